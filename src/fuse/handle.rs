//! The daemon's handle on a mounted filesystem, kept after the filesystem
//! moved into the session: policy reloads, the journal sink, counters,
//! write pauses, cache invalidations, the kernel notifier, the lower watch
//! and the io_uring queues' views all go through it.

use std::sync::Arc;
use std::time::Duration;

use super::contain::Contained;
use super::fast::QueueAnswers;
use super::init::Negotiated;
use super::shared::{LayerFs, Shared};
use super::{invalidate, uring, watcher};
use crate::overlay::events::Sink;
use crate::overlay::gate::PauseGuard;
use crate::overlay::Overlay;
use crate::policy::Policy;

/// Handle the daemon keeps after the filesystem moved into the session:
/// policy reloads (SIGHUP) and the kernel notifier go through it.
#[derive(Clone)]
pub struct FsHandle {
    inner: Arc<Shared>,
}

impl LayerFs {
    pub fn handle(&self) -> FsHandle {
        FsHandle {
            inner: self.inner.clone(),
        }
    }
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

    /// Requests per second over the last `window` seconds.
    pub fn request_rate(&self, window: u64) -> f64 {
        self.inner.rec.rate.per_second(window)
    }

    /// Requests received per operation since the mount (nonzero ones).
    pub fn requests_by_op(&self) -> Vec<(&'static str, u64)> {
        self.inner.rec.by_op.seen()
    }

    /// (requests, copy-ups, policy denials) since the mount.
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
                    .filter_map(|(id, uid)| ov.inodes().get(id).map(|i| (ov.path_of(&i), uid)))
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

    /// What INIT settled (`None` before the handshake).
    pub fn negotiated(&self) -> Option<Negotiated> {
        self.inner.negotiated.get().copied()
    }

    /// The filesystem an io_uring queue's own session serves (see
    /// `LayerFs::queue`), wrapped as every session's is.
    pub fn queue_view(&self, side: Arc<uring::QueueSide>) -> Contained<LayerFs> {
        Contained(LayerFs {
            inner: self.inner.clone(),
            queue: Some(side),
        })
    }

    /// The queue threads' own answers (`fast`), or `None` for a mount with
    /// a network lower: it can stop answering, and a queue thread waiting
    /// on it would stall every request of its CPU (request threads waiting
    /// on it are bounded by the lower guard instead).
    pub fn queue_answers(&self, acl: fuser::SessionACL) -> Option<QueueAnswers> {
        if self.inner.ov.reach().is_some() {
            return None;
        }
        Some(QueueAnswers::new(&self.inner, acl))
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

    /// Give the filesystem the session's notifier, for cache invalidations.
    pub fn set_notifier(&self, notifier: fuser::Notifier) {
        if let Some(reach) = &self.inner.ov.reach() {
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
