//! What the host records about layerfs mounts and their daemons, read by
//! every command that must find a live workspace: the kernel's mount
//! table (`mounts`), the daemons' pid files (`pidfile`), and who holds an
//! upper or work dir's lock (`holder`).

pub mod holder;
pub mod mounts;
pub mod pidfile;
