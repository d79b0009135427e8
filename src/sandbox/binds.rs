//! Host paths bound into the sandbox (`--bind`, `--ro-bind`, `--home DIR`)
//! and the private home directory.
//!
//! `layerfs run` checks each host path as the caller (`run::binds`) and
//! records the device and inode it checked; the sandbox's init clones the
//! path and binds it only if the clone's root is that same object, so a
//! path renamed or replaced by a link between the check and the bind is
//! refused rather than bound. Read-only binds are read-only, `nosuid` and
//! `nodev` with every mount below them; writable ones `nosuid` and
//! `nodev`.

use std::ffi::OsString;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::places::{Kind, PlaceError, Places};
use super::sys::SysError;
use super::sys::{self, At};

/// Where the command's home directory is in the sandbox, unless
/// `--home host`: the same path every run, so absolute paths tools record
/// in a kept home (`--home DIR`) stay valid.
pub const HOME: &str = "/home/sandbox";

/// Why a checked host path cannot be bound into the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// `layerfs __sandbox --bind` given the wrong number of values.
    #[error("--bind takes 3 values, got {0}")]
    Values(usize),
    /// `layerfs __sandbox --bind`'s first value is not `rw|ro:DEV:INO`.
    #[error("--bind {0:?}: expected rw|ro:DEV:INO")]
    Id(OsString),
    /// Cloning the host path, or setting its flags.
    #[error("binding {}: {source}", from.display())]
    Clone { from: PathBuf, source: SysError },
    /// The host path is no longer the object `layerfs run` checked.
    #[error("refusing to bind {}: it was replaced after it was checked", from.display())]
    Replaced { from: PathBuf },
    /// No place for the bind at `to` in the sandbox.
    #[error("binding {} at {}: {source}", from.display(), to.display())]
    Place {
        from: PathBuf,
        to: PathBuf,
        source: PlaceError,
    },
    /// Attaching the clone at its place `to`.
    #[error("binding {} at {}: {source}", from.display(), to.display())]
    Attach {
        from: PathBuf,
        to: PathBuf,
        source: std::io::Error,
    },
    /// No place for the private home at `HOME`.
    #[error(transparent)]
    HomePlace(PlaceError),
    #[error("mounting the private {HOME}: {0}")]
    Home(#[source] std::io::Error),
}

/// One checked bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub writable: bool,
    /// The checked object: its device and inode.
    pub dev: u64,
    pub ino: u64,
    /// Absolute, resolved host path.
    pub from: PathBuf,
    /// Absolute path in the sandbox (checked by `places::check`).
    pub to: PathBuf,
}

impl Bind {
    /// The three values of `layerfs __sandbox --bind`.
    pub fn to_args(&self) -> [OsString; 3] {
        let mode = if self.writable { "rw" } else { "ro" };
        [
            format!("{mode}:{}:{}", self.dev, self.ino).into(),
            self.from.clone().into_os_string(),
            self.to.clone().into_os_string(),
        ]
    }

    /// Reads `to_args`'s values back.
    pub fn from_args(v: &[OsString]) -> Result<Bind, BindError> {
        let [id, from, to] = v else {
            return Err(BindError::Values(v.len()));
        };
        let bad = || BindError::Id(id.clone());
        let id = std::str::from_utf8(id.as_bytes()).map_err(|_| bad())?;
        let mut parts = id.split(':');
        let writable = match parts.next() {
            Some("rw") => true,
            Some("ro") => false,
            _ => return Err(bad()),
        };
        let mut num = || -> Result<u64, BindError> {
            parts.next().and_then(|n| n.parse().ok()).ok_or_else(bad)
        };
        Ok(Bind {
            writable,
            dev: num()?,
            ino: num()?,
            from: PathBuf::from(from),
            to: PathBuf::from(to),
        })
    }
}

/// A clone of `b.from`, refused unless its root is the object `layerfs
/// run` checked; with whether it is a directory.
pub fn clone_checked(b: &Bind) -> Result<(OwnedFd, bool), BindError> {
    let failed = |e: SysError| BindError::Clone {
        from: b.from.clone(),
        source: e,
    };
    let tree = sys::clone_tree(&b.from).map_err(|e| failed(e.into()))?;
    let st = nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(&tree))
        .map_err(|e| failed(e.into()))?;
    if (st.st_dev, st.st_ino) != (b.dev, b.ino) {
        return Err(BindError::Replaced {
            from: b.from.clone(),
        });
    }
    let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
    Ok((tree, is_dir))
}

/// Binds each of `binds` under the new root at `stage`, shallowest target
/// first (so a bind inside another's target lands on it).
pub fn attach(stage: &Path, places: &mut Places, binds: &[Bind]) -> Result<(), BindError> {
    let mut order: Vec<&Bind> = binds.iter().collect();
    order.sort_by_key(|b| b.to.components().count());
    for b in order {
        let (tree, is_dir) = clone_checked(b)?;
        let mut flags = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
        if !b.writable {
            flags |= libc::MOUNT_ATTR_RDONLY;
        }
        sys::set_mount_attr(At::Fd(tree.as_fd()), true, flags, 0).map_err(|e| {
            BindError::Clone {
                from: b.from.clone(),
                source: e.into(),
            }
        })?;
        let kind = if is_dir { Kind::Dir } else { Kind::File };
        let target = places
            .ensure(stage, &b.to, kind)
            .map_err(|source| BindError::Place {
                from: b.from.clone(),
                to: b.to.clone(),
                source,
            })?;
        sys::attach(tree.as_fd(), &target).map_err(|source| BindError::Attach {
            from: b.from.clone(),
            to: b.to.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Attaches the private home directory `dir` (a detached clone of a
/// directory of the sandbox's tmpfs) at `HOME`.
pub fn attach_private_home(
    stage: &Path,
    places: &mut Places,
    dir: OwnedFd,
) -> Result<(), BindError> {
    let target = places
        .ensure(stage, Path::new(HOME), Kind::Dir)
        .map_err(BindError::HomePlace)?;
    sys::attach(dir.as_fd(), &target).map_err(BindError::Home)
}

/// The device and inode of `path` (followed).
pub fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_round_trip_through_arguments() {
        let b = Bind {
            writable: true,
            dev: 2049,
            ino: 77,
            from: PathBuf::from("/var/cache/a:b"),
            to: PathBuf::from("/cache"),
        };
        assert_eq!(Bind::from_args(&b.to_args()).unwrap(), b);
        let bad: Vec<OsString> = vec!["rx:1:2".into(), "/a".into(), "/b".into()];
        assert!(Bind::from_args(&bad).is_err());
    }

    /// Needs root (a detached `open_tree` clone), which the test suite is.
    #[test]
    fn a_path_replaced_after_its_check_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        let (dev, ino) = identity(&a).unwrap();
        let bind = Bind {
            writable: false,
            dev,
            ino,
            from: a.clone(),
            to: PathBuf::from("/in"),
        };
        assert!(clone_checked(&bind).is_ok());
        fs::remove_dir(&a).unwrap();
        fs::rename(&b, &a).unwrap();
        let e = clone_checked(&bind).unwrap_err().to_string();
        assert!(e.contains("replaced after it was checked"), "{e}");
    }
}
