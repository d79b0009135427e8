//! Workspace state beside the upper: the state directory (checked and
//! reached through its descriptor, `layer::safedir`) and its `workspace.json`,
//! the control protocol's client, the change journal, diff and its patch output, reset,
//! snapshots and scratch paths, and the state operations over them as the
//! command line and the agent tools run them (`ops`). The daemon's side of the control socket
//! lives in `daemon::control`.

pub mod checkpoint;
pub mod control;
pub mod diff;
pub mod export;
pub mod frozen;
pub mod journal;
pub mod moves;
pub mod ops;
pub mod patch;
pub mod place;
pub mod protocol;
pub mod reset;
pub mod scratch;
pub mod snapshot;
pub mod snapshot_id;
pub mod squash;
pub mod summary;
pub mod workspace;
