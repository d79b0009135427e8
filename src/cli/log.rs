//! `layerfs log [--json] [--since TIME] [--path GLOB] [--op OP] [--uid UID]
//! [--limit N] WORKSPACE`: the change journal, read straight from the
//! database (read-only), so it works whether the workspace is mounted or
//! not, and whatever layerfs wrote it (columns an older journal lacks
//! read as empty).

use super::exit::{CliError, Context};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use globset::GlobMatcher;
use serde_json::{json, Value};

use crate::quote::{quote_field, visible};
use crate::state::journal;

const LOG_HELP: &str = "\
Examples:
  layerfs log ~/ws/mnt                        # everything, oldest first
  layerfs log --since 10m --op write ~/ws/mnt # writes of the last 10 minutes
  layerfs log --path 'src/**' --limit 20 ~/ws/upper
  layerfs log --op deny --json ~/ws/mnt       # policy denials, one JSON object a line

Each record: time (RFC 3339, UTC), op, path, to (rename/link target, symlink
target, xattr name), result (ok or the errno name), bytes (write: bytes
written through the daemon, empty for passthrough writes; truncate: new
size), the caller: uid and gid (from the kernel: who it was), pid and comm
(the command name the process gave itself: anyone can call a program
`git`), and rule (the policy rule of a denial). JSON adds `user`, the
uid's name as resolved when `log` runs. Rows written before layerfs
recorded ids have none.
Ops: create write truncate unlink rename link symlink mkdir rmdir mknod
chmod chown utimes setxattr removexattr copy-up; the journal's own:
journal-dropped (bytes: events it lost) and journal-trimmed (one row,
moved to the end at each trim; bytes: the rows retention deleted in all;
oldest, newest: the span of their times); undo operations, written by the
command that ran them: reset (path: the paths given), gc (path: what it
emptied), snapshot-save and snapshot-restore (path: the snapshot ID), each
with bytes: how many entries; `deny` selects every refused change with a
policy rule. Any other --op is a usage error listing these.

Text output: one line a record; a name holding a space, a parenthesis or
a character a terminal would act on is printed in double quotes with C
escapes.";

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
    #[arg(long, value_name = "OP", value_parser = op_names())]
    op: Option<String>,

    /// Only records of this caller: a uid or a user name.
    #[arg(long, value_name = "UID|NAME")]
    uid: Option<String>,

    /// Only the last N matching records.
    #[arg(long, value_name = "N")]
    limit: Option<usize>,

    /// A layerfs mountpoint or an upper directory.
    #[arg(value_name = "WORKSPACE")]
    workspace: PathBuf,

    #[command(flatten)]
    state: super::state_arg::StateArg,
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
    uid: Option<u32>,
    gid: Option<u32>,
    /// journal-trimmed: the span of the trimmed rows' times.
    oldest: Option<i64>,
    newest: Option<i64>,
    /// The uid's user name, where it resolves.
    user: Option<String>,
}

/// The uid `--uid` names: a number, or a user name looked up.
/// The values `--op` takes: every op the journal writes, and `deny`.
fn op_names() -> clap::builder::PossibleValuesParser {
    use clap::builder::PossibleValue;
    let ops = crate::overlay::events::EvOp::ALL
        .iter()
        .map(|o| PossibleValue::new(o.name()));
    clap::builder::PossibleValuesParser::new(
        ops.chain([PossibleValue::new("deny").alias("denied")]),
    )
}

fn parse_uid(s: &str) -> Result<u32, String> {
    if let Ok(n) = s.parse::<u32>() {
        return Ok(n);
    }
    match nix::unistd::User::from_name(s) {
        Ok(Some(u)) => Ok(u.uid.as_raw()),
        Ok(None) => Err(format!(
            "--uid {s}: no such user (give a uid or a user name)"
        )),
        Err(e) => Err(format!("--uid {s}: cannot look the user up: {e}")),
    }
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
    fn text(&self) -> String {
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

impl LogCmd {
    pub fn run(self) -> Result<(), CliError> {
        for r in self.rows().or_fail("log")? {
            if self.json {
                outln!("{}", r.json());
            } else {
                outln!("{}", r.text());
            }
        }
        Ok(())
    }

    fn rows(&self) -> Result<Vec<Row>, String> {
        let since = self.since.as_deref().map(parse_since).transpose()?;
        let uid = self.uid.as_deref().map(parse_uid).transpose()?;
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
        let ws = self.state.resolve(&self.workspace)?;
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
            Some("deny") => ("rule IS NOT NULL", String::new()),
            Some(o) => ("op = ?2", o.to_string()),
        };
        // A journal no layerfs with these columns has opened yet reads
        // them as NULL (and then no row matches --uid).
        let have = journal::columns(&conn)
            .map_err(|e| format!("reading journal {}: {e}", db.display()))?;
        let col = |name: &str| {
            if have.iter().any(|h| h == name) {
                name.to_string()
            } else {
                "NULL".to_string()
            }
        };
        let uid_sql = if uid.is_some() {
            format!("{} = ?3", col("uid"))
        } else {
            "?3 IS NULL".to_string()
        };
        let sql = format!(
            "SELECT time, op, path, \"to\", result, bytes, pid, comm, rule, {}, {}, {}, {}
             FROM events
             WHERE time >= ?1 AND {op_sql} AND (?2 = ?2) AND {uid_sql} ORDER BY id DESC",
            col("uid"),
            col("gid"),
            col("oldest"),
            col("newest"),
        );
        let mut stmt = conn
            .prepare(&sql)
            .map_err(|e| format!("reading journal {}: {e}", db.display()))?;
        let mut q = stmt
            .query(rusqlite::params![since.unwrap_or(i64::MIN), op, uid])
            .map_err(|e| format!("reading journal {}: {e}", db.display()))?;
        let mut names = Names::default();
        let mut out = Vec::new();
        let limit = self.limit.unwrap_or(usize::MAX);
        while out.len() < limit {
            let Some(r) = q
                .next()
                .map_err(|e| format!("reading journal {}: {e}", db.display()))?
            else {
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
}
