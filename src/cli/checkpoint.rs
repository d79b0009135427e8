//! `layerfs checkpoint [list|rm]`, `layerfs fork` and `layerfs undo`:
//! freeze a workspace's upper into a layer, branch new workspaces from
//! one, and go back to one (see `state::checkpoint`).

use super::exit::{CliError, Context, Failed, Outcome, EXIT_OK};
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::json;

use crate::state::workspace::Workspace;
use crate::state::{checkpoint, export, ops};

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
  layerfs checkpoint rm ~/ws/upper base   # refused while anything stacks on it
  layerfs checkpoint export ~/ws/upper base base.tar
  layerfs checkpoint import ~/other/upper base.tar base   # then: layerfs fork ~/other/upper base …

An export is one tar in the snapshot format holding the tree the
checkpoint shows over the shared lowers (its layers merged into one when
it stands on others). An import checks it as a snapshot restore does and
adds it as a checkpoint of WORKSPACE over WORKSPACE's shared lowers. The
archive names the shared lowers it was taken over (their paths and a
fingerprint of each one's top directory: names, types, sizes); an import
into a workspace whose shared lowers differ is refused (--force imports
anyway). An archive without that record (a snapshot) imports as it is.";

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
    /// Write a checkpoint to a tar (snapshot format) another host can
    /// import; the file must not exist.
    Export {
        #[arg(value_name = "WORKSPACE")]
        workspace: PathBuf,
        #[arg(value_name = "NAME")]
        name: String,
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Add an exported checkpoint (or any snapshot tar) as a checkpoint
    /// of WORKSPACE, over its shared lowers, so `layerfs fork` can use it.
    Import {
        #[arg(value_name = "WORKSPACE")]
        workspace: PathBuf,
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The checkpoint's name [default: the UTC time]; an existing
        /// name is refused.
        #[arg(value_name = "NAME")]
        name: Option<String>,
        /// Import even when the archive names other shared lowers than
        /// WORKSPACE's (a fork then shows the checkpoint's changes over
        /// WORKSPACE's shared tree).
        #[arg(long)]
        force: bool,
    },
}

impl CheckpointCmd {
    pub fn run(self) -> Outcome {
        let r = match self.sub {
            Some(CheckpointSub::List { json, workspace }) => list(&workspace, json),
            Some(CheckpointSub::Rm { workspace, name }) => Workspace::resolve(&workspace)
                .map_err(Failed::from)
                .and_then(|ws| checkpoint::remove(&ws, &name).map_err(Failed::from))
                .map(|()| outln!("removed {name}")),
            Some(CheckpointSub::Export {
                workspace,
                name,
                file,
            }) => Workspace::resolve(&workspace)
                .map_err(Failed::from)
                .and_then(|ws| {
                    let e = export::export(&ws, &name, &file)?;
                    outln!(
                        "exported {name} to {} ({} entries, {} layer{})",
                        file.display(),
                        e.entries,
                        e.layers,
                        if e.layers == 1 { "" } else { "s merged" }
                    );
                    Ok(())
                }),
            Some(CheckpointSub::Import {
                workspace,
                file,
                name,
                force,
            }) => Workspace::resolve(&workspace)
                .map_err(Failed::from)
                .and_then(|ws| {
                    let (name, report) = export::import(&ws, &file, name.as_deref(), force)?;
                    if !report.is_empty() {
                        eprintln!(
                            "layerfs checkpoint import: the archive held what the workspace's \
                         policy does not allow; it was imported without it:"
                        );
                        for l in report.lines(20) {
                            eprintln!("  {l}");
                        }
                    }
                    outln!("{name}");
                    Ok(())
                }),
            None => match &self.workspace {
                None => {
                    return Err(CliError::usage(
                        "checkpoint",
                        "give WORKSPACE [NAME], list, rm, export or import",
                    ))
                }
                Some(w) => Workspace::resolve(w).map_err(Failed::from).and_then(|ws| {
                    let done = ops::checkpoint(
                        &ws,
                        self.name.as_deref(),
                        self.layers.as_deref(),
                        None,
                        crate::state::checkpoint::Durability::Now,
                    )?;
                    super::warn_all("checkpoint", &done.warnings);
                    outln!("{}", done.value);
                    Ok(())
                }),
            },
        };
        r.or_fail("checkpoint").map(|()| EXIT_OK)
    }
}

fn list(w: &std::path::Path, as_json: bool) -> Result<(), Failed> {
    let ws = Workspace::resolve(w)?;
    let all = ops::checkpoints(&ws)?;
    if as_json {
        let v: Vec<_> = all
            .iter()
            .map(|c| {
                json!({
                    "name": c.name,
                    "created": c.created,
                    "path": c.path.as_ref().map(|p| p.to_string_lossy().into_owned()),
                })
            })
            .collect();
        outln!("{}", serde_json::Value::Array(v));
    } else {
        for c in &all {
            outln!(
                "{}  {}",
                crate::state::snapshot_id::rfc3339(c.created),
                c.name
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
        let (cfg, staged) = self.prepare().or_fail("fork")?;
        crate::daemon::start_placing(cfg, Some(staged))
            .or_fail("fork")
            .map(|()| EXIT_OK)
    }

    /// Stages the fork's stack (its daemon places it) and validates its
    /// mount, with the stack's layers.
    fn prepare(&self) -> Result<(crate::config::Config, checkpoint::StagedFork), Failed> {
        let ws = Workspace::resolve(&self.workspace)?;
        let (upper, lowers, staged) = checkpoint::fork_at_staged(&ws, &self.name, &self.upper)?;
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
        let mut cfg = crate::config::validate(args)?;
        // The stack is not in place yet: its layers are served all the same.
        cfg.layers = staged.layers().to_vec();
        Ok((cfg, staged))
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
        let done = ops::undo(&ws, self.to.as_deref(), None).or_fail("undo")?;
        super::warn_all("undo", &done.warnings);
        let (name, _) = done.value;
        outln!("at {name}");
        Ok(())
    }
}

#[derive(Args, Debug)]
#[command(after_help = "\
Merges the checkpoint layers of WORKSPACE below its --keep newest into
one layer (hard links, nothing copied), so a lookup visits a bounded
number of layers however many checkpoints were taken: whiteouts, opaque
directories and redirects apply as kernel overlayfs applies them. The
view does not change. The merged checkpoints' names are gone afterwards
(undo --to and fork use the new layer's name, printed). The merged layer
is built aside and switched to with one write of the stack; a crash at
any point leaves the old stack or the new one. A mounted workspace is
squashed live: the layer is built while the mount serves, writes pause
only for the switch, files open for reading read on. Changes since the
latest checkpoint stay in the upper as they are (diff shows the same
after). Refused when another workspace or checkpoint stacks on a layer
to merge, and when the upper holds files copied up by an older layerfs
(take a checkpoint first).

Example:
  layerfs squash ~/ws/upper --keep 5")]
pub struct SquashCmd {
    /// The workspace.
    #[arg(value_name = "WORKSPACE")]
    workspace: PathBuf,
    /// How many of the newest checkpoints to keep as they are.
    #[arg(long = "keep", value_name = "N", default_value_t = 0)]
    keep: usize,
}

impl SquashCmd {
    pub fn run(self) -> Result<(), CliError> {
        let ws = Workspace::resolve(&self.workspace).or_fail("squash")?;
        match crate::state::squash::take(&ws, self.keep).or_fail("squash")? {
            Some(s) => outln!(
                "{}  (merged {} checkpoints: {})",
                s.name,
                s.merged.len(),
                s.merged.join(", ")
            ),
            None => outln!("nothing to squash (fewer than 2 checkpoints below --keep)"),
        }
        Ok(())
    }
}
