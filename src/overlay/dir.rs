//! Directory operations: create, mkdir, mknod, symlink, link, unlink,
//! rmdir and rename, each ending in the upper with the kernel-overlayfs
//! marks (whiteouts for removed lower names, opaque directories over
//! whiteouts, redirects for renamed lower directories).

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::guard::{check_name, MoveCheck, Op, Removal};
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
    fn guard_move_away(&self, ctx: &Ctx, parent: &Inode, name: &OsStr, obj: &Inode) -> Result<()> {
        match self.guard_removal(ctx, Op::Rename, parent, name, obj)? {
            Removal::Normal => Ok(()),
            Removal::RevertToLower => err(libc::EPERM),
        }
    }

    /// May the object `obj` appear as `name` in `dir`? Only symlinks are
    /// checked: their targets must stay contained from the new place.
    fn guard_moved_symlink(&self, ctx: &Ctx, obj: &Inode, dir: &Inode, name: &OsStr) -> Result<()> {
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

    pub fn unlink(&self, ctx: &Ctx, parent_id: u64, name: &OsStr) -> Result<()> {
        self.remove(ctx, parent_id, name, false)
    }

    pub fn rmdir(&self, ctx: &Ctx, parent_id: u64, name: &OsStr) -> Result<()> {
        self.remove(ctx, parent_id, name, true)
    }

    fn remove(&self, ctx: &Ctx, parent_id: u64, name: &OsStr, want_dir: bool) -> Result<()> {
        check_name(name)?;
        let parent = self.inode(parent_id)?;
        let victim = self.child(&parent, name)?;
        match (want_dir, victim.is_dir()) {
            (true, false) => return err(libc::ENOTDIR),
            (false, true) => return err(libc::EISDIR),
            _ => {}
        }
        let op = Op::Unlink;
        let removal = self.guard_removal(ctx, op, &parent, name, &victim)?;
        if want_dir && !self.dir_is_removable(&victim)? {
            return err(libc::ENOTEMPTY);
        }
        let parent_upper = self.copy_up(&parent)?;
        let upper = victim.upper_fd()?;
        let needs_whiteout = removal == Removal::Normal && self.lower_has(&parent, name);
        let upper_st = upper.as_ref().and_then(|u| sys::fstat(u.as_ref()).ok());
        match (&upper, needs_whiteout) {
            (Some(_), true) if want_dir => {
                self.upper.whiteout_over_dir(parent_upper.as_ref(), name)?
            }
            (Some(_), true) => self.upper.whiteout_over(parent_upper.as_ref(), name)?,
            (Some(_), false) if want_dir => self.upper.remove_dir(parent_upper.as_ref(), name)?,
            (Some(_), false) => sys::unlinkat(parent_upper.as_ref(), name, false)?,
            (None, true) => self.upper.whiteout(parent_upper.as_ref(), name)?,
            (None, false) => return err(libc::ENOENT),
        }
        // A reverted object is its lower file again, at this name; unless
        // its upper copy lives on under other names (see `removed_link`).
        let reverted_here = removal == Removal::RevertToLower
            && upper_st.is_some_and(|st| is_dir(&st) || st.st_nlink <= 1);
        if let Some(st) = upper_st {
            self.quota.release(&st);
            self.removed_link(&victim, &st, upper, removal == Removal::RevertToLower);
        }
        if !reverted_here {
            victim.name_gone(parent.id, name);
        }
        Ok(())
    }

    /// One name of `victim`'s upper file `st` (its attributes before the
    /// removal) is gone from the upper.
    ///
    /// Invariant (see `IdMap`): once the upper file has no link left its
    /// alias is dropped, because the filesystem may give its inode number
    /// to the next file created. A reverted object shows its lower file
    /// again; if the upper file still has other names, the object stays
    /// that upper file under them and the lower name becomes a different
    /// object (it gets its own id when looked up).
    ///
    /// A removed file the kernel still holds keeps its fd (`fd`, the upper
    /// file's) pinned, as a local filesystem keeps an unlinked inode alive
    /// while it is referenced; a removed directory, which holds nothing to
    /// read, does not.
    fn removed_link(&self, victim: &Inode, st: &Stat, fd: Option<Arc<OwnedFd>>, revert: bool) {
        let last = is_dir(st) || st.st_nlink <= 1;
        if last {
            self.ids.unalias(st.st_dev, st.st_ino);
        }
        let mut real = victim.real.write();
        match (revert, last) {
            (true, true) => real.upper = None,
            (true, false) => {
                // If this name was an object of its own (a lower file with
                // several links), the name gets a new one when looked up.
                if let Some(Ok(lst)) = real
                    .lowers
                    .first()
                    .map(|(_, l)| l.get().and_then(|fd| sys::fstat(fd.as_ref())))
                {
                    self.ids.forget_name_id(lst.st_dev, lst.st_ino, victim.id);
                }
                real.lowers.clear()
            }
            // A removed directory lets go of its fd at once (see
            // `RealFd::release`): `rm -rf` of a deep tree stays linear.
            (false, true) if is_dir(st) => {
                if let Some(u) = &real.upper {
                    u.release();
                }
            }
            (false, true) => {
                if let (Some(u), Some(fd)) = (&real.upper, fd) {
                    u.pin(fd);
                }
            }
            (false, false) => {}
        }
    }

    /// Whether `rmdir` may remove a directory: it shows no entry, and what
    /// the policy hides in it is shared only (no upper entry under a hidden
    /// name). `hide secrets/**` leaves `secrets/` listing empty; refusing
    /// its removal with ENOTEMPTY would both contradict the listing and
    /// tell the caller that hidden entries exist. Removing it whiteouts the
    /// shared tree in this workspace's view only (`layerfs reset` brings it
    /// back), as `rm -rf` of any shared directory does. Hidden entries the
    /// upper holds (written beside the mount, or before the rule) are data
    /// only this workspace has: those keep the directory (ENOTEMPTY), and
    /// so do hidden entries a readonly or protect rule also guards (their
    /// removal is refused one by one, so it is refused wholesale too): a
    /// hidden file classed so, or a hidden directory while the policy has
    /// any readonly or protect rule (its tree is not searched).
    fn dir_is_removable(&self, dir: &Inode) -> Result<bool> {
        let entries = self.merged_entries(dir)?;
        if entries.is_empty() {
            return Ok(true);
        }
        let policy = self.policy();
        if !policy.has_path_rules() {
            return Ok(false);
        }
        let guards_any = policy.subtree_rule("").is_some();
        let upper = dir.upper_fd()?;
        for e in &entries {
            let class = policy.classify(&self.child_path(dir, &e.name));
            if class.hidden.is_none() || class.readonly.is_some() || class.protected.is_some() {
                return Ok(false);
            }
            if e.kind == libc::S_IFDIR && guards_any {
                return Ok(false);
            }
            if let Some(u) = &upper {
                match sys::fstatat(u.as_ref(), &e.name) {
                    Ok(st) if !is_whiteout(&st) => return Ok(false),
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(true)
    }

    /// Whether a directory is empty as seen through the mount (hidden
    /// entries count: they exist).
    pub(super) fn dir_is_empty(&self, dir: &Inode) -> Result<bool> {
        Ok(self.merged_entries(dir)?.is_empty())
    }

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
        {
            let _adding = self.moves.adding();
            let args = (parent_id, name, newparent_id, newname, flags);
            if self.rename_locked(ctx, args, false)? == MoveCheck::Allowed {
                return Ok(());
            }
        }
        let _walking = self.moves.walking();
        let args = (parent_id, name, newparent_id, newname, flags);
        match self.rename_locked(ctx, args, true)? {
            MoveCheck::Allowed => Ok(()),
            MoveCheck::Walk => {
                tracing::error!("rename: a walk was asked for under the exclusive move lock");
                err(libc::EIO)
            }
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
        (parent_id, name, newparent_id, newname, flags): (u64, &OsStr, u64, &OsStr, u32),
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
