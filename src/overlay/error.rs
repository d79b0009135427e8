//! Why the union cannot be set up or re-rooted: which layer or directory
//! (upper, work dir, a lower root), which step, and the system's reason.
//! Requests themselves fail with an `Errno`; these are the errors of
//! `Overlay::new` and `Overlay::replace_upper_root`, which a mount, the
//! tools and the daemon's layer changes print.

use std::io;
use std::path::PathBuf;

use super::Errno;
use crate::layer::safedir::SafeDirError;
use crate::layer::LayerError;

/// The union could not be set up (or its upper root replaced).
#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    /// The upper or a lower cannot be opened as a layer.
    #[error(transparent)]
    Layer(#[from] LayerError),
    /// The work dir is refused by the checks of layerfs's own directories.
    #[error(transparent)]
    WorkDir(#[from] SafeDirError),
    #[error("work dir {} does not exist", work.display())]
    NoWorkDir { work: PathBuf },
    #[error("cannot stat work dir {}: {source}", work.display())]
    StatWork { work: PathBuf, source: io::Error },
    #[error(
        "work dir {} is not on the same filesystem as upper dir {}",
        work.display(),
        upper.display()
    )]
    WorkElsewhere { work: PathBuf, upper: PathBuf },
    #[error("cannot clean work dir {}: {source}", work.display())]
    CleanWork { work: PathBuf, source: io::Error },
    /// Counting the upper's usage for the policy's quota failed.
    #[error("cannot measure upper usage: {0}")]
    MeasureUsage(#[source] io::Error),
    #[error("cannot open upper root: {0}")]
    UpperRoot(#[source] io::Error),
    /// A lower's root could not be opened again for the root object.
    #[error("cannot open {}: {source}", lower.display())]
    LowerRoot { lower: PathBuf, source: io::Error },
    #[error("the root object is gone: {0}")]
    RootGone(#[source] Errno),
}
