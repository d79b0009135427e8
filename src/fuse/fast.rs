//! The requests an io_uring queue thread answers itself (`uring::Fast`):
//! every frequent one, where on local layers it need not wait — GETATTR,
//! GETXATTR, LISTXATTR, LOOKUP, OPEN, SETATTR, CREATE, READ, WRITE,
//! RENAME, SETXATTR, REMOVEXATTR, MKDIR, MKNOD, SYMLINK, LINK, UNLINK,
//! RMDIR, READLINK, READDIR, READDIRPLUS, STATFS, LSEEK, RELEASE, FLUSH,
//! IOCTL, FSYNC and FSYNCDIR — with the same handler code as through
//! fuser (`Shared`'s bodies, the core's calls, `NO_FLUSH`, `NO_IOCTL`)
//! and the same admission (`Contained::answer`). A sync is not waited
//! for: the queue runs it on its ring (`uring::Answer::Sync`). A request
//! that would wait (a write pause, a long copy-up, a rename's walk, a
//! long listing: see each arm) is declined, untouched, and goes to
//! fuser. Only the request's
//! arguments are decoded and the reply encoded here (`Encoded`,
//! `DirList`, `convert::*_out`).

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::Duration;

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, OpenFlags, TimeOrNow,
};

use super::contain::Contained;
use super::convert;
use super::io_mode::{Backing, CreateReply, OpenReply};
use super::listing::{DirPlusReply, DirReply, Listing};
use super::ops::{NO_FLUSH, NO_IOCTL};
use super::reply::{errno, AttrReply, EntryReply};
use super::shared::{LayerFs, Shared};
use super::sys::SessionBacking;
use super::uring;
use crate::overlay::attr::SetAttr;
use crate::overlay::dir::NewKind;
use crate::overlay::Ctx;

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

/// `fuse_ioctl_in.flags`: an ioctl of CUSE, which fuser refuses itself.
const FUSE_IOCTL_UNRESTRICTED: u32 = 1 << 1;

/// `fuse_setattr_in.valid`: which fields are set (`include/uapi/linux/fuse.h`).
const FATTR_MODE: u32 = 1 << 0;
const FATTR_UID: u32 = 1 << 1;
const FATTR_GID: u32 = 1 << 2;
const FATTR_SIZE: u32 = 1 << 3;
const FATTR_ATIME: u32 = 1 << 4;
const FATTR_MTIME: u32 = 1 << 5;
const FATTR_FH: u32 = 1 << 6;
const FATTR_ATIME_NOW: u32 = 1 << 7;
const FATTR_MTIME_NOW: u32 = 1 << 8;

/// `fuse_setattr_in` as fuser decodes it for `Filesystem::setattr`, made
/// into the core's `SetAttr` as `ops` does: valid (u32), padding, fh,
/// size, lock_owner, atime, mtime, ctime (u64 each), atimensec,
/// mtimensec, ctimensec, mode, unused, uid, gid (u32 each).
fn setattr_in(arg: &[u8]) -> Option<SetAttr> {
    let valid = u32_at(arg, 0)?;
    let set = |bit: u32| valid & bit != 0;
    let u32_if = |bit: u32, at: usize| if set(bit) { u32_at(arg, at) } else { None };
    let u64_if = |bit: u32, at: usize| if set(bit) { u64_at(arg, at) } else { None };
    let time = |bit: u32, now: u32, at: usize, nsec_at: usize| {
        if !set(bit) {
            None
        } else if set(now) {
            Some(TimeOrNow::Now)
        } else {
            let (secs, nsecs) = (u64_at(arg, at)? as i64, u32_at(arg, nsec_at)?);
            Some(TimeOrNow::SpecificTime(convert::request_time(secs, nsecs)))
        }
    };
    arg.get(..88)?;
    Some(convert::set_attr(
        u32_if(FATTR_MODE, 68),
        u32_if(FATTR_UID, 76),
        u32_if(FATTR_GID, 80),
        u64_if(FATTR_SIZE, 16),
        time(FATTR_ATIME, FATTR_ATIME_NOW, 32, 56),
        time(FATTR_MTIME, FATTR_MTIME_NOW, 40, 60),
        u64_if(FATTR_FH, 8),
    ))
}

/// The `u32` or `u64` at `at` in a request's argument.
fn u32_at(arg: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(arg.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(arg: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(arg.get(at..at + 8)?.try_into().ok()?))
}

/// A name argument: its bytes up to the NUL that ends it.
fn name(rest: &[u8]) -> Option<&std::ffi::OsStr> {
    rest.split(|&b| b == 0)
        .next()
        .map(std::ffi::OsStr::from_bytes)
}

/// A name argument and the bytes after its NUL.
fn name_then(rest: &[u8]) -> Option<(&std::ffi::OsStr, &[u8])> {
    let end = rest.iter().position(|&b| b == 0)?;
    Some((std::ffi::OsStr::from_bytes(&rest[..end]), &rest[end + 1..]))
}

/// An offset fuser takes (an `off_t`: EINVAL beyond `i64::MAX`, left to
/// fuser to answer).
fn offset_at(arg: &[u8], at: usize) -> Option<u64> {
    u64_at(arg, at).filter(|&o| o <= i64::MAX as u64)
}

/// `fuse_fsync_in.fsync_flags`: sync the data only (`fdatasync`).
const FUSE_FSYNC_FDATASYNC: u32 = 1;

/// `fuse_write_in.write_flags`: the caller lacks CAP_FSETID
/// (`FUSE_WRITE_KILL_SUIDGID`).
const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;

impl uring::Fast for QueueAnswers {
    fn answer(
        &self,
        side: &uring::QueueSide,
        req: uring::Req,
        arg: &[u8],
        rest: &[u8],
        out: &mut [u8],
    ) -> Option<uring::Answer> {
        if !self.anyone && req.uid != self.owner {
            return None;
        }
        let c = Ctx {
            uid: req.uid,
            gid: req.gid,
            pid: req.pid,
            umask: 0,
        };
        let ino = req.nodeid;
        let r = match req.opcode {
            uring::FUSE_GETATTR => {
                // fuse_getattr_in: getattr_flags (u32), dummy (u32), fh
                // (u64), the handle valid when the flags say so. An object
                // a live reset or undo emptied answers through the handle
                // that holds it (`Overlay::getattr`), as through fuser.
                let flags = u32_at(arg, 0)?;
                let fh = u64_at(arg, 8)?;
                let fh = (flags & FUSE_GETATTR_FH != 0).then_some(fh);
                self.fs.answer("getattr", ino, |fs| {
                    Some(
                        fs.attr_of(ino, fh)
                            .map(|(ttl, st)| convert::attr_out(&ttl, &st, out)),
                    )
                })
            }
            uring::FUSE_GETXATTR => {
                // fuse_getxattr_in: size (u32), padding; then the name.
                let size = u32_at(arg, 0)?;
                let name = name(rest)?;
                self.fs.answer("getxattr", ino, |fs| {
                    Some(
                        fs.ov()
                            .getxattr(ino, name)
                            .map_err(errno)
                            .and_then(|v| convert::xattr_out(&v, size, out)),
                    )
                })
            }
            uring::FUSE_LOOKUP => {
                // No first argument; the name.
                let name = name(rest)?;
                let mut enc = Encoded::new(out);
                self.fs.answer("lookup", ino, |fs| {
                    fs.inner.lookup(&c, INodeNo(ino), name, &mut enc);
                    Some(enc.result)
                })
            }
            uring::FUSE_OPEN => {
                // fuse_open_in: flags (u32), open_flags (u32, not read:
                // the O_TRUNC privilege check is `killpriv`'s, as through
                // fuser).
                let flags = OpenFlags(u32_at(arg, 0)? as i32);
                let mut enc = Encoded::new(out);
                self.fs.answer("open", ino, |fs| {
                    let via = Some(side);
                    match fs.inner.open_now(&c, INodeNo(ino), flags, via, &mut enc) {
                        Ok(()) => Some(enc.result),
                        // It must wait: left to the request threads.
                        Err(_) => None,
                    }
                })
            }
            uring::FUSE_SETATTR => {
                let a = setattr_in(arg)?;
                let mut enc = Encoded::new(out);
                self.fs.answer("setattr", ino, |fs| {
                    match fs.inner.setattr_now(&c, INodeNo(ino), &a, &mut enc) {
                        Ok(()) => Some(enc.result),
                        // It must wait: left to the request threads.
                        Err(_) => None,
                    }
                })
            }
            uring::FUSE_RELEASE => {
                // fuse_release_in: fh (u64), flags, release_flags,
                // lock_owner (not read, as through fuser).
                let fh = u64_at(arg, 0)?;
                self.fs.answer("release", ino, |fs| {
                    fs.inner.release(&c, ino, fh);
                    Some(Ok(0))
                })
            }
            uring::FUSE_UNLINK | uring::FUSE_RMDIR => {
                // No first argument; the name. Inside the write gate, as
                // through fuser; while writes are paused, left to fuser.
                let name = name(rest)?;
                let dir = req.opcode == uring::FUSE_RMDIR;
                let op = if dir { "rmdir" } else { "unlink" };
                self.fs.answer(op, ino, |fs| {
                    let _pass = fs.inner.ov.gate().try_enter()?;
                    let r = fs.inner.remove(&c, INodeNo(ino), name, dir);
                    Some(r.map(|()| 0).map_err(errno))
                })
            }
            uring::FUSE_CREATE => {
                // fuse_create_in: flags (i32), mode, umask, open_flags
                // (not read, as through fuser); then the name. Inside the
                // write gate; while writes are paused, left to fuser.
                let flags = u32_at(arg, 0)? as i32;
                let (mode, umask) = (u32_at(arg, 4)?, u32_at(arg, 8)?);
                let name = name(rest)?;
                let c = Ctx { umask, ..c };
                let mut enc = Encoded::new(out);
                self.fs.answer("create", ino, |fs| {
                    let _pass = fs.inner.ov.gate().try_enter()?;
                    let via = Some(side);
                    fs.inner
                        .create(&c, INodeNo(ino), name, mode, flags, via, &mut enc);
                    Some(enc.result)
                })
            }
            uring::FUSE_READ => {
                // fuse_read_in: fh, offset (u64), size (u32), read_flags,
                // lock_owner, flags (not read, as through fuser). Read
                // straight into the reply; a read larger than the room is
                // left to fuser.
                let (fh, offset) = (u64_at(arg, 0)?, offset_at(arg, 8)?);
                let buf = out.get_mut(..u32_at(arg, 16)? as usize)?;
                self.fs.answer("read", ino, |fs| {
                    Some(fs.ov().read_into(fh, offset, buf).map_err(errno))
                })
            }
            uring::FUSE_WRITE => {
                // fuse_write_in: fh, offset (u64), size, write_flags (u32),
                // lock_owner (u64), flags (u32, not read); then the data.
                // Inside the write gate; while writes are paused, left to
                // fuser (which parks it).
                let (fh, offset) = (u64_at(arg, 0)?, offset_at(arg, 8)?);
                let (size, wflags) = (u32_at(arg, 16)? as usize, u32_at(arg, 20)?);
                let data = rest.get(..size).filter(|d| d.len() == rest.len())?;
                let kill = wflags & FUSE_WRITE_KILL_SUIDGID != 0;
                self.fs.answer("write", ino, |fs| {
                    let _pass = fs.inner.ov.gate().try_enter()?;
                    let r = fs.inner.write(INodeNo(ino), kill, fh, offset, data);
                    Some(r.map(|n| convert::write_out(n, out)).map_err(errno))
                })
            }
            uring::FUSE_RENAME | uring::FUSE_RENAME2 => {
                // fuse_rename_in: newdir (u64); fuse_rename2_in adds flags
                // (u32). Then the two names. Inside the write gate; a
                // move that must wait (a pause, another move's walk, its
                // own policy walk, a long copy-up) is left to fuser.
                let newdir = u64_at(arg, 0)?;
                let flags = match req.opcode {
                    uring::FUSE_RENAME2 => u32_at(arg, 8)?,
                    _ => 0,
                };
                let (from, after) = name_then(rest)?;
                let to = name(after)?;
                self.fs.answer("rename", ino, |fs| {
                    let _pass = fs.inner.ov.gate().try_enter()?;
                    let (from, to) = ((INodeNo(ino), from), (INodeNo(newdir), to));
                    let r = fs.inner.rename(&c, from, to, flags, false)?;
                    Some(r.map(|()| 0).map_err(errno))
                })
            }
            uring::FUSE_SETXATTR => {
                // fuse_setxattr_in: size (u32), flags (i32); the name,
                // then the value. Inside the write gate; a copy-up that
                // would be long is left to fuser.
                let (size, flags) = (u32_at(arg, 0)? as usize, u32_at(arg, 4)? as i32);
                let (name, value) = name_then(rest)?;
                if value.len() != size {
                    return None;
                }
                self.fs.answer("setxattr", ino, |fs| {
                    let _pass = self.may_copy_up(fs, ino)?;
                    let r = fs.inner.setxattr(&c, INodeNo(ino), name, value, flags);
                    Some(r.map(|()| 0).map_err(errno))
                })
            }
            uring::FUSE_REMOVEXATTR => {
                // No first argument; the name. As SETXATTR.
                let name = name(rest)?;
                self.fs.answer("removexattr", ino, |fs| {
                    let _pass = self.may_copy_up(fs, ino)?;
                    let r = fs.inner.removexattr(&c, INodeNo(ino), name);
                    Some(r.map(|()| 0).map_err(errno))
                })
            }
            uring::FUSE_LISTXATTR => {
                // fuse_getxattr_in: size (u32), padding.
                let size = u32_at(arg, 0)?;
                self.fs.answer("listxattr", ino, |fs| {
                    Some(
                        fs.ov()
                            .listxattr(ino)
                            .map_err(errno)
                            .and_then(|v| convert::xattr_out(&v, size, out)),
                    )
                })
            }
            uring::FUSE_MKDIR => {
                // fuse_mkdir_in: mode, umask (u32); the name. Inside the
                // write gate, as every new name.
                let (mode, umask) = (u32_at(arg, 0)?, u32_at(arg, 4)?);
                let name = name(rest)?;
                let c = Ctx { umask, ..c };
                let kind = NewKind::Dir { mode };
                self.new_entry("mkdir", (ino, name), kind, &c, out)
            }
            uring::FUSE_MKNOD => {
                // fuse_mknod_in: mode, rdev, umask, padding (u32); the name.
                let (mode, rdev, umask) = (u32_at(arg, 0)?, u32_at(arg, 4)?, u32_at(arg, 8)?);
                let name = name(rest)?;
                let c = Ctx { umask, ..c };
                let kind = NewKind::Node {
                    mode,
                    rdev: rdev as u64,
                };
                self.new_entry("mknod", (ino, name), kind, &c, out)
            }
            uring::FUSE_SYMLINK => {
                // No first argument; the name, then the target.
                let (name, after) = name_then(rest)?;
                let target = self::name(after)?;
                let kind = NewKind::Symlink { target };
                self.new_entry("symlink", (ino, name), kind, &c, out)
            }
            uring::FUSE_LINK => {
                // fuse_link_in: oldnodeid (u64); the new name. `ino` is
                // the new parent; a source whose copy-up would be long is
                // left to fuser.
                let source = u64_at(arg, 0)?;
                let name = name(rest)?;
                let mut enc = Encoded::new(out);
                self.fs.answer("link", source, |fs| {
                    let _pass = self.may_copy_up(fs, source)?;
                    fs.inner
                        .link(&c, INodeNo(source), INodeNo(ino), name, &mut enc);
                    Some(enc.result)
                })
            }
            uring::FUSE_READLINK => self.fs.answer("readlink", ino, |fs| {
                Some(
                    fs.ov()
                        .readlink(ino)
                        .map_err(errno)
                        .and_then(|t| convert::data_out(t.as_bytes(), out)),
                )
            }),
            uring::FUSE_STATFS => self.fs.answer("statfs", ino, |fs| {
                Some(
                    fs.ov()
                        .statfs()
                        .map(|s| convert::statfs_out(&s, out))
                        .map_err(errno),
                )
            }),
            uring::FUSE_LSEEK => {
                // fuse_lseek_in: fh (u64), offset (i64), whence (i32).
                let (fh, offset) = (u64_at(arg, 0)?, u64_at(arg, 8)? as i64);
                let whence = u32_at(arg, 16)? as i32;
                self.fs.answer("lseek", ino, |fs| {
                    Some(
                        fs.ov()
                            .lseek(fh, offset, whence)
                            .map(|o| convert::lseek_out(o, out))
                            .map_err(errno),
                    )
                })
            }
            uring::FUSE_READDIR | uring::FUSE_READDIRPLUS => {
                // fuse_read_in: fh, offset (u64), size (u32), ... A
                // listing larger than the room is left to fuser, and so is
                // one built on the copy pool (`lists_long`).
                let offset = u64_at(arg, 8)?;
                let size = u32_at(arg, 16)? as usize;
                let plus = req.opcode == uring::FUSE_READDIRPLUS;
                let mut list = DirList::new(out.get_mut(..size)?);
                let op = if plus { "readdirplus" } else { "readdir" };
                self.fs.answer(op, ino, |fs| {
                    if offset == 0 && fs.ov().lists_long(ino) {
                        return None;
                    }
                    if offset == 0 {
                        fs.inner.io.listed(fs.ov(), ino, c.pid);
                    }
                    if plus {
                        fs.inner.readdirplus(&c, INodeNo(ino), offset, &mut list);
                    } else {
                        fs.inner.readdir(INodeNo(ino), offset, &mut list);
                    }
                    Some(list.result)
                })
            }
            uring::FUSE_FLUSH => self.fs.answer("flush", ino, |_| Some(Err(NO_FLUSH))),
            uring::FUSE_IOCTL => {
                // fuse_ioctl_in: fh (u64), flags (u32), ...
                if u32_at(arg, 8)? & FUSE_IOCTL_UNRESTRICTED != 0 {
                    return None;
                }
                self.fs.answer("ioctl", ino, |_| Some(Err(NO_IOCTL)))
            }
            uring::FUSE_FSYNC | uring::FUSE_FSYNCDIR => {
                // fuse_fsync_in: fh (u64), fsync_flags (u32), padding.
                let fh = u64_at(arg, 0)?;
                let datasync = u32_at(arg, 8)? & FUSE_FSYNC_FDATASYNC != 0;
                let dir = req.opcode == uring::FUSE_FSYNCDIR;
                return self.sync(dir, &c, ino, fh, datasync);
            }
            _ => return None,
        };
        r.map(|r| uring::Answer::Now(r.map_err(|e| e.code())))
    }
}

impl QueueAnswers {
    /// FSYNC and FSYNCDIR: the same work up to the sync as through fuser
    /// (`Shared::fsync_target`, `Overlay::fsyncdir_target`), then the
    /// sync itself runs on the queue's ring, so the queue thread does not
    /// wait for the disk. While writes are paused, left to fuser.
    fn sync(&self, dir: bool, c: &Ctx, ino: u64, fh: u64, datasync: bool) -> Option<uring::Answer> {
        let op = if dir { "fsyncdir" } else { "fsync" };
        let target = self.fs.answer(op, ino, |fs| {
            if fs.ov().gate().paused() {
                return None;
            }
            let t = if dir {
                fs.ov().fsyncdir_target(ino)
            } else {
                fs.inner.fsync_target(c, fh, datasync).map(Some)
            };
            Some(t.map_err(errno))
        })?;
        Some(match target {
            Ok(Some(t)) => uring::Answer::Sync(uring::SyncOp {
                fd: t.fd().as_raw_fd(),
                datasync: t.datasync,
                done: Box::new(move |res| {
                    let r = match res {
                        0.. => Ok(()),
                        e => Err(std::io::Error::from_raw_os_error(-e)),
                    };
                    t.synced(r).map_err(|e| errno(e).code())
                }),
            }),
            // Nothing to sync.
            Ok(None) => uring::Answer::Now(Ok(0)),
            Err(e) => uring::Answer::Now(Err(e.code())),
        })
    }

    /// The write gate's pass for a change that copies `ino` up, unless
    /// writes are paused or the copy would be long (then `None`: the
    /// request is left to fuser).
    fn may_copy_up<'a>(&self, fs: &'a LayerFs, ino: u64) -> Option<crate::overlay::gate::Pass<'a>> {
        if fs.ov().open_copies_long(ino, libc::O_WRONLY) {
            return None;
        }
        fs.inner.ov.gate().try_enter()
    }

    /// MKDIR, MKNOD and SYMLINK: `name` in `parent` made as `kind`,
    /// inside the write gate (while writes are paused, left to fuser).
    fn new_entry(
        &self,
        op: &'static str,
        (parent, name): (u64, &std::ffi::OsStr),
        kind: NewKind<'_>,
        c: &Ctx,
        out: &mut [u8],
    ) -> Option<Result<usize, Errno>> {
        let mut enc = Encoded::new(out);
        self.fs.answer(op, parent, |fs| {
            let _pass = fs.inner.ov.gate().try_enter()?;
            fs.inner
                .create_entry(c, INodeNo(parent), name, kind, &mut enc);
            Some(enc.result)
        })
    }
}

/// A reply a queue thread encodes itself, as fuser's reply would send it:
/// the length of its arguments written to `out`, or an errno. EIO until
/// answered, as for a fuser reply dropped unsent.
struct Encoded<'a> {
    out: &'a mut [u8],
    result: Result<usize, Errno>,
}

impl Encoded<'_> {
    fn new(out: &mut [u8]) -> Encoded<'_> {
        Encoded {
            out,
            result: Err(Errno::EIO),
        }
    }
}

/// A READDIR or READDIRPLUS reply a queue thread encodes itself: entries
/// laid out in `out` (the size the kernel asked) as fuser adds them.
struct DirList<'a> {
    out: &'a mut [u8],
    len: usize,
    result: Result<usize, Errno>,
}

impl DirList<'_> {
    fn new(out: &mut [u8]) -> DirList<'_> {
        DirList {
            out,
            len: 0,
            result: Err(Errno::EIO),
        }
    }

    fn added(&mut self, n: Option<usize>) -> bool {
        match n {
            Some(n) => {
                self.len += n;
                false
            }
            None => true,
        }
    }
}

impl Listing for &mut DirList<'_> {
    fn ok(self) {
        self.result = Ok(self.len);
    }

    fn error(self, e: Errno) {
        self.result = Err(e);
    }
}

impl DirReply for &mut DirList<'_> {
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &OsStr) -> bool {
        let room = &mut self.out[self.len..];
        let n = convert::dirent_out(ino.0, offset, kind, name.as_bytes(), room);
        self.added(n)
    }
}

impl DirPlusReply for &mut DirList<'_> {
    fn add(&mut self, offset: u64, name: &OsStr, ttl: &Duration, attr: &FileAttr) -> bool {
        let room = &mut self.out[self.len..];
        let n = convert::direntplus_out(offset, name.as_bytes(), ttl, attr, room);
        self.added(n)
    }
}

impl EntryReply for &mut Encoded<'_> {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        self.result = Ok(convert::entry_out(ttl, attr, generation.0, self.out));
    }

    fn error(self, e: Errno) {
        self.result = Err(e);
    }
}

impl AttrReply for &mut Encoded<'_> {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        self.result = Ok(convert::attr_out_of(ttl, attr, self.out));
    }

    fn error(self, e: Errno) {
        self.result = Err(e);
    }
}

impl CreateReply for &mut Encoded<'_> {
    /// Never asked, as for `OpenReply`.
    fn open_backing(&self, _fd: &OwnedFd) -> std::io::Result<SessionBacking> {
        Err(std::io::Error::other(
            "a queue thread's create has no fuser session to open a backing id",
        ))
    }

    /// `struct fuse_create_out`: the entry, then the open.
    fn created(self, ttl: &Duration, attr: &FileAttr, fh: FileHandle, flags: FopenFlags) {
        let n = convert::entry_out(ttl, attr, 0, self.out);
        let m = convert::open_out(fh.0, flags, 0, &mut self.out[n..]);
        self.result = Ok(n + m);
    }

    fn created_passthrough(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        fh: FileHandle,
        flags: FopenFlags,
        b: &Backing,
    ) {
        let flags = flags | FopenFlags::FOPEN_PASSTHROUGH;
        let n = convert::entry_out(ttl, attr, 0, self.out);
        let m = convert::open_out(fh.0, flags, b.raw(), &mut self.out[n..]);
        self.result = Ok(n + m);
    }

    fn error(self, e: Errno) {
        self.result = Err(e);
    }
}

impl OpenReply for &mut Encoded<'_> {
    /// Never asked: a queue's opens take their backing ids on the
    /// connection (`io_mode::Backing::Connection`).
    fn open_backing(&self, _fd: &OwnedFd) -> std::io::Result<SessionBacking> {
        Err(std::io::Error::other(
            "a queue thread's open has no fuser session to open a backing id",
        ))
    }

    fn opened(self, fh: FileHandle, flags: FopenFlags) {
        self.result = Ok(convert::open_out(fh.0, flags, 0, self.out));
    }

    fn opened_passthrough(self, fh: FileHandle, flags: FopenFlags, b: &Backing) {
        let flags = flags | FopenFlags::FOPEN_PASSTHROUGH;
        self.result = Ok(convert::open_out(fh.0, flags, b.raw(), self.out));
    }

    fn error(self, e: Errno) {
        self.result = Err(e);
    }
}

#[cfg(test)]
mod tests {
    //! Each reply a queue thread encodes, compared byte for byte with what
    //! fuser sends for the same call: a fuser session on a socket pair (as
    //! a queue's own) answers requests by calling the same reply functions.

    use std::ffi::OsStr;
    use std::os::fd::AsRawFd;

    use fuser::{ReplyAttr, ReplyEntry, ReplyOpen, Request};
    use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType};
    use zerocopy::IntoBytes;

    use super::*;
    use crate::fuse::sys::ConnectionBacking;
    use crate::fuse::uring::abi;
    use crate::layer::sys::{zeroed_stat, Stat};

    fn stat(ino: u64, mode: u32, times: [(i64, i64); 3]) -> Stat {
        let mut st = zeroed_stat();
        st.st_ino = ino;
        st.st_mode = mode;
        st.st_size = 123_456_789_012;
        st.st_blocks = 241_126_544;
        st.st_nlink = 3;
        st.st_uid = 1000;
        st.st_gid = 65534;
        st.st_rdev = libc::makedev(1, 3);
        st.st_blksize = 4096;
        [
            (st.st_atime, st.st_atime_nsec),
            (st.st_mtime, st.st_mtime_nsec),
            (st.st_ctime, st.st_ctime_nsec),
        ] = times;
        st
    }

    const NOW: (i64, i64) = (1_780_000_000, 123_456_789);
    const OLD: (i64, i64) = (-315_619_200, 250_000_000);

    /// GETATTR's cases: a timeout and the attributes.
    fn attr_case(i: u64) -> (Duration, Stat) {
        match i {
            1 => (Duration::from_secs(1), stat(5, 0o100644, [NOW; 3])),
            2 => (Duration::ZERO, stat(6, 0o40755, [OLD, NOW, (0, 0)])),
            3 => (
                Duration::new(60, 999_999_999),
                stat(7, 0o124777, [(-1, 1), OLD, NOW]),
            ),
            _ => (Duration::new(3, 5), stat(8, 0o26640, [(0, 0); 3])),
        }
    }

    /// LOOKUP's cases, by name: entries (negative ones too) and errors.
    fn entry_case(name: &OsStr, reply: impl EntryReply) {
        let (ttl, st) = attr_case(name.len() as u64 % 4);
        match name.to_str().unwrap() {
            "a" | "bb" | "ccc" | "dddd" => reply.entry(&ttl, &convert::attr(&st), Generation(0)),
            "generation" => reply.entry(&ttl, &convert::attr(&st), Generation(u64::MAX - 7)),
            "negative" => {
                let mut attr = convert::attr(&zeroed_stat());
                attr.ino = INodeNo(0);
                reply.entry(&Duration::new(1, 500), &attr, Generation(0))
            }
            "hidden" => reply.error(Errno::ENOENT),
            _ => reply.error(Errno::EACCES),
        }
    }

    /// OPEN's cases, by node id: cached opens with their flags,
    /// passthrough opens with their backing id, errors.
    fn open_case(ino: u64, dev: &Arc<OwnedFd>, reply: impl OpenReply) {
        let pt = |id| Backing::Connection(ConnectionBacking::for_test(id, dev.clone()));
        match ino {
            1 => reply.opened(FileHandle(1), FopenFlags::empty()),
            2 => reply.opened(FileHandle(u64::MAX - 3), FopenFlags::FOPEN_KEEP_CACHE),
            3 => reply.opened(
                FileHandle(0x0102_0304_0506_0708),
                FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            4 => reply.opened_passthrough(FileHandle(77), FopenFlags::empty(), &pt(5)),
            5 => reply.opened_passthrough(
                FileHandle(u64::MAX),
                FopenFlags::FOPEN_KEEP_CACHE,
                &pt(0x1234_5678),
            ),
            6 => reply.error(Errno::ETXTBSY),
            _ => reply.error(Errno::EROFS),
        }
    }

    /// What SETATTR carries, comparable.
    type SetKey = (
        Option<u32>,
        Option<u32>,
        Option<u32>,
        Option<u64>,
        Option<(i64, i64)>,
        Option<(i64, i64)>,
        Option<u64>,
    );

    fn key(a: &SetAttr) -> SetKey {
        let t = |t: &libc::timespec| (t.tv_sec, t.tv_nsec);
        let (at, mt) = (a.atime.as_ref().map(t), a.mtime.as_ref().map(t));
        (a.mode, a.uid, a.gid, a.size, at, mt, a.fh)
    }

    /// CREATE's cases, by name: cached and passthrough creates, errors.
    fn create_case(name: &OsStr, dev: &Arc<OwnedFd>, reply: impl CreateReply) {
        let (ttl, st) = attr_case(name.len() as u64 % 4);
        let attr = convert::attr(&st);
        let pt = |id| Backing::Connection(ConnectionBacking::for_test(id, dev.clone()));
        match name.to_str().unwrap() {
            "a" => reply.created(&ttl, &attr, FileHandle(3), FopenFlags::empty()),
            "bb" => reply.created(
                &ttl,
                &attr,
                FileHandle(u64::MAX),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            "ccc" => {
                reply.created_passthrough(&ttl, &attr, FileHandle(9), FopenFlags::empty(), &pt(11))
            }
            "dddd" => reply.created_passthrough(
                &ttl,
                &attr,
                FileHandle(0x0a0b_0c0d),
                FopenFlags::FOPEN_KEEP_CACHE,
                &pt(0x7fff_ffff),
            ),
            "exists" => reply.error(Errno::EEXIST),
            _ => reply.error(Errno::EACCES),
        }
    }

    /// READ's and READLINK's data, by node id.
    fn data_case(ino: u64) -> Vec<u8> {
        match ino {
            1 => Vec::new(),
            2 => b"x".to_vec(),
            3 => (0..=255u8).cycle().take(60_000).collect(),
            _ => b"../some/target with spaces".to_vec(),
        }
    }

    /// STATFS's answer: a full `statvfs`.
    fn statvfs_case() -> libc::statvfs {
        let root = std::fs::File::open("/").unwrap();
        let mut s = crate::layer::sys::fstatfs(&root).unwrap();
        s.f_blocks = u64::MAX - 1;
        s.f_bfree = 123_456_789;
        s.f_bavail = 98_765;
        s.f_files = 1 << 40;
        s.f_ffree = 7;
        s.f_bsize = 4096;
        s.f_frsize = 1024;
        s.f_namemax = 1000;
        s
    }

    /// A listing's entries: every kind, names of every length modulo 8.
    const NAMES: [(&str, FileType); 9] = [
        ("a", FileType::RegularFile),
        ("bb", FileType::Directory),
        ("ccc", FileType::Symlink),
        ("dddd", FileType::NamedPipe),
        ("eeeee", FileType::CharDevice),
        ("ffffff", FileType::BlockDevice),
        ("ggggggg", FileType::Socket),
        ("hhhhhhhh", FileType::RegularFile),
        ("a name that is quite a bit longer", FileType::Directory),
    ];

    /// READDIR's cases: from `offset`, entries until the reply is full.
    fn dir_case(offset: u64, mut reply: impl DirReply) {
        if offset == 99 {
            return reply.error(Errno::ENOTDIR);
        }
        for (i, (name, kind)) in NAMES.iter().enumerate().skip(offset as usize) {
            let ino = INodeNo(u64::MAX / (i as u64 + 1));
            if reply.add(ino, i as u64 + 1, *kind, OsStr::new(name)) {
                break;
            }
        }
        reply.ok()
    }

    /// READDIRPLUS's cases, as `dir_case`, with attributes.
    fn dirplus_case(offset: u64, mut reply: impl DirPlusReply) {
        if offset == 99 {
            return reply.error(Errno::EACCES);
        }
        for (i, (name, _)) in NAMES.iter().enumerate().skip(offset as usize) {
            let (ttl, mut st) = attr_case(i as u64 % 4 + 1);
            st.st_ino = 1000 + i as u64;
            let attr = convert::attr(&st);
            if reply.add(i as u64 + 1, OsStr::new(name), &ttl, &attr) {
                break;
            }
        }
        reply.ok()
    }

    /// Answers with the cases above, through fuser's replies; keeps what
    /// fuser decoded of each SETATTR (made into `SetAttr` as `ops` does).
    struct Cases {
        dev: Arc<OwnedFd>,
        set: Arc<std::sync::Mutex<Vec<SetKey>>>,
    }

    impl fuser::Filesystem for Cases {
        fn lookup(&self, _req: &Request, _parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
            entry_case(name, reply)
        }

        fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
            let (ttl, st) = attr_case(ino.0);
            reply.attr(&ttl, &convert::attr(&st))
        }

        fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
            open_case(ino.0, &self.dev, reply)
        }

        fn create(
            &self,
            _req: &Request,
            _parent: INodeNo,
            name: &OsStr,
            _mode: u32,
            _umask: u32,
            _flags: i32,
            reply: fuser::ReplyCreate,
        ) {
            create_case(name, &self.dev, reply)
        }

        fn setattr(
            &self,
            _req: &Request,
            ino: INodeNo,
            mode: Option<u32>,
            uid: Option<u32>,
            gid: Option<u32>,
            size: Option<u64>,
            atime: Option<TimeOrNow>,
            mtime: Option<TimeOrNow>,
            _ctime: Option<std::time::SystemTime>,
            fh: Option<FileHandle>,
            _crtime: Option<std::time::SystemTime>,
            _chgtime: Option<std::time::SystemTime>,
            _bkuptime: Option<std::time::SystemTime>,
            _flags: Option<fuser::BsdFileFlags>,
            reply: ReplyAttr,
        ) {
            let a = convert::set_attr(mode, uid, gid, size, atime, mtime, fh.map(|f| f.0));
            self.set.lock().unwrap().push(key(&a));
            let (ttl, st) = attr_case(ino.0);
            AttrReply::attr(reply, &ttl, &convert::attr(&st))
        }

        fn read(
            &self,
            _req: &Request,
            ino: INodeNo,
            _fh: FileHandle,
            _offset: u64,
            _size: u32,
            _flags: OpenFlags,
            _lock_owner: Option<fuser::LockOwner>,
            reply: fuser::ReplyData,
        ) {
            reply.data(&data_case(ino.0))
        }

        fn readlink(&self, _req: &Request, ino: INodeNo, reply: fuser::ReplyData) {
            reply.data(&data_case(ino.0))
        }

        fn write(
            &self,
            _req: &Request,
            _ino: INodeNo,
            _fh: FileHandle,
            offset: u64,
            data: &[u8],
            _write_flags: fuser::WriteFlags,
            _flags: OpenFlags,
            _lock_owner: Option<fuser::LockOwner>,
            reply: fuser::ReplyWrite,
        ) {
            reply.written(data.len() as u32 + offset as u32)
        }

        fn statfs(&self, _req: &Request, _ino: INodeNo, reply: fuser::ReplyStatfs) {
            crate::fuse::reply::statfs(&statvfs_case(), reply)
        }

        fn lseek(
            &self,
            _req: &Request,
            _ino: INodeNo,
            _fh: FileHandle,
            offset: i64,
            _whence: i32,
            reply: fuser::ReplyLseek,
        ) {
            reply.offset(offset)
        }

        fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
            crate::fuse::reply::xattr(&data_case(ino.0), size, reply)
        }

        fn mkdir(
            &self,
            _req: &Request,
            _parent: INodeNo,
            name: &OsStr,
            _mode: u32,
            _umask: u32,
            reply: ReplyEntry,
        ) {
            entry_case(name, reply)
        }

        fn readdir(
            &self,
            _req: &Request,
            _ino: INodeNo,
            _fh: FileHandle,
            offset: u64,
            reply: fuser::ReplyDirectory,
        ) {
            dir_case(offset, reply)
        }

        fn readdirplus(
            &self,
            _req: &Request,
            _ino: INodeNo,
            _fh: FileHandle,
            offset: u64,
            reply: fuser::ReplyDirectoryPlus,
        ) {
            dirplus_case(offset, reply)
        }
    }

    /// A `fuse_read_in` (40 bytes) for READ, READDIR and READDIRPLUS.
    fn read_arg(fh: u64, offset: u64, size: u32) -> Vec<u8> {
        let mut b = Vec::with_capacity(40);
        b.extend_from_slice(&fh.to_ne_bytes());
        b.extend_from_slice(&offset.to_ne_bytes());
        b.extend_from_slice(&size.to_ne_bytes());
        b.extend_from_slice(&[0u8; 20]);
        b
    }

    /// A `fuse_setattr_in` (88 bytes): valid, fh, size, then the times
    /// (seconds, nanoseconds), mode, uid, gid.
    fn setattr_arg(valid: u32, fh: u64, size: u64, t: [(i64, u32); 3], ids: [u32; 3]) -> Vec<u8> {
        let mut b = Vec::with_capacity(88);
        b.extend_from_slice(&valid.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&fh.to_ne_bytes());
        b.extend_from_slice(&size.to_ne_bytes());
        b.extend_from_slice(&0x55u64.to_ne_bytes());
        for (s, _) in t {
            b.extend_from_slice(&s.to_ne_bytes());
        }
        for (_, ns) in t {
            b.extend_from_slice(&ns.to_ne_bytes());
        }
        let [mode, uid, gid] = ids;
        for v in [mode, 0, uid, gid, 0] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        assert_eq!(b.len(), 88);
        b
    }

    fn request(opcode: u32, unique: u64, nodeid: u64, arg: &[u8]) -> Vec<u8> {
        let h = abi::InHeader {
            len: (abi::IN_HEADER_LEN + arg.len()) as u32,
            opcode,
            unique,
            nodeid,
            ..abi::InHeader::default()
        };
        let mut b = h.as_bytes().to_vec();
        b.extend_from_slice(arg);
        b
    }

    /// fuser's answer to `req`: its body, or its errno.
    fn fusers(sock: &OwnedFd, req: &[u8]) -> Result<Vec<u8>, i32> {
        socket::send(sock.as_raw_fd(), req, MsgFlags::empty()).unwrap();
        let mut buf = vec![0u8; 140_000];
        let n = socket::recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap();
        let h = abi::reply_header(&buf[..n]).unwrap();
        assert_eq!(h.len as usize, n);
        if h.error != 0 {
            assert_eq!(n, abi::OUT_HEADER_LEN);
            return Err(-h.error);
        }
        Ok(buf[abi::OUT_HEADER_LEN..n].to_vec())
    }

    /// What `Encoded` (or `attr_out`) made of the same call.
    fn ours(answer: impl FnOnce(&mut [u8]) -> Result<usize, Errno>) -> Result<Vec<u8>, i32> {
        let mut out = vec![0u8; uring::SCRATCH];
        answer(&mut out)
            .map(|n| out[..n].to_vec())
            .map_err(|e| e.code())
    }

    #[test]
    fn queue_replies_are_byte_for_byte_fusers() {
        let dev = Arc::new(OwnedFd::from(std::fs::File::open("/dev/null").unwrap()));
        let (mine, theirs) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let init = abi::init_request(1, 40, 131072, 0);
        socket::send(mine.as_raw_fd(), &init, MsgFlags::empty()).unwrap();
        let mut cfg = fuser::Config::default();
        cfg.n_threads = Some(1);
        let decoded = Arc::new(std::sync::Mutex::new(Vec::new()));
        let fs = Cases {
            dev: dev.clone(),
            set: decoded.clone(),
        };
        let session = fuser::Session::from_fd(fs, theirs, fuser::SessionACL::All, cfg).unwrap();
        let mut reply = [0u8; 512];
        socket::recv(mine.as_raw_fd(), &mut reply, MsgFlags::empty()).unwrap();
        let served = std::thread::spawn(move || session.run());
        let mut unique = 1;
        let mut next = || {
            unique += 2;
            unique
        };

        for ino in 1..=4 {
            // fuse_getattr_in: no handle.
            let req = request(uring::FUSE_GETATTR, next(), ino, &[0u8; 16]);
            let (ttl, st) = attr_case(ino);
            let ours = ours(|out| Ok(convert::attr_out(&ttl, &st, out)));
            assert_eq!(ours, fusers(&mine, &req), "GETATTR case {ino}");
        }
        for name in [
            "a",
            "bb",
            "ccc",
            "dddd",
            "generation",
            "negative",
            "hidden",
            "refused",
        ] {
            let mut arg = name.as_bytes().to_vec();
            arg.push(0);
            let req = request(uring::FUSE_LOOKUP, next(), 1, &arg);
            let ours = ours(|out| {
                let mut enc = Encoded::new(out);
                entry_case(OsStr::new(name), &mut enc);
                enc.result
            });
            assert_eq!(ours, fusers(&mine, &req), "LOOKUP {name}");
            // fuse_mkdir_in: mode, umask; the name. The same entry.
            let mut mkdir = vec![0u8; 8];
            mkdir.extend_from_slice(&arg);
            let req = request(uring::FUSE_MKDIR, next(), 1, &mkdir);
            assert_eq!(ours, fusers(&mine, &req), "MKDIR {name}");
        }
        for ino in 1..=7 {
            // fuse_open_in: flags, open_flags.
            let req = request(uring::FUSE_OPEN, next(), ino, &[0u8; 8]);
            let ours = ours(|out| {
                let mut enc = Encoded::new(out);
                open_case(ino, &dev, &mut enc);
                enc.result
            });
            assert_eq!(ours, fusers(&mine, &req), "OPEN case {ino}");
        }

        for name in ["a", "bb", "ccc", "dddd", "exists", "refused"] {
            // fuse_create_in: flags, mode, umask, open_flags; the name.
            let mut arg = vec![0u8; 16];
            arg.extend_from_slice(name.as_bytes());
            arg.push(0);
            let req = request(uring::FUSE_CREATE, next(), 1, &arg);
            let ours = ours(|out| {
                let mut enc = Encoded::new(out);
                create_case(OsStr::new(name), &dev, &mut enc);
                enc.result
            });
            assert_eq!(ours, fusers(&mine, &req), "CREATE {name}");
        }
        const NOW: u32 = FATTR_ATIME_NOW | FATTR_MTIME_NOW;
        let times = [(1_780_000_000, 5), (1_000_000_000, 999_999_999), (3, 4)];
        let old = [(-315_619_200, 250_000_000), (-1, 1), (-7, 0)];
        let sets = [
            setattr_arg(
                FATTR_MODE | FATTR_UID | FATTR_GID,
                9,
                9,
                times,
                [0o104755, 7, 8],
            ),
            setattr_arg(FATTR_SIZE | FATTR_FH, 99, 12345, times, [1, 2, 3]),
            setattr_arg(FATTR_SIZE, 99, 0, times, [1, 2, 3]),
            setattr_arg(FATTR_ATIME | FATTR_MTIME, 0, 0, times, [0; 3]),
            setattr_arg(FATTR_ATIME | FATTR_MTIME | NOW, 0, 0, times, [0; 3]),
            setattr_arg(FATTR_ATIME | FATTR_MTIME, 0, 0, old, [0; 3]),
            setattr_arg(FATTR_MTIME | FATTR_ATIME_NOW, 0, 0, old, [0; 3]),
            // Sets nothing: KILL_SUIDGID, LOCKOWNER, CTIME are not read.
            setattr_arg((1 << 11) | (1 << 10) | (1 << 9), 5, 6, times, [7, 8, 9]),
        ];
        for (n, arg) in sets.iter().enumerate() {
            let ino = n as u64 % 4 + 1;
            let req = request(uring::FUSE_SETATTR, next(), ino, arg);
            let ours = ours(|out| {
                let mut enc = Encoded::new(out);
                let (ttl, st) = attr_case(ino);
                AttrReply::attr(&mut enc, &ttl, &convert::attr(&st));
                enc.result
            });
            assert_eq!(ours, fusers(&mine, &req), "SETATTR reply {n}");
            let fusers = decoded.lock().unwrap().pop();
            assert_eq!(
                setattr_in(arg).map(|a| key(&a)),
                fusers,
                "SETATTR {n} decoded"
            );
        }

        for ino in 1..=4 {
            let data = data_case(ino);
            let req = request(uring::FUSE_READ, next(), ino, &read_arg(1, 0, 131072));
            let data_ours = ours(|out| convert::data_out(&data, out));
            assert_eq!(data_ours, fusers(&mine, &req), "READ case {ino}");
            let req = request(uring::FUSE_READLINK, next(), ino, &[]);
            assert_eq!(data_ours, fusers(&mine, &req), "READLINK case {ino}");
            for size in [0u32, 1, 4096] {
                // fuse_getxattr_in: size, padding.
                let mut arg = size.to_ne_bytes().to_vec();
                arg.extend_from_slice(&[0u8; 4]);
                let req = request(uring::FUSE_LISTXATTR, next(), ino, &arg);
                let ours = ours(|out| convert::xattr_out(&data, size, out));
                assert_eq!(ours, fusers(&mine, &req), "LISTXATTR case {ino}, {size}");
            }
        }
        for (offset, len) in [(0u64, 0usize), (5, 1), (1 << 40, 4000)] {
            // fuse_write_in: fh, offset, size, write_flags, lock_owner,
            // flags, padding; the data.
            let mut arg = 7u64.to_ne_bytes().to_vec();
            arg.extend_from_slice(&offset.to_ne_bytes());
            arg.extend_from_slice(&(len as u32).to_ne_bytes());
            arg.extend_from_slice(&[0u8; 20]);
            arg.extend(std::iter::repeat_n(b'w', len));
            let req = request(uring::FUSE_WRITE, next(), 2, &arg);
            let n = len as u32 + offset as u32;
            let ours = ours(|out| Ok(convert::write_out(n, out)));
            assert_eq!(ours, fusers(&mine, &req), "WRITE {offset} {len}");
        }
        let req = request(uring::FUSE_STATFS, next(), 1, &[]);
        let ours_statfs = ours(|out| Ok(convert::statfs_out(&statvfs_case(), out)));
        assert_eq!(ours_statfs, fusers(&mine, &req), "STATFS");
        for offset in [0i64, 1, i64::MAX, -5] {
            // fuse_lseek_in: fh, offset, whence, padding.
            let mut arg = 3u64.to_ne_bytes().to_vec();
            arg.extend_from_slice(&offset.to_ne_bytes());
            arg.extend_from_slice(&[0u8; 8]);
            let req = request(uring::FUSE_LSEEK, next(), 1, &arg);
            let ours = ours(|out| Ok(convert::lseek_out(offset, out)));
            assert_eq!(ours, fusers(&mine, &req), "LSEEK {offset}");
        }
        // Listings from several offsets into buffers of several sizes:
        // none, one entry, part of them, all.
        for offset in [0, 1, 4, 8, 9, 99] {
            for size in [0, 24, 40, 100, 200, 400, 4096] {
                let req = request(uring::FUSE_READDIR, next(), 1, &read_arg(1, offset, size));
                let listed = ours(|out| {
                    let mut list = DirList::new(&mut out[..size as usize]);
                    dir_case(offset, &mut list);
                    list.result
                });
                assert_eq!(listed, fusers(&mine, &req), "READDIR {offset} {size}");
                let req = request(
                    uring::FUSE_READDIRPLUS,
                    next(),
                    1,
                    &read_arg(1, offset, size),
                );
                let listed = ours(|out| {
                    let mut list = DirList::new(&mut out[..size as usize]);
                    dirplus_case(offset, &mut list);
                    list.result
                });
                assert_eq!(listed, fusers(&mine, &req), "READDIRPLUS {offset} {size}");
            }
        }

        let destroy = abi::destroy_request(next());
        socket::send(mine.as_raw_fd(), &destroy, MsgFlags::empty()).unwrap();
        drop(mine);
        let _ = served.join();
    }
}
