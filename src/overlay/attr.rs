//! Attributes: getattr from the highest layer holding the object, and
//! setattr (chown, chmod, truncate, utimens), which copies up first.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::copy_up::Data;
use super::guard::Op;
use super::inode::Inode;
use super::{err, Ctx, Errno, Overlay, Result};
use crate::layer::sys::{self, Stat};

/// The changes of one setattr request. Times use `UTIME_NOW` /
/// `UTIME_OMIT` in `tv_nsec` as utimensat(2) does.
#[derive(Debug, Default, Clone)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<libc::timespec>,
    pub mtime: Option<libc::timespec>,
    /// An open handle the change comes through (ftruncate, fchmod).
    pub fh: Option<u64>,
}

impl Overlay {
    /// The real file that currently answers for an object.
    pub(super) fn real_fd(&self, inode: &Inode) -> Result<Arc<OwnedFd>> {
        let real = inode.real.read();
        let r = match &real.upper {
            Some(u) => u.clone(),
            None => real
                .lowers
                .first()
                .map(|(_, fd)| fd.clone())
                .ok_or(Errno(libc::EIO))?,
        };
        drop(real);
        Ok(r.get()?)
    }

    /// The attributes of object `id`; `fh`, the handle a GETATTR comes
    /// through (fstat, and the kernel's check of the size before a read
    /// past its cached end), answers for an object with no real file any
    /// more: one emptied because a live undo, reset or restore removed it
    /// (`refresh`) while this handle held it open, which goes on reading
    /// what it opened, as a file deleted while open.
    pub fn getattr(&self, id: u64, fh: Option<u64>) -> Result<(Stat, bool)> {
        let inode = self.inode(id)?;
        if let Some(st) = inode.removed.get() {
            return Ok((st, false));
        }
        let fd = match (self.real_fd(&inode), fh) {
            (Err(Errno(libc::EIO)), Some(fh)) if inode.real.read().identity().is_none() => {
                self.file(fh)?.1
            }
            (r, _) => r?,
        };
        let st = sys::fstat(fd.as_ref())?;
        Ok((self.fix_stat(&inode, st), self.volatile(&inode)))
    }

    pub fn setattr(&self, ctx: &Ctx, id: u64, a: &SetAttr) -> Result<Stat> {
        let inode = self.inode(id)?;
        self.guard_inode(ctx, Op::SetAttr, &inode)?;
        let only_truncate_to_zero =
            a.size == Some(0) && a.mode.is_none() && a.uid.is_none() && a.gid.is_none();
        let data = if only_truncate_to_zero {
            Data::Empty
        } else {
            Data::All
        };
        let upper = self.copy_up_with(&inode, data)?;
        let is_link = inode.kind == libc::S_IFLNK;
        if a.uid.is_some() || a.gid.is_some() {
            sys::fchown(upper.as_ref(), a.uid, a.gid)?;
        }
        if let Some(mode) = a.mode {
            if is_link {
                return err(libc::EOPNOTSUPP);
            }
            sys::fchmod(
                upper.as_ref(),
                self.allowed_mode(mode & 0o7777, inode.is_dir()),
            )?;
        }
        if let Some(size) = a.size {
            if inode.is_dir() {
                return err(libc::EISDIR);
            }
            let before = sys::fstat(upper.as_ref())?;
            self.quota.charge_resize(before.st_size as u64, size)?;
            let done = match a.fh.and_then(|fh| self.files.writable_fd(fh)) {
                Some(fd) => sys::ftruncate(fd.as_ref(), size),
                None => sys::reopen(upper.as_ref(), libc::O_WRONLY)
                    .and_then(|fd| sys::ftruncate(&fd, size)),
            };
            if let Err(e) = done {
                self.quota.charge_resize(size, before.st_size as u64).ok();
                return Err(e.into());
            }
        }
        if a.atime.is_some() || a.mtime.is_some() {
            let omit = libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            };
            let times = [a.atime.unwrap_or(omit), a.mtime.unwrap_or(omit)];
            if is_link {
                let parent = inode.parent().ok_or(Errno(libc::EIO))?;
                let pu = self.copy_up(&parent)?;
                let name = inode.loc.read().name.clone();
                sys::utimensat_nofollow(pu.as_ref(), &name, &times)?;
            } else {
                sys::futimens(upper.as_ref(), &times)?;
            }
        }
        let st = sys::fstat(upper.as_ref())?;
        Ok(self.fix_stat(&inode, st))
    }

    /// Clears the bits `killed_mode` names from the upper copy of object
    /// `id`, as a local filesystem does when a caller without
    /// `CAP_FSETID` writes or truncates (`fuse::killpriv` says when);
    /// `lacks_fsetid` is asked only when there are bits to clear. Returns
    /// the new attributes, or `None` when nothing changed (no upper copy,
    /// no bits, or a caller that keeps them).
    ///
    /// Invariant: the read of the mode and the fchmod are not atomic here;
    /// what keeps a concurrent chmod from being undone by the stale mode is
    /// the kernel, which holds the FUSE inode's lock while it sends each
    /// request that leads here (a WRITE without direct I/O, a SETATTR, an
    /// OPEN with `O_TRUNC`) and while it sends a chmod's SETATTR. layerfs
    /// opens no file for direct or parallel writes; doing so would need a
    /// lock of the daemon's own around this and `setattr`'s fchmod.
    pub fn kill_suid(&self, id: u64, lacks_fsetid: impl FnOnce() -> bool) -> Result<Option<Stat>> {
        let inode = self.inode(id)?;
        let Some(upper) = inode.real.read().upper.clone() else {
            return Ok(None);
        };
        let fd = upper.get()?;
        let st = sys::fstat(fd.as_ref())?;
        let Some(mode) = killed_mode(st.st_mode) else {
            return Ok(None);
        };
        if !lacks_fsetid() {
            return Ok(None);
        }
        sys::fchmod(fd.as_ref(), mode)?;
        let st = sys::fstat(fd.as_ref())?;
        Ok(Some(self.fix_stat(&inode, st)))
    }
}

/// The mode with the bits a write by a caller without `CAP_FSETID`
/// clears, or `None` when there are none: `S_ISUID`, and `S_ISGID` when
/// the group may execute (a setgid file that is not group-executable is
/// a mandatory-locking mark, kept). Regular files only.
pub fn killed_mode(mode: u32) -> Option<u32> {
    if mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    let mut kill = mode & libc::S_ISUID;
    if mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
        kill |= libc::S_ISGID;
    }
    (kill != 0).then_some(mode & 0o7777 & !kill)
}

/// An all-zero stat (for negative entries).
pub fn zero_stat() -> Stat {
    sys::zeroed_stat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setuid_always_and_setgid_only_when_group_executable_are_cleared() {
        let reg = libc::S_IFREG;
        assert_eq!(killed_mode(reg | 0o6755), Some(0o755));
        assert_eq!(killed_mode(reg | 0o4700), Some(0o700));
        assert_eq!(killed_mode(reg | 0o2755), Some(0o755));
        assert_eq!(killed_mode(reg | 0o2644), None, "a locking mark stays");
        assert_eq!(killed_mode(reg | 0o6644), Some(0o2644));
        assert_eq!(killed_mode(reg | 0o755), None);
        assert_eq!(killed_mode(libc::S_IFDIR | 0o2775), None);
    }
}
