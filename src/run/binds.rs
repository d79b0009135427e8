//! `--bind`, `--ro-bind` and `--home`: which host paths `layerfs run`
//! agrees to bind into the sandbox, checked as the caller before anything
//! is mounted. The sandbox binds each one only if it is still the object
//! checked here (`sandbox::binds`).
//!
//! Rules (one home for them):
//! - the host path must exist and be readable (and searchable, for a
//!   directory) by the caller's effective ids; a writable one also
//!   writable by them — `faccessat(AT_EACCESS)`, so the kernel answers as
//!   it would for the caller's own write;
//! - no bind may overlap (contain or lie in) the workspace's upper, work
//!   and state directories, the run's directory or the workspace
//!   mountpoint: those are hidden or reached only through the mount, and a
//!   bind would show them at another path; a writable one may not overlap
//!   a lower either (the lowers change only through the mount), nor lie in
//!   `/proc`, `/sys` or `/dev`;
//! - the sandbox path is absolute and normalized (`places::check`), not in
//!   `/run` or `/var/run` (the sandbox's private service directory), and
//!   neither in nor above the workspace's place (`--at`).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::unistd::{faccessat, AccessFlags};

use crate::sandbox::binds::{identity, Bind, HOME};
use crate::sandbox::places::{self, PlaceError};

/// Why `layerfs run` refuses a `--home`, `--bind` or `--ro-bind`: each
/// variant names the option (`what`) and the host path as given (`host`).
#[derive(Debug, thiserror::Error)]
pub enum BindArgError {
    #[error("--home needs private, host or a directory")]
    EmptyHome,
    /// The host path cannot be resolved or read.
    #[error("{what} {}: {source}", host.display())]
    Host {
        what: &'static str,
        host: PathBuf,
        source: std::io::Error,
    },
    /// The sandbox path breaks a rule of `places::check`.
    #[error(transparent)]
    Place(#[from] PlaceError),
    #[error(
        "{what} {}: {} is the sandbox's private /run; choose another path",
        host.display(),
        to.display()
    )]
    PrivateRun {
        what: &'static str,
        host: PathBuf,
        to: PathBuf,
    },
    #[error(
        "{what} {}: {} overlaps the workspace at {}; bind elsewhere (the workspace changes \
         only through its mount)",
        host.display(),
        to.display(),
        at.display()
    )]
    OverlapsWorkspace {
        what: &'static str,
        host: PathBuf,
        to: PathBuf,
        at: PathBuf,
    },
    /// It overlaps `dir`, one of the workspace's private directories.
    #[error(
        "{what} {}: overlaps the workspace's own directory {}, which the sandbox hides",
        host.display(),
        dir.display()
    )]
    OverlapsPrivate {
        what: &'static str,
        host: PathBuf,
        dir: PathBuf,
    },
    #[error(
        "{what} {}: overlaps the lower {}, which changes only through the workspace (use \
         --ro-bind to read it elsewhere)",
        host.display(),
        lower.display()
    )]
    OverlapsLower {
        what: &'static str,
        host: PathBuf,
        lower: PathBuf,
    },
    /// A writable bind under `tree` (`/proc`, `/sys`, `/dev`).
    #[error("{what} {}: {tree} cannot be bound writable", host.display())]
    KernelTree {
        what: &'static str,
        host: PathBuf,
        tree: &'static str,
    },
    /// The caller may not read (or, `writable`, write) the host path.
    #[error(
        "{what} {}: you may not {} it ({source})",
        host.display(),
        if *writable { "write" } else { "read" }
    )]
    Access {
        what: &'static str,
        host: PathBuf,
        writable: bool,
        source: nix::Error,
    },
}

/// One `--bind`/`--ro-bind` as given: `HOST[:SANDBOX]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindArg {
    pub host: PathBuf,
    /// `None`: the same path as on the host.
    pub sandbox: Option<PathBuf>,
    pub writable: bool,
}

/// What `--home` asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Home {
    /// A fresh, empty directory per run (the default).
    Private,
    /// The caller's `HOME`, unchanged (read-only like the rest of the host).
    Host,
    /// A host directory kept between runs, bound writable.
    Dir(PathBuf),
}

impl Home {
    /// Parses `--home`'s value.
    pub fn parse(s: &str) -> Result<Home, BindArgError> {
        Ok(match s {
            "private" => Home::Private,
            "host" => Home::Host,
            "" => return Err(BindArgError::EmptyHome),
            d => Home::Dir(PathBuf::from(d)),
        })
    }

    /// The `HOME` the command gets, `None` to leave the caller's.
    pub fn env(&self) -> Option<&'static str> {
        match self {
            Home::Host => None,
            Home::Private | Home::Dir(_) => Some(HOME),
        }
    }
}

/// Splits `HOST[:SANDBOX]` at its first `:` (a host path with a `:` in it
/// needs the `:SANDBOX` part).
pub fn parse(s: &OsStr) -> (PathBuf, Option<PathBuf>) {
    let b = s.as_bytes();
    match b.iter().position(|c| *c == b':') {
        Some(i) => (
            PathBuf::from(OsStr::from_bytes(&b[..i])),
            Some(PathBuf::from(OsStr::from_bytes(&b[i + 1..]))),
        ),
        None => (PathBuf::from(s), None),
    }
}

/// The paths a bind is measured against.
pub struct Fence<'a> {
    /// Hidden or mount-only: upper, work, state, run dir, mountpoint.
    pub private: &'a [PathBuf],
    pub lowers: &'a [PathBuf],
    /// Where the workspace is in the sandbox.
    pub at: &'a Path,
}

fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Checks one bind as the caller; `what` names the option for messages.
pub fn check(arg: &BindArg, fence: &Fence<'_>, what: &'static str) -> Result<Bind, BindArgError> {
    let host = || arg.host.clone();
    let io = |source| BindArgError::Host {
        what,
        host: host(),
        source,
    };
    let from = std::fs::canonicalize(&arg.host).map_err(io)?;
    let to = places::check(arg.sandbox.as_deref().unwrap_or(&from), what)?;
    if ["/run", "/var/run"].iter().any(|r| to.starts_with(r)) {
        return Err(BindArgError::PrivateRun {
            what,
            host: host(),
            to,
        });
    }
    if overlaps(&to, fence.at) {
        return Err(BindArgError::OverlapsWorkspace {
            what,
            host: host(),
            to,
            at: fence.at.to_path_buf(),
        });
    }
    let canon = |p: &PathBuf| std::fs::canonicalize(p).ok();
    if let Some(p) = fence
        .private
        .iter()
        .filter_map(canon)
        .find(|p| overlaps(&from, p))
    {
        return Err(BindArgError::OverlapsPrivate {
            what,
            host: host(),
            dir: p,
        });
    }
    if arg.writable {
        if let Some(p) = fence
            .lowers
            .iter()
            .filter_map(canon)
            .find(|p| overlaps(&from, p))
        {
            return Err(BindArgError::OverlapsLower {
                what,
                host: host(),
                lower: p,
            });
        }
        if let Some(r) = ["/proc", "/sys", "/dev"]
            .iter()
            .find(|r| from.starts_with(r))
        {
            return Err(BindArgError::KernelTree {
                what,
                host: host(),
                tree: r,
            });
        }
    }
    let meta = std::fs::metadata(&from).map_err(io)?;
    let mut need = AccessFlags::R_OK;
    if meta.is_dir() {
        need |= AccessFlags::X_OK;
    }
    if arg.writable {
        need |= AccessFlags::W_OK;
    }
    faccessat(None, &from, need, nix::fcntl::AtFlags::AT_EACCESS).map_err(|source| {
        BindArgError::Access {
            what,
            host: host(),
            writable: arg.writable,
            source,
        }
    })?;
    let (dev, ino) = identity(&from).map_err(io)?;
    Ok(Bind {
        writable: arg.writable,
        dev,
        ino,
        from,
        to,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_sandbox_split_at_the_first_colon() {
        assert_eq!(parse(OsStr::new("/a")), (PathBuf::from("/a"), None));
        assert_eq!(
            parse(OsStr::new("/a:/b:c")),
            (PathBuf::from("/a"), Some(PathBuf::from("/b:c")))
        );
    }

    #[test]
    fn home_takes_private_host_or_a_directory() {
        assert_eq!(Home::parse("private").unwrap(), Home::Private);
        assert_eq!(Home::parse("host").unwrap(), Home::Host);
        assert_eq!(
            Home::parse("/srv/h").unwrap(),
            Home::Dir(PathBuf::from("/srv/h"))
        );
        assert!(Home::parse("").is_err());
        assert_eq!(Home::Host.env(), None);
    }

    #[test]
    fn binds_overlapping_the_workspace_or_its_dirs_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let (upper, lower, cache) = (d.path().join("u"), d.path().join("l"), d.path().join("c"));
        for p in [&upper, &lower, &cache] {
            std::fs::create_dir(p).unwrap();
        }
        let private = [upper.clone()];
        let lowers = [lower.clone()];
        let fence = Fence {
            private: &private,
            lowers: &lowers,
            at: Path::new("/workspace"),
        };
        let arg = |host: &Path, to: &str, writable: bool| BindArg {
            host: host.to_path_buf(),
            sandbox: Some(PathBuf::from(to)),
            writable,
        };
        assert!(check(&arg(&cache, "/cache", true), &fence, "--bind").is_ok());
        assert!(check(&arg(&lower, "/l", false), &fence, "--ro-bind").is_ok());
        for (a, says) in [
            (arg(&lower, "/l", true), "lower"),
            (arg(&upper, "/u", false), "own directory"),
            (arg(d.path(), "/all", false), "own directory"),
            (arg(&cache, "/workspace/c", true), "overlaps the workspace"),
            (arg(&cache, "/run/c", true), "private /run"),
            (arg(&cache, "/proc/c", true), "/proc"),
            (arg(Path::new("/proc/sys"), "/ps", true), "writable"),
            (arg(&d.path().join("nope"), "/n", false), "No such file"),
        ] {
            let e = check(&a, &fence, "--bind").unwrap_err().to_string();
            assert!(e.contains(says), "{a:?}: {e}");
        }
    }
}
