//! Workspace-relative paths, checked before anything is touched: the one
//! place the tools decide what a caller's path means.
//!
//! A path names an entry of the workspace's union view. A leading `/` is
//! the workspace root (so `/src/a.rs` and `src/a.rs` are the same entry);
//! `.` segments and repeated slashes are dropped. Refused: a `..`
//! segment, a NUL byte, a name longer than `NAME_MAX`. The result has no
//! `.`, `..` or empty segment, so walking it name by name from the root
//! can never leave the workspace (symlinks are not followed either: see
//! `store`).

use std::fmt;

use super::error::{ToolError, What};

/// The longest name a layer's filesystem takes.
const NAME_MAX: usize = 255;

/// A checked workspace-relative path; empty for the root.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelPath(String);

impl RelPath {
    /// Checks `raw` (see the module comment); the error names the path
    /// and the rule it broke.
    pub fn parse(raw: &str) -> Result<RelPath, ToolError> {
        let bad = |why: &'static str| ToolError::new(raw, What::BadPath(why));
        if raw.contains('\0') {
            return Err(bad("a path may not contain a NUL byte"));
        }
        let mut segs = Vec::new();
        for seg in raw.split('/') {
            match seg {
                "" | "." => {}
                ".." => {
                    return Err(bad(
                        "`..` is refused: paths are relative to the workspace root",
                    ))
                }
                s if s.len() > NAME_MAX => return Err(bad("a name is longer than 255 bytes")),
                s => segs.push(s),
            }
        }
        Ok(RelPath(segs.join("/")))
    }

    /// The root of the workspace.
    pub fn root() -> RelPath {
        RelPath(String::new())
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The path as the policy and the journal spell it (no leading `/`;
    /// empty for the root).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its names, root first.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|s| !s.is_empty())
    }

    /// The parent and the last name; `None` for the root.
    pub fn split_last(&self) -> Option<(RelPath, &str)> {
        if self.is_root() {
            return None;
        }
        Some(match self.0.rsplit_once('/') {
            Some((dir, name)) => (RelPath(dir.to_string()), name),
            None => (RelPath::root(), self.0.as_str()),
        })
    }

    /// `name` inside this directory (`name` is one entry name, as a
    /// listing gives it: no `/`, never `.` or `..`).
    pub fn join(&self, name: &str) -> RelPath {
        debug_assert!(!name.contains('/') && name != ".." && name != ".");
        if self.is_root() {
            RelPath(name.to_string())
        } else {
            RelPath(format!("{}/{name}", self.0))
        }
    }

    /// Whether `self` is `other` or beneath it.
    pub fn within(&self, other: &RelPath) -> bool {
        other.is_root()
            || self.0 == other.0
            || (self.0.starts_with(&other.0) && self.0.as_bytes().get(other.0.len()) == Some(&b'/'))
    }
}

impl fmt::Display for RelPath {
    /// `/` for the root, else the relative path.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_root() {
            f.write_str("/")
        } else {
            f.write_str(&self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_slash_is_the_root_and_dots_go() {
        assert_eq!(RelPath::parse("/a/./b//c").unwrap().as_str(), "a/b/c");
        assert_eq!(RelPath::parse("a/b").unwrap().as_str(), "a/b");
        assert!(RelPath::parse("/").unwrap().is_root());
        assert!(RelPath::parse("").unwrap().is_root());
        assert!(RelPath::parse(".").unwrap().is_root());
    }

    #[test]
    fn dotdot_nul_and_long_names_are_refused_naming_the_rule() {
        for bad in ["..", "a/../b", "/..", "a/..", "a\0b"] {
            let e = RelPath::parse(bad).unwrap_err();
            assert!(matches!(e.what, What::BadPath(_)), "{bad}: {e}");
            assert_eq!(e.path, bad);
        }
        let long = "x".repeat(256);
        assert!(RelPath::parse(&long).is_err());
        assert!(RelPath::parse(&"x".repeat(255)).is_ok());
        // A name that merely contains dots is a name.
        assert_eq!(RelPath::parse("a..b/...").unwrap().as_str(), "a..b/...");
    }

    #[test]
    fn split_join_and_within() {
        let p = RelPath::parse("a/b/c").unwrap();
        let (dir, name) = p.split_last().unwrap();
        assert_eq!((dir.as_str(), name), ("a/b", "c"));
        assert_eq!(dir.join(name), p);
        assert!(p.within(&RelPath::parse("a").unwrap()));
        assert!(!RelPath::parse("ab")
            .unwrap()
            .within(&RelPath::parse("a").unwrap()));
        assert!(p.within(&RelPath::root()));
    }
}
