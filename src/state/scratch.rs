//! Scratch paths: globs (`--scratch GLOB` on mount, `scratch GLOB` policy
//! lines) naming paths whose contents are disposable. `diff` and snapshots
//! leave them out; `layerfs gc` empties them (`reset::gc`).
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
    Ok(Scratch::new(&patterns)?)
}
