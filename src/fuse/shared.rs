//! What every request shares: the overlay core, the kernel notifier, the
//! cache timeouts, the io modes, the journal's recorder and the copy pool
//! (`Shared`), and the filesystem fuser serves (`LayerFs`) with its write
//! gate and its admission rule for requests that may reach a network
//! lower.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fuser::{Errno, INodeNo, Request};

use super::contain;
use super::convert;
use super::init::Negotiated;
use super::reply::{errno, AttrReply, EntryReply};
use super::{io_mode, long, record, uring};
use crate::config::Config;
use crate::overlay::file::SyncTarget;
use crate::overlay::{Ctx, Entry, Overlay};

/// Everything a request needs, shared with the daemon's handle and with
/// requests parked while writes are paused (`LayerFs::gated`).
pub(super) struct Shared {
    pub(super) ov: Overlay,
    pub(super) notifier: OnceLock<fuser::Notifier>,
    /// Cache timeout for anything that involves a lower layer.
    pub(super) lower_ttl: Duration,
    /// Cache timeout for objects that live only in the upper, which only
    /// this daemon changes.
    upper_ttl: Duration,
    pub(super) io: io_mode::IoModes,
    pub(super) rec: record::Recorder,
    /// `--io-uring` was asked for.
    pub(super) want_uring: bool,
    /// What INIT settled, once it has; `negotiated.uring` says whether the
    /// kernel agreed to io_uring.
    pub(super) negotiated: OnceLock<Negotiated>,
    /// The io_uring queues' counters, once they serve.
    pub(super) uring: OnceLock<Arc<uring::Stats>>,
    /// Where long copies run, off the request threads (`long`).
    pub(super) long: long::Pool,
}

/// The filesystem a fuser session serves (`ops` implements
/// `fuser::Filesystem` on it).
pub struct LayerFs {
    pub(super) inner: Arc<Shared>,
    /// Set on the filesystem of an io_uring queue's own session: requests
    /// it serves came through that queue (see `uring`).
    pub(super) queue: Option<Arc<uring::QueueSide>>,
}

/// The caller of a request, as the core takes it.
pub(super) fn ctx(req: &Request, umask: u32) -> Ctx {
    Ctx {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
        umask,
    }
}

impl LayerFs {
    /// Opens every layer root and the work dir; fails with a message naming
    /// the layer and the problem.
    pub fn new(cfg: &Config) -> Result<LayerFs, crate::overlay::OverlayError> {
        crate::failpoint::init();
        let ov = Overlay::new(&cfg.overlay_options())?;
        let root = nix::unistd::geteuid().is_root();
        Ok(LayerFs {
            inner: Arc::new(Shared {
                ov,
                notifier: OnceLock::new(),
                lower_ttl: cfg.lower_timeout,
                upper_ttl: cfg.lower_timeout.max(Duration::from_secs(60)),
                io: io_mode::IoModes::new(root, cfg.lower_passthrough),
                rec: Default::default(),
                want_uring: cfg.io_uring,
                negotiated: OnceLock::new(),
                uring: OnceLock::new(),
                long: long::Pool::new(cfg.threads),
            }),
            queue: None,
        })
    }

    pub(super) fn ov(&self) -> &Overlay {
        &self.inner.ov
    }

    /// Runs a mutating request inside the write gate. While writes are
    /// paused the request is parked on a thread of its own until the pause
    /// ends, so the FUSE worker threads stay free for readers.
    pub(super) fn gated(&self, op: impl FnOnce(&Shared) + Send + 'static) {
        if let Some(_pass) = self.inner.ov.gate().try_enter() {
            return op(&self.inner);
        }
        let inner = self.inner.clone();
        let parked = std::thread::Builder::new()
            .name("parked-write".into())
            .spawn(move || {
                let _pass = inner.ov.gate().enter();
                op(&inner)
            });
        if let Err(e) = parked {
            // The closure (and its reply) went with the failed spawn: the
            // request is answered EIO when the unsent reply is dropped.
            tracing::error!("cannot park a write while paused: {e}; it fails with EIO");
        }
    }

    pub(super) fn ttl(&self, lower: bool) -> Duration {
        self.inner.ttl(lower)
    }

    /// GETATTR's answer: how long the kernel may keep it, and the
    /// attributes (for fuser's reply and for `QueueAnswers`).
    pub(super) fn attr_of(
        &self,
        ino: u64,
        fh: Option<u64>,
    ) -> Result<(Duration, crate::layer::sys::Stat), Errno> {
        match self.ov().getattr(ino, fh) {
            Ok((st, lower)) => Ok((self.ttl(lower), st)),
            Err(e) => Err(errno(e)),
        }
    }
}

impl Shared {
    pub(super) fn ov(&self) -> &Overlay {
        &self.ov
    }

    /// FSYNC up to the sync itself, for the request threads and the
    /// io_uring queue threads alike: the journal's row for the writes it
    /// covers (`Recorder::fsynced`), then what to sync.
    pub(super) fn fsync_target(
        &self,
        c: &Ctx,
        fh: u64,
        datasync: bool,
    ) -> crate::overlay::Result<SyncTarget> {
        self.rec.fsynced(&self.ov, fh, c);
        self.ov.fsync_target(fh, datasync)
    }

    pub(super) fn ttl(&self, lower: bool) -> Duration {
        if lower {
            self.lower_ttl
        } else {
            self.upper_ttl
        }
    }

    pub(super) fn reply_entry(&self, r: crate::overlay::Result<Entry>, reply: impl EntryReply) {
        match r {
            Ok(e) => reply.entry(
                &self.ttl(e.lower),
                &convert::attr(&e.st),
                fuser::Generation(0),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    pub(super) fn reply_attr(
        &self,
        ino: INodeNo,
        r: crate::overlay::Result<crate::layer::sys::Stat>,
        reply: impl AttrReply,
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
        let Some(reach) = self.ov().reach() else {
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
