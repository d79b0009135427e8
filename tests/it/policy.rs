//! Policy tests through a real mount: every rule (`hide`, `readonly`,
//! `protect`, `symlinks`, `allow-host`, `devices`, `suid`, `quota`) and every
//! default is attacked with ordinary syscalls; each attack must be refused
//! with the documented errno and leave every layer (and everything else in
//! the workspace) unchanged, while the legitimate uses next to it keep
//! working. Also: the directory/symlink swap race against the daemon's own
//! I/O, SIGHUP reloads, and the `policy explain` / `policy check` commands.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::{FromRawFd, IntoRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::harness::eventually;
use crate::harness::{errno, is_mounted, policy_file, populate, Mount, Workspace};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Collects verdicts so one run reports every wrong errno, not just the first.
#[derive(Default)]
struct Verdicts {
    bad: Vec<String>,
}

impl Verdicts {
    /// `r` must fail with `want`.
    fn refused<T>(&mut self, what: &str, r: io::Result<T>, want: i32) {
        match r {
            Ok(_) => self
                .bad
                .push(format!("{what}: succeeded, expected {}", errname(want))),
            Err(e) => match e.raw_os_error() {
                Some(got) if got == want => {}
                Some(got) => self.bad.push(format!(
                    "{what}: got {}, expected {}",
                    errname(got),
                    errname(want)
                )),
                None => self
                    .bad
                    .push(format!("{what}: got `{e}`, expected {}", errname(want))),
            },
        }
    }

    /// `r` must succeed.
    fn works<T>(&mut self, what: &str, r: io::Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.bad.push(format!("{what}: failed with {e}"));
                None
            }
        }
    }

    fn check(&mut self, what: &str, ok: bool) {
        if !ok {
            self.bad.push(what.to_string());
        }
    }

    fn assert_clean(&self, test: &str) {
        assert!(
            self.bad.is_empty(),
            "{test}: {} problem(s):\n  {}",
            self.bad.len(),
            self.bad.join("\n  ")
        );
    }
}

fn errname(e: i32) -> String {
    let name = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EACCES => "EACCES",
        libc::EEXIST => "EEXIST",
        libc::EROFS => "EROFS",
        libc::EDQUOT => "EDQUOT",
        libc::EINVAL => "EINVAL",
        libc::EBUSY => "EBUSY",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::EXDEV => "EXDEV",
        libc::ENOSYS => "ENOSYS",
        libc::EIO => "EIO",
        libc::ELOOP => "ELOOP",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::ENOSPC => "ENOSPC",
        libc::ENODATA => "ENODATA",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        _ => "",
    };
    format!("{name}({e})")
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

fn cvt(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn mknod(p: &Path, mode: libc::mode_t, dev: libc::dev_t) -> io::Result<()> {
    // SAFETY: the CString from cstr(p) lives to the end of the statement, past the call.
    cvt(unsafe { libc::mknod(cstr(p).as_ptr(), mode, dev) })
}

fn truncate(p: &Path, len: i64) -> io::Result<()> {
    // SAFETY: the CString from cstr(p) lives to the end of the statement, past the call.
    cvt(unsafe { libc::truncate(cstr(p).as_ptr(), len) })
}

fn utimens(p: &Path, secs: i64) -> io::Result<()> {
    let t = libc::timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: the CString from cstr(p) outlives the call, and times holds two timespecs.
    cvt(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            cstr(p).as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

fn rename_exchange(a: &Path, b: &Path) -> io::Result<()> {
    // SAFETY: the CStrings from cstr(a) and cstr(b) live to the end of the statement.
    cvt(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cstr(a).as_ptr(),
            libc::AT_FDCWD,
            cstr(b).as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    })
}

fn chmod(p: &Path, mode: u32) -> io::Result<()> {
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
}

fn mode_of(p: &Path) -> u32 {
    fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .mode()
        & 0o7777
}

/// Creates (exclusively) a file with `mode`, as `open(O_CREAT|O_EXCL)` does.
fn create_mode(p: &Path, mode: u32) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(p)
}

fn create(p: &Path) -> io::Result<fs::File> {
    create_mode(p, 0o644)
}

fn open_write(p: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new().write(true).open(p)
}

fn open_trunc(p: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new().write(true).truncate(true).open(p)
}

fn open_append(p: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new().append(true).open(p)
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Runs a bash script; returns (success, stdout+stderr). Never panics on failure.
fn run(dir: &Path, script: &str) -> (bool, String) {
    let out = crate::harness::bash(dir, script);
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Runs the layerfs binary; returns (success, stdout+stderr).
fn layerfs(args: &[&str]) -> (bool, String) {
    let out = crate::harness::layerfs(args);
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// One entry of a tree snapshot: type, permission bits, size, device,
/// link target, content and xattrs (no times).
fn describe(p: &Path, md: &fs::Metadata) -> String {
    let ft = md.file_type();
    let kind = if ft.is_dir() {
        "dir".to_string()
    } else if ft.is_symlink() {
        format!(
            "link->{}",
            fs::read_link(p)
                .map(|t| t.display().to_string())
                .unwrap_or_default()
        )
    } else if ft.is_file() {
        let data = fs::read(p).unwrap_or_default();
        format!(
            "file {}b {:?}",
            data.len(),
            String::from_utf8_lossy(&data[..data.len().min(256)])
        )
    } else if ft.is_char_device() {
        format!("chr {:x}", md.rdev())
    } else if ft.is_block_device() {
        format!("blk {:x}", md.rdev())
    } else if ft.is_fifo() {
        "fifo".to_string()
    } else {
        "socket".to_string()
    };
    let mut xattrs: Vec<String> = xattr::list(p)
        .map(|it| {
            it.map(|n| {
                let v = xattr::get(p, &n).ok().flatten().unwrap_or_default();
                format!("{}={}", n.to_string_lossy(), String::from_utf8_lossy(&v))
            })
            .collect()
        })
        .unwrap_or_default();
    xattrs.sort();
    format!(
        "{kind} mode={:o} nlink={} xattrs={xattrs:?}",
        md.mode() & 0o7777,
        if ft.is_dir() { 0 } else { md.nlink() }
    )
}

/// Recursive snapshot of `root` (never following symlinks), skipping the
/// absolute paths in `skip`.
fn tree_skip(root: &Path, skip: &[&Path]) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, skip: &[&Path], out: &mut BTreeMap<String, String>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if skip.contains(&p.as_path()) {
                continue;
            }
            let Ok(md) = fs::symlink_metadata(&p) else {
                continue;
            };
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            out.insert(rel, describe(&p, &md));
            if md.is_dir() {
                walk(root, &p, skip, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, skip, &mut out);
    out
}

/// Everything in the workspace except the mountpoint, the daemon's work
/// dir and its state dir (whose journal records the refused attempts): all
/// layers, the policy file, and anything a leaking daemon created.
fn outside(ws: &Workspace) -> BTreeMap<String, String> {
    let state = layerfs::state::workspace::default_state_dir(&ws.upper);
    tree_skip(
        ws.dir.path(),
        &[ws.mnt.as_path(), ws.work.as_path(), state.as_path()],
    )
}

/// Asserts that two snapshots are equal, printing only the differences.
fn assert_same(what: &str, before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) {
    let mut diff = Vec::new();
    for (k, v) in before {
        match after.get(k) {
            None => diff.push(format!("- {k}: {v}")),
            Some(w) if w != v => diff.push(format!("~ {k}: {v}  =>  {w}")),
            _ => {}
        }
    }
    for (k, v) in after {
        if !before.contains_key(k) {
            diff.push(format!("+ {k}: {v}"));
        }
    }
    assert!(
        diff.is_empty(),
        "{what}: the workspace changed:\n  {}",
        diff.join("\n  ")
    );
}

fn mount_policy(ws: &Workspace, text: &str) -> Mount {
    let p = policy_file(ws, text);
    ws.mount_with(&["--policy", p.to_str().unwrap()])
}

// ---------------------------------------------------------------------------
// readonly
// ---------------------------------------------------------------------------

#[test]
fn readonly_refuses_every_change_and_reads_still_work() {
    let ws = Workspace::new();
    populate(
        ws.lower(),
        &[
            ("skills/a.txt", "skill a"),
            ("skills/sub/b.txt", "skill b"),
            ("skills/empty/", ""),
            ("vendor/pkg/lib.rs", "fn lib() {}"),
            ("other/c.txt", "c"),
        ],
    );
    xattr::set(ws.lower().join("skills/a.txt"), "user.tag", b"v").unwrap();
    // A readonly file that exists only in the upper is read-only too.
    populate(&ws.upper, &[("skills/u.txt", "upper skill")]);
    let m = mount_policy(&ws, "readonly skills/**\nreadonly vendor/pkg/**\n");
    let p = |r: &str| m.p(r);
    let before = outside(&ws);

    let mut v = Verdicts::default();
    let rofs = libc::EROFS;
    for f in ["skills/a.txt", "skills/sub/b.txt", "skills/u.txt"] {
        v.refused(&format!("open(O_WRONLY) {f}"), open_write(&p(f)), rofs);
        v.refused(&format!("open(O_TRUNC) {f}"), open_trunc(&p(f)), rofs);
        v.refused(&format!("open(O_APPEND) {f}"), open_append(&p(f)), rofs);
        v.refused(&format!("truncate {f}"), truncate(&p(f), 0), rofs);
        v.refused(&format!("unlink {f}"), fs::remove_file(p(f)), rofs);
        v.refused(&format!("chmod {f}"), chmod(&p(f), 0o600), rofs);
        v.refused(
            &format!("chown {f}"),
            std::os::unix::fs::chown(p(f), Some(1), Some(1)),
            rofs,
        );
        v.refused(&format!("utimens {f}"), utimens(&p(f), 1), rofs);
        v.refused(
            &format!("setxattr {f}"),
            xattr::set(p(f), "user.evil", b"1"),
            rofs,
        );
    }
    v.refused(
        "removexattr skills/a.txt",
        xattr::remove(p("skills/a.txt"), "user.tag"),
        rofs,
    );
    v.refused("create skills/new", create(&p("skills/new")), rofs);
    v.refused("create skills/sub/new", create(&p("skills/sub/new")), rofs);
    v.refused(
        "mkdir skills/newdir",
        fs::create_dir(p("skills/newdir")),
        rofs,
    );
    v.refused(
        "rmdir skills/empty",
        fs::remove_dir(p("skills/empty")),
        rofs,
    );
    v.refused(
        "mknod fifo skills/fifo",
        mknod(&p("skills/fifo"), libc::S_IFIFO | 0o644, 0),
        rofs,
    );
    v.refused(
        "symlink skills/sl",
        std::os::unix::fs::symlink("a.txt", p("skills/sl")),
        rofs,
    );
    v.refused(
        "rename out skills/a.txt -> other/a.txt",
        fs::rename(p("skills/a.txt"), p("other/a.txt")),
        rofs,
    );
    v.refused(
        "rename within skills/a.txt -> skills/a2.txt",
        fs::rename(p("skills/a.txt"), p("skills/a2.txt")),
        rofs,
    );
    v.refused(
        "rename in other/c.txt -> skills/c.txt",
        fs::rename(p("other/c.txt"), p("skills/c.txt")),
        rofs,
    );
    v.refused(
        "rename over other/c.txt -> skills/a.txt",
        fs::rename(p("other/c.txt"), p("skills/a.txt")),
        rofs,
    );
    v.refused(
        "rename readonly dir skills/sub -> other/sub",
        fs::rename(p("skills/sub"), p("other/sub")),
        rofs,
    );
    v.refused(
        "rename dir holding readonly entries skills -> other2",
        fs::rename(p("skills"), p("other2")),
        rofs,
    );
    v.refused(
        "rename ancestor of readonly entries vendor -> vendor2",
        fs::rename(p("vendor"), p("vendor2")),
        rofs,
    );
    v.refused(
        "RENAME_EXCHANGE skills/a.txt <-> other/c.txt",
        rename_exchange(&p("skills/a.txt"), &p("other/c.txt")),
        rofs,
    );
    v.refused(
        "link skills/a.txt -> skills/a-link",
        fs::hard_link(p("skills/a.txt"), p("skills/a-link")),
        rofs,
    );
    v.refused(
        "link other/c.txt -> skills/c-link",
        fs::hard_link(p("other/c.txt"), p("skills/c-link")),
        rofs,
    );
    v.refused(
        "write vendor/pkg/lib.rs",
        open_write(&p("vendor/pkg/lib.rs")),
        rofs,
    );
    let (ok, out) = run(m.path(), "rm -rf skills");
    v.check(&format!("rm -rf skills must fail (output: {out})"), !ok);
    v.assert_clean("readonly attacks");
    assert_same("readonly attacks", &before, &outside(&ws));

    // Legitimate uses next to the readonly tree.
    assert_eq!(fs::read_to_string(p("skills/a.txt")).unwrap(), "skill a");
    assert_eq!(
        fs::read_to_string(p("skills/sub/b.txt")).unwrap(),
        "skill b"
    );
    assert_eq!(
        fs::read_to_string(p("skills/u.txt")).unwrap(),
        "upper skill"
    );
    assert_eq!(
        listing(&p("skills")),
        vec!["a.txt", "empty", "sub", "u.txt"]
    );
    assert_eq!(
        xattr::get(p("skills/a.txt"), "user.tag").unwrap(),
        Some(b"v".to_vec())
    );
    fs::write(p("other/c.txt"), "changed").unwrap();
    assert_eq!(fs::read_to_string(p("other/c.txt")).unwrap(), "changed");
    assert_eq!(
        fs::read_to_string(ws.upper.join("other/c.txt")).unwrap(),
        "changed"
    );
    assert_eq!(
        fs::read_to_string(ws.lower().join("other/c.txt")).unwrap(),
        "c"
    );
    fs::write(p("other/new.txt"), "n").unwrap();
    fs::rename(p("other/new.txt"), p("other/new2.txt")).unwrap();
    fs::create_dir(p("fresh")).unwrap();
    fs::write(p("fresh/f"), "f").unwrap();
    // The readonly subtree can be read out with tools.
    let (ok, out) = run(m.path(), "cat skills/*.txt && tar -cf - skills | tar -tf -");
    assert!(ok, "reading skills with tools: {out}");
    assert!(
        out.contains("skill a") && out.contains("upper skill"),
        "{out}"
    );
    assert_eq!(
        fs::read_to_string(ws.lower().join("skills/a.txt")).unwrap(),
        "skill a"
    );
    assert!(m.unmount(), "daemon exited with failure");
}

// ---------------------------------------------------------------------------
// hide
// ---------------------------------------------------------------------------

#[test]
fn hide_makes_names_invisible_and_uncreatable() {
    let ws = Workspace::new();
    populate(
        ws.lower(),
        &[
            (".env", "SECRET=1"),
            (".envrc", "ok"),
            ("app/.env", "SECRET=2"),
            ("app/main.py", "print(1)"),
            ("app/x.env", "ok"),
            ("deep/x/y/.env", "SECRET=3"),
            ("deep/x/y/keep.txt", "keep"),
        ],
    );
    // A hidden name that exists only in the upper is hidden too.
    populate(
        &ws.upper,
        &[("up/.env", "upper secret"), ("up/visible.txt", "v")],
    );
    let m = mount_policy(&ws, "hide **/.env\n");
    let p = |r: &str| m.p(r);
    fs::create_dir(p("newdir")).unwrap();
    let before = outside(&ws);

    let mut v = Verdicts::default();
    let hidden = [".env", "app/.env", "deep/x/y/.env", "up/.env"];
    for (dir, visible) in [
        ("", vec![".envrc", "app", "deep", "newdir", "up"]),
        ("app", vec!["main.py", "x.env"]),
        ("deep/x/y", vec!["keep.txt"]),
        ("up", vec!["visible.txt"]),
    ] {
        let names = listing(&p(dir));
        v.check(
            &format!("readdir {dir:?} lists {names:?}, expected {visible:?}"),
            names == visible,
        );
    }
    let (_, out) = run(m.path(), "ls -aR");
    v.check(
        &format!("ls -aR shows .env: {out}"),
        !out.lines().any(|l| l == ".env"),
    );
    for h in hidden {
        v.refused(
            &format!("stat {h}"),
            fs::symlink_metadata(p(h)),
            libc::ENOENT,
        );
        v.refused(&format!("read {h}"), fs::read(p(h)), libc::ENOENT);
        v.refused(
            &format!("open(O_WRONLY) {h}"),
            open_write(&p(h)),
            libc::ENOENT,
        );
        v.refused(&format!("unlink {h}"), fs::remove_file(p(h)), libc::ENOENT);
        v.refused(&format!("chmod {h}"), chmod(&p(h), 0o600), libc::ENOENT);
        v.refused(
            &format!("rename {h} away"),
            fs::rename(p(h), p("newdir/leak")),
            libc::ENOENT,
        );
        v.refused(
            &format!("getxattr {h}"),
            xattr::list(p(h)).map(|_| ()),
            libc::ENOENT,
        );
        v.refused(&format!("create {h}"), create(&p(h)), libc::EACCES);
        v.refused(
            &format!("open(O_CREAT) {h}"),
            fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(p(h)),
            libc::EACCES,
        );
    }
    for h in ["newdir/.env", ".env/inner"] {
        let want = if h.starts_with(".env/") {
            libc::ENOENT
        } else {
            libc::EACCES
        };
        v.refused(&format!("create {h}"), create(&p(h)), want);
    }
    v.refused(
        "mkdir newdir/.env",
        fs::create_dir(p("newdir/.env")),
        libc::EACCES,
    );
    v.refused(
        "mkdir app/.env",
        fs::create_dir(p("app/.env")),
        libc::EACCES,
    );
    v.refused(
        "symlink app/.env",
        std::os::unix::fs::symlink("main.py", p("app/.env")),
        libc::EACCES,
    );
    v.refused(
        "mknod fifo newdir/.env",
        mknod(&p("newdir/.env"), libc::S_IFIFO | 0o644, 0),
        libc::EACCES,
    );
    v.refused(
        "rename app/main.py -> app/.env",
        fs::rename(p("app/main.py"), p("app/.env")),
        libc::EACCES,
    );
    v.refused(
        "link app/main.py -> newdir/.env",
        fs::hard_link(p("app/main.py"), p("newdir/.env")),
        libc::EACCES,
    );
    let (ok, out) = run(m.path(), "touch .env");
    v.check(
        &format!("touch .env must fail with Permission denied: {out}"),
        !ok && out.contains("Permission denied"),
    );
    v.assert_clean("hide attacks");
    assert_same("hide attacks", &before, &outside(&ws));

    // Names that only resemble the hidden one stay fully usable.
    assert_eq!(fs::read_to_string(p(".envrc")).unwrap(), "ok");
    assert_eq!(fs::read_to_string(p("app/x.env")).unwrap(), "ok");
    assert_eq!(fs::read_to_string(p("app/main.py")).unwrap(), "print(1)");
    fs::write(p("app/.envx"), "x").unwrap();
    fs::write(p("newdir/env"), "x").unwrap();
    fs::write(p(".envrc"), "changed").unwrap();
    assert_eq!(
        fs::read_to_string(ws.upper.join(".envrc")).unwrap(),
        "changed"
    );
    assert!(listing(&p("app")).contains(&".envx".to_string()));
    assert!(m.unmount(), "daemon exited with failure");
}

// ---------------------------------------------------------------------------
// Glob semantics, checked through the mount
// ---------------------------------------------------------------------------

#[test]
fn glob_patterns_anchor_and_cover_descendants() {
    let ws = Workspace::new();
    populate(
        ws.lower(),
        &[
            ("private/x.txt", "x"),
            ("a/private/y.txt", "y"),
            ("a/privateer.txt", "ok"),
            ("skills/z.txt", "z"),
            ("sub/skills/z.txt", "z"),
            ("a/b/c/id.key", "k"),
            ("a/b/c/id.keys", "ok"),
            ("docs/a.md", "a"),
            ("docs/secret/k.md", "k"),
        ],
    );
    let m = mount_policy(
        &ws,
        "# basename anywhere, covers descendants\nhide private\n\
         # anchored at the root\nreadonly skills/**\nhide *.key\n\
         readonly docs/**\nhide docs/secret/**\n",
    );
    let p = |r: &str| m.p(r);
    let mut v = Verdicts::default();
    for h in [
        "private",
        "private/x.txt",
        "a/private",
        "a/private/y.txt",
        "a/b/c/id.key",
        "docs/secret/k.md",
    ] {
        v.refused(
            &format!("stat {h}"),
            fs::symlink_metadata(p(h)),
            libc::ENOENT,
        );
    }
    v.check(
        "readdir / lists private",
        !listing(&p("")).contains(&"private".to_string()),
    );
    v.check(
        "readdir a lists private",
        listing(&p("a")) == vec!["b", "privateer.txt"],
    );
    v.check("readdir a/b/c", listing(&p("a/b/c")) == vec!["id.keys"]);
    v.works("read a/privateer.txt", fs::read(p("a/privateer.txt")));
    v.works("read a/b/c/id.keys", fs::read(p("a/b/c/id.keys")));
    v.refused(
        "write skills/z.txt",
        open_write(&p("skills/z.txt")),
        libc::EROFS,
    );
    v.refused("write docs/a.md", open_write(&p("docs/a.md")), libc::EROFS);
    v.works(
        "write sub/skills/z.txt (pattern with '/' is anchored)",
        fs::write(p("sub/skills/z.txt"), "mine"),
    );
    v.assert_clean("glob semantics");
    assert!(m.unmount(), "daemon exited with failure");
}

// ---------------------------------------------------------------------------
// protect
// ---------------------------------------------------------------------------

#[test]
fn protect_keeps_shared_entries_and_reverts_upper_copies() {
    let ws = Workspace::new();
    populate(
        ws.lower(),
        &[
            ("notes/a.md", "shared a"),
            ("notes/sub/b.md", "shared b"),
            ("notes/sub2/c.md", "shared c"),
            ("notes/emptydir/", ""),
            ("free/x", "x"),
        ],
    );
    let m = mount_policy(&ws, "protect notes/**\n");
    let p = |r: &str| m.p(r);
    let before = outside(&ws);

    let mut v = Verdicts::default();
    let perm = libc::EPERM;
    v.refused("unlink notes/a.md", fs::remove_file(p("notes/a.md")), perm);
    v.refused(
        "unlink notes/sub/b.md",
        fs::remove_file(p("notes/sub/b.md")),
        perm,
    );
    v.refused(
        "rmdir notes/emptydir",
        fs::remove_dir(p("notes/emptydir")),
        perm,
    );
    v.refused(
        "rename notes/a.md -> moved.md",
        fs::rename(p("notes/a.md"), p("moved.md")),
        perm,
    );
    v.refused(
        "rename notes/a.md -> notes/a2.md",
        fs::rename(p("notes/a.md"), p("notes/a2.md")),
        perm,
    );
    v.refused(
        "rename notes/sub -> sub-moved",
        fs::rename(p("notes/sub"), p("sub-moved")),
        perm,
    );
    v.refused(
        "rename notes/sub2 -> notes/sub3",
        fs::rename(p("notes/sub2"), p("notes/sub3")),
        perm,
    );
    v.refused(
        "rename dir holding protected entries notes -> notes-old",
        fs::rename(p("notes"), p("notes-old")),
        perm,
    );
    let (ok, out) = run(m.path(), "rm -rf notes/sub");
    v.check(&format!("rm -rf notes/sub must fail: {out}"), !ok);
    v.assert_clean("protect attacks");
    assert_same("protect attacks", &before, &outside(&ws));
    assert_eq!(fs::read_to_string(p("notes/sub/b.md")).unwrap(), "shared b");

    // Editing copies up as usual.
    fs::write(p("notes/a.md"), "mine").unwrap();
    assert_eq!(fs::read_to_string(p("notes/a.md")).unwrap(), "mine");
    assert_eq!(
        fs::read_to_string(ws.upper.join("notes/a.md")).unwrap(),
        "mine"
    );
    assert_eq!(
        fs::read_to_string(ws.lower().join("notes/a.md")).unwrap(),
        "shared a"
    );
    chmod(&p("notes/sub/b.md"), 0o600).unwrap();
    assert_eq!(mode_of(&ws.upper.join("notes/sub/b.md")), 0o600);

    // Removing the upper copy reverts to the shared version: no whiteout.
    fs::remove_file(p("notes/a.md")).expect("unlink of the upper copy of a protected file");
    let mut seen = String::new();
    let back = eventually(Duration::from_secs(3), || {
        seen = fs::read_to_string(p("notes/a.md")).unwrap_or_else(|e| format!("<{e}>"));
        seen == "shared a"
    });
    assert!(back, "notes/a.md after removing the upper copy: {seen:?}");
    assert!(
        fs::symlink_metadata(ws.upper.join("notes/a.md")).is_err(),
        "upper still has notes/a.md (a whiteout?)"
    );
    assert!(listing(&p("notes")).contains(&"a.md".to_string()));
    fs::remove_file(p("notes/sub/b.md")).expect("unlink upper copy of notes/sub/b.md");
    assert_eq!(fs::read_to_string(p("notes/sub/b.md")).unwrap(), "shared b");
    assert_eq!(mode_of(&p("notes/sub/b.md")), 0o644);

    // Entries of the user's own are not protected.
    fs::write(p("notes/new.md"), "own").unwrap();
    fs::rename(p("notes/new.md"), p("notes/new2.md")).unwrap();
    fs::remove_file(p("notes/new2.md")).unwrap();
    fs::create_dir(p("notes/mine")).unwrap();
    fs::remove_dir(p("notes/mine")).unwrap();
    // Outside the protected tree deleting a lower file works (whiteout).
    fs::remove_file(p("free/x")).unwrap();
    assert!(fs::symlink_metadata(p("free/x")).is_err());
    assert_eq!(fs::read_to_string(ws.lower().join("free/x")).unwrap(), "x");
    assert!(m.unmount(), "daemon exited with failure");
}

// ---------------------------------------------------------------------------
// symlinks
// ---------------------------------------------------------------------------

#[test]
fn symlinks_contained_by_default() {
    let ws = Workspace::new();
    populate(ws.lower(), &[("sub/deep/", ""), ("lib/x", "x")]);
    let m = ws.mount();
    let p = |r: &str| m.p(r);
    let before = outside(&ws);

    let mut v = Verdicts::default();
    let escapes = [
        ("sub/deep/e1", "../../../etc/passwd"),
        ("sub/deep/e2", "../../.."),
        ("sub/deep/e3", "a/../../../../x"),
        ("sub/deep/e4", "/etc/shadow"),
        ("sub/deep/e5", "/"),
        ("sub/deep/e6", "/usr/../etc/passwd"),
        ("sub/deep/e7", "/usrx/evil"),
        ("e8", ".."),
        ("e9", "../mnt/lib/x"),
        ("e10", "/etc"),
        ("sub/e11", "../../tmp"),
    ];
    for (name, target) in escapes {
        v.refused(
            &format!("symlink {name} -> {target}"),
            std::os::unix::fs::symlink(target, p(name)),
            libc::EPERM,
        );
    }
    v.assert_clean("escaping symlinks");
    assert_same("escaping symlinks", &before, &outside(&ws));

    let inside = [
        ("sub/deep/py", "/usr/bin/python3"),
        ("sub/deep/l1", "../lib/x"),
        ("sub/deep/l2", "../../lib/x"),
        ("sub/deep/l3", "../.."),
        ("sub/deep/l4", "/opt/tool/bin"),
        ("sub/deep/l5", "/lib64/ld-linux-x86-64.so.2"),
        ("sub/deep/l6", "plain"),
        ("l7", "sub/deep"),
        ("l8", "/bin/sh"),
        ("l9", "/lib/x"),
    ];
    for (name, target) in inside {
        if v.works(
            &format!("symlink {name} -> {target}"),
            std::os::unix::fs::symlink(target, p(name)),
        )
        .is_some()
        {
            let got = fs::read_link(p(name)).map(|t| t.display().to_string());
            v.check(
                &format!("readlink {name}: {got:?}, expected {target}"),
                matches!(&got, Ok(t) if t == target),
            );
            let up = fs::read_link(ws.upper.join(name)).map(|t| t.display().to_string());
            v.check(
                &format!("upper {name}: {up:?}, expected a link to {target}"),
                matches!(&up, Ok(t) if t == target),
            );
        }
    }
    v.works("read through sub/deep/l2", fs::read(p("sub/deep/l2")));
    v.assert_clean("contained symlinks");
    assert!(m.unmount(), "daemon exited with failure");
}

/// A link that is contained where it stands must not become an escape by
/// moving or hard-linking it to a shallower directory.
#[test]
fn moving_a_contained_symlink_cannot_make_it_escape() {
    let ws = Workspace::new();
    populate(ws.lower(), &[("sub/deep/", ""), ("lib/x", "x")]);
    let m = ws.mount();
    let p = |r: &str| m.p(r);
    std::os::unix::fs::symlink("../../lib/x", p("sub/deep/l")).unwrap();
    let before = outside(&ws);
    let mut v = Verdicts::default();
    v.refused(
        "rename sub/deep/l -> l",
        fs::rename(p("sub/deep/l"), p("l")),
        libc::EPERM,
    );
    v.refused(
        "link sub/deep/l -> l2",
        fs::hard_link(p("sub/deep/l"), p("l2")),
        libc::EPERM,
    );
    v.assert_clean("moving a contained symlink");
    assert_same("moving a contained symlink", &before, &outside(&ws));
    // Moving it to another place at the same depth stays allowed.
    fs::create_dir_all(p("sub/other")).unwrap();
    fs::rename(p("sub/deep/l"), p("sub/other/l")).unwrap();
    assert_eq!(fs::read_to_string(p("sub/other/l")).unwrap(), "x");
    assert!(m.unmount(), "daemon exited with failure");
}

#[test]
fn symlinks_any_and_allow_host_relax_the_default() {
    // `symlinks any`: escaping links are ordinary content.
    let ws = Workspace::new();
    populate(ws.lower(), &[("sub/", "")]);
    let m = mount_policy(&ws, "symlinks any\n");
    let mut v = Verdicts::default();
    for (name, target) in [("x", "/etc/passwd"), ("sub/y", "../../.."), ("z", "/")] {
        if v.works(
            &format!("symlinks any: symlink {name} -> {target}"),
            std::os::unix::fs::symlink(target, m.p(name)),
        )
        .is_some()
        {
            let got = fs::read_link(m.p(name)).map(|t| t.display().to_string());
            v.check(
                &format!("readlink {name}: {got:?}"),
                matches!(&got, Ok(t) if t == target),
            );
        }
    }
    v.assert_clean("symlinks any");
    assert!(m.unmount(), "daemon exited with failure");

    // `allow-host` adds a prefix to the defaults; the rest stays refused.
    let ws = Workspace::new();
    let m = mount_policy(&ws, "allow-host /srv\n");
    let before = outside(&ws);
    let mut v = Verdicts::default();
    for (name, target) in [
        ("a", "/etc/passwd"),
        ("b", "/srvx/data"),
        ("c", "/srv/../etc"),
    ] {
        v.refused(
            &format!("allow-host /srv: symlink {name} -> {target}"),
            std::os::unix::fs::symlink(target, m.p(name)),
            libc::EPERM,
        );
    }
    assert_same("allow-host refusals", &before, &outside(&ws));
    for (name, target) in [("d", "/srv/data"), ("e", "/srv"), ("f", "/usr/bin/env")] {
        v.works(
            &format!("allow-host /srv: symlink {name} -> {target}"),
            std::os::unix::fs::symlink(target, m.p(name)),
        );
    }
    v.assert_clean("allow-host");
    assert!(m.unmount(), "daemon exited with failure");
}

// ---------------------------------------------------------------------------
// The swap race: the daemon's own I/O must never follow a symlink
// ---------------------------------------------------------------------------

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2` that never lets the kernel follow a symlink, so anything that
/// appears outside the upper can only come from the daemon.
fn openat2_nofollow(dir: RawFd, rel: &str, flags: i32, mode: u32) -> io::Result<RawFd> {
    let path = CString::new(rel).unwrap();
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: mode as u64,
        resolve: libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_BENEATH,
    };
    // SAFETY: path is NUL-terminated, how a repr(C) open_how of the size passed; both outlive it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as RawFd)
    }
}

fn close(fd: RawFd) {
    // SAFETY: callers pass a descriptor they own and do not use after this call.
    unsafe { libc::close(fd) };
}

/// Every path under `root` (not following symlinks, skipping `skip`) whose
/// name starts with `prefix`.
fn find_prefixed(root: &Path, prefix: &str, skip: &[&Path]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if skip.contains(&p.as_path()) {
                continue;
            }
            if e.file_name().to_string_lossy().starts_with(prefix) {
                found.push(p.clone());
            }
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(p);
            }
        }
    }
    found
}

/// Names directly in `dir` starting with `prefix` (a shallow look at places
/// like `/` that must not be walked).
fn shallow_prefixed(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// A workspace whose mountpoint and upper sit at different depths, so a
/// link target resolved relative to the upper lands somewhere else than one
/// resolved by the kernel relative to the mountpoint; both places are inside
/// the workspace and carry a canary.
struct RaceSetup {
    ws: Workspace,
    /// Where the swapped-in links may point, each holding a `canary` file.
    targets: Vec<PathBuf>,
    link_targets: Vec<String>,
    prefix: String,
}

fn race_setup(tag: &str) -> RaceSetup {
    let mut ws = Workspace::new();
    let base = ws.dir.path().to_path_buf();
    ws.upper = base.join("u1/u2/u3/u4/upper");
    ws.work = base.join("u1/u2/u3/u4/work");
    ws.mnt = base.join("m1/m2/mnt");
    fs::create_dir_all(&ws.upper).unwrap();
    fs::create_dir_all(&ws.mnt).unwrap();
    let abs_target = base.join("abs-target");
    fs::create_dir_all(&abs_target).unwrap();
    // `d -> ../..` and `d -> ../../..` seen from the upper root and from the
    // mount root, and an absolute target.
    let targets = vec![
        base.join("u1/u2/u3"),
        base.join("u1/u2"),
        base.join("m1"),
        base.clone(),
        abs_target.clone(),
    ];
    for t in &targets {
        fs::write(t.join("canary"), "canary").unwrap();
    }
    RaceSetup {
        ws,
        targets,
        link_targets: vec![
            "../..".into(),
            "../../..".into(),
            abs_target.display().to_string(),
        ],
        prefix: format!("f-{tag}{}-", std::process::id()),
    }
}

/// For `secs`, one thread swaps `swap_root/d` between a directory and a
/// symlink (by rename-away and by RENAME_EXCHANGE, resting `dwell` with a
/// directory in place between swaps) while four threads create
/// files and directories in `d` through the mount, by path and through held
/// directory fds, never letting the kernel follow a link. Returns
/// (swaps, successful creates).
fn swap_race(
    s: &RaceSetup,
    mnt: &Path,
    swap_root: &Path,
    dwell: Duration,
    secs: u64,
) -> (usize, usize) {
    let root_fd = fs::File::open(mnt).unwrap().into_raw_fd();
    let stop = AtomicBool::new(false);
    let swaps = AtomicUsize::new(0);
    let created = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let d = swap_root.join("d");
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let target = &s.link_targets[i % s.link_targets.len()];
                if i.is_multiple_of(2) {
                    let _ = fs::rename(&d, swap_root.join(format!("old-{i}")));
                    let _ = std::os::unix::fs::symlink(target, &d);
                    std::thread::yield_now();
                    let _ = fs::remove_file(&d);
                    let _ = fs::create_dir(&d);
                } else {
                    let l = swap_root.join(format!("s-{i}"));
                    let _ = std::os::unix::fs::symlink(target, &l);
                    let _ = rename_exchange(&d, &l);
                    std::thread::yield_now();
                    let _ = rename_exchange(&d, &l);
                    let _ = fs::remove_file(&l);
                    if fs::symlink_metadata(&d)
                        .map(|m| !m.is_dir())
                        .unwrap_or(true)
                    {
                        let _ = fs::remove_file(&d);
                        let _ = fs::create_dir(&d);
                    }
                }
                swaps.fetch_add(1, Ordering::Relaxed);
                i += 1;
                // Let creators get hold of the directory before the next swap.
                std::thread::sleep(dwell);
            }
        });
        // By path: the kernel looks `d` up (never following a link) and asks
        // the daemon to create in whatever directory that was.
        for t in 0..2 {
            let (stop, created, prefix) = (&stop, &created, &s.prefix);
            sc.spawn(move || {
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let rel = format!("d/{prefix}p{t}-{n}");
                    n += 1;
                    if let Ok(fd) = openat2_nofollow(
                        root_fd,
                        &rel,
                        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                        0o644,
                    ) {
                        // SAFETY: fd was just returned by openat2 and nothing else owns it.
                        let mut f = unsafe { fs::File::from_raw_fd(fd) };
                        let _ = f.write_all(b"x");
                        created.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        // Through a held directory fd: the directory moves away under it
        // while a symlink takes its name.
        for t in 0..2 {
            let (stop, created, prefix) = (&stop, &created, &s.prefix);
            sc.spawn(move || {
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let Ok(dfd) =
                        openat2_nofollow(root_fd, "d", libc::O_PATH | libc::O_DIRECTORY, 0)
                    else {
                        std::thread::yield_now();
                        continue;
                    };
                    for _ in 0..16 {
                        let name = CString::new(format!("{prefix}h{t}-{n}")).unwrap();
                        n += 1;
                        // SAFETY: dfd is an open dir fd; name is NUL-terminated.
                        let fd = unsafe {
                            libc::openat(
                                dfd,
                                name.as_ptr(),
                                libc::O_CREAT
                                    | libc::O_EXCL
                                    | libc::O_WRONLY
                                    | libc::O_NOFOLLOW
                                    | libc::O_CLOEXEC,
                                0o644,
                            )
                        };
                        if fd >= 0 {
                            close(fd);
                            created.fetch_add(1, Ordering::Relaxed);
                        }
                        if n.is_multiple_of(4) {
                            let dname = CString::new(format!("{prefix}dir{t}-{n}")).unwrap();
                            // SAFETY: dfd is an open dir fd; dname is NUL-terminated.
                            if unsafe { libc::mkdirat(dfd, dname.as_ptr(), 0o755) } == 0 {
                                created.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    close(dfd);
                }
            });
        }
        std::thread::sleep(Duration::from_secs(secs));
        stop.store(true, Ordering::Relaxed);
    });
    close(root_fd);
    (swaps.into_inner(), created.into_inner())
}

/// After the mount is gone: no raced name anywhere outside the upper (the
/// whole workspace is walked, plus a shallow look at `/`, `/tmp`, `/root`
/// and the workspace's parent), and every canary intact. Returns how many
/// raced names the upper holds.
fn assert_nothing_escaped(s: &RaceSetup) -> usize {
    let base = s.ws.dir.path();
    let upper = s.ws.upper.as_path();
    let leaked = find_prefixed(base, "f-", &[upper]);
    let mut wide = Vec::new();
    for d in ["/", "/tmp", "/root"] {
        wide.extend(shallow_prefixed(Path::new(d), &s.prefix));
    }
    if let Some(parent) = base.parent() {
        wide.extend(shallow_prefixed(parent, &s.prefix));
    }
    assert!(
        leaked.is_empty() && wide.is_empty(),
        "the daemon followed a swapped-in symlink: {} name(s) outside the upper: {:?} {:?}",
        leaked.len() + wide.len(),
        &leaked[..leaked.len().min(20)],
        wide
    );
    for t in &s.targets {
        let c = fs::read_to_string(t.join("canary"));
        assert!(
            matches!(&c, Ok(c) if c == "canary"),
            "canary {} changed: {c:?}",
            t.display()
        );
    }
    find_prefixed(upper, &s.prefix, &[]).len()
}

#[test]
fn dir_symlink_swap_race_through_the_mount_never_redirects_daemon_io() {
    let s = race_setup("mnt");
    let m = mount_policy(&s.ws, "symlinks any\n");
    let mnt = m.path().to_path_buf();
    fs::create_dir(mnt.join("d")).unwrap();
    let (swaps, created) = swap_race(&s, &mnt, &mnt, Duration::ZERO, 3);
    eprintln!("swap race through the mount: {swaps} swaps, {created} creates");
    // The daemon survived the race and still serves.
    assert!(is_mounted(&mnt), "mount gone after the race");
    fs::write(mnt.join("after-race"), "ok").expect("write after the race");
    assert!(m.unmount(), "daemon exited with failure");
    let in_upper = assert_nothing_escaped(&s);
    assert!(swaps > 10, "the swapper made only {swaps} swaps");
    assert!(
        created > 10 && in_upper > 0,
        "the race created too little to mean anything ({created} creates, {in_upper} in upper)"
    );
}

/// The same swap done directly in the upper, behind the daemon's back: the
/// kernel's locks no longer serialize it against the creates, so only the
/// daemon's own fd-relative, no-follow I/O keeps files inside the upper.
/// Creates may fail; none may land outside.
#[test]
fn dir_symlink_swap_in_the_upper_never_redirects_daemon_io() {
    let s = race_setup("up");
    let m = mount_policy(&s.ws, "symlinks any\n");
    let mnt = m.path().to_path_buf();
    fs::create_dir(mnt.join("d")).unwrap();
    let upper = s.ws.upper.clone();
    let (swaps, created) = swap_race(&s, &mnt, &upper, Duration::from_millis(2), 3);
    eprintln!("swap race in the upper: {swaps} swaps, {created} creates");
    assert!(is_mounted(&mnt), "mount gone after the race");
    fs::write(mnt.join("after-race"), "ok").expect("write after the race");
    assert!(m.unmount(), "daemon exited with failure");
    assert_nothing_escaped(&s);
    assert!(swaps > 10, "the swapper made only {swaps} swaps");
}

// ---------------------------------------------------------------------------
// devices, suid, names
// ---------------------------------------------------------------------------

#[test]
fn devices_denied_by_default_fifos_and_sockets_fine() {
    let ws = Workspace::new();
    let m = ws.mount();
    let p = |r: &str| m.p(r);
    let before = outside(&ws);
    let mut v = Verdicts::default();
    v.refused(
        "mknod char 1/3",
        mknod(&p("null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3)),
        libc::EPERM,
    );
    v.refused(
        "mknod block 7/0",
        mknod(&p("loop"), libc::S_IFBLK | 0o660, libc::makedev(7, 0)),
        libc::EPERM,
    );
    v.refused(
        "mknod char 0/0 (a whiteout look-alike)",
        mknod(&p("wh"), libc::S_IFCHR, libc::makedev(0, 0)),
        libc::EPERM,
    );
    v.assert_clean("device attacks");
    assert_same("device attacks", &before, &outside(&ws));

    mknod(&p("fifo"), libc::S_IFIFO | 0o644, 0).expect("mkfifo through the mount");
    assert!(fs::symlink_metadata(p("fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert!(fs::symlink_metadata(ws.upper.join("fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    let sock = std::os::unix::net::UnixListener::bind(p("sock")).expect("bind a socket");
    drop(sock);
    assert!(fs::symlink_metadata(p("sock"))
        .unwrap()
        .file_type()
        .is_socket());
    assert!(m.unmount(), "daemon exited with failure");

    let ws = Workspace::new();
    let m = mount_policy(&ws, "devices allow\n");
    mknod(&m.p("null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3))
        .expect("mknod char 1/3 with `devices allow`");
    let md = fs::symlink_metadata(m.p("null")).unwrap();
    assert!(md.file_type().is_char_device());
    assert_eq!(md.rdev(), libc::makedev(1, 3));
    assert!(m.unmount(), "daemon exited with failure");
}

#[test]
fn suid_bits_stripped_by_default() {
    let ws = Workspace::new();
    populate(ws.lower(), &[("tool", "#!/bin/sh\n")]);
    let m = ws.mount();
    let p = |r: &str| m.p(r);
    let mut v = Verdicts::default();
    fs::write(p("f"), "x").unwrap();
    chmod(&p("f"), 0o755).unwrap();
    for mode in [0o4755, 0o2755, 0o6755] {
        let r = chmod(&p("f"), mode);
        v.check(&format!("chmod {mode:o}: {r:?}"), r.is_ok());
        let got = mode_of(&p("f"));
        v.check(
            &format!("chmod {mode:o} shows {got:o}, expected 755"),
            got == 0o755,
        );
        let up = mode_of(&ws.upper.join("f"));
        v.check(
            &format!("chmod {mode:o}: upper has {up:o}"),
            up & 0o6000 == 0,
        );
    }
    // SAFETY: umask takes and returns a plain integer and touches no memory.
    let old = unsafe { libc::umask(0o022) };
    let r = create_mode(&p("g"), 0o6755);
    // SAFETY: umask takes and returns a plain integer and touches no memory.
    unsafe { libc::umask(old) };
    if v.works("create g mode 6755", r).is_some() {
        let got = mode_of(&p("g"));
        v.check(&format!("created g shows {got:o}"), got & 0o6000 == 0);
        let up = mode_of(&ws.upper.join("g"));
        v.check(&format!("created g: upper has {up:o}"), up & 0o6000 == 0);
    }
    // A lower file made setuid through the mount: copied up, bit stripped.
    v.works("chmod lower tool 4755", chmod(&p("tool"), 0o4755));
    let got = mode_of(&p("tool"));
    v.check(&format!("tool shows {got:o}"), got & 0o6000 == 0);
    v.check(
        "lower tool untouched",
        mode_of(&ws.lower().join("tool")) & 0o6000 == 0,
    );
    v.assert_clean("suid strip");
    assert!(m.unmount(), "daemon exited with failure");

    let ws = Workspace::new();
    let m = mount_policy(&ws, "suid allow\n");
    fs::write(m.p("f"), "x").unwrap();
    chmod(&m.p("f"), 0o4755).unwrap();
    assert_eq!(mode_of(&m.p("f")), 0o4755, "`suid allow` keeps the bit");
    assert!(m.unmount(), "daemon exited with failure");
}

#[test]
fn dot_names_are_rejected_without_side_effects() {
    let ws = Workspace::new();
    populate(ws.lower(), &[("d/x", "x"), ("f", "f")]);
    let m = ws.mount();
    let p = |r: &str| m.p(r);
    let before = outside(&ws);
    let mut v = Verdicts::default();
    v.refused("mkdir d/..", fs::create_dir(p("d/..")), libc::EEXIST);
    v.refused("mkdir .", fs::create_dir(p(".")), libc::EEXIST);
    v.refused("rmdir d/.", fs::remove_dir(p("d/.")), libc::EINVAL);
    v.refused(
        "symlink d/..",
        std::os::unix::fs::symlink("x", p("d/..")),
        libc::EEXIST,
    );
    v.refused(
        "link f -> d/.",
        fs::hard_link(p("f"), p("d/.")),
        libc::EEXIST,
    );
    v.check(
        "rename f -> d/.. must fail",
        fs::rename(p("f"), p("d/..")).is_err(),
    );
    v.check(
        "rename d/.. -> g must fail",
        fs::rename(p("d/.."), p("g")).is_err(),
    );
    v.check("unlink d/.. must fail", fs::remove_file(p("d/..")).is_err());
    v.assert_clean("dot names");
    assert_same("dot names", &before, &outside(&ws));
    assert_eq!(listing(m.path()), vec!["d", "f"]);
    assert!(m.unmount(), "daemon exited with failure");
}

// ---------------------------------------------------------------------------
// quota
// ---------------------------------------------------------------------------

/// Writes `len` bytes to a new file in 64 KiB pieces, then fsyncs and closes
/// it; returns the first error (from write, fsync or close).
fn write_file_checked(p: &Path, len: usize) -> io::Result<()> {
    let mut f = create(p)?;
    let chunk = vec![0x5au8; 64 * 1024];
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len());
        f.write_all(&chunk[..n])?;
        left -= n;
    }
    f.sync_all()?;
    let fd = f.into_raw_fd();
    // SAFETY: fd came from into_raw_fd, so it is owned here and closed exactly once.
    cvt(unsafe { libc::close(fd) })
}

#[test]
fn quota_bytes_exhaustion_and_recovery() {
    let ws = Workspace::new();
    let m = mount_policy(&ws, "quota bytes=1M\n");
    let r = write_file_checked(&m.p("big"), 3 << 20);
    match &r {
        Err(e) if e.raw_os_error() == Some(libc::EDQUOT) => {}
        other => panic!("writing 3 MiB under `quota bytes=1M`: {other:?}, expected EDQUOT"),
    }
    // The daemon keeps serving.
    assert!(is_mounted(m.path()));
    assert!(listing(m.path()).contains(&"big".to_string()));
    let up = fs::metadata(ws.upper.join("big"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(up <= 2 << 20, "upper big is {up} bytes under a 1 MiB quota");
    // After deleting, writes succeed again.
    fs::remove_file(m.p("big")).unwrap();
    write_file_checked(&m.p("small"), 256 << 10).expect("write 256 KiB after freeing space");
    assert_eq!(fs::metadata(m.p("small")).unwrap().len(), 256 << 10);
    assert!(m.unmount(), "daemon exited with failure");
}

#[test]
fn quota_inodes_exhaustion_and_recovery() {
    let ws = Workspace::new();
    let m = mount_policy(&ws, "# a small limit\nquota bytes=10M inodes=30\n");
    let mut made = Vec::new();
    let mut failure = None;
    for i in 0..100 {
        let p = m.p(&format!("n-{i}"));
        match create(&p) {
            Ok(_) => made.push(p),
            Err(e) => {
                failure = Some((i, e));
                break;
            }
        }
    }
    let (at, e) = failure.expect("100 files created under `quota inodes=30`");
    assert_eq!(errno(&e), libc::EDQUOT, "create n-{at}: {e}");
    assert!(
        (20..=30).contains(&at),
        "first refused create was n-{at}, expected about 30"
    );
    let r = fs::create_dir(m.p("dir-over"));
    assert_eq!(
        r.as_ref().map_err(errno).err(),
        Some(libc::EDQUOT),
        "mkdir beyond the inode quota: {r:?}"
    );
    assert!(is_mounted(m.path()));
    assert_eq!(listing(m.path()).len(), made.len());
    for p in made.drain(..5) {
        fs::remove_file(p).unwrap();
    }
    create(&m.p("again-1")).expect("create after deleting files");
    fs::create_dir(m.p("again-dir")).expect("mkdir after deleting files");
    assert!(m.unmount(), "daemon exited with failure");
}

// ---------------------------------------------------------------------------
// reload (SIGHUP)
// ---------------------------------------------------------------------------

fn hup(m: &Mount) {
    assert!(m.pid() > 0);
    // SAFETY: kill takes only integers and touches no memory; the pid (> 0) is the daemon's.
    let rc = unsafe { libc::kill(m.pid() as libc::pid_t, libc::SIGHUP) };
    assert_eq!(rc, 0, "kill -HUP {}", m.pid());
}

#[test]
fn sighup_reloads_and_a_broken_file_keeps_the_old_rules() {
    let ws = Workspace::new();
    populate(
        ws.lower(),
        &[(".env", "S"), ("skills/a.txt", "a"), ("f", "f")],
    );
    let pf = policy_file(&ws, "readonly skills/**\n");
    let m = ws.mount_with(&["--policy", pf.to_str().unwrap()]);
    let p = |r: &str| m.p(r);
    assert_eq!(fs::read_to_string(p(".env")).unwrap(), "S");
    assert_eq!(
        errno(&open_write(&p("skills/a.txt")).unwrap_err()),
        libc::EROFS
    );

    // A new hide rule takes effect without a remount.
    fs::write(&pf, "readonly skills/**\nhide **/.env\n").unwrap();
    hup(&m);
    let hidden = eventually(Duration::from_secs(5), || {
        fs::symlink_metadata(p(".env")).is_err() && !listing(m.path()).contains(&".env".into())
    });
    assert!(
        hidden,
        ".env still visible 5 s after SIGHUP with a hide rule"
    );
    assert_eq!(
        fs::symlink_metadata(p(".env")).map_err(|e| errno(&e)).err(),
        Some(libc::ENOENT)
    );

    // Names the kernel caches for long (objects only in the upper) are
    // hidden at once too: the reload invalidates what the kernel holds.
    fs::write(p("mine.key"), "k").unwrap();
    assert!(fs::symlink_metadata(p("mine.key")).is_ok());
    fs::write(&pf, "readonly skills/**\nhide **/.env\nhide *.key\n").unwrap();
    hup(&m);
    let hidden = eventually(Duration::from_secs(5), || {
        fs::symlink_metadata(p("mine.key")).is_err()
    });
    assert!(
        hidden,
        "upper-only mine.key still visible 5 s after SIGHUP with `hide *.key`"
    );
    fs::write(&pf, "readonly skills/**\nhide **/.env\n").unwrap();
    hup(&m);
    assert!(eventually(Duration::from_secs(5), || {
        fs::symlink_metadata(p("mine.key")).is_ok()
    }));

    // A broken file keeps the old rules and the daemon keeps serving.
    fs::write(
        &pf,
        "readonly skills/**\nhide **/.env\nfrobnicate everything\n",
    )
    .unwrap();
    hup(&m);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        is_mounted(m.path()),
        "daemon gone after reloading a broken policy"
    );
    assert!(
        Path::new(&format!("/proc/{}", m.pid())).exists(),
        "daemon process gone"
    );
    assert_eq!(fs::read_to_string(p("f")).unwrap(), "f");
    assert_eq!(
        fs::symlink_metadata(p(".env")).map_err(|e| errno(&e)).err(),
        Some(libc::ENOENT),
        "hide rule lost after a broken reload"
    );
    assert_eq!(
        open_write(&p("skills/a.txt")).map_err(|e| errno(&e)).err(),
        Some(libc::EROFS),
        "readonly rule lost after a broken reload"
    );

    // Fixing the file and reloading again applies it: readonly gone, hide kept.
    fs::write(&pf, "hide **/.env\n").unwrap();
    hup(&m);
    let writable = eventually(Duration::from_secs(5), || {
        fs::write(p("skills/a.txt"), "mine").is_ok()
    });
    assert!(
        writable,
        "skills/a.txt still read-only 5 s after reloading without the rule"
    );
    assert_eq!(
        fs::read_to_string(ws.upper.join("skills/a.txt")).unwrap(),
        "mine"
    );
    assert!(fs::symlink_metadata(p(".env")).is_err());
    assert!(m.unmount(), "daemon exited with failure");
}

// ---------------------------------------------------------------------------
// moves and links: a path's class never changes by moving it or an ancestor
// ---------------------------------------------------------------------------

/// `hide secrets/**`: renaming the directory (or exchanging it with
/// another) would carry the hidden entries to a visible path.
#[test]
fn renaming_a_parent_cannot_reveal_hidden_content() {
    let ws = Workspace::new();
    populate(
        ws.lower(),
        &[
            ("secrets/key", "SECRET-KEY"),
            ("secrets/sub/deep", "SECRET-DEEP"),
            ("app/private/token", "SECRET-TOKEN"),
            ("app/public/readme", "hello"),
            ("a/secrets/k2", "SECRET-K2"),
            ("pub/", ""),
            ("other/x", "x"),
        ],
    );
    let m = mount_policy(
        &ws,
        "hide secrets/**\nhide **/private/**\nhide **/secrets/k2\n",
    );
    let p = |r: &str| m.p(r);
    let before = outside(&ws);
    let mut v = Verdicts::default();
    let perm = libc::EPERM;
    v.refused(
        "rename secrets -> pub2",
        fs::rename(p("secrets"), p("pub2")),
        perm,
    );
    v.refused(
        "rename secrets -> pub (an empty directory)",
        fs::rename(p("secrets"), p("pub")),
        perm,
    );
    v.refused(
        "RENAME_EXCHANGE secrets <-> pub",
        rename_exchange(&p("secrets"), &p("pub")),
        perm,
    );
    v.refused(
        "RENAME_EXCHANGE pub <-> secrets",
        rename_exchange(&p("pub"), &p("secrets")),
        perm,
    );
    v.refused(
        "rename app/private -> app/open (a `**/` rule)",
        fs::rename(p("app/private"), p("app/open")),
        perm,
    );
    v.refused(
        "rename a/secrets -> a/s2 (a `**/secrets/k2` rule)",
        fs::rename(p("a/secrets"), p("a/s2")),
        perm,
    );
    // The shell sequence of the report.
    let (ok, out) = run(m.path(), "mv secrets pub3 && cat pub3/key");
    v.check(
        &format!("`mv secrets pub3; cat pub3/key` must fail: {out}"),
        !ok,
    );
    v.check(
        &format!("hidden content shown: {out}"),
        !out.contains("SECRET"),
    );
    v.assert_clean("hidden content carried by a rename");
    assert_same("hidden content carried by a rename", &before, &outside(&ws));

    // Moves that keep every class stay allowed: the hidden entries move
    // along and stay hidden.
    fs::rename(p("app"), p("app2")).expect("rename app -> app2 (private stays private)");
    assert!(fs::symlink_metadata(p("app2/private/token")).is_err());
    assert_eq!(
        fs::read_to_string(p("app2/public/readme")).unwrap(),
        "hello"
    );
    fs::rename(p("other"), p("other2")).expect("rename a directory nothing hides");
    assert!(m.unmount(), "daemon exited with failure");
}

/// `readonly **/cfg/**`: rename the directory away, edit, rename it back.
#[test]
fn renaming_a_parent_cannot_unlock_readonly_content() {
    let ws = Workspace::new();
    populate(
        ws.lower(),
        &[
            ("app/cfg/settings.ini", "shared settings\n"),
            ("app/other/", ""),
            ("skills/a.md", "skill\n"),
        ],
    );
    // A readonly file the user has in the upper only is read-only too.
    populate(&ws.upper, &[("mine/cfg/own.ini", "own\n")]);
    let m = mount_policy(&ws, "readonly **/cfg/**\nreadonly skills/**\n");
    let p = |r: &str| m.p(r);
    let before = outside(&ws);
    let mut v = Verdicts::default();
    let rofs = libc::EROFS;
    let (ok, out) = run(
        m.path(),
        "mv app/cfg app/c2 && echo x >> app/c2/settings.ini && mv app/c2 app/cfg",
    );
    v.check(&format!("the report's sequence must fail: {out}"), !ok);
    v.refused(
        "rename app/cfg -> app/c2",
        fs::rename(p("app/cfg"), p("app/c2")),
        rofs,
    );
    v.refused(
        "rename mine/cfg -> mine/c2 (upper only)",
        fs::rename(p("mine/cfg"), p("mine/c2")),
        rofs,
    );
    v.refused(
        "RENAME_EXCHANGE app/cfg <-> app/other",
        rename_exchange(&p("app/cfg"), &p("app/other")),
        rofs,
    );
    v.refused(
        "RENAME_EXCHANGE app/other <-> app/cfg",
        rename_exchange(&p("app/other"), &p("app/cfg")),
        rofs,
    );
    // Into the readonly class: a directory of the user's own becomes cfg.
    fs::create_dir(p("mydir")).unwrap();
    fs::write(p("mydir/evil.ini"), "evil").unwrap();
    v.refused(
        "rename mydir -> app/other/cfg (its files would turn readonly)",
        fs::rename(p("mydir"), p("app/other/cfg")),
        rofs,
    );
    v.assert_clean("readonly content unlocked by a rename");
    assert_eq!(
        fs::read_to_string(p("app/cfg/settings.ini")).unwrap(),
        "shared settings\n"
    );
    fs::remove_dir_all(p("mydir")).unwrap();
    assert_same(
        "readonly content unlocked by a rename",
        &before,
        &outside(&ws),
    );

    // A move that keeps the class is fine: cfg stays readonly under app2.
    fs::rename(p("app"), p("app2")).expect("rename app -> app2");
    assert_eq!(
        errno(&open_append(&p("app2/cfg/settings.ini")).unwrap_err()),
        rofs
    );
    // An empty directory may go anywhere, and be filled where it lands.
    fs::create_dir(p("empty")).unwrap();
    fs::rename(p("empty"), p("app2/other/cfg2")).expect("move an empty directory");
    assert!(m.unmount(), "daemon exited with failure");
}

/// `protect **/keep/**`: rename away, remove, rename back.
#[test]
fn renaming_a_parent_cannot_delete_protected_content() {
    let ws = Workspace::new();
    populate(
        ws.lower(),
        &[("app/keep/shared.md", "shared\n"), ("app/free/", "")],
    );
    let m = mount_policy(&ws, "protect **/keep/**\n");
    let p = |r: &str| m.p(r);
    let before = outside(&ws);
    let mut v = Verdicts::default();
    let (ok, out) = run(
        m.path(),
        "mv app/keep app/k2 && rm app/k2/shared.md && mv app/k2 app/keep",
    );
    v.check(&format!("the report's sequence must fail: {out}"), !ok);
    v.refused(
        "rename app/keep -> app/k2",
        fs::rename(p("app/keep"), p("app/k2")),
        libc::EPERM,
    );
    v.refused(
        "RENAME_EXCHANGE app/keep <-> app/free",
        rename_exchange(&p("app/keep"), &p("app/free")),
        libc::EPERM,
    );
    v.assert_clean("protected content deleted through a rename");
    assert_same(
        "protected content deleted through a rename",
        &before,
        &outside(&ws),
    );
    assert_eq!(
        fs::read_to_string(p("app/keep/shared.md")).unwrap(),
        "shared\n"
    );
    // The user's own directories move in and out freely: protection is
    // about shared entries.
    fs::create_dir_all(p("mine/keep")).unwrap();
    fs::write(p("mine/keep/own"), "own").unwrap();
    fs::rename(p("mine/keep"), p("mine/k2")).expect("rename a directory of the user's own");
    fs::rename(p("app"), p("app2")).expect("rename app -> app2 (keep stays keep)");
    assert_eq!(
        errno(&fs::remove_file(p("app2/keep/shared.md")).unwrap_err()),
        libc::EPERM
    );
    assert!(m.unmount(), "daemon exited with failure");
}

/// A link contained at depth 4 must not escape because its directory moves
/// up; the same for links that come from the lower.
#[test]
fn moving_a_directory_cannot_make_a_symlink_beneath_it_escape() {
    let ws = Workspace::new();
    populate(ws.lower(), &[("l1/l2/l3/", ""), ("x", "inside\n")]);
    std::os::unix::fs::symlink("../../../x", ws.lower().join("l1/l2/l3/lower-link")).unwrap();
    let m = ws.mount();
    let p = |r: &str| m.p(r);
    fs::create_dir_all(p("s1/s2/s3/s4")).unwrap();
    std::os::unix::fs::symlink("../../../../etc/hostname", p("s1/s2/s3/s4/l"))
        .expect("a link contained at depth 4");
    fs::create_dir_all(p("t1/t2/t3/t4/t5")).unwrap();
    std::os::unix::fs::symlink("../../../../../x", p("t1/t2/t3/t4/t5/l")).unwrap();
    fs::create_dir_all(p("u1/u2")).unwrap();
    let before = outside(&ws);
    let mut v = Verdicts::default();
    let perm = libc::EPERM;
    let (ok, out) = run(m.path(), "mv s1/s2/s3/s4 top && cat top/l");
    v.check(&format!("the report's sequence must fail: {out}"), !ok);
    v.refused(
        "rename s1/s2/s3/s4 -> top",
        fs::rename(p("s1/s2/s3/s4"), p("top")),
        perm,
    );
    v.refused(
        "rename s1/s2 -> x2 (one level up for the link)",
        fs::rename(p("s1/s2"), p("x2")),
        perm,
    );
    v.refused(
        "rename a lower directory holding a lower link l1/l2/l3 -> l3",
        fs::rename(p("l1/l2/l3"), p("l3")),
        perm,
    );
    v.refused(
        "RENAME_EXCHANGE s1/s2/s3/s4 <-> u1 (the link goes up)",
        rename_exchange(&p("s1/s2/s3/s4"), &p("u1")),
        perm,
    );
    v.refused(
        "RENAME_EXCHANGE u1 <-> t1/t2/t3/t4/t5 (the link goes up)",
        rename_exchange(&p("u1"), &p("t1/t2/t3/t4/t5")),
        perm,
    );
    v.assert_clean("a symlink made to escape by moving its directory");
    assert_same("escaping symlinks", &before, &outside(&ws));
    // Sideways and deeper stay allowed, and the links keep working.
    fs::create_dir(p("u1/u2/u3")).unwrap();
    fs::rename(p("s1/s2/s3/s4"), p("u1/u2/u3/s4")).expect("move to the same depth");
    fs::rename(p("l1/l2/l3"), p("u1/u2/l3")).expect("move a lower directory sideways");
    assert_eq!(
        fs::read_to_string(p("u1/u2/l3/lower-link")).unwrap(),
        "inside\n"
    );
    fs::create_dir_all(p("d1/d2/d3/d4/d5")).unwrap();
    fs::rename(p("t1/t2/t3/t4/t5"), p("d1/d2/d3/d4/d5/t5")).expect("move deeper");
    // (It now points at d1/x, inside the workspace.)
    assert_eq!(
        fs::read_link(p("d1/d2/d3/d4/d5/t5/l")).unwrap(),
        Path::new("../../../../../x")
    );
    // A directory without links may move up.
    fs::create_dir_all(p("e1/e2/e3")).unwrap();
    fs::write(p("e1/e2/e3/f"), "f").unwrap();
    fs::rename(p("e1/e2/e3"), p("e3")).expect("move up a directory without links");
    assert!(m.unmount(), "daemon exited with failure");
}

/// Links made in a directory while it is being moved up: none may end up
/// escaping (the walk that checks the directory and the rename are one
/// step for whoever adds a name).
#[test]
fn symlinks_made_while_their_directory_moves_never_escape() {
    let ws = Workspace::new();
    let m = ws.mount();
    fs::create_dir_all(m.p("s1/s2/s3/s4")).unwrap();
    let stop = AtomicBool::new(false);
    let made = AtomicUsize::new(0);
    let moved = AtomicUsize::new(0);
    let mut bad = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let l = m.p(&format!("s1/s2/s3/s4/l{i}"));
                if std::os::unix::fs::symlink("../../../../x", &l).is_ok() {
                    made.fetch_add(1, Ordering::Relaxed);
                    let _ = fs::remove_file(&l);
                }
                i += 1;
            }
        });
        for _ in 0..400 {
            if fs::rename(m.p("s1/s2/s3/s4"), m.p("top")).is_err() {
                continue;
            }
            moved.fetch_add(1, Ordering::Relaxed);
            // Whatever is in `top` now was contained when made: nothing
            // with four `..` may be there.
            for e in fs::read_dir(m.p("top")).unwrap().flatten() {
                if let Ok(t) = fs::read_link(e.path()) {
                    if t.to_string_lossy().starts_with("../../../..") {
                        bad.push(format!("top/{:?} -> {t:?}", e.file_name()));
                    }
                }
            }
            // Put it back (refused while a link that must stay deep is in it).
            for _ in 0..100 {
                let _ = sh_quiet(m.path(), "find top -type l -delete");
                if fs::rename(m.p("top"), m.p("s1/s2/s3/s4")).is_ok() {
                    break;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(bad.is_empty(), "links escaped after a move: {bad:?}");
    eprintln!(
        "{} links made, {} moves up",
        made.load(Ordering::Relaxed),
        moved.load(Ordering::Relaxed)
    );
    assert!(m.unmount(), "daemon exited with failure");
}

fn sh_quiet(dir: &Path, script: &str) -> bool {
    crate::harness::bash(dir, script).status.success()
}

/// A refused move is logged with the operation, the path and the rule,
/// and never names an entry the policy hides (the log and the journal
/// would show it): the moved directory is named instead.
#[test]
fn move_refusals_are_logged_without_naming_hidden_entries() {
    let ws = Workspace::new();
    populate(
        ws.lower(),
        &[
            ("secrets/zebra-key", "SECRET"),
            ("d1/d2/sec/", ""),
            ("x", "x"),
        ],
    );
    std::os::unix::fs::symlink("../../../x", ws.lower().join("d1/d2/sec/quokka")).unwrap();
    let p = policy_file(&ws, "hide secrets/**\nhide **/sec/**\n");
    let m = ws.mount_env(
        &["--policy", p.to_str().unwrap()],
        &[("RUST_LOG", "warn,layerfs=info")],
    );
    let mut v = Verdicts::default();
    v.refused(
        "rename secrets -> pub",
        fs::rename(m.p("secrets"), m.p("pub")),
        libc::EPERM,
    );
    // The hidden link keeps its class (hidden under `**/sec/**` at both
    // places) but would escape one level up.
    v.refused(
        "rename d1/d2 -> top",
        fs::rename(m.p("d1/d2"), m.p("top")),
        libc::EPERM,
    );
    v.assert_clean("refused moves");
    let wanted = [
        ("path=\"secrets\"", "hide secrets/**"),
        ("path=\"d1/d2\"", "symlinks contained"),
    ];
    let mut log = String::new();
    let logged = eventually(Duration::from_secs(3), || {
        log = ws.daemon_log();
        wanted.iter().all(|(path, rule)| {
            log.lines().any(|l| {
                l.contains("policy denied")
                    && l.contains("op=Rename")
                    && l.contains(path)
                    && l.contains(rule)
            })
        })
    });
    assert!(logged, "refusals missing from the log:\n{log}");
    assert!(
        !log.contains("zebra") && !log.contains("quokka"),
        "a hidden entry is named in the log:\n{log}"
    );
    assert!(m.unmount(), "daemon exited with failure");
}

/// Another user reaching the workspace through `--allow-other` meets the
/// same move rules: the policy is the mount's, whoever calls.
#[test]
fn another_user_through_allow_other_meets_the_same_move_rules() {
    let ws = Workspace::with_lowers_in(1, Path::new("/var/tmp"));
    fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    populate(
        ws.lower(),
        &[
            ("secrets/key", "SECRET-KEY"),
            ("app/cfg/settings.ini", "shared settings\n"),
            ("s1/s2/s3/s4/", ""),
        ],
    );
    let (uid, gid) = crate::run::tests_ids();
    crate::run::chown_tree(ws.lower(), uid, gid);
    crate::run::chown_tree(&ws.upper, uid, gid);
    let pf = policy_file(&ws, "hide secrets/**\nreadonly **/cfg/**\n");
    let m = ws.mount_with(&["--allow-other", "--policy", pf.to_str().unwrap()]);
    let before = outside(&ws);
    let script = "mv secrets pub; cat pub/key; \
                  mv app/cfg app/c2; echo x >> app/c2/settings.ini; \
                  ln -s ../../../../etc/hostname s1/s2/s3/s4/l && mv s1/s2/s3/s4 top; \
                  cat top/l; true";
    let out = Command::new("setpriv")
        .args([
            format!("--reuid={uid}"),
            format!("--regid={gid}"),
            "--clear-groups".into(),
            "--".into(),
            "bash".into(),
            "-c".into(),
            script.into(),
        ])
        .current_dir(m.path())
        .output()
        .expect("run setpriv");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("SECRET"), "hidden content shown: {text}");
    for refusal in [
        "mv: cannot move 'secrets' to 'pub': Operation not permitted",
        "mv: cannot move 'app/cfg' to 'app/c2': Read-only file system",
        "mv: cannot move 's1/s2/s3/s4' to 'top': Operation not permitted",
    ] {
        assert!(text.contains(refusal), "expected `{refusal}` in:\n{text}");
    }
    assert!(fs::symlink_metadata(m.p("top")).is_err());
    assert_eq!(
        fs::read_to_string(m.p("app/cfg/settings.ini")).unwrap(),
        "shared settings\n"
    );
    // The link was made (contained at depth 4), nothing else changed.
    assert!(fs::symlink_metadata(m.p("s1/s2/s3/s4/l")).is_ok());
    fs::remove_file(m.p("s1/s2/s3/s4/l")).unwrap();
    let after = outside(&ws);
    let changed: Vec<&String> = after
        .keys()
        .filter(|k| before.get(*k) != after.get(*k) && !k.starts_with("upper/"))
        .collect();
    assert!(changed.is_empty(), "changed outside the upper: {changed:?}");
    assert!(m.unmount(), "daemon exited with failure");
}

/// `link` through the mount: the new name must be classed as the source.
#[test]
fn links_through_the_mount_keep_the_class() {
    let ws = Workspace::new();
    populate(
        ws.lower(),
        &[
            ("skills/a.md", "skill"),
            ("notes/n.md", "note"),
            ("free/f", "free"),
        ],
    );
    let m = mount_policy(&ws, "readonly skills/**\nprotect notes/**\n");
    let p = |r: &str| m.p(r);
    let before = outside(&ws);
    let mut v = Verdicts::default();
    v.refused(
        "link skills/a.md -> free/a.md",
        fs::hard_link(p("skills/a.md"), p("free/a.md")),
        libc::EROFS,
    );
    v.refused(
        "link free/f -> skills/f",
        fs::hard_link(p("free/f"), p("skills/f")),
        libc::EROFS,
    );
    v.refused(
        "link notes/n.md (shared, protected) -> free/n.md",
        fs::hard_link(p("notes/n.md"), p("free/n.md")),
        libc::EPERM,
    );
    v.refused(
        "link free/f (shared) -> notes/f",
        fs::hard_link(p("free/f"), p("notes/f")),
        libc::EPERM,
    );
    v.assert_clean("links across classes");
    assert_same("links across classes", &before, &outside(&ws));
    // Same class: fine; and the user's own files may be linked into a
    // protected place (nothing shared is at stake).
    fs::hard_link(p("free/f"), p("free/g")).expect("link within a class");
    fs::write(p("own"), "own").unwrap();
    fs::hard_link(p("own"), p("notes/own")).expect("link an own file into notes");
    assert!(m.unmount(), "daemon exited with failure");
}

/// Found by the policy model: the upper copy of a protected shared file,
/// linked to a second protected name where no lower entry is, could then
/// be renamed or moved out of the class through that name, and a link
/// through an unprotected name was refused or not depending on which
/// name the daemon had seen last. The copy's origin makes protection a
/// property of the object: every name keeps the class.
#[test]
fn a_copy_of_a_protected_shared_file_keeps_its_class_under_every_name() {
    let ws = Workspace::new();
    populate(
        ws.lower(),
        &[
            ("a/keep", "shared\n"),
            ("b/keep", "shared b\n"),
            ("cfg/", ""),
            ("sec/", ""),
        ],
    );
    let m = mount_policy(&ws, "protect keep\nprotect **/keep/**\n");
    let p = |r: &str| m.p(r);
    let mut v = Verdicts::default();
    v.works("link a/keep -> keep", fs::hard_link(p("a/keep"), p("keep")));
    v.refused(
        "rename keep -> f",
        fs::rename(p("keep"), p("f")),
        libc::EPERM,
    );
    v.refused(
        "link keep -> g",
        fs::hard_link(p("keep"), p("g")),
        libc::EPERM,
    );
    v.works("mkdir sec/keep", fs::create_dir(p("sec/keep")));
    v.works(
        "link b/keep -> sec/keep/x",
        fs::hard_link(p("b/keep"), p("sec/keep/x")),
    );
    v.refused(
        "rename sec/keep -> cfg/c (x would leave the class)",
        fs::rename(p("sec/keep"), p("cfg/c")),
        libc::EPERM,
    );
    // The user's own files are not protected: linked in and out freely.
    v.works("create own", fs::write(p("own"), "own"));
    v.works(
        "link own -> sec/keep/own",
        fs::hard_link(p("own"), p("sec/keep/own")),
    );
    v.works(
        "link sec/keep/own -> own2",
        fs::hard_link(p("sec/keep/own"), p("own2")),
    );
    v.assert_clean("names of a copy of a protected shared file");
    assert_eq!(fs::read_to_string(p("a/keep")).unwrap(), "shared\n");
    assert!(m.unmount(), "daemon exited with failure");
}

/// Hard links in the lower (pnpm stores, `cp -al`, git's local clones): a
/// write through a name is judged by that name, whatever name was looked up
/// last, and the readonly name keeps the shared content.
#[test]
fn lower_hard_links_are_judged_by_the_name_written_through() {
    for readonly_first in [true, false] {
        let ws = Workspace::new();
        populate(
            ws.lower(),
            &[
                ("skills/a.md", "shared\n"),
                ("store/pkg/index.js", "module\n"),
                ("proj/", ""),
            ],
        );
        fs::create_dir_all(ws.lower().join("free")).unwrap();
        fs::hard_link(ws.lower().join("skills/a.md"), ws.lower().join("free/a.md")).unwrap();
        // `cp -al store/pkg proj/node_modules/pkg`, with the store readonly.
        let (ok, out) = run(
            ws.lower(),
            "mkdir -p proj/node_modules && cp -al store/pkg proj/node_modules/pkg",
        );
        assert!(ok, "cp -al: {out}");
        let m = mount_policy(&ws, "readonly skills/**\nreadonly store/**\n");
        let p = |r: &str| m.p(r);
        let before = outside(&ws);
        let order = if readonly_first {
            ["skills/a.md", "free/a.md"]
        } else {
            ["free/a.md", "skills/a.md"]
        };
        for name in order {
            fs::symlink_metadata(p(name)).unwrap();
        }
        let mut v = Verdicts::default();
        let rofs = libc::EROFS;
        let ro = "skills/a.md";
        v.refused("append skills/a.md", open_append(&p(ro)), rofs);
        v.refused("open(O_TRUNC) skills/a.md", open_trunc(&p(ro)), rofs);
        v.refused("truncate skills/a.md", truncate(&p(ro), 0), rofs);
        v.refused("chmod skills/a.md", chmod(&p(ro), 0o600), rofs);
        v.refused(
            "setxattr skills/a.md",
            xattr::set(p(ro), "user.x", b"1"),
            rofs,
        );
        v.refused(
            "rename skills/a.md -> free/b.md",
            fs::rename(p(ro), p("free/b.md")),
            rofs,
        );
        v.refused(
            "append store/pkg/index.js",
            open_append(&p("store/pkg/index.js")),
            rofs,
        );
        let (ok, out) = run(
            m.path(),
            "stat free/a.md >/dev/null && echo x >> skills/a.md",
        );
        v.check(
            &format!("`stat free/a.md; echo x >> skills/a.md`: {out}"),
            !ok,
        );
        v.assert_clean(&format!(
            "readonly name of a lower hard link (readonly first: {readonly_first})"
        ));
        assert_same("readonly hard link", &before, &outside(&ws));

        // The free names are writable, and writing them leaves the readonly
        // names' (shared) content as it was.
        let mut f = open_append(&p("free/a.md")).expect("append free/a.md");
        f.write_all(b"mine\n").unwrap();
        drop(f);
        fs::write(p("proj/node_modules/pkg/index.js"), "patched\n").expect("write the linked copy");
        chmod(&p("free/a.md"), 0o600).expect("chmod free/a.md");
        xattr::set(p("free/a.md"), "user.x", b"1").expect("setxattr free/a.md");
        assert_eq!(
            fs::read_to_string(p("free/a.md")).unwrap(),
            "shared\nmine\n"
        );
        assert_eq!(fs::read_to_string(p(ro)).unwrap(), "shared\n");
        assert_eq!(
            fs::read_to_string(p("store/pkg/index.js")).unwrap(),
            "module\n"
        );
        assert_eq!(
            fs::read_to_string(p("proj/node_modules/pkg/index.js")).unwrap(),
            "patched\n"
        );
        assert_eq!(mode_of(&p(ro)), 0o644);
        // Each name is an object of its own: its own st_ino, one link.
        let (a, b) = (
            fs::symlink_metadata(p(ro)).unwrap(),
            fs::symlink_metadata(p("free/a.md")).unwrap(),
        );
        assert_ne!(a.ino(), b.ino(), "two names, two objects");
        assert_eq!((a.nlink(), b.nlink()), (1, 1));
        // Still judged by the name after all that, in both orders.
        for name in ["free/a.md", ro] {
            fs::symlink_metadata(p(name)).unwrap();
        }
        assert_eq!(errno(&open_append(&p(ro)).unwrap_err()), rofs);
        fs::rename(p("free/a.md"), p("free/moved.md")).expect("rename the free name");
        assert_eq!(fs::read_to_string(p(ro)).unwrap(), "shared\n");
        assert_eq!(
            fs::read_to_string(ws.lower().join("skills/a.md")).unwrap(),
            "shared\n"
        );
        assert!(m.unmount(), "daemon exited with failure");
    }
}

// ---------------------------------------------------------------------------
// CLI: explain, check, malformed policies at mount
// ---------------------------------------------------------------------------

#[test]
fn every_denial_is_logged_with_operation_path_rule_and_caller_pid() {
    let ws = Workspace::new();
    populate(
        ws.lower(),
        &[("ro/a", "a"), ("keep/k", "k"), ("secret", "s")],
    );
    let p = policy_file(&ws, "hide secret\nreadonly ro/**\nprotect keep/**\n");
    let m = ws.mount_env(
        &["--policy", p.to_str().unwrap()],
        &[("RUST_LOG", "warn,layerfs=info")],
    );
    let at = |rel: &str| m.path().join(rel);
    let mut v = Verdicts::default();
    v.refused(
        "create hidden secret",
        fs::write(at("secret"), "x"),
        libc::EACCES,
    );
    v.refused("write ro/a", fs::write(at("ro/a"), "x"), libc::EROFS);
    v.refused("unlink keep/k", fs::remove_file(at("keep/k")), libc::EPERM);
    v.refused(
        "symlink to /etc/shadow",
        std::os::unix::fs::symlink("/etc/shadow", at("l")),
        libc::EPERM,
    );
    v.assert_clean("denials");
    // FUSE reports the calling thread: this test thread's id.
    // SAFETY: gettid has no preconditions.
    let pid = format!("pid={}", unsafe { libc::gettid() });
    let wanted = [
        ("Create", "secret", "hide secret"),
        ("Write", "ro/a", "readonly ro/**"),
        ("Unlink", "keep/k", "protect keep/**"),
        ("Symlink", "l", "symlinks contained"),
    ];
    let mut log = String::new();
    let all_there = eventually(Duration::from_secs(3), || {
        log = ws.daemon_log();
        wanted.iter().all(|(op, path, rule)| {
            log.lines().any(|l| {
                l.contains("INFO")
                    && l.contains("policy denied")
                    && l.contains(&format!("op={op}"))
                    && l.contains(&format!("path=\"{path}\""))
                    && l.contains(rule)
                    && l.contains(&pid)
            })
        })
    });
    assert!(all_there, "denials missing from the daemon log:\n{log}");
    assert!(m.unmount(), "daemon exited with failure");
}

#[test]
fn policy_explain_names_the_deciding_rule() {
    let ws = Workspace::new();
    let pf = policy_file(
        &ws,
        "# workspace policy\nhide       **/.env\nreadonly   skills/**\nprotect    notes/**\n\
         readonly   docs/**\nhide       docs/secret/**\n",
    );
    let f = pf.to_str().unwrap();
    let cases = [
        ("skills/a.txt", "readonly", "skills/**", "line 3"),
        ("app/.env", "hide", "**/.env", "line 2"),
        (".env", "hide", "**/.env", "line 2"),
        ("notes/x.md", "protect", "notes/**", "line 4"),
        ("docs/secret/k", "hide", "docs/secret/**", "line 6"),
    ];
    let mut v = Verdicts::default();
    for (path, kind, pattern, line) in cases {
        let (_, out) = layerfs(&["policy", "explain", f, path]);
        v.check(
            &format!("explain {path} should name `{kind} {pattern}` ({line}): {out}"),
            out.contains(kind) && (out.contains(pattern) || out.contains(line)),
        );
    }
    let (_, out) = layerfs(&["policy", "explain", f, "src/main.rs"]);
    v.check(
        &format!("explain src/main.rs says nothing: {out:?}"),
        !out.trim().is_empty(),
    );
    v.assert_clean("policy explain");
}

/// `policy explain` names the `scratch` lines matching a path (or an
/// ancestor) and what being scratch means; the same line leaves the path
/// out of `diff` on a real mount.
#[test]
fn policy_explain_names_matching_scratch_lines() {
    let ws = Workspace::new();
    populate(ws.lower(), &[("src/main.rs", "fn main() {}\n")]);
    let pf = policy_file(&ws, "readonly skills/**\nscratch build/**\nscratch *.o\n");
    let f = pf.to_str().unwrap();
    let (_, out) = layerfs(&["policy", "explain", f, "build/obj/x.o"]);
    assert!(
        out.contains(
            "scratch:   yes, by line 2: `scratch build/**` (matches the ancestor `build/obj`), \
             and line 3: `scratch *.o` (matches the path)"
        ),
        "{out}"
    );
    assert!(
        out.contains("left out of diff and snapshots, emptied by `layerfs gc`"),
        "{out}"
    );
    let (_, out) = layerfs(&["policy", "explain", f, "src/main.rs"]);
    assert!(out.contains("scratch:   no"), "{out}");
    // What explain says is what the mount does.
    let m = ws.mount_with(&["--policy", f]);
    fs::create_dir_all(m.p("build/obj")).unwrap();
    fs::write(m.p("build/obj/x.o"), "obj").unwrap();
    fs::write(m.p("src/main.rs"), "fn main() { }\n").unwrap();
    let (_, out) = layerfs(&["diff", m.path().to_str().unwrap()]);
    assert!(!out.contains("x.o"), "{out}");
    assert!(out.contains("M src/main.rs"), "{out}");
    assert!(m.unmount(), "daemon exited with failure");
}

#[test]
fn policy_check_reports_the_bad_line() {
    let ws = Workspace::new();
    let good = policy_file(
        &ws,
        "# all rules\nhide **/.env\nreadonly skills/**\nprotect notes/**\nsymlinks contained\n\
         allow-host /srv\ndevices deny\nsuid strip\nquota bytes=10G inodes=1M\n",
    );
    let (ok, out) = layerfs(&["policy", "check", good.to_str().unwrap()]);
    assert!(ok, "policy check of a valid file failed: {out}");

    let bad_files = [
        ("hide **/.env\n# comment\nfrobnicate x\n", 3),
        ("symlinks sometimes\n", 1),
        ("\n\ndevices maybe\n", 3),
        ("suid keep\n", 1),
        ("hide **/.env\nquota bytes=lots\n", 2),
        ("quota inodes=-5\n", 1),
        ("readonly\n", 1),
        ("hide a\nhide b\nreadonly c\nprotect\n", 4),
    ];
    let mut v = Verdicts::default();
    for (i, (text, line)) in bad_files.iter().enumerate() {
        let p = ws.dir.path().join(format!("bad-{i}"));
        fs::write(&p, text).unwrap();
        let (ok, out) = layerfs(&["policy", "check", p.to_str().unwrap()]);
        v.check(&format!("policy check accepted {text:?}"), !ok);
        v.check(
            &format!("policy check of {text:?} should say `line {line}`: {out}"),
            out.contains(&format!("line {line}")),
        );
    }
    v.assert_clean("policy check");
}

#[test]
fn mount_with_a_malformed_policy_fails_and_mounts_nothing() {
    let ws = Workspace::new();
    populate(ws.lower(), &[("a", "a")]);
    let pf = policy_file(&ws, "hide **/.env\nthis is not a rule\n");
    let r = ws.try_mount_with(&["--policy", pf.to_str().unwrap()]);
    match r {
        Ok(m) => {
            drop(m);
            panic!("mount with a malformed policy succeeded");
        }
        Err(e) => assert!(e.contains("line 2"), "error should name line 2: {e}"),
    }
    assert!(
        !is_mounted(&ws.mnt),
        "something is mounted after a refused mount"
    );
    assert!(
        listing(&ws.upper).is_empty(),
        "upper changed by a refused mount"
    );

    let missing = ws.dir.path().join("no-such-policy");
    let r = ws.try_mount_with(&["--policy", missing.to_str().unwrap()]);
    assert!(r.is_err(), "mount with a missing policy file succeeded");
    drop(r);
    assert!(!is_mounted(&ws.mnt));
}

/// `hide secrets/**` leaves `secrets/` listing empty: `rmdir` removes it
/// (and `rm -r` of a parent works) without showing or touching the shared
/// files; `layerfs reset` brings the directory back, still hiding them. A
/// hidden entry only the upper holds keeps its directory (ENOTEMPTY): it
/// is data no other place has.
#[test]
fn a_directory_whose_entries_are_all_hidden_can_be_removed() {
    let ws = Workspace::new();
    populate(
        ws.lower(),
        &[
            ("secrets/key", "SECRET-KEY"),
            ("secrets/sub/deep", "SECRET-DEEP"),
            ("proj/secrets/k2", "SECRET-K2"),
            ("proj/readme", "hello"),
            ("mixed/visible", "v"),
            ("mixed/.env", "SECRET-ENV"),
            ("mine/", ""),
        ],
    );
    // A hidden file the upper alone holds (written beside the mount).
    fs::create_dir_all(ws.upper.join("mine")).unwrap();
    fs::write(ws.upper.join("mine/.env"), "UPPER-ONLY").unwrap();
    let m = mount_policy(&ws, "hide secrets/**\nhide **/secrets/**\nhide **/.env\n");
    let p = |r: &str| m.p(r);
    assert_eq!(fs::read_dir(p("secrets")).unwrap().count(), 0);
    fs::remove_dir(p("secrets")).expect("rmdir of a directory that lists empty");
    assert!(fs::symlink_metadata(p("secrets")).is_err());
    // `rm -r` of a parent holding such a directory.
    let (ok, out) = run(m.path(), "rm -r proj && ! test -e proj");
    assert!(ok, "rm -r proj: {out}");
    // A directory with a visible entry is not empty, as always.
    let e = fs::remove_dir(p("mixed")).unwrap_err();
    assert_eq!(errno(&e), libc::ENOTEMPTY, "{e}");
    fs::remove_file(p("mixed/visible")).unwrap();
    fs::remove_dir(p("mixed")).expect("rmdir with only a hidden shared file left");
    // The upper's own hidden file keeps its directory.
    let e = fs::remove_dir(p("mine")).unwrap_err();
    assert_eq!(errno(&e), libc::ENOTEMPTY, "{e}");
    assert_eq!(
        fs::read_to_string(ws.upper.join("mine/.env")).unwrap(),
        "UPPER-ONLY"
    );
    // The shared files are untouched, and a new `secrets/` shows none.
    assert_eq!(
        fs::read_to_string(ws.lower().join("secrets/key")).unwrap(),
        "SECRET-KEY"
    );
    fs::create_dir(p("secrets")).unwrap();
    assert_eq!(fs::read_dir(p("secrets")).unwrap().count(), 0);
    fs::remove_dir(p("secrets")).unwrap();
    // Reset brings the shared directory back, its entries still hidden.
    let out = crate::harness::layerfs(&["reset", m.path().to_str().unwrap(), "secrets"]);
    assert!(out.status.success(), "{out:?}");
    assert!(p("secrets").is_dir());
    assert!(fs::symlink_metadata(p("secrets/key")).is_err());
    assert_eq!(fs::read_dir(p("secrets")).unwrap().count(), 0);
    assert!(m.unmount(), "daemon exited with failure");

    // A hidden entry a protect rule also guards keeps its directory, and
    // so does a hidden directory while any readonly or protect rule exists.
    let m = mount_policy(
        &ws,
        "hide vault/**
protect vault/keep
hide box/**
readonly skills/**
",
    );
    populate(ws.lower(), &[("vault/keep", "K"), ("box/inner/f", "F")]);
    // (`protect vault/keep` refuses removing `vault` as a whole: EPERM.)
    for (d, want) in [("vault", libc::EPERM), ("box", libc::ENOTEMPTY)] {
        let e = fs::remove_dir(m.p(d)).unwrap_err();
        assert_eq!(errno(&e), want, "{d}: {e}");
    }
    assert!(m.unmount(), "daemon exited with failure");
}
