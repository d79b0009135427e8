//! The stack of frozen layers a workspace stands on, and the layer store
//! that holds them (DESIGN.md §5, "Checkpoints, forks and undo").
//!
//! This file owns the on-disk format: a workspace's `layers.json` in its
//! state dir (the store's path, the frozen layers' names top first, and a
//! pending undo), and in a store each layer's directory `NAME/`, its
//! record `NAME.json` and its holds `NAME.holds/DEV-INO` (a symlink to the
//! state dir of each workspace that stacks on it). A checkpoint being
//! taken has its record under `.NAME.pending.json` until its workspace's
//! stack names it (`Store::write_pending`, `Store::publish`). What is done
//! with them (checkpoint, undo, fork) is `state::checkpoint`.
//!
//! Invariants:
//! - A layer directory in a store never changes after it is frozen:
//!   nothing writes through a lower, and `Store::remove` is called only
//!   for a layer nothing stacks on (`Store::users`).
//! - Every file here is replaced atomically (`SafeDir::replace_file`): a
//!   reader sees the old stack or the new one.
//! - Layer names passed `snapshot_id::validate`: one safe path segment,
//!   never starting with `.` (so never a temporary name of this module).

use std::ffi::OsStr;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::layer::safedir::{Role, SafeDir, SafeDirError};

/// A workspace's stack, in its state dir.
pub const STACK_FILE: &str = "layers.json";
/// The default layer store, in the state dir.
pub const STORE_DIR: &str = "layers";

/// Why the daemon's half of a live checkpoint, undo or squash (`checkpoint::Live`,
/// `squash::Live`) failed: the daemon's own error (`daemon::layers`),
/// kept whole behind this type so the steps here need not know it.
#[derive(Debug)]
pub struct LiveError(Box<dyn std::error::Error + Send + Sync>);

impl LiveError {
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> LiveError {
        LiveError(Box::new(e))
    }
}

impl std::fmt::Display for LiveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for LiveError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Why a stack or store operation failed: what was being done, and why.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    /// A system call on a named file failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// A file of the stack or store does not say what it must.
    #[error("{}: {why}", file.display())]
    Corrupt { file: PathBuf, why: String },
    /// The operation is refused; the text says why and what to do.
    #[error("{0}")]
    Refused(String),
    /// The state dir, work dir or store was refused (`layer::safedir`).
    #[error(transparent)]
    Dir(#[from] SafeDirError),
    /// The upper could not be opened or locked (`checkpoint::lock_upper`).
    #[error(transparent)]
    Lock(#[from] crate::host::holder::LockError),
    /// An undo to a checkpoint the workspace does not stand on (`has`:
    /// the ones it does, topmost first).
    #[error(
        "this workspace stands on no checkpoint {name} (it has: {}); see layerfs checkpoint \
         list",
        if has.is_empty() { "none".to_string() } else { has.join(", ") }
    )]
    NoSuchCheckpoint { name: String, has: Vec<String> },
    /// An undo of a workspace with no checkpoint.
    #[error("this workspace has no checkpoint to go back to")]
    NoCheckpoint,
    /// An undo with nothing changed since the oldest checkpoint.
    #[error("nothing changed since checkpoint {oldest}, the oldest: nothing to undo")]
    NothingToUndo { oldest: String },
    /// A fork into an upper that holds something.
    #[error(
        "{} is not empty: a fork starts from an empty upper; give a new directory",
        upper.display()
    )]
    ForkNotEmpty { upper: PathBuf },
    /// A mounted workspace's daemon could not be asked, or refused.
    #[error(transparent)]
    Control(#[from] crate::state::control::ControlError),
    /// The daemon's half of a live checkpoint, undo or squash refused
    /// before the view changed on disk (`checkpoint::Live`).
    #[error(transparent)]
    Live(#[from] LiveError),
    /// A live checkpoint's view could not be served; the exchange was
    /// undone and the old stack written back.
    #[error("{source}; the checkpoint was taken back, the workspace is unchanged")]
    LiveCheckpointTakenBack { source: LiveError },
    /// A live checkpoint's view could not be served, nor the old upper
    /// put back: the workspace stands on checkpoint `name` on disk.
    #[error(
        "{source}; and the upper cannot be put back ({back}): unmount the workspace and mount \
         it again (it then stands on checkpoint {name})"
    )]
    LiveCheckpointStuck {
        source: LiveError,
        back: io::Error,
        name: String,
    },
    /// A live undo is done on disk but its view could not be served.
    #[error(
        "{source}; the undo is done on disk but the mount cannot serve it: unmount the \
         workspace and mount it again"
    )]
    LiveUndoUnserved { source: LiveError },
    /// A live squash is done on disk but its stack could not be served.
    #[error(
        "{source}; the squash is done on disk but the mount cannot serve it: unmount the \
         workspace and mount it again (the merged layers are removed by the next squash)"
    )]
    LiveSquashUnserved { source: LiveError },
}

/// `map_err` helper: an io error with what was being done.
pub fn io_ctx(what: impl fmt::Display) -> impl FnOnce(io::Error) -> StackError {
    move |source| StackError::Io {
        what: what.to_string(),
        source,
    }
}

/// What `layers.json` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stack {
    /// The layer store (absolute).
    pub store: PathBuf,
    /// Frozen layers, topmost first.
    pub layers: Vec<String>,
    /// An undo decided but maybe not finished: the stack it leaves
    /// (`state::checkpoint::finish_pending`).
    pub pending_undo: Option<Vec<String>>,
    /// Checkpoints taken since the top layer with nothing changed (an
    /// empty upper): each is the top layer again, made no new layer; an
    /// undo with an empty upper takes one of these back before it takes
    /// the top layer off (`state::checkpoint`).
    pub repeats: u32,
}

impl Stack {
    fn to_json(&self) -> Value {
        json!({
            "store": self.store.to_string_lossy(),
            "layers": self.layers,
            "pending": self.pending_undo.as_ref().map(|l| json!({ "undo": l })),
            "repeats": self.repeats,
        })
    }

    /// The layers a reader should use: a pending undo's, which is decided.
    pub fn effective(&self) -> &[String] {
        self.pending_undo.as_deref().unwrap_or(&self.layers)
    }
}

fn names(v: &Value) -> Option<Vec<String>> {
    v.as_array()?
        .iter()
        .map(|n| n.as_str().map(String::from))
        .collect()
}

/// Reads the stack of the workspace whose state dir is `state`; `None`
/// when it has none (no checkpoint was ever taken or forked from).
pub fn read(state: &SafeDir) -> Result<Option<Stack>, StackError> {
    let Some(j) = read_json(state, STACK_FILE)? else {
        return Ok(None);
    };
    let (v, bad) = (&j.value, |why: &str| j.bad(why));
    let store = v["store"].as_str().ok_or_else(|| bad("no \"store\""))?;
    let layers = names(&v["layers"]).ok_or_else(|| bad("no \"layers\" list of names"))?;
    let pending_undo = match &v["pending"] {
        Value::Null => None,
        p => Some(names(&p["undo"]).ok_or_else(|| bad("a \"pending\" without an undo list"))?),
    };
    for n in layers.iter().chain(pending_undo.iter().flatten()) {
        crate::state::snapshot_id::validate(OsStr::new(n)).map_err(|e| bad(&e.to_string()))?;
    }
    let repeats = v["repeats"].as_u64().unwrap_or(0).min(u32::MAX as u64) as u32;
    Ok(Some(Stack {
        store: PathBuf::from(store),
        layers,
        pending_undo,
        repeats,
    }))
}

/// Writes the stack atomically (see the module comment).
pub fn write(state: &SafeDir, stack: &Stack) -> Result<(), StackError> {
    let mut text = serde_json::to_string_pretty(&stack.to_json()).unwrap_or_default();
    text.push('\n');
    state
        .replace_file(STACK_FILE, text.as_bytes())
        .map_err(io_ctx(format!(
            "cannot write {}",
            state.shown(STACK_FILE).display()
        )))
}

/// Writes a new workspace's stack (a fork's): its content is durable,
/// then `before_rename` makes durable what must be first (the holds on
/// its layers), then it is renamed into place. The state dir's fsync that
/// makes the rename durable is left to the mount that follows, whose
/// `workspace.json` write (`daemon::describe`) fsyncs the same directory
/// before the mount appears; a power loss before that loses the stack
/// whole (the workspace is then no fork, its holds stale).
pub fn write_new(
    state: &SafeDir,
    stack: &Stack,
    before_rename: impl FnOnce() -> io::Result<()>,
) -> Result<(), StackError> {
    let mut text = serde_json::to_string_pretty(&stack.to_json()).unwrap_or_default();
    text.push('\n');
    state
        .replace_file_then_sync_later(STACK_FILE, text.as_bytes(), before_rename)
        .map_err(io_ctx(format!(
            "cannot write {}",
            state.shown(STACK_FILE).display()
        )))
}

/// Writes the stack atomically but without waiting for the disk: for a
/// change of `repeats` only, which no view depends on (a crash may keep
/// the old count; the layers it names are the same), and for a deferred
/// checkpoint (`state::checkpoint::Durability::Deferred`), which
/// `sync_stack` makes durable after.
pub fn write_unsynced(state: &SafeDir, stack: &Stack) -> Result<(), StackError> {
    let mut text = serde_json::to_string_pretty(&stack.to_json()).unwrap_or_default();
    text.push('\n');
    state
        .replace_file_unsynced(STACK_FILE, text.as_bytes())
        .map_err(io_ctx(format!(
            "cannot write {}",
            state.shown(STACK_FILE).display()
        )))
}

/// Makes the stack written by `write_unsynced` durable: the file's data,
/// then its name in the state dir. A stack a later write replaced is
/// made durable just the same (the newer one).
pub fn sync_stack(state: &SafeDir) -> Result<(), StackError> {
    let file = state.shown(STACK_FILE);
    state
        .open_file(STACK_FILE, libc::O_RDONLY, 0)
        .and_then(|f| f.sync_all())
        .and_then(|()| state.sync())
        .map_err(io_ctx(format!("cannot sync {}", file.display())))
}

/// A JSON file of the stack or store, read, and where it came from (for
/// the error that says it is corrupt).
struct Json {
    value: Value,
    file: PathBuf,
}

impl Json {
    fn bad(&self, why: &str) -> StackError {
        StackError::Corrupt {
            file: self.file.clone(),
            why: why.into(),
        }
    }
}

/// The JSON in the file `name` of `dir`; `None` when there is no such file.
fn read_json(dir: &SafeDir, name: &str) -> Result<Option<Json>, StackError> {
    let file = dir.shown(name);
    let text = match read_text(dir, name) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_ctx(format!("cannot read {}", file.display()))(e)),
    };
    match serde_json::from_str(&text) {
        Ok(value) => Ok(Some(Json { value, file })),
        Err(e) => Err(StackError::Corrupt {
            file,
            why: format!("not JSON ({e})"),
        }),
    }
}

fn read_text(dir: &SafeDir, name: &str) -> io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    dir.open_file(name, libc::O_RDONLY, 0)?
        .read_to_string(&mut text)?;
    Ok(text)
}

/// The frozen layers' paths of the workspace whose state dir is `state`,
/// topmost first (a pending undo's stack when one is pending); empty
/// without a stack.
pub fn frozen_paths(state: &SafeDir) -> Result<Vec<PathBuf>, StackError> {
    Ok(match read(state)? {
        Some(s) => s.effective().iter().map(|n| s.store.join(n)).collect(),
        None => Vec::new(),
    })
}

/// A checkpoint's record, `NAME.json` in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub name: String,
    /// The layers below it, topmost first: its stack is itself and these.
    pub below: Vec<String>,
    /// The shared lowers it was taken over, topmost first.
    pub lowers: Vec<PathBuf>,
    /// Unix time it was taken.
    pub created: i64,
    /// The upper it was frozen from.
    pub upper: PathBuf,
    /// For a layer `layerfs squash` made: the layers it replaced (removed
    /// after the switch; `state::squash`).
    pub squashed: Vec<String>,
}

impl Record {
    /// Its stack: itself and the layers below it, topmost first.
    pub fn stack(&self) -> Vec<String> {
        std::iter::once(self.name.clone())
            .chain(self.below.iter().cloned())
            .collect()
    }
}

/// A layer store, opened checked (`SafeDir`, role `Layers`).
pub struct Store {
    pub dir: SafeDir,
}

fn record_file(name: &str) -> String {
    format!("{name}.json")
}

fn holds_dir(name: &str) -> String {
    format!("{name}.holds")
}

/// The record of a checkpoint not yet on its workspace's stack.
fn pending_file(name: &str) -> String {
    format!(".{name}.pending.json")
}

/// The checkpoint a `pending_file` is for; `None` for any other name.
fn pending_name(file: &str) -> Option<&str> {
    file.strip_prefix('.')?
        .strip_suffix(".pending.json")
        .filter(|n| crate::state::snapshot_id::validate(OsStr::new(n)).is_ok())
}

impl Store {
    /// Opens the store at `path`, creating it (0700) when `create`.
    pub fn open(path: &Path, create: bool) -> Result<Store, StackError> {
        let dir = if create {
            SafeDir::create(path, Role::Layers, 0o700).map(|(d, _)| d)?
        } else {
            SafeDir::open(path, Role::Layers)?.ok_or_else(|| {
                StackError::Refused(format!("layer store {} does not exist", path.display()))
            })?
        };
        Ok(Store { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Whether `name` is taken (a layer, a record of one, or a checkpoint
    /// being taken under that name).
    pub fn taken(&self, name: &str) -> bool {
        self.dir.stat(name).is_ok()
            || self.dir.stat(record_file(name)).is_ok()
            || self.dir.stat(pending_file(name)).is_ok()
    }

    /// The name a new layer takes: `given`, checked (a valid name not
    /// taken in this store, else an error saying so), or a fresh one.
    pub fn new_name(&self, given: Option<&str>) -> Result<String, StackError> {
        let Some(n) = given else {
            return Ok(crate::state::snapshot_id::generate(|n| self.taken(n)));
        };
        let n = crate::state::snapshot_id::validate_as(OsStr::new(n), "checkpoint name")
            .map_err(|e| StackError::Refused(e.to_string()))?;
        if self.taken(n) {
            return Err(StackError::Refused(format!(
                "checkpoint {n} exists already in {}; choose another name",
                self.path().display()
            )));
        }
        Ok(n.to_string())
    }

    /// Publishes the layer built aside as `tmp` under `name`: one rename
    /// that never replaces (a layer appears whole or not at all), made
    /// durable.
    pub fn place(&self, tmp: &str, name: &str) -> Result<(), StackError> {
        crate::layer::sys::renameat2(
            &self.dir,
            OsStr::new(tmp),
            &self.dir,
            OsStr::new(name),
            crate::layer::sys::RENAME_NOREPLACE,
        )
        .map_err(io_ctx(format!(
            "cannot rename {} to {}",
            self.dir.shown(tmp).display(),
            self.dir.shown(name).display()
        )))?;
        self.dir
            .sync()
            .map_err(io_ctx(format!("cannot sync {}", self.path().display())))
    }

    /// The record of checkpoint `name`, whose layer must be here too; an
    /// error pointing at `checkpoint list` otherwise.
    pub fn checkpoint(&self, name: &str) -> Result<Record, StackError> {
        self.record(name)?
            .filter(|_| self.has_layer(name))
            .ok_or_else(|| {
                StackError::Refused(format!(
                    "no checkpoint {name} in {}; see layerfs checkpoint list",
                    self.path().display()
                ))
            })
    }

    /// Whether the layer directory `name` exists.
    pub fn has_layer(&self, name: &str) -> bool {
        self.dir
            .stat(name)
            .is_ok_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFDIR)
    }

    /// The record of `name`; `None` when it has none (a checkpoint being
    /// taken has none yet: see `pending`).
    pub fn record(&self, name: &str) -> Result<Option<Record>, StackError> {
        self.read_record(name, &record_file(name))
    }

    /// The record of `name` in the file `file` of the store.
    fn read_record(&self, name: &str, file: &str) -> Result<Option<Record>, StackError> {
        // A power cut before a deferred checkpoint was synced may leave
        // its record's name without its data: as if it had none.
        if self.dir.stat(file).is_ok_and(|s| s.st_size == 0) {
            return Ok(None);
        }
        let Some(j) = read_json(&self.dir, file)? else {
            return Ok(None);
        };
        let (v, bad) = (&j.value, |why: &str| j.bad(why));
        let below = names(&v["below"]).ok_or_else(|| bad("no \"below\" list"))?;
        for n in &below {
            crate::state::snapshot_id::validate(OsStr::new(n)).map_err(|e| bad(&e.to_string()))?;
        }
        Ok(Some(Record {
            name: name.to_string(),
            below,
            lowers: names(&v["lowers"])
                .ok_or_else(|| bad("no \"lowers\" list"))?
                .into_iter()
                .map(PathBuf::from)
                .collect(),
            created: v["created"].as_i64().unwrap_or(0),
            upper: PathBuf::from(v["upper"].as_str().unwrap_or_default()),
            squashed: names(&v["squashed"])
                .unwrap_or_default()
                .into_iter()
                .filter(|n| crate::state::snapshot_id::validate(OsStr::new(n)).is_ok())
                .collect(),
        }))
    }

    /// Writes the record of a layer (atomically), durable when it returns.
    pub fn write_record(&self, r: &Record) -> Result<(), StackError> {
        self.put_record(r, &record_file(&r.name), true)
    }

    /// Writes the record of a checkpoint being taken as pending
    /// (`.NAME.pending.json`): it takes the name, but the checkpoint is
    /// no one's until `publish` (see `state::checkpoint::settle` for what
    /// becomes of one a crash left). `synced`: durable when it returns;
    /// else `sync_layer` makes it durable after (a deferred checkpoint).
    pub fn write_pending(&self, r: &Record, synced: bool) -> Result<(), StackError> {
        self.put_record(r, &pending_file(&r.name), synced)
    }

    /// Whether `name` is a checkpoint being taken, or left pending by a
    /// crash (`write_pending`).
    pub fn is_pending(&self, name: &str) -> bool {
        self.dir.stat(pending_file(name)).is_ok()
    }

    /// The checkpoints being taken, or left pending by a crash: their
    /// records (`write_pending`). Unreadable ones are skipped.
    pub fn pending(&self) -> Vec<Record> {
        let Ok(entries) = self.dir.read_dir() else {
            return Vec::new();
        };
        entries
            .iter()
            .filter_map(|e| {
                let file = e.name.to_str()?;
                let name = pending_name(file)?;
                self.read_record(name, file).ok().flatten()
            })
            .collect()
    }

    /// Makes the pending checkpoint `name` a checkpoint: its record
    /// renamed to `NAME.json` (durable at the store's next fsync). Done
    /// when the record is there already (a crash after the rename).
    pub fn publish(&self, name: &str) -> Result<(), StackError> {
        match self.dir.rename(pending_file(name), record_file(name), 0) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && self.record(name)?.is_some() => Ok(()),
            r => r.map_err(io_ctx(format!(
                "cannot rename {} to {}",
                self.dir.shown(pending_file(name)).display(),
                self.dir.shown(record_file(name)).display()
            ))),
        }
    }

    /// Removes the pending checkpoint `name`, which no stack names: its
    /// layer directory, holds, then its pending record (last: an
    /// interrupted removal is found and finished again).
    pub fn discard(&self, name: &str) -> Result<(), StackError> {
        let gone = |r: io::Result<()>| match r {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
        let what = || {
            format!(
                "cannot remove pending checkpoint {}",
                self.dir.shown(name).display()
            )
        };
        for n in [name.to_string(), holds_dir(name)] {
            gone(crate::layer::walk::remove_tree(&self.dir, OsStr::new(&n)))
                .map_err(io_ctx(what()))?;
        }
        gone(self.dir.remove_file(pending_file(name))).map_err(io_ctx(what()))?;
        self.dir.sync().map_err(io_ctx(what()))
    }

    fn put_record(&self, r: &Record, file: &str, synced: bool) -> Result<(), StackError> {
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let v = json!({
            "name": r.name,
            "below": r.below,
            "lowers": r.lowers.iter().map(|p| s(p)).collect::<Vec<_>>(),
            "created": r.created,
            "upper": s(&r.upper),
        });
        let mut v = v;
        if !r.squashed.is_empty() {
            v["squashed"] = json!(r.squashed);
        }
        let mut text = serde_json::to_string_pretty(&v).unwrap_or_default();
        text.push('\n');
        let written = if synced {
            self.dir.replace_file(file, text.as_bytes())
        } else {
            self.dir.replace_file_unsynced(file, text.as_bytes())
        };
        written.map_err(io_ctx(format!(
            "cannot write {}",
            self.dir.shown(file).display()
        )))
    }

    /// Makes what `write_pending`, `publish`, `hold_unsynced` and the
    /// layer's directory put in the store durable: the record's data, the
    /// holds' names, the layer's and the record's names. A layer removed
    /// since (an undo went past it) has nothing left to sync.
    pub fn sync_layer(&self, name: &str) -> Result<(), StackError> {
        let gone = |r: io::Result<()>| match r {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
        let what = || format!("cannot sync layer {}", self.dir.shown(name).display());
        gone(
            self.dir
                .open_file(record_file(name), libc::O_RDONLY, 0)
                .and_then(|f| f.sync_all()),
        )
        .map_err(io_ctx(what()))?;
        if let Ok(Some(holds)) = self.dir.subdir(&holds_dir(name), Role::Layers, None) {
            gone(holds.sync()).map_err(io_ctx(what()))?;
        }
        self.dir.sync().map_err(io_ctx(what()))
    }

    /// Notes that the workspace whose state dir is `state` stacks on
    /// `name` (a symlink `NAME.holds/DEV-INO` to the state dir), durably.
    pub fn hold(&self, name: &str, state: &SafeDir) -> Result<(), StackError> {
        match self.hold_unsynced(name, state)? {
            Some(holds) => holds
                .sync()
                .map_err(io_ctx(format!("cannot sync {}", holds.path().display()))),
            None => Ok(()),
        }
    }

    /// `hold` without the fsync: returns the holds directory when a link
    /// was made in it (the caller fsyncs it before anything depends on
    /// the hold being durable), `None` when the hold was there already.
    pub fn hold_unsynced(
        &self,
        name: &str,
        state: &SafeDir,
    ) -> Result<Option<SafeDir>, StackError> {
        let holds = self
            .dir
            .subdir(&holds_dir(name), Role::Layers, Some(0o700))?
            .ok_or_else(|| StackError::Refused(format!("cannot create holds of {name}")))?;
        let (dev, ino) = state.id();
        let link = format!("{dev:x}-{ino:x}");
        match crate::layer::sys::symlinkat(state.path().as_os_str(), &holds, OsStr::new(&link)) {
            Ok(()) => Ok(Some(holds)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(io_ctx(format!(
                "cannot record a hold in {}",
                holds.path().display()
            ))(e)),
        }
    }

    /// Who stacks on `name`: the state dirs of the workspaces whose stack
    /// holds it (a hold whose workspace no longer stacks on it is
    /// removed), and the layers whose base holds it. `except` (a state
    /// dir) is not counted.
    pub fn users(&self, name: &str, except: Option<&SafeDir>) -> Result<Vec<String>, StackError> {
        let mut users = Vec::new();
        if let Ok(Some(holds)) = self.dir.subdir(&holds_dir(name), Role::Layers, None) {
            for e in holds.read_dir().unwrap_or_default() {
                let Ok(target) = std::fs::read_link(holds.fd_path(&e.name)) else {
                    continue;
                };
                let live = match SafeDir::open(&target, Role::State) {
                    Ok(Some(d)) => {
                        if except.is_some_and(|x| *x == d) {
                            continue;
                        }
                        match read(&d) {
                            Ok(Some(s)) => {
                                s.store == self.path()
                                    && (s.layers.iter().any(|l| l == name)
                                        || s.effective().iter().any(|l| l == name))
                            }
                            Ok(None) => false,
                            Err(_) => true,
                        }
                    }
                    Ok(None) => false,
                    // Another user's workspace: it may stack on it.
                    Err(_) => true,
                };
                if live {
                    users.push(format!("workspace {}", target.display()));
                } else {
                    let _ = holds.remove_file(&e.name);
                }
            }
        }
        for e in self.dir.read_dir().map_err(io_ctx(format!(
            "cannot list layer store {}",
            self.path().display()
        )))? {
            let n = e.name.to_string_lossy();
            let Some(layer) = n.strip_suffix(".json") else {
                continue;
            };
            if layer.starts_with('.') || layer == name || !self.has_layer(layer) {
                continue;
            }
            if let Ok(Some(r)) = self.record(layer) {
                if r.below.iter().any(|b| b == name) {
                    users.push(format!("checkpoint {layer}"));
                }
            }
        }
        Ok(users)
    }

    /// Removes the layer `name`: its directory, record and holds (the
    /// caller made sure nothing stacks on it). The record goes last, so
    /// an interrupted removal leaves the name taken and `rm` can finish it.
    pub fn remove(&self, name: &str) -> Result<(), StackError> {
        let gone = |r: io::Result<()>| match r {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
        let what = || format!("cannot remove layer {}", self.dir.shown(name).display());
        for n in [name.to_string(), holds_dir(name)] {
            gone(crate::layer::walk::remove_tree(&self.dir, OsStr::new(&n)))
                .map_err(io_ctx(what()))?;
        }
        gone(self.dir.remove_file(record_file(name))).map_err(io_ctx(what()))?;
        self.dir.sync().map_err(io_ctx(what()))
    }

    /// The name of a directory process `pid` builds aside in the store
    /// for `label` (a checkpoint's name, or `view`) while it runs: an
    /// `import`, an `export` or the view a `diff` compares. The next
    /// `sweep_aside` removes it once that process is dead.
    pub fn aside_name(label: &str, pid: u32, kind: &str) -> String {
        debug_assert!(ASIDE.contains(&kind));
        format!(".{label}.{pid}.{kind}")
    }

    /// Removes what processes that died left aside in the store
    /// (`aside_name`: an interrupted import, export or diff), never what a
    /// live process owns (its pid runs; a pid reused since only delays
    /// the removal). Best effort; returns the names removed.
    pub fn sweep_aside(&self) -> Vec<String> {
        let Ok(entries) = self.dir.read_dir() else {
            return Vec::new();
        };
        let mut gone = Vec::new();
        for e in entries {
            let Some(n) = e.name.to_str() else { continue };
            let Some(pid) = aside_pid(n) else { continue };
            if pid_alive(pid) {
                continue;
            }
            if crate::layer::walk::remove_tree(&self.dir, &e.name).is_ok() {
                gone.push(n.to_string());
            }
        }
        gone
    }
}

/// The kinds of `Store::aside_name`.
const ASIDE: &[&str] = &["import", "export", "diff"];

/// The pid of an `aside_name` (`.LABEL.PID.KIND`); `None` for any other.
fn aside_pid(n: &str) -> Option<u32> {
    let rest = n.strip_prefix('.')?;
    let (rest, kind) = rest.rsplit_once('.')?;
    if !ASIDE.contains(&kind) {
        return None;
    }
    let (label, pid) = rest.rsplit_once('.')?;
    if label.is_empty() || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Whether process `pid` exists (a zombie counts as dead).
fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aside_names_parse() {
        let n = Store::aside_name("v1.2", 4242, "import");
        assert_eq!(n, ".v1.2.4242.import");
        assert_eq!(aside_pid(&n), Some(4242));
        assert_eq!(aside_pid(".x.7.diff"), Some(7));
        assert_eq!(aside_pid(".x.7.squash"), None);
        assert_eq!(aside_pid("x.7.import"), None);
        assert_eq!(aside_pid("..7.import"), None);
        assert_eq!(aside_pid(".x.7a.import"), None);
        assert!(pid_alive(std::process::id()));
    }

    #[test]
    fn a_pending_checkpoint_takes_its_name_and_is_published_or_discarded() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open(&t.path().join("store"), true).unwrap();
        let rec = |name: &str| Record {
            name: name.into(),
            below: vec![],
            lowers: vec![],
            created: 7,
            upper: PathBuf::from("/u"),
            squashed: Vec::new(),
        };
        assert_eq!(pending_name(".a.b.pending.json"), Some("a.b"));
        assert_eq!(pending_name("a.pending.json"), None);
        assert_eq!(pending_name("..pending.json"), None);
        for n in ["p", "q"] {
            store.write_pending(&rec(n), true).unwrap();
            store.dir.mkdir(n, 0o755).unwrap();
            assert!(store.taken(n) && store.is_pending(n));
            assert_eq!(
                store.record(n).unwrap(),
                None,
                "{n} has a record while pending"
            );
        }
        store.dir.remove_dir("q").unwrap();
        // Pending only: taken still, so no other checkpoint gets the name.
        assert!(store.taken("q"));
        let e = store.new_name(Some("q")).unwrap_err().to_string();
        assert!(e.contains("exists already"), "{e}");
        let mut found: Vec<String> = store.pending().into_iter().map(|r| r.name).collect();
        found.sort();
        assert_eq!(found, ["p", "q"]);
        store.publish("p").unwrap();
        store.publish("p").unwrap();
        assert_eq!(store.record("p").unwrap(), Some(rec("p")));
        assert!(!store.is_pending("p") && store.has_layer("p"));
        store.discard("q").unwrap();
        assert!(!store.taken("q"));
        assert!(store.pending().is_empty());
        // A checkpoint's record does not make it stand on its base while
        // pending: a squash of the base is not refused for it.
        store.dir.mkdir("base", 0o755).unwrap();
        store.write_record(&rec("base")).unwrap();
        let mut on_base = rec("r");
        on_base.below = vec!["base".into()];
        store.write_pending(&on_base, false).unwrap();
        store.dir.mkdir("r", 0o755).unwrap();
        assert!(store.users("base", None).unwrap().is_empty());
        store.publish("r").unwrap();
        assert_eq!(store.users("base", None).unwrap(), vec!["checkpoint r"]);
    }

    #[test]
    fn stack_round_trip_and_pending() {
        let t = tempfile::tempdir().unwrap();
        let (state, _) = SafeDir::create(&t.path().join("s"), Role::State, 0o700).unwrap();
        assert_eq!(read(&state).unwrap(), None);
        let mut s = Stack {
            store: t.path().join("store"),
            layers: vec!["b".into(), "a".into()],
            pending_undo: None,
            repeats: 0,
        };
        write(&state, &s).unwrap();
        assert_eq!(read(&state).unwrap().as_ref(), Some(&s));
        s.pending_undo = Some(vec!["a".into()]);
        write(&state, &s).unwrap();
        let back = read(&state).unwrap().unwrap();
        assert_eq!(back.effective(), ["a".to_string()]);
        assert_eq!(
            frozen_paths(&state).unwrap(),
            vec![t.path().join("store").join("a")]
        );
    }

    #[test]
    fn a_name_that_is_not_one_segment_is_corrupt() {
        let t = tempfile::tempdir().unwrap();
        let (state, _) = SafeDir::create(&t.path().join("s"), Role::State, 0o700).unwrap();
        state
            .replace_file(STACK_FILE, br#"{"store":"/x","layers":["../up"]}"#)
            .unwrap();
        assert!(matches!(read(&state), Err(StackError::Corrupt { .. })));
    }

    #[test]
    fn users_count_holds_and_bases() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open(&t.path().join("store"), true).unwrap();
        let (state, _) = SafeDir::create(&t.path().join("s"), Role::State, 0o700).unwrap();
        for (name, below) in [("a", vec![]), ("b", vec!["a".to_string()])] {
            store.dir.mkdir(name, 0o755).unwrap();
            store
                .write_record(&Record {
                    name: name.into(),
                    below,
                    lowers: vec![],
                    created: 0,
                    upper: PathBuf::from("/u"),
                    squashed: Vec::new(),
                })
                .unwrap();
        }
        assert_eq!(store.users("a", None).unwrap(), vec!["checkpoint b"]);
        assert!(store.users("b", None).unwrap().is_empty());
        write(
            &state,
            &Stack {
                store: store.path().to_path_buf(),
                layers: vec!["b".into(), "a".into()],
                pending_undo: None,
                repeats: 0,
            },
        )
        .unwrap();
        store.hold("b", &state).unwrap();
        assert_eq!(store.users("b", None).unwrap().len(), 1);
        assert!(store.users("b", Some(&state)).unwrap().is_empty());
        // A workspace that no longer stacks on it: the hold is stale.
        write(
            &state,
            &Stack {
                store: store.path().to_path_buf(),
                layers: vec!["a".into()],
                pending_undo: None,
                repeats: 0,
            },
        )
        .unwrap();
        assert!(store.users("b", None).unwrap().is_empty());
        store.remove("b").unwrap();
        assert!(!store.taken("b"));
    }
}
