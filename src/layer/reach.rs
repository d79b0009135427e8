//! Reaching network lowers: noticing that one is lost and that it is
//! back, and keeping requests stuck on a slow one from taking every FUSE
//! worker thread. Exists only when some lower is remote (`netfs`).
//!
//! **Lost and back.** A request that meets a transport error (the
//! network filesystem lost its server: `ENOTCONN`, `EHOSTDOWN`, …), or
//! that had to be answered without a lower, calls `suspect`: a probe
//! thread (`lower-probe`, alive only while something is suspect) checks
//! each network lower's root every half second, logs when one is lost
//! and when it is back, and once all answer again calls `on_back`, which
//! drops the kernel's cached names and listings (answers given while a
//! lower was missing may have been cached). The probe is the only code
//! that decides a lower is lost; `status` reads what it found and never
//! touches a lower itself, so it answers even while a lower hangs.
//!
//! **Admission.** A request that involves a network lower first takes a
//! slot (`enter`); there are one fewer slots than FUSE workers, so one
//! worker is always left for requests that need no network lower (the
//! upper's own work). A request finding every slot taken waits for one,
//! but never once the oldest slot holder has been at it for `STALL`:
//! then the lower does not answer, and the request fails with
//! `ETIMEDOUT` at once instead of joining the queue — except lookups,
//! getattr and listings, which run without network lowers (`Pass::
//! Without`): names the upper holds still resolve, so a path through a
//! merged directory to the upper's own files keeps working. So while a
//! lower hangs, upper-only work waits at most `STALL` (once), and each
//! request that needs the lower gets `ETIMEDOUT` instead of hanging.
//!
//! **Not answering.** Full slots are not the only sign: requests stuck
//! on one name share one lookup (the kernel lets one lookup of a name run
//! and the others wait for it), so a hung lower may hold a single slot
//! while every new request takes a free one and hangs with it. So once a
//! slot holder has gone `STALL` without finishing, the probe is started;
//! a probe unanswered for `HUNG` means the lower does not answer, and from
//! then until a probe answers, requests are admitted as if every slot
//! were stuck (`ETIMEDOUT`, or without the network lowers). A request
//! that is merely slow (a large copy-up from a busy server) keeps its
//! slot and does not trip this: the probe of the root still answers.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::{Condvar, Mutex};

use super::root::Mount;
use super::sys;

/// How long requests holding every lower slot may go without finishing
/// before further requests needing a network lower fail with ETIMEDOUT.
pub const STALL: Duration = Duration::from_secs(5);
/// How often a lost lower is probed.
const PROBE_EVERY: Duration = Duration::from_millis(500);
/// How long a probe of a lower's root (`fstatfs`, `fstat`: answered at
/// once by any live server) may go unanswered before the lower counts as
/// not answering, and requests that need it are refused even with lower
/// slots free.
pub const HUNG: Duration = Duration::from_secs(2);

/// Transport errors met anywhere in the core (see `note`): a request
/// that saw the count move while it ran makes the lowers suspect.
static TRANSPORT_ERRORS: AtomicU64 = AtomicU64::new(0);

/// Whether `errno` says a network filesystem lost its server (rather
/// than anything about the file asked for).
pub fn is_transport(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENOTCONN
            | libc::ECONNREFUSED
            | libc::ECONNRESET
            | libc::ECONNABORTED
            | libc::EHOSTDOWN
            | libc::EHOSTUNREACH
            | libc::ENETDOWN
            | libc::ENETUNREACH
            | libc::ENETRESET
            | libc::ESHUTDOWN
    )
}

/// Whether a lower failing with `errno` is out of reach (a transport
/// error, a timeout, or an I/O error): the upper's own entries are then
/// answered without it.
pub fn is_unreachable(errno: i32) -> bool {
    is_transport(errno) || matches!(errno, libc::ETIMEDOUT | libc::EIO)
}

/// The errno a request gets for a failure of the layers: transport
/// errors become `EIO` (and are counted), since a FUSE mount answering
/// `ENOTCONN` means its own daemon died — callers, and layerfs's own
/// stale-mount check, must not take this mount for dead.
pub fn note(errno: i32) -> i32 {
    if is_transport(errno) {
        TRANSPORT_ERRORS.fetch_add(1, Ordering::Relaxed);
        return libc::EIO;
    }
    errno
}

/// One network lower under watch.
struct Lower {
    index: usize,
    path: PathBuf,
    fstype: String,
    mount: Arc<Mount>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    lost: Option<Lost>,
    /// A probe of this lower is running since.
    probing_since: Option<Instant>,
}

struct Lost {
    since: SystemTime,
    at: Instant,
    error: String,
}

/// What `status` says of one network lower.
#[derive(Debug, Clone)]
pub struct Condition {
    /// Layer index (0 is the topmost lower).
    pub index: usize,
    /// Lost since, with the error the probe met.
    pub lost: Option<(SystemTime, String)>,
    /// A probe has waited this long for an answer (more than a second).
    pub not_answering: Option<Duration>,
}

pub struct Reach {
    lowers: Vec<Lower>,
    slots: usize,
    inflight: Mutex<Inflight>,
    freed: Condvar,
    /// Requests refused with ETIMEDOUT since the mount.
    pub refused: AtomicU64,
    probing: AtomicBool,
    /// Something became suspect since the probe last looked.
    pending: AtomicBool,
    /// Answers may have been given without a lower: drop the kernel's
    /// caches once every lower answers.
    dirty: AtomicBool,
    /// Probe rounds completed.
    rounds: AtomicU64,
    /// When the last probe round ended.
    probed_at: Mutex<Option<Instant>>,
    on_back: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

#[derive(Default)]
struct Inflight {
    next: u64,
    /// Token → start; tokens grow with time, so the first is the oldest.
    started: BTreeMap<u64, Instant>,
    /// The stall of this episode was logged.
    logged: bool,
}

thread_local! {
    /// This thread serves a request that must not touch a network lower
    /// (see `Pass::Without`).
    static WITHOUT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the request this thread serves must do without network
/// lowers: `RealFd::get` then fails at once with `ETIMEDOUT` for them.
pub fn without_network() -> bool {
    WITHOUT.with(|w| w.get())
}

/// What lets a request involving a network lower run.
pub enum Pass {
    /// A slot: the request may reach the lower.
    Slot(Slot),
    /// No slot to be had (the lower does not answer): the request runs
    /// without network lowers, as if they were lost (a lookup or listing
    /// under a directory the upper holds answers with the upper's part).
    Without,
}

impl Drop for Pass {
    fn drop(&mut self) {
        if matches!(self, Pass::Without) {
            WITHOUT.with(|w| w.set(false));
        }
    }
}

/// A lower slot held by a request.
pub struct Slot {
    reach: Arc<Reach>,
    token: u64,
    errors_at: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut inf = self.reach.inflight.lock();
            inf.started.remove(&self.token);
            if inf.started.len() + 1 < self.reach.slots {
                inf.logged = false;
            }
        }
        self.reach.freed.notify_one();
        if TRANSPORT_ERRORS.load(Ordering::Relaxed) != self.errors_at {
            self.reach.suspect(false);
        }
    }
}

impl Reach {
    /// Tracks the network lowers among `lowers` ((index, path, fstype,
    /// root)); `None` when there is none. `workers` is the number of FUSE
    /// worker threads.
    pub fn new(
        lowers: Vec<(usize, PathBuf, String, Arc<Mount>)>,
        workers: usize,
    ) -> Option<Arc<Reach>> {
        if lowers.is_empty() {
            return None;
        }
        let lowers = lowers
            .into_iter()
            .map(|(index, path, fstype, mount)| Lower {
                index,
                path,
                fstype,
                mount,
                state: Mutex::new(State::default()),
            })
            .collect();
        Some(Arc::new(Reach {
            lowers,
            slots: workers.saturating_sub(1).max(1),
            inflight: Mutex::new(Inflight::default()),
            freed: Condvar::new(),
            refused: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            pending: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
            rounds: AtomicU64::new(0),
            probed_at: Mutex::new(None),
            on_back: OnceLock::new(),
        }))
    }

    /// What to do once every lower answers again after a loss.
    pub fn set_on_back(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_back.set(f);
    }

    /// Takes a slot for a request involving a network lower, or
    /// `ETIMEDOUT` when the slots are held by requests that have not
    /// finished for `STALL` (see the module comment).
    pub fn enter(self: &Arc<Self>) -> Result<Slot, i32> {
        let mut inf = self.inflight.lock();
        loop {
            let oldest = inf.started.values().next().copied();
            if oldest.is_some_and(|t| t.elapsed() >= STALL) {
                if self.not_answering() {
                    return Err(self.refuse(&mut inf));
                }
                // Is it slow, or gone? The probe tells (see the module
                // comment); it runs on its own thread, a round at most
                // every `PROBE_EVERY` while the request is slow.
                if self
                    .probed_at
                    .lock()
                    .is_none_or(|t| t.elapsed() >= PROBE_EVERY)
                {
                    self.suspect(false);
                }
            }
            if inf.started.len() < self.slots {
                let token = inf.next;
                inf.next += 1;
                inf.started.insert(token, Instant::now());
                return Ok(Slot {
                    reach: self.clone(),
                    token,
                    errors_at: TRANSPORT_ERRORS.load(Ordering::Relaxed),
                });
            }
            let oldest = inf
                .started
                .values()
                .next()
                .copied()
                .unwrap_or_else(Instant::now);
            let deadline = oldest + STALL;
            if Instant::now() >= deadline {
                let e = self.refuse(&mut inf);
                drop(inf);
                self.suspect(false);
                return Err(e);
            }
            self.freed.wait_until(&mut inf, deadline);
        }
    }

    /// Counts (and logs, once per episode) a request refused because the
    /// network lowers do not answer; the errno it gets.
    fn refuse(&self, inf: &mut Inflight) -> i32 {
        self.refused.fetch_add(1, Ordering::Relaxed);
        if !std::mem::replace(&mut inf.logged, true) {
            tracing::warn!(
                "{} requests on network lowers have not finished for {} s: requests \
                 that need a network lower fail with ETIMEDOUT until they do",
                inf.started.len(),
                STALL.as_secs()
            );
        }
        libc::ETIMEDOUT
    }

    /// Whether a probe of some network lower has waited over `HUNG`.
    fn not_answering(&self) -> bool {
        self.lowers.iter().any(|l| {
            l.state
                .lock()
                .probing_since
                .is_some_and(|t| t.elapsed() > HUNG)
        })
    }

    /// Lets a request in: with a slot, or, where the slots are stuck and
    /// the request can be answered from the upper (`may_do_without`),
    /// without network lowers; else `ETIMEDOUT`.
    pub fn admit(self: &Arc<Self>, may_do_without: bool) -> Result<Pass, i32> {
        match self.enter() {
            Ok(slot) => Ok(Pass::Slot(slot)),
            Err(_) if may_do_without => {
                self.suspect(true);
                WITHOUT.with(|w| w.set(true));
                Ok(Pass::Without)
            }
            Err(e) => Err(e),
        }
    }

    /// Something went wrong reaching a lower (`degraded`: an answer was
    /// given without it): probe them all until each answers.
    pub fn suspect(self: &Arc<Self>, degraded: bool) {
        if degraded {
            self.dirty.store(true, Ordering::Release);
        }
        self.pending.store(true, Ordering::Release);
        if self.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("lower-probe".into())
            .spawn(move || me.probe_loop());
        if let Err(e) = spawned {
            self.probing.store(false, Ordering::Release);
            tracing::warn!("cannot start the lower probe: {e}");
        }
    }

    /// Probes now (unless a probe runs) and waits up to `wait` for the
    /// round to end: for `status`, which must answer even while a lower
    /// hangs.
    pub fn check(self: &Arc<Self>, wait: Duration) {
        let before = self.rounds.load(Ordering::Acquire);
        self.suspect(false);
        let deadline = Instant::now() + wait;
        while self.rounds.load(Ordering::Acquire) == before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn probe_loop(self: Arc<Self>) {
        loop {
            self.pending.store(false, Ordering::Release);
            let mut all_ok = true;
            for l in &self.lowers {
                all_ok &= self.probe(l);
            }
            self.rounds.fetch_add(1, Ordering::AcqRel);
            *self.probed_at.lock() = Some(Instant::now());
            if all_ok {
                if self.dirty.swap(false, Ordering::AcqRel) {
                    if let Some(f) = self.on_back.get() {
                        f();
                    }
                }
                self.probing.store(false, Ordering::Release);
                // Suspected again while finishing: go on if nobody else will.
                if self.pending.load(Ordering::Acquire)
                    && !self.probing.swap(true, Ordering::AcqRel)
                {
                    continue;
                }
                return;
            }
            std::thread::sleep(PROBE_EVERY);
        }
    }

    /// One probe of a lower's root; logs a change of state. True when it
    /// answers.
    fn probe(&self, l: &Lower) -> bool {
        l.state.lock().probing_since = Some(Instant::now());
        let r = sys::fstatfs(&l.mount.fd).and_then(|_| sys::fstat(&l.mount.fd));
        let mut st = l.state.lock();
        st.probing_since = None;
        match (r, st.lost.is_some()) {
            (Ok(_), false) => true,
            (Ok(_), true) => {
                let lost = st.lost.take().map_or(0.0, |x| x.at.elapsed().as_secs_f64());
                self.dirty.store(true, Ordering::Release);
                tracing::warn!(
                    "lower #{} {} ({}) is back after {lost:.1} s",
                    l.index + 1,
                    l.path.display(),
                    l.fstype
                );
                true
            }
            (Err(e), was_lost) => {
                if !was_lost {
                    tracing::warn!(
                        "lower #{} {} ({}) is lost: {e}; requests that need it fail with EIO \
                         (names the upper holds still resolve, without the lower's part) until \
                         it is back",
                        l.index + 1,
                        l.path.display(),
                        l.fstype
                    );
                    st.lost = Some(Lost {
                        since: SystemTime::now(),
                        at: Instant::now(),
                        error: e.to_string(),
                    });
                    self.dirty.store(true, Ordering::Release);
                }
                false
            }
        }
    }

    /// The condition of each network lower, as last probed.
    pub fn conditions(&self) -> Vec<Condition> {
        self.lowers
            .iter()
            .map(|l| {
                let st = l.state.lock();
                Condition {
                    index: l.index,
                    lost: st.lost.as_ref().map(|x| (x.since, x.error.clone())),
                    not_answering: st
                        .probing_since
                        .map(|t| t.elapsed())
                        .filter(|d| *d > Duration::from_secs(1)),
                }
            })
            .collect()
    }

    /// Requests that have held a lower slot for longer than `STALL`.
    pub fn stalled(&self) -> usize {
        self.inflight
            .lock()
            .started
            .values()
            .filter(|t| t.elapsed() > STALL)
            .count()
    }
}
