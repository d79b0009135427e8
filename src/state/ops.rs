//! The state operations of a workspace, each as one sequence, for the
//! command line (`cli::{diff,reset,snapshot,checkpoint}`) and the agent
//! tools (`tools::Workspace`): on a workspace a live daemon serves, the
//! changing ones go through its control socket (the daemon's inode table
//! holds the real files); on an unmounted one they work on the upper
//! directly. Each that changes the upper leaves its row in the journal
//! (`journal::record_undo`), naming the caller.
//!
//! Invariant: the caller of an unmounted workspace holds no overlay core
//! on it meanwhile (the tools lend theirs, as for `execute`).

use std::ffi::{OsStr, OsString};

use super::diff::{self, Change, Filter, Layers};
use super::moves::Moves;
use super::protocol::{Changed, Paused, Request, Restored, Resumed, Undone};
use super::snapshot::{self, Info, Report, SaveOptions};
use super::workspace::Workspace;
use super::{checkpoint, journal, reset, scratch, snapshot_id};
use crate::overlay::events::EvOp;
use crate::policy::Policy;

/// Who a journal row names as the caller: this process by its command
/// name (`None`, the command line), or `CLIENT:TOOL` (the agent tools).
pub type Caller<'a> = Option<&'a str>;

/// An operation's result and what went wrong after it was done (a
/// journal row not written, a leftover not removed): warnings, never a
/// failure of what is done.
#[derive(Debug)]
pub struct Done<T> {
    pub value: T,
    pub warnings: Vec<String>,
}

impl<T> Done<T> {
    fn new(value: T) -> Done<T> {
        Done {
            value,
            warnings: Vec::new(),
        }
    }

    /// Writes the journal's row of the operation; a failure is a warning.
    fn record(mut self, ws: &Workspace, who: Caller<'_>, op: EvOp, what: &str, n: u64) -> Self {
        let db = ws.journal_path();
        let r = match who {
            None => journal::record_undo(&db, op, what, n),
            Some(comm) => journal::record_as(&db, op, what, n, comm),
        };
        if let Err(e) = r {
            self.warnings
                .push(format!("warning: not recorded in the journal: {e}"));
        }
        self
    }
}

/// Why a state operation failed: the part that refused (the daemon, the
/// stack, the snapshot, the diff, the reset) with its own error, or what
/// this sequence itself found wrong, naming the mount, file or paths.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The live mount's daemon could not be asked, or refused.
    #[error(transparent)]
    Control(#[from] super::control::ControlError),
    /// The workspace's state or work dir was refused.
    #[error(transparent)]
    Workspace(#[from] super::workspace::WorkspaceError),
    /// The checkpoint stack or the layer store.
    #[error(transparent)]
    Stack(#[from] super::frozen::StackError),
    #[error(transparent)]
    Scratch(#[from] super::scratch::ScratchError),
    /// The upper and lowers cannot be opened.
    #[error(transparent)]
    Layers(#[from] crate::layer::LayerError),
    #[error(transparent)]
    Diff(#[from] diff::DiffError),
    #[error(transparent)]
    Reset(#[from] reset::ResetError),
    #[error(transparent)]
    Id(#[from] snapshot_id::IdError),
    #[error(transparent)]
    Snapshot(#[from] snapshot::SnapshotError),
    /// A layer of a merged view cannot be opened.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The daemon of `mount` did not pause its writes for a snapshot.
    #[error("the daemon of {} refused to pause writes: {source}", mount.display())]
    PauseRefused {
        mount: std::path::PathBuf,
        #[source]
        source: super::control::ControlError,
    },
    /// Files open for writing through passthrough (`open`: each path,
    /// with its uid where the daemon says) hold off a snapshot.
    #[error(
        "files are open for writing through passthrough, whose writes cannot be paused: {}; \
         close them and retry",
        open.join(", ")
    )]
    OpenForWriting { open: Vec<String> },
    /// The workspace's policy file (`file`) cannot be loaded for a
    /// restore (`why`: the policy's message).
    #[error(
        "{why}: a restore checks the snapshot against the workspace's policy; fix the policy \
         file (or remount without it) and retry"
    )]
    RestorePolicy {
        file: std::path::PathBuf,
        why: Box<crate::policy::LoadError>,
    },
    /// A live restore whose work dir is on another filesystem.
    #[error(
        "work dir {} is not on the upper's filesystem: a live restore needs it there",
        work.display()
    )]
    WorkElsewhere { work: std::path::PathBuf },
    /// The daemon did not exchange the restored tree with its upper.
    #[error("the mount was not changed: {0}")]
    NotRestored(#[source] super::control::ControlError),
}

/// A path relative to the workspace root as shown (`.` the root).
pub fn shown(p: &OsStr) -> String {
    if p.is_empty() {
        ".".into()
    } else {
        crate::quote::quote_os(p).into_owned()
    }
}

/// What `diff` compares a workspace's view with (`layerfs diff --base`,
/// the library's and the MCP server's `base`: `checkpoint` or `shared`).
/// `Checkpoint`: its lowers, the checkpoint layers it stands on, then the
/// shared lowers (what changed since its latest checkpoint or its fork).
/// `Shared`: the shared lowers only (the whole view, checkpoint layers and
/// upper together). The variants carry no doc comments: `--help` says
/// what they mean in the option's own text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DiffBase {
    #[default]
    Checkpoint,
    Shared,
}

/// A diff's changes and the layers they were found in (for patches and
/// counts), valid while it lives.
pub struct Diffed {
    pub layers: Layers,
    pub changes: Vec<Change>,
    /// The merged view `layers.upper` is, removed when dropped.
    _view: Option<MergedView>,
}

/// The changes of the upper against the lowers under `paths` (relative,
/// `reset::normalize_all`; none: everything), scratch paths left out,
/// renames labelled from the journal's moves; with the layers, for
/// patches and counts. `beneath`: an added, deleted or renamed directory
/// is followed by an entry for each thing it holds
/// (`summary::with_entries_beneath`). Against the shared lowers, a workspace
/// standing on checkpoint layers is compared as one layer: the merge of
/// its upper and those layers (`squash::build_from`, hard links in the
/// layer store, named `Store::aside_name(.., "diff")` and removed when the
/// result is dropped). Its origin records name lowers of the stack, not
/// of the view: they are followed through the checkpoint layers to the
/// shared file they began as (`Origins::shared_view`), which gives the
/// renames and drift against the shared tree. Against the checkpoint,
/// records find their layer through the workspace's stack
/// (`frozen::origins`).
pub fn changes_against(
    ws: &Workspace,
    paths: &[OsString],
    beneath: bool,
    base: DiffBase,
) -> Result<Diffed, OpsError> {
    let view = match base {
        DiffBase::Checkpoint => None,
        DiffBase::Shared => MergedView::build(ws)?,
    };
    let filter = Filter {
        scratch: scratch::of_workspace(ws)?,
        paths: paths.to_vec(),
        moves: Some(Moves::from_journal(&ws.journal_path())),
        origins: Some(match view {
            None => super::frozen::origins::Origins::of(ws)?,
            Some(_) => super::frozen::origins::Origins::shared_view(ws)?,
        }),
    };
    let layers = match &view {
        Some(v) => Layers::open(&v.path(), &v.shared),
        None => Layers::open(&ws.upper, &ws.lowers),
    }
    .map_err(OpsError::Layers)?;
    let mut changes = diff::diff(&layers, &filter)?;
    if beneath {
        changes = super::summary::with_entries_beneath(&layers, changes, &filter.scratch);
    }
    Ok(Diffed {
        layers,
        changes,
        _view: view,
    })
}

/// A workspace's upper and checkpoint layers merged into one directory
/// of its layer store, over its shared lowers (`DiffBase::Shared`).
struct MergedView {
    store: super::frozen::Store,
    name: String,
    shared: Vec<std::path::PathBuf>,
}

impl MergedView {
    /// `None` when the workspace stands on no checkpoint layer (its
    /// lowers are the shared ones).
    fn build(ws: &Workspace) -> Result<Option<MergedView>, OpsError> {
        let Some(stack) = super::frozen::read(&ws.dir)? else {
            return Ok(None);
        };
        if stack.effective().is_empty() {
            return Ok(None);
        }
        let shared = checkpoint::shared_lowers(ws, &stack);
        let store = super::frozen::Store::open(&stack.store, false)?;
        store.sweep_aside();
        let open = |p: &std::path::Path| {
            crate::layer::sys::open_root(p).map_err(|source| OpsError::Open {
                path: p.to_path_buf(),
                source,
            })
        };
        let mut roots = vec![open(&ws.upper)?];
        for l in stack.effective() {
            roots.push(open(&stack.store.join(l))?);
        }
        // One per diff, also among the threads of one process (the tools).
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name =
            super::frozen::Store::aside_name(&format!("view{n}"), std::process::id(), "diff");
        let view = MergedView {
            store,
            name,
            shared,
        };
        // On failure the half-built view is removed by the drop.
        super::squash::build_from(&view.store.dir, &roots, &view.name)?;
        Ok(Some(view))
    }

    fn path(&self) -> std::path::PathBuf {
        self.store.path().join(&self.name)
    }
}

impl Drop for MergedView {
    fn drop(&mut self) {
        let _ = crate::layer::walk::remove_tree(&self.store.dir, OsStr::new(&self.name));
    }
}

/// Resets `paths` (relative; "" = everything): on a live mount its
/// daemon does it, else it is done in the upper. Returns the paths whose
/// view changed.
pub fn reset(
    ws: &Workspace,
    paths: &[OsString],
    who: Caller<'_>,
) -> Result<Done<Vec<OsString>>, OpsError> {
    let changed = match ws.client() {
        Some(client) => {
            let req = Request::Reset {
                paths: paths
                    .iter()
                    .map(|p| p.to_string_lossy().into_owned())
                    .collect(),
            };
            ask_changed(client?, &req)?
        }
        None => reset_offline(ws, paths)?,
    };
    let what: Vec<String> = paths.iter().map(|p| shown(p)).collect();
    let n = changed.len() as u64;
    Ok(Done::new(changed).record(ws, who, EvOp::Reset, &what.join(" "), n))
}

/// Asks a live mount's daemon to change its upper itself (`reset`,
/// `gc`: its inode table holds the real files); returns the paths whose
/// view changed.
pub fn ask_changed(
    mut client: super::control::Client,
    req: &Request,
) -> Result<Vec<OsString>, OpsError> {
    let resp: Changed = client.call(req)?;
    Ok(resp.changed.into_iter().map(OsString::from).collect())
}

/// Resets `paths` of an unmounted workspace directly in its upper.
fn reset_offline(ws: &Workspace, paths: &[OsString]) -> Result<Vec<OsString>, OpsError> {
    let layers = Layers::open(&ws.upper, &ws.lowers).map_err(OpsError::Layers)?;
    let work = ws.work_dir()?.into_fd();
    let mut out = reset::Outcome::default();
    let r = paths
        .iter()
        .try_for_each(|p| reset::reset_path(&layers, &work, p, &mut out));
    reset::remove_moved_away(&work, &out.moved_away)?;
    Ok(r.map(|()| out.changed)?)
}

/// Saves the upper as snapshot `id` (validated first; generated from the
/// time when `None`). On a live mount the daemon's writes are paused for
/// the capture: writes in flight complete first, later ones wait;
/// closing the connection (also when this process dies) ends the pause.
pub fn snapshot_save(
    ws: &Workspace,
    id: Option<&OsStr>,
    force: bool,
    progress: bool,
    who: Caller<'_>,
) -> Result<Done<Info>, OpsError> {
    // Invariant: a bad ID is refused before anything is read or written.
    let given = id.map(snapshot_id::validate).transpose()?;
    let id = match given {
        Some(id) => id.to_string(),
        None => snapshot_id::generate(|c| snapshot::exists(&ws.dir, c)),
    };
    let opts = SaveOptions {
        exclude: scratch::of_workspace(ws)?,
        force,
        progress,
    };
    let pause = match ws.client() {
        None => None,
        Some(client) => Some(pause(ws, client?)?),
    };
    let info = snapshot::save(&ws.upper, &ws.dir, &id, &opts)?;
    if let Some(mut c) = pause {
        // Dropping the connection also resumes; asking says so explicitly.
        let _ = c.call::<Resumed>(&Request::Resume);
    }
    let entries = info.entries.unwrap_or(0);
    let what = info.id.clone();
    Ok(Done::new(info).record(ws, who, EvOp::SnapshotSave, &what, entries))
}

/// Holds the daemon's write pause on `c` (refused, naming them, while
/// files are open for writing through passthrough).
fn pause(
    ws: &Workspace,
    mut c: super::control::Client,
) -> Result<super::control::Client, OpsError> {
    let r: Paused = c
        .call(&Request::Pause { wait_ms: None })
        .map_err(|source| OpsError::PauseRefused {
            mount: ws.mountpoint.as_deref().unwrap_or(&ws.upper).to_path_buf(),
            source,
        })?;
    if !r.busy.is_empty() {
        // Each with the uid holding it (`holders`), where the daemon says.
        let named: Vec<String> = if r.holders.is_empty() {
            r.busy
        } else {
            r.holders
                .iter()
                .map(|h| format!("{} (uid {})", h.path, h.uid))
                .collect()
        };
        return Err(OpsError::OpenForWriting { open: named });
    }
    Ok(c)
}

/// Replaces the upper by snapshot `id`, checked against the workspace's
/// policy (`Report`: what was left out or changed). On a live mount the
/// mount shows the restored state at once.
pub fn snapshot_restore(
    ws: &Workspace,
    id: &OsStr,
    progress: bool,
    who: Caller<'_>,
) -> Result<Done<(Info, Report)>, OpsError> {
    let id = snapshot_id::validate(id)?;
    let policy = workspace_policy(ws)?;
    let mut warnings = Vec::new();
    let (info, report) = match ws.client() {
        None => snapshot::restore(&ws.upper, Some(&ws.work), &ws.dir, id, &policy, progress)?,
        Some(client) => live_restore(ws, client?, id, &policy, progress, &mut warnings)?,
    };
    // The restored upper is a new directory: it records again where its
    // state is (`state::place`).
    if let Err(e) = super::place::record(&ws.upper, &ws.state) {
        warnings.push(format!(
            "cannot record the state dir on {}: {e}; once unmounted, give state commands \
             --state {}",
            ws.upper.display(),
            ws.state.display()
        ));
    }
    let entries = info.entries.unwrap_or(0);
    let what = info.id.clone();
    let mut done = Done::new((info, report)).record(ws, who, EvOp::SnapshotRestore, &what, entries);
    warnings.append(&mut done.warnings);
    done.warnings = warnings;
    Ok(done)
}

/// The policy a restore checks the archive against: the workspace's
/// policy file (named in its workspace.json), else the defaults.
pub(crate) fn workspace_policy(ws: &Workspace) -> Result<Policy, OpsError> {
    match &ws.policy {
        Some(p) => Policy::load(p).map_err(|why| OpsError::RestorePolicy {
            file: p.clone(),
            why: Box::new(why),
        }),
        None => Ok(Policy::default()),
    }
}

/// Restores on a live mount: the snapshot is extracted into a staging dir
/// in the work dir while the mount goes on serving, then the daemon
/// exchanges it with the upper, writes paused (see `daemon::restore`), and
/// the old tree is removed.
fn live_restore(
    ws: &Workspace,
    mut client: super::control::Client,
    id: &str,
    policy: &Policy,
    progress: bool,
    warnings: &mut Vec<String>,
) -> Result<(Info, Report), OpsError> {
    let staged = snapshot::stage(&ws.upper, Some(&ws.work), &ws.dir, id, policy, progress)?;
    if !staged.in_work {
        let _ = staged.remove();
        return Err(OpsError::WorkElsewhere {
            work: ws.work.clone(),
        });
    }
    let answer = client.call::<Restored>(&Request::Restore {
        staging: staged.name.to_string_lossy().into_owned(),
    });
    // Either way the staging dir is to go: on success it holds the old
    // upper, else the unused restored tree. (Killed here, it stays in the
    // work dir, which the next mount cleans.)
    let removed = staged.remove();
    let answer = answer.map_err(OpsError::NotRestored)?;
    if answer.invalidated.pending {
        warnings.push(
            "warning: the kernel's caches are still being invalidated; the mount may show \
             old attributes for a moment"
                .into(),
        );
    }
    if let Err(e) = removed {
        warnings.push(format!(
            "warning: restored, but cannot remove the old upper (now {}): {e}; remove it by \
             hand (or it goes at the next mount)",
            staged.path().display()
        ));
    }
    Ok((staged.info, staged.report))
}

/// Freezes the upper into the checkpoint `name` (generated when `None`),
/// in the layer store `layers` for a first checkpoint (default
/// STATE/layers). A mounted workspace's daemon takes it live
/// (`daemon::layers`), syncing after it answers when `durability` is
/// `Deferred` (a per-command checkpoint). Returns the checkpoint's name.
pub fn checkpoint(
    ws: &Workspace,
    name: Option<&str>,
    layers: Option<&std::path::Path>,
    who: Caller<'_>,
    durability: checkpoint::Durability,
) -> Result<Done<String>, OpsError> {
    let name = checkpoint::take(ws, name, layers, durability)?;
    let what = name.clone();
    Ok(Done::new(name).record(ws, who, EvOp::Checkpoint, &what, 1))
}

/// Goes back to the checkpoint `to` (default: the latest; when nothing
/// changed since it, the one before). A mounted workspace's daemon goes
/// back live. Returns the checkpoint it stands on and how many
/// checkpoints were taken off.
pub fn undo(
    ws: &Workspace,
    to: Option<&str>,
    who: Caller<'_>,
) -> Result<Done<(String, usize)>, OpsError> {
    let (name, dropped) = match ws.client() {
        Some(client) => {
            let v: Undone = client?.call(&Request::Undo {
                to: to.map(String::from),
            })?;
            (v.at, v.dropped)
        }
        None => checkpoint::undo(ws, to, None)?,
    };
    let what = name.clone();
    Ok(Done::new((name, dropped)).record(ws, who, EvOp::Undo, &what, dropped as u64))
}

/// One checkpoint a workspace stands on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub name: String,
    /// Unix seconds.
    pub created: i64,
    /// Its layer, where the store is known.
    pub path: Option<std::path::PathBuf>,
}

/// The checkpoints `ws` stands on, the latest first.
pub fn checkpoints(ws: &Workspace) -> Result<Vec<CheckpointInfo>, OpsError> {
    let records = checkpoint::list(ws)?;
    let store = super::frozen::read(&ws.dir)?.map(|s| s.store);
    Ok(records
        .into_iter()
        .map(|r| CheckpointInfo {
            path: store.as_ref().map(|s| s.join(&r.name)),
            name: r.name,
            created: r.created,
        })
        .collect())
}
