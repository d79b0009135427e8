//! One upper, one mount: a daemon holds an exclusive `flock` on its upper
//! directory and on its work directory for as long as it serves, and a
//! second mount of either is refused, naming the daemon that holds it.
//!
//! Two daemons on one upper would each cache what the other changes and
//! race their copy-ups; two on one work dir would delete each other's
//! copy-ups in progress (each clears the work dir when it starts). Kernel
//! overlayfs marks an upper or work dir in use too: it refuses a second
//! mount with `EBUSY` when `index=on`, and otherwise mounts with a warning
//! that using both "will result in undefined behavior"; layerfs always
//! refuses.
//!
//! The locks sit on the directories themselves (no lock file: the upper
//! stays a plain overlay tree, and the work dir is emptied at start) and
//! belong to the daemon's open file descriptions, so the kernel drops them
//! when the daemon exits however it dies: a `kill -9` never blocks the
//! next legitimate mount. They are taken in the serving process, before
//! the work dir is cleared.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::layer::safedir::{Role, SafeDir};

/// Why the upper or work dir could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The upper is locked by another daemon (`holder` describes it,
    /// `hint` says how to unmount it).
    #[error(
        "another layerfs daemon serves this workspace: its upper dir {} is already in use by \
         {holder}; unmount it first ({hint}), or give this mount another --upper",
        upper.display()
    )]
    UpperInUse {
        upper: PathBuf,
        holder: String,
        hint: String,
    },
    #[error(
        "work dir {} is already in use by another layerfs mount ({holder}); give each mount \
         its own --work DIR, or unmount the other one first ({hint})",
        work.display()
    )]
    WorkInUse {
        work: PathBuf,
        holder: String,
        hint: String,
    },
    /// The work dir, refused by its rules.
    #[error(transparent)]
    WorkDir(#[from] crate::layer::safedir::SafeDirError),
    #[error("work dir {} does not exist", .0.display())]
    NoWorkDir(PathBuf),
    #[error("cannot open {}: {source}", dir.display())]
    Open { dir: PathBuf, source: io::Error },
    #[error("cannot lock {}: {source}", dir.display())]
    Lock { dir: PathBuf, source: io::Error },
}

/// For `tools`, which words a refusal itself.
impl From<ClaimError> for String {
    fn from(e: ClaimError) -> String {
        e.to_string()
    }
}

/// Held for as long as the daemon serves; dropping it releases the locks.
pub struct Claim {
    _work: File,
    _upper: File,
    /// For an in-process holder, its registry entry: a mount that finds
    /// the locks taken by it refuses at once (see `Holder::in_process`).
    _in_process: Option<crate::host::pidfile::PidFile>,
}

/// How long a mount waits for a daemon that holds the upper or work dir
/// but no longer serves a live mount (it is shutting down after a plain
/// `umount`, or still starting).
const DEPARTURE: Duration = Duration::from_secs(30);
/// How long it waits before saying so.
const NOTE_AFTER: Duration = Duration::from_secs(2);

/// Locks the upper, then the work dir, or says who holds them.
///
/// This is the first check a mount makes, before the control socket's:
/// it holds whichever `--state` the other mount uses, and survives a
/// `kill -9`. A locked upper means the same workspace is mounted, and the
/// message says so as the control socket's does, naming the daemon and
/// its mountpoint. A holder without a live mount is waited for (see
/// `lock_file`); what the wait has to say goes to the log.
pub fn claim(cfg: &Config) -> Result<Claim, ClaimError> {
    claim_noting(cfg, &mut |m| tracing::warn!("{m}"))
}

/// `claim`, saying through `note` that it waits for a departing daemon
/// (`layerfs mount` in the background checks first from the terminal).
pub fn claim_noting(cfg: &Config, note: &mut dyn FnMut(String)) -> Result<Claim, ClaimError> {
    claim_dirs_noting(&cfg.upper, &cfg.work, note).map_err(|b| b.message)
}

/// Why an upper or work dir could not be claimed: the reason, and the
/// live daemon holding it when that is the reason (so an in-process user
/// of the core, `tools`, can work through that daemon's mount instead).
#[derive(Debug)]
pub struct Busy {
    pub message: ClaimError,
    /// The holder's pid and mountpoint, when a live daemon holds the lock.
    pub holder: Option<(u32, Option<std::path::PathBuf>)>,
}

/// `claim` of an upper and a work dir for the in-process core of `tools`:
/// the same locks a mount's daemon takes, and a registry entry that says
/// this process holds them with no mount.
pub fn claim_dirs(upper_dir: &Path, work_dir: &Path) -> Result<Claim, Busy> {
    let mut claim = claim_dirs_noting(upper_dir, work_dir, &mut |m| tracing::warn!("{m}"))?;
    match crate::host::pidfile::PidFile::in_process(upper_dir) {
        Ok(p) => claim._in_process = Some(p),
        Err(e) => tracing::warn!(
            "cannot register this process as holding {} (a mount of it will wait {} s \
             before it is refused): {e}",
            upper_dir.display(),
            DEPARTURE.as_secs()
        ),
    }
    Ok(claim)
}

fn claim_dirs_noting(
    upper_dir: &Path,
    work_dir: &Path,
    note: &mut dyn FnMut(String),
) -> Result<Claim, Busy> {
    let plain = |message: ClaimError| Busy {
        message,
        holder: None,
    };
    let upper = lock(
        upper_dir,
        |h| ClaimError::UpperInUse {
            upper: upper_dir.to_path_buf(),
            holder: h.describe(),
            hint: h.umount_hint(),
        },
        note,
    )
    .map_err(|message| Busy {
        holder: serving_daemon(upper_dir),
        message,
    })?;
    // The work dir as `layerfs mount` checked it (`layer::safedir`).
    let work_safe = SafeDir::open(work_dir, Role::Work)
        .map_err(|e| plain(e.into()))?
        .ok_or_else(|| plain(ClaimError::NoWorkDir(work_dir.to_path_buf())))?;
    let work_file = work_safe.open_self().map_err(|source| {
        plain(ClaimError::Open {
            dir: work_dir.to_path_buf(),
            source,
        })
    })?;
    let work = lock_file(
        work_file,
        work_dir,
        |h| ClaimError::WorkInUse {
            work: work_dir.to_path_buf(),
            holder: h.describe(),
            hint: h.umount_hint(),
        },
        note,
    )
    .map_err(plain)?;
    Ok(Claim {
        _work: work,
        _upper: upper,
        _in_process: None,
    })
}

/// Takes the lock on `dir`; `busy` words the refusal when a live daemon
/// holds it.
fn lock(
    dir: &Path,
    busy: impl Fn(&Holder) -> ClaimError,
    note: &mut dyn FnMut(String),
) -> Result<File, ClaimError> {
    let f = File::open(dir).map_err(|source| ClaimError::Open {
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
fn lock_file(
    f: File,
    dir: &Path,
    busy: impl Fn(&Holder) -> ClaimError,
    note: &mut dyn FnMut(String),
) -> Result<File, ClaimError> {
    let start = Instant::now();
    let mut noted = false;
    let mut last = None;
    while start.elapsed() < DEPARTURE {
        let Err(e) = crate::sys::flock(&f, libc::LOCK_EX | libc::LOCK_NB) else {
            return Ok(f);
        };
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(ClaimError::Lock {
                dir: dir.to_path_buf(),
                source: e,
            });
        }
        let holder = f
            .metadata()
            .ok()
            .and_then(|md| holder_of(md.dev(), md.ino()));
        if let Some(h) = &holder {
            if !h.exiting && h.serves_a_live_mount() {
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

struct Holder {
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
}

impl Holder {
    /// "pid N, mounted at M" (or its command line while it has no pid file).
    fn describe(&self) -> String {
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

    fn umount_hint(&self) -> String {
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
    let in_process = registration == Registration::InProcess;
    Some(Holder {
        pid,
        cmdline: cmd,
        unregistered: registration == Registration::Unregistered,
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

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_and_freed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let busy = |h: &Holder| ClaimError::UpperInUse {
            upper: dir.path().to_path_buf(),
            holder: h.describe(),
            hint: h.umount_hint(),
        };
        let note = &mut |m: String| panic!("a live holder is not waited for: {m}");
        let first = lock(dir.path(), busy, note).unwrap();
        let err = lock(dir.path(), busy, note).unwrap_err().to_string();
        assert!(err.contains("already in use"), "{err}");
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(first);
        lock(dir.path(), busy, note).unwrap();
    }
}
