//! The mount's readahead (`--readahead`): how much the kernel reads ahead
//! of a sequential reader of a file on the mount, and so how large the
//! READs of a cold sequential read are.
//!
//! The kernel starts a FUSE mount's readahead at 128 KiB and lets the
//! daemon only lower it in its INIT reply (`max_readahead`, capped at what
//! the kernel offers), so a cold read of a 256 MiB lower file costs 2,048
//! READs of 128 KiB. Root can raise it afterwards through the mount's
//! backing device info, `/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`, named
//! by the connection's device number; the kernel then sends READs up to
//! its largest (`max_pages`, 1 MiB here), 256 of them for that file, and
//! with the default of 2 MiB two at a time, which two request threads
//! serve at once. A file takes the value at its open, so it is set before
//! the mount is announced ready. Anyone else (a user mount through fusermount3) cannot
//! write there: the mount keeps the kernel's 128 KiB and says so in its
//! log. Only how much is read ahead changes; what a program reads does
//! not.

use std::path::{Path, PathBuf};

/// Sets the readahead of the FUSE mount just made at `mountpoint` to
/// `bytes` (rounded down to KiB; 0 leaves the kernel's). Fails soft: a
/// mount whose readahead cannot be set works as before, and the log says
/// why.
pub fn apply(mountpoint: &Path, bytes: u64) {
    if bytes == 0 {
        return;
    }
    match set(mountpoint, bytes) {
        Ok(file) => tracing::debug!("readahead {} KiB ({})", bytes >> 10, file.display()),
        Err(why) => tracing::info!("readahead stays at the kernel's 128 KiB: {why}"),
    }
}

/// Writes the value; returns the file written, or why not.
fn set(mountpoint: &Path, bytes: u64) -> Result<PathBuf, String> {
    let entry = crate::host::mounts::find(mountpoint)
        .ok_or_else(|| format!("{} is not in /proc/self/mountinfo", mountpoint.display()))?;
    // Root writes a device's setting here: only ever this mount's own
    // (a FUSE connection's device has major 0), never that of whatever
    // else a race left on top of the mountpoint.
    if !entry.is_layerfs() || entry.dev.0 != 0 {
        return Err(format!(
            "the mount on top of {} is not a layerfs mount ({} on {}:{})",
            mountpoint.display(),
            entry.fstype,
            entry.dev.0,
            entry.dev.1
        ));
    }
    let file = bdi_file(entry.dev);
    std::fs::write(&file, format!("{}\n", bytes >> 10))
        .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    Ok(file)
}

/// The readahead file of the mount whose superblock is `dev`.
pub fn bdi_file(dev: (u32, u32)) -> PathBuf {
    PathBuf::from(format!("/sys/class/bdi/{}:{}/read_ahead_kb", dev.0, dev.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_connections_bdi() {
        assert_eq!(
            bdi_file((0, 48)),
            PathBuf::from("/sys/class/bdi/0:48/read_ahead_kb")
        );
    }
}
