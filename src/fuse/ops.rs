//! `fuser::Filesystem` for `LayerFs`: each request decoded into a call on
//! the overlay core, run inside the write gate when it changes anything
//! (`LayerFs::gated`), on the copy pool when it may copy for long
//! (`long`), recorded for the journal (`journal`) and answered with the
//! right cache timeout and errno.

use std::ffi::OsStr;
use std::path::Path;

use fuser::{
    CopyFileRangeFlags, Errno, FileHandle, Generation, INodeNo, IoctlFlags, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::convert;
use super::init;
use super::journal::setattr_rows;
use super::killpriv;
use super::reply::{self, errno, AttrReply, EntryReply};
use super::shared::{ctx, LayerFs, Shared};
use crate::overlay::attr::SetAttr;
use crate::overlay::copy_up::NoHalt;
use crate::overlay::dir::NewKind;
use crate::overlay::events::EvOp;
use crate::overlay::file::{SyncTarget, LONG_COPY};
use crate::overlay::Ctx;

/// FLUSH's answer. Nothing is buffered in the daemon and locks live in
/// the kernel, so a close has nothing to flush: ENOSYS tells the kernel to
/// stop sending FLUSH at all (one round trip less per close).
pub(super) const NO_FLUSH: Errno = Errno::ENOSYS;

/// IOCTL's answer: no file ioctls are forwarded. Tools probing for flags
/// or reflinks (`FS_IOC_GETFLAGS`, `FICLONE`) get ENOTTY and fall back,
/// without a log line per call.
pub(super) const NO_IOCTL: Errno = Errno::ENOTTY;

impl Shared {
    /// LOOKUP, for fuser's reply and for a queue thread's (`fast`). Each
    /// entry answered counts one kernel reference (the core's lookup
    /// count, given back by FORGET).
    pub(super) fn lookup(&self, c: &Ctx, parent: INodeNo, name: &OsStr, reply: impl EntryReply) {
        crate::failpoint::hit("lookup", name);
        match self.ov().lookup(c, parent.0, name) {
            Ok(e) => reply.entry(&self.ttl(e.lower), &convert::attr(&e.st), Generation(0)),
            // A negative entry, trusted as long as the directory's other
            // entries are: a lower name appearing in a watched directory
            // is invalidated when it appears.
            // Names the policy hides are never cached as absent: a reload
            // that shows them again must take effect at once.
            Err(e) if e.0 == libc::ENOENT && self.ov().hides(parent.0, name) => {
                reply.error(errno(e))
            }
            Err(e) if e.0 == libc::ENOENT && !self.lower_ttl.is_zero() => {
                let mut attr = convert::attr(&crate::overlay::attr::zero_stat());
                attr.ino = INodeNo(0);
                let ttl = self.ttl(!self.ov().dir_watched(parent.0));
                reply.entry(&ttl, &attr, Generation(0))
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    /// SETATTR answered at once where nothing needs waiting: writes are
    /// not paused, no long copy-up comes first (a change of a lower file's
    /// attributes copies it up as an open for writing does), and a
    /// truncation by path has no lower reader's release to wait for.
    /// Otherwise nothing is done and the reply is given back.
    pub(super) fn setattr_now<R: AttrReply>(
        &self,
        c: &Ctx,
        ino: INodeNo,
        a: &SetAttr,
        reply: R,
    ) -> Result<(), R> {
        if self.ov().open_copies_long(ino.0, libc::O_WRONLY) {
            return Err(reply);
        }
        let Some(_pass) = self.ov.gate().try_enter() else {
            return Err(reply);
        };
        self.setattr_gated(c, ino, a, false, reply)
    }

    /// SETATTR inside the write gate; `wait`: it may wait for a lower
    /// reader's release (else the reply is given back, nothing done).
    pub(super) fn setattr_gated<R: AttrReply>(
        &self,
        c: &Ctx,
        ino: INodeNo,
        a: &SetAttr,
        wait: bool,
        reply: R,
    ) -> Result<(), R> {
        let path = self.path(ino.0);
        // A truncation by path changes the data: not while the lower
        // file is passed through to readers (`io_mode`).
        let truncates = a.size.is_some() && a.fh.is_none();
        if truncates && !wait && crate::failpoint::holds("open_write") {
            return Err(reply);
        }
        let began = match (truncates, wait) {
            (false, _) => None,
            (true, true) => Some(self.io.begin_write(self.ov(), ino.0)),
            (true, false) => match self.io.begin_write_now(self.ov(), ino.0) {
                None => return Err(reply),
                began => began,
            },
        };
        if began.is_some() {
            crate::failpoint::hold_at("open_write", || {
                let ov = self.ov();
                ov.inode(ino.0).map(|i| ov.path_of(&i)).unwrap_or_default()
            });
        }
        let writing = match began {
            Some(Err(e)) => {
                reply.error(Errno::from_i32(e));
                return Ok(());
            }
            Some(Ok(w @ super::io_mode::Writing::Refused)) => {
                // Refused, never made (`io_mode::Writing::Refused`).
                let refused = self.ov().guard_write(c, ino.0);
                self.io.end_write(ino.0, w);
                let e = refused.err().map_or(libc::ETXTBSY, |e| e.0);
                reply.error(Errno::from_i32(e));
                return Ok(());
            }
            Some(Ok(w)) => Some(w),
            None => None,
        };
        self.rec.around_setattr(self.ov(), ino.0, false);
        let r = self.ov().setattr(c, ino.0, a).and_then(|st| {
            // A truncate, or the kernel's own clearing handed over (a
            // SETATTR that sets nothing): `killpriv`.
            let sets_nothing = a.mode.is_none()
                && a.uid.is_none()
                && a.gid.is_none()
                && a.size.is_none()
                && a.atime.is_none()
                && a.mtime.is_none();
            if a.mode.is_some() || (a.size.is_none() && !sets_nothing) {
                return Ok(st);
            }
            let killed = self
                .ov()
                .kill_suid(ino.0, || killpriv::caller_lacks_fsetid(c.pid))?;
            Ok(killed.unwrap_or(st))
        });
        self.rec.around_setattr(self.ov(), ino.0, true);
        if let Some(w) = writing {
            self.io.end_write(ino.0, w);
        }
        let errno = r.as_ref().err().map_or(0, |e| e.0);
        self.rec.done(c, &setattr_rows(a), path, None, errno);
        self.reply_attr(ino, r, reply);
        Ok(())
    }

    /// UNLINK (RMDIR when `dir`), inside the write gate: for fuser and
    /// for a queue thread.
    pub(super) fn remove(
        &self,
        c: &Ctx,
        parent: INodeNo,
        name: &OsStr,
        dir: bool,
    ) -> crate::overlay::Result<()> {
        let path = self.child(parent, name);
        let (r, op) = match dir {
            true => (self.ov().rmdir(c, parent.0, name), EvOp::Rmdir),
            false => (self.ov().unlink(c, parent.0, name), EvOp::Unlink),
        };
        self.done(c, op, path, None, &r);
        r
    }

    /// RELEASE (answered with nothing but success), for fuser and for a
    /// queue thread: the handle's writes recorded, its io mode and the
    /// handle given up.
    pub(super) fn release(&self, c: &Ctx, ino: u64, fh: u64) {
        self.rec.writes(self.ov(), fh, Some(c), true);
        self.io.release(self.ov(), ino, fh);
        self.ov().release(fh);
    }

    /// mknod, mkdir, symlink and link, inside the write gate: create the
    /// object, reply its entry (for fuser and for a queue thread).
    pub(super) fn create_entry(
        &self,
        c: &Ctx,
        parent: INodeNo,
        name: &OsStr,
        kind: NewKind<'_>,
        reply: impl EntryReply,
    ) {
        let (op, path, to) = self.creation(parent, name, &kind);
        let r = self
            .ov()
            .create_object(c, parent.0, name, kind)
            .map(|(e, _)| e);
        self.done(c, op, path, to, &r);
        self.reply_entry(r, reply)
    }

    /// LINK, inside the write gate: `ino` gets the new name `newname`.
    pub(super) fn link(
        &self,
        c: &Ctx,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: impl EntryReply,
    ) {
        let source = match self.ov().inode(ino.0) {
            Ok(src) => src,
            Err(e) => return reply.error(errno(e)),
        };
        let kind = NewKind::Link { source: &source };
        self.create_entry(c, newparent, newname, kind, reply)
    }

    /// RENAME, inside the write gate. `walk`: the move may wait for the
    /// walk its policy check needs (and for another move's walk); else
    /// `None`, nothing done, when it would (`Overlay::rename_unwalked`).
    pub(super) fn rename(
        &self,
        c: &Ctx,
        (parent, name): (INodeNo, &OsStr),
        (newparent, newname): (INodeNo, &OsStr),
        flags: u32,
        walk: bool,
    ) -> Option<crate::overlay::Result<()>> {
        let (from, to) = (self.child(parent, name), self.child(newparent, newname));
        let args = (parent.0, name, newparent.0, newname, flags);
        let r = if walk {
            self.ov().rename(c, args.0, name, args.2, newname, flags)
        } else {
            self.ov().rename_unwalked(c, args)?
        };
        self.done(c, EvOp::Rename, from, to, &r);
        Some(r)
    }

    /// SETXATTR, inside the write gate.
    pub(super) fn setxattr(
        &self,
        c: &Ctx,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> crate::overlay::Result<()> {
        let path = self.path(ino.0);
        let r = self.ov().setxattr(c, ino.0, name, value, flags);
        let attr = Some(name.to_string_lossy().into_owned());
        self.done(c, EvOp::Setxattr, path, attr, &r);
        r
    }

    /// REMOVEXATTR, inside the write gate.
    pub(super) fn removexattr(
        &self,
        c: &Ctx,
        ino: INodeNo,
        name: &OsStr,
    ) -> crate::overlay::Result<()> {
        let path = self.path(ino.0);
        let r = self.ov().removexattr(c, ino.0, name);
        let attr = Some(name.to_string_lossy().into_owned());
        self.done(c, EvOp::Removexattr, path, attr, &r);
        r
    }

    /// A write through the daemon, inside the write gate; `kill`: its
    /// caller lacks CAP_FSETID, so setuid/setgid bits go first
    /// (`killpriv`). For fuser and for a queue thread.
    pub(super) fn write(
        &self,
        ino: INodeNo,
        kill: bool,
        fh: u64,
        offset: u64,
        data: &[u8],
    ) -> crate::overlay::Result<u32> {
        if kill {
            self.ov().kill_suid(ino.0, || true)?;
        }
        self.ov().write(fh, offset, data)
    }
}

/// WRITE's reply through fuser.
fn written(r: crate::overlay::Result<u32>, reply: ReplyWrite) {
    match r {
        Ok(n) => reply.written(n),
        Err(e) => reply.error(errno(e)),
    }
}

impl fuser::Filesystem for LayerFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if self.queue.is_some() {
            if let Some(n) = self.inner.negotiated.get() {
                init::queue_session(config, n);
            }
            return Ok(());
        }
        let n = init::negotiate(
            config,
            &self.inner.ov,
            &self.inner.io,
            self.inner.want_uring,
        );
        let _ = self.inner.negotiated.set(n);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.inner.lookup(&ctx(req, 0), parent, name, reply)
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.ov().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr_of(ino.0, fh.map(|f| f.0)) {
            Ok((ttl, st)) => reply.attr(&ttl, &convert::attr(&st)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let a = convert::set_attr(mode, uid, gid, size, atime, mtime, fh.map(|f| f.0));
        let c = ctx(req, 0);
        let Err(reply) = self.inner.setattr_now(&c, ino, &a, reply) else {
            return;
        };
        // Paused, or a truncation waiting for a reader's release.
        self.gated(move |s| {
            // Given back only when it may not wait.
            let _ = s.setattr_gated(&c, ino, &a, true, reply);
        })
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.ov().readlink(ino.0) {
            Ok(t) => reply.data(std::os::unix::ffi::OsStrExt::as_bytes(t.as_os_str())),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let (c, name) = (ctx(req, umask), name.to_owned());
        self.gated(move |s| {
            let kind = NewKind::Node {
                mode,
                rdev: rdev as u64,
            };
            s.create_entry(&c, parent, &name, kind, reply)
        })
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let (c, name) = (ctx(req, umask), name.to_owned());
        self.gated(move |s| s.create_entry(&c, parent, &name, NewKind::Dir { mode }, reply))
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (c, name) = (ctx(req, 0), name.to_owned());
        self.gated(move |s| reply::empty(s.remove(&c, parent, &name, false), reply))
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (c, name) = (ctx(req, 0), name.to_owned());
        self.gated(move |s| reply::empty(s.remove(&c, parent, &name, true), reply))
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let (c, name, target) = (ctx(req, 0), link_name.to_owned(), target.to_owned());
        self.gated(move |s| {
            let kind = NewKind::Symlink {
                target: target.as_os_str(),
            };
            s.create_entry(&c, parent, &name, kind, reply)
        })
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let c = ctx(req, 0);
        let (name, newname) = (name.to_owned(), newname.to_owned());
        self.gated(move |s| {
            let (from, to) = ((parent, &*name), (newparent, &*newname));
            match s.rename(&c, from, to, flags.bits(), true) {
                Some(r) => reply::empty(r, reply),
                // Never: a rename that may walk is done.
                None => reply.error(Errno::EIO),
            }
        })
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let (c, newname) = (ctx(req, 0), newname.to_owned());
        self.gated(move |s| s.link(&c, ino, newparent, &newname, reply))
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let c = ctx(req, 0);
        let Err(reply) = self
            .inner
            .open_now(&c, ino, flags, self.queue.as_deref(), reply)
        else {
            return;
        };
        // An open for writing that must wait: for a pause to end (parked
        // in the write gate), for a reader's release, or for a long copy
        // (on the copy pool).
        let queue = self.queue.clone();
        if self.ov().open_copies_long(ino.0, flags.0) {
            let inner = self.inner.clone();
            return self.inner.long.submit(c.uid, move || {
                inner.open_copying(&c, ino, flags, queue, reply)
            });
        }
        self.gated(move |s| {
            let r = s.open_file(&c, ino, flags, &NoHalt);
            s.opened(&c, ino, flags, r, queue.as_deref(), reply)
        })
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.ov().read(fh.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // The kernel marks the write of a caller without CAP_FSETID.
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        // The data is copied only for a request parked by a pause.
        if let Some(_pass) = self.ov().gate().try_enter() {
            return written(self.inner.write(ino, kill, fh.0, offset, data), reply);
        }
        let data = data.to_vec();
        self.gated(move |s| written(s.write(ino, kill, fh.0, offset, &data), reply))
    }

    /// See `NO_FLUSH`.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(NO_FLUSH);
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.inner.release(&ctx(req, 0), ino.0, fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let target = self.inner.fsync_target(&ctx(req, 0), fh.0, datasync);
        reply::empty(target.and_then(SyncTarget::sync), reply);
    }

    /// Directories are opened without the daemon: ENOSYS here makes the
    /// kernel stop sending OPENDIR and RELEASEDIR for good and open every
    /// directory with its listing cached (FOPEN_CACHE_DIR | KEEP_CACHE),
    /// two round trips less per directory walked. The cache stays correct
    /// because the kernel drops it itself when the directory changes
    /// through the mount, and the daemon invalidates it when a lower
    /// directory changes (`watcher`) or the policy is reloaded; for a
    /// directory it cannot watch, its reported mtime follows its lowers
    /// (`Overlay::fix_stat`), which also resets the kernel's cached copy.
    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        if offset == 0 {
            self.inner.io.listed(self.ov(), ino.0, req.pid());
        }
        if offset == 0 && self.ov().lists_long(ino.0) {
            let inner = self.inner.clone();
            return self
                .inner
                .long
                .submit(req.uid(), move || inner.readdir(ino, offset, reply));
        }
        self.inner.readdir(ino, offset, reply)
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        let c = ctx(req, 0);
        if offset == 0 {
            self.inner.io.listed(self.ov(), ino.0, c.pid);
        }
        if offset == 0 && self.ov().lists_long(ino.0) {
            let inner = self.inner.clone();
            return self
                .inner
                .long
                .submit(c.uid, move || inner.readdirplus(&c, ino, offset, reply));
        }
        self.inner.readdirplus(&c, ino, offset, reply)
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let target = self.ov().fsyncdir_target(ino.0);
        reply::empty(
            target.and_then(|t| t.map_or(Ok(()), SyncTarget::sync)),
            reply,
        );
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.ov().statfs() {
            Ok(s) => reply::statfs(&s, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let (c, name, value) = (ctx(req, 0), name.to_owned(), value.to_vec());
        self.gated(move |s| reply::empty(s.setxattr(&c, ino, &name, &value, flags), reply))
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.ov().getxattr(ino.0, name) {
            Ok(v) => reply::xattr(&v, size, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.ov().listxattr(ino.0) {
            Ok(v) => reply::xattr(&v, size, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (c, name) = (ctx(req, 0), name.to_owned());
        self.gated(move |s| reply::empty(s.removexattr(&c, ino, &name), reply))
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (c, name) = (ctx(req, umask), name.to_owned());
        let queue = self.queue.clone();
        self.gated(move |s| s.create(&c, parent, &name, mode, flags, queue.as_deref(), reply))
    }

    /// See `NO_IOCTL`.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(NO_IOCTL);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.gated(
            move |s| match s.ov().fallocate(fh.0, mode, offset, length) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            },
        )
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self.ov().lseek(fh.0, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let copy = move |s: &Shared| match s
            .ov()
            .copy_file_range(fh_in.0, offset_in, fh_out.0, offset_out, len)
        {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(e)),
        };
        // Each call copies `COPY_RANGE_MAX` at most; one that may copy
        // that much runs on the copy pool, small ones right here.
        if len < LONG_COPY {
            return self.gated(copy);
        }
        let inner = self.inner.clone();
        self.inner.long.submit(req.uid(), move || {
            // On the pool thread: it may wait out a pause here.
            let _pass = inner.ov.gate().enter();
            copy(&inner)
        })
    }
}
