//! Paths of a mount configuration: made absolute without touching the
//! filesystem, canonical directories that must exist (each error naming
//! its role and flag), how two paths nest, the default work dir.

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use super::{invalid, usage, ConfigError};

/// Makes `p` absolute against the current directory and drops `.`
/// components, without touching the filesystem (works on a stale mount).
pub(super) fn absolute(p: &Path) -> Result<PathBuf, ConfigError> {
    let abs = std::path::absolute(p)
        .map_err(|e| invalid(format!("{}: cannot resolve path: {e}", p.display())))?;
    Ok(abs
        .components()
        .filter(|c| *c != Component::CurDir)
        .collect())
}

/// Canonical path of an existing directory; `what` names its role.
pub(super) fn existing_dir(p: &Path, what: &str, flag: &str) -> Result<PathBuf, ConfigError> {
    let md = fs::metadata(p).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => invalid(format!(
            "{what} {} does not exist: create it (mkdir -p {}) or fix {flag}",
            p.display(),
            p.display()
        )),
        // A network filesystem whose server is gone (or a FUSE mount whose
        // daemon died) answers ENOTCONN and the like.
        _ if e
            .raw_os_error()
            .is_some_and(crate::layer::reach::is_transport) =>
        {
            invalid(format!(
                "{what} {}: {e}: its network filesystem does not reach its server (or its \
                 FUSE daemon is gone); mount once it answers",
                p.display()
            ))
        }
        _ => invalid(format!("{what} {}: {e}", p.display())),
    })?;
    if !md.is_dir() {
        return Err(invalid(format!(
            "{what} {} is not a directory (give a directory to {flag})",
            p.display()
        )));
    }
    fs::canonicalize(p).map_err(|e| invalid(format!("{what} {}: {e}", p.display())))
}

/// Whether `inner` is `outer` or below it (both canonical).
pub(super) fn is_within(inner: &Path, outer: &Path) -> bool {
    inner.starts_with(outer)
}

/// The default work directory: a hidden sibling of the upper, so it is on
/// the same filesystem and outside the upper tree.
pub fn default_work_dir(upper: &Path) -> Result<PathBuf, ConfigError> {
    let name = upper.file_name().ok_or_else(|| {
        usage(format!(
            "upper {} has no name to derive a work dir from; give --work DIR",
            upper.display()
        ))
    })?;
    let parent = upper.parent().unwrap_or(Path::new("/"));
    Ok(parent.join(format!(".{}.layerfs-work", name.to_string_lossy())))
}
