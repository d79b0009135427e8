//! Policy glue: where each core operation asks the path policy, and the
//! always-on name checks. Every denial is logged at `info` with the
//! operation, the path, the rule and the caller's pid.
//!
//! Moves (DESIGN.md §4): a path's class never changes by moving it or an
//! ancestor. A rename (either side of an exchange) or a link is refused
//! when an existing object whose path changes would be classed otherwise
//! at its new path, or a symlink contained where it stood would escape
//! from its new place (`move_guard`, which walks what a directory move
//! moves); the rule does not follow the object.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::inode::Inode;
use super::origin::Origin;
use super::{Ctx, Errno, Overlay, Result};
use crate::policy::RuleRef;

/// A name is one path component: never empty, `.`, `..`, nor containing
/// `/` or NUL, whatever the policy says.
pub fn check_name(name: &OsStr) -> Result<()> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') || b.contains(&0) {
        return Err(Errno(libc::EINVAL));
    }
    if b.len() > 255 {
        return Err(Errno(libc::ENAMETOOLONG));
    }
    Ok(())
}

/// The kind of change an operation makes, for messages.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    Create,
    Write,
    SetAttr,
    SetXattr,
    Unlink,
    Rename,
    Link,
    Symlink,
    Mknod,
}

/// Serializes the directory moves that must look at what they move
/// against everything that adds a name to the tree.
///
/// Invariant: a move whose check walks the moved subtree (`guard_move`
/// answered `MoveCheck::Walk`) holds this lock exclusively from before the
/// walk until its rename is done; every operation that adds a name
/// (create, mkdir, mknod, symlink, link, and every rename) holds it shared
/// from before its policy checks until the name exists. So nothing
/// appears in a subtree between the walk that checked it and the rename
/// that moves it (say a symlink made at depth 4 after the walk, which the
/// move then lifts out of the workspace). Shared, uncontended, it costs an
/// atomic; exclusive, it is held only by moves that need a walk (the
/// policy could not prove the move harmless from the paths alone).
///
/// An operation takes it once, never nested (a nested shared take could
/// wait behind a waiting exclusive one that waits for the outer: a
/// deadlock), and inside the write gate (`gate`), never around it.
#[derive(Default)]
pub struct MoveLock {
    lock: RwLock<()>,
}

impl MoveLock {
    /// Held by an operation that adds a name, or a move that needs no walk.
    pub fn adding(&self) -> RwLockReadGuard<'_, ()> {
        self.lock.read()
    }

    /// `adding`, unless a move's walk holds the lock.
    pub fn try_adding(&self) -> Option<RwLockReadGuard<'_, ()>> {
        self.lock.try_read()
    }

    /// Held by a move that walks what it moves.
    pub fn walking(&self) -> RwLockWriteGuard<'_, ()> {
        self.lock.write()
    }
}

/// What a move's check found (`Overlay::guard_move`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveCheck {
    /// The move keeps every class and every symlink contained.
    Allowed,
    /// Only a walk of the moved subtree can tell, and the caller does not
    /// hold the move lock exclusively: take it and check again.
    Walk,
}

pub fn deny(ctx: &Ctx, op: Op, path: &str, rule: &RuleRef, errno: i32) -> Errno {
    tracing::info!(op = ?op, path, rule = %rule, pid = ctx.pid, errno, "policy denied");
    let (path, rule) = (path.to_string(), rule.to_string());
    super::events::note(super::events::Note::Denied { path, rule, errno });
    Errno(errno)
}

impl Overlay {
    /// Whether `name` in `parent` is hidden by the policy.
    pub(super) fn is_hidden_child(&self, parent: &Inode, name: &OsStr) -> bool {
        let policy = self.policy();
        if !policy.has_path_rules() {
            return false;
        }
        policy
            .classify(&self.child_path(parent, name))
            .hidden
            .is_some()
    }

    /// Whether `name` in directory `parent_id` is hidden by the policy.
    pub fn hides(&self, parent_id: u64, name: &OsStr) -> bool {
        self.policy().has_path_rules()
            && self
                .inodes
                .get(parent_id)
                .is_some_and(|p| self.is_hidden_child(&p, name))
    }

    /// May `path` (an existing or new entry) be changed by `op`? Hidden
    /// names cannot be created (EACCES); read-only paths are EROFS.
    pub(super) fn guard_change(&self, ctx: &Ctx, op: Op, path: &str) -> Result<()> {
        self.check_writable()?;
        let policy = self.policy();
        if !policy.has_path_rules() {
            return Ok(());
        }
        let c = policy.classify(path);
        if let Some(r) = &c.hidden {
            return Err(deny(ctx, op, path, r, libc::EACCES));
        }
        if let Some(r) = &c.readonly {
            return Err(deny(ctx, op, path, r, libc::EROFS));
        }
        Ok(())
    }

    /// `guard_change` for an existing object, under every name it is known
    /// by: a change through one hard link changes all of them. (Names of a
    /// lower file with several links are separate objects, each judged by
    /// its own name, see `namei::split_name`; the names an upper file has
    /// were linked or moved through the mount into the same class, and
    /// this keeps a pre-existing link across classes read-only too.)
    pub(super) fn guard_inode(&self, ctx: &Ctx, op: Op, inode: &Inode) -> Result<()> {
        self.check_writable()?;
        if !self.policy().has_path_rules() {
            return Ok(());
        }
        self.guard_change(ctx, op, &self.path_of(inode))?;
        if inode.is_dir() {
            return Ok(());
        }
        let others = inode.loc.read().others.clone();
        for (parent, name) in others {
            self.guard_change(ctx, op, &self.child_path(&parent, &name))?;
        }
        Ok(())
    }

    /// `guard_inode` of the object `id` for a change of its data: the
    /// policy's answer now, recorded as any refusal is. For a change that
    /// must be refused and never made (`fuse::io_mode`'s `Writing::Refused`).
    pub fn guard_write(&self, ctx: &Ctx, id: u64) -> Result<()> {
        self.guard_inode(ctx, Op::Write, &*self.inode(id)?)
    }

    /// Whether `guard_inode` would refuse every change to the object `id`
    /// (a `readonly` or `hide` rule covers one of its names), without
    /// recording a denial: no copy-up of it can come through the mount
    /// while the policy stands.
    pub fn changes_refused(&self, id: u64) -> bool {
        let policy = self.policy();
        if !policy.has_path_rules() {
            return false;
        }
        let Ok(inode) = self.inode(id) else {
            return false;
        };
        let refused = |path: &str| {
            let c = policy.classify(path);
            c.readonly.is_some() || c.hidden.is_some()
        };
        if refused(&self.path_of(&inode)) {
            return true;
        }
        let others = inode.loc.read().others.clone();
        others
            .iter()
            .any(|(parent, name)| refused(&self.child_path(parent, name)))
    }

    /// Whether the object `obj`, `name` in `parent`, comes from a lower:
    /// what protection is about. Asks the parent's lowers, not only the
    /// object: one resolved from its upper copy does not record the lower
    /// it shadows (this costs a stat per lower, so ask only when needed).
    pub(super) fn is_shared(&self, obj: &Inode, parent: &Inode, name: &OsStr) -> bool {
        obj.real.read().has_lower() || self.lower_has(parent, name)
    }

    /// Whether protection is at stake when a move or a link gives `obj`
    /// (`name` in `parent`) a path of another protection class: it is
    /// shared (`is_shared`), or it is the upper copy of a lower file (its
    /// origin record), wherever it stands. The record is what makes this
    /// a property of the object, not of the name last looked up: a copy
    /// linked to a second protected name cannot then be moved or linked
    /// out of the class through that name, so every name of such an
    /// object keeps one class, and a link through any of them is judged
    /// alike.
    pub fn from_lower(&self, obj: &Inode, parent: &Inode, name: &OsStr) -> bool {
        self.is_shared(obj, parent, name)
            || obj
                .upper_fd()
                .ok()
                .flatten()
                .is_some_and(|fd| Origin::read(fd.as_ref()).is_some())
    }

    /// `guard_change` for a new or existing name in a directory.
    pub(super) fn guard_child(
        &self,
        ctx: &Ctx,
        op: Op,
        parent: &Inode,
        name: &OsStr,
    ) -> Result<()> {
        self.check_writable()?;
        if !self.policy().has_path_rules() {
            return Ok(());
        }
        self.guard_change(ctx, op, &self.child_path(parent, name))
    }

    /// May this object leave its place (unlink, rmdir, rename away)? A
    /// protected entry that comes from a lower may not; a directory holding
    /// read-only or protected entries may not move as a whole.
    pub(super) fn guard_removal(
        &self,
        ctx: &Ctx,
        op: Op,
        parent: &Inode,
        name: &OsStr,
        victim: &Inode,
    ) -> Result<Removal> {
        self.guard_child(ctx, op, parent, name)?;
        let policy = self.policy();
        if !policy.has_path_rules() {
            return Ok(Removal::Normal);
        }
        let path = self.child_path(parent, name);
        let c = policy.classify(&path);
        let has_lower = || self.is_shared(victim, parent, name);
        if let Some(r) = c.protected {
            if has_lower() {
                if !victim.is_dir() && victim.upper().is_some() && matches!(op, Op::Unlink) {
                    return Ok(Removal::RevertToLower);
                }
                return Err(deny(ctx, op, &path, &r, libc::EPERM));
            }
        }
        if victim.is_dir() {
            if let Some(r) = policy.subtree_rule(&path) {
                // Protection is about shared entries: a directory with no
                // lower part holds only the user's own, which may go.
                let readonly = r.text.starts_with("readonly");
                if readonly {
                    return Err(deny(ctx, op, &path, &r, libc::EROFS));
                }
                if has_lower() {
                    return Err(deny(ctx, op, &path, &r, libc::EPERM));
                }
            }
        }
        Ok(Removal::Normal)
    }

    /// May a symlink with this target be created at `path`?
    pub(super) fn guard_symlink(&self, ctx: &Ctx, path: &str, target: &OsStr) -> Result<()> {
        self.policy()
            .check_symlink(path, target)
            .map_err(|d| deny(ctx, Op::Symlink, path, &d.rule, d.errno))
    }

    /// May a device node be created at `path`?
    pub(super) fn guard_device(&self, ctx: &Ctx, path: &str) -> Result<()> {
        self.policy()
            .check_device()
            .map_err(|d| deny(ctx, Op::Mknod, path, &d.rule, d.errno))
    }

    /// The mode bits that may stick under the policy (`suid strip`).
    pub fn allowed_mode(&self, mode: u32, is_dir: bool) -> u32 {
        self.policy().allowed_mode(mode, is_dir)
    }
}

/// What removing a name does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    Normal,
    /// A protected shared entry: drop the upper copy, the lower shows again.
    RevertToLower,
}

#[cfg(test)]
mod proptests {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    use proptest::prelude::*;

    use super::check_name;
    use crate::layer::ops::Upper;
    use crate::overlay::Errno;

    /// What a local filesystem accepts as one name: 1..=255 bytes, not `.`
    /// or `..`, no `/` or NUL (those two are EINVAL through the VFS);
    /// a longer name is ENAMETOOLONG.
    fn model(b: &[u8]) -> Result<(), i32> {
        if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') || b.contains(&0) {
            Err(libc::EINVAL)
        } else if b.len() > 255 {
            Err(libc::ENAMETOOLONG)
        } else {
            Ok(())
        }
    }

    fn name_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300),
            prop::collection::vec(prop::sample::select(vec![b'.', b'/', 0, b'a', 0xff]), 0..4),
            (250usize..260).prop_map(|n| vec![b'x'; n]),
        ]
    }

    proptest! {
        #[test]
        fn fuzz_check_name_matches_model(b in name_bytes()) {
            let got = check_name(OsStr::from_bytes(&b)).map_err(|Errno(e)| e);
            prop_assert_eq!(got, model(&b), "{:?}", String::from_utf8_lossy(&b));
        }

        /// Exactly the overlay's own xattr namespaces are private.
        #[test]
        fn fuzz_private_xattr_names(prefix in prop::sample::select(vec!["trusted.overlay.", "user.overlay.", "trusted.overlay", "user.", "security.", "trusted.", "TRUSTED.overlay.", "user.overlayx.", ""]), rest in "[a-z.]{0,8}") {
            let name = format!("{prefix}{rest}");
            let private = name.starts_with("trusted.overlay.") || name.starts_with("user.overlay.");
            prop_assert_eq!(Upper::is_private_xattr(name.as_bytes()), private, "{}", name);
        }
    }
}
