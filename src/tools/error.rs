//! The tools' one error type: which path, and which rule refused it.

use std::fmt;

/// What went wrong with a tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// The path itself is refused (`path::RelPath`): the reason.
    BadPath(&'static str),
    NotFound,
    /// `write` without `overwrite`, `mkdir` or `rename` onto a name in use.
    Exists,
    NotADirectory,
    IsADirectory,
    NotEmpty,
    /// A symlink on the path or at its end: the tools never follow one.
    Symlink,
    /// The policy refused it; the rule that decided, when known.
    Denied {
        rule: Option<String>,
        errno: i32,
    },
    /// `edit` found `old_string` this many times where it needs exactly
    /// one (or at least one with `replace_all`).
    Matches(usize),
    /// `edit` with `old_string` equal to `new_string`, or empty.
    BadEdit(&'static str),
    /// A text operation on a file that is not text.
    Binary,
    /// The workspace is open read-only (`serve --read-only`).
    ReadOnly,
    /// A bad pattern (grep, glob): the parser's message.
    Pattern(String),
    /// Opening the workspace failed: the message says why and what to do.
    Open(String),
    /// `execute` could not run the command (no mount, no sandbox): the
    /// message says why and what to do.
    Exec(String),
    /// A state operation (diff, reset, snapshots, checkpoints, undo)
    /// failed: the message says why and what to do.
    State(String),
    /// Any other system error.
    Io(i32),
}

/// A tool's error: the path it concerns and what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    pub path: String,
    pub what: What,
}

impl ToolError {
    pub fn new(path: impl fmt::Display, what: What) -> ToolError {
        ToolError {
            path: path.to_string(),
            what,
        }
    }

    /// The same error about another path (a temporary file's error is
    /// reported on the file it stands for).
    pub fn about(mut self, path: impl fmt::Display) -> ToolError {
        self.path = path.to_string();
        self
    }

    /// An errno from a layer or the mount, with the policy rule that
    /// decided it when one did.
    pub fn errno(path: impl fmt::Display, errno: i32, rule: Option<String>) -> ToolError {
        let what = match errno {
            _ if rule.is_some() => What::Denied { rule, errno },
            libc::ENOENT => What::NotFound,
            libc::EEXIST => What::Exists,
            libc::ENOTDIR => What::NotADirectory,
            libc::EISDIR => What::IsADirectory,
            libc::ENOTEMPTY => What::NotEmpty,
            libc::ELOOP => What::Symlink,
            libc::EACCES | libc::EPERM | libc::EROFS => What::Denied { rule: None, errno },
            e => What::Io(e),
        };
        ToolError::new(path, what)
    }

    /// A short, stable name of the kind of error (`--json` output, MCP).
    pub fn kind(&self) -> &'static str {
        match self.what {
            What::BadPath(_) => "bad_path",
            What::NotFound => "not_found",
            What::Exists => "exists",
            What::NotADirectory => "not_a_directory",
            What::IsADirectory => "is_a_directory",
            What::NotEmpty => "not_empty",
            What::Symlink => "symlink",
            What::Denied { .. } => "denied",
            What::Matches(_) => "matches",
            What::BadEdit(_) => "bad_edit",
            What::Binary => "binary",
            What::ReadOnly => "read_only",
            What::Pattern(_) => "pattern",
            What::Open(_) => "open",
            What::Exec(_) => "exec",
            What::State(_) => "state",
            What::Io(_) => "io",
        }
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.path;
        match &self.what {
            What::BadPath(why) => write!(f, "{p:?}: {why}"),
            What::NotFound => write!(f, "{p}: no such file or directory"),
            What::Exists => write!(
                f,
                "{p}: already exists (write creates only; pass overwrite to replace it)"
            ),
            What::NotADirectory => write!(f, "{p}: not a directory"),
            What::IsADirectory => write!(f, "{p}: is a directory"),
            What::NotEmpty => write!(f, "{p}: directory not empty (pass recursive)"),
            What::Symlink => write!(
                f,
                "{p}: a symlink is on the path; tools do not follow symlinks"
            ),
            What::Denied {
                rule: Some(rule),
                errno,
            } => write!(
                f,
                "{p}: denied by the policy ({}), rule {rule}",
                std::io::Error::from_raw_os_error(*errno)
            ),
            What::Denied { rule: None, errno } => {
                write!(f, "{p}: {}", std::io::Error::from_raw_os_error(*errno))
            }
            What::Matches(0) => write!(f, "{p}: old_string not found (0 matches)"),
            What::Matches(n) => write!(
                f,
                "{p}: old_string found {n} times; it must match exactly once (add context, \
                 or pass replace_all)"
            ),
            What::BadEdit(why) => write!(f, "{p}: {why}"),
            What::Binary => write!(f, "{p}: binary file (use the raw read)"),
            What::ReadOnly => write!(f, "{p}: the workspace is open read-only"),
            What::Pattern(m) => write!(f, "bad pattern {p:?}: {m}"),
            What::Open(m) | What::Exec(m) | What::State(m) => write!(f, "{p}: {m}"),
            What::Io(e) => write!(f, "{p}: {}", std::io::Error::from_raw_os_error(*e)),
        }
    }
}

impl std::error::Error for ToolError {}

pub type Result<T> = std::result::Result<T, ToolError>;
