//! Every `unsafe` call the sandbox makes, each wrapped in a safe function:
//! the new mount API (`open_tree`, `move_mount`, `mount_setattr`, which
//! `nix` does not wrap), `openat2`, `fork`, `prctl`, signal dispositions
//! and the loopback interface's flags.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::sys::signal::{SigHandler, Signal};
use nix::unistd::ForkResult;

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: path contains a NUL byte", p.display()),
        )
    })
}

/// The returned value of a syscall that yields an fd, owned.
fn owned_fd(ret: libc::c_long) -> io::Result<OwnedFd> {
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) })
}

fn check(ret: libc::c_long) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`: a detached copy of the
/// mount at `path` and every mount below it, as an fd (Linux ≥ 5.2).
pub fn clone_tree(path: &Path) -> io::Result<OwnedFd> {
    let p = cstr(path)?;
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as u32;
    // SAFETY: p is a valid C string that outlives the call.
    owned_fd(unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, p.as_ptr(), flags) })
}

/// `move_mount`: attaches the (detached) mount tree `tree` on `target`.
pub fn attach(tree: BorrowedFd<'_>, target: &Path) -> io::Result<()> {
    let t = cstr(target)?;
    let empty = c"";
    // SAFETY: both strings outlive the call; `tree` is a live descriptor.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    })
}

/// Where `mount_setattr` applies.
pub enum At<'a> {
    /// The mount tree behind an fd from `clone_tree`.
    Fd(BorrowedFd<'a>),
    /// The mount at this path.
    Path(&'a Path),
}

/// `mount_setattr`: sets `set` and clears `clr` (`MOUNT_ATTR_*`) on one
/// mount, or with `recursive` on every mount of the tree (Linux ≥ 5.12).
pub fn set_mount_attr(at: At<'_>, recursive: bool, set: u64, clr: u64) -> io::Result<()> {
    let mut attr = libc::mount_attr {
        attr_set: set,
        attr_clr: clr,
        propagation: 0,
        userns_fd: 0,
    };
    let mut flags: libc::c_uint = if recursive {
        libc::AT_RECURSIVE as libc::c_uint
    } else {
        0
    };
    let (dirfd, path) = match at {
        At::Fd(fd) => {
            flags |= libc::AT_EMPTY_PATH as libc::c_uint;
            (fd.as_raw_fd(), CString::default())
        }
        At::Path(p) => (libc::AT_FDCWD, cstr(p)?),
    };
    // SAFETY: path and attr outlive the call; the size is that of `attr`.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            &mut attr as *mut libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    })
}

/// An `O_PATH | O_DIRECTORY` fd of `rel` beneath `dir`, with
/// `openat2(RESOLVE_BENEATH)`: `..` or a symlink leading outside `dir`
/// fails with `EXDEV`, symlinks that stay inside are followed.
pub fn open_dir_beneath(dir: BorrowedFd<'_>, rel: &Path) -> io::Result<OwnedFd> {
    use crate::layer::sys::{openat2, RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS};
    openat2(
        &dir,
        rel.as_os_str(),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
    )
}

/// `fork` in one of the sandbox's own processes.
///
/// Invariant relied on: every sandbox process (`layerfs __sandbox` and its
/// children) is single-threaded — it is a fresh exec that starts no thread
/// — so the child may run any code, not only async-signal-safe calls.
pub fn fork_single_threaded() -> io::Result<ForkResult> {
    // SAFETY: see the invariant above.
    unsafe { nix::unistd::fork() }.map_err(io::Error::from)
}

/// Ends a forked child at once, without running the parent's exit
/// handlers or flushing its copied stdio buffers.
pub fn exit_child(code: i32) -> ! {
    // SAFETY: _exit is always safe to call; it does not return.
    unsafe { libc::_exit(code) }
}

/// `prctl(PR_SET_PDEATHSIG)`: the kernel sends `sig` to this process when
/// the thread that forked it exits. Async-signal-safe (used in `pre_exec`).
pub fn set_parent_death_signal(sig: Signal) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) };
    check(r as libc::c_long)
}

/// Clears `FD_CLOEXEC` so `fd` survives an exec. Async-signal-safe.
pub fn keep_across_exec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor number; a bad one fails with EBADF.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } as libc::c_long)
}

/// Sets `FD_CLOEXEC` on `fd`.
pub fn close_on_exec(fd: RawFd) -> io::Result<()> {
    // SAFETY: as in keep_across_exec.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } as libc::c_long)
}

/// Takes ownership of an inherited descriptor number.
///
/// The caller names a descriptor its parent passed it on purpose and that
/// nothing else in this process owns.
pub fn adopt_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_GETFD only checks that the descriptor is open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open (checked above), and owned by nobody else per the contract.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `sig` is ignored (`SIG_IGN`) in this process.
pub fn is_ignored(sig: Signal) -> bool {
    let mut old: libc::sigaction = zeroed_sigaction();
    // SAFETY: a query only (act is null); old is a valid out-pointer.
    let r = unsafe { libc::sigaction(sig as libc::c_int, std::ptr::null(), &mut old) };
    r == 0 && old.sa_sigaction == libc::SIG_IGN
}

fn zeroed_sigaction() -> libc::sigaction {
    // SAFETY: sigaction is plain data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Sets the disposition of `sig` to ignore or default (never a handler).
pub fn set_disposition(sig: Signal, ignore: bool) -> io::Result<()> {
    let h = if ignore {
        SigHandler::SigIgn
    } else {
        SigHandler::SigDfl
    };
    // SAFETY: SIG_IGN and SIG_DFL install no code that could run unsafely.
    unsafe { nix::sys::signal::signal(sig, h) }
        .map(|_| ())
        .map_err(io::Error::from)
}

/// Brings network interface `name` up (`SIOCSIFFLAGS |= IFF_UP`).
pub fn interface_up(name: &str) -> io::Result<()> {
    // SAFETY: a plain socket call; the fd is owned right away.
    let sock =
        owned_fd(
            unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) }
                as libc::c_long,
        )?;
    // SAFETY: ifreq is plain data; all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name} is too long"),
        ));
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: req is a valid ifreq for both ioctls; the flags member of the
    // union is the one SIOCGIFFLAGS fills and SIOCSIFFLAGS reads.
    unsafe {
        check(libc::ioctl(sock.as_fd().as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) as libc::c_long)?;
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        check(libc::ioctl(sock.as_fd().as_raw_fd(), libc::SIOCSIFFLAGS, &req) as libc::c_long)
    }
}
