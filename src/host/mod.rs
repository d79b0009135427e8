//! What the host records about layerfs mounts and their daemons, read by
//! every command that must find a live workspace: the kernel's mount
//! table (`mounts`) and the daemons' pid files (`pidfile`).

pub mod mounts;
pub mod pidfile;
