//! The MCP tools' names, descriptions and JSON schemas: what an agent
//! reads to use them unprompted. Argument names follow the common agent
//! file-tool schemas and are those `tools::request` deserializes.

use serde_json::{json, Value};

/// One tool as offered.
pub struct ToolDef {
    pub name: &'static str,
    pub description: &'static str,
    /// It changes the workspace (left out with `--read-only`).
    pub changes: bool,
    /// It may remove or replace what exists.
    pub destroys: bool,
    /// `(name, JSON type and description, required)` of each argument.
    args: &'static [(&'static str, &'static str, &'static str, bool)],
}

impl ToolDef {
    /// The input schema: an object of the arguments.
    pub fn schema(&self) -> Value {
        let mut props = serde_json::Map::new();
        let mut required = Vec::new();
        for (name, ty, desc, req) in self.args {
            let mut p = json!({"type": ty, "description": desc});
            if *name == "output_mode" {
                p["enum"] = json!(["content", "files", "count"]);
            }
            if *name == "encoding" {
                p["enum"] = json!(["text", "base64"]);
            }
            if *name == "base" {
                p["enum"] = json!(["checkpoint", "shared"]);
            }
            if *ty == "array" {
                p["items"] = json!({"type": "string"});
            }
            props.insert(name.to_string(), p);
            if *req {
                required.push(*name);
            }
        }
        json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
    }
}

const PATH: (&str, &str, &str, bool) = (
    "path",
    "string",
    "Path relative to the workspace root (a leading / is the root).",
    true,
);

pub static TOOLS: [ToolDef; 20] = [
    ToolDef {
        name: "ls",
        description: "List a directory of the workspace: each entry's path, kind (file, dir, \
                      symlink, other), size, mtime and mode, in name order.",
        changes: false,
        destroys: false,
        args: &[(
            "path",
            "string",
            "Directory to list (default: the root).",
            false,
        )],
    },
    ToolDef {
        name: "read",
        description: "Read a text file as numbered lines (`     1<TAB>line`). offset skips that \
                      many lines, limit caps the lines returned (default 2000); the result says \
                      when more lines follow. Binary files are reported, not shown: read them \
                      with encoding base64, where offset and limit count bytes and the result's \
                      data is the bytes in base64 (eof true when nothing follows).",
        changes: false,
        destroys: false,
        args: &[
            PATH,
            (
                "offset",
                "integer",
                "Lines to skip from the start (default 0); bytes with encoding base64.",
                false,
            ),
            (
                "limit",
                "integer",
                "Most lines to return (default 2000); bytes with encoding base64 (default \
                 1048576).",
                false,
            ),
            (
                "encoding",
                "string",
                "text (default: numbered lines) or base64 (raw bytes, for binary files).",
                false,
            ),
        ],
    },
    ToolDef {
        name: "write",
        description: "Create a file with the given content. An existing file is an error naming \
                      it unless overwrite is true, which replaces it atomically. Prefer edit to \
                      change part of a file.",
        changes: true,
        destroys: true,
        args: &[
            PATH,
            ("content", "string", "The whole content of the file.", true),
            (
                "overwrite",
                "boolean",
                "Replace an existing file (default false).",
                false,
            ),
        ],
    },
    ToolDef {
        name: "edit",
        description: "Replace old_string by new_string in a file. old_string must occur exactly \
                      once (include surrounding lines to make it unique) unless replace_all is \
                      true; the error says how many times it occurs. The change is atomic.",
        changes: true,
        destroys: false,
        args: &[
            PATH,
            ("old_string", "string", "The exact text to replace.", true),
            (
                "new_string",
                "string",
                "The text to put in its place.",
                true,
            ),
            (
                "replace_all",
                "boolean",
                "Replace every occurrence (default false).",
                false,
            ),
        ],
    },
    ToolDef {
        name: "grep",
        description: "Search the text files under path for pattern: a literal string unless \
                      regex is true. output_mode content (default) gives path, line number and \
                      line of each match; files gives the matching files; count the matches per \
                      file. glob filters files by name (or by path when it has a /).",
        changes: false,
        destroys: false,
        args: &[
            (
                "pattern",
                "string",
                "Text (or regular expression with regex) to find.",
                true,
            ),
            (
                "path",
                "string",
                "File or directory to search (default: the root).",
                false,
            ),
            (
                "glob",
                "string",
                "Only files matching this glob, e.g. *.rs or src/**/*.py.",
                false,
            ),
            (
                "regex",
                "boolean",
                "pattern is a regular expression (default false).",
                false,
            ),
            (
                "ignore_case",
                "boolean",
                "Match without regard to case (default false).",
                false,
            ),
            (
                "output_mode",
                "string",
                "content, files or count (default content).",
                false,
            ),
            (
                "scratch",
                "boolean",
                "Search the workspace's scratch paths too.",
                false,
            ),
        ],
    },
    ToolDef {
        name: "glob",
        description: "Find entries under path whose path relative to it matches pattern (* \
                      stays within one name, ** crosses directories: **/*.rs).",
        changes: false,
        destroys: false,
        args: &[
            ("pattern", "string", "The glob, e.g. **/*.md.", true),
            (
                "path",
                "string",
                "Directory to search (default: the root).",
                false,
            ),
        ],
    },
    ToolDef {
        name: "delete",
        description: "Delete a file, or a directory (with everything in it when recursive is \
                      true; an empty one otherwise).",
        changes: true,
        destroys: true,
        args: &[
            PATH,
            (
                "recursive",
                "boolean",
                "Delete a directory and its contents.",
                false,
            ),
        ],
    },
    ToolDef {
        name: "rename",
        description: "Rename or move path to new_path. An existing new_path is an error unless \
                      overwrite is true.",
        changes: true,
        destroys: true,
        args: &[
            PATH,
            (
                "new_path",
                "string",
                "The new path, relative to the workspace root.",
                true,
            ),
            (
                "overwrite",
                "boolean",
                "Replace an existing new_path (default false).",
                false,
            ),
        ],
    },
    ToolDef {
        name: "mkdir",
        description: "Create a directory (with parents true, the missing ones above it too).",
        changes: true,
        destroys: false,
        args: &[
            PATH,
            (
                "parents",
                "boolean",
                "Create missing parent directories; an existing directory \
                                    is then no error.",
                false,
            ),
        ],
    },
    ToolDef {
        name: "stat",
        description: "Describe one entry: kind, size, mtime, mode (a symlink is described, not \
                      followed). A missing path is an error saying so.",
        changes: false,
        destroys: false,
        args: &[PATH],
    },
    ToolDef {
        name: "execute",
        description: "Run a shell command (/bin/sh -c) in the workspace, in a sandbox where the \
                      workspace (at /workspace, the working directory) is the only writable \
                      place and its policy applies. Returns the output (stdout and stderr \
                      together, cut after max_output bytes with truncated true) and the exit \
                      code; after timeout seconds the command and everything it started are \
                      killed (exit code 124, timed_out true). Its changes are seen by the other \
                      tools at once.",
        changes: true,
        destroys: true,
        args: &[
            ("command", "string", "The shell command line to run.", true),
            (
                "timeout",
                "number",
                "Seconds before the command is killed (default 120).",
                false,
            ),
            (
                "max_output",
                "integer",
                "Bytes of output to return (default 65536); the rest is dropped.",
                false,
            ),
            (
                "cwd",
                "string",
                "Working directory relative to the workspace root (default: the root).",
                false,
            ),
        ],
    },
    ToolDef {
        name: "diff",
        description: "What the workspace changed against the shared files it started from: one \
                      entry per changed path with kind A (added), M (modified), D (deleted), R \
                      (renamed, with from), T (metadata only), its type, and conflict true when \
                      the shared original changed after this workspace copied it. With patch \
                      true, each entry's unified diff. Use it to review work before finishing.",
        changes: false,
        destroys: false,
        args: &[
            (
                "paths",
                "array",
                "Only these paths and what lies beneath them (default: everything).",
                false,
            ),
            (
                "patch",
                "boolean",
                "Include each entry's unified diff (default false).",
                false,
            ),
            (
                "base",
                "string",
                "What to compare with: checkpoint (default), the layers this workspace \
                 stands on, so a fork shows what it changed since its checkpoint; shared, \
                 the shared files only, so a fork's checkpoint's changes show too.",
                false,
            ),
        ],
    },
    ToolDef {
        name: "log",
        description: "The workspace's change journal, oldest first: each row's time, op \
                      (create, write, rename, unlink, mkdir, reset, checkpoint, …), path, \
                      result, the caller (comm: CLIENT:TOOL for these tools) and, for a policy \
                      denial, the rule. Filter by since, path glob and op (deny: the denials); \
                      limit keeps the last N.",
        changes: false,
        destroys: false,
        args: &[
            (
                "since",
                "string",
                "Only rows from this time on: RFC 3339 (2026-12-03T15:00:00Z) or an age (10m, \
                 2h).",
                false,
            ),
            ("limit", "integer", "Only the last N matching rows.", false),
            (
                "path",
                "string",
                "Only rows whose path matches this glob (** crosses directories).",
                false,
            ),
            (
                "op",
                "string",
                "Only rows of this operation (deny: policy denials).",
                false,
            ),
        ],
    },
    ToolDef {
        name: "reset",
        description: "Discard the workspace's changes to paths (or everything, with all true): \
                      each goes back to the shared version; a file only the workspace has is \
                      removed. Returns the paths whose view changed. Paths the policy hides, \
                      makes read-only or protects are refused with the rule.",
        changes: true,
        destroys: true,
        args: &[
            (
                "paths",
                "array",
                "Paths to reset, relative to the workspace root.",
                false,
            ),
            ("all", "boolean", "Reset everything (default false).", false),
        ],
    },
    ToolDef {
        name: "snapshot_save",
        description: "Save the workspace's current changes as a snapshot, to come back to with \
                      snapshot_restore. Returns its id, size, time and entries.",
        changes: true,
        destroys: false,
        args: &[
            (
                "id",
                "string",
                "Snapshot id: 1-128 of A-Z a-z 0-9 . _ -, not starting with . (default: the \
                 UTC time).",
                false,
            ),
            (
                "force",
                "boolean",
                "Replace an existing snapshot of this id (default false).",
                false,
            ),
        ],
    },
    ToolDef {
        name: "snapshot_restore",
        description: "Replace the workspace's changes by those saved in snapshot id: everything \
                      changed since is lost. Returns the snapshot and what of it the policy kept \
                      out (left_out).",
        changes: true,
        destroys: true,
        args: &[(
            "id",
            "string",
            "The snapshot to restore (see snapshot_list).",
            true,
        )],
    },
    ToolDef {
        name: "snapshot_list",
        description: "List the workspace's snapshots: id, size, time, entries.",
        changes: false,
        destroys: false,
        args: &[],
    },
    ToolDef {
        name: "checkpoint",
        description: "Freeze the workspace's changes into a named checkpoint (instant: nothing \
                      is copied) and go on from it; undo comes back to it. Returns its name.",
        changes: true,
        destroys: false,
        args: &[(
            "name",
            "string",
            "Checkpoint name: 1-128 of A-Z a-z 0-9 . _ -, not starting with . (default: the \
             UTC time).",
            false,
        )],
    },
    ToolDef {
        name: "checkpoint_list",
        description: "List the checkpoints the workspace stands on, the latest first: name, \
                      created.",
        changes: false,
        destroys: false,
        args: &[],
    },
    ToolDef {
        name: "undo",
        description: "Go back to the latest checkpoint, dropping every change made since (when \
                      nothing changed since it, to the one before); with to, back to that \
                      checkpoint. Returns the checkpoint now stood on (at) and how many were \
                      taken off (dropped).",
        changes: true,
        destroys: true,
        args: &[(
            "to",
            "string",
            "The checkpoint to go back to (default: the latest).",
            false,
        )],
    },
];
