//! Fd-relative access to the layers. Every access to a layer goes through a
//! file descriptor opened one component at a time beneath the layer root,
//! never following a symlink (`sys`); every change of the upper goes through
//! `ops`, so each mutation of the upper is one logged wrapper.

pub mod ops;
pub mod real;
pub mod sys;

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

/// One layer root: an `O_PATH` directory fd, its device and where it lives.
#[derive(Debug)]
pub struct Layer {
    pub root: OwnedFd,
    /// A second fd of the root, shared by every `RealFd` of this layer.
    pub mount: Arc<OwnedFd>,
    pub dev: u64,
    pub path: PathBuf,
}

impl Layer {
    /// Opens a layer root; the message names the layer and the problem.
    pub fn open(path: &std::path::Path, what: &str) -> Result<Layer, String> {
        let root = sys::open_root(path)
            .map_err(|e| format!("cannot open {what} {}: {e}", path.display()))?;
        let st =
            sys::fstat(&root).map_err(|e| format!("cannot stat {what} {}: {e}", path.display()))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(format!("{what} {} is not a directory", path.display()));
        }
        // open_by_handle_at needs a real fd (not O_PATH) on the filesystem.
        let mount = Arc::new(
            sys::open_dir(&root)
                .map_err(|e| format!("cannot open {what} {}: {e}", path.display()))?,
        );
        Ok(Layer {
            root,
            mount,
            dev: st.st_dev,
            path: path.to_path_buf(),
        })
    }
}
