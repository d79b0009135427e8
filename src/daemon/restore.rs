//! The control socket's `restore` command: the daemon's half of `layerfs
//! snapshot restore` on a live mount.
//!
//! The client extracts the snapshot into a staging directory in the work
//! dir (the long part; the mount serves reads and writes meanwhile) and
//! names it in `{"cmd":"restore","staging":NAME}`. The daemon then, with
//! writes paused:
//! 1. waits (a bounded time) for the mount owner's files open for writing
//!    through the mount to be closed, and refuses, naming them and the uid
//!    holding each, if some stay open: what they would write after the
//!    restore would land in the discarded tree. Another user's files open
//!    for writing do not hold the restore up (the owner's restore must not
//!    be another user's to block): like files deleted while open, they
//!    write on into the old tree, which is discarded;
//! 2. checks the upper's path still names the upper it serves;
//! 3. exchanges the staging dir with the upper in one
//!    `renameat2(RENAME_EXCHANGE)` and syncs both parents: the upper is
//!    the old tree or the restored one, never a mix, also after a crash;
//! 4. makes the restored tree its upper root and re-resolves every inode
//!    the kernel holds against it (an inode whose path is gone is emptied,
//!    as a file deleted while open).
//!
//! Then, writes resumed, it drops everything the kernel caches: every held
//! object's name, attributes, pages and listing, and every name of every
//! held directory in the old and the new tree (the kernel may cache a name
//! as absent). The old tree is left in the staging dir for the client to
//! remove (a crash leaves it in the work dir, which `mount` cleans).
//!
//! Files open for reading keep reading the objects they opened (the old
//! tree's files stay alive while open, as deleted files do); every new
//! lookup and open sees the restored tree.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::served::{invalidate_bounded, Daemon};
use crate::layer::sys;
use crate::overlay::inode::{Inode, Real};
use crate::state::protocol::{Invalidated, Restored};

use crate::state::snapshot::STAGING_PREFIX;
/// How long the restore waits for write opens to close.
const DRAIN: Duration = Duration::from_secs(5);

/// Why a live restore (or the quiescing a live checkpoint, undo or
/// squash shares with it) was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(
        "the workspace is mounted read-only: a restore changes its upper; unmount it \
         (layerfs umount) and restore it unmounted"
    )]
    ReadOnly,
    #[error("restore: {0:?} is not a staging dir name ({STAGING_PREFIX}*)")]
    NotStagingName(OsString),
    #[error("cannot open staging dir {}: {source}", path.display())]
    OpenStaging {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot stat the staging dir: {0}")]
    StatStaging(#[source] std::io::Error),
    #[error(
        "staging dir {} is not a directory on the upper's filesystem",
        .0.display()
    )]
    StagingNotOnUpper(PathBuf),
    #[error("upper dir {} has no name", .0.display())]
    UpperWithoutName(PathBuf),
    #[error("upper dir {} has no parent", .0.display())]
    UpperWithoutParent(PathBuf),
    /// Opening the upper's parent directory.
    #[error("cannot open {}: {source}", path.display())]
    OpenParent {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot exchange staging dir {} with upper dir {}: {source}",
        staging.display(),
        upper.display()
    )]
    Exchange {
        staging: PathBuf,
        upper: PathBuf,
        source: std::io::Error,
    },
    /// Serving the exchanged tree failed (`why`, the core's message); the
    /// exchange was undone.
    #[error("{why}; the upper is unchanged")]
    NotServed { why: String },
    /// Serving the exchanged tree failed, and undoing the exchange too:
    /// the old upper is left at `staging`.
    #[error(
        "{why}; and the old upper cannot be put back ({source}): it is {}; unmount, move it \
         back to {} by hand and mount again",
        staging.display(),
        upper.display()
    )]
    NotPutBack {
        why: String,
        staging: PathBuf,
        upper: PathBuf,
        source: std::io::Error,
    },
    /// Files open for writing through the mount: each path (relative to
    /// the mount) with the uid holding it.
    #[error("{}", open_for_writing(.0))]
    OpenForWriting(Vec<(String, u32)>),
    #[error("cannot stat the upper dir being served: {0}")]
    StatServed(#[source] std::io::Error),
    #[error("cannot stat {}: {source}", upper.display())]
    StatUpper {
        upper: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} is no longer the upper dir this mount serves (it was moved or replaced behind the \
         mount); unmount and mount again, then retry",
        .0.display()
    )]
    UpperReplaced(PathBuf),
}

/// The upper's parent directory, opened, with the upper's name in it.
pub(super) fn open_upper_parent(
    upper: &Path,
) -> Result<(std::os::fd::OwnedFd, &Path, &OsStr), RestoreError> {
    let name = upper
        .file_name()
        .ok_or_else(|| RestoreError::UpperWithoutName(upper.to_path_buf()))?;
    let parent_path = upper
        .parent()
        .ok_or_else(|| RestoreError::UpperWithoutParent(upper.to_path_buf()))?;
    let parent = sys::open_root(parent_path).map_err(|source| RestoreError::OpenParent {
        path: parent_path.to_path_buf(),
        source,
    })?;
    Ok((parent, parent_path, name))
}

/// `Request::Restore` of the staging dir `name`: see the module comment.
pub fn serve(daemon: &Daemon, name: &str) -> Result<Restored, RestoreError> {
    let ov = daemon.fs.overlay();
    if ov.read_only() {
        return Err(RestoreError::ReadOnly);
    }
    let name = OsStr::new(name);
    if !name.as_bytes().starts_with(STAGING_PREFIX.as_bytes()) || name.as_bytes().contains(&b'/') {
        return Err(RestoreError::NotStagingName(name.to_os_string()));
    }
    let work = &ov.upper().work;
    let staging = daemon.work.join(name);
    let staged = match sys::open_path(work, name) {
        Ok(fd) => fd,
        Err(source) => {
            return Err(RestoreError::OpenStaging {
                path: staging,
                source,
            })
        }
    };
    let st = sys::fstat(&staged).map_err(RestoreError::StatStaging)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR || st.st_dev != ov.upper().layer.dev {
        return Err(RestoreError::StagingNotOnUpper(staging));
    }
    let (parent, parent_path, upper_name) = open_upper_parent(&daemon.upper)?;

    let pause = quiesce(daemon, &parent, upper_name, false)?;
    // What the held directories stood on before: their old names may be
    // cached by the kernel (as present or as absent).
    let dirs_before = held_dirs(ov);
    if let Err(source) = sys::renameat2(work, name, &parent, upper_name, sys::RENAME_EXCHANGE) {
        return Err(RestoreError::Exchange {
            staging,
            upper: daemon.upper.clone(),
            source,
        });
    }
    if let Err(e) = ov.replace_upper_root(staged) {
        // Put the old upper back: it is still the served one.
        let back = sys::renameat2(work, name, &parent, upper_name, sys::RENAME_EXCHANGE);
        let why = e.to_string();
        return Err(match back {
            Ok(()) => RestoreError::NotServed { why },
            Err(source) => RestoreError::NotPutBack {
                why,
                staging,
                upper: daemon.upper.clone(),
                source,
            },
        });
    }
    ov.refresh_paths(&[OsString::new()]);
    for (d, what) in [(&parent, parent_path), (work, daemon.work.as_path())] {
        if let Err(e) = sys::open_dir(d).and_then(|fd| std::fs::File::from(fd).sync_all()) {
            tracing::warn!("restore: cannot sync {}: {e}", what.display());
        }
    }
    drop(pause);
    tracing::info!("upper replaced by a restored snapshot");

    Ok(Restored {
        restored: true,
        invalidated: invalidate_swapped(daemon, &dirs_before),
    })
}

/// Pauses writes and waits (up to `DRAIN`) for files open for writing
/// through the mount to close: the mount owner's only when `all_users` is
/// false (see the module comment), everyone's when it is true (a
/// checkpoint: what they wrote after it would land in a frozen layer).
/// Refuses, naming them, if some stay open; then checks that the upper's
/// path (`upper_name` in `parent`) still names the upper served.
pub(super) fn quiesce<'a>(
    daemon: &'a Daemon,
    parent: &impl std::os::fd::AsFd,
    upper_name: &OsStr,
    all_users: bool,
) -> Result<crate::overlay::gate::PauseGuard<'a>, RestoreError> {
    let ov = daemon.fs.overlay();
    let (pause, busy) = daemon.fs.pause_writes(DRAIN);
    if !busy.is_empty() {
        return Err(RestoreError::OpenForWriting(busy));
    }
    // Opens for writing wait at the gate now; wait for those already
    // open to close.
    let deadline = Instant::now() + DRAIN;
    loop {
        let writers: Vec<(String, u32)> = ov
            .files()
            .writers()
            .into_iter()
            .filter(|(_, uid)| all_users || ov.files().shares.is_owner(*uid))
            .map(|(i, uid)| (ov.path_of(&i), uid))
            .collect();
        if writers.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            return Err(RestoreError::OpenForWriting(writers));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let served = ov
        .upper_root()
        .and_then(|r| sys::fstat(r.as_ref()))
        .map_err(RestoreError::StatServed)?;
    let at_path = sys::fstatat(parent, upper_name).map_err(|source| RestoreError::StatUpper {
        upper: daemon.upper.clone(),
        source,
    })?;
    if (served.st_dev, served.st_ino) != (at_path.st_dev, at_path.st_ino) {
        return Err(RestoreError::UpperReplaced(daemon.upper.clone()));
    }
    Ok(pause)
}

/// The held directories and what they stood on: their old names may be
/// cached by the kernel (as present or as absent).
pub(super) fn held_dirs(ov: &crate::overlay::Overlay) -> Vec<(Arc<Inode>, Real)> {
    ov.inodes()
        .all()
        .into_iter()
        .filter(|i| i.is_dir())
        .map(|i| {
            let r = i.real.read().clone();
            (i, r)
        })
        .collect()
}

/// After the layers under the held directories were replaced (writes
/// resumed): drops every name each held directory has in the old or the
/// new tree, in any layer (whatever the kernel may cache about one of
/// them), and every held object's attributes, pages and listing.
pub(super) fn invalidate_swapped(
    daemon: &Daemon,
    dirs_before: &[(Arc<Inode>, Real)],
) -> Invalidated {
    let mut names: Vec<(u64, OsString)> = Vec::new();
    for (dir, old) in dirs_before {
        let new = dir.real.read().clone();
        let mut seen: std::collections::HashSet<OsString> = Default::default();
        let fds = [old, &new].into_iter().flat_map(|r| {
            r.upper
                .iter()
                .cloned()
                .chain(r.lowers.iter().map(|(_, l)| l.clone()))
                .collect::<Vec<_>>()
        });
        for real in fds {
            let Ok(fd) = real.get() else { continue };
            let Ok(entries) = sys::read_dir(fd.as_ref()) else {
                continue;
            };
            for e in entries {
                if seen.insert(e.name.clone()) {
                    names.push((dir.id, e.name));
                }
            }
        }
    }
    let fs = daemon.fs.clone();
    invalidate_bounded(move || fs.invalidate_restored(&names))
}

fn open_for_writing(paths: &[(String, u32)]) -> String {
    let shown: Vec<String> = paths
        .iter()
        .map(|(p, uid)| {
            let p = if p.is_empty() { "." } else { p };
            format!("{p} (uid {uid})")
        })
        .collect();
    format!(
        "files are open for writing in the mount: {}; close them (or stop the programs \
         writing them) and retry: what they write after a restore would be lost",
        shown.join(", ")
    )
}
