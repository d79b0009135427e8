//! `--state DIR`, which every state command takes: the workspace's state
//! dir, for when WORKSPACE alone does not lead to it (an upper copied
//! without its xattrs, or a workspace last mounted by a layerfs that did
//! not record it, `state::place`).

use std::path::{Path, PathBuf};

use clap::Args;

use crate::state::workspace::{Workspace, WorkspaceError};

#[derive(Args, Debug, Clone, Default)]
pub struct StateArg {
    /// The workspace's state dir (as given to `layerfs mount --state`);
    /// WORKSPACE must then be its upper, its mountpoint or the dir itself
    /// [default: the one WORKSPACE records, else .<upper-name>.layerfs-state
    /// beside the upper].
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
}

impl StateArg {
    /// The workspace `arg` names, in the state dir given, if one was.
    pub fn resolve(&self, arg: &Path) -> Result<Workspace, WorkspaceError> {
        match &self.state {
            Some(state) => Workspace::resolve_in(arg, state),
            None => Workspace::resolve(arg),
        }
    }
}
