//! Unit tests of the core on temporary directories, without a mount.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use super::dir::NewKind;
use super::*;

struct Env {
    _dir: tempfile::TempDir,
    lower: std::path::PathBuf,
    upper: std::path::PathBuf,
    ov: Overlay,
}

fn env(populate: impl FnOnce(&Path, &Path)) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let lower = dir.path().join("lower");
    let upper = dir.path().join("upper");
    let work = dir.path().join("work");
    for d in [&lower, &upper, &work] {
        fs::create_dir(d).unwrap();
    }
    populate(&lower, &upper);
    let cfg = Options {
        lowers: vec![lower.clone()],
        checkpoints: 0,
        upper: upper.clone(),
        work,
        policy: crate::policy::Policy::default(),
        read_only: false,
        threads: 1,
        max_watches: None,
    };
    let ov = Overlay::new(&cfg).unwrap();
    Env {
        _dir: dir,
        lower,
        upper,
        ov,
    }
}

fn names(ov: &Overlay, id: u64) -> Vec<String> {
    let inode = ov.inode(id).unwrap();
    let mut v: Vec<String> = ov
        .merged_entries(&inode)
        .unwrap()
        .into_iter()
        .map(|e| e.name.to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn lookup(ov: &Overlay, parent: u64, name: &str) -> Result<Entry> {
    ov.lookup(&Ctx::root(), parent, OsStr::new(name))
}

#[test]
fn upper_wins_and_whiteouts_hide_lower_entries() {
    let e = env(|l, u| {
        fs::write(l.join("a"), "lower").unwrap();
        fs::write(l.join("b"), "lower").unwrap();
        fs::write(u.join("a"), "upper!").unwrap();
        crate::layer::sys::mknodat(
            &crate::layer::sys::open_root(u).unwrap(),
            OsStr::new("b"),
            libc::S_IFCHR,
            0,
        )
        .unwrap();
    });
    let a = lookup(&e.ov, ROOT_ID, "a").unwrap();
    assert_eq!(a.st.st_size, 6);
    assert_eq!(
        lookup(&e.ov, ROOT_ID, "b").unwrap_err(),
        Errno(libc::ENOENT)
    );
    assert_eq!(names(&e.ov, ROOT_ID), vec!["a"]);
}

#[test]
fn opaque_upper_dir_hides_lower_entries() {
    let e = env(|l, u| {
        fs::create_dir(l.join("d")).unwrap();
        fs::write(l.join("d/old"), "x").unwrap();
        fs::create_dir(u.join("d")).unwrap();
        fs::write(u.join("d/new"), "y").unwrap();
        ::xattr::set(u.join("d"), "trusted.overlay.opaque", b"y").unwrap();
    });
    let d = lookup(&e.ov, ROOT_ID, "d").unwrap();
    assert_eq!(names(&e.ov, d.id), vec!["new"]);
    assert_eq!(lookup(&e.ov, d.id, "old").unwrap_err(), Errno(libc::ENOENT));
}

#[test]
fn merged_directory_lists_each_name_once() {
    let e = env(|l, u| {
        fs::create_dir(l.join("d")).unwrap();
        fs::create_dir(u.join("d")).unwrap();
        for i in 0..50 {
            fs::write(l.join(format!("d/f{i}")), "l").unwrap();
        }
        for i in 25..75 {
            fs::write(u.join(format!("d/f{i}")), "u").unwrap();
        }
    });
    let d = lookup(&e.ov, ROOT_ID, "d").unwrap();
    let n = names(&e.ov, d.id);
    assert_eq!(n.len(), 75);
    let mut dedup = n.clone();
    dedup.dedup();
    assert_eq!(dedup.len(), 75);
}

#[test]
fn copy_up_keeps_data_mode_xattrs_and_node_id() {
    let e = env(|l, _| {
        fs::write(l.join("f"), "shared content").unwrap();
        fs::set_permissions(l.join("f"), fs::Permissions::from_mode(0o640)).unwrap();
        ::xattr::set(l.join("f"), "user.tag", b"v1").unwrap();
    });
    let f = lookup(&e.ov, ROOT_ID, "f").unwrap();
    let inode = e.ov.inode(f.id).unwrap();
    e.ov.copy_up(&inode).unwrap();
    let up = e.upper.join("f");
    assert_eq!(fs::read_to_string(&up).unwrap(), "shared content");
    assert_eq!(fs::metadata(&up).unwrap().mode() & 0o7777, 0o640);
    assert_eq!(::xattr::get(&up, "user.tag").unwrap().unwrap(), b"v1");
    // A later lookup finds the upper copy under the same id.
    let again = lookup(&e.ov, ROOT_ID, "f").unwrap();
    assert_eq!(again.id, f.id);
    assert_eq!(again.st.st_ino, f.st.st_ino);
    // The work dir holds nothing afterwards.
    assert_eq!(
        fs::read_dir(e.upper.parent().unwrap().join("work"))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(
        fs::read_to_string(e.lower.join("f")).unwrap(),
        "shared content"
    );
}

#[test]
fn unlink_of_a_lower_file_leaves_a_whiteout_and_rmdir_checks_merged_emptiness() {
    let e = env(|l, _| {
        fs::write(l.join("f"), "x").unwrap();
        fs::create_dir(l.join("d")).unwrap();
        fs::write(l.join("d/inner"), "x").unwrap();
    });
    let c = Ctx::root();
    e.ov.unlink(&c, ROOT_ID, OsStr::new("f")).unwrap();
    let wh = fs::symlink_metadata(e.upper.join("f")).unwrap();
    assert!(wh.file_type().is_char_device());
    assert_eq!(wh.rdev(), 0);
    assert!(e.lower.join("f").exists());
    assert_eq!(
        e.ov.rmdir(&c, ROOT_ID, OsStr::new("d")).unwrap_err(),
        Errno(libc::ENOTEMPTY)
    );
    let d = lookup(&e.ov, ROOT_ID, "d").unwrap();
    e.ov.unlink(&c, d.id, OsStr::new("inner")).unwrap();
    e.ov.rmdir(&c, ROOT_ID, OsStr::new("d")).unwrap();
    assert_eq!(
        lookup(&e.ov, ROOT_ID, "d").unwrap_err(),
        Errno(libc::ENOENT)
    );
    // mkdir over the whiteout gives an empty, opaque directory.
    let (nd, _) =
        e.ov.create_object(&c, ROOT_ID, OsStr::new("d"), NewKind::Dir { mode: 0o755 })
            .unwrap();
    assert!(names(&e.ov, nd.id).is_empty());
    assert_eq!(
        ::xattr::get(e.upper.join("d"), "trusted.overlay.opaque")
            .unwrap()
            .unwrap(),
        b"y"
    );
}

#[test]
fn renamed_lower_directory_keeps_its_content_through_a_redirect() {
    let e = env(|l, _| {
        fs::create_dir_all(l.join("src/sub")).unwrap();
        fs::write(l.join("src/sub/file"), "deep").unwrap();
    });
    let c = Ctx::root();
    lookup(&e.ov, ROOT_ID, "src").unwrap();
    e.ov.rename(
        &c,
        ROOT_ID,
        OsStr::new("src"),
        ROOT_ID,
        OsStr::new("dst"),
        0,
    )
    .unwrap();
    assert_eq!(
        lookup(&e.ov, ROOT_ID, "src").unwrap_err(),
        Errno(libc::ENOENT)
    );
    let dst = lookup(&e.ov, ROOT_ID, "dst").unwrap();
    let sub = lookup(&e.ov, dst.id, "sub").unwrap();
    assert_eq!(names(&e.ov, sub.id), vec!["file"]);
    assert_eq!(
        ::xattr::get(e.upper.join("dst"), "trusted.overlay.redirect")
            .unwrap()
            .unwrap(),
        b"/src"
    );
    assert!(e.lower.join("src/sub/file").exists());
}

#[test]
fn names_that_are_not_one_component_are_rejected() {
    for bad in ["", ".", "..", "a/b"] {
        assert_eq!(
            guard::check_name(OsStr::new(bad)).unwrap_err(),
            Errno(libc::EINVAL),
            "{bad:?}"
        );
    }
    assert!(guard::check_name(OsStr::new("ok.txt")).is_ok());
}

#[test]
fn rename_noreplace_and_exchange_across_layers() {
    let e = env(|l, u| {
        fs::write(l.join("a"), "A").unwrap();
        fs::write(u.join("b"), "B").unwrap();
    });
    let c = Ctx::root();
    lookup(&e.ov, ROOT_ID, "a").unwrap();
    lookup(&e.ov, ROOT_ID, "b").unwrap();
    let noreplace = crate::layer::sys::RENAME_NOREPLACE;
    assert_eq!(
        e.ov.rename(
            &c,
            ROOT_ID,
            OsStr::new("a"),
            ROOT_ID,
            OsStr::new("b"),
            noreplace
        )
        .unwrap_err(),
        Errno(libc::EEXIST)
    );
    e.ov.rename(
        &c,
        ROOT_ID,
        OsStr::new("a"),
        ROOT_ID,
        OsStr::new("b"),
        crate::layer::sys::RENAME_EXCHANGE,
    )
    .unwrap();
    assert_eq!(fs::read_to_string(e.upper.join("a")).unwrap(), "B");
    assert_eq!(fs::read_to_string(e.upper.join("b")).unwrap(), "A");
}
