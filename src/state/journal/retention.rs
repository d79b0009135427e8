//! Retention: the size budget of the database and its WAL, and deleting
//! the oldest rows with the one `journal-trimmed` row that records them.

use std::time::SystemTime;

use rusqlite::{params, Connection};

use super::rows::{daemon_ids, micros};
use crate::overlay::events::{EvOp, Event};

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
pub(super) struct Budget {
    /// `--journal-max-size`.
    pub(super) cap: u64,
    /// The WAL's share: it is checkpointed and truncated beyond this (an
    /// eighth of the cap, at most 4 MiB, which is SQLite's usual
    /// checkpoint interval).
    pub(super) wal: u64,
    /// The estimated row bytes (`row_bytes`) one batch takes at most: a
    /// 32nd of the cap, at least 1 KiB, at most 1 MiB.
    pub(super) batch: u64,
}

impl Budget {
    pub(super) fn new(cap: u64) -> Budget {
        Budget {
            cap,
            wal: (cap / 8).min(4 << 20),
            batch: (cap / 32).clamp(1 << 10, 1 << 20),
        }
    }

    /// The database file's share: the cap less the WAL's.
    pub(super) fn db(&self) -> u64 {
        self.cap - self.wal
    }

    /// Pages in use beyond which the oldest rows are trimmed: the file's
    /// share less room for one batch (whose pages take about twice its
    /// row bytes: table and index).
    pub(super) fn trim_above(&self) -> u64 {
        self.db().saturating_sub(2 * self.batch)
    }

    /// What trimming leaves in use: three quarters of the file's share,
    /// so the next trim comes only after a quarter of it was written.
    pub(super) fn trim_to(&self) -> u64 {
        self.db() / 4 * 3
    }
}

/// An estimate of the bytes a row takes, for the batch bound.
pub(super) fn row_bytes(e: &Event) -> u64 {
    (64 + e.path.len()
        + e.to.as_ref().map_or(0, |t| t.len())
        + e.comm.len()
        + e.rule.as_ref().map_or(0, |r| r.len())) as u64
}

/// Which rows retention deletes, oldest (by id) first.
#[derive(Debug, Clone, Copy)]
pub(super) enum Trim {
    /// Rows whose time is before this (microseconds): `--journal-max-age`.
    OlderThan(i64),
    /// Enough rows to bring the database back within its share of
    /// `--journal-max-size` (`Budget::trim_to`).
    ToSize,
}

impl Trim {
    pub(super) fn describe(self) -> &'static str {
        match self {
            Trim::OlderThan(_) => "by age",
            Trim::ToSize => "by size",
        }
    }
}

/// What one `trim_rows` did.
pub(super) struct Trimmed {
    /// Rows deleted, the earlier marker included.
    pub(super) deleted: u64,
    /// Rows deleted that were not the earlier marker.
    pub(super) own: u64,
}

/// The bytes of the database's pages in use (free pages not counted).
pub(super) fn used_bytes(conn: &Connection) -> rusqlite::Result<u64> {
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
pub(super) fn trim_rows(
    conn: &mut Connection,
    cutoff: i64,
    limit: i64,
) -> rusqlite::Result<Trimmed> {
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
