//! Why a layer root cannot be opened: which layer (its role and path),
//! which step failed and the system's reason. The text is what a mount,
//! the tools and the state commands print when a layer is refused.

use std::io;
use std::path::PathBuf;

/// A layer root (upper, lower, checkpoint layer) that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// A call on the root failed (`doing`: "open", "stat").
    #[error("cannot {doing} {what} {}: {source}", path.display())]
    Io {
        doing: &'static str,
        /// The layer's role: "upper dir", "lower dir #2", ...
        what: String,
        path: PathBuf,
        source: io::Error,
    },
    /// `statfs` of the root failed while probing its filesystem.
    #[error("cannot statfs {what} {}: {source}", path.display())]
    Statfs {
        what: String,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{what} {} is not a directory", path.display())]
    NotADirectory { what: String, path: PathBuf },
    /// The kernel cannot reach beneath a root the only way layerfs does.
    #[error(
        "{what} {}: the kernel has no openat2 with RESOLVE_BENEATH ({source}); layerfs \
         reaches its layers only that way and needs Linux 5.6 or later",
        path.display()
    )]
    NoOpenat2 {
        what: String,
        path: PathBuf,
        source: io::Error,
    },
    /// Its filesystem gives different files one inode number.
    #[error(
        "{what} {} ({fstype}) gives different files the same inode number {ino} \
         ({} and {}); layerfs tells files apart by inode number: mount that \
         filesystem with real inode numbers (e.g. sshfs -o use_ino, cifs -o serverino)",
        path.display(),
        names[0],
        names[1]
    )]
    SharedInodes {
        what: String,
        path: PathBuf,
        fstype: String,
        ino: u64,
        /// Two of the names that share it.
        names: Box<[String; 2]>,
    },
    /// A call on the root failed with a transport error: the network
    /// filesystem's server is gone.
    #[error("{0}: its network filesystem does not reach its server; mount once it is back")]
    Unreachable(#[source] Box<LayerError>),
}

impl LayerError {
    /// A call `doing` on the root of `what` at `path` failed.
    pub fn io(doing: &'static str, what: &str, path: &std::path::Path, source: io::Error) -> Self {
        LayerError::Io {
            doing,
            what: what.to_string(),
            path: path.to_path_buf(),
            source,
        }
    }

    /// Whether a call on the root failed with a transport error.
    pub(super) fn is_transport(&self) -> bool {
        match self {
            LayerError::Io { source, .. } => source
                .raw_os_error()
                .is_some_and(super::reach::is_transport),
            _ => false,
        }
    }
}
