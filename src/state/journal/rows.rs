//! Rows written outside the writer thread (undo operations of the
//! state commands) and read back for `status` of an unmounted workspace,
//! with the encodings every row shares.

use std::fs;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::params;

use super::error::JournalError;
use super::health::HealthReport;
use super::schema::disk_bytes;
use super::schema::{open_ro, open_rw, shown};
use crate::overlay::events::EvOp;

/// The daemon itself, as rows it writes about the journal name it.
pub(super) fn daemon_ids() -> (u32, u32, u32) {
    (
        std::process::id(),
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    )
}

/// How long a row written outside the writer thread waits for the
/// database (`record_as`).
pub(super) const ONE_OFF_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// Records an undo operation (`reset`, `gc`, `snapshot save`/`restore`)
/// as one row of the journal at `db`, written by the command that ran it:
/// `what` names the paths or the snapshot, `entries` how many entries it
/// changed or archived; the caller is this process (uid, gid, pid, comm).
/// A workspace whose journal is off (no database) gets no row.
pub fn record_undo(db: &Path, op: EvOp, what: &str, entries: u64) -> Result<(), JournalError> {
    let comm = fs::read_to_string("/proc/self/comm")
        .map(|c| c.trim_end().to_string())
        .unwrap_or_else(|_| "layerfs".into());
    record_as(db, op, what, entries, &comm)
}

/// As `record_undo`, naming the caller `comm` (the agent tools name
/// themselves `CLIENT:TOOL`, as their other rows do).
pub fn record_as(
    db: &Path,
    op: EvOp,
    what: &str,
    entries: u64,
    comm: &str,
) -> Result<(), JournalError> {
    if !db.exists() {
        return Ok(());
    }
    let (pid, uid, gid) = daemon_ids();
    let failed = |source| JournalError::Write {
        path: db.to_path_buf(),
        source,
    };
    let conn = open_rw(db).map_err(failed)?;
    // The daemon's writer may hold the database for a while under load
    // (it runs at a lower priority, in batches): the row of a state
    // operation waits for it rather than being lost.
    conn.busy_timeout(ONE_OFF_WAIT).map_err(failed)?;
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
    .map_err(failed)?;
    Ok(())
}

/// Microseconds since the epoch.
pub(super) fn micros(t: SystemTime) -> i64 {
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

/// Journal health of an unmounted workspace, read from the database:
/// its rows, the events its `journal-dropped` rows say were lost
/// (`dropped_recorded`; a live mount's `dropped` counts since the mount)
/// and the rows retention deleted, as its newest `journal-trimmed` rows
/// say (`trimmed_recorded`: the older ones are folded into them).
pub fn offline_health(db: &Path) -> HealthReport {
    let path = shown(db).to_string_lossy().into_owned();
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
        .map_err(|source| JournalError::Count {
            path: shown(db),
            source,
        })
    }) {
        Ok((rows, lost, trimmed)) => HealthReport {
            path: Some(path),
            rows: Some(rows.max(0) as u64),
            dropped_recorded: Some(lost.max(0) as u64),
            trimmed_recorded: Some(trimmed.max(0) as u64),
            bytes: Some(disk_bytes(db)),
            ..HealthReport::default()
        },
        Err(e) => HealthReport {
            path: Some(path),
            last_error: Some(e.to_string()),
            ..HealthReport::default()
        },
    }
}
