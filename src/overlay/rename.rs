//! rename and RENAME_EXCHANGE: the move in the upper, with a redirect
//! for a renamed lower directory and a whiteout at the old name where a
//! lower still shows one.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::guard::{check_name, MoveCheck, Op};
use super::inode::Inode;
use super::{err, Ctx, Errno, Overlay, Result};
use crate::layer::ops::is_whiteout;
use crate::layer::sys;
use crate::layer::walk::is_dir;

/// A rename's names: the parent's id and the name, the new parent's id
/// and the new name, and the flags (`RENAME_NOREPLACE`, `RENAME_EXCHANGE`).
pub type Names<'a> = (u64, &'a OsStr, u64, &'a OsStr, u32);

impl Overlay {
    /// rename(2) and renameat2 with `RENAME_NOREPLACE` / `RENAME_EXCHANGE`.
    ///
    /// Holds the move lock (`guard::MoveLock`) shared; a directory move
    /// whose policy check must walk what it moves starts again holding it
    /// exclusively, so nothing is added beneath it between the walk and
    /// the rename.
    pub fn rename(
        &self,
        ctx: &Ctx,
        parent_id: u64,
        name: &OsStr,
        newparent_id: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        let args = (parent_id, name, newparent_id, newname, flags);
        {
            let _adding = self.moves.adding();
            if self.rename_locked(ctx, args, false)? == MoveCheck::Allowed {
                return Ok(());
            }
        }
        let _walking = self.moves.walking();
        match self.rename_locked(ctx, args, true)? {
            MoveCheck::Allowed => Ok(()),
            MoveCheck::Walk => {
                tracing::error!("rename: a walk was asked for under the exclusive move lock");
                err(libc::EIO)
            }
        }
    }

    /// `rename` where it need not wait long: `None`, nothing changed,
    /// when another move's walk holds the move lock, when the policy
    /// check must walk what moves, or when the source is a lower file
    /// whose copy-up would be long (`open_copies_long`).
    pub fn rename_unwalked(&self, ctx: &Ctx, args: Names<'_>) -> Option<Result<()>> {
        let (parent_id, name, ..) = args;
        let src = self.inode(parent_id).and_then(|p| {
            if p.is_dir() {
                self.child(&p, name)
            } else {
                err(libc::ENOTDIR)
            }
        });
        if src.is_ok_and(|src| self.copy_up_long(&src)) {
            return None;
        }
        let _adding = self.moves.try_adding()?;
        match self.rename_locked(ctx, args, false) {
            Ok(MoveCheck::Allowed) => Some(Ok(())),
            Ok(MoveCheck::Walk) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// `rename` with the move lock held (exclusively when `walking`);
    /// answers `MoveCheck::Walk`, having changed nothing, when the policy
    /// check needs a walk and `walking` is false.
    ///
    /// The steps, each its own function: resolve and check the shape of
    /// the move (`rename_targets`), check it against the policy
    /// (`rename_allowed`) and the tree (`check_not_beneath`), all before
    /// anything changes; then swap two names (`rename_exchange`) or move
    /// one, maybe over another (`rename_move`).
    fn rename_locked(
        &self,
        ctx: &Ctx,
        (parent_id, name, newparent_id, newname, flags): Names<'_>,
        walking: bool,
    ) -> Result<MoveCheck> {
        let Some(m) = self.rename_targets(parent_id, name, newparent_id, newname, flags)? else {
            return Ok(MoveCheck::Allowed);
        };
        if self.rename_allowed(ctx, &m, walking)? == MoveCheck::Walk {
            return Ok(MoveCheck::Walk);
        }
        // Invariant: a directory never moves beneath itself, either way of
        // an exchange.
        check_not_beneath(&m.src, &m.newparent)?;
        if let (true, Some(d)) = (m.exchange, &m.dst) {
            check_not_beneath(d, &m.parent)?;
        }
        // Invariant: both parents are in the upper before either name
        // changes; the source (and an exchanged target) carries its
        // redirect there (`prepare_move`).
        let up = MoveUppers {
            old: self.copy_up(&m.parent)?,
            new: self.copy_up(&m.newparent)?,
            src: self.prepare_move(&m.src, &m.parent, m.name)?,
            src_lower_here: self.lower_has(&m.parent, m.name),
            dst_lower_here: self.lower_has(&m.newparent, m.newname),
        };
        if !m.src.is_dir() {
            self.note_moved_in(up.src.as_ref(), up.new.as_ref());
        }
        if m.exchange {
            self.rename_exchange(&m, &up)?;
        } else {
            self.rename_move(&m, &up)?;
        }
        Ok(MoveCheck::Allowed)
    }

    /// Resolves a rename's objects and checks its shape as rename(2)
    /// does: valid names and flags, directories as parents, the target
    /// there for an exchange and absent for `RENAME_NOREPLACE`, a
    /// directory only over an empty directory. `None`: both names are of
    /// one object, and there is nothing to do.
    fn rename_targets<'a>(
        &self,
        parent_id: u64,
        name: &'a OsStr,
        newparent_id: u64,
        newname: &'a OsStr,
        flags: u32,
    ) -> Result<Option<Move<'a>>> {
        check_name(name)?;
        check_name(newname)?;
        if flags & !(sys::RENAME_NOREPLACE | sys::RENAME_EXCHANGE) != 0 {
            return err(libc::EINVAL);
        }
        let exchange = flags & sys::RENAME_EXCHANGE != 0;
        let parent = self.inode(parent_id)?;
        let newparent = self.inode(newparent_id)?;
        if !newparent.is_dir() || !parent.is_dir() {
            return err(libc::ENOTDIR);
        }
        let src = self.child(&parent, name)?;
        let dst = match self.child(&newparent, newname) {
            Ok(d) => Some(d),
            Err(Errno(libc::ENOENT)) => None,
            Err(e) => return Err(e),
        };
        if exchange && dst.is_none() {
            return err(libc::ENOENT);
        }
        if let Some(d) = &dst {
            if d.id == src.id {
                // Two names of one object (or the same name): nothing to do.
                return Ok(None);
            }
            if flags & sys::RENAME_NOREPLACE != 0 {
                return err(libc::EEXIST);
            }
            if !exchange {
                match (src.is_dir(), d.is_dir()) {
                    (true, false) => return err(libc::ENOTDIR),
                    (false, true) => return err(libc::EISDIR),
                    (true, true) if !self.dir_is_empty(d)? => return err(libc::ENOTEMPTY),
                    _ => {}
                }
            }
        }
        Ok(Some(Move {
            parent,
            name,
            newparent,
            newname,
            src,
            dst,
            exchange,
        }))
    }

    /// The policy's say on a rename, checked before anything changes:
    /// the source leaves its place and the target name is created or
    /// replaced (with exchange, both do both); a moved symlink may not
    /// climb out of the mount from where it lands; a directory may not
    /// land where a path rule covers its subtree; and no path changes
    /// class by the move, beneath a moved directory either
    /// (`guard_move`, which answers `Walk` when that needs a walk the
    /// shared move lock does not allow).
    fn rename_allowed(&self, ctx: &Ctx, m: &Move<'_>, walking: bool) -> Result<MoveCheck> {
        let Move {
            parent,
            name,
            newparent,
            newname,
            src,
            dst,
            exchange,
        } = m;
        let (name, newname, exchange) = (*name, *newname, *exchange);
        self.guard_move_away(ctx, parent, name, src)?;
        self.guard_child(ctx, Op::Rename, newparent, newname)?;
        // A symlink's target is relative to where it stands: moving it
        // must not let it climb out of the mount.
        self.guard_moved_symlink(ctx, src, newparent, newname)?;
        if exchange {
            if let Some(d) = dst {
                self.guard_moved_symlink(ctx, d, parent, name)?;
            }
        }
        let new_path = self.child_path(newparent, newname);
        if src.is_dir() && self.policy().has_path_rules() {
            if let Some(r) = self.policy().subtree_rule(&new_path) {
                let errno = if r.text.starts_with("readonly") {
                    libc::EROFS
                } else {
                    libc::EPERM
                };
                return Err(super::guard::deny(ctx, Op::Rename, &new_path, &r, errno));
            }
        }
        if let Some(d) = dst {
            // The replaced target leaves its place like a removal does;
            // exchanged, its name is also created at the source's place.
            self.guard_move_away(ctx, newparent, newname, d)?;
            if exchange {
                self.guard_child(ctx, Op::Rename, parent, name)?;
            }
        }
        let old_path = self.child_path(parent, name);
        let mut check = self.guard_move(
            ctx,
            Op::Rename,
            src,
            parent,
            name,
            &old_path,
            &new_path,
            walking,
        )?;
        if let (true, Some(d)) = (exchange, dst) {
            let back = self.guard_move(
                ctx,
                Op::Rename,
                d,
                newparent,
                newname,
                &new_path,
                &old_path,
                walking,
            )?;
            if back == MoveCheck::Walk {
                check = MoveCheck::Walk;
            }
        }
        Ok(check)
    }

    /// `RENAME_EXCHANGE`: the two names swap objects in one
    /// `renameat2`. Invariant: each directory, standing where the other
    /// was, does not merge with the lower entries of its new name
    /// (`seal_moved_dir`).
    fn rename_exchange(&self, m: &Move<'_>, up: &MoveUppers) -> Result<()> {
        let d = m.dst.as_ref().ok_or(Errno(libc::ENOENT))?;
        let d_upper = self.prepare_move(d, &m.newparent, m.newname)?;
        if !d.is_dir() {
            self.note_moved_in(d_upper.as_ref(), up.old.as_ref());
        }
        sys::renameat2(
            up.old.as_ref(),
            m.name,
            up.new.as_ref(),
            m.newname,
            sys::RENAME_EXCHANGE,
        )?;
        if m.src.is_dir() {
            self.seal_moved_dir(&m.src, &up.src, up.dst_lower_here)?;
        }
        if d.is_dir() {
            self.seal_moved_dir(d, &d_upper, up.src_lower_here)?;
        }
        self.moved(d, &m.parent, m.name);
        self.moved(&m.src, &m.newparent, m.newname);
        Ok(())
    }

    /// A plain rename, maybe over an existing target. Invariants: a
    /// lower object of the old name stays hidden (a whiteout takes the
    /// name, `rename_leaving_whiteout`); a replaced directory's upper
    /// holds only whiteouts when it goes; the replaced object's quota and
    /// link are given back; a moved directory does not merge with lower
    /// entries of its new name (`seal_moved_dir`).
    fn rename_move(&self, m: &Move<'_>, up: &MoveUppers) -> Result<()> {
        let (src, dst) = (&m.src, m.dst.as_ref());
        // Replacing a directory: its upper may only hold whiteouts.
        if let Some(d) = dst.filter(|d| d.is_dir()) {
            if let Some(du) = d.upper_fd()? {
                self.upper.clear_whiteouts(du.as_ref())?;
            }
        }
        // A directory cannot be renamed over a whiteout: drop the whiteout
        // first; the moved directory is sealed against the lower below.
        if src.is_dir()
            && dst.is_none()
            && matches!(sys::fstatat(up.new.as_ref(), m.newname), Ok(s) if is_whiteout(&s))
        {
            sys::unlinkat(up.new.as_ref(), m.newname, false)?;
        }
        // An atomic save keeps the base it replaces (drift stays visible).
        if let Some(d) = dst {
            if !src.is_dir() && !d.is_dir() {
                self.inherit_origin(up.src.as_ref(), d);
            }
        }
        let replaced_fd = dst.and_then(|d| d.upper_fd().ok().flatten());
        let replaced_st = replaced_fd
            .as_ref()
            .and_then(|u| sys::fstat(u.as_ref()).ok());
        self.rename_leaving_whiteout(m, up)?;
        if let (Some(st), Some(d)) = (replaced_st, dst) {
            if st.st_nlink <= 1 && !is_dir(&st) {
                self.quota.release(&st);
            }
            self.removed_link(d, &st, replaced_fd, false);
        }
        if let Some(d) = dst {
            d.name_gone(m.newparent.id, m.newname);
            self.dir_removed(d, replaced_st);
        }
        if src.is_dir() {
            self.seal_moved_dir(src, &up.src, up.dst_lower_here)?;
        }
        self.moved(src, &m.newparent, m.newname);
        Ok(())
    }

    /// Moves the source's upper entry to the new name, leaving a whiteout
    /// at the old name when a lower has an object there (in one
    /// `RENAME_WHITEOUT`, or, where the caller may not, a rename then a
    /// whiteout).
    fn rename_leaving_whiteout(&self, m: &Move<'_>, up: &MoveUppers) -> Result<()> {
        let (old, new) = (up.old.as_ref(), up.new.as_ref());
        let flag = if up.src_lower_here {
            sys::RENAME_WHITEOUT
        } else {
            0
        };
        match sys::renameat2(old, m.name, new, m.newname, flag) {
            Ok(()) => Ok(()),
            Err(e)
                if flag != 0
                    && matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EPERM)) =>
            {
                // No RENAME_WHITEOUT here (unprivileged): rename, then mark.
                sys::renameat2(old, m.name, new, m.newname, 0)?;
                self.upper.whiteout(old, m.name)?;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Gives a rename source its upper copy; a directory with lower parts
    /// gets a redirect mark naming where they live, so they follow it.
    fn prepare_move(
        &self,
        inode: &Arc<Inode>,
        _parent: &Arc<Inode>,
        _name: &OsStr,
    ) -> Result<Arc<OwnedFd>> {
        let upper = self.copy_up(inode)?;
        if inode.is_dir() {
            let real = inode.real.read().clone();
            if real.has_lower() && !real.opaque && self.upper.redirect(upper.as_ref()).is_none() {
                let path = real.lower_path.as_ref().ok_or(Errno(libc::EIO))?;
                let path = if path.is_root() {
                    "/".to_string()
                } else {
                    path.to_os_string().to_string_lossy().into_owned()
                };
                self.upper.set_redirect(upper.as_ref(), &path)?;
            }
        }
        Ok(upper)
    }

    /// After a directory moved to a name where a lower has something: if it
    /// does not carry a redirect, it must be opaque so the lower entries of
    /// its new name do not merge into it.
    fn seal_moved_dir(
        &self,
        inode: &Inode,
        upper: &Arc<OwnedFd>,
        lower_at_target: bool,
    ) -> Result<()> {
        if !lower_at_target {
            return Ok(());
        }
        let mut real = inode.real.write();
        if !real.has_lower() && !real.opaque {
            self.upper.set_opaque(upper.as_ref())?;
            real.opaque = true;
        }
        Ok(())
    }

    /// Records an object's new place after a rename.
    fn moved(&self, inode: &Arc<Inode>, parent: &Arc<Inode>, name: &OsStr) {
        inode.moved_to(parent, name);
    }
}

/// One rename's objects, resolved and checked for shape
/// (`Overlay::rename_targets`).
struct Move<'a> {
    parent: Arc<Inode>,
    name: &'a OsStr,
    newparent: Arc<Inode>,
    newname: &'a OsStr,
    src: Arc<Inode>,
    /// The object at the new name; always there for an exchange.
    dst: Option<Arc<Inode>>,
    exchange: bool,
}

/// A rename's upper directories and what the lowers hold at both names,
/// taken before either name changes.
struct MoveUppers {
    /// The old parent's and the new parent's upper directories.
    old: Arc<OwnedFd>,
    new: Arc<OwnedFd>,
    /// The source's upper copy (with its redirect, `prepare_move`).
    src: Arc<OwnedFd>,
    src_lower_here: bool,
    dst_lower_here: bool,
}

/// A directory may not move beneath itself: `EINVAL` when `dir` is
/// `dest` or one of its ancestors.
fn check_not_beneath(dir: &Arc<Inode>, dest: &Arc<Inode>) -> Result<()> {
    if !dir.is_dir() {
        return Ok(());
    }
    let mut cur = Some(dest.clone());
    while let Some(c) = cur {
        if c.id == dir.id {
            return err(libc::EINVAL);
        }
        cur = c.parent();
    }
    Ok(())
}
