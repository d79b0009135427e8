//! Replies that need nothing but the result: the core's errno as fuser's,
//! empty replies, and the size-or-data rule of the xattr replies.

use fuser::{Errno, ReplyEmpty, ReplyXattr};

/// The core's errno as fuser's (the number is kept as it is).
pub(super) fn errno(e: crate::overlay::Errno) -> Errno {
    Errno::from_i32(e.0)
}

pub(super) fn empty(r: crate::overlay::Result<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

/// GETXATTR and LISTXATTR: size 0 asks for the length only; a buffer too
/// small is `ERANGE`.
pub(super) fn xattr(v: &[u8], size: u32, reply: ReplyXattr) {
    if size == 0 {
        reply.size(v.len() as u32)
    } else if v.len() > size as usize {
        reply.error(Errno::ERANGE)
    } else {
        reply.data(v)
    }
}
