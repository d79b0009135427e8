//! Scratch paths: globs (`--scratch GLOB` on mount, `scratch GLOB` policy
//! lines) naming paths whose contents are disposable. `diff` and snapshots
//! leave them out; `layerfs gc` empties them.
//!
//! Pattern semantics are the policy's (gitignore-style): a pattern without
//! `/` (a trailing one aside) matches a name at any depth; one with `/` is
//! anchored at the mount root (a leading `/` is stripped); `*`, `?` and
//! `[...]` do not cross `/`; `**` as a component crosses directories. A path
//! is scratch when it or one of its ancestors matches.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

/// The compiled scratch globs of a workspace.
#[derive(Debug, Clone, Default)]
pub struct Scratch {
    patterns: Vec<String>,
    set: GlobSet,
}

/// The glob for a pattern (`**/NAME` for basename patterns), or why not.
fn glob_of(pattern: &str) -> Result<String, String> {
    if pattern.starts_with('!') {
        return Err(format!(
            "scratch pattern `{pattern}`: negation (`!`) is not supported"
        ));
    }
    let trimmed = pattern.trim_end_matches('/');
    let anchored = trimmed.contains('/');
    let body = trimmed.strip_prefix('/').unwrap_or(trimmed);
    if body.is_empty() {
        return Err(format!(
            "scratch pattern `{pattern}` is empty; expected a glob relative to the mount root, e.g. `build/**`"
        ));
    }
    if body
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(format!(
            "scratch pattern `{pattern}`: empty, `.` or `..` components are not allowed"
        ));
    }
    Ok(if anchored {
        body.to_string()
    } else {
        format!("**/{body}")
    })
}

fn build(glob: &str) -> Result<globset::Glob, String> {
    GlobBuilder::new(glob)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map_err(|e| format!("scratch pattern `{glob}`: {e}"))
}

/// Checks one pattern; the error says what is wrong with it.
pub fn validate(pattern: &str) -> Result<(), String> {
    build(&glob_of(pattern)?).map(drop)
}

impl Scratch {
    pub fn new(patterns: &[String]) -> Result<Scratch, String> {
        let mut b = GlobSetBuilder::new();
        for p in patterns {
            let g = glob_of(p)?;
            // `G/**` too: one match of a path answers for its ancestors.
            b.add(build(&g)?);
            b.add(build(&format!("{g}/**"))?);
        }
        Ok(Scratch {
            patterns: patterns.to_vec(),
            set: b.build().map_err(|e| format!("scratch patterns: {e}"))?,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// Whether `rel` (relative to the mount root, no leading `/`) is
    /// scratch: it or one of its ancestors matches a pattern.
    pub fn matches(&self, rel: &str) -> bool {
        !self.patterns.is_empty() && !rel.is_empty() && self.set.is_match(rel)
    }

    /// `matches` of a path as read from disk (names shown lossily), at no
    /// cost without patterns.
    pub fn matches_os(&self, rel: &std::ffi::OsStr) -> bool {
        !self.patterns.is_empty() && self.matches(&rel.to_string_lossy())
    }
}

/// The scratch patterns of a workspace: its `--scratch` globs and the
/// `scratch` lines of its policy file (named in `workspace.json`).
pub fn of_workspace(ws: &super::workspace::Workspace) -> Result<Scratch, String> {
    let mut patterns = ws.scratch.clone();
    // `ws.policy` comes from workspace.json, read through the checked
    // state dir (`Workspace::resolve`).
    if let Some(p) = &ws.policy {
        let policy = crate::policy::Policy::load(p)?;
        patterns.extend(policy.scratch().iter().cloned());
    }
    Scratch::new(&patterns)
}

/// Empties the scratch paths of a workspace: every topmost upper entry
/// matching a pattern is reset (removed from the upper, so the path shows
/// its shared version, or nothing). What was reset is added to `done`,
/// also when a later one fails; `reset::remove_moved_away` finishes it.
pub fn gc(
    layers: &super::diff::Layers,
    work: &std::os::fd::OwnedFd,
    scratch: &Scratch,
    done: &mut super::reset::Outcome,
) -> Result<(), String> {
    use crate::layer::walk::{entry_mode, Step, Walker};
    let mut found = Vec::new();
    if scratch.is_empty() {
        return Ok(());
    }
    let ctx = |w: &Walker, e: std::io::Error| {
        format!("cannot read upper path {}: {e}", w.path().to_string_lossy())
    };
    let mut w =
        Walker::new(&layers.upper).map_err(|e| format!("cannot read the upper root: {e}"))?;
    while let Some(step) = w.step().map_err(|e| ctx(&w, e))? {
        let Step::Entry(e) = step else { continue };
        let p = w.child_path(&e.name);
        if scratch.matches_os(&p) {
            found.push(p);
        } else if entry_mode(w.dir().map_err(|err| ctx(&w, err))?, &e)
            .map_err(|err| ctx(&w, err))?
            == libc::S_IFDIR
        {
            w.descend(&e.name).map_err(|err| ctx(&w, err))?;
        }
    }
    found.sort();
    for p in found {
        super::reset::reset_path(layers, work, &p, done)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(p: &[&str]) -> Scratch {
        Scratch::new(&p.iter().map(|x| x.to_string()).collect::<Vec<_>>()).unwrap()
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
            assert!(validate(p).is_err(), "{p:?} refused");
        }
    }
}
