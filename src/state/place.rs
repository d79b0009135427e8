//! Where a workspace's state lives, recorded on its upper and on its
//! mountpoint, so a state command given either finds the state dir
//! whatever `--state` (or `--instance`) placed it, mounted or not.
//!
//! The record is an xattr in the overlay's private namespace
//! (`trusted.overlay.layerfs.state` written by root,
//! `user.overlay.layerfs.state` by others) on the directory itself:
//! - the upper stays a plain overlay tree (no file in it), and the mount
//!   neither shows nor lets anyone set a private name (`overlay::guard`),
//!   so nothing inside the workspace can change where its state is;
//! - it travels with the directory when it is copied with its xattrs
//!   (`cp -a`, `rsync -aX`, `tar --xattrs`); the path is stored relative
//!   to the directory's parent when the state dir lies under it (the
//!   `--instance` layout, `USER/{upper,state}`, and the default
//!   `.UPPER.layerfs-state`), so a copy of the whole workspace directory
//!   still points at its own copy of the state;
//! - it is only a hint: whoever owns the directory can write it, so a
//!   state dir it names is used only if that state dir's `workspace.json`
//!   names this very directory as its upper or its mountpoint
//!   (`Workspace::resolve`), and `check_owner` then holds as for any state
//!   dir. A forged record can point only at the state of this workspace.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::layer::ops::PRIVATE_PREFIXES;
use crate::layer::sys;

/// The record's name after the private prefix.
pub const STATE_XATTR: &str = "layerfs.state";

/// The full name this process writes: `trusted.` as root (the only
/// spelling root commands read first), `user.` otherwise.
fn own_name() -> CString {
    let prefix = if nix::unistd::geteuid().is_root() {
        PRIVATE_PREFIXES[0]
    } else {
        PRIVATE_PREFIXES[1]
    };
    CString::new(format!("{prefix}{STATE_XATTR}")).expect("no NUL in the name")
}

fn open_dir(dir: &Path) -> std::io::Result<std::fs::File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
}

/// The record's value for `state` seen from `dir`: relative to `dir`'s
/// parent when under it, else absolute.
fn value_for(dir: &Path, state: &Path) -> PathBuf {
    dir.parent()
        .and_then(|p| state.strip_prefix(p).ok())
        .filter(|r| !r.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| state.to_path_buf())
}

/// Records on `dir` (an upper or a mountpoint, absolute) that its
/// workspace's state is `state` (absolute).
pub fn record(dir: &Path, state: &Path) -> std::io::Result<()> {
    let f = open_dir(dir)?;
    let value = value_for(dir, state);
    let old = sys::getxattr(&f, &own_name()).ok();
    if old.as_deref() == Some(value.as_os_str().as_bytes()) {
        return Ok(());
    }
    sys::setxattr(&f, &own_name(), value.as_os_str().as_bytes(), 0)
}

/// The state dir recorded on `dir` (absolute), if any: the `trusted.`
/// record first, then the `user.` one.
pub fn recorded(dir: &Path) -> Option<PathBuf> {
    let f = open_dir(dir).ok()?;
    PRIVATE_PREFIXES.iter().find_map(|p| {
        let name = CString::new(format!("{p}{STATE_XATTR}")).ok()?;
        let v = sys::getxattr(&f, &name).ok()?;
        let rel = PathBuf::from(std::ffi::OsStr::from_bytes(&v));
        if rel.as_os_str().is_empty() {
            return None;
        }
        Some(match dir.parent() {
            Some(parent) if rel.is_relative() => parent.join(rel),
            _ => rel,
        })
    })
}

/// Whether `name` (a full xattr name) is the record: it describes where
/// the workspace lives, not what it holds, so snapshots leave it out.
pub fn is_record(name: &[u8]) -> bool {
    PRIVATE_PREFIXES
        .iter()
        .any(|p| name.strip_prefix(p.as_bytes()) == Some(STATE_XATTR.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_relative_under_the_parent_else_absolute() {
        let v = |d: &str, s: &str| value_for(Path::new(d), Path::new(s));
        assert_eq!(v("/v/alice/upper", "/v/alice/state"), Path::new("state"));
        assert_eq!(
            v("/v/alice/upper", "/v/alice/.upper.layerfs-state"),
            Path::new(".upper.layerfs-state")
        );
        assert_eq!(
            v("/run/alice/mnt", "/v/alice/state"),
            Path::new("/v/alice/state")
        );
    }

    #[test]
    fn a_record_round_trips_and_follows_a_copied_parent() {
        let t = tempfile::tempdir().unwrap();
        let upper = t.path().join("upper");
        std::fs::create_dir(&upper).unwrap();
        assert_eq!(recorded(&upper), None);
        record(&upper, &t.path().join("state")).unwrap();
        assert_eq!(recorded(&upper), Some(t.path().join("state")));
        assert!(is_record(b"user.overlay.layerfs.state"));
        assert!(!is_record(b"user.overlay.layerfs.origin"));
    }
}
