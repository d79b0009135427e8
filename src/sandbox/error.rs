//! The sandbox's typed errors: which step failed, on which path inside
//! the sandbox, and the system's reason. Their text is what `layerfs run`
//! prints when it cannot build the sandbox.

use std::io;
use std::path::PathBuf;

use super::binds::BindError;
use super::places::PlaceError;
use super::sys::SysError;

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
    /// Mounting a filesystem (`fs`: "a tmpfs", "devpts") on a path of the
    /// sandbox's `/dev`.
    #[error("mounting {fs} on {} in the sandbox: {source}", path.display())]
    MountOn {
        fs: &'static str,
        path: PathBuf,
        source: SysError,
    },
    /// Binding the host's device node `host` on `path`.
    #[error("mounting {} on {} in the sandbox: {source}", host.display(), path.display())]
    BindNode {
        host: PathBuf,
        path: PathBuf,
        source: nix::Error,
    },
    #[error("creating {}: {source}", path.display())]
    Create { path: PathBuf, source: io::Error },
    #[error("chmod {}: {source}", path.display())]
    Chmod { path: PathBuf, source: io::Error },
    #[error("making {} read-only: {source}", path.display())]
    ReadOnly { path: PathBuf, source: io::Error },
    /// A step of the new mount API (`step` names it and its path), which
    /// an old kernel lacks.
    #[error("{step}: {}", mount_api_reason(source))]
    MountApi { step: String, source: io::Error },
    #[error("making the sandbox's mounts private: {0}")]
    Private(#[source] nix::Error),
    #[error("keeping {} readable in the sandbox: {source}", path.display())]
    KeepReadable { path: PathBuf, source: io::Error },
    #[error("mounting /proc for the sandbox's pid namespace: {0}")]
    Proc(#[source] nix::Error),
    #[error("mounting /sys for the sandbox's network namespace: {0}")]
    Sysfs(#[source] nix::Error),
    /// The private tmpfs of `--tmp-size` (bytes).
    #[error("mounting the sandbox's private tmpfs (--tmp-size {size}): {source}")]
    Tmpfs { size: u64, source: nix::Error },
    #[error("detaching the private tmpfs from {}: {source}", stage.display())]
    DetachTmpfs { stage: PathBuf, source: nix::Error },
    #[error("cannot place the workspace at {}: {source}", at.display())]
    PlaceWorkspace { at: PathBuf, source: PlaceError },
    #[error("chdir {}: {source}", path.display())]
    Chdir { path: PathBuf, source: nix::Error },
    #[error("pivot_root into the sandbox: {0}")]
    PivotRoot(#[source] nix::Error),
    #[error("detaching the host's root: {0}")]
    DetachHostRoot(#[source] nix::Error),
    /// `--no-network`: the sandbox's loopback interface.
    #[error("bringing up loopback in the sandbox: {0}")]
    Loopback(#[source] io::Error),
    /// A place made in the tree (the private home, sealing the shadows).
    #[error(transparent)]
    Place(#[from] PlaceError),
    /// A `--bind`, `--ro-bind` or `--home` host path.
    #[error(transparent)]
    Bind(#[from] BindError),
}

/// What a failed call of the new mount API says: its error, or that the
/// kernel lacks the API altogether.
fn mount_api_reason(e: &io::Error) -> String {
    if e.raw_os_error() == Some(libc::ENOSYS) {
        "this kernel lacks the mount API the sandbox needs (open_tree, move_mount, \
         mount_setattr: Linux 5.12 or later)"
            .to_string()
    } else {
        e.to_string()
    }
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

    /// A step of the new mount API, described by `step`, failed.
    pub fn mount_api(step: impl Into<String>, source: io::Error) -> Self {
        SandboxError::MountApi {
            step: step.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_without_the_mount_api_is_named_as_such() {
        let old = SandboxError::mount_api(
            "cloning the host's mount tree",
            io::Error::from_raw_os_error(libc::ENOSYS),
        );
        assert_eq!(
            old.to_string(),
            "cloning the host's mount tree: this kernel lacks the mount API the sandbox needs \
             (open_tree, move_mount, mount_setattr: Linux 5.12 or later)"
        );
        let other =
            SandboxError::mount_api("binding tmp", io::Error::from_raw_os_error(libc::EPERM));
        let e = other.to_string();
        assert!(e.starts_with("binding tmp: "), "{e}");
        assert!(!e.contains("mount API"), "{e}");
    }
}
