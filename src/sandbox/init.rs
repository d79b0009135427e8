//! The sandbox's processes, from `layerfs __sandbox` on:
//!
//! ```text
//! layerfs run (outside) ── monitor: unshares the namespaces, forks the init,
//!                          │         reports its pid, waits for it
//!                          └─ init (pid 1 of the new pid namespace, a
//!                               │   session of its own, not dumpable):
//!                               │   builds the tree, pivots, opens the
//!                               │   command's terminal, forks the command,
//!                               │   forwards signals, reports its status
//!                               └─ the command (new session, confined, exec)
//! ```
//!
//! When the init exits the kernel kills every process left in its pid
//! namespace, so a command's background children never outlive it, and
//! `layerfs run` ends the whole tree by killing the init alone. The init
//! also ends when `layerfs run` goes away (its control pipe reaches EOF),
//! besides the parent-death signals of the monitor and the init.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sched::CloneFlags;
use nix::sys::signal::{kill, SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{geteuid, ForkResult, Pid};

use super::binds::{Bind, BindError};
use super::confine::ConfineError;
use super::error::SandboxError;
use super::report::{parse_forward, Report, Reporter};
use super::rootfs::{self, Layout};
use super::terminal::TerminalError;
use super::userns::UsernsError;
use super::userns::{self, IdMap};
use super::{confine, cwd, net, sys, terminal, Spec, STOP_SIGNALS};

/// Why the monitor or the init could not start the command; its text is
/// the `failed` report `layerfs run` prints.
#[derive(Debug, thiserror::Error)]
enum InitError {
    #[error("cannot create the sandbox's namespaces: {0}")]
    Namespaces(#[source] nix::Error),
    #[error("fork: {0}")]
    Fork(#[source] std::io::Error),
    #[error("waiting for the sandbox's init: {0}")]
    Wait(#[source] nix::Error),
    #[error("setsid: {0}")]
    Setsid(#[source] nix::Error),
    #[error("PR_SET_DUMPABLE: {0}")]
    NotDumpable(#[source] std::io::Error),
    #[error(transparent)]
    Userns(#[from] UsernsError),
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(transparent)]
    Tree(#[from] SandboxError),
    #[error(transparent)]
    Terminal(#[from] TerminalError),
    #[error(transparent)]
    Confine(#[from] ConfineError),
}

/// Entry point of `layerfs __sandbox` (the monitor); returns its exit code.
pub fn main(spec: Spec) -> i32 {
    let report = match sys::adopt_fd(spec.report_fd) {
        Ok(fd) => Reporter::new(File::from(fd)),
        Err(e) => {
            eprintln!("layerfs __sandbox: report fd {}: {e}", spec.report_fd);
            return 125;
        }
    };
    let control = match sys::adopt_fd(spec.control_fd) {
        Ok(fd) => fd,
        Err(e) => {
            report.send(&Report::Failed(format!(
                "control fd {}: {e}",
                spec.control_fd
            )));
            return 125;
        }
    };
    let terminal = match spec.terminal_fd.map(sys::adopt_fd).transpose() {
        Ok(t) => t,
        Err(e) => {
            report.send(&Report::Failed(format!(
                "terminal fd {:?}: {e}",
                spec.terminal_fd
            )));
            return 125;
        }
    };
    let cgroup_go = match spec.cgroup_fd.map(sys::adopt_fd).transpose() {
        Ok(g) => g,
        Err(e) => {
            report.send(&Report::Failed(format!(
                "cgroup fd {:?}: {e}",
                spec.cgroup_fd
            )));
            return 125;
        }
    };
    for fd in [spec.report_fd, spec.control_fd]
        .into_iter()
        .chain(spec.terminal_fd)
        .chain(spec.cgroup_fd)
    {
        if let Err(e) = sys::close_on_exec(fd) {
            report.send(&Report::Failed(format!("fd {fd}: {e}")));
            return 125;
        }
    }
    // A Ctrl-C from the terminal reaches every process of the foreground
    // group: the command reacts to it, `layerfs run` decides the rest, and
    // the monitor and the init must survive it. What the caller already
    // ignored stays ignored for the command.
    let ignored: Vec<Signal> = STOP_SIGNALS
        .into_iter()
        .filter(|s| sys::is_ignored(*s))
        .collect();
    for s in STOP_SIGNALS {
        let _ = sys::set_disposition(s, true);
    }
    match monitor(&spec, &report, control, terminal, cgroup_go, &ignored) {
        Ok(()) => 0,
        Err(e) => {
            report.send(&Report::Failed(e.to_string()));
            125
        }
    }
}

/// Unshares the namespaces, forks the init and waits for it.
fn monitor(
    spec: &Spec,
    report: &Reporter,
    control: OwnedFd,
    terminal: Option<OwnedFd>,
    cgroup_go: Option<OwnedFd>,
    ignored: &[Signal],
) -> Result<(), InitError> {
    // A private IPC namespace: the host's System V shared memory, message
    // queues and semaphores (a database's, say) are not reachable.
    let mut flags = CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWIPC;
    if spec.no_network {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    if geteuid().is_root() {
        nix::sched::unshare(flags).map_err(InitError::Namespaces)?;
    } else {
        userns::enter(flags, &IdMap::own())?;
    }
    match sys::fork_single_threaded().map_err(InitError::Fork)? {
        ForkResult::Child => {
            let _ = sys::set_parent_death_signal(Signal::SIGKILL);
            sys::exit_child(init(spec, report, control, terminal, cgroup_go, ignored))
        }
        ForkResult::Parent { child } => {
            drop(control);
            drop(terminal);
            drop(cgroup_go);
            report.send(&Report::InitPid(child.as_raw()));
            loop {
                match waitpid(child, None) {
                    Ok(WaitStatus::Exited(..)) | Ok(WaitStatus::Signaled(..)) => return Ok(()),
                    Err(nix::Error::EINTR) | Ok(_) => continue,
                    Err(e) => return Err(InitError::Wait(e)),
                }
            }
        }
    }
}

/// Builds the sandbox's tree in the new namespaces. As root, the command
/// then goes into a user namespace of its own (every id mapped to itself):
/// the kernel locks every mount it inherits there, so even root cannot
/// remount the host read-write or unmount what hides it.
fn prepare(spec: &Spec) -> Result<(), InitError> {
    if spec.no_network {
        net::loopback_up()?;
    }
    let binds = spec
        .binds
        .chunks(3)
        .map(Bind::from_args)
        .collect::<Result<Vec<_>, _>>()?;
    rootfs::build(&Layout {
        workspace: &spec.workspace,
        at: &spec.at,
        stage: &spec.stage,
        fresh_sysfs: spec.no_network,
        tmp_size: spec.tmp_size,
        hide: &spec.hide,
        binds: &binds,
        private_home: spec.private_home,
    })?;
    if geteuid().is_root() {
        userns::enter(CloneFlags::CLONE_NEWNS, &IdMap::identity())?;
    }
    Ok(())
}

/// Pid 1 of the sandbox: prepares it, runs the command, reaps, reports.
fn init(
    spec: &Spec,
    report: &Reporter,
    control: OwnedFd,
    terminal: Option<OwnedFd>,
    cgroup_go: Option<OwnedFd>,
    ignored: &[Signal],
) -> i32 {
    // Out of the caller's session, so the init has no controlling terminal
    // a command could reach through it, and not dumpable, so the command
    // cannot ptrace it or open its descriptors through /proc/1/fd.
    let hardened = nix::unistd::setsid()
        .map_err(InitError::Setsid)
        .and_then(|_| sys::set_not_dumpable().map_err(InitError::NotDumpable));
    if let Err(e) = hardened.and_then(|()| prepare(spec)) {
        report.send(&Report::Failed(e.to_string()));
        return 1;
    }
    if let Err(e) = cwd::enter(&spec.at, spec.cwd.as_deref().unwrap_or(Path::new(""))) {
        report.send(&Report::Usage(e.to_string()));
        return 1;
    }
    let pty = match terminal {
        Some(sock) => match terminal::open_and_hand_over(sock, spec.rows, spec.cols) {
            Ok(path) => Some(path),
            Err(e) => {
                report.send(&Report::Failed(e.to_string()));
                return 1;
            }
        },
        None => None,
    };
    let mut chld = SigSet::empty();
    chld.add(Signal::SIGCHLD);
    if let Err(e) = chld.thread_block() {
        report.send(&Report::Failed(format!("blocking SIGCHLD: {e}")));
        return 1;
    }
    let sfd = match SignalFd::with_flags(&chld, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK) {
        Ok(s) => s,
        Err(e) => {
            report.send(&Report::Failed(format!("signalfd: {e}")));
            return 1;
        }
    };
    // `layerfs run` moves this process into the run's cgroup while the
    // tree is built; the command is forked only once it says so.
    if let Some(go) = cgroup_go {
        let mut byte = [0u8; 1];
        match File::from(go).read(&mut byte) {
            Ok(1) => {}
            _ => {
                report.send(&Report::Failed(
                    "the run's cgroup was not joined; not starting the command".into(),
                ));
                return 1;
            }
        }
    }
    report.send(&Report::Started);
    let child = match sys::fork_single_threaded() {
        Ok(ForkResult::Child) => exec_command(spec, report, ignored, pty.as_deref()),
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => {
            report.send(&Report::Failed(format!("fork: {e}")));
            return 1;
        }
    };
    match reap(child, &File::from(control), &sfd) {
        Some(r) => {
            report.send(&r);
            0
        }
        None => 1,
    }
}

/// Waits for the command, reaping every orphan of the namespace on the
/// way, continuing the command when it stops, and forwarding the signals
/// `layerfs run` asks for. `None` when `layerfs run` went away first.
fn reap(child: Pid, mut control: &File, sfd: &SignalFd) -> Option<Report> {
    loop {
        let mut fds = [
            PollFd::new(sfd.as_fd(), PollFlags::POLLIN),
            PollFd::new(control.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::Error::EINTR) => {}
            Err(_) => return None,
        }
        let control_ready = fds[1]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP));
        while let Ok(Some(_)) = sfd.read_signal() {}
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == child => {
                    return Some(Report::Exited(code))
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => {
                    return Some(Report::Signaled(sig as i32))
                }
                // The command runs in a session of its own: no shell
                // outside can resume it if it stops (Ctrl-Z in an editor),
                // so it is continued rather than left to hang the run.
                Ok(WaitStatus::Stopped(pid, _)) if pid == child => {
                    let _ = kill(child, Signal::SIGCONT);
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => continue,
            }
        }
        if control_ready {
            let mut buf = [0u8; 256];
            match control.read(&mut buf) {
                // `layerfs run` is gone: end the sandbox with it.
                Ok(0) | Err(_) => return None,
                Ok(n) => {
                    for line in String::from_utf8_lossy(&buf[..n]).lines() {
                        if let Some(sig) =
                            parse_forward(line).and_then(|s| Signal::try_from(s).ok())
                        {
                            let _ = kill(child, sig);
                        }
                    }
                }
            }
        }
    }
}

/// The command's process: a session of its own (with its terminal, if
/// any), the signal state the caller gave `layerfs run`, confined, then
/// execs. Never returns.
fn exec_command(spec: &Spec, report: &Reporter, ignored: &[Signal], pty: Option<&Path>) -> ! {
    let setup = terminal::enter_session(pty.map(|p| (p, spec.pty_fds.as_slice())))
        .map_err(InitError::from)
        .and_then(|()| confine::command(geteuid().is_root()).map_err(InitError::from));
    if let Err(e) = setup {
        report.send(&Report::Failed(e.to_string()));
        sys::exit_child(125);
    }
    for s in STOP_SIGNALS {
        let _ = sys::set_disposition(s, ignored.contains(&s));
    }
    let _ =
        nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    let program = &spec.command[0];
    let pwd = match spec.cwd.as_deref() {
        Some(c) if !c.as_os_str().is_empty() => spec.at.join(c),
        _ => spec.at.clone(),
    };
    let err = Command::new(program)
        .args(&spec.command[1..])
        .env("PWD", &pwd)
        .exec();
    let errno = err.raw_os_error().unwrap_or(0);
    let shown = program.to_string_lossy();
    let (code, msg) = match errno {
        libc::ENOENT => (127, format!("{shown}: command not found in the sandbox")),
        libc::EACCES => (126, format!("{shown}: permission denied")),
        _ => (126, format!("{shown}: cannot execute: {err}")),
    };
    report.send(&Report::ExecFailed(errno, msg));
    sys::exit_child(code)
}
