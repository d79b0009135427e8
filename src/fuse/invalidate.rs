//! Invalidation of chosen paths on request (the control socket's
//! `invalidate`, after the upper was changed behind the mount, e.g. by a
//! reset): the kernel's cached names, attributes, pages and listings for
//! those paths and everything the kernel holds below them are dropped, and
//! the daemon's own record of their real files is re-resolved, so the next
//! access sees the layers as they are now.

use std::ffi::OsString;
use std::sync::Arc;

use fuser::{INodeNo, Notifier};

use super::watcher::forget_listing;
use crate::overlay::refresh::Held;
use crate::overlay::{Inode, Overlay};

/// Invalidates each path (relative to the mount root; `""` or `.` is the
/// root) and everything the kernel holds below it. Returns how many cached
/// objects were invalidated. Call from a thread that serves no request.
pub fn invalidate_paths(ov: &Overlay, n: &Notifier, paths: &[String]) -> usize {
    let held = Held::new(ov);
    let mut targets: Vec<Arc<Inode>> = Vec::new();
    let mut names: Vec<(u64, OsString)> = Vec::new();
    for path in paths {
        let found = held.find(path.as_bytes());
        // The entry (or a cached absence) of the path's last name in its
        // parent; where the kernel does not hold the way down, the
        // deepest name it may cache on it.
        if let Some((parent, name)) = found.parent {
            names.push((parent.id, name));
        }
        targets.extend(found.target);
    }
    // Each target and every held object below it is re-resolved, parents
    // before children, each against its parent's new state (the overlay's
    // rule, `Overlay::re_resolve`; an upper file removed behind the daemon
    // is dropped from its record rather than kept, as lookups keep an
    // upper fd they already have) ...
    let below = held.below(&targets);
    for inode in &below {
        ov.re_resolve(inode);
    }
    // ... and the kernel's entries are dropped children first: dropping a
    // name makes the kernel walk every cached name below it, so top down
    // over a chain of N directories would cost N²/2 steps (minutes, with
    // every other request on those names waiting) where bottom up costs N.
    let mut count = 0;
    for inode in below.iter().rev() {
        if let Some(parent) = inode.parent() {
            let name = inode.loc.read().name.clone();
            let _ = n.inval_entry(INodeNo(parent.id), &name);
        }
        if inode.is_dir() {
            forget_listing(ov, n, inode.id);
        } else {
            let _ = n.inval_inode(INodeNo(inode.id), 0, 0);
        }
        count += 1;
    }
    for (parent, name) in &names {
        let _ = n.inval_entry(INodeNo(*parent), name);
        forget_listing(ov, n, *parent);
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
    for inode in Held::new(ov).children_first() {
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
