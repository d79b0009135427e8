//! `layerfs fs` (the agent file tools, `tools::Workspace`) through both of
//! its places: an unmounted workspace (the core in-process, no FUSE), and
//! beside a live mount of the same workspace (every call through the
//! mount). Policy denials name the rule; `..` and symlinks never lead out.

use std::fs;
use std::path::Path;
use std::process::Output;

use crate::harness::{layerfs, policy_file, Workspace};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `layerfs fs VERB` on the layers of `ws` given as options.
fn by_layers(ws: &Workspace, verb: &str, extra: &[&str]) -> Output {
    let mut args: Vec<String> = vec!["fs".into(), verb.into()];
    for l in &ws.lowers {
        args.push("--lower".into());
        args.push(l.to_string_lossy().into());
    }
    args.push("--upper".into());
    args.push(ws.upper.to_string_lossy().into());
    args.extend(extra.iter().map(|s| s.to_string()));
    layerfs(&args)
}

/// `layerfs fs VERB WORKSPACE ARGS…`.
fn by_name(verb: &str, workspace: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<String> = vec!["fs".into(), verb.into()];
    args.push(workspace.to_string_lossy().into());
    args.extend(extra.iter().map(|s| s.to_string()));
    layerfs(&args)
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed: {}\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stdout)
}

/// Fails with status 1 and a message holding every one of `wants`.
fn refused(o: &Output, wants: &[&str]) {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    for w in wants {
        assert!(err.contains(w), "{w:?} not in: {err}");
    }
}

fn populate(ws: &Workspace) {
    fs::write(ws.lower().join("a.txt"), "alpha\nbeta\nalpha\n").unwrap();
    fs::create_dir(ws.lower().join("src")).unwrap();
    fs::write(ws.lower().join("src/main.rs"), "fn main() {}\n").unwrap();
}

#[test]
fn fs_verbs_work_on_an_unmounted_workspace() {
    let ws = Workspace::new();
    populate(&ws);
    ok(&by_layers(&ws, "write", &["new.txt", "hello\n"]));
    assert_eq!(
        fs::read_to_string(ws.upper.join("new.txt")).unwrap(),
        "hello\n"
    );
    // Create-only: the existing file is named, and left as it was.
    refused(
        &by_layers(&ws, "write", &["new.txt", "other"]),
        &["new.txt", "already exists"],
    );
    ok(&by_layers(
        &ws,
        "write",
        &["--overwrite", "new.txt", "again\n"],
    ));
    assert_eq!(
        fs::read_to_string(ws.upper.join("new.txt")).unwrap(),
        "again\n"
    );

    let cat = ok(&by_layers(&ws, "cat", &["-n", "a.txt"]));
    assert_eq!(cat, "     1\talpha\n     2\tbeta\n     3\talpha\n");
    refused(
        &by_layers(&ws, "edit", &["a.txt", "alpha", "x"]),
        &["a.txt", "2 times"],
    );
    refused(
        &by_layers(&ws, "edit", &["a.txt", "zzz", "x"]),
        &["a.txt", "0 matches"],
    );
    ok(&by_layers(&ws, "edit", &["a.txt", "beta", "delta"]));
    assert_eq!(
        fs::read_to_string(ws.upper.join("a.txt")).unwrap(),
        "alpha\ndelta\nalpha\n"
    );
    assert_eq!(
        fs::read_to_string(ws.lower().join("a.txt")).unwrap(),
        "alpha\nbeta\nalpha\n",
        "the lower is never changed"
    );

    let grep: serde_json::Value =
        serde_json::from_str(&ok(&by_layers(&ws, "grep", &["--json", "alpha"]))).unwrap();
    let lines: Vec<(String, u64)> = grep["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["path"].as_str().unwrap().into(),
                m["line"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(lines, [("a.txt".to_string(), 1), ("a.txt".to_string(), 3)]);
    assert_eq!(ok(&by_layers(&ws, "glob", &["**/*.rs"])), "src/main.rs\n");

    ok(&by_layers(&ws, "mv", &["new.txt", "src/moved.txt"]));
    ok(&by_layers(&ws, "rm", &["src/main.rs"]));
    let ls: serde_json::Value =
        serde_json::from_str(&ok(&by_layers(&ws, "ls", &["--json", "src"]))).unwrap();
    let names: Vec<&str> = ls
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["src/moved.txt"]);
    assert!(ws.lower().join("src/main.rs").exists());

    // The journal says which tool of which client made each change.
    let log = ok(&layerfs(&["log".as_ref(), ws.upper.as_os_str()]));
    assert!(log.contains("(fs:edit)"), "{log}");
    assert!(log.contains("(fs:write)"), "{log}");
    // Named by its upper alone, the workspace opens the same way.
    assert_eq!(
        ok(&by_name("cat", &ws.upper, &["src/moved.txt"])),
        "again\n"
    );
}

#[test]
fn paths_outside_the_workspace_are_refused_before_anything_is_touched() {
    let ws = Workspace::new();
    populate(&ws);
    std::os::unix::fs::symlink("/", ws.lower().join("root")).unwrap();
    let outside = ws.dir.path().join("escape");
    for p in ["../escape", "a/../../escape", "/../escape"] {
        refused(&by_layers(&ws, "write", &[p, "x"]), &["`..` is refused"]);
    }
    assert!(!outside.exists());
    // A symlink is never followed, in the middle of a path or at its end.
    refused(
        &by_layers(&ws, "cat", &["root/etc/hostname"]),
        &["root/etc/hostname", "symlink"],
    );
    refused(&by_layers(&ws, "write", &["root/tmp/x", "x"]), &["symlink"]);
    refused(&by_layers(&ws, "cat", &["root"]), &["symlink"]);
    // Nothing was copied up or created on the way.
    assert_eq!(fs::read_dir(&ws.upper).unwrap().count(), 0);
}

#[test]
fn policy_denials_name_the_rule_unmounted_and_mounted() {
    let ws = Workspace::new();
    populate(&ws);
    let pol = policy_file(&ws, "readonly src/**\nhide secret.txt\n");
    fs::write(ws.lower().join("secret.txt"), "s3cret\n").unwrap();
    let pol_s = pol.to_str().unwrap();
    let denied = by_layers(
        &ws,
        "edit",
        &["--policy", pol_s, "src/main.rs", "main", "start"],
    );
    refused(&denied, &["src/main.rs", "line 1: `readonly src/**`"]);
    refused(
        &by_layers(&ws, "write", &["--policy", pol_s, "src/new.rs", "x"]),
        &["src/new.rs", "readonly src/**"],
    );
    // Hidden paths are not there for the tools.
    refused(
        &by_layers(&ws, "cat", &["--policy", pol_s, "secret.txt"]),
        &["no such file"],
    );
    let grep = by_layers(&ws, "grep", &["--policy", pol_s, "s3cret"]);
    assert_eq!(ok(&grep), "");
    assert!(!ws.upper.join("src").exists());

    // The same through a live mount with that policy.
    let m = ws.mount_with(&["--policy", pol_s]);
    refused(
        &by_name("write", &m.path, &["src/new.rs", "x"]),
        &["src/new.rs", "readonly src/**"],
    );
    refused(&by_name("cat", &m.path, &["secret.txt"]), &["no such file"]);
    assert!(!m.p("src/new.rs").exists());
    drop(m);
}

#[test]
fn beside_a_live_mount_changes_either_way_are_seen_at_once() {
    let ws = Workspace::new();
    populate(&ws);
    let m = ws.mount();
    // By the mountpoint, by the upper (its daemon's mount is found), and
    // by the layers (the upper's lock names the daemon): all attach.
    ok(&by_name("write", &m.path, &["one.txt", "1\n"]));
    assert_eq!(fs::read_to_string(m.p("one.txt")).unwrap(), "1\n");
    ok(&by_name("write", &ws.upper, &["two.txt", "2\n"]));
    assert_eq!(fs::read_to_string(m.p("two.txt")).unwrap(), "2\n");
    ok(&by_layers(&ws, "edit", &["a.txt", "beta", "gamma"]));
    assert_eq!(
        fs::read_to_string(m.p("a.txt")).unwrap(),
        "alpha\ngamma\nalpha\n"
    );
    // And what the mount changes, the tools see.
    fs::write(m.p("three.txt"), "3\n").unwrap();
    fs::remove_file(m.p("src/main.rs")).unwrap();
    assert_eq!(ok(&by_name("cat", &m.path, &["three.txt"])), "3\n");
    refused(&by_layers(&ws, "cat", &["src/main.rs"]), &["no such file"]);
    assert!(m.unmount());
    assert_eq!(fs::read_to_string(ws.upper.join("two.txt")).unwrap(), "2\n");
}

#[test]
fn unmounted_use_needs_no_dev_fuse() {
    let ws = Workspace::new();
    populate(&ws);
    // /dev hidden behind an empty tmpfs in a private mount namespace.
    let script = format!(
        "mount -t tmpfs none /dev && ! test -e /dev/fuse && {} fs write --lower {} --upper {} \
         made.txt ok && {} fs cat --lower {} --upper {} made.txt",
        crate::harness::bin().display(),
        ws.lower().display(),
        ws.upper.display(),
        crate::harness::bin().display(),
        ws.lower().display(),
        ws.upper.display(),
    );
    let o = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(ok(&o), "ok");
    assert_eq!(fs::read_to_string(ws.upper.join("made.txt")).unwrap(), "ok");
}

/// The state operations of the library (`Workspace::diff`, `log`,
/// `reset`, `snapshot_*`, `checkpoint*`, `undo`) on `lib`, a workspace
/// whose lower holds a.txt and src/main.rs and whose policy makes src/**
/// read-only; `view` reads a path as the workspace shows it.
fn state_operations(lib: &layerfs::Workspace, view: &dyn Fn(&str) -> Option<String>) {
    use layerfs::tools::{
        ChangeKind, DiffRequest, EditRequest, LogRequest, ResetRequest, What, WriteRequest,
    };
    let write = |p: &str, c: &str| {
        lib.write(&WriteRequest {
            path: p.into(),
            content: c.into(),
            overwrite: true,
        })
        .unwrap();
    };
    lib.edit(&EditRequest {
        path: "a.txt".into(),
        old_string: "beta".into(),
        new_string: "gamma".into(),
        replace_all: false,
    })
    .unwrap();
    write("new.txt", "new\n");

    // diff: typed entries, with patches on request, limited to paths.
    let d = lib.diff(&DiffRequest::default()).unwrap();
    let kinds: Vec<_> = d
        .changes
        .iter()
        .map(|c| (c.path.as_str(), c.kind))
        .collect();
    assert_eq!(
        kinds,
        [("a.txt", ChangeKind::M), ("new.txt", ChangeKind::A)]
    );
    assert!(d.changes.iter().all(|c| c.patch.is_none() && !c.conflict));
    let d = lib
        .diff(&DiffRequest {
            paths: vec!["/a.txt".into()],
            patch: true,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(d.changes.len(), 1);
    let p = d.changes[0].patch.as_deref().unwrap();
    assert!(p.contains("-beta") && p.contains("+gamma"), "{p}");
    assert!(lib
        .diff(&DiffRequest {
            paths: vec!["../x".into()],
            ..Default::default()
        })
        .is_err());

    // reset: a path, refused on a read-only path with the rule.
    let e = lib
        .reset(&ResetRequest {
            paths: vec!["src/main.rs".into()],
            all: false,
        })
        .unwrap_err();
    assert!(
        matches!(&e.what, What::Denied { rule: Some(r), .. } if r.contains("readonly src/**")),
        "{e}"
    );
    let e = lib.reset(&ResetRequest::default()).unwrap_err();
    assert!(e.to_string().contains("pass all"), "{e}");
    let r = lib
        .reset(&ResetRequest {
            paths: vec!["new.txt".into()],
            all: false,
        })
        .unwrap();
    assert_eq!(r.reset, ["new.txt"]);
    assert_eq!(view("new.txt"), None);
    assert_eq!(view("a.txt").unwrap(), "alpha\ngamma\nalpha\n");

    // Snapshots: save, change, restore, list; an unknown one is refused.
    let saved = lib.snapshot_save(Some("s1"), false).unwrap();
    assert_eq!(saved.id, "s1");
    write("a.txt", "changed\n");
    let e = lib.snapshot_restore("nope").unwrap_err();
    assert!(e.to_string().contains("no snapshot `nope`"), "{e}");
    let e = lib.snapshot_save(Some("s1"), false).unwrap_err();
    assert!(e.to_string().contains("s1"), "{e}");
    lib.snapshot_restore("s1").unwrap();
    assert_eq!(view("a.txt").unwrap(), "alpha\ngamma\nalpha\n");
    assert_eq!(lib.snapshot_list().unwrap(), [saved]);

    // Checkpoint and undo: back to the checkpoint, then past it.
    assert_eq!(lib.checkpoint(Some("c1")).unwrap(), "c1");
    write("later.txt", "later\n");
    assert_eq!(view("later.txt").unwrap(), "later\n");
    let u = lib.undo(None).unwrap();
    assert_eq!((u.at.as_str(), u.dropped), ("c1", 0));
    assert_eq!(view("later.txt"), None);
    assert_eq!(view("a.txt").unwrap(), "alpha\ngamma\nalpha\n");
    let names: Vec<_> = lib
        .checkpoint_list()
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["c1"]);
    // The diff of a checkpointed workspace is against the checkpoint.
    assert!(lib
        .diff(&DiffRequest::default())
        .unwrap()
        .changes
        .is_empty());
    let e = lib.undo(Some("nothing")).unwrap_err();
    assert!(e.to_string().contains("no checkpoint nothing"), "{e}");

    // log: every operation above left its row, naming the tool.
    let rows = lib.log(&LogRequest::default()).unwrap();
    let ops: Vec<_> = rows.iter().map(|r| r.op.as_str()).collect();
    for op in [
        "reset",
        "snapshot-save",
        "snapshot-restore",
        "checkpoint",
        "undo",
    ] {
        assert!(ops.contains(&op), "{op} not in {ops:?}");
    }
    let resets = lib
        .log(&LogRequest {
            op: Some("reset".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(resets.len(), 1);
    assert_eq!(resets[0].comm.as_deref(), Some("t:reset"));
    assert_eq!(resets[0].path, "new.txt");
    let last = lib
        .log(&LogRequest {
            limit: Some(1),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(last.len(), 1);
    assert!(lib
        .log(&LogRequest {
            op: Some("frobnicate".into()),
            ..Default::default()
        })
        .unwrap_err()
        .to_string()
        .contains("unknown journal op"));
}

fn lib_open(arg: &Path, read_only: bool) -> layerfs::Workspace {
    let opts = layerfs::tools::OpenOptions {
        read_only,
        client: Some("t".into()),
        ..Default::default()
    };
    layerfs::Workspace::open(arg, &opts).unwrap()
}

#[test]
fn library_state_operations_on_an_unmounted_workspace() {
    let ws = Workspace::new();
    populate(&ws);
    let policy = policy_file(&ws, "readonly src/**\n");
    let mut layers = layerfs::tools::Layers::new(ws.lowers.clone(), ws.upper.clone());
    layers.policy = Some(policy);
    let opts = layerfs::tools::OpenOptions {
        client: Some("t".into()),
        ..Default::default()
    };
    let lib = layerfs::Workspace::open_layers(&layers, &opts).unwrap();
    assert!(lib.mountpoint().is_none());
    let read = |p: &str| {
        lib.read_raw(p, 0, None)
            .ok()
            .map(|b| String::from_utf8(b).unwrap())
    };
    state_operations(&lib, &read);
    // The core is the workspace's after the checkpoint: a mount of it
    // is refused while the library holds it, and sees the same tree after.
    assert!(ws.try_mount_with(&[]).is_err());
    drop(lib);
    let m = ws.mount();
    assert_eq!(
        fs::read_to_string(m.p("a.txt")).unwrap(),
        "alpha\ngamma\nalpha\n"
    );
    assert!(!m.p("later.txt").exists());
}

#[test]
fn library_state_operations_beside_a_live_mount() {
    let ws = Workspace::new();
    populate(&ws);
    let policy = policy_file(&ws, "readonly src/**\n");
    let m = ws.mount_with(&["--policy", &policy.to_string_lossy()]);
    let lib = lib_open(&m.path, false);
    assert_eq!(lib.mountpoint(), Some(m.path.as_path()));
    let read = |p: &str| fs::read_to_string(m.p(p)).ok();
    state_operations(&lib, &read);
    // The daemon did them: its mount shows the result at once.
    assert!(!m.p("later.txt").exists());
    drop(lib);
    assert!(m.unmount());
}

#[test]
fn library_read_raw_takes_byte_offsets_and_read_only_refuses_state_changes() {
    let ws = Workspace::new();
    populate(&ws);
    fs::write(ws.lower().join("bin.dat"), [0u8, 1, 2, 255, 254, 0, 7]).unwrap();
    let layers = layerfs::tools::Layers::new(ws.lowers.clone(), ws.upper.clone());
    let lib = layerfs::Workspace::open_layers(&layers, &Default::default()).unwrap();
    assert_eq!(
        lib.read_raw("bin.dat", 0, None).unwrap(),
        [0, 1, 2, 255, 254, 0, 7]
    );
    assert_eq!(lib.read_raw("bin.dat", 3, Some(2)).unwrap(), [255, 254]);
    assert_eq!(lib.read_raw("bin.dat", 6, Some(100)).unwrap(), [7]);
    assert!(lib.read_raw("bin.dat", 99, None).unwrap().is_empty());
    assert!(lib.read_raw("src", 0, None).is_err());
    drop(lib);
    let ro = lib_open(&ws.upper, true);
    use layerfs::tools::{ResetRequest, What};
    for e in [
        ro.reset(&ResetRequest {
            paths: vec![],
            all: true,
        })
        .unwrap_err(),
        ro.snapshot_save(None, false).unwrap_err(),
        ro.snapshot_restore("x").unwrap_err(),
        ro.checkpoint(None).unwrap_err(),
        ro.undo(None).unwrap_err(),
    ] {
        assert_eq!(e.what, What::ReadOnly, "{e}");
    }
    // Reading the state is no change.
    assert!(ro.snapshot_list().unwrap().is_empty());
    assert!(ro.checkpoint_list().unwrap().is_empty());
    assert!(ro.diff(&Default::default()).unwrap().changes.is_empty());
}

/// A workspace with checkpoint `base` (holding base.txt and an edit of
/// a.txt over the shared tree) and a mounted fork of it that adds
/// fork.txt: what `diff` shows of the fork against each base.
pub(crate) fn forked_workspace() -> (Workspace, crate::checkpoint::Fork) {
    let ws = Workspace::new();
    populate(&ws);
    let m = ws.mount();
    fs::write(m.p("base.txt"), "base\n").unwrap();
    fs::write(m.p("a.txt"), "alpha\n").unwrap();
    assert!(m.unmount());
    ok(&layerfs(&[
        "checkpoint".as_ref(),
        ws.upper.as_os_str(),
        "base".as_ref(),
    ]));
    let f = crate::checkpoint::fork(&ws, "base", 1);
    fs::write(f.0.join("fork.txt"), "fork\n").unwrap();
    (ws, f)
}

#[test]
fn library_diff_of_a_fork_is_against_its_checkpoint_or_with_base_shared_the_shared_tree() {
    use layerfs::tools::{ChangeKind, DiffBase, DiffRequest};
    let (ws, f) = forked_workspace();
    let kinds = |lib: &layerfs::Workspace, base: DiffBase| -> Vec<(String, ChangeKind)> {
        lib.diff(&DiffRequest {
            base,
            ..Default::default()
        })
        .unwrap()
        .changes
        .into_iter()
        .map(|c| (c.path, c.kind))
        .collect()
    };
    let since = [("fork.txt".to_string(), ChangeKind::A)];
    let shared = [
        ("a.txt".to_string(), ChangeKind::M),
        ("base.txt".to_string(), ChangeKind::A),
        ("fork.txt".to_string(), ChangeKind::A),
    ];
    // Beside the live fork, and on it unmounted (the core in-process).
    let lib = lib_open(&f.0, false);
    assert_eq!(kinds(&lib, DiffBase::Checkpoint), since);
    assert_eq!(kinds(&lib, DiffBase::Shared), shared);
    let d = lib
        .diff(&DiffRequest {
            paths: vec!["a.txt".into()],
            patch: true,
            base: DiffBase::Shared,
        })
        .unwrap();
    let p = d.changes[0].patch.as_deref().unwrap();
    assert!(p.contains("-beta") && !p.contains("+beta"), "{p}");
    drop(lib);
    let upper = f.0.parent().unwrap().join("upper");
    drop(f);
    let lib = lib_open(&upper, false);
    assert_eq!(kinds(&lib, DiffBase::Checkpoint), since);
    assert_eq!(kinds(&lib, DiffBase::Shared), shared);
    // The checkpoint's own workspace is untouched by either.
    let base = lib_open(&ws.upper, true);
    assert!(kinds(&base, DiffBase::Checkpoint).is_empty());
}
