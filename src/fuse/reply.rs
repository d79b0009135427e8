//! Replies that need nothing but the result: the core's errno as fuser's,
//! empty replies, and the size-or-data rule of the xattr replies; and
//! where a LOOKUP's and a SETATTR's answers go (`EntryReply`,
//! `AttrReply`).

use std::time::Duration;

use fuser::{Errno, FileAttr, Generation, ReplyAttr, ReplyEmpty, ReplyEntry, ReplyXattr};

/// Where a LOOKUP's answer goes: fuser's `ReplyEntry`, or the reply a
/// queue thread encodes itself (`fast`).
pub(super) trait EntryReply {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation);
    fn error(self, e: Errno);
}

/// Where a SETATTR's answer goes: fuser's `ReplyAttr`, or the reply a
/// queue thread encodes itself (`fast`).
pub(super) trait AttrReply {
    fn attr(self, ttl: &Duration, attr: &FileAttr);
    fn error(self, e: Errno);
}

impl AttrReply for ReplyAttr {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        ReplyAttr::attr(self, ttl, attr)
    }

    fn error(self, e: Errno) {
        ReplyAttr::error(self, e)
    }
}

impl EntryReply for ReplyEntry {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        ReplyEntry::entry(self, ttl, attr, generation)
    }

    fn error(self, e: Errno) {
        ReplyEntry::error(self, e)
    }
}

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

/// STATFS through fuser (`convert::statfs_out` is the queue's encoding).
pub(super) fn statfs(s: &libc::statvfs, reply: fuser::ReplyStatfs) {
    reply.statfs(
        s.f_blocks,
        s.f_bfree,
        s.f_bavail,
        s.f_files,
        s.f_ffree,
        s.f_bsize as u32,
        super::convert::NAME_MAX,
        s.f_frsize as u32,
    )
}
