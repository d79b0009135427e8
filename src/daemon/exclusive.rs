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
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::host::holder::{lock, lock_file, serving_daemon, LockError, DEPARTURE};
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
    /// The dir could not be opened or locked.
    #[error(transparent)]
    Lock(#[from] LockError),
}

/// Held for as long as the daemon serves; dropping it releases the locks.
pub struct Claim {
    _work: File,
    _upper: File,
    /// For an in-process holder, its registry entry: a mount that finds
    /// the locks taken by it refuses at once (`host::holder`).
    _in_process: Option<crate::host::pidfile::PidFile>,
}

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
    match crate::host::pidfile::PidFile::in_process(upper_dir, work_dir) {
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
        plain(
            LockError::Open {
                dir: work_dir.to_path_buf(),
                source,
            }
            .into(),
        )
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
