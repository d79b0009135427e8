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

/// The normalized relative form of `cwd` (`.` and inner `..` folded), or
/// why it leaves the workspace.
pub fn check(cwd: &Path) -> Result<PathBuf, String> {
    let mut out: Vec<&std::ffi::OsStr> = Vec::new();
    for c in cwd.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                if out.pop().is_none() {
                    return Err(format!(
                        "--cwd {} leaves the workspace (its `..` climbs above the workspace \
                         root); give a directory relative to the workspace root, e.g. \
                         --cwd src",
                        cwd.display()
                    ));
                }
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "--cwd {} is an absolute path; give a directory relative to the workspace \
                     root, e.g. --cwd src",
                    cwd.display()
                ))
            }
        }
    }
    Ok(out.iter().collect())
}

/// Makes `root/rel` the working directory, refusing a path that leaves
/// `root` through a symlink. The error is for the user.
pub fn enter(root: &Path, rel: &Path) -> Result<(), String> {
    let root_dir = File::open(root)
        .map_err(|e| format!("cannot open the workspace {}: {e}", root.display()))?;
    let target = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let fd = sys::open_dir_beneath(root_dir.as_fd(), target).map_err(|e| {
        let shown = rel.display();
        match e.raw_os_error() {
            Some(libc::EXDEV) | Some(libc::ELOOP) => format!(
                "--cwd {shown} leaves the workspace through a symlink; give a directory inside it"
            ),
            Some(libc::ENOENT) => format!("--cwd {shown}: no such directory in the workspace"),
            Some(libc::ENOTDIR) => format!("--cwd {shown} is not a directory in the workspace"),
            _ => format!("--cwd {shown}: {e}"),
        }
    })?;
    nix::unistd::fchdir(fd.as_raw_fd()).map_err(|e| format!("--cwd {}: {e}", rel.display()))
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
            let e = check(Path::new(bad)).unwrap_err();
            assert!(e.contains("--cwd"), "{bad}: {e}");
        }
    }
}
