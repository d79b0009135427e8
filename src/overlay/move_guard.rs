//! The check of a move (rename, either side of an exchange, link) against
//! the path policy: the moved object compared at its two paths, and for a
//! directory, when the policy cannot decide from the two paths alone, a
//! walk of the moved subtree through the union (`Overlay::walk_union`).
//! The per-operation checks and the move lock live in `guard`; this sits
//! above the lookup and the listing, which the walk needs.

use std::ffi::OsStr;

use super::guard::{deny, MoveCheck, Op};
use super::inode::{Inode, Real};
use super::origin::Origin;
use super::readdir::Met;
use super::{Ctx, Overlay, Result};
use crate::layer::sys;
use crate::policy::RuleRef;

impl Overlay {
    /// May the existing object `obj`, `name` in `parent` at path `old`, be
    /// given the path `new` (rename, either side of an exchange, link)?
    /// Refused when it, or anything beneath it, would be classed otherwise
    /// at its new path, or a symlink beneath it contained where it stands
    /// would escape from its new place (`Policy::class_change`,
    /// `Policy::moved_symlink`; the moved object's own symlink target is
    /// checked by the caller).
    ///
    /// Cheap first: the object itself is compared directly; beneath a
    /// directory, the policy decides from the two paths whether any rule
    /// could class `old/X` and `new/X` differently (`unproven_move_rule`)
    /// and whether a link could escape (`move_may_uncontain`: only a move
    /// to a shallower place, under `symlinks contained`). Only then is
    /// the moved subtree walked (the union view, every layer, hidden
    /// entries included), which needs the move lock held exclusively
    /// (`walking`): without it (`walking` false) the answer is
    /// `MoveCheck::Walk`, and nothing is decided.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn guard_move(
        &self,
        ctx: &Ctx,
        op: Op,
        obj: &Inode,
        parent: &Inode,
        name: &OsStr,
        old: &str,
        new: &str,
        walking: bool,
    ) -> Result<MoveCheck> {
        let policy = self.policy();
        if let Some(d) = policy.class_change(old, new, || self.from_lower(obj, parent, name)) {
            return Err(deny(ctx, op, old, &d.rule, d.errno));
        }
        if !obj.is_dir() {
            return Ok(MoveCheck::Allowed);
        }
        let classes = policy.unproven_move_rule(old, new).is_some();
        let links = policy.move_may_uncontain(old, new);
        if !classes && !links {
            return Ok(MoveCheck::Allowed);
        }
        if !walking {
            return Ok(MoveCheck::Walk);
        }
        let root = obj.real.read().clone();
        // The state of a directory in the walk: whether the classes
        // beneath it still need comparing (a subdirectory the policy
        // proves alike needs no more class checks below it).
        self.walk_union(root, classes, |met: &Met<'_>, &classes: &bool| {
            let is_dir = met.kind == libc::S_IFDIR;
            if !classes && !(links && (is_dir || met.kind == libc::S_IFLNK)) {
                return Ok(None);
            }
            let (from, to) = (format!("{old}/{}", met.rel), format!("{new}/{}", met.rel));
            // A refusal names the entry, unless it is hidden at either
            // path: the log and the journal would show what the policy
            // hides; then it names the moved object.
            let refuse = |rule: &RuleRef, errno: i32| {
                let hides = |p: &str| policy.classify(p).hidden.is_some();
                let shown = if hides(&from) || hides(&to) {
                    old
                } else {
                    &from
                };
                Err(deny(ctx, op, shown, rule, errno))
            };
            if classes {
                // As `from_lower`, for an entry no inode stands for.
                let shared = || {
                    met.real.is_some_and(Real::has_lower)
                        || self.lower_has_in(met.dir, met.name)
                        || sys::open_path(met.layer.as_ref(), met.name)
                            .is_ok_and(|fd| Origin::read(&fd).is_some())
                };
                if let Some(d) = policy.class_change(&from, &to, shared) {
                    return refuse(&d.rule, d.errno);
                }
            }
            if links && met.kind == libc::S_IFLNK {
                let target = sys::open_path(met.layer.as_ref(), met.name)
                    .and_then(|fd| sys::readlink_fd(&fd));
                match target {
                    Ok(target) => {
                        if let Err(d) = policy.moved_symlink(&from, &to, &target) {
                            return refuse(&d.rule, d.errno);
                        }
                    }
                    // Gone meanwhile: nothing left to move.
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if !is_dir {
                return Ok(None);
            }
            let classes = classes && policy.unproven_move_rule(&from, &to).is_some();
            Ok((classes || links).then_some(classes))
        })?;
        Ok(MoveCheck::Allowed)
    }
}
