//! Who holds a workspace's directory: the exclusive `flock` a daemon (or
//! an in-process user of the core) takes on an upper or work dir, taken
//! here, and its holder named from the kernel's lock table and the pid
//! files (`pidfile`) when it cannot be taken.
//!
//! A lock's holder is told apart by what the registry says of it: a
//! daemon serving a live mount, or a process holding the dir in process,
//! is refused at once; one starting or stopping (no registry entry yet or
//! any more, or exiting) is waited for; one the registry knows nothing of
//! is taken for live after a moment (`PRESUMED`), since a lock can outlive
//! its holder's letting go for as long as a child the holder forked has
//! not executed yet.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why a dir's lock could not be taken, other than its holder (which the
/// caller words: `lock`'s `busy`).
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("cannot open {}: {source}", dir.display())]
    Open { dir: PathBuf, source: io::Error },
    #[error("cannot lock {}: {source}", dir.display())]
    Lock { dir: PathBuf, source: io::Error },
}

/// How long a mount waits for a daemon that holds the upper or work dir
/// but no longer serves a live mount (it is shutting down after a plain
/// `umount`, or still starting).
pub const DEPARTURE: Duration = Duration::from_secs(30);
/// How long it waits before saying so.
const NOTE_AFTER: Duration = Duration::from_secs(2);
/// How long a holder it knows nothing of may hold the lock before it is
/// taken for a live daemon. A process that forks shares its locks'
/// open file descriptions with the child until the child executes, so a
/// lock just let go of can stay taken for a moment, by a process that
/// serves nothing (a library user of the core spawning a command, or the
/// test suite).
const PRESUMED: Duration = Duration::from_secs(1);

/// Takes the lock on `dir`; `busy` words the refusal when a live daemon
/// holds it.
pub fn lock<E: From<LockError>>(
    dir: &Path,
    busy: impl Fn(&Holder) -> E,
    note: &mut dyn FnMut(String),
) -> Result<File, E> {
    let f = File::open(dir).map_err(|source| LockError::Open {
        dir: dir.to_path_buf(),
        source,
    })?;
    lock_file(f, dir, busy, note)
}

/// Takes the lock on the open directory `f` (`dir` names it).
///
/// A holder whose mount is live is refused at once. Any other holder is
/// on its way out or in: killed a moment ago, exiting, or unmounted by a
/// plain `umount` (which removes the mount before the daemon has flushed
/// its journal and let go: `umount MNT && layerfs mount … MNT` is what
/// scripts, fstab users and `systemctl restart` do), or registered and
/// about to mount. It is waited for, up to `DEPARTURE`, with a `note`
/// after `NOTE_AFTER`; one that mounts meanwhile is refused then.
pub fn lock_file<E: From<LockError>>(
    f: File,
    dir: &Path,
    busy: impl Fn(&Holder) -> E,
    note: &mut dyn FnMut(String),
) -> Result<File, E> {
    let start = Instant::now();
    let mut noted = false;
    let mut last = None;
    while start.elapsed() < DEPARTURE {
        let Err(e) = crate::sys::flock(&f, libc::LOCK_EX | libc::LOCK_NB) else {
            return Ok(f);
        };
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(LockError::Lock {
                dir: dir.to_path_buf(),
                source: e,
            }
            .into());
        }
        let holder = f
            .metadata()
            .ok()
            .and_then(|md| holder_of(md.dev(), md.ino()));
        if let Some(h) = &holder {
            if !h.exiting && h.serves_a_live_mount() && (!h.presumed || start.elapsed() >= PRESUMED)
            {
                return Err(busy(h));
            }
            if !noted && start.elapsed() >= NOTE_AFTER {
                noted = true;
                note(format!(
                    "{} is still held by {}, whose mount is gone; waiting up to {} s for it \
                     to finish",
                    dir.display(),
                    h.describe(),
                    DEPARTURE.as_secs()
                ));
            }
        }
        last = holder.or(last);
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(busy(&last.unwrap_or(Holder {
        pid: 0,
        cmdline: String::new(),
        mountpoint: None,
        unregistered: true,
        exiting: true,
        in_process: false,
        presumed: false,
    })))
}

/// The live daemon that holds `dir` (an upper or a work dir) and the
/// mountpoint it registered: `Some((pid, None))` while it has no registry
/// entry this caller can read (it is starting, or belongs to another
/// user). `None` when nobody holds it or the holder is exiting.
pub fn serving_daemon(dir: &Path) -> Option<(u32, Option<std::path::PathBuf>)> {
    let md = std::fs::metadata(dir).ok()?;
    let h = holder_of(md.dev(), md.ino())?;
    (!h.exiting).then_some((h.pid, h.mountpoint))
}

pub struct Holder {
    pid: u32,
    cmdline: String,
    /// Where it serves, from its pid file (absent for a moment while it
    /// starts or stops, and for another user's daemon).
    mountpoint: Option<std::path::PathBuf>,
    /// Its user's registry was read and does not name it: it is starting
    /// (the lock comes before the pid file) or stopping (the pid file goes
    /// before the lock).
    unregistered: bool,
    /// The process is exiting (a zombie, or `PF_EXITING`): its locks are
    /// about to go.
    exiting: bool,
    /// It holds the workspace in process (the agent tools' core), with no
    /// mount: never on its way out by itself, so never waited for.
    in_process: bool,
    /// Its registry could not be read (another user's process, or one
    /// that is no layerfs daemon): taken for live, once it has held the
    /// lock for `PRESUMED`.
    presumed: bool,
}

impl Holder {
    /// "pid N, mounted at M" (or its command line while it has no pid file).
    pub fn describe(&self) -> String {
        match (&self.mountpoint, self.pid) {
            (_, 0) => format!(
                "a daemon that did not let go within {} s",
                DEPARTURE.as_secs()
            ),
            (Some(m), p) => format!("pid {p}, mounted at {}", m.display()),
            (None, p) => format!("pid {p}: {}", self.cmdline),
        }
    }

    /// Whether the mountpoint it registered is mounted (layerfs) now. A
    /// holder whose registry this caller cannot read counts as live: it
    /// may be another user's daemon, and waiting would only delay the
    /// refusal.
    fn serves_a_live_mount(&self) -> bool {
        if self.in_process {
            return true;
        }
        match &self.mountpoint {
            Some(m) => crate::host::mounts::find(m).is_some_and(|e| e.is_layerfs()),
            None => !self.unregistered,
        }
    }

    pub fn umount_hint(&self) -> String {
        match &self.mountpoint {
            Some(m) => format!("layerfs umount {}", m.display()),
            None if self.pid != 0 => format!("layerfs umount MOUNTPOINT, or kill {}", self.pid),
            None => "layerfs umount MOUNTPOINT".into(),
        }
    }
}

/// The pid and command line of the process holding a `flock` on the
/// file (`dev`, `ino`), from /proc/locks.
fn holder_of(dev: u64, ino: u64) -> Option<Holder> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let want = format!(
        "{:02x}:{:02x}:{ino}",
        libc::major(dev as libc::dev_t),
        libc::minor(dev as libc::dev_t)
    );
    let pid = locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // "1: FLOCK  ADVISORY  WRITE 1234 fd:00:5678 0 EOF"
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()))
            .then(|| f.get(4)?.parse::<u32>().ok())
            .flatten()
    })?;
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            c.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    use crate::host::pidfile::{registration_of_pid, Registration};
    let registration = registration_of_pid(pid);
    // An in-process holder counts as holding this dir only when one of
    // its claims names it: the lock may also be held for a moment by a
    // child it forked for something else (the child shares the lock's
    // open file description until it executes), after the claim that
    // took it is gone.
    let in_process = match &registration {
        Registration::InProcess { held } => held
            .iter()
            .any(|p| std::fs::metadata(p).is_ok_and(|md| md.dev() == dev && md.ino() == ino)),
        _ => false,
    };
    Some(Holder {
        pid,
        cmdline: cmd,
        // An in-process holder with no claim on this dir is passing
        // through, as a daemon not yet (or no longer) registered is.
        unregistered: registration == Registration::Unregistered
            || matches!(registration, Registration::InProcess { .. }) && !in_process,
        presumed: registration == Registration::Unknown,
        mountpoint: match registration {
            Registration::Serving { mountpoint, .. } => Some(mountpoint),
            _ => None,
        },
        exiting: exiting(pid),
        in_process,
    })
}

/// Whether process `pid` is gone, a zombie, or exiting (`PF_EXITING` in
/// the flags field of /proc/PID/stat).
fn exiting(pid: u32) -> bool {
    const PF_EXITING: u64 = 0x4;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // Fields after the command name, which is in parentheses: state is
    // field 3, flags field 9.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return false;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let state = f.first().copied().unwrap_or("");
    let flags = f.get(6).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    matches!(state, "Z" | "X") || flags & PF_EXITING != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusal the tests word (`busy`), or the lock's own error.
    #[derive(Debug)]
    struct Refused(String);

    impl From<LockError> for Refused {
        fn from(e: LockError) -> Refused {
            Refused(e.to_string())
        }
    }

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_and_freed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let busy = |h: &Holder| Refused(format!("already in use by {}", h.describe()));
        let note = &mut |m: String| panic!("a live holder is not waited for: {m}");
        let first = lock(dir.path(), busy, note).unwrap();
        let Refused(err) = lock(dir.path(), busy, note).unwrap_err();
        assert!(err.contains("already in use"), "{err}");
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(first);
        lock(dir.path(), busy, note).unwrap();
    }

    /// A lock still taken a moment after its holder let go (a forked child
    /// shares it until it executes) is waited for, not refused, even while
    /// this process holds another workspace in process.
    #[test]
    fn a_lock_held_for_a_moment_by_a_process_holding_another_workspace_is_waited_for() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let (upper, work) = (a.path().join("upper"), a.path().join("work"));
        std::fs::create_dir(&upper).unwrap();
        std::fs::create_dir(&work).unwrap();
        let note = &mut |m: String| panic!("no note expected: {m}");
        let name = |h: &Holder| Refused(h.describe());
        let _other = (
            lock(&upper, name, note).unwrap(),
            lock(&work, name, note).unwrap(),
            crate::host::pidfile::PidFile::in_process(&upper, &work),
        );
        // The moment: the lock on `b` is this process's, under no claim,
        // and let go of 300 ms later.
        let passing = File::open(b.path()).unwrap();
        crate::sys::flock(&passing, libc::LOCK_EX | libc::LOCK_NB).unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(passing);
        });
        let busy = |h: &Holder| Refused(format!("already in use by {}", h.describe()));
        let start = Instant::now();
        let r = lock(b.path(), busy, &mut |m| panic!("no note expected: {m}"));
        release.join().unwrap();
        assert!(r.is_ok(), "{:?}", r.err());
        assert!(start.elapsed() >= Duration::from_millis(250));
    }
}
