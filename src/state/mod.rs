//! Workspace state kept beside the upper: journal, snapshots, control.

pub mod snapshot;
pub mod snapshot_id;
pub mod workspace_standin;
