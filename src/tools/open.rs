//! Opening a workspace: by its upper or state directory, or by its
//! layers; served through a live mount or worked on in this process.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::error::Result;
use super::store::{self, Store};
use super::{core, exec, mounted, RelPath, ToolError, What, Workspace, STRIPES};
use crate::layer::safedir::{Role, SafeDir};
use crate::policy::pattern::PathSet;
use crate::policy::Policy;
use crate::state::workspace as ws_state;

/// The layers of a workspace given directly (`--lower … --upper …
/// [--policy FILE]`), rather than by its mountpoint or upper.
#[derive(Debug, Clone)]
pub struct Layers {
    /// Topmost first.
    pub lowers: Vec<PathBuf>,
    pub upper: PathBuf,
    pub policy: Option<PathBuf>,
}

impl Layers {
    pub fn new(lowers: Vec<PathBuf>, upper: PathBuf) -> Layers {
        Layers {
            lowers,
            upper,
            policy: None,
        }
    }
}

/// How a workspace is opened.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Every change is refused (`What::ReadOnly`).
    pub read_only: bool,
    /// Who the journal's rows name as the caller, with the tool
    /// (`CLIENT:TOOL`); `lib` when not given.
    pub client: Option<String>,
    /// The `layerfs` binary `execute` runs commands with; by default this
    /// process's when it is layerfs, else `layerfs` on `PATH`.
    pub layerfs: Option<PathBuf>,
}

pub(super) fn open_err(what: impl std::fmt::Display, msg: impl std::fmt::Display) -> ToolError {
    ToolError::new(what, What::Open(msg.to_string()))
}

/// Where the calls of one workspace run, before it is claimed.
struct Plan<'a> {
    /// The shared lowers (the checkpoints' layers go on top of them when
    /// the core starts, `Reclaim::start`).
    lowers: &'a [PathBuf],
    upper: &'a Path,
    work: &'a Path,
    state: Option<Arc<SafeDir>>,
    policy: Policy,
    /// The policy's file, for `execute`'s `layerfs run`.
    policy_file: Option<&'a Path>,
    scratch: Vec<String>,
}

/// What starting the core again takes (after `execute` lent the
/// workspace to `layerfs run`).
pub(super) struct Reclaim {
    /// The shared lowers.
    lowers: Vec<PathBuf>,
    upper: PathBuf,
    work: PathBuf,
    state: Option<Arc<SafeDir>>,
    policy: Policy,
    read_only: bool,
}

/// Why the core was not started.
pub(super) enum NotStarted {
    /// A live daemon serves the workspace at this mountpoint.
    Served(PathBuf),
    Failed(ToolError),
}

impl Reclaim {
    /// Takes the upper and work dir as a mount would and starts the core
    /// on the workspace's checkpoints (an undo left pending is finished
    /// first) above the shared lowers, as a mount does.
    pub(super) fn start(&self, client: &str) -> std::result::Result<Box<dyn Store>, NotStarted> {
        let claim = match crate::daemon::exclusive::claim_dirs(&self.upper, &self.work) {
            Ok(c) => c,
            Err(busy) => {
                if let Some((_, Some(mp))) = busy.holder {
                    return Err(NotStarted::Served(mp));
                }
                return Err(NotStarted::Failed(open_err(
                    self.upper.display(),
                    busy.message,
                )));
            }
        };
        let frozen = match &self.state {
            Some(dir) => {
                crate::state::checkpoint::mount_layers(dir.path(), &self.upper, &self.work)
                    .map_err(|e| {
                        NotStarted::Failed(open_err(self.upper.display(), e.to_string()))
                    })?
            }
            None => Vec::new(),
        };
        let ov = crate::overlay::Overlay::new(&crate::overlay::Options {
            checkpoints: frozen.len(),
            lowers: frozen
                .into_iter()
                .chain(self.lowers.iter().cloned())
                .collect(),
            upper: self.upper.clone(),
            work: self.work.clone(),
            policy: self.policy.clone(),
            read_only: self.read_only,
            threads: 2,
            max_watches: None,
        })
        .map_err(|m| NotStarted::Failed(open_err(self.upper.display(), m)))?;
        let journal = self.state.clone().map(|dir| {
            crate::state::journal::Journal::start_in(dir, crate::state::journal::Options::default())
        });
        Ok(Box::new(core::CoreStore::new(ov, claim, journal, client)))
    }
}

/// The store of a workspace whose core could not be taken back after
/// `execute`: every call says so.
pub(super) struct Lost(pub(super) ToolError);

impl Store for Lost {
    fn stat(&self, _: &RelPath) -> Result<store::Meta> {
        Err(self.0.clone())
    }
    fn list(&self, _: &RelPath) -> Result<Vec<(String, store::Meta)>> {
        Err(self.0.clone())
    }
    fn read_range(&self, _: &RelPath, _: u64, _: u64) -> Result<Vec<u8>> {
        Err(self.0.clone())
    }
    fn create(&self, _: &str, _: &RelPath, _: &[u8], _: u32) -> Result<()> {
        Err(self.0.clone())
    }
    fn remove(&self, _: &str, _: &RelPath, _: bool) -> Result<()> {
        Err(self.0.clone())
    }
    fn rename(&self, _: &str, _: &RelPath, _: &RelPath, _: bool) -> Result<()> {
        Err(self.0.clone())
    }
    fn mkdir(&self, _: &str, _: &RelPath) -> Result<()> {
        Err(self.0.clone())
    }
}

impl Workspace {
    /// Opens a workspace by its live mountpoint, its upper directory or
    /// its state directory (as `layerfs diff` takes it). A mounted one is
    /// worked on through its mount, an unmounted one in this process.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// use layerfs::tools::{Layers, OpenOptions};
    /// // Opening by layers once leaves the workspace's description beside
    /// // the upper; from then on the upper alone names it.
    /// drop(layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper.clone()), &OpenOptions::default())?);
    /// let ws = layerfs::Workspace::open(&upper, &OpenOptions::default())?;
    /// assert!(ws.mountpoint().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(arg: &Path, opts: &OpenOptions) -> Result<Workspace> {
        let ws = ws_state::Workspace::resolve(arg).map_err(|m| open_err(arg.display(), m))?;
        let policy = match &ws.policy {
            Some(f) => Policy::load(f).map_err(|m| open_err(arg.display(), m))?,
            None => Policy::default(),
        };
        // The description's lowers have the checkpoints' layers on top.
        let shared = match crate::state::frozen::read(&ws.dir) {
            Ok(Some(stack)) => crate::state::checkpoint::shared_lowers(&ws, &stack),
            _ => ws.lowers.clone(),
        };
        let plan = Plan {
            lowers: &shared,
            upper: &ws.upper,
            work: &ws.work,
            state: Some(ws.dir.clone()),
            policy,
            policy_file: ws.policy.as_deref(),
            scratch: ws.scratch.clone(),
        };
        if let Some(mp) = &ws.mountpoint {
            return Workspace::attach(mp, plan, opts);
        }
        Workspace::claim(plan, opts)
    }

    /// Opens a workspace from its layers. The work and state directories
    /// are the defaults a mount of the same upper uses (hidden siblings of
    /// the upper), created when missing; a live mount of the upper is
    /// worked on through its mount.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// # std::fs::create_dir(lower.join("src"))?;
    /// # std::fs::write(lower.join("src/main.rs"), "fn main() {}\n")?;
    /// use layerfs::tools::{Layers, OpenOptions};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// assert_eq!(ws.ls("/")?.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_layers(layers: &Layers, opts: &OpenOptions) -> Result<Workspace> {
        let canon =
            |p: &Path| std::fs::canonicalize(p).map_err(|e| open_err(p.display(), e.to_string()));
        let upper = canon(&layers.upper)?;
        let lowers = layers
            .lowers
            .iter()
            .map(|l| canon(l))
            .collect::<Result<Vec<_>>>()?;
        let policy = match &layers.policy {
            Some(f) => Policy::load(f).map_err(|m| open_err(f.display(), m))?,
            None => Policy::default(),
        };
        let work = crate::config::default_work_dir(&upper)
            .map_err(|e| open_err(upper.display(), e.to_string()))?;
        SafeDir::create(&work, Role::Work, 0o700).map_err(|m| open_err(work.display(), m))?;
        let state_path = ws_state::default_state_dir(&upper);
        let state = Arc::new(
            ws_state::create_state_dir(&state_path)
                .map_err(|m| open_err(state_path.display(), m))?,
        );
        // A description lets `layerfs diff`/`log` find the workspace by
        // its upper later; one a mount wrote is kept as it is.
        if !state.shown(ws_state::WORKSPACE_FILE).exists() {
            let d = ws_state::Description {
                upper: &upper,
                lowers: &lowers,
                work: &work,
                mountpoint: None,
                last_mountpoint: None,
                policy: layers.policy.as_deref(),
                scratch: &[],
            };
            ws_state::write_description(&state, &d)
                .map_err(|e| open_err(state_path.display(), e.to_string()))?;
        }
        Workspace::claim(
            Plan {
                lowers: &lowers,
                upper: &upper,
                work: &work,
                state: Some(state),
                policy,
                policy_file: layers.policy.as_deref(),
                scratch: Vec::new(),
            },
            opts,
        )
    }

    /// Takes the upper and work dir as a mount would and starts the core
    /// here; when a live daemon holds them, works through its mount.
    fn claim(plan: Plan<'_>, opts: &OpenOptions) -> Result<Workspace> {
        let scratch = scratch_set(&plan.policy, &plan.scratch, plan.upper)?;
        let reclaim = Reclaim {
            lowers: plan.lowers.to_vec(),
            upper: plan.upper.to_path_buf(),
            work: plan.work.to_path_buf(),
            state: plan.state.clone(),
            policy: plan.policy.clone(),
            read_only: opts.read_only,
        };
        let client = opts.client.as_deref().unwrap_or("lib");
        let store = match reclaim.start(client) {
            Ok(s) => s,
            Err(NotStarted::Served(mp)) => return Workspace::attach(&mp, plan, opts),
            Err(NotStarted::Failed(e)) => return Err(e),
        };
        Ok(Workspace::with(
            store,
            opts,
            scratch,
            None,
            Workspace::target(&plan, false, opts),
            Some(reclaim),
            &plan,
        ))
    }

    fn target(plan: &Plan<'_>, mounted: bool, opts: &OpenOptions) -> exec::Target {
        exec::Target {
            lowers: plan.lowers.to_vec(),
            upper: plan.upper.to_path_buf(),
            policy: plan.policy_file.map(Path::to_path_buf),
            mounted,
            binary: opts.layerfs.clone().unwrap_or_else(exec::default_binary),
        }
    }

    /// Works through the live mount at `mp`.
    fn attach(mp: &Path, plan: Plan<'_>, opts: &OpenOptions) -> Result<Workspace> {
        let set = scratch_set(&plan.policy, &plan.scratch, mp)?;
        let target = Workspace::target(&plan, true, opts);
        let store = mounted::MountStore::new(mp, plan.policy.clone())
            .map_err(|e| open_err(mp.display(), e.to_string()))?;
        Ok(Workspace::with(
            Box::new(store),
            opts,
            set,
            Some(mp.to_path_buf()),
            target,
            None,
            &plan,
        ))
    }

    fn with(
        store: Box<dyn Store>,
        opts: &OpenOptions,
        scratch: PathSet,
        mountpoint: Option<PathBuf>,
        target: exec::Target,
        reclaim: Option<Reclaim>,
        plan: &Plan<'_>,
    ) -> Workspace {
        let state = plan.state.as_ref();
        Workspace {
            store: RwLock::new(store),
            read_only: opts.read_only,
            target,
            reclaim,
            journal_db: state.map(|d| d.fd_path(ws_state::JOURNAL_FILE)),
            client: opts.client.clone().unwrap_or_else(|| "lib".into()),
            scratch,
            mountpoint,
            policy: plan.policy.clone(),
            state_at: state.map(|d| (plan.upper.to_path_buf(), d.path().to_path_buf())),
            locks: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }
}

/// The scratch patterns of a workspace: the policy's and `--scratch`'s.
fn scratch_set(policy: &Policy, extra: &[String], whose: &Path) -> Result<PathSet> {
    let all: Vec<String> = policy.scratch().iter().chain(extra).cloned().collect();
    PathSet::new(&all).map_err(|m| open_err(whose.display(), m))
}
