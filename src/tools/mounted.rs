//! The tools beside a live mount: every primitive is a system call on the
//! workspace's mountpoint, so the serving daemon applies its policy,
//! quota and journal, and what the tools change is seen through the
//! mount at once (and the other way round). No second core ever runs on
//! the upper (`daemon::exclusive`).
//!
//! Paths are opened beneath the mountpoint's descriptor with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` (`layer::sys`), so no
//! symlink and no `..` can lead a call out of the workspace. The policy
//! rule of a refusal is the workspace policy's classification of the
//! path (the daemon's journal has the rule it applied).

use std::ffi::OsStr;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

use super::error::{Result, ToolError, What};
use super::path::RelPath;
use super::store::{Meta, Store};
use crate::layer::sys;
use crate::policy::Policy;

/// The live mount's root could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot open mountpoint {}: {source}", mountpoint.display())]
pub(crate) struct MountpointError {
    mountpoint: std::path::PathBuf,
    source: std::io::Error,
}

pub(crate) struct MountStore {
    root: OwnedFd,
    policy: Policy,
}

impl MountStore {
    pub fn new(
        mountpoint: &Path,
        policy: Policy,
    ) -> std::result::Result<MountStore, MountpointError> {
        let root = sys::open_root(mountpoint).map_err(|source| MountpointError {
            mountpoint: mountpoint.to_path_buf(),
            source,
        })?;
        Ok(MountStore { root, policy })
    }

    /// An error from the mount, with the rule that refused it when the
    /// policy has one for the path.
    fn fail(&self, p: &RelPath, e: std::io::Error) -> ToolError {
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        let rule = matches!(errno, libc::EACCES | libc::EPERM | libc::EROFS)
            .then(|| {
                let c = self.policy.classify(p.as_str());
                c.readonly
                    .or(c.protected)
                    .or(c.hidden)
                    .map(|r| r.to_string())
            })
            .flatten();
        ToolError::errno(p, errno, rule)
    }

    fn open(&self, p: &RelPath, flags: i32, mode: u32) -> Result<OwnedFd> {
        let name = if p.is_root() { "." } else { p.as_str() };
        sys::open_beneath(&self.root, OsStr::new(name), flags, mode).map_err(|e| self.fail(p, e))
    }

    /// The directory holding `p` (`O_PATH`) and `p`'s last name.
    fn parent<'p>(&self, p: &'p RelPath) -> Result<(OwnedFd, &'p str)> {
        let (dir, name) = p
            .split_last()
            .ok_or_else(|| ToolError::new(p, What::BadPath("the workspace root itself")))?;
        let fd = self
            .open(&dir, libc::O_PATH | libc::O_DIRECTORY, 0)
            .map_err(|e| e.about(p))?;
        Ok((fd, name))
    }
}

impl Store for MountStore {
    fn stat(&self, p: &RelPath) -> Result<Meta> {
        let fd = self.open(p, libc::O_PATH, 0)?;
        sys::fstat(&fd)
            .map(|st| Meta::of(&st))
            .map_err(|e| self.fail(p, e))
    }

    fn list(&self, p: &RelPath) -> Result<Vec<(String, Meta)>> {
        let dir = self.open(p, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let entries = sys::read_open_dir(&dir).map_err(|e| self.fail(p, e))?;
        Ok(entries
            .into_iter()
            .filter_map(|e| {
                // A name gone since the listing is left out.
                let st = sys::fstatat(&dir, &e.name).ok()?;
                Some((e.name.to_string_lossy().into_owned(), Meta::of(&st)))
            })
            .collect())
    }

    fn read_range(&self, p: &RelPath, offset: u64, limit: u64) -> Result<Vec<u8>> {
        let fd = self.open(p, libc::O_RDONLY, 0)?;
        let mut f = std::fs::File::from(fd);
        if offset > 0 {
            f.seek(SeekFrom::Start(offset))
                .map_err(|e| self.fail(p, e))?;
        }
        let mut data = Vec::new();
        f.take(limit)
            .read_to_end(&mut data)
            .map_err(|e| self.fail(p, e))?;
        Ok(data)
    }

    fn create(&self, _tool: &str, p: &RelPath, data: &[u8], mode: u32) -> Result<()> {
        let (dir, name) = self.parent(p)?;
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
        let fd =
            sys::open_beneath(&dir, OsStr::new(name), flags, mode).map_err(|e| self.fail(p, e))?;
        let mut f = std::fs::File::from(fd);
        f.write_all(data).map_err(|e| self.fail(p, e))
    }

    fn remove(&self, _tool: &str, p: &RelPath, is_dir: bool) -> Result<()> {
        let (dir, name) = self.parent(p)?;
        sys::unlinkat(&dir, OsStr::new(name), is_dir).map_err(|e| self.fail(p, e))
    }

    fn rename(&self, _tool: &str, from: &RelPath, to: &RelPath, noreplace: bool) -> Result<()> {
        let (fdir, fname) = self.parent(from)?;
        let (tdir, tname) = self.parent(to)?;
        let flags = if noreplace { sys::RENAME_NOREPLACE } else { 0 };
        sys::renameat2(&fdir, OsStr::new(fname), &tdir, OsStr::new(tname), flags)
            .map_err(|e| self.fail(from, e))
    }

    fn mkdir(&self, _tool: &str, p: &RelPath) -> Result<()> {
        let (dir, name) = self.parent(p)?;
        sys::mkdirat(&dir, OsStr::new(name), 0o777).map_err(|e| self.fail(p, e))
    }
}
