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

use crate::harness::{bin, eventually, layerfs_quiet, Tmpfs, Workspace};

const NOBODY: u32 = 65534;

/// The default state dir of a harness workspace (beside its upper).
pub(crate) fn state_dir(ws: &Workspace) -> PathBuf {
    ws.dir.path().join(".upper.layerfs-state")
}
pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A control connection speaking JSON lines.
pub(crate) struct Control {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Control {
    pub(crate) fn connect(state: &Path) -> Control {
        let s = UnixStream::connect(state.join("control.sock")).expect("connect control.sock");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Control {
            writer: s.try_clone().unwrap(),
            reader: BufReader::new(s),
        }
    }

    pub(crate) fn ask(&mut self, req: Value) -> Value {
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

/// A new workspace's journal is made once the mount is live, but its
/// file is there from the start: `log` at once shows no rows (never "no
/// journal"), it is private, and the first change is recorded.
#[test]
fn a_new_workspace_has_its_journal_from_the_first_moment_of_its_mount() {
    let ws = Workspace::new();
    let m = ws.mount();
    let db = state_dir(&ws).join("journal.db");
    let md = fs::symlink_metadata(&db).expect("no journal.db once the mount is live");
    assert_eq!(md.permissions().mode() & 0o777, 0o600);
    assert_eq!(log_rows(m.path(), &[]), Vec::<Value>::new());
    fs::write(m.p("first"), "1\n").unwrap();
    poll_log(m.path(), |rows| rows.iter().any(|r| r["path"] == "first"));
    let s = layerfs_quiet(&["status", "--json", m.path().to_str().unwrap()]);
    let v: Value = serde_json::from_slice(&s.stdout).unwrap();
    assert!(v["journal"]["last_error"].is_null(), "{v}");
    assert!(m.unmount());
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
    let out = layerfs_quiet(&["status", "--json", m.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(
        v["state"],
        json!(fs::canonicalize(&state).unwrap().to_string_lossy())
    );
    // The upper leads there too: it records where its state is (this
    // used to fail asking for --state; `state::place` made it work). An
    // upper without the record (copied without xattrs) still says what to
    // give.
    let out = layerfs_quiet(&["status", "--json", ws.upper.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let copy = ws.dir.path().join("copied-upper");
    fs::create_dir(&copy).unwrap();
    let out = layerfs_quiet(&["status", copy.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--state"), "{}", stderr(&out));
    // The state dir itself does.
    let out = layerfs_quiet(&["status", "--json", state.to_str().unwrap()]);
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
    // Refused by the lock on the upper (the first check): the message names
    // the daemon, its mountpoint and what to do.
    let canon_mnt = fs::canonicalize(&ws.mnt).unwrap();
    let err = stderr(&out);
    assert!(err.contains(&format!("pid {}", m.pid())), "{err}");
    assert!(
        err.contains(&format!("layerfs umount {}", canon_mnt.display())),
        "{err}"
    );
    // Another upper and work dir with this workspace's state dir: the
    // control socket (the second check) refuses it, in the same words.
    let upper3 = ws.dir.path().join("upper3");
    fs::create_dir(&upper3).unwrap();
    let out = Command::new(bin())
        .args(["mount", "--lower"])
        .arg(ws.lower())
        .arg("--upper")
        .arg(&upper3)
        .arg("--work")
        .arg(ws.dir.path().join("work3"))
        .arg("--state")
        .arg(&state)
        .arg(&mnt2)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("another layerfs daemon serves this workspace")
            && err.contains("control socket")
            && err.contains(&format!("pid {}", m.pid()))
            && err.contains(&format!("layerfs umount {}", canon_mnt.display())),
        "{err}"
    );
    assert!(!crate::harness::is_mounted(&mnt2));
    // The first mount's socket survived the attempts.
    assert_eq!(c.ask(json!({"cmd": "status"}))["ok"], json!(true));
    drop(m);
}

#[test]
fn status_of_a_mount_and_of_an_unmounted_upper() {
    let ws = Workspace::new();
    let m = ws.mount();
    for arg in [m.path().to_path_buf(), ws.upper.clone()] {
        let out = layerfs_quiet(&["status", "--json", arg.to_str().unwrap()]);
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
    let out = layerfs_quiet(&["status"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let canon = fs::canonicalize(&ws.mnt).unwrap();
    assert!(text.contains(&*canon.to_string_lossy()), "{text}");
    assert!(
        text.contains(&format!("pid          {}", m.pid())),
        "{text}"
    );
    assert!(m.unmount());
    let out = layerfs_quiet(&["status", "--json", ws.upper.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["mounted"], json!(false));
    assert!(v["mountpoint"].is_null());
    // Not a workspace at all: the message says what to give.
    let out = layerfs_quiet(&["status", ws.lower().to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not a layerfs mountpoint"),
        "{}",
        stderr(&out)
    );
}

/// Resumes a stopped daemon when dropped, so the guard can unmount it.
struct Stopped(nix::unistd::Pid);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

#[test]
fn status_reports_a_stopped_daemon_instead_of_waiting_for_it() {
    let ws = Workspace::new();
    let m = ws.mount();
    let pid = nix::unistd::Pid::from_raw(m.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let _resume = Stopped(pid);
    let started = std::time::Instant::now();
    let out = layerfs_quiet(&["status", ws.upper.to_str().unwrap()]);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("no answer within 10s: the daemon is stopped"),
        "{}",
        stderr(&out)
    );
    assert!(took < Duration::from_secs(60), "status took {took:?}");
    // The list of every mount names it with the same reason and goes on.
    let out = layerfs_quiet(&["status", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let canon = fs::canonicalize(&ws.mnt).unwrap();
    let mine = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["mountpoint"] == json!(canon.to_string_lossy()))
        .expect("the stopped mount is listed");
    assert!(
        mine["error"]
            .as_str()
            .unwrap_or("")
            .contains("no answer within"),
        "{mine}"
    );
    drop(_resume);
    assert!(m.unmount());
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
    if passthrough {
        // Named with the uid holding it.
        assert_eq!(v["holders"], json!([{"path": "held.txt", "uid": 0}]), "{v}");
    } else {
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
fn the_control_socket_ignores_unknown_fields_and_says_what_a_bad_request_lacks() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("f.txt"), "lower\n").unwrap();
    let m = ws.mount();
    let mut c = Control::connect(&state_dir(&ws));
    // A newer client's extra fields are ignored.
    let v = c.ask(json!({"cmd": "status", "since": 3, "verbose": true}));
    assert_eq!(v["ok"], json!(true), "{v}");
    assert_eq!(v["mountpoint"], json!(m.path.to_string_lossy()), "{v}");
    let v = c.ask(json!({"cmd": "pause", "wait_ms": 50, "reason": "test"}));
    assert_eq!(v["paused"], json!(true), "{v}");
    let v = c.ask(json!({"cmd": "resume", "whatever": null}));
    assert_eq!(v["resumed"], json!(true), "{v}");
    // A malformed request is refused naming what to send; the
    // connection goes on.
    let v = c.ask(json!({"cmd": "reset", "path": "f.txt"}));
    assert_eq!(v["ok"], json!(false), "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(e.contains("bad \"reset\" request"), "{e}");
    assert!(
        e.contains(r#"{"cmd":"reset","paths":["rel/path", ...]}"#),
        "{e}"
    );
    let v = c.ask(json!({"cmd": "restore", "staging": 7}));
    assert!(v["error"].as_str().unwrap().contains("staging"), "{v}");
    let v = c.ask(json!({"cmd": "fly"}));
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("unknown command \"fly\""),
        "{v}"
    );
    let v = c.ask(json!({"cmd": "reset", "paths": ["f.txt"]}));
    assert_eq!(v["ok"], json!(true), "{v}");
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

/// The journal's rows through `layerfs log --json` (extra filter args).
pub(crate) fn log_rows(ws: &Path, extra: &[&str]) -> Vec<Value> {
    try_log_rows(ws, extra).unwrap_or_else(|e| panic!("layerfs log: {e}"))
}

pub(crate) fn try_log_rows(ws: &Path, extra: &[&str]) -> Result<Vec<Value>, String> {
    let mut args = vec!["log", "--json"];
    args.extend_from_slice(extra);
    let w = ws.to_str().unwrap();
    args.push(w);
    let out = layerfs_quiet(&args);
    if !out.status.success() {
        return Err(stderr(&out));
    }
    Ok(stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad row {l:?}: {e}")))
        .collect())
}

/// Polls the journal (written asynchronously) until `done` holds.
pub(crate) fn poll_log(ws: &Path, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let mut rows = Vec::new();
    // (A journal being recreated may be missing for a moment.)
    let ok = eventually(Duration::from_secs(20), || {
        rows = try_log_rows(ws, &[]).unwrap_or_else(|e| vec![json!({ "error": e })]);
        done(&rows)
    });
    assert!(ok, "the journal never got there: {rows:#?}");
    rows
}

pub(crate) fn status_json(ws: &Path) -> Value {
    let out = layerfs_quiet(&["status", "--json", ws.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(stdout(&out).trim()).unwrap()
}

fn find<'a>(rows: &'a [Value], op: &str, path: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["op"] == json!(op) && r["path"] == json!(path))
        .unwrap_or_else(|| panic!("no {op} row for {path} in {rows:#?}"))
}

#[test]
fn journal_records_every_operation_kind_with_its_fields() {
    let ws = Workspace::new();
    fs::create_dir(ws.lower().join("ro")).unwrap();
    fs::write(ws.lower().join("shared.txt"), "shared\n").unwrap();
    let policy = crate::harness::policy_file(&ws, "readonly ro/**\n");
    // Through the daemon, so it counts the bytes written.
    let m = ws.mount_env(
        &["--policy", policy.to_str().unwrap()],
        &[("LAYERFS_NO_PASSTHROUGH", "1")],
    );
    let script = "set -e
        printf 'abc' > new.txt
        printf 'more' >> shared.txt
        mkdir d
        mv new.txt d/moved.txt
        ln d/moved.txt d/hard.txt
        ln -s moved.txt d/sym
        chmod 600 d/moved.txt
        touch -d 2020-01-01 d/moved.txt
        truncate -s 2 d/moved.txt
        setfattr -n user.k -v v d/moved.txt
        setfattr -x user.k d/moved.txt
        rm d/hard.txt d/sym
        mkdir e && rmdir e
        touch ro/denied 2>/dev/null && exit 1
        echo last > last.txt";
    crate::harness::sh(m.path(), script);
    let rows = poll_log(m.path(), |r| {
        r.iter()
            .any(|x| x["op"] == json!("write") && x["path"] == json!("last.txt"))
    });
    for r in &rows {
        assert!(r["time"].as_str().unwrap().ends_with('Z'), "{r}");
        assert!(r["pid"].as_u64().unwrap() > 0, "{r}");
        assert!(!r["comm"].as_str().unwrap().is_empty(), "{r}");
    }
    let create = find(&rows, "create", "new.txt");
    assert_eq!(create["result"], json!("ok"));
    assert_eq!(create["comm"], json!("bash"));
    // One coalesced row per open file, with the bytes written.
    assert_eq!(find(&rows, "write", "new.txt")["bytes"], json!(3));
    assert_eq!(find(&rows, "copy-up", "shared.txt")["result"], json!("ok"));
    assert_eq!(find(&rows, "write", "shared.txt")["bytes"], json!(4));
    assert_eq!(find(&rows, "mkdir", "d")["comm"], json!("mkdir"));
    let mv = find(&rows, "rename", "new.txt");
    assert_eq!(mv["to"], json!("d/moved.txt"));
    assert_eq!(mv["comm"], json!("mv"));
    assert_eq!(
        find(&rows, "link", "d/moved.txt")["to"],
        json!("d/hard.txt")
    );
    assert_eq!(find(&rows, "symlink", "d/sym")["to"], json!("moved.txt"));
    assert_eq!(find(&rows, "chmod", "d/moved.txt")["comm"], json!("chmod"));
    assert_eq!(find(&rows, "utimes", "d/moved.txt")["comm"], json!("touch"));
    assert_eq!(find(&rows, "truncate", "d/moved.txt")["bytes"], json!(2));
    assert_eq!(
        find(&rows, "setxattr", "d/moved.txt")["to"],
        json!("user.k")
    );
    assert_eq!(
        find(&rows, "removexattr", "d/moved.txt")["to"],
        json!("user.k")
    );
    assert_eq!(find(&rows, "unlink", "d/hard.txt")["comm"], json!("rm"));
    assert_eq!(find(&rows, "unlink", "d/sym")["result"], json!("ok"));
    assert_eq!(find(&rows, "rmdir", "e")["comm"], json!("rmdir"));
    // The denial: the errno and the rule that fired.
    let denied = find(&rows, "create", "ro/denied");
    assert_eq!(denied["result"], json!("EROFS"));
    assert!(
        denied["rule"].as_str().unwrap().contains("readonly ro/**"),
        "{denied}"
    );
    assert!(rows.iter().filter(|r| !r["rule"].is_null()).count() == 1);
    // Filters.
    let denials = log_rows(m.path(), &["--op", "deny"]);
    assert_eq!(denials.len(), 1, "{denials:#?}");
    let under_d = log_rows(m.path(), &["--path", "d/*"]);
    assert!(!under_d.is_empty());
    assert!(under_d
        .iter()
        .all(|r| r["path"].as_str().unwrap().starts_with("d/")
            || r["to"].as_str().is_some_and(|t| t.starts_with("d/"))));
    let last = log_rows(m.path(), &["--limit", "1"]);
    assert_eq!(last.len(), 1);
    assert_eq!(last[0]["path"], json!("last.txt"));
    assert!(log_rows(m.path(), &["--since", "2099-01-01T00:00:00Z"]).is_empty());
    assert_eq!(
        log_rows(m.path(), &["--since", "1h", "--op", "mkdir"]).len(),
        2
    );
    // Readable after unmount too, from the upper directory.
    assert!(m.unmount());
    assert_eq!(log_rows(&ws.upper, &["--op", "symlink"]).len(), 1);
    let text = layerfs_quiet(&["log", "--op", "rename", ws.upper.to_str().unwrap()]);
    assert!(
        stdout(&text).contains("new.txt -> d/moved.txt  ok"),
        "{}",
        stdout(&text)
    );
}

#[test]
fn passthrough_writes_are_recorded_at_close() {
    let ws = Workspace::new();
    let m = ws.mount();
    let mut f = fs::File::create(m.p("pt.txt")).unwrap();
    f.write_all(b"hello").unwrap();
    f.sync_all().unwrap();
    f.write_all(b" world").unwrap();
    drop(f);
    let rows = poll_log(m.path(), |r| {
        r.iter().filter(|x| x["op"] == json!("write")).count() >= 2
    });
    let writes: Vec<&Value> = rows.iter().filter(|x| x["op"] == json!("write")).collect();
    assert!(
        writes.iter().all(|w| w["path"] == json!("pt.txt")),
        "{writes:#?}"
    );
    // Passthrough writes never reach the daemon: no byte count then.
    for w in &writes {
        assert!(
            w["bytes"].is_null() || w["bytes"].as_u64().unwrap() > 0,
            "{w}"
        );
    }
    drop(m);
}

/// A database commits (writes and fsyncs) many times a second: the
/// journal records a write row at an fsync at most once a second per
/// open file, and what the skipped fsyncs covered at the next record
/// (here, the close).
#[test]
fn a_file_fsynced_many_times_a_second_gets_a_write_row_a_second() {
    let ws = Workspace::new();
    let m = ws.mount();
    let mut f = fs::File::create(m.p("app.db")).unwrap();
    let started = std::time::Instant::now();
    for _ in 0..50 {
        f.write_all(&[b'x'; 512]).unwrap();
        f.sync_data().unwrap();
    }
    let secs = started.elapsed().as_secs() as usize;
    drop(f);
    let writes = |r: &[Value]| {
        r.iter()
            .filter(|x| x["op"] == json!("write") && x["path"] == json!("app.db"))
            .count()
    };
    // The first fsync's row, then the close's.
    poll_log(m.path(), |r| writes(r) >= 2);
    // (Time for any later row to be written too.)
    std::thread::sleep(Duration::from_millis(300));
    let rows = log_rows(m.path(), &["--path", "app.db"]);
    let n = writes(&rows);
    assert!(
        (2..=secs + 3).contains(&n),
        "{n} write rows for 50 fsyncs in {secs} s: {rows:#?}"
    );
}

#[test]
fn status_reports_usage_counters_and_journal_health() {
    let ws = Workspace::new();
    fs::create_dir(ws.lower().join("ro")).unwrap();
    fs::write(ws.lower().join("shared.txt"), "shared\n").unwrap();
    let policy = crate::harness::policy_file(&ws, "readonly ro/**\nquota bytes=1M inodes=100\n");
    let m = ws.mount_with(&["--policy", policy.to_str().unwrap()]);
    fs::write(m.p("a.txt"), vec![b'x'; 1000]).unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(m.p("shared.txt"))
        .unwrap()
        .write_all(b"!")
        .unwrap();
    assert!(fs::write(m.p("ro/x"), "no").is_err());
    poll_log(m.path(), |r| r.iter().any(|x| x["path"] == json!("ro/x")));
    let v = status_json(m.path());
    assert_eq!(v["pid"], json!(m.pid()));
    assert!(v["lowers"].as_array().unwrap().len() == 1);
    let u = &v["upper_usage"];
    assert_eq!(u["bytes"], json!(1000 + 8));
    assert_eq!(u["inodes"], json!(2));
    assert_eq!(u["quota_bytes"], json!(1 << 20));
    assert_eq!(u["quota_inodes"], json!(100));
    let c = &v["counters"];
    assert_eq!(c["copy_ups"], json!(1));
    assert_eq!(c["denials"], json!(1));
    assert!(c["requests"].as_u64().unwrap() > 5, "{c}");
    assert!(c["requests_per_second"].as_f64().unwrap() >= 0.0);
    // Every request is counted under its operation, once.
    let by_op = c["by_op"].as_object().unwrap();
    let sum: u64 = by_op.values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(json!(sum), c["requests"], "{c}");
    assert!(by_op["lookup"].as_u64().unwrap() >= 1, "{c}");
    let creates = |v: &serde_json::Value| v["counters"]["by_op"]["create"].as_u64().unwrap_or(0);
    let before = creates(&v);
    for name in ["n1", "n2", "n3"] {
        fs::write(m.p(name), "n").unwrap();
    }
    assert_eq!(creates(&status_json(m.path())), before + 3);
    let j = &v["journal"];
    assert_eq!(j["enabled"], json!(true));
    assert!(j["rows"].as_u64().unwrap() >= 4, "{j}");
    assert_eq!(j["dropped"], json!(0));
    assert!(j["last_error"].is_null());
    // The text form names the same things.
    let out = layerfs_quiet(&["status", m.path().to_str().unwrap()]);
    let text = stdout(&out);
    for word in [
        "upper use",
        "quota",
        "1 copy-ups, 1 denials",
        "journal",
        "0 dropped",
    ] {
        assert!(text.contains(word), "{word}: {text}");
    }
    drop(m);

    // Without a journal.
    let m = ws.mount_with(&["--no-journal"]);
    fs::remove_file(state_dir(&ws).join("journal.db")).unwrap();
    fs::write(m.p("b.txt"), "b").unwrap();
    let v = status_json(m.path());
    assert_eq!(v["journal"]["enabled"], json!(false));
    assert!(!state_dir(&ws).join("journal.db").exists());
    drop(m);
}

/// Writes through the mount keep working, and read back right.
fn still_serving(m: &crate::harness::Mount, tag: &str) {
    for i in 0..20 {
        let p = m.p(&format!("{tag}-{i}.txt"));
        fs::write(&p, format!("{tag} {i}")).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), format!("{tag} {i}"));
    }
}

#[test]
fn journal_failures_never_stop_the_mount() {
    // A deleted database: a new one is started and status says so.
    let ws = Workspace::new();
    let m = ws.mount();
    fs::write(m.p("first.txt"), "1").unwrap();
    poll_log(m.path(), |r| {
        r.iter().any(|x| x["path"] == json!("first.txt"))
    });
    for f in ["journal.db", "journal.db-wal", "journal.db-shm"] {
        let _ = fs::remove_file(state_dir(&ws).join(f));
    }
    still_serving(&m, "after-delete");
    poll_log(m.path(), |r| {
        r.iter().any(|x| x["path"] == json!("after-delete-19.txt"))
    });
    let v = status_json(m.path());
    assert!(
        v["journal"]["last_error"]
            .as_str()
            .unwrap()
            .contains("deleted"),
        "{v}"
    );
    drop(m);

    // A read-only state dir: the mount serves; the journal drops and says
    // why in the log (no control socket can be created there either).
    let ws = Workspace::new();
    let state = ws.dir.path().join("ro-state");
    let tmpfs = Tmpfs::new(&state, "16m");
    tmpfs.read_only();
    let m = ws.mount_with(&["--state", state.to_str().unwrap()]);
    still_serving(&m, "ro");
    assert!(
        eventually(Duration::from_secs(20), || ws
            .daemon_log()
            .contains("journal: cannot open")),
        "{}",
        ws.daemon_log()
    );
    assert!(ws.daemon_log().contains("cannot create control socket"));
    drop(m);
    drop(tmpfs);

    // A full state dir.
    let ws = Workspace::new();
    let state = ws.dir.path().join("full-state");
    let tmpfs = Tmpfs::new(&state, "256k");
    let m = ws.mount_with(&["--state", state.to_str().unwrap()]);
    // Fill the tmpfs beside the journal.
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=4k", "count=1000"])
        .arg(format!("of={}", state.join("filler").display()))
        .stderr(Stdio::null())
        .status();
    still_serving(&m, "full");
    // More events than the writer holds for a retry (journal::HOLD, 4096):
    // a create and a write each.
    let names: Vec<String> = (0..2500)
        .map(|i| format!("n{i:03}-{}", "x".repeat(100)))
        .collect();
    for n in &names {
        fs::write(m.p(n), "x").unwrap();
    }
    let mut v = Value::Null;
    assert!(
        eventually(Duration::from_secs(20), || {
            v = status_json(m.path());
            v["journal"]["dropped"].as_u64().unwrap_or(0) > 0
        }),
        "{v}"
    );
    let err = v["journal"]["last_error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(err.contains("full"), "{v}");
    still_serving(&m, "still");
    // Space again: the journal records what it lost.
    fs::remove_file(state.join("filler")).unwrap();
    fs::write(m.p("recovered.txt"), "r").unwrap();
    let rows = poll_log(m.path(), |r| {
        r.iter().any(|x| x["path"] == json!("recovered.txt"))
    });
    assert!(
        rows.iter()
            .any(|r| r["op"] == json!("journal-dropped") && r["bytes"].as_u64().unwrap() > 0),
        "{rows:#?}"
    );
    drop(m);
    drop(tmpfs);
}

/// The number of rows `layerfs log` shows for `ws`.
fn row_count(ws: &Path) -> usize {
    log_rows(ws, &[]).len()
}

#[test]
fn journal_retention_trims_by_age_and_by_size() {
    // Age: rows older than --journal-max-age go (retention runs when the
    // writer starts and every minute after).
    let ws = Workspace::new();
    let m = ws.mount_with(&["--journal-max-age", "4s"]);
    fs::write(m.p("old.txt"), "old").unwrap();
    poll_log(m.path(), |r| {
        r.iter().any(|x| x["path"] == json!("old.txt"))
    });
    assert!(m.unmount());
    std::thread::sleep(Duration::from_secs(5));
    let m = ws.mount_with(&["--journal-max-age", "4s"]);
    fs::write(m.p("new.txt"), "new").unwrap();
    let rows = poll_log(m.path(), |r| {
        r.iter().any(|x| x["path"] == json!("new.txt"))
    });
    assert!(
        rows.iter().all(|x| x["path"] != json!("old.txt")),
        "{rows:#?}"
    );
    assert!(m.unmount());

    // Size: beyond --journal-max-size the oldest rows go, the newest stay.
    // The rows are written under a larger cap, then the workspace is
    // mounted with a smaller one: the writer trims when it starts. (Under
    // the 64K cap itself the size is kept after every batch, so the rows
    // would already go while being written: `shared::trimming_by_size_…`.)
    let ws = Workspace::new();
    let m = ws.mount_with(&["--journal-max-size", "1M"]);
    let script = "for i in $(seq 1500); do echo x > f$i; done";
    crate::harness::sh(m.path(), script);
    // (The last file's write row comes at its close, after its create row.)
    poll_log(m.path(), |r| {
        r.iter()
            .any(|x| x["op"] == json!("write") && x["path"] == json!("f1500"))
    });
    let before = row_count(m.path());
    assert!(before >= 3000, "{before} rows");
    assert!(m.unmount());
    let m = ws.mount_with(&["--journal-max-size", "64K"]);
    fs::write(m.p("last.txt"), "last").unwrap();
    // Retention runs right after the writer's first batch is committed:
    // the new row may show a moment before the old ones go.
    let rows = poll_log(m.path(), |r| {
        r.iter().any(|x| x["path"] == json!("last.txt")) && r.len() < before / 2
    });
    assert!(rows.iter().any(|x| x["path"] == json!("f1500")));
    assert!(rows.iter().all(|x| x["path"] != json!("f1")));
    drop(m);
}

#[test]
fn state_files_stay_private_under_any_umask() {
    for umask in [0o000, 0o022, 0o077] {
        let ws = Workspace::new();
        let m = ws.mount_daemon_umask(&[], umask);
        fs::write(m.p("a.txt"), "a").unwrap();
        poll_log(m.path(), |r| r.iter().any(|x| x["path"] == json!("a.txt")));
        let state = state_dir(&ws);
        let mode = |p: &Path| fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&state), 0o700, "umask {umask:03o}");
        assert_eq!(
            mode(&state.join("control.sock")),
            0o600,
            "umask {umask:03o}"
        );
        for f in ["journal.db", "journal.db-wal", "journal.db-shm"] {
            let p = state.join(f);
            if p.exists() {
                assert_eq!(mode(&p), 0o600, "{f} under umask {umask:03o}");
            }
        }
        // Log and status work for the owner whatever the umask.
        let v = status_json(m.path());
        assert_eq!(v["journal"]["dropped"], json!(0), "{v}");
        assert!(m.unmount());
        assert_eq!(log_rows(&ws.upper, &["--path", "a.txt"]).len(), 2);
    }
}

#[test]
fn another_user_may_use_an_allow_other_mount_but_not_its_state_commands() {
    let ws = Workspace::new();
    let m = ws.mount_with(&["--allow-other"]);
    fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir(m.p("pub")).unwrap();
    fs::set_permissions(m.p("pub"), fs::Permissions::from_mode(0o777)).unwrap();
    let as_tests = |args: &[&str]| {
        Command::new("runuser")
            .args(["-u", "tests", "--"])
            .args(args)
            .env("RUST_LOG", "warn")
            .current_dir("/")
            .output()
            .expect("run runuser")
    };
    // The other user writes through the mount; the journal names them.
    let target = m.p("pub/theirs.txt");
    let out = as_tests(&["sh", "-c", &format!("echo hi > '{}'", target.display())]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows = poll_log(m.path(), |r| {
        r.iter()
            .any(|x| x["op"] == json!("create") && x["path"] == json!("pub/theirs.txt"))
    });
    let create = find(&rows, "create", "pub/theirs.txt");
    assert_eq!(create["comm"], json!("sh"), "{create}");
    // But neither the journal nor the control socket is theirs to read.
    let b = bin();
    let b = b.to_str().unwrap();
    let mnt = m.path().to_str().unwrap();
    // Nor may they see the owner's diff, or change the workspace's state:
    // every state command is refused, on the mountpoint and on the upper.
    let up = ws.upper.to_str().unwrap();
    fn state_cmds<'a>(b: &'a str, ws: &'a str) -> Vec<Vec<&'a str>> {
        vec![
            vec![b, "status", ws],
            vec![b, "log", ws],
            vec![b, "diff", ws],
            vec![b, "reset", ws, "pub/theirs.txt"],
            vec![b, "gc", ws],
            vec![b, "snapshot", "save", ws, "theirs"],
            vec![b, "snapshot", "list", ws],
        ]
    }
    for args in state_cmds(b, mnt) {
        let out = as_tests(&args);
        assert!(!out.status.success(), "{args:?}: {}", stdout(&out));
        let err = stderr(&out);
        assert!(
            err.contains("another user") && err.contains("run as the user who mounted it"),
            "{args:?}: {err}"
        );
    }
    for args in state_cmds(b, up) {
        let out = as_tests(&args);
        assert!(!out.status.success(), "{args:?}: {}", stdout(&out));
        let err = stderr(&out);
        assert!(
            err.contains("permission denied") && err.contains("another user"),
            "{args:?}: {err}"
        );
    }
    // Their refused reset removed nothing.
    assert_eq!(fs::read_to_string(&target).unwrap(), "hi\n");
    // `status` without a workspace lists the mount and says why it cannot
    // tell more.
    let out = as_tests(&[b, "status", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let canon = fs::canonicalize(m.path()).unwrap();
    let mine = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["mountpoint"] == json!(canon.to_string_lossy()))
        .unwrap_or_else(|| panic!("{}", stdout(&out)));
    assert!(
        mine["error"]
            .as_str()
            .unwrap()
            .contains("another user's mount"),
        "{mine}"
    );
    assert!(mine["pid"].is_null(), "{mine}");
    drop(m);
}

/// The names of the daemon's threads.
fn thread_names(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .collect();
    names.sort();
    names
}

/// Nice values of `pid`'s threads by name (field 19 of each task's stat).
fn thread_nices(pid: u32) -> Vec<(String, i64)> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| {
            let stat = fs::read_to_string(t.ok()?.path().join("stat")).ok()?;
            let (head, tail) = stat.rsplit_once(')')?;
            let name = head.split_once('(')?.1.to_string();
            // After ")": state, ppid, ... nice is the 17th field there.
            let nice = tail.split_whitespace().nth(16)?.parse().ok()?;
            Some((name, nice))
        })
        .collect()
}

/// The journal writer yields to the threads that serve requests: it runs
/// 10 nice levels below the FUSE workers, which keep the daemon's own.
#[test]
fn journal_writer_runs_below_the_request_threads() {
    let ws = Workspace::new();
    let m = ws.mount();
    fs::write(m.p("a.txt"), "x").unwrap();
    poll_log(m.path(), |r| r.iter().any(|x| x["path"] == json!("a.txt")));
    let nices = thread_nices(m.pid());
    let writer: Vec<_> = nices.iter().filter(|(n, _)| n == "journal").collect();
    assert_eq!(writer.len(), 1, "{nices:?}");
    let workers: Vec<_> = nices
        .iter()
        .filter(|(n, _)| n.starts_with("fuser-"))
        .collect();
    assert!(!workers.is_empty(), "{nices:?}");
    let base = workers[0].1;
    assert!(
        base < 19,
        "the daemon already runs at the lowest priority: {nices:?}"
    );
    assert!(workers.iter().all(|(_, n)| *n == base), "{nices:?}");
    assert_eq!(writer[0].1, (base + 10).min(19), "{nices:?}");
}

/// An idle mount runs no journal writer; a change starts one, which writes
/// the change and goes away again once idle.
#[test]
fn journal_writer_runs_only_while_there_is_work() {
    let ws = Workspace::new();
    let m = ws.mount_env(&[], &[("LAYERFS_JOURNAL_IDLE_EXIT_MS", "300")]);
    let pid = m.pid();
    let idle = |what: &str| {
        eventually(Duration::from_secs(10), || {
            !thread_names(pid).iter().any(|t| t == "journal")
        });
        let names = thread_names(pid);
        assert!(!names.iter().any(|t| t == "journal"), "{what}: {names:?}");
    };
    idle("after mounting");
    for round in 0..3 {
        let name = format!("r{round}.txt");
        fs::write(m.p(&name), "x").unwrap();
        let rows = poll_log(m.path(), |r| {
            r.iter()
                .any(|x| x["op"] == json!("create") && x["path"] == json!(name))
        });
        assert_eq!(find(&rows, "create", &name)["result"], json!("ok"));
        idle("after a change");
    }
    let st = status_json(m.path());
    assert_eq!(st["journal"]["dropped"], json!(0), "{st}");
}

/// Every state command on a workspace whose state dir is elsewhere
/// (`--state DIR`), given its mountpoint, its upper or its state dir,
/// mounted and unmounted; and with `--state DIR` when the upper lost the
/// record of where its state is (copied without xattrs).
#[test]
fn every_state_command_finds_a_state_dir_elsewhere_from_any_of_its_paths() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("base"), "lower\n").unwrap();
    let state = ws.dir.path().join("elsewhere");
    let st = state.to_str().unwrap();
    let m = ws.mount_with(&["--state", st, "--scratch", "tmp/**"]);
    let canon_state = fs::canonicalize(&state).unwrap();
    // Nothing of the record shows through the mount.
    assert_eq!(
        xattr::list(m.path()).unwrap().count(),
        0,
        "the mount root shows xattrs"
    );
    let mut round = 0;
    let mut check_all = |mounted: bool, extra: &[&str]| {
        for arg in [&ws.mnt, &ws.upper, &state] {
            round += 1;
            let a = arg.to_str().unwrap();
            let run = |args: &[&str]| {
                let mut all: Vec<&str> = args.to_vec();
                all.extend(extra);
                let out = layerfs_quiet(&all);
                assert!(
                    out.status.success(),
                    "{all:?} (mounted {mounted}): {}",
                    stderr(&out)
                );
                stdout(&out)
            };
            if mounted {
                fs::write(ws.mnt.join(format!("new{round}")), "x").unwrap();
                fs::create_dir_all(ws.mnt.join("tmp")).unwrap();
                fs::write(ws.mnt.join("tmp/o"), "o").unwrap();
            }
            let v: Value = serde_json::from_str(run(&["status", "--json", a]).trim()).unwrap();
            assert_eq!(v["state"], json!(canon_state.to_string_lossy()), "{a}");
            assert_eq!(v["mounted"], json!(mounted), "{a}");
            let diff = run(&["diff", a]);
            assert!(diff.contains("new1"), "diff of {a}: {diff}");
            run(&["log", a]);
            let id = format!("s{round}");
            run(&["snapshot", "save", a, &id]);
            assert!(run(&["snapshot", "list", a]).contains(&id), "{a}");
            run(&["snapshot", "rm", a, &id]);
            run(&["gc", a]);
            run(&["reset", a, "base"]);
        }
    };
    check_all(true, &[]);
    assert!(m.unmount());
    check_all(false, &[]);
    // An upper copied without its xattrs: found with --state DIR.
    for name in [
        "trusted.overlay.layerfs.state",
        "user.overlay.layerfs.state",
    ] {
        let _ = xattr::remove(&ws.upper, name);
        let _ = xattr::remove(&ws.mnt, name);
    }
    let out = layerfs_quiet(&["diff", ws.upper.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--state"), "{}", stderr(&out));
    check_all(false, &["--state", st]);
    // --state naming another workspace's state dir is refused.
    let other = Workspace::new();
    drop(other.mount());
    let out = layerfs_quiet(&[
        "status",
        "--state",
        state_dir(&other).to_str().unwrap(),
        ws.upper.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("describes the workspace of upper"),
        "{}",
        stderr(&out)
    );
}

/// The doc's "Moving a workspace to another host" recipe, run as written:
/// two `--instance alice` workspaces over one lower stand for the two
/// hosts (their roots replace `/var/lib/layerfs` and `/run/layerfs`), a
/// directory for the object store (`rclone copy` becomes `cp`).
#[test]
fn the_recipe_for_moving_a_workspace_to_another_host_works_as_written() {
    // The section's heading, at whatever level the doc puts it.
    let heading = "# Moving a workspace to another host\n";
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![root.join("README.md")];
    if let Ok(rd) = fs::read_dir(root.join("docs")) {
        docs.extend(rd.flatten().map(|e| e.path()));
    }
    let text = docs
        .iter()
        .filter_map(|p| fs::read_to_string(p).ok())
        .find(|t| t.contains(heading))
        .expect("the recipe's section in README.md or docs/");
    let after = &text[text.find(heading).unwrap()..];
    let block = after.split("```sh\n").nth(1).unwrap();
    let block = &block[..block.find("```").unwrap()];

    let t = tempfile::Builder::new()
        .prefix("layerfs-test.")
        .tempdir()
        .unwrap();
    let lower = t.path().join("lower");
    fs::create_dir(&lower).unwrap();
    fs::write(lower.join("shared"), "shared\n").unwrap();
    let remote = t.path().join("remote");
    let host = |h: &str| (t.path().join(h).join("lib"), t.path().join(h).join("run"));
    let mut guards = vec![];
    for h in ["a", "b"] {
        let (lib, run) = host(h);
        let out = layerfs_quiet(&[
            "mount",
            "--instance",
            "alice",
            "--upper-root",
            lib.to_str().unwrap(),
            "--mount-root",
            run.to_str().unwrap(),
            "--lower",
            lower.to_str().unwrap(),
        ]);
        let mnt = run.join("alice/mnt");
        guards.push(crate::daemon::BgMount {
            pid: fs::canonicalize(&mnt)
                .ok()
                .and_then(|c| layerfs::host::pidfile::find_daemon(&c, None)),
            mnt,
        });
        assert!(out.status.success(), "mount on host {h}: {}", stderr(&out));
    }
    fs::write(host("a").1.join("alice/mnt/handover-note"), "from A\n").unwrap();

    let mut current = None;
    for line in block.lines().map(str::trim) {
        if line.starts_with("# host A") {
            current = Some(host("a"));
        } else if line.starts_with("# host B") {
            current = Some(host("b"));
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (lib, run) = current.as_ref().expect("a command before `# host …`");
        let mut cmd = line
            .replace("/var/lib/layerfs", lib.to_str().unwrap())
            .replace("/run/layerfs", run.to_str().unwrap())
            .replace("remote:bucket", remote.to_str().unwrap());
        if let Some(rest) = cmd.strip_prefix("rclone copy ") {
            let dest = rest.split_whitespace().last().unwrap().to_string();
            cmd = format!("mkdir -p {dest} && cp {rest}");
        }
        if let Some(rest) = cmd.strip_prefix("layerfs ") {
            cmd = format!("{} {rest}", bin().display());
        }
        let out = Command::new("sh")
            .arg("-c")
            .arg(&cmd)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`{line}` (as `{cmd}`): {}",
            stderr(&out)
        );
    }
    assert_eq!(
        fs::read_to_string(host("b").1.join("alice/mnt/handover-note")).unwrap(),
        "from A\n"
    );
    // Host B's state commands find alice's state from her upper too.
    let out = layerfs_quiet(&[
        "snapshot",
        "list",
        host("b").0.join("alice/upper").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("handover"), "{}", stdout(&out));
    drop(guards);
}
