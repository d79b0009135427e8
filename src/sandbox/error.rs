//! The sandbox's typed errors: which step failed, on which path inside
//! the sandbox, and the system's reason. Their text is what `layerfs run`
//! prints when it cannot build the sandbox.

use std::io;
use std::path::PathBuf;

/// A step of building the sandbox's tree that failed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A mount step (`what`: "masking", "binding", "hiding", "making
    /// read-only", ...) on a path of the sandbox.
    #[error("{what} {} in the sandbox: {source}", path.display())]
    Mount {
        what: &'static str,
        path: PathBuf,
        source: SysError,
    },
    /// Listing a directory of the sandbox (its `/proc`).
    #[error("listing {} in the sandbox: {source}", path.display())]
    List { path: PathBuf, source: io::Error },
}

/// The system's reason, as the call that failed reported it.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    #[error(transparent)]
    Nix(#[from] nix::Error),
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl SandboxError {
    /// A mount step on `path` failed.
    pub fn mount(what: &'static str, path: &std::path::Path, e: impl Into<SysError>) -> Self {
        SandboxError::Mount {
            what,
            path: path.to_path_buf(),
            source: e.into(),
        }
    }
}
