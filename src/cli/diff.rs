//! `layerfs diff`: what a workspace's upper changes against its lowers.

use super::exit::{CliError, Context, Failed};
use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use crate::state::{ops, patch, reset, summary};

const DIFF_HELP: &str = "\
Output: one line per changed path, `A` added, `M` modified (content or type),
`D` deleted, `R old -> new` renamed, `T` metadata only (mode, owner, mtime,
xattrs); ` (conflict)` marks a copied-up file whose shared original changed
after the copy-up. A new directory is one line, `A dir/ (N entries)`, as a
deleted one is `D dir`. --files (and --json) list what is inside: every
entry of a new directory, every shared entry beneath a deleted one
(`D dir/x`) or a renamed one (`R old/x -> new/x`).
Scratch paths are left out.
A fork, or a workspace with checkpoints, is compared with its lowers: the
checkpoint layers it stands on, then the shared lowers. `--base shared` compares
its whole view with the shared lowers (a file moved before the checkpoint and
again after it is one rename of its shared original; conflicts are marked as
usual); `--patch --base shared` applied to a copy of the shared tree gives the
view.

Examples:
  layerfs diff ~/ws/mnt                  # a live mount
  layerfs diff ~/ws/upper src            # an unmounted workspace, only src/
  layerfs diff --stat ~/ws/mnt           # counts and bytes per top-level entry
  layerfs diff --json ~/ws/mnt | jq -r 'select(.conflict) | .path'
  layerfs diff --patch ~/ws/mnt > agent.patch
  layerfs diff --base shared ~/try1/mnt   # a fork: its checkpoint's changes too";

#[derive(Args, Debug)]
#[command(after_help = DIFF_HELP)]
pub struct DiffCmd {
    /// One JSON object per line for every entry: path, change, from (renames),
    /// type, conflict (with --patch also `patch`; with --stat the counts).
    #[arg(long)]
    json: bool,

    /// Unified diffs of text files (binary files are named as such).
    #[arg(long, conflicts_with = "stat")]
    patch: bool,

    /// List every entry of a new directory instead of one `A dir/ (N entries)`
    /// line, and every shared entry beneath a deleted or renamed directory.
    #[arg(long, conflicts_with = "stat")]
    files: bool,

    /// Counts (added, modified, deleted, renamed, metadata) and bytes added and
    /// removed per top-level entry, then the totals; with --json one object per
    /// line, the totals' line marked `"total": true`.
    #[arg(long)]
    stat: bool,

    /// What the view is compared with: `checkpoint`, the workspace's lowers
    /// (for a fork or a workspace with checkpoints: what changed since its
    /// latest checkpoint); `shared`, the shared lowers only (everything its
    /// checkpoint layers and its upper change together).
    #[arg(long, value_enum, default_value_t = ops::DiffBase::Checkpoint, value_name = "BASE")]
    base: ops::DiffBase,

    /// A live layerfs mountpoint, or the upper directory of an unmounted workspace.
    #[arg(value_name = "WORKSPACE")]
    workspace: PathBuf,

    #[command(flatten)]
    state: super::state_arg::StateArg,

    /// Only these paths (relative to the workspace root) and what lies beneath them.
    #[arg(value_name = "PATH")]
    paths: Vec<PathBuf>,
}

impl DiffCmd {
    pub fn run(self) -> Result<(), CliError> {
        self.diff().or_fail("diff")
    }

    fn diff(&self) -> Result<(), Failed> {
        let ws = self.state.resolve(&self.workspace)?;
        let paths = reset::normalize_all(&ws, &self.paths).map_err(|e| e.to_string())?;
        // Every entry, as --files lists them (and --json, --stat count them);
        // --patch speaks for a directory's files in its own way.
        let beneath = (self.files || self.json || self.stat) && !self.patch;
        let diffed = ops::changes_against(&ws, &paths, beneath, self.base)?;
        let (layers, changes) = (&diffed.layers, &diffed.changes);
        if self.stat {
            print_stat(&summary::stat(layers, changes), self.json);
            return Ok(());
        }
        let patches = if self.patch {
            patch::patches(layers, changes)
        } else {
            Vec::new()
        };
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        if !(self.json || self.patch || self.files) {
            for line in summary::fold(changes, &paths) {
                if writeln!(out, "{}", line.text()).is_err() {
                    // A closed pipe (`| head`) ends the output quietly.
                    return Ok(());
                }
            }
            let _ = out.flush();
            return Ok(());
        }
        for (i, c) in changes.iter().enumerate() {
            let r = if self.json && self.patch {
                let mut v = c.json();
                v["patch"] = serde_json::Value::String(patches[i].clone());
                writeln!(out, "{v}")
            } else if self.json {
                writeln!(out, "{}", c.json_line())
            } else if self.patch {
                write!(out, "{}", patches[i])
            } else {
                c.write_text(&mut out)
            };
            if r.is_err() {
                // A closed pipe (`| head`) ends the output quietly.
                return Ok(());
            }
        }
        let _ = out.flush();
        Ok(())
    }
}

/// `--stat`: the table, or one JSON object per group and the totals.
fn print_stat(st: &summary::Stat, json: bool) {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let text = if json {
        let mut s = String::new();
        for (k, c) in &st.groups {
            s.push_str(&format!("{}\n", c.json(Some(k))));
        }
        s.push_str(&format!("{}\n", st.total.json(None)));
        s
    } else {
        st.text()
    };
    // A closed pipe (`| head`) ends the output quietly.
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}
