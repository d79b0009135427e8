//! `layerfs reset`: discard a workspace's changes under some paths.

use super::exit::{CliError, Context};
use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

use crate::overlay::events::EvOp;

use crate::state::diff::Layers;
use crate::state::protocol::{Changed, Request};
use crate::state::{reset, workspace::Workspace};

const RESET_HELP: &str = "\
Each PATH (relative to the workspace root; `.` = everything) goes back to the
shared version: the upper's copy, whiteouts and marks there are removed; a path
that exists only in the upper is removed; a renamed shared directory gets its
old name back. On a live mount the daemon does it and the mount shows the
shared version at once. Prints each path whose view changed.

Examples:
  layerfs reset ~/ws/mnt src/main.rs        # undo an edit
  layerfs reset ~/ws/mnt docs               # undo everything under docs/
  layerfs reset ~/ws/upper .                # an unmounted workspace, all of it";

#[derive(Args, Debug)]
#[command(after_help = RESET_HELP)]
pub struct ResetCmd {
    /// A live layerfs mountpoint, or the upper directory of an unmounted workspace.
    #[arg(value_name = "WORKSPACE")]
    workspace: PathBuf,

    #[command(flatten)]
    state: super::state_arg::StateArg,

    /// Paths to reset, relative to the workspace root.
    #[arg(value_name = "PATH", required = true)]
    paths: Vec<PathBuf>,
}

impl ResetCmd {
    pub fn run(self) -> Result<(), CliError> {
        self.reset().or_fail("reset")
    }

    fn reset(&self) -> Result<(), String> {
        let ws = self.state.resolve(&self.workspace)?;
        let paths = reset::normalize_all(&ws, &self.paths)?;
        let changed = match ws.client() {
            Some(client) => {
                let req = Request::Reset {
                    paths: paths
                        .iter()
                        .map(|p| p.to_string_lossy().into_owned())
                        .collect(),
                };
                live(client?, &req)?
            }
            None => offline(&ws, &paths)?,
        };
        let what: Vec<String> = paths.iter().map(|p| shown(p)).collect();
        super::journal_undo(
            "reset",
            &ws,
            EvOp::Reset,
            &what.join(" "),
            changed.len() as u64,
        );
        for p in changed {
            outln!("reset {}", shown(&p));
        }
        Ok(())
    }
}

/// Asks a live mount's daemon to change its upper itself (its inode table
/// holds the real files); returns the paths whose view changed.
pub fn live(
    mut client: crate::state::control::Client,
    req: &Request,
) -> Result<Vec<OsString>, String> {
    let resp: Changed = client.call(req)?;
    Ok(resp.changed.into_iter().map(OsString::from).collect())
}

pub fn shown(p: &std::ffi::OsStr) -> String {
    if p.is_empty() {
        ".".into()
    } else {
        crate::quote::quote_os(p).into_owned()
    }
}

/// Resets `paths` of an unmounted workspace directly in its upper.
pub fn offline(ws: &Workspace, paths: &[OsString]) -> Result<Vec<OsString>, String> {
    let layers = Layers::open(&ws.upper, &ws.lowers)?;
    let work = ws.work_dir()?.into_fd();
    let mut out = reset::Outcome::default();
    let r = paths
        .iter()
        .try_for_each(|p| reset::reset_path(&layers, &work, p, &mut out));
    reset::remove_moved_away(&work, &out.moved_away)?;
    r.map(|()| out.changed)
}
