//! The stack of frozen layers a workspace stands on, and the layer store
//! that holds them (DESIGN.md §5, "Checkpoints, forks and undo").
//!
//! This module owns the on-disk format (the store's files in `store`): a workspace's `layers.json` in its
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
//!   nothing writes through a lower, and a layer is removed only when
//!   nothing stacks on it, decided under the store's lock
//!   (`Store::remove_unused`), which each fork holds until its stack is
//!   placed (`Store::lock_for_fork`).
//! - Every file here is replaced atomically (`SafeDir::replace_file`): a
//!   reader sees the old stack or the new one.
//! - Layer names passed `snapshot_id::validate`: one safe path segment,
//!   never starting with `.` (so never a temporary name of this module).

use std::ffi::OsStr;
use std::fmt;
use std::io;
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::layer::safedir::{SafeDir, SafeDirError};

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
    write_with(state, stack, SafeDir::replace_file)
}

/// Stages a new workspace's stack (a fork's) beside its place, not yet
/// synced (`SafeDir::stage_file`): the workspace has no stack until
/// `place_new`, which makes the content durable, then runs
/// `before_rename` to make durable what must be first (the holds on its
/// layers), then renames it into place. The state dir's fsync that makes
/// the rename durable is left to the mount that follows, whose
/// `workspace.json` write (`daemon::describe`) fsyncs the same directory
/// before the mount appears; a power loss before that loses the stack
/// whole (the workspace is then no fork, its holds stale).
pub fn stage_new(state: &SafeDir, stack: &Stack) -> Result<(), StackError> {
    write_with(state, stack, SafeDir::stage_file)
}

/// The rest of `stage_new`'s write (see there).
pub fn place_new(
    state: &SafeDir,
    before_rename: impl FnOnce() -> io::Result<()>,
) -> Result<(), StackError> {
    state
        .place_staged(STACK_FILE, before_rename)
        .map_err(writing(state))
}

/// Writes the stack atomically but without waiting for the disk: for a
/// change of `repeats` only, which no view depends on (a crash may keep
/// the old count; the layers it names are the same), and for a deferred
/// checkpoint (`state::checkpoint::Durability::Deferred`), which
/// `sync_stack` makes durable after.
pub fn write_unsynced(state: &SafeDir, stack: &Stack) -> Result<(), StackError> {
    write_with(state, stack, SafeDir::replace_file_unsynced)
}

/// The stack's file written by `how` (one of `SafeDir`'s ways).
fn write_with(
    state: &SafeDir,
    stack: &Stack,
    how: impl FnOnce(&SafeDir, &str, &[u8]) -> io::Result<()>,
) -> Result<(), StackError> {
    let mut text = serde_json::to_string_pretty(&stack.to_json()).unwrap_or_default();
    text.push('\n');
    how(state, STACK_FILE, text.as_bytes()).map_err(writing(state))
}

/// The error of a failed write of the stack's file in `state`.
fn writing(state: &SafeDir) -> impl FnOnce(io::Error) -> StackError {
    io_ctx(format!(
        "cannot write {}",
        state.shown(STACK_FILE).display()
    ))
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

pub mod origins;
mod store;
pub use store::{Record, Store, StoreLock};
