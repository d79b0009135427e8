//! The control socket's `reset` and `gc` commands: the daemon changes the
//! upper itself, because its inode table holds the real files. Writes are
//! paused for the moment of the change (a write in flight completes first;
//! readers go on), the inodes under the changed paths are re-resolved,
//! then the kernel's caches for those paths are invalidated, so the mount
//! shows the shared version at once.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use super::served::Daemon;
use crate::layer::stack::Layers;
use crate::state::protocol::Changed;
use crate::state::{reset, scratch};

/// Why a live `reset` or `gc` failed.
#[derive(Debug, thiserror::Error)]
pub enum LiveResetError {
    /// A path given, or a step of the reset itself.
    #[error(transparent)]
    Reset(#[from] reset::ResetError),
    /// Duplicating the descriptor of `what` ("lower dir", "upper dir",
    /// "work dir").
    #[error("cannot use the {what}: {source}")]
    Dup {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("cannot use the upper dir: {0}")]
    UpperRoot(#[source] std::io::Error),
    #[error("cannot stat the upper dir: {0}")]
    StatUpper(#[source] std::io::Error),
    /// The scratch globs of the mount and its policy.
    #[error(transparent)]
    Scratch(#[from] crate::policy::pattern::PatternError),
    #[error(
        "this workspace has no scratch paths; mount it with --scratch GLOB or add `scratch \
         GLOB` to its policy"
    )]
    NoScratch,
    /// A step failed after `done` (relative paths) were already reset.
    #[error("{source} (already reset: {})", done.join(", "))]
    Partial {
        source: reset::ResetError,
        done: Vec<String>,
    },
}

/// How long a reset waits for passthrough write opens to close.
const DRAIN: Duration = Duration::from_secs(2);

/// `Request::Reset` of `paths`, or `Request::Gc` when `gc`.
pub fn serve(daemon: &Daemon, paths: &[String], gc: bool) -> Result<Changed, LiveResetError> {
    let ov = daemon.fs.overlay();
    let paths: Vec<OsString> = paths
        .iter()
        .map(|p| reset::normalize(Path::new(p), &[]))
        .collect::<Result<_, reset::ResetError>>()?;
    let dup = |fd: &std::os::fd::OwnedFd, what: &'static str| {
        fd.try_clone()
            .map_err(|source| LiveResetError::Dup { what, source })
    };
    let lowers = ov
        .lowers()
        .iter()
        .map(|l| dup(&l.root, "lower dir"))
        .collect::<Result<Vec<_>, _>>()?;
    // The upper as served now (a live restore may have replaced it).
    let upper_root = ov.upper_root().map_err(LiveResetError::UpperRoot)?;
    let layers = Layers::from_fds(dup(&upper_root, "upper dir")?, lowers)
        .map_err(LiveResetError::StatUpper)?;
    let work = dup(&ov.upper().work, "work dir")?;
    let mut patterns = daemon.scratch.clone();
    patterns.extend(ov.policy().scratch().iter().cloned());
    let sc = scratch::Scratch::new(&patterns)?;
    if gc && sc.is_empty() {
        return Err(LiveResetError::NoScratch);
    }
    // Whatever was changed before an error is still refreshed and
    // invalidated: the mount never shows a stale view.
    let mut done = reset::Outcome::default();
    let failed = {
        let (_pause, _busy) = daemon.fs.pause_writes(DRAIN);
        let r = if gc {
            reset::gc(&layers, &work, &sc, &mut done)
        } else {
            paths
                .iter()
                .try_for_each(|p| reset::reset_path(&layers, &work, p, &mut done))
        };
        // The inodes under the reset paths let go of the upper files they
        // held (those moved into the work dir among them).
        ov.refresh_paths(&done.changed);
        r.err()
    };
    let rel: Vec<String> = done
        .changed
        .iter()
        .map(|p| String::from_utf8_lossy(p.as_bytes()).into_owned())
        .collect();
    daemon.fs.invalidate_paths(&rel);
    // Out of the view since the pause: removed with writes going on.
    if let Err(e) = reset::remove_moved_away(&work, &done.moved_away) {
        tracing::warn!("{e}");
    }
    match failed {
        Some(e) if rel.is_empty() => Err(e.into()),
        Some(source) => Err(LiveResetError::Partial { source, done: rel }),
        None => Ok(Changed { changed: rel }),
    }
}
