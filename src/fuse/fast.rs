//! The requests an io_uring queue thread answers itself (`uring::Fast`):
//! GETATTR and GETXATTR, the most frequent ones that change nothing (and,
//! on local layers, do not wait long), with the same handler code as
//! through fuser (`LayerFs::attr_of`, the overlay's getxattr) and the same
//! admission (`Contained::answer`); only the reply is encoded here.

use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use super::contain::Contained;
use super::convert;
use super::reply::errno;
use super::shared::{LayerFs, Shared};
use super::uring;

/// `fuse_getattr_in.getattr_flags`: `fh` names the handle the request
/// comes through (the kernel's `FUSE_GETATTR_FH`).
const FUSE_GETATTR_FH: u32 = 1;

/// A queue thread's answers for one mount (`FsHandle::queue_answers`).
pub struct QueueAnswers {
    fs: Contained<LayerFs>,
    /// fuser's session rule: with `SessionACL::Owner`, requests of other
    /// users are refused; those are left to fuser.
    anyone: bool,
    owner: u32,
}

impl QueueAnswers {
    pub(super) fn new(inner: &Arc<Shared>, acl: fuser::SessionACL) -> QueueAnswers {
        QueueAnswers {
            fs: Contained(LayerFs {
                inner: inner.clone(),
                queue: None,
            }),
            anyone: acl == fuser::SessionACL::All,
            owner: nix::unistd::getuid().as_raw(),
        }
    }
}

impl uring::Fast for QueueAnswers {
    fn answer(
        &self,
        req: uring::Req,
        arg: &[u8],
        rest: &[u8],
        out: &mut [u8],
    ) -> Option<Result<usize, i32>> {
        if !self.anyone && req.uid != self.owner {
            return None;
        }
        let r = match req.opcode {
            uring::FUSE_GETATTR => {
                // fuse_getattr_in: getattr_flags (u32), dummy (u32), fh
                // (u64), the handle valid when the flags say so. An object
                // a live reset or undo emptied answers through the handle
                // that holds it (`Overlay::getattr`), as through fuser.
                let flags = u32::from_ne_bytes(arg.get(0..4)?.try_into().ok()?);
                let fh = u64::from_ne_bytes(arg.get(8..16)?.try_into().ok()?);
                let fh = (flags & FUSE_GETATTR_FH != 0).then_some(fh);
                self.fs
                    .answer("getattr", req.nodeid, |fs| fs.attr_of(req.nodeid, fh))
                    .map(|(ttl, st)| convert::attr_out(&ttl, &st, out))
            }
            uring::FUSE_GETXATTR => {
                // fuse_getxattr_in: size (u32), padding; then the name.
                let size = u32::from_ne_bytes(arg.get(0..4)?.try_into().ok()?);
                let name = rest.split(|&b| b == 0).next()?;
                let name = std::ffi::OsStr::from_bytes(name);
                self.fs
                    .answer("getxattr", req.nodeid, |fs| {
                        fs.ov().getxattr(req.nodeid, name).map_err(errno)
                    })
                    .and_then(|v| convert::xattr_out(&v, size, out))
            }
            _ => return None,
        };
        Some(r.map_err(|e| e.code()))
    }
}
