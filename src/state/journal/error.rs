//! Why the journal could not be read, written or queried: which
//! database, which filter, and the reason SQLite or the parser gave. The
//! text is what `layerfs log`, `status` and the state commands print.

use std::path::PathBuf;

/// A journal query refused, or a database that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// `Query::op` names no operation the journal writes (`known`: the
    /// ones it does, listed).
    #[error("unknown journal op `{op}`; known: {known}")]
    UnknownOp { op: String, known: String },
    /// `Query::since` is neither an RFC 3339 time nor an age.
    #[error("since {given}: give an RFC 3339 time (2026-12-03T15:00:00Z) or an age (10m, 2h)")]
    BadSince { given: String },
    /// A path glob that does not compile; `field` names the filter it
    /// was given for ("path ", or "" where the caller names it).
    #[error("{field}{glob}: {source}")]
    BadGlob {
        field: &'static str,
        glob: String,
        #[source]
        source: globset::Error,
    },
    /// No database at `path` (the journal is off, or never written).
    #[error(
        "no journal at {} (the workspace was mounted with --no-journal, or never mounted)",
        path.display()
    )]
    Missing { path: PathBuf },
    /// The database could not be opened read-only.
    #[error("cannot open journal {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    /// Reading rows back failed.
    #[error("reading journal {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    /// A state command's row could not be written.
    #[error("journal {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    /// Counting the rows of an unmounted workspace's journal failed.
    #[error("{}: {source}", path.display())]
    Count {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
}
