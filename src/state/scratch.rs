//! Scratch paths: globs (`--scratch GLOB` on mount, `scratch GLOB` policy
//! lines) naming paths whose contents are disposable. `diff` and snapshots
//! leave them out; `layerfs gc` empties them.
//!
//! Patterns are checked and compiled by `policy::pattern` (the one pattern
//! language): a path is scratch when it or one of its ancestors matches.

/// The compiled scratch globs of a workspace: a path is scratch when it or
/// one of its ancestors matches (the policy's pattern language).
pub type Scratch = crate::policy::pattern::PathSet;

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
