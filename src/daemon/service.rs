//! The daemon's one service thread: it takes the handled signals (from a
//! signalfd; they are blocked in every thread), the control socket's
//! connections and the lower watch's inotify events, waiting for all in
//! one poll(2) with no timeout, so an idle daemon is never woken. Each control connection is served on a
//! thread of its own (a `pause` holds its connection open), so a slow
//! client never delays a signal.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixListener;
use std::sync::Arc;

use nix::sys::signal::Signal;
use nix::sys::signalfd::{SfdFlags, SignalFd};

use super::control;
use super::served::Daemon;
use super::signals::{self, SignalContext};
use crate::fuse::LowerWatch;

/// Starts the service thread; it lives until the process exits.
pub fn spawn(
    signals: SignalContext,
    control: Option<(UnixListener, Arc<Daemon>)>,
    watch: Option<LowerWatch>,
) -> io::Result<()> {
    let sfd = SignalFd::with_flags(
        &signals::handled(),
        SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK,
    )
    .map_err(io::Error::from)?;
    std::thread::Builder::new()
        .name("layerfs-service".into())
        .spawn(move || run(sfd, &signals, control, watch))
        .map(|_| ())
}

fn run(
    sfd: SignalFd,
    signals: &SignalContext,
    control: Option<(UnixListener, Arc<Daemon>)>,
    watch: Option<LowerWatch>,
) {
    let mut fds = vec![libc::pollfd {
        fd: sfd.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    // Slots 1 and 2: the control socket and the lower watch; a negative
    // fd is one poll ignores (absent, or a watch that failed).
    let pollfd = |fd: Option<i32>| libc::pollfd {
        fd: fd.unwrap_or(-1),
        events: libc::POLLIN,
        revents: 0,
    };
    fds.push(pollfd(control.as_ref().map(|(l, _)| l.as_raw_fd())));
    fds.push(pollfd(watch.as_ref().map(LowerWatch::fd)));
    loop {
        for f in fds.iter_mut() {
            f.revents = 0;
        }
        // The fds stay open meanwhile (owned by sfd, control and watch).
        if let Err(e) = crate::sys::poll_forever(&mut fds) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!("service thread: poll failed: {e}; signals and the control socket are no longer served");
            return;
        }
        if fds[0].revents != 0 {
            loop {
                match sfd.read_signal() {
                    Ok(Some(info)) => match Signal::try_from(info.ssi_signo as i32) {
                        Ok(sig) => signals::handle(signals, sig),
                        Err(_) => continue,
                    },
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!("reading the signalfd failed: {e}");
                        break;
                    }
                }
            }
        }
        if let Some((l, d)) = &control {
            if fds[1].revents != 0 {
                control::accept_ready(l, d);
            }
        }
        if let Some(w) = &watch {
            if fds[2].revents != 0 && !w.drain() {
                fds[2].fd = -1;
            }
        }
    }
}
