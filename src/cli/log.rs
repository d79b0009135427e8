//! `layerfs log [--json] [--since TIME] [--path GLOB] [--op OP] [--uid UID]
//! [--limit N] WORKSPACE`: the change journal, read straight from the
//! database (read-only), so it works whether the workspace is mounted or
//! not, and whatever layerfs wrote it (columns an older journal lacks
//! read as empty).

use super::exit::{CliError, Context, Failed};
use std::path::PathBuf;

use clap::Args;

use crate::state::journal::query::{self, Query, Row};

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

/// The uid `--uid` names: a number, or a user name looked up.
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

    fn rows(&self) -> Result<Vec<Row>, Failed> {
        // Bad options are refused before the workspace is looked up.
        let since = self
            .since
            .as_deref()
            .map(|s| query::parse_since(s).map_err(|e| format!("--{e}")))
            .transpose()?;
        if let Some(g) = &self.path {
            query::path_glob(g).map_err(|e| format!("--path {e}"))?;
        }
        let uid = self.uid.as_deref().map(parse_uid).transpose()?;
        let ws = self.state.resolve(&self.workspace)?;
        let q = Query {
            since,
            op: self.op.as_deref().map(query::op_known).transpose()?,
            uid,
            path: self.path.clone(),
            limit: self.limit,
        };
        Ok(query::query(&ws.journal_path(), &q)?)
    }
}
