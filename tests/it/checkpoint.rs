//! Checkpoints, forks and undo (DESIGN.md §5, "Checkpoints, forks and
//! undo"), through real mounts: the view a checkpoint freezes is the view
//! after it and after a remount, kernel overlayfs given the same stack
//! shows the same tree, forks are isolated, undo goes back exactly.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::crash::{tree_view, view_diff};
use crate::harness::*;

/// Runs `layerfs ARGS`, which must succeed; returns its stdout.
pub(crate) fn ok(args: &[&dyn AsRef<std::ffi::OsStr>]) -> String {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    let out = layerfs(&args);
    assert!(
        out.status.success(),
        "layerfs {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `layerfs ARGS`, which must fail; returns its stderr.
pub(crate) fn refused(args: &[&dyn AsRef<std::ffi::OsStr>]) -> String {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    let out = layerfs(&args);
    assert!(!out.status.success(), "layerfs {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub(crate) fn layer(ws: &Workspace, name: &str) -> PathBuf {
    ws.dir
        .path()
        .join(".upper.layerfs-state")
        .join("layers")
        .join(name)
}

fn is_empty(dir: &Path) -> bool {
    fs::read_dir(dir).unwrap().next().is_none()
}

/// The tree kernel overlayfs shows for `layers` (topmost first) over the
/// shared lower, with the workspace's upper on top.
pub(crate) fn kernel_view(
    ws: &Workspace,
    layers: &[&str],
) -> std::collections::BTreeMap<String, String> {
    let lowerdirs: Vec<PathBuf> = layers
        .iter()
        .map(|n| layer(ws, n))
        .chain([ws.lower().to_path_buf()])
        .collect();
    let lowers: Vec<&Path> = lowerdirs.iter().map(|p| p.as_path()).collect();
    let kmnt = ws.dir.path().join("kmnt");
    let k = KernelOverlay::mount(&lowers, &ws.upper, &ws.dir.path().join("kwork"), &kmnt).unwrap();
    let view = tree_view(&kmnt);
    drop(k);
    view
}

/// Kernel overlayfs over `layers` (topmost first), the shared lower and
/// the upper of `ws` shows `view` (link counts aside).
pub(crate) fn assert_kernel_shows(
    ws: &Workspace,
    layers: &[&str],
    view: &std::collections::BTreeMap<String, String>,
    what: &str,
) {
    assert_same(
        &links_aside(view),
        &links_aside(&kernel_view(ws, layers)),
        what,
    );
}

/// After a squash of `ws` was stopped, its stack is the one it had, `old`,
/// or the new one (a single layer of a generated name), never a mix.
pub(crate) fn assert_old_or_squashed(ws: &Workspace, old: &[&str], what: &str) {
    let stack = stack_of(ws);
    assert!(
        stack == old || (stack.len() == 1 && !stack[0].starts_with('c')),
        "{what}: a mixed stack {stack:?}"
    );
}

/// The next squash of the unmounted `ws`, after one was stopped, leaves
/// one layer and the view `view`.
pub(crate) fn assert_squash_finishes(
    ws: &Workspace,
    view: &std::collections::BTreeMap<String, String>,
    what: &str,
) {
    ok(&[&"squash", &ws.upper]);
    assert_eq!(stack_of(ws).len(), 1, "{what}");
    assert_same(view, &view_of(ws), &format!("squash after, {what}"));
}

pub(crate) fn assert_same(
    a: &std::collections::BTreeMap<String, String>,
    b: &std::collections::BTreeMap<String, String>,
    what: &str,
) {
    let d = view_diff(a, b);
    assert!(d.is_empty(), "{what}: views differ: {d:#?}");
}

/// `view` with every link count left out: a hard link made in the upper
/// shows one link per name once a checkpoint moved it into a lower.
pub(crate) fn links_aside(
    view: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    view.iter()
        .map(|(k, v)| {
            let v: Vec<&str> = v.split(' ').collect();
            let kept: Vec<&str> = v
                .iter()
                .enumerate()
                .filter(|(i, w)| **w != "nlink" && (*i == 0 || v[i - 1] != "nlink"))
                .map(|(_, w)| *w)
                .collect();
            (k.clone(), kept.join(" "))
        })
        .collect()
}

/// A mounted fork, unmounted (and its daemon waited for) on drop.
pub(crate) struct Fork(pub(crate) PathBuf);

impl Drop for Fork {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let ok = Command::new(bin())
                .arg("umount")
                .arg(&self.0)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if !matches!(ok, Ok(s) if s.success()) {
                let _ = Command::new("umount").arg("-l").arg(&self.0).status();
            }
        }
    }
}

/// `layerfs fork` of checkpoint `name` of `ws` into `ws.dir/forkN`,
/// mounted at `forkN/mnt`.
pub(crate) fn fork(ws: &Workspace, name: &str, n: usize) -> Fork {
    let base = ws.dir.path().join(format!("fork{n}"));
    let mnt = base.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let guard = Fork(mnt.clone());
    ok(&[
        &"fork",
        &ws.upper,
        &name,
        &"--upper",
        &base.join("upper"),
        &mnt,
    ]);
    assert!(is_mounted(&mnt), "fork {n} is not mounted");
    guard
}

/// The shared tree the layered tests change: directories to rename,
/// make opaque and keep, files to edit and delete.
fn shared_tree(l: &Path) {
    fs::create_dir_all(l.join("d/sub")).unwrap();
    fs::create_dir_all(l.join("o")).unwrap();
    fs::create_dir_all(l.join("keep")).unwrap();
    fs::write(l.join("a"), "a\n").unwrap();
    fs::write(l.join("gone"), "gone\n").unwrap();
    fs::write(l.join("d/sub/x"), "x\n").unwrap();
    fs::write(l.join("o/y"), "y\n").unwrap();
    fs::write(l.join("keep/k"), "k\n").unwrap();
}

#[test]
fn a_checkpoint_keeps_the_view_across_remounts_and_kernel_overlay_agrees() {
    let ws = Workspace::new();
    let l = ws.lower();
    shared_tree(l);

    let m = ws.mount();
    sh(
        m.path(),
        "echo new > new && echo more >> a && rm gone && mv d d2 && rm -r o && mkdir o \
         && echo z > o/z && chmod 600 keep/k && ln -s a link",
    );
    let first = tree_view(m.path());
    assert!(m.unmount());

    assert_eq!(ok(&[&"checkpoint", &ws.upper, &"c1"]).trim(), "c1");
    assert!(
        is_empty(&ws.upper),
        "the upper is not fresh after a checkpoint"
    );
    assert!(
        layer(&ws, "c1").join("new").is_file(),
        "the upper did not become the layer"
    );

    let m = ws.mount();
    assert_same(&first, &tree_view(m.path()), "after checkpoint c1");
    // A second layer: a rename through a frozen layer's redirect, a
    // whiteout over a frozen file, an edit of a shared file reached
    // through the redirect.
    sh(
        m.path(),
        "rm new && mv d2 d3 && echo w > o/w && echo more >> d3/sub/x && echo again >> a",
    );
    let second = tree_view(m.path());
    assert_eq!(fs::read_to_string(m.p("d3/sub/x")).unwrap(), "x\nmore\n");
    assert!(m.unmount());

    assert_eq!(ok(&[&"checkpoint", &ws.upper, &"c2"]).trim(), "c2");
    let m = ws.mount();
    assert_same(&second, &tree_view(m.path()), "after checkpoint c2");
    assert!(m.unmount());
    assert_same(
        &second,
        &kernel_view(&ws, &["c2", "c1"]),
        "kernel overlayfs",
    );

    let list: serde_json::Value =
        serde_json::from_str(&ok(&[&"checkpoint", &"list", &"--json", &ws.upper])).unwrap();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["c2", "c1"]);
    let e = refused(&[&"checkpoint", &"rm", &ws.upper, &"c1"]);
    assert!(e.contains("in use"), "{e}");
    let e = refused(&[&"checkpoint", &ws.upper, &"c1"]);
    assert!(e.contains("exists already"), "{e}");
}

#[test]
fn a_live_checkpoint_is_refused_while_a_file_is_open_for_writing_and_left_as_it_was() {
    let ws = Workspace::new();
    let m = ws.mount();
    fs::write(m.p("f"), "f").unwrap();
    let w = fs::OpenOptions::new().append(true).open(m.p("f")).unwrap();
    let e = refused(&[&"checkpoint", &m.path(), &"c"]);
    assert!(
        e.contains("open for writing") && e.contains("f (uid"),
        "{e}"
    );
    assert_eq!(fs::read_to_string(m.p("f")).unwrap(), "f");
    assert!(ws.upper.join("f").is_file());
    assert!(
        !layer(&ws, "c").exists(),
        "a refused checkpoint left its layer"
    );
    drop(w);
    // Closed: the same checkpoint is taken.
    assert_eq!(ok(&[&"checkpoint", &ws.upper, &"c"]).trim(), "c");
    assert!(is_empty(&ws.upper));
    assert_eq!(fs::read_to_string(m.p("f")).unwrap(), "f");
}

#[test]
fn live_checkpoint_and_undo_go_back_exactly_while_a_reader_holds_a_file() {
    use std::io::{Read, Seek};
    let ws = Workspace::new();
    let l = ws.lower();
    fs::create_dir_all(l.join("d/sub")).unwrap();
    fs::write(l.join("d/sub/x"), "x\n").unwrap();
    fs::write(l.join("e"), "e\n").unwrap();
    fs::write(l.join("gone"), "gone\n").unwrap();
    fs::write(l.join("m"), "m\n").unwrap();
    fs::set_permissions(l.join("m"), fs::Permissions::from_mode(0o644)).unwrap();

    let m = ws.mount();
    fs::write(m.p("c0"), "before c1\n").unwrap();
    let at_c1 = tree_view(m.path());
    assert_eq!(ok(&[&"checkpoint", &m.path(), &"c1"]).trim(), "c1");
    assert!(is_empty(&ws.upper), "the upper is not fresh");
    assert!(
        layer(&ws, "c1").join("c0").is_file(),
        "the upper did not become the layer"
    );
    assert_same(
        &at_c1,
        &tree_view(m.path()),
        "right after a live checkpoint",
    );

    sh(
        m.path(),
        "echo created > new && echo edited > c0 && echo appended >> e && rm gone && mv d d2 \
         && chmod 600 m && ln c0 hard && ln -s e sym && echo deep >> d2/sub/x",
    );
    let changed = tree_view(m.path());
    assert_eq!(fs::read_to_string(m.p("d2/sub/x")).unwrap(), "x\ndeep\n");
    assert!(!is_empty(&ws.upper));
    assert_eq!(
        fs::read_to_string(layer(&ws, "c1").join("c0")).unwrap(),
        "before c1\n",
        "a write after the checkpoint reached its layer"
    );

    // A second live checkpoint keeps the view (a hard link, now in a
    // lower, shows one link per name: DESIGN.md, "Hard links in a
    // lower"), the very view a remount shows; kernel overlayfs given the
    // same stack shows the same tree.
    assert_eq!(ok(&[&"checkpoint", &m.path(), &"c2"]).trim(), "c2");
    let at_c2 = tree_view(m.path());
    assert_same(
        &links_aside(&changed),
        &links_aside(&at_c2),
        "after live checkpoint c2",
    );
    assert!(m.unmount());
    assert_same(
        &links_aside(&changed),
        &links_aside(&kernel_view(&ws, &["c2", "c1"])),
        "kernel overlayfs",
    );

    let m = ws.mount();
    assert_same(&at_c2, &tree_view(m.path()), "remounted on c2");
    let mut reader = fs::File::open(m.p("new")).unwrap();
    sh(m.path(), "echo later > later && rm c0");
    assert_eq!(ok(&[&"undo", &m.path(), &"--to", &"c1"]).trim(), "at c1");
    assert!(is_empty(&ws.upper), "the upper was not emptied");
    assert_same(&at_c1, &tree_view(m.path()), "after a live undo to c1");
    assert!(!m.p("new").exists(), "a new lookup sees the undone file");
    let mut back = String::new();
    reader.rewind().unwrap();
    reader.read_to_string(&mut back).unwrap();
    assert_eq!(back, "created\n", "the reader lost what it opened");
    // The workspace goes on writing after the undo, into its upper.
    fs::write(m.p("after"), "after\n").unwrap();
    assert!(ws.upper.join("after").is_file());
    assert!(!layer(&ws, "c1").join("after").exists());
    drop(reader);
    assert!(m.unmount());
    assert!(
        !layer(&ws, "c2").exists(),
        "the undone checkpoint is still in the store"
    );
    let m = ws.mount();
    assert_eq!(fs::read_to_string(m.p("c0")).unwrap(), "before c1\n");
    assert_eq!(fs::read_to_string(m.p("after")).unwrap(), "after\n");
    assert!(m.unmount());
    fs::remove_file(ws.upper.join("after")).unwrap();
    assert_same(
        &at_c1,
        &kernel_view(&ws, &["c1"]),
        "kernel overlayfs after undo",
    );
}

#[test]
fn a_crash_of_the_daemon_at_any_step_of_a_live_checkpoint_or_undo_leaves_a_whole_view() {
    for (op, step) in [
        ("checkpoint", "record"),
        ("checkpoint", "layer"),
        ("checkpoint", "stack"),
        ("checkpoint", "exchange"),
        ("undo", "pending"),
        ("undo", "exchange"),
        ("undo", "stack"),
    ] {
        let (ws, view) = changed_workspace();
        if op == "undo" {
            ok(&[&"checkpoint", &ws.upper, &"c"]);
        }
        let m = ws.mount_env(&[], &[("LAYERFS_FAILPOINT", &format!("abort:{op}:{step}"))]);
        if op == "undo" {
            sh(m.path(), "rm -r d2 && echo later > n && echo l > later");
        }
        let args: Vec<&dyn AsRef<std::ffi::OsStr>> = if op == "undo" {
            vec![&"undo", &ws.upper]
        } else {
            vec![&"checkpoint", &ws.upper, &"c2"]
        };
        let out = layerfs(&args.iter().map(|a| a.as_ref()).collect::<Vec<_>>());
        assert!(!out.status.success(), "{op} survived a crash at {step}");
        drop(m);
        let m = ws.mount();
        assert_same(
            &view,
            &tree_view(m.path()),
            &format!("daemon killed in a live {op} at {step}"),
        );
        // The workspace goes on: a live checkpoint keeps the view.
        ok(&[&"checkpoint", &m.path(), &"next"]);
        assert_same(
            &view,
            &tree_view(m.path()),
            &format!("live checkpoint after a crash in {op} at {step}"),
        );
        assert!(m.unmount());
    }
}

#[test]
fn forks_are_isolated_from_each_other_and_from_the_checkpoint() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("shared"), "shared\n").unwrap();
    let m = ws.mount();
    fs::write(m.p("b"), "base\n").unwrap();
    assert!(m.unmount());
    ok(&[&"checkpoint", &ws.upper, &"base"]);

    let f1 = fork(&ws, "base", 1);
    let f2 = fork(&ws, "base", 2);
    fs::write(f1.0.join("b"), "one\n").unwrap();
    fs::write(f1.0.join("n1"), "n1\n").unwrap();
    fs::remove_file(f2.0.join("b")).unwrap();
    fs::write(f2.0.join("n2"), "n2\n").unwrap();
    fs::write(f2.0.join("shared"), "two\n").unwrap();

    assert_eq!(fs::read_to_string(f1.0.join("b")).unwrap(), "one\n");
    assert_eq!(fs::read_to_string(f1.0.join("shared")).unwrap(), "shared\n");
    assert!(!f1.0.join("n2").exists());
    assert!(!f2.0.join("b").exists());
    assert!(!f2.0.join("n1").exists());
    assert_eq!(fs::read_to_string(f2.0.join("shared")).unwrap(), "two\n");
    assert_eq!(
        fs::read_to_string(layer(&ws, "base").join("b")).unwrap(),
        "base\n",
        "a fork wrote into the checkpoint"
    );

    // diff of a fork is against its checkpoint.
    let d = ok(&[&"diff", &f1.0]);
    let lines: Vec<&str> = d.lines().collect();
    assert!(lines.contains(&"M b"), "{d}");
    assert!(lines.contains(&"A n1"), "{d}");
    assert_eq!(lines.len(), 2, "{d}");
    let d = ok(&[&"diff", &f2.0]);
    let lines: Vec<&str> = d.lines().collect();
    assert!(lines.contains(&"D b"), "{d}");
    assert!(lines.contains(&"M shared"), "{d}");

    let e = refused(&[&"checkpoint", &"rm", &ws.upper, &"base"]);
    assert!(
        e.contains("fork1"),
        "the refusal does not name the fork: {e}"
    );
    drop(f1);
    drop(f2);

    let m = ws.mount();
    assert_eq!(fs::read_to_string(m.p("b")).unwrap(), "base\n");
    assert!(!m.p("n1").exists() && !m.p("n2").exists());
    assert_eq!(fs::read_to_string(m.p("shared")).unwrap(), "shared\n");
}

/// A best-of-N runner starts its forks at once, while the workspace they
/// come from is mounted and changing: every fork mounts, sees the
/// checkpoint and only its own changes, and holds the checkpoint (its
/// hold made beside the others', none lost).
#[test]
fn forks_started_together_all_mount_on_the_checkpoint_and_each_holds_it() {
    const N: usize = 8;
    let ws = Workspace::new();
    fs::write(ws.lower().join("shared"), "shared\n").unwrap();
    let m = ws.mount();
    fs::write(m.p("b"), "base\n").unwrap();
    assert_eq!(ok(&[&"checkpoint", &m.path(), &"base"]).trim(), "base");

    let mut guards = Vec::new();
    let mut children = Vec::new();
    for n in 0..N {
        let base = ws.dir.path().join(format!("fork{n}"));
        let mnt = base.join("mnt");
        fs::create_dir_all(&mnt).unwrap();
        guards.push(Fork(mnt.clone()));
        children.push(
            Command::new(bin())
                .arg("fork")
                .arg(m.path())
                .arg("base")
                .arg("--upper")
                .arg(base.join("upper"))
                .arg(&mnt)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
    }
    // The source goes on changing while its forks start.
    fs::write(m.p("b"), "after\n").unwrap();
    for (n, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "fork {n} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for (n, g) in guards.iter().enumerate() {
        assert!(is_mounted(&g.0), "fork {n} is not mounted");
        assert_eq!(fs::read_to_string(g.0.join("b")).unwrap(), "base\n");
        assert_eq!(fs::read_to_string(g.0.join("shared")).unwrap(), "shared\n");
        fs::write(g.0.join(format!("own{n}")), format!("{n}\n")).unwrap();
    }
    for (n, g) in guards.iter().enumerate() {
        let d = ok(&[&"diff", &g.0]);
        assert_eq!(
            d.lines().collect::<Vec<_>>(),
            [format!("A own{n}")],
            "fork {n}"
        );
    }
    assert_eq!(fs::read_to_string(m.p("b")).unwrap(), "after\n");
    assert!(!m.p("own0").exists());

    let e = refused(&[&"checkpoint", &"rm", &m.path(), &"base"]);
    for n in 0..N {
        assert!(
            e.contains(&format!("fork{n}")),
            "the refusal does not name fork {n}: {e}"
        );
    }
    drop(guards);
    let e = refused(&[&"checkpoint", &"rm", &m.path(), &"base"]);
    assert!(
        e.contains("fork0"),
        "unmounted forks still stand on it: {e}"
    );
}

#[test]
fn undo_returns_the_upper_to_the_checkpoint_exactly_and_steps_back() {
    let ws = Workspace::new();
    let l = ws.lower();
    fs::create_dir_all(l.join("d")).unwrap();
    fs::write(l.join("d/x"), "x\n").unwrap();
    fs::write(l.join("e"), "e\n").unwrap();
    fs::write(l.join("gone"), "gone\n").unwrap();
    fs::write(l.join("m"), "m\n").unwrap();
    fs::set_permissions(l.join("m"), fs::Permissions::from_mode(0o644)).unwrap();

    let m = ws.mount();
    fs::write(m.p("c0"), "before c0\n").unwrap();
    let at_c0 = tree_view(m.path());
    assert!(m.unmount());
    ok(&[&"checkpoint", &ws.upper, &"c0"]);

    let m = ws.mount();
    fs::write(m.p("c1"), "before c1\n").unwrap();
    sh(m.path(), "echo edit > e");
    let at_c1 = tree_view(m.path());
    assert!(m.unmount());
    ok(&[&"checkpoint", &ws.upper, &"c1"]);

    let m = ws.mount();
    sh(
        m.path(),
        "echo created > new && echo edited > c0 && echo appended >> e && rm gone && mv d d2 \
         && chmod 600 m && ln c1 hard && ln -s e sym",
    );
    assert!(m.unmount());

    assert_eq!(ok(&[&"undo", &ws.upper]).trim(), "at c1");
    assert!(is_empty(&ws.upper));
    let m = ws.mount();
    assert_same(&at_c1, &tree_view(m.path()), "after undo to c1");
    assert!(m.unmount());

    // Nothing changed since c1: the next undo steps back to c0.
    assert_eq!(ok(&[&"undo", &ws.upper]).trim(), "at c0");
    let m = ws.mount();
    assert_same(&at_c0, &tree_view(m.path()), "after undo to c0");
    assert!(m.unmount());
    assert!(
        !layer(&ws, "c1").exists(),
        "the undone checkpoint is still in the store"
    );
    let e = refused(&[&"undo", &ws.upper]);
    assert!(e.contains("nothing to undo"), "{e}");
    let e = refused(&[&"undo", &ws.upper, &"--to", &"c1"]);
    assert!(e.contains("no checkpoint c1"), "{e}");

    // `log` shows the checkpoints and the undos.
    let log = ok(&[&"log", &ws.upper]);
    let ops: Vec<String> = log
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1).map(String::from))
        .filter(|op| op == "checkpoint" || op == "undo")
        .collect();
    assert_eq!(ops, ["checkpoint", "checkpoint", "undo", "undo"], "{log}");
    assert!(log.contains("1 checkpoint taken off"), "{log}");
}

/// `layerfs ARGS` with a crash armed at `op`'s `step`: it must die there.
pub(crate) fn crash_at(op: &str, step: &str, args: &[&dyn AsRef<std::ffi::OsStr>]) {
    let out = armed(op, step, args);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "{op} did not stop at {step}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `layerfs ARGS` run with a crash armed at `op`'s `step`.
fn armed(op: &str, step: &str, args: &[&dyn AsRef<std::ffi::OsStr>]) -> std::process::Output {
    Command::new(bin())
        .args(args.iter().map(|a| a.as_ref()))
        .env("LAYERFS_FAILPOINT", format!("abort:{op}:{step}"))
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A shared tree and a workspace with changes of every kind.
fn changed_workspace() -> (Workspace, std::collections::BTreeMap<String, String>) {
    let ws = Workspace::new();
    fs::create_dir_all(ws.lower().join("d/sub")).unwrap();
    fs::write(ws.lower().join("d/sub/x"), "x\n").unwrap();
    fs::write(ws.lower().join("a"), "a\n").unwrap();
    let m = ws.mount();
    sh(
        m.path(),
        "echo n > n && echo more >> a && mv d d2 && mkdir o && echo o > o/o",
    );
    let view = tree_view(m.path());
    assert!(m.unmount());
    (ws, view)
}

#[test]
fn a_crash_at_any_step_of_a_checkpoint_leaves_the_view_unchanged() {
    for step in ["record", "layer", "stack", "exchange"] {
        let (ws, view) = changed_workspace();
        crash_at("checkpoint", step, &[&"checkpoint", &ws.upper, &"c"]);
        let m = ws.mount();
        assert_same(&view, &tree_view(m.path()), &format!("crash at {step}"));
        assert!(m.unmount());
        // The workspace goes on: the next checkpoint works and keeps it.
        ok(&[&"checkpoint", &ws.upper, &"next"]);
        assert!(is_empty(&ws.upper));
        let m = ws.mount();
        assert_same(
            &view,
            &tree_view(m.path()),
            &format!("checkpoint after a crash at {step}"),
        );
    }
}

#[test]
fn a_crash_at_any_step_of_a_fork_leaves_no_fork_or_a_whole_one_its_base_held() {
    for step in ["holds", "stack"] {
        let (ws, view) = changed_workspace();
        ok(&[&"checkpoint", &ws.upper, &"c"]);
        let base = ws.dir.path().join("fork1");
        let (upper, mnt) = (base.join("upper"), base.join("mnt"));
        fs::create_dir_all(&mnt).unwrap();
        let guard = Fork(mnt.clone());
        let args: [&dyn AsRef<std::ffi::OsStr>; 6] =
            [&"fork", &ws.upper, &"c", &"--upper", &upper, &mnt];
        if step == "holds" {
            crash_at("fork", step, &args);
        } else {
            // The new daemon places the stack while it starts: the process
            // that dies there is the daemon, and the command says so.
            let out = armed("fork", step, &args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "fork went on past {step}: {err}");
            assert!(
                err.contains("the daemon exited before the mount was live"),
                "fork did not stop at {step}: {err}"
            );
        }
        assert!(!is_mounted(&mnt), "crash at {step}: mounted");
        let stack = base.join(".upper.layerfs-state/layers.json");
        let e = refused(&[&"checkpoint", &"rm", &ws.upper, &"c"]);
        if step == "holds" {
            // No fork: its stack was never written, and the hold it left
            // does not count; the fork is made again from the start.
            assert!(!stack.exists(), "crash at {step}: a stack was written");
            assert!(!e.contains("fork1"), "a stale hold counts: {e}");
            ok(&[&"fork", &ws.upper, &"c", &"--upper", &upper, &mnt]);
        } else {
            // A whole fork: its base is held, and it mounts as any upper.
            assert!(stack.exists(), "crash at {step}: no stack");
            assert!(e.contains("fork1"), "the fork's hold is lost: {e}");
            ok(&[&"mount", &"--lower", &ws.lower(), &"--upper", &upper, &mnt]);
        }
        assert_same(
            &view,
            &tree_view(&mnt),
            &format!("a fork after a crash at {step}"),
        );
        drop(guard);
    }
}

/// `layerfs ARGS` started with the step `step` of `op` held
/// (`hold:OP:STEP`) while the file `gate` exists.
fn held_at(op: &str, step: &str, gate: &Path, args: &[&dyn AsRef<std::ffi::OsStr>]) -> Spawned {
    let child = Command::new(bin())
        .args(args.iter().map(|a| a.as_ref()))
        .env("LAYERFS_FAILPOINT", format!("hold:{op}:{step}"))
        .env("LAYERFS_FAILPOINT_WHILE", gate)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    Spawned(child)
}

/// Waits up to `limit` for `p` to end; its status and output.
fn ended(p: &mut Spawned, limit: Duration) -> std::process::Output {
    use std::io::Read;
    assert!(
        eventually(limit, || matches!(p.0.try_wait(), Ok(Some(_)))),
        "still running after {limit:?}"
    );
    let status = p.0.wait().unwrap();
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    if let Some(mut o) = p.0.stdout.take() {
        o.read_to_end(&mut stdout).unwrap();
    }
    if let Some(mut e) = p.0.stderr.take() {
        e.read_to_end(&mut stderr).unwrap();
    }
    std::process::Output {
        status,
        stdout,
        stderr,
    }
}

#[test]
fn checkpoint_rm_during_a_fork_waits_for_its_stack_and_then_refuses() {
    // Between a fork's holds and its stack's placing (in the command, and
    // in the new daemon), its holds name a state dir with no stack: a
    // removal that took them for stale would pull the layer from under
    // the fork.
    for step in ["holds", "placing"] {
        let (ws, view) = changed_workspace();
        // A checkpoint no workspace stacks on yet: an imported one.
        ok(&[&"checkpoint", &ws.upper, &"c0"]);
        let tar = ws.dir.path().join("c0.tar");
        ok(&[&"checkpoint", &"export", &ws.upper, &"c0", &tar]);
        ok(&[&"checkpoint", &"import", &ws.upper, &tar, &"c"]);
        let base = ws.dir.path().join("fork1");
        let (upper, mnt) = (base.join("upper"), base.join("mnt"));
        fs::create_dir_all(&mnt).unwrap();
        let guard = Fork(mnt.clone());
        let gate = ws.dir.path().join("gate");
        fs::write(&gate, "").unwrap();
        let mut forking = held_at(
            "fork",
            step,
            &gate,
            &[&"fork", &ws.upper, &"c", &"--upper", &upper, &mnt],
        );
        let holds = layer(&ws, "c.holds");
        assert!(
            eventually(Duration::from_secs(20), || fs::read_dir(&holds)
                .is_ok_and(|mut d| d.next().is_some())),
            "step {step}: the fork made no hold"
        );
        let mut rm = Spawned(
            Command::new(bin())
                .args([OsStr::new("checkpoint"), OsStr::new("rm")])
                .arg(&ws.upper)
                .arg("c")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        std::thread::sleep(Duration::from_millis(700));
        let early = rm.0.try_wait().unwrap();
        fs::remove_file(&gate).unwrap();
        let fork_out = ended(&mut forking, Duration::from_secs(30));
        let rm_out = ended(&mut rm, Duration::from_secs(40));
        assert!(
            early.is_none(),
            "step {step}: checkpoint rm finished while the fork was in progress: {rm_out:?}"
        );
        assert!(fork_out.status.success(), "step {step}: fork: {fork_out:?}");
        assert!(
            !rm_out.status.success(),
            "step {step}: rm removed c under a fork"
        );
        let e = String::from_utf8_lossy(&rm_out.stderr);
        assert!(e.contains("in use by workspace"), "step {step}: {e}");
        assert!(layer(&ws, "c").exists(), "step {step}: the layer is gone");
        assert_same(&view, &tree_view(&mnt), &format!("the fork held at {step}"));
        drop(guard);
    }
}

#[test]
fn a_fork_made_while_a_squash_builds_keeps_the_checkpoints_it_stands_on() {
    let (ws, _) = layered();
    let at_c2 = fork_view(&ws, "c2", 1);
    fs::remove_dir_all(ws.dir.path().join("fork1")).unwrap();
    let gate = ws.dir.path().join("gate");
    fs::write(&gate, "").unwrap();
    // Held once its merged layer is in the store: past its check of who
    // stands on what it merges, before it removes them.
    let mut squash = held_at(
        "squash",
        "layer",
        &gate,
        &[&"squash", &ws.upper, &"--keep", &"1"],
    );
    let store = layer(&ws, "c1").parent().unwrap().to_path_buf();
    let merged_placed = || {
        fs::read_dir(&store)
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                e.file_type().is_ok_and(|t| t.is_dir())
                    && !n.starts_with('.')
                    && !n.ends_with(".holds")
                    && !["c1", "c2", "c3"].contains(&n.as_str())
            })
    };
    assert!(
        eventually(Duration::from_secs(30), merged_placed),
        "the squash placed no merged layer"
    );
    let f = fork(&ws, "c2", 2);
    fs::remove_file(&gate).unwrap();
    let out = ended(&mut squash, Duration::from_secs(30));
    assert!(out.status.success(), "squash: {out:?}");
    for c in ["c2", "c1"] {
        assert!(
            layer(&ws, c).exists(),
            "the squash removed {c} from under a fork"
        );
    }
    assert_same(
        &at_c2,
        &tree_view(&f.0),
        "the fork of c2 made during the squash",
    );
    drop(f);
    // Once nothing stands on them, the next squash sweeps them away.
    fs::remove_dir_all(ws.dir.path().join("fork2")).unwrap();
    ok(&[&"checkpoint", &ws.upper, &"c4"]);
    ok(&[&"squash", &ws.upper, &"--keep", &"1"]);
    for c in ["c2", "c1"] {
        assert!(!layer(&ws, c).exists(), "{c} outlived its last fork");
    }
}

#[test]
fn a_crash_during_undo_is_finished_by_the_next_mount() {
    for step in ["pending", "exchange", "stack"] {
        let (ws, view) = changed_workspace();
        ok(&[&"checkpoint", &ws.upper, &"c"]);
        let m = ws.mount();
        sh(m.path(), "rm -r d2 && echo later > n && echo l > later");
        assert!(m.unmount());
        crash_at("undo", step, &[&"undo", &ws.upper]);
        let m = ws.mount();
        assert_same(
            &view,
            &tree_view(m.path()),
            &format!("undo crashed at {step}"),
        );
        assert!(m.unmount());
        assert!(
            is_empty(&ws.upper),
            "crash at {step}: the upper was not emptied"
        );
        let e = refused(&[&"undo", &ws.upper]);
        assert!(e.contains("nothing to undo"), "crash at {step}: {e}");
    }
}

#[test]
fn another_user_cannot_checkpoint_fork_or_undo_a_workspace_through_allow_other() {
    let ws = Workspace::new();
    fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let m = ws.mount();
    fs::write(m.p("f"), "f\n").unwrap();
    assert!(m.unmount());
    ok(&[&"checkpoint", &ws.upper, &"c"]);
    let m = ws.mount_with(&["--allow-other"]);
    fs::write(m.p("g"), "g\n").unwrap();
    let other = ws.dir.path().join("other");
    fs::create_dir(&other).unwrap();
    std::os::unix::fs::chown(
        &other,
        Some(crate::daemon::NOBODY),
        Some(crate::daemon::NOBODY),
    )
    .unwrap();
    let bin = bin();
    let s = |p: &Path| p.to_string_lossy().into_owned();
    for target in [s(m.path()), s(&ws.upper)] {
        for args in [
            vec!["checkpoint".to_string(), target.clone(), "theirs".into()],
            vec!["undo".to_string(), target.clone()],
            vec![
                "fork".to_string(),
                target.clone(),
                "c".into(),
                "--upper".into(),
                s(&other.join("upper")),
                s(&other.join("mnt")),
            ],
            vec![
                "checkpoint".to_string(),
                "rm".into(),
                target.clone(),
                "c".into(),
            ],
        ] {
            let out = crate::daemon::as_nobody(&bin, &args);
            assert!(
                !out.status.success(),
                "{args:?} was allowed to another user"
            );
            assert!(!is_mounted(&other.join("mnt")));
        }
    }
    assert_eq!(fs::read_to_string(m.p("g")).unwrap(), "g\n");
    assert!(ws.upper.join("g").is_file(), "the upper changed");
    assert!(
        layer(&ws, "c").join("f").is_file(),
        "the checkpoint changed"
    );
    assert!(!layer(&ws, "theirs").exists());
}

/// `nobody` opens `file` through a mount (`>>` to write, `<` to read) and
/// keeps it open until the returned process is dropped; returns once it
/// is open.
fn held_open(file: &Path, how: &str) -> crate::harness::Spawned {
    let mut child = Command::new("setpriv")
        .args([
            format!("--reuid={}", crate::daemon::NOBODY),
            format!("--regid={}", crate::daemon::NOBODY),
            "--clear-groups".into(),
            "--".into(),
            "sh".into(),
            "-c".into(),
            format!(
                "exec 3{how}'{}' && echo open && exec sleep 600",
                file.display()
            ),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let h = crate::harness::Spawned(child);
    assert_eq!(line, "open\n", "nobody could not open {}", file.display());
    h
}

#[test]
fn another_users_open_files_through_allow_other_refuse_or_allow_the_owners_state_commands() {
    let ws = Workspace::new();
    fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let m = ws.mount();
    fs::write(m.p("f"), "f\n").unwrap();
    fs::write(m.p("shared.txt"), "shared\n").unwrap();
    fs::set_permissions(m.p("shared.txt"), fs::Permissions::from_mode(0o666)).unwrap();
    let at_c = tree_view(m.path());
    assert!(m.unmount());
    ok(&[&"checkpoint", &ws.upper, &"c"]);
    let m = ws.mount_with(&["--allow-other"]);
    fs::write(m.p("g"), "g\n").unwrap();

    // Another user's file open for writing: a checkpoint would freeze
    // what it writes later, so it is refused, naming the file and uid.
    let writer = held_open(&m.p("shared.txt"), ">>");
    let e = refused(&[&"checkpoint", &m.path(), &"c2"]);
    assert!(
        e.contains("shared.txt") && e.contains(&format!("uid {}", crate::daemon::NOBODY)),
        "{e}"
    );
    assert!(
        !layer(&ws, "c2").exists(),
        "a refused checkpoint made a layer"
    );
    assert!(
        ws.upper.join("g").is_file(),
        "a refused checkpoint moved the upper"
    );
    // An undo is the owner's: another user's writer does not hold it up.
    assert_eq!(ok(&[&"undo", &m.path()]).trim(), "at c");
    assert_same(&at_c, &tree_view(m.path()), "the live mount after the undo");
    drop(writer);

    // Another user's file open for reading holds up neither; it reads on.
    fs::write(m.p("h"), "h\n").unwrap();
    let reader = held_open(&m.p("shared.txt"), "<");
    assert_eq!(ok(&[&"checkpoint", &m.path(), &"c2"]).trim(), "c2");
    assert!(layer(&ws, "c2").join("h").is_file());
    fs::write(m.p("i"), "i\n").unwrap();
    assert_eq!(ok(&[&"undo", &m.path()]).trim(), "at c2");
    assert!(!m.p("i").exists() && m.p("h").is_file());
    drop(reader);
    assert!(m.unmount());
}

/// `layerfs run ARGS` as root (the workspace outside /tmp); must exit 0.
fn run_ok(args: &[&str]) -> std::process::Output {
    let out = crate::run::run_as(crate::run::Caller::Root, args);
    assert!(
        out.status.success(),
        "layerfs run {args:?} failed: {}",
        crate::run::text(&out)
    );
    out
}

/// The tree a fresh mount of `ws` shows.
pub(crate) fn view_of(ws: &Workspace) -> std::collections::BTreeMap<String, String> {
    let m = ws.mount();
    let v = tree_view(m.path());
    assert!(m.unmount());
    v
}

#[test]
fn run_checkpoint_lets_undo_take_back_exactly_that_command_mounted_or_not() {
    let ws = crate::run::workspace_for(crate::run::Caller::Root);
    let l = ws.lower();
    fs::create_dir_all(l.join("d")).unwrap();
    fs::write(l.join("d/x"), "x\n").unwrap();
    fs::write(l.join("a"), "a\n").unwrap();
    fs::write(l.join("gone"), "gone\n").unwrap();
    let (lower, upper) = (l.to_str().unwrap(), ws.upper.to_str().unwrap());
    let run = |script: &str| {
        run_ok(&[
            "--lower",
            lower,
            "--upper",
            upper,
            "--checkpoint",
            "--json",
            "--",
            "sh",
            "-c",
            script,
        ])
    };

    // Unmounted: the run mounts, checkpoints, runs, unmounts.
    let first = run("echo one > one");
    let name = crate::run::json_of(&first)["checkpoint"]
        .as_str()
        .expect("no checkpoint in --json")
        .to_string();
    assert!(
        crate::run::stderr(&first).contains(&format!("checkpoint {name}")),
        "{}",
        crate::run::text(&first)
    );
    let before = view_of(&ws);
    run("echo new > a && rm gone && echo more >> d/x && mkdir n && mv d d2 && ln -s a s");
    assert!(
        !is_empty(&ws.upper),
        "the command's changes are not in the upper"
    );
    assert_ne!(before, view_of(&ws));
    ok(&[&"undo", &ws.upper]);
    assert_same(&before, &view_of(&ws), "undo after run --checkpoint");
    assert!(is_empty(&ws.upper));

    // Live: the run reuses the mount and its daemon takes the checkpoint;
    // the undo goes back on the live mount.
    let m = ws.mount();
    fs::write(m.p("live"), "live\n").unwrap();
    let before = tree_view(m.path());
    run("echo changed > a && rm live && mkdir -p n && echo n > n/f");
    assert_eq!(fs::read_to_string(m.p("a")).unwrap(), "changed\n");
    ok(&[&"undo", &m.path()]);
    assert_same(
        &before,
        &tree_view(m.path()),
        "live undo after run --checkpoint",
    );
    assert!(m.unmount());

    // `log` shows the runs' checkpoints and the undos.
    let log = ok(&[&"log", &ws.upper]);
    let ops: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|op| *op == "checkpoint" || *op == "undo")
        .collect();
    assert_eq!(
        ops,
        ["checkpoint", "checkpoint", "undo", "checkpoint", "undo"],
        "{log}"
    );
    assert!(log.contains(&name), "{log}");
}

#[test]
fn run_checkpoint_of_an_unchanged_workspace_makes_no_layer_and_undo_stays_exact() {
    let ws = crate::run::workspace_for(crate::run::Caller::Root);
    fs::write(ws.lower().join("a"), "a\n").unwrap();
    let m = ws.mount();
    let run = |script: &str| run_checkpointed(&ws, script);
    let v0 = tree_view(m.path());
    run("echo one > one");
    let v1 = tree_view(m.path());
    let changed = run("true");
    let layers = stack_of(&ws);
    // Nothing changed since `changed`: the next command's checkpoint is
    // that layer again, and no layer is added.
    assert_eq!(run("echo two > two"), changed);
    assert_eq!(stack_of(&ws), layers);
    assert_ne!(tree_view(m.path()), v1);
    // Each undo takes back one command: `echo two`, then `true` (nothing
    // to take back: the view stays), then `echo one`.
    ok(&[&"undo", &m.path()]);
    assert_same(&v1, &tree_view(m.path()), "undo of `echo two`");
    ok(&[&"undo", &m.path()]);
    assert_same(&v1, &tree_view(m.path()), "undo of `true`");
    assert_eq!(stack_of(&ws), layers);
    ok(&[&"undo", &m.path()]);
    assert_same(&v0, &tree_view(m.path()), "undo of `echo one`");
    assert!(m.unmount());
    assert_same(&v0, &view_of(&ws), "after a remount");
}

/// `layerfs run --checkpoint -- sh -c SCRIPT` in the workspace `ws`
/// (mounted or not); returns the checkpoint's name.
fn run_checkpointed(ws: &Workspace, script: &str) -> String {
    let (lower, upper) = (ws.lower().to_str().unwrap(), ws.upper.to_str().unwrap());
    let out = run_ok(&[
        "--lower",
        lower,
        "--upper",
        upper,
        "--checkpoint",
        "--json",
        "--",
        "sh",
        "-c",
        script,
    ]);
    crate::run::json_of(&out)["checkpoint"]
        .as_str()
        .expect("no checkpoint in --json")
        .to_string()
}

#[test]
fn run_checkpoints_after_changes_keep_open_files_reading_and_undo_takes_back_one_command_each() {
    use std::io::{Read, Seek};
    let ws = crate::run::workspace_for(crate::run::Caller::Root);
    fs::write(ws.lower().join("f"), "0\n").unwrap();
    let m = ws.mount();
    let read_all = |r: &mut fs::File| {
        let mut got = String::new();
        r.rewind().unwrap();
        r.read_to_string(&mut got).unwrap();
        got
    };
    let mut views = vec![tree_view(m.path())];
    // Files each command made, held open from then on: the next
    // checkpoints move them into layers, the undos take them away.
    let mut readers: Vec<(fs::File, String)> = Vec::new();
    let mut f = fs::File::open(m.p("f")).unwrap();
    let mut names = Vec::new();
    let mut text = String::from("0\n");
    for i in 1..=4 {
        // Every command changes files: every checkpoint makes a layer.
        names.push(run_checkpointed(
            &ws,
            &format!("echo {i} >> f && echo {i} > new{i}"),
        ));
        text.push_str(&format!("{i}\n"));
        assert_eq!(fs::read_to_string(m.p("f")).unwrap(), text, "after run {i}");
        // `f`, open since before the first command, reads as a new open
        // does (a copy-up is followed, from whichever layer it was made).
        assert_eq!(read_all(&mut f), text, "f held open, after run {i}");
        let mut r = fs::File::open(m.p(&format!("new{i}"))).unwrap();
        let opened = read_all(&mut r);
        assert_eq!(opened, format!("{i}\n"));
        readers.push((r, opened));
        views.push(tree_view(m.path()));
        for (r, opened) in &mut readers {
            assert_eq!(&read_all(r), opened, "an open file, after run {i}");
        }
    }
    // Each checkpoint is a layer on the stack, with its record, held by
    // the workspace (`checkpoint rm` refuses it).
    let stack = stack_of(&ws);
    for n in &names {
        assert!(stack.contains(n), "{n} is not on the stack {stack:?}");
        assert!(layer(&ws, n).is_dir(), "no layer {n}");
        let why = refused(&[&"checkpoint", &"rm", &ws.upper, n]);
        assert!(why.contains("in use"), "{why}");
    }
    assert_eq!(
        fs::read_to_string(layer(&ws, &names[3]).join("f")).unwrap(),
        "0\n1\n2\n3\n",
        "the layer of the last checkpoint is not what the command before it left"
    );
    // A write to a file held open since before the checkpoint that froze
    // it (passed through, as root) never reaches the frozen layer: the
    // name became a new object, copied up into the new upper, while the
    // reader reads on what it opened.
    let layer_file = layer(&ws, &names[1]).join("new1");
    {
        use std::io::Write;
        let mut w = fs::OpenOptions::new()
            .append(true)
            .open(m.p("new1"))
            .unwrap();
        w.write_all(b"more\n").unwrap();
    }
    assert_eq!(fs::read_to_string(m.p("new1")).unwrap(), "1\nmore\n");
    let held = &mut readers[1];
    assert_eq!(
        read_all(&mut held.0),
        held.1,
        "new1 held open, after a write"
    );
    assert_eq!(
        fs::read_to_string(&layer_file).unwrap(),
        "1\n",
        "a write reached the frozen layer"
    );
    // Each undo takes back one command, on the live mount, while the
    // readers read on.
    for i in (0..4).rev() {
        ok(&[&"undo", &m.path()]);
        assert_same(&views[i], &tree_view(m.path()), &format!("undo to {i}"));
        for (r, opened) in &mut readers {
            assert_eq!(&read_all(r), opened, "an open file, after the undo to {i}");
        }
    }
    drop((readers, f));
    assert!(m.unmount());
    assert_same(&views[0], &view_of(&ws), "after a remount");
}

#[test]
fn a_crash_of_the_daemon_at_any_step_of_a_run_checkpoint_leaves_a_whole_view() {
    for step in ["record", "layer", "stack", "exchange"] {
        let ws = crate::run::workspace_for(crate::run::Caller::Root);
        fs::write(ws.lower().join("f"), "0\n").unwrap();
        let (lower, upper) = (ws.lower().to_str().unwrap(), ws.upper.to_str().unwrap());
        let m = ws.mount_env(
            &[],
            &[("LAYERFS_FAILPOINT", &format!("abort:checkpoint:{step}"))],
        );
        sh(m.path(), "echo 1 >> f && mkdir d && echo n > d/n");
        let view = tree_view(m.path());
        let out = crate::run::run_as(
            crate::run::Caller::Root,
            &[
                "--lower",
                lower,
                "--upper",
                upper,
                "--checkpoint",
                "--",
                "sh",
                "-c",
                "echo 2 >> f",
            ],
        );
        assert!(
            !out.status.success(),
            "run --checkpoint survived a crash at {step}: {}",
            crate::run::text(&out)
        );
        drop(m);
        let m = ws.mount();
        assert_same(
            &view,
            &tree_view(m.path()),
            &format!("daemon killed in a run's checkpoint at {step}"),
        );
        // The workspace goes on: the next run's checkpoint is exact.
        run_checkpointed(&ws, "echo 3 >> f");
        assert_eq!(fs::read_to_string(m.p("f")).unwrap(), "0\n1\n3\n");
        ok(&[&"undo", &m.path()]);
        assert_same(
            &view,
            &tree_view(m.path()),
            &format!("undo of a run after a crash at {step}"),
        );
        assert!(m.unmount());
    }
}

#[test]
fn run_fork_runs_in_a_fresh_fork_of_a_checkpoint() {
    let ws = crate::run::workspace_for(crate::run::Caller::Root);
    fs::write(ws.lower().join("shared"), "shared\n").unwrap();
    let m = ws.mount();
    fs::write(m.p("base"), "base\n").unwrap();
    assert!(m.unmount());
    ok(&[&"checkpoint", &ws.upper, &"start"]);
    let source = view_of(&ws);
    let fork = format!("{}:start", ws.upper.display());

    // Ephemeral: the command sees the checkpoint; nothing stays.
    let out = run_ok(&[
        "--fork",
        &fork,
        "--ephemeral",
        "--",
        "sh",
        "-c",
        "cat base shared && echo x > new && rm base",
    ]);
    assert_eq!(crate::run::stdout(&out), "base\nshared\n");
    assert_same(&source, &view_of(&ws), "the source after an ephemeral fork");

    // With --upper: the fork stays, and diffs against the checkpoint.
    let u2 = ws.dir.path().join("fork-upper");
    run_ok(&[
        "--fork",
        &fork,
        "--upper",
        u2.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "echo y > y && rm base",
    ]);
    assert!(u2.join("y").is_file());
    let diff = ok(&[&"diff", &u2]);
    let mut lines: Vec<&str> = diff.lines().collect();
    lines.sort();
    assert_eq!(lines, ["A y", "D base"], "{diff}");
    assert_same(&source, &view_of(&ws), "the source after a kept fork");

    // A second run in that upper continues the fork (its stack is kept).
    let out = run_ok(&[
        "--lower",
        ws.lower().to_str().unwrap(),
        "--upper",
        u2.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "ls",
    ]);
    assert_eq!(crate::run::stdout(&out), "shared\ny\n");

    // A fork into a non-empty upper, or of no such checkpoint: refused.
    let out = crate::run::run_as(
        crate::run::Caller::Root,
        &[
            "--fork",
            &fork,
            "--upper",
            u2.to_str().unwrap(),
            "--",
            "true",
        ],
    );
    assert_eq!(out.status.code(), Some(125));
    assert!(
        crate::run::stderr(&out).contains("not empty"),
        "{}",
        crate::run::text(&out)
    );
    let out = crate::run::run_as(
        crate::run::Caller::Root,
        &[
            "--fork",
            &format!("{}:nope", ws.upper.display()),
            "--ephemeral",
            "--",
            "true",
        ],
    );
    assert_eq!(out.status.code(), Some(125));
    assert!(
        crate::run::stderr(&out).contains("no checkpoint nope"),
        "{}",
        crate::run::text(&out)
    );
}

/// A workspace with three checkpoints holding changes of every kind
/// (whiteouts over frozen files, an opaque directory over a frozen one,
/// a chain of directory renames, hard links, symlinks, modes) and an
/// empty upper; its view.
fn layered() -> (Workspace, std::collections::BTreeMap<String, String>) {
    let ws = Workspace::new();
    let l = ws.lower();
    shared_tree(l);
    let view = checkpoints(
        &ws,
        &[
            (
                "c1",
                "echo new > new && echo more >> a && rm gone && mv d d2 && rm -r o && mkdir o \
                 && echo z > o/z && chmod 600 keep/k && ln -s a link && echo h > h && ln h h2",
            ),
            (
                "c2",
                "rm new && mv d2 d3 && echo w > o/w && echo more >> d3/sub/x && echo again >> a \
                 && mkdir n && echo 1 > n/1 && echo 1 > n/old",
            ),
            (
                "c3",
                "rm -r n && mkdir n && echo 2 > n/2 && echo 3 > three && rm o/z && chmod 700 o",
            ),
        ],
    );
    (ws, view)
}

/// Takes the checkpoints `steps` of the unmounted workspace `ws` in turn,
/// each (name, script) the script run in a mount of it, then the
/// checkpoint; returns the view at the last one.
pub(crate) fn checkpoints(
    ws: &Workspace,
    steps: &[(&str, &str)],
) -> std::collections::BTreeMap<String, String> {
    for (name, script) in steps {
        let m = ws.mount();
        sh(m.path(), script);
        assert!(m.unmount());
        ok(&[&"checkpoint", &ws.upper, name]);
    }
    view_of(ws)
}

/// The layer names of `ws`'s stack, topmost first.
pub(crate) fn stack_of(ws: &Workspace) -> Vec<String> {
    let list: serde_json::Value =
        serde_json::from_str(&ok(&[&"checkpoint", &"list", &"--json", &ws.upper])).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn squash_merges_layers_into_one_with_the_same_tree_as_kernel_overlay() {
    let (ws, view) = layered();
    assert_same(
        &links_aside(&view),
        &links_aside(&kernel_view(&ws, &["c3", "c2", "c1"])),
        "kernel overlayfs before the squash",
    );
    // Changes since the latest checkpoint, checkpointed too (a squash
    // over changes left in the upper: tests/it/squash.rs).
    let m = ws.mount();
    sh(m.path(), "echo top > top && echo top >> three");
    let view = tree_view(m.path());
    assert!(m.unmount());
    ok(&[&"checkpoint", &ws.upper, &"c4"]);
    let out = ok(&[&"squash", &ws.upper]);
    let name = out.split_whitespace().next().unwrap().to_string();
    assert!(out.contains("merged 4 checkpoints"), "{out}");
    assert_eq!(stack_of(&ws), std::slice::from_ref(&name));
    for c in ["c1", "c2", "c3", "c4"] {
        assert!(!layer(&ws, c).exists(), "{c} is still in the store");
    }
    assert_same(&view, &view_of(&ws), "layerfs after the squash");
    assert_same(
        &links_aside(&view),
        &links_aside(&kernel_view(&ws, &[&name])),
        "kernel overlayfs over the squashed layer",
    );
    // The workspace goes on: a checkpoint over the squashed layer (taken
    // live: `status` lists it), undo.
    let m = ws.mount();
    ok(&[&"checkpoint", &m.path(), &"c5"]);
    let st: serde_json::Value =
        serde_json::from_str(&ok(&[&"status", &"--json", &m.path()])).unwrap();
    assert_eq!(st["checkpoints"], serde_json::json!(["c5", name]), "{st}");
    let text = ok(&[&"status", &m.path()]);
    assert!(text.contains(&format!("c5, {name} (top first")), "{text}");
    assert!(m.unmount());
    let m = ws.mount();
    sh(m.path(), "rm -r d3 && echo later > a");
    assert!(m.unmount());
    assert_eq!(ok(&[&"undo", &ws.upper]).trim(), "at c5");
    assert_same(&view, &view_of(&ws), "after checkpoint and undo");
    let out = ok(&[&"squash", &ws.upper, &"--keep", &"1"]);
    assert!(out.contains("nothing to squash"), "{out}");
}

#[test]
fn squash_keeps_the_newest_layers_and_forks_of_them() {
    let (ws, view) = layered();
    let m = ws.mount();
    let at_c3 = {
        let f = fork(&ws, "c3", 1);
        let v = tree_view(&f.0);
        drop(f);
        v
    };
    assert!(m.unmount());
    // A fork on c3 stands on c2 and c1 too: they cannot be squashed away.
    let f = fork(&ws, "c3", 2);
    let e = refused(&[&"squash", &ws.upper, &"--keep", &"1"]);
    assert!(e.contains("also stood on by workspace"), "{e}");
    drop(f);
    // The forks are gone (their state dirs with them): nothing else
    // stands on the layers.
    for n in ["fork1", "fork2"] {
        fs::remove_dir_all(ws.dir.path().join(n)).unwrap();
    }

    let out = ok(&[&"squash", &ws.upper, &"--keep", &"1"]);
    let name = out.split_whitespace().next().unwrap().to_string();
    assert_eq!(stack_of(&ws), ["c3".to_string(), name.clone()]);
    assert_same(&view, &view_of(&ws), "after squash --keep 1");
    assert_same(
        &links_aside(&view),
        &links_aside(&kernel_view(&ws, &["c3", &name])),
        "kernel overlayfs after squash --keep 1",
    );
    // A fork of the kept checkpoint stands on the squashed layer.
    let f = fork(&ws, "c3", 3);
    assert_same(&at_c3, &tree_view(&f.0), "a fork of c3 after the squash");
}

#[test]
fn a_live_squash_keeps_the_view_while_a_reader_holds_a_file_and_kernel_overlay_agrees() {
    let (ws, _) = layered();
    let m = ws.mount();
    // Changes since the latest checkpoint, taken by a live checkpoint (a
    // squash over changes left in the upper: tests/it/squash.rs).
    sh(m.path(), "echo top > top");
    ok(&[&"checkpoint", &m.path(), &"c4"]);
    let view = tree_view(m.path());
    // A reader holds a file of a merged layer open, half read.
    let whole = fs::read(m.p("d3/sub/x")).unwrap();
    let mut reader = fs::File::open(m.p("d3/sub/x")).unwrap();
    let mut head = vec![0u8; 2];
    std::io::Read::read_exact(&mut reader, &mut head).unwrap();
    let out = ok(&[&"squash", &m.path()]);
    let name = out.split_whitespace().next().unwrap().to_string();
    assert!(out.contains("merged 4 checkpoints"), "{out}");
    assert_eq!(stack_of(&ws), std::slice::from_ref(&name));
    for c in ["c1", "c2", "c3", "c4"] {
        assert!(!layer(&ws, c).exists(), "{c} is still in the store");
    }
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut reader, &mut rest).unwrap();
    assert_eq!([head, rest].concat(), whole, "the open file read on");
    drop(reader);
    assert_same(
        &view,
        &tree_view(m.path()),
        "the live mount after the squash",
    );
    // The mount goes on over the new stack.
    sh(m.path(), "echo after > after && rm three");
    let later = tree_view(m.path());
    assert!(m.unmount());
    assert_same(&later, &view_of(&ws), "a remount after the live squash");
    ok(&[&"undo", &ws.upper]);
    assert_same(&view, &view_of(&ws), "undo after the live squash");
    assert_same(
        &links_aside(&view),
        &links_aside(&kernel_view(&ws, &[&name])),
        "kernel overlayfs over the squashed layer",
    );
}

#[test]
fn a_crash_of_the_daemon_at_any_step_of_a_live_squash_leaves_the_old_stack_or_the_new_one() {
    for step in ["built", "layer", "records", "stack", "remove"] {
        let (ws, view) = layered();
        let m = ws.mount_env(
            &[],
            &[("LAYERFS_FAILPOINT", &format!("abort:squash:{step}"))],
        );
        let out = layerfs(&[std::ffi::OsStr::new("squash"), m.path().as_os_str()]);
        assert!(!out.status.success(), "squash survived a crash at {step}");
        drop(m);
        let stack = stack_of(&ws);
        assert!(
            stack == ["c3", "c2", "c1"] || (stack.len() == 1 && !stack[0].starts_with('c')),
            "daemon killed at {step}: a mixed stack {stack:?}"
        );
        let m = ws.mount();
        assert_same(
            &view,
            &tree_view(m.path()),
            &format!("daemon killed in a live squash at {step}"),
        );
        // The next squash, live, finishes or redoes it.
        ok(&[&"squash", &m.path()]);
        assert_eq!(stack_of(&ws).len(), 1, "crash at {step}");
        assert_same(
            &view,
            &tree_view(m.path()),
            &format!("live squash after a crash at {step}"),
        );
        assert!(m.unmount());
    }
}

/// A checkpoint killed at each of its steps, of an unmounted workspace
/// and of a live mount: before its stack names it, it leaves a pending
/// record (and maybe its empty layer and hold) that is no one's; after,
/// it is on the stack with its record maybe still pending. The next
/// checkpoint (or undo, or squash) settles either: the name is free
/// again or the checkpoint whole, and a squash merges everything, with
/// no `checkpoint rm` by hand. A checkpoint kept on purpose on no stack
/// (an imported one, recorded with this very upper) is never taken for
/// a leftover.
#[test]
fn a_checkpoint_killed_at_any_step_leaves_nothing_aside_mounted_or_not() {
    for live in [false, true] {
        for step in ["record", "layer", "stack", "exchange"] {
            let what = format!(
                "{} checkpoint killed at {step}",
                if live { "live" } else { "a" }
            );
            let (ws, _) = layered();
            let tar = ws.dir.path().join("c2.tar");
            ok(&[&"checkpoint", &"export", &ws.upper, &"c2", &tar]);
            ok(&[&"checkpoint", &"import", &ws.upper, &tar, &"imp"]);
            let m = ws.mount();
            sh(m.path(), "echo k > k && rm three && echo more >> a");
            let view = tree_view(m.path());
            assert!(m.unmount());
            if live {
                let m = ws.mount_env(
                    &[],
                    &[("LAYERFS_FAILPOINT", &format!("abort:checkpoint:{step}"))],
                );
                let out = layerfs(&[
                    std::ffi::OsStr::new("checkpoint"),
                    m.path().as_os_str(),
                    std::ffi::OsStr::new("k"),
                ]);
                assert!(!out.status.success(), "{what}: it survived");
                drop(m);
            } else {
                crash_at("checkpoint", step, &[&"checkpoint", &ws.upper, &"k"]);
            }
            // What the kill left: a pending record, never a published one.
            assert_eq!(
                store_leftovers(&ws, ".pending.json"),
                [".k.pending.json"],
                "{what}"
            );
            assert!(!layer(&ws, "k.json").exists(), "{what}: published");
            // Not the user's to remove: its workspace settles it.
            let e = refused(&[&"checkpoint", &"rm", &ws.upper, &"k"]);
            assert!(e.contains("being taken"), "{what}: {e}");
            let stacked = matches!(step, "stack" | "exchange");
            assert_eq!(stack_of(&ws).contains(&"k".to_string()), stacked, "{what}");
            let m = ws.mount();
            assert_same(&view, &tree_view(m.path()), &what);
            // The workspace goes on, through the daemon when live.
            let m = if live {
                Some(m)
            } else {
                assert!(m.unmount());
                None
            };
            let at = m
                .as_ref()
                .map_or(ws.upper.clone(), |m| m.path().to_path_buf());
            let now = |m: &Option<Mount>| match m {
                Some(m) => tree_view(m.path()),
                None => view_of(&ws),
            };
            if stacked {
                let e = refused(&[&"checkpoint", &at, &"k"]);
                assert!(e.contains("exists already"), "{what}: {e}");
                ok(&[&"checkpoint", &at]);
                assert!(layer(&ws, "k.json").is_file(), "{what}: not finished");
            } else {
                // Never anyone's: its name is free again.
                assert_eq!(ok(&[&"checkpoint", &at, &"k"]).trim(), "k", "{what}");
            }
            assert!(store_leftovers(&ws, ".pending.json").is_empty(), "{what}");
            // Killed at "stack", `k` is an empty layer under a
            // checkpoint of the changes; else it holds them.
            let stack = stack_of(&ws);
            assert!(
                stack.ends_with(&["k", "c3", "c2", "c1"].map(String::from)),
                "{what}: {stack:?}"
            );
            assert_same(&view, &now(&m), &format!("{what}, then settled"));
            let squashed = ok(&[&"squash", &at]);
            assert_eq!(stack_of(&ws).len(), 1, "{what}: {squashed}");
            assert_same(&view, &now(&m), &format!("{what}, then squashed"));
            if let Some(m) = m {
                assert!(m.unmount());
            }
            assert!(
                layer(&ws, "imp").is_dir() && layer(&ws, "imp.json").is_file(),
                "{what}: the imported checkpoint was taken for a leftover"
            );
            let m = ws.mount();
            assert_same(&view, &tree_view(m.path()), &format!("{what}, remounted"));
            assert!(m.unmount());
        }
    }
}

/// Starts `layerfs ARGS` and kills it (SIGKILL, by its pid) after a
/// random moment of up to 40 ms, or lets it finish first.
fn kill_9_within(rng: &mut crate::crash::Rng, args: &[&dyn AsRef<std::ffi::OsStr>]) {
    let mut child = Command::new(bin())
        .args(args.iter().map(|a| a.as_ref()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_micros(rng.next() % 40_000));
    let _ = child.kill();
    let _ = child.wait();
}

/// Crash campaign of the state commands: rounds of a change, then a
/// `checkpoint`, `undo` or `squash` of the unmounted workspace killed at a
/// random moment; the next mount shows the view before it or, for an
/// undo, the one it goes back to, never a mix, and the next command
/// finishes the work. LAYERFS_CRASH_ROUNDS (default 12) and
/// LAYERFS_CRASH_SEED (default: the clock, printed) as in `crash.rs`.
#[test]
fn kill_9_at_random_moments_of_checkpoint_undo_and_squash_leaves_a_whole_view() {
    let rounds = crate::crash::env_u64("LAYERFS_CRASH_ROUNDS", 12);
    let seed = crate::crash::env_u64(
        "LAYERFS_CRASH_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    );
    eprintln!("checkpoint crash campaign: LAYERFS_CRASH_SEED={seed}");
    let mut rng = crate::crash::Rng::new(seed);
    let (ws, _) = layered();
    let mut pending = 0;
    for r in 0..rounds {
        let m = ws.mount();
        sh(
            m.path(),
            &format!("echo {r} > r{r} && echo {r} >> a && rm -rf n && mkdir -p o/p{r}"),
        );
        let changed = tree_view(m.path());
        assert!(m.unmount());
        let what = format!("round {r} (LAYERFS_CRASH_SEED={seed})");
        match rng.next() % 3 {
            0 => {
                let k = format!("k{r}");
                kill_9_within(&mut rng, &[&"checkpoint", &ws.upper, &k]);
                assert_same(
                    &changed,
                    &view_of(&ws),
                    &format!("checkpoint killed, {what}"),
                );
                // Killed after its record and before its publication, it
                // left a pending checkpoint: the next checkpoint removes
                // it (on no stack) or finishes it, so no later squash is
                // refused for it.
                if !store_leftovers(&ws, ".pending.json").is_empty() {
                    pending += 1;
                }
                ok(&[&"checkpoint", &ws.upper]);
                assert_eq!(
                    store_leftovers(&ws, ".pending.json"),
                    Vec::<String>::new(),
                    "a pending checkpoint outlived the next one, {what}"
                );
                assert_same(
                    &changed,
                    &view_of(&ws),
                    &format!("checkpoint after, {what}"),
                );
            }
            1 => {
                ok(&[&"checkpoint", &ws.upper, &format!("k{r}")]);
                let m = ws.mount();
                sh(m.path(), &format!("echo later > later{r} && rm -r o"));
                let later = tree_view(m.path());
                assert!(m.unmount());
                kill_9_within(&mut rng, &[&"undo", &ws.upper]);
                let after = view_of(&ws);
                if after == later {
                    // Killed before it decided: the undo is made again.
                    ok(&[&"undo", &ws.upper]);
                } else {
                    assert_same(&changed, &after, &format!("undo killed, {what}"));
                }
                assert_same(&changed, &view_of(&ws), &format!("undo after, {what}"));
            }
            _ => {
                ok(&[&"checkpoint", &ws.upper, &format!("k{r}")]);
                let old = stack_of(&ws);
                kill_9_within(&mut rng, &[&"squash", &ws.upper]);
                let stack = stack_of(&ws);
                assert!(
                    stack == old || stack.len() == 1,
                    "squash killed, {what}: a mixed stack {stack:?} (was {old:?})"
                );
                assert_same(&changed, &view_of(&ws), &format!("squash killed, {what}"));
                ok(&[&"squash", &ws.upper]);
                assert_eq!(stack_of(&ws).len(), 1, "{what}");
                assert_same(&changed, &view_of(&ws), &format!("squash after, {what}"));
            }
        }
    }
    eprintln!("checkpoint crash campaign: {pending} kills left a pending checkpoint, settled");
}

#[test]
fn a_crash_at_any_step_of_a_squash_leaves_the_old_stack_or_the_new_one() {
    for step in ["built", "layer", "records", "stack", "remove"] {
        let (ws, view) = layered();
        crash_at("squash", step, &[&"squash", &ws.upper]);
        assert_same(&view, &view_of(&ws), &format!("squash crashed at {step}"));
        assert_old_or_squashed(&ws, &["c3", "c2", "c1"], &format!("crash at {step}"));
        // The next squash finishes or redoes it, and cleans up.
        assert_squash_finishes(&ws, &view, &format!("crash at {step}"));
        let store = ws.dir.path().join(".upper.layerfs-state").join("layers");
        let left: Vec<String> = fs::read_dir(&store)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".json") && !n.ends_with(".holds") && n != ".lock")
            .collect();
        assert_eq!(left.len(), 1, "crash at {step}: the store keeps {left:?}");
    }
}

/// The tree a fork of checkpoint `name` of `ws` shows (fork `n`).
fn fork_view(ws: &Workspace, name: &str, n: usize) -> std::collections::BTreeMap<String, String> {
    let f = fork(ws, name, n);
    let v = tree_view(&f.0);
    drop(f);
    v
}

#[test]
fn an_exported_checkpoint_imported_into_another_workspace_forks_to_the_same_tree() {
    // c1: edit, delete of a lower file, rename of a lower dir, symlink,
    // chmod, hard link; c2 and c3 stand on it (whiteouts, opaque dirs,
    // redirects through frozen layers).
    let (ws, at_c3) = layered();
    let at_c1 = fork_view(&ws, "c1", 1);
    let out = ws.dir.path().join("out");
    fs::create_dir(&out).unwrap();
    let (t3, t1) = (out.join("c3.tar"), out.join("c1.tar"));
    let said = ok(&[&"checkpoint", &"export", &ws.upper, &"c3", &t3]);
    assert!(said.contains("3 layers merged"), "{said}");
    let said = ok(&[&"checkpoint", &"export", &ws.upper, &"c1", &t1]);
    assert!(said.contains("1 layer)"), "{said}");
    let e = refused(&[&"checkpoint", &"export", &ws.upper, &"c1", &t1]);
    assert!(e.contains("exists already"), "{e}");
    assert!(
        !fs::read_dir(layer(&ws, "c1").parent().unwrap())
            .unwrap()
            .any(|e| e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".export")),
        "an export left its merged tree in the store"
    );

    // Another host: a fresh workspace over a copy of the shared lower.
    let other = Workspace::new();
    fs::remove_dir(other.lower()).unwrap();
    let cp = Command::new("cp")
        .arg("-a")
        .arg(ws.lower())
        .arg(other.lower())
        .status()
        .unwrap();
    assert!(cp.success());
    assert!(other.mount().unmount());
    assert_eq!(
        ok(&[&"checkpoint", &"import", &other.upper, &t3, &"top"]).trim(),
        "top"
    );
    assert_eq!(
        ok(&[&"checkpoint", &"import", &other.upper, &t1, &"first"]).trim(),
        "first"
    );
    assert_same(
        &links_aside(&at_c3),
        &links_aside(&fork_view(&other, "top", 2)),
        "a fork of the imported c3",
    );
    assert_same(
        &links_aside(&at_c1),
        &links_aside(&fork_view(&other, "first", 3)),
        "a fork of the imported c1",
    );
    // The importing workspace itself is unchanged.
    assert!(is_empty(&other.upper));

    // Refused: an existing name; an archive with a `..` entry (nothing
    // is left in the store).
    let e = refused(&[&"checkpoint", &"import", &other.upper, &t1, &"top"]);
    assert!(e.contains("exists already"), "{e}");
    let bad = out.join("bad.tar");
    sh(
        &out,
        &format!(
            "python3 -c 'import tarfile,io; t=tarfile.open(\"{}\",\"w\"); \
             i=tarfile.TarInfo(\"../escape\"); i.size=2; t.addfile(i, io.BytesIO(b\"x\\n\")); \
             t.close()'",
            bad.display()
        ),
    );
    let e = refused(&[&"checkpoint", &"import", &other.upper, &bad, &"evil"]);
    assert!(
        e.contains("..") && e.contains("nothing was imported"),
        "{e}"
    );
    let store = other.dir.path().join(".upper.layerfs-state").join("layers");
    let left: Vec<String> = fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("evil"))
        .collect();
    assert!(left.is_empty(), "a refused import left {left:?}");
    assert!(!other.dir.path().join("escape").exists());
    let e = refused(&[
        &"fork",
        &other.upper,
        &"evil",
        &"--upper",
        &out.join("u"),
        &out.join("m"),
    ]);
    assert!(e.contains("no checkpoint evil"), "{e}");
}

/// Names in `ws`'s default layer store that end with `suffix`.
fn store_leftovers(ws: &Workspace, suffix: &str) -> Vec<String> {
    let store = ws.dir.path().join(".upper.layerfs-state").join("layers");
    fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(suffix))
        .collect()
}

#[test]
fn diff_of_a_fork_is_against_its_checkpoint_and_with_base_shared_against_the_shared_tree() {
    let ws = Workspace::new();
    shared_tree(ws.lower());
    // (A patch cannot make an empty directory: d2/sub keeps a file.)
    fs::write(ws.lower().join("d/sub/w"), "w\n").unwrap();
    let m = ws.mount();
    sh(
        m.path(),
        "echo more >> a && rm gone && mv d d2 && echo new1 > new1
         mkdir nd && echo f > nd/f && ln -s a link",
    );
    assert!(m.unmount());
    ok(&[&"checkpoint", &ws.upper, &"base"]);
    let f = fork(&ws, "base", 1);
    sh(
        &f.0,
        "echo k2 >> keep/k && echo n1 > n1 && rm new1 && rm -rf o
         mv d2/sub/x x2 && echo again >> a",
    );

    // Against the checkpoint: only what the fork changed.
    let d = ok(&[&"diff", &f.0]);
    let lines: Vec<&str> = d.lines().collect();
    for l in ["M keep/k", "A n1", "D new1", "D o", "M a"] {
        assert!(lines.contains(&l), "no `{l}` in:\n{d}");
    }
    for l in ["D gone", "R d -> d2", "A link", "A nd/ (1 entries)"] {
        assert!(!lines.contains(&l), "a checkpoint's `{l}` in:\n{d}");
    }

    // Against the shared tree: the checkpoint's changes and the fork's.
    let d = ok(&[&"diff", &"--base", &"shared", &f.0]);
    let lines: Vec<&str> = d.lines().collect();
    for l in ["M keep/k", "A n1", "D o", "M a", "D gone", "A link"] {
        assert!(lines.contains(&l), "no `{l}` in:\n{d}");
    }
    assert!(lines.iter().any(|l| l.starts_with("A nd/")), "{d}");
    assert!(!d.contains("new1"), "added then deleted, yet listed:\n{d}");
    let files = ok(&[&"diff", &"--files", &"--base", &"shared", &f.0]);
    assert!(files.lines().any(|l| l == "A nd/f"), "{files}");
    assert!(files.lines().any(|l| l == "D o/y"), "{files}");
    let json = ok(&[&"diff", &"--json", &"--base", &"shared", &f.0]);
    assert!(
        json.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .any(|v| v["path"] == "gone" && v["change"] == "deleted"),
        "{json}"
    );
    let stat = ok(&[&"diff", &"--stat", &"--json", &"--base", &"shared", &f.0]);
    let total: serde_json::Value = serde_json::from_str(stat.lines().last().unwrap()).unwrap();
    let stat_cp = ok(&[&"diff", &"--stat", &"--json", &f.0]);
    let total_cp: serde_json::Value =
        serde_json::from_str(stat_cp.lines().last().unwrap()).unwrap();
    assert!(
        stat.contains("\"path\":\"gone\"") && !stat_cp.contains("\"path\":\"gone\""),
        "{stat}\nagainst the checkpoint: {stat_cp}"
    );
    assert!(
        total["renamed"].as_u64() > total_cp["renamed"].as_u64(),
        "{stat}\nagainst the checkpoint: {stat_cp}"
    );

    // The patch against the shared tree turns a copy of it into the view.
    let patch = ok(&[&"diff", &"--patch", &"--base", &"shared", &f.0]);
    crate::harness::assert_patch_gives(ws.dir.path(), ws.lower(), &patch, &f.0);
    // Nothing of the merged views is left in the store.
    assert_eq!(store_leftovers(&ws, ".diff"), Vec::<String>::new());
    drop(f);
}

#[test]
fn leftovers_of_dead_imports_are_swept_by_import_squash_and_gc_but_not_a_live_one() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("shared"), "shared\n").unwrap();
    let m = ws.mount_with(&["--scratch", "tmp/**"]);
    fs::write(m.p("one"), "1\n").unwrap();
    assert!(m.unmount());
    ok(&[&"checkpoint", &ws.upper, &"c1"]);
    let m = ws.mount_with(&["--scratch", "tmp/**"]);
    fs::write(m.p("two"), "2\n").unwrap();
    assert!(m.unmount());
    ok(&[&"checkpoint", &ws.upper, &"c2"]);
    let tar = ws.dir.path().join("c2.tar");
    ok(&[&"checkpoint", &"export", &ws.upper, &"c2", &tar]);

    let store = ws.dir.path().join(".upper.layerfs-state").join("layers");
    // A process that is gone, and one that runs (as an import would).
    let dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    let _ = { dead }.wait();
    let live = crate::harness::Spawned(
        Command::new("sleep")
            .arg("600")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let live_dir = store.join(format!(".busy.{}.import", live.0.id()));
    fs::create_dir_all(live_dir.join("sub")).unwrap();
    let leave = |label: &str, kind: &str| {
        let d = store.join(format!(".{label}.{dead_pid}.{kind}"));
        fs::create_dir_all(d.join("sub")).unwrap();
        fs::write(d.join("sub/f"), "half\n").unwrap();
        d
    };

    let d = leave("imp", "import");
    ok(&[&"checkpoint", &"import", &ws.upper, &tar, &"again"]);
    assert!(!d.exists(), "import left a dead import's {}", d.display());
    assert!(
        live_dir.exists(),
        "import removed a live import's directory"
    );

    let d = leave("exp", "export");
    ok(&[&"squash", &ws.upper]);
    assert!(!d.exists(), "squash left a dead export's {}", d.display());
    assert!(
        live_dir.exists(),
        "squash removed a live import's directory"
    );

    let d = leave("view0", "diff");
    let out = layerfs(&["gc".as_ref(), ws.upper.as_os_str()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!d.exists(), "gc left a dead diff's {}", d.display());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("{}", d.display())),
        "gc did not name what it removed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(live_dir.exists(), "gc removed a live import's directory");

    drop(live);
    ok(&[&"gc", &ws.upper]);
    assert!(!live_dir.exists(), "a finished import's directory is left");
}

#[test]
fn an_import_over_other_shared_lowers_is_refused_unless_forced_and_old_archives_still_import() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("shared"), "shared\n").unwrap();
    let m = ws.mount();
    fs::write(m.p("mine"), "mine\n").unwrap();
    assert!(m.unmount());
    ok(&[&"checkpoint", &ws.upper, &"c1"]);
    let tar = ws.dir.path().join("c1.tar");
    ok(&[&"checkpoint", &"export", &ws.upper, &"c1", &tar]);

    // A workspace over another shared tree (one more file at its top).
    let other = Workspace::new();
    fs::write(other.lower().join("shared"), "shared\n").unwrap();
    fs::write(other.lower().join("extra"), "extra\n").unwrap();
    assert!(other.mount().unmount());
    let e = refused(&[&"checkpoint", &"import", &other.upper, &tar, &"c1"]);
    assert!(
        e.contains("shared lower #1")
            && e.contains(&ws.lower().display().to_string())
            && e.contains(&other.lower().display().to_string())
            && e.contains("--force")
            && e.contains("nothing was imported"),
        "{e}"
    );
    let store = other.dir.path().join(".upper.layerfs-state").join("layers");
    assert!(!store.join("c1").exists(), "a refused import left c1");
    ok(&[
        &"checkpoint",
        &"import",
        &"--force",
        &other.upper,
        &tar,
        &"c1",
    ]);
    let f = fork(&other, "c1", 1);
    assert_eq!(fs::read_to_string(f.0.join("mine")).unwrap(), "mine\n");
    assert!(f.0.join("extra").exists());
    drop(f);

    // The same tree elsewhere (a copy) is the same shared lower.
    let copy = Workspace::new();
    fs::remove_dir(copy.lower()).unwrap();
    sh(
        ws.dir.path(),
        &format!("cp -a {} {}", ws.lower().display(), copy.lower().display()),
    );
    assert!(copy.mount().unmount());
    ok(&[&"checkpoint", &"import", &copy.upper, &tar, &"c1"]);

    // An archive without the record (an older export: the same tar
    // without its first header and record block) imports anywhere.
    let old = ws.dir.path().join("old.tar");
    sh(
        ws.dir.path(),
        &format!("tail -c +1025 {} > {}", tar.display(), old.display()),
    );
    let listed = sh(ws.dir.path(), &format!("tar tf {}", old.display()));
    assert!(listed.lines().any(|l| l == "mine"), "{listed}");
    ok(&[&"checkpoint", &"import", &other.upper, &old, &"old"]);
    let f = fork(&other, "old", 2);
    assert_eq!(fs::read_to_string(f.0.join("mine")).unwrap(), "mine\n");
    drop(f);
}

/// An import killed after its record is written (before its layer is in
/// place) leaves no checkpoint and no name taken once the workspace's next
/// checkpoint has run; one killed after the layer is in place is whole.
#[test]
fn an_import_killed_at_any_step_leaves_the_checkpoint_whole_or_its_name_free() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("shared"), "shared\n").unwrap();
    let m = ws.mount();
    fs::write(m.p("mine"), "mine\n").unwrap();
    assert!(m.unmount());
    ok(&[&"checkpoint", &ws.upper, &"c1"]);
    let tar = ws.dir.path().join("c1.tar");
    ok(&[&"checkpoint", &"export", &ws.upper, &"c1", &tar]);

    crash_at(
        "import",
        "record",
        &[&"checkpoint", &"import", &ws.upper, &tar, &"imp"],
    );
    // The next checkpoint settles what the kill left: the name is free.
    ok(&[&"checkpoint", &ws.upper, &"c2"]);
    assert_eq!(
        ok(&[&"checkpoint", &"import", &ws.upper, &tar, &"imp"]).trim(),
        "imp"
    );
    let f = fork(&ws, "imp", 1);
    assert_eq!(fs::read_to_string(f.0.join("mine")).unwrap(), "mine\n");
    drop(f);

    crash_at(
        "import",
        "layer",
        &[&"checkpoint", &"import", &ws.upper, &tar, &"imp2"],
    );
    // The next checkpoint publishes the whole layer: the name is taken.
    ok(&[&"checkpoint", &ws.upper, &"c3"]);
    let e = refused(&[&"checkpoint", &"import", &ws.upper, &tar, &"imp2"]);
    assert!(e.contains("imp2"), "{e}");
    let f = fork(&ws, "imp2", 2);
    assert_eq!(fs::read_to_string(f.0.join("mine")).unwrap(), "mine\n");
    drop(f);
}

#[test]
fn diff_with_base_shared_finds_moves_made_before_the_checkpoint_and_after_it_in_the_fork() {
    let ws = Workspace::new();
    let l = ws.lower();
    for n in ["f1", "f2", "f3", "f4", "f5"] {
        fs::write(l.join(n), format!("{n}\n")).unwrap();
    }
    fs::create_dir(l.join("dir")).unwrap();
    let m = ws.mount();
    // Moves in the workspace the checkpoint freezes: f1 moved and left
    // alone after; f2 moved, then moved on in the fork; f3 moved, then
    // changed in the shared tree (drift); f4 moved into a directory the
    // fork later writes into (its upper copy of `dir` has no mark of its
    // own).
    sh(
        m.path(),
        "mv f1 g1 && mv f2 g2 && mv f3 g3 && mv f4 dir/g4 && echo more >> g1",
    );
    assert!(m.unmount());
    ok(&[&"checkpoint", &ws.upper, &"base"]);
    let f = fork(&ws, "base", 1);
    sh(&f.0, "mv g2 h2 && echo n > dir/new && mv f5 h5");
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::write(l.join("f3"), "changed in the shared tree\n").unwrap();

    let d = ok(&[&"diff", &"--base", &"shared", &f.0]);
    let lines: Vec<&str> = d.lines().collect();
    for want in [
        "R f1 -> g1",
        "R f2 -> h2",
        "R f4 -> dir/g4",
        "R f5 -> h5",
        "A dir/new",
    ] {
        assert!(lines.contains(&want), "no `{want}` in:\n{d}");
    }
    for gone in ["f1", "f2", "f4", "f5"] {
        assert!(
            !lines.contains(&format!("D {gone}").as_str()),
            "{gone} listed as deleted:\n{d}"
        );
    }
    let json = ok(&[&"diff", &"--json", &"--base", &"shared", &f.0]);
    let rows: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let row = |p: &str| {
        rows.iter()
            .find(|v| v["path"] == p)
            .unwrap_or_else(|| panic!("no {p} in:\n{json}"))
            .clone()
    };
    let g3 = row("g3");
    assert_eq!(g3["change"], "renamed", "{json}");
    assert_eq!(g3["from"], "f3", "{json}");
    assert_eq!(
        g3["conflict"], true,
        "a drifted original not marked:\n{json}"
    );
    assert_eq!(row("h2")["conflict"], false, "{json}");
    assert_eq!(row("g1")["from"], "f1", "{json}");

    // Against the checkpoint, the fork's own move of a checkpoint file.
    let d = ok(&[&"diff", &f.0]);
    let lines: Vec<&str> = d.lines().collect();
    assert!(lines.contains(&"R g2 -> h2"), "{d}");
    assert!(lines.contains(&"R f5 -> h5"), "{d}");
    // The patch against the shared tree still turns a copy of it into
    // the view.
    let patch = ok(&[&"diff", &"--patch", &"--base", &"shared", &f.0]);
    crate::harness::assert_patch_gives(ws.dir.path(), ws.lower(), &patch, &f.0);
    drop(f);
}
