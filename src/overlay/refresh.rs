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

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use super::inode::{Inode, Real, ROOT_ID};
use super::{Overlay, OverlayError};
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

/// The objects the kernel holds, as the tree their last-seen names make:
/// found by name from the root, and each directory's held children. Built
/// in one pass over the inode table; finding a path costs one step per
/// component and what lies below a path is walked breadth-first, so no
/// path string is built per inode and nothing recurses over the depth
/// (a tree of 20,000 levels held by the kernel is 20,000 inodes).
pub struct Held {
    all: Vec<Arc<Inode>>,
    root: Option<Arc<Inode>>,
    by_name: HashMap<(u64, OsString), Arc<Inode>>,
    children: HashMap<u64, Vec<Arc<Inode>>>,
}

/// Where a path led in the held tree.
pub struct Found {
    /// The held directory holding the last component reached, and that
    /// component: the deepest name the kernel may cache on the way.
    pub parent: Option<(Arc<Inode>, OsString)>,
    /// Whether `parent` holds the path's last component (every directory
    /// on the way is held).
    pub whole: bool,
    /// The object at the whole path, when the kernel holds it.
    pub target: Option<Arc<Inode>>,
}

impl Held {
    pub fn new(ov: &Overlay) -> Held {
        let mut by_name = HashMap::new();
        let mut children: HashMap<u64, Vec<Arc<Inode>>> = HashMap::new();
        let mut root = None;
        let all = ov.inodes.all();
        // Each object is linked under its parent; a parent the table no
        // longer holds (an object can outlive the kernel's lookups of its
        // parent) is linked under its own in turn, each object once.
        let mut linked = std::collections::HashSet::new();
        for inode in &all {
            let mut cur = inode.clone();
            while linked.insert(Arc::as_ptr(&cur)) {
                let (parent, name) = {
                    let loc = cur.loc.read();
                    (loc.parent.clone(), loc.name.clone())
                };
                let Some(p) = parent else {
                    if cur.id == ROOT_ID {
                        root = Some(cur.clone());
                    }
                    break;
                };
                children.entry(p.id).or_default().push(cur.clone());
                by_name.insert((p.id, name), cur.clone());
                cur = p;
            }
        }
        Held {
            all,
            root,
            by_name,
            children,
        }
    }

    /// Follows `rel` ("a/b"; "" or "." is the root) from the root by names.
    pub fn find(&self, rel: &[u8]) -> Found {
        let mut found = Found {
            parent: None,
            whole: true,
            target: self.root.clone(),
        };
        for comp in rel
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
        {
            let Some(cur) = found.target.take() else {
                found.whole = false;
                break;
            };
            let name = OsStr::from_bytes(comp).to_os_string();
            found.target = self.by_name.get(&(cur.id, name.clone())).cloned();
            found.parent = Some((cur, name));
        }
        found
    }

    /// Every held object, children before their parents: the order in
    /// which to drop the kernel's names (dropping one makes the kernel walk
    /// all it caches below it; top down over a held chain of N directories
    /// that costs N²/2 steps, bottom up N).
    /// (Objects not reached from the root by their last-seen names, if
    /// any, come last.)
    pub fn children_first(&self) -> Vec<Arc<Inode>> {
        let mut out = self.below(self.root.as_slice());
        out.reverse();
        let seen: std::collections::HashSet<u64> = out.iter().map(|i| i.id).collect();
        out.extend(self.all.iter().filter(|i| !seen.contains(&i.id)).cloned());
        out
    }

    /// `targets` and every held object below them, each once, parents
    /// before children.
    pub fn below(&self, targets: &[Arc<Inode>]) -> Vec<Arc<Inode>> {
        let mut seen = std::collections::HashSet::new();
        let mut out: Vec<Arc<Inode>> = Vec::new();
        for t in targets {
            if seen.insert(t.id) {
                out.push(t.clone());
            }
        }
        let mut i = 0;
        while i < out.len() {
            if let Some(kids) = self.children.get(&out[i].id) {
                for k in kids {
                    if seen.insert(k.id) {
                        out.push(k.clone());
                    }
                }
            }
            i += 1;
        }
        out
    }
}

impl Overlay {
    /// Re-resolves every inode at or beneath `changed` (paths relative to
    /// the root) and returns what the kernel must invalidate.
    pub fn refresh_paths(&self, changed: &[OsString]) -> Invalidations {
        let mut inv = Invalidations::default();
        if changed.is_empty() {
            return inv;
        }
        let held = Held::new(self);
        let mut targets = Vec::new();
        for c in changed {
            let found = held.find(c.as_bytes());
            // The changed name's parent, when the kernel holds the whole
            // way to it: its listing and its entry for the name go.
            if let (Some((parent, name)), true) = (&found.parent, found.whole) {
                *parent.listing.lock() = None;
                inv.inodes.push(parent.id);
                inv.entries.push((parent.id, name.clone()));
            }
            targets.extend(found.target);
        }
        // Parents before children: a child resolves through its parent.
        for inode in held.below(&targets) {
            self.re_resolve(&inode);
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
    pub fn replace_upper_root(
        &self,
        root: std::os::fd::OwnedFd,
    ) -> std::result::Result<(), OverlayError> {
        let opaque = self.upper.is_opaque(&root);
        let mut lowers = Vec::new();
        if !opaque {
            for (i, l) in self.lowers().iter().enumerate() {
                let fd = sys::open_path(&l.root, OsStr::new(".")).map_err(|source| {
                    OverlayError::LowerRoot {
                        lower: l.path.clone(),
                        source,
                    }
                })?;
                lowers.push((i, RealFd::new(fd, &l.mount)));
            }
        }
        let real = Real {
            upper: Some(RealFd::new(root, &self.upper.layer.mount)),
            lowers,
            opaque,
            lower_path: Some(super::inode::LowerPath::root()),
        };
        let inode = self.inode(ROOT_ID).map_err(OverlayError::RootGone)?;
        *inode.real.write() = real;
        *inode.listing.lock() = None;
        self.watch_dir(&inode);
        Ok(())
    }

    /// Re-resolves what `inode` stands on now, at its last-seen name: the
    /// one rule for an inode whose layers changed outside a request (a
    /// reset, gc, restore or checkpoint here; the control socket's
    /// `invalidate` in `fuse::invalidate`). Its listing and its last-seen
    /// attributes are dropped; an object of the same type at its path is
    /// what it stands on from now; otherwise it is emptied (as a file
    /// deleted while open: only handles already open use it). Parents
    /// first: a child resolves through its parent.
    ///
    /// A file whose data file is passed through (`IoState::
    /// passthrough_opens`) is held by the kernel as that node's backing
    /// file until its last such handle is released, and the kernel allows
    /// one backing file per node: if the data file behind the name is now
    /// another one, or the same one in another role (an upper file frozen
    /// into a checkpoint's layer), the node is emptied as a file deleted
    /// while open, and the name becomes a new object at its next lookup
    /// (`detach`). Its readers read on what they opened; new opens, and
    /// writes, reach the file the view shows.
    pub fn re_resolve(&self, inode: &Arc<Inode>) {
        *inode.listing.lock() = None;
        inode.io.lock().last_seen = None;
        let Some(parent) = inode.parent() else {
            // The root: its upper stays; its lowers are unchanged.
            return;
        };
        let name = inode.loc.read().name.clone();
        let fresh = match self.resolve(&parent, &name) {
            Ok(Some(r)) if r.st.st_mode & libc::S_IFMT == inode.kind => {
                // A directory removed before stands on this one now.
                inode.removed.clear();
                if self.passed_through_elsewhere(inode, &r.real) {
                    self.detach(inode, &r);
                    Real::default()
                } else {
                    r.real
                }
            }
            Ok(_) => Real::default(),
            Err(e) => {
                tracing::warn!(path = %self.path_of(inode), "cannot re-resolve after the layers changed: {e}");
                Real::default()
            }
        };
        *inode.real.write() = fresh;
        if inode.is_dir() {
            self.watch_dir(inode);
        }
    }

    /// Whether `inode`'s handles pass a data file through that is not
    /// `fresh`'s, in the same role (see `re_resolve`).
    fn passed_through_elsewhere(&self, inode: &Inode, fresh: &Real) -> bool {
        if inode.io.lock().passthrough_opens == 0 {
            return false;
        }
        let cur = inode.real.read();
        match (cur.identity(), fresh.identity()) {
            (Some(a), Some(b)) => !a.same_file(b) || cur.upper.is_some() != fresh.upper.is_some(),
            // Emptied before (detached, or its file was gone): it stays so.
            _ => true,
        }
    }

    /// `inode` gives up the name it was last seen at (its data file was
    /// replaced under passthrough handles): the file now there must not
    /// find it by the file's id, so that id is renewed where it is
    /// `inode`'s (an alias; a derived id finds an emptied inode not to be
    /// the same object and reassigns by itself).
    fn detach(&self, inode: &Inode, r: &super::namei::Resolved) {
        tracing::debug!(
            path = %self.path_of(inode),
            id = inode.id,
            "the file behind a passed-through node changed: the name becomes a new object"
        );
        if let Some(file) = r.real.identity() {
            self.ids.renew(r.st.st_dev, r.st.st_ino, file, inode.id);
        }
    }
}
