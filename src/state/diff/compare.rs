//! Whether an upper entry differs from its shared version: bytes,
//! target, metadata, xattrs, drift from the origin.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;

use crate::layer::stack::{rel_of, stat_in, BaseEntry};
use crate::layer::sys::{self, Stat};
use crate::overlay::origin::Origin;
use crate::state::frozen::origins::Found;

use super::walk::Walk;
use super::Kind;

impl Walk<'_> {
    /// `Some(Modified)` when content or type differ, `Some(Metadata)` when
    /// only metadata does, `None` when the upper entry equals the shared one.
    pub(super) fn compare(
        &self,
        dir: &OwnedFd,
        name: &OsStr,
        st: &Stat,
        b: &BaseEntry,
        old: Option<&(usize, OsString)>,
    ) -> io::Result<Option<Kind>> {
        let fmt = st.st_mode & libc::S_IFMT;
        if fmt != b.st.st_mode & libc::S_IFMT {
            return Ok(Some(Kind::Modified));
        }
        let ufd = sys::open_path(dir, name)?;
        if old.is_none() {
            return Ok(Some(Kind::Modified));
        }
        // The shared file, from the lower directory it was found in.
        let ldir = self
            .frames
            .last()
            .and_then(|f| f.base.iter().find(|(i, _)| *i == b.layer))
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let lfd = sys::open_path(&ldir.1, name)?;
        let content_same = match fmt {
            libc::S_IFREG => {
                st.st_size == b.st.st_size && {
                    let a = sys::reopen(&ufd, libc::O_RDONLY)?;
                    let l = sys::reopen(&lfd, libc::O_RDONLY | libc::O_NOATIME)
                        .or_else(|_| sys::reopen(&lfd, libc::O_RDONLY))?;
                    same_bytes(&a, &l)?
                }
            }
            libc::S_IFLNK => sys::readlink_fd(&ufd)? == sys::readlink_fd(&lfd)?,
            libc::S_IFCHR | libc::S_IFBLK => st.st_rdev == b.st.st_rdev,
            _ => true,
        };
        if !content_same {
            return Ok(Some(Kind::Modified));
        }
        let same = self.same_meta(&ufd, st, &lfd, &b.st, fmt != libc::S_IFLNK);
        Ok((!same).then_some(Kind::Metadata))
    }

    pub(super) fn same_meta(
        &self,
        ufd: &OwnedFd,
        ust: &Stat,
        lfd: &OwnedFd,
        lst: &Stat,
        times: bool,
    ) -> bool {
        let fmt = ust.st_mode & libc::S_IFMT;
        ust.st_mode & 0o7777 == lst.st_mode & 0o7777
            && (!self.layers.compare_owner()
                || (ust.st_uid, ust.st_gid) == (lst.st_uid, lst.st_gid))
            && (!times || (ust.st_mtime, ust.st_mtime_nsec) == (lst.st_mtime, lst.st_mtime_nsec))
            && (fmt == libc::S_IFLNK || user_xattrs(ufd) == user_xattrs(lfd))
    }

    /// Whether the upper file `name` in `dir` has an origin record whose
    /// shared original is no longer what was copied.
    pub(super) fn drifted(&self, dir: &OwnedFd, name: &OsStr) -> bool {
        if self.filter.origins.is_none() {
            return false;
        }
        let Ok(fd) = sys::open_path(dir, name) else {
            return false;
        };
        match Origin::read(&fd) {
            Some(o) => self.origin_drifted(&o),
            None => false,
        }
    }

    /// Whether the original `o` names is no longer what was copied: it is
    /// gone, or its identity changed. A checkpoint layer never changes
    /// (`frozen::origins`): an original in one has not drifted.
    pub(super) fn origin_drifted(&self, o: &Origin) -> bool {
        match self.origin_layer(o) {
            Some((at, o)) => self.resolved_drifted(at, &o),
            None => true,
        }
    }

    /// `origin_drifted` for a record already resolved (`origin_layer`).
    pub(super) fn resolved_drifted(&self, at: Found, o: &Origin) -> bool {
        if at.frozen {
            return false;
        }
        let Some(root) = self.layers.lowers.get(at.index) else {
            return true;
        };
        match stat_in(root, &rel_of(&o.path)) {
            Ok(st) => !o.matches(&st),
            Err(_) => true,
        }
    }

    /// The original `o` names (followed down to a shared lower against
    /// the shared tree, `Origins::resolve`), and where its layer is among
    /// these lowers now.
    pub(super) fn origin_layer(&self, o: &Origin) -> Option<(Found, Origin)> {
        self.filter.origins.as_ref()?.resolve(o)
    }
}

/// Whether two regular files (same size) have the same bytes.
pub(crate) fn same_bytes(a: &OwnedFd, b: &OwnedFd) -> io::Result<bool> {
    let mut ba = vec![0u8; 256 * 1024];
    let mut bb = vec![0u8; 256 * 1024];
    let mut off = 0u64;
    loop {
        let n = read_full(a, &mut ba, off)?;
        let m = read_full(b, &mut bb[..n.max(1)], off)?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
        off += n as u64;
    }
}

pub(crate) fn read_full(fd: &OwnedFd, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let n = sys::pread(fd, &mut buf[got..], off + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

/// The xattrs outside the overlay's namespace, sorted.
fn user_xattrs(fd: &impl std::os::fd::AsRawFd) -> Vec<(Vec<u8>, Vec<u8>)> {
    let Ok(list) = sys::listxattr(fd) else {
        return Vec::new();
    };
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = list
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty() && !crate::layer::ops::Upper::is_private_xattr(n))
        .filter_map(|n| {
            let c = CString::new(n).ok()?;
            Some((n.to_vec(), sys::getxattr(fd, &c).ok()?))
        })
        .collect();
    out.sort();
    out
}
