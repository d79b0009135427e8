//! Fd-relative access to the layers. Every access to a layer goes through a
//! file descriptor opened one component at a time beneath the layer root,
//! never following a symlink (`sys`); every change of the upper goes through
//! `ops`, so each mutation of the upper is one logged wrapper; `ops` also
//! reads the marks of the on-disk format, and `stack` looks a path up
//! across the layers on fds for the state commands. layerfs's own
//! directories beside the layers (state, work, snapshots, a run's
//! mountpoint) are checked once and then reached the same way (`safedir`).

mod error;
pub mod fds;
pub mod netfs;
pub mod ops;
pub mod reach;
pub mod real;
pub mod root;
pub mod safedir;
pub mod stack;
#[allow(unsafe_code)]
pub mod sys;
pub mod walk;

pub use error::LayerError;

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

/// One layer root: an `O_PATH` directory fd, its device and where it lives.
#[derive(Debug)]
pub struct Layer {
    pub root: OwnedFd,
    /// A second fd of the root, shared by every `RealFd` of this layer.
    pub mount: Arc<root::Mount>,
    pub dev: u64,
    pub path: PathBuf,
    /// What its filesystem offers (network or FUSE, handles, xattrs).
    pub caps: netfs::Caps,
    /// What origin records call it, for a lower (`overlay::origin`);
    /// `None` for the upper. Set by whoever stacks it.
    pub name: Option<LayerName>,
}

/// The name origin records give a lower layer (`overlay::origin`): it
/// stays the same while layers are added above it or squashed below it,
/// where its index in the stack would not.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LayerName {
    /// A checkpoint layer, by its name in the layer store (the last
    /// segment of its path).
    Checkpoint(String),
    /// The K-th shared lower, 0 = the topmost shared one (the shared
    /// lowers never change under a workspace).
    Shared(usize),
}

impl LayerName {
    /// The names of a stack of `lowers` (paths, topmost first) whose
    /// `checkpoints` topmost ones are checkpoint layers.
    pub fn of_stack(lowers: &[PathBuf], checkpoints: usize) -> Vec<LayerName> {
        lowers
            .iter()
            .enumerate()
            .map(|(i, p)| match i.checked_sub(checkpoints) {
                Some(k) => LayerName::Shared(k),
                None => LayerName::checkpoint_at(p),
            })
            .collect()
    }

    /// The name of the checkpoint layer at `path` (in a layer store).
    pub fn checkpoint_at(path: &std::path::Path) -> LayerName {
        LayerName::Checkpoint(
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        )
    }
}

impl Layer {
    /// Opens a layer root and probes its filesystem; the message names the
    /// layer and the problem. A filesystem that fails with a transport
    /// error (its server is gone) is named as such.
    pub fn open(path: &std::path::Path, what: &str) -> Result<Layer, LayerError> {
        Self::open_inner(path, what).map_err(|e| {
            if e.is_transport() {
                LayerError::Unreachable(Box::new(e))
            } else {
                e
            }
        })
    }

    fn open_inner(path: &std::path::Path, what: &str) -> Result<Layer, LayerError> {
        let root = sys::open_root(path).map_err(|e| LayerError::io("open", what, path, e))?;
        let st = sys::fstat(&root).map_err(|e| LayerError::io("stat", what, path, e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(LayerError::NotADirectory {
                what: what.to_string(),
                path: path.to_path_buf(),
            });
        }
        // open_by_handle_at needs a real fd (not O_PATH) on the filesystem.
        let dir = sys::open_dir(&root).map_err(|e| match e.raw_os_error() {
            // The no-escape guarantee rests on openat2 (see `sys`).
            Some(libc::ENOSYS) => LayerError::NoOpenat2 {
                what: what.to_string(),
                path: path.to_path_buf(),
                source: e,
            },
            _ => LayerError::io("open", what, path, e),
        })?;
        let caps = netfs::Caps::probe(&root, &dir, path, what)?;
        Ok(Layer {
            root,
            mount: Arc::new(root::Mount {
                fd: dir,
                handles: caps.handles,
                remote: caps.remote,
            }),
            dev: st.st_dev,
            path: path.to_path_buf(),
            caps,
            name: None,
        })
    }
}
