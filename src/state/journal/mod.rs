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
//!
//! The parts, each using only those after it: `handle` (the `Journal`
//! the mount records through), `query` (rows read back for `log`),
//! `writer` (the writer thread: its messages, health counters, idle
//! parking and batches), `retention` (the size budget and trimming),
//! `rows` (rows written and read outside the writer) and `schema` (the
//! database: its files, opening and migrating it).

mod error;
mod handle;
mod health;
pub mod query;
mod retention;
mod rows;
mod schema;
#[cfg(test)]
mod tests;
mod writer;

pub use error::JournalError;
pub use handle::{Journal, PATH_KEPT};
pub use health::HealthReport;
pub use rows::{errno_name, offline_health, record_as, record_undo};
pub use schema::{columns, open_ro, open_rw, ADDED_COLUMNS};

use std::time::Duration;

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
pub(super) const BATCH: usize = 4096;
/// After a small batch the writer waits this long for more events: one
/// transaction per window instead of one per event keeps its CPU time and
/// wakeups small beside the FUSE threads (a flush waits at most this).
pub(super) const GATHER: Duration = Duration::from_millis(20);
/// How often retention runs.
pub(super) const RETENTION_EVERY: Duration = Duration::from_secs(60);
/// How long the writer waits before reopening a database that failed.
pub(super) const REOPEN_AFTER: Duration = Duration::from_secs(1);
/// Events the writer keeps while the database cannot take them; the
/// oldest beyond this are dropped (and counted).
pub const HOLD: usize = 4096;
