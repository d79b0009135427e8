//! Real tools through a real mount: git (fresh repo and a repo from the
//! lower), tar in both directions, cp -a, rm -rf of a large lower tree,
//! sed -i, mv of a large lower dir, concurrent SQLite WAL writers, make
//! incremental builds, executing scripts, and python venvs.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use crate::basic::fsutil::*;
use crate::harness::{errno, sh, Workspace};

/// Git with no user or system configuration and a fixed identity.
const GIT_ENV: &str = "export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 \
    GIT_AUTHOR_NAME=tester GIT_AUTHOR_EMAIL=t@example.com \
    GIT_COMMITTER_NAME=tester GIT_COMMITTER_EMAIL=t@example.com; set -e; ";

fn git(dir: &Path, script: &str) -> String {
    sh(dir, &format!("{GIT_ENV}{script}"))
}

/// One line per entry: name, type, mode, owner, size (files), mtime
/// (not for symlinks), link target; for comparing trees copied by tools.
fn stat_listing(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut |rel, md| {
        let kind = type_letter(&md.file_type());
        let size = if kind == 'f' {
            md.len().to_string()
        } else {
            "-".into()
        };
        let mtime = if kind == 'l' {
            "-".to_string()
        } else {
            format!("{}.{:09}", md.mtime(), md.mtime_nsec())
        };
        let target = if kind == 'l' {
            fs::read_link(root.join(rel)).unwrap().display().to_string()
        } else {
            String::new()
        };
        out.insert(
            rel.to_string(),
            format!(
                "{kind} {:o} {}:{} {size} {mtime} {target}",
                md.mode() & 0o7777,
                md.uid(),
                md.gid()
            ),
        );
    });
    out
}

/// A source tree with varied modes, owners, times, symlinks and xattrs.
fn sample_tree(root: &Path) {
    write(&root.join("README.md"), b"# sample\n");
    write(&root.join("bin/run.sh"), b"#!/bin/sh\necho run\n");
    write(&root.join("src/lib/deep/file.txt"), &vec![b'z'; 100_000]);
    write(&root.join("secret.key"), b"k");
    fs::create_dir_all(root.join("empty_dir")).unwrap();
    std::os::unix::fs::symlink("src/lib/deep/file.txt", root.join("link_rel")).unwrap();
    std::os::unix::fs::symlink("/usr/bin/env", root.join("link_abs")).unwrap();
    fs::set_permissions(root.join("bin/run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(root.join("secret.key"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(root.join("src/lib"), fs::Permissions::from_mode(0o751)).unwrap();
    std::os::unix::fs::chown(root.join("README.md"), Some(1000), Some(1000)).unwrap();
    xattr::set(root.join("README.md"), "user.origin", b"sample").unwrap();
    sh(
        root,
        "touch -h -d '2015-06-01 12:00:00.123456789' link_rel && \
         touch -d '2016-01-01 00:00:01.5' README.md secret.key bin/run.sh src/lib/deep/file.txt && \
         touch -d '2017-02-02' src/lib/deep src/lib src bin empty_dir",
    );
}

// ---------------------------------------------------------------- git

#[test]
fn git_init_add_and_commit_work_in_a_fresh_repo() {
    let ws = Workspace::new();
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    git(
        &m.path,
        "git init -q -b main repo && cd repo && echo hello > a.txt && mkdir -p src && \
         printf 'fn main(){}\\n' > src/main.rs && git add -A && git commit -qm first",
    );
    let repo = m.p("repo");
    assert_eq!(
        git(&repo, "git status --porcelain"),
        "",
        "clean after commit"
    );
    assert_eq!(git(&repo, "git log --oneline | wc -l").trim(), "1");
    git(
        &repo,
        "echo more >> a.txt && git commit -qam second && git fsck --strict --no-progress",
    );
    assert_eq!(git(&repo, "git log --oneline | wc -l").trim(), "2");
    assert_eq!(git(&repo, "git show HEAD:a.txt"), "hello\nmore\n");
    git(&repo, "git checkout -q -b side && git rm -q a.txt && git commit -qm third && git checkout -q main");
    assert_eq!(
        fs::read_to_string(m.p("repo/a.txt")).unwrap(),
        "hello\nmore\n"
    );
    assert_eq!(git(&repo, "git status --porcelain"), "");
    drop(m);
    assert!(ws.upper.join("repo/.git/HEAD").is_file());
    assert_unchanged(&before);
}

#[test]
fn git_commits_on_top_of_a_repo_that_lives_in_the_lower() {
    let ws = Workspace::new();
    let lrepo = ws.lower().join("repo");
    fs::create_dir(&lrepo).unwrap();
    git(
        &lrepo,
        "git init -q -b main && for i in $(seq 1 30); do echo line $i > f$i.txt; done && \
         mkdir -p sub && echo s > sub/s.txt && git add -A && git commit -qm base",
    );
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let repo = m.p("repo");
    assert_eq!(git(&repo, "git status --porcelain"), "", "clean before");
    git(&repo, "echo changed >> f7.txt && rm f9.txt && echo n > sub/new.txt && git add -A && git commit -qm change");
    assert_eq!(
        git(&repo, "git status --porcelain"),
        "",
        "clean after commit"
    );
    assert_eq!(git(&repo, "git log --oneline | wc -l").trim(), "2");
    assert_eq!(
        git(&repo, "git diff --name-status HEAD~1 HEAD"),
        "M\tf7.txt\nD\tf9.txt\nA\tsub/new.txt\n"
    );
    // Repacking rewrites and deletes files that came from the lower.
    git(&repo, "git gc -q && git fsck --strict --no-progress");
    assert_eq!(git(&repo, "git log --oneline | wc -l").trim(), "2");
    assert_eq!(git(&repo, "git status --porcelain"), "");
    drop(m);
    assert_unchanged(&before);
    assert_eq!(
        git(&lrepo, "git log --oneline | wc -l").trim(),
        "1",
        "lower repo untouched"
    );
}

// ---------------------------------------------------------------- tar

#[test]
fn tar_of_a_lower_tree_through_the_mount_equals_tar_of_the_lower() {
    let ws = Workspace::new();
    sample_tree(&ws.lower().join("tree"));
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let tv = |root: &Path| {
        sh(
            root,
            "tar --sort=name --numeric-owner --xattrs -cf - tree | tar --full-time --numeric-owner -tvf -",
        )
    };
    let from_mount = tv(&m.path);
    let from_lower = tv(ws.lower());
    assert!(from_lower.contains("tree/src/lib/deep/file.txt"));
    assert_eq!(from_mount, from_lower, "tar listings differ");
    // Extracted content is identical as well.
    let out = ws.dir.path().join("x");
    fs::create_dir(&out).unwrap();
    sh(
        &m.path,
        &format!("tar -cf - tree | tar -xpf - -C {}", out.display()),
    );
    sh(
        ws.dir.path(),
        &format!(
            "diff -r --no-dereference {} x/tree",
            ws.lower().join("tree").display()
        ),
    );
    drop(m);
    assert!(walk_names(&ws.upper).is_empty(), "tar c copies nothing up");
    assert_unchanged(&before);
}

#[test]
fn tar_extract_into_the_mount_reproduces_the_original() {
    let ws = Workspace::new();
    write(&ws.lower().join("over/a"), b"lower a");
    write(&ws.lower().join("over/keep"), b"lower keep");
    let src = ws.dir.path().join("src");
    sample_tree(&src);
    write(&ws.dir.path().join("over/a"), b"archive a");
    write(&ws.dir.path().join("over/new"), b"archive new");
    sh(
        ws.dir.path(),
        "tar --xattrs -cf src.tar src && tar -cf over.tar over",
    );
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    sh(
        &m.path,
        &format!("tar --xattrs -xpf {}/src.tar", ws.dir.path().display()),
    );
    sh(
        &m.path,
        &format!("tar -xpf {}/over.tar", ws.dir.path().display()),
    );
    sh(
        ws.dir.path(),
        &format!("diff -r --no-dereference src {}", m.p("src").display()),
    );
    assert_eq!(
        stat_listing(&m.p("src")),
        stat_listing(&src),
        "modes/owners/times"
    );
    assert_eq!(
        xattr::get(m.p("src/README.md"), "user.origin")
            .unwrap()
            .as_deref(),
        Some(&b"sample"[..])
    );
    assert_eq!(fs::read(m.p("over/a")).unwrap(), b"archive a");
    assert_eq!(fs::read(m.p("over/keep")).unwrap(), b"lower keep");
    assert_eq!(fs::read(m.p("over/new")).unwrap(), b"archive new");
    drop(m);
    assert_eq!(
        stat_listing(&ws.upper.join("src")),
        stat_listing(&src),
        "upper copy"
    );
    assert_unchanged(&before);
}

// ---------------------------------------------------------------- cp, rm, sed, mv

#[test]
fn cp_a_into_the_mount_preserves_modes_times_owners_and_symlinks() {
    let ws = Workspace::new();
    fs::create_dir(ws.lower().join("dest_parent")).unwrap();
    let src = ws.dir.path().join("src");
    sample_tree(&src);
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    sh(
        &m.path,
        &format!("cp -a {} dest_parent/copy", src.display()),
    );
    sh(
        ws.dir.path(),
        &format!(
            "diff -r --no-dereference src {}",
            m.p("dest_parent/copy").display()
        ),
    );
    assert_eq!(stat_listing(&m.p("dest_parent/copy")), stat_listing(&src));
    assert_eq!(
        fs::read_link(m.p("dest_parent/copy/link_abs")).unwrap(),
        Path::new("/usr/bin/env")
    );
    assert_eq!(
        xattr::get(m.p("dest_parent/copy/README.md"), "user.origin")
            .unwrap()
            .as_deref(),
        Some(&b"sample"[..])
    );
    // Copying out again round-trips.
    let back = ws.dir.path().join("back");
    sh(
        &m.path,
        &format!("cp -a dest_parent/copy {}", back.display()),
    );
    assert_eq!(stat_listing(&back), stat_listing(&src));
    drop(m);
    assert_eq!(
        stat_listing(&ws.upper.join("dest_parent/copy")),
        stat_listing(&src)
    );
    assert_unchanged(&before);
}

#[test]
fn rm_rf_of_a_lower_tree_with_2000_files_then_recreating_it_starts_empty() {
    let ws = Workspace::new();
    for d in 0..20 {
        let dir = ws.lower().join(format!("big/d{d}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..100 {
            fs::File::create(dir.join(format!("f{f}"))).unwrap();
        }
    }
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    assert_eq!(sh(&m.path, "find big -type f | wc -l").trim(), "2000");
    sh(&m.path, "rm -rf big");
    assert_eq!(
        errno(&fs::symlink_metadata(m.p("big")).unwrap_err()),
        libc::ENOENT
    );
    assert!(list_names(&m.path).is_empty());
    assert_whiteout(&ws.upper.join("big"));
    sh(&m.path, "mkdir -p big/d0 && echo again > big/d0/f0");
    assert_eq!(list_names(&m.p("big")), set(&["d0"]));
    assert_eq!(list_names(&m.p("big/d0")), set(&["f0"]));
    assert_eq!(sh(&m.path, "find big | wc -l").trim(), "3");
    drop(m);
    assert_eq!(
        get_trusted(&ws.upper.join("big"), "trusted.overlay.opaque").as_deref(),
        Some("y")
    );
    assert_eq!(walk_names(&ws.upper), vec!["big", "big/d0", "big/d0/f0"]);
    assert_unchanged(&before);
}

#[test]
fn sed_in_place_edits_lower_files_and_leaves_no_temp_files() {
    let ws = Workspace::new();
    for n in ["a.conf", "b.conf"] {
        write(&ws.lower().join(format!("conf/{n}")), b"foo=1\nbar=foo\n");
        fs::set_permissions(
            ws.lower().join(format!("conf/{n}")),
            fs::Permissions::from_mode(0o640),
        )
        .unwrap();
    }
    write(&ws.lower().join("conf/untouched"), b"foo\n");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    sh(&m.path, "sed -i 's/foo/baz/g' conf/a.conf conf/b.conf");
    for n in ["a.conf", "b.conf"] {
        assert_eq!(
            fs::read_to_string(m.p(&format!("conf/{n}"))).unwrap(),
            "baz=1\nbar=baz\n"
        );
        assert_eq!(
            fs::metadata(m.p(&format!("conf/{n}"))).unwrap().mode() & 0o7777,
            0o640
        );
    }
    assert_eq!(
        list_names(&m.p("conf")),
        set(&["a.conf", "b.conf", "untouched"])
    );
    drop(m);
    assert_eq!(
        walk_names(&ws.upper),
        vec!["conf", "conf/a.conf", "conf/b.conf"]
    );
    assert_eq!(
        fs::read_to_string(ws.upper.join("conf/a.conf")).unwrap(),
        "baz=1\nbar=baz\n"
    );
    assert_unchanged(&before);
}

#[test]
fn mv_of_a_lower_dir_with_500_files_is_a_rename_not_a_copy() {
    let ws = Workspace::new();
    for i in 0..500 {
        write(
            &ws.lower().join(format!("many/f{i}")),
            format!("content {i}").as_bytes(),
        );
    }
    write(&ws.lower().join("many/sub/deep"), b"deep");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    sh(&m.path, "mv many moved");
    assert_eq!(sh(&m.path, "ls moved | wc -l").trim(), "501");
    assert_eq!(fs::read(m.p("moved/f123")).unwrap(), b"content 123");
    assert_eq!(fs::read(m.p("moved/sub/deep")).unwrap(), b"deep");
    assert_eq!(
        errno(&fs::symlink_metadata(m.p("many")).unwrap_err()),
        libc::ENOENT
    );
    drop(m);
    assert_eq!(
        count_regular_files(&ws.upper),
        0,
        "mv copied files into the upper: {:?}",
        walk_names(&ws.upper).len()
    );
    assert_unchanged(&before);
}

// ---------------------------------------------------------------- sqlite, make

#[test]
fn sqlite_in_wal_mode_with_two_concurrent_writers_keeps_every_row() {
    let ws = Workspace::new();
    let writer = ws.dir.path().join("writer.py");
    fs::write(
        &writer,
        "import sqlite3, sys\n\
         db, who = sys.argv[1], sys.argv[2]\n\
         c = sqlite3.connect(db, timeout=120, isolation_level=None)\n\
         c.execute('PRAGMA busy_timeout=120000')\n\
         for i in range(200):\n\
         \x20   c.execute('BEGIN IMMEDIATE')\n\
         \x20   c.execute('INSERT INTO t(who, i) VALUES (?, ?)', (who, i))\n\
         \x20   c.execute('COMMIT')\n\
         c.close()\n",
    )
    .unwrap();
    let m = ws.mount();
    let mode = sh(
        &m.path,
        "python3 -c \"import sqlite3; c = sqlite3.connect('db.sqlite'); \
         print(c.execute('PRAGMA journal_mode=WAL').fetchone()[0]); \
         c.execute('CREATE TABLE t(who TEXT, i INTEGER)'); c.commit()\"",
    );
    assert_eq!(mode.trim(), "wal");
    let w = writer.display();
    sh(
        &m.path,
        &format!("python3 {w} db.sqlite one & p1=$!; python3 {w} db.sqlite two & p2=$!; wait $p1 && wait $p2"),
    );
    let q = |sql: &str| {
        sh(
            &m.path,
            &format!("python3 -c \"import sqlite3; print(sqlite3.connect('db.sqlite').execute('{sql}').fetchall())\""),
        )
        .trim()
        .to_string()
    };
    assert_eq!(q("SELECT count(*) FROM t"), "[(400,)]");
    assert_eq!(
        q("SELECT who, count(*) FROM t GROUP BY who ORDER BY who"),
        "[('one', 200), ('two', 200)]"
    );
    assert_eq!(q("PRAGMA integrity_check"), "[('ok',)]");
}

#[test]
fn make_builds_a_project_from_the_lower_and_rebuilds_only_what_changed() {
    let ws = Workspace::new();
    let p = ws.lower().join("proj");
    write(
        &p.join("Makefile"),
        b"prog: main.o util.o\n\tcc -o prog main.o util.o\n\
          %.o: %.c util.h\n\tcc -c $< -o $@\n",
    );
    write(&p.join("util.h"), b"int util(void);\n");
    write(
        &p.join("util.c"),
        b"#include \"util.h\"\nint util(void) { return 41; }\n",
    );
    write(
        &p.join("main.c"),
        b"#include <stdio.h>\n#include \"util.h\"\nint main(void) { printf(\"%d\\n\", util() + 1); return 0; }\n",
    );
    sh(&p, "touch -d '2020-01-01' Makefile util.h util.c main.c");
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    let proj = m.p("proj");
    let first = sh(&proj, "make");
    assert!(
        first.contains("-c main.c") && first.contains("-c util.c"),
        "{first}"
    );
    assert_eq!(sh(&proj, "./prog").trim(), "42");
    let second = sh(&proj, "make");
    assert!(
        second.contains("up to date") || !second.contains("cc "),
        "nothing rebuilt: {second}"
    );
    // Make compares mtimes: let the clock move past the outputs' timestamps.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    sh(&proj, "sed -i 's/41/99/' util.c");
    let third = sh(&proj, "make");
    assert!(third.contains("-c util.c"), "util.c rebuilt: {third}");
    assert!(!third.contains("-c main.c"), "main.c not rebuilt: {third}");
    assert_eq!(sh(&proj, "./prog").trim(), "100");
    assert_eq!(
        sh(&proj, "make -q; echo $?").trim(),
        "0",
        "up to date at the end"
    );
    drop(m);
    assert!(ws.upper.join("proj/prog").is_file());
    assert_unchanged(&before);
}

// ---------------------------------------------------------------- exec, venv

#[test]
fn a_script_written_in_the_mount_executes() {
    let ws = Workspace::new();
    write(
        &ws.lower().join("lower.sh"),
        b"#!/bin/sh\necho lower script $1\n",
    );
    fs::set_permissions(
        ws.lower().join("lower.sh"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let before = snapshot_lowers(&ws);
    let m = ws.mount();
    write(
        &m.p("bin/hello.sh"),
        b"#!/bin/sh\necho \"hello $1 from $(basename $0)\"\n",
    );
    fs::set_permissions(m.p("bin/hello.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(m.p("bin/hello.sh"))
        .arg("world")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello world from hello.sh\n"
    );
    assert_eq!(sh(&m.path, "./lower.sh x"), "lower script x\n");
    // Rewrite the script and run it again at once.
    write(&m.p("bin/hello.sh"), b"#!/bin/sh\necho changed\n");
    assert_eq!(sh(&m.path, "bin/hello.sh"), "changed\n");
    drop(m);
    assert!(
        walk_names(&ws.upper).iter().all(|n| n != "lower.sh"),
        "exec does not copy up"
    );
    assert_unchanged(&before);
}

#[test]
fn python_venv_can_be_created_and_used_inside_the_mount() {
    // The system python: its venv symlinks point into /usr, which the default
    // policy allows (a pyenv python under /root would be refused).
    let py = "/usr/bin/python3";
    let has_venv = Command::new(py)
        .args(["-c", "import ensurepip, venv"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !has_venv {
        eprintln!("note: {py} has no ensurepip/venv, skipping the venv test");
        return;
    }
    let ws = Workspace::new();
    let m = ws.mount();
    sh(&m.path, &format!("{py} -m venv venv"));
    let out = sh(
        &m.path,
        "venv/bin/python -c 'import sys; print(sys.prefix != sys.base_prefix, sys.prefix)'",
    );
    assert!(out.starts_with("True "), "{out}");
    assert!(out.trim().ends_with("/venv"), "{out}");
    let pip = sh(&m.path, "venv/bin/python -m pip --version");
    assert!(pip.contains("pip"), "{pip}");
    sh(&m.path, "venv/bin/python -c 'import json, sqlite3, ssl'");
}
