//! Logging setup: tracing to stderr (which a background daemon or
//! `--log-file` points at a file), filtered by RUST_LOG, default `info` for
//! layerfs and `warn` for everything else (fuser included).

use tracing_subscriber::EnvFilter;

/// The filter used when RUST_LOG is unset.
pub const DEFAULT_FILTER: &str = "warn,layerfs=info";

/// Installs the global subscriber once; later calls do nothing.
pub fn init(ansi: bool) {
    init_with(ansi, DEFAULT_FILTER)
}

/// `init` with another filter when `RUST_LOG` is not set: the tools
/// (`layerfs fs`, `serve`) run the core in-process and want only its
/// warnings on their stderr.
pub fn init_with(ansi: bool, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .try_init();
}
