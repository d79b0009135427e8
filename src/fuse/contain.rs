//! Panic containment: a request handler that panics anyway fails that one
//! request with `EIO`, is logged with the operation and node id, and the
//! mount keeps serving.
//!
//! The request path is written not to panic (an impossible state logs an
//! error and returns `EIO`); this is the net under it. Without it, a panic
//! ends the fuser worker thread it ran on: the request itself still gets
//! `EIO` (fuser's reply objects send `EIO` when dropped unsent, which also
//! happens while unwinding), but the thread is gone, and once every worker
//! has died the kernel's requests queue forever and every caller hangs on
//! a mount that looks alive. Exiting on the first panic instead would turn
//! every open file and every process sitting in the mount into
//! `ENOTCONN`. Failing the one request loses the least: the state a
//! handler leaves behind is made of per-object locks that unwinding
//! releases (parking_lot locks do not poison) and of upper-layer
//! operations that are each atomic on disk.
//!
//! `Contained` wraps the filesystem and delegates every `Filesystem`
//! method through `catch_unwind`, so a method added to `LayerFs` later is
//! covered without touching this file. Each request first passes
//! `Admit::admit`, which may fail it at once (a network lower that does
//! not answer must not hold every worker: see `layer::reach`). It relies on the release profile
//! unwinding on panic (Cargo's default; `panic = "abort"` would make every
//! panic end the daemon, and the next mount recover the stale mountpoint).

use std::ffi::OsStr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, INodeNo,
    IoctlFlags, KernelConfig, LockOwner, OpenFlags, PollEvents, PollFlags, PollNotifier,
    RenameFlags, ReplyAttr, ReplyBmap, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

/// A filesystem whose request handlers may not take the mount down.
pub struct Contained<F>(pub F);

/// Runs one handler; a panic is logged and swallowed. The reply, moved
/// into `f`, is dropped unsent while unwinding, which answers `EIO`.
fn contain(op: &'static str, ino: u64, f: impl FnOnce()) {
    if let Err(panic) = catch_unwind(AssertUnwindSafe(f)) {
        let what = panic
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(no message)");
        tracing::error!(
            op,
            ino,
            "request handler panicked: {what}; the request got EIO, the mount keeps serving"
        );
    }
}

impl<F: Admit> Contained<F> {
    /// Runs an answer computed outside fuser (an io_uring queue's own
    /// answers, `uring::Fast`) under the same rules as a request handler:
    /// counted, admitted, and a panic answered with EIO. `f` may decline
    /// (`None`, having done nothing): the request is then left to fuser,
    /// which counts it.
    pub fn answer<R>(
        &self,
        op: &'static str,
        ino: u64,
        f: impl FnOnce(&F) -> Option<Result<R, Errno>>,
    ) -> Option<Result<R, Errno>> {
        let mut out = Some(Err(Errno::EIO));
        contain(op, ino, || {
            out = match self.0.admit(op, ino) {
                Ok(_pass) => f(&self.0),
                Err(e) => Some(Err(e)),
            }
        });
        if out.is_some() {
            self.0.seen(op);
        }
        out
    }
}

/// What a filesystem decides about a request before its handler runs:
/// let it in (holding the pass until the handler returns) or fail it at
/// once with an errno (see `layer::reach` for the one use: requests that
/// need a network lower that does not answer).
pub trait Admit {
    type Pass;
    /// Notes that a request of operation `op` arrived (every request,
    /// forgets included, before anything else).
    fn seen(&self, op: &'static str);
    fn admit(&self, op: &'static str, ino: u64) -> Result<Self::Pass, Errno>;
}

/// A reply that can carry an errno.
trait Fail {
    fn fail(self, e: Errno);
}

macro_rules! fail {
    ($($t:ty),*) => {
        $(impl Fail for $t {
            fn fail(self, e: Errno) {
                self.error(e)
            }
        })*
    };
}

fail!(
    ReplyAttr,
    ReplyBmap,
    ReplyCreate,
    ReplyData,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyEmpty,
    ReplyEntry,
    ReplyIoctl,
    ReplyLock,
    ReplyLseek,
    ReplyOpen,
    ReplyPoll,
    ReplyStatfs,
    ReplyWrite,
    ReplyXattr
);

/// Delegates each listed method to the inner filesystem through
/// `contain`, after `Admit::admit`, logging the node id given by the
/// first argument after the request. The reply is written after `->` so
/// that a refused request can be answered with its errno.
macro_rules! contained {
    ($( fn $name:ident(&self, $req:ident: $rt:ty, $ino:ident: $it:ty $(, $arg:ident: $ty:ty)* $(,)?) -> $reply:ident: $rpt:ty; )*) => {
        $(
            fn $name(&self, $req: $rt, $ino: $it $(, $arg: $ty)*, $reply: $rpt) {
                let id = node_id(&$ino);
                let op = stringify!($name);
                self.0.seen(op);
                contain(op, id, || match self.0.admit(op, id) {
                    Ok(_pass) => self.0.$name($req, $ino $(, $arg)*, $reply),
                    Err(e) => Fail::fail($reply, e),
                })
            }
        )*
    };
}

/// The node id to log: every contained method's first argument after
/// the request is one. (`batch_forget` is left to the trait's default,
/// which calls the contained `forget` per node.)
fn node_id(ino: &INodeNo) -> u64 {
    ino.0
}

impl<F: Filesystem + Admit> Filesystem for Contained<F> {
    // Not requests: run once, before and after serving.
    fn init(&mut self, req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.0.init(req, config)
    }
    fn destroy(&mut self) {
        self.0.destroy()
    }
    // No reply, and never refused.
    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {
        self.0.seen("forget");
        contain("forget", ino.0, || self.0.forget(req, ino, nlookup))
    }

    contained! {
        fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr) -> reply: ReplyEntry;
        fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>) -> reply: ReplyAttr;
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
            ctime: Option<SystemTime>,
            fh: Option<FileHandle>,
            crtime: Option<SystemTime>,
            chgtime: Option<SystemTime>,
            bkuptime: Option<SystemTime>,
            flags: Option<BsdFileFlags>,
        ) -> reply: ReplyAttr;
        fn readlink(&self, req: &Request, ino: INodeNo) -> reply: ReplyData;
        fn mknod(
            &self,
            req: &Request,
            parent: INodeNo,
            name: &OsStr,
            mode: u32,
            umask: u32,
            rdev: u32,
        ) -> reply: ReplyEntry;
        fn mkdir(
            &self,
            req: &Request,
            parent: INodeNo,
            name: &OsStr,
            mode: u32,
            umask: u32,
        ) -> reply: ReplyEntry;
        fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr) -> reply: ReplyEmpty;
        fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr) -> reply: ReplyEmpty;
        fn symlink(
            &self,
            req: &Request,
            parent: INodeNo,
            link_name: &OsStr,
            target: &Path,
        ) -> reply: ReplyEntry;
        fn rename(
            &self,
            req: &Request,
            parent: INodeNo,
            name: &OsStr,
            newparent: INodeNo,
            newname: &OsStr,
            flags: RenameFlags,
        ) -> reply: ReplyEmpty;
        fn link(
            &self,
            req: &Request,
            ino: INodeNo,
            newparent: INodeNo,
            newname: &OsStr,
        ) -> reply: ReplyEntry;
        fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags) -> reply: ReplyOpen;
        fn read(
            &self,
            req: &Request,
            ino: INodeNo,
            fh: FileHandle,
            offset: u64,
            size: u32,
            flags: OpenFlags,
            lock_owner: Option<LockOwner>,
        ) -> reply: ReplyData;
        fn write(
            &self,
            req: &Request,
            ino: INodeNo,
            fh: FileHandle,
            offset: u64,
            data: &[u8],
            write_flags: WriteFlags,
            flags: OpenFlags,
            lock_owner: Option<LockOwner>,
        ) -> reply: ReplyWrite;
        fn flush(
            &self,
            req: &Request,
            ino: INodeNo,
            fh: FileHandle,
            lock_owner: LockOwner,
        ) -> reply: ReplyEmpty;
        fn release(
            &self,
            req: &Request,
            ino: INodeNo,
            fh: FileHandle,
            flags: OpenFlags,
            lock_owner: Option<LockOwner>,
            flush: bool,
        ) -> reply: ReplyEmpty;
        fn fsync(&self, req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool) -> reply: ReplyEmpty;
        fn opendir(&self, req: &Request, ino: INodeNo, flags: OpenFlags) -> reply: ReplyOpen;
        fn readdir(
            &self,
            req: &Request,
            ino: INodeNo,
            fh: FileHandle,
            offset: u64,
        ) -> reply: ReplyDirectory;
        fn readdirplus(
            &self,
            req: &Request,
            ino: INodeNo,
            fh: FileHandle,
            offset: u64,
        ) -> reply: ReplyDirectoryPlus;
        fn releasedir(
            &self,
            req: &Request,
            ino: INodeNo,
            fh: FileHandle,
            flags: OpenFlags,
        ) -> reply: ReplyEmpty;
        fn fsyncdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool) -> reply: ReplyEmpty;
        fn statfs(&self, req: &Request, ino: INodeNo) -> reply: ReplyStatfs;
        fn setxattr(
            &self,
            req: &Request,
            ino: INodeNo,
            name: &OsStr,
            value: &[u8],
            flags: i32,
            position: u32,
        ) -> reply: ReplyEmpty;
        fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32) -> reply: ReplyXattr;
        fn listxattr(&self, req: &Request, ino: INodeNo, size: u32) -> reply: ReplyXattr;
        fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr) -> reply: ReplyEmpty;
        fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags) -> reply: ReplyEmpty;
        fn create(
            &self,
            req: &Request,
            parent: INodeNo,
            name: &OsStr,
            mode: u32,
            umask: u32,
            flags: i32,
        ) -> reply: ReplyCreate;
        fn getlk(
            &self,
            req: &Request,
            ino: INodeNo,
            fh: FileHandle,
            lock_owner: LockOwner,
            start: u64,
            end: u64,
            typ: i32,
            pid: u32,
        ) -> reply: ReplyLock;
        fn setlk(
            &self,
            req: &Request,
            ino: INodeNo,
            fh: FileHandle,
            lock_owner: LockOwner,
            start: u64,
            end: u64,
            typ: i32,
            pid: u32,
            sleep: bool,
        ) -> reply: ReplyEmpty;
        fn bmap(&self, req: &Request, ino: INodeNo, blocksize: u32, idx: u64) -> reply: ReplyBmap;
        fn ioctl(
            &self,
            req: &Request,
            ino: INodeNo,
            fh: FileHandle,
            flags: IoctlFlags,
            cmd: u32,
            in_data: &[u8],
            out_size: u32,
        ) -> reply: ReplyIoctl;
        fn poll(
            &self,
            req: &Request,
            ino: INodeNo,
            fh: FileHandle,
            ph: PollNotifier,
            events: PollEvents,
            flags: PollFlags,
        ) -> reply: ReplyPoll;
        fn fallocate(
            &self,
            req: &Request,
            ino: INodeNo,
            fh: FileHandle,
            offset: u64,
            length: u64,
            mode: i32,
        ) -> reply: ReplyEmpty;
        fn lseek(
            &self,
            req: &Request,
            ino: INodeNo,
            fh: FileHandle,
            offset: i64,
            whence: i32,
        ) -> reply: ReplyLseek;
        fn copy_file_range(
            &self,
            req: &Request,
            ino_in: INodeNo,
            fh_in: FileHandle,
            offset_in: u64,
            ino_out: INodeNo,
            fh_out: FileHandle,
            offset_out: u64,
            len: u64,
            flags: CopyFileRangeFlags,
        ) -> reply: ReplyWrite;
    }
}
