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
use super::sys::SessionBacking;
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
        if self.ov().open_copies_long(ino.0, flags.0) || crate::failpoint::holds("open_write") {
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
        crate::failpoint::hold_at("open_write", || {
            self.ov()
                .inode(ino.0)
                .map(|i| self.ov().path_of(&i))
                .unwrap_or_default()
        });
        let began = began.and_then(|w| match w {
            io_mode::Writing::Refused => {
                let refused = self.ov().guard_write(c, ino.0);
                self.io.end_write(ino.0, w);
                Err(refused.err().map_or(libc::ETXTBSY, |e| e.0))
            }
            w => Ok(w),
        });
        let writing = match began {
            Ok(w) => w,
            Err(e) if e != libc::ETXTBSY => {
                return (Err(crate::overlay::Errno(e)), Prepared::default());
            }
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
                let notifier = self.notifier.get().map(|n| (n, c.pid));
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

    /// CREATE of a name that exists after all: it appeared in a lower (one
    /// not watched: `--max-watches`, a network lower) or in the upper
    /// through another mount after the kernel had cached it as absent.
    /// Without `O_EXCL`, open(2) opens the file it finds, so the name is
    /// opened as an OPEN of it is (`open_begun`: policy, copy-up, journal
    /// row) and answered as a CREATE of it; a directory is `EISDIR`, any
    /// other kind keeps `EEXIST` (see below). Rare,
    /// so it may wait (a copy-up, a lower reader's release) in whichever
    /// thread received it.
    fn create_existing(
        &self,
        c: &Ctx,
        parent: INodeNo,
        name: &OsStr,
        flags: i32,
        via: io_mode::Via,
        reply: impl CreateReply,
    ) {
        let e = match self.ov().lookup(c, parent.0, name) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(e)),
        };
        // The lookup counted a kernel reference, which the kernel takes
        // only with a successful answer (`Existing::error` gives it back).
        let reply = Existing {
            reply,
            shared: self,
            id: e.id,
            ttl: self.ttl(e.lower),
            found: super::convert::attr(&e.st),
        };
        match e.st.st_mode & libc::S_IFMT {
            libc::S_IFREG => {}
            libc::S_IFDIR => return reply.error(Errno::EISDIR),
            // A symlink would be followed by the kernel's own walk (the
            // daemon must never follow one), and a FIFO or device opened
            // here could block or reach a device: these keep the EEXIST,
            // which drops the kernel's entry, so a retry takes the
            // kernel's path.
            _ => return reply.error(Errno::EEXIST),
        }
        // The kernel checked only the directory: the file's own
        // permissions are checked here, as it would have had it known.
        let acl = self
            .ov()
            .getxattr(e.id, OsStr::new("system.posix_acl_access"))
            .is_ok();
        if let Err(no) = may_open_existing(c, &e.st, flags, acl) {
            return reply.error(no);
        }
        let (ino, oflags) = (INodeNo(e.id), OpenFlags(flags & !libc::O_CREAT));
        let r = if wants_write(flags) {
            let began = self.io.begin_write(self.ov(), e.id);
            self.open_begun(c, ino, oflags, &NoHalt, began)
        } else {
            (self.ov().open(c, e.id, oflags.0), Prepared::default())
        };
        self.opened(c, ino, oflags, r, via, reply)
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
        if matches!(&created, Err(e) if e.0 == libc::EEXIST) && flags & libc::O_EXCL == 0 {
            return self.create_existing(c, parent, name, flags, via, reply);
        }
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

/// Whether caller `c` may open the existing file `st` with `flags`, as the
/// kernel's check (`default_permissions`) decides for an OPEN: the mode's
/// bits for the caller's uid, else its groups, else anyone;
/// `CAP_DAC_OVERRIDE` allows any access, `CAP_DAC_READ_SEARCH` reading
/// (`caller::Creds`; a caller that cannot be vouched for has neither).
/// `EACCES` when it may not. A file with an access ACL (`acl`) is left to
/// the kernel: `EEXIST`, the answer it had before, which drops the
/// kernel's entry so that a retry meets its own check.
fn may_open_existing(
    c: &Ctx,
    st: &crate::layer::sys::Stat,
    flags: i32,
    acl: bool,
) -> Result<(), Errno> {
    use super::caller::{Creds, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH};
    let creds = Creds::of(c.pid);
    let cap = |bit| creds.as_ref().is_some_and(|k| k.has_cap(bit));
    let write = wants_write(flags) || flags & libc::O_TRUNC != 0;
    let read = flags & libc::O_ACCMODE != libc::O_WRONLY;
    if cap(CAP_DAC_OVERRIDE) || (!write && cap(CAP_DAC_READ_SEARCH)) {
        return Ok(());
    }
    if acl {
        return Err(Errno::EEXIST);
    }
    let shift = if c.uid == st.st_uid {
        6
    } else if c.gid == st.st_gid || creds.as_ref().is_some_and(|k| k.in_group(st.st_gid)) {
        3
    } else {
        0
    };
    let bits = (st.st_mode >> shift) & 0o7;
    if (read && bits & 0o4 == 0) || (write && bits & 0o2 == 0) {
        return Err(Errno::EACCES);
    }
    Ok(())
}

/// A CREATE answered with an open of the name found there
/// (`Shared::create_existing`): the open's answer, with the file's
/// attributes as they are once it is open (after a copy-up or a
/// truncation; as the lookup found them if they cannot be read).
struct Existing<'a, R> {
    reply: R,
    shared: &'a Shared,
    id: u64,
    ttl: std::time::Duration,
    found: fuser::FileAttr,
}

impl<R: CreateReply> Existing<'_, R> {
    fn attr(&self) -> fuser::FileAttr {
        match self.shared.ov().getattr(self.id, None) {
            Ok((st, _)) => super::convert::attr(&st),
            Err(_) => self.found,
        }
    }
}

impl<R: CreateReply> OpenReply for Existing<'_, R> {
    fn open_backing(&self, fd: &std::os::fd::OwnedFd) -> std::io::Result<SessionBacking> {
        self.reply.open_backing(fd)
    }

    fn opened(self, fh: fuser::FileHandle, flags: fuser::FopenFlags) {
        let attr = self.attr();
        self.reply.created(&self.ttl, &attr, fh, flags)
    }

    fn opened_passthrough(
        self,
        fh: fuser::FileHandle,
        flags: fuser::FopenFlags,
        b: &io_mode::Backing,
    ) {
        let attr = self.attr();
        self.reply
            .created_passthrough(&self.ttl, &attr, fh, flags, b)
    }

    fn error(self, e: Errno) {
        self.shared.ov().forget(self.id, 1);
        self.reply.error(e)
    }
}
