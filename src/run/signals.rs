//! The signals that ask `layerfs run` to stop (SIGINT, SIGTERM, SIGHUP,
//! SIGQUIT): blocked from the start and read from a signalfd in the event
//! loops, so a stop request at any moment — mounting, running, cleaning up
//! — still ends in an unmounted workspace.

use std::os::fd::{AsFd, BorrowedFd};

use nix::sys::signal::{SigSet, SigmaskHow};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::sandbox::STOP_SIGNALS;

/// Why the signals a run reads could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// Blocking `what` ("signals", "SIGWINCH") in this process.
    #[error("blocking {what}: {source}")]
    Block {
        what: &'static str,
        source: nix::Error,
    },
    #[error("signalfd: {0}")]
    Signalfd(#[source] nix::Error),
}

/// A stop request. Even one the terminal sent to the whole foreground
/// process group (Ctrl-C when stdin is no terminal, a hangup) has not
/// reached the command: it runs in a session of its own.
#[derive(Debug, Clone, Copy)]
pub struct StopRequest {
    pub signal: i32,
}

pub struct StopSignals {
    fd: SignalFd,
}

impl StopSignals {
    /// Blocks the stop signals in this (single-threaded) process and
    /// opens a signalfd for them. Children get an empty mask (std resets
    /// it before exec).
    pub fn install() -> Result<StopSignals, SignalError> {
        let mut set = SigSet::empty();
        for s in STOP_SIGNALS {
            set.add(s);
        }
        nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None).map_err(
            |source| SignalError::Block {
                what: "signals",
                source,
            },
        )?;
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
            .map_err(SignalError::Signalfd)?;
        Ok(StopSignals { fd })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The next pending stop request, if any.
    pub fn take(&self) -> Option<StopRequest> {
        let info = self.fd.read_signal().ok()??;
        Some(StopRequest {
            signal: info.ssi_signo as i32,
        })
    }
}
