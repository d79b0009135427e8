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
pub fn of_workspace(ws: &super::workspace::Workspace) -> Result<Scratch, ScratchError> {
    let mut patterns = ws.scratch.clone();
    // `ws.policy` comes from workspace.json, read through the checked
    // state dir (`Workspace::resolve`).
    if let Some(p) = &ws.policy {
        let policy = crate::policy::Policy::load(p)?;
        patterns.extend(policy.scratch().iter().cloned());
    }
    Ok(Scratch::new(&patterns)?)
}

/// Why a workspace's scratch paths could not be known. The text is the
/// policy's own message (which names the file, line and pattern).
#[derive(Debug, thiserror::Error)]
pub enum ScratchError {
    /// The policy file named in workspace.json cannot be read or parsed.
    #[error(transparent)]
    Policy(#[from] crate::policy::LoadError),
    /// A `--scratch` glob or `scratch` line is not a valid pattern.
    #[error(transparent)]
    Pattern(#[from] crate::policy::pattern::PatternError),
}
