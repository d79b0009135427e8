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

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::OnceLock;

pub const ENV: &str = "LAYERFS_FAILPOINT";

struct Failpoint {
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
        match (parts.next(), parts.next(), parts.next()) {
            (Some(b"panic"), Some(op), Some(name)) if !name.is_empty() => {
                let op = String::from_utf8_lossy(op).into_owned();
                let name = OsStr::from_bytes(name).to_os_string();
                tracing::warn!("{ENV}: failpoint armed: {op} of {name:?} will panic");
                Some(Failpoint { op, name })
            }
            _ => {
                tracing::warn!("{ENV}={raw:?} ignored: expected panic:OP:NAME");
                None
            }
        }
    });
}

/// Panics if the failpoint for `op` on `name` is armed.
pub fn hit(op: &str, name: &OsStr) {
    if let Some(Some(fp)) = ARMED.get() {
        if fp.op == op && fp.name == name {
            panic!("failpoint {op}:{name:?} hit ({ENV})");
        }
    }
}
