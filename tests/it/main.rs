//! Integration tests: every test mounts layerfs for real through the binary
//! and drives it with ordinary syscalls and tools. One binary, a module per area.

mod harness;

mod basic;
mod daemon;
mod differential;
mod pjdfstest;
mod policy;
mod posix;
mod snapshot;
mod state;
mod tools;
