//! Reading the journal back (`layerfs log`, the agent tools' `log`):
//! rows filtered by time, operation, caller and path, read straight from
//! the database (read-only), so it works whether the workspace is mounted
//! or not, and whatever layerfs wrote it (columns an older journal lacks
//! read as empty).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use globset::GlobMatcher;
use serde_json::{json, Value};

use super::error::JournalError;
use super::schema::{columns, open_ro};
use crate::quote::{quote_field, visible};

/// One journal row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Microseconds since the Unix epoch.
    pub time: i64,
    pub op: String,
    pub path: String,
    pub to: Option<String>,
    pub result: String,
    pub bytes: Option<i64>,
    pub pid: Option<i64>,
    pub comm: Option<String>,
    pub rule: Option<String>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// journal-trimmed: the span of the trimmed rows' times.
    pub oldest: Option<i64>,
    pub newest: Option<i64>,
    /// The uid's user name, where it resolves.
    pub user: Option<String>,
}

/// What rows to read; every filter is optional.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Only rows from this time on (microseconds, `parse_since`).
    pub since: Option<i64>,
    /// Only rows of this operation (`deny`: policy denials, `op_known`).
    pub op: Option<String>,
    /// Only rows of this caller.
    pub uid: Option<u32>,
    /// Only rows whose path (or `to`) matches this glob (`**` crosses
    /// directories).
    pub path: Option<String>,
    /// Only the last N matching rows.
    pub limit: Option<usize>,
}

/// Every operation name the journal writes, and `deny`.
pub fn op_names() -> Vec<&'static str> {
    crate::overlay::events::EvOp::ALL
        .iter()
        .map(|o| o.name())
        .chain(["deny"])
        .collect()
}

/// Checks an operation name for `Query::op` (`denied` is `deny`).
pub fn op_known(op: &str) -> Result<String, JournalError> {
    match op {
        "denied" => Ok("deny".into()),
        o if op_names().contains(&o) => Ok(o.into()),
        o => Err(JournalError::UnknownOp {
            op: o.into(),
            known: op_names().join(", "),
        }),
    }
}

/// A time for `Query::since`: RFC 3339 (2026-12-03T15:00:00Z) or an age
/// (10m, 2h, 1day), as microseconds since the epoch.
pub fn parse_since(s: &str) -> Result<i64, JournalError> {
    let t = match humantime::parse_rfc3339_weak(s) {
        Ok(t) => t,
        Err(_) => {
            let age = humantime::parse_duration(s)
                .map_err(|_| JournalError::BadSince { given: s.into() })?;
            SystemTime::now().checked_sub(age).unwrap_or(UNIX_EPOCH)
        }
    };
    Ok(t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0))
}

/// A journal time (microseconds) as RFC 3339, UTC.
pub fn rfc3339(micros: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_micros(micros.max(0) as u64);
    humantime::format_rfc3339_micros(t).to_string()
}

/// User names by uid, each looked up once.
#[derive(Default)]
struct Names(HashMap<u32, Option<String>>);

impl Names {
    fn of(&mut self, uid: u32) -> Option<String> {
        self.0
            .entry(uid)
            .or_insert_with(|| {
                nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                    .ok()
                    .flatten()
                    .map(|u| u.name)
            })
            .clone()
    }
}

impl Row {
    pub fn json(&self) -> Value {
        json!({
            "time": rfc3339(self.time),
            "op": self.op,
            "path": self.path,
            "to": self.to,
            "result": self.result,
            "bytes": self.bytes,
            "pid": self.pid,
            "comm": self.comm,
            "rule": self.rule,
            "uid": self.uid,
            "gid": self.gid,
            "user": self.user,
            "oldest": self.oldest.map(rfc3339),
            "newest": self.newest.map(rfc3339),
        })
    }

    /// One line per record, whatever the names hold: paths, targets,
    /// process and user names are one word or quoted, rules escaped
    /// (`crate::quote`), so no name can forge a line or a field.
    pub fn text(&self) -> String {
        let mut s = format!(
            "{}  {:<11} {}",
            rfc3339(self.time),
            self.op,
            quote_field(self.path.as_bytes())
        );
        if let Some(t) = &self.to {
            s.push_str(&format!(" -> {}", quote_field(t.as_bytes())));
        }
        s.push_str(&format!("  {}", visible(&self.result)));
        match (self.op.as_str(), self.bytes) {
            ("journal-trimmed", Some(n)) => s.push_str(&format!(
                "  {n} rows trimmed, from {} to {}",
                self.oldest.map_or("?".into(), rfc3339),
                self.newest.map_or("?".into(), rfc3339)
            )),
            ("journal-dropped", Some(n)) => s.push_str(&format!("  {n} events lost")),
            ("reset" | "gc" | "snapshot-save" | "snapshot-restore", Some(n)) => s.push_str(
                &format!("  {n} {}", if n == 1 { "entry" } else { "entries" }),
            ),
            ("checkpoint", _) => {}
            ("undo", Some(n)) => s.push_str(&format!(
                "  {n} {} taken off",
                if n == 1 { "checkpoint" } else { "checkpoints" }
            )),
            (_, Some(b)) => s.push_str(&format!("  {b} bytes")),
            (_, None) => {}
        }
        if let Some(u) = self.uid {
            s.push_str(&format!("  uid {u}"));
            if let Some(n) = &self.user {
                s.push_str(&format!(" ({})", quote_field(n.as_bytes())));
            }
            if let Some(g) = self.gid {
                s.push_str(&format!(" gid {g}"));
            }
        }
        if let Some(p) = self.pid {
            s.push_str(&format!("  pid {p}"));
            if let Some(c) = &self.comm {
                s.push_str(&format!(" ({})", quote_field(c.as_bytes())));
            }
        }
        if let Some(r) = &self.rule {
            s.push_str(&format!("  rule: {}", visible(r)));
        }
        s
    }
}

/// The matcher of `Query::path` (`**` crosses directories, `*` does
/// not); the error names the glob.
pub fn path_glob(g: &str) -> Result<GlobMatcher, JournalError> {
    Ok(globset::GlobBuilder::new(g.trim_start_matches('/'))
        .literal_separator(true)
        .build()
        .map_err(|source| JournalError::BadGlob {
            field: "",
            glob: g.into(),
            source,
        })?
        .compile_matcher())
}

/// The rows of the journal at `db` that `q` selects, oldest first.
///
/// In the order things happened, not the order rows were written: a live
/// mount's daemon writes its rows in batches, so a state command's row (a
/// reset or an undo, written by the command's own process) can land
/// before the rows of the writes that came before it. `events_time`'s
/// entries are ordered by (time, id), so the scan needs no sort.
pub fn query(db: &Path, q: &Query) -> Result<Vec<Row>, JournalError> {
    let glob = match &q.path {
        Some(g) => Some(path_glob(g).map_err(|e| match e {
            JournalError::BadGlob { glob, source, .. } => JournalError::BadGlob {
                field: "path ",
                glob,
                source,
            },
            e => e,
        })?),
        None => None,
    };
    let conn = open_ro(db)?;
    let failed = |source| JournalError::Read {
        path: db.to_path_buf(),
        source,
    };
    // A journal just (re)created has no table yet: nothing to show.
    let has_table = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'events'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(failed)?;
    if has_table == 0 {
        return Ok(Vec::new());
    }
    let (op_sql, op) = match q.op.as_deref() {
        None => ("1", String::new()),
        Some("deny") => ("rule IS NOT NULL", String::new()),
        Some(o) => ("op = ?2", o.to_string()),
    };
    // A journal no layerfs with these columns has opened yet reads
    // them as NULL (and then no row matches a uid).
    let have = columns(&conn).map_err(failed)?;
    let col = |name: &str| {
        if have.iter().any(|h| h == name) {
            name.to_string()
        } else {
            "NULL".to_string()
        }
    };
    let uid_sql = if q.uid.is_some() {
        format!("{} = ?3", col("uid"))
    } else {
        "?3 IS NULL".to_string()
    };
    let sql = format!(
        "SELECT time, op, path, \"to\", result, bytes, pid, comm, rule, {}, {}, {}, {}
         FROM events
         WHERE time >= ?1 AND {op_sql} AND (?2 = ?2) AND {uid_sql} ORDER BY time DESC, id DESC",
        col("uid"),
        col("gid"),
        col("oldest"),
        col("newest"),
    );
    let mut stmt = conn.prepare(&sql).map_err(failed)?;
    let mut rows = stmt
        .query(rusqlite::params![q.since.unwrap_or(i64::MIN), op, q.uid])
        .map_err(failed)?;
    let mut names = Names::default();
    let mut out = Vec::new();
    let limit = q.limit.unwrap_or(usize::MAX);
    while out.len() < limit {
        let Some(r) = rows.next().map_err(failed)? else {
            break;
        };
        let mut row = Row {
            time: r.get(0).unwrap_or(0),
            op: r.get(1).unwrap_or_default(),
            path: r.get(2).unwrap_or_default(),
            to: r.get(3).unwrap_or(None),
            result: r.get(4).unwrap_or_default(),
            bytes: r.get(5).unwrap_or(None),
            pid: r.get(6).unwrap_or(None),
            comm: r.get(7).unwrap_or(None),
            rule: r.get(8).unwrap_or(None),
            uid: r.get(9).unwrap_or(None),
            gid: r.get(10).unwrap_or(None),
            oldest: r.get(11).unwrap_or(None),
            newest: r.get(12).unwrap_or(None),
            user: None,
        };
        if let Some(g) = &glob {
            let to_matches = row.to.as_deref().is_some_and(|t| g.is_match(t));
            if !g.is_match(&row.path) && !to_matches {
                continue;
            }
        }
        row.user = row.uid.and_then(|u| names.of(u));
        out.push(row);
    }
    out.reverse();
    Ok(out)
}
