//! The request side of the journal: `Journal`, the `Sink` the mount
//! offers events to (never blocking), its health counters, and starting
//! the writer thread again after it went idle.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::health::HealthReport;
use super::schema::disk_bytes;
use super::schema::shown;
use super::writer::{Health, Idle, Msg, Writer};
use super::Options;
use crate::overlay::events::{Event, Sink};

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
        let j = Self::start_with(path, None, opts);
        j.begin();
        j
    }

    /// Starts the writer for `journal.db` in the checked state dir `dir`,
    /// reached through its descriptor (kept open by the journal).
    pub fn start_in(dir: Arc<crate::layer::safedir::SafeDir>, opts: Options) -> Arc<Journal> {
        let j = Self::start_in_later(dir, opts);
        j.begin();
        j
    }

    /// `start_in`, but the database is opened (made, counted, trimmed) only
    /// at `begin` or at the first event: a daemon begins once its mount
    /// is live, so that work never delays the mount.
    pub fn start_in_later(dir: Arc<crate::layer::safedir::SafeDir>, opts: Options) -> Arc<Journal> {
        let path = dir.fd_path(crate::state::workspace::JOURNAL_FILE);
        // The file exists from the start, so `log` run as soon as the
        // mount is live shows no rows rather than a missing journal; a
        // failure is the writer's to report when it opens the database.
        let _ = super::schema::create_private(&path);
        Self::start_with(path, Some(dir), opts)
    }

    /// Opens the database now if no event has (`start_in_later`).
    pub fn begin(&self) {
        self.idle.wake(&self.health);
    }

    /// The writer, parked until `begin` or the first event.
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
        // The first run (at `begin`) opens the database (and counts its
        // rows for `status`) and applies retention, then goes idle.
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
    pub fn health(&self) -> HealthReport {
        let h = &self.health;
        let (err, err_time) = match &*h.last_error.lock() {
            Some((t, m)) => (
                Some(m.clone()),
                Some(humantime::format_rfc3339_seconds(*t).to_string()),
            ),
            None => (None, None),
        };
        HealthReport {
            enabled: Some(true),
            path: Some(shown(&self.path).to_string_lossy().into_owned()),
            rows: Some(h.rows.load(Ordering::Relaxed)),
            written: Some(h.written.load(Ordering::Relaxed)),
            dropped: Some(h.dropped.load(Ordering::Relaxed)),
            trimmed: Some(h.trimmed.load(Ordering::Relaxed)),
            // The database and its WAL as they are now (what the cap bounds).
            bytes: Some(disk_bytes(&self.path)),
            last_error: err,
            last_error_time: err_time,
            max_bytes: Some(self.opts.max_bytes),
            max_age_seconds: Some(self.opts.max_age.as_secs()),
            ..HealthReport::default()
        }
    }
}
