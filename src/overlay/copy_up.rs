//! Copy-up: giving an object an upper copy before it is changed.
//!
//! Ordering: parents first (each directory copied up with its mode, owner,
//! times and xattrs); then the object is built in the work dir — data
//! first, then owner, then mode (chown clears set-id bits), then xattrs,
//! then times — fsynced, and renamed into place. A crash at any moment
//! leaves no upper copy or a complete one; the work dir is cleared at the
//! next mount. One copy-up per inode at a time (`Inode::copy_up`); others
//! wait and find the upper in place.
//!
//! Data is copied in chunks of `CHUNK` bytes. Between two chunks a long
//! copy asks its `Halt` whether to go on: the adapter's copy pool
//! (`fuse::long`) stops a copy whose caller was killed, or that a pause of
//! writes is waiting for. A halted copy ends like a failed one: its temp
//! file is removed from the work dir and nothing appears in the upper.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

use super::inode::Inode;
use super::{err, Errno, Overlay, Result};
use crate::layer::ops::Upper;
use crate::layer::real::RealFd;
use crate::layer::sys::{self, Stat};

/// The most a copy moves between two `Halt` checks: at disk speed a few
/// tens of milliseconds, so a halt is noticed that quickly.
pub const CHUNK: u64 = 16 << 20;

/// Asked between chunks of a copy whether to abandon it.
pub trait Halt: Sync {
    /// True to stop the copy now; it then fails with `EINTR`.
    fn halt(&self) -> bool;
}

/// A copy that always runs to its end (copies on request threads: small
/// files, or copy-ups other operations need at once).
pub struct NoHalt;

impl Halt for NoHalt {
    fn halt(&self) -> bool {
        false
    }
}

/// The copy of the object named `name`: its caller's `Halt`, behind the
/// test hook that can hold a copy between chunks (`failpoint::hold`).
struct Checked<'a> {
    inner: &'a dyn Halt,
    name: &'a OsStr,
}

impl Halt for Checked<'_> {
    fn halt(&self) -> bool {
        crate::failpoint::hold("copy_chunk", self.name, || self.inner.halt()) || self.inner.halt()
    }
}

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
    pub(super) fn copy_up(&self, inode: &Arc<Inode>) -> Result<Arc<OwnedFd>> {
        self.copy_up_with(inode, Data::All)
    }

    pub(super) fn copy_up_with(&self, inode: &Arc<Inode>, data: Data) -> Result<Arc<OwnedFd>> {
        self.copy_up_halting(inode, data, &NoHalt)
    }

    /// `copy_up_with`, abandoning the data copy with `EINTR` (temp file
    /// removed, upper unchanged) as soon as `halt` says so.
    pub(super) fn copy_up_halting(
        &self,
        inode: &Arc<Inode>,
        data: Data,
        halt: &dyn Halt,
    ) -> Result<Arc<OwnedFd>> {
        // A removed directory is not brought back by a change made through
        // an fd still open on it (its name may hold another object now).
        if inode.removed.is_set() {
            return err(libc::ENOENT);
        }
        if let Some(u) = inode.upper_fd()? {
            return Ok(u);
        }
        self.check_writable()?;
        let parent = inode.parent().ok_or(Errno(libc::EIO))?;
        let parent_upper = self.copy_up_parents(&parent)?;
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
        let halt = Checked {
            inner: halt,
            name: &name,
        };
        let built = self
            .build_copy(&lower_fd, &st, &tmp, data, inode.is_dir(), &halt)
            .and_then(|_| self.record_origin(inode, &tmp, &st));
        crate::failpoint::hit("copy_up", &name);
        // The copy is this object before its name appears in the upper: a
        // lookup that finds it there must already get the object's id.
        let copy = built.and_then(|_| {
            let real = RealFd::new(
                sys::open_path(&self.upper.work, &tmp)?,
                &self.upper.layer.mount,
            );
            let ust = sys::fstat(real.get()?.as_ref())?;
            self.ids.alias(ust.st_dev, ust.st_ino, &real, inode.id);
            Ok((real, ust))
        });
        let result = copy.and_then(|(real, ust)| {
            match sys::renameat2(
                &self.upper.work,
                &tmp,
                parent_upper.as_ref(),
                &name,
                sys::RENAME_NOREPLACE,
            ) {
                Ok(()) => Ok(real),
                Err(e) => {
                    self.ids.unalias(ust.st_dev, ust.st_ino);
                    Err(Errno::from(e))
                }
            }
        });
        let real = match result {
            Ok(real) => real,
            Err(e) => {
                let _ = crate::layer::walk::remove_tree(&self.upper.work, &tmp);
                self.quota.refund_copy_up(&st);
                if e.0 == libc::EINTR {
                    tracing::info!(path = %self.path_of(inode), "copy-up abandoned");
                } else {
                    tracing::warn!(path = %self.path_of(inode), "copy-up failed: {e}");
                }
                return Err(e);
            }
        };
        // Copying up changed the upper parent's times; the object's parent
        // did not change as seen through the mount.
        if let Some(pst) = pst {
            let _ = sys::futimens(parent_upper.as_ref(), &times_of(&pst));
        }
        let fd = real.get()?;
        inode.real.write().upper = Some(real);
        super::events::note(super::events::Note::CopyUp {
            path: self.path_of(inode),
        });
        Ok(fd)
    }

    /// Copies up directory `dir` and every ancestor still without an upper
    /// copy, top down, in a loop: a lower tree may be thousands of levels
    /// deep, deeper than a worker thread's stack would allow recursing.
    /// Each `copy_up_with` below finds its own parent already copied up.
    fn copy_up_parents(&self, dir: &Arc<Inode>) -> Result<Arc<OwnedFd>> {
        let mut missing = Vec::new();
        let mut cur = dir.clone();
        loop {
            if let Some(u) = cur.upper_fd()? {
                if missing.is_empty() {
                    return Ok(u);
                }
                break;
            }
            let Some(parent) = cur.parent() else {
                // The root always has its upper: this cannot happen.
                tracing::error!(path = %self.path_of(&cur), "copy-up: no parent and no upper");
                return err(libc::EIO);
            };
            missing.push(cur);
            cur = parent;
        }
        let mut upper = None;
        for d in missing.iter().rev() {
            upper = Some(self.copy_up_with(d, Data::All)?);
        }
        upper.ok_or(Errno(libc::EIO))
    }

    /// Builds the copy of the lower object `lower` as `tmp` in the work dir.
    fn build_copy(
        &self,
        lower: &OwnedFd,
        st: &Stat,
        tmp: &OsStr,
        data: Data,
        is_dir: bool,
        halt: &dyn Halt,
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
                    copy_data(&src, &dst, st.st_size as u64, halt)?;
                }
                // Owner before xattrs: a chown drops security.capability.
                self.own(&dst, Some(st.st_uid), Some(st.st_gid))?;
                copy_xattrs(lower, &dst, fmt)?;
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
        self.own(&target, Some(st.st_uid), Some(st.st_gid))?;
        copy_xattrs(lower, &target, fmt)?;
        sys::fchmod(&target, perm)?;
        sys::futimens(&target, &times_of(st))?;
        Ok(())
    }
}

/// Copies the first `len` bytes of `src` into the empty `dst`, keeping
/// holes: `dst` is given its size first (so a trailing hole stays one),
/// then only the data segments `SEEK_DATA`/`SEEK_HOLE` report are copied.
/// A 5 GiB sparse file with one written block copies as that one block,
/// not 5 GiB of zeros. Where the source cannot report holes, it is copied
/// whole.
fn copy_data(src: &OwnedFd, dst: &OwnedFd, len: u64, halt: &dyn Halt) -> Result<()> {
    sys::ftruncate(dst, len)?;
    let mut off = 0u64;
    while off < len {
        let data = match sys::lseek(src, off as i64, libc::SEEK_DATA) {
            Ok(d) => d as u64,
            // No data after `off`: the rest is a hole, already in place.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                return copy_range(src, dst, off, len, halt);
            }
            Err(e) => return Err(e.into()),
        };
        if data >= len {
            return Ok(());
        }
        let hole = match sys::lseek(src, data as i64, libc::SEEK_HOLE) {
            Ok(h) => (h as u64).min(len),
            Err(_) => len,
        };
        copy_range(src, dst, data, hole, halt)?;
        off = hole;
    }
    Ok(())
}

/// Copies bytes `from..to` of `src` to the same offsets of `dst`,
/// in-kernel where the filesystems allow it, `CHUNK` bytes at a time,
/// asking `halt` before each chunk.
fn copy_range(src: &OwnedFd, dst: &OwnedFd, from: u64, to: u64, halt: &dyn Halt) -> Result<()> {
    let mut soff = from as i64;
    let mut doff = from as i64;
    while (soff as u64) < to {
        if halt.halt() {
            return err(libc::EINTR);
        }
        let want = (to - soff as u64).min(CHUNK) as usize;
        match sys::copy_file_range(src, &mut soff, dst, &mut doff, want) {
            // The source shrank under us: what is left stays a hole.
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
                let mut since_check = 0u64;
                while (soff as u64) < to {
                    if since_check >= CHUNK {
                        if halt.halt() {
                            return err(libc::EINTR);
                        }
                        since_check = 0;
                    }
                    let want = ((to - soff as u64) as usize).min(buf.len());
                    let n = sys::pread(src, &mut buf[..want], soff as u64)?;
                    if n == 0 {
                        return Ok(());
                    }
                    let mut done = 0;
                    while done < n {
                        done += sys::pwrite(dst, &buf[done..n], doff as u64 + done as u64)?;
                    }
                    soff += n as i64;
                    doff += n as i64;
                    since_check += n as u64;
                }
                return Ok(());
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
