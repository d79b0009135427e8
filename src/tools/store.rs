//! The few primitive operations every tool is built from, and the two
//! places they run: the overlay core in this process (`core::CoreStore`,
//! an unmounted workspace) or the live mount of the workspace
//! (`mounted::MountStore`). Everything above this trait (numbered reads,
//! edits, grep, glob) is written once, on these primitives.
//!
//! Invariants both keep: a path is walked name by name from the
//! workspace root and a symlink is never followed, on the way or at the
//! end (`What::Symlink`); every change goes through the overlay core's
//! copy-up, whiteout, policy, quota and journal code (in-process, or the
//! serving daemon's).

use serde::Serialize;

use super::error::Result;
use super::path::RelPath;
use crate::layer::sys::Stat;

/// The kind of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

/// What `stat` and `ls` say about an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Meta {
    pub kind: Kind,
    pub size: u64,
    /// Seconds since the Unix epoch.
    pub mtime: i64,
    /// Permission bits (`0o7777`).
    pub mode: u32,
}

impl Meta {
    pub fn of(st: &Stat) -> Meta {
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        };
        Meta {
            kind,
            size: st.st_size as u64,
            mtime: st.st_mtime,
            mode: st.st_mode & 0o7777,
        }
    }
}

/// The primitives. `tool` names the tool a change is made for (the
/// journal's rows say it, see `core::CoreStore`).
pub(crate) trait Store: Send + Sync {
    fn stat(&self, p: &RelPath) -> Result<Meta>;
    /// The visible entries of a directory, unsorted, each with its meta.
    fn list(&self, p: &RelPath) -> Result<Vec<(String, Meta)>>;
    /// The whole content of a file.
    fn read(&self, p: &RelPath) -> Result<Vec<u8>> {
        self.read_range(p, 0, u64::MAX)
    }
    /// At most `limit` bytes of a file from byte `offset` on (none past
    /// its end).
    fn read_range(&self, p: &RelPath, offset: u64, limit: u64) -> Result<Vec<u8>>;
    /// Creates `p` (which must not exist: `O_EXCL`) holding `data`.
    fn create(&self, tool: &str, p: &RelPath, data: &[u8], mode: u32) -> Result<()>;
    /// Removes a file (`dir` false) or an empty directory.
    fn remove(&self, tool: &str, p: &RelPath, dir: bool) -> Result<()>;
    /// rename(2); with `noreplace`, an existing `to` is `Exists`.
    fn rename(&self, tool: &str, from: &RelPath, to: &RelPath, noreplace: bool) -> Result<()>;
    fn mkdir(&self, tool: &str, p: &RelPath) -> Result<()>;
}
