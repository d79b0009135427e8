//! The change journal: SQLite (WAL mode) in the state directory, one row
//! per change made through the mount and per policy denial.
//!
//! The request path only offers events to a bounded channel
//! (`Sink::record` never blocks); one writer thread inserts them in
//! batches, each batch one transaction. When SQLite fails (read-only or
//! full state dir, corrupt or deleted database) the writer keeps the
//! events it could not write (at most `HOLD`) and retries every
//! `REOPEN_AFTER`, also when no new event arrives, so a short outage
//! loses nothing. Beyond that, and when the channel is full, events are
//! dropped and counted; the filesystem serves on, `status` shows the
//! count and the last error, and once the journal can write again it
//! records a `journal-dropped` row saying how many it lost. The journal
//! is an index of what happened; the upper is the truth.
//!
//! Each row names its caller by the uid and gid of the FUSE request
//! header (what the kernel says, not what the process calls itself), with
//! its pid and command name. Journals written before these columns
//! existed get them added at open (`migrate`); their old rows have none.
//!
//! Retention: rows older than `max_age` are deleted (when the writer
//! starts and every minute), and the oldest rows go when the database
//! outgrows its share of `max_bytes` (checked after every batch). Every
//! deletion updates, in the same transaction, the journal's one
//! `journal-trimmed` row: how many rows retention deleted in all and the
//! span of their times, so evidence never vanishes without a trace
//! (`trim_rows`). The size bound, database and WAL together, is stated at
//! `Budget`.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use rusqlite::{params, Connection, OpenFlags};
use serde_json::{json, Value};

use crate::overlay::events::{EvOp, Event, Sink};

/// Retention and queue settings (`mount --journal-max-size/-age`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The database is trimmed (oldest rows first) beyond this size.
    pub max_bytes: u64,
    /// Rows older than this are deleted.
    pub max_age: Duration,
    /// Events waiting for the writer; beyond this they are dropped.
    pub queue: usize,
    /// The writer thread exits after this long without events (and
    /// closes the database); the next event starts it again.
    pub idle_exit: Duration,
}

pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(30 * 86_400);

impl Default for Options {
    fn default() -> Options {
        Options {
            max_bytes: DEFAULT_MAX_BYTES,
            max_age: DEFAULT_MAX_AGE,
            queue: 65_536,
            idle_exit: idle_exit(),
        }
    }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS events (
    id     INTEGER PRIMARY KEY,
    time   INTEGER NOT NULL,  -- microseconds since the Unix epoch, UTC
    op     TEXT NOT NULL,
    path   TEXT NOT NULL,
    \"to\"   TEXT,
    result TEXT NOT NULL,     -- 'ok' or the errno name
    bytes  INTEGER,           -- journal-dropped/-trimmed: how many
    pid    INTEGER,
    comm   TEXT,
    rule   TEXT,
    uid    INTEGER,           -- the caller's fs uid and gid (request header)
    gid    INTEGER,
    oldest INTEGER,           -- journal-trimmed: the time span of the rows
    newest INTEGER            --   that went
);
CREATE INDEX IF NOT EXISTS events_time ON events(time);
-- The journal-trimmed row (one at most, see `trim_rows`), found at once
-- and costing other rows nothing.
CREATE INDEX IF NOT EXISTS events_trimmed ON events(id) WHERE op = 'journal-trimmed';
";

/// Columns added since the first schema, with their types: `migrate`
/// adds those a journal lacks (`ALTER TABLE … ADD COLUMN` changes only
/// the schema, not the rows, so it is quick on any size), and readers
/// select NULL for those an unmigrated journal lacks (`columns`).
pub const ADDED_COLUMNS: [(&str, &str); 4] = [
    ("uid", "INTEGER"),
    ("gid", "INTEGER"),
    ("oldest", "INTEGER"),
    ("newest", "INTEGER"),
];

/// The writer's idle time before it exits: 30 s, or
/// `LAYERFS_JOURNAL_IDLE_EXIT_MS` (for tests that watch it come and go).
fn idle_exit() -> Duration {
    std::env::var("LAYERFS_JOURNAL_IDLE_EXIT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis)
        .unwrap_or(Duration::from_secs(30))
}

/// How many events one transaction takes at most (and at most
/// `Budget::batch` bytes of them).
const BATCH: usize = 4096;
/// After a small batch the writer waits this long for more events: one
/// transaction per window instead of one per event keeps its CPU time and
/// wakeups small beside the FUSE threads (a flush waits at most this).
const GATHER: Duration = Duration::from_millis(20);
/// How often retention runs.
const RETENTION_EVERY: Duration = Duration::from_secs(60);
/// How long the writer waits before reopening a database that failed.
const REOPEN_AFTER: Duration = Duration::from_secs(1);
/// Events the writer keeps while the database cannot take them; the
/// oldest beyond this are dropped (and counted).
pub const HOLD: usize = 4096;

/// How the writer keeps the database and its WAL within `max_bytes`.
///
/// The bound: after every batch the writer trims, checkpoints and, if
/// needed, compacts, so that the database file is at most `cap - wal`
/// and the WAL at most `wal`; the next batch adds its pages to the WAL
/// before the next check. So database and WAL together stay within the
/// cap plus one batch (`batch` bytes of rows, about twice that in pages:
/// a sixteenth of the cap at most) while the writer runs. (A reader
/// holding the journal open, `layerfs log`, can delay a checkpoint while
/// it reads; the shared-memory index, `-shm`, 32 KiB, is not counted.)
/// The freed pages of trimmed rows are reused, so the file does not
/// shrink as it trims; a file already beyond its share (written by an
/// older layerfs, or under a larger cap) is compacted once with VACUUM.
/// The bound holds for caps of 64 KiB and more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Budget {
    /// `--journal-max-size`.
    cap: u64,
    /// The WAL's share: it is checkpointed and truncated beyond this (an
    /// eighth of the cap, at most 4 MiB, which is SQLite's usual
    /// checkpoint interval).
    wal: u64,
    /// The estimated row bytes (`row_bytes`) one batch takes at most: a
    /// 32nd of the cap, at least 1 KiB, at most 1 MiB.
    batch: u64,
}

impl Budget {
    fn new(cap: u64) -> Budget {
        Budget {
            cap,
            wal: (cap / 8).min(4 << 20),
            batch: (cap / 32).clamp(1 << 10, 1 << 20),
        }
    }

    /// The database file's share: the cap less the WAL's.
    fn db(&self) -> u64 {
        self.cap - self.wal
    }

    /// Pages in use beyond which the oldest rows are trimmed: the file's
    /// share less room for one batch (whose pages take about twice its
    /// row bytes: table and index).
    fn trim_above(&self) -> u64 {
        self.db().saturating_sub(2 * self.batch)
    }

    /// What trimming leaves in use: three quarters of the file's share,
    /// so the next trim comes only after a quarter of it was written.
    fn trim_to(&self) -> u64 {
        self.db() / 4 * 3
    }
}

/// An estimate of the bytes a row takes, for the batch bound.
fn row_bytes(e: &Event) -> u64 {
    (64 + e.path.len()
        + e.to.as_ref().map_or(0, |t| t.len())
        + e.comm.len()
        + e.rule.as_ref().map_or(0, |r| r.len())) as u64
}

/// The bytes the database and its WAL take on disk now.
fn disk_bytes(db: &Path) -> u64 {
    let len = |p: &Path| fs::metadata(p).map_or(0, |m| m.len());
    len(db) + len(&wal_path(db))
}

fn wal_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_os_string();
    p.push("-wal");
    PathBuf::from(p)
}

/// The daemon itself, as rows it writes about the journal name it.
fn daemon_ids() -> (u32, u32, u32) {
    (
        std::process::id(),
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    )
}

/// Records an undo operation (`reset`, `gc`, `snapshot save`/`restore`)
/// as one row of the journal at `db`, written by the command that ran it:
/// `what` names the paths or the snapshot, `entries` how many entries it
/// changed or archived; the caller is this process (uid, gid, pid, comm).
/// A workspace whose journal is off (no database) gets no row.
pub fn record_undo(db: &Path, op: EvOp, what: &str, entries: u64) -> Result<(), String> {
    if !db.exists() {
        return Ok(());
    }
    let comm = fs::read_to_string("/proc/self/comm")
        .map(|c| c.trim_end().to_string())
        .unwrap_or_else(|_| "layerfs".into());
    let (pid, uid, gid) = daemon_ids();
    let conn = open_rw(db).map_err(|e| format!("journal {}: {e}", db.display()))?;
    conn.execute(
        "INSERT INTO events (time, op, path, result, bytes, pid, comm, uid, gid)
         VALUES (?1, ?2, ?3, 'ok', ?4, ?5, ?6, ?7, ?8)",
        params![
            micros(SystemTime::now()),
            op.name(),
            what,
            entries as i64,
            pid,
            comm,
            uid,
            gid
        ],
    )
    .map_err(|e| format!("journal {}: {e}", db.display()))?;
    Ok(())
}

/// Counters `status` reports.
#[derive(Default)]
struct Health {
    /// Rows in the database (as far as this daemon knows).
    rows: AtomicU64,
    /// Rows this daemon inserted.
    written: AtomicU64,
    /// Events lost (full queue or a failed insert).
    dropped: AtomicU64,
    /// Rows retention deleted (the `journal-trimmed` row it replaces
    /// not counted).
    trimmed: AtomicU64,
    last_error: Mutex<Option<(SystemTime, String)>>,
}

impl Health {
    /// Records an error for `status`; logged once until it changes (a
    /// failing journal retries every second).
    fn fail(&self, msg: String) {
        let mut last = self.last_error.lock();
        if last.as_ref().map(|(_, m)| m) != Some(&msg) {
            tracing::warn!("journal: {msg}");
        }
        *last = Some((SystemTime::now(), msg));
    }
}

enum Msg {
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
    idle: Arc<Idle>,
    health: Arc<Health>,
    path: PathBuf,
    opts: Options,
    /// The state dir whose descriptor `path` goes through, kept open for
    /// as long as the journal may use it.
    _dir: Option<Arc<crate::layer::safedir::SafeDir>>,
}

/// The writer's state while no thread runs it.
struct Idle {
    /// Whether a writer thread runs (or is being started).
    running: AtomicBool,
    parked: Mutex<Option<(Writer, Receiver<Msg>)>>,
}

impl Idle {
    /// Starts the writer thread if none runs. Called after every send.
    ///
    /// Invariant (no event is left in the channel with no writer): a
    /// writer that goes idle clears `running` and then, holding `parked`,
    /// looks at the channel once more before it parks. A send that this
    /// last look misses comes after the clear, so its `wake` sees
    /// `running == false` and waits on `parked` until the state is back.
    fn wake(self: &Arc<Idle>, health: &Arc<Health>) {
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
fn bounded(p: String) -> String {
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

/// Microseconds since the epoch.
fn micros(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The symbolic name of an errno ("ENOENT"), or its number.
pub fn errno_name(e: i32) -> String {
    if e == 0 {
        return "ok".into();
    }
    nix::errno::Errno::from_raw(e)
        .to_string()
        .split(':')
        .next()
        .filter(|n| n.starts_with('E'))
        .map(String::from)
        .unwrap_or_else(|| format!("errno {e}"))
}

/// The database's identity on disk, to notice it being deleted or replaced.
fn file_id(p: &Path) -> Option<(u64, u64)> {
    fs::symlink_metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// A database path for messages: a path through a state dir's descriptor
/// (`SafeDir::fd_path`) shows as the directory's own path.
fn shown(p: &Path) -> PathBuf {
    crate::layer::safedir::shown_path(p)
}

/// Opens the database at `path`. A path through a checked state dir's
/// descriptor (`/proc/self/fd/N/journal.db`) is opened through the
/// `layerfs-fd` VFS, so SQLite reaches it (and its `-wal`, `-shm` and
/// `-journal` files) through the descriptor rather than by the
/// directory's name (`layer::sys::sqlite_fd_vfs`).
fn open_db(path: &Path, flags: OpenFlags) -> rusqlite::Result<Connection> {
    if path.starts_with("/proc/self/fd") && crate::layer::sys::sqlite_fd_vfs() {
        Connection::open_with_flags_and_vfs(path, flags, crate::layer::sys::SQLITE_FD_VFS)
    } else {
        Connection::open_with_flags(path, flags)
    }
}

fn is_corrupt(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
    )
}

/// SQLite's journal mode for the database at `path`: WAL, except on a
/// copy-on-write filesystem. WAL keeps its index in a memory-mapped file
/// (`-shm`); on btrfs (and other copy-on-write filesystems) every store
/// into that mapping needs a new block, and when the filesystem is full or
/// over its quota the kernel answers the store with SIGBUS, which kills
/// the daemon and with it the mount. The rollback journal (`TRUNCATE`)
/// maps nothing: a full disk is then an error SQLite returns, which the
/// writer survives like any other.
fn journal_mode(path: &Path) -> &'static str {
    const COW_FILESYSTEMS: [i64; 3] = [
        0x9123_683e, // btrfs
        0xca45_1a4e, // bcachefs
        0x2fc1_2fc1, // zfs
    ];
    let dir = path.parent().unwrap_or(Path::new("."));
    match nix::sys::statfs::statfs(dir) {
        Ok(st) if COW_FILESYSTEMS.contains(&st.filesystem_type().0) => "TRUNCATE",
        _ => "WAL",
    }
}

/// Opens (creating if needed) the journal database (WAL mode where the
/// filesystem allows it, see `journal_mode`).
pub fn open_rw(path: &Path) -> rusqlite::Result<Connection> {
    // Private whatever the daemon's umask (SQLite gives the -wal and -shm
    // files the database's mode); a failure here is SQLite's to report.
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let _ = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .and_then(|f| f.set_permissions(fs::Permissions::from_mode(0o600)));
    }
    let c = open_db(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    c.busy_timeout(Duration::from_millis(500))?;
    c.pragma_update(None, "journal_mode", journal_mode(path))?;
    c.pragma_update(None, "synchronous", "NORMAL")?;
    c.execute_batch(SCHEMA)?;
    migrate(&c)?;
    Ok(c)
}

/// The columns of the events table (empty when there is none).
pub fn columns(c: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = c.prepare("SELECT name FROM pragma_table_info('events')")?;
    let names = stmt.query_map([], |r| r.get(0))?;
    names.collect()
}

/// Adds the columns a journal of an older layerfs lacks (its rows keep
/// NULL there: their caller's ids were never known).
fn migrate(c: &Connection) -> rusqlite::Result<()> {
    let have = columns(c)?;
    for (name, ty) in ADDED_COLUMNS {
        if !have.iter().any(|h| h == name) {
            c.execute_batch(&format!("ALTER TABLE events ADD COLUMN {name} {ty}"))?;
            tracing::info!("journal: added column {name} to an older journal");
        }
    }
    Ok(())
}

struct Writer {
    path: PathBuf,
    opts: Options,
    budget: Budget,
    health: Arc<Health>,
    conn: Option<Connection>,
    id: Option<(u64, u64)>,
    /// Events not yet written because the database failed (oldest first).
    held: Vec<Event>,
    /// Dropped events not yet recorded as a `journal-dropped` row.
    unrecorded: u64,
    seen_dropped: u64,
    next_open: Instant,
    next_retention: Instant,
    /// The journal's `queued` count (the writer decrements it).
    queued: Arc<AtomicUsize>,
    /// Whether the rows were counted (once: a reopen after an idle exit
    /// does not scan the table again).
    counted: bool,
    /// The state dir `path` goes through, open while the writer lives.
    _dir: Option<Arc<crate::layer::safedir::SafeDir>>,
}

impl Writer {
    fn new(path: PathBuf, opts: Options, health: Arc<Health>, queued: Arc<AtomicUsize>) -> Writer {
        Writer {
            path,
            budget: Budget::new(opts.max_bytes),
            opts,
            health,
            conn: None,
            id: None,
            held: Vec::new(),
            unrecorded: 0,
            seen_dropped: 0,
            next_open: Instant::now(),
            next_retention: Instant::now(),
            queued,
            counted: false,
            _dir: None,
        }
    }

    fn run(mut self, rx: Receiver<Msg>, idle: &Idle) {
        self.ensure_open();
        self.maintain();
        loop {
            // Held events are retried on time, not only when new ones come.
            let wait = if self.held.is_empty() {
                self.opts.idle_exit.min(RETENTION_EVERY)
            } else {
                REOPEN_AFTER
            };
            let first = match rx.recv_timeout(wait) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => {
                    if !self.held.is_empty() {
                        self.write(Vec::new());
                        self.maintain();
                        continue;
                    }
                    self.maintain();
                    // Idle: park (see `Idle::wake` for why this order).
                    idle.running.store(false, Ordering::SeqCst);
                    let mut parked = idle.parked.lock();
                    match rx.try_recv() {
                        Ok(m) => {
                            idle.running.store(true, Ordering::SeqCst);
                            drop(parked);
                            m
                        }
                        Err(_) => {
                            // Closing the database frees its cache; WAL
                            // is checkpointed by the last close.
                            self.conn = None;
                            // A clean close, not a failure: the next start
                            // opens at once.
                            self.next_open = Instant::now();
                            *parked = Some((self, rx));
                            return;
                        }
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    if !self.held.is_empty() {
                        tracing::warn!(
                            "journal: {} event(s) could not be written to {} and are lost",
                            self.held.len(),
                            shown(&self.path).display()
                        );
                    }
                    return;
                }
            };
            let mut batch = Vec::new();
            let mut bytes = 0;
            let mut flushes = Vec::new();
            let mut next = Some(first);
            while let Some(m) = next.take() {
                match m {
                    Msg::Event(e) => {
                        self.queued.fetch_sub(1, Ordering::Relaxed);
                        bytes += row_bytes(&e);
                        batch.push(e)
                    }
                    Msg::Flush(t) => flushes.push(t),
                }
                // A batch is bounded in rows and in bytes: the size cap
                // is checked between batches (`Budget`).
                if batch.len() < BATCH && bytes < self.budget.batch {
                    next = rx.try_recv().ok();
                }
            }
            let small = batch.len() < BATCH && bytes < self.budget.batch;
            let flushed = !flushes.is_empty();
            if !batch.is_empty() || !self.held.is_empty() {
                self.write(batch);
            }
            self.maintain();
            for f in flushes {
                let _ = f.send(());
            }
            if small && !flushed {
                std::thread::sleep(GATHER);
            }
        }
    }

    /// Opens the database when there is none (retrying failures at most
    /// every `REOPEN_AFTER`); a corrupt one is moved aside first.
    fn ensure_open(&mut self) -> bool {
        if self.conn.is_some() {
            // Deleted or replaced behind the daemon: SQLite would write on
            // into the unlinked file, so start a new one where it was.
            if file_id(&self.path) != self.id {
                self.health.fail(format!(
                    "{} was deleted or replaced while mounted; a new journal was started \
                     (earlier rows are gone with the old file)",
                    shown(&self.path).display()
                ));
                self.conn = None;
                self.next_open = Instant::now();
            } else {
                return true;
            }
        }
        if Instant::now() < self.next_open {
            return false;
        }
        // Closed while idle, and deleted or replaced meanwhile: said as if
        // it had happened under an open connection.
        if self.id.is_some() && file_id(&self.path) != self.id {
            self.health.fail(format!(
                "{} was deleted or replaced while mounted; a new journal was started \
                 (earlier rows are gone with the old file)",
                shown(&self.path).display()
            ));
            self.id = None;
            self.counted = false;
        }
        self.next_open = Instant::now() + REOPEN_AFTER;
        let opened = match open_rw(&self.path) {
            Err(e) if is_corrupt(&e) => {
                self.set_aside(&e);
                open_rw(&self.path)
            }
            r => r,
        };
        match opened {
            Ok(c) => {
                // The WAL's share of the cap: SQLite checkpoints at
                // about that size and truncates the file back to it.
                let pages = (self.budget.wal / 4096).max(1) as i64;
                let sized = c
                    .pragma_update(None, "wal_autocheckpoint", pages)
                    .and_then(|_| {
                        c.pragma_update(None, "journal_size_limit", self.budget.wal as i64)
                    });
                if let Err(e) = sized {
                    self.health.fail(format!(
                        "cannot size the WAL of {}: {e}",
                        self.path.display()
                    ));
                }
                if !self.counted {
                    let rows: i64 = c
                        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
                        .unwrap_or(0);
                    self.health.rows.store(rows as u64, Ordering::Relaxed);
                    self.counted = true;
                }
                self.id = file_id(&self.path);
                self.conn = Some(c);
                true
            }
            Err(e) => {
                self.health
                    .fail(format!("cannot open {}: {e}", shown(&self.path).display()));
                false
            }
        }
    }

    /// Keeps `events` (after the ones already held) for the next try;
    /// the oldest beyond `HOLD` are dropped and counted, to be recorded as
    /// a `journal-dropped` row once the journal writes again.
    fn hold(&mut self, events: Vec<Event>) {
        self.held = events;
        if self.held.len() > HOLD {
            let excess = self.held.len() - HOLD;
            self.held.drain(..excess);
            self.health
                .dropped
                .fetch_add(excess as u64, Ordering::Relaxed);
        }
    }

    /// Writes the held events and `batch` in one transaction, or holds
    /// them when the database cannot take them. A full disk drops the
    /// oldest half and tries again at once, so the newest events (and the
    /// count of the lost ones) get in when a little space is left.
    fn write(&mut self, batch: Vec<Event>) {
        let mut batch = batch;
        if !self.held.is_empty() {
            let mut all = std::mem::take(&mut self.held);
            all.append(&mut batch);
            batch = all;
        }
        if !self.ensure_open() {
            return self.hold(batch);
        }
        loop {
            // Events the queue (or a full disk) refused since the last look.
            let dropped = self.health.dropped.load(Ordering::Relaxed);
            self.unrecorded += dropped - self.seen_dropped;
            self.seen_dropped = dropped;
            let Some(conn) = self.conn.as_mut() else {
                return self.hold(batch);
            };
            let e = match insert(conn, &batch, self.unrecorded) {
                Ok(rows) => {
                    self.unrecorded = 0;
                    self.health.rows.fetch_add(rows, Ordering::Relaxed);
                    self.health.written.fetch_add(rows, Ordering::Relaxed);
                    return;
                }
                Err(e) => e,
            };
            let full = e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull);
            if full && !batch.is_empty() {
                let half = batch.len().div_ceil(2);
                batch.drain(..half);
                self.health
                    .dropped
                    .fetch_add(half as u64, Ordering::Relaxed);
                self.health.fail(format!(
                    "writing to {} failed: {e}; the oldest events waiting were dropped \
                     (free space in the state dir, or lower --journal-max-size)",
                    shown(&self.path).display()
                ));
                continue;
            }
            self.health.fail(format!(
                "writing to {} failed: {e}; {} event(s) kept for a retry (at most {HOLD}, \
                 then dropped)",
                shown(&self.path).display(),
                batch.len()
            ));
            self.conn = None;
            if is_corrupt(&e) {
                self.set_aside(&e);
            }
            return self.hold(batch);
        }
    }

    /// Moves a corrupt database aside (its WAL and shared-memory files go:
    /// they belong to it and must not be replayed into a new one).
    fn set_aside(&mut self, e: &rusqlite::Error) {
        let aside = self.path.with_extension(format!(
            "db.corrupt-{}",
            micros(SystemTime::now()) / 1_000_000
        ));
        let moved = fs::rename(&self.path, &aside);
        for ext in ["db-wal", "db-shm"] {
            let _ = fs::remove_file(self.path.with_extension(ext));
        }
        self.health.fail(match moved {
            Ok(()) => format!(
                "{} was corrupt ({e}); moved to {} and a new journal was started",
                shown(&self.path).display(),
                aside.display()
            ),
            Err(m) => format!(
                "{} is corrupt ({e}) and cannot be moved: {m}; remove it to start a new journal",
                shown(&self.path).display()
            ),
        });
    }

    /// Retention: rows beyond the age limit (at most every
    /// `RETENTION_EVERY`), then the size bound (every time: after each
    /// batch).
    fn maintain(&mut self) {
        if Instant::now() >= self.next_retention {
            self.next_retention = Instant::now() + RETENTION_EVERY;
            let _ = self.ensure_open();
            let cutoff = micros(SystemTime::now()) - self.opts.max_age.as_micros() as i64;
            if let Err(e) = self.trim(Trim::OlderThan(cutoff)) {
                self.health
                    .fail(format!("journal retention by age failed: {e}"));
            }
        }
        if let Err(e) = self.keep_within_cap() {
            self.health.fail(format!(
                "keeping {} within --journal-max-size failed: {e}",
                self.path.display()
            ));
        }
    }

    /// Keeps the database and its WAL within the cap (see `Budget`):
    /// trims the oldest rows when the pages in use pass `trim_above`,
    /// checkpoints (truncating the WAL) when it passes its share, and
    /// compacts a file beyond its share.
    fn keep_within_cap(&mut self) -> rusqlite::Result<()> {
        let b = self.budget;
        self.trim(Trim::ToSize)?;
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        let len = |p: &Path| fs::metadata(p).map_or(0, |m| m.len());
        if len(&wal_path(&self.path)) > b.wal {
            conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")?;
        }
        if len(&self.path) > b.db() {
            // Beyond its share with the rows trimmed (an older layerfs's
            // journal, or a larger cap before): freed pages are reused
            // but never given back, so the file is rewritten once.
            tracing::info!(
                "journal: compacting {} ({} bytes, --journal-max-size {})",
                self.path.display(),
                len(&self.path),
                b.cap
            );
            conn.execute_batch("VACUUM; PRAGMA wal_checkpoint(TRUNCATE)")?;
        }
        Ok(())
    }

    /// Deletes the oldest rows `how` selects, in chunks, each one
    /// transaction that adds what went to the `journal-trimmed` row (how
    /// many rows, the span of their times: `trim_rows`), so a trim is
    /// never silent. A chunk's freed pages go through the WAL, so each
    /// chunk frees at most half the WAL's share, the WAL emptied before
    /// it: trimming keeps within the bound too. Returns whether any row
    /// went.
    fn trim(&mut self, how: Trim) -> rusqlite::Result<bool> {
        let b = self.budget;
        let wal = wal_path(&self.path);
        let Some(conn) = self.conn.as_mut() else {
            return Ok(false);
        };
        // After every batch: two page counts, and no row count unless
        // the pages in use call for a trim.
        if matches!(how, Trim::ToSize) && used_bytes(conn)? <= b.trim_above() {
            return Ok(false);
        }
        let mut rows: i64 = conn.query_row("SELECT count(*) FROM events", [], |r| r.get(0))?;
        let mut any = false;
        while rows > 1 {
            let used = used_bytes(conn)?.max(1);
            let per_chunk = (rows as u128 * (b.wal / 2) as u128 / used as u128).max(1) as i64;
            let (cutoff, limit) = match how {
                Trim::OlderThan(cutoff) => (cutoff, per_chunk),
                Trim::ToSize => {
                    // Trimming starts above `trim_above` and goes on down
                    // to `trim_to`: not a trim every batch.
                    if used <= if any { b.trim_to() } else { b.trim_above() } {
                        break;
                    }
                    let want = (rows as u128 * (used - b.trim_to().min(used)) as u128)
                        .div_ceil(used as u128) as i64;
                    (i64::MAX, want.clamp(1, per_chunk))
                }
            };
            if fs::metadata(&wal).map_or(0, |m| m.len()) > 0 {
                conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")?;
            }
            let t = trim_rows(conn, cutoff, limit)?;
            if t.own == 0 {
                break;
            }
            // The marker row replaces what went.
            let _ = self
                .health
                .rows
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                    Some(r.saturating_sub(t.deleted) + 1)
                });
            self.health.trimmed.fetch_add(t.own, Ordering::Relaxed);
            rows -= t.deleted as i64 - 1;
            any = true;
        }
        if any {
            conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")?;
            tracing::debug!("journal: trimmed {}", how.describe());
        }
        Ok(any)
    }
}

/// Which rows retention deletes, oldest (by id) first.
#[derive(Debug, Clone, Copy)]
enum Trim {
    /// Rows whose time is before this (microseconds): `--journal-max-age`.
    OlderThan(i64),
    /// Enough rows to bring the database back within its share of
    /// `--journal-max-size` (`Budget::trim_to`).
    ToSize,
}

impl Trim {
    fn describe(self) -> &'static str {
        match self {
            Trim::OlderThan(_) => "by age",
            Trim::ToSize => "by size",
        }
    }
}

/// What one `trim_rows` did.
struct Trimmed {
    /// Rows deleted, the earlier marker included.
    deleted: u64,
    /// Rows deleted that were not the earlier marker.
    own: u64,
}

/// The bytes of the database's pages in use (free pages not counted).
fn used_bytes(conn: &Connection) -> rusqlite::Result<u64> {
    let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    let free: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
    let size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    Ok(((pages - free).max(0) * size) as u64)
}

/// Deletes the oldest `limit` rows (by id) whose time is before `cutoff`
/// and, in the same transaction, replaces the `journal-trimmed` row by one
/// that adds them: its `bytes` counts every row retention ever deleted
/// from this journal and `oldest`/`newest` span their times. So a trim is
/// never silent, and the rows kept plus that count are every row written.
/// (One marker, moved to the end at each trim: markers left among the
/// rows would be trimmed in turn, and spans of markers folded into one
/// another would overlap.)
fn trim_rows(conn: &mut Connection, cutoff: i64, limit: i64) -> rusqlite::Result<Trimmed> {
    const CHOSEN: &str = "id IN (SELECT id FROM (SELECT id FROM events
                                                 WHERE time < ?1 AND op <> 'journal-trimmed'
                                                 ORDER BY id LIMIT ?2)
                                 UNION SELECT id FROM events WHERE op = 'journal-trimmed')";
    let args = params![cutoff, limit];
    let tx = conn.transaction()?;
    let (rows, events, own, oldest, newest): (i64, i64, i64, Option<i64>, Option<i64>) = tx
        .query_row(
            &format!(
                "SELECT count(*),
                        coalesce(sum(CASE WHEN op = 'journal-trimmed'
                                          THEN coalesce(bytes, 0) ELSE 1 END), 0),
                        coalesce(sum(op <> 'journal-trimmed'), 0),
                        min(CASE WHEN op = 'journal-trimmed' THEN coalesce(oldest, time)
                                 ELSE time END),
                        max(CASE WHEN op = 'journal-trimmed' THEN coalesce(newest, time)
                                 ELSE time END)
                 FROM events WHERE {CHOSEN}"
            ),
            args,
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )?;
    if own == 0 {
        // Nothing new to trim (the transaction rolls back as it drops).
        return Ok(Trimmed { deleted: 0, own: 0 });
    }
    tx.execute(&format!("DELETE FROM events WHERE {CHOSEN}"), args)?;
    let (pid, uid, gid) = daemon_ids();
    tx.execute(
        "INSERT INTO events (time, op, path, result, bytes, pid, comm, uid, gid, oldest, newest)
         VALUES (?1, ?2, '', 'ok', ?3, ?4, 'layerfs', ?5, ?6, ?7, ?8)",
        params![
            micros(SystemTime::now()),
            EvOp::Trimmed.name(),
            events,
            pid,
            uid,
            gid,
            oldest,
            newest
        ],
    )?;
    tx.commit()?;
    Ok(Trimmed {
        deleted: rows as u64,
        own: own as u64,
    })
}

/// Inserts `batch` in one transaction, after a `journal-dropped` row
/// when `unrecorded` events were lost; returns the rows written.
fn insert(conn: &mut Connection, batch: &[Event], unrecorded: u64) -> rusqlite::Result<u64> {
    let tx = conn.transaction()?;
    let mut rows = 0;
    {
        let mut ins = tx.prepare_cached(
            "INSERT INTO events (time, op, path, \"to\", result, bytes, pid, comm, rule, uid, gid)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        )?;
        if unrecorded > 0 {
            let (pid, uid, gid) = daemon_ids();
            ins.execute(params![
                micros(SystemTime::now()),
                EvOp::Dropped.name(),
                "",
                None::<String>,
                "ok",
                unrecorded as i64,
                pid,
                "layerfs",
                None::<String>,
                uid,
                gid,
            ])?;
            rows += 1;
        }
        for e in batch {
            ins.execute(params![
                micros(e.time),
                e.op.name(),
                e.path,
                e.to,
                errno_name(e.errno),
                e.bytes.map(|b| b as i64),
                e.pid,
                &*e.comm,
                e.rule,
                e.uid,
                e.gid,
            ])?;
            rows += 1;
        }
    }
    tx.commit()?;
    Ok(rows)
}

/// Opens the journal read-only (for `layerfs log` and offline status).
pub fn open_ro(path: &Path) -> Result<Connection, String> {
    if fs::symlink_metadata(path).is_err() {
        return Err(format!(
            "no journal at {} (the workspace was mounted with --no-journal, or never mounted)",
            shown(path).display()
        ));
    }
    let c = open_db(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("cannot open journal {}: {e}", shown(path).display()))?;
    let _ = c.busy_timeout(Duration::from_secs(2));
    Ok(c)
}

/// Journal health of an unmounted workspace, read from the database:
/// its rows, the events its `journal-dropped` rows say were lost
/// (`dropped_recorded`; a live mount's `dropped` counts since the mount)
/// and the rows retention deleted, as its newest `journal-trimmed` rows
/// say (`trimmed_recorded`: the older ones are folded into them).
pub fn offline_health(db: &Path) -> Value {
    match open_ro(db).and_then(|c| {
        c.query_row(
            "SELECT count(*), coalesce(sum(CASE WHEN op = 'journal-dropped' THEN bytes END), 0),
                    coalesce(sum(CASE WHEN op = 'journal-trimmed' THEN bytes END), 0)
             FROM events",
            [],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            },
        )
        .map_err(|e| format!("{}: {e}", shown(db).display()))
    }) {
        Ok((rows, lost, trimmed)) => json!({
            "path": shown(db).to_string_lossy(),
            "rows": rows,
            "dropped_recorded": lost,
            "trimmed_recorded": trimmed,
            "bytes": disk_bytes(db),
        }),
        Err(e) => json!({"path": shown(db).to_string_lossy(), "rows": null, "last_error": e}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_deeper_than_path_max_is_kept_bounded() {
        let short = "a/".repeat(100) + "f";
        assert_eq!(bounded(short.clone()), short);
        let deep = "é/".repeat(10_000) + "leaf";
        let b = bounded(deep.clone());
        assert!(b.len() <= PATH_KEPT + 64, "{}", b.len());
        assert!(b.starts_with("é/é/") && b.ends_with("é/leaf"));
        let left_out: usize = b
            .split("…[")
            .nth(1)
            .and_then(|r| r.split(" bytes]").next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert_eq!(
            b.len() - "/…[ bytes]…/".len() - left_out.to_string().len() + left_out,
            deep.len()
        );
    }

    fn ev(op: EvOp, path: &str) -> Event {
        Event {
            time: SystemTime::now(),
            op,
            path: path.into(),
            to: None,
            errno: 0,
            bytes: Some(3),
            pid: 1,
            uid: 1001,
            gid: 1001,
            comm: Arc::from("test"),
            rule: None,
        }
    }

    #[test]
    fn errno_names() {
        assert_eq!(errno_name(0), "ok");
        assert_eq!(errno_name(libc::ENOENT), "ENOENT");
        assert_eq!(errno_name(libc::EROFS), "EROFS");
    }

    #[test]
    fn writes_rows_and_recovers_from_a_deleted_database() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("journal.db");
        let j = Journal::start(db.clone(), Options::default());
        j.record(ev(EvOp::Create, "a"));
        j.record(ev(EvOp::Write, "a"));
        assert!(j.flush(Duration::from_secs(10)));
        let c = open_ro(&db).unwrap();
        let n: i64 = c
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
        drop(c);
        fs::remove_file(&db).unwrap();
        j.record(ev(EvOp::Unlink, "a"));
        assert!(j.flush(Duration::from_secs(10)));
        let h = j.health();
        assert!(h["last_error"].as_str().unwrap().contains("deleted"), "{h}");
        let c = open_ro(&db).unwrap();
        let ops: Vec<String> = c
            .prepare("SELECT op FROM events")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(ops, vec!["unlink".to_string()]);
    }

    #[test]
    fn the_writer_exits_when_idle_and_comes_back_for_the_next_event() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("journal.db");
        let opts = Options {
            idle_exit: Duration::from_millis(200),
            ..Options::default()
        };
        let j = Journal::start(db.clone(), opts);
        let gone = |j: &Journal| {
            let t = Instant::now();
            while j.idle.running.load(Ordering::SeqCst) {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "writer never went idle"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(j.idle.parked.lock().is_some());
        };
        for round in 0..5 {
            gone(&j);
            // Events sent to a parked writer start it again, and none is
            // lost however the send and the parking interleave.
            for i in 0..100 {
                j.record(ev(EvOp::Create, &format!("r{round}-{i}")));
                if i % 10 == 0 {
                    std::thread::sleep(Duration::from_millis(i as u64));
                }
            }
            assert!(j.flush(Duration::from_secs(10)));
            assert_eq!(count(&db), Some(100 * (round + 1)));
        }
        gone(&j);
        assert_eq!(j.health()["dropped"], 0);
        assert_eq!(j.health()["rows"], 500);
        // A database deleted while the writer was parked is noticed.
        fs::remove_file(&db).unwrap();
        j.record(ev(EvOp::Unlink, "x"));
        assert!(j.flush(Duration::from_secs(10)));
        let h = j.health();
        assert!(h["last_error"].as_str().unwrap().contains("deleted"), "{h}");
        assert_eq!(count(&db), Some(1));
    }

    fn count(db: &Path) -> Option<i64> {
        let c = open_ro(db).ok()?;
        c.query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .ok()
    }

    #[test]
    fn events_are_held_while_the_database_cannot_open_and_written_when_it_can() {
        let dir = tempfile::tempdir().unwrap();
        let later = dir.path().join("later");
        let db = later.join("journal.db");
        let j = Journal::start(db.clone(), Options::default());
        // More than the writer holds: the oldest are dropped and counted.
        for i in 0..HOLD + 10 {
            j.record(ev(EvOp::Create, &format!("f{i}")));
        }
        assert!(j.flush(Duration::from_secs(10)));
        let h = j.health();
        assert!(
            h["last_error"].as_str().unwrap().contains("cannot open"),
            "{h}"
        );
        assert_eq!(h["dropped"], json!(10), "{h}");
        // The directory appears; no new event comes, the writer retries alone.
        fs::create_dir(&later).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while count(&db) != Some(HOLD as i64 + 1) {
            assert!(Instant::now() < deadline, "held events never written");
            std::thread::sleep(Duration::from_millis(50));
        }
        let c = open_ro(&db).unwrap();
        let (first, lost): (String, i64) = c
            .query_row(
                "SELECT (SELECT path FROM events WHERE op = 'create' ORDER BY id LIMIT 1),
                        (SELECT bytes FROM events WHERE op = 'journal-dropped')",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(first, "f10");
        assert_eq!(lost, 10);
    }

    /// Rows kept plus the counts of the `journal-trimmed` rows.
    fn accounted(db: &Path) -> (i64, i64, i64) {
        let c = open_ro(db).unwrap();
        c.query_row(
            "SELECT coalesce(sum(op <> 'journal-trimmed'), 0),
                    coalesce(sum(CASE WHEN op = 'journal-trimmed' THEN bytes END), 0),
                    coalesce(sum(op = 'journal-trimmed'), 0)
             FROM events",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap()
    }

    #[test]
    fn trimming_by_size_accounts_for_every_row_and_keeps_within_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("journal.db");
        let cap = 256 << 10;
        let j = Journal::start(
            db.clone(),
            Options {
                max_bytes: cap,
                ..Options::default()
            },
        );
        let mut max = 0;
        for round in 0..40 {
            for i in 0..500 {
                j.record(ev(
                    EvOp::Create,
                    &format!("dir/some-longer-name-{round}-{i}"),
                ));
            }
            assert!(j.flush(Duration::from_secs(10)));
            max = max.max(disk_bytes(&db));
        }
        let (kept, trimmed, markers) = accounted(&db);
        assert_eq!(kept + trimmed, 20_000, "kept {kept}, trimmed {trimmed}");
        assert!(trimmed > 0);
        // One marker, counting every trim.
        assert_eq!(markers, 1);
        assert!(disk_bytes(&db) <= cap, "{} bytes", disk_bytes(&db));
        assert!(max <= cap + cap / 16, "{max} bytes");
        let h = j.health();
        assert_eq!(h["trimmed"], json!(trimmed), "{h}");
        assert_eq!(h["rows"], json!(kept + markers), "{h}");
    }

    #[test]
    fn an_oversized_journal_of_an_older_layerfs_is_migrated_trimmed_and_compacted() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("journal.db");
        {
            let c = Connection::open(&db).unwrap();
            c.execute_batch(
                "CREATE TABLE events (id INTEGER PRIMARY KEY, time INTEGER NOT NULL,
                     op TEXT NOT NULL, path TEXT NOT NULL, \"to\" TEXT, result TEXT NOT NULL,
                     bytes INTEGER, pid INTEGER, comm TEXT, rule TEXT);
                 CREATE INDEX events_time ON events(time);
                 BEGIN;",
            )
            .unwrap();
            let now = micros(SystemTime::now());
            for i in 0..30_000i64 {
                c.execute(
                    "INSERT INTO events (time, op, path, result, pid, comm)
                     VALUES (?1, 'create', ?2, 'ok', 7, 'old')",
                    params![now - 30_000 + i, format!("old/file-{i}")],
                )
                .unwrap();
            }
            c.execute_batch("COMMIT").unwrap();
        }
        let before = fs::metadata(&db).unwrap().len();
        let cap = 512 << 10;
        assert!(before > 2 * cap, "{before}");
        let j = Journal::start(
            db.clone(),
            Options {
                max_bytes: cap,
                ..Options::default()
            },
        );
        j.record(ev(EvOp::Create, "new"));
        assert!(j.flush(Duration::from_secs(30)));
        assert!(disk_bytes(&db) <= cap, "{} bytes", disk_bytes(&db));
        let (kept, trimmed, _) = accounted(&db);
        assert_eq!(kept + trimmed, 30_001);
        let c = open_ro(&db).unwrap();
        let cols = columns(&c).unwrap();
        for (name, _) in ADDED_COLUMNS {
            assert!(cols.iter().any(|c| c == name), "{name} missing: {cols:?}");
        }
        let (uid, old_uid): (Option<i64>, Option<i64>) = c
            .query_row(
                "SELECT (SELECT uid FROM events WHERE path = 'new'),
                        (SELECT uid FROM events WHERE comm = 'old' LIMIT 1)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(uid, Some(1001));
        assert_eq!(old_uid, None);
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let dir = tempfile::tempdir().unwrap();
        let opts = Options {
            queue: 1,
            ..Options::default()
        };
        let j = Journal::start(dir.path().join("journal.db"), opts);
        for i in 0..10_000 {
            j.record(ev(EvOp::Write, &format!("f{i}")));
        }
        assert!(j.flush(Duration::from_secs(10)));
        let h = j.health();
        let dropped = h["dropped"].as_u64().unwrap();
        assert!(dropped > 0, "{h}");
        // The next write records the loss.
        j.record(ev(EvOp::Create, "after"));
        assert!(j.flush(Duration::from_secs(10)));
        let c = open_ro(&dir.path().join("journal.db")).unwrap();
        let lost: i64 = c
            .query_row(
                "SELECT coalesce(sum(bytes), 0) FROM events WHERE op = 'journal-dropped'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(lost as u64, dropped);
    }
}
