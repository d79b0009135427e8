//! `layerfs serve --mcp` driven by a real MCP client, the official Python
//! SDK (tests/mcp_client.py; `.ci/run` installs it in target/mcp-venv):
//! every tool and the error cases on an unmounted workspace and beside a
//! live mount, read-only mode, the tool allow list, and the one-core
//! invariant (a mount is refused while the server holds the workspace).

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use crate::harness::{bin, layerfs, policy_file, Workspace};

/// The venv's python with the `mcp` SDK (LAYERFS_TEST_PYTHON overrides).
fn python() -> PathBuf {
    let p = std::env::var_os("LAYERFS_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/mcp-venv/bin/python")
        });
    assert!(
        p.exists(),
        "{} is missing: run .ci/run (python3 -m venv target/mcp-venv && \
         target/mcp-venv/bin/pip install mcp)",
        p.display()
    );
    p
}

fn client(mode: &str, expect: &[&str], serve: &[String]) -> Output {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let mut cmd = Command::new(python());
    cmd.arg(script).arg(mode);
    for e in expect {
        cmd.arg("--expect").arg(e);
    }
    cmd.arg("--")
        .arg(bin())
        .arg("serve")
        .arg("--mcp")
        .args(serve);
    cmd.stdin(Stdio::null())
        .output()
        .expect("run the MCP client")
}

fn passed(o: &Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success() && out.ends_with("OK\n"),
        "client failed ({}):\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

fn populate(ws: &Workspace) -> String {
    fs::write(ws.lower().join("a.txt"), "alpha\nbeta\nalpha\n").unwrap();
    fs::create_dir(ws.lower().join("src")).unwrap();
    fs::write(ws.lower().join("src/main.rs"), "fn main() {}\n").unwrap();
    let bytes: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
    fs::write(ws.lower().join("bin.dat"), bytes).unwrap();
    policy_file(ws, "readonly src/**\n")
        .to_string_lossy()
        .into_owned()
}

fn layer_args(ws: &Workspace, policy: &str) -> Vec<String> {
    let mut v = Vec::new();
    for l in &ws.lowers {
        v.push("--lower".to_string());
        v.push(l.to_string_lossy().into_owned());
    }
    v.extend([
        "--upper".to_string(),
        ws.upper.to_string_lossy().into_owned(),
        "--policy".to_string(),
        policy.to_string(),
    ]);
    v
}

#[test]
fn a_real_mcp_client_calls_every_tool_on_an_unmounted_workspace() {
    let ws = Workspace::new();
    let policy = populate(&ws);
    passed(&client("full", &[], &layer_args(&ws, &policy)));
    assert_eq!(
        fs::read_to_string(ws.upper.join("a.txt")).unwrap(),
        "omega\ngamma\nomega\n"
    );
    assert_eq!(
        fs::read_to_string(ws.upper.join("kept.txt")).unwrap(),
        "kept\n"
    );
    assert_eq!(
        fs::read_to_string(ws.lower().join("a.txt")).unwrap(),
        "alpha\nbeta\nalpha\n"
    );
    assert!(!ws.dir.path().join("escape.txt").exists());
    assert!(
        !ws.upper.join("src").exists(),
        "the denied writes left nothing"
    );
    let log = layerfs(&["log".as_ref(), ws.upper.as_os_str()]);
    let log = String::from_utf8_lossy(&log.stdout);
    assert!(log.contains("(mcp:edit)"), "{log}");
    assert!(log.contains("readonly src/**"), "{log}");
}

#[test]
fn a_real_mcp_client_beside_a_live_mount_sees_and_is_seen_at_once() {
    let ws = Workspace::new();
    let policy = populate(&ws);
    let m = ws.mount_with(&["--policy", &policy]);
    fs::write(m.p("from-mount.txt"), "hello").unwrap();
    let serve = [m.path.to_string_lossy().into_owned()];
    passed(&client("full", &["from-mount.txt=hello"], &serve));
    // What the client changed is in the mount (and from there the upper).
    assert_eq!(fs::read_to_string(m.p("kept.txt")).unwrap(), "kept\n");
    assert_eq!(
        fs::read_to_string(m.p("a.txt")).unwrap(),
        "omega\ngamma\nomega\n"
    );
    assert!(!m.p("src/evil.rs").exists());
    assert!(m.unmount());
    assert_eq!(
        fs::read_to_string(ws.upper.join("kept.txt")).unwrap(),
        "kept\n"
    );
}

/// The state tools (diff, log, reset, snapshot_*, checkpoint*, undo) and
/// raw reads through the real client (tests/mcp_client.py state) on an
/// unmounted workspace: the server's in-process core is lent to each
/// changing one and taken back.
#[test]
fn a_real_mcp_client_calls_the_state_tools_on_an_unmounted_workspace() {
    let ws = Workspace::new();
    let policy = populate(&ws);
    passed(&client("state", &[], &layer_args(&ws, &policy)));
    // What the session left: at checkpoint c1, which holds the restored
    // edit; the upper above it is empty.
    assert_eq!(fs::read_dir(&ws.upper).unwrap().count(), 0);
    let cps = layerfs(&["checkpoint".as_ref(), "list".as_ref(), ws.upper.as_os_str()]);
    assert!(String::from_utf8_lossy(&cps.stdout).contains("c1"));
    let m = ws.mount_with(&["--policy", &policy]);
    assert_eq!(
        fs::read_to_string(m.p("a.txt")).unwrap(),
        "alpha\ngamma\nalpha\n"
    );
    assert!(!m.p("new.txt").exists() && !m.p("later.txt").exists());
    assert!(m.unmount());
}

/// The same beside a live mount: the daemon does the changing ones
/// through its control socket, and its mount shows them at once.
#[test]
fn a_real_mcp_client_calls_the_state_tools_beside_a_live_mount() {
    let ws = Workspace::new();
    let policy = populate(&ws);
    let m = ws.mount_with(&["--policy", &policy]);
    let serve = [m.path.to_string_lossy().into_owned()];
    passed(&client("state", &[], &serve));
    assert_eq!(
        fs::read_to_string(m.p("a.txt")).unwrap(),
        "alpha\ngamma\nalpha\n"
    );
    assert!(!m.p("later.txt").exists());
    let log = layerfs(&["log".as_ref(), m.path.as_os_str()]);
    let log = String::from_utf8_lossy(&log.stdout);
    assert!(log.contains("(mcp:checkpoint)"), "{log}");
    assert!(m.unmount());
}

/// `diff` of a fork through the real client: against its checkpoint by
/// default, against the shared tree with `base` `shared`, beside the
/// live fork and on it unmounted.
#[test]
fn a_real_mcp_client_diffs_a_fork_against_its_checkpoint_or_the_shared_tree() {
    let (_ws, f) = crate::agent_fs::forked_workspace();
    passed(&client("fork", &[], &[f.0.to_string_lossy().into_owned()]));
    let upper = f.0.parent().unwrap().join("upper");
    drop(f);
    passed(&client(
        "fork",
        &[],
        &[upper.to_string_lossy().into_owned()],
    ));
}

#[test]
fn read_only_offers_only_the_reading_tools_and_changes_nothing() {
    let ws = Workspace::new();
    let policy = populate(&ws);
    let mut args = layer_args(&ws, &policy);
    args.push("--read-only".into());
    passed(&client("readonly", &[], &args));
    assert_eq!(fs::read_dir(&ws.upper).unwrap().count(), 0);
    // The same five through the allow list.
    let mut args = layer_args(&ws, &policy);
    args.extend(["--tools".into(), "ls,read,grep,glob,stat".into()]);
    passed(&client("readonly", &[], &args));
}

/// The names on the client's `tools` line.
fn offered(out: &str) -> Vec<String> {
    let line = out
        .lines()
        .find(|l| l.contains(r#""kind": "tools""#))
        .unwrap_or_else(|| panic!("no tools line in {out}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    v["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_allow_list_and_read_only_filter_the_state_tools() {
    let ws = Workspace::new();
    let policy = populate(&ws);
    let mut args = layer_args(&ws, &policy);
    args.extend(["--tools".into(), "read,diff,undo,snapshot_list".into()]);
    let out = passed(&client("list", &[], &args));
    assert_eq!(offered(&out), ["diff", "read", "snapshot_list", "undo"]);
    // Read-only keeps the ones that change nothing.
    args.push("--read-only".into());
    let out = passed(&client("list", &[], &args));
    assert_eq!(offered(&out), ["diff", "read", "snapshot_list"]);
    let mut args = layer_args(&ws, &policy);
    args.push("--read-only".into());
    let out = passed(&client("list", &[], &args));
    let names = offered(&out);
    for kept in ["diff", "log", "snapshot_list", "checkpoint_list"] {
        assert!(names.iter().any(|n| n == kept), "{kept} not in {names:?}");
    }
    for gone in [
        "reset",
        "snapshot_save",
        "snapshot_restore",
        "checkpoint",
        "undo",
    ] {
        assert!(!names.iter().any(|n| n == gone), "{gone} in {names:?}");
    }
}

#[test]
fn an_unknown_tool_in_the_allow_list_is_a_usage_error_naming_it() {
    let ws = Workspace::new();
    let policy = populate(&ws);
    let mut args: Vec<String> = vec!["serve".into(), "--mcp".into()];
    args.extend(layer_args(&ws, &policy));
    args.extend(["--tools".into(), "read,frobnicate".into()]);
    let o = layerfs(&args);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("frobnicate"));
}

#[test]
fn a_mount_is_refused_while_the_server_holds_the_workspace() {
    let ws = Workspace::new();
    let policy = populate(&ws);
    // The default work dir, as the server uses: the lock it holds is the
    // upper's, which any mount of this upper takes first.
    let mut server = Command::new(bin())
        .args(["serve", "--mcp"])
        .args(layer_args(&ws, &policy))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // An answer to initialize means the server holds the workspace.
    let mut stdin = server.stdin.take().unwrap();
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"t","version":"0"}}}}}}"#
    )
    .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("\"layerfs\""), "{line}");
    let refused = ws.try_mount_with(&["--policy", &policy]);
    let err = refused.as_ref().err().cloned().unwrap_or_default();
    // Closing stdin ends the session and the server.
    drop(stdin);
    let status = server.wait().unwrap();
    assert!(refused.is_err(), "a mount beside the in-process core");
    assert!(err.contains("already in use"), "{err}");
    assert!(err.contains(&format!("pid {}", server.id())), "{err}");
    assert!(status.success());
    // Once the server is gone, the workspace mounts.
    let m = ws.mount_with(&["--policy", &policy]);
    assert!(m.unmount());
}

#[test]
fn listen_serves_sessions_on_a_private_unix_socket() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixStream;
    let ws = Workspace::new();
    let policy = populate(&ws);
    let sock = ws.dir.path().join("mcp.sock");
    let mut server = crate::harness::Spawned(
        Command::new(bin())
            .args(["serve", "--mcp", "--listen"])
            .arg(format!("unix:{}", sock.display()))
            .args(layer_args(&ws, &policy))
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let up = crate::harness::eventually(std::time::Duration::from_secs(20), || sock.exists());
    let session = |calls: &[&str]| -> Vec<String> {
        let s = UnixStream::connect(&sock).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        let mut answers = Vec::new();
        for c in calls {
            writeln!(w, "{c}").unwrap();
            if c.contains("\"id\"") {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                answers.push(line);
            }
        }
        answers
    };
    let calls = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"read","arguments":{"path":"a.txt","limit":1}}}"#,
    ];
    let (first, second) = if up {
        (session(&calls), session(&calls))
    } else {
        (Vec::new(), Vec::new())
    };
    let mode = fs::metadata(&sock).map(|m| m.permissions().mode() & 0o777);
    // SIGTERM to the server this test started.
    let _ = Command::new("kill").arg(server.0.id().to_string()).status();
    let status = server.0.wait().unwrap();
    assert!(up, "the socket never appeared");
    assert_eq!(mode.unwrap(), 0o600);
    for answers in [first, second] {
        assert!(answers[0].contains("\"layerfs\""), "{answers:?}");
        assert!(answers[1].contains(r#"     1\talpha"#), "{answers:?}");
    }
    assert!(status.success(), "{status}");
    assert!(!sock.exists(), "the socket is removed at exit");
}

/// `execute` on an unmounted workspace: the server lends it to
/// `layerfs run` for each command and takes it back; exit codes, output
/// cut at max_output, the timeout, the policy inside the command, and the
/// command's changes seen by the next read (tests/mcp_client.py execute).
#[test]
fn execute_runs_commands_in_the_sandbox_of_an_unmounted_workspace() {
    let ws = Workspace::new();
    let policy = populate(&ws);
    let out = passed(&client("execute", &[], &layer_args(&ws, &policy)));
    println!("{out}");
    assert_eq!(
        fs::read_to_string(ws.upper.join("made.txt")).unwrap(),
        "made\n"
    );
    assert!(!ws.upper.join("src/evil.rs").exists());
    // Each command's mount is gone, and the server's core let go at exit.
    let mp = ws.dir.path().join(format!(
        ".{}.layerfs-mnt",
        ws.upper.file_name().unwrap().to_string_lossy()
    ));
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(&*mp.to_string_lossy()),
        "left mounted: {mounts}"
    );
    let log = layerfs(&["log".as_ref(), ws.upper.as_os_str()]);
    let log = String::from_utf8_lossy(&log.stdout);
    assert!(log.contains("(mcp:execute)"), "{log}");
    assert!(log.contains("exec"), "{log}");
    let m = ws.mount_with(&["--policy", &policy]);
    assert_eq!(fs::read_to_string(m.p("from-tool.txt")).unwrap(), "tool\n");
}

/// `execute` beside a live mount runs in that mount, which stays mounted.
#[test]
fn execute_runs_commands_in_a_live_mount_and_leaves_it_mounted() {
    let ws = Workspace::new();
    let policy = populate(&ws);
    let m = ws.mount_with(&["--policy", &policy]);
    let serve = [m.path.to_string_lossy().into_owned()];
    passed(&client("execute", &[], &serve));
    assert_eq!(fs::read_to_string(m.p("made.txt")).unwrap(), "made\n");
    assert!(!m.p("src/evil.rs").exists());
    assert!(m.unmount());
    assert_eq!(
        fs::read_to_string(ws.upper.join("made.txt")).unwrap(),
        "made\n"
    );
}
