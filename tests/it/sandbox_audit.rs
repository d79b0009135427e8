//! The sandbox of `layerfs run` attacked from inside, as root and as the
//! unprivileged user `tests`: every way a command could change the host
//! outside the workspace must fail.
//!
//! - the kernel's settings: a real write to a harmless sysctl (the host's
//!   value compared before and after, and put back whatever happens);
//!   opening `core_pattern`, `sysrq-trigger` and others for writing
//!   (opened only, never written);
//! - an enumeration of every path under `/proc` and `/sys` the command may
//!   write (`access(W_OK)`, nothing is written), failing on any outside a
//!   short allow list of per-process files;
//! - device nodes: only the usual ones in `/dev`, the host's nodes
//!   unusable, none can be made;
//! - the caller's terminal: `TIOCSTI` on every terminal the command can
//!   find, with `layerfs run` under script(1), and the calling shell
//!   checked for injected input afterwards;
//! - host sockets: a listening Unix socket under the host's `/run`, the
//!   workspace's `control.sock`, an abstract socket of the host;
//! - mounts: mount, umount, remount, bind, `unshare -m`, and inside a
//!   nested user namespace the mounts that would undo the masks;
//! - the bounded tmpfs behind `/tmp`, `/dev/shm` and `/run`.
//!
//! And interactive use through the command's terminal keeps working:
//! window size (also when it changes), Ctrl-C, exit code, `--max-output`,
//! `--json`, the caller's terminal mode restored.

use std::fs;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{bin, eventually};
use crate::run::{
    run_as, run_cmd, s, stderr, stdout, tests_ids, text, workspace_for, Caller, KillGroup,
    OpenFuse, Running,
};

/// A harmless sysctl the attack tries to change: how long the kernel waits
/// for a lease holder (fs/lease-break-time, seconds).
const SYSCTL: &str = "/proc/sys/fs/lease-break-time";

/// Puts the host's value of `SYSCTL` back when dropped, if a run changed it.
struct SysctlGuard {
    before: String,
}

impl SysctlGuard {
    fn new() -> SysctlGuard {
        SysctlGuard {
            before: fs::read_to_string(SYSCTL).unwrap(),
        }
    }

    fn value(&self) -> u64 {
        self.before.trim().parse().unwrap()
    }

    fn changed(&self) -> bool {
        fs::read_to_string(SYSCTL).unwrap() != self.before
    }
}

impl Drop for SysctlGuard {
    fn drop(&mut self) {
        if self.changed() {
            let _ = fs::write(SYSCTL, &self.before);
        }
    }
}

/// Removes a path when dropped.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// The probe run inside the sandbox: takes a JSON plan, prints one line
/// `AUDIT <json>` with what each attempt gave.
const PROBE: &str = r#"
import errno, fcntl, glob, json, os, re, socket, stat, subprocess, sys, termios
cfg = json.loads(sys.argv[1])
out = {"writes": {}, "writable": [], "checked": 0, "devices": [], "host_devices": {},
       "mknod": "", "tiocsti": {}, "sockets": {}, "mounts": {}, "nested": {}}

def why(e):
    return "refused: " + os.strerror(e.errno)

# Writes: with data, written for real (the test puts the host value back);
# without, only opened for writing and closed again.
for path, data in cfg["writes"]:
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as e:
        out["writes"][path] = why(e); continue
    try:
        if data is None:
            out["writes"][path] = "opened for writing"
        else:
            os.write(fd, data.encode()); out["writes"][path] = "written"
    except OSError as e:
        out["writes"][path] = why(e)
    finally:
        os.close(fd)

# Per-process files a process may write about itself (or a nested user
# namespace's child): only the sandbox's own processes show under /proc.
PER_PROCESS = {"autogroup", "clear_refs", "comm", "coredump_filter", "fail-nth",
               "gid_map", "loginuid", "make-it-fail", "mem", "oom_adj", "oom_score_adj",
               "projid_map", "sched", "setgroups", "timens_offsets", "timerslack_ns",
               "uid_map"}
def allowed(p, st):
    # A masked file is the null device: what is written there goes nowhere.
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3):
        return True
    parts = p.split("/")[2:]
    if p.startswith("/proc/") and parts and (parts[0].isdigit() or parts[0] in ("self", "thread-self")):
        rest = parts[1:]
        if len(rest) >= 2 and rest[0] == "task":
            rest = rest[2:]
        # attr/*: the security module's labels of the process itself.
        if rest and rest[0] == "attr":
            return True
        return len(rest) == 1 and rest[0] in PER_PROCESS
    return False

for top in ("/proc", "/sys"):
    for d, dirs, files in os.walk(top):
        for name in dirs + files:
            p = os.path.join(d, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            out["checked"] += 1
            if stat.S_ISLNK(st.st_mode):
                continue
            # proc cannot create files or directories: a directory there
            # that access() calls writable (root's DAC override) holds
            # nothing new. Under /sys (cgroups, configfs, tracing) it would.
            if top == "/proc" and stat.S_ISDIR(st.st_mode):
                continue
            # Writable: the kernel offers a write (a write bit; a proc or
            # sysfs file without one has no write method, whatever root's
            # DAC override lets access() say) and access() grants it.
            if st.st_mode & 0o222 and os.access(p, os.W_OK) and not allowed(p, st):
                out["writable"].append(p)

DEV_OK = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty",
          "/dev/pts/ptmx"}
for d, dirs, files in os.walk("/dev"):
    for name in dirs + files:
        p = os.path.join(d, name)
        st = os.lstat(p)
        if (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)) and p not in DEV_OK \
                and not re.fullmatch(r"/dev/pts/[0-9]+", p):
            out["devices"].append(p)
for p in cfg["host_devices"]:
    try:
        os.close(os.open(p, os.O_RDWR)); out["host_devices"][p] = "opened for writing"
    except OSError as e:
        out["host_devices"][p] = why(e)
try:
    os.mknod("/tmp/null-copy", stat.S_IFCHR | 0o666, os.makedev(1, 3)); out["mknod"] = "made"
except OSError as e:
    out["mknod"] = why(e)

def inject(name, fd):
    if not os.isatty(fd):
        out["tiocsti"][name] = "not a terminal"; return
    try:
        for c in cfg["payload"].encode():
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([c]))
        out["tiocsti"][name] = "INJECTED"
    except OSError as e:
        out["tiocsti"][name] = why(e)
for fd in (0, 1, 2):
    inject("fd%d" % fd, fd)
for p in ["/dev/tty"] + glob.glob("/dev/pts/*") + glob.glob("/proc/[0-9]*/fd/*"):
    try:
        fd = os.open(p, os.O_RDWR | os.O_NOCTTY)
    except OSError as e:
        out["tiocsti"][p] = why(e); continue
    try:
        inject(p, fd)
    finally:
        os.close(fd)

for p in cfg["sockets"]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(p if not p.startswith("@") else "\0" + p[1:]); out["sockets"][p] = "connected"
    except OSError as e:
        out["sockets"][p] = why(e)
    finally:
        s.close()

def sh(cmd):
    r = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True)
    return "exit %d: %s" % (r.returncode, (r.stdout + r.stderr).strip()[:200])
for i in range(1, 6):
    os.makedirs("/tmp/m%d" % i, exist_ok=True)
for cmd in cfg["mounts"]:
    out["mounts"][cmd] = sh(cmd)
for cmd in cfg["nested"]:
    out["nested"][cmd] = sh(cmd)
print("AUDIT " + json.dumps(out))
"#;

/// Mount calls that must all fail inside the sandbox.
const MOUNTS: [&str; 13] = [
    "mount -t tmpfs none /tmp/m1",
    "mount --bind /tmp /tmp/m2",
    "mount -o remount,rw /",
    "mount -o remount,rw /proc/sys",
    "mount -o remount,bind,rw /proc/sys",
    "umount /proc/sys",
    "umount -l /run",
    "umount /sys/firmware",
    "mount -t proc proc /tmp/m3",
    "mount -t sysfs sysfs /tmp/m4",
    "mount -t tmpfs none /proc/sys",
    "mount -t tmpfs none /sys/firmware",
    "unshare -m sh -c 'mount -t tmpfs none /tmp/m5'",
];

/// Inside a nested user namespace (which any process may create, and in
/// which it holds every capability over its own mounts), what would undo
/// the masks or reach the host's settings must still fail: the mounts it
/// inherits are locked. (Mounting a new tmpfs there succeeds and only
/// hides more.)
fn nested(value: u64) -> Vec<String> {
    [
        "umount /proc/sys",
        "umount -l /proc/sys",
        "mount -o remount,rw /proc/sys",
        "mount -o remount,bind,rw /proc/sys",
        "mount -o remount,bind,rw /",
        "mount --bind /proc /tmp/m1",
        "umount -l /run",
        "umount /sys/firmware",
    ]
    .iter()
    .map(|c| format!("unshare -Urm sh -c '{c}'"))
    .chain([
        format!("unshare -Urm sh -c 'echo {value} > {SYSCTL}'"),
        "unshare -Urmpf sh -c 'mount -t proc proc /tmp/m3'".to_string(),
        "unshare -Urmn sh -c 'mount -t sysfs sysfs /tmp/m4'".to_string(),
    ])
    .collect()
}

/// The `AUDIT` line of a probe run.
fn audit_of(out: &Output) -> Value {
    let o = stdout(out);
    let line = o
        .lines()
        .find_map(|l| l.trim_end_matches('\r').strip_prefix("AUDIT "))
        .unwrap_or_else(|| panic!("no audit line: {}", text(out)));
    serde_json::from_str(line).unwrap()
}

/// Every value of a JSON object.
fn entries(v: &Value) -> Vec<(String, String)> {
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect()
}

/// A Unix socket listening under the host's /run, reachable by anyone.
struct HostSocket {
    path: PathBuf,
    _listener: UnixListener,
}

impl HostSocket {
    fn new(tag: &str) -> HostSocket {
        let path = PathBuf::from(format!(
            "/run/layerfs-audit-{}-{tag}.sock",
            std::process::id()
        ));
        let _ = fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o777)).unwrap();
        HostSocket {
            path,
            _listener: listener,
        }
    }
}

impl Drop for HostSocket {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// A listening abstract Unix socket of the host's network namespace.
fn abstract_listener(name: &str) -> UnixListener {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    UnixListener::bind_addr(&addr).unwrap()
}

fn audit(caller: Caller) {
    let ws = workspace_for(caller);
    let guard = SysctlGuard::new();
    let tag = format!("{}", caller as u8);
    let host_sock = HostSocket::new(&tag);
    let abstract_name = format!("layerfs-audit-{}-{tag}", std::process::id());
    let _abstract = abstract_listener(&abstract_name);
    // Device nodes on the host, in a directory the sandbox shows.
    let null_node = ws.dir.path().join("host-null");
    let mem_node = ws.dir.path().join("host-mem");
    for (node, minor) in [(&null_node, 3), (&mem_node, 1)] {
        nix::sys::stat::mknod(
            node.as_path(),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(1, minor),
        )
        .unwrap();
        fs::set_permissions(node, fs::Permissions::from_mode(0o666)).unwrap();
    }
    let control = layerfs::state::workspace::default_state_dir(&ws.upper).join("control.sock");
    let plan = json!({
        "writes": [
            [SYSCTL, format!("{}\n", guard.value() + 1)],
            ["/proc/sys/kernel/core_pattern", null],
            ["/proc/sys/kernel/modprobe", null],
            ["/proc/sys/vm/drop_caches", null],
            ["/proc/sysrq-trigger", null],
            ["/proc/sys/net/ipv4/ip_forward", null],
            ["/sys/kernel/mm/transparent_hugepage/enabled", null],
            ["/sys/fs/cgroup/memory/memory.limit_in_bytes", null],
        ],
        "host_devices": [s(&null_node), s(&mem_node)],
        "payload": "true\n",
        "sockets": [s(&host_sock.path), s(&control), format!("@{abstract_name}")],
        "mounts": MOUNTS,
        "nested": nested(guard.value() + 1),
    });
    let out = run_as(
        caller,
        &[
            "--lower",
            s(ws.lower()),
            "--upper",
            s(&ws.upper),
            "--",
            "python3",
            "-c",
            PROBE,
            &plan.to_string(),
        ],
    );
    assert!(!guard.changed(), "{caller:?} changed the host's {SYSCTL}");
    assert_eq!(out.status.code(), Some(0), "{caller:?}: {}", text(&out));
    let a = audit_of(&out);
    let mut holes = Vec::new();
    for (what, got) in entries(&a["writes"]) {
        if !got.starts_with("refused") {
            holes.push(format!("write {what}: {got}"));
        }
    }
    let writable: Vec<&str> = a["writable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    if !writable.is_empty() {
        holes.push(format!("writable under /proc or /sys: {writable:?}"));
    }
    let checked = a["checked"].as_u64().unwrap();
    assert!(checked > 1000, "the walk saw only {checked} paths: {a}");
    let devices = a["devices"].as_array().unwrap();
    if !devices.is_empty() {
        holes.push(format!("device nodes in /dev: {devices:?}"));
    }
    for (node, got) in entries(&a["host_devices"]) {
        if !got.starts_with("refused") {
            holes.push(format!("host device {node}: {got}"));
        }
    }
    if !a["mknod"].as_str().unwrap().starts_with("refused") {
        holes.push(format!("mknod in /tmp: {}", a["mknod"]));
    }
    // No terminal was given: none is reachable at all.
    for (tty, got) in entries(&a["tiocsti"]) {
        if got == "INJECTED" {
            holes.push(format!("TIOCSTI on {tty}"));
        }
    }
    let scoped = layerfs::sandbox::scopes_abstract_sockets();
    for (sock, got) in entries(&a["sockets"]) {
        if sock.starts_with('@') && !scoped {
            eprintln!("note: no Landlock ABI 6 here; abstract socket {sock}: {got}");
            continue;
        }
        if !got.starts_with("refused") {
            holes.push(format!("socket {sock}: {got}"));
        }
    }
    for (cmd, got) in entries(&a["mounts"])
        .into_iter()
        .chain(entries(&a["nested"]))
    {
        if got.starts_with("exit 0") {
            holes.push(format!("`{cmd}` succeeded"));
        }
    }
    assert!(holes.is_empty(), "{caller:?}: {holes:#?}\n{a:#}");
}

#[test]
fn audit_as_root_nothing_of_the_host_is_writable() {
    audit(Caller::Root);
}

#[test]
fn audit_as_a_user_nothing_of_the_host_is_writable() {
    audit(Caller::Tests);
}

/// The issue's reproduction: root in `layerfs run` changed the host's
/// sysctls through its fresh /proc. The value is compared before and after
/// and put back whatever happens.
#[test]
fn root_cannot_change_the_hosts_kernel_settings() {
    let ws = workspace_for(Caller::Root);
    let guard = SysctlGuard::new();
    let script = format!(
        "cat {SYSCTL}; echo {} > {SYSCTL}; echo rc=$?; \
         if : >> /proc/sys/kernel/core_pattern; then echo core_pattern-writable; fi",
        guard.value() + 1
    );
    let out = run_as(
        Caller::Root,
        &[
            "--lower",
            s(ws.lower()),
            "--ephemeral",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    assert!(
        !guard.changed(),
        "the host's {SYSCTL} changed: {}",
        text(&out)
    );
    let o = stdout(&out);
    // Still readable: tools read their settings.
    assert!(o.starts_with(guard.before.as_str()), "{}", text(&out));
    assert!(o.contains("rc=2"), "{}", text(&out));
    assert!(!o.contains("core_pattern-writable"), "{}", text(&out));
    assert!(
        stderr(&out).contains("Read-only file system"),
        "{}",
        text(&out)
    );
}

/// The masks hold: masked files read empty, masked directories list
/// nothing, the host's /run and the workspace's own directories are not
/// there, DNS still resolves its configuration.
#[test]
fn masks_hide_kernel_files_run_and_the_workspaces_own_dirs() {
    for caller in [Caller::Root, Caller::Tests] {
        let ws = workspace_for(caller);
        fs::write(ws.upper.join("in-upper.txt"), "private\n").unwrap();
        if caller == Caller::Tests {
            let (uid, gid) = tests_ids();
            crate::run::chown_tree(ws.dir.path(), uid, gid);
        }
        let state = layerfs::state::workspace::default_state_dir(&ws.upper);
        let host_run: Vec<String> = fs::read_dir("/run")
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let script = format!(
            "echo keys=$(wc -c < /proc/keys); echo firmware=$(ls -A /sys/firmware | wc -l); \
             echo upper=$(ls -A {u} | wc -l); cat {u}/in-upper.txt 2>/dev/null; \
             echo state=$(ls -A {st} 2>/dev/null | wc -l); echo run:; ls -A /run; echo :run; \
             cat /etc/resolv.conf | md5sum",
            u = ws.upper.display(),
            st = state.display()
        );
        let out = run_as(
            caller,
            &[
                "--lower",
                s(ws.lower()),
                "--upper",
                s(&ws.upper),
                "--",
                "sh",
                "-c",
                &script,
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{caller:?}: {}", text(&out));
        let o = stdout(&out);
        for want in ["keys=0\n", "firmware=0\n", "upper=0\n", "state=0\n"] {
            assert!(o.contains(want), "{caller:?}: {want}: {o}");
        }
        assert!(!o.contains("private"), "{caller:?}: {o}");
        let run_inside = o
            .split("run:\n")
            .nth(1)
            .unwrap()
            .split(":run")
            .next()
            .unwrap();
        for name in run_inside.lines() {
            assert!(
                !host_run.contains(&name.to_string()) || name == "lock",
                "{caller:?}: the host's /run/{name} shows inside: {o}"
            );
        }
        let host_resolv = Command::new("sh")
            .args(["-c", "cat /etc/resolv.conf | md5sum"])
            .output()
            .unwrap();
        assert!(o.ends_with(&stdout(&host_resolv)), "{caller:?}: {o}");
        // The upper itself is untouched.
        assert_eq!(
            fs::read_to_string(ws.upper.join("in-upper.txt")).unwrap(),
            "private\n"
        );
    }
}

/// `--tmp-size` bounds /tmp, /dev/shm and /run together; bad sizes are
/// refused before anything runs.
#[test]
fn tmp_size_bounds_tmp_shm_and_run_together() {
    let ws = workspace_for(Caller::Root);
    let lower = s(ws.lower());
    let script = "df -B1 --output=size /tmp | tail -1; \
                  head -c 3M /dev/zero > /tmp/a && echo tmp-ok; \
                  head -c 3M /dev/zero > /dev/shm/b && echo shm-ok; \
                  head -c 3M /dev/zero > /run/c && echo run-ok; true";
    for caller in [Caller::Root, Caller::Tests] {
        let out = run_as(
            caller,
            &[
                "--lower",
                lower,
                "--ephemeral",
                "--tmp-size",
                "4M",
                "--",
                "sh",
                "-c",
                script,
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{caller:?}: {}", text(&out));
        let o = stdout(&out);
        assert_eq!(
            o.lines().next().map(str::trim),
            Some("4194304"),
            "{caller:?}: {o}"
        );
        assert!(o.contains("tmp-ok"), "{caller:?}: {o}");
        assert!(
            !o.contains("shm-ok") && !o.contains("run-ok"),
            "{caller:?}: {o}"
        );
        assert!(stderr(&out).contains("No space left"), "{}", text(&out));
    }
    // By default: a quarter of the machine's memory.
    let out = run_as(
        Caller::Root,
        &[
            "--lower",
            lower,
            "--ephemeral",
            "--",
            "df",
            "-B1",
            "--output=size",
            "/tmp",
        ],
    );
    let size: u64 = stdout(&out).lines().nth(1).unwrap().trim().parse().unwrap();
    assert_eq!(size, layerfs::run::default_tmp_size(), "{}", text(&out));
    for (bad, says) in [
        ("0", "at least 1M"),
        ("4K", "at least 1M"),
        ("lots", "invalid size"),
    ] {
        let out = run_as(
            Caller::Root,
            &[
                "--lower",
                lower,
                "--ephemeral",
                "--tmp-size",
                bad,
                "--",
                "true",
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", text(&out));
        assert!(stderr(&out).contains(says), "{bad}: {}", text(&out));
    }
    let help = Command::new(bin())
        .args(["run", "--help"])
        .output()
        .unwrap();
    let words = stdout(&help)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        words.contains("[default: a quarter of the machine's memory"),
        "{}",
        text(&help)
    );
}

/// The outer shell of the terminal tests: runs `layerfs run` on the
/// terminal script(1) gives it, then reads what is left in that terminal's
/// input and runs it, as an interactive shell would.
fn outer_shell(dir: &Path, run: &str) -> PathBuf {
    let path = dir.join("outer.sh");
    fs::write(
        &path,
        format!(
            "{run}\nst=$?\nline=\nread -t 1 line\necho \"STATUS[$st] LEFTOVER[$line]\"\n\
             eval \"$line\"\n"
        ),
    )
    .unwrap();
    path
}

/// The command line of `layerfs run` as `caller`, for a shell.
fn run_line(caller: Caller, args: &[&str]) -> String {
    let quoted: Vec<String> = args
        .iter()
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect();
    let prefix = match caller {
        Caller::Root => String::new(),
        Caller::Tests => {
            let (uid, gid) = tests_ids();
            format!("setpriv --reuid={uid} --regid={gid} --clear-groups -- ")
        }
    };
    format!("{prefix}{} run {}", bin().display(), quoted.join(" "))
}

/// The issue's reproduction: the command pushes `touch MARKER` into every
/// terminal it can find; the calling shell must not run it.
fn keystrokes_cannot_reach_the_callers_shell(caller: Caller, stdin_is_terminal: bool) {
    let ws = workspace_for(caller);
    let marker = PathBuf::from(format!(
        "/var/tmp/layerfs-tiocsti-{}-{}-{}",
        std::process::id(),
        caller as u8,
        stdin_is_terminal as u8
    ));
    let _ = fs::remove_file(&marker);
    let _cleanup = Removed(marker.clone());
    let plan = json!({
        "writes": [], "host_devices": [], "sockets": [], "mounts": [], "nested": [],
        "payload": format!("touch {}\n", marker.display()),
    });
    let mut run = run_line(
        caller,
        &[
            "--lower",
            s(ws.lower()),
            "--ephemeral",
            "--",
            "python3",
            "-c",
            PROBE,
            &plan.to_string(),
        ],
    );
    if !stdin_is_terminal {
        // Then layerfs run does not read the terminal: anything pushed
        // into it would wait there for the calling shell.
        run.push_str(" < /dev/null");
    }
    let outer = outer_shell(ws.dir.path(), &run);
    let _fuse = (caller == Caller::Tests).then(OpenFuse::new);
    let mut child = Command::new("script")
        .args(["-qfec", &format!("bash {}", outer.display()), "/dev/null"])
        .env("RUST_LOG", "warn")
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("run script(1)");
    let _group = KillGroup(child.id() as i32);
    // Held open and silent: script(1) must not see an end of input.
    let stdin = child.stdin.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let o = stdout(&out);
    let what = format!("{caller:?}, stdin a terminal: {stdin_is_terminal}");
    let a = audit_of(&out);
    assert!(
        o.contains("STATUS[0] LEFTOVER[]"),
        "{what}: input was left in the caller's terminal: {o}"
    );
    assert!(
        !marker.exists(),
        "{what}: the calling shell ran the injected command: {o}"
    );
    // The command did have a terminal: its own.
    assert_eq!(a["tiocsti"]["fd1"], "INJECTED", "{what}: {a}");
}

#[test]
fn keystrokes_pushed_by_root_never_reach_the_callers_shell() {
    keystrokes_cannot_reach_the_callers_shell(Caller::Root, true);
    keystrokes_cannot_reach_the_callers_shell(Caller::Root, false);
}

#[test]
fn keystrokes_pushed_by_a_user_never_reach_the_callers_shell() {
    keystrokes_cannot_reach_the_callers_shell(Caller::Tests, true);
    keystrokes_cannot_reach_the_callers_shell(Caller::Tests, false);
}

/// `layerfs run` as the foreground job of a terminal the test holds the
/// master of.
struct OnTerminal {
    master: Arc<OwnedFd>,
    output: Arc<Mutex<Vec<u8>>>,
    run: Option<Running>,
}

impl OnTerminal {
    fn start(caller: Caller, rows: u16, cols: u16, args: &[&str]) -> OnTerminal {
        let size = nix::pty::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&size), None).unwrap();
        // `setsid --ctty`: a session of its own whose controlling terminal
        // is stdin, layerfs run in its foreground group.
        let cmd = run_cmd(caller, args);
        let program = cmd.get_program().to_owned();
        let argv: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
        // SIGINT at its default even when the suite was started ignoring
        // it (a `&` job), which `layerfs run` would rightly keep.
        let mut wrapped = Command::new("env");
        wrapped
            .args(["--default-signal=INT", "setsid", "--ctty"])
            .arg(program)
            .args(argv)
            .env("RUST_LOG", "warn")
            .env_remove("TMPDIR")
            .current_dir("/");
        let slave = pty.slave;
        wrapped
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        let run = Running::spawn(wrapped);
        let master = Arc::new(pty.master);
        let output = Arc::new(Mutex::new(Vec::new()));
        let (m, o) = (master.clone(), output.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once every descriptor of the terminal is closed.
            while let Ok(n) = nix::unistd::read(m.as_raw_fd(), &mut buf) {
                if n == 0 {
                    break;
                }
                o.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        OnTerminal {
            master,
            output,
            run: Some(run),
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    fn wait_for(&self, what: &str) {
        assert!(
            eventually(Duration::from_secs(30), || self.text().contains(what)),
            "no {what:?} on the terminal: {:?}",
            self.text()
        );
    }

    fn type_in(&self, bytes: &[u8]) {
        nix::unistd::write(self.master.as_fd(), bytes).unwrap();
    }

    fn termios(&self) -> nix::sys::termios::Termios {
        nix::sys::termios::tcgetattr(self.master.as_fd()).unwrap()
    }

    /// Waits for layerfs run to end; its output, everything the terminal
    /// showed, and the terminal's mode afterwards.
    fn finish(mut self) -> (Output, String, nix::sys::termios::Termios) {
        let out = self.run.take().unwrap().finish(Duration::from_secs(60));
        let termios = self.termios();
        // The reader ends at EIO, once nothing holds the terminal.
        let _ = eventually(Duration::from_secs(5), || {
            Arc::strong_count(&self.master) == 1
        });
        (out, self.text(), termios)
    }
}

/// Sets the window size of the test's terminal (its foreground group,
/// layerfs run, gets SIGWINCH).
fn set_winsize(master: std::os::fd::BorrowedFd<'_>, rows: u16, cols: u16) {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads the winsize it is given.
    let r = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    assert_eq!(r, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
}

fn canonical_and_echo(t: &nix::sys::termios::Termios) -> bool {
    use nix::sys::termios::LocalFlags;
    t.local_flags
        .contains(LocalFlags::ICANON | LocalFlags::ECHO)
}

#[test]
fn on_a_terminal_size_ctrl_c_and_exit_codes_work_through_the_commands_own_terminal() {
    for caller in [Caller::Root, Caller::Tests] {
        let ws = workspace_for(caller);
        let lower = s(ws.lower());
        let _fuse = (caller == Caller::Tests).then(OpenFuse::new);
        // Window size at the start and when it changes; Ctrl-C.
        let script = "tty; stty size; trap 'stty size' WINCH; echo ready; \
                      while :; do sleep 0.1; done";
        let t = OnTerminal::start(
            caller,
            33,
            77,
            &[
                "--lower",
                lower,
                "--ephemeral",
                "--json",
                "--",
                "sh",
                "-c",
                script,
            ],
        );
        t.wait_for("ready");
        assert!(
            !canonical_and_echo(&t.termios()),
            "{caller:?}: not in raw mode"
        );
        set_winsize(t.master.as_fd(), 40, 100);
        t.wait_for("40 100");
        t.type_in(b"\x03");
        let (out, shown, after) = t.finish();
        assert_eq!(out.status.code(), Some(130), "{caller:?}: {shown:?}");
        assert!(
            shown.contains("/dev/pts/0\r\n33 77\r\n"),
            "{caller:?}: {shown:?}"
        );
        let last = shown.lines().last().unwrap().trim_end_matches('\r');
        let v: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {shown:?}"));
        assert_eq!(v["signal"], 2, "{caller:?}: {shown:?}");
        assert!(
            canonical_and_echo(&after),
            "{caller:?}: the terminal's mode was not restored"
        );

        // Exit code, typed input, --max-output over the terminal.
        let t = OnTerminal::start(
            caller,
            24,
            80,
            &[
                "--lower",
                lower,
                "--ephemeral",
                "--max-output",
                "40",
                "--",
                "sh",
                "-c",
                "echo ready; read line; echo got:$line; head -c 5000 /dev/zero | tr '\\0' x; exit 7",
            ],
        );
        t.wait_for("ready");
        t.type_in(b"hello\r");
        let (out, shown, after) = t.finish();
        assert_eq!(out.status.code(), Some(7), "{caller:?}: {shown:?}");
        assert!(shown.contains("got:hello\r\n"), "{caller:?}: {shown:?}");
        assert!(!shown.contains(&"x".repeat(40)), "{caller:?}: {shown:?}");
        assert!(shown.contains("output truncated"), "{caller:?}: {shown:?}");
        assert!(
            canonical_and_echo(&after),
            "{caller:?}: the terminal's mode was not restored"
        );
    }
}

/// A failure after the sandbox started (a --cwd refused inside it) and a
/// --timeout still give the terminal its mode back.
#[test]
fn on_a_terminal_every_ending_restores_the_terminals_mode() {
    let ws = workspace_for(Caller::Root);
    fs::create_dir(ws.lower().join("d")).unwrap();
    std::os::unix::fs::symlink("/etc", ws.lower().join("d/out")).unwrap();
    let lower = s(ws.lower());
    for (args, code) in [
        (vec!["--cwd", "d/out", "--", "true"], 2),
        (
            vec!["--timeout", "1s", "--", "sh", "-c", "echo ready; sleep 60"],
            124,
        ),
        (vec!["--", "no-such-command-xyz"], 127),
    ] {
        let mut all = vec!["--lower", lower, "--ephemeral"];
        all.extend(args.iter().copied());
        let t = OnTerminal::start(Caller::Root, 24, 80, &all);
        let (out, shown, after) = t.finish();
        assert_eq!(out.status.code(), Some(code), "{args:?}: {shown:?}");
        assert!(
            canonical_and_echo(&after),
            "{args:?}: the terminal's mode was not restored"
        );
    }
}

/// A command that stops itself (as an editor does at Ctrl-Z) has no shell
/// outside to resume it: it is continued instead of hanging the run.
#[test]
fn a_command_that_stops_itself_is_continued() {
    let ws = workspace_for(Caller::Root);
    let out = run_as(
        Caller::Root,
        &[
            "--lower",
            s(ws.lower()),
            "--ephemeral",
            "--",
            "sh",
            "-c",
            "kill -TSTP $$; echo continued; exit 4",
        ],
    );
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert_eq!(stdout(&out), "continued\n", "{}", text(&out));
}
