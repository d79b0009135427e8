//! Why a checked directory was refused: which directory (its role and
//! path), what is wrong with it, and what to do. The text is what the
//! commands print.

use std::io;
use std::path::{Path, PathBuf};

use super::{fix, shell_quote, who, Role};

/// A checked directory that could not be opened, created or trusted.
#[derive(Debug, thiserror::Error)]
pub enum SafeDirError {
    /// The system refused a call on the directory itself.
    #[error("{} {}: {source}", role.what(), path.display())]
    Io {
        role: Role,
        path: PathBuf,
        source: io::Error,
    },
    /// The path ends in `/`, `..` or nothing: no name to keep state under.
    #[error(
        "{} {}: not a directory layerfs can keep its state in (it has no plain last \
         name); give another path",
        role.what(),
        path.display()
    )]
    NoPlainName { role: Role, path: PathBuf },
    /// Its parent could not be opened.
    #[error("{} {}: cannot open its parent {}: {source}", role.what(), path.display(), parent.display())]
    Parent {
        role: Role,
        path: PathBuf,
        parent: PathBuf,
        source: io::Error,
    },
    /// A name given to `open_at` is not a single file name.
    #[error(transparent)]
    Name(io::Error),
    /// `open_at` of a directory that is not there.
    #[error("{} {} does not exist", role.what(), path.display())]
    Missing { role: Role, path: PathBuf },
    /// `mkdirat` failed (other than for an existing name).
    #[error("{} {}: cannot create it: {source}{}", role.what(), path.display(), role.elsewhere())]
    Create {
        role: Role,
        path: PathBuf,
        source: io::Error,
    },
    /// Created, then gone before it could be opened.
    #[error(
        "{} {} vanished right after it was created (another process removed it); retry",
        role.what(),
        path.display()
    )]
    Vanished { role: Role, path: PathBuf },
    /// A symbolic link where the directory should be.
    #[error(
        "{} {} is a symbolic link{}, owned by {}: layerfs never follows a link there, \
         since whoever can write its parent could point it anywhere; {}",
        role.what(),
        path.display(),
        target.as_ref().map(|t| format!(" (to {})", t.display())).unwrap_or_default(),
        owner.map_or("someone".into(), who),
        fix(path, false, *role)
    )]
    Symlink {
        role: Role,
        path: PathBuf,
        target: Option<PathBuf>,
        owner: Option<u32>,
    },
    /// Something other than a directory at its name.
    #[error(
        "{} {} exists and is not a directory; {}",
        role.what(),
        path.display(),
        fix(path, false, *role)
    )]
    NotADirectory { role: Role, path: PathBuf },
    /// Its owner or mode breaks the rules of the module comment
    /// (`problem` says which); `is_mode`: the mode, not the owner.
    #[error("{} {} {problem}; {}", role.what(), path.display(), fix(path, *is_mode, *role))]
    Untrusted {
        role: Role,
        path: PathBuf,
        problem: String,
        is_mode: bool,
    },
    /// Another user's directory, seen by root.
    #[error(
        "{} {} {problem}: check what it holds and remove it (`rm -r {}`){}",
        role.what(),
        path.display(),
        shell_quote(path),
        role.elsewhere()
    )]
    OthersForRoot {
        role: Role,
        path: PathBuf,
        problem: String,
    },
    /// The way to a stable directory could not be resolved or opened
    /// (`step`: "cannot resolve its parent P", "cannot open /").
    #[error("{} {}: {step}: {source}", role.what(), path.display())]
    Way {
        role: Role,
        path: PathBuf,
        step: String,
        source: io::Error,
    },
    /// fstat of a directory on the way failed.
    #[error("{}: {source}", at.display())]
    WayStat { at: PathBuf, source: io::Error },
    /// A directory on the way belongs to someone else.
    #[error(
        "{} {}: {} on the way to it belongs to {}, who could rename it and put \
         something else there; {}",
        role.what(),
        path.display(),
        at.display(),
        who(*owner),
        role.elsewhere().trim_start_matches(", or ")
    )]
    WayForeign {
        role: Role,
        path: PathBuf,
        at: PathBuf,
        owner: u32,
    },
    /// A directory on the way is writable by others and not sticky.
    #[error(
        "{} {}: {} on the way to it is writable by others (mode {mode:04o}) without \
         the sticky bit, so they could rename it and put something else there; run \
         `chmod +t {}`{}",
        role.what(),
        path.display(),
        at.display(),
        shell_quote(at),
        role.elsewhere()
    )]
    WayWritable {
        role: Role,
        path: PathBuf,
        at: PathBuf,
        mode: u32,
    },
    /// A directory on the way was replaced while it was checked.
    #[error("{} {}: {} changed while it was checked ({source}); retry", role.what(), path.display(), at.display())]
    WayChanged {
        role: Role,
        path: PathBuf,
        at: PathBuf,
        source: io::Error,
    },
}

impl SafeDirError {
    pub(super) fn io(role: Role, path: &Path, source: io::Error) -> Self {
        SafeDirError::Io {
            role,
            path: path.to_path_buf(),
            source,
        }
    }
}
