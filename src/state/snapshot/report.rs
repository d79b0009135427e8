//! What a restore leaves out or changes under the workspace's policy:
//! the `Report`, and the verdict on each xattr.

use std::path::{Path, PathBuf};

use super::{SnapshotError, MAX_LISTED};
use crate::layer::ops::{self, PRIVATE_PREFIXES};
use crate::overlay::origin::{Origin, MOVED_IN_VALUE, MOVED_IN_XATTR, ORIGIN_XATTR};
use crate::policy::Policy;

/// What a restore left out of the archive or changed, by name: everything
/// the workspace's policy (or the restoring user's rights) did not let
/// through as the archive had it.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The first `MAX_LISTED` changes, in archive order.
    pub changes: Vec<Change>,
    /// Every change, counted by kind.
    pub counts: std::collections::BTreeMap<&'static str, u64>,
}

/// One change: the entry's path in the archive, what happened
/// (`device-skipped`, `suid-stripped`, `xattr-dropped`, `owner-kept`,
/// `symlink-skipped`, `link-skipped`, `root-kept`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: PathBuf,
    pub kind: &'static str,
    pub detail: String,
}

impl Report {
    pub(super) fn add(&mut self, path: &Path, kind: &'static str, detail: String) {
        *self.counts.entry(kind).or_default() += 1;
        if self.changes.len() < MAX_LISTED {
            self.changes.push(Change {
                path: path.to_path_buf(),
                kind,
                detail,
            });
        }
    }

    /// Whether nothing was left out or changed.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Changes counted but not listed.
    pub fn omitted(&self) -> u64 {
        self.counts.values().sum::<u64>() - self.changes.len() as u64
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "changes": self.changes.iter().map(|c| serde_json::json!({
                "path": c.path.to_string_lossy(),
                "change": c.kind,
                "detail": c.detail,
            })).collect::<Vec<_>>(),
            "counts": self.counts,
            "omitted": self.omitted(),
        })
    }

    /// Lines for the terminal: at most `max` changes (paths quoted with
    /// control characters escaped), then what was left unlisted.
    pub fn lines(&self, max: usize) -> Vec<String> {
        let mut out: Vec<String> = self
            .changes
            .iter()
            .take(max)
            .map(|c| {
                let p = if c.path.as_os_str().is_empty() {
                    "./".to_string()
                } else {
                    format!("{:?}", c.path.to_string_lossy())
                };
                format!("{}: {p}: {}", c.kind, c.detail)
            })
            .collect();
        let more = self.counts.values().sum::<u64>() - out.len() as u64;
        if more > 0 {
            let counts: Vec<String> = self
                .counts
                .iter()
                .map(|(k, n)| format!("{n} {k}"))
                .collect();
            out.push(format!(
                "… {more} more not listed (all: {}; --json lists up to {MAX_LISTED})",
                counts.join(", ")
            ));
        }
        out
    }
}

/// What kind of object an xattr sits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Dir,
    File,
    Symlink,
    /// A device node or a fifo.
    Node,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Dir => "directory",
            Kind::File => "regular file",
            Kind::Symlink => "symlink",
            Kind::Node => "device or fifo",
        }
    }
}

pub(super) fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether the xattr `name` = `value` may be restored on an object of
/// `kind` under `policy`: `Ok(name to set)` (an overlay mark is written in
/// the restoring user's spelling: `trusted.overlay.` as root, else
/// `user.overlay.`, as the mount would write it), or `Err(why not)`.
pub(super) fn xattr_verdict(
    name: &[u8],
    value: &[u8],
    kind: Kind,
    policy: &Policy,
) -> Result<Vec<u8>, SnapshotError> {
    if kind == Kind::Symlink {
        return Err("a symlink's xattrs are not restored".into());
    }
    if let Some(mark) = PRIVATE_PREFIXES
        .iter()
        .find_map(|p| name.strip_prefix(p.as_bytes()))
    {
        let valid = match mark {
            b"opaque" => kind == Kind::Dir && value == ops::OPAQUE_VALUE,
            b"redirect" => kind == Kind::Dir && ops::is_valid_redirect(value),
            m if m == MOVED_IN_XATTR.as_bytes() => kind == Kind::Dir && value == MOVED_IN_VALUE,
            m if m == ORIGIN_XATTR.as_bytes() => kind == Kind::File && Origin::is_valid(value),
            _ => {
                return Err("the overlay's private namespace holds only layerfs's own marks".into())
            }
        };
        if !valid {
            return Err(format!(
                "not a valid {} mark for a {}: the overlay writes it differently",
                String::from_utf8_lossy(mark),
                kind.name()
            )
            .into());
        }
        let prefix = if is_root() {
            PRIVATE_PREFIXES[0]
        } else {
            PRIVATE_PREFIXES[1]
        };
        let mut n = prefix.as_bytes().to_vec();
        n.extend_from_slice(mark);
        return Ok(n);
    }
    if name.starts_with(b"trusted.") {
        return Err("trusted.* xattrs are privileged and not layerfs's marks".into());
    }
    if name == b"security.capability" {
        if policy.strip_suid() {
            return Err(format!(
                "a file capability grants privilege like a setuid bit ({})",
                policy.suid_rule()
            )
            .into());
        }
        return if kind == Kind::File {
            Ok(name.to_vec())
        } else {
            Err("a capability belongs on a regular file".into())
        };
    }
    if name.starts_with(b"security.") {
        return Err("security labels are not restored".into());
    }
    if name == b"system.posix_acl_access" || name == b"system.posix_acl_default" {
        return match kind {
            Kind::Dir => Ok(name.to_vec()),
            Kind::File | Kind::Node if name == b"system.posix_acl_access" => Ok(name.to_vec()),
            _ => Err("a default ACL belongs on a directory".into()),
        };
    }
    if name.starts_with(b"user.") {
        // The kernel keeps user.* on files and directories only.
        return if matches!(kind, Kind::Dir | Kind::File) {
            Ok(name.to_vec())
        } else {
            Err("user.* xattrs belong on files and directories".into())
        };
    }
    Err("not an xattr namespace a workspace keeps".into())
}
