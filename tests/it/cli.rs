//! The command line's one exit path (`src/cli/exit.rs`): every subcommand
//! ends through it, so each prints `layerfs CMD: message` on stderr, nothing
//! on stdout, and exits 2 for a wrong command line and 1 for a failure.

use crate::harness::{layerfs_quiet, Workspace};

/// Runs `args`; checks the status and that stderr is the one error line
/// `layerfs CMD: …` containing `says`.
fn expect(args: &[&str], code: i32, cmd: &str, says: &str) {
    let out = layerfs_quiet(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?} printed on stdout");
    let line = err.trim_end();
    assert!(!line.contains('\n'), "{args:?}: one line expected: {err}");
    let prefix = format!("layerfs {cmd}: ");
    assert!(line.starts_with(&prefix), "{args:?}: {err}");
    assert!(line.contains(says), "{args:?}: {err} lacks {says:?}");
}

#[test]
fn usage_errors_exit_2_and_failures_exit_1_with_the_command_named() {
    let ws = Workspace::new();
    let missing = ws.dir.path().join("missing");
    let missing = missing.to_str().unwrap();
    let policy = ws.dir.path().join("policy.txt");
    std::fs::write(&policy, "hide **/.env\n").unwrap();
    let policy = policy.to_str().unwrap();

    // Wrong command lines: exit 2.
    expect(&["checkpoint"], 2, "checkpoint", "give WORKSPACE [NAME]");
    expect(
        &["policy", "explain", policy, "../x"],
        2,
        "policy explain",
        "`..` is not allowed",
    );
    expect(&["fs", "cat"], 2, "fs cat", "give a WORKSPACE");
    expect(
        &["mount", "--upper", missing, missing],
        2,
        "mount",
        "no lower layer",
    );
    let upper = ws.upper.to_str().unwrap();
    expect(
        &["serve", "--mcp", "--listen", "tcp:1", "--upper", upper],
        2,
        "serve",
        "--listen takes unix:PATH",
    );

    // Failures: exit 1, the path named.
    for cmd in ["diff", "log", "status", "undo", "gc"] {
        expect(&[cmd, missing], 1, cmd, missing);
    }
    expect(&["reset", missing, "a"], 1, "reset", missing);
    expect(&["snapshot", "list", missing], 1, "snapshot list", missing);
    expect(&["policy", "check", missing], 1, "policy check", missing);
    // A manual page directory beneath a file cannot be made.
    let under_file = format!("{policy}/man");
    expect(&["man", &under_file], 1, "man", &under_file);
}

/// `layerfs ARGS` with the default log filter (no RUST_LOG), as a user
/// runs it, and extra environment.
fn layerfs_as_user(args: &[&str], env: &[(&str, &std::path::Path)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(crate::harness::bin());
    cmd.args(args).env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(std::process::Stdio::null())
        .output()
        .expect("run layerfs")
}

/// What people hit first: a `mount` missing several parts names them all
/// in one line; an upper planned inside a lower is refused as such, not
/// answered with `mkdir -p` inside the lower; clap's own usage errors
/// carry the same `layerfs CMD: ` prefix, and `run` without a place for
/// its changes names `--ephemeral`.
#[test]
fn usage_errors_name_everything_missing_and_the_way_out() {
    let ws = Workspace::new();
    let out = layerfs_quiet(&["mount"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    for part in [
        "layerfs mount: ",
        "no lower layer",
        "no upper layer",
        "no mountpoint",
    ] {
        assert!(err.contains(part), "{err} lacks {part:?}");
    }
    let lower = ws.lower().to_str().unwrap();
    let upper = ws.lower().join("not/yet/upper");
    let mnt = ws.mnt.to_str().unwrap();
    let args = [
        "mount",
        "--lower",
        lower,
        "--upper",
        upper.to_str().unwrap(),
        mnt,
    ];
    expect(&args, 1, "mount", "the upper must be outside every lower");
    let out = layerfs_quiet(&args);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("mkdir"));
    assert!(!ws.lower().join("not").exists());

    for (args, prefix, says) in [
        (
            &["run", "--lower", lower, "--", "true"][..],
            "layerfs run: ",
            "--ephemeral",
        ),
        (
            &["snapshot", "save"][..],
            "layerfs snapshot save: ",
            "<WORKSPACE>",
        ),
        (&["no-such-command"][..], "layerfs: ", "no-such-command"),
    ] {
        let out = layerfs_quiet(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with(prefix), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err} lacks {says:?}");
        assert!(!err.contains("error:"), "{args:?}: {err}");
    }
}

/// `--instance` mounts and `layerfs run` say nothing on the terminal
/// unless something is wrong: no `INFO` lines by default (the daemon's
/// log keeps them).
#[test]
fn instance_mounts_and_run_print_no_info_lines() {
    let ws = Workspace::new();
    std::fs::write(ws.lower().join("f"), "shared\n").unwrap();
    let roots = ws.dir.path();
    let (upper_root, mount_root) = (roots.join("uroot"), roots.join("mroot"));
    let out = layerfs_as_user(
        &[
            "mount",
            "--instance",
            "alice",
            "--upper-root",
            upper_root.to_str().unwrap(),
            "--mount-root",
            mount_root.to_str().unwrap(),
            "--lower",
            ws.lower().to_str().unwrap(),
        ],
        &[],
    );
    let mnt = mount_root.join("alice/mnt");
    let mounted = crate::harness::is_mounted(&mnt);
    let content = std::fs::read_to_string(mnt.join("f")).unwrap_or_default();
    if mounted {
        let u = layerfs_quiet(&["umount", mnt.to_str().unwrap()]);
        assert!(u.status.success(), "umount: {u:?}");
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && mounted, "mount --instance: {err}");
    assert_eq!(content, "shared\n");
    assert!(err.is_empty(), "mount --instance printed: {err}");

    // A run dir a killed run left behind is swept without a word.
    let tmp = roots.join("tmp");
    let left = tmp.join("layerfs-run.dead");
    std::fs::create_dir_all(&left).unwrap();
    std::fs::write(left.join("owner"), "999999999 1\n").unwrap();
    let out = layerfs_as_user(
        &[
            "run",
            "--lower",
            ws.lower().to_str().unwrap(),
            "--ephemeral",
            "--",
            "cat",
            "f",
        ],
        &[("TMPDIR", &tmp)],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "run: {err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "shared\n");
    assert!(!left.exists(), "the stale run dir was not swept");
    assert!(!err.contains("INFO"), "run printed: {err}");
}
