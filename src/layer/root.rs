//! A layer's root as the objects beneath it share it.

use std::os::fd::OwnedFd;

/// A readable fd of a layer root, shared by every `RealFd` of that layer
/// (for `open_by_handle_at`), and whether the layer's file handles can be
/// trusted to reopen objects the kernel forgot (`netfs::Caps::handles`).
#[derive(Debug)]
pub struct Mount {
    pub fd: OwnedFd,
    pub handles: bool,
    /// A network lower (`netfs::Caps::remote`): see `RealFd::get`.
    pub remote: bool,
}
