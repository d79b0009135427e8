//! The one pattern language of layerfs: every glob a user writes (policy
//! `hide` / `readonly` / `protect` / `scratch` lines, `--scratch` on mount)
//! is checked and compiled here, so diff, gc, snapshots and the policy
//! agree on what a pattern matches.
//!
//! Semantics (gitignore-style): a pattern without `/` (a trailing one
//! aside, which is accepted and ignored) matches a name at any depth
//! (compiled as `**/NAME`); one with `/` is anchored at the mount root (a
//! leading `/` is stripped); `*`, `?` and `[...]` do not cross `/`; `**` as
//! a whole component crosses directories; `\` escapes. A path is matched
//! by a pattern set when it or one of its ancestors matches (`PathSet`).
//! Refused: negation (`!`), empty patterns, empty, `.` and `..` components,
//! and globs globset cannot compile.

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};

pub use super::error::PatternError;

/// A checked pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    /// The glob as handed to globset (`**/NAME` for basename patterns).
    pub glob: String,
    /// The pattern without its leading and trailing `/`.
    pub body: String,
    /// Whether it is anchored at the mount root.
    pub anchored: bool,
}

impl Pattern {
    /// Checks and compiles one pattern; the error names it and says what
    /// is wrong.
    pub fn parse(pattern: &str) -> Result<Pattern, PatternError> {
        let refuse = |why: fn(String) -> PatternError| Err(why(pattern.to_string()));
        if pattern.starts_with('!') {
            return refuse(PatternError::Negation);
        }
        let trimmed = pattern.trim_end_matches('/');
        let anchored = trimmed.contains('/');
        let body = trimmed.strip_prefix('/').unwrap_or(trimmed);
        if body.is_empty() {
            return refuse(PatternError::Empty);
        }
        for component in body.split('/') {
            match component {
                "" => return refuse(PatternError::EmptySegment),
                ".." => return refuse(PatternError::DotDot),
                "." => return refuse(PatternError::Dot),
                _ => {}
            }
        }
        let glob = if anchored {
            body.to_string()
        } else {
            format!("**/{body}")
        };
        build_glob(&glob).map_err(|source| PatternError::Glob {
            pattern: pattern.to_string(),
            source,
        })?;
        Ok(Pattern {
            glob,
            body: body.to_string(),
            anchored,
        })
    }

    /// The body's components (`a/*/c` -> `a`, `*`, `c`).
    pub fn components(&self) -> Vec<&str> {
        self.body.split('/').collect()
    }
}

/// Compiles a glob with the pattern language's options (`*` stops at `/`,
/// `\` escapes).
pub fn build_glob(glob: &str) -> Result<Glob, globset::Error> {
    GlobBuilder::new(glob)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
}

/// A set of patterns matching a path when it or one of its ancestors
/// matches one of them (scratch paths: diff, gc and snapshots).
#[derive(Debug, Clone, Default)]
pub struct PathSet {
    patterns: Vec<String>,
    set: GlobSet,
}

impl PathSet {
    pub fn new(patterns: &[String]) -> Result<PathSet, PatternError> {
        let mut b = GlobSetBuilder::new();
        for p in patterns {
            let g = Pattern::parse(p)?.glob;
            // `G/**` too: one match of a path answers for its ancestors.
            for glob in [g.clone(), format!("{g}/**")] {
                b.add(build_glob(&glob).map_err(|source| PatternError::Glob {
                    pattern: p.clone(),
                    source,
                })?);
            }
        }
        Ok(PathSet {
            patterns: patterns.to_vec(),
            set: b.build().map_err(PatternError::Set)?,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// Whether `rel` (relative to the mount root, no leading `/`) or one of
    /// its ancestors matches a pattern.
    pub fn matches(&self, rel: &str) -> bool {
        !self.patterns.is_empty() && !rel.is_empty() && self.set.is_match(rel)
    }

    /// `matches` of a path as read from disk (names shown lossily), at no
    /// cost without patterns.
    pub fn matches_os(&self, rel: &std::ffi::OsStr) -> bool {
        !self.patterns.is_empty() && self.matches(&rel.to_string_lossy())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_pattern_and_the_rule() {
        let err = |p: &str| Pattern::parse(p).unwrap_err().to_string();
        assert!(err("a/../b").contains("`..`"));
        assert!(err("a/./b").contains("`.`"));
        assert!(err("a//b").contains("empty path segment"));
        assert!(err("/").contains("empty"));
        assert!(err("!x").contains("negation"));
        assert!(err("a[b").contains("bad glob `a[b`"));
        assert!(Pattern::parse("\\!x").is_ok());
    }

    #[test]
    fn a_path_or_an_ancestor_matches() {
        let s = PathSet::new(&[
            "tmp/**".into(),
            "*.log".into(),
            "/cache".into(),
            "build/".into(),
        ])
        .unwrap();
        for p in [
            "tmp/a",
            "tmp/a/b",
            "x.log",
            "a/b/c.log",
            "cache",
            "cache/x",
            "a/build/o",
        ] {
            assert!(s.matches(p), "{p}");
        }
        for p in ["tmp", "a/tmp/x", "log", "cache2", "a/cache", ""] {
            assert!(!s.matches(p), "{p}");
        }
        assert!(!PathSet::new(&[]).unwrap().matches("x"));
        assert!(PathSet::new(&["a/[".into()]).is_err());
    }

    fn s(p: &[&str]) -> PathSet {
        PathSet::new(&p.iter().map(|x| x.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn basename_anchored_and_beneath() {
        let sc = s(&["target", "/build/**", "*.o", "tmp/cache/"]);
        assert!(sc.matches("target"));
        assert!(sc.matches("a/b/target/x/y"));
        assert!(!sc.matches("targets"));
        assert!(
            !sc.matches("build"),
            "build/** matches what is beneath build only"
        );
        assert!(sc.matches("build/x"));
        assert!(!sc.matches("a/build/x"));
        assert!(sc.matches("src/m.o"));
        assert!(sc.matches("tmp/cache"));
        assert!(sc.matches("tmp/cache/f"));
        assert!(!sc.matches("tmp/cachex"));
        assert!(!sc.matches(""));
    }

    #[test]
    fn bad_patterns() {
        for p in ["", "/", "!x", "a/../b", "a//b", "[z"] {
            assert!(Pattern::parse(p).is_err(), "{p:?} refused");
        }
    }
}
