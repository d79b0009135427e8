//! `layerfs checkpoint [list|rm]`, `layerfs fork` and `layerfs undo`:
//! freeze a workspace's upper into a layer, branch new workspaces from
//! one, and go back to one (see `state::checkpoint`).

use super::exit::{CliError, Context, Outcome, EXIT_OK};
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::json;

use crate::overlay::events::EvOp;
use crate::state::checkpoint;
use crate::state::protocol::{Checkpointed, Request, Undone};
use crate::state::workspace::{self, Workspace};

const CHECKPOINT_HELP: &str = "\
WORKSPACE is a layerfs mountpoint, an upper directory or a state dir. A
checkpoint freezes the upper into a read-only layer in the layer store
(STATE/layers/NAME, or --layers DIR on the upper's filesystem) without
copying it; the workspace goes on with an empty upper stacked on it.
NAME is 1-128 characters of A-Z a-z 0-9 . _ -, not starting with `.`
(default: the UTC time). A mounted workspace is checkpointed live by its
daemon: writes pause for the moment it takes, and it is refused while a
file is open for writing through the mount (close it and retry).

Examples:
  layerfs checkpoint ~/ws/upper base
  layerfs checkpoint list --json ~/ws/upper
  layerfs fork ~/ws/upper base --upper ~/try1/upper ~/try1/mnt
  layerfs undo ~/ws/upper                 # back to the latest checkpoint
  layerfs checkpoint rm ~/ws/upper base   # refused while anything stacks on it";

#[derive(Args, Debug)]
#[command(after_help = CHECKPOINT_HELP, args_conflicts_with_subcommands = true)]
pub struct CheckpointCmd {
    #[command(subcommand)]
    sub: Option<CheckpointSub>,
    /// The workspace to checkpoint.
    #[arg(value_name = "WORKSPACE")]
    workspace: Option<PathBuf>,
    /// The checkpoint's name [default: the UTC time].
    #[arg(value_name = "NAME")]
    name: Option<String>,
    /// The layer store for a workspace's first checkpoint [default:
    /// STATE/layers]; on the upper's filesystem.
    #[arg(long = "layers", value_name = "DIR")]
    layers: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum CheckpointSub {
    /// List the checkpoints a workspace stands on, the latest first.
    List {
        /// One JSON array: name, created (Unix time), path.
        #[arg(long)]
        json: bool,
        #[arg(value_name = "WORKSPACE")]
        workspace: PathBuf,
    },
    /// Remove a checkpoint's layer; refused while a workspace or another
    /// checkpoint stacks on it.
    Rm {
        #[arg(value_name = "WORKSPACE")]
        workspace: PathBuf,
        #[arg(value_name = "NAME")]
        name: String,
    },
}

impl CheckpointCmd {
    pub fn run(self) -> Outcome {
        let r = match self.sub {
            Some(CheckpointSub::List { json, workspace }) => list(&workspace, json),
            Some(CheckpointSub::Rm { workspace, name }) => Workspace::resolve(&workspace)
                .and_then(|ws| checkpoint::remove(&ws, &name).map_err(String::from))
                .map(|()| outln!("removed {name}")),
            None => match &self.workspace {
                None => {
                    return Err(CliError::usage(
                        "checkpoint",
                        "give WORKSPACE [NAME], list or rm",
                    ))
                }
                Some(w) => Workspace::resolve(w).and_then(|ws| {
                    let name = match ws.client() {
                        // Mounted: the daemon takes it (`daemon::layers`).
                        Some(client) => {
                            let layers = self
                                .layers
                                .as_deref()
                                .map(|p| std::path::absolute(p).unwrap_or(p.to_path_buf()));
                            let v: Checkpointed = client?.call(&Request::Checkpoint {
                                name: self.name.clone(),
                                layers: layers.map(|p| p.to_string_lossy().into_owned()),
                            })?;
                            v.name
                        }
                        None => checkpoint::checkpoint(
                            &ws,
                            self.name.as_deref(),
                            self.layers.as_deref(),
                            None,
                        )?,
                    };
                    super::journal_undo("checkpoint", &ws, EvOp::Checkpoint, &name, 1);
                    outln!("{name}");
                    Ok(())
                }),
            },
        };
        r.or_fail("checkpoint").map(|()| EXIT_OK)
    }
}

fn list(w: &std::path::Path, as_json: bool) -> Result<(), String> {
    let ws = Workspace::resolve(w)?;
    let records = checkpoint::list(&ws)?;
    let store = crate::state::frozen::read(&ws.dir)?.map(|s| s.store);
    let path = |n: &str| store.as_ref().map(|s| s.join(n));
    if as_json {
        let v: Vec<_> = records
            .iter()
            .map(|r| {
                json!({
                    "name": r.name,
                    "created": r.created,
                    "path": path(&r.name).map(|p| p.to_string_lossy().into_owned()),
                })
            })
            .collect();
        outln!("{}", serde_json::Value::Array(v));
    } else {
        for r in &records {
            outln!(
                "{}  {}",
                crate::state::snapshot_id::rfc3339(r.created),
                r.name
            );
        }
    }
    Ok(())
}

const FORK_HELP: &str = "\
Mounts a new workspace whose lowers are the checkpoint's layers on top of
the shared lowers of WORKSPACE, with NEW_UPPER (created if missing; it must
be empty) as its upper. Nothing is copied: the time does not depend on the
tree's size. Forks share the frozen layers read-only and are isolated from
each other and from the checkpoint; `layerfs diff` of a fork shows what it
changed since the checkpoint.

Example (best of 4):
  layerfs checkpoint ~/ws/upper base
  for i in 1 2 3 4; do
    layerfs fork ~/ws/upper base --upper ~/try$i/upper ~/try$i/mnt
  done";

#[derive(Args, Debug)]
#[command(after_help = FORK_HELP)]
pub struct ForkCmd {
    /// The workspace that has the checkpoint.
    #[arg(value_name = "WORKSPACE")]
    workspace: PathBuf,
    /// The checkpoint to fork.
    #[arg(value_name = "NAME")]
    name: String,
    /// The new workspace's upper (empty or missing).
    #[arg(long = "upper", value_name = "NEW_UPPER")]
    upper: PathBuf,
    /// The new workspace's work dir [default: hidden sibling of NEW_UPPER].
    #[arg(long = "work", value_name = "DIR")]
    work: Option<PathBuf>,
    /// Stay in the foreground (serve until unmounted).
    #[arg(short = 'f', long)]
    foreground: bool,
    /// Where to mount the fork.
    #[arg(value_name = "MOUNTPOINT")]
    mountpoint: PathBuf,
}

impl ForkCmd {
    pub fn run(self) -> Outcome {
        self.prepare().or_fail("fork").map(crate::daemon::start)
    }

    /// Writes the fork's stack and validates its mount.
    fn prepare(&self) -> Result<crate::config::Config, String> {
        let ws = Workspace::resolve(&self.workspace)?;
        match std::fs::create_dir_all(&self.upper).and_then(|()| {
            let mut entries = std::fs::read_dir(&self.upper)?;
            Ok(entries.next().is_none())
        }) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "{} is not empty: a fork starts from an empty upper",
                    self.upper.display()
                ))
            }
            Err(e) => return Err(format!("cannot create {}: {e}", self.upper.display())),
        }
        let upper = std::fs::canonicalize(&self.upper)
            .map_err(|e| format!("{}: {e}", self.upper.display()))?;
        let state = workspace::create_state_dir(&workspace::default_state_dir(&upper))?;
        let lowers = checkpoint::fork(&ws, &self.name, &state)?;
        let args = crate::config::MountArgs {
            lowers,
            upper: Some(upper),
            work: self.work.clone(),
            journal: Some(Default::default()),
            mountpoint: self.mountpoint.clone(),
            foreground: self.foreground,
            policy_file: ws.policy.clone(),
            lower_timeout: None,
            scratch: ws.scratch.clone(),
            ..Default::default()
        };
        crate::config::validate(args).map_err(|e| e.to_string())
    }
}

#[derive(Args, Debug)]
#[command(after_help = "\
Without --to, goes back to the latest checkpoint; when nothing changed
since it, to the one before (so repeated undos step back one checkpoint
each). Checkpoints above the one gone back to are removed unless another
workspace or checkpoint stacks on them. A mounted workspace goes back
live: files open for reading read on what they opened, new opens see the
checkpoint; refused while the owner has a file open for writing.")]
pub struct UndoCmd {
    /// The workspace.
    #[arg(value_name = "WORKSPACE")]
    workspace: PathBuf,
    /// The checkpoint to go back to.
    #[arg(long = "to", value_name = "NAME")]
    to: Option<String>,
}

impl UndoCmd {
    pub fn run(self) -> Result<(), CliError> {
        let ws = Workspace::resolve(&self.workspace).or_fail("undo")?;
        let (name, dropped) = match ws.client() {
            // Mounted: the daemon goes back (`daemon::layers`).
            Some(client) => {
                let v: Undone = client
                    .and_then(|mut c| {
                        c.call(&Request::Undo {
                            to: self.to.clone(),
                        })
                    })
                    .or_fail("undo")?;
                (v.at, v.dropped)
            }
            None => checkpoint::undo(&ws, self.to.as_deref(), None).or_fail("undo")?,
        };
        super::journal_undo("undo", &ws, EvOp::Undo, &name, dropped as u64);
        outln!("at {name}");
        Ok(())
    }
}
