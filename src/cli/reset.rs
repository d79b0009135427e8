//! `layerfs reset`: discard a workspace's changes under some paths.

use super::exit::{CliError, Context, Failed};
use std::path::PathBuf;

use clap::Args;

use crate::state::{ops, reset};

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

    fn reset(&self) -> Result<(), Failed> {
        let ws = self.state.resolve(&self.workspace)?;
        let paths = reset::normalize_all(&ws, &self.paths).map_err(|e| e.to_string())?;
        let done = ops::reset(&ws, &paths, None)?;
        super::warn_all("reset", &done.warnings);
        for p in done.value {
            outln!("reset {}", ops::shown(&p));
        }
        Ok(())
    }
}
