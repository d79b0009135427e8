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
