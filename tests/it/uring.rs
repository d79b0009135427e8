//! `--io-uring`: requests served through one io_uring queue per CPU.
//!
//! The kernel offers io_uring to FUSE servers only while root has set
//! /sys/module/fuse/parameters/enable_uring to Y. These tests set it for
//! the moment a mount negotiates (the kernel keeps io_uring for a
//! connection that agreed to it) and put the previous value back at once,
//! holding a lock file so that tests in other processes do not change it
//! in between. layerfs itself never writes it.

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::harness::*;
use crate::netlower::status_json;

const SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";

/// Holds fuse's `enable_uring` at a value until dropped (or `restore`d),
/// under a lock shared by every test process.
struct UringSwitch {
    lock: File,
    before: Option<String>,
}

impl UringSwitch {
    /// `None` when this kernel has no FUSE io_uring at all.
    fn set(on: bool) -> Option<UringSwitch> {
        if !Path::new(SWITCH).exists() {
            return None;
        }
        let lock = File::create(std::env::temp_dir().join("layerfs-test-enable-uring.lock"))
            .expect("create the lock file");
        // SAFETY: flock on an fd this function owns.
        assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
        // Read under the lock: another test's value is put back by then.
        let before = fs::read_to_string(SWITCH).expect("read enable_uring");
        fs::write(SWITCH, if on { "Y" } else { "N" }).expect("write enable_uring (as root)");
        Some(UringSwitch {
            lock,
            before: Some(before.trim().to_string()),
        })
    }

    fn restore(&mut self) {
        if let Some(b) = self.before.take() {
            let _ = fs::write(SWITCH, b);
        }
    }
}

impl Drop for UringSwitch {
    fn drop(&mut self) {
        self.restore();
        // SAFETY: unlocks the fd this guard owns.
        unsafe { libc::flock(self.lock.as_raw_fd(), libc::LOCK_UN) };
    }
}

fn transport(mnt: &Path) -> Value {
    status_json(mnt)["transport"].clone()
}

/// Mounts with `--io-uring` while the kernel offers it, and waits until
/// the queues serve (after which the switch can go back).
fn mount_uring(ws: &Workspace, extra: &[&str]) -> Option<Mount> {
    let mut switch = UringSwitch::set(true)?;
    let mut args = vec!["--io-uring"];
    args.extend_from_slice(extra);
    let m = ws.mount_with(&args);
    let serving = eventually(Duration::from_secs(10), || {
        transport(m.path())["kind"] == "io_uring"
    });
    switch.restore();
    assert!(
        serving,
        "the queues did not start: {}\n{}",
        transport(m.path()),
        ws.daemon_log()
    );
    Some(m)
}

fn ring_requests(mnt: &Path) -> Vec<u64> {
    transport(mnt)["ring_requests"]
        .as_array()
        .expect("ring_requests")
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect()
}

fn possible_cpus() -> usize {
    let s = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    s.trim()
        .split(',')
        .map(|p| p.rsplit('-').next().unwrap().parse::<usize>().unwrap() + 1)
        .max()
        .unwrap()
}

fn online(cpu: usize) -> bool {
    cpu == 0
        || fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/online"))
            .map(|s| s.trim() == "1")
            .unwrap_or(false)
}

#[test]
fn requests_are_served_by_the_queue_of_the_callers_cpu() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("f"), "shared\n").unwrap();
    let Some(m) = mount_uring(&ws, &[]) else {
        panic!("this kernel has no {SWITCH}: FUSE over io_uring is not built in");
    };
    let t = transport(m.path());
    assert_eq!(
        t["queues"],
        possible_cpus(),
        "one queue per possible CPU: {t}"
    );
    for cpu in (0..possible_cpus()).filter(|&c| online(c)) {
        let before = ring_requests(m.path());
        // Each `cat` opens the file: an OPEN and a RELEASE at least, from
        // a process the scheduler may only run on `cpu`.
        sh(
            m.path(),
            &format!(
                "taskset -c {cpu} sh -c 'i=0; while [ $i -lt 100 ]; do \\
                 cat f >/dev/null || exit 1; i=$((i+1)); done'"
            ),
        );
        let after = ring_requests(m.path());
        let mine = after[cpu] - before[cpu];
        let others: u64 = (0..after.len())
            .filter(|&q| q != cpu)
            .map(|q| after[q] - before[q])
            .sum();
        assert!(
            mine >= 200,
            "CPU {cpu}'s queue served {mine} requests for 100 opens"
        );
        assert!(
            others < mine / 4,
            "other queues served {others} requests of a caller on CPU {cpu} ({mine} on its own)"
        );
    }
    assert!(m.unmount(), "the daemon did not end cleanly");
}

#[test]
fn every_kind_of_request_works_through_the_queues() {
    let ws = Workspace::new();
    let lower = ws.lower();
    fs::create_dir(lower.join("big")).unwrap();
    for i in 0..1500 {
        fs::write(
            lower.join(format!("big/entry-with-a-long-name-{i:05}")),
            "x",
        )
        .unwrap();
    }
    let data: Vec<u8> = (0..3 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    fs::write(lower.join("data.bin"), &data).unwrap();
    fs::create_dir(lower.join("src")).unwrap();
    fs::write(lower.join("src/main.c"), "int main(void) { return 0; }\n").unwrap();
    fs::set_permissions(lower.join("src"), fs::Permissions::from_mode(0o777)).unwrap();
    let Some(m) = mount_uring(&ws, &["--allow-other"]) else {
        panic!("this kernel has no {SWITCH}: FUSE over io_uring is not built in");
    };
    let before = status_json(m.path());

    // Reads of a lower file come through the daemon: READ replies of up
    // to the ring's payload size, byte for byte.
    assert_eq!(fs::read(m.p("data.bin")).unwrap(), data);
    // A 1500-entry listing takes several READDIRPLUS replies.
    assert_eq!(fs::read_dir(m.p("big")).unwrap().count(), 1500);

    // Names, data, attributes and links, in a lower directory and a new
    // one, under a restrictive umask.
    let script = r#"
        set -e
        umask 027
        echo appended >> src/main.c
        mkdir -p new/deeper
        printf 'one\n' > new/deeper/file
        dd if=/dev/urandom of=new/big.bin bs=1M count=8 status=none
        sha256sum new/big.bin | cut -d' ' -f1 > /tmp/layerfs-uring-sum.$$
        truncate -s 3 new/deeper/file
        chmod 640 src/main.c
        ln -s ../src/main.c new/link
        ln new/deeper/file new/hard
        mv new/deeper new/moved
        rm big/entry-with-a-long-name-00007
        rmdir new/moved 2>/dev/null && exit 1
        python3 -c 'import os; os.setxattr("new/hard", "user.k", b"v"); assert os.getxattr("new/hard", "user.k") == b"v"; assert "user.k" in os.listxattr("new/hard"); os.removexattr("new/hard", "user.k")'
        sync new/big.bin
        df . >/dev/null
        find . -maxdepth 2 | wc -l
        sha256sum new/big.bin | cut -d' ' -f1 | cmp - /tmp/layerfs-uring-sum.$$
        rm /tmp/layerfs-uring-sum.$$
    "#;
    let out = bash(m.path(), script);
    assert!(
        out.status.success(),
        "workload: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        ws.daemon_log()
    );
    assert_eq!(
        fs::read_to_string(m.p("src/main.c")).unwrap(),
        "int main(void) { return 0; }\nappended\n"
    );
    assert_eq!(
        fs::read_link(m.p("new/link")).unwrap(),
        Path::new("../src/main.c")
    );
    assert_eq!(fs::read_to_string(m.p("new/moved/file")).unwrap(), "one");
    assert_eq!(fs::metadata(m.p("new/hard")).unwrap().nlink(), 2);
    let mode = |p: &str| fs::metadata(m.p(p)).unwrap().mode() & 0o7777;
    assert_eq!(mode("new/moved"), 0o750, "umask 027 applied to mkdir");
    assert_eq!(mode("new/moved/file"), 0o640, "umask 027 applied to create");
    assert_eq!(mode("src/main.c"), 0o640);
    assert!(!m.p("big/entry-with-a-long-name-00007").exists());
    // The upper holds the changes; the lower is untouched.
    assert_eq!(
        fs::read_to_string(ws.upper.join("src/main.c")).unwrap(),
        "int main(void) { return 0; }\nappended\n"
    );
    assert_eq!(fs::read(lower.join("data.bin")).unwrap(), data);
    assert!(lower.join("big/entry-with-a-long-name-00007").exists());

    // Another user, on the same queues: owns what it creates.
    let theirs = sh(
        m.path(),
        "setpriv --reuid=65534 --regid=65534 --clear-groups -- \\
         sh -c 'echo theirs > src/theirs && cat src/theirs'",
    );
    assert_eq!(theirs, "theirs\n");
    let meta = fs::metadata(ws.upper.join("src/theirs")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (65534, 65534));

    let after = status_json(m.path());
    // Every request but FORGET (which the kernel still sends through
    // /dev/fuse) came through the rings.
    let rings = |v: &Value| -> u64 {
        v["transport"]["ring_requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum()
    };
    let others = |v: &Value| -> u64 {
        let c = &v["counters"];
        let forgets = c["by_op"]["forget"].as_u64().unwrap_or(0)
            + c["by_op"]["batch_forget"].as_u64().unwrap_or(0);
        c["requests"].as_u64().unwrap() - forgets
    };
    let (through_rings, all) = (
        rings(&after) - rings(&before),
        others(&after) - others(&before),
    );
    assert!(
        through_rings > 100 && through_rings >= all - all / 20,
        "{through_rings} of {all} requests came through the rings: {}",
        after["counters"]
    );
    // The 8 MiB file was written through passthrough: its data never
    // reached the daemon (as without io_uring, as root).
    let writes = |v: &Value| v["counters"]["by_op"]["write"].as_u64().unwrap_or(0);
    assert!(
        writes(&after) - writes(&before) < 8,
        "{} WRITE requests for an 8 MiB passthrough write",
        writes(&after) - writes(&before)
    );
    assert!(m.unmount(), "the daemon did not end cleanly");
}

/// Every entry's attributes, asked with `AT_STATX_FORCE_SYNC` (so each is
/// a GETATTR, not the kernel's cache), and its xattrs read three ways (the
/// size query, a too-small buffer, the value), as JSON lines: what the
/// queue threads' own GETATTR and GETXATTR answers must agree with fuser's
/// on. Inode numbers may differ between mounts; within one, each must be
/// the one the directory listing (fuser's READDIRPLUS) gave.
const COLLECT: &str = r#"
import ctypes, json, os, struct
libc = ctypes.CDLL(None, use_errno=True)
def statx(p):
    buf = ctypes.create_string_buffer(256)
    if libc.statx(-100, p.encode(), 0x2000 | 0x100, 0x7ff, buf) != 0:
        raise OSError(ctypes.get_errno(), p)
    b = buf.raw
    f = lambda fmt, at: struct.unpack_from(fmt, b, at)[0]
    t = lambda at: f("q", at) * 10**9 + f("I", at + 8)
    return f("Q", 32), [f("I", 4), f("I", 16), f("I", 20), f("I", 24), f("H", 28), f("Q", 40),
                        f("Q", 48), t(64), t(96), t(112), f("I", 128), f("I", 132)]
def query(p, n, size):
    buf = ctypes.create_string_buffer(max(size, 1))
    r = libc.lgetxattr(p.encode(), n.encode(), buf if size else None, size)
    return r if r >= 0 else -ctypes.get_errno()
rows, bad = [], []
def visit(path, d_ino):
    ino, st = statx(path)
    if d_ino is not None and ino != d_ino:
        bad.append([path, ino, d_ino])
    x = {}
    for n in sorted(os.listxattr(path, follow_symlinks=False)) + ["user.absent"]:
        try:
            v = os.getxattr(path, n, follow_symlinks=False).hex()
        except OSError as e:
            v = -e.errno
        x[n] = [query(path, n, 0), query(path, n, 2), v]
    rows.append({"p": path, "st": st, "x": x})
def walk(d):
    for e in sorted(os.scandir(d), key=lambda e: e.name):
        visit(e.path, e.inode())
        if e.is_dir(follow_symlinks=False):
            walk(e.path)
visit(".", None)
walk(".")
assert not bad, bad
for r in rows:
    print(json.dumps(r, sort_keys=True))
"#;

#[test]
fn the_queues_own_answers_agree_with_fusers() {
    let ws = Workspace::new();
    let l = ws.lower();
    let setup = r#"
        set -e
        mkdir -p d/e
        printf 'abc' > d/f
        chmod 4755 d/f
        ln -s f d/link
        mkfifo d/fifo
        mknod d/null c 1 3
        touch -d '1960-01-01 00:00:00.25' d/old
        touch -d '2030-05-06 07:08:09.123456789' d/e/new
        python3 -c 'import os; os.setxattr("d/f", "user.small", b"v"); os.setxattr("d/f", "user.big", b"x" * 3000); os.setxattr("d/e", "user.empty", b"")'
    "#;
    sh(l, setup);
    let script = ws.dir.path().join("collect.py");
    fs::write(&script, COLLECT).unwrap();
    let collect = |m: &Mount| sh(m.path(), &format!("python3 {}", script.display()));
    let Some(m) = mount_uring(&ws, &[]) else {
        panic!("this kernel has no {SWITCH}: FUSE over io_uring is not built in");
    };
    // Upper objects too: a copied-up file, a new one with an xattr.
    sh(
        m.path(),
        "set -e; echo more >> d/f; echo new > d/e/mine; \\
         python3 -c 'import os; os.setxattr(\"d/e/mine\", \"user.k\", b\"1234\")'",
    );
    let before = status_json(m.path())["counters"]["by_op"]["getattr"]
        .as_u64()
        .unwrap_or(0);
    let fast = collect(&m);
    let after = status_json(m.path())["counters"]["by_op"]["getattr"]
        .as_u64()
        .unwrap_or(0);
    assert!(m.unmount());
    // The same layers, with every request decoded and answered by fuser.
    let mut switch = UringSwitch::set(true).unwrap();
    let m = ws.mount_env(&["--io-uring"], &[("LAYERFS_URING_NO_FAST", "1")]);
    assert!(eventually(Duration::from_secs(10), || {
        transport(m.path())["kind"] == "io_uring"
    }));
    switch.restore();
    let slow = collect(&m);
    assert!(m.unmount());
    assert!(fast.lines().count() >= 10, "{fast}");
    for (a, b) in fast.lines().zip(slow.lines()) {
        assert_eq!(a, b, "queue-thread answer (left) against fuser's (right)");
    }
    assert_eq!(fast.lines().count(), slow.lines().count());
    // The queue threads' answers are counted like any request.
    assert!(after > before, "getattr count {before} -> {after}");
}

#[test]
fn without_the_kernels_offer_the_mount_serves_dev_fuse_and_says_why() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("f"), "shared\n").unwrap();
    let Some(switch) = UringSwitch::set(false) else {
        panic!("this kernel has no {SWITCH}: FUSE over io_uring is not built in");
    };
    let m = ws.mount_with(&["--io-uring"]);
    // The kernel decides at INIT, which is over once status answers.
    let t = transport(m.path());
    drop(switch);
    assert_eq!(t["kind"], "/dev/fuse", "{t}");
    let why = t["io_uring_refused"].as_str().unwrap_or_default();
    assert!(why.contains("enable_uring is N"), "reason given: {t}");
    assert_eq!(fs::read_to_string(m.p("f")).unwrap(), "shared\n");
    fs::write(m.p("g"), "new\n").unwrap();
    assert_eq!(fs::read_to_string(ws.upper.join("g")).unwrap(), "new\n");
    let out = Command::new(bin())
        .arg("status")
        .arg(m.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("/dev/fuse (io_uring asked for, not used: the kernel does not offer it"),
        "{text}"
    );
    assert!(
        ws.daemon_log().contains("enable_uring is N"),
        "log: {}",
        ws.daemon_log()
    );
    assert!(m.unmount());
}

#[test]
fn io_uring_is_a_mount_option_too() {
    let ws = Workspace::new();
    let Some(m) = ({
        let mut switch = UringSwitch::set(true);
        let m = switch.as_ref().map(|_| ws.mount_with(&["-o", "io_uring"]));
        if let Some(m) = &m {
            assert!(eventually(Duration::from_secs(10), || {
                transport(m.path())["kind"] == "io_uring"
            }));
        }
        if let Some(s) = switch.as_mut() {
            s.restore();
        }
        m
    }) else {
        panic!("this kernel has no {SWITCH}: FUSE over io_uring is not built in");
    };
    fs::write(m.p("x"), "x").unwrap();
    let out = Command::new(bin())
        .args(["mount", "-o", "io_uring=yes"])
        .arg(ws.dir.path().join("elsewhere"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("io_uring"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(m.unmount());
}

/// A file held open while a live reset removes it goes on reading what it
/// opened. The kernel asks for its size with the handle (GETATTR with
/// `FUSE_GETATTR_FH`, e.g. for `lseek(SEEK_END)` once the reset dropped the
/// cached attributes); a queue thread answering that itself must use the
/// handle as fuser's path does, or the held file fails with EIO.
#[test]
fn a_file_held_open_through_a_live_reset_keeps_its_size_on_the_queues() {
    use std::io::{Read, Seek, SeekFrom};
    let ws = Workspace::new();
    let Some(m) = mount_uring(&ws, &[]) else {
        panic!("this kernel has no {SWITCH}: FUSE over io_uring is not built in");
    };
    fs::write(m.p("new"), "created\n").unwrap();
    let mut reader = File::open(m.p("new")).unwrap();
    let reset = [
        std::ffi::OsStr::new("reset"),
        m.path().as_os_str(),
        "new".as_ref(),
    ];
    let out = layerfs(&reset);
    assert!(
        out.status.success(),
        "reset: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!m.p("new").exists(), "the reset did not remove the file");
    let end = reader.seek(SeekFrom::End(0));
    assert_eq!(
        end.as_ref().ok(),
        Some(&8),
        "lseek(SEEK_END) on the held file: {end:?}\n{}",
        ws.daemon_log()
    );
    let mut back = String::new();
    reader.rewind().unwrap();
    reader.read_to_string(&mut back).unwrap();
    assert_eq!(back, "created\n");
    drop(reader);
    assert!(m.unmount());
}

fn answered_total(mnt: &Path) -> u64 {
    transport(mnt)["ring_answered"]
        .as_array()
        .expect("ring_answered")
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum()
}

/// Lookups of names present, new, whited out and hidden; opens read-only,
/// for writing and with `O_TRUNC` (both copying up), of a readonly path
/// (refused) and of a directory; closes; attribute changes (mode, owner,
/// size by path and by handle, times given, before 1970 and now), allowed
/// and refused. Each outcome as a JSON line.
const OPENS: &str = r#"
import errno, json, os
out = []
def rec(label, f):
    try:
        r = f()
    except OSError as e:
        r = "E" + errno.errorcode[e.errno]
    out.append([label, r])
def read(p):
    with open(p) as f:
        return f.read()
def write(p, flags, s):
    fd = os.open(p, os.O_WRONLY | flags, 0o644)
    try:
        os.write(fd, s.encode())
    finally:
        os.close(fd)
    return read(p)
def st(p):
    s = os.lstat(p)
    return [s.st_size, oct(s.st_mode), s.st_nlink]
rec("read f", lambda: read("f"))
rec("append f", lambda: write("f", os.O_APPEND, "more\n"))
rec("truncate t", lambda: write("t", os.O_TRUNC, "new\n"))
rec("open f read-write", lambda: os.close(os.open("f", os.O_RDWR)))
rec("lookup gone", lambda: st("gone"))
rec("unlink gone", lambda: os.unlink("gone"))
rec("lookup whited-out gone", lambda: st("gone"))
rec("open whited-out gone", lambda: read("gone"))
rec("lookup new", lambda: st("new"))
rec("create new", lambda: write("new", os.O_CREAT, "fresh\n"))
rec("lookup new again", lambda: st("new"))
rec("create gone again", lambda: write("gone", os.O_CREAT, "back\n"))
rec("lookup gone again", lambda: st("gone"))
rec("read ro/x", lambda: read("ro/x"))
rec("append ro/x", lambda: write("ro/x", os.O_APPEND, "no"))
rec("truncate ro/x", lambda: write("ro/x", os.O_TRUNC, "no"))
rec("lookup d/.env", lambda: st("d/.env"))
rec("open d/.env", lambda: read("d/.env"))
rec("create d/.env", lambda: write("d/.env", os.O_CREAT, "x"))
rec("list d", lambda: sorted(os.listdir("d")))
rec("open d for writing", lambda: os.open("d", os.O_WRONLY))
rec("lookup d/nested/deep", lambda: st("d/nested/deep"))
rec("read d/nested/deep", lambda: read("d/nested/deep"))
def stt(p):
    s = os.lstat(p)
    return [s.st_size, oct(s.st_mode), s.st_uid, s.st_gid, s.st_atime_ns, s.st_mtime_ns]
def ftrunc(p, n):
    fd = os.open(p, os.O_RDWR)
    try:
        os.ftruncate(fd, n)
    finally:
        os.close(fd)
    return read(p)
rec("chmod f", lambda: os.chmod("f", 0o4711))
rec("chown f", lambda: os.chown("f", 1234, 5678))
rec("truncate lower s by path", lambda: (os.truncate("s", 3), read("s"))[1])
rec("ftruncate f", lambda: ftrunc("f", 2))
rec("times of f", lambda: (os.utime("f", ns=(1600000000123456789, 1700000000987654321)), stt("f"))[1])
rec("old times of s", lambda: (os.utime("s", ns=(-99750000000, -1)), stt("s"))[1])
rec("times of t now", lambda: (os.utime("t"), os.lstat("t").st_size)[1])
rec("chmod ro/x", lambda: os.chmod("ro/x", 0o600))
rec("truncate ro/x by path", lambda: os.truncate("ro/x", 1))
rec("times of ro/x", lambda: os.utime("ro/x", ns=(1, 1)))
rec("chmod d/.env", lambda: os.chmod("d/.env", 0o600))
rec("mode of d/nested/deep", lambda: (os.chmod("d/nested/deep", 0o640), stt("d/nested/deep")[:4])[1])
def getflags(p):
    import fcntl
    fd = os.open(p, os.O_RDONLY)
    try:
        return fcntl.ioctl(fd, 0x80086601, b"\0" * 8).hex()
    finally:
        os.close(fd)
rec("ioctl FS_IOC_GETFLAGS f", lambda: getflags("f"))
rec("unlink new", lambda: os.unlink("new"))
rec("lookup unlinked new", lambda: st("new"))
rec("unlink absent", lambda: os.unlink("absent"))
rec("unlink ro/x", lambda: os.unlink("ro/x"))
rec("unlink d/.env", lambda: os.unlink("d/.env"))
rec("unlink lower d/visible", lambda: os.unlink("d/visible"))
rec("list d after unlink", lambda: sorted(os.listdir("d")))
def umasked(p):
    old = os.umask(0o027)
    try:
        fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
        os.close(fd)
    finally:
        os.umask(old)
    return stt(p)[:4]
rec("create under umask 027", lambda: umasked("umasked"))
rec("create existing O_EXCL", lambda: umasked("umasked"))
rec("create ro/new", lambda: write("ro/new", os.O_CREAT, "no"))
import ctypes, hashlib
libc = ctypes.CDLL(None, use_errno=True)
def renameat2(a, b, flags):
    if libc.renameat2(-100, a.encode(), -100, b.encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
def tree(p):
    return sorted((os.path.relpath(os.path.join(r, n), p), oct(os.lstat(os.path.join(r, n)).st_mode))
                  for r, ds, fs in os.walk(p) for n in ds + fs)
rec("read big", lambda: hashlib.sha256(open("big", "rb").read()).hexdigest())
rec("read big from 100000", lambda: (lambda f: (f.seek(100000), len(f.read(70000)))[1])(open("big", "rb")))
rec("rename lower file", lambda: (os.rename("m/one", "m/one-moved"), read("m/one-moved"), sorted(os.listdir("m")))[1:])
rec("rename over lower file", lambda: (write("m/fresh", os.O_CREAT, "fresh\n"), os.rename("m/fresh", "m/two"), read("m/two"), sorted(os.listdir("m")))[2:])
rec("rename lower dir", lambda: (os.rename("ldir", "ldir-moved"), tree("ldir-moved"), os.path.exists("ldir"))[1:])
rec("rename onto a whiteout", lambda: (os.unlink("m/three"), os.rename("m/two", "m/three"), read("m/three"), sorted(os.listdir("m")))[2:])
rec("rename noreplace", lambda: renameat2("m/one-moved", "m/three", 1))
rec("rename exchange", lambda: (renameat2("m/one-moved", "m/three", 2), read("m/one-moved"), read("m/three"))[1:])
rec("rename ro/x", lambda: os.rename("ro/x", "x-out"))
rec("rename into ro", lambda: os.rename("m/three", "ro/in"))
rec("rename d/.env", lambda: os.rename("d/.env", "env-out"))
rec("rename onto d/.env", lambda: os.rename("m/three", "d/.env"))
rec("rename dir over non-empty", lambda: os.rename("ldir-moved", "d"))
rec("mkdir over a whiteout", lambda: (os.unlink("m/four"), os.mkdir("m/four", 0o750), os.listdir("m/four"), stt("m/four")[1])[2:])
rec("mkdir existing", lambda: os.mkdir("m"))
rec("mkdir ro/new", lambda: os.mkdir("ro/new"))
rec("mkdir d/.env", lambda: os.mkdir("d/.env"))
rec("rmdir lower empty", lambda: (os.rmdir("emptyd"), os.path.exists("emptyd"))[1])
rec("rmdir non-empty", lambda: os.rmdir("ldir-moved"))
rec("rmdir ro", lambda: os.rmdir("ro"))
rec("list merged", lambda: (write("d/upper-new", os.O_CREAT, "u"), sorted(os.listdir("d")))[1])
rec("scandir merged", lambda: sorted((e.name, e.is_dir(), e.stat().st_size) for e in os.scandir("d")))
rec("walk merged", lambda: tree("."))
rec("setxattr lower", lambda: (os.setxattr("m/five", "user.k", b"v1"), os.getxattr("m/five", "user.k"))[1].decode())
rec("listxattr", lambda: sorted(os.listxattr("m/five")))
rec("removexattr", lambda: (os.removexattr("m/five", "user.k"), os.listxattr("m/five"))[1])
rec("removexattr absent", lambda: os.removexattr("m/five", "user.k"))
rec("removexattr lower absent", lambda: os.removexattr("m/six", "user.k"))
rec("setxattr ro/x", lambda: os.setxattr("ro/x", "user.k", b"v"))
rec("setxattr d/.env", lambda: os.setxattr("d/.env", "user.k", b"v"))
rec("listxattr ro/x", lambda: os.listxattr("ro/x"))
rec("symlink", lambda: (os.symlink("m/three", "sl"), os.readlink("sl"), read("sl"))[1:])
rec("symlink in ro", lambda: os.symlink("x", "ro/sl"))
rec("symlink d/.env", lambda: os.symlink("x", "d/.env"))
rec("link lower", lambda: (os.link("m/six", "six-link"), os.lstat("six-link").st_nlink, read("six-link"))[1:])
rec("link ro/x", lambda: os.link("ro/x", "x-link"))
rec("link into ro", lambda: os.link("m/three", "ro/link"))
rec("mkfifo", lambda: (os.mkfifo("fifo", 0o600), oct(os.lstat("fifo").st_mode))[1])
rec("statfs", lambda: os.statvfs(".").f_namemax)
rec("lseek SEEK_DATA", lambda: (lambda fd: (os.lseek(fd, 10, os.SEEK_DATA), os.close(fd))[0])(os.open("big", os.O_RDONLY)))
rec("write and read back", lambda: write("m/three", os.O_APPEND, "appended\n"))
for l in out:
    print(json.dumps(l))
"#;

/// Every name under `upper` with its kind, size and the names and values
/// of its xattrs, sorted.
fn upper_tree(upper: &Path) -> Vec<String> {
    let mut rows = Vec::new();
    let mut todo = vec![upper.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(upper).unwrap().display().to_string();
            // An origin names the lower file's inode and times, which
            // differ between workspaces: kept by name only.
            let mut xattrs = crate::differential::xattrs(&p).unwrap();
            for (name, v) in xattrs.iter_mut() {
                if name.ends_with(".origin") {
                    *v = "..".into();
                }
            }
            let size = if md.is_file() { md.len() } else { 0 };
            let kind = format!("{:o}", md.mode() & libc::S_IFMT);
            rows.push(format!("{rel} {kind} {size} {xattrs:?}"));
            if md.is_dir() {
                todo.push(p);
            }
        }
    }
    rows.sort();
    rows
}

/// A workspace for `OPENS`, its policy, and the script's path.
fn opens_workspace() -> (Workspace, String) {
    let ws = Workspace::new();
    populate(
        ws.lower(),
        &[
            ("f", "lower\n"),
            ("s", "shortened\n"),
            ("t", "to truncate\n"),
            ("gone", "gone\n"),
            ("ro/x", "readonly\n"),
            ("d/.env", "secret\n"),
            ("d/visible", "v\n"),
            ("d/nested/deep", "deep\n"),
            ("m/one", "one\n"),
            ("m/two", "two\n"),
            ("m/three", "three\n"),
            ("m/four", "four\n"),
            ("m/five", "five\n"),
            ("m/six", "six\n"),
            ("ldir/inner", "inner\n"),
            ("ldir/sub/deeper", "deeper\n"),
        ],
    );
    fs::create_dir_all(ws.lower().join("emptyd")).unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(ws.lower().join("big"), big).unwrap();
    let p = policy_file(&ws, "readonly ro/**\nhide **/.env\n");
    (ws, p.to_str().unwrap().to_string())
}

/// The journal's rows as the script's outcome shows them: operation,
/// path, errno, rule.
fn journal(ws: &Workspace) -> Vec<String> {
    let mut rows: Vec<String> = crate::state::log_rows(&ws.upper, &[])
        .iter()
        .map(|r| format!("{} {} {} {}", r["op"], r["path"], r["errno"], r["rule"]))
        .collect();
    rows.sort();
    rows
}

/// The queue threads answer LOOKUP, OPEN, CREATE, SETATTR, UNLINK, RELEASE
/// and IOCTL themselves (no hop to the request threads) with fuser's answers:
/// every outcome, the upper, the journal and the counters are those of
/// the same requests answered by fuser (`LAYERFS_URING_NO_FAST`), and
/// policy refusals happen there too.
#[test]
fn the_queue_threads_answer_their_requests_as_fuser_does() {
    let run = |env: &[(&str, &str)]| {
        let (ws, policy) = opens_workspace();
        let script = ws.dir.path().join("opens.py");
        fs::write(&script, OPENS).unwrap();
        let mut switch = UringSwitch::set(true).expect("this kernel has no FUSE over io_uring");
        let m = ws.mount_env(&["--io-uring", "--policy", &policy], env);
        assert!(eventually(Duration::from_secs(10), || {
            transport(m.path())["kind"] == "io_uring"
        }));
        switch.restore();
        let before = status_json(m.path());
        let answered = answered_total(m.path());
        let out = sh(m.path(), &format!("python3 {}", script.display()));
        let answered = answered_total(m.path()) - answered;
        // The lower is untouched.
        for (p, was) in [
            ("f", "lower\n"),
            ("s", "shortened\n"),
            ("t", "to truncate\n"),
        ] {
            assert_eq!(fs::read_to_string(ws.lower().join(p)).unwrap(), was);
        }
        let after = status_json(m.path());
        let by_op = |op: &str| {
            after["counters"]["by_op"][op].as_u64().unwrap_or(0)
                - before["counters"]["by_op"][op].as_u64().unwrap_or(0)
        };
        let quick = [
            "lookup",
            "open",
            "create",
            "setattr",
            "unlink",
            "release",
            "flush",
            "ioctl",
            "getattr",
            "getxattr",
            "read",
            "write",
            "rename",
            "setxattr",
            "removexattr",
            "listxattr",
            "mkdir",
            "mknod",
            "symlink",
            "link",
            "rmdir",
            "readlink",
            "statfs",
            "lseek",
            "readdir",
            "readdirplus",
        ];
        let quick: u64 = quick.iter().map(|op| by_op(op)).sum();
        let counters = ["copy_ups", "denials"].map(|c| after["counters"][c].clone());
        let upper: Vec<String> = ["f", "s", "t", "gone"]
            .iter()
            .map(|p| fs::read_to_string(ws.upper.join(p)).unwrap_or_default())
            .collect();
        // Every name of the upper (whiteouts, redirects and copies
        // included) with its kind and its layerfs xattrs.
        let upper_tree = upper_tree(&ws.upper);
        assert!(m.unmount(), "{}", ws.daemon_log());
        let journal = journal(&ws);
        (
            out,
            answered,
            by_op("open"),
            quick,
            counters,
            (upper, upper_tree),
            journal,
        )
    };
    let (out, answered, opens, quick, counters, (upper, upper_tree), journal) = run(&[]);
    let line = |label: &str| -> Value {
        out.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(|v| v[0] == label)
            .unwrap_or_else(|| panic!("no {label} in {out}"))[1]
            .clone()
    };
    assert_eq!(line("read f"), "lower\n");
    assert_eq!(line("append f"), "lower\nmore\n", "{out}");
    assert_eq!(line("truncate t"), "new\n", "{out}");
    assert_eq!(line("open f read-write"), Value::Null, "{out}");
    assert_eq!(line("lookup whited-out gone"), "EENOENT", "{out}");
    assert_eq!(line("open whited-out gone"), "EENOENT", "{out}");
    assert_eq!(line("lookup new"), "EENOENT", "{out}");
    assert_eq!(line("lookup new again")[0], 6, "{out}");
    assert_eq!(line("lookup gone again")[0], 5, "{out}");
    assert_eq!(line("read ro/x"), "readonly\n");
    assert_eq!(line("append ro/x"), "EEROFS", "{out}");
    assert_eq!(line("truncate ro/x"), "EEROFS", "{out}");
    assert_eq!(line("lookup d/.env"), "EENOENT", "{out}");
    assert_eq!(line("open d/.env"), "EENOENT", "{out}");
    assert_eq!(line("list d"), serde_json::json!(["nested", "visible"]));
    assert_eq!(line("open d for writing"), "EEISDIR", "{out}");
    assert_eq!(line("read d/nested/deep"), "deep\n");
    assert_eq!(line("ftruncate f"), "lo", "{out}");
    assert_eq!(line("truncate lower s by path"), "sho", "{out}");
    let f = line("times of f");
    let f: Vec<u64> = (2..6).map(|i| f[i].as_u64().unwrap()).collect();
    assert_eq!(f, [1234, 5678, 1600000000123456789, 1700000000987654321]);
    assert_eq!(line("chmod ro/x"), "EEROFS", "{out}");
    assert_eq!(line("truncate ro/x by path"), "EEROFS", "{out}");
    assert_eq!(line("times of ro/x"), "EEROFS", "{out}");
    assert_eq!(line("chmod d/.env"), "EENOENT", "{out}");
    assert_eq!(
        line("mode of d/nested/deep"),
        serde_json::json!([5, "0o100640", 0, 0])
    );
    assert_eq!(line("ioctl FS_IOC_GETFLAGS f"), "EENOTTY", "{out}");
    assert_eq!(line("lookup unlinked new"), "EENOENT", "{out}");
    assert_eq!(line("unlink absent"), "EENOENT", "{out}");
    assert_eq!(line("unlink ro/x"), "EEROFS", "{out}");
    assert_eq!(line("unlink d/.env"), "EENOENT", "{out}");
    assert_eq!(line("list d after unlink"), serde_json::json!(["nested"]));
    assert_eq!(
        line("create under umask 027"),
        serde_json::json!([0, "0o100640", 0, 0])
    );
    assert_eq!(line("create existing O_EXCL"), "EEEXIST", "{out}");
    assert_eq!(line("create ro/new"), "EEROFS", "{out}");
    assert_eq!(upper[..3], ["lo", "sho", "new\n"]);

    // Every LOOKUP, OPEN, RELEASE (and GETATTR, GETXATTR, FLUSH) was
    // answered by a queue thread, none handed on.
    assert!(opens >= 10, "{opens} opens");
    assert_eq!(
        answered, quick,
        "answered by the queue threads: {answered} of {quick}"
    );

    let (slow, none, _, _, slow_counters, (slow_upper, slow_tree), slow_journal) =
        run(&[("LAYERFS_URING_NO_FAST", "1")]);
    assert_eq!(none, 0);
    for (a, b) in out.lines().zip(slow.lines()) {
        assert_eq!(a, b, "queue thread's answer (left) against fuser's (right)");
    }
    assert_eq!(out.lines().count(), slow.lines().count());
    assert_eq!(upper, slow_upper);
    assert_eq!(upper_tree, slow_tree, "the upper's names, kinds and xattrs");
    assert_eq!(counters, slow_counters, "copy-ups and denials");
    assert_eq!(journal, slow_journal);
    assert!(
        journal
            .iter()
            .any(|r| r.starts_with("\"write\" \"ro/x\"") && r.contains("readonly ro/**")),
        "the readonly refusal is in the journal with its rule: {journal:#?}"
    );
}

/// A LOOKUP answered by a queue thread gives the kernel a reference the
/// daemon counts, as through fuser (FORGET still comes through
/// `/dev/fuse`): once the kernel forgets every name, the daemon drops
/// every node (the watches of the lower directories go with them), and
/// the names look up again afterwards.
#[test]
fn lookups_answered_by_the_queue_threads_are_forgotten_exactly() {
    let ws = Workspace::new();
    for i in 0..40 {
        populate(ws.lower(), &[(&format!("d{i:02}/sub/f"), "f\n")]);
    }
    let Some(m) = mount_uring(&ws, &[]) else {
        panic!("this kernel has no {SWITCH}: FUSE over io_uring is not built in");
    };
    // Each path looked up name by name (no listing), several times.
    let stat_all = "for i in $(seq -w 0 39); do stat -c %s d$i/sub/f; done | sort | uniq -c";
    let lookups = |v: &Value| v["counters"]["by_op"]["lookup"].as_u64().unwrap_or(0);
    let before = status_json(m.path());
    let answered = answered_total(m.path());
    for _ in 0..3 {
        assert_eq!(sh(m.path(), stat_all).trim(), "40 2");
    }
    let after = status_json(m.path());
    assert!(
        lookups(&after) - lookups(&before) >= 120,
        "{}",
        after["counters"]
    );
    assert!(answered_total(m.path()) - answered >= 120);
    let watched = |m: &Mount| status_json(m.path())["watches"]["used"].as_u64().unwrap();
    assert!(
        watched(&m) >= 80,
        "lower directories watched: {}",
        watched(&m)
    );
    let mut c = crate::state::Control::connect(&crate::state::state_dir(&ws));
    let v = c.ask(serde_json::json!({"cmd": "invalidate_all"}));
    assert_eq!(v["ok"], serde_json::json!(true), "{v}");
    let mut left = 0;
    let forgotten = eventually(Duration::from_secs(10), || {
        left = watched(&m);
        left <= 1
    });
    assert!(
        forgotten,
        "{left} watches kept after the kernel forgot every name"
    );
    assert_eq!(sh(m.path(), stat_all).trim(), "40 2");
    assert!(m.unmount(), "{}", ws.daemon_log());
}

/// A change that copies up 8 MiB or more (a chmod of a lower file, an
/// open for writing) is not answered by a queue thread, which would hold
/// up every other request of its CPU meanwhile: the request threads get
/// it, and it works as usual.
#[test]
fn a_long_copy_up_is_left_to_the_request_threads() {
    let ws = Workspace::new();
    let data: Vec<u8> = (0..9 << 20).map(|i: u32| (i % 251) as u8).collect();
    fs::write(ws.lower().join("big"), &data).unwrap();
    fs::write(ws.lower().join("big2"), &data).unwrap();
    let Some(m) = mount_uring(&ws, &[]) else {
        panic!("this kernel has no {SWITCH}: FUSE over io_uring is not built in");
    };
    let handed_on = |m: &Mount| -> u64 {
        ring_requests(m.path()).iter().sum::<u64>() - answered_total(m.path())
    };
    fs::metadata(m.p("big")).unwrap();
    fs::metadata(m.p("big2")).unwrap();
    let before = handed_on(&m);
    fs::set_permissions(m.p("big"), fs::Permissions::from_mode(0o600)).unwrap();
    let after_chmod = handed_on(&m);
    assert!(
        after_chmod > before,
        "the chmod's SETATTR was answered by a queue thread"
    );
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(m.p("big2"))
        .unwrap();
    std::io::Write::write_all(&mut f, b"end").unwrap();
    drop(f);
    assert!(
        handed_on(&m) > after_chmod,
        "the open for writing was answered by a queue thread"
    );
    let meta = fs::metadata(ws.upper.join("big")).unwrap();
    assert_eq!(
        (meta.len(), meta.mode() & 0o777),
        (data.len() as u64, 0o600)
    );
    assert_eq!(
        fs::read(ws.upper.join("big2")).unwrap().len(),
        data.len() + 3
    );
    assert!(m.unmount(), "{}", ws.daemon_log());
}

/// Confines the calling thread to `cpu`.
fn pin_to(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).unwrap();
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
}

/// FSYNC and FSYNCDIR are answered by the queue threads (the sync runs
/// on the queue's ring): none of them is handed on to the request
/// threads; a lower directory (nothing in the upper to sync) and a new
/// one both sync, and fdatasync too.
#[test]
fn fsyncs_are_answered_by_the_queue_threads() {
    let ws = Workspace::new();
    fs::create_dir(ws.lower().join("low")).unwrap();
    fs::write(ws.lower().join("low/f"), "lower\n").unwrap();
    let Some(m) = mount_uring(&ws, &[]) else {
        panic!("this kernel has no {SWITCH}: FUSE over io_uring is not built in");
    };
    let handed_on = |m: &Mount| -> u64 {
        ring_requests(m.path()).iter().sum::<u64>() - answered_total(m.path())
    };
    fs::create_dir(m.p("new")).unwrap();
    let mut f = fs::File::create(m.p("new/db")).unwrap();
    let lower = fs::File::open(m.p("low/f")).unwrap();
    let (dir, low) = (
        fs::File::open(m.p("new")).unwrap(),
        fs::File::open(m.p("low")).unwrap(),
    );
    let before = (handed_on(&m), answered_total(m.path()));
    for i in 0..50 {
        std::io::Write::write_all(&mut f, format!("row {i}\n").as_bytes()).unwrap();
        f.sync_all().unwrap();
        f.sync_data().unwrap();
        lower.sync_all().unwrap();
        dir.sync_all().unwrap();
        low.sync_all().unwrap();
    }
    let after = (handed_on(&m), answered_total(m.path()));
    assert!(
        after.0 - before.0 < 10,
        "{} requests handed on to the request threads for 250 syncs",
        after.0 - before.0
    );
    assert!(
        after.1 - before.1 >= 250,
        "{} requests answered by the queue threads for 250 syncs and 50 writes",
        after.1 - before.1
    );
    drop((f, lower, dir, low));
    let rows: String = (0..50).map(|i| format!("row {i}\n")).collect();
    assert_eq!(fs::read_to_string(ws.upper.join("new/db")).unwrap(), rows);
    assert!(m.unmount(), "{}", ws.daemon_log());
}

/// A slow fsync answered by a queue thread does not hold up the other
/// requests of its CPU: while one thread on CPU 0 fsyncs a large dirty
/// file, lookups from another thread on CPU 0 keep being answered. (A
/// queue thread that synced in place would answer none of them until the
/// sync ended.) The fsync is judged only once it took long enough to
/// tell (a larger file is tried otherwise), and only lookups in its first
/// half are counted, so that a late wake-up of the syncing thread cannot
/// count as overlap.
#[test]
fn a_slow_fsync_does_not_hold_up_its_queue() {
    let ws = Workspace::new();
    let Some(m) = mount_uring(&ws, &[]) else {
        panic!("this kernel has no {SWITCH}: FUSE over io_uring is not built in");
    };
    let chunk = vec![0x5au8; 1 << 20];
    let mut judged = None;
    for (round, mib) in [256usize, 768, 2048].into_iter().enumerate() {
        let path = m.p(&format!("big{round}"));
        let sync = {
            let (path, chunk) = (path.clone(), chunk.clone());
            std::thread::spawn(move || {
                pin_to(0);
                let mut f = fs::File::create(&path).unwrap();
                for _ in 0..mib {
                    std::io::Write::write_all(&mut f, &chunk).unwrap();
                }
                // Closed and opened again: what the kernel still holds
                // dirty goes to the daemon at the close, so the fsync is
                // the daemon's sync of its upper file alone.
                drop(f);
                let f = fs::File::open(&path).unwrap();
                let t0 = std::time::Instant::now();
                f.sync_all().unwrap();
                (t0, std::time::Instant::now())
            })
        };
        let looker = {
            let mnt = m.path().to_path_buf();
            let sync_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let done = sync_done.clone();
            let t = std::thread::spawn(move || {
                pin_to(0);
                let mut answered = Vec::new();
                let mut i = 0u64;
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    // A name never looked up before: a LOOKUP each time.
                    let r = fs::symlink_metadata(mnt.join(format!("nope-{round}-{i}")));
                    assert!(r.is_err());
                    answered.push(std::time::Instant::now());
                    i += 1;
                }
                answered
            });
            (t, sync_done)
        };
        let (t0, t1) = sync.join().unwrap();
        looker.1.store(true, std::sync::atomic::Ordering::Release);
        let answered = looker.0.join().unwrap();
        fs::remove_file(&path).unwrap();
        let took = t1 - t0;
        if took < Duration::from_millis(200) {
            continue;
        }
        let half = t0 + took / 2;
        let during = answered.iter().filter(|&&t| t > t0 && t < half).count();
        judged = Some((mib, took, during));
        break;
    }
    let Some((mib, took, during)) = judged else {
        panic!("no fsync of up to 2 GiB took 200 ms here: cannot tell whether it blocks");
    };
    assert!(
        during >= 5,
        "{during} lookups on CPU 0 answered in the first half of a {took:?} fsync of {mib} MiB"
    );
    assert!(m.unmount(), "{}", ws.daemon_log());
}
