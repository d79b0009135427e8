//! Workspace state through real mounts: the state directory and
//! `workspace.json`, the control socket (status, pause/resume,
//! invalidation, access by another user), the journal and `layerfs log`.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::{bin, Workspace};

const NOBODY: u32 = 65534;

/// The default state dir of a harness workspace (beside its upper).
fn state_dir(ws: &Workspace) -> PathBuf {
    ws.dir.path().join(".upper.layerfs-state")
}

fn layerfs(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run layerfs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A control connection speaking JSON lines.
struct Control {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Control {
    fn connect(state: &Path) -> Control {
        let s = UnixStream::connect(state.join("control.sock")).expect("connect control.sock");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Control {
            writer: s.try_clone().unwrap(),
            reader: BufReader::new(s),
        }
    }

    fn ask(&mut self, req: Value) -> Value {
        writeln!(self.writer, "{req}").unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("control answer");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad answer {line:?}: {e}"))
    }
}

/// A client in another process that pauses writes and holds the pause
/// until it is killed: prints the pause answer, then sleeps.
fn pausing_client(state: &Path) -> (Child, Value) {
    let script = r#"
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
f.write(json.dumps({"cmd": "pause", "wait_ms": 100}) + "\n"); f.flush()
print(f.readline().strip(), flush=True)
time.sleep(3600)
"#;
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(state.join("control.sock"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python3");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v = serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad answer {line:?}: {e}"));
    (child, v)
}

/// Runs `f` on a thread; the receiver gets its result when it finishes.
fn background<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

#[test]
fn state_dir_is_created_private_and_describes_the_workspace() {
    let ws = Workspace::new();
    let m = ws.mount();
    let state = state_dir(&ws);
    let md = fs::metadata(&state).unwrap();
    assert!(md.is_dir());
    assert_eq!(md.permissions().mode() & 0o777, 0o700);
    let sock = fs::symlink_metadata(state.join("control.sock")).unwrap();
    assert!(sock.file_type().is_socket());
    assert_eq!(sock.permissions().mode() & 0o777, 0o600);
    let desc: Value =
        serde_json::from_str(&fs::read_to_string(state.join("workspace.json")).unwrap()).unwrap();
    let canon = |p: &Path| fs::canonicalize(p).unwrap().to_string_lossy().into_owned();
    assert_eq!(desc["upper"], json!(canon(&ws.upper)));
    assert_eq!(desc["lowers"], json!([canon(ws.lower())]));
    assert_eq!(desc["work"], json!(canon(&ws.work)));
    assert_eq!(desc["mountpoint"], json!(canon(&ws.mnt)));
    assert!(desc["policy"].is_null());
    assert_eq!(desc["scratch"], json!([]));
    // Nothing of the state lands in the upper or shows through the mount.
    assert_eq!(fs::read_dir(&ws.upper).unwrap().count(), 0);
    assert!(m.unmount());
    assert!(
        !state.join("control.sock").exists(),
        "the socket is removed at a clean exit"
    );
    let desc: Value =
        serde_json::from_str(&fs::read_to_string(state.join("workspace.json")).unwrap()).unwrap();
    assert!(desc["mountpoint"].is_null(), "{desc}");
}

#[test]
fn state_dir_inside_the_layers_is_refused() {
    let ws = Workspace::new();
    for (bad, what) in [
        (ws.upper.join("st"), "upper"),
        (ws.lower().join("st"), "lower"),
        (ws.mnt.join("st"), "mountpoint"),
        (ws.work.join("st"), "work dir"),
    ] {
        let arg = bad.to_string_lossy().into_owned();
        let err = match ws.try_mount_with(&["--state", &arg]) {
            Ok(_) => panic!("--state {arg} was accepted"),
            Err(e) => e,
        };
        assert!(
            err.contains("state dir") && err.contains(what),
            "--state {arg}: {err}"
        );
        assert!(!bad.exists(), "nothing is created at {arg}");
    }
}

#[test]
fn state_dir_elsewhere_is_found_from_the_mountpoint() {
    let ws = Workspace::new();
    let state = ws.dir.path().join("elsewhere");
    let m = ws.mount_with(&["--state", state.to_str().unwrap()]);
    assert!(state.join("workspace.json").is_file());
    assert!(!state_dir(&ws).exists());
    let out = layerfs(&["status", "--json", m.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(
        v["state"],
        json!(fs::canonicalize(&state).unwrap().to_string_lossy())
    );
    // The upper alone does not lead there: the message says what to give.
    let out = layerfs(&["status", ws.upper.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--state"), "{}", stderr(&out));
    // The state dir itself does.
    let out = layerfs(&["status", "--json", state.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    drop(m);
}

#[test]
fn stale_control_socket_is_replaced_and_a_live_one_refuses_a_second_daemon() {
    let ws = Workspace::new();
    let state = state_dir(&ws);
    fs::create_dir(&state).unwrap();
    // A socket nobody listens on, as a killed daemon leaves it.
    drop(std::os::unix::net::UnixListener::bind(state.join("control.sock")).unwrap());
    let m = ws.mount();
    let mut c = Control::connect(&state);
    let v = c.ask(json!({"cmd": "status"}));
    assert_eq!(v["ok"], json!(true), "{v}");
    assert_eq!(v["pid"], json!(m.pid()));

    // A second mount of the same workspace elsewhere is refused.
    let mnt2 = ws.dir.path().join("mnt2");
    fs::create_dir(&mnt2).unwrap();
    let out = Command::new(bin())
        .args(["mount", "--lower"])
        .arg(ws.lower())
        .arg("--upper")
        .arg(&ws.upper)
        .arg("--work")
        .arg(&ws.work)
        .arg(&mnt2)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("another layerfs daemon serves this workspace"),
        "{}",
        stderr(&out)
    );
    assert!(!crate::harness::is_mounted(&mnt2));
    // The first mount's socket survived the attempt.
    assert_eq!(c.ask(json!({"cmd": "status"}))["ok"], json!(true));
    drop(m);
}

#[test]
fn status_of_a_mount_and_of_an_unmounted_upper() {
    let ws = Workspace::new();
    let m = ws.mount();
    for arg in [m.path().to_path_buf(), ws.upper.clone()] {
        let out = layerfs(&["status", "--json", arg.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
        let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
        assert_eq!(v["mounted"], json!(true));
        assert_eq!(v["pid"], json!(m.pid()));
        assert_eq!(
            v["mountpoint"],
            json!(fs::canonicalize(&ws.mnt).unwrap().to_string_lossy())
        );
        assert!(v["uptime_seconds"].as_f64().unwrap() >= 0.0);
    }
    // Every mount: this one is listed.
    let out = layerfs(&["status"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let canon = fs::canonicalize(&ws.mnt).unwrap();
    assert!(text.contains(&*canon.to_string_lossy()), "{text}");
    assert!(
        text.contains(&format!("pid          {}", m.pid())),
        "{text}"
    );
    assert!(m.unmount());
    let out = layerfs(&["status", "--json", ws.upper.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["mounted"], json!(false));
    assert!(v["mountpoint"].is_null());
    // Not a workspace at all: the message says what to give.
    let out = layerfs(&["status", ws.lower().to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not a layerfs mountpoint"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn pause_blocks_writers_not_readers_until_resume() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("shared.txt"), "shared\n").unwrap();
    fs::create_dir(ws.lower().join("w")).unwrap();
    let m = ws.mount();
    fs::write(m.p("mine.txt"), "v1\n").unwrap();
    assert!(m.p("w").is_dir());
    let mut c = Control::connect(&state_dir(&ws));
    let v = c.ask(json!({"cmd": "pause"}));
    assert_eq!(v["ok"], json!(true), "{v}");
    assert_eq!(v["busy"], json!([]));
    assert_eq!(c.ask(json!({"cmd": "status"}))["paused"], json!(true));

    // (The kernel holds a directory's lock while a create in it waits, so
    // new names are looked up elsewhere meanwhile: the create goes in w/.)
    let p = m.p("w/new.txt");
    let creator = background(move || fs::write(p, "created while paused\n"));
    let p = m.p("mine.txt");
    let appender = background(move || {
        fs::OpenOptions::new()
            .append(true)
            .open(p)
            .and_then(|mut f| f.write_all(b"v2\n"))
    });
    // Readers go on while the writers wait.
    for _ in 0..3 {
        assert_eq!(fs::read_to_string(m.p("shared.txt")).unwrap(), "shared\n");
        assert_eq!(fs::read_to_string(m.p("mine.txt")).unwrap(), "v1\n");
        assert!(fs::read_dir(m.path()).unwrap().count() >= 2);
    }
    assert!(
        creator.recv_timeout(Duration::from_millis(300)).is_err(),
        "a create went through while paused"
    );
    assert!(
        appender.try_recv().is_err(),
        "an open for writing went through while paused"
    );
    assert!(!ws.upper.join("w/new.txt").exists());

    assert_eq!(c.ask(json!({"cmd": "resume"}))["resumed"], json!(true));
    creator
        .recv_timeout(Duration::from_secs(30))
        .unwrap()
        .unwrap();
    appender
        .recv_timeout(Duration::from_secs(30))
        .unwrap()
        .unwrap();
    assert_eq!(fs::read_to_string(m.p("mine.txt")).unwrap(), "v1\nv2\n");
    assert_eq!(
        fs::read_to_string(ws.upper.join("w/new.txt")).unwrap(),
        "created while paused\n"
    );
    assert_eq!(c.ask(json!({"cmd": "status"}))["paused"], json!(false));
}

#[test]
fn pause_reports_files_still_open_for_writing() {
    let ws = Workspace::new();
    let m = ws.mount();
    let mut f = fs::File::create(m.p("held.txt")).unwrap();
    f.write_all(b"before\n").unwrap();
    let mut c = Control::connect(&state_dir(&ws));
    let v = c.ask(json!({"cmd": "pause", "wait_ms": 200}));
    assert_eq!(v["ok"], json!(true), "{v}");
    // Passthrough (root) writes bypass the daemon: such a handle is busy.
    // Through the daemon its writes wait at the gate instead.
    let passthrough = v["busy"] == json!(["held.txt"]);
    if !passthrough {
        assert_eq!(v["busy"], json!([]), "{v}");
    }
    c.ask(json!({"cmd": "resume"}));
    drop(f);
    // Closed: a new pause has nothing to wait for.
    let v = c.ask(json!({"cmd": "pause", "wait_ms": 5000}));
    assert_eq!(v["busy"], json!([]), "{v}");
    c.ask(json!({"cmd": "resume"}));
    drop(m);
}

#[test]
fn a_killed_pausing_client_releases_the_pause() {
    let ws = Workspace::new();
    let m = ws.mount();
    let (mut client, answer) = pausing_client(&state_dir(&ws));
    assert_eq!(answer["ok"], json!(true), "{answer}");
    let p = m.p("after-kill.txt");
    let writer = background(move || fs::write(p, "x"));
    assert!(writer.recv_timeout(Duration::from_millis(300)).is_err());
    client.kill().unwrap();
    client.wait().unwrap();
    writer
        .recv_timeout(Duration::from_secs(30))
        .expect("the writer went on once the pausing client died")
        .unwrap();
    assert_eq!(fs::read_to_string(m.p("after-kill.txt")).unwrap(), "x");
    let mut c = Control::connect(&state_dir(&ws));
    assert_eq!(c.ask(json!({"cmd": "status"}))["paused"], json!(false));
}

#[test]
fn invalidate_shows_changes_made_behind_the_mount() {
    let ws = Workspace::new();
    fs::create_dir(ws.lower().join("d")).unwrap();
    fs::write(ws.lower().join("d/f.txt"), "lower\n").unwrap();
    let m = ws.mount();
    // Copy up through the mount, then revert behind its back (as a reset does).
    fs::write(m.p("d/f.txt"), "upper\n").unwrap();
    fs::write(m.p("d/new.txt"), "new\n").unwrap();
    assert_eq!(fs::read_to_string(m.p("d/f.txt")).unwrap(), "upper\n");
    let _ = fs::read_dir(m.p("d")).unwrap().count();
    fs::remove_file(ws.upper.join("d/f.txt")).unwrap();
    fs::remove_file(ws.upper.join("d/new.txt")).unwrap();
    let mut c = Control::connect(&state_dir(&ws));
    let v = c.ask(json!({"cmd": "invalidate", "paths": ["d/f.txt", "d/new.txt"]}));
    assert_eq!(v["ok"], json!(true), "{v}");
    assert_eq!(v["pending"], json!(false));
    assert_eq!(fs::read_to_string(m.p("d/f.txt")).unwrap(), "lower\n");
    assert!(!m.p("d/new.txt").exists());
    let names: Vec<String> = fs::read_dir(m.p("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["f.txt".to_string()]);
    // The daemon re-resolved it: a new write copies up again.
    fs::write(m.p("d/f.txt"), "again\n").unwrap();
    assert_eq!(
        fs::read_to_string(ws.upper.join("d/f.txt")).unwrap(),
        "again\n"
    );

    // Everything at once.
    fs::write(ws.upper.join("d/f.txt"), "edited in the upper\n").unwrap();
    let v = c.ask(json!({"cmd": "invalidate_all"}));
    assert_eq!(v["ok"], json!(true), "{v}");
    assert_eq!(
        fs::read_to_string(m.p("d/f.txt")).unwrap(),
        "edited in the upper\n"
    );
    // Unknown commands are refused with the list of known ones.
    let v = c.ask(json!({"cmd": "frobnicate"}));
    assert_eq!(v["ok"], json!(false));
    assert!(v["error"].as_str().unwrap().contains("status"), "{v}");
    drop(m);
}

#[test]
fn another_user_is_refused_with_a_clear_message() {
    let ws = Workspace::new();
    let m = ws.mount();
    // Let uid 65534 reach the workspace directory (tempdirs are 0700).
    fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args([
                format!("--reuid={NOBODY}"),
                format!("--regid={NOBODY}"),
                "--clear-groups".into(),
                "--".into(),
            ])
            .arg(bin())
            .args(args)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run setpriv")
    };
    let state = state_dir(&ws);
    // The 0700 state dir keeps the socket out of reach.
    let out = as_nobody(&["status", state.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("permission denied") && stderr(&out).contains("another user"),
        "{}",
        stderr(&out)
    );
    // Even with the directory and socket opened up, the daemon checks the
    // caller's uid and says why it refuses.
    fs::set_permissions(&state, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(
        state.join("workspace.json"),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    fs::set_permissions(
        state.join("control.sock"),
        fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let out = as_nobody(&["status", state.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("permission denied") && err.contains("uid 0") && err.contains("65534"),
        "{err}"
    );
    // The owner is still served.
    let mut c = Control::connect(&state);
    assert_eq!(c.ask(json!({"cmd": "status"}))["ok"], json!(true));
    drop(m);
}
