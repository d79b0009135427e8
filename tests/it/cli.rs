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
