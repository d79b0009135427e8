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
//! - terminals: `TIOCSTI` on every terminal the command can find;
//! - host sockets: a listening Unix socket under the host's `/run`, the
//!   workspace's `control.sock`, an abstract socket of the host;
//! - mounts: mount, umount, remount, bind, `unshare -m`, and inside a
//!   nested user namespace the mounts that would undo the masks;
//! - the bounded tmpfs behind `/tmp`, `/dev/shm` and `/run`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::{json, Value};

use crate::harness::bin;
use crate::run::{run_as, s, stderr, stdout, tests_ids, text, workspace_for, Caller};

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
    assert_eq!(
        size,
        layerfs::run::default_tmp_size() / 4096 * 4096,
        "{}",
        text(&out)
    );
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
