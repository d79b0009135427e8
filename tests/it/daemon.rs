//! Daemon and CLI tests through the real binary: background mounts that
//! return only when live, `layerfs umount` waiting for the daemon, every
//! refusal `layerfs mount` makes before mounting, kernel-overlay `-o`
//! options, signals (TERM/INT unmount, HUP reloads the policy), stale-mount
//! recovery, systemd readiness, and the unprivileged (fusermount3) path.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use layerfs::host::pidfile;

use crate::harness::eventually;
use crate::harness::{bin, is_mounted, layerfs_quiet, policy_file, Workspace};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A background mount made with `layerfs mount` (no --foreground). Dropping
/// it runs `layerfs umount`, then `umount -l`, then kills the recorded
/// daemon if it is still alive.
pub(crate) struct BgMount {
    pub(crate) mnt: PathBuf,
    pub(crate) pid: Option<u32>,
}

impl BgMount {
    fn pid(&self) -> u32 {
        self.pid.expect("the daemon recorded no pid file")
    }
}

impl Drop for BgMount {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = Command::new(bin()).arg("umount").arg(&self.mnt).output();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        if let Some(pid) = self.pid {
            if pidfile::is_daemon_alive(pid) {
                kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// A foreground daemon run as a child. Dropping it unmounts and reaps it.
pub(crate) struct FgDaemon {
    pub(crate) mnt: PathBuf,
    pub(crate) child: Option<Child>,
}

impl FgDaemon {
    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// Waits for the daemon to exit; its exit status, or `None` on timeout.
    pub(crate) fn wait(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(s)) = child.try_wait() {
                self.child = None;
                return Some(s);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for FgDaemon {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg(&self.mnt).status();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        if let Some(mut c) = self.child.take() {
            if self.wait_quietly(&mut c).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl FgDaemon {
    fn wait_quietly(&self, c: &mut Child) -> Option<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return Some(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

fn kill(pid: u32, sig: i32) {
    // SAFETY: sending a signal to a pid this test started.
    unsafe { libc::kill(pid as i32, sig) };
}

/// `layerfs mount` arguments for `ws` (all lowers, upper, work) plus `extra`.
pub(crate) fn mount_args(ws: &Workspace, extra: &[&str]) -> Vec<String> {
    let mut a = vec!["mount".to_string()];
    for l in &ws.lowers {
        a.push("--lower".into());
        a.push(l.display().to_string());
    }
    a.push("--upper".into());
    a.push(ws.upper.display().to_string());
    a.push("--work".into());
    a.push(ws.work.display().to_string());
    a.extend(extra.iter().map(|s| s.to_string()));
    a.push(ws.mnt.display().to_string());
    a
}
pub(crate) fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Mounts `ws` in the background with the raw argument list `args`.
fn bg_mount_args(mnt: &Path, args: &[String]) -> Result<BgMount, Output> {
    let out = layerfs_quiet(args);
    if !out.status.success() {
        return Err(out);
    }
    let canon = fs::canonicalize(mnt).unwrap_or_else(|_| mnt.to_path_buf());
    Ok(BgMount {
        mnt: mnt.to_path_buf(),
        pid: pidfile::find_daemon(&canon, None),
    })
}

fn bg_mount(ws: &Workspace, extra: &[&str]) -> BgMount {
    bg_mount_args(&ws.mnt, &mount_args(ws, extra))
        .unwrap_or_else(|o| panic!("layerfs mount failed: {}", text(&o)))
}

/// Runs `layerfs mount` expecting a refusal: exit `code`, a message with
/// every needle, nothing mounted, no daemon left.
fn expect_refusal(mnt: &Path, args: &[String], code: i32, needles: &[&str]) {
    assert!(
        !is_mounted(mnt),
        "{} is mounted before the test",
        mnt.display()
    );
    let out = layerfs_quiet(args);
    // Whatever a wrongly accepted mount left behind is cleaned up on return.
    let _leftover = BgMount {
        mnt: mnt.to_path_buf(),
        pid: fs::canonicalize(mnt)
            .ok()
            .and_then(|c| pidfile::find_daemon(&c, None)),
    };
    let all = text(&out);
    assert_eq!(out.status.code(), Some(code), "{all}");
    let err = String::from_utf8_lossy(&out.stderr);
    for n in needles {
        assert!(err.contains(n), "message lacks `{n}`: {all}");
    }
    assert!(
        !is_mounted(mnt),
        "refused mount left {} mounted",
        mnt.display()
    );
}

/// Starts a foreground daemon for `ws` and waits until it is mounted.
fn fg_mount(ws: &Workspace, extra: &[&str], env: &[(&str, &Path)]) -> FgDaemon {
    let mut cmd = Command::new(bin());
    cmd.args(mount_args(ws, &[&["--foreground"], extra].concat()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("spawn layerfs --foreground");
    let mut d = FgDaemon {
        mnt: ws.mnt.clone(),
        child: Some(child),
    };
    let live = eventually(Duration::from_secs(20), || {
        is_mounted(&ws.mnt) || matches!(d.child.as_mut().map(|c| c.try_wait()), Some(Ok(Some(_))))
    });
    assert!(
        live && is_mounted(&ws.mnt),
        "foreground daemon did not mount"
    );
    d
}

// ---------------------------------------------------------------------------
// Background mount and umount
// ---------------------------------------------------------------------------

#[test]
fn background_mount_returns_only_when_live_and_umount_waits_for_the_daemon() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("greeting"), "hello\n").unwrap();
    let m = bg_mount(&ws, &[]);
    // No retry: the mount must already answer.
    assert_eq!(
        fs::read_to_string(ws.mnt.join("greeting")).unwrap(),
        "hello\n"
    );
    assert!(is_mounted(&ws.mnt));
    let pid = m.pid();
    assert!(pidfile::is_daemon_alive(pid));

    let out = layerfs_quiet(&["umount".into(), ws.mnt.display().to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!is_mounted(&ws.mnt));
    assert!(
        !pidfile::is_daemon_alive(pid),
        "daemon {pid} still running after layerfs umount returned"
    );
}

/// `layerfs umount MNT && umount UPPER_FS` must work: once `layerfs umount`
/// returns, nothing of the daemon holds the upper's filesystem. (Its main
/// thread turns zombie while the other threads still exit holding the
/// shared fds; waiting only for the main thread lost that race about half
/// the time.)
#[test]
fn after_umount_the_upper_filesystem_is_free_to_unmount() {
    let mut ws = Workspace::new();
    fs::write(ws.lower().join("f"), "shared\n").unwrap();
    let base = ws.dir.path().to_path_buf();
    let disk = crate::fulldisk::LoopFs::new(&base, "disk", 32, &["mkfs.ext4", "-q", "-F"], "");
    ws.upper = disk.mnt.join("upper");
    ws.work = disk.mnt.join("work");
    for round in 0..6 {
        if round > 0 {
            disk.mount("");
        }
        fs::create_dir_all(&ws.upper).unwrap();
        let m = bg_mount(&ws, &[]);
        let pid = m.pid();
        // Written by a child: a file this process opened in the mount
        // could be inherited for a moment by a process another test
        // spawns meanwhile, and make the mount itself busy.
        let st = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo 'round {round}' >> '{}'",
                ws.mnt.join("f").display()
            ))
            .status()
            .unwrap();
        assert!(st.success());
        let out = layerfs_quiet(&["umount".into(), ws.mnt.display().to_string()]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(!pidfile::is_daemon_alive(pid));
        // No retry, no lazy unmount: busy now is the bug.
        let um = Command::new("umount").arg(&disk.mnt).output().unwrap();
        assert!(
            um.status.success(),
            "round {round}: the upper's filesystem is still busy right after \
             layerfs umount returned: {}",
            String::from_utf8_lossy(&um.stderr)
        );
    }
    disk.mount("");
    let text = fs::read_to_string(ws.upper.join("f")).unwrap();
    assert_eq!(text.lines().count(), 7, "{text}");
}

#[test]
fn umount_of_something_not_mounted_fails_clearly() {
    let ws = Workspace::new();
    let out = layerfs_quiet(&["umount".into(), ws.mnt.display().to_string()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not mounted"));
}

// ---------------------------------------------------------------------------
// Refusals before mounting
// ---------------------------------------------------------------------------

#[test]
fn mount_refuses_a_missing_lower_upper_or_mountpoint() {
    let ws = Workspace::new();
    let missing = ws.dir.path().join("missing");
    let m = missing.display().to_string();

    let mut args = mount_args(&ws, &[]);
    args[2] = m.clone(); // --lower
    expect_refusal(&ws.mnt, &args, 1, &["lower", &m, "does not exist"]);

    let mut args = mount_args(&ws, &[]);
    args[4] = m.clone(); // --upper
    expect_refusal(&ws.mnt, &args, 1, &["upper", &m, "does not exist"]);

    let mut args = mount_args(&ws, &[]);
    *args.last_mut().unwrap() = m.clone();
    expect_refusal(&missing, &args, 1, &["mountpoint", &m, "does not exist"]);
}

#[test]
fn mount_refuses_an_upper_inside_a_lower_and_a_mountpoint_inside_the_upper() {
    let ws = Workspace::new();
    let nested = ws.lower().join("upper");
    fs::create_dir(&nested).unwrap();
    let mut args = mount_args(&ws, &[]);
    args[4] = nested.display().to_string();
    expect_refusal(&ws.mnt, &args, 1, &["inside lower"]);

    let inner = ws.upper.join("mnt");
    fs::create_dir(&inner).unwrap();
    let mut args = mount_args(&ws, &[]);
    *args.last_mut().unwrap() = inner.display().to_string();
    expect_refusal(&inner, &args, 1, &["mountpoint", "inside the upper"]);
}

#[test]
fn mount_refuses_a_busy_mountpoint() {
    let ws = Workspace::new();
    let _m = bg_mount(&ws, &[]);
    let out = layerfs_quiet(&mount_args(&ws, &[]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("mountpoint busy"),
        "{}",
        text(&out)
    );
    // The first mount is untouched.
    assert!(is_mounted(&ws.mnt));
}

#[test]
fn mount_refuses_an_unknown_dash_o_option_as_a_usage_error() {
    let ws = Workspace::new();
    let args = mount_args(&ws, &["-o", "rw,frobnicate=3"]);
    expect_refusal(&ws.mnt, &args, 2, &["unknown mount option", "frobnicate"]);
}

#[test]
fn mount_refuses_a_bad_policy_file_naming_the_line() {
    let ws = Workspace::new();
    let p = policy_file(&ws, "hide **/.env\nfrobnicate everything\n");
    let args = mount_args(&ws, &["--policy", p.to_str().unwrap()]);
    expect_refusal(&ws.mnt, &args, 1, &["line 2"]);
}

#[test]
fn usage_errors_exit_2_and_help_exits_0_with_examples() {
    let out = layerfs_quiet(&["mount"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = layerfs_quiet(&["mount", "--help"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("Examples") && help.contains("lowerdir="),
        "{help}"
    );
    let out = layerfs_quiet(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn policy_check_says_ok_or_names_the_bad_line() {
    let ws = Workspace::new();
    let good = policy_file(&ws, "hide **/.env\nreadonly skills/**\n");
    let out = layerfs_quiet(&["policy".into(), "check".into(), good.display().to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK"));

    let bad = ws.dir.path().join("bad-policy");
    fs::write(&bad, "hide a\n\nreadonly\n").unwrap();
    let out = layerfs_quiet(&["policy".into(), "check".into(), bad.display().to_string()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 3"),
        "{}",
        text(&out)
    );
}

// ---------------------------------------------------------------------------
// Kernel-overlay style options
// ---------------------------------------------------------------------------

#[test]
fn dash_o_lowerdir_upperdir_workdir_mounts_two_lowers_topmost_first() {
    let ws = Workspace::with_lowers(2);
    fs::write(ws.lowers[0].join("both"), "top\n").unwrap();
    fs::write(ws.lowers[1].join("both"), "bottom\n").unwrap();
    fs::write(ws.lowers[1].join("only-bottom"), "b\n").unwrap();
    let opts = format!(
        "lowerdir={}:{},upperdir={},workdir={},default_permissions,nodev",
        ws.lowers[0].display(),
        ws.lowers[1].display(),
        ws.upper.display(),
        ws.work.display()
    );
    let args = vec![
        "mount".to_string(),
        "-o".into(),
        opts,
        ws.mnt.display().to_string(),
    ];
    let _m = bg_mount_args(&ws.mnt, &args).unwrap_or_else(|o| panic!("{}", text(&o)));
    assert_eq!(fs::read_to_string(ws.mnt.join("both")).unwrap(), "top\n");
    assert_eq!(
        fs::read_to_string(ws.mnt.join("only-bottom")).unwrap(),
        "b\n"
    );
    fs::write(ws.mnt.join("new"), "n").unwrap();
    assert_eq!(fs::read_to_string(ws.upper.join("new")).unwrap(), "n");
}

// ---------------------------------------------------------------------------
// Signals
// ---------------------------------------------------------------------------

fn signal_unmounts_cleanly(sig: i32) {
    let ws = Workspace::new();
    fs::write(ws.lower().join("f"), "x").unwrap();
    let mut d = fg_mount(&ws, &[], &[]);
    assert_eq!(fs::read_to_string(ws.mnt.join("f")).unwrap(), "x");
    kill(d.pid(), sig);
    let status = d
        .wait(Duration::from_secs(10))
        .expect("daemon still running 10 s after the signal");
    assert!(status.success(), "daemon exited with {status}");
    assert!(!is_mounted(&ws.mnt), "mount left behind after signal {sig}");
}

#[test]
fn sigterm_unmounts_cleanly_and_exits_0() {
    signal_unmounts_cleanly(libc::SIGTERM);
}

#[test]
fn sigint_unmounts_cleanly_and_exits_0() {
    signal_unmounts_cleanly(libc::SIGINT);
}

#[test]
fn sighup_reloads_the_policy_and_a_broken_file_keeps_the_old_one() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("secret"), "s3cret").unwrap();
    fs::write(ws.lower().join("plain"), "p").unwrap();
    let p = policy_file(&ws, "# nothing hidden yet\n");
    let log = ws.dir.path().join("daemon.log");
    let m = bg_mount(
        &ws,
        &[
            "--policy",
            p.to_str().unwrap(),
            "--log-file",
            log.to_str().unwrap(),
        ],
    );
    assert!(ws.mnt.join("secret").exists());

    fs::write(&p, "hide secret\n").unwrap();
    kill(m.pid(), libc::SIGHUP);
    assert!(
        eventually(Duration::from_secs(5), || fs::metadata(
            ws.mnt.join("secret")
        )
        .is_err()),
        "`secret` still visible after SIGHUP with `hide secret`"
    );
    assert_eq!(
        fs::read_dir(&ws.mnt)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name() == "secret")
            .count(),
        0,
        "hidden name still listed"
    );

    fs::write(&p, "hide secret\nthis is not a rule\n").unwrap();
    kill(m.pid(), libc::SIGHUP);
    assert!(
        eventually(Duration::from_secs(5), || fs::read_to_string(&log)
            .is_ok_and(|l| l.contains("line 2"))),
        "broken policy not reported with its line in the log: {}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        fs::metadata(ws.mnt.join("secret")).is_err(),
        "a broken policy file dropped the previous policy"
    );
    assert_eq!(fs::read_to_string(ws.mnt.join("plain")).unwrap(), "p");
    assert!(pidfile::is_daemon_alive(m.pid()));
}

// ---------------------------------------------------------------------------
// Stale mounts and readiness
// ---------------------------------------------------------------------------

#[test]
fn a_stale_mount_left_by_a_killed_daemon_is_recovered_by_the_next_mount() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("f"), "still here").unwrap();
    let first = bg_mount(&ws, &[]);
    let pid = first.pid();
    kill(pid, libc::SIGKILL);
    assert!(eventually(Duration::from_secs(5), || {
        !pidfile::is_daemon_alive(pid)
    }));
    assert!(is_mounted(&ws.mnt), "kill -9 should leave a stale mount");
    let err = fs::metadata(&ws.mnt).unwrap_err();
    // ECONNABORTED while the kernel is still aborting the connection.
    assert!(
        matches!(
            err.raw_os_error(),
            Some(libc::ENOTCONN | libc::ECONNABORTED)
        ),
        "{err}"
    );

    let second = bg_mount(&ws, &[]);
    assert_eq!(fs::read_to_string(ws.mnt.join("f")).unwrap(), "still here");
    drop(second);
    drop(first);
    assert!(!is_mounted(&ws.mnt));
}

#[test]
fn foreground_mode_notifies_systemd_ready_and_stopping() {
    let ws = Workspace::new();
    let sock_path = ws.dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut d = fg_mount(&ws, &[], &[("NOTIFY_SOCKET", &sock_path)]);

    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).expect("no sd_notify message");
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(
        msg.lines().any(|l| l == "READY=1"),
        "first message: {msg:?}"
    );
    assert!(
        is_mounted(&ws.mnt),
        "READY=1 sent before the mount was live"
    );

    kill(d.pid(), libc::SIGTERM);
    let mut stopping = false;
    while let Ok(n) = sock.recv(&mut buf) {
        if String::from_utf8_lossy(&buf[..n])
            .lines()
            .any(|l| l == "STOPPING=1")
        {
            stopping = true;
            break;
        }
    }
    assert!(stopping, "no STOPPING=1 after SIGTERM");
    let status = d
        .wait(Duration::from_secs(10))
        .expect("daemon did not exit");
    assert!(status.success());
}

// ---------------------------------------------------------------------------
// Unprivileged mode (fusermount3)
// ---------------------------------------------------------------------------

pub(crate) const NOBODY: u32 = 65534;

/// Serializes tests that change the mode of /dev/fuse.
pub(crate) static DEV_FUSE: Mutex<()> = Mutex::new(());

/// Makes /dev/fuse usable by everyone until dropped (restores the mode).
pub(crate) struct DevFuseOpen {
    mode: u32,
}

impl DevFuseOpen {
    pub(crate) fn new() -> DevFuseOpen {
        let mode = fs::metadata("/dev/fuse").unwrap().mode() & 0o7777;
        fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666)).unwrap();
        DevFuseOpen { mode }
    }
}

impl Drop for DevFuseOpen {
    fn drop(&mut self) {
        let _ = fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(self.mode));
    }
}

/// Runs `args` as uid/gid 65534.
pub(crate) fn as_nobody(program: &Path, args: &[String]) -> Output {
    Command::new("setpriv")
        .args([
            format!("--reuid={NOBODY}"),
            format!("--regid={NOBODY}"),
            "--clear-groups".to_string(),
            "--".into(),
        ])
        .arg(program)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run setpriv")
}

pub(crate) fn chown_tree(p: &Path) -> io::Result<()> {
    std::os::unix::fs::lchown(p, Some(NOBODY), Some(NOBODY))?;
    if fs::symlink_metadata(p)?.is_dir() {
        for e in fs::read_dir(p)? {
            chown_tree(&e?.path())?;
        }
    }
    Ok(())
}

#[test]
fn an_unprivileged_user_mounts_through_fusermount3() {
    if Command::new("fusermount3").arg("-V").output().is_err() {
        panic!("fusermount3 is missing: apt-get install fuse3");
    }
    let _serial = DEV_FUSE.lock().unwrap_or_else(|e| e.into_inner());
    let ws = Workspace::new();
    fs::write(ws.lower().join("shared"), "from lower\n").unwrap();
    fs::create_dir(&ws.work).unwrap();
    fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    chown_tree(ws.dir.path()).unwrap();
    let _dev = DevFuseOpen::new();

    let out = as_nobody(&bin(), &mount_args(&ws, &[]));
    let guard = BgMount {
        mnt: ws.mnt.clone(),
        pid: pidfile::find_daemon(&ws.mnt, Some(NOBODY)),
    };
    assert!(
        out.status.success(),
        "unprivileged mount failed: {}",
        text(&out)
    );
    assert!(is_mounted(&ws.mnt));
    let pid = guard.pid();
    // Only root may raise the mount's readahead: this mount keeps the
    // kernel's and works all the same.
    assert_eq!(crate::readahead::readahead_kb(&ws.mnt), 128);

    let script = format!(
        "set -e; cd {mnt}; echo made-by-nobody > new; cat new; cat shared; rm shared; \
         test ! -e shared",
        mnt = ws.mnt.display()
    );
    let out = as_nobody(Path::new("/bin/sh"), &["-c".into(), script]);
    assert!(
        out.status.success(),
        "operations as uid {NOBODY}: {}",
        text(&out)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "made-by-nobody\nfrom lower\n"
    );
    let wh = fs::symlink_metadata(ws.upper.join("shared")).expect("no whiteout in the upper");
    assert!(
        wh.file_type().is_char_device() && wh.rdev() == 0
            || xattr::get(ws.upper.join("shared"), "user.overlay.whiteout")
                .ok()
                .flatten()
                .is_some(),
        "upper/shared is not a whiteout: {wh:?}"
    );
    assert_eq!(
        fs::read_to_string(ws.lower().join("shared")).unwrap(),
        "from lower\n"
    );

    let out = as_nobody(&bin(), &["umount".into(), ws.mnt.display().to_string()]);
    assert!(out.status.success(), "unprivileged umount: {}", text(&out));
    assert!(!is_mounted(&ws.mnt));
    assert!(!pidfile::is_daemon_alive(pid));
}

// ---------------------------------------------------------------------------
// Remount right after umount(8)
// ---------------------------------------------------------------------------

/// `umount MNT && layerfs mount … MNT`, as scripts, fstab users and
/// `systemctl restart` do: the old daemon's mount is gone but it may still
/// be flushing and hold the upper's lock. The new mount waits for it
/// instead of refusing, every time, and nothing written is lost.
#[test]
fn remount_right_after_plain_umount_waits_for_the_old_daemon() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("base"), "lower\n").unwrap();
    let mut m = bg_mount(&ws, &[]);
    for i in 0..20 {
        // Enough data that the old daemon has something to flush.
        let body = format!("cycle {i}\n").repeat(20_000);
        fs::write(ws.mnt.join(format!("f{i}")), &body).unwrap();
        fs::write(ws.mnt.join("base"), format!("edited {i}\n")).unwrap();
        let st = Command::new("umount").arg(&ws.mnt).status().unwrap();
        assert!(st.success(), "umount failed in cycle {i}");
        // The old daemon exits on its own now; the guard must not kill it.
        m.pid = None;
        drop(m);
        m = bg_mount_args(&ws.mnt, &mount_args(&ws, &[]))
            .unwrap_or_else(|o| panic!("remount {i} refused: {}", text(&o)));
        for j in 0..=i {
            let want = format!("cycle {j}\n").repeat(20_000);
            assert_eq!(
                fs::read_to_string(ws.mnt.join(format!("f{j}"))).unwrap(),
                want,
                "f{j} after remount {i}"
            );
        }
        assert_eq!(
            fs::read_to_string(ws.mnt.join("base")).unwrap(),
            format!("edited {i}\n")
        );
    }
    drop(m);
    assert!(!is_mounted(&ws.mnt));
}

/// Mounting over a directory that holds files would hide them silently:
/// refused, naming the option that allows it; `--nonempty` and
/// `-o nonempty` allow it, and `--help` says so.
#[test]
fn mount_refuses_a_non_empty_mountpoint_unless_nonempty() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("from-lower"), "l").unwrap();
    fs::write(ws.mnt.join("hidden"), "under the mount").unwrap();
    expect_refusal(
        &ws.mnt,
        &mount_args(&ws, &[]),
        1,
        &["is not empty", "hidden", "--nonempty", "-o nonempty"],
    );
    for extra in [&["--nonempty"][..], &["-o", "nonempty"][..]] {
        let m = bg_mount(&ws, extra);
        assert!(ws.mnt.join("from-lower").exists(), "{extra:?}");
        assert!(!ws.mnt.join("hidden").exists(), "{extra:?}");
        drop(m);
        assert!(!is_mounted(&ws.mnt));
        assert_eq!(
            fs::read_to_string(ws.mnt.join("hidden")).unwrap(),
            "under the mount"
        );
    }
    let help = layerfs_quiet(&["mount", "--help"]);
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("--nonempty"),
        "{}",
        text(&help)
    );
}

/// `status --json` of `mnt`, parsed.
fn status_json(mnt: &Path) -> serde_json::Value {
    let out = layerfs_quiet(&["status".into(), "--json".into(), mnt.display().to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim())
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
}

/// A policy reload that fails is visible: in the log, in `status` and
/// in `status --json`, until a reload succeeds.
#[test]
fn a_failed_policy_reload_is_shown_by_status_until_one_succeeds() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("secret"), "s3cret").unwrap();
    let p = policy_file(&ws, "hide secret\n");
    let m = bg_mount(&ws, &["--policy", p.to_str().unwrap()]);
    assert!(status_json(&ws.mnt)["policy_reload_failure"].is_null());

    fs::write(&p, "# one\nhide secret\nthis is not a rule\n").unwrap();
    kill(m.pid(), libc::SIGHUP);
    assert!(
        eventually(Duration::from_secs(10), || !status_json(&ws.mnt)
            ["policy_reload_failure"]
            .is_null()),
        "status never showed the failed reload"
    );
    let v = status_json(&ws.mnt);
    let msg = v["policy_reload_failure"]["message"].as_str().unwrap();
    assert!(msg.starts_with("policy reload failed at "), "{msg}");
    assert!(msg.contains("line 3"), "{msg}");
    assert!(msg.ends_with("; serving the previous policy"), "{msg}");
    assert!(v["policy_reload_failure"]["failed_at"].is_string(), "{v}");
    let out = layerfs_quiet(&["status".into(), ws.mnt.display().to_string()]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(msg),
        "{}",
        text(&out)
    );
    assert!(fs::metadata(ws.mnt.join("secret")).is_err());

    fs::write(&p, "hide secret\n").unwrap();
    kill(m.pid(), libc::SIGHUP);
    assert!(
        eventually(Duration::from_secs(10), || status_json(&ws.mnt)
            ["policy_reload_failure"]
            .is_null()),
        "a good reload did not clear the failure"
    );
}

/// `status` of a mount whose daemon died says what to do.
#[test]
fn status_of_a_dead_mount_says_it_is_stale_and_how_to_clear_it() {
    let ws = Workspace::new();
    let m = bg_mount(&ws, &[]);
    let pid = m.pid();
    kill(pid, libc::SIGKILL);
    assert!(eventually(Duration::from_secs(10), || {
        !pidfile::is_daemon_alive(pid)
    }));
    assert!(is_mounted(&ws.mnt));
    let canon = fs::canonicalize(ws.dir.path()).unwrap().join("mnt");
    let want = format!("stale: run `layerfs umount {}`", canon.display());
    let v = status_json(&ws.mnt);
    assert_eq!(v["stale"], serde_json::json!(true), "{v}");
    assert!(v["error"].as_str().unwrap().starts_with(&want), "{v}");
    for args in [vec![ws.mnt.display().to_string()], vec![]] {
        let out = layerfs_quiet(&[vec!["status".to_string()], args].concat());
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&want),
            "{}",
            text(&out)
        );
    }
    let out = layerfs_quiet(&["umount".into(), canon.display().to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!is_mounted(&ws.mnt));
    drop(m);
}

/// A daemon started under another file name (a copied binary; `layerfs
/// run`'s own, which runs as /proc/self/exe) is found from its mountpoint
/// by the state commands and waited for by `umount`, as one started as
/// `layerfs` is: the registry tells a live daemon from a reused pid by the
/// process name, which the daemon sets itself.
#[test]
fn a_daemon_started_under_another_file_name_is_found_from_its_mountpoint() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("f"), "f\n").unwrap();
    let renamed = ws.dir.path().join("agentfs-copy");
    fs::copy(bin(), &renamed).unwrap();
    // Another test's fork can hold the copy's descriptor for a moment
    // (between its fork and exec): running the copy is then ETXTBSY.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let out = loop {
        match Command::new(&renamed).args(mount_args(&ws, &[])).output() {
            Err(e)
                if e.raw_os_error() == Some(libc::ETXTBSY)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => break r.unwrap(),
        }
    };
    let canon = fs::canonicalize(&ws.mnt).unwrap();
    let m = BgMount {
        mnt: ws.mnt.clone(),
        pid: pidfile::find_daemon(&canon, None),
    };
    assert!(out.status.success(), "mount: {}", text(&out));
    let pid = m.pid.unwrap_or_else(|| {
        panic!(
            "the registry does not find the daemon of {}",
            ws.mnt.display()
        )
    });
    fs::write(ws.mnt.join("mine"), "mine\n").unwrap();
    let st = crate::harness::layerfs(&["status", "--json", &ws.mnt.display().to_string()]);
    assert!(st.status.success(), "status: {}", text(&st));
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(v["mounted"], true, "{v}");
    assert_eq!(v["pid"], pid, "{v}");
    let d = crate::harness::layerfs(&["diff", &ws.mnt.display().to_string()]);
    assert!(d.status.success(), "diff: {}", text(&d));
    assert_eq!(String::from_utf8_lossy(&d.stdout), "A mine\n");
    let u = crate::harness::layerfs(&["umount", &ws.mnt.display().to_string()]);
    assert!(u.status.success(), "umount: {}", text(&u));
    assert!(
        !pidfile::is_daemon_alive(pid),
        "umount returned before the daemon (pid {pid}) exited"
    );
}
