//! Invalidation of chosen paths on request (the control socket's
//! `invalidate`, after the upper was changed behind the mount, e.g. by a
//! reset): the kernel's cached names, attributes, pages and listings for
//! those paths and everything the kernel holds below them are dropped, and
//! the daemon's own record of their real files is re-resolved, so the next
//! access sees the layers as they are now.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::sync::Arc;

use fuser::{INodeNo, Notifier};

use super::watcher::forget_listing;
use crate::overlay::{Inode, Overlay, ROOT_ID};

/// The objects the kernel holds, by (parent id, name).
fn held_children(ov: &Overlay) -> HashMap<(u64, OsString), Arc<Inode>> {
    let mut index = HashMap::new();
    for inode in ov.inodes.all() {
        let loc = inode.loc.read().clone();
        if let Some(p) = loc.parent {
            index.insert((p.id, loc.name), inode.clone());
        }
    }
    index
}

/// Re-resolves what `inode` (held by the kernel at `name` in `parent`)
/// stands on now. An upper file removed behind the daemon is dropped
/// from its record rather than kept (lookups otherwise keep an upper fd
/// they already have, see `Overlay::instantiate`).
fn refresh(ov: &Overlay, parent: &Arc<Inode>, name: &OsStr, inode: &Inode) {
    if let Ok(Some(r)) = ov.resolve(parent, name) {
        if ov.known_id(parent, name, &r) == inode.id {
            *inode.real.write() = r.real;
        }
    }
    inode.io.lock().last_seen = None;
    inode.listing.lock().take();
}

/// Invalidates each path (relative to the mount root; `""` or `.` is the
/// root) and everything the kernel holds below it. Returns how many cached
/// objects were invalidated. Call from a thread that serves no request.
pub fn invalidate_paths(ov: &Overlay, n: &Notifier, paths: &[String]) -> usize {
    let index = held_children(ov);
    let Some(root) = ov.inodes.get(ROOT_ID) else {
        return 0;
    };
    let mut targets: Vec<Arc<Inode>> = Vec::new();
    let mut count = 0;
    for path in paths {
        let comps: Vec<&str> = path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        let mut cur = root.clone();
        let mut found = true;
        for (i, comp) in comps.iter().enumerate() {
            let name = OsStr::new(comp);
            // The entry (or a cached absence) of this name in its parent.
            if i + 1 == comps.len() {
                let _ = n.inval_entry(INodeNo(cur.id), name);
                forget_listing(ov, n, cur.id);
                count += 1;
            }
            match index.get(&(cur.id, name.to_os_string())) {
                Some(child) => cur = child.clone(),
                None => {
                    if i + 1 < comps.len() {
                        // Not held below here: only the name in its parent.
                        let _ = n.inval_entry(INodeNo(cur.id), name);
                        forget_listing(ov, n, cur.id);
                        count += 1;
                    }
                    found = false;
                    break;
                }
            }
        }
        if found {
            targets.push(cur);
        }
    }
    // Each target and every held object below it, parents before children
    // so each is re-resolved against its parent's new state.
    let mut below: Vec<(usize, Arc<Inode>)> = Vec::new();
    for inode in ov.inodes.all() {
        let mut depth = 0;
        let mut cur = Some(inode.clone());
        while let Some(c) = cur {
            if targets.iter().any(|t| t.id == c.id) {
                below.push((depth, inode.clone()));
                break;
            }
            depth += 1;
            cur = c.parent();
        }
    }
    below.sort_by_key(|(d, _)| *d);
    for (_, inode) in &below {
        if let Some(parent) = inode.parent() {
            let name = inode.loc.read().name.clone();
            refresh(ov, &parent, &name, inode);
            let _ = n.inval_entry(INodeNo(parent.id), &name);
        }
        if inode.is_dir() {
            forget_listing(ov, n, inode.id);
        } else {
            let _ = n.inval_inode(INodeNo(inode.id), 0, 0);
        }
        count += 1;
    }
    count
}

/// After the whole upper was replaced (a live restore): drops every name,
/// attribute, page and listing the kernel holds for any object, and the
/// names in `names` ((directory id, name): what the kernel may hold as
/// absent, which no inode records). The daemon's inodes were re-resolved
/// beforehand, with writes paused; nothing is re-resolved here, since
/// writes go on meanwhile. Returns how many objects were invalidated.
pub fn invalidate_everything(ov: &Overlay, n: &Notifier, names: &[(u64, OsString)]) -> usize {
    let mut count = 0;
    for inode in ov.inodes.all() {
        inode.io.lock().last_seen = None;
        if inode.is_dir() {
            forget_listing(ov, n, inode.id);
        } else {
            let _ = n.inval_inode(INodeNo(inode.id), 0, 0);
        }
        if let Some(parent) = inode.parent() {
            let name = inode.loc.read().name.clone();
            let _ = n.inval_entry(INodeNo(parent.id), &name);
        }
        count += 1;
    }
    for (dir, name) in names {
        if n.inval_entry(INodeNo(*dir), name).is_ok() {
            count += 1;
        }
    }
    count
}
