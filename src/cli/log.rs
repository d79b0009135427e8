//! `layerfs log [--json] [--since TIME] [--path GLOB] [--op OP] [--limit N]
//! WORKSPACE`: the change journal, read straight from the database
//! (read-only), so it works whether the workspace is mounted or not.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use globset::GlobMatcher;
use serde_json::{json, Value};

use crate::quote::{quote, visible};
use crate::state::journal;
use crate::state::workspace::Workspace;

const LOG_HELP: &str = "\
Examples:
  layerfs log ~/ws/mnt                        # everything, oldest first
  layerfs log --since 10m --op write ~/ws/mnt # writes of the last 10 minutes
  layerfs log --path 'src/**' --limit 20 ~/ws/upper
  layerfs log --op deny --json ~/ws/mnt       # policy denials, one JSON object a line

Each record: time (RFC 3339, UTC), op, path, to (rename/link target, symlink
target, xattr name), result (ok or the errno name), bytes (write: bytes
written through the daemon, empty for passthrough writes; truncate: new
size), pid and comm (the caller), rule (the policy rule of a denial).
Ops: create write truncate unlink rename link symlink mkdir rmdir mknod
chmod chown utimes setxattr removexattr copy-up journal-dropped; `deny`
selects every refused change with a policy rule.";

#[derive(Args, Debug)]
#[command(after_help = LOG_HELP)]
pub struct LogCmd {
    /// One JSON object per record, one a line.
    #[arg(long)]
    json: bool,

    /// Only records from this time on: RFC 3339 (2026-12-03T15:00:00Z) or an
    /// age (10m, 2h, 1day).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,

    /// Only records whose path (or `to`) matches this glob (`**` crosses
    /// directories).
    #[arg(long, value_name = "GLOB")]
    path: Option<String>,

    /// Only records of this operation (`deny`: policy denials).
    #[arg(long, value_name = "OP")]
    op: Option<String>,

    /// Only the last N matching records.
    #[arg(long, value_name = "N")]
    limit: Option<usize>,

    /// A layerfs mountpoint or an upper directory.
    #[arg(value_name = "WORKSPACE")]
    workspace: PathBuf,
}

/// One journal row.
struct Row {
    time: i64,
    op: String,
    path: String,
    to: Option<String>,
    result: String,
    bytes: Option<i64>,
    pid: Option<i64>,
    comm: Option<String>,
    rule: Option<String>,
}

fn parse_since(s: &str) -> Result<i64, String> {
    let t = match humantime::parse_rfc3339_weak(s) {
        Ok(t) => t,
        Err(_) => {
            let age = humantime::parse_duration(s).map_err(|_| {
                format!(
                    "--since {s}: give an RFC 3339 time (2026-12-03T15:00:00Z) or an age (10m, 2h)"
                )
            })?;
            SystemTime::now().checked_sub(age).unwrap_or(UNIX_EPOCH)
        }
    };
    Ok(t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0))
}

fn rfc3339(micros: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_micros(micros.max(0) as u64);
    humantime::format_rfc3339_micros(t).to_string()
}

impl Row {
    fn json(&self) -> Value {
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
        })
    }

    /// One line per record, whatever the names hold: paths, targets and
    /// process names are quoted, rules escaped (`crate::quote`).
    fn text(&self) -> String {
        let mut s = format!(
            "{}  {:<11} {}",
            rfc3339(self.time),
            self.op,
            quote(self.path.as_bytes())
        );
        if let Some(t) = &self.to {
            s.push_str(&format!(" -> {}", quote(t.as_bytes())));
        }
        s.push_str(&format!("  {}", visible(&self.result)));
        if let Some(b) = self.bytes {
            s.push_str(&format!("  {b} bytes"));
        }
        if let Some(p) = self.pid {
            s.push_str(&format!("  pid {p}"));
            if let Some(c) = &self.comm {
                s.push_str(&format!(" ({})", quote(c.as_bytes())));
            }
        }
        if let Some(r) = &self.rule {
            s.push_str(&format!("  rule: {}", visible(r)));
        }
        s
    }
}

impl LogCmd {
    pub fn run(self) -> i32 {
        match self.rows() {
            Ok(rows) => {
                for r in rows {
                    if self.json {
                        println!("{}", r.json());
                    } else {
                        println!("{}", r.text());
                    }
                }
                0
            }
            Err(e) => super::fail("log", e),
        }
    }

    fn rows(&self) -> Result<Vec<Row>, String> {
        let since = self.since.as_deref().map(parse_since).transpose()?;
        let glob: Option<GlobMatcher> = match &self.path {
            Some(g) => Some(
                globset::GlobBuilder::new(g.trim_start_matches('/'))
                    .literal_separator(true)
                    .build()
                    .map_err(|e| format!("--path {g}: {e}"))?
                    .compile_matcher(),
            ),
            None => None,
        };
        let ws = Workspace::resolve(&self.workspace)?;
        let db = ws.journal_path();
        let conn = journal::open_ro(&db)?;
        // A journal just (re)created has no table yet: nothing to show.
        let has_table = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'events'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map_err(|e| format!("reading journal {}: {e}", db.display()))?;
        if has_table == 0 {
            return Ok(Vec::new());
        }
        let (op_sql, op) = match self.op.as_deref() {
            None => ("1", String::new()),
            Some("deny") | Some("denied") => ("rule IS NOT NULL", String::new()),
            Some(o) => ("op = ?2", o.to_string()),
        };
        let sql = format!(
            "SELECT time, op, path, \"to\", result, bytes, pid, comm, rule FROM events
             WHERE time >= ?1 AND {op_sql} AND (?2 = ?2) ORDER BY id DESC"
        );
        let mut stmt = conn
            .prepare(&sql)
            .map_err(|e| format!("reading journal {}: {e}", db.display()))?;
        let mut q = stmt
            .query(rusqlite::params![since.unwrap_or(i64::MIN), op])
            .map_err(|e| format!("reading journal {}: {e}", db.display()))?;
        let mut out = Vec::new();
        let limit = self.limit.unwrap_or(usize::MAX);
        while out.len() < limit {
            let Some(r) = q
                .next()
                .map_err(|e| format!("reading journal {}: {e}", db.display()))?
            else {
                break;
            };
            let row = Row {
                time: r.get(0).unwrap_or(0),
                op: r.get(1).unwrap_or_default(),
                path: r.get(2).unwrap_or_default(),
                to: r.get(3).unwrap_or(None),
                result: r.get(4).unwrap_or_default(),
                bytes: r.get(5).unwrap_or(None),
                pid: r.get(6).unwrap_or(None),
                comm: r.get(7).unwrap_or(None),
                rule: r.get(8).unwrap_or(None),
            };
            if let Some(g) = &glob {
                let to_matches = row.to.as_deref().is_some_and(|t| g.is_match(t));
                if !g.is_match(&row.path) && !to_matches {
                    continue;
                }
            }
            out.push(row);
        }
        out.reverse();
        Ok(out)
    }
}
