//! The daemon a `layerfs run` starts when its workspace is not mounted:
//! `layerfs mount --foreground` as a child, ready once it sends `READY=1`
//! on a private notify socket (the systemd protocol the daemon already
//! speaks), and stopped with SIGTERM, which unmounts cleanly.
//!
//! The child gets SIGTERM from the kernel when `layerfs run` dies
//! (`PR_SET_PDEATHSIG`), so even a `kill -9` of the run unmounts.

use std::fs::{self, File};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::outcome::{End, Failure};
use super::rundir::RunDir;
use super::signals::StopSignals;
use crate::host::mounts;
use crate::sandbox::SELF_EXE;

/// How long the daemon may take to mount.
const READY_LIMIT: Duration = Duration::from_secs(60);
/// How long it may take to unmount and exit.
const STOP_LIMIT: Duration = Duration::from_secs(20);

/// What to mount (paths canonical).
pub struct Plan<'a> {
    pub lowers: &'a [PathBuf],
    pub upper: &'a Path,
    pub policy: Option<&'a Path>,
    pub mountpoint: &'a Path,
}

/// A mount this run made, served by its child daemon.
pub struct OwnMount {
    child: Child,
    mountpoint: PathBuf,
    log: PathBuf,
}

/// Starts the daemon and waits until the mount is live. A stop request
/// meanwhile stops the daemon again (`End::Stopped`).
pub fn start(plan: &Plan<'_>, rundir: &RunDir, stop: &StopSignals) -> Result<OwnMount, End> {
    let fail = |m: String| End::Failed(Failure::Runtime(m));
    let sock_path = rundir.notify_socket();
    let sock = UnixDatagram::bind(&sock_path)
        .and_then(|s| s.set_nonblocking(true).map(|_| s))
        .map_err(|e| fail(format!("readiness socket {}: {e}", sock_path.display())))?;
    let log_path = rundir.daemon_log();
    let log = File::create(&log_path)
        .map_err(|e| fail(format!("daemon log {}: {e}", log_path.display())))?;
    let mut cmd = Command::new(SELF_EXE);
    cmd.arg("mount").arg("--foreground");
    for l in plan.lowers {
        cmd.arg("--lower").arg(l);
    }
    cmd.arg("--upper").arg(plan.upper);
    if let Some(p) = plan.policy {
        cmd.arg("--policy").arg(p);
    }
    cmd.arg(plan.mountpoint)
        .env("NOTIFY_SOCKET", &sock_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    crate::sys::ExecSetup::new()
        .die_with_parent(Signal::SIGTERM)
        .apply(&mut cmd);
    let child = cmd
        .spawn()
        .map_err(|e| fail(format!("cannot start the layerfs daemon: {e}")))?;
    let mut own = OwnMount {
        child,
        mountpoint: plan.mountpoint.to_path_buf(),
        log: log_path,
    };
    let begun = Instant::now();
    loop {
        let mut fds = [
            PollFd::new(sock.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.fd(), PollFlags::POLLIN),
        ];
        let _ = poll(&mut fds, PollTimeout::from(100u16));
        if let Some(req) = stop.take() {
            let _ = own.stop();
            return Err(End::Stopped(req.signal));
        }
        let mut buf = [0u8; 4096];
        while let Ok(n) = sock.recv(&mut buf) {
            if String::from_utf8_lossy(&buf[..n])
                .lines()
                .any(|l| l == "READY=1")
            {
                return Ok(own);
            }
        }
        if let Ok(Some(status)) = own.child.try_wait() {
            let text = fs::read_to_string(&own.log).unwrap_or_default();
            let msg = format!("mounting the workspace failed: {}", last_error(&text));
            return Err(End::Failed(if status.code() == Some(2) {
                Failure::Usage(msg)
            } else {
                Failure::Runtime(msg)
            }));
        }
        if begun.elapsed() > READY_LIMIT {
            let _ = own.stop();
            return Err(fail(format!(
                "the layerfs daemon did not mount {} within {READY_LIMIT:?}",
                plan.mountpoint.display()
            )));
        }
    }
}

/// The daemon's last error line, without the log's time and level.
fn last_error(log: &str) -> String {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("ERROR") || l.starts_with("layerfs"))
        .or_else(|| log.lines().rev().find(|l| !l.trim().is_empty()))
        .unwrap_or("the daemon exited without saying why");
    let line = match line.find(" ERROR ") {
        Some(i) => {
            let rest = &line[i + " ERROR ".len()..];
            rest.split_once(": ").map_or(rest, |(_, m)| m)
        }
        None => line,
    };
    line.trim_start_matches("layerfs mount: ")
        .trim_start_matches("layerfs: ")
        .to_string()
}

impl OwnMount {
    /// Unmounts (SIGTERM to the daemon) and waits for the daemon; returns
    /// warnings for the user.
    pub fn stop(&mut self) -> Vec<String> {
        let mut warnings = Vec::new();
        let pid = Pid::from_raw(self.child.id() as i32);
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = kill(pid, Signal::SIGTERM);
        }
        let deadline = Instant::now() + STOP_LIMIT;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        let text = fs::read_to_string(&self.log).unwrap_or_default();
                        warnings.push(format!(
                            "the layerfs daemon exited with {status}: {}",
                            last_error(&text)
                        ));
                    }
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    warnings.push(format!(
                        "the layerfs daemon (pid {pid}) still serves {} after {STOP_LIMIT:?} \
                         (another sandbox still uses the workspace?); it exits once that ends",
                        self.mountpoint.display()
                    ));
                    return warnings;
                }
            }
        }
        if mounts::find(&self.mountpoint).is_some_and(|m| m.is_layerfs()) {
            if let Err(e) = mounts::detach(&self.mountpoint) {
                warnings.push(format!(
                    "{} is still mounted and cannot be detached: {e}",
                    self.mountpoint.display()
                ));
            }
        }
        warnings
    }
}

/// Whether an error from `layerfs mount` means another daemon serves the
/// upper already (a concurrent run mounted it first).
pub fn is_busy_error(f: &Failure) -> bool {
    f.message()
        .contains("another layerfs daemon serves this workspace")
}

/// Creates a mountpoint directory if it is missing.
pub fn ensure_dir(p: &Path) -> io::Result<()> {
    match fs::create_dir(p) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_line_loses_its_log_prefix() {
        let log = "2026-01-01T00:00:00Z  INFO layerfs::daemon: serving\n\
                   2026-01-01T00:00:01Z ERROR layerfs::daemon: upper /u is in use\n";
        assert_eq!(last_error(log), "upper /u is in use");
        assert_eq!(
            last_error("layerfs mount: lower layer #1 /x does not exist\n"),
            "lower layer #1 /x does not exist"
        );
        assert_eq!(last_error(""), "the daemon exited without saying why");
    }
}
