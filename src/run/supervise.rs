//! Starting the sandbox (`layerfs __sandbox`) and watching it: relaying
//! the command's output as it comes, reading the sandbox's reports,
//! enforcing `--timeout`, and turning stop requests into a forwarded
//! signal, then a kill.
//!
//! One thread, one `poll` over the command's stdout and stderr, the report
//! pipe and the stop signals' signalfd — and when the caller has a
//! terminal, the socket on which the sandbox sends the command's terminal,
//! that terminal's master, the caller's stdin and a `SIGWINCH` signalfd
//! (see `terminal`). The loop ends when all three pipes reach EOF: the
//! monitor and the init hold them until they exit, and the init's exit
//! kills whatever the command left running; what the command's terminal
//! still holds is read after.
//!
//! Invariant relied on: the sandbox's processes never get a descriptor of
//! the caller's terminal — their stdin is `/dev/null` when it is one,
//! their stdout and stderr are pipes, and inherited terminals above 2 are
//! closed on exec.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{PipeReader, PipeWriter};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use nix::unistd::Pid;

use super::binds::Home;
use super::cgroup::{self, Cgroup};
use super::env::EnvPlan;
use super::outcome::{End, Failure};
use super::relay::{stop_bound, Relay, Stream, STOP_AFTER};
use super::signals::{StopRequest, StopSignals};
use super::terminal::{self, CallerTerminal};
use crate::sandbox::binds::Bind;
use crate::sandbox::report::{forward_request, Report};
use crate::sandbox::{SELF_EXE, SUBCOMMAND};

/// How long the command has to exit after a stop request before the
/// sandbox is killed (a second request kills at once).
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// What to run, where.
pub struct Launch<'a> {
    /// The workspace mountpoint on the host.
    pub workspace: &'a Path,
    /// Where the command sees the workspace (checked).
    pub at: &'a Path,
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
    /// Checked host paths to bind in.
    pub binds: &'a [Bind],
    pub home: &'a Home,
    pub env: &'a EnvPlan,
    /// Stop the command once its output runs past `--max-output` (see
    /// `relay::stop_bound`); false with `--overflow discard`.
    pub stop_on_overflow: bool,
    /// The run's cgroup, which the sandbox joins before it starts anything.
    pub cgroup: Option<&'a Cgroup>,
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
///
/// Long on purpose: it is one ordered sequence (terminal, pipes, the
/// init's arguments, its fds and exec set-up, spawn, close our copies of
/// the child's ends, cgroup hand-over, wait) whose steps share the fds
/// they create; each fd's lifetime is visible in one place.
pub fn run(l: &Launch<'_>, relay: &mut Relay, stop: &StopSignals) -> Ran {
    terminal::close_inherited_terminals();
    let caller = match CallerTerminal::detect() {
        Ok(c) => c,
        Err(e) => return failed(e.to_string()),
    };
    // The socket the init sends the command's terminal on.
    let sockets = match &caller {
        None => None,
        Some(_) => match socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        ) {
            Ok(p) => Some(p),
            Err(e) => return failed(format!("socketpair: {e}")),
        },
    };
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
        .arg("--at")
        .arg(l.at)
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
    for b in l.binds {
        cmd.arg("--bind").args(b.to_args());
    }
    if *l.home == Home::Private {
        cmd.arg("--private-home");
    }
    let term_fd = sockets.as_ref().map(|(_, theirs)| theirs.as_raw_fd());
    if let (Some(c), Some(fd)) = (&caller, term_fd) {
        let (rows, cols) = c.size();
        let fds: Vec<String> = c.fds().iter().map(|f| f.to_string()).collect();
        cmd.arg("--terminal-fd")
            .arg(fd.to_string())
            .arg("--pty-fds")
            .arg(fds.join(","))
            .arg("--rows")
            .arg(rows.to_string())
            .arg("--cols")
            .arg(cols.to_string());
    }
    // A terminal on stdin stays out of the sandbox: the command reads the
    // terminal the init gives it.
    let stdin = if caller.as_ref().is_some_and(|c| c.fds().contains(&0)) {
        Stdio::null()
    } else {
        Stdio::inherit()
    };
    // With limits: the init joins the run's cgroup (moved by us once its
    // pid is reported, while it builds the tree) before it forks the
    // command, which it does only after a byte on this pipe.
    let cgroup_pipe = match l.cgroup {
        None => None,
        Some(_) => match std::io::pipe() {
            Ok(p) => Some(p),
            Err(e) => return failed(format!("pipe: {e}")),
        },
    };
    let go_fd = cgroup_pipe.as_ref().map(|(r, _)| r.as_raw_fd());
    if let Some(fd) = go_fd {
        cmd.arg("--cgroup-fd").arg(fd.to_string());
    }
    cmd.arg("--")
        .args(l.command)
        .stdin(stdin)
        .stdout(out_w)
        .stderr(err_w);
    let mut fixed = vec![
        ("TMPDIR", OsStr::new("/tmp")),
        ("LAYERFS_WORKSPACE", l.at.as_os_str()),
    ];
    if let Some(home) = l.home.env() {
        fixed.push(("HOME", OsStr::new(home)));
    }
    l.env.apply(&mut cmd, &fixed);
    let mut setup = crate::sys::ExecSetup::new();
    if let Some(fd) = go_fd {
        setup = setup.keep(fd);
    }
    setup = setup.keep(rep_fd).keep(ctl_fd);
    if let Some(fd) = term_fd {
        setup = setup.keep(fd);
    }
    setup.die_with_parent(Signal::SIGKILL).apply(&mut cmd);
    let spawned = cmd.spawn();
    // Our copies of the child's ends: the pipes reach EOF only once every
    // process of the sandbox has closed its copies.
    drop(cmd);
    drop(rep_w);
    drop(ctl_r);
    let cgroup_go = cgroup_pipe.map(|(_, w)| w);
    let ours = sockets.map(|(ours, _theirs)| ours);
    let child = match spawned {
        Ok(c) => c,
        Err(e) => return failed(format!("cannot start the sandbox: {e}")),
    };
    let tty = caller
        .zip(ours)
        .map(|(caller, socket)| TtyRelay::new(caller, socket));
    let mut watch = Watch::new(child, ctl_w, l.timeout);
    watch.stop_on_overflow = l.stop_on_overflow;
    if let (Some(cg), Some(go)) = (l.cgroup, cgroup_go) {
        match cg.join_handles() {
            Ok(procs) => watch.cgroup = Some((procs, go)),
            Err(e) => {
                watch.kill_sandbox();
                watch.failure = Some(Failure::Runtime(format!("the run's cgroup: {e}")));
            }
        }
    }
    watch.watch([&out_r, &err_r, &rep_r], relay, stop, tty)
}

/// Where a poll event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// stdout, stderr or the report pipe.
    Pipe(usize),
    Stop,
    /// The socket the command's terminal arrives on.
    Socket,
    /// The command's terminal (its master side).
    Master,
    /// The caller's terminal on stdin.
    Stdin,
    Winch,
}

/// How often a command's terminal whose every descriptor was closed is
/// tried again (a command may open it anew).
const IDLE_RETRY: Duration = Duration::from_millis(100);

/// Most input read ahead of what the command's terminal accepted.
const INPUT_AHEAD: usize = 64 * 1024;

/// The relay between the caller's terminal and the command's.
struct TtyRelay {
    caller: CallerTerminal,
    /// Until the master arrives.
    socket: Option<OwnedFd>,
    master: Option<File>,
    /// Every descriptor of the command's terminal is closed (EIO): not
    /// polled (it would report a hangup at once), read every
    /// `IDLE_RETRY` instead.
    master_idle: bool,
    /// Typed input not yet written to the command's terminal.
    pending: Vec<u8>,
    stdin_open: bool,
    stdin: std::io::Stdin,
    output: Stream,
}

impl TtyRelay {
    fn new(caller: CallerTerminal, socket: OwnedFd) -> TtyRelay {
        let output = caller.output();
        let stdin_open = caller.relays_input();
        TtyRelay {
            caller,
            socket: Some(socket),
            master: None,
            master_idle: false,
            pending: Vec::new(),
            stdin_open,
            stdin: std::io::stdin(),
            output,
        }
    }

    /// The descriptors to poll now.
    fn poll_fds<'a>(&'a self, sources: &mut Vec<Source>, fds: &mut Vec<PollFd<'a>>) {
        sources.push(Source::Winch);
        fds.push(PollFd::new(self.caller.winch_fd(), PollFlags::POLLIN));
        if let Some(s) = &self.socket {
            sources.push(Source::Socket);
            fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
        }
        let Some(m) = &self.master else { return };
        if !self.master_idle {
            let mut flags = PollFlags::POLLIN;
            if !self.pending.is_empty() {
                flags |= PollFlags::POLLOUT;
            }
            sources.push(Source::Master);
            fds.push(PollFd::new(m.as_fd(), flags));
        }
        if self.stdin_open && self.pending.len() < INPUT_AHEAD {
            sources.push(Source::Stdin);
            fds.push(PollFd::new(self.stdin.as_fd(), PollFlags::POLLIN));
        }
    }

    fn on_ready(&mut self, src: Source, relay: &mut Relay, buf: &mut [u8]) {
        match src {
            Source::Socket => self.take_master(),
            Source::Winch => {
                if self.caller.take_winch() {
                    if let Some(m) = &self.master {
                        self.caller.copy_size(m.as_fd());
                    }
                }
            }
            Source::Master => {
                self.read_master(relay, buf, false);
                self.write_pending();
            }
            Source::Stdin => self.read_stdin(buf),
            Source::Pipe(_) | Source::Stop => {}
        }
    }

    /// Receives the command's terminal; the caller's goes raw from now on.
    fn take_master(&mut self) {
        let Some(socket) = self.socket.take() else {
            return;
        };
        match terminal::receive_master(socket.as_fd()) {
            Ok(Some(m)) => {
                self.caller.copy_size(m.as_fd());
                self.caller.enter_raw();
                self.master = Some(m);
            }
            Ok(None) => {}
            Err(e) => tracing::debug!("receiving the command's terminal: {e}"),
        }
    }

    /// Relays what the command's terminal printed: one read, or with
    /// `drain` until nothing is left.
    fn read_master(&mut self, relay: &mut Relay, buf: &mut [u8], drain: bool) {
        let Some(m) = &mut self.master else { return };
        loop {
            match m.read(buf) {
                Ok(0) => {
                    self.master_idle = true;
                    return;
                }
                Ok(n) => {
                    self.master_idle = false;
                    relay.relay(self.output, &buf[..n]);
                    if !drain {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                // EIO: every descriptor of the command's terminal is closed.
                Err(_) => {
                    self.master_idle = true;
                    return;
                }
            }
        }
    }

    fn write_pending(&mut self) {
        let Some(m) = &mut self.master else { return };
        while !self.pending.is_empty() {
            match m.write(&self.pending) {
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.pending.clear();
                    return;
                }
            }
        }
    }

    fn read_stdin(&mut self, buf: &mut [u8]) {
        let room = INPUT_AHEAD
            .saturating_sub(self.pending.len())
            .min(buf.len());
        // Unbuffered: what std's buffer kept back, poll would not report.
        match nix::unistd::read(self.stdin.as_fd().as_raw_fd(), &mut buf[..room]) {
            Ok(0) => self.stdin_open = false,
            Ok(n) => {
                self.pending.extend_from_slice(&buf[..n]);
                self.write_pending();
            }
            Err(nix::Error::EINTR) | Err(nix::Error::EAGAIN) => {}
            Err(_) => self.stdin_open = false,
        }
    }

    /// After each poll: an idle terminal is tried again.
    fn after_poll(&mut self, relay: &mut Relay, buf: &mut [u8]) {
        if self.master_idle {
            self.read_master(relay, buf, true);
            if !self.master_idle {
                self.write_pending();
            }
        }
    }

    /// The poll timeout, shortened while the terminal is idle.
    fn limit(&self, t: PollTimeout) -> PollTimeout {
        if !(self.master.is_some() && self.master_idle) {
            return t;
        }
        let retry = PollTimeout::try_from(IDLE_RETRY.as_millis() as i32).unwrap_or(t);
        // (Compared as values: `PollTimeout::as_millis` panics on NONE.)
        if !t.is_none() && t < retry {
            t
        } else {
            retry
        }
    }
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
    stop_on_overflow: bool,
    /// When the output first passed the cap.
    over_since: Option<Instant>,
    /// Killed for its output.
    output_stopped: bool,
    /// The run's cgroup (`cgroup.procs` of each group) and the pipe that
    /// lets the init go on once it is in it.
    cgroup: Option<(Vec<File>, PipeWriter)>,
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
            stop_on_overflow: false,
            over_since: None,
            output_stopped: false,
            cgroup: None,
            started: None,
            ended: None,
            status: None,
            failure: None,
            reports: Vec::new(),
        }
    }

    fn watch(
        mut self,
        pipes: [&PipeReader; 3],
        relay: &mut Relay,
        stop: &StopSignals,
        mut tty: Option<TtyRelay>,
    ) -> Ran {
        let mut open = [true; 3];
        let mut buf = vec![0u8; 64 * 1024];
        while open.iter().any(|o| *o) {
            let mut sources: Vec<Source> = Vec::new();
            let mut pfds: Vec<PollFd> = Vec::new();
            // Once the command is killed for its output, its stdout and
            // stderr are not read until the report pipe (held by the
            // monitor and the init) closes: a writer then blocks on a full
            // pipe until its SIGKILL lands, instead of writing on as fast
            // as it is drained while the kill cascades through the pid
            // namespace (tens of MB on a loaded host). What it wrote is
            // still all read and counted after.
            let held = self.output_stopped && self.killed && open[2];
            for (i, pipe) in pipes
                .iter()
                .enumerate()
                .filter(|(i, _)| open[*i] && !(held && *i < 2))
            {
                sources.push(Source::Pipe(i));
                pfds.push(PollFd::new(pipe.as_fd(), PollFlags::POLLIN));
            }
            sources.push(Source::Stop);
            pfds.push(PollFd::new(stop.fd(), PollFlags::POLLIN));
            let mut timeout = self.poll_timeout();
            if let Some(t) = &tty {
                t.poll_fds(&mut sources, &mut pfds);
                timeout = t.limit(timeout);
            }
            let _ = poll(&mut pfds, timeout);
            let ready: Vec<Source> = sources
                .iter()
                .zip(&pfds)
                .filter(|(_, p)| {
                    p.revents().is_some_and(|r| {
                        r.intersects(
                            PollFlags::POLLIN
                                | PollFlags::POLLOUT
                                | PollFlags::POLLHUP
                                | PollFlags::POLLERR,
                        )
                    })
                })
                .map(|(s, _)| *s)
                .collect();
            drop(pfds);
            for src in ready {
                let Source::Pipe(i) = src else {
                    if let Some(t) = tty.as_mut() {
                        t.on_ready(src, relay, &mut buf);
                    }
                    continue;
                };
                let n = match { pipes[i] }.read(&mut buf) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    r => r.unwrap_or(0),
                };
                if n == 0 {
                    open[i] = false;
                    continue;
                }
                match i {
                    0 => relay.relay(Stream::Out, &buf[..n]),
                    1 => relay.relay(Stream::Err, &buf[..n]),
                    _ => self.take_reports(&buf[..n]),
                }
            }
            if let Some(t) = tty.as_mut() {
                t.after_poll(relay, &mut buf);
            }
            while let Some(req) = stop.take() {
                self.on_stop(req);
            }
            self.check_output(relay);
            self.check_clocks();
        }
        // Every process of the sandbox is gone: what its terminal still
        // holds comes last, then the caller's terminal gets its mode back.
        if let Some(t) = tty.as_mut() {
            t.read_master(relay, &mut buf, true);
        }
        drop(tty);
        let _ = self.monitor.wait();
        self.finish()
    }

    /// Until the next deadline (timeout or grace), or forever.
    fn poll_timeout(&self) -> PollTimeout {
        if self.killed {
            return PollTimeout::NONE;
        }
        let output_deadline = self.over_since.map(|t| t + STOP_AFTER);
        let next = [self.deadline, self.grace_until, output_deadline]
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
                Some(Report::InitPid(p)) => {
                    self.init = Some(Pid::from_raw(p));
                    self.join_cgroup(p);
                }
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

    /// Moves the init (pid `pid`) into the run's cgroup and lets it go on;
    /// if that fails, the sandbox is killed before the command starts.
    fn join_cgroup(&mut self, pid: i32) {
        let Some((procs, mut go)) = self.cgroup.take() else {
            return;
        };
        match cgroup::join_pid(&procs, pid).and_then(|()| go.write_all(b"1")) {
            Ok(()) => {}
            Err(e) => {
                self.failure = Some(Failure::Runtime(format!(
                    "moving the sandbox into the run's cgroup: {e}"
                )));
                self.kill_sandbox();
            }
        }
    }

    fn ended_with(&mut self, end: End) {
        if self.status.is_none() && !self.timed_out && !self.output_stopped {
            self.status = Some(end);
            self.ended = Some(Instant::now());
        }
    }

    /// A first stop request is passed on to the command (which runs in a
    /// session of its own, so no terminal signal reached it) with
    /// `STOP_GRACE` to end; a second one kills the sandbox.
    fn on_stop(&mut self, req: StopRequest) {
        if self.stop.is_some() {
            self.kill_sandbox();
            return;
        }
        self.stop = Some(req);
        let _ = self
            .control
            .write_all(forward_request(req.signal).as_bytes());
        self.grace_until = Some(Instant::now() + STOP_GRACE);
    }

    /// Stops a command whose output ran past the cap, once it passed the
    /// bound or `STOP_AFTER` (with `stop_on_overflow`).
    fn check_output(&mut self, relay: &Relay) {
        if !self.stop_on_overflow || self.killed || self.status.is_some() || !relay.over() {
            return;
        }
        let now = Instant::now();
        let since = *self.over_since.get_or_insert(now);
        let cap = relay.limit().unwrap_or(0);
        if relay.total() >= stop_bound(cap) || now >= since + STOP_AFTER {
            self.output_stopped = true;
            self.ended = Some(now);
            self.kill_sandbox();
        }
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
        } else if self.output_stopped {
            End::OutputStopped
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
