//! Why a pattern, a policy line or a policy file is refused: which
//! pattern, which line and keyword, which file, and what is wrong. The
//! text is what `layerfs mount --policy`, `policy check` and a `SIGHUP`
//! reload print.

use std::io;
use std::path::PathBuf;

/// What the `quota` keyword accepts.
const QUOTA_EXPECTED: &str =
    "expected `bytes=SIZE` and/or `inodes=COUNT`, e.g. `quota bytes=10G inodes=1M`";

/// The keywords of a policy file.
pub(super) const KEYWORDS: &str =
    "hide, readonly, protect, symlinks, allow-host, devices, suid, quota, scratch";

/// A pattern (policy `hide` / `readonly` / `protect` / `scratch`,
/// `--scratch`) that the pattern language refuses.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PatternError {
    #[error(
        "pattern `{0}`: negation (`!`) is not supported; write `\\!` for a name that starts with `!`"
    )]
    Negation(String),
    #[error("pattern `{0}` is empty; expected a glob relative to the mount root, e.g. `build/**`")]
    Empty(String),
    #[error("pattern `{0}` has an empty path segment (`//`)")]
    EmptySegment(String),
    #[error(
        "pattern `{0}` has a `..` segment; patterns are relative to the mount root and cannot climb out of it"
    )]
    DotDot(String),
    #[error("pattern `{0}` has a `.` segment, which never matches; write the path without it")]
    Dot(String),
    /// globset cannot compile it (`pattern` as the user wrote it, or the
    /// glob a rule compiled to).
    #[error("bad glob `{pattern}`: {}", source.kind())]
    Glob {
        pattern: String,
        source: globset::Error,
    },
    /// A set of patterns that cannot be compiled together.
    #[error("patterns: {0}")]
    Set(#[source] globset::Error),
}

/// A quota amount that is not one (`bytes=10X`, `--max-log-size`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error(
        "not a number; expected a whole number with an optional suffix K, M, G or T (e.g. 10G)"
    )]
    NotANumber,
    #[error("number too large")]
    TooLarge,
}

/// What is wrong with one line of a policy file (`PolicyError` adds the
/// line's number).
#[derive(Debug, Clone, thiserror::Error)]
pub enum LineError {
    #[error("unknown rule `{0}`; expected one of {KEYWORDS}", KEYWORDS = KEYWORDS)]
    UnknownRule(String),
    #[error("`{keyword}` needs an argument: expected {expected}")]
    NoArgument {
        keyword: String,
        expected: &'static str,
    },
    #[error(
        "`{keyword}` takes one argument, found extra `{extra}`: expected {expected} \
         (patterns cannot contain spaces)"
    )]
    ExtraArgument {
        keyword: String,
        extra: String,
        expected: &'static str,
    },
    /// A setting's value that is not one of its words.
    #[error("`{keyword} {value}`: unknown value `{value}`; expected {expected}")]
    BadValue {
        keyword: String,
        value: String,
        expected: &'static str,
    },
    #[error("`allow-host {0}`: the prefix must be an absolute path such as `/usr` (or `none`)")]
    HostNotAbsolute(String),
    #[error("`allow-host {0}`: the prefix must not contain `..`")]
    HostClimbs(String),
    #[error("`quota` needs an argument: {QUOTA_EXPECTED}", QUOTA_EXPECTED = QUOTA_EXPECTED)]
    QuotaNoArgument,
    #[error("quota: `{0}` is not KEY=VALUE; {QUOTA_EXPECTED}", QUOTA_EXPECTED = QUOTA_EXPECTED)]
    QuotaNotKeyValue(String),
    #[error("quota: unknown key `{0}`; {QUOTA_EXPECTED}", QUOTA_EXPECTED = QUOTA_EXPECTED)]
    QuotaKey(String),
    #[error("quota: `{0}` given twice")]
    QuotaTwice(String),
    #[error("quota: {key}=`{value}`: {source}")]
    QuotaAmount {
        key: String,
        value: String,
        source: AmountError,
    },
    /// The line's pattern is refused.
    #[error(transparent)]
    Pattern(#[from] PatternError),
    /// A container glob derived from a rule did not compile, nor did `**`.
    #[error("internal glob error: {0}")]
    InternalGlob(#[source] globset::Error),
    /// The path rules together are too large to compile.
    #[error("cannot compile the path rules: {0}")]
    TooLarge(#[source] globset::Error),
}

/// A policy file that does not parse: the line and what is wrong with it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("line {line}: {kind}")]
pub struct PolicyError {
    pub line: usize,
    pub kind: LineError,
}

/// A policy file that cannot be read or does not parse.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read policy file {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{}: {source}", path.display())]
    Parse { path: PathBuf, source: PolicyError },
}
