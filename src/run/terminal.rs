//! The caller's terminal, seen from `layerfs run`. The sandbox never gets
//! a descriptor of it (a process holding it could push keystrokes into the
//! caller's shell with `TIOCSTI`; see `crate::sandbox::terminal`): when
//! stdin, stdout or stderr is a terminal, the command gets a
//! pseudo-terminal of the sandbox's own on those descriptors, and
//! `layerfs run` relays between the two.
//!
//! - Input: when stdin is a terminal and `layerfs run` is in its
//!   foreground process group, what the user types is read from it and
//!   written to the pseudo-terminal. The caller's terminal is in raw mode
//!   meanwhile (nothing echoed, edited or translated locally, Ctrl-C a
//!   byte that the pseudo-terminal's line discipline turns into SIGINT for
//!   the command's foreground group): every byte written to it comes from
//!   the pseudo-terminal, which does its own output processing. The old
//!   mode comes back when the relay ends, on every path: `Drop`, and
//!   nothing kills the run before it (the stop signals are read from a
//!   signalfd).
//! - Output: what the pseudo-terminal prints goes to stdout when that is a
//!   terminal, else to stderr, else back to the terminal on stdin (echo).
//! - Window size: copied when the sandbox starts and at every `SIGWINCH`.
//! - Inherited descriptors above 2 that are terminals are closed on exec,
//!   so none reaches the sandbox either.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::termios::{self, SetArg, Termios};

use super::relay::Stream;
use super::signals::SignalError;
use crate::sandbox::terminal as pty;

/// The caller's terminal, while a command runs on a pseudo-terminal.
pub struct CallerTerminal {
    /// Which of descriptors 0, 1, 2 are terminals.
    fds: Vec<i32>,
    /// Whether what is typed on stdin is relayed to the command.
    input: bool,
    /// The mode to restore, once raw mode is on.
    saved: Option<Termios>,
    winch: SignalFd,
}

fn is_terminal(fd: RawFd) -> bool {
    nix::unistd::isatty(fd).unwrap_or(false)
}

/// Runs `f` on descriptor 0, 1 or 2.
fn with_std_fd<R>(fd: RawFd, f: impl FnOnce(BorrowedFd<'_>) -> R) -> R {
    match fd {
        0 => f(std::io::stdin().as_fd()),
        1 => f(std::io::stdout().as_fd()),
        _ => f(std::io::stderr().as_fd()),
    }
}

impl CallerTerminal {
    /// The caller's terminal, if any of stdin, stdout, stderr is one.
    pub fn detect() -> Result<Option<CallerTerminal>, SignalError> {
        let fds: Vec<i32> = (0..3).filter(|fd| is_terminal(*fd)).collect();
        if fds.is_empty() {
            return Ok(None);
        }
        // In the background, reading the terminal would stop the run
        // (SIGTTIN): then the command's terminal gets no input.
        let input = fds.contains(&0)
            && nix::unistd::tcgetpgrp(std::io::stdin()).is_ok_and(|g| g == nix::unistd::getpgrp());
        let mut set = SigSet::empty();
        set.add(Signal::SIGWINCH);
        nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None).map_err(
            |source| SignalError::Block {
                what: "SIGWINCH",
                source,
            },
        )?;
        let winch = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
            .map_err(SignalError::Signalfd)?;
        Ok(Some(CallerTerminal {
            fds,
            input,
            saved: None,
            winch,
        }))
    }

    /// Which of the command's descriptors 0, 1, 2 get its terminal.
    pub fn fds(&self) -> &[i32] {
        &self.fds
    }

    /// Whether typed input is relayed (stdin is a terminal, in the
    /// foreground).
    pub fn relays_input(&self) -> bool {
        self.input
    }

    /// Where the pseudo-terminal's output goes.
    pub fn output(&self) -> Stream {
        if self.fds.contains(&1) {
            Stream::Out
        } else if self.fds.contains(&2) {
            Stream::Err
        } else {
            Stream::Terminal
        }
    }

    /// The caller's window size, (rows, columns); 0×0 if unknown.
    pub fn size(&self) -> (u16, u16) {
        self.fds
            .iter()
            .find_map(|fd| with_std_fd(*fd, |f| pty::window_size(f).ok()))
            .unwrap_or((0, 0))
    }

    /// Copies the caller's window size to the command's terminal.
    pub fn copy_size(&self, master: BorrowedFd<'_>) {
        let (rows, cols) = self.size();
        if let Err(e) = pty::set_window_size(master, rows, cols) {
            tracing::debug!("setting the command's window size: {e}");
        }
    }

    /// The signalfd that becomes readable at a `SIGWINCH`.
    pub fn winch_fd(&self) -> BorrowedFd<'_> {
        self.winch.as_fd()
    }

    /// Consumes pending `SIGWINCH`s; whether there was one.
    pub fn take_winch(&self) -> bool {
        let mut any = false;
        while let Ok(Some(_)) = self.winch.read_signal() {
            any = true;
        }
        any
    }

    /// Puts the caller's terminal in raw mode (if input is relayed).
    /// `Drop` restores it.
    pub fn enter_raw(&mut self) {
        if !self.input || self.saved.is_some() {
            return;
        }
        let Ok(saved) = termios::tcgetattr(std::io::stdin()) else {
            return;
        };
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        if termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &raw).is_ok() {
            self.saved = Some(saved);
        }
    }

    /// Restores the caller's terminal mode, if raw mode changed it.
    pub fn restore(&mut self) {
        if let Some(saved) = self.saved.take() {
            if let Err(e) = termios::tcsetattr(std::io::stdin(), SetArg::TCSADRAIN, &saved) {
                tracing::warn!("restoring the terminal's mode: {e}");
            }
        }
    }
}

impl Drop for CallerTerminal {
    fn drop(&mut self) {
        self.restore();
        let mut set = SigSet::empty();
        set.add(Signal::SIGWINCH);
        let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None);
    }
}

/// The command's terminal master as received from the sandbox, made
/// non-blocking for the relay loop.
pub fn receive_master(socket: BorrowedFd<'_>) -> std::io::Result<Option<File>> {
    let Some(fd) = pty::receive_master(socket)? else {
        return Ok(None);
    };
    set_nonblocking(&fd)?;
    Ok(Some(File::from(fd)))
}

/// Sets `O_NONBLOCK` on `fd`.
pub fn set_nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    let flags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?;
    fcntl(
        fd.as_raw_fd(),
        FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
    )?;
    Ok(())
}

/// Marks every inherited descriptor above 2 that is a terminal
/// close-on-exec, so the sandbox cannot inherit one.
pub fn close_inherited_terminals() {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<RawFd> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        if is_terminal(fd) {
            let _ = fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
        }
    }
}
