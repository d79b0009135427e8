//! The command's working directory: `--cwd SUBDIR`, relative to the
//! workspace root and never outside it.
//!
//! Checked twice: by its spelling before anything is mounted (an absolute
//! path or a `..` that climbs above the root is a usage error at once),
//! then inside the sandbox by opening it with `openat2(RESOLVE_BENEATH)`,
//! which also refuses a symlink in the workspace that points outside.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Component, Path, PathBuf};

use super::sys;

/// Why `--cwd` cannot be the command's working directory.
#[derive(Debug, thiserror::Error)]
pub enum CwdError {
    #[error(
        "--cwd {} leaves the workspace (its `..` climbs above the workspace root); give a \
         directory relative to the workspace root, e.g. --cwd src",
        .0.display()
    )]
    ClimbsOut(PathBuf),
    #[error(
        "--cwd {} is an absolute path; give a directory relative to the workspace root, e.g. \
         --cwd src",
        .0.display()
    )]
    Absolute(PathBuf),
    #[error("cannot open the workspace {}: {source}", root.display())]
    OpenWorkspace {
        root: PathBuf,
        source: std::io::Error,
    },
    #[error("--cwd {} leaves the workspace through a symlink; give a directory inside it", .0.display())]
    ThroughSymlink(PathBuf),
    #[error("--cwd {}: no such directory in the workspace", .0.display())]
    Missing(PathBuf),
    #[error("--cwd {} is not a directory in the workspace", .0.display())]
    NotDir(PathBuf),
    #[error("--cwd {}: {source}", cwd.display())]
    Other {
        cwd: PathBuf,
        source: std::io::Error,
    },
    #[error("--cwd {}: {source}", cwd.display())]
    Chdir { cwd: PathBuf, source: nix::Error },
}

/// The normalized relative form of `cwd` (`.` and inner `..` folded), or
/// why it leaves the workspace.
pub fn check(cwd: &Path) -> Result<PathBuf, CwdError> {
    let mut out: Vec<&std::ffi::OsStr> = Vec::new();
    for c in cwd.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                if out.pop().is_none() {
                    return Err(CwdError::ClimbsOut(cwd.to_path_buf()));
                }
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(CwdError::Absolute(cwd.to_path_buf()))
            }
        }
    }
    Ok(out.iter().collect())
}

/// Makes `root/rel` the working directory, refusing a path that leaves
/// `root` through a symlink. The error is for the user.
pub fn enter(root: &Path, rel: &Path) -> Result<(), CwdError> {
    let root_dir = File::open(root).map_err(|source| CwdError::OpenWorkspace {
        root: root.to_path_buf(),
        source,
    })?;
    let target = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let fd = sys::open_dir_beneath(root_dir.as_fd(), target).map_err(|e| {
        let cwd = rel.to_path_buf();
        match e.raw_os_error() {
            Some(libc::EXDEV) | Some(libc::ELOOP) => CwdError::ThroughSymlink(cwd),
            Some(libc::ENOENT) => CwdError::Missing(cwd),
            Some(libc::ENOTDIR) => CwdError::NotDir(cwd),
            _ => CwdError::Other { cwd, source: e },
        }
    })?;
    nix::unistd::fchdir(fd.as_raw_fd()).map_err(|source| CwdError::Chdir {
        cwd: rel.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_fold_and_escapes_are_refused() {
        assert_eq!(check(Path::new("")).unwrap(), PathBuf::new());
        assert_eq!(check(Path::new(".")).unwrap(), PathBuf::new());
        assert_eq!(
            check(Path::new("src/./a/../b")).unwrap(),
            PathBuf::from("src/b")
        );
        assert_eq!(check(Path::new("a/..")).unwrap(), PathBuf::new());
        for bad in ["..", "../x", "a/../../x", "/etc", "/"] {
            let e = check(Path::new(bad)).unwrap_err().to_string();
            assert!(e.contains("--cwd"), "{bad}: {e}");
        }
    }
}
