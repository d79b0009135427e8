//! The workspace's file tools as a library: list, read with line
//! numbers, write (create-only unless told), edit by unique match, grep,
//! glob, delete, rename, mkdir, stat, exists — for agents and scripts that
//! reach a workspace without a mount (`layerfs fs`, `layerfs serve --mcp`).
//!
//! Where the calls run (decided once, at `open`; see DESIGN.md, "The
//! agent tools"):
//! - an unmounted workspace: the overlay core runs in this process
//!   (`core`), holding the upper's and work dir's locks as a mount's
//!   daemon does; no `/dev/fuse` is needed;
//! - a workspace a daemon serves: every call is a system call on its
//!   mount (`mounted`), so the daemon's policy, quota and journal apply
//!   and changes either way are seen at once. There is never a second
//!   core on one upper (`daemon::exclusive`).
//!
//! Paths are checked before anything is touched (`path::RelPath`).
//! Changes to one path are serialized (`Workspace::lock`); a `Workspace`
//! is safe to share between threads.

mod core;
pub mod error;
pub mod exec;
mod mounted;
pub mod path;
pub mod request;
mod search;
pub mod state;
pub mod store;
mod text;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard};

use error::Result;
pub use error::{ToolError, What};
pub use exec::{ExecuteRequest, ExecuteResult};
pub use path::RelPath;
pub use request::*;
pub use state::*;
use store::{Kind, Store};

use crate::layer::safedir::{Role, SafeDir};
use crate::policy::pattern::PathSet;
use crate::policy::Policy;
use crate::state::workspace as ws_state;

/// Stripes of the per-path change locks.
const STRIPES: usize = 64;

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

/// An open workspace: the tools on its union view.
pub struct Workspace {
    /// Swapped only by `execute`, which lends an unmounted workspace to
    /// `layerfs run` for the command's duration (write-locked meanwhile,
    /// so the other calls wait for the command).
    store: RwLock<Box<dyn Store>>,
    read_only: bool,
    /// Where `execute` runs commands.
    target: exec::Target,
    /// How to take the core back after `execute` (in-process only).
    reclaim: Option<Reclaim>,
    /// The journal's database, for `execute`'s row.
    journal_db: Option<PathBuf>,
    client: String,
    /// Scratch paths (the policy's and the workspace's `--scratch`).
    scratch: PathSet,
    /// Where the calls go when a daemon serves the workspace.
    mountpoint: Option<PathBuf>,
    /// The policy, for the state operations' checks (the core and the
    /// mount apply it to every change themselves).
    policy: Policy,
    /// The upper and the state dir, to read the workspace's description
    /// for the state operations (`state`).
    state_at: Option<(PathBuf, PathBuf)>,
    locks: Vec<Mutex<()>>,
}

fn open_err(what: impl std::fmt::Display, msg: impl Into<String>) -> ToolError {
    ToolError::new(what, What::Open(msg.into()))
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
struct Reclaim {
    /// The shared lowers.
    lowers: Vec<PathBuf>,
    upper: PathBuf,
    work: PathBuf,
    state: Option<Arc<SafeDir>>,
    policy: Policy,
    read_only: bool,
}

/// Why the core was not started.
enum NotStarted {
    /// A live daemon serves the workspace at this mountpoint.
    Served(PathBuf),
    Failed(ToolError),
}

impl Reclaim {
    /// Takes the upper and work dir as a mount would and starts the core
    /// on the workspace's checkpoints (an undo left pending is finished
    /// first) above the shared lowers, as a mount does.
    fn start(&self, client: &str) -> std::result::Result<Box<dyn Store>, NotStarted> {
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
struct Lost(ToolError);

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
            .map_err(|m| open_err(mp.display(), m))?;
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

    /// The store, for one call (recursive: a call may nest another while
    /// `execute` waits for the write lock).
    fn store(&self) -> RwLockReadGuard<'_, Box<dyn Store>> {
        self.store.read_recursive()
    }

    /// The live mount the calls go through; `None` when the core runs in
    /// this process.
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
    /// assert_eq!(ws.mountpoint(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn mountpoint(&self) -> Option<&Path> {
        self.mountpoint.as_deref()
    }

    /// Serializes changes to one path (and to whatever shares its stripe).
    fn lock(&self, p: &RelPath) -> MutexGuard<'_, ()> {
        self.locks[self.lock_index(p)].lock()
    }

    /// Refuses the state operation `tool` on a read-only workspace.
    fn writable(&self, tool: &str) -> Result<()> {
        match self.read_only {
            true => Err(ToolError::new(tool, What::ReadOnly)),
            false => Ok(()),
        }
    }

    /// Runs `f` with an unmounted workspace's core stopped (its locks
    /// released, its journal flushed: `f` may change the upper and the
    /// stack as the command line would, or mount it), the other calls
    /// waiting meanwhile; then starts the core again on what `f` left.
    /// A workspace a daemon serves just runs `f`.
    fn lent<T>(&self, f: impl FnOnce() -> T) -> T {
        let Some(reclaim) = &self.reclaim else {
            return f();
        };
        let mut store = self.store.write();
        // Dropping the core releases the upper's and work dir's locks and
        // ends its journal writer.
        *store = Box::new(Lost(ToolError::new(
            "workspace",
            What::Exec("the workspace is lent to another operation".into()),
        )));
        let r = f();
        *store = match reclaim.start(&self.client) {
            Ok(s) => s,
            Err(NotStarted::Served(mp)) => Box::new(Lost(open_err(
                mp.display(),
                "a mount took the workspace meanwhile; open it again by that mountpoint",
            ))),
            Err(NotStarted::Failed(e)) => Box::new(Lost(e)),
        };
        r
    }

    /// Checks `raw` for a change: the path rule, and the read-only mode.
    fn changing(&self, raw: &str) -> Result<RelPath> {
        let p = RelPath::parse(raw)?;
        if self.read_only {
            return Err(ToolError::new(&p, What::ReadOnly));
        }
        if p.is_root() {
            return Err(ToolError::new(
                raw,
                What::BadPath("the workspace root itself"),
            ));
        }
        Ok(p)
    }

    /// The entries of a directory (union view: upper wins, whiteouts and
    /// hidden paths left out), in name order.
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
    /// let names: Vec<_> = ws.ls("/")?.into_iter().map(|e| e.path).collect();
    /// assert_eq!(names, ["notes.txt", "src"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ls(&self, path: &str) -> Result<Vec<Entry>> {
        let p = RelPath::parse(path)?;
        let mut v = self.store().list(&p)?;
        v.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(v.iter()
            .map(|(n, m)| search::entry(&p.join(n), m))
            .collect())
    }

    /// Numbered lines of a text file (`     1\tline`), `offset` lines
    /// skipped, at most `limit`; a binary file is reported, not dumped.
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
    /// let r = ws.read(&layerfs::tools::ReadRequest { path: "notes.txt".into(), offset: 1, limit: 1 })?;
    /// assert_eq!(r.content, "     2\tbeta");
    /// assert!(r.truncated);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read(&self, req: &ReadRequest) -> Result<ReadResult> {
        let p = RelPath::parse(&req.path)?;
        let data = self.store().read(&p)?;
        let size = data.len() as u64;
        let path = p.as_str().to_string();
        let Some(text) = text::as_text(&data) else {
            return Ok(ReadResult {
                path,
                content: String::new(),
                lines: 0,
                total_lines: 0,
                truncated: false,
                binary: true,
                size,
            });
        };
        let (content, lines, total_lines) = text::numbered(text, req.offset, req.limit);
        Ok(ReadResult {
            path,
            content,
            lines,
            total_lines,
            truncated: req.offset + lines < total_lines,
            binary: false,
            size,
        })
    }

    /// The raw bytes of a file: at most `limit` bytes (all when `None`)
    /// from byte `offset` on; none past its end.
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
    /// assert_eq!(ws.read_raw("src/main.rs", 0, None)?, b"fn main() {}\n");
    /// assert_eq!(ws.read_raw("src/main.rs", 3, Some(4))?, b"main");
    /// assert_eq!(ws.read_raw("src/main.rs", 100, None)?, b"");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read_raw(&self, path: &str, offset: u64, limit: Option<u64>) -> Result<Vec<u8>> {
        let p = RelPath::parse(path)?;
        self.store()
            .read_range(&p, offset, limit.unwrap_or(u64::MAX))
    }

    /// Creates a file; an existing one is an error naming it unless
    /// `overwrite`, which replaces it atomically (its mode kept).
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
    /// use layerfs::tools::{WriteRequest, What};
    /// let req = WriteRequest { path: "new.txt".into(), content: "hi\n".into(), overwrite: false };
    /// assert!(ws.write(&req)?.created);
    /// assert_eq!(ws.write(&req).unwrap_err().what, What::Exists);
    /// ws.write(&WriteRequest { overwrite: true, ..req })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write(&self, req: &WriteRequest) -> Result<WriteResult> {
        let p = self.changing(&req.path)?;
        let _l = self.lock(&p);
        let data = req.content.as_bytes();
        let created = match self.store().create("write", &p, data, 0o666) {
            Ok(()) => true,
            Err(e) if e.what == What::Exists && req.overwrite => {
                self.replace("write", &p, data)?;
                false
            }
            Err(e) => return Err(e),
        };
        Ok(WriteResult {
            path: p.as_str().to_string(),
            bytes: data.len() as u64,
            created,
        })
    }

    /// Replaces file `p`'s content atomically: a temporary file beside it,
    /// renamed over it (a reader sees the old or the new file, never
    /// half). Callers hold `p`'s lock.
    fn replace(&self, tool: &str, p: &RelPath, data: &[u8]) -> Result<()> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let meta = self.store().stat(p)?;
        match meta.kind {
            Kind::File => {}
            Kind::Dir => return Err(ToolError::new(p, What::IsADirectory)),
            Kind::Symlink => return Err(ToolError::new(p, What::Symlink)),
            Kind::Other => return Err(ToolError::new(p, What::Io(libc::EINVAL))),
        }
        let (dir, name) = p.split_last().expect("not the root");
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(&format!(".{name}.layerfs-{}-{n}.tmp", std::process::id()));
        self.store()
            .create(tool, &tmp, data, meta.mode)
            .map_err(|e| e.about(p))?;
        self.store().rename(tool, &tmp, p, false).map_err(|e| {
            let _ = self.store().remove(tool, &tmp, false);
            e.about(p)
        })
    }

    /// Replaces `old_string` by `new_string`: exactly one occurrence
    /// unless `replace_all`; zero or several are errors saying how many.
    /// Atomic, as `write` with `overwrite`.
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
    /// use layerfs::tools::{EditRequest, What};
    /// let mut req = EditRequest { path: "notes.txt".into(), old_string: "alpha".into(),
    ///     new_string: "gamma".into(), replace_all: false };
    /// assert_eq!(ws.edit(&req).unwrap_err().what, What::Matches(2));
    /// req.replace_all = true;
    /// assert_eq!(ws.edit(&req)?.replacements, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn edit(&self, req: &EditRequest) -> Result<EditResult> {
        let p = self.changing(&req.path)?;
        let _l = self.lock(&p);
        let data = self.store().read(&p)?;
        let old = text::as_text(&data).ok_or_else(|| ToolError::new(&p, What::Binary))?;
        let (new, n) = text::replace(old, &req.old_string, &req.new_string, req.replace_all)
            .map_err(|w| ToolError::new(&p, w))?;
        self.replace("edit", &p, new.as_bytes())?;
        Ok(EditResult {
            path: p.as_str().to_string(),
            replacements: n,
        })
    }

    /// Searches text files for a literal string (or a regex on request).
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
    /// use layerfs::tools::GrepRequest;
    /// let r = ws.grep(&GrepRequest::new("alpha"))?;
    /// assert_eq!(r.matches.len(), 2);
    /// assert_eq!((r.matches[1].path.as_str(), r.matches[1].line), ("notes.txt", 3));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn grep(&self, req: &GrepRequest) -> Result<GrepResult> {
        let base = RelPath::parse(&req.path)?;
        search::grep(self.store().as_ref(), &base, req, &self.scratch)
    }

    /// The entries under `path` whose path relative to it matches the
    /// pattern, in walk order.
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
    /// let found = ws.glob(&layerfs::tools::GlobRequest::new("**/*.rs"))?;
    /// assert_eq!(found[0].path, "src/main.rs");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn glob(&self, req: &GlobRequest) -> Result<Vec<Entry>> {
        let base = RelPath::parse(&req.path)?;
        search::glob(self.store().as_ref(), &base, &req.pattern)
    }

    /// Removes a file, or a directory (with everything in it when
    /// `recursive`; an empty one otherwise).
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
    /// ws.delete("src", true)?;
    /// assert!(!ws.exists("src/main.rs")?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn delete(&self, path: &str, recursive: bool) -> Result<()> {
        let p = self.changing(path)?;
        let _l = self.lock(&p);
        if self.store().stat(&p)?.kind != Kind::Dir {
            return self.store().remove("delete", &p, false);
        }
        if recursive {
            let mut inside = Vec::new();
            let none = PathSet::default();
            search::walk(self.store().as_ref(), &p, &none, &mut |q, m| {
                inside.push((q.clone(), m.kind == Kind::Dir));
                Ok(())
            })?;
            // Walk order puts a directory before what it holds.
            for (q, dir) in inside.iter().rev() {
                self.store().remove("delete", q, *dir)?;
            }
        }
        self.store().remove("delete", &p, true)
    }

    /// Renames an entry; an existing destination is an error unless
    /// `overwrite`.
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
    /// ws.rename("notes.txt", "src/notes.md", false)?;
    /// assert!(ws.exists("src/notes.md")?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rename(&self, from: &str, to: &str, overwrite: bool) -> Result<()> {
        let (f, t) = (self.changing(from)?, self.changing(to)?);
        if f == t {
            // As rename(2) through the kernel answers: the name exists,
            // so without `overwrite` that is the error; with it, nothing
            // to do. (The core is never asked: the kernel never asks it.)
            self.store().stat(&f)?;
            return match overwrite {
                true => Ok(()),
                false => Err(ToolError::new(&t, What::Exists)),
            };
        }
        // Both stripes, in one order, so two renames never wait in a circle.
        let (a, b) = (self.lock_index(&f), self.lock_index(&t));
        let _first = self.locks[a.min(b)].lock();
        let _second = (a != b).then(|| self.locks[a.max(b)].lock());
        self.store().rename("rename", &f, &t, !overwrite)
    }

    fn lock_index(&self, p: &RelPath) -> usize {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        BuildHasherDefault::<DefaultHasher>::default().hash_one(p) as usize % STRIPES
    }

    /// Creates a directory; with `parents`, the missing ones above it too
    /// (and an existing directory is no error).
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
    /// ws.mkdir("a/b/c", true)?;
    /// assert_eq!(ws.stat("a/b")?.kind, layerfs::tools::store::Kind::Dir);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        let p = self.changing(path)?;
        if !parents {
            return self.store().mkdir("mkdir", &p);
        }
        let mut cur = RelPath::root();
        for seg in p.segments() {
            cur = cur.join(seg);
            match self.store().mkdir("mkdir", &cur) {
                Err(e) if e.what == What::Exists => {
                    if self.store().stat(&cur)?.kind != Kind::Dir {
                        return Err(ToolError::new(&cur, What::NotADirectory));
                    }
                }
                r => r?,
            }
        }
        Ok(())
    }

    /// What an entry is (a symlink is described, not followed).
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
    /// assert_eq!(ws.stat("notes.txt")?.size, 23);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stat(&self, path: &str) -> Result<Entry> {
        let p = RelPath::parse(path)?;
        let m = self.store().stat(&p)?;
        Ok(search::entry(&p, &m))
    }

    /// Whether an entry exists (hidden paths do not).
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
    /// assert!(ws.exists("/notes.txt")?);
    /// assert!(!ws.exists("nothing")?);
    /// assert!(ws.exists("../etc").is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn exists(&self, path: &str) -> Result<bool> {
        match self.store().stat(&RelPath::parse(path)?) {
            Ok(_) => Ok(true),
            Err(e) if e.what == What::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl Workspace {
    /// Runs a shell command in the workspace's sandbox (`layerfs run`:
    /// the workspace at `/workspace`, the rest of the host read-only, the
    /// policy enforced by the mount), killed with everything it started
    /// after `timeout` seconds, its output cut at `max_output` bytes.
    /// An unmounted workspace is lent to `layerfs run` for the command's
    /// duration: the in-process core is stopped (its locks released, its
    /// journal flushed), `run` mounts, runs and unmounts, and the core is
    /// started again; the other calls wait meanwhile. A mounted one is
    /// run in through its mount. Journaled as an `exec` row naming
    /// `CLIENT:execute`, the command and its exit code.
    pub fn execute(&self, req: &ExecuteRequest) -> Result<ExecuteResult> {
        if self.read_only {
            return Err(ToolError::new("execute", What::ReadOnly));
        }
        exec::check(req)?;
        let result = self.lent(|| exec::run(&self.target, req));
        if let (Ok(r), Some(db)) = (&result, &self.journal_db) {
            let comm = format!("{}:execute", self.client);
            let what = exec::shown(&req.command);
            let code = r.exit_code.max(0) as u64;
            if let Err(e) = crate::state::journal::record_as(
                db,
                crate::overlay::events::EvOp::Exec,
                &what,
                code,
                &comm,
            ) {
                tracing::warn!("execute: not recorded in the journal: {e}");
            }
        }
        result
    }
}

/// The scratch patterns of a workspace: the policy's and `--scratch`'s.
fn scratch_set(policy: &Policy, extra: &[String], whose: &Path) -> Result<PathSet> {
    let all: Vec<String> = policy.scratch().iter().chain(extra).cloned().collect();
    PathSet::new(&all).map_err(|m| open_err(whose.display(), m))
}
