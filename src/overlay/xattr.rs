//! Extended attributes: read from the highest layer, set and removed on
//! the upper after copy-up. The overlay's own marks (`trusted.overlay.*`,
//! `user.overlay.*`) are never listed, read, set nor removed through the
//! mount.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;

use super::guard::Op;
use super::{err, Ctx, Errno, Overlay, Result};
use crate::layer::ops::Upper;
use crate::layer::sys;

fn name_of(name: &OsStr) -> Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| Errno(libc::EINVAL))
}

impl Overlay {
    pub fn getxattr(&self, id: u64, name: &OsStr) -> Result<Vec<u8>> {
        if Upper::is_private_xattr(name.as_bytes()) {
            return err(libc::ENODATA);
        }
        let inode = self.inode(id)?;
        if inode.kind == libc::S_IFLNK {
            return err(libc::ENODATA);
        }
        let fd = self.real_fd(&inode)?;
        Ok(sys::getxattr(fd.as_ref(), &name_of(name)?)?)
    }

    /// The NUL-separated name list, without the overlay's own names.
    pub fn listxattr(&self, id: u64) -> Result<Vec<u8>> {
        let inode = self.inode(id)?;
        if inode.kind == libc::S_IFLNK {
            return Ok(Vec::new());
        }
        let fd = self.real_fd(&inode)?;
        let raw = sys::listxattr(fd.as_ref())?;
        let mut out = Vec::with_capacity(raw.len());
        for n in raw.split(|&b| b == 0).filter(|n| !n.is_empty()) {
            if !Upper::is_private_xattr(n) {
                out.extend_from_slice(n);
                out.push(0);
            }
        }
        Ok(out)
    }

    pub fn setxattr(
        &self,
        ctx: &Ctx,
        id: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        if Upper::is_private_xattr(name.as_bytes()) {
            return err(libc::EPERM);
        }
        let inode = self.inode(id)?;
        self.guard_inode(ctx, Op::SetXattr, &inode)?;
        if inode.kind == libc::S_IFLNK {
            return err(libc::EPERM);
        }
        let upper = self.copy_up(&inode)?;
        Ok(sys::setxattr(
            upper.as_ref(),
            &name_of(name)?,
            value,
            flags,
        )?)
    }

    pub fn removexattr(&self, ctx: &Ctx, id: u64, name: &OsStr) -> Result<()> {
        if Upper::is_private_xattr(name.as_bytes()) {
            return err(libc::EPERM);
        }
        let inode = self.inode(id)?;
        self.guard_inode(ctx, Op::SetXattr, &inode)?;
        if inode.kind == libc::S_IFLNK {
            return err(libc::EPERM);
        }
        // Nothing to remove is ENODATA, without copying up.
        let cname = name_of(name)?;
        sys::getxattr(self.real_fd(&inode)?.as_ref(), &cname)?;
        let upper = self.copy_up(&inode)?;
        Ok(sys::removexattr(upper.as_ref(), &cname)?)
    }
}
