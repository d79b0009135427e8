//! The request side of the journal: `Journal`, the `Sink` the mount
//! offers events to (never blocking), its health counters, and starting
//! the writer thread again after it went idle.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use serde_json::{json, Value};

use super::retention::disk_bytes;
use super::schema::shown;
use super::writer::Writer;
use super::Options;
use crate::overlay::events::{Event, Sink};

/// Counters `status` reports.
#[derive(Default)]
pub(super) struct Health {
    /// Rows in the database (as far as this daemon knows).
    pub(super) rows: AtomicU64,
    /// Rows this daemon inserted.
    pub(super) written: AtomicU64,
    /// Events lost (full queue or a failed insert).
    pub(super) dropped: AtomicU64,
    /// Rows retention deleted (the `journal-trimmed` row it replaces
    /// not counted).
    pub(super) trimmed: AtomicU64,
    pub(super) last_error: Mutex<Option<(SystemTime, String)>>,
}

impl Health {
    /// Records an error for `status`; logged once until it changes (a
    /// failing journal retries every second).
    pub(super) fn fail(&self, msg: String) {
        let mut last = self.last_error.lock();
        if last.as_ref().map(|(_, m)| m) != Some(&msg) {
            tracing::warn!("journal: {msg}");
        }
        *last = Some((SystemTime::now(), msg));
    }
}

pub(super) enum Msg {
    Event(Event),
    /// Write everything queued so far, then answer.
    Flush(mpsc::Sender<()>),
}

/// The journal of one mount: a `Sink` for the adapter, health for `status`.
///
/// The queue is an unbounded channel (memory in proportion to what waits,
/// not to the bound) with the bound kept by `queued`. The writer thread
/// runs only while there is work: idle for `Options::idle_exit`, it closes
/// the database, parks its state in `Idle::parked` and exits; the next
/// event starts it again (`Idle::wake`).
pub struct Journal {
    tx: Sender<Msg>,
    /// Events in the channel (incremented before a send, decremented by
    /// the writer as it takes each).
    queued: Arc<AtomicUsize>,
    pub(super) idle: Arc<Idle>,
    health: Arc<Health>,
    path: PathBuf,
    opts: Options,
    /// The state dir whose descriptor `path` goes through, kept open for
    /// as long as the journal may use it.
    _dir: Option<Arc<crate::layer::safedir::SafeDir>>,
}

/// The writer's state while no thread runs it.
pub(super) struct Idle {
    /// Whether a writer thread runs (or is being started).
    pub(super) running: AtomicBool,
    pub(super) parked: Mutex<Option<(Writer, Receiver<Msg>)>>,
}

impl Idle {
    /// Starts the writer thread if none runs. Called after every send.
    ///
    /// Invariant (no event is left in the channel with no writer): a
    /// writer that goes idle clears `running` and then, holding `parked`,
    /// looks at the channel once more before it parks. A send that this
    /// last look misses comes after the clear, so its `wake` sees
    /// `running == false` and waits on `parked` until the state is back.
    pub(super) fn wake(self: &Arc<Idle>, health: &Arc<Health>) {
        if self.running.load(Ordering::SeqCst) {
            return;
        }
        let parked = self.parked.lock();
        if parked.is_none() || self.running.load(Ordering::SeqCst) {
            return;
        }
        self.running.store(true, Ordering::SeqCst);
        let idle = self.clone();
        let spawned = std::thread::Builder::new()
            .name("journal".into())
            .spawn(move || {
                let Some((writer, rx)) = idle.parked.lock().take() else {
                    return;
                };
                yield_to_requests();
                writer.run(rx, &idle);
            });
        if let Err(e) = spawned {
            // The state stays parked: the next event tries again.
            self.running.store(false, Ordering::SeqCst);
            health.fail(format!("cannot start the journal writer: {e}"));
        }
    }
}

/// Lowers the calling thread's scheduling priority by 10 nice levels
/// (at most to 19): the writer is a background index, so on a busy CPU
/// the FUSE workers and the programs they serve run first, and the
/// writer catches up in the gaps. Under contention it still gets about a
/// tenth of a CPU against the workers, more than the journal needs (its
/// own CPU is about 5% of the daemon's); the queue bound covers a longer
/// backlog.
fn yield_to_requests() {
    if let Err(e) = crate::sys::lower_thread_priority(10) {
        tracing::debug!("journal writer keeps its priority: {e}");
    }
}

/// The longest path a journal row keeps. A path beyond it (deeper than
/// any single system call can name: `PATH_MAX`) keeps its first and last
/// parts around a marker saying how many bytes were left out: a tree
/// 20,000 levels deep would otherwise make its journal grow with the
/// square of its depth (each event naming every level above it: 400 MB
/// for one file written at the bottom) and hold as much in the queue.
pub const PATH_KEPT: usize = 4096;

/// `p` cut to at most about `PATH_KEPT` bytes (see there).
pub(super) fn bounded(p: String) -> String {
    if p.len() <= PATH_KEPT {
        return p;
    }
    let mut head = PATH_KEPT / 4;
    while !p.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = p.len() - PATH_KEPT / 2;
    while !p.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}/…[{} bytes]…/{}", &p[..head], tail - head, &p[tail..])
}

impl Sink for Journal {
    fn record(&self, mut ev: Event) {
        ev.path = bounded(std::mem::take(&mut ev.path));
        ev.to = ev.to.map(bounded);
        if self.queued.fetch_add(1, Ordering::Relaxed) >= self.opts.queue.max(1) {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            self.health.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self.tx.send(Msg::Event(ev)).is_err() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            self.health.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.idle.wake(&self.health);
    }
}

impl Journal {
    /// Starts the writer for the database at `path`. Never fails: a
    /// database that cannot be opened is retried, and events dropped
    /// meanwhile are counted.
    pub fn start(path: PathBuf, opts: Options) -> Arc<Journal> {
        Self::start_with(path, None, opts)
    }

    /// Starts the writer for `journal.db` in the checked state dir `dir`,
    /// reached through its descriptor (kept open by the journal).
    pub fn start_in(dir: Arc<crate::layer::safedir::SafeDir>, opts: Options) -> Arc<Journal> {
        let path = dir.fd_path(crate::state::workspace::JOURNAL_FILE);
        Self::start_with(path, Some(dir), opts)
    }

    fn start_with(
        path: PathBuf,
        dir: Option<Arc<crate::layer::safedir::SafeDir>>,
        opts: Options,
    ) -> Arc<Journal> {
        let (tx, rx) = mpsc::channel();
        let health = Arc::new(Health::default());
        let queued = Arc::new(AtomicUsize::new(0));
        let mut writer = Writer::new(path.clone(), opts.clone(), health.clone(), queued.clone());
        writer._dir = dir.clone();
        let j = Arc::new(Journal {
            tx,
            queued,
            idle: Arc::new(Idle {
                running: AtomicBool::new(false),
                parked: Mutex::new(Some((writer, rx))),
            }),
            health,
            path,
            opts,
            _dir: dir,
        });
        // The first run opens the database (and counts its rows for
        // `status`) and applies retention, then goes idle.
        j.idle.wake(&j.health);
        j
    }

    /// Waits (up to `limit`) until every event queued so far is written
    /// or dropped: at unmount, and for tests that read the database.
    pub fn flush(&self, limit: Duration) -> bool {
        let (tx, rx) = mpsc::channel();
        if self.tx.send(Msg::Flush(tx)).is_err() {
            return false;
        }
        self.idle.wake(&self.health);
        rx.recv_timeout(limit).is_ok()
    }

    /// The journal's health as `status` shows it.
    pub fn health(&self) -> Value {
        let h = &self.health;
        let (err, err_time) = match &*h.last_error.lock() {
            Some((t, m)) => (
                Some(m.clone()),
                Some(humantime::format_rfc3339_seconds(*t).to_string()),
            ),
            None => (None, None),
        };
        json!({
            "enabled": true,
            "path": shown(&self.path).to_string_lossy(),
            "rows": h.rows.load(Ordering::Relaxed),
            "written": h.written.load(Ordering::Relaxed),
            "dropped": h.dropped.load(Ordering::Relaxed),
            "trimmed": h.trimmed.load(Ordering::Relaxed),
            // The database and its WAL as they are now (what the cap bounds).
            "bytes": disk_bytes(&self.path),
            "last_error": err,
            "last_error_time": err_time,
            "max_bytes": self.opts.max_bytes,
            "max_age_seconds": self.opts.max_age.as_secs(),
        })
    }
}
