//! Workspace state beside the upper: the state directory and its
//! `workspace.json`, the control protocol's client, and the change journal.
//! The daemon's side of the control socket lives in `daemon::control`.

pub mod control;
pub mod journal;
pub mod workspace;
pub mod snapshot;
pub mod snapshot_id;
