//! The daemon's file descriptors as one budget: how many it may hold
//! (`RLIMIT_NOFILE`, the soft limit, read again when it changes) and how
//! that number is split between the parts that hold them, so that no part
//! — and no caller, through the part it drives — can take the fds the
//! others need.
//!
//! | part | share of the limit | when it is used up |
//! |---|---|---|
//! | the `RealFd` cache (`real`): `O_PATH` fds of objects the kernel holds | 1/2 | the least recently admitted is closed (reopened by file handle on use) |
//! | removed files the kernel still holds (`RealFd::pin`) | 1/16 | a removed file stays reachable through its open handles only |
//! | the daemon's own: FUSE channels, journal, sockets, the directory and copy-up fds a request opens while it runs | 1/8 | — (a reserve no part may take) |
//! | open file handles (`overlay::share`), one fd each | the rest, less the fds of objects on layers without file handles | the caller over its share gets `EMFILE` |
//!
//! Objects on a layer whose file handles cannot be trusted (`netfs`) keep
//! their fd for as long as the kernel holds them; they are counted
//! (`unevictable`) and leave the open files that much less.
//!
//! The limit is read at most once a second: an administrator may lower it
//! on the running daemon (`prlimit --pid`), and every share follows.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// The soft `RLIMIT_NOFILE` last read, and when (ms since `epoch()`).
static SOFT: AtomicUsize = AtomicUsize::new(0);
static READ_AT: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

/// The process's soft fd limit, read again when the last read is over a
/// second old (cheap enough for every open and every cache admission).
pub fn limit() -> usize {
    let now = epoch().elapsed().as_millis() as u64 + 1;
    let at = READ_AT.load(Ordering::Relaxed);
    let soft = SOFT.load(Ordering::Relaxed);
    if soft != 0 && now.saturating_sub(at) < 1000 {
        return soft;
    }
    let soft = match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
        Ok((cur, _)) => usize::try_from(cur).unwrap_or(usize::MAX).max(64),
        Err(_) => 1024,
    };
    SOFT.store(soft, Ordering::Relaxed);
    READ_AT.store(now, Ordering::Relaxed);
    soft
}

/// Fds kept open for good by objects on layers without usable file
/// handles (maintained by `real`).
pub(crate) static UNEVICTABLE: AtomicUsize = AtomicUsize::new(0);
/// Fds the `RealFd` cache holds now (maintained by `real`).
pub(crate) static CACHED: AtomicUsize = AtomicUsize::new(0);
/// Fds pinned for removed files the kernel still holds (by `real`).
pub(crate) static PINNED: AtomicUsize = AtomicUsize::new(0);

/// The `RealFd` cache's bound: `LAYERFS_FD_CACHE` when set, else half the
/// limit.
pub fn cache_limit() -> usize {
    static FIXED: OnceLock<Option<usize>> = OnceLock::new();
    let fixed = *FIXED.get_or_init(|| {
        std::env::var("LAYERFS_FD_CACHE")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    fixed.unwrap_or_else(|| (limit() / 2).max(64))
}

/// How many removed files may keep a pinned fd.
pub fn pin_limit() -> usize {
    (limit() / 16).max(16)
}

/// Fds kept for the daemon's own needs.
pub fn reserve() -> usize {
    (limit() / 8).max(32)
}

/// Fds open file handles may hold together, all callers counted.
pub fn handle_pool() -> usize {
    limit()
        .saturating_sub(cache_limit())
        .saturating_sub(pin_limit())
        .saturating_sub(reserve())
        .saturating_sub(UNEVICTABLE.load(Ordering::Relaxed))
}

/// How many fds the process has open now (a walk of `/proc/self/fd`; for
/// `status`, not for a request path).
pub fn open_now() -> Option<usize> {
    std::fs::read_dir("/proc/self/fd")
        .ok()
        // The walk's own directory fd is one of them.
        .map(|d| d.count().saturating_sub(1))
}

/// The budget as `status` shows it.
pub fn report() -> Report {
    Report {
        limit: limit(),
        open: open_now(),
        cache: Budget {
            open: CACHED.load(Ordering::Relaxed),
            limit: cache_limit(),
        },
        pinned: Budget {
            open: PINNED.load(Ordering::Relaxed),
            limit: pin_limit(),
        },
        unevictable: UNEVICTABLE.load(Ordering::Relaxed),
        reserve: reserve(),
        handle_pool: handle_pool(),
    }
}

/// The daemon's fds as `status` reports them (`report`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Report {
    /// The soft fd limit.
    pub limit: usize,
    /// Open now (unknown without /proc).
    pub open: Option<usize>,
    /// The object cache's fds.
    pub cache: Budget,
    /// Fds pinning removed files that are still open.
    pub pinned: Budget,
    pub unevictable: usize,
    pub reserve: usize,
    /// Fds open file handles may hold together.
    pub handle_pool: usize,
}

/// One part of the fd budget: how many are open of its limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Budget {
    pub open: usize,
    pub limit: usize,
}
