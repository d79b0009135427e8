//! Turns changes in watched lower directories into kernel cache
//! invalidations (see `overlay::watch` for what is watched and why). The
//! daemon's service thread polls the watch's fd and calls `drain` when it
//! is readable: the notifier must never be called from inside a request,
//! where the kernel may hold the very locks it needs.

use std::sync::atomic::Ordering;

use fuser::{INodeNo, Notifier};

use crate::layer::sys;
use crate::overlay::watch::Change;
use crate::overlay::Overlay;

/// Marks the watch live (from now on watched directories get the long
/// timeout) and returns the fd to poll; `None` without a watch.
pub fn start(ov: &Overlay) -> Option<std::os::fd::RawFd> {
    let w = ov.watch()?;
    w.set_live(true);
    Some(w.raw_fd())
}

/// Reads the pending lower changes (the fd polled readable, so the read
/// does not block) and applies them. Returns false once the inotify
/// instance failed: nothing counts as watched any more and lower entries
/// fall back to the short timeout.
pub fn drain(ov: &Overlay, n: &Notifier) -> bool {
    let Some(w) = ov.watch() else {
        return false;
    };
    match w.next_changes() {
        Ok(changes) => {
            for c in changes {
                apply(ov, n, c);
            }
            true
        }
        Err(e) => {
            tracing::warn!("lower watch failed: {e}; lower changes show after --lower-timeout");
            w.set_live(false);
            invalidate_all(ov, n);
            false
        }
    }
}

/// Drops a directory's kept listing and the kernel's cached attributes and
/// listing of it, after reading its lowers' mtime again (what its stat
/// reports while it is watched, `Overlay::read_lower_mtime`): the stat that
/// follows the invalidation must not be answered with the old one.
pub fn forget_listing(ov: &Overlay, n: &Notifier, dir: u64) {
    if let Some(d) = ov.inodes().get(dir) {
        ov.read_lower_mtime(&d);
        d.listing.lock().take();
    }
    // Offset 0, length 0: the attributes and every cached page (for a
    // directory, the cached listing).
    let _ = n.inval_inode(INodeNo(dir), 0, 0);
}

fn apply(ov: &Overlay, n: &Notifier, c: Change) {
    match c {
        Change::Overflow => {
            tracing::info!("lower watch overflowed; invalidating every cached name");
            invalidate_all(ov, n);
        }
        Change::Dir { dirs, gone } => {
            for d in dirs {
                let dir = ov.inodes().get(d);
                if let (true, Some(dir)) = (gone, &dir) {
                    // Unwatched from now on: its stat reads the lowers.
                    dir.watched.store(false, Ordering::Release);
                }
                forget_listing(ov, n, d);
                let Some(dir) = dir else {
                    continue;
                };
                if gone {
                    if let Some(p) = dir.parent() {
                        let name = dir.loc.read().name.clone();
                        let _ = n.inval_entry(INodeNo(p.id), &name);
                    }
                }
            }
        }
        Change::Entry { dirs, name, lower } => {
            // The objects the name now denotes in that lower, if the kernel
            // holds them (each name of a file with several links is one):
            // their attributes and cached data may be stale.
            let children: Vec<u64> = lower
                .and_then(|l| sys::fstatat(l.as_ref(), &name).ok())
                .map(|st| ov.ids().ids_of_file(st.st_dev, st.st_ino))
                .unwrap_or_default()
                .into_iter()
                .filter(|id| ov.inodes().get(*id).is_some())
                .collect();
            for d in dirs {
                forget_listing(ov, n, d);
                let _ = n.inval_entry(INodeNo(d), &name);
            }
            for id in children {
                let _ = n.inval_inode(INodeNo(id), 0, 0);
            }
        }
    }
}

/// Drops every name, attribute and listing the kernel caches, so the next
/// access asks the daemon again (after a policy reload or lost events).
pub fn invalidate_all(ov: &Overlay, n: &Notifier) -> usize {
    let mut dropped = 0;
    // Children first: see `Held::children_first`.
    for inode in crate::overlay::refresh::Held::new(ov).children_first() {
        if inode.is_dir() {
            forget_listing(ov, n, inode.id);
        }
        let Some(parent) = inode.parent() else {
            continue;
        };
        let name = inode.loc.read().name.clone();
        if n.inval_entry(INodeNo(parent.id), &name).is_ok() {
            dropped += 1;
        }
    }
    dropped
}
