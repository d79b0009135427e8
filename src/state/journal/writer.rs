//! The writer thread: started on demand (`Idle::wake`) and parked when
//! idle; gathers events (`Msg`) into batches, inserts each in one
//! transaction, holds what it could not write and retries, runs
//! retention, and keeps the `Health` counters `status` reports.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use parking_lot::Mutex;
use rusqlite::{params, Connection};

use super::retention::{row_bytes, trim_rows, used_bytes, Budget, Trim};
use super::rows::{daemon_ids, errno_name, micros};
use super::schema::{file_id, is_corrupt, open_rw, shown, wal_path};
use super::{Options, BATCH, GATHER, HOLD, REOPEN_AFTER, RETENTION_EVERY};
use crate::overlay::events::{EvOp, Event};

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

pub(super) struct Writer {
    pub(super) path: PathBuf,
    pub(super) opts: Options,
    pub(super) budget: Budget,
    pub(super) health: Arc<Health>,
    pub(super) conn: Option<Connection>,
    pub(super) id: Option<(u64, u64)>,
    /// Events not yet written because the database failed (oldest first).
    pub(super) held: Vec<Event>,
    /// Dropped events not yet recorded as a `journal-dropped` row.
    pub(super) unrecorded: u64,
    pub(super) seen_dropped: u64,
    pub(super) next_open: Instant,
    pub(super) next_retention: Instant,
    /// The journal's `queued` count (the writer decrements it).
    pub(super) queued: Arc<AtomicUsize>,
    /// Whether the rows were counted (once: a reopen after an idle exit
    /// does not scan the table again).
    pub(super) counted: bool,
    /// The state dir `path` goes through, open while the writer lives.
    pub(super) _dir: Option<Arc<crate::layer::safedir::SafeDir>>,
}

impl Writer {
    pub(super) fn new(
        path: PathBuf,
        opts: Options,
        health: Arc<Health>,
        queued: Arc<AtomicUsize>,
    ) -> Writer {
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

    pub(super) fn run(mut self, rx: Receiver<Msg>, idle: &Idle) {
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
    pub(super) fn ensure_open(&mut self) -> bool {
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
    pub(super) fn hold(&mut self, events: Vec<Event>) {
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
    pub(super) fn write(&mut self, batch: Vec<Event>) {
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
    pub(super) fn set_aside(&mut self, e: &rusqlite::Error) {
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
    pub(super) fn maintain(&mut self) {
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
    pub(super) fn keep_within_cap(&mut self) -> rusqlite::Result<()> {
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
    pub(super) fn trim(&mut self, how: Trim) -> rusqlite::Result<bool> {
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
