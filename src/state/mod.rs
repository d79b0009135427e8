//! Workspace state: what changed in a workspace (diff), undoing it
//! (reset), scratch paths.

pub mod diff;
pub mod reset;
pub mod scratch;
pub mod workspace;
