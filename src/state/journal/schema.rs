//! The journal database: its schema, opening it (read-write, read-only)
//! and bringing an older journal up to date.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::error::JournalError;

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

/// The database's identity on disk, to notice it being deleted or replaced.
pub(super) fn file_id(p: &Path) -> Option<(u64, u64)> {
    fs::symlink_metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// A database path for messages: a path through a state dir's descriptor
/// (`SafeDir::fd_path`) shows as the directory's own path.
pub(super) fn shown(p: &Path) -> PathBuf {
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

pub(super) fn is_corrupt(e: &rusqlite::Error) -> bool {
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

/// Creates the database file if it is missing, private whatever the
/// daemon's umask (SQLite gives the -wal and -shm files the database's
/// mode). Returns whether it is empty: a new journal, or one a power cut
/// left with nothing written, which readers show as having no rows.
pub fn create_private(path: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    Ok(f.metadata()?.len() == 0)
}

/// Opens (creating if needed) the journal database (WAL mode where the
/// filesystem allows it, see `journal_mode`).
pub fn open_rw(path: &Path) -> rusqlite::Result<Connection> {
    // A failure here is SQLite's to report.
    let fresh = create_private(path).unwrap_or(false);
    let c = open_db(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    c.busy_timeout(Duration::from_millis(500))?;
    // A new, empty journal is made without waiting for the disk: the
    // switch to WAL and the schema would otherwise sync four or five
    // times, at the moment a new workspace's daemon syncs its description
    // before mounting (a fork's too), and delay it. Losing them to a crash
    // of the machine loses no row: the next open finds an empty file, or
    // one SQLite calls corrupt, which the writer sets aside and makes anew
    // (`Writer::ensure_open`).
    if fresh {
        c.pragma_update(None, "synchronous", "OFF")?;
    }
    c.pragma_update(None, "journal_mode", journal_mode(path))?;
    c.execute_batch(SCHEMA)?;
    c.pragma_update(None, "synchronous", "NORMAL")?;
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

/// Opens the journal read-only (for `layerfs log` and offline status).
pub fn open_ro(path: &Path) -> Result<Connection, JournalError> {
    if fs::symlink_metadata(path).is_err() {
        return Err(JournalError::Missing { path: shown(path) });
    }
    let c = open_db(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| JournalError::Open {
        path: shown(path),
        source,
    })?;
    let _ = c.busy_timeout(Duration::from_secs(2));
    Ok(c)
}

/// The bytes the database and its WAL take on disk now.
pub(super) fn disk_bytes(db: &Path) -> u64 {
    let len = |p: &Path| fs::metadata(p).map_or(0, |m| m.len());
    len(db) + len(&wal_path(db))
}

pub(super) fn wal_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_os_string();
    p.push("-wal");
    PathBuf::from(p)
}
