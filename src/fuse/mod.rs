//! The FUSE adapter: `fuser::Filesystem` as thin delegations to the overlay
//! core, plus what only the kernel interface knows about: errno replies,
//! cache timeouts, init flags and passthrough (`io_mode`).

mod contain;
mod convert;
mod invalidate;
mod io_mode;
mod long;
mod record;
#[allow(unsafe_code)]
mod sys;
#[allow(unsafe_code)]
pub mod uring;
mod watcher;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fuser::{
    CopyFileRangeFlags, Errno, FileHandle, Generation, INodeNo, InitFlags, IoctlFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::config::Config;
use crate::overlay::attr::SetAttr;
use crate::overlay::copy_up::{Halt, NoHalt};
use crate::overlay::dir::NewKind;
use crate::overlay::events::{EvOp, Sink};
use crate::overlay::file::{wants_write, Opened, LONG_COPY};
use crate::overlay::gate::PauseGuard;
use crate::overlay::{Ctx, Entry, Overlay};
use crate::policy::Policy;
pub use contain::Contained;

/// Everything a request needs, shared with the daemon's handle and with
/// requests parked while writes are paused (`LayerFs::gated`).
struct Shared {
    ov: Overlay,
    notifier: OnceLock<fuser::Notifier>,
    /// Cache timeout for anything that involves a lower layer.
    lower_ttl: Duration,
    /// Cache timeout for objects that live only in the upper, which only
    /// this daemon changes.
    upper_ttl: Duration,
    io: io_mode::IoModes,
    rec: record::Recorder,
    /// `--io-uring` was asked for.
    want_uring: bool,
    /// What INIT settled, once it has; `negotiated.uring` says whether the
    /// kernel agreed to io_uring.
    negotiated: OnceLock<Negotiated>,
    /// The io_uring queues' counters, once they serve.
    uring: OnceLock<Arc<uring::Stats>>,
    /// Where long copies run, off the request threads (`long`).
    long: long::Pool,
}

/// The outcome of the INIT handshake the daemon needs afterwards.
#[derive(Clone, Copy, Debug)]
pub struct Negotiated {
    /// The kernel agreed to serve requests through io_uring.
    pub uring: bool,
    /// Why not, when io_uring was asked for and is off.
    pub uring_refused: Option<&'static str>,
    pub init: uring::Negotiated,
    /// The capabilities layerfs asked for (the queues' own sessions ask
    /// for the same).
    pub requested: InitFlags,
}

/// Handle the daemon keeps after the filesystem moved into the session:
/// policy reloads (SIGHUP) and the kernel notifier go through it.
#[derive(Clone)]
pub struct FsHandle {
    inner: Arc<Shared>,
}

impl FsHandle {
    /// Swap the policy in effect; requests already running finish with the old one.
    ///
    /// The kernel may hold names the new rules hide, for as long as their
    /// entry timeout (a minute for upper-only objects): every name it holds
    /// is invalidated so the next access asks the daemon, and the new
    /// rules, again. Runs on the signal thread, never inside a request.
    pub fn reload_policy(&self, policy: Policy) {
        self.inner.ov.set_policy(policy);
        let Some(notifier) = self.inner.notifier.get() else {
            return;
        };
        // Cached listings may show names now hidden, too.
        let dropped = watcher::invalidate_all(&self.inner.ov, notifier);
        tracing::info!(names = dropped, "policy reloaded; cached names invalidated");
    }
    /// Sends change events to `sink` (the journal) from now on.
    pub fn set_journal(&self, sink: Arc<dyn Sink>) {
        self.inner.rec.set_sink(sink);
    }

    /// (requests, copy-ups, policy denials) since the mount.
    /// Requests per second over the last `window` seconds.
    pub fn request_rate(&self, window: u64) -> f64 {
        self.inner.rec.rate.per_second(window)
    }

    /// Requests received per operation since the mount (nonzero ones).
    pub fn requests_by_op(&self) -> Vec<(&'static str, u64)> {
        self.inner.rec.by_op.seen()
    }

    pub fn counters(&self) -> (u64, u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let r = &self.inner.rec;
        (
            r.requests.load(Relaxed),
            r.copy_ups.load(Relaxed),
            r.denials.load(Relaxed),
        )
    }

    /// The overlay core being served.
    pub fn overlay(&self) -> &Overlay {
        &self.inner.ov
    }

    /// Pauses every mutating request (see `overlay::gate`) and waits, up to
    /// `wait`, for passthrough handles open for writing to close: their
    /// writes bypass the daemon, so only their closing ends them (only the
    /// mount owner opens such handles, see `io_mode`). Returns the guard
    /// (writes resume when it is dropped) and the paths still open for
    /// writing when the wait ended, with the uid holding each (empty when
    /// drained).
    pub fn pause_writes(&self, wait: Duration) -> (PauseGuard<'_>, Vec<(String, u32)>) {
        let guard = self.inner.ov.pause_writes();
        let deadline = std::time::Instant::now() + wait;
        loop {
            let ids = self.inner.io.passthrough_writers();
            if ids.is_empty() {
                return (guard, Vec::new());
            }
            if std::time::Instant::now() >= deadline {
                let ov = &self.inner.ov;
                let busy = ids
                    .into_iter()
                    .filter_map(|(id, uid)| ov.inodes.get(id).map(|i| (ov.path_of(&i), uid)))
                    .collect();
                return (guard, busy);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Drops the kernel's cached names, attributes, pages and listings for
    /// these paths (relative to the mount root) and below, and re-resolves
    /// the daemon's record of them. Returns how many objects were
    /// invalidated; 0 before the session is up. Never call it from inside
    /// a request: the kernel may hold locks the invalidation needs.
    pub fn invalidate_paths(&self, paths: &[String]) -> usize {
        match self.inner.notifier.get() {
            Some(n) => invalidate::invalidate_paths(&self.inner.ov, n, paths),
            None => 0,
        }
    }

    /// After a live restore replaced the upper: drops everything the
    /// kernel caches about any object it holds, and the names `names`
    /// ((directory id, name), which it may cache as absent). See
    /// `invalidate::invalidate_everything`; same rules as `invalidate_paths`.
    pub fn invalidate_restored(&self, names: &[(u64, std::ffi::OsString)]) -> usize {
        match self.inner.notifier.get() {
            Some(n) => invalidate::invalidate_everything(&self.inner.ov, n, names),
            None => 0,
        }
    }

    /// Drops every name, attribute and listing the kernel caches.
    pub fn invalidate_all(&self) -> usize {
        match self.inner.notifier.get() {
            Some(n) => watcher::invalidate_all(&self.inner.ov, n),
            None => 0,
        }
    }

    /// Give the filesystem the session's notifier, for cache invalidations.
    /// What INIT settled (`None` before the handshake).
    pub fn negotiated(&self) -> Option<Negotiated> {
        self.inner.negotiated.get().copied()
    }

    /// The filesystem an io_uring queue's own session serves (see
    /// `LayerFs::queue_view`), wrapped as every session's is.
    pub fn queue_view(&self, side: Arc<uring::QueueSide>) -> Contained<LayerFs> {
        Contained(LayerFs {
            inner: self.inner.clone(),
            queue: Some(side),
        })
    }

    /// Records that io_uring queues serve this mount.
    pub fn set_uring(&self, stats: Arc<uring::Stats>) {
        let _ = self.inner.uring.set(stats);
    }

    /// Whether `--io-uring` was asked for.
    pub fn uring_requested(&self) -> bool {
        self.inner.want_uring
    }

    /// The io_uring queues' counters, when they serve this mount.
    pub fn uring(&self) -> Option<Arc<uring::Stats>> {
        self.inner.uring.get().cloned()
    }

    pub fn set_notifier(&self, notifier: fuser::Notifier) {
        if let Some(reach) = &self.inner.ov.reach {
            // Answers given while a network lower was missing may be in
            // the kernel's caches: drop them all once it is back.
            let weak = Arc::downgrade(&self.inner);
            reach.set_on_back(Box::new(move || {
                if let Some(inner) = weak.upgrade() {
                    if let Some(n) = inner.notifier.get() {
                        let names = watcher::invalidate_all(&inner.ov, n);
                        tracing::info!(names, "lowers answer again; cached names invalidated");
                    }
                }
            }));
        }
        let _ = self.inner.notifier.set(notifier);
    }

    /// The lower watch, for the service thread to poll; `None` without a
    /// watch or before `set_notifier`. Taking it marks the watch live.
    pub fn lower_watch(&self) -> Option<LowerWatch> {
        self.inner.notifier.get()?;
        let fd = watcher::start(&self.inner.ov)?;
        Some(LowerWatch {
            inner: self.inner.clone(),
            fd,
        })
    }
}

/// The lower watch as the service thread sees it: an fd to poll and what
/// to do when it is readable.
pub struct LowerWatch {
    inner: Arc<Shared>,
    fd: std::os::fd::RawFd,
}

impl LowerWatch {
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.fd
    }

    /// Applies the pending lower changes; false once the watch failed.
    pub fn drain(&self) -> bool {
        match self.inner.notifier.get() {
            Some(n) => watcher::drain(&self.inner.ov, n),
            None => false,
        }
    }
}

pub struct LayerFs {
    inner: Arc<Shared>,
    /// Set on the filesystem of an io_uring queue's own session: requests
    /// it serves came through that queue (see `uring`).
    queue: Option<Arc<uring::QueueSide>>,
}

fn ctx(req: &Request, umask: u32) -> Ctx {
    Ctx {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
        umask,
    }
}

fn errno(e: crate::overlay::Errno) -> Errno {
    Errno::from_i32(e.0)
}

impl LayerFs {
    /// Opens every layer root and the work dir; fails with a message naming
    /// the layer and the problem.
    pub fn new(cfg: &Config) -> Result<LayerFs, String> {
        crate::failpoint::init();
        let ov = Overlay::new(&cfg.overlay_options())?;
        let root = nix::unistd::geteuid().is_root();
        Ok(LayerFs {
            inner: Arc::new(Shared {
                ov,
                notifier: OnceLock::new(),
                lower_ttl: cfg.lower_timeout,
                upper_ttl: cfg.lower_timeout.max(Duration::from_secs(60)),
                io: io_mode::IoModes::new(root),
                rec: Default::default(),
                want_uring: cfg.io_uring,
                negotiated: OnceLock::new(),
                uring: OnceLock::new(),
                long: long::Pool::new(cfg.threads),
            }),
            queue: None,
        })
    }

    pub fn handle(&self) -> FsHandle {
        FsHandle {
            inner: self.inner.clone(),
        }
    }

    fn ov(&self) -> &Overlay {
        &self.inner.ov
    }

    /// Runs a mutating request inside the write gate. While writes are
    /// paused the request is parked on a thread of its own until the pause
    /// ends, so the FUSE worker threads stay free for readers.
    fn gated(&self, op: impl FnOnce(&Shared) + Send + 'static) {
        if let Some(_pass) = self.inner.ov.gate.try_enter() {
            return op(&self.inner);
        }
        let inner = self.inner.clone();
        let parked = std::thread::Builder::new()
            .name("parked-write".into())
            .spawn(move || {
                let _pass = inner.ov.gate.enter();
                op(&inner)
            });
        if let Err(e) = parked {
            // The closure (and its reply) went with the failed spawn: the
            // request is answered EIO when the unsent reply is dropped.
            tracing::error!("cannot park a write while paused: {e}; it fails with EIO");
        }
    }
}

impl LayerFs {
    fn ttl(&self, lower: bool) -> Duration {
        self.inner.ttl(lower)
    }

    /// GETATTR's answer: how long the kernel may keep it, and the
    /// attributes (for fuser's reply and for `QueueAnswers`).
    fn attr_of(&self, ino: u64) -> Result<(Duration, crate::layer::sys::Stat), Errno> {
        match self.ov().getattr(ino) {
            Ok((st, lower)) => Ok((self.ttl(lower), st)),
            Err(e) => Err(errno(e)),
        }
    }
}

/// The requests an io_uring queue thread answers itself (`uring::Fast`):
/// GETATTR and GETXATTR, the most frequent ones that change nothing (and,
/// on local layers, do not wait long), with
/// the same handler code as through fuser (`LayerFs::attr_of`, the
/// overlay's getxattr) and the same admission (`Contained::answer`); only
/// the reply is encoded here.
pub struct QueueAnswers {
    fs: Contained<LayerFs>,
    /// fuser's session rule: with `SessionACL::Owner`, requests of other
    /// users are refused; those are left to fuser.
    anyone: bool,
    owner: u32,
}

impl FsHandle {
    /// The queue threads' own answers, or `None` for a mount with a
    /// network lower: it can stop answering, and a queue thread waiting on
    /// it would stall every request of its CPU (request threads waiting on
    /// it are bounded by the lower guard instead).
    pub fn queue_answers(&self, acl: fuser::SessionACL) -> Option<QueueAnswers> {
        if self.inner.ov.reach.is_some() {
            return None;
        }
        Some(QueueAnswers {
            fs: Contained(LayerFs {
                inner: self.inner.clone(),
                queue: None,
            }),
            anyone: acl == fuser::SessionACL::All,
            owner: nix::unistd::getuid().as_raw(),
        })
    }
}

impl uring::Fast for QueueAnswers {
    fn answer(
        &self,
        req: uring::Req,
        arg: &[u8],
        rest: &[u8],
        out: &mut [u8],
    ) -> Option<Result<usize, i32>> {
        if !self.anyone && req.uid != self.owner {
            return None;
        }
        let r = match req.opcode {
            uring::FUSE_GETATTR => self
                .fs
                .answer("getattr", req.nodeid, |fs| fs.attr_of(req.nodeid))
                .map(|(ttl, st)| convert::attr_out(&ttl, &st, out)),
            uring::FUSE_GETXATTR => {
                // fuse_getxattr_in: size (u32), padding; then the name.
                let size = u32::from_ne_bytes(arg.get(0..4)?.try_into().ok()?);
                let name = rest.split(|&b| b == 0).next()?;
                let name = std::ffi::OsStr::from_bytes(name);
                self.fs
                    .answer("getxattr", req.nodeid, |fs| {
                        fs.ov().getxattr(req.nodeid, name).map_err(errno)
                    })
                    .and_then(|v| convert::xattr_out(&v, size, out))
            }
            _ => return None,
        };
        Some(r.map_err(|e| e.code()))
    }
}

impl Shared {
    fn ov(&self) -> &Overlay {
        &self.ov
    }

    fn ttl(&self, lower: bool) -> Duration {
        if lower {
            self.lower_ttl
        } else {
            self.upper_ttl
        }
    }

    /// The path of object `ino`, when the journal wants it.
    fn path(&self, ino: u64) -> Option<String> {
        if !self.rec.on() {
            return None;
        }
        Some(match self.ov().inode(ino) {
            Ok(i) => self.ov().path_of(&i),
            Err(_) => format!("<node {ino}>"),
        })
    }

    /// The path of `name` in directory `parent`, when the journal wants it.
    fn child(&self, parent: INodeNo, name: &OsStr) -> Option<String> {
        if !self.rec.on() {
            return None;
        }
        Some(match self.ov().inode(parent.0) {
            Ok(p) => self.ov().child_path(&p, name),
            Err(_) => name.to_string_lossy().into_owned(),
        })
    }

    /// Records the end of a mutating request (see `record::Recorder::done`).
    fn done<T>(
        &self,
        c: &Ctx,
        op: EvOp,
        path: Option<String>,
        to: Option<String>,
        r: &crate::overlay::Result<T>,
    ) {
        let errno = r.as_ref().err().map_or(0, |e| e.0);
        self.rec.done(c, &[(op, None)], path, to, errno);
    }

    /// mknod, mkdir, symlink and link: create the object, reply its entry.
    fn create_entry(
        &self,
        c: &Ctx,
        parent: INodeNo,
        name: &OsStr,
        kind: NewKind<'_>,
        reply: ReplyEntry,
    ) {
        let new_path = self.child(parent, name);
        let (op, path, to) = match &kind {
            NewKind::Dir { .. } => (EvOp::Mkdir, new_path, None),
            NewKind::Node { .. } => (EvOp::Mknod, new_path, None),
            NewKind::File { .. } => (EvOp::Create, new_path, None),
            NewKind::Symlink { target } => (
                EvOp::Symlink,
                new_path,
                Some(target.to_string_lossy().into_owned()),
            ),
            NewKind::Link { source } => (EvOp::Link, self.path(source.id), new_path),
        };
        let r = self
            .ov()
            .create_object(c, parent.0, name, kind)
            .map(|(e, _)| e);
        self.done(c, op, path, to, &r);
        self.reply_entry(r, reply)
    }

    fn reply_entry(&self, r: crate::overlay::Result<Entry>, reply: ReplyEntry) {
        match r {
            Ok(e) => reply.entry(&self.ttl(e.lower), &convert::attr(&e.st), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn reply_attr(
        &self,
        ino: INodeNo,
        r: crate::overlay::Result<crate::layer::sys::Stat>,
        reply: ReplyAttr,
    ) {
        match r {
            Ok(st) => {
                let lower = self
                    .ov()
                    .inode(ino.0)
                    .map(|i| self.ov().volatile(&i))
                    .unwrap_or(true);
                reply.attr(&self.ttl(lower), &convert::attr(&st))
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    /// An open's work (the caller's share of daemon-served writers booked
    /// first for another user's open for writing; see `io_mode`): the
    /// result, and whether a booking was taken.
    fn open_file(
        &self,
        c: &Ctx,
        ino: INodeNo,
        flags: OpenFlags,
        halt: &dyn Halt,
    ) -> (crate::overlay::Result<Opened>, bool) {
        let booking = if !self.ov().files.shares.is_owner(c.uid) {
            self.io
                .book_daemon_write(ino.0)
                .map_err(crate::overlay::Errno)
        } else {
            Ok(false)
        };
        let booked = *booking.as_ref().unwrap_or(&false);
        let r = booking.and_then(|_| self.ov().open_halting(c, ino.0, flags.0, halt));
        if booked && r.is_err() {
            self.io.cancel_booking(ino.0);
        }
        (r, booked)
    }

    /// An open that copies up a large file, on the copy pool: inside the
    /// write gate like any open for writing, its copy watched (`long::Watch`).
    /// A copy stopped for a pause waits for the pause to end and starts
    /// again; one stopped because its caller was killed answers `EINTR`.
    fn open_copying(
        &self,
        c: &Ctx,
        ino: INodeNo,
        flags: OpenFlags,
        queue: Option<Arc<uring::QueueSide>>,
        reply: ReplyOpen,
    ) {
        loop {
            // Invariant: the pass is dropped before the next `enter`.
            let _pass = self.ov.gate.enter();
            let watch = long::Watch::new(c.pid, &self.ov.gate);
            let r = self.open_file(c, ino, flags, &watch);
            if r.0.is_err() && watch.stopped() == Some(long::Stopped::PauseWanted) {
                continue;
            }
            return self.opened(c, ino, flags, r, queue, reply);
        }
    }

    /// Records an open's outcome in the journal and replies to it.
    fn opened(
        &self,
        c: &Ctx,
        ino: INodeNo,
        flags: OpenFlags,
        (r, booked): (crate::overlay::Result<Opened>, bool),
        queue: Option<Arc<uring::QueueSide>>,
        reply: ReplyOpen,
    ) {
        if wants_write(flags.0) {
            // The open itself is a change only when it truncates; a
            // refused open for writing is recorded as a refused write.
            let trunc = flags.0 & libc::O_TRUNC != 0;
            let row = match (&r, trunc) {
                (Ok(_), true) => Some((EvOp::Truncate, Some(0))),
                (Ok(_), false) => None,
                (Err(_), true) => Some((EvOp::Truncate, None)),
                (Err(_), false) => Some((EvOp::Write, None)),
            };
            let errno = r.as_ref().err().map_or(0, |e| e.0);
            self.rec
                .done(c, row.as_slice(), self.path(ino.0), None, errno);
        }
        match r {
            Ok(o) => {
                let (fh, writable) = (o.fh, o.writable);
                self.io
                    .reply_open(self.ov(), ino.0, o, queue.as_deref(), booked, reply, |pt| {
                        if writable {
                            self.rec.opened(self.ov(), fh, c, pt)
                        }
                    })
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    /// READDIR: from offset 0 a listing is built (or shared, see
    /// `Overlay::dir_listing`), later offsets continue it.
    fn readdir(&self, ino: INodeNo, offset: u64, mut reply: ReplyDirectory) {
        let (dir, entries) = match self.ov().dir_listing(ino.0, offset) {
            Ok(x) => x,
            Err(e) => return reply.error(errno(e)),
        };
        // Offsets: `.` is 1, `..` is 2, entry i is i + 3.
        let mut off = offset;
        if off == 0 {
            if reply.add(ino, 1, fuser::FileType::Directory, ".") {
                return reply.ok();
            }
            off = 1;
        }
        if off == 1 {
            let pid = dir.parent().map(|p| p.id).unwrap_or(ino.0);
            if reply.add(INodeNo(pid), 2, fuser::FileType::Directory, "..") {
                return reply.ok();
            }
            off = 2;
        }
        for (i, e) in entries.iter().enumerate().skip((off - 2) as usize) {
            if reply.add(INodeNo(e.id), i as u64 + 3, convert::kind(e.kind), &e.name) {
                return reply.ok();
            }
        }
        self.ov().dir_listing_done(&dir);
        reply.ok();
        release_listing(entries);
    }

    /// READDIRPLUS: as `readdir`, each entry with its attributes.
    fn readdirplus(&self, c: &Ctx, ino: INodeNo, offset: u64, mut reply: ReplyDirectoryPlus) {
        let (dir, entries) = match self.ov().dir_listing(ino.0, offset) {
            Ok(x) => x,
            Err(e) => return reply.error(errno(e)),
        };
        let zero = Duration::ZERO;
        let mut off = offset;
        // The kernel uses neither the attributes nor the node of `.` and
        // `..` in a READDIRPLUS reply (it skips both when filling its
        // caches): `..` gets the directory's own attributes, so listing a
        // directory never touches its parent (whose lower may be a
        // network filesystem that does not answer).
        let here = if off < 2 {
            self.ov()
                .getattr(ino.0)
                .ok()
                .map(|(st, _)| convert::attr(&st))
        } else {
            None
        };
        if off == 0 {
            if let Some(a) = &here {
                if reply.add(ino, 1, ".", &zero, a, Generation(0)) {
                    return reply.ok();
                }
            }
            off = 1;
        }
        if off == 1 {
            let pid = dir.parent().map(|p| p.id).unwrap_or(ino.0);
            if let Some(a) = &here {
                if reply.add(INodeNo(pid), 2, "..", &zero, a, Generation(0)) {
                    return reply.ok();
                }
            }
            off = 2;
        }
        for (i, e) in entries.iter().enumerate().skip((off - 2) as usize) {
            // Each entry sent counts one lookup, like a LOOKUP reply.
            let Ok(ent) = self.ov().lookup(c, ino.0, &e.name) else {
                continue;
            };
            let full = reply.add(
                INodeNo(ent.id),
                i as u64 + 3,
                &e.name,
                &self.ttl(ent.lower),
                &convert::attr(&ent.st),
                Generation(0),
            );
            if full {
                // Not sent after all: give the lookup back.
                self.ov().forget(ent.id, 1);
                return reply.ok();
            }
        }
        self.ov().dir_listing_done(&dir);
        reply.ok();
        release_listing(entries);
    }

    fn write(&self, fh: u64, offset: u64, data: &[u8], reply: ReplyWrite) {
        match self.ov().write(fh, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(e)),
        }
    }

    // FUSE CREATE's own arguments, plus how the request came.
    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        c: &Ctx,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        flags: i32,
        via: io_mode::Via,
        reply: ReplyCreate,
    ) {
        let kind = NewKind::File { mode, flags };
        let path = self.child(parent, name);
        // The creator's share of the daemon's fds first: over it, nothing
        // is created (EMFILE, as open(2) checks for a free fd first).
        let created = self
            .ov()
            .files
            .charge(c.uid)
            .and_then(|charge| Ok((self.ov().create_object(c, parent.0, name, kind)?, charge)));
        self.done(c, EvOp::Create, path, None, &created);
        let (entry, fd, charge) = match created {
            Ok(((e, Some(fd)), charge)) => (e, fd, charge),
            Ok(((_, None), _)) => return reply.error(Errno::EIO),
            Err(e) => return reply.error(errno(e)),
        };
        match self.ov().adopt(entry.id, fd, flags, charge) {
            Ok(o) => {
                let (fh, writable) = (o.fh, o.writable);
                let ttl = self.ttl(entry.lower);
                self.io
                    .reply_create(self.ov(), &entry, ttl, o, via, reply, |pt| {
                        if writable {
                            self.rec.opened(self.ov(), fh, c, pt)
                        }
                    })
            }
            Err(e) => reply.error(errno(e)),
        }
    }
}

impl contain::Admit for LayerFs {
    type Pass = Option<crate::layer::reach::Pass>;

    fn seen(&self, op: &'static str) {
        self.inner.rec.tick(op);
    }

    /// Requests about an object that may reach a network lower take a
    /// lower slot (`layer::reach`); lookups, getattr, listings and
    /// releases go on without the network lowers when no slot is to be
    /// had. Requests that never reach a lower pass freely.
    fn admit(&self, op: &'static str, ino: u64) -> Result<Self::Pass, Errno> {
        let Some(reach) = &self.ov().reach else {
            return Ok(None);
        };
        let free = matches!(
            op,
            "releasedir" | "flush" | "opendir" | "statfs" | "write" | "ioctl"
        );
        if free || !self.ov().involves_remote(ino) {
            return Ok(None);
        }
        // A release is never refused: without a slot it closes the file
        // on a thread of its own (`Overlay::release`).
        let may_do_without = matches!(
            op,
            "lookup" | "getattr" | "readdir" | "readdirplus" | "release"
        );
        reach
            .admit(may_do_without)
            .map(Some)
            .map_err(Errno::from_i32)
    }
}

impl fuser::Filesystem for LayerFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if self.queue.is_some() {
            // A queue's own session: the kernel's INIT is over; ask for
            // what the mount asked for, so both sessions decode alike.
            if let Some(n) = self.inner.negotiated.get() {
                let _ = config.add_capabilities(n.requested & config.capabilities());
                let _ = config.set_max_write(n.init.max_write);
                if n.requested.contains(InitFlags::FUSE_PASSTHROUGH) {
                    let _ = config.set_max_stack_depth(1);
                }
            }
            return Ok(());
        }
        let wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_POSIX_ACL
            // Modes arrive with the caller's umask unapplied: the core
            // applies it unless a default ACL decides (overlay::mode).
            | InitFlags::FUSE_DONT_MASK
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_MAX_PAGES;
        // Not FUSE_HANDLE_KILLPRIV_V2: it would spare the kernel's
        // security.capability lookup before each write, but then nothing
        // clears setuid/setgid on passthrough writes by other users (the
        // backing write runs with the daemon's CAP_FSETID). The lookup
        // costs one round trip per write syscall.
        // A network lower changes behind the kernel's back: let the
        // kernel check a file's attributes (and drop its cached pages and
        // listing when they changed) once they time out, before a read or
        // a listing from the start, rather than only at open.
        let wanted = if self.ov().reach.is_some() {
            wanted | InitFlags::FUSE_AUTO_INVAL_DATA
        } else {
            wanted
        };
        // Take what the kernel offers of them (the call adds all or none).
        let mut asked = wanted & config.capabilities();
        if let Err(missing) = config.add_capabilities(wanted) {
            tracing::debug!("kernel lacks {missing:?}");
            let _ = config.add_capabilities(wanted & !missing);
        }
        if self.inner.io.passthrough_wanted() {
            let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(1).is_ok();
            if ok {
                asked |= InitFlags::FUSE_PASSTHROUGH;
            }
            self.inner
                .io
                .set_passthrough(ok && !self.ov().quota.bytes_limited());
        }
        let max_write = match config.set_max_write(1 << 20) {
            Ok(_) => 1 << 20,
            Err(most) => {
                let _ = config.set_max_write(most);
                most
            }
        };
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        // io_uring only when asked for, and offered: the kernel offers it
        // only while root has set fuse's `enable_uring` (which layerfs
        // never changes).
        let mut uring_refused = None;
        let uring = self.inner.want_uring
            && if !config
                .capabilities()
                .contains(InitFlags::FUSE_OVER_IO_URING)
            {
                uring_refused = Some(if uring::kernel_allows() == Some(false) {
                    "the kernel does not offer it: /sys/module/fuse/parameters/enable_uring is N"
                } else {
                    "the kernel does not offer it"
                });
                false
            } else {
                config
                    .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                    .is_ok()
            };
        let _ = self.inner.negotiated.set(Negotiated {
            uring,
            uring_refused,
            init: uring::Negotiated {
                minor: config.kernel_abi().1,
                max_readahead: 128 * 1024,
                capabilities: config.capabilities().bits(),
                max_write,
            },
            requested: asked,
        });
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        crate::failpoint::hit("lookup", name);
        match self.ov().lookup(&ctx(req, 0), parent.0, name) {
            Ok(e) => reply.entry(&self.ttl(e.lower), &convert::attr(&e.st), Generation(0)),
            // A negative entry, trusted as long as the directory's other
            // entries are: a lower name appearing in a watched directory
            // is invalidated when it appears.
            // Names the policy hides are never cached as absent: a reload
            // that shows them again must take effect at once.
            Err(e) if e.0 == libc::ENOENT && self.ov().hides(parent.0, name) => {
                reply.error(errno(e))
            }
            Err(e) if e.0 == libc::ENOENT && !self.inner.lower_ttl.is_zero() => {
                let mut attr = convert::attr(&crate::overlay::attr::zero_stat());
                attr.ino = INodeNo(0);
                let ttl = self.ttl(!self.ov().dir_watched(parent.0));
                reply.entry(&ttl, &attr, Generation(0))
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.ov().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr_of(ino.0) {
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
        let a = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(convert::timespec),
            mtime: mtime.map(convert::timespec),
            fh: fh.map(|f| f.0),
        };
        let c = ctx(req, 0);
        self.gated(move |s| {
            let path = s.path(ino.0);
            s.rec.around_setattr(s.ov(), ino.0, false);
            let r = s.ov().setattr(&c, ino.0, &a);
            s.rec.around_setattr(s.ov(), ino.0, true);
            let mut rows = Vec::with_capacity(4);
            if a.mode.is_some() {
                rows.push((EvOp::Chmod, None));
            }
            if a.uid.is_some() || a.gid.is_some() {
                rows.push((EvOp::Chown, None));
            }
            if let Some(size) = a.size {
                rows.push((EvOp::Truncate, Some(size)));
            }
            if a.atime.is_some() || a.mtime.is_some() {
                rows.push((EvOp::Utimes, None));
            }
            let errno = r.as_ref().err().map_or(0, |e| e.0);
            s.rec.done(&c, &rows, path, None, errno);
            s.reply_attr(ino, r, reply)
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
        self.gated(move |s| {
            let path = s.child(parent, &name);
            let r = s.ov().unlink(&c, parent.0, &name);
            s.done(&c, EvOp::Unlink, path, None, &r);
            reply_empty(r, reply)
        })
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (c, name) = (ctx(req, 0), name.to_owned());
        self.gated(move |s| {
            let path = s.child(parent, &name);
            let r = s.ov().rmdir(&c, parent.0, &name);
            s.done(&c, EvOp::Rmdir, path, None, &r);
            reply_empty(r, reply)
        })
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
            let (from, to) = (s.child(parent, &name), s.child(newparent, &newname));
            let r = s
                .ov()
                .rename(&c, parent.0, &name, newparent.0, &newname, flags.bits());
            s.done(&c, EvOp::Rename, from, to, &r);
            reply_empty(r, reply)
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
        self.gated(move |s| {
            let source = match s.ov().inode(ino.0) {
                Ok(src) => src,
                Err(e) => return reply.error(errno(e)),
            };
            let kind = NewKind::Link { source: &source };
            s.create_entry(&c, newparent, &newname, kind, reply)
        })
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let c = ctx(req, 0);
        let queue = self.queue.clone();
        // An open for writing copies up and lets passthrough writes
        // through: it waits while writes are paused. Reads never do.
        if !wants_write(flags.0) {
            let r = self.ov().open(&c, ino.0, flags.0);
            return self.inner.opened(&c, ino, flags, (r, false), queue, reply);
        }
        if self.ov().open_copies_long(ino.0, flags.0) {
            let inner = self.inner.clone();
            return self.inner.long.submit(c.uid, move || {
                inner.open_copying(&c, ino, flags, queue, reply)
            });
        }
        self.gated(move |s| {
            let r = s.open_file(&c, ino, flags, &NoHalt);
            s.opened(&c, ino, flags, r, queue, reply)
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
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // The data is copied only for a request parked by a pause.
        if let Some(_pass) = self.ov().gate.try_enter() {
            return self.inner.write(fh.0, offset, data, reply);
        }
        let data = data.to_vec();
        self.gated(move |s| s.write(fh.0, offset, &data, reply))
    }

    /// Nothing is buffered in the daemon and locks live in the kernel, so
    /// a close has nothing to flush: ENOSYS tells the kernel to stop
    /// sending FLUSH at all (one round trip less per close).
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
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
        self.inner
            .rec
            .writes(self.ov(), fh.0, Some(&ctx(req, 0)), true);
        self.inner.io.release(self.ov(), ino.0, fh.0);
        self.ov().release(fh.0);
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
        self.inner
            .rec
            .writes(self.ov(), fh.0, Some(&ctx(req, 0)), false);
        match self.ov().fsync(fh.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
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
        match self.ov().fsyncdir(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.ov().statfs() {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                255,
                s.f_frsize as u32,
            ),
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
        self.gated(move |s| {
            let path = s.path(ino.0);
            let r = s.ov().setxattr(&c, ino.0, &name, &value, flags);
            let attr = Some(name.to_string_lossy().into_owned());
            s.done(&c, EvOp::Setxattr, path, attr, &r);
            reply_empty(r, reply)
        })
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.ov().getxattr(ino.0, name) {
            Ok(v) => xattr_reply(&v, size, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.ov().listxattr(ino.0) {
            Ok(v) => xattr_reply(&v, size, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (c, name) = (ctx(req, 0), name.to_owned());
        self.gated(move |s| {
            let path = s.path(ino.0);
            let r = s.ov().removexattr(&c, ino.0, &name);
            let attr = Some(name.to_string_lossy().into_owned());
            s.done(&c, EvOp::Removexattr, path, attr, &r);
            reply_empty(r, reply)
        })
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

    /// No file ioctls are forwarded: tools probing for flags or reflinks
    /// (`FS_IOC_GETFLAGS`, `FICLONE`) get ENOTTY and fall back, without a
    /// log line per call.
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
        reply.error(Errno::ENOTTY);
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
            let _pass = inner.ov.gate.enter();
            copy(&inner)
        })
    }
}

/// A big listing is built in one pass (every name, its id, and a map of
/// the names seen) on whichever worker thread asked, and its peak stays
/// in that thread's malloc arena after it is freed: once the kernel has
/// read it all, give the free pages back, so the daemon does not keep one
/// such peak per worker (a directory of a million names listed three
/// times grew the daemon from 258 to 634 MiB without this).
fn release_listing(entries: Arc<Vec<crate::overlay::readdir::DirEntry>>) {
    let big = entries.len() >= 10_000;
    drop(entries);
    if big {
        crate::sys::trim_heap();
    }
}

fn reply_empty(r: crate::overlay::Result<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

fn xattr_reply(v: &[u8], size: u32, reply: ReplyXattr) {
    if size == 0 {
        reply.size(v.len() as u32)
    } else if v.len() > size as usize {
        reply.error(Errno::ERANGE)
    } else {
        reply.data(v)
    }
}

/// The fuser session settings for a config: worker threads, clone_fd, ACL.
pub fn session_config(cfg: &Config) -> fuser::Config {
    let mut c = fuser::Config::default();
    // With io_uring the queues serve requests; `/dev/fuse` keeps only
    // FORGET and INTERRUPT (and everything, should the queues not start).
    c.n_threads = Some(if cfg.io_uring {
        cfg.threads.clamp(1, 2)
    } else {
        cfg.threads.max(1)
    });
    c.clone_fd = true;
    c.acl = if cfg.allow_other {
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    c
}
