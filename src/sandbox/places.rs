//! Places in the sandbox's tree for what `layerfs run` puts there — the
//! workspace at `--at` (`/workspace` by default) and the targets of
//! `--bind`/`--ro-bind` and the home directory — whether or not the host
//! has such a path.
//!
//! The host's tree is a read-only clone, so a missing directory cannot be
//! made in it, and it must not be: the host never changes. Where the
//! nearest existing parent is read-only, it is *shadowed*: a small tmpfs is
//! mounted over it, each of its entries is bound back in (a recursive clone
//! of each directory or file, symlinks copied as symlinks), and the missing
//! path is made in the tmpfs. Inside a private tmpfs already (`/tmp`, a
//! hiding tmpfs, a shadow) the directory is simply made.
//!
//! Invariant relied on: every shadow stays writable until `seal`, so later
//! places under the same parent are made in it rather than shadowing it
//! again, and `seal` runs before the pivot (as root, before the init enters
//! its locking user namespace), so the command cannot change a shadow.

use std::ffi::OsString;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::mount::{mount, MsFlags};

use super::sys::SysError;
use super::sys::{self, At};

/// What a place holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    /// An empty regular file, to bind a host file on.
    File,
}

/// Sandbox paths no place may be made at or under: the kernel's and the
/// sandbox's own trees.
const RESERVED: [&str; 3] = ["/proc", "/sys", "/dev"];

/// Checks a sandbox path by its spelling: absolute, normalized (no `.` or
/// `..`), not `/` and not under `/proc`, `/sys` or `/dev`. `what` names the
/// option for the message (e.g. `--at`).
pub fn check(path: &Path, what: &'static str) -> Result<PathBuf, PlaceError> {
    let bad = |rule| PlaceError::Spelling {
        what,
        path: path.to_path_buf(),
        rule,
    };
    if !path.is_absolute() {
        return Err(bad(Spelling::NotAbsolute));
    }
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::ParentDir | Component::Prefix(_) => {
                return Err(bad(Spelling::Dots))
            }
        }
    }
    if out == Path::new("/") {
        return Err(bad(Spelling::Root));
    }
    if let Some(r) = RESERVED.iter().find(|r| out.starts_with(r)) {
        return Err(bad(Spelling::Reserved(r)));
    }
    Ok(out)
}

/// Why a place cannot be made in the sandbox's tree.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    /// The path given for option `what` (e.g. `--at`) breaks a rule of
    /// `check`.
    #[error("{what} {}: {rule}", path.display())]
    Spelling {
        what: &'static str,
        path: PathBuf,
        rule: Spelling,
    },
    /// `path` leads through the symlink `link` (a sandbox path).
    #[error(
        "{} goes through the symlink {} inside the sandbox; give the path it leads to",
        path.display(),
        link.display()
    )]
    ThroughSymlink { path: PathBuf, link: PathBuf },
    /// `path` exists as the other kind (`is_dir`: it is a directory).
    #[error(
        "{} is {} in the sandbox",
        path.display(),
        if *is_dir { "a directory, not a file" } else { "not a directory" }
    )]
    WrongKind { path: PathBuf, is_dir: bool },
    #[error("{}: a part of it is not a directory in the sandbox", path.display())]
    NotDirOnTheWay { path: PathBuf },
    /// A shadow that is read-only although it was made writable.
    #[error("shadowing {} in the sandbox: already shadowed, yet read-only", dir.display())]
    AlreadyShadowed { dir: PathBuf },
    /// A step (`what`: "creating", "listing", "shadowing", ...) on a path
    /// of the sandbox.
    #[error("{what} {} in the sandbox: {source}", path.display())]
    Step {
        what: &'static str,
        path: PathBuf,
        source: SysError,
    },
}

/// The rule of `check` a sandbox path breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Spelling {
    #[error("give an absolute path inside the sandbox (e.g. /workspace)")]
    NotAbsolute,
    #[error("give the path without `.` or `..` components")]
    Dots,
    #[error("cannot be the sandbox's root")]
    Root,
    /// Under one of `RESERVED`.
    #[error("{0} belongs to the sandbox itself; choose another path")]
    Reserved(&'static str),
}

/// The shadows made so far, writable until `seal`.
#[derive(Default)]
pub struct Places {
    shadows: Vec<PathBuf>,
}

/// One entry of a shadowed directory, cloned before the shadow covers it.
enum Entry {
    Tree(OsString, OwnedFd, bool),
    Link(OsString, PathBuf),
}

fn err(what: &'static str, p: &Path, e: impl Into<SysError>) -> PlaceError {
    PlaceError::Step {
        what,
        path: p.to_path_buf(),
        source: e.into(),
    }
}

impl Places {
    /// Makes `path` (checked by `check`) exist under the new root at
    /// `stage` as `kind`, and returns it as a host path under `stage`. An
    /// existing path must already be of that kind; a symlink on the way is
    /// refused (give the resolved path).
    pub fn ensure(&mut self, stage: &Path, path: &Path, kind: Kind) -> Result<PathBuf, PlaceError> {
        let mut at = stage.to_path_buf();
        let parts: Vec<_> = path.components().skip(1).collect();
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let next = at.join(part);
            match fs::symlink_metadata(&next) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(PlaceError::ThroughSymlink {
                        path: path.to_path_buf(),
                        link: Path::new("/").join(next.strip_prefix(stage).unwrap_or(&next)),
                    })
                }
                Ok(m) if last => {
                    let fits = match kind {
                        Kind::Dir => m.is_dir(),
                        Kind::File => !m.is_dir(),
                    };
                    if !fits {
                        return Err(PlaceError::WrongKind {
                            path: path.to_path_buf(),
                            is_dir: m.is_dir(),
                        });
                    }
                }
                Ok(m) if !m.is_dir() => {
                    return Err(PlaceError::NotDirOnTheWay {
                        path: path.to_path_buf(),
                    })
                }
                Ok(_) => {}
                Err(_) => {
                    self.make(&at, &parts[i..], kind)?;
                    return Ok(inside(stage, path));
                }
            }
            at = next;
        }
        Ok(inside(stage, path))
    }

    /// Makes `rest` below the existing directory `parent`, shadowing
    /// `parent` first if it is read-only.
    fn make(
        &mut self,
        parent: &Path,
        rest: &[Component<'_>],
        kind: Kind,
    ) -> Result<(), PlaceError> {
        let first = parent.join(rest[0]);
        let made = match (rest.len(), kind) {
            (1, Kind::File) => fs::File::create_new(&first).map(drop),
            _ => fs::DirBuilder::new().mode(0o755).create(&first),
        };
        match made {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
                self.shadow(parent)?;
                return self.make(parent, rest, kind);
            }
            Err(e) => return Err(err("creating", &first, e)),
        }
        let mut at = first;
        for (i, part) in rest.iter().enumerate().skip(1) {
            at.push(part);
            let made = if i + 1 == rest.len() && kind == Kind::File {
                fs::File::create_new(&at).map(drop)
            } else {
                fs::DirBuilder::new().mode(0o755).create(&at)
            };
            made.map_err(|e| err("creating", &at, e))?;
        }
        Ok(())
    }

    /// Covers the read-only directory `dir` with a tmpfs showing the same
    /// entries (each bound from a clone of the original), writable until
    /// `seal`.
    fn shadow(&mut self, dir: &Path) -> Result<(), PlaceError> {
        if self.shadows.iter().any(|s| s == dir) {
            return Err(PlaceError::AlreadyShadowed {
                dir: dir.to_path_buf(),
            });
        }
        let meta = fs::metadata(dir).map_err(|e| err("reading", dir, e))?;
        let mut entries = Vec::new();
        for e in fs::read_dir(dir).map_err(|e| err("listing", dir, e))? {
            let e = e.map_err(|e| err("listing", dir, e))?;
            let (name, path) = (e.file_name(), e.path());
            let ft = e.file_type().map_err(|e| err("reading", &path, e))?;
            entries.push(if ft.is_symlink() {
                Entry::Link(
                    name,
                    fs::read_link(&path).map_err(|e| err("reading", &path, e))?,
                )
            } else {
                let tree = sys::clone_tree(&path).map_err(|e| err("cloning", &path, e))?;
                Entry::Tree(name, tree, ft.is_dir())
            });
        }
        mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(
                format!(
                    "mode={:o},size=1m,nr_inodes=4096",
                    meta.permissions().mode() & 0o7777
                )
                .as_str(),
            ),
        )
        .map_err(|e| err("shadowing", dir, e))?;
        self.shadows.push(dir.to_path_buf());
        for entry in entries {
            match entry {
                Entry::Link(name, target) => {
                    let at = dir.join(name);
                    std::os::unix::fs::symlink(&target, &at).map_err(|e| err("linking", &at, e))?;
                }
                Entry::Tree(name, tree, is_dir) => {
                    let at = dir.join(name);
                    if is_dir {
                        fs::create_dir(&at).map_err(|e| err("creating", &at, e))?;
                    } else {
                        fs::File::create(&at).map_err(|e| err("creating", &at, e))?;
                    }
                    sys::attach(tree.as_fd(), &at).map_err(|e| err("binding", &at, e))?;
                }
            }
        }
        Ok(())
    }

    /// Makes every shadow read-only (what is bound in them keeps its own
    /// flags).
    pub fn seal(self) -> Result<(), PlaceError> {
        for s in &self.shadows {
            sys::set_mount_attr(
                At::Path(s),
                false,
                libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
                0,
            )
            .map_err(|e| err("making read-only", s, e))?;
        }
        Ok(())
    }
}

/// `path` (absolute) under the new root at `stage`.
pub fn inside(stage: &Path, path: &Path) -> PathBuf {
    stage.join(path.strip_prefix("/").unwrap_or(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_absolute_normal_and_outside_the_kernels_trees() {
        assert_eq!(
            check(Path::new("/workspace"), "--at").unwrap(),
            PathBuf::from("/workspace")
        );
        assert_eq!(
            check(Path::new("/srv//proj/"), "--at").unwrap(),
            PathBuf::from("/srv/proj")
        );
        assert_eq!(
            check(Path::new("/procs"), "--at").unwrap(),
            PathBuf::from("/procs")
        );
        for bad in ["workspace", "/", "/a/../b", "/proc", "/sys/x", "/dev/shm/w"] {
            let e = check(Path::new(bad), "--at").unwrap_err().to_string();
            assert!(e.starts_with("--at "), "{bad}: {e}");
        }
    }
}
