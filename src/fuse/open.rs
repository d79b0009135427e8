//! OPEN and CREATE: the caller's share of the daemon's fds and writers,
//! the open itself (on the copy pool when it copies up a large file), the
//! journal's row for it, and the reply in the file's io mode (`io_mode`).
//! An open that need not wait (`open_now`) is answered by whoever received
//! it, a fuser request thread or an io_uring queue thread (`fast`).

use std::ffi::OsStr;
use std::sync::Arc;

use fuser::{Errno, INodeNo, OpenFlags, ReplyOpen};

use super::io_mode::{CreateReply, OpenReply};
use super::journal::open_row;
use super::reply::errno;
use super::shared::Shared;
use super::{io_mode, long, uring};
use crate::overlay::copy_up::{Halt, NoHalt};
use crate::overlay::dir::NewKind;
use crate::overlay::events::EvOp;
use crate::overlay::file::{wants_write, Opened};
use crate::overlay::Ctx;

/// What an open for writing set up in `io_mode` before the open itself,
/// settled by its reply: a daemon-served open booked, the change of data
/// begun. Nothing for a read-only open.
#[derive(Default)]
pub(super) struct Prepared {
    booked: bool,
    writing: Option<io_mode::Writing>,
}

impl Shared {
    /// OPEN, answered at once where nothing needs waiting: a read-only
    /// open; an open for writing while writes are not paused, with no
    /// long copy-up (`Overlay::open_copies_long`) and no lower reader's
    /// release to wait for (`IoModes::begin_write_now`). Otherwise nothing
    /// is done and the reply is given back, for an open where waiting is
    /// allowed (`open_file`, in the write gate or on the copy pool).
    pub(super) fn open_now<R: OpenReply>(
        &self,
        c: &Ctx,
        ino: INodeNo,
        flags: OpenFlags,
        via: io_mode::Via,
        reply: R,
    ) -> Result<(), R> {
        // An open for writing copies up and lets passthrough writes
        // through: it waits while writes are paused. Reads never do.
        if !wants_write(flags.0) {
            let r = self.ov().open(c, ino.0, flags.0);
            self.opened(c, ino, flags, (r, Prepared::default()), via, reply);
            return Ok(());
        }
        if self.ov().open_copies_long(ino.0, flags.0) {
            return Err(reply);
        }
        let Some(_pass) = self.ov.gate().try_enter() else {
            return Err(reply);
        };
        let Some(began) = self.io.begin_write_now(self.ov(), ino.0) else {
            return Err(reply);
        };
        let r = self.open_begun(c, ino, flags, &NoHalt, began);
        self.opened(c, ino, flags, r, via, reply);
        Ok(())
    }

    /// An open's work (the caller's share of daemon-served writers booked
    /// first for another user's open for writing; see `io_mode`): the
    /// result, and what was set up for its reply.
    pub(super) fn open_file(
        &self,
        c: &Ctx,
        ino: INodeNo,
        flags: OpenFlags,
        halt: &dyn Halt,
    ) -> (crate::overlay::Result<Opened>, Prepared) {
        let began = self.io.begin_write(self.ov(), ino.0);
        self.open_begun(c, ino, flags, halt, began)
    }

    /// `open_file` once `IoModes::begin_write` has answered.
    fn open_begun(
        &self,
        c: &Ctx,
        ino: INodeNo,
        flags: OpenFlags,
        halt: &dyn Halt,
        began: Result<io_mode::Writing, i32>,
    ) -> (crate::overlay::Result<Opened>, Prepared) {
        // Before the copy-up: refused while the lower file is passed
        // through to readers (`io_mode`); ended when the open is decided.
        let writing = match began {
            Ok(w) => w,
            Err(e) => {
                let path = self.ov().inode(ino.0).map(|i| self.ov().path_of(&i));
                tracing::info!(
                path = %path.as_deref().unwrap_or("?"),
                "open for writing refused (ETXTBSY): the lower file is open for reading \
                 through lower passthrough; it can be opened for writing once those \
                 descriptors are closed"
                );
                return (Err(crate::overlay::Errno(e)), Prepared::default());
            }
        };
        let booking = if !self.ov().files().shares.is_owner(c.uid) {
            self.io
                .book_daemon_write(ino.0)
                .map_err(crate::overlay::Errno)
        } else {
            Ok(false)
        };
        let booked = *booking.as_ref().unwrap_or(&false);
        let r = booking.and_then(|_| self.ov().open_halting(c, ino.0, flags.0, halt));
        // open(O_TRUNC) by a caller without CAP_FSETID clears
        // setuid/setgid (`killpriv`); a failure fails the open.
        let r = r.and_then(|o| {
            if flags.0 & libc::O_TRUNC != 0 {
                let killed = self
                    .ov()
                    .kill_suid(ino.0, || super::killpriv::caller_lacks_fsetid(c.pid));
                if let Err(e) = killed {
                    self.ov().release(o.fh);
                    return Err(e);
                }
            }
            Ok(o)
        });
        if booked && r.is_err() {
            self.io.cancel_booking(ino.0);
        }
        if r.is_err() {
            self.io.end_write(ino.0, writing);
            return (r, Prepared::default());
        }
        let writing = Some(writing);
        (r, Prepared { booked, writing })
    }

    /// An open that copies up a large file, on the copy pool: inside the
    /// write gate like any open for writing, its copy watched (`long::Watch`).
    /// A copy stopped for a pause waits for the pause to end and starts
    /// again; one stopped because its caller was killed answers `EINTR`.
    pub(super) fn open_copying(
        &self,
        c: &Ctx,
        ino: INodeNo,
        flags: OpenFlags,
        queue: Option<Arc<uring::QueueSide>>,
        reply: ReplyOpen,
    ) {
        loop {
            // Invariant: the pass is dropped before the next `enter`.
            let _pass = self.ov.gate().enter();
            let watch = long::Watch::new(c.pid, self.ov.gate());
            let r = self.open_file(c, ino, flags, &watch);
            if r.0.is_err() && watch.stopped() == Some(long::Stopped::PauseWanted) {
                continue;
            }
            return self.opened(c, ino, flags, r, queue.as_deref(), reply);
        }
    }

    /// Records an open's outcome in the journal and replies to it.
    pub(super) fn opened<R: OpenReply>(
        &self,
        c: &Ctx,
        ino: INodeNo,
        flags: OpenFlags,
        (r, prep): (crate::overlay::Result<Opened>, Prepared),
        via: io_mode::Via,
        reply: R,
    ) {
        if wants_write(flags.0) {
            let row = open_row(flags.0 & libc::O_TRUNC != 0, r.is_ok());
            let errno = r.as_ref().err().map_or(0, |e| e.0);
            self.rec
                .done(c, row.as_slice(), self.path(ino.0), None, errno);
        }
        match r {
            Ok(o) => {
                let (fh, writable) = (o.fh, o.writable);
                let Prepared { booked, writing } = prep;
                let notifier = self.notifier.get();
                self.io.reply_open(
                    self.ov(),
                    ino.0,
                    o,
                    via,
                    notifier,
                    booked,
                    writing,
                    reply,
                    |pt| {
                        if writable {
                            self.rec.opened(self.ov(), fh, c, pt)
                        }
                    },
                )
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    /// CREATE: the new file, opened. FUSE CREATE's own arguments, plus how
    /// the request came.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn create(
        &self,
        c: &Ctx,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        flags: i32,
        via: io_mode::Via,
        reply: impl CreateReply,
    ) {
        let kind = NewKind::File { mode, flags };
        let path = self.child(parent, name);
        // The creator's share of the daemon's fds first: over it, nothing
        // is created (EMFILE, as open(2) checks for a free fd first).
        let created = self
            .ov()
            .files()
            .charge(c.uid)
            .and_then(|charge| Ok((self.ov().create_object(c, parent.0, name, kind)?, charge)));
        self.done(c, EvOp::Create, path, None, &created);
        let (entry, fd, charge) = match created {
            Ok(((e, Some(fd)), charge)) => (e, fd, charge),
            Ok(((_, None), _)) => return reply.error(Errno::EIO),
            Err(e) => return reply.error(errno(e)),
        };
        match self.ov().adopt(entry.id, fd, flags, charge) {
            Ok(o) => {
                let (fh, writable) = (o.fh, o.writable);
                let ttl = self.ttl(entry.lower);
                self.io
                    .reply_create(self.ov(), &entry, ttl, o, via, reply, |pt| {
                        if writable {
                            self.rec.opened(self.ov(), fh, c, pt)
                        }
                    })
            }
            Err(e) => reply.error(errno(e)),
        }
    }
}
