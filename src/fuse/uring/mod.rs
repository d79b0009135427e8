//! FUSE over io_uring (`--io-uring`): one request queue per CPU.
//!
//! **Why.** Through `/dev/fuse` every request waits in one queue, and
//! whichever worker is idle takes it — usually one on another CPU, which
//! the kernel must first wake. On these virtual machines that wake-up is
//! most of a round trip: a request served on the caller's CPU takes about
//! 40 µs, on the other CPU 240–400 µs (DESIGN.md §6). With io_uring the
//! kernel puts each request on the queue of the CPU its caller runs on;
//! layerfs serves each queue with threads pinned to that CPU, so the
//! caller's CPU switches straight to the thread that answers.
//!
//! **How.** After the INIT handshake (over `/dev/fuse`, where FORGET and
//! INTERRUPT also keep arriving), one thread per CPU registers `DEPTH`
//! ring entries (`queue`). Requests from a queue go, byte for byte as
//! `/dev/fuse` would deliver them, over a socket pair to a fuser session
//! of that CPU's own, which decodes them and calls the same filesystem as
//! the `/dev/fuse` session; its replies go back the same way. The socket
//! hop stays on one CPU and costs a few microseconds; it lets every
//! operation keep the one implementation, and one place (fuser) that
//! decodes the protocol.
//!
//! **Passthrough.** A session on a socket cannot open backing files
//! (that is an ioctl on `/dev/fuse`): a request thread opens the backing
//! id on the connection's fd itself (`QueueSide::dev`, see `io_mode`).
//!
//! **When it is not used.** The kernel offers io_uring only while root has
//! set `/sys/module/fuse/parameters/enable_uring` to Y; layerfs never sets
//! it. Without the offer, or if any queue cannot be set up, the mount
//! serves through `/dev/fuse` as usual and logs why. Once the kernel has
//! agreed to io_uring at INIT it holds requests until every CPU's queue
//! has an entry, so a set-up that fails half-way makes the kernel give up
//! on the rings (`give_up`) before `/dev/fuse` serves.

pub(super) mod abi;
mod error;
mod queue;

pub use error::UringError;

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType};

/// Ring entries per CPU: requests a CPU's callers can have in service at
/// once. A request parked by a write pause keeps its entry.
pub const DEPTH: usize = 16;

/// The switch root uses to let FUSE servers use io_uring.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// A request as the queue thread sees it, for `Fast`.
#[derive(Clone, Copy, Debug)]
pub struct Req {
    pub opcode: u32,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// Requests a queue thread answers itself instead of handing them to its
/// request threads: the socket hop costs two thread switches, more than
/// answering a GETATTR, LOOKUP or OPEN does. `answer` writes the reply's
/// arguments into `out` (at least `SCRATCH` bytes) and returns their
/// length, or an errno, or a sync for the queue to run on its ring;
/// `None` hands the request on as usual, untouched. Its answers must be
/// the ones the filesystem gives through fuser (one implementation of the
/// operation, two encodings of the reply). `side` is the queue the
/// request came through.
pub trait Fast: Send + Sync {
    /// `arg` is the request's first argument, `rest` the others.
    fn answer(
        &self,
        side: &QueueSide,
        req: Req,
        arg: &[u8],
        rest: &[u8],
        out: &mut [u8],
    ) -> Option<Answer>;
}

/// What `Fast` made of a request.
pub enum Answer {
    /// The reply's arguments (their length in `out`), or an errno.
    Now(Result<usize, i32>),
    /// An FSYNC or FSYNCDIR: the queue thread submits the sync on its own
    /// ring (IORING_OP_FSYNC) and goes on serving; the request's entry
    /// waits, uncommitted, for the sync's completion, whose result
    /// `SyncOp::done` makes into the (empty) reply or its errno.
    Sync(SyncOp),
}

pub struct SyncOp {
    /// The descriptor to sync, open for as long as `done` is held.
    pub fd: RawFd,
    /// `fdatasync` rather than `fsync`.
    pub datasync: bool,
    /// Takes the sync's result (0 or -errno), gives the answer's.
    pub done: Box<dyn FnOnce(i32) -> Result<(), i32> + Send>,
}

/// Room for a reply `Fast` writes: an xattr value is at most 64 KiB (a
/// queue's room is the larger of this and its payload buffer, which
/// holds the largest READ).
pub const SCRATCH: usize = 64 * 1024 + 64;

/// The requests `Fast` may answer (`include/uapi/linux/fuse.h`).
pub const FUSE_LOOKUP: u32 = 1;
pub const FUSE_GETATTR: u32 = 3;
pub const FUSE_SETATTR: u32 = 4;
pub const FUSE_READLINK: u32 = 5;
pub const FUSE_SYMLINK: u32 = 6;
pub const FUSE_MKNOD: u32 = 8;
pub const FUSE_MKDIR: u32 = 9;
pub const FUSE_UNLINK: u32 = 10;
pub const FUSE_RMDIR: u32 = 11;
pub const FUSE_RENAME: u32 = 12;
pub const FUSE_LINK: u32 = 13;
pub const FUSE_OPEN: u32 = 14;
pub const FUSE_READ: u32 = 15;
pub const FUSE_WRITE: u32 = 16;
pub const FUSE_STATFS: u32 = 17;
pub const FUSE_RELEASE: u32 = 18;
pub const FUSE_FSYNC: u32 = 20;
pub const FUSE_SETXATTR: u32 = 21;
pub const FUSE_GETXATTR: u32 = 22;
pub const FUSE_LISTXATTR: u32 = 23;
pub const FUSE_REMOVEXATTR: u32 = 24;
pub const FUSE_FLUSH: u32 = 25;
pub const FUSE_READDIR: u32 = 28;
pub const FUSE_FSYNCDIR: u32 = 30;
pub const FUSE_CREATE: u32 = 35;
pub const FUSE_IOCTL: u32 = 39;
pub const FUSE_READDIRPLUS: u32 = 44;
pub const FUSE_RENAME2: u32 = 45;
pub const FUSE_LSEEK: u32 = 46;

/// What a request served through a queue needs: the connection's fd, for
/// backing ids.
pub struct QueueSide {
    pub dev: Arc<OwnedFd>,
}

/// Counters `status` shows.
#[derive(Default)]
pub struct Stats {
    pub queues: usize,
    pub depth: usize,
    /// Requests served through each CPU's ring.
    pub requests: Vec<AtomicU64>,
    /// Of those, the ones its queue thread answered itself (`Fast`).
    pub answered: Vec<AtomicU64>,
}

/// What the INIT handshake settled, for the queues' own sessions.
#[derive(Clone, Copy, Debug)]
pub struct Negotiated {
    pub minor: u32,
    pub max_readahead: u32,
    pub capabilities: u64,
    pub max_write: u32,
}

pub struct Transport {
    pub stats: Arc<Stats>,
    threads: Vec<JoinHandle<()>>,
}

/// The number of queues the kernel expects: one per possible CPU, so the
/// highest possible CPU's number plus one (queue ids are CPU numbers).
fn possible_cpus() -> Result<usize, UringError> {
    let path = "/sys/devices/system/cpu/possible";
    let s =
        std::fs::read_to_string(path).map_err(|source| UringError::ReadCpus { path, source })?;
    let mut n = 0;
    for part in s.trim().split(',') {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        match (first.parse::<usize>(), last.parse::<usize>()) {
            (Ok(first), Ok(last)) if first <= last => n = n.max(last + 1),
            _ => {
                return Err(UringError::ParseCpus {
                    path,
                    text: s.trim().to_string(),
                })
            }
        }
    }
    Ok(n)
}

/// Sets up one queue per CPU on the connection `dev` (after INIT) and
/// returns once the kernel has every queue's entries. `view` makes each
/// queue's filesystem (sharing the mount's state).
///
/// Each queue gets `workers` request threads, as many as the mount's
/// `/dev/fuse` workers (`--threads`). Invariant relied on by the lower
/// guard (`layer::reach`): it lets one fewer request than that wait on a
/// network lower at a time, in the whole mount, so every queue keeps a
/// thread for requests the lowers do not hold up, however the stuck ones
/// fell on the queues.
pub fn start<F: fuser::Filesystem>(
    dev: &OwnedFd,
    negotiated: Negotiated,
    acl: fuser::SessionACL,
    workers: usize,
    fast: Option<Arc<dyn Fast>>,
    view: impl Fn(Arc<QueueSide>) -> F,
) -> Result<Transport, UringError> {
    let dev = Arc::new(dev.try_clone().map_err(UringError::DupDevice)?);
    let result = start_queues(&dev, negotiated, acl, workers.max(2), fast, view);
    if result.is_err() {
        give_up(&dev);
    }
    result
}

fn start_queues<F: fuser::Filesystem>(
    dev: &Arc<OwnedFd>,
    negotiated: Negotiated,
    acl: fuser::SessionACL,
    workers: usize,
    fast: Option<Arc<dyn Fast>>,
    view: impl Fn(Arc<QueueSide>) -> F,
) -> Result<Transport, UringError> {
    let cpus = possible_cpus()?;
    let payload = (negotiated.max_write as usize)
        .max(negotiated.max_readahead as usize)
        .max(8192)
        .next_multiple_of(4096);
    let stats = Arc::new(Stats {
        queues: cpus,
        depth: DEPTH,
        requests: (0..cpus).map(|_| AtomicU64::new(0)).collect(),
        answered: (0..cpus).map(|_| AtomicU64::new(0)).collect(),
    });
    let mut threads = Vec::new();
    let mut waits = Vec::new();
    for qid in 0..cpus {
        let (mine, theirs) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|source| UringError::SocketPair { qid, source })?;
        // Each direction carries at most DEPTH messages of up to one
        // payload: room for all of them, so no send ever waits.
        let room = DEPTH * (payload + 8192);
        for s in [&mine, &theirs] {
            socket::setsockopt(s, sockopt::SndBufForce, &room)
                .or_else(|_| socket::setsockopt(s, sockopt::SndBuf, &room))
                .map_err(|source| UringError::SocketBuffer { qid, source })?;
            let got: usize = socket::getsockopt(s, sockopt::SndBuf)
                .map_err(|source| UringError::SocketBuffer { qid, source })?;
            if got < payload + 8192 {
                return Err(UringError::SmallSocketBuffer { qid, got, payload });
            }
        }
        let side = Arc::new(QueueSide { dev: dev.clone() });
        let session = handshake(
            qid,
            &mine,
            theirs,
            negotiated,
            acl,
            workers,
            view(side.clone()),
        )?;
        threads.push(
            std::thread::Builder::new()
                .name(format!("uring-{qid}-req"))
                .spawn(move || {
                    pin(qid);
                    if let Err(e) = session.run() {
                        tracing::debug!("queue {qid}: request threads ended: {e}");
                    }
                })
                .map_err(|source| UringError::RequestThreads { qid, source })?,
        );
        let q = queue::Queue {
            qid: qid as u16,
            dev: dev.clone(),
            side,
            sock: mine,
            depth: DEPTH,
            payload,
            stats: stats.clone(),
            workers,
            fast: fast.clone(),
        };
        let (tx, rx) = mpsc::channel();
        threads.push(
            std::thread::Builder::new()
                .name(format!("uring-{qid}"))
                .spawn(move || q.run(tx))
                .map_err(|source| UringError::RingThread { qid, source })?,
        );
        waits.push(rx);
    }
    for (qid, rx) in waits.into_iter().enumerate() {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(UringError::NoAnswer { qid }),
        }
    }
    Ok(Transport { stats, threads })
}

/// Confines the calling thread (and the threads it starts) to `cpu`.
fn pin(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok() {
        if let Err(e) = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set) {
            tracing::debug!("queue {cpu}: not pinned to its CPU: {e}");
        }
    }
}

/// Starts a queue's own fuser session on `theirs`: it expects an INIT
/// first, so it gets one made from what the kernel's INIT settled; its
/// reply is read and dropped here.
fn handshake<F: fuser::Filesystem>(
    qid: usize,
    mine: &OwnedFd,
    theirs: OwnedFd,
    n: Negotiated,
    acl: fuser::SessionACL,
    workers: usize,
    fs: F,
) -> Result<fuser::Session<F>, UringError> {
    let init = abi::init_request(1, n.minor, n.max_readahead, n.capabilities);
    socket::send(mine.as_raw_fd(), &init, socket::MsgFlags::empty())
        .map_err(|source| UringError::SendInit { qid, source })?;
    let mut cfg = fuser::Config::default();
    cfg.n_threads = Some(workers);
    cfg.clone_fd = false;
    let session = fuser::Session::from_fd(fs, theirs, acl, cfg)
        .map_err(|source| UringError::RequestThreads { qid, source })?;
    let mut reply = [0u8; 512];
    let n = socket::recv(mine.as_raw_fd(), &mut reply, socket::MsgFlags::empty())
        .map_err(|source| UringError::InitReply { qid, source })?;
    if abi::reply_header(&reply[..n]).is_none_or(|h| h.error != 0) {
        return Err(UringError::InitRefused { qid });
    }
    Ok(session)
}

/// Makes the kernel stop waiting for rings on this connection: a
/// registration it must refuse (a queue that does not exist) turns
/// io_uring off for the connection, and requests go to `/dev/fuse`.
fn give_up(dev: &Arc<OwnedFd>) {
    match queue::refuse_rings(dev) {
        Ok(()) => tracing::info!("io_uring turned off for this mount; serving /dev/fuse"),
        Err(e) => tracing::error!("could not turn io_uring off for this mount: {e}"),
    }
}

impl Transport {
    /// Waits (up to `limit`) for the queues to end, which they do when
    /// the connection ends.
    pub fn join(self, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        for t in self.threads {
            while !t.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// Whether root has let FUSE servers use io_uring.
pub fn kernel_allows() -> Option<bool> {
    std::fs::read_to_string(ENABLE_URING)
        .ok()
        .map(|s| s.trim() == "Y" || s.trim() == "1")
}
