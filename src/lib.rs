//! layerfs: a copy-on-write union filesystem served over FUSE, with a path
//! policy enforced inside the filesystem.
//!
//! Dependencies point down only: `cli` → `daemon` → `fuse` (adapter) →
//! `overlay` (the union core, no FUSE types) → `layer` (fd-relative access
//! to one layer root) and `policy` (a pure decision function).
//!
//! `unsafe` lives in the system-call modules only, each call wrapped in a
//! safe function with its `// SAFETY:` reason: `sys` (the process:
//! forking, exec set-up, locks, inotify), `layer::sys` (reaching the
//! layers), `sandbox::sys` (building the sandbox), `fuse::sys` (backing
//! ids) and `fuse::uring` (the ring's entries point into the queue's own
//! buffers). Everything else denies `unsafe_code`.

#![deny(unsafe_code)]

pub mod cli;
pub mod config;
pub mod daemon;
pub mod failpoint;
pub mod fuse;
pub mod host;
pub mod layer;
pub mod overlay;
pub mod policy;
pub mod quote;
pub mod run;
pub mod sandbox;
pub mod serve;
pub mod state;
#[allow(unsafe_code)]
pub mod sys;
pub mod tools;

/// The workspace's file tools as a library (`tools`).
pub use tools::Workspace;
