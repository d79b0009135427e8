//! Snapshot files and their IDs: where they live in the state dir, how
//! they are listed, described and removed, and the leftovers of killed saves.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::scan::prescan;
use super::{ctx, SnapshotError, SNAPSHOTS};
use crate::layer::safedir::{Role, SafeDir};
use crate::state::scratch::Scratch;
use crate::state::snapshot_id;

/// The `snapshots/` directory of a state dir (for messages).
pub fn dir(state: &Path) -> PathBuf {
    state.join(SNAPSHOTS)
}

/// Path of snapshot `id` (a validated ID) in a state dir (for messages).
pub fn path(state: &Path, id: &str) -> PathBuf {
    dir(state).join(file_name(id))
}

pub(super) fn file_name(id: &str) -> String {
    format!("{id}.tar")
}

pub(super) fn tmp_name(id: &str) -> String {
    format!(".{id}.tar.tmp")
}

/// `snapshots/` in the checked state dir, itself checked; created (0700)
/// when `create`, else `None` when missing.
pub fn snapshots_dir(state: &SafeDir, create: bool) -> Result<Option<SafeDir>, SnapshotError> {
    Ok(state.subdir(SNAPSHOTS, Role::Snapshots, create.then_some(0o700))?)
}

/// Options of a save.
pub struct SaveOptions {
    /// Paths left out: the workspace's scratch paths.
    pub exclude: Scratch,
    /// Replace an existing snapshot of the same ID.
    pub force: bool,
    /// Show a progress bar on stderr (a terminal).
    pub progress: bool,
}

/// What one snapshot holds, for `list` and for reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    pub id: String,
    /// Archive size in bytes.
    pub size: u64,
    /// When the snapshot was completed (the file's mtime), Unix seconds.
    pub time: i64,
    /// Archive entries (objects of the upper, the root included).
    pub entries: Option<u64>,
}

impl Info {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "size": self.size,
            "time": snapshot_id::rfc3339(self.time),
            "entries": self.entries,
        })
    }
}

/// Removes leftovers of killed saves: `.ID.tar.tmp` files no running save
/// holds locked.
pub(super) fn remove_stale_tmps(d: &SafeDir) {
    let Ok(entries) = d.read_dir() else { return };
    for e in entries {
        let b = e.name.as_bytes();
        if !(b.starts_with(b".") && b.ends_with(b".tar.tmp")) {
            continue;
        }
        let Ok(f) = d.open_file(&e.name, libc::O_RDONLY, 0) else {
            continue;
        };
        if crate::sys::flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
            let _ = d.remove_file(&e.name);
        }
    }
}

/// Whether snapshot `id` exists.
pub fn exists(state: &SafeDir, id: &str) -> bool {
    matches!(snapshots_dir(state, false), Ok(Some(d)) if d.stat(file_name(id)).is_ok())
}

/// Info about snapshot `id` in the checked `snapshots/` (entries not
/// counted).
pub(super) fn info_in(d: &SafeDir, id: &str) -> Result<Info, SnapshotError> {
    let name = file_name(id);
    let p = d.shown(&name);
    let st = d.stat(&name).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            SnapshotError::Refused(format!(
                "no snapshot `{id}` in {} (see: layerfs snapshot list WORKSPACE)",
                d.path().display()
            ))
        } else {
            ctx(format!("cannot stat {}", p.display()))(e)
        }
    })?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(format!("{} is not a regular file", p.display()).into());
    }
    Ok(Info {
        id: id.to_string(),
        size: st.st_size as u64,
        time: st.st_mtime,
        entries: None,
    })
}

/// Info about snapshot `id` of the checked state dir.
pub fn info_of(state: &SafeDir, id: &str) -> Result<Info, SnapshotError> {
    match snapshots_dir(state, false)? {
        Some(d) => info_in(&d, id),
        None => Err(format!(
            "no snapshot `{id}`: {} does not exist (see: layerfs snapshot list WORKSPACE)",
            dir(state.path()).display()
        )
        .into()),
    }
}

/// Opens snapshot `id` for reading, never following a symlink.
pub(super) fn open_snapshot(d: &SafeDir, id: &str) -> Result<File, SnapshotError> {
    let name = file_name(id);
    d.open_file(&name, libc::O_RDONLY, 0)
        .map_err(ctx(format!("cannot open {}", d.shown(&name).display())))
}

/// Every snapshot in the state dir, oldest first (then by ID); `count`
/// counts each one's entries (reading only headers, `prescan`).
pub fn list(state: &SafeDir, count: bool) -> Result<Vec<Info>, SnapshotError> {
    let Some(d) = snapshots_dir(state, false)? else {
        return Ok(Vec::new());
    };
    let entries = d
        .read_dir()
        .map_err(ctx(format!("cannot list {}", d.path().display())))?;
    let mut out = Vec::new();
    for e in entries {
        let Some(id) = e.name.as_bytes().strip_suffix(b".tar") else {
            continue;
        };
        let Ok(id) = snapshot_id::validate(OsStr::from_bytes(id)) else {
            continue;
        };
        let mut info = match info_in(&d, id) {
            Ok(i) => i,
            Err(_) => continue,
        };
        if count {
            info.entries = open_snapshot(&d, id)
                .and_then(|f| prescan(&f))
                .ok()
                .map(|s| s.entries);
        }
        out.push(info);
    }
    out.sort_by(|a, b| (a.time, &a.id).cmp(&(b.time, &b.id)));
    Ok(out)
}

/// Removes snapshot `id`.
pub fn remove(state: &SafeDir, id: &str) -> Result<(), SnapshotError> {
    let d = snapshots_dir(state, false)?
        .ok_or_else(|| format!("no snapshot `{id}` in {}", dir(state.path()).display()))?;
    info_in(&d, id)?;
    let name = file_name(id);
    d.remove_file(&name)
        .map_err(ctx(format!("cannot remove {}", d.shown(&name).display())))?;
    d.sync()
        .map_err(ctx(format!("cannot sync {}", d.path().display())))
}
