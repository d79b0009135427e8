//! unlink and rmdir: the name leaves the upper, and a whiteout holds it
//! where a lower still shows one.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::guard::{check_name, Op, Removal};
use super::inode::Inode;
use super::{err, Ctx, Overlay, Result};
use crate::layer::ops::is_whiteout;
use crate::layer::sys::{self, Stat};
use crate::layer::walk::is_dir;

impl Overlay {
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
            self.dir_removed(&victim, upper_st);
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
    /// A directory's only name is gone (rmdir, or replaced by a rename):
    /// what a stat through an fd still open on it answers from now on,
    /// link count 0 (`Inode::removed`). `st` is its upper's stat when it
    /// had one; a shared-only directory's is read from its lower.
    pub(super) fn dir_removed(&self, victim: &Inode, st: Option<Stat>) {
        if !victim.is_dir() {
            return;
        }
        let st = st.or_else(|| {
            let real = victim.real.read();
            let (_, l) = real.lowers.first()?;
            l.get().ok().and_then(|fd| sys::fstat(fd.as_ref()).ok())
        });
        if let Some(mut gone) = st {
            gone.st_nlink = 0;
            victim.removed.set(gone);
        }
    }

    pub(super) fn removed_link(
        &self,
        victim: &Inode,
        st: &Stat,
        fd: Option<Arc<OwnedFd>>,
        revert: bool,
    ) {
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
}
