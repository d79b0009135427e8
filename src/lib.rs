//! layerfs: a copy-on-write union filesystem served over FUSE, with a path
//! policy enforced inside the filesystem.
//!
//! Dependencies point down only: `cli` → `daemon` → `fuse` (adapter) →
//! `overlay` (the union core, no FUSE types) → `layer` (fd-relative access
//! to one layer root) and `policy` (a pure decision function).

pub mod cli;
pub mod config;
pub mod daemon;
pub mod failpoint;
pub mod fuse;
pub mod layer;
pub mod overlay;
pub mod policy;
pub mod quote;
pub mod run;
pub mod sandbox;
pub mod state;
