//! Directory operations: lookup of a child, create, mkdir, mknod,
//! symlink and link, each ending in the upper with the kernel-overlayfs
//! marks (a new name over a whiteout, opaque directories over whiteouts).
//! unlink and rmdir are in `remove.rs`, rename in `rename.rs`.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::guard::{check_name, Op, Removal};
use super::inode::{Inode, Real};
use super::{err, Ctx, Entry, Errno, Overlay, Result};
use crate::layer::ops::is_whiteout;
use crate::layer::real::RealFd;
use crate::layer::sys::{self, Stat};
use crate::layer::walk::is_dir;

/// What a new object is.
pub enum NewKind<'a> {
    File { mode: u32, flags: i32 },
    Dir { mode: u32 },
    Node { mode: u32, rdev: u64 },
    Symlink { target: &'a OsStr },
    Link { source: &'a Arc<Inode> },
}

/// Where a new name goes in the upper.
struct Slot {
    parent_upper: Arc<OwnedFd>,
    /// A whiteout of a deleted lower entry holds the name in the upper.
    over_whiteout: bool,
}

impl Overlay {
    /// Resolves an existing child and returns the inode for it (the one the
    /// kernel holds, or a detached one) without counting a lookup.
    pub fn child(&self, parent: &Arc<Inode>, name: &OsStr) -> Result<Arc<Inode>> {
        if self.is_hidden_child(parent, name) {
            return err(libc::ENOENT);
        }
        let r = self.resolve(parent, name)?.ok_or(Errno(libc::ENOENT))?;
        let id = self.object_id(parent, name, &r);
        let kind = r.st.st_mode & libc::S_IFMT;
        if let Some(i) = self.inodes.get(id) {
            // `object_id` chose `id` for this object, so an inode under it
            // is this object (unless replaced by a concurrent lookup).
            if i.kind == kind {
                {
                    let mut cur = i.real.write();
                    let mut real = r.real;
                    if real.upper.is_none() {
                        real.upper = cur.upper.clone();
                    }
                    *cur = real;
                }
                i.seen_at(parent, name);
                return Ok(i);
            }
        }
        Ok(Arc::new(Inode::new(
            id,
            kind,
            r.real,
            Some(parent.clone()),
            name.to_os_string(),
        )))
    }

    /// Whether some lower layer shows `name` in the directory `parent`
    /// (so removing the upper name needs a whiteout).
    pub(super) fn lower_has(&self, parent: &Inode, name: &OsStr) -> bool {
        let real = parent.real.read().clone();
        self.lower_has_in(&real, name)
    }

    /// `lower_has` for the directory whose real files are `real`.
    pub(super) fn lower_has_in(&self, real: &Real, name: &OsStr) -> bool {
        if real.opaque {
            return false;
        }
        for (_, fd) in &real.lowers {
            let Ok(fd) = fd.get() else { continue };
            match sys::fstatat(fd.as_ref(), name) {
                Ok(s) if is_whiteout(&s) => return false,
                Ok(_) => return true,
                Err(_) => continue,
            }
        }
        false
    }

    /// May `obj` leave `name` in `parent` by a rename? Like a removal,
    /// except that a protected shared entry cannot be reverted by moving
    /// its upper copy away: that is refused (EPERM).
    pub(super) fn guard_move_away(
        &self,
        ctx: &Ctx,
        parent: &Inode,
        name: &OsStr,
        obj: &Inode,
    ) -> Result<()> {
        match self.guard_removal(ctx, Op::Rename, parent, name, obj)? {
            Removal::Normal => Ok(()),
            Removal::RevertToLower => err(libc::EPERM),
        }
    }

    /// May the object `obj` appear as `name` in `dir`? Only symlinks are
    /// checked: their targets must stay contained from the new place.
    pub(super) fn guard_moved_symlink(
        &self,
        ctx: &Ctx,
        obj: &Inode,
        dir: &Inode,
        name: &OsStr,
    ) -> Result<()> {
        if obj.kind != libc::S_IFLNK {
            return Ok(());
        }
        let target = sys::readlink_fd(self.real_fd(obj)?.as_ref())?;
        self.guard_symlink(ctx, &self.child_path(dir, name), &target)
    }

    /// Checks that `name` is free in `parent` and prepares its upper slot.
    fn slot(&self, ctx: &Ctx, op: Op, parent: &Arc<Inode>, name: &OsStr) -> Result<Slot> {
        check_name(name)?;
        if !parent.is_dir() {
            return err(libc::ENOTDIR);
        }
        self.guard_child(ctx, op, parent, name)?;
        if self.resolve(parent, name)?.is_some() {
            return err(libc::EEXIST);
        }
        let parent_upper = self.copy_up(parent)?;
        let over_whiteout =
            matches!(sys::fstatat(parent_upper.as_ref(), name), Ok(s) if is_whiteout(&s));
        Ok(Slot {
            parent_upper,
            over_whiteout,
        })
    }

    /// Creates a new object; for files also returns the open fd. The steps:
    /// the policy checks that need no upper (`guard_new`), the name's slot
    /// in the upper (`slot`), the object built and put at its name
    /// (`build_new`, undone on failure), then the entry the kernel gets
    /// (`link_entry` for a hard link, `new_entry` otherwise).
    pub fn create_object(
        &self,
        ctx: &Ctx,
        parent_id: u64,
        name: &OsStr,
        kind: NewKind<'_>,
    ) -> Result<(Entry, Option<OwnedFd>)> {
        // A name is added: see `guard::MoveLock`.
        let _adding = self.moves.adding();
        let parent = self.inode(parent_id)?;
        let op = match kind {
            NewKind::File { .. } => Op::Create,
            NewKind::Dir { .. } => Op::Create,
            NewKind::Node { .. } => Op::Mknod,
            NewKind::Symlink { .. } => Op::Symlink,
            NewKind::Link { .. } => Op::Link,
        };
        self.guard_new(ctx, op, &parent, name, &kind)?;
        // Only now may the upper change: the slot copies the parent up.
        let slot = self.slot(ctx, op, &parent, name)?;
        let file = self.build_new(ctx, &slot, name, &kind)?;
        let fd = sys::open_path(slot.parent_upper.as_ref(), name)?;
        let st = sys::fstat(&fd)?;
        if let NewKind::Link { source } = &kind {
            return Ok((self.link_entry(source, st)?, None));
        }
        Ok((self.new_entry(&parent, name, &slot, fd, st), file))
    }

    /// The policy checks of a new name that need no upper. They come before
    /// anything is copied up: a refused symlink, device or link must not
    /// leave copied-up parents behind.
    fn guard_new(
        &self,
        ctx: &Ctx,
        op: Op,
        parent: &Arc<Inode>,
        name: &OsStr,
        kind: &NewKind<'_>,
    ) -> Result<()> {
        let path = self.child_path(parent, name);
        match kind {
            NewKind::Symlink { target } => self.guard_symlink(ctx, &path, target)?,
            NewKind::Node { mode, .. }
                if matches!(mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK) =>
            {
                self.guard_device(ctx, &path)?
            }
            NewKind::Link { source } => {
                if source.is_dir() {
                    return err(libc::EPERM);
                }
                self.guard_inode(ctx, Op::Link, source)?;
                self.guard_moved_symlink(ctx, source, parent, name)?;
                // The new name must be classed as the source is: a link is
                // a second path to the same content. (A hidden or readonly
                // new name is refused as for any new name first.)
                if self.policy().has_path_rules() {
                    self.guard_child(ctx, op, parent, name)?;
                    let (src_parent, src_name) = {
                        let loc = source.loc.read();
                        (loc.parent.clone(), loc.name.clone())
                    };
                    let src_parent = src_parent.ok_or(Errno(libc::EIO))?;
                    let from = self.path_of(source);
                    self.guard_move(
                        ctx,
                        Op::Link,
                        source,
                        &src_parent,
                        &src_name,
                        &from,
                        &path,
                        false,
                    )?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Builds the new object and puts it at `name` in the slot's upper
    /// directory; for a file returns its open fd. A new inode is charged to
    /// the quota (a link adds none). On failure nothing is left: the half
    /// built object is removed and the charge refunded, so the name is as
    /// it was (free, or held by its whiteout).
    ///
    /// Long on purpose: one arm per kind of object, and the undo on
    /// failure (remove the half-built object, refund the charge) must see
    /// every step that came before it.
    fn build_new(
        &self,
        ctx: &Ctx,
        slot: &Slot,
        name: &OsStr,
        kind: &NewKind<'_>,
    ) -> Result<Option<OwnedFd>> {
        let pst = sys::fstat(slot.parent_upper.as_ref())?;
        let sgid_parent = pst.st_mode & libc::S_ISGID != 0;
        let gid = if sgid_parent { pst.st_gid } else { ctx.gid };
        if !matches!(kind, NewKind::Link { .. }) {
            self.quota.charge_inode()?;
        }
        // New objects are built at their name, or in the work dir and
        // renamed over a whiteout holding the name.
        let (dir, tmp): (&OwnedFd, OsString) = if slot.over_whiteout {
            (&self.upper.work, self.upper.tmp_name())
        } else {
            (slot.parent_upper.as_ref(), name.to_os_string())
        };
        let mut file = None;
        // New objects take their default ACL (if any) from the parent.
        let parent_fd = slot.parent_upper.as_ref();
        let built: Result<()> = (|| {
            match kind {
                NewKind::File { mode, flags } => {
                    let nm =
                        self.new_mode(ctx, parent_fd, self.allowed_mode(*mode & 0o7777, false));
                    let mode = nm.mode;
                    let acc = flags & libc::O_ACCMODE;
                    let extra = flags
                        & (libc::O_APPEND
                            | libc::O_DIRECT
                            | libc::O_SYNC
                            | libc::O_DSYNC
                            | libc::O_NOATIME);
                    let fd = sys::open_beneath(
                        dir,
                        &tmp,
                        libc::O_CREAT | libc::O_EXCL | acc | extra,
                        mode,
                    )?;
                    self.own(&fd, Some(ctx.uid), Some(gid))?;
                    // chown cleared any set-id bits.
                    if nm.fix_after || mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
                        sys::fchmod(&fd, mode)?;
                    }
                    file = Some(fd);
                }
                NewKind::Dir { mode } => {
                    // As mkdir(2): set-id bits are not taken from the
                    // caller; setgid comes from the parent.
                    let nm = self.new_mode(ctx, parent_fd, *mode & 0o1777);
                    let mode = nm.mode | if sgid_parent { libc::S_ISGID } else { 0 };
                    sys::mkdirat(dir, &tmp, nm.mode)?;
                    let fd = sys::open_path(dir, &tmp)?;
                    self.own(&fd, Some(ctx.uid), Some(gid))?;
                    // Built in the work dir, it did not inherit setgid.
                    if nm.fix_after || (sgid_parent && slot.over_whiteout) {
                        sys::fchmod(&fd, mode)?;
                    }
                    if slot.over_whiteout {
                        self.upper.set_opaque(&fd)?;
                    }
                }
                NewKind::Node { mode, rdev } => {
                    let fmt = mode & libc::S_IFMT;
                    let nm =
                        self.new_mode(ctx, parent_fd, self.allowed_mode(*mode & 0o7777, false));
                    let m = fmt | nm.mode;
                    sys::mknodat(dir, &tmp, m, *rdev)?;
                    let fd = sys::open_path(dir, &tmp)?;
                    self.own(&fd, Some(ctx.uid), Some(gid))?;
                    if nm.fix_after || m & (libc::S_ISUID | libc::S_ISGID) != 0 {
                        sys::fchmod(&fd, m & 0o7777)?;
                    }
                }
                NewKind::Symlink { target } => {
                    sys::symlinkat(target, dir, &tmp)?;
                    let fd = sys::open_path(dir, &tmp)?;
                    self.own(&fd, Some(ctx.uid), Some(gid))?;
                }
                NewKind::Link { source } => {
                    let src = self.copy_up(source)?;
                    self.note_moved_in(src.as_ref(), parent_fd);
                    sys::link_fd(src.as_ref(), dir, &tmp)?;
                }
            }
            if slot.over_whiteout {
                let is_dir = matches!(kind, NewKind::Dir { .. });
                let flags = if is_dir { sys::RENAME_EXCHANGE } else { 0 };
                sys::renameat2(
                    &self.upper.work,
                    &tmp,
                    slot.parent_upper.as_ref(),
                    name,
                    flags,
                )?;
                if is_dir {
                    // The whiteout was swapped into the work dir.
                    sys::unlinkat(&self.upper.work, &tmp, false)?;
                }
            }
            Ok(())
        })();
        if let Err(e) = built {
            if slot.over_whiteout {
                let _ = crate::layer::walk::remove_tree(&self.upper.work, &tmp);
            } else if !matches!(e.0, libc::EEXIST) {
                let is_dir = matches!(kind, NewKind::Dir { .. });
                let _ = sys::unlinkat(slot.parent_upper.as_ref(), name, is_dir);
            }
            if !matches!(kind, NewKind::Link { .. }) {
                self.quota.refund_inode();
            }
            return Err(e);
        }
        Ok(file)
    }

    /// The entry of a new hard link: the source's inode, one more lookup
    /// of it held by the kernel. `st` is the new name's (the same object).
    fn link_entry(&self, source: &Arc<Inode>, st: Stat) -> Result<Entry> {
        let entry_st = self.fix_stat(source, st);
        source
            .lookups
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        // The kernel now holds one more lookup of the source.
        if self.inodes.get(source.id).is_none() {
            return err(libc::ESTALE);
        }
        Ok(Entry {
            id: source.id,
            st: entry_st,
            lower: false,
        })
    }

    /// The inode of a new object, upper only. A directory made over a
    /// whiteout is opaque (`build_new` marked it): no lower shows through.
    fn new_entry(
        &self,
        parent: &Arc<Inode>,
        name: &OsStr,
        slot: &Slot,
        fd: OwnedFd,
        st: Stat,
    ) -> Entry {
        let lower_path = parent
            .real
            .read()
            .lower_path
            .as_ref()
            .map(|p| p.child(name));
        let real = Real {
            upper: Some(RealFd::new(fd, &self.upper.layer.mount)),
            lowers: Vec::new(),
            opaque: slot.over_whiteout && is_dir(&st),
            lower_path: if is_dir(&st) { lower_path } else { None },
        };
        self.instantiate(
            parent,
            name,
            super::namei::Resolved {
                st,
                real,
                degraded: false,
            },
        )
    }
}
