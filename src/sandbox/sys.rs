//! Every `unsafe` call the sandbox makes, each wrapped in a safe function:
//! the new mount API (`open_tree`, `move_mount`, `mount_setattr`, which
//! `nix` does not wrap), `openat2`, signal dispositions, the loopback
//! interface's flags, capabilities (`capset`), Landlock, the session
//! keyring and terminal window sizes. Forking, descriptors passed across
//! exec or a socket, and the parent-death signal are process calls that
//! others need too: their home is `crate::sys`, re-exported here.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::sys::signal::{SigHandler, Signal};

pub use crate::sys::{
    adopt_fd, close_on_exec, exit_child, fork_single_threaded, receive_fd, set_parent_death_signal,
};

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

/// Marks this process non-dumpable: processes of its user namespace that
/// lack `CAP_SYS_PTRACE` can no longer ptrace it or open its
/// `/proc/PID/fd` entries.
pub fn set_not_dumpable() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) };
    check(r as libc::c_long)
}

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Limits this process to the capabilities in `keep` (a bit per
/// capability number): every other one leaves the bounding set (so no
/// exec can give it back), the permitted and effective sets become
/// `keep`, the inheritable and ambient sets empty.
pub fn limit_capabilities(keep: u64) -> io::Result<()> {
    for cap in 0..64u32 {
        if keep & (1u64 << cap) != 0 {
            continue;
        }
        // SAFETY: prctl with integer arguments only.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            // EINVAL: past the kernel's last capability.
            if e.raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(e);
        }
    }
    // SAFETY: prctl with integer arguments only. EINVAL on kernels before
    // 4.3, which have no ambient set to clear.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
        return Err(io::Error::last_os_error());
    }
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let word = |shift: u32| CapData {
        effective: (keep >> shift) as u32,
        permitted: (keep >> shift) as u32,
        inheritable: 0,
    };
    let data = [word(0), word(32)];
    // SAFETY: header and data are valid for the call; version 3 reads two
    // CapData entries, which `data` holds.
    check(unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) })
}

/// `LANDLOCK_CREATE_RULESET_VERSION`: ask `landlock_create_ruleset` for the ABI.
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

#[repr(C)]
struct LandlockRulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// The Landlock ABI version this kernel offers, `None` when Landlock is
/// missing or disabled.
pub fn landlock_abi() -> Option<i64> {
    // SAFETY: a null attribute with size 0 and the version flag only
    // queries the ABI.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<LandlockRulesetAttr>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    (r > 0).then_some(r)
}

/// Restricts this process and its future children to a Landlock domain
/// that handles no file or network access and only the given scopes
/// (`LANDLOCK_SCOPE_*`, ABI 6 and later). Needs `no_new_privs` or
/// `CAP_SYS_ADMIN` in the current user namespace.
pub fn landlock_restrict_scopes(scoped: u64) -> io::Result<()> {
    let attr = LandlockRulesetAttr {
        handled_access_fs: 0,
        handled_access_net: 0,
        scoped,
    };
    // SAFETY: attr is a valid landlock_ruleset_attr of the size given.
    let ruleset = owned_fd(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const LandlockRulesetAttr,
            std::mem::size_of::<LandlockRulesetAttr>(),
            0 as libc::c_uint,
        )
    })?;
    // SAFETY: a live ruleset descriptor and no flags.
    check(unsafe {
        libc::syscall(
            libc::SYS_landlock_restrict_self,
            ruleset.as_raw_fd(),
            0 as libc::c_uint,
        )
    })
}

/// `KEYCTL_JOIN_SESSION_KEYRING`.
const KEYCTL_JOIN_SESSION_KEYRING: libc::c_int = 1;

/// Joins a new, anonymous session keyring, leaving the one inherited from
/// the caller.
pub fn join_new_session_keyring() -> io::Result<()> {
    // SAFETY: a null name asks for a new anonymous keyring.
    check(unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_JOIN_SESSION_KEYRING,
            std::ptr::null::<libc::c_char>(),
        )
    })
}

/// A terminal's window size (`TIOCGWINSZ`): (rows, columns).
pub fn window_size(tty: BorrowedFd<'_>) -> io::Result<(u16, u16)> {
    // SAFETY: winsize is plain data; all-zero is valid.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ fills the winsize it is given.
    check(unsafe { libc::ioctl(tty.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) } as libc::c_long)?;
    Ok((ws.ws_row, ws.ws_col))
}

/// Sets a terminal's window size (`TIOCSWINSZ`); the kernel sends
/// `SIGWINCH` to its foreground process group when it changes.
pub fn set_window_size(tty: BorrowedFd<'_>, rows: u16, cols: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads the winsize it is given.
    check(unsafe { libc::ioctl(tty.as_raw_fd(), libc::TIOCSWINSZ, &ws) } as libc::c_long)
}

/// The system's reason, as the call that failed reported it.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    #[error(transparent)]
    Nix(#[from] nix::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
