//! The tools' requests and results, as values. Argument names follow the
//! common agent-tool schemas (`path`, `offset`, `limit`, `content`,
//! `overwrite`, `old_string`, `new_string`, `replace_all`, `pattern`,
//! `glob`, `regex`), so the MCP server (`serve`) and `layerfs fs --json`
//! hand them over as they come.

use serde::{Deserialize, Serialize};

use super::store::Kind;

/// Lines `read` returns when no limit is given.
pub const DEFAULT_LIMIT: usize = 2000;

fn default_limit() -> usize {
    DEFAULT_LIMIT
}

fn root() -> String {
    "/".into()
}

/// One entry of `ls`, `glob` or `stat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// Workspace-relative, no leading `/`.
    pub path: String,
    pub kind: Kind,
    pub size: u64,
    /// Seconds since the Unix epoch.
    pub mtime: i64,
    /// Permission bits.
    pub mode: u32,
}

/// `read`: lines `offset..offset+limit` (0-based: `offset` lines skipped).
#[derive(Debug, Clone, Deserialize)]
pub struct ReadRequest {
    pub path: String,
    #[serde(default)]
    pub offset: usize,
    #[serde(default = "default_limit")]
    pub limit: usize,
}

impl ReadRequest {
    /// The first `DEFAULT_LIMIT` lines of `path`.
    pub fn new(path: &str) -> ReadRequest {
        ReadRequest {
            path: path.into(),
            offset: 0,
            limit: DEFAULT_LIMIT,
        }
    }
}

/// What `read` found: numbered lines (`     1\tline`), or, for a binary
/// file, no content and `binary` set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReadResult {
    pub path: String,
    pub content: String,
    /// Lines shown.
    pub lines: usize,
    /// Lines in the whole file.
    pub total_lines: usize,
    /// More lines follow the ones shown.
    pub truncated: bool,
    pub binary: bool,
    pub size: u64,
}

/// `write`: creates `path`; an existing file is an error unless
/// `overwrite`, which replaces it atomically.
#[derive(Debug, Clone, Deserialize)]
pub struct WriteRequest {
    pub path: String,
    pub content: String,
    #[serde(default)]
    pub overwrite: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WriteResult {
    pub path: String,
    pub bytes: u64,
    /// The file is new (false: an existing one was replaced).
    pub created: bool,
}

/// `edit`: replaces `old_string` by `new_string`, which must occur exactly
/// once unless `replace_all`.
#[derive(Debug, Clone, Deserialize)]
pub struct EditRequest {
    pub path: String,
    pub old_string: String,
    pub new_string: String,
    #[serde(default)]
    pub replace_all: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EditResult {
    pub path: String,
    pub replacements: usize,
}

/// What `grep` returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GrepMode {
    /// Each matching line with its path and number.
    #[default]
    Content,
    /// The paths of the files with a match.
    Files,
    /// Matching lines per file.
    Count,
}

/// `grep`: `pattern` (a literal string unless `regex`) in the text files
/// under `path` (whose name, or path when the glob has a `/`, matches
/// `glob`). Binary files are skipped, hidden paths are never seen, and
/// scratch paths are skipped unless `scratch`.
#[derive(Debug, Clone, Deserialize)]
pub struct GrepRequest {
    pub pattern: String,
    #[serde(default = "root")]
    pub path: String,
    #[serde(default)]
    pub glob: Option<String>,
    #[serde(default)]
    pub regex: bool,
    #[serde(default)]
    pub ignore_case: bool,
    #[serde(default)]
    pub output_mode: GrepMode,
    #[serde(default)]
    pub scratch: bool,
}

impl GrepRequest {
    /// A literal, case-sensitive search of the whole workspace.
    pub fn new(pattern: &str) -> GrepRequest {
        GrepRequest {
            pattern: pattern.into(),
            path: root(),
            glob: None,
            regex: false,
            ignore_case: false,
            output_mode: GrepMode::Content,
            scratch: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrepMatch {
    pub path: String,
    /// 1-based.
    pub line: usize,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrepCount {
    pub path: String,
    pub count: usize,
}

/// `grep`'s answer; the field of the request's mode is filled.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GrepResult {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<GrepMatch>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub counts: Vec<GrepCount>,
}

/// `glob`: entries under `path` whose path relative to it matches
/// `pattern` (`*` stays within a name, `**` crosses directories).
#[derive(Debug, Clone, Deserialize)]
pub struct GlobRequest {
    pub pattern: String,
    #[serde(default = "root")]
    pub path: String,
}

impl GlobRequest {
    pub fn new(pattern: &str) -> GlobRequest {
        GlobRequest {
            pattern: pattern.into(),
            path: root(),
        }
    }
}
