//! Copy-up: giving an object an upper copy before it is changed.
//!
//! Ordering: parents first (each directory copied up with its mode, owner,
//! times and xattrs); then the object is built in the work dir — data
//! first, then owner, then mode (chown clears set-id bits), then xattrs,
//! then times — fsynced, and renamed into place. A crash at any moment
//! leaves no upper copy or a complete one; the work dir is cleared at the
//! next mount. One copy-up per inode at a time (`Inode::copy_up`); others
//! wait and find the upper in place.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

use super::inode::Inode;
use super::{err, Errno, Overlay, Result};
use crate::layer::ops::Upper;
use crate::layer::real::RealFd;
use crate::layer::sys::{self, Stat};

/// How much of a regular file to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    /// The whole content.
    All,
    /// None: the caller truncates to zero anyway (`O_TRUNC`).
    Empty,
}

fn times_of(st: &Stat) -> [libc::timespec; 2] {
    [
        libc::timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec,
        },
        libc::timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec,
        },
    ]
}

impl Overlay {
    /// Makes sure `inode` has an upper copy and returns its `O_PATH` fd.
    pub fn copy_up(&self, inode: &Arc<Inode>) -> Result<Arc<OwnedFd>> {
        self.copy_up_with(inode, Data::All)
    }

    pub fn copy_up_with(&self, inode: &Arc<Inode>, data: Data) -> Result<Arc<OwnedFd>> {
        if let Some(u) = inode.upper_fd()? {
            return Ok(u);
        }
        self.check_writable()?;
        let parent = inode.parent().ok_or(Errno(libc::EIO))?;
        let parent_upper = self.copy_up(&parent)?;
        let _guard = inode.copy_up.lock();
        if let Some(u) = inode.upper_fd()? {
            return Ok(u);
        }
        let (lower_fd, name) = {
            let real = inode.real.read();
            let lower = real
                .lowers
                .first()
                .map(|(_, fd)| fd.clone())
                .ok_or(Errno(libc::EIO))?;
            (lower, inode.loc.read().name.clone())
        };
        let lower_fd = lower_fd.get()?;
        let st = sys::fstat(lower_fd.as_ref())?;
        self.quota.charge_copy_up(&st)?;
        let pst = sys::fstat(parent_upper.as_ref()).ok();
        let tmp = self.upper.tmp_name();
        let built = self.build_copy(&lower_fd, &st, &tmp, data, inode.is_dir());
        let result = built.and_then(|_| {
            sys::renameat2(
                &self.upper.work,
                &tmp,
                parent_upper.as_ref(),
                &name,
                sys::RENAME_NOREPLACE,
            )
            .map_err(Errno::from)
        });
        if let Err(e) = result {
            let _ = self.upper.remove_tree(&self.upper.work, &tmp);
            self.quota.refund_copy_up(&st);
            tracing::warn!(path = %self.path_of(inode), "copy-up failed: {e}");
            return Err(e);
        }
        // Copying up changed the upper parent's times; the object's parent
        // did not change as seen through the mount.
        if let Some(pst) = pst {
            let _ = sys::futimens(parent_upper.as_ref(), &times_of(&pst));
        }
        let real = RealFd::new(
            sys::open_path(parent_upper.as_ref(), &name)?,
            &self.upper.layer.mount,
        );
        let fd = real.get()?;
        let ust = sys::fstat(fd.as_ref())?;
        self.ids.alias(ust.st_dev, ust.st_ino, inode.id);
        inode.real.write().upper = Some(real);
        super::events::note(super::events::Note::CopyUp {
            path: self.path_of(inode),
        });
        Ok(fd)
    }

    /// Builds the copy of the lower object `lower` as `tmp` in the work dir.
    fn build_copy(
        &self,
        lower: &OwnedFd,
        st: &Stat,
        tmp: &OsStr,
        data: Data,
        is_dir: bool,
    ) -> Result<()> {
        let work = &self.upper.work;
        let fmt = st.st_mode & libc::S_IFMT;
        let perm = st.st_mode & 0o7777;
        let target: OwnedFd = match fmt {
            libc::S_IFREG => {
                let dst = sys::open_beneath(
                    work,
                    tmp,
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                    0o600,
                )?;
                if data == Data::All && st.st_size > 0 {
                    let src = sys::reopen(lower, libc::O_RDONLY | libc::O_NOATIME)
                        .or_else(|_| sys::reopen(lower, libc::O_RDONLY))?;
                    copy_data(&src, &dst, st.st_size as u64)?;
                }
                copy_xattrs(lower, &dst, fmt)?;
                self.own(&dst, Some(st.st_uid), Some(st.st_gid))?;
                sys::fchmod(&dst, perm)?;
                sys::futimens(&dst, &times_of(st))?;
                sys::fsync(&dst, false)?;
                return Ok(());
            }
            libc::S_IFDIR => {
                debug_assert!(is_dir);
                sys::mkdirat(work, tmp, 0o700)?;
                sys::open_path(work, tmp)?
            }
            libc::S_IFLNK => {
                let t = sys::readlink_fd(lower)?;
                sys::symlinkat(&t, work, tmp)?;
                let fd = sys::open_path(work, tmp)?;
                self.own(&fd, Some(st.st_uid), Some(st.st_gid))?;
                sys::utimensat_nofollow(work, tmp, &times_of(st))?;
                return Ok(());
            }
            _ => {
                sys::mknodat(work, tmp, fmt | 0o600, st.st_rdev)?;
                sys::open_path(work, tmp)?
            }
        };
        copy_xattrs(lower, &target, fmt)?;
        self.own(&target, Some(st.st_uid), Some(st.st_gid))?;
        sys::fchmod(&target, perm)?;
        sys::futimens(&target, &times_of(st))?;
        Ok(())
    }
}

/// Copies `len` bytes, in-kernel where the filesystems allow it.
fn copy_data(src: &OwnedFd, dst: &OwnedFd, len: u64) -> Result<()> {
    let mut soff: i64 = 0;
    let mut doff: i64 = 0;
    while (soff as u64) < len {
        let want = (len - soff as u64).min(1 << 30) as usize;
        match sys::copy_file_range(src, &mut soff, dst, &mut doff, want) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EXDEV)
                        | Some(libc::EOPNOTSUPP)
                        | Some(libc::ENOSYS)
                        | Some(libc::EINVAL)
                ) =>
            {
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = sys::pread(src, &mut buf, soff as u64)?;
                    if n == 0 {
                        return Ok(());
                    }
                    let mut done = 0;
                    while done < n {
                        done += sys::pwrite(dst, &buf[done..n], doff as u64 + done as u64)?;
                    }
                    soff += n as i64;
                    doff += n as i64;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Copies the xattrs of `src` to `dst`, except the overlay's own marks.
/// Symlinks carry none that matter here.
pub fn copy_xattrs(src: &impl AsRawFd, dst: &(impl AsRawFd + AsFd), fmt: u32) -> Result<()> {
    if fmt == libc::S_IFLNK {
        return Ok(());
    }
    let list = match sys::listxattr(src) {
        Ok(l) => l,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if Upper::is_private_xattr(name) {
            continue;
        }
        let Ok(cname) = CString::new(name) else {
            continue;
        };
        let value = match sys::getxattr(src, &cname) {
            Ok(v) => v,
            Err(_) => continue,
        };
        if let Err(e) = sys::setxattr(dst, &cname, &value, 0) {
            // security.* labels may be refused by the upper's filesystem;
            // user data xattrs may not be lost.
            if name.starts_with(b"user.") || name.starts_with(b"system.posix_acl") {
                return Err(e.into());
            }
            tracing::debug!("xattr {} not copied up: {e}", String::from_utf8_lossy(name));
        }
    }
    Ok(())
}

pub fn cstr(name: &[u8]) -> Result<CString> {
    CString::new(name).map_err(|_| Errno(libc::EINVAL))
}

pub fn _unused(_: &CStr) -> Result<()> {
    err(0)
}
