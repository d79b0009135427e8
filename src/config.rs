//! Validated mount configuration: what `layerfs mount` (long options or the
//! kernel-overlay style `-o lowerdir=…,upperdir=…,workdir=…`) resolves to.

use std::path::PathBuf;
use std::time::Duration;

use crate::policy::Policy;

/// Everything the daemon and the overlay core need to serve one mount.
/// Paths are absolute and canonical once `validate` has run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Lower layers, topmost first.
    pub lowers: Vec<PathBuf>,
    pub upper: PathBuf,
    /// Work directory on the upper's filesystem, outside the upper tree.
    pub work: PathBuf,
    pub mountpoint: PathBuf,
    pub foreground: bool,
    pub allow_other: bool,
    pub read_only: bool,
    /// Policy file given with `--policy`, kept for SIGHUP reloads.
    pub policy_file: Option<PathBuf>,
    pub policy: Policy,
    /// FUSE worker threads.
    pub threads: usize,
    /// How long the kernel may trust names and attributes of lower entries
    /// before asking again: changes made to a lower from outside show up
    /// through the mount within this time.
    pub lower_timeout: Duration,
}
