//! Refreshing the inode table after the upper was changed under some paths
//! by the daemon itself outside a request (`layerfs reset`, `layerfs gc`).
//!
//! Invariant relied on: lookups never drop an upper file an inode already
//! has (a copy-up may have finished meanwhile), so after the upper copy of
//! a path was removed, its inode (and every inode beneath it) must be
//! re-resolved here, or it would keep serving the removed file. An inode
//! whose path no longer resolves to an object of its type is emptied: the
//! kernel's entry for it is invalidated, so only handles already open use
//! it, as with a file deleted while open.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use super::inode::{Inode, Real, ROOT_ID};
use super::Overlay;
use crate::layer::real::RealFd;
use crate::layer::sys;

/// What the kernel must forget after a refresh.
#[derive(Debug, Default)]
pub struct Invalidations {
    /// (parent node id, name): cached names to drop.
    pub entries: Vec<(u64, OsString)>,
    /// Node ids whose attributes, pages and listings to drop.
    pub inodes: Vec<u64>,
}

fn at_or_under(p: &[u8], dir: &[u8]) -> bool {
    dir.is_empty() || p == dir || (p.starts_with(dir) && p.get(dir.len()) == Some(&b'/'))
}

impl Overlay {
    /// Re-resolves every inode at or beneath `changed` (paths relative to
    /// the root) and returns what the kernel must invalidate.
    pub fn refresh_paths(&self, changed: &[OsString]) -> Invalidations {
        let mut inv = Invalidations::default();
        if changed.is_empty() {
            return inv;
        }
        let mut held: Vec<(String, Arc<Inode>)> = self
            .inodes
            .all()
            .into_iter()
            .map(|i| (self.path_of(&i), i))
            .collect();
        // Parents before children: a child resolves through its parent.
        held.sort_by(|a, b| a.0.len().cmp(&b.0.len()).then(a.0.cmp(&b.0)));
        for (path, inode) in &held {
            let p = path.as_bytes();
            let is_parent_of_changed = changed.iter().any(|c| {
                let c = c.as_bytes();
                let parent = c
                    .iter()
                    .rposition(|&b| b == b'/')
                    .map_or(&c[..0], |i| &c[..i]);
                !c.is_empty() && parent == p
            });
            if is_parent_of_changed {
                *inode.listing.lock() = None;
                inv.inodes.push(inode.id);
                for c in changed {
                    let c = c.as_bytes();
                    let (parent, name) = match c.iter().rposition(|&b| b == b'/') {
                        Some(i) => (&c[..i], &c[i + 1..]),
                        None => (&c[..0], c),
                    };
                    if parent == p && !c.is_empty() {
                        inv.entries
                            .push((inode.id, OsStr::from_bytes(name).to_os_string()));
                    }
                }
            }
            if !changed.iter().any(|c| at_or_under(p, c.as_bytes())) {
                continue;
            }
            self.re_resolve(inode);
            inv.inodes.push(inode.id);
        }
        if self.quota.limited() {
            if let Err(e) = self.upper_root().and_then(|r| self.quota.scan(r.as_ref())) {
                tracing::warn!("cannot re-measure upper usage after a reset: {e}");
            }
        }
        inv
    }

    /// The upper's root directory as served now (`O_PATH`). Not
    /// `upper.layer.root`, which stays the directory that was the upper at
    /// mount time: a live restore replaces the upper by another directory
    /// (`replace_upper_root`).
    pub fn upper_root(&self) -> std::io::Result<Arc<std::os::fd::OwnedFd>> {
        let root = self
            .inode(ROOT_ID)
            .map_err(|e| std::io::Error::from_raw_os_error(e.0))?;
        let upper = root.upper();
        match upper {
            Some(u) => u.get(),
            None => Err(std::io::Error::from_raw_os_error(libc::ESTALE)),
        }
    }

    /// Makes `root` (an `O_PATH` fd of a directory on the upper's
    /// filesystem, now at the upper's path) the upper's root: the root
    /// object's real files are resolved again from it (its opaque mark
    /// decides whether the lower roots are merged). Every other held
    /// inode must then be re-resolved (`refresh_paths(&[""])`). Call with
    /// writes paused.
    pub fn replace_upper_root(&self, root: std::os::fd::OwnedFd) -> Result<(), String> {
        let opaque = self.upper.is_opaque(&root);
        let mut lowers = Vec::new();
        if !opaque {
            for (i, l) in self.lowers.iter().enumerate() {
                let fd = sys::open_path(&l.root, OsStr::new("."))
                    .map_err(|e| format!("cannot open {}: {e}", l.path.display()))?;
                lowers.push((i, RealFd::new(fd, &l.mount)));
            }
        }
        let real = Real {
            upper: Some(RealFd::new(root, &self.upper.layer.mount)),
            lowers,
            opaque,
            lower_path: Some(String::new()),
        };
        let inode = self
            .inode(ROOT_ID)
            .map_err(|e| format!("the root object is gone: {e}"))?;
        *inode.real.write() = real;
        *inode.listing.lock() = None;
        self.watch_dir(&inode);
        Ok(())
    }

    fn re_resolve(&self, inode: &Arc<Inode>) {
        *inode.listing.lock() = None;
        let Some(parent) = inode.parent() else {
            // The root: its upper stays; its lowers are unchanged.
            return;
        };
        let name = inode.loc.read().name.clone();
        let fresh = match self.resolve(&parent, &name) {
            Ok(Some(r)) if r.st.st_mode & libc::S_IFMT == inode.kind => r.real,
            Ok(_) => Real::default(),
            Err(e) => {
                tracing::warn!(path = %self.path_of(inode), "cannot re-resolve after a reset: {e}");
                Real::default()
            }
        };
        *inode.real.write() = fresh;
        if inode.is_dir() {
            self.watch_dir(inode);
        }
    }
}
