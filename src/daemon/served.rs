//! The running daemon as the control socket's handlers see it: the
//! filesystem handle and the mount's facts (`Daemon`), and the bounded
//! wait for kernel invalidations that reset and restore both need.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::config::Config;
use crate::fuse::FsHandle;
use crate::state::journal::Journal;
use crate::state::protocol::Invalidated;

/// How long an invalidation may take before the answer says it is still
/// pending (it may wait on a request parked by a pause).
const INVALIDATE_WAIT: Duration = Duration::from_secs(2);

/// What the server answers from: the filesystem and the mount's facts.
pub struct Daemon {
    pub fs: FsHandle,
    pub mountpoint: PathBuf,
    pub upper: PathBuf,
    pub lowers: Vec<PathBuf>,
    pub work: PathBuf,
    pub state: PathBuf,
    pub policy_file: Option<PathBuf>,
    pub started: Instant,
    pub started_at: SystemTime,
    /// The daemon's uid: the only one (with root) allowed on the socket.
    pub uid: u32,
    /// `--scratch` globs (the policy's `scratch` lines are read live).
    pub scratch: Vec<String>,
    pub lower_timeout: Duration,
    pub journal: Option<Arc<Journal>>,
    /// The last failed policy reload (`signals`).
    pub reloads: Arc<super::signals::Reloads>,
    /// Locks on the directories a live checkpoint or undo made the upper
    /// (`daemon::layers`): held, like the mount's own (`exclusive`), for
    /// as long as the daemon serves.
    pub upper_claims: parking_lot::Mutex<Vec<std::fs::File>>,
}

impl Daemon {
    pub fn new(
        cfg: &Config,
        fs: FsHandle,
        journal: Option<Arc<Journal>>,
        reloads: Arc<super::signals::Reloads>,
    ) -> Daemon {
        Daemon {
            fs,
            mountpoint: cfg.mountpoint.clone(),
            upper: cfg.upper.clone(),
            lowers: cfg.lowers.clone(),
            work: cfg.work.clone(),
            state: cfg.state.clone(),
            policy_file: cfg.policy_file.clone(),
            started: Instant::now(),
            started_at: SystemTime::now(),
            uid: nix::unistd::geteuid().as_raw(),
            scratch: cfg.scratch.clone(),
            lower_timeout: cfg.lower_timeout,
            journal,
            reloads,
            upper_claims: Default::default(),
        }
    }

    /// Requests per second over the last few seconds.
    pub(super) fn rate(&self) -> f64 {
        self.fs.request_rate(RATE_WINDOW)
    }
}

/// Seconds of request counts the rate covers.
const RATE_WINDOW: u64 = 10;

/// Runs an invalidation on a thread of its own and waits for it a
/// bounded time: the kernel takes a directory's lock to drop a name in
/// it, and a request parked by a pause may hold that lock until writes
/// resume. Then the answer says the invalidation is still pending.
pub fn invalidate_bounded(work: impl FnOnce() -> usize + Send + 'static) -> Invalidated {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("invalidate".into())
        .stack_size(crate::layer::walk::THREAD_STACK)
        .spawn(move || {
            let _ = tx.send(work());
        });
    if let Err(e) = spawned {
        return Invalidated {
            warning: Some(format!("cannot start: {e}")),
            ..Invalidated::default()
        };
    }
    match rx.recv_timeout(INVALIDATE_WAIT) {
        Ok(n) => Invalidated {
            invalidated: n as u64,
            ..Invalidated::default()
        },
        Err(_) => Invalidated {
            pending: true,
            ..Invalidated::default()
        },
    }
}
