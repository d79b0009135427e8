//! The command's terminal. The command never holds the caller's terminal:
//! a process that does can push keystrokes into it with `TIOCSTI`, which
//! the caller's shell then runs after `layerfs run` returns, outside the
//! sandbox. So the command runs in a session of its own (`setsid`), and
//! the sandbox's processes never inherit a descriptor of the caller's
//! terminal (`layerfs run` hands them `/dev/null` or pipes instead).
//!
//! When the caller has a terminal, the command gets a new pseudo-terminal
//! from the sandbox's own devpts instance (so `tty` and `/dev/pts` inside
//! show it) as its controlling terminal on the descriptors that were
//! terminals; the init sends its master to `layerfs run` over a Unix
//! socket, and `layerfs run` relays between the caller's terminal and it
//! (`crate::run`). What the command pushes into its terminal then only
//! reaches its own input.

use std::fs::OpenOptions;
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::pty::{grantpt, posix_openpt, ptsname_r, unlockpt};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

use super::sys;

/// A step of giving the command its terminal that failed.
#[derive(Debug, thiserror::Error)]
pub enum TerminalError {
    /// A step (`what`: "opening /dev/ptmx", "grantpt", ...) of making the
    /// pseudo-terminal and handing it over.
    #[error("{what} for the command's terminal: {source}")]
    Pty {
        what: &'static str,
        source: nix::Error,
    },
    /// Setting the window size of the terminal at `path`.
    #[error("setting the window size of {path}: {source}")]
    WindowSize {
        path: String,
        source: std::io::Error,
    },
    #[error("setsid: {0}")]
    Setsid(#[source] nix::Error),
    #[error("opening the command's terminal {}: {source}", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Putting the terminal on the command's descriptor `fd`.
    #[error("terminal on descriptor {fd}: {source}")]
    Dup { fd: i32, source: nix::Error },
}

/// In the init, after the pivot: opens a pseudo-terminal of the sandbox's
/// devpts, gives it the caller's window size, hands its master to
/// `layerfs run` over `socket` and closes its own copy. Returns the path
/// of the terminal (its slave) for the command to open.
pub fn open_and_hand_over(socket: OwnedFd, rows: u16, cols: u16) -> Result<PathBuf, TerminalError> {
    let fail = |what: &'static str, source: nix::Error| TerminalError::Pty { what, source };
    let master = posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)
        .map_err(|e| fail("opening /dev/ptmx", e))?;
    grantpt(&master).map_err(|e| fail("grantpt", e))?;
    unlockpt(&master).map_err(|e| fail("unlockpt", e))?;
    let path = ptsname_r(&master).map_err(|e| fail("ptsname", e))?;
    sys::set_window_size(master.as_fd(), rows, cols).map_err(|source| {
        TerminalError::WindowSize {
            path: path.clone(),
            source,
        }
    })?;
    let fds = [master.as_raw_fd()];
    sendmsg::<()>(
        socket.as_raw_fd(),
        &[IoSlice::new(b"m")],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| fail("handing the terminal to layerfs run", e))?;
    Ok(PathBuf::from(path))
}

/// In the command's process, before exec: a session of its own, so it has
/// no controlling terminal; with `pty`, that terminal becomes its
/// controlling terminal and is put on descriptors `fds` (of 0, 1, 2).
pub fn enter_session(pty: Option<(&Path, &[i32])>) -> Result<(), TerminalError> {
    nix::unistd::setsid().map_err(TerminalError::Setsid)?;
    if let Some((path, fds)) = pty {
        // Opened without O_NOCTTY by a session leader with no controlling
        // terminal: it becomes the controlling terminal.
        let tty = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| TerminalError::Open {
                path: path.to_path_buf(),
                source,
            })?;
        for &fd in fds {
            nix::unistd::dup2(tty.as_raw_fd(), fd)
                .map_err(|source| TerminalError::Dup { fd, source })?;
        }
    }
    Ok(())
}

/// In `layerfs run`: the master the init sent on `socket`, `None` if the
/// socket closed without one.
pub fn receive_master(socket: BorrowedFd<'_>) -> std::io::Result<Option<OwnedFd>> {
    sys::receive_fd(socket)
}

/// A terminal's window size, (rows, columns).
pub fn window_size(tty: BorrowedFd<'_>) -> std::io::Result<(u16, u16)> {
    sys::window_size(tty)
}

/// Sets a terminal's window size; its foreground process group gets
/// `SIGWINCH`.
pub fn set_window_size(tty: BorrowedFd<'_>, rows: u16, cols: u16) -> std::io::Result<()> {
    sys::set_window_size(tty, rows, cols)
}
