//! Upper usage limits (`quota bytes=… inodes=…`): bytes and inodes used in
//! the upper are counted (measured once at mount, then kept up to date by
//! the operations that change them); a change that would go beyond a
//! limit fails with EDQUOT and the daemon keeps serving.

use std::sync::atomic::{AtomicI64, Ordering};

use parking_lot::RwLock;

use super::{Errno, Result};
use crate::layer::sys::{self, Stat};
use crate::policy::Quota;

pub struct Usage {
    limits: RwLock<Quota>,
    bytes: AtomicI64,
    inodes: AtomicI64,
}

impl Usage {
    pub fn new(limits: Quota) -> Usage {
        Usage {
            limits: RwLock::new(limits),
            bytes: AtomicI64::new(0),
            inodes: AtomicI64::new(0),
        }
    }

    pub fn set_limits(&self, q: Quota) {
        *self.limits.write() = q;
    }

    pub fn limited(&self) -> bool {
        let l = self.limits.read();
        l.bytes.is_some() || l.inodes.is_some()
    }

    /// (bytes, inodes) the upper holds, as counted (only kept while limited).
    pub fn used(&self) -> (u64, u64) {
        (
            self.bytes.load(Ordering::Relaxed).max(0) as u64,
            self.inodes.load(Ordering::Relaxed).max(0) as u64,
        )
    }

    pub fn limits(&self) -> Quota {
        *self.limits.read()
    }

    pub fn bytes_limited(&self) -> bool {
        self.limits.read().bytes.is_some()
    }

    /// Counts what the upper holds now (whiteouts are free); `root` is
    /// the upper's root directory (`Overlay::upper_root`: a live restore
    /// replaces it).
    pub fn scan(&self, root: &impl std::os::fd::AsFd) -> std::io::Result<()> {
        let mut bytes = 0i64;
        let mut inodes = 0i64;
        let mut w = crate::layer::walk::Walker::new(root)?;
        while let Some(step) = w.step()? {
            let crate::layer::walk::Step::Entry(e) = step else {
                continue;
            };
            let st = sys::fstatat(w.dir()?, &e.name)?;
            if crate::layer::ops::is_whiteout(&st) {
                continue;
            }
            inodes += 1;
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                w.descend(&e.name)?;
            } else if st.st_mode & libc::S_IFMT == libc::S_IFREG {
                bytes += st.st_size;
            }
        }
        self.bytes.store(bytes, Ordering::Relaxed);
        self.inodes.store(inodes, Ordering::Relaxed);
        Ok(())
    }

    fn charge(counter: &AtomicI64, limit: Option<u64>, delta: i64) -> Result<()> {
        let Some(limit) = limit else {
            counter.fetch_add(delta, Ordering::Relaxed);
            return Ok(());
        };
        let prev = counter.fetch_add(delta, Ordering::AcqRel);
        if delta > 0 && prev + delta > limit as i64 {
            counter.fetch_sub(delta, Ordering::AcqRel);
            return Err(Errno(libc::EDQUOT));
        }
        Ok(())
    }

    pub fn charge_inode(&self) -> Result<()> {
        let l = self.limits.read().inodes;
        Self::charge(&self.inodes, l, 1)
    }

    pub fn refund_inode(&self) {
        self.inodes.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn charge_copy_up(&self, st: &Stat) -> Result<()> {
        self.charge_inode()?;
        if st.st_mode & libc::S_IFMT == libc::S_IFREG {
            let l = self.limits.read().bytes;
            if let Err(e) = Self::charge(&self.bytes, l, st.st_size) {
                self.refund_inode();
                return Err(e);
            }
        }
        Ok(())
    }

    pub fn refund_copy_up(&self, st: &Stat) {
        self.release(st);
    }

    /// A file grows or shrinks from `old` to `new` bytes.
    pub fn charge_resize(&self, old: u64, new: u64) -> Result<()> {
        let l = self.limits.read().bytes;
        Self::charge(&self.bytes, l, new as i64 - old as i64)
    }

    /// An upper object went away.
    pub fn release(&self, st: &Stat) {
        if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_nlink > 1 {
            return;
        }
        self.inodes.fetch_sub(1, Ordering::Relaxed);
        if st.st_mode & libc::S_IFMT == libc::S_IFREG {
            self.bytes.fetch_sub(st.st_size, Ordering::Relaxed);
        }
    }
}
