//! Which journal events a request makes: the paths it names (only looked
//! up while a journal is on) and the rows each kind of change records
//! (`record::Recorder` adds the caller and hands them to the sink).

use std::ffi::OsStr;

use fuser::INodeNo;

use super::shared::Shared;
use crate::overlay::attr::SetAttr;
use crate::overlay::dir::NewKind;
use crate::overlay::events::EvOp;
use crate::overlay::Ctx;

/// One journal row: the operation and, for a truncation, the new size.
pub(super) type Row = (EvOp, Option<u64>);

impl Shared {
    /// The path of object `ino`, when the journal wants it.
    pub(super) fn path(&self, ino: u64) -> Option<String> {
        if !self.rec.on() {
            return None;
        }
        Some(match self.ov().inode(ino) {
            Ok(i) => self.ov().path_of(&i),
            Err(_) => format!("<node {ino}>"),
        })
    }

    /// The path of `name` in directory `parent`, when the journal wants it.
    pub(super) fn child(&self, parent: INodeNo, name: &OsStr) -> Option<String> {
        if !self.rec.on() {
            return None;
        }
        Some(match self.ov().inode(parent.0) {
            Ok(p) => self.ov().child_path(&p, name),
            Err(_) => name.to_string_lossy().into_owned(),
        })
    }

    /// Records the end of a mutating request (see `record::Recorder::done`).
    pub(super) fn done<T>(
        &self,
        c: &Ctx,
        op: EvOp,
        path: Option<String>,
        to: Option<String>,
        r: &crate::overlay::Result<T>,
    ) {
        let errno = r.as_ref().err().map_or(0, |e| e.0);
        self.rec.done(c, &[(op, None)], path, to, errno);
    }

    /// The event of creating `name` in `parent` as `kind`: (op, path, to).
    pub(super) fn creation(
        &self,
        parent: INodeNo,
        name: &OsStr,
        kind: &NewKind<'_>,
    ) -> (EvOp, Option<String>, Option<String>) {
        let new_path = self.child(parent, name);
        match kind {
            NewKind::Dir { .. } => (EvOp::Mkdir, new_path, None),
            NewKind::Node { .. } => (EvOp::Mknod, new_path, None),
            NewKind::File { .. } => (EvOp::Create, new_path, None),
            NewKind::Symlink { target } => (
                EvOp::Symlink,
                new_path,
                Some(target.to_string_lossy().into_owned()),
            ),
            NewKind::Link { source } => (EvOp::Link, self.path(source.id), new_path),
        }
    }
}

/// The rows of a SETATTR: one per kind of attribute it sets.
pub(super) fn setattr_rows(a: &SetAttr) -> Vec<Row> {
    let mut rows = Vec::with_capacity(4);
    if a.mode.is_some() {
        rows.push((EvOp::Chmod, None));
    }
    if a.uid.is_some() || a.gid.is_some() {
        rows.push((EvOp::Chown, None));
    }
    if let Some(size) = a.size {
        rows.push((EvOp::Truncate, Some(size)));
    }
    if a.atime.is_some() || a.mtime.is_some() {
        rows.push((EvOp::Utimes, None));
    }
    rows
}

/// The row of an open for writing, `ok` when it succeeded: the open itself
/// is a change only when it truncates; a refused open for writing is
/// recorded as a refused write.
pub(super) fn open_row(trunc: bool, ok: bool) -> Option<Row> {
    match (ok, trunc) {
        (true, true) => Some((EvOp::Truncate, Some(0))),
        (true, false) => None,
        (false, true) => Some((EvOp::Truncate, None)),
        (false, false) => Some((EvOp::Write, None)),
    }
}
