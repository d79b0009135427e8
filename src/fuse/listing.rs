//! READDIR and READDIRPLUS: a directory's merged listing (built or shared
//! by the core, see `Overlay::dir_listing`) sent in the kernel's offsets,
//! and the memory of a big listing given back once it was read.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use fuser::{Errno, FileAttr, FileType, Generation, INodeNo, ReplyDirectory, ReplyDirectoryPlus};

use super::convert;
use super::reply::errno;
use super::shared::Shared;
use crate::overlay::Ctx;

/// Where a READDIR's or READDIRPLUS's entries go: fuser's
/// `ReplyDirectory` or `ReplyDirectoryPlus`, or the reply a queue thread
/// encodes itself (`fast`).
pub(super) trait Listing {
    fn ok(self);
    fn error(self, e: Errno);
}

/// READDIR's entries. `add` answers true when the entry did not fit (it
/// is then not sent).
pub(super) trait DirReply: Listing {
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &OsStr) -> bool;
}

/// READDIRPLUS's entries, as `DirReply`: each with its attributes (the
/// node id is theirs; the generation is always 0).
pub(super) trait DirPlusReply: Listing {
    fn add(&mut self, offset: u64, name: &OsStr, ttl: &Duration, attr: &FileAttr) -> bool;
}

macro_rules! listing {
    ($($t:ty),*) => {
        $(impl Listing for $t {
            fn ok(self) {
                <$t>::ok(self)
            }

            fn error(self, e: Errno) {
                <$t>::error(self, e)
            }
        })*
    };
}

listing!(ReplyDirectory, ReplyDirectoryPlus);

impl DirReply for ReplyDirectory {
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &OsStr) -> bool {
        ReplyDirectory::add(self, ino, offset, kind, name)
    }
}

impl DirPlusReply for ReplyDirectoryPlus {
    fn add(&mut self, offset: u64, name: &OsStr, ttl: &Duration, attr: &FileAttr) -> bool {
        ReplyDirectoryPlus::add(self, attr.ino, offset, name, ttl, attr, Generation(0))
    }
}

impl Shared {
    /// READDIR: from offset 0 a listing is built (or shared, see
    /// `Overlay::dir_listing`), later offsets continue it.
    pub(super) fn readdir(&self, ino: INodeNo, offset: u64, mut reply: impl DirReply) {
        let (dir, entries) = match self.ov().dir_listing(ino.0, offset) {
            Ok(x) => x,
            Err(e) => return reply.error(errno(e)),
        };
        // Offsets: `.` is 1, `..` is 2, entry i is i + 3.
        let mut off = offset;
        if off == 0 {
            if reply.add(ino, 1, FileType::Directory, OsStr::new(".")) {
                return reply.ok();
            }
            off = 1;
        }
        if off == 1 {
            let pid = dir.parent().map(|p| p.id).unwrap_or(ino.0);
            if reply.add(INodeNo(pid), 2, FileType::Directory, OsStr::new("..")) {
                return reply.ok();
            }
            off = 2;
        }
        for (i, e) in entries.iter().enumerate().skip((off - 2) as usize) {
            if reply.add(INodeNo(e.id), i as u64 + 3, convert::kind(e.kind), &e.name) {
                return reply.ok();
            }
        }
        self.ov().dir_listing_done(&dir);
        reply.ok();
        release_listing(entries);
    }

    /// READDIRPLUS: as `readdir`, each entry with its attributes.
    pub(super) fn readdirplus(
        &self,
        c: &Ctx,
        ino: INodeNo,
        offset: u64,
        mut reply: impl DirPlusReply,
    ) {
        let (dir, entries) = match self.ov().dir_listing(ino.0, offset) {
            Ok(x) => x,
            Err(e) => return reply.error(errno(e)),
        };
        let zero = Duration::ZERO;
        let mut off = offset;
        // The kernel uses neither the attributes nor the node of `.` and
        // `..` in a READDIRPLUS reply (it skips both when filling its
        // caches): `..` gets the directory's own attributes, so listing a
        // directory never touches its parent (whose lower may be a
        // network filesystem that does not answer).
        let here = if off < 2 {
            self.ov()
                .getattr(ino.0, None)
                .ok()
                .map(|(st, _)| convert::attr(&st))
        } else {
            None
        };
        if off == 0 {
            if let Some(a) = &here {
                if reply.add(1, OsStr::new("."), &zero, a) {
                    return reply.ok();
                }
            }
            off = 1;
        }
        if off == 1 {
            if let Some(a) = &here {
                if reply.add(2, OsStr::new(".."), &zero, a) {
                    return reply.ok();
                }
            }
            off = 2;
        }
        for (i, e) in entries.iter().enumerate().skip((off - 2) as usize) {
            // Each entry sent counts one lookup, like a LOOKUP reply.
            let Ok(ent) = self.ov().lookup(c, ino.0, &e.name) else {
                continue;
            };
            let attr = convert::attr(&ent.st);
            let full = reply.add(i as u64 + 3, &e.name, &self.ttl(ent.lower), &attr);
            if full {
                // Not sent after all: give the lookup back.
                self.ov().forget(ent.id, 1);
                return reply.ok();
            }
        }
        self.ov().dir_listing_done(&dir);
        reply.ok();
        release_listing(entries);
    }
}

/// A big listing is built in one pass (every name, its id, and a map of
/// the names seen) on whichever worker thread asked, and its peak stays
/// in that thread's malloc arena after it is freed: once the kernel has
/// read it all, give the free pages back, so the daemon does not keep one
/// such peak per worker (a directory of a million names listed three
/// times grew the daemon from 258 to 634 MiB without this).
fn release_listing(entries: Arc<Vec<crate::overlay::listing::DirEntry>>) {
    let big = entries.len() >= 10_000;
    drop(entries);
    if big {
        crate::sys::trim_heap();
    }
}
