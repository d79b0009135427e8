//! The workspace's state operations as tools: `diff`, `log`, `reset`,
//! snapshots, checkpoints and `undo`, each a typed request and result.
//!
//! One home per rule: each calls the sequence the command line runs
//! (`state::ops`), so a live mount's daemon does the changing ones
//! through its control socket, as `layerfs reset`/`snapshot`/`checkpoint`/
//! `undo` would; an unmounted workspace's in-process core is lent for the
//! operation's duration (as for `execute`: stopped, its locks released,
//! started again on the changed upper and stack).

use std::ffi::{OsStr, OsString};

use serde::{Deserialize, Serialize};

use super::error::{Result, ToolError, What};
use super::path::RelPath;
use super::Workspace;
use crate::state::diff::Kind;
use crate::state::journal::query;
use crate::state::{ops, patch, snapshot, snapshot_id};

/// `diff`: what the workspace changed against its lowers (`base`), under
/// `paths` (none: everything).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct DiffRequest {
    #[serde(default)]
    pub paths: Vec<String>,
    /// Give each entry's unified diff (text files; a binary one is named
    /// as such).
    #[serde(default)]
    pub patch: bool,
    /// What the view is compared with, as `layerfs diff --base`:
    /// `Checkpoint` (the default), the workspace's lowers, so a fork or a
    /// workspace with checkpoints shows what changed since its latest
    /// checkpoint; `Shared`, the shared lowers only, so its checkpoint
    /// layers' changes show too (renames then come from the journal only,
    /// and no conflict is marked).
    #[serde(default)]
    pub base: DiffBase,
}

pub use crate::state::ops::DiffBase;

/// The kind of a change: added, modified, deleted, renamed, or metadata
/// only (as `layerfs diff` prints them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ChangeKind {
    A,
    M,
    D,
    R,
    T,
}

/// One changed path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiffEntry {
    pub path: String,
    pub kind: ChangeKind,
    /// The old path of a rename.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// `file`, `dir`, `symlink`, …
    #[serde(rename = "type")]
    pub file_type: String,
    /// A copied-up file whose shared original changed after the copy-up.
    pub conflict: bool,
    /// The unified diff, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiffResult {
    pub changes: Vec<DiffEntry>,
}

/// `log`: the change journal's rows, oldest first; every filter optional.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct LogRequest {
    /// RFC 3339 time (2026-12-03T15:00:00Z) or an age (10m, 2h).
    #[serde(default)]
    pub since: Option<String>,
    /// Only the last N matching rows.
    #[serde(default)]
    pub limit: Option<usize>,
    /// Only rows whose path (or rename target) matches this glob.
    #[serde(default)]
    pub path: Option<String>,
    /// Only rows of this operation (`write`, `rename`, …; `deny`: policy
    /// denials).
    #[serde(default)]
    pub op: Option<String>,
}

/// One journal row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogEntry {
    /// RFC 3339, UTC.
    pub time: String,
    pub op: String,
    pub path: String,
    pub to: Option<String>,
    /// `ok` or the errno's name.
    pub result: String,
    pub bytes: Option<i64>,
    pub uid: Option<u32>,
    pub pid: Option<i64>,
    /// The caller's command name (`CLIENT:TOOL` for the tools).
    pub comm: Option<String>,
    /// The policy rule of a denial.
    pub rule: Option<String>,
    /// The row as `layerfs log` prints it.
    pub text: String,
}

/// `reset`: `paths` go back to the shared version (`all`: everything).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResetRequest {
    #[serde(default)]
    pub paths: Vec<String>,
    #[serde(default)]
    pub all: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResetResult {
    /// The paths whose view changed (`.`: the root).
    pub reset: Vec<String>,
}

/// A snapshot: a saved state of the workspace's changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnapshotInfo {
    pub id: String,
    /// Archive bytes.
    pub size: u64,
    /// RFC 3339, UTC.
    pub time: String,
    /// Entries archived, where counted.
    pub entries: Option<u64>,
}

impl SnapshotInfo {
    fn of(i: &snapshot::Info) -> SnapshotInfo {
        SnapshotInfo {
            id: i.id.clone(),
            size: i.size,
            time: snapshot_id::rfc3339(i.time),
            entries: i.entries,
        }
    }
}

/// What a restore put back, and what of the snapshot the workspace's
/// policy kept out (device nodes, setuid bits, … one line each).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RestoreResult {
    pub snapshot: SnapshotInfo,
    pub left_out: Vec<String>,
}

/// A checkpoint the workspace stands on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckpointInfo {
    pub name: String,
    /// RFC 3339, UTC.
    pub created: String,
}

/// Where `undo` left the workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UndoResult {
    /// The checkpoint it now stands on.
    pub at: String,
    /// Checkpoints taken off.
    pub dropped: usize,
}

/// A state operation's failure, reported on `what` (the tool, or the
/// snapshot or checkpoint named).
fn failed<E: ToString>(what: &str) -> impl Fn(E) -> ToolError + '_ {
    move |m| ToolError::new(what, What::State(m.to_string()))
}

impl Workspace {
    /// The workspace's description, read again for each operation (a
    /// checkpoint, undo or restore changes what it holds).
    fn described(&self, tool: &str) -> Result<crate::state::workspace::Workspace> {
        let (upper, state) = self.state_at.as_ref().ok_or_else(|| {
            ToolError::new(tool, What::State("the workspace has no state dir".into()))
        })?;
        crate::state::workspace::Workspace::resolve_in(upper, state)
            .map_err(|e| failed(tool)(e.to_string()))
    }

    /// Who the journal's rows of a state operation name.
    fn caller(&self, tool: &str) -> String {
        format!("{}:{tool}", self.client)
    }

    /// Logs what an operation warns of once it is done.
    fn warn(tool: &str, warnings: &[String]) {
        for w in warnings {
            tracing::warn!("{tool}: {w}");
        }
    }

    /// What the workspace changed against its lowers (or, with `base`
    /// `Shared`, against its shared lowers): one entry per changed path
    /// (kind A/M/D/R/T, the conflict flag), scratch paths left out; with
    /// `patch`, each entry's unified diff.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// use layerfs::tools::{ChangeKind, DiffRequest, EditRequest, Layers, OpenOptions};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// ws.edit(&EditRequest { path: "notes.txt".into(), old_string: "beta".into(),
    ///     new_string: "gamma".into(), replace_all: false })?;
    /// let d = ws.diff(&DiffRequest { patch: true, ..Default::default() })?;
    /// assert_eq!((d.changes[0].path.as_str(), d.changes[0].kind), ("notes.txt", ChangeKind::M));
    /// assert!(d.changes[0].patch.as_deref().unwrap().contains("+gamma"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn diff(&self, req: &DiffRequest) -> Result<DiffResult> {
        let ws = self.described("diff")?;
        let paths = req
            .paths
            .iter()
            .map(|p| RelPath::parse(p).map(|r| OsString::from(r.as_str())))
            .collect::<Result<Vec<_>>>()?;
        let diffed = ops::changes_against(&ws, &paths, false, req.base).map_err(failed("diff"))?;
        let (layers, changes) = (&diffed.layers, &diffed.changes);
        let patches = if req.patch {
            patch::patches(layers, changes)
        } else {
            Vec::new()
        };
        let changes = changes
            .iter()
            .enumerate()
            .map(|(i, c)| DiffEntry {
                path: c.path_str(),
                kind: match c.kind {
                    Kind::Added => ChangeKind::A,
                    Kind::Modified => ChangeKind::M,
                    Kind::Deleted => ChangeKind::D,
                    Kind::Renamed => ChangeKind::R,
                    Kind::Metadata => ChangeKind::T,
                },
                from: c.from_str(),
                file_type: c.ftype.to_string(),
                conflict: c.conflict,
                patch: patches.get(i).cloned(),
            })
            .collect();
        Ok(DiffResult { changes })
    }

    /// The change journal's rows, oldest first, filtered by time, path
    /// glob and operation, the last `limit` of them.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// use layerfs::tools::{Layers, LogRequest, OpenOptions, WriteRequest};
    /// let opts = OpenOptions { client: Some("doc".into()), ..Default::default() };
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper.clone()), &opts)?;
    /// ws.write(&WriteRequest { path: "a.txt".into(), content: "a\n".into(), overwrite: false })?;
    /// drop(ws); // the journal's writer thread flushes its rows
    /// let ws = layerfs::Workspace::open(&upper, &OpenOptions::default())?;
    /// let rows = ws.log(&LogRequest { op: Some("create".into()), ..Default::default() })?;
    /// assert_eq!((rows[0].path.as_str(), rows[0].comm.as_deref()), ("a.txt", Some("doc:write")));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn log(&self, req: &LogRequest) -> Result<Vec<LogEntry>> {
        let ws = self.described("log")?;
        let q = query::Query {
            since: req
                .since
                .as_deref()
                .map(query::parse_since)
                .transpose()
                .map_err(failed("log"))?,
            op: req
                .op
                .as_deref()
                .map(query::op_known)
                .transpose()
                .map_err(failed("log"))?,
            uid: None,
            path: req.path.clone(),
            limit: req.limit,
        };
        let rows = query::query(&ws.journal_path(), &q).map_err(failed("log"))?;
        Ok(rows
            .into_iter()
            .map(|r| LogEntry {
                time: query::rfc3339(r.time),
                text: r.text(),
                op: r.op,
                path: r.path,
                to: r.to,
                result: r.result,
                bytes: r.bytes,
                uid: r.uid,
                pid: r.pid,
                comm: r.comm,
                rule: r.rule,
            })
            .collect())
    }

    /// Puts `paths` (or everything, with `all`) back to the shared
    /// version; returns the paths whose view changed. A path the policy
    /// hides, makes read-only or protects is refused with its rule.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// use layerfs::tools::{Layers, OpenOptions, ReadRequest, ResetRequest, WriteRequest};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// ws.write(&WriteRequest { path: "notes.txt".into(), content: "gone\n".into(), overwrite: true })?;
    /// let r = ws.reset(&ResetRequest { paths: vec!["notes.txt".into()], all: false })?;
    /// assert_eq!(r.reset, ["notes.txt"]);
    /// assert_eq!(ws.read(&ReadRequest::new("notes.txt"))?.content, "     1\talpha\n     2\tbeta\n     3\talpha again");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset(&self, req: &ResetRequest) -> Result<ResetResult> {
        self.writable("reset")?;
        let mut paths = Vec::new();
        for raw in &req.paths {
            let p = RelPath::parse(raw)?;
            let c = self.policy.classify(p.as_str());
            if let Some(rule) = c.hidden.or(c.readonly).or(c.protected) {
                return Err(ToolError::new(
                    &p,
                    What::Denied {
                        rule: Some(rule.to_string()),
                        errno: libc::EACCES,
                    },
                ));
            }
            paths.push(OsString::from(p.as_str()));
        }
        if req.all {
            paths = vec![OsString::new()];
        } else if paths.is_empty() {
            return Err(ToolError::new(
                "reset",
                What::State("no paths given (pass all to reset everything)".into()),
            ));
        }
        let ws = self.described("reset")?;
        let who = self.caller("reset");
        let done = self
            .lent(|| ops::reset(&ws, &paths, Some(&who)))
            .map_err(failed("reset"))?;
        Workspace::warn("reset", &done.warnings);
        Ok(ResetResult {
            reset: done.value.iter().map(|p| ops::shown(p)).collect(),
        })
    }

    /// Saves the workspace's changes as snapshot `id` (generated from the
    /// time when `None`); an existing one is replaced only with `force`.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// use layerfs::tools::{Layers, OpenOptions, WriteRequest};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// ws.write(&WriteRequest { path: "a.txt".into(), content: "one\n".into(), overwrite: false })?;
    /// let saved = ws.snapshot_save(Some("first"), false)?;
    /// ws.write(&WriteRequest { path: "a.txt".into(), content: "two\n".into(), overwrite: true })?;
    /// ws.snapshot_restore("first")?;
    /// assert_eq!(ws.read_raw("a.txt", 0, None)?, b"one\n");
    /// assert_eq!(ws.snapshot_list()?, [saved]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot_save(&self, id: Option<&str>, force: bool) -> Result<SnapshotInfo> {
        self.writable("snapshot_save")?;
        let ws = self.described("snapshot_save")?;
        let who = self.caller("snapshot_save");
        let done = self
            .lent(|| ops::snapshot_save(&ws, id.map(OsStr::new), force, false, Some(&who)))
            .map_err(failed(id.unwrap_or("snapshot_save")))?;
        Workspace::warn("snapshot_save", &done.warnings);
        // As `snapshot_list` gives it: the time is the archive's.
        let saved = done.value;
        let info = match snapshot::info_of(&ws.dir, &saved.id) {
            Ok(i) => snapshot::Info {
                entries: saved.entries,
                ..i
            },
            Err(_) => saved,
        };
        Ok(SnapshotInfo::of(&info))
    }

    /// Replaces the workspace's changes by snapshot `id`'s, checked
    /// against the policy (what it keeps out is listed); an unknown ID
    /// is an error saying so.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// use layerfs::tools::{Layers, OpenOptions, WriteRequest};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// ws.snapshot_save(Some("empty"), false)?;
    /// ws.write(&WriteRequest { path: "a.txt".into(), content: "a\n".into(), overwrite: false })?;
    /// assert!(ws.snapshot_restore("nope").is_err());
    /// assert_eq!(ws.snapshot_restore("empty")?.snapshot.id, "empty");
    /// assert!(!ws.exists("a.txt")?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot_restore(&self, id: &str) -> Result<RestoreResult> {
        self.writable("snapshot_restore")?;
        let ws = self.described("snapshot_restore")?;
        let who = self.caller("snapshot_restore");
        let done = self
            .lent(|| ops::snapshot_restore(&ws, OsStr::new(id), false, Some(&who)))
            .map_err(failed(id))?;
        Workspace::warn("snapshot_restore", &done.warnings);
        let (info, report) = done.value;
        Ok(RestoreResult {
            snapshot: SnapshotInfo::of(&info),
            left_out: report.lines(usize::MAX),
        })
    }

    /// The snapshots of the workspace.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// use layerfs::tools::{Layers, OpenOptions, WriteRequest};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// assert!(ws.snapshot_list()?.is_empty());
    /// ws.snapshot_save(Some("one"), false)?;
    /// assert_eq!(ws.snapshot_list()?[0].id, "one");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot_list(&self) -> Result<Vec<SnapshotInfo>> {
        let ws = self.described("snapshot_list")?;
        let all = snapshot::list(&ws.dir, true)
            .map_err(|e| e.to_string())
            .map_err(failed("snapshot_list"))?;
        Ok(all.iter().map(SnapshotInfo::of).collect())
    }

    /// Freezes the workspace's changes into checkpoint `name` (generated
    /// from the time when `None`) and goes on from an empty upper above
    /// it; returns its name. `undo` goes back to it.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// use layerfs::tools::{Layers, OpenOptions, WriteRequest};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// ws.write(&WriteRequest { path: "kept.txt".into(), content: "k\n".into(), overwrite: false })?;
    /// assert_eq!(ws.checkpoint(Some("base"))?, "base");
    /// ws.write(&WriteRequest { path: "later.txt".into(), content: "l\n".into(), overwrite: false })?;
    /// let u = ws.undo(None)?;
    /// assert_eq!((u.at.as_str(), u.dropped), ("base", 0));
    /// assert!(ws.exists("kept.txt")? && !ws.exists("later.txt")?);
    /// assert_eq!(ws.checkpoint_list()?[0].name, "base");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn checkpoint(&self, name: Option<&str>) -> Result<String> {
        self.writable("checkpoint")?;
        let ws = self.described("checkpoint")?;
        let who = self.caller("checkpoint");
        let done = self
            .lent(|| {
                ops::checkpoint(
                    &ws,
                    name,
                    None,
                    Some(&who),
                    crate::state::checkpoint::Durability::Now,
                )
            })
            .map_err(failed(name.unwrap_or("checkpoint")))?;
        Workspace::warn("checkpoint", &done.warnings);
        Ok(done.value)
    }

    /// The checkpoints the workspace stands on, the latest first.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// use layerfs::tools::{Layers, OpenOptions, WriteRequest};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// ws.checkpoint(Some("first"))?;
    /// ws.checkpoint(Some("second"))?;
    /// let names: Vec<_> = ws.checkpoint_list()?.into_iter().map(|c| c.name).collect();
    /// assert_eq!(names, ["second", "first"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn checkpoint_list(&self) -> Result<Vec<CheckpointInfo>> {
        let ws = self.described("checkpoint_list")?;
        let all = ops::checkpoints(&ws).map_err(failed("checkpoint_list"))?;
        Ok(all
            .into_iter()
            .map(|c| CheckpointInfo {
                name: c.name,
                created: snapshot_id::rfc3339(c.created),
            })
            .collect())
    }

    /// Goes back to checkpoint `to`, or the latest (when nothing changed
    /// since it, the one before): the changes since are dropped.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// use layerfs::tools::{Layers, OpenOptions, WriteRequest};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// ws.checkpoint(Some("base"))?;
    /// ws.write(&WriteRequest { path: "a.txt".into(), content: "a\n".into(), overwrite: false })?;
    /// assert_eq!(ws.undo(None)?.at, "base");
    /// assert!(!ws.exists("a.txt")?);
    /// assert!(ws.undo(Some("unknown")).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn undo(&self, to: Option<&str>) -> Result<UndoResult> {
        self.writable("undo")?;
        let ws = self.described("undo")?;
        let who = self.caller("undo");
        let done = self
            .lent(|| ops::undo(&ws, to, Some(&who)))
            .map_err(failed(to.unwrap_or("undo")))?;
        Workspace::warn("undo", &done.warnings);
        let (at, dropped) = done.value;
        Ok(UndoResult { at, dropped })
    }
}
