//! Unit tests of the journal: the writer, retention and migration.

use std::fs;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rusqlite::{params, Connection};
use serde_json::json;

use crate::overlay::events::{EvOp, Event, Sink};

use super::handle::bounded;
use super::rows::micros;
use super::schema::disk_bytes;
use super::*;

/// The health report as `status` sends it.
fn health(j: &Journal) -> serde_json::Value {
    serde_json::to_value(j.health()).unwrap()
}

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
    let h = health(&j);
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
    assert_eq!(health(&j)["dropped"], 0);
    assert_eq!(health(&j)["rows"], 500);
    // A database deleted while the writer was parked is noticed.
    fs::remove_file(&db).unwrap();
    j.record(ev(EvOp::Unlink, "x"));
    assert!(j.flush(Duration::from_secs(10)));
    let h = health(&j);
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
    let h = health(&j);
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
    let h = health(&j);
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
    let h = health(&j);
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

/// A state operation's row waits for the database while another writer
/// (the daemon's, busy under load) holds it, and is not lost.
#[test]
fn a_one_off_row_waits_for_a_busy_writer() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("journal.db");
    drop(super::schema::open_rw(&db).unwrap());
    let holder = Connection::open(&db).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let hold = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        holder.execute_batch("COMMIT").unwrap();
    });
    let start = Instant::now();
    record_as(&db, EvOp::Reset, "new.txt", 1, "t:reset").unwrap();
    assert!(start.elapsed() >= Duration::from_millis(1400));
    hold.join().unwrap();
    let c = Connection::open(&db).unwrap();
    let n: i64 = c
        .query_row("SELECT count(*) FROM events WHERE op = 'reset'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(n, 1);
}

/// A new journal is made without syncs, then used as any other: its
/// commits wait for the disk as `synchronous=NORMAL` says, in WAL mode;
/// and an empty file (what a power cut during its making can leave) is
/// made anew with its schema.
#[test]
fn a_new_journal_is_made_unsynced_and_then_commits_as_normal() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("journal.db");
    let c = open_rw(&db).unwrap();
    let sync: i64 = c.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
    assert_eq!(
        sync, 1,
        "synchronous is not NORMAL after the journal was made"
    );
    let mode: String = c
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    drop(c);
    // Torn to nothing, as a cut before any write-back leaves it.
    fs::write(&db, b"").unwrap();
    let _ = fs::remove_file(schema::wal_path(&db));
    let c = open_rw(&db).unwrap();
    assert_eq!(
        columns(&c).unwrap().len(),
        14,
        "the schema was not made anew"
    );
    let sync: i64 = c.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
    assert_eq!(sync, 1);
    // An existing journal opens with its rows and NORMAL too.
    c.execute(
        "INSERT INTO events (time, op, path, result) VALUES (1, 'create', 'a', 'ok')",
        [],
    )
    .unwrap();
    drop(c);
    let c = open_rw(&db).unwrap();
    let n: i64 = c
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
    let sync: i64 = c.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
    assert_eq!(sync, 1);
}
