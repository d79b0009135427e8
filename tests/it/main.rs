//! Integration tests: every test mounts layerfs for real through the binary
//! and drives it with ordinary syscalls and tools. One binary, a module per area.
//! (`layering` alone mounts nothing: it reads the sources to keep the
//! layering written in lib.rs true.)

mod harness;

mod agent_differential;
mod agent_fs;
mod agent_mcp;
mod archive;
mod basic;
mod checkpoint;
mod cli;
mod cluster;
mod container;
mod crash;
mod daemon;
mod deep;
mod diff;
mod differential;
mod docs;
mod fulldisk;
mod identity;
mod layering;
mod lower_passthrough;
mod manpages;
mod modes;
mod mount_helper;
mod netlower;
mod odd;
mod passthrough_replaced;
mod pjdfstest;
mod policy;
mod policy_model;
mod posix;
mod powerloss;
mod prefetch;
mod quoting;
mod readahead;
mod robust;
mod run;
mod run_binds;
mod run_limits;
mod run_places;
mod sandbox_audit;
mod shared;
mod sharing;
mod snapshot;
mod squash;
mod state;
mod stress;
mod systemd;
mod tools;
mod trust;
mod uring;
