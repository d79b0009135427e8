//! Validated mount configuration: what `layerfs mount` (long options or the
//! kernel-overlay style `-o lowerdir=…,upperdir=…,workdir=…`) resolves to.
//!
//! This room turns raw command-line values into a `Config`, one file a job:
//! `args` (the raw values), `values` (sizes, ages, durations), `options`
//! (`-o` parsing), `paths` (canonical paths and how they nest),
//! `mountpoint` (the mountpoint's checks), `dirs` (the work and state
//! dirs, found or created), `validate` (every check that must pass before
//! anything is mounted, in order) and `instance` (the USER[@SESSION]
//! naming scheme). Here: the `Config` itself and why one is refused.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::policy::Policy;

mod args;
mod dirs;
pub mod instance;
mod mountpoint;
mod options;
mod paths;
mod validate;
mod values;

pub use args::MountArgs;
pub use options::{apply_mount_options, split_known_options, IGNORED_OPTIONS, LAYERFS_OPTIONS};
pub use paths::default_work_dir;
pub use validate::validate;
pub use values::{parse_age, parse_duration, parse_size, ValueError};

/// Everything the daemon and the overlay core need to serve one mount.
/// Paths are absolute and canonical once `validate` has run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Lower layers, topmost first.
    pub lowers: Vec<PathBuf>,
    /// Frozen layers (checkpoints) from the workspace's stack, topmost
    /// first, served above `lowers` (`state::frozen`).
    pub layers: Vec<PathBuf>,
    pub upper: PathBuf,
    /// Work directory on the upper's filesystem, outside the upper tree.
    pub work: PathBuf,
    /// Workspace state directory (control socket, journal, snapshots),
    /// outside the upper, the lowers and the work dir.
    pub state: PathBuf,
    /// The change journal's settings; `None` with `--no-journal`.
    pub journal: Option<crate::state::journal::Options>,
    pub mountpoint: PathBuf,
    pub foreground: bool,
    pub allow_other: bool,
    pub read_only: bool,
    /// `-o noexec`: programs on the mount cannot be executed (`MS_NOEXEC`).
    pub no_exec: bool,
    /// Policy file given with `--policy`, kept for SIGHUP reloads.
    pub policy_file: Option<PathBuf>,
    pub policy: Policy,
    /// FUSE worker threads.
    pub threads: usize,
    /// `--io-uring`: serve requests through per-CPU io_uring queues when
    /// the kernel offers them.
    pub io_uring: bool,
    /// `--lower-passthrough`: every read-only open of a lower file passes
    /// it through to the kernel (`fuse::io_mode`).
    pub lower_passthrough: bool,
    /// How long the kernel may trust names and attributes of lower entries
    /// before asking again: changes made to a lower from outside show up
    /// through the mount within this time.
    pub lower_timeout: Duration,
    /// `--max-watches`: the most inotify watches the mount holds on lower
    /// directories; `None` = `overlay::watch::default_cap()`.
    pub max_watches: Option<usize>,
    /// `--readahead`: the mount's readahead in bytes, set as root after
    /// the INIT handshake (`daemon::readahead`); 0 keeps the kernel's.
    pub readahead: u64,
    /// Where the daemon logs (`--log-file`); `None` = stderr (foreground)
    /// or nowhere (background).
    pub log_file: Option<PathBuf>,
    /// `layerfs mount` created the work dir: a mount that fails removes it
    /// again (if still empty), so a refused mount leaves nothing behind.
    pub created_work: bool,
    /// `--scratch` globs: paths diff and snapshots leave out, gc empties.
    pub scratch: Vec<String>,
}

/// Default for `--lower-timeout`.
pub const DEFAULT_LOWER_TIMEOUT: Duration = Duration::from_secs(1);

/// Default for `--readahead`: two of the largest READs the kernel sends
/// (256 pages each), so each readahead window keeps two READs in flight
/// (`daemon::readahead`).
pub const DEFAULT_READAHEAD: u64 = 2 << 20;

impl Config {
    /// What the overlay core needs of this config.
    pub fn overlay_options(&self) -> crate::overlay::Options {
        crate::overlay::Options {
            lowers: self.layers.iter().chain(&self.lowers).cloned().collect(),
            checkpoints: self.layers.len(),
            upper: self.upper.clone(),
            work: self.work.clone(),
            policy: self.policy.clone(),
            read_only: self.read_only,
            threads: self.threads,
            max_watches: self.max_watches,
        }
    }
}

/// Why a mount configuration was refused. `Usage` means the command line
/// itself is wrong; `Invalid` means the system state is (the command line
/// maps them to its exit statuses, `cli::exit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    Usage(String),
    Invalid(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Usage(m) | ConfigError::Invalid(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ConfigError {}

pub(crate) fn usage(msg: impl Into<String>) -> ConfigError {
    ConfigError::Usage(msg.into())
}

pub(crate) fn invalid(msg: impl std::fmt::Display) -> ConfigError {
    ConfigError::Invalid(msg.to_string())
}

/// Default worker thread count: 4, whatever the number of CPUs. Four let
/// requests that wait on disk (cold reads, fsync, a large copy-up) overlap
/// with others; one workspace seldom has more requests in flight. fuser
/// fixes the count for the session's life and an idle worker still is a
/// thread, so a default that grew with the CPUs would give each of many
/// idle workspaces on a large host dozens of threads (`--threads N` raises
/// it for a busy shared workspace).
pub const DEFAULT_THREADS: usize = 4;

pub fn default_threads() -> usize {
    DEFAULT_THREADS
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests;
