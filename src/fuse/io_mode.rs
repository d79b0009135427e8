//! How opened files are served: FUSE passthrough or through the daemon.
//!
//! Passthrough (reads and writes go straight to the backing file, never
//! reaching the daemon) is used for regular files that live in the upper,
//! when running as root. Lower files are served through the daemon with
//! the kernel page cache: a passthrough open would pin the lower file as
//! the inode's backing file, and the kernel allows one backing file per
//! inode at a time, so a later open for writing (which copies up) could
//! not switch to the upper copy — except where that cannot happen:
//!
//! Lower passthrough. A read-only open of a lower file of at least 1 MiB
//! (`LOWER_PASSTHROUGH_MIN`: below it a backing file costs more than it
//! saves) is passed through (the lower file as backing) when no copy-up
//! can come while it is open:
//! on a read-only mount, or when a `readonly` rule covers the file (a
//! policy reload may lift the rule later). With `--lower-passthrough`
//! every such read-only open of a lower file is — except on a network
//! lower, whose reads the daemon watches for a server that stops
//! answering. While such opens of a node
//! exist, whatever would change its data — an open for writing, a
//! truncation by path — is refused with `ETXTBSY` before anything is
//! changed (`begin_write`, which first waits a moment for the RELEASE of
//! a reader just closed), so the kernel's one-backing rule never
//! surfaces as `EIO` and no descriptor reads data older than the file.
//! A change of metadata only (chmod, an xattr) copies the file up as
//! usual; its data stays that of the lower file, so later read-only opens
//! share the lower backing until the last of them closes. An open for
//! writing announces itself first, so no lower passthrough open of that
//! node starts until it is decided (a read-only open meanwhile is served
//! by the daemon).
//!
//! Writes through passthrough cannot be paused (`overlay::gate`): a pause
//! (a snapshot, a live restore) can only wait for such opens to close. So
//! only the mount owner (`overlay::share`: the daemon's user, root, the
//! upper's owner) opens files for writing through passthrough; another
//! user's open for writing is served by the daemon, whose write gate
//! pauses each WRITE request (also the write-back of a shared writable
//! mapping, which the kernel sends as WRITE requests), so no other user's
//! open file can hold up the owner's snapshot. What the owner's own
//! passthrough writers block is named with their uid.
//!
//! Kernel rule relied on here: cached (daemon-served) opens and
//! passthrough opens of one inode may not coexist. While an inode has
//! cached opens, new opens of it are cached too; passthrough opens of one
//! inode share one backing id. Another user's open for writing books its
//! cached open before the file is opened (`book_daemon_write`), so no
//! passthrough open of that inode starts meanwhile; while passthrough
//! opens of it exist (the owner has the file open) it is refused with
//! `ETXTBSY` ("file busy"), before anything is changed.
//!
//! A node whose real file a live reset, restore, undo, checkpoint or
//! squash replaced while passthrough handles hold its old file as backing
//! is detached from its name (`Overlay::re_resolve`, which reads the
//! count of those handles this module keeps in the inode's `IoState`):
//! the name's next lookup makes a new node, with no backing yet, so the
//! one-backing rule never meets the old file there.
//!
//! Daemon-served opens keep the kernel's page cache while the file is
//! unchanged (`cache_flags`), and the first open of a small lower file
//! fills it before it is answered (`prefill`), so that its reads send no
//! READ; while a caller fills the files of a directory, the next ones are
//! read ahead into the lower's page cache (`super::prefetch`), so those
//! fills do not wait for the disk.
//!
//! An open served through an io_uring queue (`super::uring`) is answered
//! by a fuser session on a socket, which cannot open backing ids (an ioctl
//! on `/dev/fuse`): it opens the id on the connection's fd
//! (`Backing::Connection`), which closes it when the last open using it
//! is released. Backing ids belong to the connection, so any open may
//! share either kind. An open a queue thread answers itself (`fast`) is
//! decided here all the same; only its reply is encoded by layerfs
//! (`OpenReply`), with the backing id's number (`Backing::raw`).

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use fuser::{
    Errno, FileAttr, FileHandle, FopenFlags, Generation, INodeNo, Notifier, ReplyCreate, ReplyOpen,
};
use parking_lot::{Condvar, Mutex};

use super::prefetch::{Hint, Prefetch};
use super::sys::{ConnectionBacking, SessionBacking};
use super::uring::QueueSide;
use crate::layer::sys;
use crate::overlay::file::Opened;
use crate::overlay::inode::Inode;
use crate::overlay::{Entry, Overlay};

#[derive(Default)]
struct State {
    /// Node id → its shared backing id while passthrough opens exist.
    backing: HashMap<u64, Weak<Backing>>,
    /// Node ids whose backing (in `backing`) is a lower file.
    lower_backed: HashSet<u64>,
    /// Opens for writing and truncations under way, by node id
    /// (`begin_write`): no lower passthrough open of them starts.
    writing: HashMap<u64, u32>,
    /// Handle → backing id it holds (dropped at release).
    held: HashMap<u64, Arc<Backing>>,
    /// Handles served by the daemon, by node id (count).
    cached: HashMap<u64, u32>,
    cached_handles: HashMap<u64, u64>,
    /// Passthrough handles open for writing → node id and the uid that
    /// opened it. Their writes never reach the daemon, so a pause waits
    /// for them to close.
    pt_writers: HashMap<u64, (u64, u32)>,
}

/// How long an open for writing waits for the last lower passthrough
/// reader's RELEASE before it is refused (`begin_write`).
const RELEASE_WAIT: Duration = Duration::from_secs(1);

pub struct IoModes {
    wanted: bool,
    /// `--lower-passthrough`: every read-only open of a lower file.
    lower_all: bool,
    enabled: AtomicBool,
    /// Raised (for good) before the first node is marked as passing a
    /// lower file through (`lower_backed`). See `begin_write`.
    lower_seen: AtomicBool,
    /// Changes of data under way that `begin_write` did not list in
    /// `State::writing` because no lower passthrough had begun yet.
    unlisted_writes: AtomicUsize,
    state: Mutex<State>,
    /// Signalled when a lower passthrough backing is given up.
    released: Condvar,
    /// Reads ahead the next small lower files of a directory whose files
    /// are being filled (`prefill`).
    prefetch: Prefetch,
}

enum Mode {
    Passthrough(Arc<Backing>),
    Cached(FopenFlags),
}

/// A backing id, closed when the last open using it is released.
pub enum Backing {
    /// Opened through a fuser session's reply (a `/dev/fuse` request).
    Session(SessionBacking),
    /// Opened on the connection's fd for a request served through an
    /// io_uring queue.
    Connection(ConnectionBacking),
}

impl Backing {
    /// The id's number, as an open reply carries it.
    pub fn raw(&self) -> u32 {
        match self {
            Backing::Session(b) => b.raw,
            Backing::Connection(c) => c.raw(),
        }
    }
}

/// Where an OPEN's answer goes: fuser's `ReplyOpen`, or the reply a
/// queue thread encodes itself (`fast`). Both answer what `reply_open`
/// decided; only the encoding differs.
pub trait OpenReply {
    /// Opens a backing id through this reply's fuser session (used for
    /// requests that came through `/dev/fuse` only, see `Via`).
    fn open_backing(&self, fd: &OwnedFd) -> std::io::Result<SessionBacking>;
    /// A daemon-served open.
    fn opened(self, fh: FileHandle, flags: FopenFlags);
    /// A passthrough open on backing `b` (`FOPEN_PASSTHROUGH` is added).
    fn opened_passthrough(self, fh: FileHandle, flags: FopenFlags, b: &Backing);
    fn error(self, e: Errno);
}

/// Where a CREATE's answer goes (generation 0), as `OpenReply`.
pub trait CreateReply {
    fn open_backing(&self, fd: &OwnedFd) -> std::io::Result<SessionBacking>;
    fn created(self, ttl: &Duration, attr: &FileAttr, fh: FileHandle, flags: FopenFlags);
    fn created_passthrough(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        fh: FileHandle,
        flags: FopenFlags,
        b: &Backing,
    );
    fn error(self, e: Errno);
}

impl CreateReply for ReplyCreate {
    fn open_backing(&self, fd: &OwnedFd) -> std::io::Result<SessionBacking> {
        SessionBacking::for_create(self, fd)
    }

    fn created(self, ttl: &Duration, attr: &FileAttr, fh: FileHandle, flags: FopenFlags) {
        ReplyCreate::created(self, ttl, attr, Generation(0), fh, flags)
    }

    fn created_passthrough(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        fh: FileHandle,
        flags: FopenFlags,
        b: &Backing,
    ) {
        match b {
            Backing::Session(b) => {
                ReplyCreate::created_passthrough(self, ttl, attr, Generation(0), fh, flags, &b.id)
            }
            Backing::Connection(c) => c.reply_created(self, ttl, attr, fh, flags),
        }
    }

    fn error(self, e: Errno) {
        ReplyCreate::error(self, e)
    }
}

impl OpenReply for ReplyOpen {
    fn open_backing(&self, fd: &OwnedFd) -> std::io::Result<SessionBacking> {
        SessionBacking::for_open(self, fd)
    }

    fn opened(self, fh: FileHandle, flags: FopenFlags) {
        ReplyOpen::opened(self, fh, flags)
    }

    fn opened_passthrough(self, fh: FileHandle, flags: FopenFlags, b: &Backing) {
        match b {
            Backing::Session(b) => ReplyOpen::opened_passthrough(self, fh, flags, &b.id),
            Backing::Connection(c) => c.reply_opened(self, fh, flags),
        }
    }

    fn error(self, e: Errno) {
        ReplyOpen::error(self, e)
    }
}

/// A change of data under way (`IoModes::begin_write`), given back to
/// `IoModes::end_write`: whether it was listed under its node.
#[must_use]
#[derive(Clone, Copy, Debug)]
pub enum Writing {
    Listed,
    Unlisted,
    /// Listed, and let through only because the change is refused anyway
    /// (a read-only mount, a `readonly` rule) while readers pass the
    /// lower file through: the caller answers with that refusal
    /// (`Overlay::guard_write`) and never makes the change, so a policy
    /// reload lifting the rule meanwhile cannot bring a copy-up to those
    /// readers' node (it gets `ETXTBSY`, as after the reload).
    Refused,
}

/// How a request reached the daemon: `None` through `/dev/fuse`, or
/// through an io_uring queue.
pub type Via<'a> = Option<&'a QueueSide>;

impl IoModes {
    pub fn new(root: bool, lower_all: bool) -> IoModes {
        let disabled = std::env::var_os("LAYERFS_NO_PASSTHROUGH").is_some();
        IoModes {
            wanted: root && !disabled,
            lower_all,
            enabled: AtomicBool::new(false),
            lower_seen: AtomicBool::new(false),
            unlisted_writes: AtomicUsize::new(0),
            state: Mutex::new(State::default()),
            released: Condvar::new(),
            prefetch: Prefetch::new(PREFILL_MAX as u64),
        }
    }

    pub fn passthrough_wanted(&self) -> bool {
        self.wanted
    }

    pub fn set_passthrough(&self, on: bool) {
        self.enabled.store(on, Ordering::Release);
    }

    /// Before an open for writing by a caller who is not the mount owner:
    /// books a daemon-served open of node `id` (true), so that no
    /// passthrough open of it starts before this one is decided; `ETXTBSY`
    /// while passthrough opens of it exist (the kernel would refuse a
    /// daemon-served open next to them). False when passthrough is off:
    /// every open is daemon-served then. A booking is taken up by the
    /// open's reply (`booked`) or given back with `cancel_booking`.
    pub fn book_daemon_write(&self, id: u64) -> Result<bool, i32> {
        if !self.enabled.load(Ordering::Acquire) {
            return Ok(false);
        }
        let mut st = self.state.lock();
        if st.backing.get(&id).and_then(Weak::upgrade).is_some() {
            return Err(libc::ETXTBSY);
        }
        *st.cached.entry(id).or_insert(0) += 1;
        Ok(true)
    }

    /// Before a change of node `id`'s data (an open for writing, a
    /// truncation by path): `ETXTBSY` while read-only opens of it pass the
    /// lower file through (the kernel could not give the node the upper
    /// copy as its backing, and those descriptors would keep reading the
    /// lower file). Otherwise no lower passthrough open of it starts until
    /// `end_write`.
    ///
    /// A program's close reaches the daemon as a RELEASE request sent
    /// after `close` returned: one that closed its last reader just
    /// before is not refused, the wait for that RELEASE lasting up to
    /// `RELEASE_WAIT`.
    ///
    /// Where the change will be refused anyway (a read-only mount, a
    /// `readonly` rule: why those files were passed through), it is not
    /// held up: its refusal (`EROFS`, recorded as a denial) is the answer.
    /// Such a change is `Writing::Refused`: its caller answers with the
    /// refusal and makes no change, so a policy reload lifting the rule
    /// between this check and the caller's never lets a copy-up meet the
    /// readers' lower backing.
    ///
    /// Until the first lower passthrough open, no change of data takes the
    /// lock: it is counted in `unlisted_writes` instead of being listed
    /// under its node. Invariant: a node is marked as passing a lower file
    /// through (`lower_backed`) only after `lower_seen` is raised and
    /// `unlisted_writes` is then read as 0 (`lower_allowed`), both
    /// sequentially consistent, as is this count's rise before `lower_seen`
    /// is read here. So either this change sees the flag and is listed
    /// (the slow path below), or that open sees the count and is served
    /// by the daemon instead; nothing was lower-backed before the flag, so
    /// an unlisted change has no reader to wait for.
    pub fn begin_write(&self, ov: &Overlay, id: u64) -> Result<Writing, i32> {
        self.begin(ov, id, true).unwrap_or(Err(libc::ETXTBSY))
    }

    /// `begin_write` where nothing may wait (an io_uring queue thread):
    /// `None`, with nothing begun, where `begin_write` would wait for a
    /// reader's RELEASE — which may well be queued behind the caller.
    pub fn begin_write_now(&self, ov: &Overlay, id: u64) -> Option<Result<Writing, i32>> {
        self.begin(ov, id, false)
    }

    fn begin(&self, ov: &Overlay, id: u64, wait: bool) -> Option<Result<Writing, i32>> {
        if !self.lower_seen.load(Ordering::SeqCst) {
            self.unlisted_writes.fetch_add(1, Ordering::SeqCst);
            if !self.lower_seen.load(Ordering::SeqCst) {
                return Some(Ok(Writing::Unlisted));
            }
            self.unlisted_writes.fetch_sub(1, Ordering::SeqCst);
        }
        let mut st = self.state.lock();
        let deadline = std::time::Instant::now() + RELEASE_WAIT;
        let writing = loop {
            if !st.lower_backed.contains(&id)
                || st.backing.get(&id).and_then(Weak::upgrade).is_none()
            {
                break Writing::Listed;
            }
            if no_copy_up(ov, id) {
                break Writing::Refused;
            }
            if !wait {
                return None;
            }
            if self.released.wait_until(&mut st, deadline).timed_out() {
                return Some(Err(libc::ETXTBSY));
            }
        };
        *st.writing.entry(id).or_insert(0) += 1;
        Some(Ok(writing))
    }

    /// Ends what `begin_write` began.
    pub fn end_write(&self, id: u64, w: Writing) {
        if let Writing::Unlisted = w {
            self.unlisted_writes.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let mut st = self.state.lock();
        if let Some(n) = st.writing.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                st.writing.remove(&id);
            }
        }
    }

    /// Gives back a booking whose open failed.
    pub fn cancel_booking(&self, id: u64) {
        let mut st = self.state.lock();
        if let Some(n) = st.cached.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                st.cached.remove(&id);
            }
        }
    }

    /// Decides the mode of a new open of node `id` and books it; `booked`:
    /// its daemon-served open was booked already (`book_daemon_write`).
    // The open's node and result, plus how the request came, its booking
    // and the notifier for `prefill`.
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &self,
        ov: &Overlay,
        id: u64,
        o: &Opened,
        via: Via,
        booked: bool,
        notifier: Option<(&Notifier, u32)>,
        open_backing: impl FnOnce(&OwnedFd) -> std::io::Result<SessionBacking>,
    ) -> Mode {
        let mut st = self.state.lock();
        if booked {
            st.cached_handles.insert(o.fh, id);
            drop(st);
            return Mode::Cached(self.cache_flags(ov, id, o, None));
        }
        let cached_now = st.cached.get(&id).copied().unwrap_or(0);
        let regular = ov
            .inode(id)
            .map(|i| i.kind == libc::S_IFREG)
            .unwrap_or(false);
        // Writes through passthrough cannot be paused: the owner's only.
        let may_pass = !o.writable || ov.files().shares.is_owner(o.uid);
        let existing = st.backing.get(&id).and_then(Weak::upgrade);
        let lower_backed = existing.is_some() && st.lower_backed.contains(&id);
        // A lower file's backing is shared only by read-only opens (an
        // open for writing was refused by `begin_write`); an upper open
        // after a metadata-only copy-up reads the same data.
        let as_upper = o.upper && !lower_backed;
        let as_lower = !o.writable
            && (lower_backed
                || (!o.upper
                    && !st.writing.contains_key(&id)
                    && (self.lower_all || no_copy_up(ov, id))
                    // A network lower's reads stay where the lower guard
                    // sees them (a server that stops answering).
                    && !ov.involves_remote(id)
                    && large(o)
                    && self.lower_allowed()));
        if self.enabled.load(Ordering::Acquire)
            && (as_upper || as_lower)
            && regular
            && cached_now == 0
            && may_pass
        {
            let backing = match existing {
                Some(b) => Some(b),
                None => match Self::open_backing(o.fd.as_ref(), via, open_backing) {
                    Ok(b) => {
                        let b = Arc::new(b);
                        st.backing.insert(id, Arc::downgrade(&b));
                        if o.upper {
                            st.lower_backed.remove(&id);
                        } else {
                            st.lower_backed.insert(id);
                        }
                        Some(b)
                    }
                    Err(e) => {
                        tracing::debug!(id, "passthrough refused: {e}");
                        None
                    }
                },
            };
            if let Some(b) = backing {
                st.held.insert(o.fh, b.clone());
                if let Ok(inode) = ov.inode(id) {
                    inode.io.lock().passthrough_opens += 1;
                }
                if o.writable {
                    st.pt_writers.insert(o.fh, (id, o.uid));
                }
                return Mode::Passthrough(b);
            }
        }
        let passed_through = st.backing.get(&id).and_then(Weak::upgrade).is_some();
        if passed_through {
            // A passthrough open exists and a backing could not be shared:
            // serving this one through the daemon would be refused by the
            // kernel; the caller gets direct I/O through the daemon instead.
            tracing::debug!(id, "mixed open while passthrough is active");
        }
        *st.cached.entry(id).or_insert(0) += 1;
        st.cached_handles.insert(o.fh, id);
        drop(st);
        // The only open of the node: nothing else can read its pages
        // while `prefill` fills them (see there).
        let sole = cached_now == 0 && !passed_through;
        Mode::Cached(self.cache_flags(ov, id, o, notifier.filter(|_| sole)))
    }

    /// Whether a node may start passing a lower file through now: not
    /// while a change of data counted in `unlisted_writes` is under way
    /// (it could be of this node). Raises `lower_seen` first, so changes
    /// beginning from now on are listed (see `begin_write`); the open is
    /// served by the daemon meanwhile.
    fn lower_allowed(&self) -> bool {
        self.lower_seen.store(true, Ordering::SeqCst);
        self.unlisted_writes.load(Ordering::SeqCst) == 0
    }

    fn open_backing(
        fd: &OwnedFd,
        via: Via,
        by_session: impl FnOnce(&OwnedFd) -> std::io::Result<SessionBacking>,
    ) -> std::io::Result<Backing> {
        match via {
            None => by_session(fd).map(Backing::Session),
            Some(q) => ConnectionBacking::open(&q.dev, fd).map(Backing::Connection),
        }
    }

    /// Keeps the page cache when the file did not change since it was
    /// last opened (same mtime and size) — except for a file on a network
    /// lower, whose client may serve data older than the attributes it
    /// reports (GlusterFS keeps small files in a data cache its upcalls do
    /// not invalidate): pages kept then would keep that old data for as
    /// long as the attributes stay the same. Such files are re-read at
    /// every open (close-to-open, as NFS).
    ///
    /// `notifier`: given for the only open of the node (nothing else reads
    /// its pages meanwhile), which may then fill them (`prefill`), with
    /// the caller's pid.
    fn cache_flags(
        &self,
        ov: &Overlay,
        id: u64,
        o: &Opened,
        notifier: Option<(&Notifier, u32)>,
    ) -> FopenFlags {
        if !o.upper && ov.involves_remote(id) {
            return FopenFlags::empty();
        }
        let Ok(st) = sys::fstat(o.fd.as_ref()) else {
            return FopenFlags::empty();
        };
        let Ok(inode) = ov.inode(id) else {
            return FopenFlags::empty();
        };
        let now = (st.st_mtime, st.st_mtime_nsec, st.st_size as u64);
        // Held while the pages are filled: a second open of the node waits
        // here for them (see `prefill`).
        let mut io = inode.io.lock();
        let keep = io.last_seen == Some(now);
        io.last_seen = Some(now);
        let first = !std::mem::replace(&mut io.paged, true);
        if keep {
            return FopenFlags::FOPEN_KEEP_CACHE;
        }
        // In a watched lower directory (`volatile`, which takes the
        // node's and its parent's other locks, never held while waiting
        // for `io`), an outside change of the file drops what `prefill`
        // stored, as it drops pages read before.
        let watched = || !ov.volatile(&inode);
        let fills = notifier.filter(|_| first && watched() && prefills(o, &st));
        let Some((n, pid)) = fills else {
            return FopenFlags::empty();
        };
        // The next small files of its lower directory are read ahead
        // while this one is read (`prefetch`).
        if let Some(h) = hint(&inode) {
            self.prefetch.hint(h, pid);
        }
        if prefill(n, id, &inode, o, &st) {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        }
    }

    /// Replies to an open; `before_reply` learns whether it is passthrough
    /// before the kernel can use the handle. `booked`: see `decide`;
    /// `writing`: what `begin_write` began for an open for writing;
    /// `notifier`: the kernel's, with which the first open of a small
    /// lower file fills its pages (`prefill`), and the caller's pid.
    // The open reply's fields, plus how the request came and its booking.
    #[allow(clippy::too_many_arguments)]
    pub fn reply_open<R: OpenReply>(
        &self,
        ov: &Overlay,
        id: u64,
        o: Opened,
        via: Via,
        notifier: Option<(&Notifier, u32)>,
        booked: bool,
        writing: Option<Writing>,
        reply: R,
        before_reply: impl FnOnce(bool),
    ) {
        let mode = self.decide(ov, id, &o, via, booked, notifier, |fd| {
            reply.open_backing(fd)
        });
        if let Some(w) = writing {
            // Decided: a later lower passthrough open shares with it.
            self.end_write(id, w);
        }
        before_reply(matches!(mode, Mode::Passthrough(_)));
        match mode {
            Mode::Passthrough(b) => {
                reply.opened_passthrough(FileHandle(o.fh), FopenFlags::empty(), &b)
            }
            Mode::Cached(flags) => reply.opened(FileHandle(o.fh), flags),
        }
    }

    // The create reply's fields, plus how the request came.
    #[allow(clippy::too_many_arguments)]
    pub fn reply_create(
        &self,
        ov: &Overlay,
        e: &Entry,
        ttl: Duration,
        o: Opened,
        via: Via,
        reply: impl CreateReply,
        before_reply: impl FnOnce(bool),
    ) {
        let attr = super::convert::attr(&e.st);
        let mode = self.decide(ov, e.id, &o, via, false, None, |fd| reply.open_backing(fd));
        before_reply(matches!(mode, Mode::Passthrough(_)));
        let fh = FileHandle(o.fh);
        match mode {
            Mode::Passthrough(b) => {
                reply.created_passthrough(&ttl, &attr, fh, FopenFlags::empty(), &b)
            }
            Mode::Cached(flags) => reply.created(&ttl, &attr, fh, flags),
        }
    }

    /// A listing of directory `dir_id` from its start, asked by caller
    /// `pid`: if that caller is reading small lower files (a walk that
    /// reads, `Prefetch::reading`), the first small files of the
    /// directory's lowers are read ahead, so the walk's first opens there
    /// find them too. A caller that only lists and stats reads nothing.
    pub fn listed(&self, ov: &Overlay, dir_id: u64, pid: u32) {
        if !self.prefetch.reading(pid) || ov.involves_remote(dir_id) || !ov.dir_watched(dir_id) {
            return;
        }
        let Ok(dir) = ov.inode(dir_id) else {
            return;
        };
        let lowers = dir.real.read().lowers.clone();
        for (layer, fd) in lowers.into_iter().take(LISTED_LOWERS) {
            let h = Hint {
                dir_id,
                layer,
                dir: fd,
                name: None,
            };
            self.prefetch.hint(h, pid);
        }
    }

    /// Node ids of passthrough handles open for writing, with the uid
    /// holding each.
    pub fn passthrough_writers(&self) -> Vec<(u64, u32)> {
        let mut ids: Vec<(u64, u32)> = self.state.lock().pt_writers.values().copied().collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    pub fn release(&self, ov: &Overlay, id: u64, fh: u64) {
        let mut st = self.state.lock();
        st.pt_writers.remove(&fh);
        if st.held.remove(&fh).is_some() {
            if let Ok(inode) = ov.inode(id) {
                let mut io = inode.io.lock();
                io.passthrough_opens = io.passthrough_opens.saturating_sub(1);
            }
            if st.backing.get(&id).is_some_and(|w| w.strong_count() == 0) {
                st.backing.remove(&id);
                if st.lower_backed.remove(&id) {
                    self.released.notify_all();
                }
            }
            return;
        }
        if let Some(id) = st.cached_handles.remove(&fh) {
            if let Some(n) = st.cached.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    st.cached.remove(&id);
                }
            }
        }
    }
}

/// Lower files smaller than this are read through the daemon: setting up
/// a backing file costs each open more than their few READs (none once
/// their pages are cached and kept) — measured with grep -r and tar c
/// over 30000 small files, slower passed through, warm and cold.
const LOWER_PASSTHROUGH_MIN: i64 = 1 << 20;

/// A listing by a reading caller reads ahead in this many of the
/// directory's lowers, topmost first (`IoModes::listed`).
const LISTED_LOWERS: usize = 2;

/// Lower files up to this size have their pages filled at their first
/// open (`prefill`): the kernel's own readahead window (which the mount's
/// `--readahead` only widens), so a first read of such a file would ask
/// for all of it in one READ anyway.
const PREFILL_MAX: i64 = 128 << 10;

/// Whether an open may have its file's pages filled by `prefill`: a
/// read-only open of a nonempty lower regular file of at most
/// `PREFILL_MAX` bytes, opened with `O_NOATIME` (the daemon's read then
/// leaves the lower file's atime as it was, so the attributes the kernel
/// holds stay true).
fn prefills(o: &Opened, st: &sys::Stat) -> bool {
    let noatime = || {
        nix::fcntl::fcntl(o.fd.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL)
            .is_ok_and(|f| f & libc::O_NOATIME != 0)
    };
    !o.writable
        && !o.upper
        && st.st_mode & libc::S_IFMT == libc::S_IFREG
        && st.st_size > 0
        && st.st_size <= PREFILL_MAX
        && noatime()
}

/// Fills the kernel's pages of node `id` with the whole of the file just
/// opened (`FUSE_NOTIFY_STORE`), before the open is answered, so that
/// its reads are served from the page cache: no READ request, and no
/// GETATTR at the next stat either (the kernel marks the atime stale
/// after each READ it sends, not after reads from its cache). True when
/// every byte was stored and the file did not change meanwhile: the open
/// is then answered with `FOPEN_KEEP_CACHE`. Otherwise it is answered
/// without, and the kernel drops whatever was stored when the open
/// completes, as for any file whose pages are not kept.
///
/// Only at the node's first daemon-served open (`IoState::paged`): its
/// kernel inode holds no pages yet, so the stored bytes are all it holds.
/// The node's `io` lock is held throughout and no other open of it exists
/// (`decide`): a second open waits in `cache_flags` until the pages are
/// filled, so no READ of the node can hold a page the store waits for,
/// and no write through the mount can reach the file meanwhile (an open
/// for writing waits the same way; a truncation by path is seen below,
/// as a copy-up). A second open that follows keeps the pages only if its
/// own `fstat` finds the file as this one read it.
fn prefill(n: &Notifier, id: u64, inode: &Inode, o: &Opened, st: &sys::Stat) -> bool {
    let size = st.st_size as usize;
    let mut buf = vec![0u8; size];
    let mut done = 0;
    while done < size {
        match sys::pread(o.fd.as_ref(), &mut buf[done..], done as u64) {
            Ok(0) | Err(_) => return false,
            Ok(k) => done += k,
        }
    }
    if let Err(e) = n.store(INodeNo(id), 0, &buf) {
        tracing::debug!(id, "page fill refused: {e}");
        return false;
    }
    // Changed while read (outside, or copied up through the mount): the
    // stored bytes may be older than the file; the kernel drops them.
    let same = |a: &sys::Stat| {
        (
            a.st_mtime,
            a.st_mtime_nsec,
            a.st_ctime,
            a.st_ctime_nsec,
            a.st_size,
        ) == (
            st.st_mtime,
            st.st_mtime_nsec,
            st.st_ctime,
            st.st_ctime_nsec,
            st.st_size,
        )
    };
    sys::fstat(o.fd.as_ref()).is_ok_and(|a| same(&a)) && inode.upper().is_none()
}

/// What `prefetch` needs of a lower file being filled: its name and the
/// lower directory it was found in (the same lower of its parent).
fn hint(inode: &Inode) -> Option<Hint> {
    let layer = inode.real.read().lowers.first()?.0;
    let (parent, name) = {
        let loc = inode.loc.read();
        (loc.parent.clone()?, loc.name.clone())
    };
    let dir = parent
        .real
        .read()
        .lowers
        .iter()
        .find(|(i, _)| *i == layer)?
        .1
        .clone();
    Some(Hint {
        dir_id: parent.id,
        layer,
        dir,
        name: Some(name),
    })
}

/// Whether the opened lower file is large enough to pass through.
fn large(o: &Opened) -> bool {
    sys::fstat(o.fd.as_ref()).is_ok_and(|st| st.st_size >= LOWER_PASSTHROUGH_MIN)
}

/// Whether no copy-up of node `id` can come through the mount: it is
/// read-only, or the policy refuses every change to the file.
fn no_copy_up(ov: &Overlay, id: u64) -> bool {
    ov.read_only() || ov.changes_refused(id)
}
