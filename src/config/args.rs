//! The raw values of `layerfs mount` (long options and `-o`), before any
//! check: what `validate` turns into a `Config`.

use std::path::PathBuf;
use std::time::Duration;

/// Raw values of `layerfs mount`, before any check.
#[derive(Debug, Clone, Default)]
pub struct MountArgs {
    pub lowers: Vec<PathBuf>,
    pub upper: Option<PathBuf>,
    pub work: Option<PathBuf>,
    pub state: Option<PathBuf>,
    /// `None` with `--no-journal`.
    pub journal: Option<crate::state::journal::Options>,
    pub mountpoint: PathBuf,
    pub foreground: bool,
    pub allow_other: bool,
    /// `--nonempty` or `-o nonempty`: mount over a directory that holds
    /// files (hiding them while mounted).
    pub nonempty: bool,
    pub read_only: bool,
    /// `-o noexec`.
    pub no_exec: bool,
    pub policy_file: Option<PathBuf>,
    pub threads: Option<usize>,
    /// `--io-uring` or `-o io_uring`.
    pub io_uring: bool,
    /// `--lower-passthrough` or `-o lower_passthrough`.
    pub lower_passthrough: bool,
    pub lower_timeout: Option<Duration>,
    pub max_watches: Option<usize>,
    /// `--readahead` or `-o readahead=`, in bytes; 0 keeps the kernel's.
    pub readahead: Option<u64>,
    pub log_file: Option<PathBuf>,
    /// Every `-o` value, in order (each a comma-separated list).
    pub options: Vec<String>,
    pub scratch: Vec<String>,
}
