//! layerfs: a copy-on-write union filesystem served over FUSE, with a path
//! policy enforced inside the filesystem.
//!
//! Dependencies point down only. The rooms, lowest first; a file may use
//! the rooms on the floors below its own, never one on its own floor or
//! above (`tests/it/layering.rs` reads this list and the sources and
//! fails on an import that points up, naming the file and the rule):
//!
//! 1. `sys`, `quote`, `failpoint`: system calls, shell quoting, fault points
//! 2. `layer`: fd-relative access to one layer root, the on-disk format
//! 3. `policy`: the path policy, a pure decision function
//! 4. `overlay`, `host`, `sandbox`: the union core (no FUSE types), the
//!    host's mounts and pid files, the sandbox's building blocks
//! 5. `state`: journal, diff, reset, snapshots, workspaces
//! 6. `config`: the validated mount configuration
//! 7. `fuse`: the FUSE adapter over the core
//! 8. `daemon`: the served mount, its control socket and signals
//! 9. `run`, `tools`: `layerfs run` workspaces; the agent file tools
//!    (`Workspace`) over the core or through a live mount
//! 10. `serve`: the tools served over the Model Context Protocol
//! 11. `cli`: the command line
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
