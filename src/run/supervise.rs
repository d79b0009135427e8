//! Starting the sandbox (`layerfs __sandbox`) and watching it: relaying
//! the command's output as it comes, reading the sandbox's reports,
//! enforcing `--timeout`, and turning stop requests into a forwarded
//! signal, then a kill.
//!
//! One thread, one `poll` over the command's stdout and stderr, the report
//! pipe and the stop signals' signalfd. The loop ends when all three pipes
//! reach EOF: the monitor and the init hold them until they exit, and the
//! init's exit kills whatever the command left running.

use std::ffi::OsString;
use std::io::{PipeReader, PipeWriter};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::outcome::{End, Failure};
use super::relay::{Relay, Stream};
use super::signals::{StopRequest, StopSignals};
use crate::sandbox::report::{forward_request, Report};
use crate::sandbox::{self, SELF_EXE, SUBCOMMAND};

/// How long the command has to exit after a stop request before the
/// sandbox is killed (a second request kills at once).
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// What to run, where.
pub struct Launch<'a> {
    /// The workspace mountpoint; the command sees it at this path.
    pub workspace: &'a Path,
    pub stage: PathBuf,
    /// Relative to the workspace root, checked by its spelling already.
    pub cwd: &'a Path,
    pub network: bool,
    pub command: &'a [OsString],
    pub timeout: Option<Duration>,
    /// Bytes of the sandbox's private tmpfs (/tmp, /dev/shm, /run).
    pub tmp_size: u64,
    /// Host directories the command must not see.
    pub hide: &'a [PathBuf],
}

/// How the command ended and how long it ran.
pub struct Ran {
    pub end: End,
    pub duration: Duration,
}

fn failed(msg: String) -> Ran {
    Ran {
        end: End::Failed(Failure::Runtime(msg)),
        duration: Duration::ZERO,
    }
}

/// Runs the command in a sandbox and waits until everything in it ended.
pub fn run(l: &Launch<'_>, relay: &mut Relay, stop: &StopSignals) -> Ran {
    let pipes = (|| {
        Ok::<_, std::io::Error>((
            std::io::pipe()?,
            std::io::pipe()?,
            std::io::pipe()?,
            std::io::pipe()?,
        ))
    })();
    let ((out_r, out_w), (err_r, err_w), (rep_r, rep_w), (ctl_r, ctl_w)) = match pipes {
        Ok(p) => p,
        Err(e) => return failed(format!("pipe: {e}")),
    };
    let (rep_fd, ctl_fd) = (rep_w.as_raw_fd(), ctl_r.as_raw_fd());
    let mut cmd = Command::new(SELF_EXE);
    cmd.arg(SUBCOMMAND)
        .arg("--workspace")
        .arg(l.workspace)
        .arg("--stage")
        .arg(&l.stage)
        .arg("--report-fd")
        .arg(rep_fd.to_string())
        .arg("--control-fd")
        .arg(ctl_fd.to_string());
    if !l.cwd.as_os_str().is_empty() {
        cmd.arg("--cwd").arg(l.cwd);
    }
    if !l.network {
        cmd.arg("--no-network");
    }
    cmd.arg("--tmp-size").arg(l.tmp_size.to_string());
    for d in l.hide {
        cmd.arg("--hide").arg(d);
    }
    cmd.arg("--")
        .args(l.command)
        .env("TMPDIR", "/tmp")
        .env("LAYERFS_WORKSPACE", l.workspace)
        .stdin(Stdio::inherit())
        .stdout(out_w)
        .stderr(err_w);
    // SAFETY: fcntl and prctl are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            sandbox::keep_across_exec(rep_fd)?;
            sandbox::keep_across_exec(ctl_fd)?;
            sandbox::die_with_parent(Signal::SIGKILL)
        });
    }
    let spawned = cmd.spawn();
    // Our copies of the child's ends: the pipes reach EOF only once every
    // process of the sandbox has closed its copies.
    drop(cmd);
    drop(rep_w);
    drop(ctl_r);
    let child = match spawned {
        Ok(c) => c,
        Err(e) => return failed(format!("cannot start the sandbox: {e}")),
    };
    Watch::new(child, ctl_w, l.timeout).watch([&out_r, &err_r, &rep_r], relay, stop)
}

/// The state of one watched sandbox.
struct Watch {
    monitor: Child,
    control: PipeWriter,
    init: Option<Pid>,
    deadline: Option<Instant>,
    grace_until: Option<Instant>,
    stop: Option<StopRequest>,
    killed: bool,
    timed_out: bool,
    started: Option<Instant>,
    ended: Option<Instant>,
    status: Option<End>,
    failure: Option<Failure>,
    reports: Vec<u8>,
}

impl Watch {
    fn new(monitor: Child, control: PipeWriter, timeout: Option<Duration>) -> Watch {
        Watch {
            monitor,
            control,
            init: None,
            deadline: timeout.map(|t| Instant::now() + t),
            grace_until: None,
            stop: None,
            killed: false,
            timed_out: false,
            started: None,
            ended: None,
            status: None,
            failure: None,
            reports: Vec::new(),
        }
    }

    fn watch(mut self, pipes: [&PipeReader; 3], relay: &mut Relay, stop: &StopSignals) -> Ran {
        let mut open = [true; 3];
        let mut buf = vec![0u8; 64 * 1024];
        while open.iter().any(|o| *o) {
            let mut polled: Vec<(usize, PollFd)> = (0..3)
                .filter(|i| open[*i])
                .map(|i| (i, PollFd::new(pipes[i].as_fd(), PollFlags::POLLIN)))
                .collect();
            polled.push((3, PollFd::new(stop.fd(), PollFlags::POLLIN)));
            let mut pfds: Vec<PollFd> = polled.iter().map(|(_, p)| *p).collect();
            let _ = poll(&mut pfds, self.poll_timeout());
            for ((i, _), p) in polled.iter().zip(&pfds) {
                let ready = p.revents().is_some_and(|r| {
                    r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
                });
                if *i == 3 || !ready {
                    continue;
                }
                let n = match { pipes[*i] }.read(&mut buf) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    r => r.unwrap_or(0),
                };
                if n == 0 {
                    open[*i] = false;
                    continue;
                }
                match i {
                    0 => relay.relay(Stream::Out, &buf[..n]),
                    1 => relay.relay(Stream::Err, &buf[..n]),
                    _ => self.take_reports(&buf[..n]),
                }
            }
            while let Some(req) = stop.take() {
                self.on_stop(req);
            }
            self.check_clocks();
        }
        let _ = self.monitor.wait();
        self.finish()
    }

    /// Until the next deadline (timeout or grace), or forever.
    fn poll_timeout(&self) -> PollTimeout {
        if self.killed {
            return PollTimeout::NONE;
        }
        let next = [self.deadline, self.grace_until]
            .into_iter()
            .flatten()
            .min();
        match next {
            None => PollTimeout::NONE,
            Some(t) => {
                let ms = t.saturating_duration_since(Instant::now()).as_millis() + 1;
                PollTimeout::try_from(ms.min(60_000) as i32).unwrap_or(PollTimeout::NONE)
            }
        }
    }

    fn take_reports(&mut self, bytes: &[u8]) {
        self.reports.extend_from_slice(bytes);
        while let Some(nl) = self.reports.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.reports.drain(..=nl).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            match Report::parse(&text) {
                Some(Report::InitPid(p)) => self.init = Some(Pid::from_raw(p)),
                Some(Report::Started) => self.started = Some(Instant::now()),
                Some(Report::Failed(m)) => self.failure = Some(Failure::Runtime(m)),
                Some(Report::Usage(m)) => self.failure = Some(Failure::Usage(m)),
                Some(Report::ExecFailed(errno, m)) => {
                    let code = if errno == libc::ENOENT { 127 } else { 126 };
                    self.failure = Some(Failure::Exec(code, m));
                }
                Some(Report::Exited(c)) => self.ended_with(End::Exited(c)),
                Some(Report::Signaled(s)) => self.ended_with(End::Signaled(s)),
                None => tracing::debug!("unknown sandbox report: {text}"),
            }
        }
    }

    fn ended_with(&mut self, end: End) {
        if self.status.is_none() && !self.timed_out {
            self.status = Some(end);
            self.ended = Some(Instant::now());
        }
    }

    /// A first stop request is passed on to the command (unless the
    /// terminal sent it to the command already) with `STOP_GRACE` to end;
    /// a second one kills the sandbox.
    fn on_stop(&mut self, req: StopRequest) {
        if self.stop.is_some() {
            self.kill_sandbox();
            return;
        }
        self.stop = Some(req);
        if !req.from_terminal {
            let _ = self
                .control
                .write_all(forward_request(req.signal).as_bytes());
        }
        self.grace_until = Some(Instant::now() + STOP_GRACE);
    }

    fn check_clocks(&mut self) {
        if self.killed || self.status.is_some() {
            return;
        }
        let now = Instant::now();
        if self.deadline.is_some_and(|d| now >= d) {
            self.timed_out = true;
            self.ended = Some(now);
            self.kill_sandbox();
        } else if self.grace_until.is_some_and(|g| now >= g) {
            self.kill_sandbox();
        }
    }

    /// Kills the init — and with it, by the kernel, every process of the
    /// sandbox's pid namespace. Before the init exists, the monitor: its
    /// child then gets its parent-death signal.
    fn kill_sandbox(&mut self) {
        let target = self
            .init
            .unwrap_or_else(|| Pid::from_raw(self.monitor.id() as i32));
        let _ = kill(target, Signal::SIGKILL);
        self.killed = true;
    }

    fn finish(self) -> Ran {
        let duration = match self.started {
            Some(s) => self
                .ended
                .unwrap_or_else(Instant::now)
                .saturating_duration_since(s),
            None => Duration::ZERO,
        };
        let end = if self.timed_out {
            End::TimedOut
        } else if let Some(f) = self.failure {
            End::Failed(f)
        } else if let Some(s) = self.status {
            s
        } else if let Some(req) = self.stop {
            End::Stopped(req.signal)
        } else {
            End::Failed(Failure::Runtime(
                "the sandbox ended without reporting how the command ended".into(),
            ))
        };
        Ran { end, duration }
    }
}
