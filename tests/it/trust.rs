//! The directories layerfs keeps beside the upper (state, work, snapshots,
//! `layerfs run`'s mountpoint) when another user can write the upper's
//! parent: planted symlinks, directories of another owner or writable by
//! others are refused with a message naming the path, the problem and the
//! fix, and nothing is ever followed. As root (another user `tests`
//! attacking) and as `tests` (`nobody` attacking), in a shared sticky
//! directory as /tmp is.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::daemon::{BgMount, DevFuseOpen, DEV_FUSE, NOBODY};
use crate::harness::{bin, is_mounted, Workspace};

/// A user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Who {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

pub(crate) const ROOT: Who = Who { uid: 0, gid: 0 };
const NOBODY_USER: Who = Who {
    uid: NOBODY,
    gid: NOBODY,
};

pub(crate) fn tests_user() -> Who {
    let (uid, gid) = crate::run::tests_ids();
    Who { uid, gid }
}

/// Runs `program args` as `who` (through setpriv unless root).
pub(crate) fn as_who(who: Who, program: &Path, args: &[&str]) -> Output {
    let mut cmd = if who == ROOT {
        Command::new(program)
    } else {
        let mut c = Command::new("setpriv");
        c.args([
            format!("--reuid={}", who.uid),
            format!("--regid={}", who.gid),
            "--clear-groups".into(),
            "--".into(),
        ])
        .arg(program);
        c
    };
    cmd.args(args)
        .env("RUST_LOG", "warn")
        .env_remove("TMPDIR")
        .current_dir("/")
        .stdin(Stdio::null());
    with_deadline(cmd, Duration::from_secs(60))
}

/// Runs `cmd`, killing it (and failing) after `limit`.
fn with_deadline(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a command");
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("command did not end within {limit:?}: {}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

pub(crate) fn sh_as(who: Who, script: &str) -> Output {
    as_who(who, Path::new("/bin/sh"), &["-c", script])
}

pub(crate) fn layerfs_as(who: Who, args: &[&str]) -> Output {
    as_who(who, &bin(), args)
}

pub(crate) fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// /dev/fuse opened to everyone (as distributions ship it) for an
/// unprivileged caller, serialized with the other tests that do.
pub(crate) struct FuseFor {
    _dev: Option<DevFuseOpen>,
    _serial: Option<std::sync::MutexGuard<'static, ()>>,
}

impl FuseFor {
    pub(crate) fn new(who: Who) -> FuseFor {
        if who == ROOT {
            return FuseFor {
                _dev: None,
                _serial: None,
            };
        }
        let serial = DEV_FUSE.lock().unwrap_or_else(|e| e.into_inner());
        FuseFor {
            _dev: Some(DevFuseOpen::new()),
            _serial: Some(serial),
        }
    }
}

/// A workspace whose upper `x` sits in `shared`, a sticky directory
/// everyone may write (as /tmp), beside names another user can plant.
pub(crate) struct Shared {
    pub(crate) ws: Workspace,
    pub(crate) shared: PathBuf,
    pub(crate) upper: PathBuf,
    pub(crate) caller: Who,
}

impl Shared {
    pub(crate) fn new(caller: Who) -> Shared {
        // Under /var/tmp: `layerfs run`'s sandbox has a private /tmp.
        let ws = Workspace::with_lowers_in(1, Path::new("/var/tmp"));
        fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let shared = ws.dir.path().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
        let upper = shared.join("x");
        fs::create_dir(&upper).unwrap();
        for p in [&upper, &ws.mnt] {
            std::os::unix::fs::chown(p, Some(caller.uid), Some(caller.gid)).unwrap();
        }
        fs::write(ws.lower().join("shared.txt"), "from the lower\n").unwrap();
        Shared {
            ws,
            shared,
            upper,
            caller,
        }
    }

    pub(crate) fn state(&self) -> PathBuf {
        self.shared.join(".x.layerfs-state")
    }

    fn work(&self) -> PathBuf {
        self.shared.join(".x.layerfs-work")
    }

    /// `layerfs mount` (in the background, default state and work dirs)
    /// as the caller; the guard unmounts whatever it mounted.
    fn mount(&self) -> (Output, BgMount) {
        let out = layerfs_as(
            self.caller,
            &[
                "mount",
                "--lower",
                s(self.ws.lower()),
                "--upper",
                s(&self.upper),
                s(&self.ws.mnt),
            ],
        );
        let guard = BgMount {
            mnt: self.ws.mnt.clone(),
            pid: layerfs::host::pidfile::find_daemon(&self.ws.mnt, Some(self.caller.uid)),
        };
        (out, guard)
    }
}

/// The names in `dir`.
pub(crate) fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn attacker_of(caller: Who) -> Who {
    if caller == ROOT {
        tests_user()
    } else {
        NOBODY_USER
    }
}

fn planted_dirs_are_refused_and_never_followed(caller: Who) {
    let sh = Shared::new(caller);
    let attacker = attacker_of(caller);
    let _fuse = FuseFor::new(caller);
    // Where planted links point: a directory of the attacker's.
    let decoy = sh.shared.join("decoy");
    let out = sh_as(attacker, &format!("mkdir -m 0777 {}", s(&decoy)));
    assert!(out.status.success(), "{}", text(&out));
    let state = sh.state();
    let work = sh.work();
    let cases: Vec<(String, String, &[&str])> = vec![
        (
            format!("ln -s {} {}", s(&decoy), s(&state)),
            s(&state).to_string(),
            &["is a symbolic link", "rm -r", "--state DIR"],
        ),
        (
            format!("mkdir -m 0777 {}", s(&state)),
            s(&state).to_string(),
            &["belongs to", "uid"],
        ),
        (
            format!("ln -s {} {}", s(&decoy), s(&work)),
            s(&work).to_string(),
            &["is a symbolic link", "--work DIR"],
        ),
        (
            format!("mkdir -m 0700 {}", s(&work)),
            s(&work).to_string(),
            &["belongs to"],
        ),
    ];
    for (plant, path, words) in &cases {
        let out = sh_as(attacker, plant);
        assert!(out.status.success(), "{plant}: {}", text(&out));
        let (out, guard) = sh.mount();
        let err = stderr(&out);
        assert!(
            !out.status.success() && !is_mounted(&sh.ws.mnt),
            "{plant}: the mount went ahead: {}",
            text(&out)
        );
        assert!(err.contains(path.as_str()), "{plant}: {err}");
        for w in *words {
            assert!(err.contains(w), "{plant}: no `{w}` in: {err}");
        }
        drop(guard);
        assert!(
            names(&decoy).is_empty(),
            "{plant}: something was made through the planted name: {:?}",
            names(&decoy)
        );
        // What layerfs made of its own is gone again or private.
        fs::remove_file(path)
            .or_else(|_| fs::remove_dir_all(path))
            .unwrap();
        for own in [&state, &work] {
            if let Ok(m) = fs::symlink_metadata(own) {
                assert!(m.is_dir() && m.uid() == caller.uid && m.mode() & 0o022 == 0);
            }
        }
    }
    // The caller's own state dir, opened up to others: refused too, with
    // the chmod that fixes it.
    let _ = fs::remove_dir_all(&state);
    fs::create_dir(&state).unwrap();
    std::os::unix::fs::chown(&state, Some(caller.uid), Some(caller.gid)).unwrap();
    fs::set_permissions(&state, fs::Permissions::from_mode(0o777)).unwrap();
    let (out, guard) = sh.mount();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        stderr(&out).contains("writable by group and others")
            && stderr(&out).contains(&format!("chmod go-w {}", s(&state))),
        "{}",
        text(&out)
    );
    drop(guard);
    // Fixed as the message says, the mount goes ahead.
    fs::set_permissions(&state, fs::Permissions::from_mode(0o700)).unwrap();
    let (out, guard) = sh.mount();
    assert!(out.status.success(), "{}", text(&out));
    assert!(is_mounted(&sh.ws.mnt));
    // Root may still ask a user's daemon how it is (reading the user's
    // state dir, never writing through it).
    let out = layerfs_as(ROOT, &["status", "--json", s(&sh.ws.mnt)]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mounted"], serde_json::json!(true), "{v}");
    let out = layerfs_as(ROOT, &["status", "--json"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("\"upper\":\"{}\"", s(&sh.upper))),
        "{}",
        text(&out)
    );
    drop(guard);
}

#[test]
fn as_root_planted_state_and_work_dirs_are_refused_and_never_followed() {
    planted_dirs_are_refused_and_never_followed(ROOT);
}

#[test]
fn as_a_user_planted_state_and_work_dirs_are_refused_and_never_followed() {
    planted_dirs_are_refused_and_never_followed(tests_user());
}

/// A tar whose root is `./` with a setuid-root copy of `sh` in it, as an
/// attacker would swap in for a saved snapshot.
pub(crate) fn setuid_shell_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_path("./").unwrap();
    h.set_mode(0o755);
    h.set_size(0);
    h.set_cksum();
    b.append(&h, &b""[..]).unwrap();
    let sh = fs::read("/bin/sh").unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_path("rootshell").unwrap();
    h.set_mode(0o4755);
    h.set_uid(0);
    h.set_gid(0);
    h.set_size(sh.len() as u64);
    h.set_cksum();
    b.append(&h, &sh[..]).unwrap();
    b.into_inner().unwrap()
}

fn save_swap_restore_is_refused(caller: Who) {
    let sh = Shared::new(caller);
    let attacker = attacker_of(caller);
    let _fuse = FuseFor::new(caller);
    let state = sh.state();
    // Before the workspace is first mounted, the attacker makes its state
    // dir and snapshots/ world-writable, with a description that sends
    // the state commands there.
    let desc = serde_json::json!({
        "upper": sh.upper, "lowers": [sh.ws.lower()], "work": sh.shared.join(".x.layerfs-work"),
        "mountpoint": null, "policy": null, "scratch": [],
    });
    let out = sh_as(
        attacker,
        &format!(
            "mkdir -m 0777 {st} {st}/snapshots && printf '%s' '{desc}' > {st}/workspace.json \
             && chmod 0666 {st}/workspace.json",
            st = s(&state)
        ),
    );
    assert!(out.status.success(), "{}", text(&out));
    let (out, guard) = sh.mount();
    assert!(!out.status.success(), "mounted with a planted state dir");
    assert!(stderr(&out).contains(s(&state)) && stderr(&out).contains("belongs to"));
    drop(guard);
    fs::write(sh.upper.join("mine.txt"), "mine\n").unwrap();
    let upper = s(&sh.upper);
    // Refused as another user's, or (root may read a user's state) as
    // writable by others.
    let refused = |o: &Output| {
        let e = stderr(o);
        e.contains(s(&state)) && (e.contains("belongs to") || e.contains("writable by"))
    };
    let out = layerfs_as(caller, &["snapshot", "save", upper, "base"]);
    assert!(
        !out.status.success(),
        "saved into a planted dir: {}",
        text(&out)
    );
    assert!(refused(&out), "{}", text(&out));
    // The swap: a setuid-root shell where the snapshot was to be.
    let evil = sh.ws.dir.path().join("evil.tar");
    fs::write(&evil, setuid_shell_tar()).unwrap();
    fs::set_permissions(&evil, fs::Permissions::from_mode(0o644)).unwrap();
    let out = sh_as(
        attacker,
        &format!("cp {} {}/snapshots/base.tar", s(&evil), s(&state)),
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = layerfs_as(caller, &["snapshot", "restore", upper, "base"]);
    assert!(
        !out.status.success(),
        "restored from a planted dir: {}",
        text(&out)
    );
    assert!(refused(&out), "{}", text(&out));
    assert_eq!(names(&sh.upper), ["mine.txt"]);
    assert!(!sh.upper.join("rootshell").exists());
}

#[test]
fn as_root_a_snapshot_swapped_between_save_and_restore_is_refused() {
    save_swap_restore_is_refused(ROOT);
}

#[test]
fn as_a_user_a_snapshot_swapped_between_save_and_restore_is_refused() {
    save_swap_restore_is_refused(tests_user());
}

/// Whether `p` is any mountpoint right now.
fn is_any_mount(p: &Path) -> bool {
    let want = p.to_string_lossy().into_owned();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

fn planted_run_mountpoint_is_refused(caller: Who) {
    let sh = Shared::new(caller);
    let attacker = attacker_of(caller);
    let _fuse = FuseFor::new(caller);
    let mnt = sh.shared.join(".x.layerfs-mnt");
    // A directory of the attacker's choosing, with something to hide.
    let decoy = sh.shared.join("decoy");
    let out = sh_as(
        attacker,
        &format!(
            "mkdir -m 0777 {d} && echo canary > {d}/canary && ln -s {d} {m}",
            d = s(&decoy),
            m = s(&mnt)
        ),
    );
    assert!(out.status.success(), "{}", text(&out));
    let run = |upper: &Path| {
        layerfs_as(
            caller,
            &[
                "run",
                "--lower",
                s(sh.ws.lower()),
                "--upper",
                s(upper),
                "--",
                "sh",
                "-c",
                "echo ran; cat shared.txt",
            ],
        )
    };
    // Watch for a mount on the decoy while the run goes on.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (stop, decoy) = (stop.clone(), decoy.clone());
        std::thread::spawn(move || {
            let mut seen = false;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                seen |= is_any_mount(&decoy);
                std::thread::sleep(Duration::from_millis(2));
            }
            seen
        })
    };
    let out = run(&sh.upper);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mounted_on_decoy = watcher.join().unwrap();
    assert!(
        !mounted_on_decoy,
        "the workspace was mounted over the planted link's target: {}",
        text(&out)
    );
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    let err = stderr(&out);
    assert!(
        err.contains(s(&mnt)) && err.contains("is a symbolic link"),
        "{}",
        text(&out)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"));
    assert!(!is_any_mount(&decoy) && !is_any_mount(&mnt));
    assert_eq!(names(&decoy), ["canary"]);
    // Removing the link, as the message says, lets the run go ahead.
    fs::remove_file(&mnt).unwrap();
    let out = run(&sh.upper);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ran\nfrom the lower"));
    assert!(!is_any_mount(&mnt));

    // Beside an upper whose parent others may write without the sticky
    // bit, anyone could swap the mountpoint between the check and the
    // mount: refused before anything is made there.
    let open = sh.ws.dir.path().join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let upper2 = open.join("y");
    fs::create_dir(&upper2).unwrap();
    std::os::unix::fs::chown(&upper2, Some(caller.uid), Some(caller.gid)).unwrap();
    let out = run(&upper2);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        stderr(&out).contains("without the sticky bit")
            && stderr(&out).contains(&format!("chmod +t {}", s(&open))),
        "{}",
        text(&out)
    );
    assert!(!open.join(".y.layerfs-mnt").exists());
}

#[test]
fn as_root_a_planted_run_mountpoint_is_refused() {
    planted_run_mountpoint_is_refused(ROOT);
}

#[test]
fn as_a_user_a_planted_run_mountpoint_is_refused() {
    planted_run_mountpoint_is_refused(tests_user());
}
