//! The mountpoint and the device it needs: `/dev/fuse` present, the
//! mountpoint a directory that is not a live mount (a stale layerfs mount
//! left by a dead daemon is detached first) and, unless `--nonempty`,
//! empty.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::paths::{absolute, existing_dir};
use super::{invalid, ConfigError};
use crate::host::mounts;

/// Checks that `/dev/fuse` is there to open.
pub(super) fn check_dev_fuse() -> Result<(), ConfigError> {
    match fs::metadata("/dev/fuse") {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(invalid(
            "/dev/fuse is missing: load the FUSE kernel module (`modprobe fuse`) and \
             install fuse3 (`apt-get install fuse3`)",
        )),
        Err(e) => Err(invalid(format!("/dev/fuse: {e}"))),
    }
}

/// Resolves the mountpoint: detaches a stale layerfs mount left by a dead
/// daemon, refuses a live mount, and returns the canonical directory.
/// Mountinfo is consulted before the mountpoint itself is touched, since a
/// dead or hung FUSE mount there may fail or block a stat.
pub(super) fn resolve_mountpoint(raw: &Path) -> Result<PathBuf, ConfigError> {
    let abs = absolute(raw)?;
    let abs = match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => fs::canonicalize(parent)
            .map(|p| p.join(name))
            .unwrap_or(abs),
        _ => abs,
    };
    if let Some(m) = mounts::find(&abs) {
        if !m.is_stale() {
            return Err(busy(&abs, &m));
        }
        tracing::warn!(
            "{}: stale layerfs mount (its daemon is gone); detaching it",
            abs.display()
        );
        mounts::detach(&abs).map_err(|e| {
            invalid(format!(
                "{}: stale layerfs mount could not be detached: {e}; run `umount -l {}`",
                abs.display(),
                abs.display()
            ))
        })?;
    }
    let mnt = existing_dir(&abs, "mountpoint", "MOUNTPOINT")?;
    match mounts::find(&mnt) {
        Some(m) => Err(busy(&mnt, &m)),
        None => Ok(mnt),
    }
}

/// Refuses a mountpoint that holds anything: the mount would hide it
/// silently (FUSE's own `nonempty` rule). `--nonempty` allows it.
pub(super) fn check_empty(mnt: &Path) -> Result<(), ConfigError> {
    let mut entries =
        fs::read_dir(mnt).map_err(|e| invalid(format!("mountpoint {}: {e}", mnt.display())))?;
    match entries.next() {
        None => Ok(()),
        Some(e) => {
            let first = e
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .unwrap_or_default();
            Err(invalid(format!(
                "mountpoint {} is not empty (it holds `{first}`{}): the mount would hide \
                 what is there; mount on an empty directory, or give --nonempty \
                 (-o nonempty) to mount over it",
                mnt.display(),
                if entries.next().is_some() {
                    ", …"
                } else {
                    ""
                }
            )))
        }
    }
}

fn busy(mnt: &Path, m: &mounts::MountEntry) -> ConfigError {
    let how = if m.is_layerfs() {
        format!("`layerfs umount {}`", mnt.display())
    } else {
        format!("`umount {}`", mnt.display())
    };
    invalid(format!(
        "mountpoint busy: {} is already a mount ({} from {}); unmount it first with {how}",
        mnt.display(),
        m.fstype,
        m.source
    ))
}
