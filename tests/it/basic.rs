//! Foundation semantics through a real mount: lookup/stat/readdir across an
//! upper and two lowers, whiteouts and opaque directories, large merged
//! directories read with small buffers and seekdir, read fall-through,
//! copy-up of data and metadata for every mutating operation, creation of
//! every node type, deletion (whiteouts), rename, statfs/fsync, st_dev and
//! st_ino stability. Every test also checks that the lower was not modified.
//! The `fsutil` helpers at the bottom are shared with `posix` and `tools`.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CStr;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{
    DirEntryExt, FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt,
};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::{errno, Workspace};
use fsutil::*;

// ---------------------------------------------------------------- lookup/stat

/// Three layers: `lowers[1]` (bottom), `lowers[0]`, upper (top).
fn three_layer_workspace() -> Workspace {
    let ws = Workspace::with_lowers(2);
    let (top, bottom) = (&ws.lowers[0], &ws.lowers[1]);
    write(&bottom.join("a"), b"bottom-a");
    write(&bottom.join("b"), b"bottom-b");
    write(&bottom.join("only_bottom"), b"ob");
    write(&bottom.join("d/from_bottom"), b"db");
    write(&bottom.join("d/shared"), b"shared-bottom");
    write(&bottom.join("kind"), b"a file in the bottom layer");
    write(&top.join("a"), b"top-a");
    write(&top.join("only_top"), b"ot");
    write(&top.join("d/from_top"), b"dt");
    write(&top.join("d/shared"), b"shared-top");
    fs::create_dir(top.join("kind")).unwrap();
    write(&top.join("kind/inner"), b"i");
    write(&ws.upper.join("b"), b"upper-b");
    write(&ws.upper.join("only_upper"), b"ou");
    write(&ws.upper.join("d/from_upper"), b"du");
    ws
}

#[test]
fn lookup_and_stat_take_each_name_from_the_highest_layer_holding_it() {
    let ws = three_layer_workspace();
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    for (name, want) in [
        ("a", "top-a"),
        ("b", "upper-b"),
        ("only_bottom", "ob"),
        ("only_top", "ot"),
        ("only_upper", "ou"),
        ("d/from_bottom", "db"),
        ("d/from_top", "dt"),
        ("d/from_upper", "du"),
        ("d/shared", "shared-top"),
    ] {
        let got = fs::read_to_string(m.p(name)).unwrap_or_else(|e| panic!("read {name}: {e}"));
        assert_eq!(got, want, "content of {name}");
        let md = fs::symlink_metadata(m.p(name)).unwrap();
        assert!(md.is_file(), "{name} is a regular file");
        assert_eq!(md.len(), want.len() as u64, "size of {name}");
    }
    let kind = fs::symlink_metadata(m.p("kind")).unwrap();
    assert!(
        kind.is_dir(),
        "a directory in a higher layer wins over a file below"
    );
    assert_eq!(fs::read_to_string(m.p("kind/inner")).unwrap(), "i");
    assert!(fs::symlink_metadata(m.p("d")).unwrap().is_dir());
    assert_eq!(
        errno(&fs::symlink_metadata(m.p("nope")).unwrap_err()),
        libc::ENOENT
    );
    drop(m);
    assert_unchanged(&before);
}

#[test]
fn readdir_lists_the_union_of_all_layers_once_with_the_higher_layer_winning() {
    let ws = three_layer_workspace();
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let root = list_types(&m.path);
    let want: BTreeMap<String, char> = [
        ("a", 'f'),
        ("b", 'f'),
        ("d", 'd'),
        ("kind", 'd'),
        ("only_bottom", 'f'),
        ("only_top", 'f'),
        ("only_upper", 'f'),
    ]
    .into_iter()
    .map(|(n, t)| (n.to_string(), t))
    .collect();
    assert_eq!(root, want);
    let d: BTreeSet<String> = list_names(&m.p("d"));
    assert_eq!(
        d,
        set(&["from_bottom", "from_top", "from_upper", "shared"]),
        "merged directory lists each name once"
    );
    // `.` and `..` are present in the raw listing.
    let raw = getdents_names(&m.p("d"), 4096);
    assert!(raw.iter().any(|(n, _)| n == "."), "`.` listed");
    assert!(raw.iter().any(|(n, _)| n == ".."), "`..` listed");
    assert_eq!(raw.len(), 6, "no duplicates in the raw listing: {raw:?}");
    drop(m);
    assert_unchanged(&before);
}

#[test]
fn a_whiteout_in_a_higher_layer_hides_the_entries_below_it() {
    let ws = Workspace::with_lowers(2);
    let (top, bottom) = (&ws.lowers[0], &ws.lowers[1]);
    write(&bottom.join("hidden_by_top"), b"x");
    write(&bottom.join("hidden_by_upper"), b"x");
    write(&bottom.join("dir_hidden/child"), b"x");
    write(&top.join("top_file_hidden_by_upper"), b"x");
    write(&bottom.join("visible"), b"v");
    make_whiteout(&top.join("hidden_by_top"));
    make_whiteout(&ws.upper.join("hidden_by_upper"));
    make_whiteout(&ws.upper.join("dir_hidden"));
    make_whiteout(&ws.upper.join("top_file_hidden_by_upper"));
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    for name in [
        "hidden_by_top",
        "hidden_by_upper",
        "dir_hidden",
        "dir_hidden/child",
        "top_file_hidden_by_upper",
    ] {
        let e = fs::symlink_metadata(m.p(name)).unwrap_err();
        assert_eq!(errno(&e), libc::ENOENT, "{name} is hidden");
    }
    assert_eq!(list_names(&m.path), set(&["visible"]));
    // A name hidden by a whiteout can be created again.
    write(&m.p("hidden_by_upper"), b"new");
    assert_eq!(fs::read_to_string(m.p("hidden_by_upper")).unwrap(), "new");
    assert!(fs::symlink_metadata(ws.upper.join("hidden_by_upper"))
        .unwrap()
        .is_file());
    drop(m);
    assert_unchanged(&before);
}

#[test]
fn an_opaque_directory_hides_the_lower_content_of_the_same_directory() {
    let ws = Workspace::with_lowers(2);
    let (top, bottom) = (&ws.lowers[0], &ws.lowers[1]);
    write(&bottom.join("op/bottom_child"), b"x");
    write(&top.join("op/top_child"), b"x");
    write(&ws.upper.join("op/upper_child"), b"u");
    set_trusted_opaque(&ws.upper.join("op"));
    write(&bottom.join("op2/bottom_child"), b"x");
    write(&top.join("op2/top_child"), b"t");
    set_trusted_opaque(&top.join("op2"));
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    assert_eq!(list_names(&m.p("op")), set(&["upper_child"]));
    assert_eq!(
        errno(&fs::symlink_metadata(m.p("op/top_child")).unwrap_err()),
        libc::ENOENT
    );
    assert_eq!(list_names(&m.p("op2")), set(&["top_child"]));
    assert_eq!(
        errno(&fs::symlink_metadata(m.p("op2/bottom_child")).unwrap_err()),
        libc::ENOENT
    );
    drop(m);
    assert_unchanged(&before);
}

// ---------------------------------------------------------------- big readdir

/// 5000 visible names spread over upper + 2 lowers, with overlaps and
/// whiteouts in both the upper and the middle layer. Returns the expected
/// names (with `d` or `f` types).
fn big_dir_workspace() -> (Workspace, BTreeMap<String, char>) {
    let ws = Workspace::with_lowers(2);
    let (top, bottom) = (ws.lowers[0].join("big"), ws.lowers[1].join("big"));
    let upper = ws.upper.join("big");
    for d in [&top, &bottom, &upper] {
        fs::create_dir(d).unwrap();
    }
    let name = |i: usize| format!("entry-{i:05}");
    let mut want = BTreeMap::new();
    for i in 0..3000 {
        if i % 100 == 7 {
            fs::create_dir(bottom.join(name(i))).unwrap();
        } else {
            fs::File::create(bottom.join(name(i))).unwrap();
        }
    }
    for i in 2000..4000 {
        fs::File::create(top.join(name(i))).unwrap();
    }
    for i in 0..100 {
        make_whiteout(&top.join(name(i)));
    }
    for i in 3500..5200 {
        fs::File::create(upper.join(name(i))).unwrap();
    }
    for i in 2500..2600 {
        make_whiteout(&upper.join(name(i)));
    }
    make_whiteout(&upper.join("never-existed"));
    for i in (100..2500).chain(2600..5200) {
        let t = if i < 2000 && i % 100 == 7 { 'd' } else { 'f' };
        want.insert(name(i), t);
    }
    assert_eq!(want.len(), 5000);
    (ws, want)
}

#[test]
fn readdir_of_5000_entries_merged_across_layers_is_exact_without_duplicates() {
    let (ws, want) = big_dir_workspace();
    let m = ws.mount();
    let mut seen = Vec::new();
    for e in fs::read_dir(m.p("big")).unwrap() {
        let e = e.unwrap();
        let t = if e.file_type().unwrap().is_dir() {
            'd'
        } else {
            'f'
        };
        seen.push((e.file_name().to_string_lossy().into_owned(), t));
    }
    assert_eq!(seen.len(), 5000, "number of entries listed");
    let got: BTreeMap<String, char> = seen.into_iter().collect();
    assert_eq!(got.len(), 5000, "no name listed twice");
    assert_eq!(got, want);
    // Reading twice gives the same answer.
    assert_eq!(list_types(&m.p("big")), want);
}

#[test]
fn readdir_with_a_512_byte_getdents_buffer_neither_repeats_nor_skips() {
    let (ws, want) = big_dir_workspace();
    let m = ws.mount();
    let raw = getdents_names(&m.p("big"), 512);
    let names: Vec<&(String, u8)> = raw.iter().filter(|(n, _)| n != "." && n != "..").collect();
    assert_eq!(raw.len() - names.len(), 2, "`.` and `..` once each");
    assert_eq!(names.len(), 5000, "entries returned by getdents64");
    let got: BTreeMap<String, char> = names
        .iter()
        .map(|(n, t)| (n.clone(), if *t == libc::DT_DIR { 'd' } else { 'f' }))
        .collect();
    assert_eq!(got.len(), 5000, "no duplicates");
    assert_eq!(got, want, "exact set with d_type");
}

#[test]
fn readdir_resumed_with_telldir_and_seekdir_neither_repeats_nor_skips() {
    let (ws, want) = big_dir_workspace();
    let m = ws.mount();
    let dir = Dir::open(&m.p("big"));
    let mut first: Vec<String> = Vec::new();
    let mut early_pos = None;
    while first.len() < 1000 {
        let n = dir.next().expect("directory ended early");
        first.push(n);
        if first.len() == 10 {
            early_pos = Some((dir.tell(), first.clone()));
        }
    }
    let pos = dir.tell();
    let peek: Vec<String> = (0..100).map(|_| dir.next().unwrap()).collect();
    dir.seek(pos);
    let mut rest = Vec::new();
    while let Some(n) = dir.next() {
        rest.push(n);
    }
    assert_eq!(&rest[..100], &peek[..], "seekdir resumes where telldir was");
    let mut all: Vec<String> = first.into_iter().chain(rest).collect();
    all.retain(|n| n != "." && n != "..");
    assert_eq!(all.len(), 5000, "entries over the resumed listing");
    let got: BTreeSet<String> = all.iter().cloned().collect();
    assert_eq!(got.len(), 5000, "no duplicates");
    assert_eq!(got, want.keys().cloned().collect::<BTreeSet<_>>());

    // Seek back to an early position: the tail is the same as the first time.
    let (early, head) = early_pos.unwrap();
    dir.seek(early);
    let mut again = head;
    while let Some(n) = dir.next() {
        again.push(n);
    }
    again.retain(|n| n != "." && n != "..");
    assert_eq!(
        again, all,
        "a second pass from an early cookie is identical"
    );
}

// ---------------------------------------------------------------- read

#[test]
fn reads_fall_through_to_the_lower_and_never_copy_up() {
    let ws = Workspace::new();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    write(&ws.lower().join("big.bin"), &big);
    write(&ws.lower().join("dir/sub/small"), b"small");
    fs::set_permissions(
        ws.lower().join("dir/sub/small"),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    xattr::set(ws.lower().join("dir/sub/small"), "user.k", b"v").unwrap();
    std::os::unix::fs::symlink("sub/small", ws.lower().join("dir/link")).unwrap();
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    assert_eq!(fs::read(m.p("big.bin")).unwrap(), big);
    // Random-access reads.
    let f = fs::File::open(m.p("big.bin")).unwrap();
    let mut buf = vec![0u8; 10_000];
    f.read_exact_at(&mut buf, 1_234_567).unwrap();
    assert_eq!(&buf[..], &big[1_234_567..1_244_567]);
    drop(f);
    // Every read-only access: open O_RDONLY, stat, readdir, readlink, getxattr, access.
    let mut s = String::new();
    fs::OpenOptions::new()
        .read(true)
        .open(m.p("dir/sub/small"))
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "small");
    assert_eq!(fs::read_to_string(m.p("dir/link")).unwrap(), "small");
    assert_eq!(
        fs::read_link(m.p("dir/link")).unwrap(),
        Path::new("sub/small")
    );
    assert_eq!(
        xattr::get(m.p("dir/sub/small"), "user.k")
            .unwrap()
            .as_deref(),
        Some(&b"v"[..])
    );
    assert!(list_names(&m.p("dir")).contains("sub"));
    let c = cpath(&m.p("dir/sub/small"));
    // SAFETY: c is a valid NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::access(c.as_ptr(), libc::R_OK) }, 0);
    let dirfd = fs::File::open(m.p("dir")).unwrap();
    assert!(dirfd.metadata().unwrap().is_dir());
    drop(dirfd);
    drop(m);
    assert_eq!(
        walk_names(&ws.upper),
        Vec::<String>::new(),
        "a read-only session leaves the upper empty"
    );
    assert_unchanged(&before);
}

// ---------------------------------------------------------------- copy-up

#[derive(Clone, Copy, Debug)]
enum CopyUpOp {
    Write,
    Truncate,
    Chmod,
    Chown,
    Utimens,
    SetXattr,
}

const OLD_MTIME: i64 = 1_000_000_000; // 2001-09-09
const OLD_ATIME: i64 = 1_100_000_000;
const NEW_MTIME: i64 = 1_200_000_000;
const BODY: &[u8] = b"hello from the lower layer\nsecond line\n";

/// Sets up `a/b/f` in the lower with distinctive metadata, applies `op`
/// through the mount, and checks the upper copy and the mount view.
fn copy_up_case(op: CopyUpOp) {
    let ws = Workspace::new();
    let l = ws.lower();
    write(&l.join("a/b/f"), BODY);
    write(&l.join("a/b/sibling"), b"not touched");
    fs::set_permissions(l.join("a/b/f"), fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(l.join("a/b/f"), Some(1234), Some(5678)).unwrap();
    xattr::set(l.join("a/b/f"), "user.k", b"v").unwrap();
    set_times(&l.join("a/b/f"), OLD_ATIME, OLD_MTIME);
    fs::set_permissions(l.join("a/b"), fs::Permissions::from_mode(0o751)).unwrap();
    std::os::unix::fs::chown(l.join("a/b"), Some(3333), Some(4444)).unwrap();
    fs::set_permissions(l.join("a"), fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::chown(l.join("a"), Some(1111), Some(2222)).unwrap();
    set_times(&l.join("a/b"), OLD_ATIME, OLD_MTIME);
    set_times(&l.join("a"), OLD_ATIME, OLD_MTIME);
    let before = snapshot_lowers(&ws);

    let m = ws.mount();
    let f = m.p("a/b/f");
    let ino_before = fs::symlink_metadata(&f).unwrap().ino();
    let dir_mtime_before = fs::symlink_metadata(m.p("a/b")).unwrap().mtime();
    let mut want_body = BODY.to_vec();
    let mut want_mode = 0o640;
    let mut want_owner = (1234, 5678);
    let mut want_mtime = Some(OLD_MTIME);
    let mut want_xattrs = vec![("user.k", &b"v"[..])];
    match op {
        CopyUpOp::Write => {
            let fh = fs::OpenOptions::new().write(true).open(&f).unwrap();
            fh.write_all_at(b"HELLO", 0).unwrap();
            want_body[..5].copy_from_slice(b"HELLO");
            want_mtime = None;
        }
        CopyUpOp::Truncate => {
            let c = cpath(&f);
            // SAFETY: c is a valid NUL-terminated path that outlives the call.
            assert_eq!(unsafe { libc::truncate(c.as_ptr(), 5) }, 0, "truncate");
            want_body.truncate(5);
            want_mtime = None;
        }
        CopyUpOp::Chmod => {
            fs::set_permissions(&f, fs::Permissions::from_mode(0o604)).unwrap();
            want_mode = 0o604;
        }
        CopyUpOp::Chown => {
            std::os::unix::fs::chown(&f, Some(42), Some(43)).unwrap();
            want_owner = (42, 43);
        }
        CopyUpOp::Utimens => {
            set_times(&f, NEW_MTIME, NEW_MTIME);
            want_mtime = Some(NEW_MTIME);
        }
        CopyUpOp::SetXattr => {
            xattr::set(&f, "user.added", b"new").unwrap();
            want_xattrs.push(("user.added", &b"new"[..]));
        }
    }
    // The mount view.
    let md = fs::symlink_metadata(&f).unwrap();
    assert_eq!(
        fs::read(&f).unwrap(),
        want_body,
        "{op:?}: content via mount"
    );
    assert_eq!(md.mode() & 0o7777, want_mode, "{op:?}: mode via mount");
    assert_eq!((md.uid(), md.gid()), want_owner, "{op:?}: owner via mount");
    assert_eq!(md.ino(), ino_before, "{op:?}: st_ino unchanged by copy-up");
    if let Some(t) = want_mtime {
        assert_eq!(md.mtime(), t, "{op:?}: mtime via mount");
    }
    assert_eq!(
        fs::symlink_metadata(m.p("a/b")).unwrap().mtime(),
        dir_mtime_before,
        "{op:?}: copy-up does not change the parent's mtime"
    );
    for (k, v) in &want_xattrs {
        assert_eq!(
            xattr::get(&f, k).unwrap().as_deref(),
            Some(*v),
            "{op:?}: {k}"
        );
    }
    drop(m);

    // The upper copy.
    let u = ws.upper.join("a/b/f");
    let umd = fs::symlink_metadata(&u).unwrap_or_else(|e| panic!("{op:?}: no upper copy: {e}"));
    assert!(umd.is_file());
    assert_eq!(fs::read(&u).unwrap(), want_body, "{op:?}: upper data");
    assert_eq!(umd.mode() & 0o7777, want_mode, "{op:?}: upper mode");
    assert_eq!((umd.uid(), umd.gid()), want_owner, "{op:?}: upper owner");
    if let Some(t) = want_mtime {
        assert_eq!(umd.mtime(), t, "{op:?}: upper mtime preserved");
    }
    for (k, v) in &want_xattrs {
        assert_eq!(
            xattr::get(&u, k).unwrap().as_deref(),
            Some(*v),
            "{op:?}: upper xattr {k}"
        );
    }
    for (dir, mode, owner) in [("a", 0o750, (1111, 2222)), ("a/b", 0o751, (3333, 4444))] {
        let d = fs::symlink_metadata(ws.upper.join(dir)).unwrap();
        assert!(d.is_dir(), "{op:?}: upper parent {dir}");
        assert_eq!(d.mode() & 0o7777, mode, "{op:?}: upper {dir} mode");
        assert_eq!((d.uid(), d.gid()), owner, "{op:?}: upper {dir} owner");
        assert_eq!(
            get_trusted(&ws.upper.join(dir), "trusted.overlay.opaque"),
            None,
            "{op:?}: a copied-up parent is not opaque"
        );
    }
    assert_eq!(
        walk_names(&ws.upper),
        vec!["a", "a/b", "a/b/f"],
        "{op:?}: only the file and its parents are in the upper (no temp files)"
    );
    assert_unchanged(&before);
}

#[test]
fn writing_a_lower_file_copies_up_data_mode_owner_xattrs_and_parents() {
    copy_up_case(CopyUpOp::Write);
}

#[test]
fn truncating_a_lower_file_copies_it_up_first() {
    copy_up_case(CopyUpOp::Truncate);
}

#[test]
fn chmod_of_a_lower_file_copies_it_up_preserving_its_mtime() {
    copy_up_case(CopyUpOp::Chmod);
}

#[test]
fn chown_of_a_lower_file_copies_it_up_preserving_its_mtime() {
    copy_up_case(CopyUpOp::Chown);
}

#[test]
fn utimens_of_a_lower_file_copies_it_up_with_the_new_times() {
    copy_up_case(CopyUpOp::Utimens);
}

#[test]
fn setting_a_user_xattr_on_a_lower_file_copies_it_up_with_all_its_xattrs() {
    copy_up_case(CopyUpOp::SetXattr);
}

#[test]
fn a_read_only_open_never_copies_up() {
    let ws = Workspace::new();
    write(&ws.lower().join("d/f"), b"data");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    for flags in [
        libc::O_RDONLY,
        libc::O_RDONLY | libc::O_NOATIME,
        libc::O_RDONLY | libc::O_NOFOLLOW,
    ] {
        let mut f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(m.p("d/f"))
            .unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, "data");
        f.sync_all().ok();
    }
    drop(m);
    assert!(
        walk_names(&ws.upper).is_empty(),
        "upper: {:?}",
        walk_names(&ws.upper)
    );
    assert_unchanged(&before);
}

#[test]
fn copy_up_is_atomic_and_leaves_no_temporary_files_in_the_upper() {
    let ws = Workspace::new();
    let big: Vec<u8> = (0..8_000_000u32).map(|i| (i % 253) as u8).collect();
    write(&ws.lower().join("big"), &big);
    for i in 0..20 {
        write(
            &ws.lower().join(format!("many/f{i}")),
            format!("{i}").as_bytes(),
        );
    }
    let before = snapshot_lowers(&ws);
    assert!(
        !ws.work.starts_with(&ws.upper),
        "the work dir is outside the upper"
    );
    let m = ws.mount();
    fs::OpenOptions::new()
        .append(true)
        .open(m.p("big"))
        .unwrap()
        .write_all(b"tail")
        .unwrap();
    for i in 0..20 {
        fs::OpenOptions::new()
            .append(true)
            .open(m.p(&format!("many/f{i}")))
            .unwrap()
            .write_all(b"+")
            .unwrap();
    }
    let mut want_big = big.clone();
    want_big.extend_from_slice(b"tail");
    assert_eq!(fs::read(m.p("big")).unwrap(), want_big);
    drop(m);
    let mut want: Vec<String> = vec!["big".into(), "many".into()];
    let mut many: Vec<String> = (0..20).map(|i| format!("many/f{i}")).collect();
    many.sort();
    want.extend(many);
    assert_eq!(walk_names(&ws.upper), want, "exactly the copied-up names");
    assert_eq!(fs::read(ws.upper.join("big")).unwrap(), want_big);
    assert_unchanged(&before);
}

// ---------------------------------------------------------------- create

#[test]
fn create_mkdir_and_symlink_land_in_the_upper() {
    let ws = Workspace::new();
    write(&ws.lower().join("dir/existing"), b"e");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    write(&m.p("new_file"), b"n");
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(m.p("dir/new_in_lower_dir"))
        .unwrap()
        .write_all(b"x")
        .unwrap();
    fs::create_dir(m.p("newdir")).unwrap();
    fs::set_permissions(m.p("newdir"), fs::Permissions::from_mode(0o710)).unwrap();
    std::os::unix::fs::symlink("dir/existing", m.p("link")).unwrap();
    std::os::unix::fs::symlink("nowhere", m.p("dangling")).unwrap();
    assert_eq!(
        errno(
            &fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(m.p("dir/existing"))
                .unwrap_err()
        ),
        libc::EEXIST,
        "O_EXCL on a lower file"
    );
    assert_eq!(
        errno(&fs::create_dir(m.p("dir")).unwrap_err()),
        libc::EEXIST
    );
    assert_eq!(
        fs::read_link(m.p("link")).unwrap(),
        Path::new("dir/existing")
    );
    assert_eq!(fs::read_to_string(m.p("link")).unwrap(), "e");
    assert_eq!(
        fs::read_link(m.p("dangling")).unwrap(),
        Path::new("nowhere")
    );
    assert!(fs::symlink_metadata(m.p("link"))
        .unwrap()
        .file_type()
        .is_symlink());
    let nmd = fs::symlink_metadata(m.p("dir/new_in_lower_dir")).unwrap();
    assert_eq!(nmd.mode() & 0o777, 0o600 & !current_umask());
    assert_eq!(
        list_names(&m.p("dir")),
        set(&["existing", "new_in_lower_dir"])
    );
    drop(m);
    let u = &ws.upper;
    assert_eq!(fs::read(u.join("new_file")).unwrap(), b"n");
    assert_eq!(fs::read(u.join("dir/new_in_lower_dir")).unwrap(), b"x");
    let nd = fs::symlink_metadata(u.join("newdir")).unwrap();
    assert!(nd.is_dir());
    assert_eq!(nd.mode() & 0o7777, 0o710);
    assert_eq!(
        fs::read_link(u.join("link")).unwrap(),
        Path::new("dir/existing")
    );
    assert_eq!(
        fs::read_link(u.join("dangling")).unwrap(),
        Path::new("nowhere")
    );
    assert_eq!(
        get_trusted(&u.join("newdir"), "trusted.overlay.opaque"),
        None,
        "a new dir over nothing need not be opaque"
    );
    assert!(
        fs::symlink_metadata(u.join("dir/existing")).is_err(),
        "not copied up"
    );
    assert_unchanged(&before);
}

#[test]
fn mknod_of_a_fifo_and_bind_of_a_unix_socket_work() {
    let ws = Workspace::new();
    fs::create_dir(ws.lower().join("d")).unwrap();
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let fifo = cpath(&m.p("d/fifo"));
    // SAFETY: fifo is a valid NUL-terminated path that outlives the call.
    assert_eq!(
        unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) },
        0,
        "mkfifo: {}",
        std::io::Error::last_os_error()
    );
    assert!(fs::symlink_metadata(m.p("d/fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    // The fifo carries data between a writer thread and a reader.
    let p = m.p("d/fifo");
    let w = std::thread::spawn(move || fs::write(p, b"through the fifo").unwrap());
    assert_eq!(fs::read(m.p("d/fifo")).unwrap(), b"through the fifo");
    w.join().unwrap();

    let sock = m.p("d/sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    assert!(fs::symlink_metadata(&sock).unwrap().file_type().is_socket());
    let mut client = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    client.write_all(b"ping").unwrap();
    let mut got = [0u8; 4];
    server.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    drop((client, server, listener));
    drop(m);
    assert!(fs::symlink_metadata(ws.upper.join("d/fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert!(fs::symlink_metadata(ws.upper.join("d/sock"))
        .unwrap()
        .file_type()
        .is_socket());
    assert_unchanged(&before);
}

// ---------------------------------------------------------------- delete

#[test]
fn unlinking_a_lower_file_leaves_a_char_0_0_whiteout_in_the_upper() {
    let ws = Workspace::new();
    write(&ws.lower().join("gone"), b"g");
    write(&ws.lower().join("d/gone_too"), b"g");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    fs::remove_file(m.p("gone")).unwrap();
    fs::remove_file(m.p("d/gone_too")).unwrap();
    for n in ["gone", "d/gone_too"] {
        assert_eq!(
            errno(&fs::symlink_metadata(m.p(n)).unwrap_err()),
            libc::ENOENT
        );
    }
    assert!(list_names(&m.path).iter().all(|n| n != "gone"));
    assert!(list_names(&m.p("d")).is_empty());
    assert_eq!(
        errno(&fs::remove_file(m.p("gone")).unwrap_err()),
        libc::ENOENT
    );
    drop(m);
    assert_whiteout(&ws.upper.join("gone"));
    assert_whiteout(&ws.upper.join("d/gone_too"));
    assert_unchanged(&before);
}

#[test]
fn a_file_recreated_over_a_whiteout_is_a_plain_upper_file() {
    let ws = Workspace::new();
    write(&ws.lower().join("f"), b"lower");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    fs::remove_file(m.p("f")).unwrap();
    write(&m.p("f"), b"again");
    assert_eq!(fs::read(m.p("f")).unwrap(), b"again");
    drop(m);
    let md = fs::symlink_metadata(ws.upper.join("f")).unwrap();
    assert!(md.is_file());
    assert_eq!(fs::read(ws.upper.join("f")).unwrap(), b"again");
    assert_unchanged(&before);
}

#[test]
fn rmdir_of_a_lower_dir_leaves_a_whiteout() {
    let ws = Workspace::new();
    fs::create_dir_all(ws.lower().join("emptydir")).unwrap();
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    fs::remove_dir(m.p("emptydir")).unwrap();
    assert_eq!(
        errno(&fs::symlink_metadata(m.p("emptydir")).unwrap_err()),
        libc::ENOENT
    );
    assert!(list_names(&m.path).is_empty());
    drop(m);
    assert_whiteout(&ws.upper.join("emptydir"));
    assert_unchanged(&before);
}

#[test]
fn rmdir_of_a_merged_dir_is_enotempty_until_all_children_are_deleted() {
    let ws = Workspace::with_lowers(2);
    write(&ws.lowers[1].join("m/bottom"), b"b");
    write(&ws.lowers[0].join("m/top"), b"t");
    write(&ws.upper.join("m/up"), b"u");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    assert_eq!(
        errno(&fs::remove_dir(m.p("m")).unwrap_err()),
        libc::ENOTEMPTY
    );
    fs::remove_file(m.p("m/up")).unwrap();
    assert_eq!(
        errno(&fs::remove_dir(m.p("m")).unwrap_err()),
        libc::ENOTEMPTY
    );
    fs::remove_file(m.p("m/top")).unwrap();
    assert_eq!(
        errno(&fs::remove_dir(m.p("m")).unwrap_err()),
        libc::ENOTEMPTY
    );
    fs::remove_file(m.p("m/bottom")).unwrap();
    assert!(list_names(&m.p("m")).is_empty());
    fs::remove_dir(m.p("m")).unwrap();
    assert_eq!(
        errno(&fs::symlink_metadata(m.p("m")).unwrap_err()),
        libc::ENOENT
    );
    // Re-creating it gives an empty directory.
    fs::create_dir(m.p("m")).unwrap();
    assert!(
        list_names(&m.p("m")).is_empty(),
        "no lower child comes back"
    );
    drop(m);
    assert_eq!(
        get_trusted(&ws.upper.join("m"), "trusted.overlay.opaque").as_deref(),
        Some("y")
    );
    assert_unchanged(&before);
}

#[test]
fn rm_rf_of_a_lower_tree_then_mkdir_gives_an_empty_opaque_dir() {
    let ws = Workspace::new();
    for i in 0..30 {
        write(&ws.lower().join(format!("tree/sub{}/f{i}", i % 3)), b"x");
    }
    std::os::unix::fs::symlink("sub0", ws.lower().join("tree/link")).unwrap();
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    crate::harness::sh(&m.path, "rm -rf tree && mkdir tree");
    assert!(
        list_names(&m.p("tree")).is_empty(),
        "{:?}",
        list_names(&m.p("tree"))
    );
    assert_eq!(
        errno(&fs::symlink_metadata(m.p("tree/sub0")).unwrap_err()),
        libc::ENOENT
    );
    drop(m);
    let up = ws.upper.join("tree");
    assert!(fs::symlink_metadata(&up).unwrap().is_dir());
    assert_eq!(
        get_trusted(&up, "trusted.overlay.opaque").as_deref(),
        Some("y")
    );
    assert!(
        walk_names(&up).is_empty(),
        "the opaque dir holds no whiteouts: {:?}",
        walk_names(&up)
    );
    assert_unchanged(&before);
}

// ---------------------------------------------------------------- rename

#[test]
fn renaming_a_lower_file_leaves_a_whiteout_at_the_old_name() {
    let ws = Workspace::new();
    write(&ws.lower().join("old"), b"content");
    write(&ws.lower().join("src/inner"), b"inner");
    fs::create_dir(ws.lower().join("dst")).unwrap();
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    fs::rename(m.p("old"), m.p("new")).unwrap();
    fs::rename(m.p("src/inner"), m.p("dst/moved")).unwrap();
    assert_eq!(
        errno(&fs::symlink_metadata(m.p("old")).unwrap_err()),
        libc::ENOENT
    );
    assert_eq!(fs::read(m.p("new")).unwrap(), b"content");
    assert_eq!(fs::read(m.p("dst/moved")).unwrap(), b"inner");
    assert!(list_names(&m.p("src")).is_empty());
    assert_eq!(list_names(&m.p("dst")), set(&["moved"]));
    drop(m);
    assert_whiteout(&ws.upper.join("old"));
    assert_whiteout(&ws.upper.join("src/inner"));
    assert_eq!(fs::read(ws.upper.join("new")).unwrap(), b"content");
    assert_eq!(fs::read(ws.upper.join("dst/moved")).unwrap(), b"inner");
    assert_unchanged(&before);
}

// ---------------------------------------------------------------- misc

/// A tmpfs mounted for one test; unmounted (lazily if busy) on drop.
struct SmallFs(PathBuf);

impl SmallFs {
    fn new(at: PathBuf, size: &str) -> SmallFs {
        fs::create_dir_all(&at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount tmpfs at {}", at.display());
        SmallFs(at)
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// A full upper: the copy-up that does not fit fails with ENOSPC and
/// leaves nothing half-written (no partial upper file, nothing in the work
/// dir, the lower intact); the daemon keeps serving and works again once
/// space is freed.
#[test]
fn a_full_upper_fails_copy_up_with_enospc_and_leaves_nothing_half_written() {
    let mut ws = Workspace::new();
    let big = vec![b'L'; 3 << 20];
    fs::write(ws.lower().join("big"), &big).unwrap();
    fs::write(ws.lower().join("small"), b"s").unwrap();
    let small = SmallFs::new(ws.dir.path().join("small"), "2M");
    ws.upper = small.0.join("upper");
    ws.work = small.0.join("work");
    fs::create_dir(&ws.upper).unwrap();
    fs::create_dir(&ws.work).unwrap();
    let m = ws.mount();
    let r = fs::OpenOptions::new().append(true).open(m.p("big"));
    let e = r.expect_err("a 3 MiB copy-up into a 2 MiB upper must fail");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert!(
        fs::symlink_metadata(ws.upper.join("big")).is_err(),
        "partial upper copy"
    );
    assert!(
        fs::read_dir(&ws.work).unwrap().next().is_none(),
        "work dir not cleaned: {:?}",
        walk_names(&ws.work)
    );
    assert_eq!(
        fs::read(m.p("big")).unwrap(),
        big,
        "the mount still shows the lower"
    );
    assert_eq!(fs::read(ws.lower().join("big")).unwrap(), big);
    // Filling the upper with a new file: ENOSPC, then freeing it helps.
    let mut f = fs::File::create(m.p("filler")).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut hit = None;
    for _ in 0..4 {
        if let Err(e) = f.write_all(&chunk).and_then(|_| f.sync_all()) {
            hit = e.raw_os_error();
            break;
        }
    }
    drop(f);
    assert_eq!(hit, Some(libc::ENOSPC), "writing 4 MiB into 2 MiB");
    fs::remove_file(m.p("filler")).unwrap();
    // The kernel sends the filler's RELEASE asynchronously after close:
    // until the daemon has handled it, the unlinked file's blocks are
    // still held open (seen under load), so the copy-up may take a moment
    // to find space.
    let appended = crate::harness::eventually(std::time::Duration::from_secs(10), || {
        fs::OpenOptions::new()
            .append(true)
            .open(m.p("small"))
            .and_then(|mut f| f.write_all(b"+"))
            .is_ok()
    });
    assert!(appended, "no space after the filler was removed");
    assert_eq!(fs::read(m.p("small")).unwrap(), b"s+");
    drop(m);
}

#[test]
fn statfs_and_fsync_work() {
    let ws = Workspace::new();
    write(&ws.lower().join("f"), b"lower");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let c = cpath(&m.path);
    // SAFETY: c is a valid NUL-terminated path and st a writable statvfs; both outlive it.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    assert!(st.f_bsize > 0, "f_bsize");
    assert!(st.f_blocks > 0, "f_blocks reflects a real filesystem");
    assert!(st.f_bfree <= st.f_blocks && st.f_bavail <= st.f_blocks);
    assert!(st.f_namemax >= 255, "f_namemax {}", st.f_namemax);

    let mut f = fs::File::create(m.p("new")).unwrap();
    f.write_all(b"durable").unwrap();
    f.sync_all().unwrap();
    f.sync_data().unwrap();
    let mut g = fs::OpenOptions::new().append(true).open(m.p("f")).unwrap();
    g.write_all(b"+").unwrap();
    g.sync_all().unwrap();
    fs::File::open(&m.path).unwrap().sync_all().unwrap();
    drop((f, g));
    assert_eq!(fs::read(m.p("f")).unwrap(), b"lower+");
    drop(m);
    assert_eq!(fs::read(ws.upper.join("new")).unwrap(), b"durable");
    assert_unchanged(&before);
}

#[test]
fn every_entry_reports_the_same_st_dev() {
    let ws = Workspace::with_lowers(2);
    write(&ws.lowers[1].join("bottom/f"), b"b");
    write(&ws.lowers[0].join("top/f"), b"t");
    std::os::unix::fs::symlink("top/f", ws.lowers[0].join("link")).unwrap();
    write(&ws.upper.join("up/f"), b"u");
    let m = ws.mount();
    write(&m.p("created"), b"c");
    fs::create_dir(m.p("madedir")).unwrap();
    let root_dev = fs::metadata(&m.path).unwrap().dev();
    let mut n = 0;
    for rel in walk_names(&m.path) {
        let md = fs::symlink_metadata(m.p(&rel)).unwrap();
        assert_eq!(md.dev(), root_dev, "st_dev of {rel}");
        n += 1;
    }
    assert_eq!(n, 9);
    let f = fs::File::open(m.p("bottom/f")).unwrap();
    assert_eq!(f.metadata().unwrap().dev(), root_dev, "fstat st_dev");
}

#[test]
fn st_ino_of_a_lower_file_is_unchanged_after_copy_up() {
    let ws = Workspace::new();
    write(&ws.lower().join("f"), b"x");
    write(&ws.lower().join("d/g"), b"y");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let ino_f = fs::symlink_metadata(m.p("f")).unwrap().ino();
    let ino_g = fs::symlink_metadata(m.p("d/g")).unwrap().ino();
    let ino_d = fs::symlink_metadata(m.p("d")).unwrap().ino();
    let fh = fs::OpenOptions::new().write(true).open(m.p("f")).unwrap();
    assert_eq!(fh.metadata().unwrap().ino(), ino_f, "fstat of the write fd");
    fh.write_all_at(b"X", 0).unwrap();
    drop(fh);
    fs::set_permissions(m.p("d/g"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::symlink_metadata(m.p("f")).unwrap().ino(), ino_f);
    assert_eq!(fs::symlink_metadata(m.p("d/g")).unwrap().ino(), ino_g);
    assert_eq!(
        fs::symlink_metadata(m.p("d")).unwrap().ino(),
        ino_d,
        "copied-up parent"
    );
    let listed: Vec<(String, u64)> = fs::read_dir(&m.path)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), e.ino())
        })
        .collect();
    assert!(
        listed.contains(&("f".to_string(), ino_f)),
        "readdir d_ino: {listed:?}"
    );
    drop(m);
    assert_unchanged(&before);
}

#[test]
fn stat_of_the_mountpoint_root_describes_a_directory() {
    let ws = Workspace::with_lowers(2);
    write(&ws.lowers[0].join("x"), b"x");
    fs::set_permissions(&ws.upper, fs::Permissions::from_mode(0o751)).unwrap();
    let m = ws.mount();
    let md = fs::metadata(&m.path).unwrap();
    assert!(md.is_dir());
    assert_eq!(
        md.mode() & 0o7777,
        0o751,
        "root mode comes from the upper root"
    );
    // Like kernel overlayfs, a merged directory may report nlink 1.
    assert!(md.nlink() >= 1);
    assert_eq!(fs::metadata(m.p(".")).unwrap().ino(), md.ino());
    let parent = fs::metadata(m.p("..")).unwrap();
    assert_eq!(
        parent.ino(),
        fs::metadata(ws.dir.path()).unwrap().ino(),
        "`..` leaves the mount"
    );
    assert_eq!(list_names(&m.path), set(&["x"]));
}

#[test]
fn nothing_in_the_lowers_changes_after_a_session_of_every_operation() {
    let ws = Workspace::with_lowers(2);
    for l in &ws.lowers {
        for i in 0..5 {
            write(&l.join(format!("d{i}/f{i}")), b"data");
            write(&l.join(format!("d{i}/sub/g")), b"g");
        }
        write(&l.join("top"), b"t");
        std::os::unix::fs::symlink("top", l.join("lnk")).unwrap();
        xattr::set(l.join("top"), "user.x", b"1").unwrap();
    }
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let script = r#"set -e
        echo more >> d0/f0
        truncate -s 1 d1/f1
        chmod 600 d2/f2
        chown 5:6 d3/f3
        touch -d 2010-01-01 d4/f4
        setfattr -n user.y -v 2 top
        rm d0/sub/g
        rm -rf d1/sub
        mv d2 d2moved
        mv d3/f3 d4/
        ln d4/f4 d4/hard
        ln -s d4 newlink
        mkdir d0/newdir && echo n > d0/newdir/n
        rm -rf d4 && mkdir d4
        cat lnk >/dev/null
    "#;
    crate::harness::sh(&m.path, script);
    assert_eq!(fs::read(m.p("d0/f0")).unwrap(), b"datamore\n");
    drop(m);
    assert_unchanged(&before);
}

// ---------------------------------------------------------------- helpers

fn current_umask() -> u32 {
    // umask(2) only reads by writing; restore it at once.
    // SAFETY: umask takes and returns a plain integer and touches no memory.
    let old = unsafe { libc::umask(0o022) };
    // SAFETY: umask takes and returns a plain integer and touches no memory.
    unsafe { libc::umask(old) };
    old
}

/// A libc DIR stream for telldir/seekdir tests.
struct Dir(*mut libc::DIR);

impl Dir {
    fn open(p: &Path) -> Dir {
        let c = cpath(p);
        // SAFETY: c is a valid NUL-terminated path that outlives the call.
        let d = unsafe { libc::opendir(c.as_ptr()) };
        assert!(
            !d.is_null(),
            "opendir {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
        Dir(d)
    }
    fn next(&self) -> Option<String> {
        // SAFETY: self.0 is a non-null DIR* from opendir, closed only in Drop.
        let e = unsafe { libc::readdir(self.0) };
        if e.is_null() {
            return None;
        }
        // SAFETY: e is a non-null dirent, live until the next readdir; d_name is NUL-terminated.
        let name = unsafe { CStr::from_ptr((*e).d_name.as_ptr()) };
        Some(name.to_string_lossy().into_owned())
    }
    fn tell(&self) -> libc::c_long {
        // SAFETY: self.0 is a non-null DIR* from opendir, closed only in Drop.
        unsafe { libc::telldir(self.0) }
    }
    fn seek(&self, pos: libc::c_long) {
        // SAFETY: self.0 is a non-null DIR* from opendir, closed only in Drop.
        unsafe { libc::seekdir(self.0, pos) }
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // SAFETY: self.0 is a DIR* from opendir and is closed exactly once, here.
        unsafe { libc::closedir(self.0) };
    }
}

/// Raw getdents64 with a buffer of `bufsize` bytes: (name, d_type) in order.
fn getdents_names(dir: &Path, bufsize: usize) -> Vec<(String, u8)> {
    let f = fs::File::open(dir).unwrap();
    let mut buf = vec![0u64; bufsize / 8];
    let mut out = Vec::new();
    loop {
        // SAFETY: buf holds bufsize writable bytes (callers pass multiples of 8); f's fd is open.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                f.as_raw_fd(),
                buf.as_mut_ptr(),
                bufsize,
            )
        };
        assert!(n >= 0, "getdents64: {}", std::io::Error::last_os_error());
        if n == 0 {
            return out;
        }
        // SAFETY: buf's first n <= bufsize bytes are initialised and unchanged while bytes lives.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, n as usize) };
        let mut off = 0usize;
        while off < bytes.len() {
            let reclen = u16::from_ne_bytes([bytes[off + 16], bytes[off + 17]]) as usize;
            let dtype = bytes[off + 18];
            let name = CStr::from_bytes_until_nul(&bytes[off + 19..off + reclen]).unwrap();
            out.push((name.to_string_lossy().into_owned(), dtype));
            off += reclen;
        }
    }
}

/// Helpers shared by the `basic`, `posix` and `tools` test modules.
pub(crate) mod fsutil {
    use std::collections::{BTreeMap, BTreeSet};
    use std::ffi::CString;
    use std::fs;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use crate::harness::Workspace;

    pub fn cpath(p: &Path) -> CString {
        CString::new(p.as_os_str().as_bytes()).unwrap()
    }

    pub fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// Write a file, creating its parent directories.
    pub fn write(p: &Path, data: &[u8]) {
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    }

    /// Set atime/mtime (whole seconds) without following symlinks.
    pub fn set_times(p: &Path, atime: i64, mtime: i64) {
        let ts = [
            libc::timespec {
                tv_sec: atime,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: mtime,
                tv_nsec: 0,
            },
        ];
        let c = cpath(p);
        // SAFETY: c is a valid NUL-terminated path and ts two timespecs; both outlive the call.
        let r = unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c.as_ptr(),
                ts.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        assert_eq!(
            r,
            0,
            "utimensat {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
    }

    /// Create a kernel-overlay whiteout (char device 0/0) directly in a layer.
    pub fn make_whiteout(p: &Path) {
        let c = cpath(p);
        // SAFETY: c is a valid NUL-terminated path that outlives the call.
        let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, libc::makedev(0, 0)) };
        assert_eq!(
            r,
            0,
            "mknod whiteout {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
    }

    pub fn assert_whiteout(p: &Path) {
        let md = fs::symlink_metadata(p)
            .unwrap_or_else(|e| panic!("expected a whiteout at {}: {e}", p.display()));
        assert!(
            md.file_type().is_char_device(),
            "{} is a char device (got {:?})",
            p.display(),
            md.file_type()
        );
        assert_eq!(md.rdev(), 0, "{} is device 0/0", p.display());
    }

    /// Mark a directory in a layer opaque, the way kernel overlayfs does.
    pub fn set_trusted_opaque(p: &Path) {
        xattr::set(p, "trusted.overlay.opaque", b"y")
            .unwrap_or_else(|e| panic!("set opaque on {}: {e}", p.display()));
    }

    /// Read a trusted.* xattr straight from a layer with getfattr.
    pub fn get_trusted(p: &Path, name: &str) -> Option<String> {
        let out = Command::new("getfattr")
            .args(["-n", name, "--only-values", "--absolute-names"])
            .arg(p)
            .output()
            .expect("run getfattr");
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Names (relative, sorted) of everything below `root`, not following symlinks.
    pub fn walk_names(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        walk(root, root, &mut |rel, _| out.push(rel.to_string()));
        out.sort();
        out
    }

    pub fn walk(root: &Path, dir: &Path, f: &mut dyn FnMut(&str, &fs::Metadata)) {
        let mut entries: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            let md = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            f(&rel, &md);
            if md.is_dir() {
                walk(root, &p, f);
            }
        }
    }

    pub fn list_names(dir: &Path) -> BTreeSet<String> {
        fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// Names with a type letter from the dirent (f, d, l, c, p, s, b).
    pub fn list_types(dir: &Path) -> BTreeMap<String, char> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let t = type_letter(&e.file_type().unwrap());
                (e.file_name().to_string_lossy().into_owned(), t)
            })
            .collect()
    }

    pub fn type_letter(t: &fs::FileType) -> char {
        if t.is_dir() {
            'd'
        } else if t.is_file() {
            'f'
        } else if t.is_symlink() {
            'l'
        } else if t.is_char_device() {
            'c'
        } else if t.is_block_device() {
            'b'
        } else if t.is_fifo() {
            'p'
        } else {
            's'
        }
    }

    /// Read a file without updating its atime (so a snapshot of a lower
    /// never perturbs what a later test step observes).
    pub fn read_noatime(p: &Path) -> Vec<u8> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOATIME)
            .open(p)
            .unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    }

    /// Everything observable about one entry of a layer.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Node {
        pub kind: char,
        pub mode: u32,
        pub uid: u32,
        pub gid: u32,
        pub size: u64,
        pub rdev: u64,
        pub ino: u64,
        pub nlink: u64,
        pub mtime: (i64, i64),
        pub ctime: (i64, i64),
        pub data: Vec<u8>,
        pub xattrs: BTreeMap<String, Vec<u8>>,
    }

    /// Full snapshot of a directory tree (root included as "").
    pub fn snapshot(root: &Path) -> BTreeMap<String, Node> {
        let mut out = BTreeMap::new();
        let mut add = |rel: &str, md: &fs::Metadata| {
            let p = if rel.is_empty() {
                root.to_path_buf()
            } else {
                root.join(rel)
            };
            let kind = type_letter(&md.file_type());
            let data = match kind {
                'f' => read_noatime(&p),
                'l' => fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec(),
                _ => Vec::new(),
            };
            let mut xattrs = BTreeMap::new();
            if kind != 'l' {
                for name in xattr::list(&p).unwrap() {
                    let n = name.to_string_lossy().into_owned();
                    let v = xattr::get(&p, &name).unwrap().unwrap_or_default();
                    xattrs.insert(n, v);
                }
            }
            out.insert(
                rel.to_string(),
                Node {
                    kind,
                    mode: md.mode(),
                    uid: md.uid(),
                    gid: md.gid(),
                    size: md.len(),
                    rdev: md.rdev(),
                    ino: md.ino(),
                    nlink: md.nlink(),
                    mtime: (md.mtime(), md.mtime_nsec()),
                    ctime: (md.ctime(), md.ctime_nsec()),
                    data,
                    xattrs,
                },
            );
        };
        add("", &fs::symlink_metadata(root).unwrap());
        walk(root, root, &mut add);
        out
    }

    /// Snapshots of every lower of a workspace, to compare at the end.
    pub struct LowerSnapshot(Vec<(PathBuf, BTreeMap<String, Node>)>);

    pub fn snapshot_lowers(ws: &Workspace) -> LowerSnapshot {
        LowerSnapshot(ws.lowers.iter().map(|l| (l.clone(), snapshot(l))).collect())
    }

    /// Panics with the first difference if any lower changed.
    pub fn assert_unchanged(before: &LowerSnapshot) {
        for (root, old) in &before.0 {
            let new = snapshot(root);
            for (k, v) in old {
                match new.get(k) {
                    None => panic!("lower {} lost {k:?}", root.display()),
                    Some(n) => assert_eq!(n, v, "lower {} changed at {k:?}", root.display()),
                }
            }
            for k in new.keys() {
                assert!(old.contains_key(k), "lower {} gained {k:?}", root.display());
            }
        }
    }

    /// A comparable listing of a tree as seen by a user: type, size,
    /// contents (or link target) per name. Whiteouts would show as 'c'.
    pub fn tree_listing(root: &Path) -> BTreeMap<String, (char, u64, Vec<u8>)> {
        let mut out = BTreeMap::new();
        walk(root, root, &mut |rel, md| {
            let p = root.join(rel);
            let kind = type_letter(&md.file_type());
            let (size, data) = match kind {
                'f' => (md.len(), fs::read(&p).unwrap()),
                'l' => (
                    0,
                    fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec(),
                ),
                _ => (0, Vec::new()),
            };
            out.insert(rel.to_string(), (kind, size, data));
        });
        out
    }

    /// Regular files (not whiteouts, not dirs) anywhere below `root`.
    pub fn count_regular_files(root: &Path) -> usize {
        let mut n = 0;
        walk(root, root, &mut |_, md| {
            if md.is_file() {
                n += 1
            }
        });
        n
    }
}
