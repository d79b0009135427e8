//! `layerfs gc`: empty a workspace's scratch paths.

use super::exit::{CliError, Context, Failed};
use std::path::PathBuf;

use clap::Args;

use crate::overlay::events::EvOp;

use crate::state::diff::Layers;
use crate::state::{reset, scratch};

const GC_HELP: &str = "\
Removes the upper's contents of every scratch path (`--scratch GLOB` on mount,
`scratch GLOB` policy lines): each topmost matching path is reset to its shared
version (usually: removed). On a live mount the daemon does it. Prints each
path emptied. Also removes what an interrupted `checkpoint import`, `checkpoint
export` or `diff --base shared` left in the workspace's layer store (its process
is gone), naming it on stderr.

Examples:
  layerfs mount --scratch 'target/**' --scratch '*.pyc' ... ~/ws/mnt
  layerfs gc ~/ws/mnt";

#[derive(Args, Debug)]
#[command(after_help = GC_HELP)]
pub struct GcCmd {
    /// A live layerfs mountpoint, or the upper directory of an unmounted workspace.
    #[arg(value_name = "WORKSPACE")]
    workspace: PathBuf,

    #[command(flatten)]
    state: super::state_arg::StateArg,
}

impl GcCmd {
    pub fn run(self) -> Result<(), CliError> {
        self.gc().or_fail("gc")
    }

    fn gc(&self) -> Result<(), Failed> {
        let ws = self.state.resolve(&self.workspace)?;
        for p in crate::state::checkpoint::sweep_aside(&ws) {
            eprintln!(
                "note: removed {} (left by an interrupted checkpoint import or export, or diff)",
                p.display()
            );
        }
        let sc = scratch::of_workspace(&ws)?;
        if sc.is_empty() {
            return Err(format!(
                "workspace {} has no scratch paths; mount it with --scratch GLOB or add `scratch GLOB` to its policy",
                ws.upper.display()
            )
            .into());
        }
        let record = |done: &[std::ffi::OsString]| {
            let what: Vec<String> = done.iter().map(|p| crate::state::ops::shown(p)).collect();
            super::journal_undo("gc", &ws, EvOp::Gc, &what.join(" "), done.len() as u64);
        };
        if let Some(client) = ws.client() {
            let done =
                crate::state::ops::ask_changed(client?, &crate::state::protocol::Request::Gc)?;
            record(&done);
            for p in done {
                outln!("emptied {}", crate::state::ops::shown(&p));
            }
            return Ok(());
        }
        let layers = Layers::open(&ws.upper, &ws.lowers)?;
        let work = ws.work_dir()?.into_fd();
        let mut done = crate::state::reset::Outcome::default();
        let r = reset::gc(&layers, &work, &sc, &mut done);
        record(&done.changed);
        for p in &done.changed {
            outln!("emptied {}", crate::state::ops::shown(p));
        }
        Ok(r.and(crate::state::reset::remove_moved_away(
            &work,
            &done.moved_away,
        ))?)
    }
}
