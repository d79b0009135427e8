//! Snapshots: a tar of the upper directory in the state dir's `snapshots/`,
//! and restoring one as the upper.
//!
//! What an archive keeps, per object of the upper (walked without ever
//! following a symlink): its type (directory, regular file, symlink, hard
//! link to an earlier entry, character/block device — the 0/0 whiteouts —
//! and fifo; sockets are skipped with a warning), permission bits with
//! setuid/setgid/sticky, numeric owner and group, mtime and atime to the
//! nanosecond (PAX `mtime`/`atime` records; the ustar header keeps whole
//! seconds for other tools), every xattr the caller can read of
//! directories, files, devices and fifos (PAX `SCHILY.xattr.NAME` records,
//! as GNU tar writes them, or `LAYERFS.xattr.hex.NAME` for a value holding
//! a newline, which the tar reader could not read back: this includes the
//! overlay's `opaque`/`redirect` marks and POSIX ACLs; a symlink's own
//! xattrs are not kept), symlink
//! targets, device numbers, and the holes of sparse files (GNU sparse
//! entries; a restored file has the same holes). Not kept: ctime (no one
//! can set it) and the inode numbers. Paths matching the workspace's
//! scratch globs are left out (a matching directory with everything
//! beneath it).
//!
//! Invariants:
//! - The state dir and `snapshots/` are checked directories
//!   (`layer::safedir`): every snapshot file is opened, created, renamed
//!   and removed through their descriptors, never through a path another
//!   user could redirect.
//! - A snapshot file `ID.tar` is complete or absent: it is written as
//!   `.ID.tar.tmp`, fsynced, renamed into place and the directory fsynced.
//!   A `.ID.tar.tmp` is held with `flock` while its save runs, so a later
//!   save removes any unlocked leftover (a killed save) and never mistakes
//!   a running save's file for one. `list` shows only `*.tar` names whose
//!   stem is a valid ID (never a dot file).
//! - Save and extraction walk iteratively and reach every object relative
//!   to its parent directory's descriptor (`Chain`), so a tree deeper than
//!   `PATH_MAX` (or than the open-file limit) is archived and restored
//!   whole, and no symlink inside it is ever followed.
//! - `restore` never modifies the upper in place: the archive is extracted
//!   into a staging directory on the upper's filesystem, synced, and
//!   exchanged with the upper by one `renameat2(RENAME_EXCHANGE)`; before
//!   the exchange the upper is untouched, after it the upper is the whole
//!   restored tree. The old tree is removed afterwards (a crash leaves it
//!   in the work dir, which `mount` cleans).
//! - An archive is untrusted input (it may come from another host, or have
//!   been replaced): before anything is extracted a pass over its headers
//!   (`prescan`) bounds the metadata any one entry carries (`META_LIMIT`),
//!   and checks its entries and data fit the workspace's quota and the
//!   upper's free space; extraction creates every object itself beneath the
//!   staging dir, and an entry whose path is absolute, has a `..`
//!   component, lies under anything but a directory extracted before it,
//!   repeats an earlier name, or is a hard link to anything but a
//!   non-directory extracted before it, fails the restore (the upper stays
//!   as it was).
//! - The restored tree holds only what the workspace's policy lets the
//!   mount create (`Policy`): no device node but the overlay's 0/0
//!   whiteouts unless `devices allow`; no setuid/setgid bit on anything but
//!   a directory, and no file capability, unless `suid allow`; no symlink
//!   the `symlinks` rule refuses; of the private xattrs only the overlay's
//!   own marks, each on the kind of object it belongs to and in the form
//!   its reader parses (`ops::is_valid_redirect`, `Origin::is_valid`, …);
//!   no other `trusted.*`, `security.*` or `system.*` xattr but POSIX
//!   ACLs; owners only as the restoring user may set them; the upper
//!   root's own mode and owner unchanged. Every entry left out or changed
//!   is reported by name (`Report`).
//!
//! The parts: `store` (snapshot files and IDs: listing, describing,
//! removing), `archive` (saving: the tar writer), `chain` (the walk both
//! directions share), `scan` (the pass over an archive's headers),
//! `report` (what the policy left out or changed), `extract` (making the
//! archive's entries beneath a staging dir) and `restore` (staging and the
//! exchange with the upper).

mod archive;
mod chain;
mod extract;
mod report;
mod restore;
mod scan;
mod store;
#[cfg(test)]
mod tests;

pub use archive::{save, write_archive};
pub use extract::{extract, RootMeta};
pub use report::{Change, Report};
pub use restore::{restore, stage, Staged};
pub use scan::{prescan, Scan};
pub use store::{dir, exists, info_of, list, path, remove, snapshots_dir, Info, SaveOptions};

use std::io;

const PAX_XATTR: &str = "SCHILY.xattr.";
/// An xattr whose value holds a newline, hex-encoded: the tar reader
/// splits PAX records at newlines, so `SCHILY.xattr.NAME` with such a
/// value (a POSIX ACL naming uid 10, say) could not be read back. Other
/// tools skip the record and lose only that xattr.
const PAX_XATTR_HEX: &str = "LAYERFS.xattr.hex.";
const IO_BUF: usize = 1 << 20;
/// Most bytes of metadata (one PAX record set, one long name or link
/// name) a single entry may carry. Such records are read whole into
/// memory, so this bounds what an archive can make a restore allocate; a
/// path deeper than `PATH_MAX` (tens of KiB) or a file's xattrs (64 KiB
/// each at most) stay far below it.
pub const META_LIMIT: u64 = 8 << 20;
/// Directories along a walk that keep an open descriptor (`Chain`).
const WINDOW: usize = 64;
/// Changes a `Report` lists by name; beyond this they are only counted.
const MAX_LISTED: usize = 1000;
/// The name of `snapshots/` in the state dir.
const SNAPSHOTS: &str = "snapshots";
/// Name prefix of the staging directories a restore extracts into (the
/// daemon's live restore checks the names it is given against it).
pub const STAGING_PREFIX: &str = ".layerfs-restore.";

/// Why a snapshot could not be saved, listed, removed or restored. Each
/// names the snapshot file, archive entry or directory concerned and,
/// where there is one, what to do.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A system call failed: what was being done (naming its file), why,
    /// and a hint for the errors a user can act on.
    #[error("{what}: {source}{hint}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
        hint: &'static str,
    },
    /// An archive entry that cannot be restored as it is: the archive is
    /// not a layerfs snapshot, is damaged, or was crafted (named by its
    /// path in the archive).
    #[error("{0}")]
    Archive(String),
    /// Refused, or failed in the parts a snapshot relies on (the state
    /// dir's checks, the policy, the ID): the message says why.
    #[error("{0}")]
    Refused(String),
    /// The state dir, `snapshots/` or a staging dir was refused.
    #[error(transparent)]
    Dir(#[from] crate::layer::safedir::SafeDirError),
    /// The snapshot ID given is not a safe one.
    #[error(transparent)]
    Id(#[from] crate::state::snapshot_id::IdError),
    /// What went wrong reading the snapshot `file`.
    #[error("snapshot {}: {source}", file.display())]
    In {
        file: std::path::PathBuf,
        #[source]
        source: Box<SnapshotError>,
    },
    /// A tar header whose size field cannot be read, at byte `at`.
    #[error("the archive's header at byte {at}: {source}")]
    Header {
        at: u64,
        #[source]
        source: io::Error,
    },
}

impl SnapshotError {
    /// `self`, as a failure reading the snapshot `file`.
    fn in_file(file: &std::path::Path) -> impl FnOnce(SnapshotError) -> SnapshotError + '_ {
        move |e| SnapshotError::In {
            file: file.to_path_buf(),
            source: Box::new(e),
        }
    }
}

impl From<String> for SnapshotError {
    fn from(why: String) -> SnapshotError {
        SnapshotError::Refused(why)
    }
}

impl From<&str> for SnapshotError {
    fn from(why: &str) -> SnapshotError {
        SnapshotError::Refused(why.to_string())
    }
}

/// `map_err` helper: an io error with what was being done, no hint.
fn plain(what: impl std::fmt::Display) -> impl FnOnce(io::Error) -> SnapshotError {
    move |source| SnapshotError::Io {
        what: what.to_string(),
        source,
        hint: "",
    }
}

/// `map_err` helper: an io error with what was being done, and a hint
/// where the user can act on it.
fn ctx(what: impl std::fmt::Display) -> impl FnOnce(io::Error) -> SnapshotError {
    move |source| {
        let hint = match source.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => " (no space left: free some and retry)",
            Some(libc::EACCES) | Some(libc::EPERM) => {
                " (permission denied: run as the workspace's owner)"
            }
            Some(libc::EROFS) => " (read-only filesystem)",
            _ => "",
        };
        SnapshotError::Io {
            what: what.to_string(),
            source,
            hint,
        }
    }
}

fn progress_bar(show: bool, total: Option<u64>, msg: &str) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = match total {
        Some(n) => indicatif::ProgressBar::new(n).with_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        ),
        None => indicatif::ProgressBar::new_spinner().with_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {msg}: {bytes} {bytes_per_sec} {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        ),
    };
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    bar.set_message(msg.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}
