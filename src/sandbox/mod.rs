//! The sandbox `layerfs run` runs a command in: private mount, pid and IPC
//! namespaces (and a network namespace with `--no-network`) in which the
//! workspace mount is the only writable place — the rest of the host is a
//! read-only clone, `/tmp`, `/dev/shm` and `/run` are one private tmpfs
//! of bounded size, `/dev` holds only the usual device nodes, `/proc`
//! shows the sandbox's processes, the kernel's global settings in `/proc`
//! and `/sys` are read-only or masked, and the workspace's own upper, work
//! and state directories are hidden.
//!
//! Built with the kernel's own interfaces (`unshare`, the new mount API,
//! `pivot_root`) by a fresh process, `layerfs __sandbox`, which
//! `layerfs run` starts with the command line below; see `init` for the
//! processes, `rootfs` and `masks` for the tree, `terminal` for the
//! command's terminal and `confine` for what the command gives up before
//! it execs. As an unprivileged user it needs user namespaces (the user's
//! own uid mapped to itself); as root the command also runs in a user
//! namespace of its own, so it cannot undo the read-only mounts and masks.

pub mod binds;
mod confine;
pub mod cwd;
mod devices;
pub mod error;
mod init;
mod masks;
mod net;
pub mod places;
pub mod report;
mod rootfs;
#[allow(unsafe_code)]
mod sys;
pub mod terminal;
pub mod userns;

use std::ffi::OsString;
use std::path::PathBuf;

use nix::sys::signal::Signal;

/// The running layerfs binary, whatever its name or path.
pub const SELF_EXE: &str = "/proc/self/exe";

/// The name of the hidden subcommand that starts a sandbox.
pub const SUBCOMMAND: &str = "__sandbox";

/// Signals that ask a `layerfs run` to stop its command.
pub const STOP_SIGNALS: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// What `layerfs run` hands `layerfs __sandbox` (internal; not for users).
#[derive(clap::Args, Debug)]
pub struct Spec {
    /// The workspace mountpoint on the host (absolute).
    #[arg(long, value_name = "DIR")]
    pub workspace: PathBuf,
    /// Where the command sees the workspace (checked by `places::check`).
    #[arg(long, value_name = "DIR")]
    pub at: PathBuf,
    /// An empty host directory to build the sandbox's root on.
    #[arg(long, value_name = "DIR")]
    pub stage: PathBuf,
    /// The working directory, relative to the workspace root (checked)
    /// [default: the workspace root].
    #[arg(long, value_name = "SUBDIR")]
    pub cwd: Option<PathBuf>,
    /// Give the sandbox its own network namespace (loopback only).
    #[arg(long)]
    pub no_network: bool,
    /// Size in bytes of the private tmpfs behind /tmp, /dev/shm and /run.
    #[arg(long, value_name = "BYTES")]
    pub tmp_size: u64,
    /// A checked host path to bind (repeatable): `rw|ro:DEV:INO HOST
    /// SANDBOX` (see `binds::Bind`).
    #[arg(long = "bind", num_args = 3, value_names = ["ID", "HOST", "SANDBOX"])]
    pub binds: Vec<OsString>,
    /// Give the command a private home directory at `binds::HOME`.
    #[arg(long)]
    pub private_home: bool,
    /// A host directory the command must not see (repeatable).
    #[arg(long = "hide", value_name = "DIR")]
    pub hide: Vec<PathBuf>,
    /// Inherited Unix socket on which the init sends `layerfs run` the
    /// master of the command's pseudo-terminal; without it the command
    /// gets no terminal.
    #[arg(long, value_name = "FD", requires = "pty_fds")]
    pub terminal_fd: Option<i32>,
    /// Which of the command's descriptors 0, 1, 2 are its terminal.
    #[arg(long, value_name = "FDS", value_delimiter = ',')]
    pub pty_fds: Vec<i32>,
    /// The terminal's initial window size: rows.
    #[arg(long, default_value_t = 0)]
    pub rows: u16,
    /// The terminal's initial window size: columns.
    #[arg(long, default_value_t = 0)]
    pub cols: u16,
    /// Inherited descriptor for report lines (see `report`).
    #[arg(long, value_name = "FD")]
    pub report_fd: i32,
    /// Inherited pipe on which `layerfs run` sends one byte once it has
    /// moved the init into the run's cgroup; the init forks the command
    /// only after it (so no process of the command runs outside the
    /// group), and gives up at EOF.
    #[arg(long, value_name = "FD")]
    pub cgroup_fd: Option<i32>,
    /// Inherited descriptor on which `layerfs run` sends requests.
    #[arg(long, value_name = "FD")]
    pub control_fd: i32,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// Whether this kernel lets the sandbox refuse the host's abstract Unix
/// sockets (Landlock ABI 6 or later).
pub fn scopes_abstract_sockets() -> bool {
    confine::scopes_abstract_sockets()
}

impl Spec {
    pub fn run(self) -> i32 {
        init::main(self)
    }
}
