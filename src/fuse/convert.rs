//! Conversions between the core's plain data and fuser's types.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, FopenFlags, INodeNo, TimeOrNow};

use crate::layer::sys::Stat;
use crate::overlay::attr::SetAttr;

pub fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()) + Duration::from_nanos(nsec as u64)
    }
}

pub fn attr(st: &Stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(st.st_ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        crtime: UNIX_EPOCH,
        kind: kind(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

/// A setattr time as utimensat(2) takes it.
pub fn timespec(t: TimeOrNow) -> libc::timespec {
    match t {
        TimeOrNow::Now => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        TimeOrNow::SpecificTime(st) => match st.duration_since(UNIX_EPOCH) {
            Ok(d) => libc::timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: d.subsec_nanos() as i64,
            },
            Err(e) => {
                let d = e.duration();
                let mut sec = -(d.as_secs() as i64);
                let mut nsec = -(d.subsec_nanos() as i64);
                if nsec < 0 {
                    sec -= 1;
                    nsec += 1_000_000_000;
                }
                libc::timespec {
                    tv_sec: sec,
                    tv_nsec: nsec,
                }
            }
        },
    }
}

/// `struct fuse_attr_out` for `ttl` and `st`, written to `out` as fuser
/// would encode `attr(st)` (`attr_valid`, `attr_valid_nsec`, a pad, then
/// `struct fuse_attr`); returns its length, 104. For replies built
/// outside fuser (`uring::Fast`).
pub fn attr_out(ttl: &Duration, st: &Stat, out: &mut [u8]) -> usize {
    attr_out_of(ttl, &attr(st), out)
}

/// `attr_out` for attributes already converted (`attr`).
pub fn attr_out_of(ttl: &Duration, a: &FileAttr, out: &mut [u8]) -> usize {
    let mut w = Writer { out, at: 0 };
    w.u64(ttl.as_secs());
    w.u32(ttl.subsec_nanos());
    w.u32(0);
    w.attr(a);
    w.at
}

/// SETATTR's arguments as the core takes them.
pub fn set_attr(
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
    fh: Option<u64>,
) -> SetAttr {
    SetAttr {
        mode,
        uid,
        gid,
        size,
        atime: atime.map(timespec),
        mtime: mtime.map(timespec),
        fh,
    }
}

/// A time of a request (`fuse_setattr_in`'s atime, mtime) as fuser
/// decodes it: before 1970, the nanoseconds are taken away from the
/// seconds rather than added (fuser 0.18's `system_time_from_time`), kept
/// here so that both decoders give the same answer.
pub fn request_time(secs: i64, nsecs: u32) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs)
    } else {
        UNIX_EPOCH - Duration::new(secs.unsigned_abs(), nsecs)
    }
}

/// `struct fuse_entry_out` as fuser's `ReplyEntry::entry` encodes it
/// (`nodeid` from `a.ino`, one timeout for the entry and its attributes,
/// then `struct fuse_attr`); returns its length, 128.
pub fn entry_out(ttl: &Duration, a: &FileAttr, generation: u64, out: &mut [u8]) -> usize {
    let mut w = Writer { out, at: 0 };
    w.u64(a.ino.0);
    w.u64(generation);
    w.u64(ttl.as_secs());
    w.u64(ttl.as_secs());
    w.u32(ttl.subsec_nanos());
    w.u32(ttl.subsec_nanos());
    w.attr(a);
    w.at
}

/// `struct fuse_open_out` as fuser's `ReplyOpen` encodes it: the handle,
/// the `FOPEN_*` flags and the backing id (0 unless the flags hold
/// `FOPEN_PASSTHROUGH`); returns its length, 16.
pub fn open_out(fh: u64, flags: FopenFlags, backing_id: u32, out: &mut [u8]) -> usize {
    let mut w = Writer { out, at: 0 };
    w.u64(fh);
    w.u32(flags.bits());
    w.u32(backing_id);
    w.at
}

/// A GETXATTR reply as fuser's `ReplyXattr` would send it for value `v`
/// and the caller's buffer `size`: the length alone when `size` is 0
/// (`struct fuse_getxattr_out`), ERANGE when `v` does not fit, else `v`.
pub fn xattr_out(v: &[u8], size: u32, out: &mut [u8]) -> Result<usize, Errno> {
    if size == 0 {
        let mut w = Writer { out, at: 0 };
        w.u32(v.len() as u32);
        w.u32(0);
        Ok(w.at)
    } else if v.len() > size as usize {
        Err(Errno::ERANGE)
    } else if v.len() > out.len() {
        Err(Errno::E2BIG)
    } else {
        out[..v.len()].copy_from_slice(v);
        Ok(v.len())
    }
}

/// `struct fuse_write_out` as fuser's `ReplyWrite::written` encodes it:
/// the count and a pad; returns its length, 8.
pub fn write_out(n: u32, out: &mut [u8]) -> usize {
    let mut w = Writer { out, at: 0 };
    w.u32(n);
    w.u32(0);
    w.at
}

/// `struct fuse_lseek_out` as fuser's `ReplyLseek::offset` encodes it;
/// returns its length, 8.
pub fn lseek_out(offset: i64, out: &mut [u8]) -> usize {
    let mut w = Writer { out, at: 0 };
    w.u64(offset as u64);
    w.at
}

/// `struct fuse_statfs_out` for `s` as `ops` answers STATFS through
/// fuser's `ReplyStatfs` (names of up to 255 bytes); returns its length,
/// 80.
pub fn statfs_out(s: &libc::statvfs, out: &mut [u8]) -> usize {
    let mut w = Writer { out, at: 0 };
    for v in [s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree] {
        w.u64(v);
    }
    for v in [
        s.f_bsize as u32,
        NAME_MAX,
        s.f_frsize as u32,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ] {
        w.u32(v);
    }
    w.at
}

/// The longest name STATFS reports.
pub const NAME_MAX: u32 = 255;

/// Bytes a reply sends as they are (READ, READLINK): copied to `out`;
/// returns their length (E2BIG if `out` is too small, never for READ,
/// whose buffer is the size asked).
pub fn data_out(v: &[u8], out: &mut [u8]) -> Result<usize, Errno> {
    let dst = out.get_mut(..v.len()).ok_or(Errno::E2BIG)?;
    dst.copy_from_slice(v);
    Ok(v.len())
}

/// `struct fuse_dirent` and its name, zero-padded to 8 bytes, as fuser's
/// `ReplyDirectory::add` lays an entry out; `None` when it does not fit
/// in `out` (fuser's "full").
pub fn dirent_out(
    ino: u64,
    off: u64,
    kind: FileType,
    name: &[u8],
    out: &mut [u8],
) -> Option<usize> {
    dirent_typed(ino, off, kind_bits(kind) >> 12, name, out)
}

/// `struct fuse_direntplus` (the entry, then the dirent) and its name,
/// padded, as fuser's `ReplyDirectoryPlus::add` lays it out
/// (generation 0, as layerfs answers every entry).
pub fn direntplus_out(
    off: u64,
    name: &[u8],
    ttl: &Duration,
    a: &FileAttr,
    out: &mut [u8],
) -> Option<usize> {
    let size = (ENTRY_OUT_LEN + DIRENT_LEN + name.len()).next_multiple_of(8);
    let out = out.get_mut(..size)?;
    let n = entry_out(ttl, a, 0, out);
    let typ = (kind_bits(a.kind) | u32::from(a.perm)) >> 12;
    Some(n + dirent_typed(a.ino.0, off, typ, name, &mut out[n..])?)
}

const ENTRY_OUT_LEN: usize = 128;
const DIRENT_LEN: usize = 24;

fn dirent_typed(ino: u64, off: u64, typ: u32, name: &[u8], out: &mut [u8]) -> Option<usize> {
    let len = DIRENT_LEN + name.len();
    let out = out.get_mut(..len.next_multiple_of(8))?;
    let mut w = Writer { out, at: 0 };
    w.u64(ino);
    w.u64(off);
    w.u32(name.len() as u32);
    w.u32(typ);
    out[DIRENT_LEN..len].copy_from_slice(name);
    out[len..].fill(0);
    Some(out.len())
}

/// The `S_IF*` bits of a kind, as fuser encodes it.
fn kind_bits(kind: FileType) -> u32 {
    match kind {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    }
}

struct Writer<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn u64(&mut self, v: u64) {
        self.out[self.at..self.at + 8].copy_from_slice(&v.to_ne_bytes());
        self.at += 8;
    }

    fn u32(&mut self, v: u32) {
        self.out[self.at..self.at + 4].copy_from_slice(&v.to_ne_bytes());
        self.at += 4;
    }

    /// `struct fuse_attr` as fuser encodes `a` (88 bytes).
    fn attr(&mut self, a: &FileAttr) {
        let secs = |t: SystemTime| match t.duration_since(UNIX_EPOCH) {
            Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
            Err(e) => {
                let d = e.duration();
                if d.subsec_nanos() == 0 {
                    (-(d.as_secs() as i64), 0)
                } else {
                    (-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
                }
            }
        };
        let (at, an) = secs(a.atime);
        let (mt, mn) = secs(a.mtime);
        let (ct, cn) = secs(a.ctime);
        let kind = kind_bits(a.kind);
        self.u64(a.ino.0);
        self.u64(a.size);
        self.u64(a.blocks);
        self.u64(at as u64);
        self.u64(mt as u64);
        self.u64(ct as u64);
        self.u32(an);
        self.u32(mn);
        self.u32(cn);
        self.u32(kind | u32::from(a.perm));
        self.u32(a.nlink);
        self.u32(a.uid);
        self.u32(a.gid);
        self.u32(a.rdev);
        self.u32(a.blksize);
        self.u32(0);
    }
}
