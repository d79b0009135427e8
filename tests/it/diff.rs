//! Workspace state through real mounts: `layerfs diff` (every change kind,
//! text, `--json`, `--patch`, drift), `layerfs reset` (live and unmounted,
//! path escapes refused), scratch paths and `layerfs gc`, and the copy-up
//! origin record (hidden through the mount, harmless to kernel overlayfs).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use crate::basic::fsutil::write;
use crate::harness::{bin, errno, layerfs, sh, KernelOverlay, Workspace};
/// Runs layerfs, requires success, returns stdout.
fn ok(args: &[&str]) -> String {
    let out = layerfs(args);
    assert!(
        out.status.success(),
        "layerfs {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn lines(text: &str) -> Vec<String> {
    text.lines().map(str::to_string).collect()
}

fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

/// A lower with files, nested directories and fixed modes.
fn populate(lower: &Path) {
    crate::harness::populate(
        lower,
        &[
            ("a.txt", "hello\n"),
            ("b.txt", "bye\n"),
            ("src/main.rs", "line1\nline2\nline3\n"),
            ("src/lib.rs", "pub fn x() {}\n"),
            ("docs/x.md", "x\n"),
            ("docs/sub/y.md", "y\n"),
            ("old/o.txt", "o\n"),
            ("old/inner/p.txt", "p\n"),
            ("keep/k1", "k1\n"),
            ("keep/k2", "k2\n"),
            ("mv.txt", "moved\n"),
            ("chm.txt", "c\n"),
            ("touch.txt", "t\n"),
            ("bin.dat", "\x00\x01\x02bin"),
        ],
    );
    for d in ["", "src", "docs", "docs/sub", "old", "old/inner", "keep"] {
        fs::set_permissions(lower.join(d), fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// Every change kind, made through the mount under `umask`.
fn make_changes(mnt: &Path, umask: &str) {
    sh(
        mnt,
        &format!(
            "umask {umask}
             echo new > new.txt
             echo x > src/added.rs
             mkdir -p newdir/deep && echo n > newdir/deep/f
             echo more >> a.txt
             sed -i s/line2/LINE2/ src/main.rs
             rm b.txt
             rm -rf docs
             rm -rf keep && mkdir -m 700 keep && echo k1new > keep/k1
             mv old renamed
             echo inside > renamed/inner/q.txt
             mv mv.txt moved.txt
             chmod 600 chm.txt
             touch -d 2001-01-01 touch.txt
             ln -s a.txt link"
        ),
    );
}

const EXPECTED: &[&str] = &[
    "M a.txt",
    "D b.txt",
    "T chm.txt",
    "D docs",
    "D docs/sub",
    "D docs/sub/y.md",
    "D docs/x.md",
    "T keep",
    "M keep/k1",
    "D keep/k2",
    "A link",
    "R mv.txt -> moved.txt",
    "A new.txt",
    "A newdir",
    "A newdir/deep",
    "A newdir/deep/f",
    "R old -> renamed",
    "R old/inner -> renamed/inner",
    "R old/inner/p.txt -> renamed/inner/p.txt",
    "A renamed/inner/q.txt",
    "R old/o.txt -> renamed/o.txt",
    "A src/added.rs",
    "M src/main.rs",
    "T touch.txt",
];

/// `EXPECTED` as plain `diff` prints it: the new directory is one line.
const FOLDED: &[&str] = &[
    "M a.txt",
    "D b.txt",
    "T chm.txt",
    "D docs",
    "T keep",
    "M keep/k1",
    "D keep/k2",
    "A link",
    "R mv.txt -> moved.txt",
    "A new.txt",
    "A newdir/ (2 entries)",
    "R old -> renamed",
    "A renamed/inner/q.txt",
    "A src/added.rs",
    "M src/main.rs",
    "T touch.txt",
];

fn check_json(out: &str) {
    let objs = json_lines(out);
    assert_eq!(objs.len(), EXPECTED.len(), "{out}");
    let find = |p: &str| {
        objs.iter()
            .find(|o| o["path"] == p)
            .unwrap_or_else(|| panic!("{p} missing from {out}"))
    };
    for o in &objs {
        assert!(o["conflict"].is_boolean() && o["type"].is_string(), "{o}");
    }
    let want = [
        ("a.txt", "modified", "file"),
        ("b.txt", "deleted", "file"),
        ("chm.txt", "metadata", "file"),
        ("docs", "deleted", "dir"),
        ("keep", "metadata", "dir"),
        ("keep/k2", "deleted", "file"),
        ("link", "added", "symlink"),
        ("moved.txt", "renamed", "file"),
        ("newdir", "added", "dir"),
        ("renamed", "renamed", "dir"),
        ("touch.txt", "metadata", "file"),
    ];
    for (p, change, t) in want {
        let o = find(p);
        assert_eq!(o["change"], change, "{o}");
        assert_eq!(o["type"], t, "{o}");
        assert_eq!(o["conflict"], false, "{o}");
    }
    assert_eq!(find("moved.txt")["from"], "mv.txt");
    assert_eq!(find("renamed")["from"], "old");
    assert!(find("a.txt").get("from").is_none());
}

fn diff_kinds(umask: &str) {
    let ws = Workspace::new();
    populate(ws.lower());
    let m = ws.mount();
    make_changes(m.path(), umask);
    // Live: answered from the upper while mounted.
    assert_eq!(lines(&ok(&["diff", "--files", s(m.path())])), EXPECTED);
    assert_eq!(lines(&ok(&["diff", s(m.path())])), FOLDED);
    check_json(&ok(&["diff", "--json", s(m.path())]));
    // PATH… limits the output.
    assert_eq!(
        lines(&ok(&["diff", s(m.path()), "src", "keep/k2"])),
        ["D keep/k2", "A src/added.rs", "M src/main.rs"]
    );
    drop(m);
    // Unmounted: the upper directory names the workspace.
    assert_eq!(lines(&ok(&["diff", "--files", s(&ws.upper)])), EXPECTED);
    assert_eq!(lines(&ok(&["diff", s(&ws.upper)])), FOLDED);
    check_json(&ok(&["diff", "--json", s(&ws.upper)]));
}

#[test]
fn diff_lists_every_change_kind_in_text_and_json() {
    diff_kinds("022");
}

#[test]
fn diff_under_umask_002() {
    diff_kinds("002");
}

#[test]
fn diff_marks_drift_of_a_copied_up_file_as_conflict() {
    let ws = Workspace::new();
    populate(ws.lower());
    let m = ws.mount();
    sh(m.path(), "echo more >> a.txt; echo more >> src/lib.rs");
    let before = json_lines(&ok(&["diff", "--json", s(m.path())]));
    assert!(before.iter().all(|o| o["conflict"] == false), "{before:?}");
    // An administrator updates the shared original after the copy-up.
    write(&ws.lower().join("a.txt"), b"hello, updated upstream\n");
    let after = json_lines(&ok(&["diff", "--json", s(m.path())]));
    let get = |p: &str| after.iter().find(|o| o["path"] == p).unwrap().clone();
    assert_eq!(get("a.txt")["conflict"], true, "{after:?}");
    assert_eq!(get("a.txt")["change"], "modified");
    assert_eq!(get("src/lib.rs")["conflict"], false);
    let text = ok(&["diff", s(m.path())]);
    assert!(text.contains("M a.txt (conflict)\n"), "{text}");
    // The workspace's own copy is untouched by the upstream change.
    assert_eq!(fs::read_to_string(m.p("a.txt")).unwrap(), "hello\nmore\n");
}

#[test]
fn diff_patch_shows_text_edits_and_names_binary_files() {
    let ws = Workspace::new();
    populate(ws.lower());
    let m = ws.mount();
    sh(
        m.path(),
        "sed -i s/line2/LINE2/ src/main.rs; printf '\\000\\003bin' > bin.dat; rm b.txt; echo n > new.txt",
    );
    let patch = ok(&["diff", "--patch", s(m.path())]);
    let want = "\
diff --git a/b.txt b/b.txt
deleted file mode 100644
--- a/b.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
diff --git a/bin.dat b/bin.dat
Binary files a/bin.dat and b/bin.dat differ
diff --git a/new.txt b/new.txt
new file mode 100644
--- /dev/null
+++ b/new.txt
@@ -0,0 +1 @@
+n
diff --git a/src/main.rs b/src/main.rs
--- a/src/main.rs
+++ b/src/main.rs
@@ -1,3 +1,3 @@
 line1
-line2
+LINE2
 line3
";
    assert_eq!(patch, want);
    // `git apply` accepts it against a copy of the shared tree.
    let text_only: String = patch
        .split("diff --git ")
        .filter(|p| !p.is_empty() && !p.contains("Binary files"))
        .map(|p| format!("diff --git {p}"))
        .collect();
    let tree = crate::harness::apply_patch(ws.dir.path(), ws.lower(), &text_only);
    assert_eq!(
        fs::read_to_string(tree.join("src/main.rs")).unwrap(),
        "line1\nLINE2\nline3\n"
    );
    let json = json_lines(&ok(&["diff", "--json", "--patch", s(m.path()), "src"]));
    assert_eq!(json.len(), 1);
    assert!(json[0]["patch"].as_str().unwrap().contains("+LINE2\n"));
}

#[test]
fn reset_on_a_live_mount_shows_the_shared_version_at_once() {
    let ws = Workspace::new();
    populate(ws.lower());
    let m = ws.mount();
    make_changes(m.path(), "022");
    // Let the kernel cache what it sees now.
    assert_eq!(fs::read_to_string(m.p("a.txt")).unwrap(), "hello\nmore\n");
    assert!(!m.p("b.txt").exists() && !m.p("old").exists());
    let out = ok(&[
        "reset",
        s(m.path()),
        "a.txt",
        "b.txt",
        "renamed",
        "new.txt",
        "keep",
    ]);
    assert!(out.contains("reset old\n"), "{out}");
    assert_eq!(fs::read_to_string(m.p("a.txt")).unwrap(), "hello\n");
    assert_eq!(fs::read_to_string(m.p("b.txt")).unwrap(), "bye\n");
    assert_eq!(fs::read_to_string(m.p("old/o.txt")).unwrap(), "o\n");
    assert!(!m.p("old/inner/q.txt").exists());
    assert_eq!(
        errno(&fs::symlink_metadata(m.p("renamed")).unwrap_err()),
        libc::ENOENT
    );
    assert_eq!(
        errno(&fs::symlink_metadata(m.p("new.txt")).unwrap_err()),
        libc::ENOENT
    );
    assert_eq!(fs::read_to_string(m.p("keep/k2")).unwrap(), "k2\n");
    assert_eq!(fs::read_to_string(m.p("keep/k1")).unwrap(), "k1\n");
    let left = lines(&ok(&["diff", s(m.path())]));
    for gone in ["a.txt", "b.txt", "old", "new.txt", "keep"] {
        assert!(
            !left.iter().any(|l| l.contains(&format!(" {gone}"))),
            "{gone} still in {left:?}"
        );
    }
    assert!(left.contains(&"M src/main.rs".to_string()), "{left:?}");
    // The mount keeps working on reset paths.
    fs::write(m.p("a.txt"), "again\n").unwrap();
    assert_eq!(fs::read_to_string(m.p("a.txt")).unwrap(), "again\n");
    assert_eq!(lines(&ok(&["diff", s(m.path()), "a.txt"])), ["M a.txt"]);
}

#[test]
fn reset_of_an_unmounted_upper() {
    let ws = Workspace::new();
    populate(ws.lower());
    let m = ws.mount();
    make_changes(m.path(), "077");
    drop(m);
    ok(&[
        "reset",
        s(&ws.upper),
        "a.txt",
        "b.txt",
        "renamed",
        "moved.txt",
        "docs",
    ]);
    let left = lines(&ok(&["diff", s(&ws.upper)]));
    for gone in ["a.txt", "b.txt", "old", "mv.txt", "docs"] {
        assert!(
            !left.iter().any(|l| l.contains(&format!(" {gone}"))),
            "{gone} still in {left:?}"
        );
    }
    let m = ws.mount();
    assert_eq!(fs::read_to_string(m.p("a.txt")).unwrap(), "hello\n");
    assert_eq!(fs::read_to_string(m.p("mv.txt")).unwrap(), "moved\n");
    assert!(!m.p("moved.txt").exists());
    assert_eq!(fs::read_to_string(m.p("old/inner/p.txt")).unwrap(), "p\n");
    assert_eq!(fs::read_to_string(m.p("docs/sub/y.md")).unwrap(), "y\n");
    drop(m);
    // Everything: the upper holds nothing that changes the view.
    ok(&["reset", s(&ws.upper), "."]);
    assert_eq!(ok(&["diff", s(&ws.upper)]), "");
}

#[test]
fn reset_refuses_paths_outside_the_workspace() {
    let ws = Workspace::new();
    populate(ws.lower());
    let m = ws.mount();
    sh(m.path(), "echo more >> a.txt; rm -rf docs");
    let outside = ws.dir.path().join("outside.txt");
    fs::write(&outside, "keep me").unwrap();
    for bad in [
        "../outside.txt",
        "src/../../outside.txt",
        s(&outside),
        "/etc/passwd",
    ] {
        let out = layerfs(&["reset", s(m.path()), bad]);
        assert_eq!(out.status.code(), Some(1), "{bad} refused");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("outside the workspace") || err.contains("`..`"),
            "{bad}: {err}"
        );
    }
    // Under a deleted shared directory: names the directory to reset.
    let out = layerfs(&["reset", s(m.path()), "docs/x.md"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("reset docs instead"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::read_to_string(&outside).unwrap(), "keep me");
    assert_eq!(fs::read_to_string(m.p("a.txt")).unwrap(), "hello\nmore\n");
    // A symlink in the upper (planted there directly) is never followed.
    fs::create_dir(ws.upper.join("d")).unwrap();
    std::os::unix::fs::symlink(ws.dir.path(), ws.upper.join("d/esc")).unwrap();
    let out = layerfs(&["reset", s(m.path()), "d/esc/outside.txt"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(fs::read_to_string(&outside).unwrap(), "keep me");
}

#[test]
fn scratch_paths_are_left_out_of_diff_and_emptied_by_gc() {
    let ws = Workspace::new();
    populate(ws.lower());
    write(&ws.lower().join("cache/shared.bin"), b"shared");
    let policy = crate::harness::policy_file(&ws, "scratch cache\n");
    let m = ws.mount_with(&[
        "--scratch",
        "build/**",
        "--scratch",
        "*.o",
        "--policy",
        s(&policy),
    ]);
    sh(
        m.path(),
        "mkdir -p build/x && echo o > build/x/out && echo o > src/m.o && echo c > cache/mine \
         && echo kept > keep/k1",
    );
    assert_eq!(
        lines(&ok(&["diff", s(m.path())])),
        ["A build/ (empty)", "M keep/k1"]
    );
    let out = ok(&["gc", s(m.path())]);
    assert_eq!(
        lines(&out),
        ["emptied build/x", "emptied cache", "emptied src/m.o"]
    );
    // The live mount shows it at once: scratch contents gone, shared ones back.
    assert!(m.p("build").is_dir());
    assert_eq!(fs::read_dir(m.p("build")).unwrap().count(), 0);
    assert!(!m.p("src/m.o").exists());
    assert!(!m.p("cache/mine").exists());
    assert_eq!(fs::read(m.p("cache/shared.bin")).unwrap(), b"shared");
    assert_eq!(fs::read_to_string(m.p("keep/k1")).unwrap(), "kept\n");
    drop(m);
    // Unmounted too.
    write(&ws.upper.join("build/again"), b"a");
    ok(&["gc", s(&ws.upper)]);
    assert!(!ws.upper.join("build/again").exists());
    // A workspace without scratch paths says how to get some.
    let plain = Workspace::new();
    drop(plain.mount());
    let out = layerfs(&["gc", s(&plain.upper)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--scratch"));
}

#[test]
fn origin_record_is_hidden_and_harmless_to_kernel_overlayfs() {
    let ws = Workspace::new();
    populate(ws.lower());
    let m = ws.mount();
    sh(m.path(), "echo more >> a.txt");
    let name = "trusted.overlay.layerfs.origin";
    // In the upper: the record names the lower original (the first
    // shared lower, by name: `s:0`).
    let raw = xattr::get(ws.upper.join("a.txt"), name)
        .unwrap()
        .expect("origin recorded");
    let text = String::from_utf8(raw).unwrap();
    assert!(
        text.starts_with("v2 s:0 ") && text.ends_with(" /a.txt"),
        "{text}"
    );
    // Through the mount: never listed, read, set nor removed.
    let listed: Vec<_> = xattr::list(m.p("a.txt")).unwrap().collect();
    assert!(
        listed
            .iter()
            .all(|n| !n.to_string_lossy().contains("layerfs")),
        "{listed:?}"
    );
    assert_eq!(xattr::get(m.p("a.txt"), name).unwrap(), None);
    for n in [name, "user.overlay.layerfs.origin"] {
        let e = xattr::set(m.p("a.txt"), n, b"v1 0 1 1 1.1 1.1 /x").unwrap_err();
        assert_eq!(errno(&e), libc::EPERM, "set {n}");
        let e = xattr::remove(m.p("a.txt"), n).unwrap_err();
        assert_eq!(errno(&e), libc::EPERM, "remove {n}");
    }
    make_changes(m.path(), "022");
    let view = crate::basic::fsutil::tree_listing(m.path());
    drop(m);
    // Kernel overlayfs mounts the same upper and shows the same tree.
    let kwork = ws.dir.path().join("kwork");
    let kmnt = ws.dir.path().join("kmnt");
    let k = KernelOverlay::mount(&[ws.lower()], &ws.upper, &kwork, &kmnt).unwrap();
    assert_eq!(crate::basic::fsutil::tree_listing(&kmnt), view);
    assert_eq!(xattr::get(kmnt.join("a.txt"), name).unwrap(), None);
    drop(k);
}

#[test]
fn diff_and_reset_of_an_unprivileged_workspace() {
    use crate::daemon::{
        as_nobody, chown_tree, mount_args, text, BgMount, DevFuseOpen, DEV_FUSE, NOBODY,
    };
    let _serial = DEV_FUSE.lock().unwrap_or_else(|e| e.into_inner());
    let ws = Workspace::new();
    populate(ws.lower());
    fs::create_dir(&ws.work).unwrap();
    fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    chown_tree(ws.dir.path()).unwrap();
    let _dev = DevFuseOpen::new();
    let out = as_nobody(&bin(), &mount_args(&ws, &[]));
    let _guard = BgMount {
        mnt: ws.mnt.clone(),
        pid: layerfs::host::pidfile::find_daemon(&ws.mnt, Some(NOBODY)),
    };
    assert!(out.status.success(), "unprivileged mount: {}", text(&out));
    let run = |args: &[&str]| {
        let out = as_nobody(
            Path::new(args[0]),
            &args[1..].iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        );
        assert!(out.status.success(), "{args:?} as nobody: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mnt = s(&ws.mnt);
    run(&[
        "/bin/sh",
        "-c",
        &format!(
            "cd {mnt} && echo more >> a.txt && mv old renamed && chmod 600 chm.txt && rm b.txt"
        ),
    ]);
    // Owners are not compared: copies keep the daemon's owner here.
    let b = bin();
    let b = s(&b);
    assert_eq!(
        lines(&run(&[b, "diff", mnt])),
        ["M a.txt", "D b.txt", "T chm.txt", "R old -> renamed"]
    );
    let rec = xattr::get(ws.upper.join("a.txt"), "user.overlay.layerfs.origin").unwrap();
    assert!(
        rec.is_some(),
        "origin recorded in the user.overlay namespace"
    );
    run(&[b, "reset", mnt, "a.txt", "renamed", "b.txt"]);
    assert_eq!(
        run(&[
            "/bin/cat",
            &format!("{mnt}/a.txt"),
            &format!("{mnt}/old/o.txt"),
            &format!("{mnt}/b.txt")
        ]),
        "hello\no\nbye\n"
    );
    assert_eq!(lines(&run(&[b, "diff", mnt])), ["T chm.txt"]);
    run(&[b, "umount", mnt]);
}

/// A shared file moved anywhere is a rename: into a new directory that is
/// itself renamed later, into a shared directory, by a hard link whose
/// first name is then removed, after an edit, and as one of two files
/// swapped by `RENAME_EXCHANGE`. (`diff` looks for moved files only where
/// the mount marked a directory as receiving one.)
#[test]
fn diff_finds_shared_files_moved_by_rename_and_link() {
    let ws = Workspace::new();
    for f in [
        "m1.txt",
        "m2.txt",
        "m3.txt",
        "m4.txt",
        "m5.txt",
        "sub/m6.txt",
    ] {
        write(&ws.lower().join(f), format!("{f}\n").as_bytes());
    }
    write(&ws.lower().join("ldir/l.txt"), b"l\n");
    let m = ws.mount();
    sh(
        m.path(),
        "mkdir -p n1/n2 && mv m1.txt n1/n2/m1.txt && mv n1 n1moved
         mv m2.txt ldir/m2b
         ln m3.txt keep3 && rm m3.txt
         echo edited >> m4.txt && mkdir n4 && mv m4.txt n4/
         mkdir n6 && mv sub/m6.txt n6/ && mv n6 sub/n6
         for i in $(seq 1 50); do echo $i > n4/new$i; done",
    );
    // Swap m5.txt with a new file: the new name of each is the other's.
    let swapped = Command::new("python3")
        .current_dir(m.path())
        .args([
            "-c",
            "import ctypes,os\n\
             os.mkdir('n5'); open('n5/e','w').write('e\\n')\n\
             libc=ctypes.CDLL(None,use_errno=True)\n\
             r=libc.renameat2(-100,b'm5.txt',-100,b'n5/e',2)\n\
             assert r==0, os.strerror(ctypes.get_errno())",
        ])
        .status()
        .unwrap();
    assert!(swapped.success());
    sh(m.path(), "rm m5.txt");
    let expected = [
        "R m3.txt -> keep3",
        "R m2.txt -> ldir/m2b",
        "A n1moved",
        "A n1moved/n2",
        "R m1.txt -> n1moved/n2/m1.txt",
        "A n4",
        "R m4.txt -> n4/m4.txt",
        "A n5",
        "R m5.txt -> n5/e",
        "A sub/n6",
        "R sub/m6.txt -> sub/n6/m6.txt",
    ];
    let moved = |text: String| -> Vec<String> {
        let all = lines(&text);
        let new_files = all.iter().filter(|l| l.starts_with("A n4/new")).count();
        assert_eq!(new_files, 50, "{text}");
        all.into_iter()
            .filter(|l| !l.starts_with("A n4/new"))
            .collect()
    };
    assert_eq!(moved(ok(&["diff", "--files", s(m.path())])), expected);
    drop(m);
    assert_eq!(moved(ok(&["diff", "--files", s(&ws.upper)])), expected);
    // Content moved with the name: the edit made before the move is there.
    let patch = ok(&["diff", "--patch", s(&ws.upper), "n4/m4.txt"]);
    assert!(patch.contains("+edited"), "{patch}");
}

/// A shared file replaced by an atomic save (`sed -i` writes a new file
/// and renames it over the name) and then moved: the journal's rows tell
/// it was moved, so diff lists one rename. Without the journal the saved
/// file's origin record, inherited from the name it replaced, tells the
/// same (before atomic saves inherited the record, this read as an added
/// and a deleted file; the journal stays the answer for an upper without
/// xattrs).
#[test]
fn diff_takes_renames_of_saved_files_from_the_journal() {
    for journal in [true, false] {
        let ws = Workspace::new();
        write(&ws.lower().join("src/main.rs"), b"fn main() {}\n");
        write(&ws.lower().join("keep.txt"), b"k\n");
        let m = if journal {
            ws.mount()
        } else {
            ws.mount_with(&["--no-journal"])
        };
        sh(
            m.path(),
            "sed -i s/main/start/ src/main.rs && mv src/main.rs src/app.rs
             echo new > fresh.txt && mv fresh.txt fresh2.txt",
        );
        let expected: &[&str] = &["A fresh2.txt", "R src/main.rs -> src/app.rs"];
        let mut got = Vec::new();
        crate::harness::eventually(std::time::Duration::from_secs(5), || {
            got = lines(&ok(&["diff", s(m.path())]));
            got == expected
        });
        assert_eq!(got, expected, "journal {journal}");
        drop(m);
        assert_eq!(
            lines(&ok(&["diff", s(&ws.upper)])),
            expected,
            "journal {journal}"
        );
    }
}

/// Atomic saves (a temp file renamed over the name, as `sed -i` and most
/// editors do) keep the base they replace: drift of the shared original is
/// still a conflict, whether the replaced file was still the shared one or
/// already a copy-up.
#[test]
fn diff_marks_drift_after_an_atomic_save_as_conflict() {
    let ws = Workspace::new();
    populate(ws.lower());
    let m = ws.mount();
    sh(
        m.path(),
        "sed -i '1i x' a.txt
         echo more >> b.txt && cp b.txt .b.tmp && echo again >> .b.tmp && mv .b.tmp b.txt
         cp src/lib.rs src/.lib.rs.swp && echo edit >> src/.lib.rs.swp && mv src/.lib.rs.swp src/lib.rs
         sed -i s/line2/LINE2/ src/main.rs",
    );
    let before = json_lines(&ok(&["diff", "--json", s(m.path())]));
    assert!(before.iter().all(|o| o["conflict"] == false), "{before:?}");
    // An administrator updates three of the shared originals.
    for f in ["a.txt", "b.txt", "src/lib.rs"] {
        let p = ws.lower().join(f);
        let mut text = fs::read(&p).unwrap();
        text.extend_from_slice(b"admin\n");
        write(&p, &text);
    }
    let after = json_lines(&ok(&["diff", "--json", s(m.path())]));
    let get = |p: &str| {
        after
            .iter()
            .find(|o| o["path"] == p)
            .unwrap_or_else(|| panic!("{p} missing: {after:?}"))
            .clone()
    };
    for f in ["a.txt", "b.txt", "src/lib.rs"] {
        assert_eq!(get(f)["conflict"], true, "{f}: {after:?}");
        assert_eq!(get(f)["change"], "modified", "{f}");
    }
    assert_eq!(get("src/main.rs")["conflict"], false);
    let text = ok(&["diff", s(m.path())]);
    for f in ["a.txt", "b.txt", "src/lib.rs"] {
        assert!(text.contains(&format!("M {f} (conflict)\n")), "{text}");
    }
    assert!(text.contains("M src/main.rs\n"), "{text}");
    // The same answer from the upper once unmounted.
    drop(m);
    let text = ok(&["diff", s(&ws.upper)]);
    assert!(text.contains("M a.txt (conflict)\n"), "{text}");
}

/// Every file and symlink under `root` (git's view of a tree: directories
/// only through what they hold): path -> (kind and owner-execute bit, bytes
/// or link target).
fn git_view(root: &Path) -> std::collections::BTreeMap<String, (String, Vec<u8>)> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_str().unwrap().to_string();
            let md = fs::symlink_metadata(&p).unwrap();
            if md.is_dir() {
                stack.push(p);
            } else if md.file_type().is_symlink() {
                let t = fs::read_link(&p).unwrap();
                out.insert(
                    rel,
                    ("link".into(), t.into_os_string().into_encoded_bytes()),
                );
            } else {
                let exec = md.permissions().mode() & 0o100 != 0;
                out.insert(rel, (format!("file exec={exec}"), fs::read(&p).unwrap()));
            }
        }
    }
    out
}

/// `diff --patch` tells renamed directories file by file, so `git apply` on
/// a copy of the lower reproduces the mount's view exactly: renames,
/// nested renames, renames plus edits, files moved out of renamed
/// directories, mode changes, symlinks, type changes and deletions.
#[test]
fn diff_patch_of_renamed_directories_applies_with_git() {
    let ws = Workspace::new();
    let l = ws.lower();
    for (p, text) in [
        ("docs/a.md", "a\n"),
        ("docs/b.md", "b\n"),
        ("docs/sub/c.md", "c\n"),
        ("docs/sub/deep/d.md", "d1\nd2\nd3\n"),
        ("docs/sub/deep/e.md", "e\n"),
        ("pkg/inner/f.txt", "f\n"),
        ("pkg/g.txt", "g\n"),
        ("old/o.txt", "o\n"),
        ("old/inner/p.txt", "p\n"),
        ("tools/run.sh", "#!/bin/sh\n"),
        ("tools/exec.sh", "#!/bin/sh\necho\n"),
        ("keep.txt", "k\n"),
        ("plain.txt", "plain\n"),
        ("src/x.rs", "fn x() {}\n"),
    ] {
        write(&l.join(p), text.as_bytes());
    }
    fs::set_permissions(l.join("tools/exec.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("a.md", l.join("docs/link")).unwrap();
    std::os::unix::fs::symlink("keep.txt", l.join("oldlink")).unwrap();
    std::os::unix::fs::symlink("keep.txt", l.join("retarget")).unwrap();
    let m = ws.mount();
    sh(
        m.path(),
        "mv docs manual
         echo edit >> manual/a.md
         mv manual/sub manual/sub2
         sed -i s/d2/D2/ manual/sub2/deep/d.md
         rm manual/b.md
         echo new > manual/new.md
         mv pkg pkg2 && mv pkg2/inner/f.txt top.txt
         rm -rf old
         chmod +x tools/run.sh && chmod -x tools/exec.sh
         mv keep.txt kept.txt
         ln -s kept.txt newlink && rm oldlink && ln -sfn plain.txt retarget
         rm plain.txt && ln -s kept.txt plain.txt
         mv src/x.rs x.rs",
    );
    let patch = ok(&["diff", "--patch", s(m.path())]);
    assert!(
        !patch.contains("rename from docs\n") && !patch.contains("rename to manual\n"),
        "no directory renames: {patch}"
    );
    assert!(
        patch.contains("rename from docs/sub/c.md\nrename to manual/sub2/c.md\n"),
        "{patch}"
    );
    let tree = crate::harness::apply_patch(ws.dir.path(), l, &patch);
    assert_eq!(git_view(&tree), git_view(m.path()), "{patch}");
    // --json --patch carries the same patches, one per change.
    let json = json_lines(&ok(&["diff", "--json", "--patch", s(m.path())]));
    let joined: String = json.iter().map(|o| o["patch"].as_str().unwrap()).collect();
    assert_eq!(joined, patch);
}

/// Undo operations leave a trace: reset, gc, snapshot save and restore
/// are journal rows naming what, how many entries and who; `log --op`
/// takes only the ops the journal writes.
#[test]
fn undo_operations_are_journal_rows() {
    let ws = Workspace::new();
    populate(ws.lower());
    let m = ws.mount_with(&["--scratch", "build/**"]);
    let mnt = s(m.path());
    sh(
        m.path(),
        "echo more >> a.txt && mkdir -p build && echo o > build/o && echo n > new.txt",
    );
    ok(&["snapshot", "save", mnt, "before"]);
    ok(&["reset", mnt, "a.txt"]);
    ok(&["gc", mnt]);
    ok(&["snapshot", "restore", mnt, "before"]);
    drop(m);
    // Unmounted too.
    ok(&["reset", s(&ws.upper), "new.txt"]);
    let rows: Vec<serde_json::Value> = json_lines(&ok(&["log", "--json", s(&ws.upper)]))
        .into_iter()
        .filter(|r| {
            ["reset", "gc", "snapshot-save", "snapshot-restore"]
                .contains(&r["op"].as_str().unwrap())
        })
        .collect();
    let ops: Vec<&str> = rows.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(
        ops,
        ["snapshot-save", "reset", "gc", "snapshot-restore", "reset"],
        "{rows:?}"
    );
    let paths: Vec<&str> = rows.iter().map(|r| r["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["before", "a.txt", "build/o", "before", "new.txt"]);
    for r in &rows {
        assert_eq!(r["uid"], 0, "{r}");
        assert_eq!(r["comm"], "layerfs", "{r}");
        assert!(r["pid"].as_u64().unwrap() > 0, "{r}");
        assert!(r["bytes"].as_u64().unwrap() >= 1, "entries: {r}");
    }
    let text = ok(&["log", "--op", "reset", s(&ws.upper)]);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.lines().all(|l| l.contains("  1 entry")), "{text}");
    // An unknown op is a usage error naming the valid ones.
    let bad = layerfs(&["log", "--op", "bogus", s(&ws.upper)]);
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("snapshot-restore") && err.contains("deny"),
        "{err}"
    );
}

/// Runs layerfs with its stdout a pipe nobody reads any more (what `| head
/// -1` leaves once head is gone): every write fails with EPIPE at once.
fn to_closed_pipe(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    Command::new(bin())
        .args(args)
        .stdout(writer)
        .output()
        .expect("run layerfs")
}

/// Every command that prints ends quietly on a closed pipe: status 0, no
/// panic, nothing on stderr.
#[test]
fn printing_commands_end_quietly_on_a_closed_pipe() {
    let ws = Workspace::new();
    populate(ws.lower());
    let m = ws.mount();
    let mnt = s(m.path());
    sh(m.path(), "echo more >> a.txt && echo n > new.txt");
    ok(&["snapshot", "save", mnt, "s1"]);
    let policy = crate::harness::policy_file(&ws, "hide secrets/**\n");
    let cases: Vec<Vec<&str>> = vec![
        vec!["log", mnt],
        vec!["log", "--json", mnt],
        vec!["diff", mnt],
        vec!["diff", "--json", mnt],
        vec!["diff", "--patch", mnt],
        vec!["status", mnt],
        vec!["status", "--json", mnt],
        vec!["snapshot", "list", mnt],
        vec!["snapshot", "list", "--json", mnt],
        vec!["policy", "check", s(&policy)],
        vec!["--help"],
    ];
    // The journal's rows are in once the writer flushed them.
    crate::harness::eventually(std::time::Duration::from_secs(10), || {
        !ok(&["log", mnt]).is_empty()
    });
    for args in cases {
        let out = to_closed_pipe(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && err.is_empty(),
            "layerfs {args:?}: {:?} {err}",
            out.status
        );
    }
}

/// A `git init` inside the workspace is one `A .git/ (N entries)` line,
/// with N the entries `--files` and `--json` list one by one; a shared file
/// moved into a new directory keeps its own `R` line; naming the new
/// directory as a PATH lists what is inside it.
#[test]
fn diff_folds_a_new_directory_into_one_line_with_its_count() {
    let ws = Workspace::new();
    write(&ws.lower().join("README.md"), b"readme\n");
    write(&ws.lower().join("notes.txt"), b"notes\n");
    let m = ws.mount();
    sh(
        m.path(),
        "git init -q . && mkdir -p new/sub && echo x > new/sub/x && mv notes.txt new/notes.txt",
    );
    let files = ok(&["diff", "--files", s(m.path())]);
    let git_entries = files.lines().filter(|l| l.starts_with("A .git/")).count();
    assert!(git_entries > 10, "{files}");
    assert!(files.lines().any(|l| l == "A .git"), "{files}");
    let json = json_lines(&ok(&["diff", "--json", s(m.path())]));
    assert_eq!(
        json.len(),
        files.lines().count(),
        "--json keeps every entry"
    );
    assert_eq!(
        lines(&ok(&["diff", s(m.path())])),
        [
            format!("A .git/ ({git_entries} entries)"),
            "A new/ (2 entries)".to_string(),
            "R notes.txt -> new/notes.txt".to_string(),
        ]
    );
    // A PATH naming the new directory lists it; its new subdirectory folds.
    let named = lines(&ok(&["diff", s(m.path()), "new"]));
    assert_eq!(named.len(), 3, "{named:?}");
    assert_eq!(named[0], "A new");
    assert_eq!(named[2], "A new/sub/ (1 entry)");
    // Through a pipe that closes early, as people page it.
    let out = to_closed_pipe(&["diff", s(m.path())]);
    assert!(out.status.success(), "{out:?}");
}

/// `diff --stat`: counts and bytes per top-level entry and the totals, a
/// deleted directory counted with every shared entry beneath it; `--json`
/// gives the same numbers exactly.
#[test]
fn diff_stat_counts_changes_and_bytes_per_top_level_entry() {
    let ws = Workspace::new();
    let l = ws.lower();
    write(&l.join("big.txt"), &[b'b'; 1000]);
    write(&l.join("old/a"), &[b'a'; 300]);
    write(&l.join("old/in/b"), &[b'b'; 200]);
    write(&l.join("src/main.rs"), b"fn main() {}\n");
    write(&l.join("src/mode.rs"), b"m\n");
    let m = ws.mount();
    sh(
        m.path(),
        "git init -q . && rm -rf old && head -c 4096 /dev/zero > big.txt \
         && echo '// more' >> src/main.rs && chmod 600 src/mode.rs && mv src/mode.rs src/mode2.rs \
         && printf 12345 > src/new.rs",
    );
    let text = ok(&["diff", "--stat", s(m.path())]);
    let rows: Vec<Vec<String>> = text
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    assert_eq!(
        rows[0],
        ["path", "added", "modified", "deleted", "renamed", "metadata", "+bytes", "-bytes"],
        "{text}"
    );
    let row = |name: &str| {
        rows.iter()
            .find(|r| r[0] == name)
            .unwrap_or_else(|| panic!("no row {name} in\n{text}"))
            .clone()
    };
    assert_eq!(
        row("big.txt"),
        ["big.txt", "0", "1", "0", "0", "0", "4.0", "KiB", "1000", "B"]
    );
    // `old` and the three entries beneath it, 500 bytes of files.
    assert_eq!(
        row("old/"),
        ["old/", "0", "0", "4", "0", "0", "0", "B", "500", "B"]
    );
    // main.rs modified (21 bytes now, 13 before), mode.rs renamed, new.rs
    // added (5 bytes).
    assert_eq!(
        row("src/"),
        ["src/", "1", "1", "0", "1", "0", "26", "B", "13", "B"]
    );
    let git = row(".git/");
    assert_eq!(&git[2..6], ["0", "0", "0", "0"], "{text}");
    let json = json_lines(&ok(&["diff", "--stat", "--json", s(m.path())]));
    let total = json.last().unwrap();
    assert_eq!(total["total"], true, "{json:?}");
    let git_added = json.iter().find(|o| o["path"] == ".git/").unwrap()["added"]
        .as_u64()
        .unwrap();
    let files = ok(&["diff", "--files", s(m.path()), ".git"]);
    assert_eq!(git_added as usize, files.lines().count(), "{files}");
    assert_eq!(total["added"].as_u64().unwrap(), git_added + 1);
    assert_eq!(total["modified"], 2);
    assert_eq!(total["deleted"], 4);
    assert_eq!(total["renamed"], 1);
    assert_eq!(total["bytes_removed"], 1000 + 500 + 13);
    let sum: u64 = json[..json.len() - 1]
        .iter()
        .map(|o| o["bytes_added"].as_u64().unwrap())
        .sum();
    assert_eq!(total["bytes_added"].as_u64().unwrap(), sum);
    assert!(sum >= 4096 + 21 + 5, "{json:?}");
    assert_eq!(row("total")[1], total["added"].to_string(), "{text}");
}

/// `diff --files` lists what a deleted shared directory held (`D dir/x`)
/// and what a renamed one carried along (`R old/x -> new/x`), as it lists
/// an added directory's entries; an entry another change speaks for (a
/// file moved out first, a file edited under the new name) keeps only its
/// own line. `--stat` counts exactly those lines.
#[test]
fn diff_files_lists_the_entries_of_deleted_and_renamed_directories() {
    let ws = Workspace::new();
    let l = ws.lower();
    write(&l.join("gone/a"), b"a\n");
    write(&l.join("gone/sub/b"), b"bb\n");
    write(&l.join("docs/x.md"), b"x\n");
    write(&l.join("docs/in/y.md"), b"y\n");
    write(&l.join("docs/in/z.md"), b"z\n");
    let m = ws.mount();
    sh(
        m.path(),
        "rm -rf gone && mv docs/in/y.md y.md && mv docs manual && echo more >> manual/x.md",
    );
    assert_eq!(
        lines(&ok(&["diff", s(m.path())])),
        [
            "D gone",
            "R docs -> manual",
            "M manual/x.md",
            "R manual/in/y.md -> y.md"
        ]
    );
    let want = [
        "D gone",
        "D gone/a",
        "D gone/sub",
        "D gone/sub/b",
        "R docs -> manual",
        "R docs/in -> manual/in",
        "R docs/in/z.md -> manual/in/z.md",
        "M manual/x.md",
        "R manual/in/y.md -> y.md",
    ];
    assert_eq!(lines(&ok(&["diff", "--files", s(m.path())])), want);
    let json = json_lines(&ok(&["diff", "--files", "--json", s(m.path())]));
    assert_eq!(json.len(), want.len(), "{json:?}");
    let total = json_lines(&ok(&["diff", "--stat", "--json", s(m.path())]))
        .pop()
        .unwrap();
    assert_eq!(total["deleted"], 4, "{total}");
    assert_eq!(total["renamed"], 4, "{total}");
    assert_eq!(total["modified"], 1, "{total}");
    drop(m);
    // Unmounted, from the upper: the same lines.
    assert_eq!(lines(&ok(&["diff", "--files", s(&ws.upper)])), want);
}

/// A file moved out of a shared directory that is then removed (`mv d/x
/// y; rm -rf d`): kernel overlayfs's redirect cannot say it either, so
/// `diff` shows the new file and the removed directory, and `--patch`
/// applied with `git apply` to a copy of the shared tree gives the view.
#[test]
fn a_file_moved_out_of_a_removed_shared_directory_round_trips_through_the_patch() {
    let ws = Workspace::new();
    let l = ws.lower();
    for (p, text) in [
        ("d/x", "x1\nx2\n"),
        ("d/z", "z\n"),
        ("d/sub/w", "w\n"),
        ("keep", "k\n"),
    ] {
        write(&l.join(p), text.as_bytes());
    }
    let m = ws.mount();
    sh(m.path(), "mv d/x y && rm -rf d && echo x3 >> y");
    let d = ok(&["diff", s(m.path())]);
    let lines: Vec<&str> = d.lines().collect();
    assert!(lines.contains(&"D d"), "{d}");
    assert!(
        lines
            .iter()
            .any(|l| l.ends_with(" y") || l.ends_with("-> y")),
        "{d}"
    );
    let files = ok(&["diff", "--files", s(m.path())]);
    for gone in ["D d/z", "D d/sub/w"] {
        assert!(files.lines().any(|l| l == gone), "no `{gone}` in:\n{files}");
    }
    let patch = ok(&["diff", "--patch", s(m.path())]);
    let tree = crate::harness::assert_patch_gives(ws.dir.path(), l, &patch, m.path());
    assert!(!tree.join("d").exists(), "{patch}");
    assert_eq!(fs::read_to_string(tree.join("y")).unwrap(), "x1\nx2\nx3\n");
}
