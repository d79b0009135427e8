//! Every unsafe system call layerfs makes, each wrapped to take fds and
//! single names and to return `io::Result`. Names passed here are single
//! path components that the caller has already checked (`check_name`).

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

mod sqlite;
mod xattr;

pub use sqlite::*;
pub use xattr::*;

pub type Stat = libc::stat;

/// An all-zero `Stat`, to fill in field by field.
pub fn zeroed_stat() -> Stat {
    // SAFETY: libc::stat is plain data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `/proc/self/fd/N`: the magic link that reaches the file behind an fd.
/// Used to reopen an `O_PATH` fd with real access modes and for calls that
/// have no fd form; it names the very inode the fd holds, so no path
/// resolution in any layer happens.
pub fn proc_path(fd: &impl AsRawFd) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL in a number")
}

/// Opens a layer root directory as an `O_PATH` fd (the one place a full
/// path is resolved, at mount time, by the administrator's choice).
pub fn open_root(path: &Path) -> io::Result<OwnedFd> {
    let p = cstr(path.as_os_str())?;
    // SAFETY: p is a valid NUL-terminated string; the returned fd is owned below.
    let fd = check(unsafe {
        libc::open(
            p.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fd was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `RESOLVE_*` flags of openat2(2).
pub const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
pub const RESOLVE_NO_SYMLINKS: u64 = 0x04;
pub const RESOLVE_BENEATH: u64 = 0x08;

/// Opens `name` beneath `dir` with `openat2(RESOLVE_BENEATH |
/// RESOLVE_NO_SYMLINKS)`: a symlink or `..` can never lead the daemon out of
/// the directory. With `O_PATH | O_NOFOLLOW` a trailing symlink yields an fd
/// of the link itself.
pub fn open_beneath(dir: &impl AsFd, name: &OsStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    openat2(
        dir,
        name,
        flags | libc::O_NOFOLLOW,
        mode,
        RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    )
}

/// `openat2(2)` of `path` relative to `dir` with open `flags` (plus
/// `O_CLOEXEC`) and `resolve` flags; retried on `EAGAIN` and `EINTR`.
pub fn openat2(
    dir: &impl AsFd,
    path: &OsStr,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let n = cstr(path)?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u32 as u64,
        mode: if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
            mode as u64
        } else {
            0
        },
        resolve,
    };
    loop {
        // SAFETY: n and how outlive the call; the size passed is that of `how`.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_fd().as_raw_fd(),
                n.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if ret < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAGAIN) || e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        // SAFETY: the kernel returned a new fd that nobody else owns.
        return Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) });
    }
}

/// An `O_PATH` fd of `name` in `dir` (not following a trailing symlink).
pub fn open_path(dir: &impl AsFd, name: &OsStr) -> io::Result<OwnedFd> {
    open_beneath(dir, name, libc::O_PATH, 0)
}

/// Reopens the file behind an `O_PATH` fd with real access flags.
///
/// Through `fd_dir` where it can: the magic link `N` in this process's
/// fd directory, without resolving `/proc/self/fd` again at every open
/// (a read-only open of a lower file is one of these per OPEN request).
pub fn reopen(fd: &impl AsRawFd, flags: i32) -> io::Result<OwnedFd> {
    let flags = (flags | libc::O_CLOEXEC) & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY);
    let ret = match fd_dir() {
        Some(dir) => {
            let mut digits = [0u8; 24];
            let name = fd_name(fd.as_raw_fd(), &mut digits);
            // SAFETY: dir is an open directory fd (never closed, see
            // `fd_dir`); name is NUL-terminated; the returned fd is owned below.
            check(unsafe { libc::openat(dir, name.as_ptr().cast(), flags) })?
        }
        None => {
            let p = proc_path(fd);
            // SAFETY: p is a valid C string; the returned fd is owned below.
            check(unsafe { libc::open(p.as_ptr(), flags) })?
        }
    };
    // SAFETY: a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(ret) })
}

/// This process's `/proc/self/fd` directory (an `O_PATH` fd opened once
/// and never closed), or `None` in a process forked after it was opened,
/// whose fds that directory does not list, or where it cannot be opened.
fn fd_dir() -> Option<RawFd> {
    static DIR: std::sync::OnceLock<Option<(u32, OwnedFd)>> = std::sync::OnceLock::new();
    let (pid, dir) = DIR
        .get_or_init(|| {
            let p = c"/proc/self/fd";
            let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
            // SAFETY: p is a valid C string; the returned fd is owned below.
            let fd = check(unsafe { libc::open(p.as_ptr(), flags) }).ok()?;
            // SAFETY: a fresh fd owned by nobody else.
            Some((std::process::id(), unsafe { OwnedFd::from_raw_fd(fd) }))
        })
        .as_ref()?;
    (*pid == std::process::id()).then(|| dir.as_raw_fd())
}

/// `fd` in decimal, NUL-terminated, written into `buf`.
fn fd_name(fd: RawFd, buf: &mut [u8; 24]) -> &[u8] {
    let mut n = fd.unsigned_abs();
    let mut i = buf.len() - 1;
    buf[i] = 0;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Opens a directory fd (readable) of the directory behind an `O_PATH` fd.
pub fn open_dir(fd: &impl AsFd) -> io::Result<OwnedFd> {
    open_beneath(fd, OsStr::new("."), libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

pub fn fstatat(dir: &impl AsFd, name: &OsStr) -> io::Result<Stat> {
    let n = cstr(name)?;
    let mut st = MaybeUninit::<Stat>::uninit();
    // SAFETY: n is valid; st is written by the kernel on success.
    check(unsafe {
        libc::fstatat(
            dir.as_fd().as_raw_fd(),
            n.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat succeeded, so st is initialized.
    Ok(unsafe { st.assume_init() })
}

/// The birth time (seconds, nanoseconds) of the file an fd (also
/// `O_PATH`) refers to; `None` where the filesystem does not keep one.
/// With the inode number it names one file for good: a recycled inode
/// number comes with a new birth time.
pub fn birth_time(fd: &impl AsFd) -> io::Result<Option<(i64, u32)>> {
    let mut stx = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: the empty path with AT_EMPTY_PATH names the fd itself; stx
    // is writable and written by the kernel on success.
    check(unsafe {
        libc::statx(
            fd.as_fd().as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BTIME,
            stx.as_mut_ptr(),
        )
    })?;
    // SAFETY: zeroed, then filled by statx on success.
    let stx = unsafe { stx.assume_init() };
    Ok((stx.stx_mask & libc::STATX_BTIME != 0)
        .then_some((stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec)))
}

/// stat of the file an fd (also `O_PATH`) refers to.
pub fn fstat(fd: &impl AsFd) -> io::Result<Stat> {
    let mut st = MaybeUninit::<Stat>::uninit();
    // SAFETY: the empty path with AT_EMPTY_PATH names the fd itself.
    check(unsafe {
        libc::fstatat(
            fd.as_fd().as_raw_fd(),
            c"".as_ptr(),
            st.as_mut_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat succeeded.
    Ok(unsafe { st.assume_init() })
}

pub fn fstatfs(fd: &impl AsFd) -> io::Result<libc::statvfs> {
    let mut st = MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: fstatvfs fills st on success; O_PATH fds are accepted.
    check(unsafe { libc::fstatvfs(fd.as_fd().as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: the call succeeded.
    Ok(unsafe { st.assume_init() })
}

/// The filesystem type (`f_type`, a magic number) of the file behind an fd.
// f_type is an i64 here but narrower, or unsigned, on other architectures.
#[allow(clippy::unnecessary_cast)]
pub fn fstatfs_type(fd: &impl AsFd) -> io::Result<i64> {
    let mut st = MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: fstatfs fills st on success; O_PATH fds are accepted.
    check(unsafe { libc::fstatfs(fd.as_fd().as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: the call succeeded.
    Ok(unsafe { st.assume_init() }.f_type as i64)
}

pub fn mkdirat(dir: &impl AsFd, name: &OsStr, mode: u32) -> io::Result<()> {
    let n = cstr(name)?;
    // SAFETY: n is a valid C string.
    check(unsafe { libc::mkdirat(dir.as_fd().as_raw_fd(), n.as_ptr(), mode) }).map(drop)
}

pub fn mknodat(dir: &impl AsFd, name: &OsStr, mode: u32, rdev: u64) -> io::Result<()> {
    let n = cstr(name)?;
    // SAFETY: n is a valid C string.
    check(unsafe { libc::mknodat(dir.as_fd().as_raw_fd(), n.as_ptr(), mode, rdev) }).map(drop)
}

pub fn symlinkat(target: &OsStr, dir: &impl AsFd, name: &OsStr) -> io::Result<()> {
    let t = cstr(target)?;
    let n = cstr(name)?;
    // SAFETY: both are valid C strings.
    check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_fd().as_raw_fd(), n.as_ptr()) }).map(drop)
}

/// Makes a new name `name` in `dir` for the file behind `fd` (any fd).
pub fn link_fd(fd: &impl AsRawFd, dir: &impl AsFd, name: &OsStr) -> io::Result<()> {
    let p = proc_path(fd);
    let n = cstr(name)?;
    // SAFETY: valid C strings; AT_SYMLINK_FOLLOW resolves the magic link to the inode.
    check(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            p.as_ptr(),
            dir.as_fd().as_raw_fd(),
            n.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
    .map(drop)
}

pub fn linkat(odir: &impl AsFd, oname: &OsStr, ndir: &impl AsFd, nname: &OsStr) -> io::Result<()> {
    let o = cstr(oname)?;
    let n = cstr(nname)?;
    // SAFETY: valid C strings; no symlink following.
    check(unsafe {
        libc::linkat(
            odir.as_fd().as_raw_fd(),
            o.as_ptr(),
            ndir.as_fd().as_raw_fd(),
            n.as_ptr(),
            0,
        )
    })
    .map(drop)
}

pub fn unlinkat(dir: &impl AsFd, name: &OsStr, is_dir: bool) -> io::Result<()> {
    let n = cstr(name)?;
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: n is a valid C string.
    check(unsafe { libc::unlinkat(dir.as_fd().as_raw_fd(), n.as_ptr(), flags) }).map(drop)
}

pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;
pub const RENAME_WHITEOUT: u32 = 4;

pub fn renameat2(
    odir: &impl AsFd,
    oname: &OsStr,
    ndir: &impl AsFd,
    nname: &OsStr,
    flags: u32,
) -> io::Result<()> {
    let o = cstr(oname)?;
    let n = cstr(nname)?;
    // SAFETY: valid C strings; renameat2 never follows symlinks in the last component.
    check(unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            odir.as_fd().as_raw_fd(),
            o.as_ptr(),
            ndir.as_fd().as_raw_fd(),
            n.as_ptr(),
            flags,
        ) as libc::c_int
    })
    .map(drop)
}

/// Target of the symlink behind an `O_PATH` fd.
pub fn readlink_fd(fd: &impl AsFd) -> io::Result<OsString> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: buf is writable for its length; the empty path names the fd (a symlink).
    let n = unsafe {
        libc::readlinkat(
            fd.as_fd().as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(OsString::from_vec(buf))
}

/// chown of the file behind any fd, never following a symlink.
pub fn fchown(fd: &impl AsFd, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    let u = uid.unwrap_or(u32::MAX);
    let g = gid.unwrap_or(u32::MAX);
    // SAFETY: the empty path with AT_EMPTY_PATH names the fd itself.
    check(unsafe {
        libc::fchownat(
            fd.as_fd().as_raw_fd(),
            c"".as_ptr(),
            u,
            g,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// chmod of the (non-symlink) file behind any fd.
pub fn fchmod(fd: &impl AsRawFd, mode: u32) -> io::Result<()> {
    let p = proc_path(fd);
    // SAFETY: p names the inode behind fd.
    check(unsafe { libc::chmod(p.as_ptr(), mode) }).map(drop)
}

/// Sets atime/mtime of the (non-symlink) file behind any fd.
pub fn futimens(fd: &impl AsRawFd, times: &[libc::timespec; 2]) -> io::Result<()> {
    let p = proc_path(fd);
    // SAFETY: p is valid; times points at two timespecs.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) }).map(drop)
}

/// Sets times of `name` in `dir` without following a symlink.
pub fn utimensat_nofollow(
    dir: &impl AsFd,
    name: &OsStr,
    times: &[libc::timespec; 2],
) -> io::Result<()> {
    let n = cstr(name)?;
    // SAFETY: n is valid; times points at two timespecs.
    check(unsafe {
        libc::utimensat(
            dir.as_fd().as_raw_fd(),
            n.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

pub fn ftruncate(fd: &impl AsFd, size: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an owned fd.
    check(unsafe { libc::ftruncate(fd.as_fd().as_raw_fd(), size as libc::off_t) }).map(drop)
}

pub fn fsync(fd: &impl AsFd, datasync: bool) -> io::Result<()> {
    // SAFETY: plain syscalls on an owned fd.
    check(unsafe {
        if datasync {
            libc::fdatasync(fd.as_fd().as_raw_fd())
        } else {
            libc::fsync(fd.as_fd().as_raw_fd())
        }
    })
    .map(drop)
}

pub fn pread(fd: &impl AsFd, buf: &mut [u8], off: u64) -> io::Result<usize> {
    // SAFETY: buf is writable for its length.
    let n = unsafe {
        libc::pread(
            fd.as_fd().as_raw_fd(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            off as i64,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

pub fn pwrite(fd: &impl AsFd, buf: &[u8], off: u64) -> io::Result<usize> {
    // SAFETY: buf is readable for its length.
    let n = unsafe {
        libc::pwrite(
            fd.as_fd().as_raw_fd(),
            buf.as_ptr() as *const libc::c_void,
            buf.len(),
            off as i64,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// write(2) at the file position (for `O_APPEND` files).
pub fn write(fd: &impl AsFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is readable for its length.
    let n = unsafe {
        libc::write(
            fd.as_fd().as_raw_fd(),
            buf.as_ptr() as *const libc::c_void,
            buf.len(),
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

pub fn copy_file_range(
    src: &impl AsFd,
    soff: &mut i64,
    dst: &impl AsFd,
    doff: &mut i64,
    len: usize,
) -> io::Result<usize> {
    // SAFETY: the offsets point at live i64s; the fds are owned.
    let n = unsafe {
        libc::copy_file_range(
            src.as_fd().as_raw_fd(),
            soff,
            dst.as_fd().as_raw_fd(),
            doff,
            len,
            0,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

pub fn fallocate(fd: &impl AsFd, mode: i32, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall.
    check(unsafe { libc::fallocate(fd.as_fd().as_raw_fd(), mode, off as i64, len as i64) })
        .map(drop)
}

pub fn lseek(fd: &impl AsFd, off: i64, whence: i32) -> io::Result<i64> {
    // SAFETY: plain syscall.
    let r = unsafe { libc::lseek(fd.as_fd().as_raw_fd(), off, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// One directory entry as read from a layer.
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: OsString,
    pub ino: u64,
    pub dtype: u8,
}

/// All entries of the directory behind `dir` (an `O_PATH` fd), without `.`/`..`.
pub fn read_dir(dir: &impl AsFd) -> io::Result<Vec<DirEntry>> {
    read_open_dir(&open_dir(dir)?)
}

/// The entries of a directory opened for reading (`O_RDONLY |
/// O_DIRECTORY`) and not read from before: the listing starts where the
/// fd's position is.
pub fn read_open_dir(fd: &impl AsRawFd) -> io::Result<Vec<DirEntry>> {
    thread_local! {
        // One buffer per thread, not one per directory: a walk lists
        // thousands of directories, and a fresh 64 KiB each time costs
        // more than the listing of a small one.
        static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; 64 * 1024]);
    }
    BUF.with(|b| read_open_dir_with(fd.as_raw_fd(), &mut b.borrow_mut()))
}

fn read_open_dir_with(raw: RawFd, buf: &mut [u8]) -> io::Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    while read_dir_into(raw, buf, &mut out)? {}
    Ok(out)
}

/// The next entries of a directory opened for reading, as many as one
/// `getdents64` into `buf` returns (empty at its end): a listing read in
/// steps, from where the fd's position is, holding one step at a time.
pub fn read_dir_step(fd: &impl AsRawFd, buf: &mut [u8]) -> io::Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    read_dir_into(fd.as_raw_fd(), buf, &mut out)?;
    Ok(out)
}

/// One `getdents64` into `buf`, its entries (without `.` and `..`)
/// pushed to `out`; false at the end of the directory.
fn read_dir_into(raw: RawFd, buf: &mut [u8], out: &mut Vec<DirEntry>) -> io::Result<bool> {
    // SAFETY: buf is writable for its length; getdents64 fills it with records.
    let n = unsafe { libc::syscall(libc::SYS_getdents64, raw, buf.as_mut_ptr(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n == 0 {
        return Ok(false);
    }
    let mut off = 0usize;
    while off < n as usize {
        // Record layout of linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name.
        let rec = &buf[off..];
        let ino = u64::from_ne_bytes(rec[0..8].try_into().expect("8 bytes"));
        let reclen = u16::from_ne_bytes(rec[16..18].try_into().expect("2 bytes")) as usize;
        let dtype = rec[18];
        let name_bytes = &rec[19..reclen];
        let len = name_bytes
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(name_bytes.len());
        let name = &name_bytes[..len];
        if name != b"." && name != b".." {
            out.push(DirEntry {
                name: OsStr::from_bytes(name).to_os_string(),
                ino,
                dtype,
            });
        }
        off += reclen;
    }
    Ok(true)
}

/// Asks the kernel to start reading the first `len` bytes of the file
/// behind `fd` into its page cache (`POSIX_FADV_WILLNEED`) and returns
/// without waiting for the disk: a hint, which changes no data.
pub fn will_need(fd: &impl AsFd, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an fd we hold; no memory is passed.
    let r = unsafe {
        libc::posix_fadvise(
            fd.as_fd().as_raw_fd(),
            0,
            len as libc::off_t,
            libc::POSIX_FADV_WILLNEED,
        )
    };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

const MAX_HANDLE_SZ: usize = 128;

/// The file handle of the file behind any fd (`struct file_handle` bytes:
/// u32 size, i32 type, then the opaque handle).
pub fn name_to_handle(fd: &impl AsFd) -> io::Result<Box<[u8]>> {
    let mut buf = vec![0u8; 8 + MAX_HANDLE_SZ];
    buf[0..4].copy_from_slice(&(MAX_HANDLE_SZ as u32).to_ne_bytes());
    let mut mount_id: libc::c_int = 0;
    // SAFETY: buf holds a file_handle header with room for MAX_HANDLE_SZ bytes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            fd.as_fd().as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr(),
            &mut mount_id as *mut libc::c_int,
            libc::AT_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let size = u32::from_ne_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
    buf.truncate(8 + size);
    Ok(buf.into_boxed_slice())
}

/// Opens a file by handle as an `O_PATH` fd; `mount` is any fd on its filesystem.
pub fn open_by_handle(mount: &impl AsFd, handle: &[u8]) -> io::Result<OwnedFd> {
    let mut buf = handle.to_vec();
    // SAFETY: buf is a complete file_handle as name_to_handle returned it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount.as_fd().as_raw_fd(),
            buf.as_mut_ptr(),
            libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// Makes the calling thread yield to the others: CPU nice 10 and the
/// lowest best-effort I/O priority, for background work (the copy pool)
/// that must not slow the threads answering requests. Best effort: a
/// refusal leaves the thread as it was.
pub fn background_thread() -> io::Result<()> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority on our own thread id; no memory is passed.
    check(unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10) })?;
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    const IOPRIO_CLASS_BE: libc::c_long = 2;
    let prio = (IOPRIO_CLASS_BE << 13) | 7;
    // SAFETY: ioprio_set takes three integers; no memory is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            tid as libc::c_long,
            prio,
        )
    };
    check(r as libc::c_int).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_names_are_decimal_and_nul_terminated() {
        let mut buf = [0u8; 24];
        for (fd, want) in [(0, "0"), (7, "7"), (10, "10"), (123_456, "123456")] {
            let name = fd_name(fd, &mut buf);
            assert_eq!(name, format!("{want}\0").as_bytes());
        }
        assert_eq!(fd_name(RawFd::MAX, &mut buf).len(), 11);
    }

    #[test]
    fn reopen_reaches_the_file_behind_an_o_path_fd() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"content").unwrap();
        let root = open_root(dir.path()).unwrap();
        let path = open_path(&root, OsStr::new("f")).unwrap();
        let f = std::fs::File::from(reopen(&path, libc::O_RDONLY).unwrap());
        assert_eq!(std::io::read_to_string(f).unwrap(), "content");
    }
}
