//! Extended attributes: get, set, remove and list, by fd, by `/proc`
//! path for `O_PATH` fds, and by name in a directory (`listxattrat`).

use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd};

use super::*;

/// Reads an xattr of the (non-symlink) file behind any fd.
pub fn getxattr(fd: &impl AsRawFd, name: &CStr) -> io::Result<Vec<u8>> {
    let p = proc_path(fd);
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: buf is writable for its length; p and name are valid.
        let n = unsafe {
            libc::getxattr(
                p.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
            )
        };
        if n >= 0 {
            buf.truncate(n as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
        // SAFETY: a size query with a null buffer.
        let need = unsafe { libc::getxattr(p.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
        if need < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.resize(need as usize + 1, 0);
    }
}

pub fn setxattr(fd: &impl AsRawFd, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    let p = proc_path(fd);
    // SAFETY: valid pointers and lengths.
    check(unsafe {
        libc::setxattr(
            p.as_ptr(),
            name.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            flags,
        )
    })
    .map(drop)
}

pub fn removexattr(fd: &impl AsRawFd, name: &CStr) -> io::Result<()> {
    let p = proc_path(fd);
    // SAFETY: valid C strings.
    check(unsafe { libc::removexattr(p.as_ptr(), name.as_ptr()) }).map(drop)
}

/// The raw NUL-separated xattr name list of the file behind any fd.
/// Runs an xattr-listing call (`call(buf, len)`, as listxattr(2) takes
/// them) until the buffer is large enough; the names, NUL-separated.
fn list_names(
    initial: usize,
    call: impl Fn(*mut libc::c_char, usize) -> isize,
) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; initial];
    loop {
        let n = call(buf.as_mut_ptr() as *mut libc::c_char, buf.len());
        if n >= 0 {
            buf.truncate(n as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
        // A size query with a null buffer.
        let need = call(std::ptr::null_mut(), 0);
        if need < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.resize(need as usize + 1, 0);
    }
}

/// The xattr names of a file opened for real (not `O_PATH`), NUL-separated.
pub fn flistxattr(fd: &impl AsRawFd) -> io::Result<Vec<u8>> {
    // SAFETY: list_names passes a buffer writable for `len` bytes, or a
    // null one with length 0 (a size query); fd is an open file.
    list_names(256, |buf, len| unsafe {
        libc::flistxattr(fd.as_raw_fd(), buf, len)
    })
}

pub fn listxattr(fd: &impl AsRawFd) -> io::Result<Vec<u8>> {
    let p = proc_path(fd);
    // SAFETY: as in flistxattr; p is a valid C string.
    list_names(1024, |buf, len| unsafe {
        libc::listxattr(p.as_ptr(), buf, len)
    })
}

/// `listxattrat(2)` (Linux 6.13; the same number on every architecture).
const SYS_LISTXATTRAT: libc::c_long = 465;

/// The raw xattr name list of `name` in `dir`, not following a symlink:
/// one call with `listxattrat` where the kernel has it, else through an
/// `O_PATH` fd (symlinks then report none).
pub fn listxattr_at(dir: &impl AsFd, name: &OsStr) -> io::Result<Vec<u8>> {
    let n = cstr(name)?;
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: n is a valid C string; buf is writable for its length.
        let r = unsafe {
            libc::syscall(
                SYS_LISTXATTRAT,
                dir.as_fd().as_raw_fd(),
                n.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        if r >= 0 {
            buf.truncate(r as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) => buf.resize(buf.len() * 4, 0),
            Some(libc::ENOSYS) => {
                let fd = open_path(dir, name)?;
                if fstat(&fd)?.st_mode & libc::S_IFMT == libc::S_IFLNK {
                    return Ok(Vec::new());
                }
                return listxattr(&fd);
            }
            _ => return Err(e),
        }
    }
}
