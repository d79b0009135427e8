//! The FUSE adapter's `unsafe` calls outside the io_uring ring (whose
//! entries point into the queue's own buffers, `uring::queue`): backing
//! ids opened on the connection's fd for passthrough opens that reach the
//! daemon through an io_uring queue, where no fuser session can open them,
//! and the number of a backing id a fuser session opened (which fuser
//! keeps to itself), for open replies layerfs encodes itself.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use fuser::{BackingId, FileAttr, FileHandle, FopenFlags, Generation, ReplyCreate, ReplyOpen};

nix::ioctl_write_ptr!(fuse_dev_ioc_backing_close, 229, 2, u32);

/// A backing id opened through a fuser session's reply (closed by fuser
/// when `id` is dropped), with its number.
pub struct SessionBacking {
    pub id: BackingId,
    pub raw: u32,
}

impl SessionBacking {
    /// Opens a backing id for `fd` through an OPEN's reply.
    pub fn for_open(reply: &ReplyOpen, fd: impl AsFd) -> std::io::Result<SessionBacking> {
        let raw = reply.open_backing(fd)?.into_raw();
        // SAFETY: `raw` was opened on this reply's session just now, and
        // `into_raw` gave up closing it: the wrapper takes that back, so
        // the id stays open until `id` is dropped, and only then closes.
        let id = unsafe { reply.wrap_backing(raw) };
        Ok(SessionBacking { id, raw })
    }

    /// Opens a backing id for `fd` through a CREATE's reply.
    pub fn for_create(reply: &ReplyCreate, fd: impl AsFd) -> std::io::Result<SessionBacking> {
        let raw = reply.open_backing(fd)?.into_raw();
        // SAFETY: as in `for_open`.
        let id = unsafe { reply.wrap_backing(raw) };
        Ok(SessionBacking { id, raw })
    }
}

/// A backing id open on the connection `dev`, closed when this is dropped.
///
/// Invariant: the id stays open for as long as this value lives, and only
/// this value closes it; a borrow of it therefore proves the id valid for
/// a reply.
pub struct ConnectionBacking {
    id: u32,
    dev: Arc<OwnedFd>,
}

impl ConnectionBacking {
    /// Opens a backing id for `fd` on the connection `dev`.
    pub fn open(dev: &Arc<OwnedFd>, fd: impl AsFd) -> std::io::Result<ConnectionBacking> {
        let id = BackingId::create_raw(&**dev, fd)?;
        Ok(ConnectionBacking {
            id,
            dev: dev.clone(),
        })
    }

    /// A value for id `id` on `dev` that was never opened (encoding tests:
    /// its drop's close fails and is only logged).
    #[cfg(test)]
    pub fn for_test(id: u32, dev: Arc<OwnedFd>) -> ConnectionBacking {
        ConnectionBacking { id, dev }
    }

    /// The id's number, for a reply layerfs encodes itself.
    pub fn raw(&self) -> u32 {
        self.id
    }

    /// Replies to an open with this backing id.
    pub fn reply_opened(&self, reply: ReplyOpen, fh: FileHandle, flags: FopenFlags) {
        // SAFETY: the id is open on this connection while `self` lives
        // (the invariant above); the wrapper is given up (`into_raw`,
        // which closes nothing) right after the reply, so only `self`
        // ever closes the id.
        let w = unsafe { reply.wrap_backing(self.id) };
        reply.opened_passthrough(fh, flags, &w);
        w.into_raw();
    }

    /// Replies to a create with this backing id.
    pub fn reply_created(
        &self,
        reply: ReplyCreate,
        ttl: &Duration,
        attr: &FileAttr,
        fh: FileHandle,
        flags: FopenFlags,
    ) {
        // SAFETY: as in `reply_opened`.
        let w = unsafe { reply.wrap_backing(self.id) };
        reply.created_passthrough(ttl, attr, Generation(0), fh, flags, &w);
        w.into_raw();
    }
}

impl Drop for ConnectionBacking {
    fn drop(&mut self) {
        // SAFETY: FUSE_DEV_IOC_BACKING_CLOSE reads one u32 from the
        // pointer, which points at `self.id`, alive for the call.
        if let Err(e) = unsafe { fuse_dev_ioc_backing_close(self.dev.as_raw_fd(), &self.id) } {
            tracing::debug!("closing backing id {}: {e}", self.id);
        }
    }
}
