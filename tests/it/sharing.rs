//! A mount other users share (`--allow-other`): what one of them (user
//! `tests`, uid 1001, the attacker here) can do to the owner (root, who
//! runs the daemon). It must not exhaust the daemon's descriptors, nor
//! hold up the owner's snapshots with an open file.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::harness::{bin, eventually, Mount, Workspace};

/// The other user.
const TENANT: u32 = 1001;

/// A python process run as `TENANT`, driven line by line: it prints a
/// line when it has done a step and waits for a line on stdin before the
/// next. Killed (by its pid) and reaped when dropped.
struct Tenant {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Tenant {
    fn start(script: &str, args: &[String]) -> Tenant {
        let mut child = Command::new("setpriv")
            .args([
                format!("--reuid={TENANT}"),
                format!("--regid={TENANT}"),
                "--clear-groups".into(),
                "--".into(),
                "/usr/bin/python3".into(),
                "-c".into(),
                script.into(),
            ])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run python3 as the other user");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Tenant {
            child,
            stdin,
            stdout,
        }
    }

    /// The next line the tenant prints.
    fn line(&mut self) -> String {
        let mut l = String::new();
        self.stdout.read_line(&mut l).unwrap();
        assert!(!l.is_empty(), "the other user's process ended early");
        l.trim_end().to_string()
    }

    /// Lets the tenant go on to its next step and returns what it prints.
    fn step(&mut self) -> String {
        let w = self.stdin.as_mut().expect("tenant still running");
        w.write_all(b"go\n").unwrap();
        w.flush().unwrap();
        self.line()
    }

    /// Ends the tenant (it exits at its last `go`, or on end of input).
    fn finish(mut self) {
        self.stdin.take();
        let _ = self.child.wait();
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        self.stdin.take();
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// A workspace the other user can reach (test workspaces are 0700).
fn shared_workspace() -> Workspace {
    let ws = Workspace::new();
    fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    ws
}

fn status(m: &Mount) -> Value {
    let out = Command::new(bin())
        .args(["status", "--json"])
        .arg(m.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The daemon's open fds, from /proc.
fn daemon_fds(m: &Mount) -> usize {
    fs::read_dir(format!("/proc/{}/fd", m.pid()))
        .unwrap()
        .count()
}

/// Lowers the daemon's fd limit to `n` and waits until it works with it
/// (it reads its limit again at most once a second).
fn limit_daemon_fds(m: &Mount, n: usize) {
    let out = Command::new("prlimit")
        .arg(format!("--pid={}", m.pid()))
        .arg(format!("--nofile={n}:{n}"))
        .output()
        .expect("run prlimit");
    assert!(out.status.success(), "prlimit: {}", text(&out));
    assert!(
        eventually(Duration::from_secs(10), || status(m)["descriptors"]
            ["limit"]
            == n),
        "{}",
        status(m)["descriptors"]
    );
}

/// The other uid's line in `status`'s open files, if it holds or was
/// refused any.
fn tenant_files(m: &Mount) -> Value {
    let st = status(m);
    st["open_files"]["by_uid"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["uid"] == TENANT)
        .cloned()
        .unwrap_or(Value::Null)
}

/// What the owner must still be able to do: read a file, list a
/// directory, create a file, and hold 100 files open at once.
fn owner_works(m: &Mount, new: &str) {
    assert_eq!(fs::read_to_string(m.p("own.txt")).unwrap(), "mine\n");
    assert!(fs::read_dir(m.path()).unwrap().count() > 20);
    fs::write(m.p(new), "created\n").unwrap_or_else(|e| panic!("owner's create: {e}"));
    let held: Vec<fs::File> = (0..100)
        .map(|i| fs::File::open(m.p(&format!("f{}", i % 20))).unwrap())
        .collect();
    drop(held);
}

/// Opens `argv[2:]` round robin `argv[1]` times and holds what it got;
/// prints how many, and each errno refused with its count. At the next
/// line tries 10 more opens and prints the same, then exits at the next.
const HOLDER: &str = r#"
import os, sys, errno
n = int(sys.argv[1]); paths = sys.argv[2:]
fds = []
def opens(k):
    refused = {}
    for i in range(k):
        try:
            fds.append(os.open(paths[i % len(paths)], os.O_RDONLY))
        except OSError as e:
            name = errno.errorcode[e.errno]
            refused[name] = refused.get(name, 0) + 1
    return " ".join(f"{k}={v}" for k, v in sorted(refused.items()))
r = opens(n)
print(len(fds), r, flush=True)
sys.stdin.readline()
before = len(fds)
r = opens(10)
print(len(fds) - before, r, flush=True)
sys.stdin.readline()
"#;

#[test]
fn another_user_holding_files_open_cannot_exhaust_the_daemons_fds() {
    let ws = shared_workspace();
    for i in 0..20 {
        fs::write(ws.lower().join(format!("f{i}")), format!("{i}\n")).unwrap();
    }
    fs::write(ws.lower().join("own.txt"), "mine\n").unwrap();
    let m = ws.mount_with(&["--allow-other", "--no-journal"]);
    // Far fewer than the opens below: the daemon cannot keep an fd for
    // each, as it could not once the holders outnumber its limit.
    limit_daemon_fds(&m, 1024);
    owner_works(&m, "new0");
    let baseline = daemon_fds(&m);

    let paths: Vec<String> = (0..20)
        .map(|i| m.p(&format!("f{i}")).to_string_lossy().into_owned())
        .collect();
    let mut args = vec!["1500".to_string()];
    args.extend(paths);
    let mut holder = Tenant::start(HOLDER, &args);
    let got = holder.line();
    let (held, refused) = got.split_once(' ').unwrap_or((&got, ""));
    let held: usize = held.parse().unwrap();
    // While it holds them, the owner works as before.
    owner_works(&m, "new1");
    // The other user got its share and no more: the rest EMFILE, the
    // open(2) error for "too many open files", and nothing else.
    let mine = tenant_files(&m);
    assert_eq!(mine["open"], Value::from(held), "{mine}");
    assert!(held > 0 && held < 1500, "{got}");
    assert_eq!(refused, format!("EMFILE={}", 1500 - held), "{got}");
    let share = status(&m)["open_files"]["per_user_limit"].as_u64().unwrap() as usize;
    assert_eq!(held, share, "{got}");
    // `status` shows it to the administrator.
    let out = Command::new(bin())
        .arg("status")
        .arg(m.path())
        .output()
        .unwrap();
    let shown = text(&out);
    assert!(
        shown.contains(&format!(
            "uid {TENANT} {held}/{share} ({} refused)",
            1500 - held
        )),
        "{shown}"
    );

    // The other user's further opens are refused, its own only.
    assert_eq!(holder.step(), "0 EMFILE=10");
    owner_works(&m, "new2");

    // Once the holder exits, every fd it made the daemon open is closed
    // (the kernel releases its files after the process is gone). The
    // files the owner created keep one cached fd each.
    holder.finish();
    assert!(
        eventually(Duration::from_secs(10), || daemon_fds(&m) <= baseline + 2),
        "daemon fds {} after the holder exited, {baseline} before",
        daemon_fds(&m)
    );
    assert_eq!(tenant_files(&m)["open"], Value::from(0));
    // The refusals are counted for the administrator.
    assert_eq!(
        tenant_files(&m)["refused"],
        Value::from(1500 - held + 10),
        "{}",
        tenant_files(&m)
    );
    assert!(m.unmount());
}

/// Opens each of `argv[1:]` with O_PATH (no open file in the mount, only
/// the object held) and holds them; prints how many it got, then exits at
/// the next line.
const PATH_HOLDER: &str = r#"
import os, sys
fds = []
for p in sys.argv[1:]:
    try:
        fds.append(os.open(p, os.O_PATH))
    except OSError:
        pass
print(len(fds), flush=True)
sys.stdin.readline()
"#;

#[test]
fn files_another_user_holds_cannot_pin_the_daemons_fds_once_removed() {
    let ws = shared_workspace();
    for i in 0..20 {
        fs::write(ws.lower().join(format!("f{i}")), format!("{i}\n")).unwrap();
    }
    fs::write(ws.lower().join("own.txt"), "mine\n").unwrap();
    // The owner's build tree, in the upper.
    fs::create_dir(ws.upper.join("build")).unwrap();
    let n = 1200;
    for i in 0..n {
        fs::write(ws.upper.join(format!("build/o{i}")), "obj\n").unwrap();
    }
    let m = ws.mount_with(&["--allow-other", "--no-journal"]);
    limit_daemon_fds(&m, 1024);
    // The other user holds every object of the tree (it needs only to
    // look them up), and waits for the owner to remove them: a removed
    // file the kernel holds used to keep an fd open in the daemon.
    let args: Vec<String> = (0..n)
        .map(|i| m.p(&format!("build/o{i}")).to_string_lossy().into_owned())
        .collect();
    let mut holder = Tenant::start(PATH_HOLDER, &args);
    assert_eq!(holder.line(), n.to_string());
    owner_works(&m, "new0");
    for i in 0..n {
        fs::remove_file(m.p(&format!("build/o{i}"))).unwrap();
    }
    owner_works(&m, "new1");
    let d = status(&m)["descriptors"].clone();
    assert!(
        d["pinned"]["open"].as_u64() <= d["pinned"]["limit"].as_u64(),
        "{d}"
    );
    // A file the owner removes while holding it open stays readable.
    let mut f = fs::File::open(m.p("own.txt")).unwrap();
    fs::write(m.p("tmp.txt"), "kept while open\n").unwrap();
    let kept = fs::File::open(m.p("tmp.txt")).unwrap();
    fs::remove_file(m.p("tmp.txt")).unwrap();
    owner_works(&m, "new2");
    assert_eq!(std::io::read_to_string(&kept).unwrap(), "kept while open\n");
    assert_eq!(std::io::read_to_string(&mut f).unwrap(), "mine\n");
    drop((f, kept));
    holder.finish();
    assert!(m.unmount());
}

/// Record size of the writer below: whole pages, each numbered.
const RECORD: usize = 4096;

fn record(seq: usize) -> Vec<u8> {
    let mut r = format!("{seq:08} ").into_bytes();
    r.resize(RECORD - 1, b'a' + (seq % 26) as u8);
    r.push(b'\n');
    r
}

/// Opens `argv[1]` for writing and leaves it idle; writes numbered 4 KiB
/// records to `argv[2]` in a loop, one write(2) each, from a thread.
/// Prints `ready` once both are open and records are flowing; at the next
/// line stops and prints how many records it wrote.
const WRITERS: &str = r#"
import os, sys, threading
idle = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
log = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
stop = threading.Event(); count = [0]; started = threading.Event()
def record(seq):
    r = b"%08d " % seq
    return r + bytes([ord("a") + seq % 26]) * (4096 - 1 - len(r)) + b"\n"
def loop():
    while not stop.is_set():
        assert os.write(log, record(count[0])) == 4096
        count[0] += 1
        if count[0] == 50:
            started.set()
threading.Thread(target=loop, daemon=True).start()
started.wait()
print("ready", flush=True)
sys.stdin.readline()
stop.set()
while threading.active_count() > 1:
    threading.enumerate()[-1].join()
print(count[0], flush=True)
sys.stdin.readline()
"#;

/// Checks that `data` is whole records 0, 1, 2, …; returns how many.
fn whole_records(data: &[u8]) -> usize {
    assert_eq!(
        data.len() % RECORD,
        0,
        "{} bytes: a torn record",
        data.len()
    );
    for (seq, r) in data.chunks(RECORD).enumerate() {
        assert!(r == record(seq).as_slice(), "record {seq} is not whole");
    }
    data.len() / RECORD
}

fn snapshot(args: &[&str]) -> Output {
    Command::new(bin())
        .arg("snapshot")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The content of `name` in the snapshot archive `tar`.
fn archived(tar: &Path, name: &str) -> Option<Vec<u8>> {
    let mut ar = tar::Archive::new(fs::File::open(tar).unwrap());
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().to_string_lossy() == name {
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            return Some(data);
        }
    }
    None
}

fn snapshots_dir(ws: &Workspace) -> PathBuf {
    ws.dir.path().join(".upper.layerfs-state/snapshots")
}

/// A directory every user may create files in, made through the mount.
fn public_dir(m: &Mount) {
    fs::create_dir(m.p("pub")).unwrap();
    fs::set_permissions(m.p("pub"), fs::Permissions::from_mode(0o1777)).unwrap();
}

#[test]
fn another_users_open_files_do_not_hold_up_the_owners_snapshot() {
    let ws = shared_workspace();
    fs::write(ws.lower().join("own.txt"), "mine\n").unwrap();
    let m = ws.mount_with(&["--allow-other"]);
    public_dir(&m);
    let idle = m.p("pub/idle.bin");
    let log = m.p("pub/log.bin");
    let args = [idle, log].map(|p| p.to_string_lossy().into_owned());
    let mut writers = Tenant::start(WRITERS, &args);
    assert_eq!(writers.line(), "ready");

    // Saved twice while the other user holds one file open for writing
    // and writes the other: no wait for them, no --force.
    let mnt = m.path().to_str().unwrap();
    for id in ["s1", "s2"] {
        let out = snapshot(&["save", mnt, id]);
        assert!(out.status.success(), "save {id}: {}", text(&out));
    }
    let written: usize = writers.step().parse().unwrap();
    writers.finish();
    // Each snapshot holds whole records only (a pause between two writes,
    // never inside one), more in the later one, and writing went on
    // after the pauses.
    let mut seen = Vec::new();
    for id in ["s1", "s2"] {
        let tar = snapshots_dir(&ws).join(format!("{id}.tar"));
        let data = archived(&tar, "pub/log.bin").expect("pub/log.bin archived");
        seen.push(whole_records(&data));
        assert_eq!(archived(&tar, "pub/idle.bin"), Some(Vec::new()));
    }
    assert!(
        seen[0] >= 50 && seen[0] <= seen[1] && seen[1] <= written,
        "{seen:?} {written}"
    );
    assert_eq!(
        whole_records(&fs::read(m.p("pub/log.bin")).unwrap()),
        written
    );
    assert!(m.unmount());
}

#[test]
fn another_users_open_files_do_not_hold_up_the_owners_live_restore() {
    let ws = shared_workspace();
    let m = ws.mount_with(&["--allow-other"]);
    fs::write(m.p("own.txt"), "one\n").unwrap();
    let mnt = m.path().to_str().unwrap();
    let out = snapshot(&["save", mnt, "s"]);
    assert!(out.status.success(), "{}", text(&out));
    fs::write(m.p("own.txt"), "two\n").unwrap();
    public_dir(&m);
    let idle = m.p("pub/idle.bin");
    let log = m.p("pub/log.bin");
    let args = [idle, log].map(|p| p.to_string_lossy().into_owned());
    let mut writers = Tenant::start(WRITERS, &args);
    assert_eq!(writers.line(), "ready");
    let out = snapshot(&["restore", mnt, "s"]);
    assert!(out.status.success(), "restore: {}", text(&out));
    assert_eq!(fs::read_to_string(m.p("own.txt")).unwrap(), "one\n");
    // The other user's files did not exist in the snapshot: what it
    // writes on goes to the discarded tree, as into a file deleted while
    // open.
    assert!(!m.p("pub").exists());
    writers.step();
    writers.finish();
    assert!(m.unmount());
}

/// Opens `argv[1]` for writing with O_TRUNC; prints `ok` or the errno.
const TRUNCATE: &str = r#"
import os, sys, errno
try:
    os.close(os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC))
    print("ok", flush=True)
except OSError as e:
    print(errno.errorcode[e.errno], flush=True)
"#;

#[test]
fn another_user_cannot_write_a_file_the_owner_holds_through_passthrough() {
    let ws = shared_workspace();
    let m = ws.mount_with(&["--allow-other"]);
    public_dir(&m);
    fs::write(m.p("pub/shared.txt"), "owner's\n").unwrap();
    fs::set_permissions(m.p("pub/shared.txt"), fs::Permissions::from_mode(0o666)).unwrap();
    let path = m.p("pub/shared.txt").to_string_lossy().into_owned();
    // The owner reads it, through passthrough when the daemon runs as
    // root: another user's open for writing would have to be passthrough
    // too, whose writes no pause can stop. It is refused (ETXTBSY, "file
    // busy"), and the file is not truncated.
    let reading = fs::File::open(m.p("pub/shared.txt")).unwrap();
    let mut t = Tenant::start(TRUNCATE, std::slice::from_ref(&path));
    let got = t.line();
    t.finish();
    if std::env::var_os("LAYERFS_NO_PASSTHROUGH").is_none() {
        assert_eq!(got, "ETXTBSY");
        assert_eq!(std::io::read_to_string(&reading).unwrap(), "owner's\n");
    } else {
        assert_eq!(got, "ok");
    }
    drop(reading);
    // Closed: the other user writes it, through the daemon.
    let mut t = Tenant::start(TRUNCATE, std::slice::from_ref(&path));
    assert_eq!(t.line(), "ok");
    t.finish();
    assert_eq!(fs::read_to_string(m.p("pub/shared.txt")).unwrap(), "");
    assert!(m.unmount());
}

/// Maps `argv[1]` (64 KiB, created) shared and writable; prints `ready`.
/// At the next line fills its first page with `X` through the mapping,
/// then msync(MS_SYNC)s it and prints `synced`; exits at the next line.
const MAPPER: &str = r#"
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 65536)
m = mmap.mmap(fd, 65536, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
assert m[0:1] == b"\0"
print("ready", flush=True)
sys.stdin.readline()
m[0:4096] = b"X" * 4096
m.flush()
print("synced", flush=True)
sys.stdin.readline()
"#;

#[test]
fn another_users_shared_writable_mapping_waits_for_a_pause_to_end() {
    use std::os::unix::net::UnixStream;
    let ws = shared_workspace();
    let m = ws.mount_with(&["--allow-other"]);
    public_dir(&m);
    let args = [m.p("pub/mapped.bin").to_string_lossy().into_owned()];
    let mut mapper = Tenant::start(MAPPER, &args);
    assert_eq!(mapper.line(), "ready");
    let upper = ws.upper.join("pub/mapped.bin");
    let first_page = || fs::read(&upper).unwrap()[..4096].to_vec();
    assert_eq!(first_page(), vec![0u8; 4096]);

    // Writes paused, as a snapshot pauses them: the mapping's dirty page
    // reaches the file only as a WRITE request, which waits at the gate.
    let control = ws.dir.path().join(".upper.layerfs-state/control.sock");
    let sock = UnixStream::connect(control).unwrap();
    let mut answers = BufReader::new(sock.try_clone().unwrap());
    let mut ask = |req: &str| {
        writeln!(&sock, "{req}").unwrap();
        let mut l = String::new();
        answers.read_line(&mut l).unwrap();
        serde_json::from_str::<Value>(&l).unwrap()
    };
    let paused = ask(r#"{"cmd": "pause", "wait_ms": 100}"#);
    assert_eq!(paused["busy"], serde_json::json!([]), "{paused}");
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let got = mapper.step();
        tx.send(got).unwrap();
        mapper
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "msync of another user's mapping went through while paused"
    );
    assert_eq!(
        first_page(),
        vec![0u8; 4096],
        "the file changed while paused"
    );
    assert_eq!(ask(r#"{"cmd": "resume"}"#)["resumed"], Value::Bool(true));
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), "synced");
    assert_eq!(first_page(), vec![b'X'; 4096]);
    let mapper = waiter.join().unwrap();
    mapper.finish();
    assert!(m.unmount());
}

/// Keeps the copies of objects named `big` held before each chunk (the
/// `hold:copy_chunk` failpoint) while its file exists; removed when
/// dropped, so a failing test never leaves a copy held.
struct Hold(PathBuf);

impl Hold {
    fn new(ws: &Workspace) -> Hold {
        let p = ws.dir.path().join("hold");
        fs::write(&p, "").unwrap();
        Hold(p)
    }

    /// The daemon's environment arming the failpoint.
    fn env(&self) -> [(&'static str, &str); 2] {
        [
            ("LAYERFS_FAILPOINT", "hold:copy_chunk:big"),
            ("LAYERFS_FAILPOINT_WHILE", self.0.to_str().unwrap()),
        ]
    }

    fn release(&self) {
        let _ = fs::remove_file(&self.0);
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
    }
}

/// A lower file named `big` of 12 MiB of data (a long copy: over
/// `LONG_COPY`), writable by anyone, under `dir` in the lower.
fn big_lower(ws: &Workspace, dir: &str) -> Vec<u8> {
    let data: Vec<u8> = (0..12u32 << 20).map(|i| (i % 251) as u8).collect();
    let d = ws.lower().join(dir);
    fs::create_dir_all(&d).unwrap();
    fs::write(d.join("big"), &data).unwrap();
    fs::set_permissions(d.join("big"), fs::Permissions::from_mode(0o666)).unwrap();
    data
}

/// Copy-ups under way: the temp files in the work dir.
fn copying(ws: &Workspace) -> usize {
    fs::read_dir(&ws.work)
        .map(|d| d.count())
        .unwrap_or_default()
}

/// Runs `f` on a thread of its own and returns what it returned, or
/// `None` if it has not returned after a minute. A bound for a hang (a
/// request no thread serves), not a timing: whatever this waits for takes
/// milliseconds when it works.
fn unless_hung<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60)).ok()
}

/// Opens each of `argv[1:]` for writing, each on a thread of its own;
/// prints `started` once all are under way, then `opened` (or the errno)
/// for each open as it returns; exits at the next line.
const OPENERS: &str = r#"
import os, sys, threading, errno
lock = threading.Lock()
def say(line):
    # One write per line: print() from threads writes the text and its
    # newline apart, and two lines could interleave ("openedopened").
    with lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
def opener(p):
    try:
        os.open(p, os.O_WRONLY)
        say("opened")
    except OSError as e:
        say(errno.errorcode[e.errno])
for p in sys.argv[1:]:
    threading.Thread(target=opener, args=(p,), daemon=True).start()
say("started")
sys.stdin.readline()
"#;

#[test]
fn another_users_long_copy_ups_do_not_hold_the_request_threads() {
    let ws = shared_workspace();
    let data = big_lower(&ws, "d0");
    for d in ["d1", "d2", "d3"] {
        big_lower(&ws, d);
    }
    fs::create_dir(ws.lower().join("elsewhere")).unwrap();
    fs::write(ws.lower().join("elsewhere/small"), "small\n").unwrap();
    let hold = Hold::new(&ws);
    // As many copies as request threads (4 by default).
    let m = ws.mount_env(&["--allow-other", "--no-journal"], &hold.env());
    let paths: Vec<String> = (0..4)
        .map(|i| m.p(&format!("d{i}/big")).to_string_lossy().into_owned())
        .collect();
    let mut openers = Tenant::start(OPENERS, &paths);
    assert_eq!(openers.line(), "started");
    // The other user's copies run (held: they cannot end while the hold
    // file exists), as many at once as its share of the copy threads.
    assert!(
        eventually(Duration::from_secs(60), || copying(&ws) >= 3),
        "copies did not start"
    );
    // The owner is served meanwhile: a lookup, a read, a new file.
    let small = m.p("elsewhere/small");
    let new = m.p("elsewhere/new");
    let owner = unless_hung(move || {
        let meta = fs::metadata(&small).map(|m| m.len());
        let read = fs::read_to_string(&small);
        let made = fs::write(&new, "new\n");
        (meta.ok(), read.ok(), made.is_ok())
    });
    let held = copying(&ws);
    hold.release();
    assert_eq!(
        owner,
        Some((Some(6), Some("small\n".into()), true)),
        "the owner was not served while another user's copies ran"
    );
    assert!(held >= 3, "the copies ended before the owner was served");
    // Then the copies complete, whole, and nothing is left in the work dir.
    for _ in 0..4 {
        assert_eq!(openers.line(), "opened");
    }
    openers.finish();
    for i in 0..4 {
        let up = fs::read(ws.upper.join(format!("d{i}/big"))).unwrap();
        assert!(up == data, "d{i}/big copied up incomplete");
    }
    assert_eq!(copying(&ws), 0);
    assert!(m.unmount());
}

#[test]
fn a_killed_opener_stops_its_copy_and_leaves_nothing_behind() {
    let ws = shared_workspace();
    let data = big_lower(&ws, "d");
    let hold = Hold::new(&ws);
    let m = ws.mount_env(&["--allow-other", "--no-journal"], &hold.env());
    let path = m.p("d/big").to_string_lossy().into_owned();
    let mut opener = Tenant::start(OPENERS, &[path]);
    assert_eq!(opener.line(), "started");
    assert!(eventually(Duration::from_secs(60), || copying(&ws) == 1));
    opener.child.kill().unwrap();
    // The copy stops although the hold file is still there (the copy could
    // not have ended by itself), and leaves nothing in the work dir or the
    // upper.
    let stopped = eventually(Duration::from_secs(60), || copying(&ws) == 0);
    let leftover = ws.upper.join("d/big").exists();
    hold.release();
    assert!(stopped, "the killed opener's copy went on");
    assert!(!leftover, "a half-done copy became visible");
    let _ = opener.child.wait();
    // The file reads as before, from the lower; a later open copies it.
    assert!(fs::read(m.p("d/big")).unwrap() == data);
    assert!(!ws.upper.join("d/big").exists());
    fs::OpenOptions::new()
        .append(true)
        .open(m.p("d/big"))
        .unwrap();
    assert!(fs::read(ws.upper.join("d/big")).unwrap() == data);
    assert!(m.unmount());
}

/// Creates `argv[1]/src` (40 MiB) and copies it to `argv[1]/dst` with
/// `copy_file_range`, asking for 1 GiB at each call; prints what the first
/// call copied and the total.
const COPY_RANGE: &str = r#"
import os, sys
d = sys.argv[1]; n = 40 << 20
data = bytes(i % 251 for i in range(1 << 20)) * 40
with open(d + "/src", "wb") as f:
    f.write(data)
a = os.open(d + "/src", os.O_RDONLY)
b = os.open(d + "/dst", os.O_WRONLY | os.O_CREAT, 0o644)
first = os.copy_file_range(a, b, 1 << 30)
total = first
while True:
    k = os.copy_file_range(a, b, 1 << 30)
    if k == 0:
        break
    total += k
print(first, total, flush=True)
"#;

#[test]
fn copy_file_range_through_the_mount_copies_a_bounded_amount_per_call() {
    let ws = shared_workspace();
    let m = ws.mount_with(&["--allow-other", "--no-journal"]);
    public_dir(&m);
    let mut t = Tenant::start(COPY_RANGE, &[m.p("pub").to_string_lossy().into_owned()]);
    let got = t.line();
    t.finish();
    let (first, total) = got.split_once(' ').unwrap();
    let (first, total): (u64, u64) = (first.parse().unwrap(), total.parse().unwrap());
    // A short count (callers loop), of at most one chunk (16 MiB).
    assert!(first > 0 && first <= 16 << 20, "{got}");
    assert_eq!(total, 40 << 20);
    assert!(fs::read(m.p("pub/dst")).unwrap() == fs::read(m.p("pub/src")).unwrap());
    assert!(m.unmount());
}

#[test]
fn long_copies_waiting_for_a_pause_neither_stall_the_mount_nor_get_lost() {
    let ws = shared_workspace();
    let data = big_lower(&ws, "d");
    fs::write(ws.lower().join("own.txt"), "mine\n").unwrap();
    let hold = Hold::new(&ws);
    let m = ws.mount_env(&["--allow-other"], &hold.env());
    let path = m.p("d/big").to_string_lossy().into_owned();
    let mut opener = Tenant::start(OPENERS, &[path]);
    assert_eq!(opener.line(), "started");
    assert!(eventually(Duration::from_secs(60), || copying(&ws) == 1));
    // The owner's snapshot pauses writes: it does not wait for the copy
    // (which cannot end while the hold file exists).
    let mnt = m.path().to_str().unwrap().to_string();
    let saved = unless_hung(move || snapshot(&["save", &mnt, "s1"]));
    let own = fs::read_to_string(m.p("own.txt")).ok();
    let held = ws.dir.path().join("hold").exists();
    assert!(
        eventually(Duration::from_secs(60), || copying(&ws) == 1),
        "the copy did not start again after the pause"
    );
    hold.release();
    let saved = saved.expect("the snapshot waited for another user's copy");
    assert!(saved.status.success(), "{}", text(&saved));
    assert!(held);
    assert_eq!(own.as_deref(), Some("mine\n"));
    // The copy was not part of the snapshot, and not lost: the open
    // completes once the hold ends, with the whole file.
    let tar = snapshots_dir(&ws).join("s1.tar");
    assert_eq!(archived(&tar, "d/big"), None);
    assert_eq!(opener.line(), "opened");
    opener.finish();
    assert!(fs::read(ws.upper.join("d/big")).unwrap() == data);
    assert!(m.unmount());
}

/// Lists `argv[1]` over and over on four threads; prints `listing` once
/// each has listed it once, and exits at the next line.
const LISTERS: &str = r#"
import os, sys, threading
done = threading.Barrier(5)
def lister():
    os.listdir(sys.argv[1])
    done.wait()
    while True:
        os.listdir(sys.argv[1])
for _ in range(4):
    threading.Thread(target=lister, daemon=True).start()
done.wait()
print("listing", flush=True)
sys.stdin.readline()
"#;

#[test]
fn a_listing_shared_with_other_readers_still_shows_later_changes() {
    let ws = shared_workspace();
    let many = ws.lower().join("many");
    fs::create_dir(&many).unwrap();
    fs::set_permissions(&many, fs::Permissions::from_mode(0o777)).unwrap();
    // Over LONG_LISTING entries: from the second listing on, listings of
    // it are built on the copy pool and shared between concurrent readers.
    for i in 0..12_000 {
        fs::write(many.join(format!("e{i}")), "").unwrap();
    }
    let m = ws.mount_with(&["--allow-other", "--no-journal"]);
    let dir = m.p("many");
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 12_000);
    let mut listers = Tenant::start(LISTERS, &[dir.to_string_lossy().into_owned()]);
    assert_eq!(listers.line(), "listing");
    // Each change is in the next listing the owner takes, however the
    // other user's listings overlap it.
    for k in 0..20 {
        let name = format!("new{k}");
        fs::write(dir.join(&name), "").unwrap();
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.contains(&name), "{name} missing from a later listing");
        assert_eq!(names.len(), 12_001);
        fs::remove_file(dir.join(&name)).unwrap();
        let gone = fs::read_dir(&dir)
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy() == name);
        assert!(!gone, "{name} still listed after its removal");
    }
    listers.finish();
    assert!(m.unmount());
}
