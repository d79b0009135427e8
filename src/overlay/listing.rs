//! One entry of a merged listing (`DirEntry`): what `readdir` builds, what
//! a directory inode caches while the kernel reads it, and what the FUSE
//! adapter sends. A type of its own, so the inode table does not depend on
//! the listing code that depends on it.

use std::ffi::OsString;

/// One merged entry: name, `S_IFMT` type and the node id it will have.
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: OsString,
    pub kind: u32,
    pub id: u64,
}
