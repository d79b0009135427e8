//! `RealFd`: the way the core holds on to a real file in a layer without
//! keeping a file descriptor open for every object the kernel knows.
//!
//! Each real file is remembered by its file handle (`name_to_handle_at`);
//! an `O_PATH` fd is kept in a bounded cache and reopened by handle
//! (`open_by_handle_at`) after eviction. The process may hold only so many
//! fds (`RLIMIT_NOFILE`), and a walk over a large tree makes the kernel
//! hold far more objects than that. Files without a handle (filesystems
//! that refuse them, FUSE lowers whose handles stop working once the
//! kernel forgets the object — see `netfs` — or a daemon without
//! `CAP_DAC_READ_SEARCH`) keep their fd pinned. How many fds the cache
//! and the pins may hold is set by the daemon's fd budget (`fds`).

use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;

use super::root::Mount;
use super::{fds, sys};

pub struct RealFd {
    handle: Option<Box<[u8]>>,
    /// The fd is kept open for good (see `pin`): not in the cache's count.
    pinned: std::sync::atomic::AtomicBool,
    /// The layer's root, for `open_by_handle_at`.
    mount: Arc<Mount>,
    slot: Mutex<Option<Arc<OwnedFd>>>,
}

impl std::fmt::Debug for RealFd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RealFd(cached: {})", self.slot.lock().is_some())
    }
}

/// The ring of admitted `RealFd`s, oldest first; how many fds it holds
/// is `fds::CACHED`, the budget's count.
struct FdCache {
    ring: Mutex<VecDeque<Weak<RealFd>>>,
}

fn cache() -> &'static FdCache {
    static CACHE: OnceLock<FdCache> = OnceLock::new();
    CACHE.get_or_init(|| FdCache {
        ring: Mutex::new(VecDeque::new()),
    })
}

impl FdCache {
    fn admit(&self, r: &Arc<RealFd>) {
        let mut ring = self.ring.lock();
        ring.push_back(Arc::downgrade(r));
        let open = fds::CACHED.fetch_add(1, Ordering::AcqRel) + 1;
        // Half the fd limit (see `fds`), read again as the limit changes.
        let limit = fds::cache_limit();
        if open > limit {
            let target = limit * 9 / 10;
            while fds::CACHED.load(Ordering::Acquire) > target {
                let Some(w) = ring.pop_front() else { break };
                if let Some(victim) = w.upgrade() {
                    if Arc::ptr_eq(&victim, r) {
                        ring.push_back(w);
                        continue;
                    }
                    // A pinned fd leaves the ring for good (checked under
                    // the slot lock, which `pin` holds while pinning).
                    let mut slot = victim.slot.lock();
                    if !victim.pinned.load(Ordering::Acquire) && slot.take().is_some() {
                        fds::CACHED.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            }
        }
        // Entries of dropped or already evicted fds pile up: compact.
        if ring.len() > 2 * limit.max(1024) {
            ring.retain(|w| {
                w.upgrade()
                    .is_some_and(|r| r.slot.lock().is_some() && !r.pinned.load(Ordering::Acquire))
            });
        }
    }
}

impl RealFd {
    /// Wraps an `O_PATH` fd of a real file on the layer of `mount`.
    pub fn new(fd: OwnedFd, mount: &Arc<Mount>) -> Arc<RealFd> {
        let handle = if mount.handles {
            sys::name_to_handle(&fd).ok()
        } else {
            None
        };
        let evictable = handle.is_some();
        let r = Arc::new(RealFd {
            handle,
            pinned: std::sync::atomic::AtomicBool::new(false),
            mount: mount.clone(),
            slot: Mutex::new(Some(Arc::new(fd))),
        });
        if evictable {
            cache().admit(&r);
        } else {
            fds::UNEVICTABLE.fetch_add(1, Ordering::AcqRel);
        }
        r
    }

    /// The `O_PATH` fd, reopened by handle if it was evicted. ESTALE when
    /// the file no longer exists.
    ///
    /// A request running without network lowers (`reach::Pass::Without`)
    /// gets `ETIMEDOUT` for a file on one, before any system call.
    pub fn get(self: &Arc<Self>) -> io::Result<Arc<OwnedFd>> {
        if self.mount.remote && super::reach::without_network() {
            return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
        }
        if let Some(fd) = self.slot.lock().as_ref() {
            return Ok(fd.clone());
        }
        let handle = self
            .handle
            .as_ref()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ESTALE))?;
        let fd = Arc::new(sys::open_by_handle(&self.mount.fd, handle)?);
        {
            let mut slot = self.slot.lock();
            if let Some(existing) = slot.as_ref() {
                return Ok(existing.clone());
            }
            *slot = Some(fd.clone());
        }
        cache().admit(self);
        Ok(fd)
    }
}

impl RealFd {
    /// Whether `self` and `other` are the same real file. Handles carry the
    /// inode's generation, so a file whose inode number was recycled by
    /// the filesystem never compares equal to the file that had it before.
    /// Without handles both fds are pinned (never evicted), so the files
    /// they name are alive and (dev, ino) identifies them.
    pub fn same_file(self: &Arc<Self>, other: &Arc<RealFd>) -> bool {
        if Arc::ptr_eq(self, other) {
            return true;
        }
        match (&self.handle, &other.handle) {
            // Handles are unique only within one filesystem: compare them
            // within one layer (two layers on one filesystem sharing a file
            // through a hard link count as two files, the safe side).
            (Some(a), Some(b)) => a == b && Arc::ptr_eq(&self.mount, &other.mount),
            (None, None) => {
                let stat =
                    |r: &Arc<RealFd>| r.get().ok().and_then(|fd| sys::fstat(fd.as_ref()).ok());
                match (stat(self), stat(other)) {
                    (Some(a), Some(b)) => (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino),
                    _ => false,
                }
            }
            _ => false,
        }
    }

    /// Keeps `fd` — this file's open fd — for as long as `self` lives. For
    /// a file about to lose its last link while the kernel still holds the
    /// object: like a local filesystem, the removed file then stays
    /// readable through the descriptors that hold it (its handle could no
    /// longer be opened), and its inode number is not recycled meanwhile.
    ///
    /// Pinned fds are bounded (`fds::pin_limit`): a caller could otherwise
    /// hold any number of objects (an `O_PATH` descriptor each, no open
    /// file needed) and wait for them to be removed. Beyond the bound the
    /// fd is not pinned (false): it stays in the cache, evictable. While an
    /// open file handle holds the removed file (each keeps an fd of its
    /// own, `overlay::file`) the file is still reopened by its handle
    /// (ext4 reopens a removed file that is still open: checked); once
    /// none does, the object answers `ESTALE`.
    pub fn pin(&self, fd: Arc<OwnedFd>) -> bool {
        let mut slot = self.slot.lock();
        if self.pinned.load(Ordering::Acquire) {
            return true;
        }
        if self.handle.is_some() {
            if fds::PINNED.fetch_add(1, Ordering::AcqRel) >= fds::pin_limit() {
                fds::PINNED.fetch_sub(1, Ordering::AcqRel);
                tracing::debug!(
                    "removed file not pinned: {} fds pinned already",
                    fds::pin_limit()
                );
                return false;
            }
            if slot.is_some() {
                fds::CACHED.fetch_sub(1, Ordering::AcqRel);
            }
        }
        *slot = Some(fd);
        self.pinned.store(true, Ordering::Release);
        true
    }

    /// Closes the cached fd now (unless pinned): for a directory just
    /// removed. A removed directory's fd, held open, keeps its dentry
    /// linked under its parent, and removing that parent then makes the
    /// kernel walk every removed directory still held below it: `rm -rf`
    /// of a chain N levels deep costs N²/2 steps. The next `get` reopens
    /// by handle, which answers ESTALE for a directory that is gone.
    pub fn release(&self) {
        if self.pinned.load(Ordering::Acquire) {
            return;
        }
        let mut slot = self.slot.lock();
        if slot.take().is_some() && self.handle.is_some() {
            fds::CACHED.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The file handle (generation included), when the filesystem gives one.
    pub fn handle(&self) -> Option<&[u8]> {
        self.handle.as_deref()
    }
}

impl Drop for RealFd {
    fn drop(&mut self) {
        if self.handle.is_none() {
            fds::UNEVICTABLE.fetch_sub(1, Ordering::AcqRel);
        } else if *self.pinned.get_mut() {
            fds::PINNED.fetch_sub(1, Ordering::AcqRel);
        } else if self.slot.get_mut().is_some() {
            fds::CACHED.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
