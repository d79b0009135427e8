//! Every `unsafe` call about the process itself, each wrapped in a safe
//! function: forking, what a child does between fork and exec, inherited
//! and received descriptors, file locks, write-back hints, thread
//! priority, inotify, polling raw descriptors, the monotonic clock and the
//! allocator. The other homes of `unsafe` are `layer::sys` (reaching the
//! layers), `sandbox::sys` (building the sandbox) and `fuse::sys` (the
//! kernel's FUSE interface); the rest of the crate denies `unsafe_code`.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sys::signal::Signal;
use nix::unistd::ForkResult;

fn check(ret: libc::c_long) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// How many threads this process has now.
fn threads() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// `fork` in a process that runs one thread only, so that the child may
/// run any code, not only async-signal-safe calls.
///
/// Refused (`EBUSY`) when the process runs other threads: the invariant is
/// checked here, not assumed. Callers fork before anything starts a
/// thread: the sandbox's own processes (a fresh exec that starts none) and
/// the daemon going to the background before it serves.
pub fn fork_single_threaded() -> io::Result<ForkResult> {
    if threads()? != 1 {
        return Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            "cannot fork: the process already runs other threads",
        ));
    }
    // SAFETY: the process has one thread (checked above, and nothing in
    // this call starts one), so the child's copy of memory is consistent.
    unsafe { nix::unistd::fork() }.map_err(io::Error::from)
}

/// Ends a forked child at once, without running the parent's exit
/// handlers or flushing its copied stdio buffers.
pub fn exit_child(code: i32) -> ! {
    // SAFETY: _exit is always safe to call; it does not return.
    unsafe { libc::_exit(code) }
}

/// `prctl(PR_SET_PDEATHSIG)`: the kernel sends `sig` to this process when
/// the thread that forked it exits. Async-signal-safe (used between fork
/// and exec).
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

/// What a spawned child does between fork and exec, limited to
/// async-signal-safe calls: keep some inherited descriptors open across
/// the exec, ask for a signal when its parent dies, leave namespaces.
#[derive(Debug, Default, Clone)]
pub struct ExecSetup {
    keep: Vec<RawFd>,
    parent_death: Option<Signal>,
    unshare: Option<nix::sched::CloneFlags>,
}

impl ExecSetup {
    pub fn new() -> ExecSetup {
        ExecSetup::default()
    }

    /// Keeps `fd` open across the exec (it must stay open in the parent
    /// until the child is spawned).
    pub fn keep(mut self, fd: RawFd) -> ExecSetup {
        self.keep.push(fd);
        self
    }

    /// Has the kernel send `sig` to the child when the spawning thread exits.
    pub fn die_with_parent(mut self, sig: Signal) -> ExecSetup {
        self.parent_death = Some(sig);
        self
    }

    /// Moves the child into new namespaces (`unshare`) before the exec.
    pub fn unshare(mut self, flags: nix::sched::CloneFlags) -> ExecSetup {
        self.unshare = Some(flags);
        self
    }

    /// Installs the set-up on `cmd`.
    pub fn apply(self, cmd: &mut Command) {
        let hook = move || -> io::Result<()> {
            for fd in &self.keep {
                keep_across_exec(*fd)?;
            }
            if let Some(sig) = self.parent_death {
                set_parent_death_signal(sig)?;
            }
            if let Some(flags) = self.unshare {
                nix::sched::unshare(flags)?;
            }
            Ok(())
        };
        // SAFETY: the hook runs in the forked child before exec and only
        // reads its own captured, already-allocated data and makes
        // async-signal-safe system calls (fcntl, prctl, unshare): no
        // allocation, no lock.
        unsafe {
            cmd.pre_exec(hook);
        }
    }
}

/// Receives one descriptor sent with `SCM_RIGHTS` on `sock`; `None` at
/// end of stream or for a message that carries none. Interrupted calls
/// are retried.
pub fn receive_fd(sock: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = loop {
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::Error::EINTR) => continue,
            r => break r.map_err(io::Error::from)?,
        }
    };
    let mut got = None;
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                // SAFETY: the kernel installed this descriptor in our table
                // for this message; nothing else refers to it.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                if got.is_none() {
                    got = Some(owned);
                }
            }
        }
    }
    Ok(got)
}

/// `flock(2)` on a descriptor: `LOCK_EX`, `LOCK_SH`, `LOCK_UN`, with
/// `LOCK_NB` as wanted.
pub fn flock(fd: impl AsFd, op: libc::c_int) -> io::Result<()> {
    // SAFETY: flock takes a descriptor and flags; no memory is passed.
    check(unsafe { libc::flock(fd.as_fd().as_raw_fd(), op) } as libc::c_long)
}

/// Starts write-back of `len` bytes at `offset` without waiting
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`): a head start for the
/// `fsync` that follows.
pub fn start_writeback(fd: impl AsFd, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: integers only; the kernel checks the descriptor.
    let r = unsafe {
        libc::sync_file_range(
            fd.as_fd().as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
    check(r as libc::c_long)
}

/// `syncfs(2)`: makes the filesystem holding `fd` durable.
pub fn syncfs(fd: impl AsFd) -> io::Result<()> {
    nix::unistd::syncfs(fd.as_fd().as_raw_fd()).map_err(io::Error::from)
}

/// Lowers the calling thread's priority by `by` nice levels (to at most
/// 19); other threads keep theirs.
pub fn lower_thread_priority(by: i32) -> io::Result<()> {
    // SAFETY: gettid, getpriority and setpriority take no pointers; on
    // Linux PRIO_PROCESS with a thread id reads and changes that thread's
    // nice value only (getpriority returns the nice value itself).
    let r = unsafe {
        let tid = libc::gettid() as libc::id_t;
        let now = libc::getpriority(libc::PRIO_PROCESS, tid);
        libc::setpriority(libc::PRIO_PROCESS, tid, (now + by).min(19))
    };
    check(r as libc::c_long)
}

/// Gives the calling thread its own filesystem context (`unshare
/// (CLONE_FS)`: cwd, root and umask no longer shared with the other
/// threads) and sets its umask to 0.
pub fn private_thread_umask_zero() -> io::Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS)?;
    nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    Ok(())
}

/// The monotonic clock in microseconds (systemd's `MONOTONIC_USEC`).
pub fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// Waits without a timeout until one of `fds` is ready; `revents` of each
/// entry are set. Entries with a negative fd are ignored by the kernel.
pub fn poll_forever(fds: &mut [libc::pollfd]) -> io::Result<usize> {
    // SAFETY: fds is a valid, exclusively borrowed array of fds.len()
    // pollfd structs for the whole call.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Returns freed heap memory to the system (glibc's `malloc_trim`); a
/// no-op elsewhere.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// An inotify instance (`inotify_init1(IN_CLOEXEC)`).
pub fn inotify_init() -> io::Result<OwnedFd> {
    // SAFETY: inotify_init1 takes only flags.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds (or updates) a watch on `path`; the watch descriptor.
pub fn inotify_add_watch(inotify: BorrowedFd<'_>, path: &CStr, mask: u32) -> io::Result<i32> {
    // SAFETY: path is a valid NUL-terminated string the call only reads.
    let wd = unsafe { libc::inotify_add_watch(inotify.as_raw_fd(), path.as_ptr(), mask) };
    if wd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(wd)
}

/// Removes watch `wd`; a stale one only yields `EINVAL`, ignored.
pub fn inotify_rm_watch(inotify: BorrowedFd<'_>, wd: i32) {
    // SAFETY: integers only.
    unsafe { libc::inotify_rm_watch(inotify.as_raw_fd(), wd) };
}

/// One inotify event as read from the instance.
#[derive(Debug, Clone)]
pub struct InotifyEvent {
    pub wd: i32,
    pub mask: u32,
    /// The name within the watched directory, without its NUL padding.
    pub name: Vec<u8>,
}

/// Blocks until the instance has events, and returns them.
pub fn inotify_read(inotify: BorrowedFd<'_>) -> io::Result<Vec<InotifyEvent>> {
    let mut buf = vec![0u8; 64 * 1024];
    let n = loop {
        match nix::unistd::read(inotify.as_raw_fd(), &mut buf) {
            Ok(n) => break n,
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    Ok(parse_inotify(&buf[..n]))
}

/// Decodes the kernel's `struct inotify_event` records (wd, mask, cookie,
/// len, then `len` bytes of NUL-padded name), in native byte order.
fn parse_inotify(buf: &[u8]) -> Vec<InotifyEvent> {
    const HEAD: usize = 16;
    let word = |at: usize| -> [u8; 4] { buf[at..at + 4].try_into().expect("4 bytes") };
    let mut out = Vec::new();
    let mut off = 0;
    while off + HEAD <= buf.len() {
        let wd = i32::from_ne_bytes(word(off));
        let mask = u32::from_ne_bytes(word(off + 4));
        let len = u32::from_ne_bytes(word(off + 12)) as usize;
        let raw = &buf[off + HEAD..(off + HEAD + len).min(buf.len())];
        let name = raw.split(|b| *b == 0).next().unwrap_or_default().to_vec();
        out.push(InotifyEvent { wd, mask, name });
        off += HEAD + len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inotify_events_decode_as_the_kernel_writes_them() {
        assert_eq!(std::mem::size_of::<libc::inotify_event>(), 16);
        let mut buf = Vec::new();
        for (wd, mask, name) in [(3i32, libc::IN_CREATE, &b"a.txt"[..]), (7, 0x40, b"")] {
            let padded = if name.is_empty() { 0 } else { 16 };
            buf.extend_from_slice(&wd.to_ne_bytes());
            buf.extend_from_slice(&mask.to_ne_bytes());
            buf.extend_from_slice(&0u32.to_ne_bytes());
            buf.extend_from_slice(&(padded as u32).to_ne_bytes());
            let mut n = name.to_vec();
            n.resize(padded, 0);
            buf.extend_from_slice(&n);
        }
        let ev = parse_inotify(&buf);
        assert_eq!(ev.len(), 2);
        assert_eq!(
            (ev[0].wd, ev[0].mask, ev[0].name.as_slice()),
            (3, libc::IN_CREATE, &b"a.txt"[..])
        );
        assert_eq!((ev[1].wd, ev[1].mask, ev[1].name.len()), (7, 0x40, 0));
    }

    #[test]
    fn a_real_inotify_instance_reports_a_created_file() {
        let dir = tempfile::tempdir().unwrap();
        let fd = inotify_init().unwrap();
        let path = std::ffi::CString::new(dir.path().to_str().unwrap()).unwrap();
        let wd = inotify_add_watch(fd.as_fd(), &path, libc::IN_CREATE).unwrap();
        std::fs::write(dir.path().join("new"), b"x").unwrap();
        let ev = inotify_read(fd.as_fd()).unwrap();
        assert!(ev.iter().any(|e| e.wd == wd && e.name == b"new"), "{ev:?}");
        inotify_rm_watch(fd.as_fd(), wd);
    }

    #[test]
    fn forking_is_refused_while_other_threads_run() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || rx.recv());
        let e = fork_single_threaded().map(|_| ()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ResourceBusy);
        drop(tx);
        let _ = t.join();
    }
}
