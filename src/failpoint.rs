//! Test-only fault injection: `LAYERFS_FAILPOINT=panic:OP:NAME` in the
//! daemon's environment makes the operation `OP` panic when it reaches the
//! name `NAME`, so the tests can show what a panicking request handler
//! does to the mount (see `fuse::contain`).
//!
//! Compiled in always, so the tests exercise the very binary that ships,
//! and inert without the variable: the environment is read once at start,
//! and each hook is then one load of an empty `OnceLock`. Anyone who can
//! set the daemon's environment can already do worse than make it panic.
//! The daemon logs a warning at start when a failpoint is armed.
//!
//! Operations: `lookup` (the FUSE adapter, before any core work) and
//! `copy_up` (the core, with the object's copy-up lock held and its copy
//! half built in the work dir).
//!
//! `LAYERFS_FAILPOINT=abort:OP:STEP` ends the process at once
//! (`abort`, no unwinding, nothing flushed: what a kill -9 leaves on disk)
//! when the operation `OP` reaches the step `STEP`; the state commands
//! arm it themselves (`init`) for their crash tests: `checkpoint`,
//! `undo`, `squash` and `fork`, whose steps are named where they call
//! `crash`. Armed as `hold:OP:STEP`, such a step waits instead (as
//! below), so a test can run a second command inside its window.
//!
//! `LAYERFS_FAILPOINT=hold:copy_chunk:NAME` instead holds every copy of
//! an object named `NAME` before each chunk of its data for as long as
//! the file named by `LAYERFS_FAILPOINT_WHILE` exists, so a test can keep
//! copies provably running (the temp file in the work dir, the caller
//! waiting) and end them when it has seen what it wanted, with no clock
//! involved. The held copy still answers its halt checks
//! (`overlay::copy_up::Halt`) while it waits.
//!
//! `LAYERFS_FAILPOINT=hold:open_write:PATH` holds an open for writing (or
//! a truncation) of the mount's `PATH` once `fuse::io_mode` has let it
//! begin, before its policy check, and says so by creating
//! `LAYERFS_FAILPOINT_WHILE`'s file with `.reached` appended.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::OnceLock;

pub const ENV: &str = "LAYERFS_FAILPOINT";
/// The file whose existence keeps a `hold:` failpoint holding.
pub const WHILE: &str = "LAYERFS_FAILPOINT_WHILE";

#[derive(PartialEq)]
enum Action {
    Panic,
    Abort,
    /// Wait while this file exists.
    Hold(std::path::PathBuf),
}

struct Failpoint {
    action: Action,
    op: String,
    name: OsString,
}

static ARMED: OnceLock<Option<Failpoint>> = OnceLock::new();

/// Reads `LAYERFS_FAILPOINT` once; a value that does not parse is logged
/// and ignored.
pub fn init() {
    ARMED.get_or_init(|| {
        let raw = std::env::var_os(ENV)?;
        let mut parts = raw.as_bytes().splitn(3, |&b| b == b':');
        let action = match parts.next() {
            Some(b"panic") => Action::Panic,
            Some(b"abort") => Action::Abort,
            Some(b"hold") => match std::env::var_os(WHILE) {
                Some(p) => Action::Hold(p.into()),
                None => {
                    tracing::warn!("{ENV}={raw:?} ignored: hold needs {WHILE}");
                    return None;
                }
            },
            _ => {
                tracing::warn!("{ENV}={raw:?} ignored: expected panic:OP:NAME or hold:OP:NAME");
                return None;
            }
        };
        match (parts.next(), parts.next()) {
            (Some(op), Some(name)) if !name.is_empty() => {
                let op = String::from_utf8_lossy(op).into_owned();
                let name = OsStr::from_bytes(name).to_os_string();
                let what = match &action {
                    Action::Panic => "panic".to_string(),
                    Action::Abort => "abort the process".to_string(),
                    Action::Hold(p) => format!("wait while {} exists", p.display()),
                };
                tracing::warn!("{ENV}: failpoint armed: {op} of {name:?} will {what}");
                Some(Failpoint { action, op, name })
            }
            _ => {
                tracing::warn!("{ENV}={raw:?} ignored: expected panic:OP:NAME or hold:OP:NAME");
                None
            }
        }
    });
}

/// Panics if the failpoint for `op` on `name` is armed.
pub fn hit(op: &str, name: &OsStr) {
    if let Some(Some(fp)) = ARMED.get() {
        if fp.action == Action::Panic && fp.op == op && fp.name == name {
            panic!("failpoint {op}:{name:?} hit ({ENV})");
        }
    }
}

/// Ends the process at once (`abort`) if the failpoint for `op` at
/// `step` is armed: a crash at that step, for the crash tests. Armed as
/// `hold:OP:STEP`, the step instead waits while the `LAYERFS_FAILPOINT_WHILE`
/// file exists, so a test can run another command inside its window.
pub fn crash(op: &str, step: &str) {
    if let Some(Some(fp)) = ARMED.get() {
        if fp.op != op || fp.name != step {
            return;
        }
        match &fp.action {
            Action::Abort => std::process::abort(),
            Action::Hold(path) => {
                while path.exists() {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            Action::Panic => {}
        }
    }
}

/// Whether a `hold` failpoint for `op` is armed: an io_uring queue thread
/// hands such a request on rather than hold its whole queue.
pub fn holds(op: &str) -> bool {
    matches!(ARMED.get(), Some(Some(fp)) if fp.op == op && matches!(fp.action, Action::Hold(_)))
}

/// Waits while a `hold` failpoint for `op` is armed for the path `path()`
/// (computed only then) and its file exists. On reaching the point it
/// creates the file's sibling `FILE.reached`, so a test knows the request
/// is held there.
pub fn hold_at(op: &str, path: impl FnOnce() -> String) {
    let Some(Some(fp)) = ARMED.get() else {
        return;
    };
    let Action::Hold(gate) = &fp.action else {
        return;
    };
    if fp.op != op || fp.name != OsStr::new(&path()) {
        return;
    }
    let mut reached = gate.as_os_str().to_os_string();
    reached.push(".reached");
    let _ = std::fs::write(&reached, "");
    while gate.exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Waits while a `hold` failpoint for `op` on `name` is armed and its file
/// exists, or until `stop` returns true; returns whether `stop` ended it.
pub fn hold(op: &str, name: &OsStr, stop: impl Fn() -> bool) -> bool {
    let Some(Some(fp)) = ARMED.get() else {
        return false;
    };
    let Action::Hold(path) = &fp.action else {
        return false;
    };
    if fp.op != op || fp.name != name {
        return false;
    }
    while path.exists() {
        if stop() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}
