//! The full POSIX surface through a real mount: directory renames across
//! layers (checked against kernel overlayfs mounting the same layers),
//! renameat2 flags, hard links, xattrs and ACLs, locks, mmap, fallocate,
//! SEEK_DATA/SEEK_HOLE, copy_file_range, O_APPEND/O_DIRECT/O_TMPFILE,
//! utimensat, truncate, lower changes made from outside while mounted, and
//! permission checks for a non-root user.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirEntryExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::basic::fsutil::*;
use crate::harness::eventually as poll_until;
use crate::harness::{errno, KernelOverlay, Workspace};

// ---------------------------------------------------------------- helpers

/// Unmounts layerfs, mounts the same layers with kernel overlayfs and
/// checks it shows exactly `seen` (the listing layerfs showed).
fn assert_kernel_overlay_agrees(
    ws: &Workspace,
    m: crate::harness::Mount,
    seen: &BTreeMap<String, (char, u64, Vec<u8>)>,
) {
    assert!(m.unmount(), "layerfs exits cleanly on unmount");
    let k = KernelOverlay::of_workspace(ws)
        .unwrap_or_else(|e| panic!("kernel overlay mount failed: {e}"));
    let kernel = tree_listing(k.path());
    let only_layerfs: Vec<&String> = seen.keys().filter(|n| !kernel.contains_key(*n)).collect();
    let only_kernel: Vec<&String> = kernel.keys().filter(|n| !seen.contains_key(*n)).collect();
    assert!(
        only_layerfs.is_empty() && only_kernel.is_empty(),
        "kernel overlayfs disagrees on names: only in layerfs {only_layerfs:?}, only in kernel {only_kernel:?}"
    );
    for (n, v) in seen {
        assert_eq!(&kernel[n], v, "kernel overlayfs disagrees on {n}");
    }
}

fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> Result<(), i32> {
    let (a, b) = (cpath(from), cpath(to));
    // SAFETY: a and b are valid NUL-terminated paths that outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

fn rw(p: &Path) -> fs::File {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .unwrap_or_else(|e| panic!("open rw {}: {e}", p.display()))
}

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| ((i * 31 + seed) % 251) as u8)
        .collect()
}

/// How long a change made directly in a lower may take to show through the
/// mount (the design promises the 1 s cache timeout).
const LOWER_CHANGE_TIMEOUT: Duration = Duration::from_millis(1500);

// ---------------------------------------------------------------- rename dirs

fn project_tree(l: &Path) {
    write(&l.join("proj/README"), b"readme");
    write(&l.join("proj/src/main.rs"), b"fn main() {}");
    write(&l.join("proj/src/deep/er/mod.rs"), b"// deep");
    fs::create_dir_all(l.join("proj/empty")).unwrap();
    std::os::unix::fs::symlink("src/main.rs", l.join("proj/link")).unwrap();
    fs::create_dir(l.join("elsewhere")).unwrap();
}

#[test]
fn a_lower_directory_with_nested_files_can_be_renamed_twice_and_its_contents_follow() {
    let ws = Workspace::new();
    project_tree(ws.lower());
    let before = snapshot_lowers(&ws);
    let original = tree_listing(&ws.lower().join("proj"));
    let m = ws.mount();
    fs::rename(m.p("proj"), m.p("proj2"))
        .unwrap_or_else(|e| panic!("rename of a lower dir: {e} (EXDEV = {})", libc::EXDEV));
    assert_eq!(
        errno(&fs::symlink_metadata(m.p("proj")).unwrap_err()),
        libc::ENOENT
    );
    assert_eq!(
        tree_listing(&m.p("proj2")),
        original,
        "contents follow the first rename"
    );
    fs::rename(m.p("proj2"), m.p("elsewhere/proj3")).unwrap();
    assert_eq!(
        errno(&fs::symlink_metadata(m.p("proj2")).unwrap_err()),
        libc::ENOENT
    );
    assert_eq!(
        tree_listing(&m.p("elsewhere/proj3")),
        original,
        "and the second"
    );
    // The renamed tree is fully usable: edit, create, delete inside it.
    write(&m.p("elsewhere/proj3/src/main.rs"), b"fn main() { edited }");
    write(&m.p("elsewhere/proj3/src/new.rs"), b"new");
    fs::remove_file(m.p("elsewhere/proj3/README")).unwrap();
    // A new directory under the old name starts empty.
    fs::create_dir(m.p("proj")).unwrap();
    assert!(list_names(&m.p("proj")).is_empty());
    let seen = tree_listing(&m.path);
    assert_eq!(
        list_names(&m.p("elsewhere/proj3/src")),
        set(&["deep", "main.rs", "new.rs"])
    );
    assert!(
        get_trusted(
            &ws.upper.join("elsewhere/proj3"),
            "trusted.overlay.redirect"
        )
        .is_some(),
        "the moved dir carries a redirect in the upper"
    );
    assert!(
        count_regular_files(&ws.upper) <= 2,
        "rename did not copy the tree: upper has {:?}",
        walk_names(&ws.upper)
    );
    assert_kernel_overlay_agrees(&ws, m, &seen);
    assert_unchanged(&before);
}

#[test]
fn renaming_a_merged_directory_keeps_the_entries_of_every_layer() {
    let ws = Workspace::with_lowers(2);
    write(&ws.lowers[1].join("m/bottom"), b"b");
    write(&ws.lowers[1].join("m/sub/deep_bottom"), b"db");
    write(&ws.lowers[0].join("m/top"), b"t");
    write(&ws.lowers[0].join("m/sub/deep_top"), b"dt");
    write(&ws.lowers[0].join("m/gone"), b"g");
    write(&ws.upper.join("m/up"), b"u");
    make_whiteout(&ws.upper.join("m/gone"));
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let original = tree_listing(&m.p("m"));
    assert_eq!(list_names(&m.p("m")), set(&["bottom", "sub", "top", "up"]));
    fs::rename(m.p("m"), m.p("renamed")).unwrap();
    assert_eq!(tree_listing(&m.p("renamed")), original);
    assert_eq!(
        errno(&fs::symlink_metadata(m.p("m")).unwrap_err()),
        libc::ENOENT
    );
    fs::rename(m.p("renamed/sub"), m.p("sub_out")).unwrap();
    assert_eq!(
        list_names(&m.p("sub_out")),
        set(&["deep_bottom", "deep_top"])
    );
    let seen = tree_listing(&m.path);
    assert_kernel_overlay_agrees(&ws, m, &seen);
    assert_unchanged(&before);
}

#[test]
fn kernel_overlayfs_mounting_the_same_layers_shows_the_same_tree() {
    let ws = Workspace::with_lowers(2);
    for (i, l) in ws.lowers.iter().enumerate() {
        for d in ["a", "b", "c/d/e"] {
            write(&l.join(format!("{d}/f{i}")), format!("{d}{i}").as_bytes());
        }
        write(&l.join("shared"), format!("shared{i}").as_bytes());
        std::os::unix::fs::symlink("shared", l.join(format!("sl{i}"))).unwrap();
    }
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let script = r#"set -e
        mv a a_moved
        mv c/d c_d_moved
        mv b/f0 b/f0_renamed
        mv b/f1 a_moved/
        rm -rf c
        mkdir c && echo new > c/new
        echo edit >> shared
        rm sl0
        mkdir a_moved/inner && mv c_d_moved a_moved/inner/
        ln -s a_moved sl_new
        mkdir x && mv x a_moved/inner/c_d_moved/
    "#;
    crate::harness::sh(&m.path, script);
    let seen = tree_listing(&m.path);
    assert!(seen.contains_key("a_moved/inner/c_d_moved/e/f0"));
    assert!(seen.contains_key("a_moved/inner/c_d_moved/e/f1"));
    assert_eq!(seen["c/new"].2, b"new\n");
    assert_kernel_overlay_agrees(&ws, m, &seen);
    assert_unchanged(&before);
}

// ---------------------------------------------------------------- renameat2

#[test]
fn renameat2_noreplace_fails_with_eexist_when_the_target_exists() {
    let ws = Workspace::new();
    write(&ws.lower().join("a"), b"a");
    write(&ws.lower().join("b"), b"b");
    write(&ws.lower().join("deleted"), b"d");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    write(&m.p("u"), b"u");
    let nr = libc::RENAME_NOREPLACE;
    assert_eq!(
        renameat2(&m.p("a"), &m.p("b"), nr),
        Err(libc::EEXIST),
        "lower target"
    );
    assert_eq!(
        renameat2(&m.p("u"), &m.p("a"), nr),
        Err(libc::EEXIST),
        "upper→lower target"
    );
    assert_eq!(
        renameat2(&m.p("a"), &m.p("u"), nr),
        Err(libc::EEXIST),
        "lower→upper target"
    );
    assert_eq!(fs::read(m.p("a")).unwrap(), b"a");
    assert_eq!(fs::read(m.p("b")).unwrap(), b"b");
    fs::remove_file(m.p("deleted")).unwrap();
    assert_eq!(
        renameat2(&m.p("a"), &m.p("deleted"), nr),
        Ok(()),
        "onto a whiteout"
    );
    assert_eq!(
        renameat2(&m.p("u"), &m.p("fresh"), nr),
        Ok(()),
        "onto nothing"
    );
    assert_eq!(fs::read(m.p("deleted")).unwrap(), b"a");
    assert_eq!(fs::read(m.p("fresh")).unwrap(), b"u");
    assert_eq!(list_names(&m.path), set(&["b", "deleted", "fresh"]));
    let seen = tree_listing(&m.path);
    assert_kernel_overlay_agrees(&ws, m, &seen);
    assert_unchanged(&before);
}

#[test]
fn renameat2_exchange_swaps_files_across_layers() {
    let ws = Workspace::new();
    write(&ws.lower().join("low"), b"from lower");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    write(&m.p("up"), b"from upper");
    let ino_low = fs::symlink_metadata(m.p("low")).unwrap().ino();
    let ino_up = fs::symlink_metadata(m.p("up")).unwrap().ino();
    renameat2(&m.p("low"), &m.p("up"), libc::RENAME_EXCHANGE).expect("exchange");
    assert_eq!(fs::read(m.p("low")).unwrap(), b"from upper");
    assert_eq!(fs::read(m.p("up")).unwrap(), b"from lower");
    assert_eq!(
        fs::symlink_metadata(m.p("low")).unwrap().ino(),
        ino_up,
        "inodes move"
    );
    assert_eq!(fs::symlink_metadata(m.p("up")).unwrap().ino(), ino_low);
    assert_eq!(
        renameat2(&m.p("low"), &m.p("missing"), libc::RENAME_EXCHANGE),
        Err(libc::ENOENT)
    );
    let seen = tree_listing(&m.path);
    assert_kernel_overlay_agrees(&ws, m, &seen);
    assert_unchanged(&before);
}

#[test]
fn renameat2_exchange_swaps_a_lower_directory_with_a_file() {
    let ws = Workspace::new();
    write(&ws.lower().join("dir/child"), b"c");
    write(&ws.lower().join("dir/sub/deeper"), b"d");
    write(&ws.lower().join("file"), b"f");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    renameat2(&m.p("dir"), &m.p("file"), libc::RENAME_EXCHANGE).expect("exchange dir<->file");
    assert!(fs::symlink_metadata(m.p("dir")).unwrap().is_file());
    assert_eq!(fs::read(m.p("dir")).unwrap(), b"f");
    assert!(fs::symlink_metadata(m.p("file")).unwrap().is_dir());
    assert_eq!(list_names(&m.p("file")), set(&["child", "sub"]));
    assert_eq!(fs::read(m.p("file/sub/deeper")).unwrap(), b"d");
    let seen = tree_listing(&m.path);
    assert_kernel_overlay_agrees(&ws, m, &seen);
    assert_unchanged(&before);
}

// ---------------------------------------------------------------- rename over

#[test]
fn rename_over_an_existing_lower_file_replaces_it() {
    let ws = Workspace::new();
    write(&ws.lower().join("target"), b"old lower content");
    write(&ws.lower().join("lsrc"), b"lower source");
    write(&ws.lower().join("target2"), b"old 2");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    write(&m.p("usrc"), b"upper source");
    fs::rename(m.p("usrc"), m.p("target")).unwrap();
    fs::rename(m.p("lsrc"), m.p("target2")).unwrap();
    assert_eq!(fs::read(m.p("target")).unwrap(), b"upper source");
    assert_eq!(fs::read(m.p("target2")).unwrap(), b"lower source");
    assert_eq!(list_names(&m.path), set(&["target", "target2"]));
    let seen = tree_listing(&m.path);
    assert_kernel_overlay_agrees(&ws, m, &seen);
    assert!(fs::symlink_metadata(ws.upper.join("target"))
        .unwrap()
        .is_file());
    assert_whiteout(&ws.upper.join("lsrc"));
    assert_unchanged(&before);
}

#[test]
fn rename_of_a_directory_over_an_empty_merged_directory_replaces_it() {
    let ws = Workspace::new();
    write(&ws.lower().join("target/was_here"), b"x");
    write(&ws.lower().join("src/s"), b"s");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    fs::remove_file(m.p("target/was_here")).unwrap();
    assert!(list_names(&m.p("target")).is_empty());
    fs::rename(m.p("src"), m.p("target")).expect("rename over an empty merged dir");
    assert_eq!(
        list_names(&m.p("target")),
        set(&["s"]),
        "no lower child comes back"
    );
    assert_eq!(
        errno(&fs::symlink_metadata(m.p("src")).unwrap_err()),
        libc::ENOENT
    );
    // And over a non-empty one: ENOTEMPTY.
    fs::create_dir(m.p("other")).unwrap();
    write(&m.p("other/o"), b"o");
    let e = fs::rename(m.p("other"), m.p("target")).unwrap_err();
    assert!(matches!(errno(&e), libc::ENOTEMPTY | libc::EEXIST), "{e}");
    let seen = tree_listing(&m.path);
    assert_kernel_overlay_agrees(&ws, m, &seen);
    assert_unchanged(&before);
}

#[test]
fn rename_onto_a_name_deleted_earlier_works() {
    let ws = Workspace::new();
    write(&ws.lower().join("w"), b"deleted");
    write(&ws.lower().join("wd/c"), b"c");
    write(&ws.lower().join("src"), b"source");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    fs::remove_file(m.p("w")).unwrap();
    fs::rename(m.p("src"), m.p("w")).unwrap();
    assert_eq!(fs::read(m.p("w")).unwrap(), b"source");
    crate::harness::sh(
        &m.path,
        "rm -rf wd && mkdir newdir && touch newdir/n && mv newdir wd",
    );
    assert_eq!(list_names(&m.p("wd")), set(&["n"]));
    let seen = tree_listing(&m.path);
    assert_kernel_overlay_agrees(&ws, m, &seen);
    assert!(fs::symlink_metadata(ws.upper.join("w")).unwrap().is_file());
    assert_unchanged(&before);
}

// ---------------------------------------------------------------- hard links

#[test]
fn link_of_a_lower_file_gives_two_names_for_one_inode() {
    let ws = Workspace::new();
    write(&ws.lower().join("orig"), b"shared");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let ino = fs::symlink_metadata(m.p("orig")).unwrap().ino();
    fs::hard_link(m.p("orig"), m.p("alias")).unwrap();
    let a = fs::symlink_metadata(m.p("orig")).unwrap();
    let b = fs::symlink_metadata(m.p("alias")).unwrap();
    assert_eq!(a.ino(), ino, "st_ino survives the copy-up done by link");
    assert_eq!(b.ino(), ino, "both names, one inode");
    assert_eq!((a.nlink(), b.nlink()), (2, 2));
    fs::OpenOptions::new()
        .append(true)
        .open(m.p("alias"))
        .unwrap()
        .write_all(b"+via alias")
        .unwrap();
    assert_eq!(fs::read(m.p("orig")).unwrap(), b"shared+via alias");
    fs::OpenOptions::new()
        .append(true)
        .open(m.p("orig"))
        .unwrap()
        .write_all(b"+via orig")
        .unwrap();
    assert_eq!(
        fs::read(m.p("alias")).unwrap(),
        b"shared+via alias+via orig"
    );
    fs::remove_file(m.p("orig")).unwrap();
    assert_eq!(fs::symlink_metadata(m.p("alias")).unwrap().nlink(), 1);
    assert_eq!(
        fs::read(m.p("alias")).unwrap(),
        b"shared+via alias+via orig"
    );
    drop(m);
    assert_whiteout(&ws.upper.join("orig"));
    assert_eq!(
        fs::read(ws.upper.join("alias")).unwrap(),
        b"shared+via alias+via orig"
    );
    assert_unchanged(&before);
}

#[test]
fn link_of_upper_files_counts_links_and_shares_data() {
    let ws = Workspace::new();
    fs::create_dir(ws.lower().join("d")).unwrap();
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    write(&m.p("u"), b"upper");
    fs::hard_link(m.p("u"), m.p("d/u2")).unwrap();
    fs::hard_link(m.p("u"), m.p("u3")).unwrap();
    let ino = fs::symlink_metadata(m.p("u")).unwrap().ino();
    for n in ["u", "d/u2", "u3"] {
        let md = fs::symlink_metadata(m.p(n)).unwrap();
        assert_eq!((md.ino(), md.nlink()), (ino, 3), "{n}");
    }
    rw(&m.p("u3")).write_all_at(b"UP", 0).unwrap();
    assert_eq!(fs::read(m.p("d/u2")).unwrap(), b"UPper");
    fs::remove_file(m.p("u")).unwrap();
    assert_eq!(fs::symlink_metadata(m.p("u3")).unwrap().nlink(), 2);
    fs::remove_file(m.p("d/u2")).unwrap();
    assert_eq!(fs::symlink_metadata(m.p("u3")).unwrap().nlink(), 1);
    drop(m);
    assert_eq!(
        fs::symlink_metadata(ws.upper.join("u3")).unwrap().nlink(),
        1
    );
    assert_unchanged(&before);
}

/// Each name of a lower file with several links is an object of its own
/// through the mount (DESIGN.md §2, "Hard links in a lower"). This used to
/// be one object with one st_ino, but then a write through one name was
/// judged by whichever name was looked up last, and a readonly name could
/// be written through a free alias (the path policy must judge a write by
/// the name it comes through). As in kernel overlayfs without `index`, a
/// copy-up breaks the link; unlike it, st_ino tells the truth: two names,
/// two objects, one link each, so `tar`, `cp -a` and `rsync -H` never pair
/// names whose contents may differ.
#[test]
fn hard_links_in_the_lower_are_one_object_per_name() {
    let ws = Workspace::new();
    write(&ws.lower().join("one"), b"linked");
    fs::create_dir(ws.lower().join("sub")).unwrap();
    fs::hard_link(ws.lower().join("one"), ws.lower().join("sub/two")).unwrap();
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let a = fs::symlink_metadata(m.p("one")).unwrap();
    let b = fs::symlink_metadata(m.p("sub/two")).unwrap();
    assert_ne!(a.ino(), b.ino(), "one object per name");
    assert_eq!((a.nlink(), b.nlink()), (1, 1));
    assert_eq!(fs::read(m.p("sub/two")).unwrap(), b"linked");
    // Stable: the same st_ino again, in readdir too, and across copy-up.
    let listed: Vec<(String, u64)> = fs::read_dir(m.p("sub"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), e.ino())
        })
        .collect();
    assert_eq!(listed, vec![("two".to_string(), b.ino())]);
    assert_eq!(fs::symlink_metadata(m.p("one")).unwrap().ino(), a.ino());
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(m.p("one"))
        .unwrap();
    f.write_all(b" more").unwrap();
    drop(f);
    assert_eq!(fs::symlink_metadata(m.p("one")).unwrap().ino(), a.ino());
    assert_eq!(fs::symlink_metadata(m.p("sub/two")).unwrap().ino(), b.ino());
    // The copy-up broke the link: the other name keeps the shared content.
    assert_eq!(fs::read(m.p("one")).unwrap(), b"linked more");
    assert_eq!(fs::read(m.p("sub/two")).unwrap(), b"linked");
    drop(m);
    assert_eq!(walk_names(&ws.upper), vec!["one".to_string()]);
    assert_unchanged(&before);
}

/// Found by scripts/stress: one name of a lower hard-link pair removed
/// (or replaced by a rename), then the object written through another
/// name. The copy-up went to the removed name and failed with EEXIST on
/// its whiteout: `echo >> one` said "File exists".
#[test]
fn writing_a_lower_hard_link_after_its_other_name_went_away() {
    let ws = Workspace::new();
    write(&ws.lower().join("one"), b"linked\n");
    fs::create_dir(ws.lower().join("sub")).unwrap();
    fs::hard_link(ws.lower().join("one"), ws.lower().join("sub/two")).unwrap();
    fs::hard_link(ws.lower().join("one"), ws.lower().join("three")).unwrap();
    write(&ws.lower().join("other"), b"other\n");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    for name in ["one", "sub/two", "three"] {
        fs::symlink_metadata(m.p(name)).unwrap();
    }
    // Unlinked: the whiteout stands at `sub/two`.
    fs::remove_file(m.p("sub/two")).unwrap();
    append(&m.p("one"), b"more\n");
    assert_eq!(fs::read(m.p("one")).unwrap(), b"linked\nmore\n");
    // Replaced by a rename: `other` now stands at `one`.
    fs::rename(m.p("other"), m.p("one")).unwrap();
    append(&m.p("three"), b"again\n");
    assert_eq!(fs::read(m.p("one")).unwrap(), b"other\n");
    assert!(fs::symlink_metadata(m.p("sub/two")).is_err());
    // `three` is an object of its own (each name of a lower hard link is,
    // see `hard_links_in_the_lower_are_one_object_per_name`): the write
    // through `one` copied up `one` alone, so `three` started from the
    // shared content.
    assert_eq!(fs::read(m.p("three")).unwrap(), b"linked\nagain\n");
    drop(m);
    assert_unchanged(&before);
}

fn append(path: &Path, data: &[u8]) {
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {} for append: {e}", path.display()));
    f.write_all(data).unwrap();
}

// ---------------------------------------------------------------- xattrs, ACLs

#[test]
fn user_xattrs_can_be_set_read_listed_and_removed() {
    let ws = Workspace::new();
    write(&ws.lower().join("f"), b"x");
    xattr::set(ws.lower().join("f"), "user.orig", b"o").unwrap();
    fs::create_dir(ws.lower().join("d")).unwrap();
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let f = m.p("f");
    assert_eq!(
        xattr::get(&f, "user.orig").unwrap().as_deref(),
        Some(&b"o"[..])
    );
    let names = |p: &Path| -> Vec<String> {
        let mut v: Vec<String> = xattr::list(p)
            .unwrap()
            .map(|n| n.to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&f), vec!["user.orig"]);
    xattr::set(&f, "user.new", b"value with \0 nul").unwrap();
    assert_eq!(names(&f), vec!["user.new", "user.orig"]);
    assert_eq!(
        xattr::get(&f, "user.new").unwrap().as_deref(),
        Some(&b"value with \0 nul"[..])
    );
    xattr::remove(&f, "user.orig").unwrap();
    assert_eq!(names(&f), vec!["user.new"]);
    assert_eq!(xattr::get(&f, "user.orig").unwrap(), None);
    assert_eq!(
        errno(&xattr::remove(&f, "user.orig").unwrap_err()),
        libc::ENODATA
    );
    // A large value, and an xattr on a lower directory.
    let big = pattern(3000, 1);
    xattr::set(m.p("d"), "user.big", &big).unwrap();
    assert_eq!(xattr::get(m.p("d"), "user.big").unwrap(), Some(big.clone()));
    assert_eq!(list_names(&m.path), set(&["d", "f"]));
    drop(m);
    let u = ws.upper.join("f");
    assert_eq!(
        xattr::get(&u, "user.new").unwrap().as_deref(),
        Some(&b"value with \0 nul"[..])
    );
    assert_eq!(
        xattr::get(&u, "user.orig").unwrap(),
        None,
        "removed in the upper"
    );
    assert_eq!(
        xattr::get(ws.upper.join("d"), "user.big").unwrap(),
        Some(big)
    );
    assert_unchanged(&before);
}

#[test]
fn private_overlay_xattrs_are_never_listed_nor_settable_through_the_mount() {
    let ws = Workspace::new();
    write(&ws.lower().join("tree/child"), b"c");
    write(&ws.lower().join("moveme/x"), b"x");
    write(&ws.lower().join("f"), b"f");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    crate::harness::sh(
        &m.path,
        "rm -rf tree && mkdir tree && mv moveme moved && rm f && touch f",
    );
    let up_tree = ws.upper.join("tree");
    assert_eq!(
        get_trusted(&up_tree, "trusted.overlay.opaque").as_deref(),
        Some("y")
    );
    for n in ["tree", "moved", "f", ""] {
        let p = if n.is_empty() { m.path.clone() } else { m.p(n) };
        let listed: Vec<String> = xattr::list(&p)
            .unwrap()
            .map(|x| x.to_string_lossy().into_owned())
            .collect();
        assert!(
            listed
                .iter()
                .all(|x| !x.starts_with("trusted.overlay.") && !x.starts_with("user.overlay.")),
            "{n:?} lists private xattrs: {listed:?}"
        );
        let dump = crate::harness::sh(&m.path, &format!("getfattr -d -m - ./{n} 2>&1"));
        assert!(
            !dump.contains("overlay."),
            "getfattr shows private xattrs of {n:?}: {dump}"
        );
        match xattr::get(&p, "trusted.overlay.opaque") {
            Ok(None) => {}
            Ok(Some(v)) => panic!("{n:?}: trusted.overlay.opaque readable: {v:?}"),
            Err(e) => assert!(
                matches!(
                    errno(&e),
                    libc::ENODATA | libc::EPERM | libc::EACCES | libc::EOPNOTSUPP
                ),
                "{n:?}: get: {e}"
            ),
        }
    }
    // Setting or removing them is refused. (Kernel overlayfs since 6.7
    // instead stores such names escaped as trusted.overlay.overlay.*; the
    // layerfs design refuses them.)
    let refused = |r: std::io::Result<()>, what: &str| {
        let e = r.err().unwrap_or_else(|| panic!("{what} was allowed"));
        assert!(
            matches!(
                errno(&e),
                libc::EPERM | libc::EACCES | libc::EOPNOTSUPP | libc::ENODATA
            ),
            "{what}: {e}"
        );
    };
    refused(
        xattr::set(m.p("f"), "trusted.overlay.opaque", b"y"),
        "set opaque on a file",
    );
    refused(
        xattr::set(m.p("moved"), "trusted.overlay.opaque", b"y"),
        "set opaque on a dir",
    );
    refused(
        xattr::set(m.p("moved"), "trusted.overlay.redirect", b"/x"),
        "set redirect",
    );
    refused(
        xattr::remove(m.p("tree"), "trusted.overlay.opaque"),
        "remove opaque",
    );
    refused(
        xattr::remove(m.p("moved"), "trusted.overlay.redirect"),
        "remove redirect",
    );
    // The merge is unaffected.
    assert_eq!(
        list_names(&m.p("moved")),
        set(&["x"]),
        "moved dir still shows lower content"
    );
    assert!(list_names(&m.p("tree")).is_empty());
    drop(m);
    assert_eq!(
        get_trusted(&up_tree, "trusted.overlay.opaque").as_deref(),
        Some("y")
    );
    assert_eq!(
        get_trusted(&ws.upper.join("moved"), "trusted.overlay.opaque"),
        None
    );
    assert_unchanged(&before);
}

#[test]
fn posix_acls_set_with_setfacl_are_shown_by_getfacl() {
    if Command::new("setfacl").arg("--version").output().is_err() {
        eprintln!("note: setfacl missing, skipping the ACL test");
        return;
    }
    let ws = Workspace::new();
    write(&ws.lower().join("file"), b"acl");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    crate::harness::sh(&m.path, "setfacl -m u:65534:r file");
    let acl = crate::harness::sh(&m.path, "getfacl -n file");
    assert!(acl.contains("user:65534:r--"), "getfacl: {acl}");
    drop(m);
    let upper_acl = crate::harness::sh(&ws.upper, "getfacl -n file");
    assert!(
        upper_acl.contains("user:65534:r--"),
        "upper acl: {upper_acl}"
    );
    assert_unchanged(&before);
}

// ---------------------------------------------------------------- locks

#[test]
fn flock_excludes_a_second_process() {
    let ws = Workspace::new();
    write(&ws.lower().join("lockme"), b"l");
    let m = ws.mount();
    let f = fs::File::open(m.p("lockme")).unwrap();
    // SAFETY: f owns an open descriptor for the duration of the call.
    assert_eq!(
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    let try_lock = || {
        Command::new("flock")
            .args(["-n", "-E", "42"])
            .arg(m.p("lockme"))
            .arg("true")
            .status()
            .unwrap()
            .code()
    };
    assert_eq!(
        try_lock(),
        Some(42),
        "a second process cannot take the lock"
    );
    // SAFETY: f owns an open descriptor for the duration of the call.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) }, 0);
    assert_eq!(try_lock(), Some(0), "free after unlock");
}

#[test]
fn fcntl_setlk_excludes_a_second_process() {
    let ws = Workspace::new();
    write(&ws.lower().join("rec"), b"0123456789");
    let m = ws.mount();
    let f = rw(&m.p("rec"));
    // SAFETY: flock is plain old data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = 0;
    fl.l_len = 0;
    // SAFETY: f owns an open fd and fl is an initialised flock; both outlive the call.
    assert_eq!(
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &fl) },
        0,
        "F_SETLK: {}",
        std::io::Error::last_os_error()
    );
    let script = "import fcntl, sys\n\
                  f = open(sys.argv[1], 'r+')\n\
                  try:\n    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('acquired')\n\
                  except OSError as e:\n    print('blocked', e.errno)\n";
    let try_lock = || {
        let out = Command::new("python3")
            .args(["-c", script])
            .arg(m.p("rec"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let got = try_lock();
    assert!(
        got == format!("blocked {}", libc::EAGAIN) || got == format!("blocked {}", libc::EACCES),
        "while held: {got}"
    );
    // F_GETLK from this process sees no conflict with itself; unlock frees it.
    fl.l_type = libc::F_UNLCK as _;
    // SAFETY: f owns an open fd and fl is an initialised flock; both outlive the call.
    assert_eq!(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &fl) }, 0);
    assert_eq!(try_lock(), "acquired");
}

// ---------------------------------------------------------------- mmap etc.

#[test]
fn a_shared_writable_mmap_of_a_lower_file_writes_to_the_upper_copy() {
    let ws = Workspace::new();
    let orig = pattern(3 * 4096, 5);
    write(&ws.lower().join("mm"), &orig);
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let f = rw(&m.p("mm"));
    let len = orig.len();
    // SAFETY: f's fd is open read-write; s spans exactly the len mapped bytes, unused after munmap.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        let s = std::slice::from_raw_parts_mut(p as *mut u8, len);
        assert_eq!(&s[..], &orig[..], "mapping shows the lower data");
        s[100..104].copy_from_slice(b"MMAP");
        s[len - 4..].copy_from_slice(b"TAIL");
        assert_eq!(libc::msync(p, len, libc::MS_SYNC), 0);
        assert_eq!(libc::munmap(p, len), 0);
    }
    let mut want = orig.clone();
    want[100..104].copy_from_slice(b"MMAP");
    want[len - 4..].copy_from_slice(b"TAIL");
    let mut via_fd = vec![0u8; len];
    f.read_exact_at(&mut via_fd, 0).unwrap();
    assert_eq!(via_fd, want, "read on the same fd");
    drop(f);
    assert_eq!(fs::read(m.p("mm")).unwrap(), want, "read via a new open");
    drop(m);
    assert_eq!(fs::read(ws.upper.join("mm")).unwrap(), want, "upper copy");
    assert_unchanged(&before);
}

#[test]
fn fallocate_allocates_and_punches_holes() {
    let ws = Workspace::new();
    write(&ws.lower().join("lowfile"), &vec![0xAAu8; 65536]);
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("new"))
        .unwrap();
    let fd = f.as_raw_fd();
    // SAFETY: fd is an open descriptor owned by f for the duration of the call.
    assert_eq!(
        unsafe { libc::fallocate(fd, 0, 0, 1 << 20) },
        0,
        "fallocate: {}",
        std::io::Error::last_os_error()
    );
    let md = f.metadata().unwrap();
    assert_eq!(md.len(), 1 << 20);
    assert!(md.blocks() >= 2048, "blocks allocated: {}", md.blocks());
    f.write_all_at(&vec![0xAAu8; 65536], 0).unwrap();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fd is an open descriptor owned by f for the duration of the call.
    assert_eq!(
        unsafe { libc::fallocate(fd, punch, 4096, 8192) },
        0,
        "punch: {}",
        std::io::Error::last_os_error()
    );
    assert_eq!(f.metadata().unwrap().len(), 1 << 20, "KEEP_SIZE");
    let mut buf = vec![0u8; 65536];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf[..4096].iter().all(|&b| b == 0xAA));
    assert!(
        buf[4096..12288].iter().all(|&b| b == 0),
        "punched range reads zeros"
    );
    assert!(buf[12288..].iter().all(|&b| b == 0xAA));
    // KEEP_SIZE allocation past EOF does not change the size.
    // SAFETY: fd is an open descriptor owned by f for the duration of the call.
    assert_eq!(
        unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 1 << 20, 1 << 20) },
        0
    );
    assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    drop(f);
    // On a lower file: copy-up, then punch.
    let g = rw(&m.p("lowfile"));
    // SAFETY: g owns an open descriptor for the duration of the call.
    assert_eq!(unsafe { libc::fallocate(g.as_raw_fd(), punch, 0, 4096) }, 0);
    drop(g);
    let got = fs::read(m.p("lowfile")).unwrap();
    assert_eq!(got.len(), 65536);
    assert!(got[..4096].iter().all(|&b| b == 0) && got[4096..].iter().all(|&b| b == 0xAA));
    drop(m);
    assert_eq!(fs::read(ws.upper.join("lowfile")).unwrap(), got);
    assert_unchanged(&before);
}

#[test]
fn lseek_seek_data_and_seek_hole_find_the_extents_of_a_sparse_file() {
    let ws = Workspace::new();
    const MB: i64 = 1 << 20;
    // A sparse lower file: data at 0 and at 2 MiB, size 3 MiB.
    let lf = fs::File::create(ws.lower().join("sparse_lower")).unwrap();
    lf.write_all_at(&[1u8; 4096], 0).unwrap();
    lf.write_all_at(&[2u8; 4096], 2 * MB as u64).unwrap();
    lf.set_len(3 * MB as u64).unwrap();
    lf.sync_all().unwrap();
    drop(lf);
    let backing = fs::File::open(ws.lower().join("sparse_lower")).unwrap();
    // SAFETY: lseek takes no pointers; it only gets fds of files (backing, f) that are still open.
    let seek = |fd: i32, off: i64, whence: i32| unsafe { libc::lseek(fd, off, whence) };
    let bfd = backing.as_raw_fd();
    let expect_lower = [
        seek(bfd, 0, libc::SEEK_HOLE),
        seek(bfd, 4096, libc::SEEK_DATA),
        seek(bfd, 2 * MB, libc::SEEK_HOLE),
    ];
    assert!(
        expect_lower[0] < 2 * MB,
        "the backing fs reports holes: {expect_lower:?}"
    );
    let m = ws.mount();
    let f = fs::File::open(m.p("sparse_lower")).unwrap();
    let fd = f.as_raw_fd();
    let got = [
        seek(fd, 0, libc::SEEK_HOLE),
        seek(fd, 4096, libc::SEEK_DATA),
        seek(fd, 2 * MB, libc::SEEK_HOLE),
    ];
    assert_eq!(got, expect_lower, "SEEK_HOLE/SEEK_DATA on a lower file");
    assert_eq!(seek(fd, 3 * MB, libc::SEEK_DATA), -1);
    assert_eq!(last_errno(), libc::ENXIO, "SEEK_DATA at EOF");
    drop(f);

    // A sparse file made through the mount.
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("sparse_new"))
        .unwrap();
    f.write_all_at(&[3u8; 4096], 0).unwrap();
    f.write_all_at(&[4u8; 4096], MB as u64).unwrap();
    f.sync_all().unwrap();
    let fd = f.as_raw_fd();
    let hole = seek(fd, 0, libc::SEEK_HOLE);
    assert!((4096..MB).contains(&hole), "first hole at {hole}");
    let data = seek(fd, hole, libc::SEEK_DATA);
    assert!(data > hole && data <= MB, "next data at {data}");
    assert_eq!(seek(fd, MB, libc::SEEK_HOLE), MB + 4096, "hole at EOF");
}

#[test]
fn copy_file_range_copies_a_lower_file_into_a_new_file() {
    let ws = Workspace::new();
    let src = pattern(3 * 1024 * 1024 + 123, 9);
    write(&ws.lower().join("src"), &src);
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let s = fs::File::open(m.p("src")).unwrap();
    let d = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("dst"))
        .unwrap();
    let mut left = src.len();
    while left > 0 {
        // SAFETY: s and d own open fds; null offset pointers mean use the file positions.
        let n = unsafe {
            libc::copy_file_range(
                s.as_raw_fd(),
                std::ptr::null_mut(),
                d.as_raw_fd(),
                std::ptr::null_mut(),
                left,
                0,
            )
        };
        assert!(
            n > 0,
            "copy_file_range: {} ({} left)",
            std::io::Error::last_os_error(),
            left
        );
        left -= n as usize;
    }
    drop(d);
    assert_eq!(fs::read(m.p("dst")).unwrap(), src);
    // With explicit offsets, into an existing upper file.
    let d2 = rw(&m.p("dst"));
    let (mut off_in, mut off_out): (libc::loff_t, libc::loff_t) = (1000, 10);
    // SAFETY: s and d2 own open fds; off_in and off_out are writable loff_t outliving the call.
    let n = unsafe {
        libc::copy_file_range(
            s.as_raw_fd(),
            &mut off_in,
            d2.as_raw_fd(),
            &mut off_out,
            500,
            0,
        )
    };
    assert_eq!(n, 500);
    assert_eq!((off_in, off_out), (1500, 510));
    drop(d2);
    let got = fs::read(m.p("dst")).unwrap();
    assert_eq!(&got[10..510], &src[1000..1500]);
    assert_eq!(&got[..10], &src[..10]);
    drop((s, m));
    assert!(
        fs::symlink_metadata(ws.upper.join("src")).is_err(),
        "the source was not copied up"
    );
    assert_unchanged(&before);
}

#[test]
fn o_append_writes_always_go_to_the_end() {
    let ws = Workspace::new();
    write(&ws.lower().join("log"), b"abc");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let open = || {
        fs::OpenOptions::new()
            .append(true)
            .open(m.p("log"))
            .unwrap()
    };
    let (mut a, mut b) = (open(), open());
    a.write_all(b"def").unwrap();
    b.write_all(b"ghi").unwrap();
    a.write_all(b"jkl").unwrap();
    let mut c = fs::OpenOptions::new().write(true).open(m.p("log")).unwrap();
    c.write_all(b"ABC").unwrap();
    b.write_all(b"mno").unwrap();
    drop((a, b, c));
    assert_eq!(fs::read(m.p("log")).unwrap(), b"ABCdefghijklmno");
    drop(m);
    assert_eq!(fs::read(ws.upper.join("log")).unwrap(), b"ABCdefghijklmno");
    assert_unchanged(&before);
}

/// A heap buffer aligned for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: layout has a non-zero size (callers pass 8192) and a valid alignment.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Aligned { ptr, layout }
    }
    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr owns layout.size() zeroed bytes; &mut self makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated with this layout in Aligned::new and is freed only here.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

#[test]
fn o_direct_aligned_writes_work_where_the_backing_fs_allows() {
    let ws = Workspace::new();
    write(&ws.lower().join("lower"), &pattern(8192, 3));
    let m = ws.mount();
    let f = match fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.p("direct"))
    {
        Ok(f) => f,
        Err(e) if errno(&e) == libc::EINVAL => {
            eprintln!("note: O_DIRECT open refused with EINVAL, skipping");
            return;
        }
        Err(e) => panic!("O_DIRECT open: {e}"),
    };
    let mut buf = Aligned::new(8192);
    buf.slice().copy_from_slice(&pattern(8192, 7));
    // SAFETY: buf.ptr points to 8192 readable bytes owned by buf; f's fd is open.
    let n = unsafe { libc::pwrite(f.as_raw_fd(), buf.ptr as *const _, 8192, 0) };
    if n < 0 && last_errno() == libc::EINVAL {
        eprintln!("note: O_DIRECT write refused with EINVAL, skipping");
        return;
    }
    assert_eq!(
        n,
        8192,
        "O_DIRECT pwrite: {}",
        std::io::Error::last_os_error()
    );
    let mut back = Aligned::new(8192);
    // SAFETY: back.ptr points to 8192 writable bytes owned by back; f's fd is open.
    let r = unsafe { libc::pread(f.as_raw_fd(), back.ptr as *mut _, 8192, 0) };
    assert_eq!(
        r,
        8192,
        "O_DIRECT pread: {}",
        std::io::Error::last_os_error()
    );
    assert_eq!(back.slice(), &pattern(8192, 7)[..]);
    drop(f);
    assert_eq!(fs::read(m.p("direct")).unwrap(), pattern(8192, 7));
    // O_DIRECT read of a lower file.
    let g = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.p("lower"))
        .unwrap();
    // SAFETY: back.ptr points to 8192 writable bytes owned by back; g's fd is open.
    let r = unsafe { libc::pread(g.as_raw_fd(), back.ptr as *mut _, 8192, 0) };
    assert_eq!(
        r,
        8192,
        "O_DIRECT pread of a lower file (kernel overlayfs allows it): {}",
        std::io::Error::last_os_error()
    );
    assert_eq!(back.slice(), &pattern(8192, 3)[..]);
}

#[test]
fn utimensat_honours_utime_now_and_utime_omit() {
    let ws = Workspace::new();
    write(&ws.lower().join("t"), b"times");
    set_times(&ws.lower().join("t"), 1_100_000_000, 1_000_000_000);
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let c = cpath(&m.p("t"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let ts = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
    ];
    // SAFETY: c is a valid NUL-terminated path and ts two timespecs; both outlive the call.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) },
        0
    );
    let md = fs::metadata(m.p("t")).unwrap();
    assert_eq!(md.atime(), 1_100_000_000, "UTIME_OMIT keeps atime");
    assert!(
        (now - 2..now + 60).contains(&md.mtime()),
        "UTIME_NOW mtime {} vs {now}",
        md.mtime()
    );
    let mtime_now = (md.mtime(), md.mtime_nsec());
    let ts = [
        libc::timespec {
            tv_sec: 1_234_567_890,
            tv_nsec: 123_456_789,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    // SAFETY: c is a valid NUL-terminated path and ts two timespecs; both outlive the call.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) },
        0
    );
    let md = fs::metadata(m.p("t")).unwrap();
    assert_eq!(
        (md.atime(), md.atime_nsec()),
        (1_234_567_890, 123_456_789),
        "explicit atime with ns"
    );
    assert_eq!(
        (md.mtime(), md.mtime_nsec()),
        mtime_now,
        "UTIME_OMIT keeps mtime"
    );
    drop(m);
    let u = fs::metadata(ws.upper.join("t")).unwrap();
    assert_eq!((u.atime(), u.atime_nsec()), (1_234_567_890, 123_456_789));
    assert_eq!((u.mtime(), u.mtime_nsec()), mtime_now);
    assert_unchanged(&before);
}

#[test]
fn o_tmpfile_works_or_fails_with_exactly_eopnotsupp() {
    let ws = Workspace::new();
    fs::create_dir(ws.lower().join("d")).unwrap();
    let m = ws.mount();
    let dir = cpath(&m.p("d"));
    // SAFETY: dir is a valid NUL-terminated path that outlives the call.
    let fd = unsafe { libc::open(dir.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o600) };
    if fd < 0 {
        // fuser 0.18 has no tmpfile operation: the kernel answers EOPNOTSUPP.
        assert_eq!(
            last_errno(),
            libc::EOPNOTSUPP,
            "O_TMPFILE: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    // SAFETY: fd was just returned by open (checked >= 0) and nothing else owns it.
    let f = unsafe { <fs::File as std::os::unix::io::FromRawFd>::from_raw_fd(fd) };
    f.write_all_at(b"anonymous", 0).unwrap();
    assert!(
        list_names(&m.p("d")).is_empty(),
        "an O_TMPFILE file has no name"
    );
    let proc_path = cpath(Path::new(&format!("/proc/self/fd/{fd}")));
    let target = cpath(&m.p("d/named"));
    // SAFETY: proc_path and target are valid NUL-terminated paths that outlive the call.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc_path.as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    assert_eq!(r, 0, "linkat: {}", std::io::Error::last_os_error());
    assert_eq!(fs::read(m.p("d/named")).unwrap(), b"anonymous");
}

#[test]
fn ftruncate_and_truncate_of_lower_files_copy_them_up() {
    let ws = Workspace::new();
    write(&ws.lower().join("t1"), b"0123456789");
    write(&ws.lower().join("t2"), b"0123456789");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let f = fs::OpenOptions::new().write(true).open(m.p("t1")).unwrap();
    f.set_len(3).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 3, "fstat after ftruncate");
    drop(f);
    let c = cpath(&m.p("t2"));
    // SAFETY: c is a valid NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::truncate(c.as_ptr(), 16) }, 0);
    assert_eq!(fs::read(m.p("t1")).unwrap(), b"012");
    assert_eq!(fs::read(m.p("t2")).unwrap(), b"0123456789\0\0\0\0\0\0");
    // O_TRUNC open.
    write(&m.p("t1"), b"");
    assert_eq!(fs::metadata(m.p("t1")).unwrap().len(), 0);
    drop(m);
    assert_eq!(fs::read(ws.upper.join("t1")).unwrap(), b"");
    assert_eq!(
        fs::read(ws.upper.join("t2")).unwrap(),
        b"0123456789\0\0\0\0\0\0"
    );
    assert_unchanged(&before);
}

#[test]
fn chmod_and_chown_of_a_lower_dir_copy_it_up_without_making_it_opaque() {
    let ws = Workspace::new();
    write(&ws.lower().join("d/c1"), b"1");
    write(&ws.lower().join("d/sub/c2"), b"2");
    fs::set_permissions(ws.lower().join("d"), fs::Permissions::from_mode(0o755)).unwrap();
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    fs::set_permissions(m.p("d"), fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(m.p("d"), Some(7), Some(8)).unwrap();
    let md = fs::metadata(m.p("d")).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o700);
    assert_eq!((md.uid(), md.gid()), (7, 8));
    assert_eq!(
        list_names(&m.p("d")),
        set(&["c1", "sub"]),
        "lower children still visible"
    );
    assert_eq!(fs::read(m.p("d/sub/c2")).unwrap(), b"2");
    drop(m);
    let u = fs::metadata(ws.upper.join("d")).unwrap();
    assert_eq!(u.mode() & 0o7777, 0o700);
    assert_eq!((u.uid(), u.gid()), (7, 8));
    assert_eq!(
        get_trusted(&ws.upper.join("d"), "trusted.overlay.opaque"),
        None
    );
    assert_eq!(
        walk_names(&ws.upper),
        vec!["d"],
        "children are not copied up"
    );
    assert_unchanged(&before);
}

// ---------------------------------------------------------------- lower changes

#[test]
fn a_file_added_to_the_lower_from_outside_appears_while_mounted() {
    let ws = Workspace::new();
    fs::create_dir(ws.lower().join("d")).unwrap();
    let m = ws.mount();
    assert!(
        fs::symlink_metadata(m.p("d/new")).is_err(),
        "absent at first (negative entry cached)"
    );
    assert!(list_names(&m.p("d")).is_empty());
    write(&ws.lower().join("d/new"), b"arrived");
    assert!(
        poll_until(LOWER_CHANGE_TIMEOUT, || fs::read(m.p("d/new"))
            .ok()
            .as_deref()
            == Some(&b"arrived"[..])),
        "a new lower file did not appear within {LOWER_CHANGE_TIMEOUT:?}"
    );
    assert!(
        poll_until(LOWER_CHANGE_TIMEOUT, || list_names(&m.p("d"))
            .contains("new")),
        "a new lower file is not listed within {LOWER_CHANGE_TIMEOUT:?}"
    );
}

#[test]
fn content_rewritten_in_the_lower_from_outside_appears_while_mounted() {
    let ws = Workspace::new();
    write(&ws.lower().join("f"), b"version one");
    let m = ws.mount();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"version one");
    let ino = fs::metadata(ws.lower().join("f")).unwrap().ino();
    // Same inode, same length, new bytes.
    let mut lf = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(ws.lower().join("f"))
        .unwrap();
    lf.write_all(b"version two").unwrap();
    drop(lf);
    assert_eq!(fs::metadata(ws.lower().join("f")).unwrap().ino(), ino);
    assert!(
        poll_until(LOWER_CHANGE_TIMEOUT, || fs::read(m.p("f")).unwrap()
            == b"version two"),
        "rewritten lower content not visible within {LOWER_CHANGE_TIMEOUT:?}: {:?}",
        String::from_utf8_lossy(&fs::read(m.p("f")).unwrap())
    );
    // A change of size, too.
    fs::OpenOptions::new()
        .append(true)
        .open(ws.lower().join("f"))
        .unwrap()
        .write_all(b", longer")
        .unwrap();
    assert!(
        poll_until(LOWER_CHANGE_TIMEOUT, || fs::read(m.p("f")).unwrap()
            == b"version two, longer"),
        "appended lower content not visible within {LOWER_CHANGE_TIMEOUT:?}"
    );
}

#[test]
fn a_file_deleted_from_the_lower_from_outside_disappears_while_mounted() {
    let ws = Workspace::new();
    write(&ws.lower().join("d/doomed"), b"x");
    write(&ws.lower().join("d/stays"), b"y");
    let m = ws.mount();
    assert_eq!(fs::read(m.p("d/doomed")).unwrap(), b"x");
    assert_eq!(list_names(&m.p("d")), set(&["doomed", "stays"]));
    fs::remove_file(ws.lower().join("d/doomed")).unwrap();
    assert!(
        poll_until(LOWER_CHANGE_TIMEOUT, || matches!(
            fs::symlink_metadata(m.p("d/doomed")),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT)
        )),
        "a deleted lower file still visible after {LOWER_CHANGE_TIMEOUT:?}"
    );
    assert!(poll_until(LOWER_CHANGE_TIMEOUT, || list_names(&m.p("d"))
        == set(&["stays"])));
}

/// With a long `--lower-timeout` the kernel may cache lower entries for ten
/// minutes: outside changes can only show at once because the daemon
/// watches the lower directories and invalidates what the kernel holds.
#[test]
fn outside_lower_changes_show_at_once_even_with_a_long_cache_timeout() {
    let ws = Workspace::new();
    write(&ws.lower().join("d/doomed"), b"x");
    write(&ws.lower().join("d/f"), b"version one");
    write(&ws.lower().join("top"), b"t");
    let m = ws.mount_with(&["--lower-timeout", "10m"]);
    // Prime every cache: names, a negative entry, listings, file pages.
    assert_eq!(fs::read(m.p("d/f")).unwrap(), b"version one");
    assert_eq!(fs::read(m.p("d/doomed")).unwrap(), b"x");
    assert!(fs::symlink_metadata(m.p("d/new")).is_err());
    assert!(fs::symlink_metadata(m.p("newdir")).is_err());
    assert_eq!(list_names(&m.p("d")), set(&["doomed", "f"]));
    assert_eq!(list_names(m.path()), set(&["d", "top"]));

    write(&ws.lower().join("d/new"), b"arrived");
    fs::remove_file(ws.lower().join("d/doomed")).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(ws.lower().join("d/f"))
        .unwrap()
        .write_all(b"version two")
        .unwrap();
    fs::create_dir(ws.lower().join("newdir")).unwrap();
    write(&ws.lower().join("newdir/inside"), b"i");

    let t = LOWER_CHANGE_TIMEOUT;
    assert!(
        poll_until(t, || fs::read(m.p("d/new")).ok().as_deref()
            == Some(&b"arrived"[..])),
        "new lower file (cached as absent) not visible within {t:?}"
    );
    assert!(
        poll_until(t, || fs::symlink_metadata(m.p("d/doomed")).is_err()),
        "deleted lower file still visible after {t:?}"
    );
    assert!(
        poll_until(t, || fs::read(m.p("d/f")).ok().as_deref()
            == Some(&b"version two"[..])),
        "rewritten lower file shows its cached pages after {t:?}: {:?}",
        fs::read(m.p("d/f"))
    );
    assert!(
        poll_until(t, || list_names(&m.p("d")) == set(&["f", "new"])),
        "cached listing of d not refreshed within {t:?}: {:?}",
        list_names(&m.p("d"))
    );
    assert!(
        poll_until(t, || list_names(m.path()) == set(&["d", "newdir", "top"])),
        "cached listing of the root not refreshed within {t:?}"
    );
    assert_eq!(fs::read(m.p("newdir/inside")).unwrap(), b"i");
}

/// The attributes of a lower file in a watched directory are trusted for
/// the long timeout, not `--lower-timeout`: the watch reports changes to a
/// directory's children, and the daemon drops the kernel's copy of every
/// name of the changed file. With a ten-minute `--lower-timeout` each
/// outside change below (mode, size, content, a replacement renamed over
/// the name, a change through another hard link, a change to a file
/// renamed in the lower) can only show because of that invalidation.
#[test]
fn outside_attribute_changes_of_watched_lower_files_show_at_once() {
    let ws = Workspace::new();
    let l = |rel: &str| ws.lower().join(rel);
    write(&l("d/chmod"), b"mode");
    write(&l("d/append"), b"short");
    write(&l("d/truncate"), b"a longer text");
    write(&l("d/replace"), b"old");
    write(&l("d/link1"), b"linked");
    fs::hard_link(l("d/link1"), l("d/link2")).unwrap();
    write(&l("d/before"), b"moved");
    let m = ws.mount_with(&["--lower-timeout", "10m"]);
    // Prime the kernel's attributes and pages of every name.
    for n in [
        "chmod", "append", "truncate", "replace", "link1", "link2", "before",
    ] {
        fs::read(m.p(&format!("d/{n}"))).unwrap();
        fs::metadata(m.p(&format!("d/{n}"))).unwrap();
    }
    assert!(fs::symlink_metadata(m.p("d/after")).is_err());

    fs::set_permissions(l("d/chmod"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(l("d/append"))
        .unwrap()
        .write_all(b", now longer")
        .unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(l("d/truncate"))
        .unwrap()
        .set_len(1)
        .unwrap();
    write(&l("d/replacement"), b"brand new content");
    fs::rename(l("d/replacement"), l("d/replace")).unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(l("d/link1"))
        .unwrap()
        .write_all(b" and grown")
        .unwrap();
    fs::rename(l("d/before"), l("d/after")).unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(l("d/after"))
        .unwrap()
        .write_all(b" and grown")
        .unwrap();

    let t = LOWER_CHANGE_TIMEOUT;
    let shows = |rel: &str, want: &[u8]| {
        poll_until(t, || {
            fs::metadata(m.p(rel)).map(|md| md.len()).ok() == Some(want.len() as u64)
                && fs::read(m.p(rel)).ok().as_deref() == Some(want)
        })
    };
    assert!(
        poll_until(t, || fs::metadata(m.p("d/chmod"))
            .map(|md| md.mode() & 0o777)
            .ok()
            == Some(0o600)),
        "an outside chmod not seen within {t:?}: {:o}",
        fs::metadata(m.p("d/chmod")).unwrap().mode()
    );
    assert!(shows("d/append", b"short, now longer"), "append not seen");
    assert!(shows("d/truncate", b"a"), "truncate not seen");
    assert!(
        shows("d/replace", b"brand new content"),
        "a file renamed over the name not seen"
    );
    assert!(
        shows("d/link1", b"linked and grown"),
        "the changed hard link not seen"
    );
    assert!(
        shows("d/link2", b"linked and grown"),
        "the other name of a changed hard link not seen"
    );
    assert!(
        shows("d/after", b"moved and grown"),
        "a file renamed in the lower and then changed not seen"
    );
    assert!(poll_until(t, || fs::symlink_metadata(m.p("d/before")).is_err()));
}

/// The first open of a small lower file fills the kernel's pages of it
/// before it is answered (`fuse::io_mode::prefill`): its reads then send
/// no READ, and the stat after them no GETATTR (the kernel marks the
/// atime stale only after a READ it sent). What a program sees stays the
/// same: every byte at every size around a page, the lower file's atime
/// (read with `O_NOATIME`), an outside change once the watch reports it
/// (a reader that opened before a copy-up:
/// `lower_passthrough::small_lower_files_stay_with_the_daemon_and_keep_their_semantics`).
/// A file beyond 128 KiB is read through the daemon as before.
#[test]
fn the_first_open_of_a_small_lower_file_fills_its_pages() {
    let ws = Workspace::new();
    let sizes = [1usize, 4095, 4096, 4097, 65539, 131072];
    let data = |n: usize, salt: u8| -> Vec<u8> {
        (0..n)
            .map(|i| (i / 4096) as u8 ^ (i % 253) as u8 ^ salt)
            .collect()
    };
    for n in sizes.iter().chain(&[131073]) {
        write(&ws.lower().join(format!("d/f{n}")), &data(*n, 0));
    }
    let m = ws.mount_with(&["--lower-timeout", "10m"]);
    let count = |op: &str| -> u64 {
        crate::netlower::status_json(m.path())["counters"]["by_op"][op]
            .as_u64()
            .unwrap_or(0)
    };
    // The root's and the directory's first attributes, asked once.
    fs::metadata(m.p("d")).unwrap();
    count("getattr");
    for n in sizes {
        let rel = format!("d/f{n}");
        let lower_atime = fs::metadata(ws.lower().join(&rel)).unwrap().atime();
        let (reads, getattrs) = (count("read"), count("getattr"));
        assert!(fs::read(m.p(&rel)).unwrap() == data(n, 0), "{rel}");
        let f = fs::File::open(m.p(&rel)).unwrap();
        let mut tail = vec![0; 10];
        let k = f.read_at(&mut tail, n as u64 - 1).unwrap();
        assert_eq!(&tail[..k], &data(n, 0)[n - 1..], "{rel}: the last byte");
        drop(f);
        let md = fs::metadata(m.p(&rel)).unwrap();
        assert_eq!(md.len(), n as u64, "{rel}");
        assert_eq!(md.atime(), lower_atime, "{rel}: atime through the mount");
        assert_eq!(count("read"), reads, "{rel}: READ requests");
        assert_eq!(count("getattr"), getattrs, "{rel}: GETATTR requests");
    }
    assert_eq!(
        fs::metadata(ws.lower().join("d/f4097")).unwrap().atime(),
        fs::metadata(m.p("d/f4097")).unwrap().atime(),
        "the lower file's atime is untouched"
    );
    let reads = count("read");
    assert!(fs::read(m.p("d/f131073")).unwrap() == data(131073, 0));
    assert!(
        count("read") > reads,
        "a larger file is read through the daemon"
    );

    // An outside change replaces what was stored, once the watch saw it.
    write(&ws.lower().join("d/f4097"), &data(4097, 7));
    assert!(
        poll_until(LOWER_CHANGE_TIMEOUT, || fs::read(m.p("d/f4097"))
            .is_ok_and(|d| d == data(4097, 7))),
        "an outside change did not show within {LOWER_CHANGE_TIMEOUT:?}"
    );
    drop(m);
}

/// A directory beyond `--max-watches` is not watched: the attributes of
/// its lower files get `--lower-timeout`, so an outside change still shows
/// once that passes (with the long timeout of watched entries it would
/// stay hidden for a minute).
#[test]
fn lower_files_in_an_unwatched_directory_keep_the_short_timeout() {
    let ws = Workspace::new();
    write(&ws.lower().join("d/f"), b"short");
    let m = ws.mount_with(&["--max-watches", "1", "--lower-timeout", "1s"]);
    assert_eq!(fs::read(m.p("d/f")).unwrap(), b"short");
    assert_eq!(fs::metadata(m.p("d/f")).unwrap().len(), 5);
    let status = crate::harness::layerfs(&["status", "--json", m.path().to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(
        v["watches"]["dirs_over_cap"].as_u64().unwrap_or(0) > 0,
        "d should be beyond the cap: {v}"
    );
    fs::OpenOptions::new()
        .append(true)
        .open(ws.lower().join("d/f"))
        .unwrap()
        .write_all(b", now longer")
        .unwrap();
    let t = Duration::from_secs(5);
    assert!(
        poll_until(t, || fs::metadata(m.p("d/f")).map(|md| md.len()).ok()
            == Some(17)
            && fs::read(m.p("d/f")).ok().as_deref()
                == Some(&b"short, now longer"[..])),
        "a change in an unwatched directory not seen within {t:?}"
    );
}

/// A merged directory's mtime follows an outside change to its lower even
/// while the lower is watched: the watch keeps this mount's kernel cache
/// right, but a client stacked on the mount (another layerfs whose lower
/// it is, an NFS export, `make`) knows a directory changed only by its
/// mtime. With the upper's mtime alone, such a client kept a listing that
/// still showed a directory renamed in the shared tree.
#[test]
fn a_watched_merged_directory_shows_its_lowers_newest_mtime() {
    let ws = Workspace::new();
    write(&ws.lower().join("docs/guide"), b"g");
    let m = ws.mount();
    // The root is merged: upper and lower both have it. Written now, the
    // upper's root is newer than the lower's.
    fs::write(m.p("mine"), "m").unwrap();
    let before = fs::metadata(m.path()).unwrap();
    assert_eq!(list_names(m.path()), set(&["docs", "mine"]));
    std::thread::sleep(Duration::from_millis(20));
    fs::rename(ws.lower().join("docs"), ws.lower().join("manual")).unwrap();
    let lower = fs::metadata(ws.lower()).unwrap();
    let t = LOWER_CHANGE_TIMEOUT;
    let mtime = |md: &fs::Metadata| (md.mtime(), md.mtime_nsec());
    assert!(
        poll_until(t, || fs::metadata(m.path())
            .is_ok_and(|md| mtime(&md) == mtime(&lower))),
        "the root's mtime stayed {:?} (the lower's is {:?})",
        mtime(&before),
        mtime(&lower)
    );
    assert_eq!(list_names(m.path()), set(&["manual", "mine"]));
}

/// A stat of a watched merged directory reads no lower: the mtime it
/// reports was read by the watcher when the watch was set and at each
/// change since. Traced with strace: `stat --cached=never` makes the kernel
/// ask the daemon every time, and a daemon that read each lower at each
/// stat would show one fstat of a lower directory per lower per stat.
#[test]
fn a_watched_merged_directory_is_stated_without_reading_its_lowers() {
    use std::io::{BufRead, BufReader};
    const LOWERS: usize = 4;
    const STATS: usize = 10;
    let ws = Workspace::with_lowers(LOWERS);
    for (i, l) in ws.lowers.iter().enumerate() {
        write(&l.join(format!("d/f{i}")), b"f");
    }
    let m = ws.mount();
    fs::write(m.p("d/mine"), "m").unwrap();
    // Looked up, hence watched.
    assert!(fs::metadata(m.p("d")).unwrap().is_dir());
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("trace");
    let mut strace = Command::new("strace")
        .args(["-f", "-y", "-e", "trace=newfstatat,fstat,statx", "-o"])
        .arg(&log)
        .args(["-p", &m.pid().to_string()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn strace");
    // strace says on stderr when it is attached to every thread.
    let mut err = BufReader::new(strace.stderr.take().unwrap());
    let mut line = String::new();
    while err.read_line(&mut line).unwrap() > 0 && !line.contains("attached") {
        line.clear();
    }
    assert!(line.contains("attached"), "strace did not attach: {line}");
    for _ in 0..STATS {
        let out = Command::new("stat")
            .args(["--cached=never", "-c", "%Y"])
            .arg(m.p("d"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    // SAFETY: strace is this test's own child, still running.
    assert_eq!(unsafe { libc::kill(strace.id() as i32, libc::SIGINT) }, 0);
    strace.wait().unwrap();
    let trace = fs::read_to_string(&log).unwrap();
    let getattrs = trace.matches(&format!("{}/d>", ws.upper.display())).count();
    let lower_reads: Vec<&str> = trace
        .lines()
        .filter(|l| {
            ws.lowers
                .iter()
                .any(|w| l.contains(&format!("{}/d>", w.display())))
        })
        .collect();
    // The stats reached the daemon (each reads the upper directory) ...
    assert!(
        getattrs >= STATS,
        "{getattrs} reads of the upper dir:\n{trace}"
    );
    // ... and none of them read a lower directory.
    assert!(
        lower_reads.is_empty(),
        "lower directories read:\n{}",
        lower_reads.join("\n")
    );
}

/// A lower directory replaced from outside (removed and made again) ends
/// its watch; the new one is watched from its next lookup on.
#[test]
fn a_lower_directory_replaced_from_outside_is_watched_again() {
    let ws = Workspace::new();
    write(&ws.lower().join("d/old"), b"o");
    let m = ws.mount_with(&["--lower-timeout", "10m"]);
    assert_eq!(list_names(&m.p("d")), set(&["old"]));
    fs::remove_dir_all(ws.lower().join("d")).unwrap();
    fs::create_dir(ws.lower().join("d")).unwrap();
    write(&ws.lower().join("d/new"), b"n");
    let t = LOWER_CHANGE_TIMEOUT;
    assert!(
        poll_until(t, || list_names(&m.p("d")) == set(&["new"])),
        "replaced lower dir not seen within {t:?}: {:?}",
        list_names(&m.p("d"))
    );
    // The new directory is watched: a later change shows at once too.
    write(&ws.lower().join("d/later"), b"l");
    assert!(
        poll_until(t, || list_names(&m.p("d")) == set(&["later", "new"])),
        "change in the replaced lower dir not seen within {t:?}: {:?}",
        list_names(&m.p("d"))
    );
}

/// Without watches (LAYERFS_NO_LOWER_WATCH, or inotify unavailable) the
/// kernel trusts lower entries only for `--lower-timeout`, and a merged
/// directory reports its newest layer mtime so cached listings are dropped.
#[test]
fn without_the_lower_watch_outside_changes_show_within_the_lower_timeout() {
    let ws = Workspace::new();
    write(&ws.lower().join("d/doomed"), b"x");
    write(&ws.lower().join("d/f"), b"f");
    let m = ws.mount_env(&[], &[("LAYERFS_NO_LOWER_WATCH", "1")]);
    assert_eq!(list_names(&m.p("d")), set(&["doomed", "f"]));
    assert!(fs::symlink_metadata(m.p("d/new")).is_err());
    write(&ws.lower().join("d/new"), b"arrived");
    fs::remove_file(ws.lower().join("d/doomed")).unwrap();
    let t = Duration::from_secs(3);
    assert!(
        poll_until(t, || fs::read(m.p("d/new")).ok().as_deref()
            == Some(&b"arrived"[..])),
        "new lower file not visible within {t:?}"
    );
    assert!(
        poll_until(t, || list_names(&m.p("d")) == set(&["f", "new"])),
        "cached listing not refreshed within {t:?}: {:?}",
        list_names(&m.p("d"))
    );
}

#[test]
fn a_copied_up_file_ignores_later_changes_to_its_lower() {
    let ws = Workspace::new();
    write(&ws.lower().join("f"), b"lower v1");
    let m = ws.mount();
    fs::OpenOptions::new()
        .append(true)
        .open(m.p("f"))
        .unwrap()
        .write_all(b" + mine")
        .unwrap();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"lower v1 + mine");
    fs::write(ws.lower().join("f"), b"lower v2, changed outside").unwrap();
    // Wait past the cache timeout (not a timing assertion: the answer must not change).
    std::thread::sleep(LOWER_CHANGE_TIMEOUT + Duration::from_millis(200));
    assert_eq!(fs::read(m.p("f")).unwrap(), b"lower v1 + mine");
    assert_eq!(fs::metadata(m.p("f")).unwrap().len(), 15);
}

// ---------------------------------------------------------------- permissions

/// Runs `args` as uid/gid 65534 with no groups; returns (success, stderr).
fn as_nobody(args: &[&str]) -> (bool, String) {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(args)
        .current_dir("/")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A workspace whose mountpoint a non-root user can reach.
fn shared_workspace() -> Workspace {
    let ws = Workspace::new();
    fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&ws.upper, fs::Permissions::from_mode(0o755)).unwrap();
    ws
}

#[test]
fn permission_checks_apply_to_a_non_root_user() {
    let ws = shared_workspace();
    write(&ws.lower().join("secret"), b"root only");
    fs::set_permissions(ws.lower().join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    write(&ws.lower().join("public"), b"everyone");
    fs::set_permissions(ws.lower().join("public"), fs::Permissions::from_mode(0o644)).unwrap();
    let before = snapshot_lowers(&ws);
    let m = ws.mount_with(&["--allow-other"]);
    let p = |n: &str| m.p(n).display().to_string();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
        .arg(m.p("public"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nobody reads a 0644 file: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"everyone");
    let (ok, err) = as_nobody(&["cat", &p("secret")]);
    assert!(
        !ok && err.contains("Permission denied"),
        "nobody reads a 0600 root file: {err}"
    );
    let (ok, err) = as_nobody(&["sh", "-c", &format!("echo x >> {}", p("public"))]);
    assert!(
        !ok && err.contains("Permission denied"),
        "nobody writes a 0644 root file: {err}"
    );
    let (ok, err) = as_nobody(&["touch", &p("newfile")]);
    assert!(
        !ok && err.contains("Permission denied"),
        "nobody creates in a 0755 root dir: {err}"
    );
    assert_eq!(
        fs::read(m.p("secret")).unwrap(),
        b"root only",
        "root still reads it"
    );
    drop(m);
    assert!(
        walk_names(&ws.upper).is_empty(),
        "a denied write copies nothing up: {:?}",
        walk_names(&ws.upper)
    );
    assert_unchanged(&before);
}

/// With `suid allow` setuid/setgid bits may stick, so the kernel rule
/// matters: a write or truncate by a user without CAP_FSETID clears them,
/// for a lower file (copied up by the write) and for an upper one.
#[test]
fn a_write_or_truncate_by_another_user_clears_setuid_and_setgid() {
    let ws = shared_workspace();
    write(&ws.lower().join("lowsuid"), b"l");
    fs::set_permissions(
        ws.lower().join("lowsuid"),
        fs::Permissions::from_mode(0o6777),
    )
    .unwrap();
    let pol = crate::harness::policy_file(&ws, "suid allow\n");
    let m = ws.mount_with(&["--allow-other", "--policy", pol.to_str().unwrap()]);
    write(&m.p("upsuid"), b"u");
    write(&m.p("trunc"), b"t");
    for f in ["upsuid", "trunc"] {
        fs::set_permissions(m.p(f), fs::Permissions::from_mode(0o6777)).unwrap();
    }
    let mode = |f: &str| fs::metadata(m.p(f)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("lowsuid"), 0o6777);
    assert_eq!(mode("upsuid"), 0o6777, "suid allow keeps the bits");
    for f in ["lowsuid", "upsuid"] {
        let (ok, err) = as_nobody(&["sh", "-c", &format!("echo more >> {}", m.p(f).display())]);
        assert!(ok, "nobody appends to a 0777 file: {err}");
        assert_eq!(
            mode(f),
            0o777,
            "{f}: setuid/setgid survive another user's write"
        );
    }
    let (ok, err) = as_nobody(&["truncate", "-s", "0", &m.p("trunc").display().to_string()]);
    assert!(ok, "nobody truncates a 0777 file: {err}");
    assert_eq!(
        mode("trunc"),
        0o777,
        "setuid/setgid survive another user's truncate"
    );
    write(&m.p("otrunc"), b"o");
    fs::set_permissions(m.p("otrunc"), fs::Permissions::from_mode(0o6777)).unwrap();
    let (ok, err) = as_nobody(&["sh", "-c", &format!(": > {}", m.p("otrunc").display())]);
    assert!(ok, "nobody opens a 0777 file with O_TRUNC: {err}");
    assert_eq!(
        mode("otrunc"),
        0o777,
        "setuid/setgid survive another user's open(O_TRUNC)"
    );
    // fallocate and copy_file_range change the data without a WRITE: the
    // kernel hands the clearing over as a SETATTR that sets nothing.
    for f in ["falloc", "copied", "source"] {
        write(&m.p(f), b"c");
        fs::set_permissions(m.p(f), fs::Permissions::from_mode(0o6777)).unwrap();
    }
    let (ok, err) = as_nobody(&[
        "fallocate",
        "-l",
        "65536",
        &m.p("falloc").display().to_string(),
    ]);
    assert!(ok, "nobody fallocates a 0777 file: {err}");
    assert_eq!(
        mode("falloc"),
        0o777,
        "setuid/setgid survive another user's fallocate"
    );
    let copy = format!(
        "import os; s = os.open({:?}, os.O_RDONLY); d = os.open({:?}, os.O_WRONLY); \
         assert os.copy_file_range(s, d, 1, 0, 1) == 1",
        m.p("source").display().to_string(),
        m.p("copied").display().to_string()
    );
    let (ok, err) = as_nobody(&["/usr/bin/python3", "-c", &copy]);
    assert!(ok, "nobody copies into a 0777 file: {err}");
    assert_eq!(
        mode("copied"),
        0o777,
        "setuid/setgid survive another user's copy_file_range"
    );
    assert_eq!(
        fs::metadata(ws.lower().join("lowsuid"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o6777,
        "the lower keeps its bits"
    );
}

/// Root without `CAP_FSETID` (a sandbox that drops it) loses setuid and
/// setgid bits on what it writes or truncates, as on a local filesystem,
/// also where the mount owner's writes go straight to the upper file
/// (passthrough, where the daemon sees no write); root with the
/// capability keeps them.
#[test]
fn a_write_or_truncate_without_cap_fsetid_clears_setuid_and_setgid_also_through_passthrough() {
    let ws = Workspace::new();
    write(&ws.lower().join("low"), b"l");
    fs::set_permissions(ws.lower().join("low"), fs::Permissions::from_mode(0o6755)).unwrap();
    let pol = crate::harness::policy_file(&ws, "suid allow\n");
    let m = ws.mount_with(&["--policy", pol.to_str().unwrap()]);
    for f in ["up", "trunc", "otrunc", "keep", "fd"] {
        write(&m.p(f), b"u");
        fs::set_permissions(m.p(f), fs::Permissions::from_mode(0o6755)).unwrap();
    }
    let mode = |f: &str| fs::metadata(m.p(f)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("up"), 0o6755, "suid allow keeps the bits");
    // One file held open for writing from before the bits matter: its
    // writes are the ones passthrough serves without the daemon.
    let script = format!(
        "exec 3>>{fd}; echo more >> {low}; echo more >> {up}; truncate -s 0 {trunc}; \
         : > {otrunc}; chmod 6755 {fd}; echo more >&3",
        fd = m.p("fd").display(),
        low = m.p("low").display(),
        up = m.p("up").display(),
        trunc = m.p("trunc").display(),
        otrunc = m.p("otrunc").display(),
    );
    let out = Command::new("setpriv")
        .args([
            "--inh-caps=-fsetid",
            "--bounding-set=-fsetid",
            "--",
            "sh",
            "-c",
        ])
        .arg(&script)
        .output()
        .expect("run setpriv");
    assert!(
        out.status.success(),
        "root without CAP_FSETID writes: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in ["low", "up", "trunc", "otrunc", "fd"] {
        assert_eq!(
            mode(f),
            0o755,
            "{f}: setuid/setgid survive a change by root without CAP_FSETID"
        );
    }
    let mut keep = fs::OpenOptions::new()
        .append(true)
        .open(m.p("keep"))
        .unwrap();
    keep.write_all(b"more").unwrap();
    drop(keep);
    assert_eq!(mode("keep"), 0o6755, "root with CAP_FSETID keeps the bits");
    assert_eq!(
        fs::metadata(ws.lower().join("low"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o6755,
        "the lower keeps its bits"
    );
}

#[test]
fn a_sticky_directory_stops_a_non_root_user_deleting_others_files() {
    let ws = shared_workspace();
    write(&ws.lower().join("tmp/rootfile"), b"r");
    fs::set_permissions(
        ws.lower().join("tmp/rootfile"),
        fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    fs::set_permissions(ws.lower().join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    let before = snapshot_lowers(&ws);
    let m = ws.mount_with(&["--allow-other"]);
    let p = |n: &str| m.p(n).display().to_string();
    let (ok, err) = as_nobody(&["rm", "-f", &p("tmp/rootfile")]);
    assert!(
        !ok && err.contains("Operation not permitted"),
        "sticky bit protects root's file: {err}"
    );
    let (ok, err) = as_nobody(&["mv", &p("tmp/rootfile"), &p("tmp/stolen")]);
    assert!(!ok, "nor can it be renamed: {err}");
    assert_eq!(fs::read(m.p("tmp/rootfile")).unwrap(), b"r");
    let (ok, err) = as_nobody(&[
        "sh",
        "-c",
        &format!("echo mine > {0} && rm {0}", p("tmp/mine")),
    ]);
    assert!(
        ok,
        "nobody creates and deletes its own file in a 1777 dir: {err}"
    );
    let (ok, err) = as_nobody(&[
        "sh",
        "-c",
        &format!("echo appended >> {}", p("tmp/rootfile")),
    ]);
    assert!(ok, "a 0666 file is writable: {err}");
    assert_eq!(fs::read(m.p("tmp/rootfile")).unwrap(), b"rappended\n");
    let md = fs::metadata(m.p("tmp")).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o1777);
    drop(m);
    assert_eq!(
        fs::metadata(ws.upper.join("tmp")).unwrap().mode() & 0o7777,
        0o1777
    );
    assert_unchanged(&before);
}

/// A directory removed while it is open (an fd, a shell's cwd) acts as on
/// a local filesystem: fsync succeeds (nothing is left to sync), fstat
/// answers with link count 0, it lists empty; a change through the fd is
/// refused (ENOENT) and never reaches a new directory made under its old
/// name. (Found by the stress campaign: a racing `rmdir` made fsync and
/// fstat fail with ESTALE, the removed directory's handle no longer
/// opening.)
#[test]
fn a_directory_removed_while_open_acts_as_on_a_local_filesystem() {
    let ws = Workspace::new();
    write(&ws.lower().join("shared/keep"), b"k");
    fs::create_dir(ws.lower().join("plain")).unwrap();
    fs::create_dir(ws.lower().join("over")).unwrap();
    let m = ws.mount();
    for name in ["new", "shared/gone"] {
        let p = m.p(name);
        fs::create_dir_all(&p).unwrap();
        let dir = fs::File::open(&p).unwrap();
        dir.sync_all()
            .unwrap_or_else(|e| panic!("fsync of {name} before its removal: {e}"));
        fs::remove_dir(&p).unwrap();
        dir.sync_all()
            .unwrap_or_else(|e| panic!("fsync of {name} after its removal: {e}"));
        dir.sync_data()
            .unwrap_or_else(|e| panic!("fdatasync of {name} after its removal: {e}"));
        let st = dir
            .metadata()
            .unwrap_or_else(|e| panic!("fstat of {name} after its removal: {e}"));
        assert!(st.is_dir(), "{name}");
        assert_eq!(st.nlink(), 0, "{name}: a removed directory has no links");
        // A new directory under the old name is another object: a chmod
        // through the old fd does not reach it.
        fs::create_dir(&p).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        let e = dir
            .set_permissions(fs::Permissions::from_mode(0o700))
            .expect_err("chmod through the fd of a removed directory");
        assert_eq!(errno(&e), libc::ENOENT, "{name}");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o755,
            "{name}: the new directory is untouched"
        );
        fs::remove_dir(&p).unwrap();
    }
    // Shared-only directories (no upper copy), removed by rmdir and
    // replaced by a rename, and a new one replaced by a rename.
    for (victim, how) in [
        ("plain", "rmdir"),
        ("over", "rename"),
        ("newover", "rename"),
    ] {
        let p = m.p(victim);
        if victim == "newover" {
            fs::create_dir(&p).unwrap();
        }
        let dir = fs::File::open(&p).unwrap();
        if how == "rmdir" {
            fs::remove_dir(&p).unwrap();
            fs::create_dir(&p).unwrap();
        } else {
            fs::create_dir(m.p("incoming")).unwrap();
            fs::rename(m.p("incoming"), &p).unwrap();
        }
        dir.sync_all()
            .unwrap_or_else(|e| panic!("fsync of {victim} after {how}: {e}"));
        assert_eq!(dir.metadata().unwrap().nlink(), 0, "{victim} after {how}");
        let e = dir
            .set_permissions(fs::Permissions::from_mode(0o700))
            .expect_err("chmod through the fd of a removed directory");
        assert_eq!(errno(&e), libc::ENOENT, "{victim} after {how}");
        assert_ne!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o700,
            "{victim}: the directory now at the name is untouched"
        );
    }
    // A lower directory (copied up by nothing but its removal's whiteout).
    let d = m.p("shared");
    fs::remove_file(m.p("shared/keep")).unwrap();
    let dir = fs::File::open(&d).unwrap();
    fs::remove_dir(&d).unwrap();
    dir.sync_all()
        .unwrap_or_else(|e| panic!("fsync of a removed lower directory: {e}"));
    assert_eq!(dir.metadata().unwrap().nlink(), 0);
    fs::create_dir(&d).unwrap();
    let e = dir
        .set_permissions(fs::Permissions::from_mode(0o700))
        .expect_err("chmod through the fd of a removed lower directory");
    assert_eq!(errno(&e), libc::ENOENT);
    // Its listing is empty (the kernel answers for a removed directory).
    let mut d = nix::dir::Dir::from_fd(std::os::fd::IntoRawFd::into_raw_fd(dir)).unwrap();
    assert_eq!(
        d.iter()
            .filter_map(|e| e.ok())
            .filter(|e| ![".", ".."].contains(&e.file_name().to_str().unwrap()))
            .count(),
        0
    );
}

/// A name the kernel holds as absent may exist by the time it is created:
/// it appeared in a lower that is not watched (or in a network lower).
/// open(O_CREAT) without O_EXCL then opens what is there, as on a plain
/// directory (the daemon's CREATE finds the name and opens it instead of
/// answering EEXIST); with O_EXCL it is EEXIST, and a directory EISDIR.
#[test]
fn create_of_a_name_that_appeared_in_an_unwatched_lower_opens_it() {
    use std::os::unix::fs::OpenOptionsExt;
    let ws = Workspace::new();
    fs::create_dir(ws.lower().join("d")).unwrap();
    let m = ws.mount_with(&["--max-watches", "0", "--lower-timeout", "60s"]);
    for n in ["f", "g", "t", "x", "sub", "link"] {
        assert!(fs::symlink_metadata(m.p(&format!("d/{n}"))).is_err());
    }
    for n in ["f", "g", "t", "x"] {
        fs::write(ws.lower().join("d").join(n), "from the lower\n").unwrap();
    }
    fs::create_dir(ws.lower().join("d/sub")).unwrap();

    // Appended to (a copy-up), as `echo >> f` does.
    let mut f = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(m.p("d/f"))
        .expect("open(O_APPEND|O_CREAT) of a name that appeared in the lower");
    f.write_all(b"appended\n").unwrap();
    drop(f);
    assert_eq!(
        fs::read_to_string(m.p("d/f")).unwrap(),
        "from the lower\nappended\n"
    );
    // Opened read-only with O_CREAT: the lower file itself.
    let g = fs::OpenOptions::new()
        .read(true)
        .write(false)
        .custom_flags(libc::O_CREAT)
        .open(m.p("d/g"))
        .expect("open(O_RDONLY|O_CREAT)");
    assert_eq!(std::io::read_to_string(g).unwrap(), "from the lower\n");
    // O_TRUNC: emptied, and the size the kernel holds says so.
    let mut t = fs::File::create(m.p("d/t")).expect("creat(2) of a name in the lower");
    assert_eq!(t.metadata().unwrap().len(), 0);
    t.write_all(b"new\n").unwrap();
    drop(t);
    assert_eq!(fs::read_to_string(m.p("d/t")).unwrap(), "new\n");
    // O_EXCL: it exists.
    let e = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.p("d/x"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST), "{e}");
    // A directory: EISDIR, as open(2) gives.
    let e = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(m.p("d/sub"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EISDIR), "{e}");
    // A symlink that appeared, pointing out of the mount: the daemon
    // never follows it; the open fails (EEXIST, the kernel's entry is
    // dropped) and the file outside is untouched. A retry then takes the
    // kernel's own walk, which resolves the link inside the mount's view.
    let outside = ws.dir.path().join("outside");
    fs::write(&outside, "outside\n").unwrap();
    std::os::unix::fs::symlink(&outside, ws.lower().join("d/link")).unwrap();
    let e = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(m.p("d/link"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST), "{e}");
    assert_eq!(fs::read_to_string(&outside).unwrap(), "outside\n");
    // The lower is untouched; the changes are in the upper.
    for n in ["f", "g", "t", "x"] {
        assert_eq!(
            fs::read_to_string(ws.lower().join("d").join(n)).unwrap(),
            "from the lower\n"
        );
    }
    assert_eq!(
        fs::read_to_string(ws.upper.join("d/f")).unwrap(),
        "from the lower\nappended\n"
    );
    assert!(!ws.upper.join("d/g").exists(), "a read-only open copied up");
    assert!(m.unmount());
}

/// The open a CREATE falls back to for a name that appeared unseen (see
/// above) checks the file's own permissions, which the kernel did not (it
/// checked only the directory's): another user is refused writing a file
/// that is not theirs, as on a plain directory, and may read it.
#[test]
fn create_of_a_name_that_appeared_unseen_checks_the_files_permissions() {
    let ws = shared_workspace();
    let d = ws.lower().join("d");
    fs::create_dir(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
    let m = ws.mount_with(&[
        "--allow-other",
        "--max-watches",
        "0",
        "--lower-timeout",
        "60s",
    ]);
    for n in ["mine", "theirs", "open"] {
        assert!(fs::symlink_metadata(m.p(&format!("d/{n}"))).is_err());
    }
    for (n, mode, uid) in [
        ("mine", 0o600, 65534),
        ("theirs", 0o644, 0),
        ("open", 0o666, 0),
    ] {
        let f = d.join(n);
        fs::write(&f, "lower\n").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(&f, Some(uid), Some(uid)).unwrap();
    }
    let append = |n: &str| {
        let script = format!("echo more >> {}", m.p(&format!("d/{n}")).display());
        as_nobody(&["sh", "-c", &script])
    };
    let (ok, err) = append("theirs");
    assert!(!ok && err.contains("Permission denied"), "{err}");
    let read = format!(
        "import os; os.read(os.open({:?}, os.O_RDONLY | os.O_CREAT), 9)",
        m.p("d/theirs").display().to_string()
    );
    let (ok, err) = as_nobody(&["/usr/bin/python3", "-c", &read]);
    assert!(ok, "reading a readable file refused: {err}");
    let (ok, err) = append("mine");
    assert!(ok, "{err}");
    let (ok, err) = append("open");
    assert!(ok, "{err}");
    assert_eq!(fs::read_to_string(m.p("d/theirs")).unwrap(), "lower\n");
    assert_eq!(fs::read_to_string(m.p("d/mine")).unwrap(), "lower\nmore\n");
    assert_eq!(fs::read_to_string(m.p("d/open")).unwrap(), "lower\nmore\n");
    assert!(
        !ws.upper.join("d/theirs").exists(),
        "a refused open copied up"
    );
    assert!(m.unmount());
}
