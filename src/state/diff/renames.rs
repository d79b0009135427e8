//! Moves found after the walk: an added file whose origin record, or the
//! journal, names a deleted shared file is its rename.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use crate::layer::stack::rel_of;
use crate::layer::walk::{self};
use crate::overlay::origin::Origin;
use crate::state::moves;

use super::walk::Walk;
use super::Kind;

impl Walk<'_> {
    /// Turns an added file whose origin is a deleted shared file into a
    /// rename of it (one added file per deleted original).
    pub(super) fn match_moves(&mut self) {
        if self.deleted.is_empty() || self.filter.origins.is_none() {
            return;
        }
        // Only now, and only when a shared file was deleted, are the added
        // files' xattrs read, and only those in directories with the
        // moved-in mark: other new files cost no call. Candidates come
        // grouped by directory (walk order).
        let mut gone = Vec::new();
        let mut dir: Option<(OsString, OwnedFd)> = None;
        for idx in std::mem::take(&mut self.added_files) {
            let path = self.out[idx].path.clone();
            let (parent, name) = split_parent(&path);
            if dir.as_ref().is_none_or(|(p, _)| p != parent) {
                let fd = walk::open_rel(&self.layers.upper, parent, libc::O_PATH);
                let Ok(fd) = fd else {
                    continue;
                };
                dir = Some((parent.to_os_string(), fd));
            }
            let Some((_, dfd)) = &dir else {
                continue;
            };
            let Some(o) = Origin::read_at(dfd, name) else {
                continue;
            };
            let Some((at, o)) = self.origin_layer(&o) else {
                continue;
            };
            let Some(d) = self.deleted.remove(&(at.index, rel_of(&o.path))) else {
                continue;
            };
            let conflict = self.resolved_drifted(at, &o);
            let from = self.out[d].path.clone();
            let old = self.out[d].old.clone();
            let c = &mut self.out[idx];
            c.kind = Kind::Renamed;
            c.from = Some(from);
            c.conflict = conflict;
            c.old = old;
            gone.push(d);
        }
        let gone: std::collections::HashSet<usize> = gone.into_iter().collect();
        let mut i = 0;
        self.out.retain(|_| {
            i += 1;
            !gone.contains(&(i - 1))
        });
    }
}

impl Walk<'_> {
    /// Turns an added file the journal saw moved from a deleted shared
    /// file into a rename of it (for files without an origin record, such
    /// as a shared file replaced by an atomic save and then moved).
    pub(super) fn match_journal_moves(&mut self, moves: &moves::Moves) {
        let deleted: HashMap<String, usize> = self
            .out
            .iter()
            .enumerate()
            .filter(|(_, c)| c.kind == Kind::Deleted && c.ftype != "dir")
            .map(|(i, c)| (c.path_str(), i))
            .collect();
        if deleted.is_empty() {
            return;
        }
        let mut gone = std::collections::HashSet::new();
        for idx in 0..self.out.len() {
            let c = &self.out[idx];
            if c.kind != Kind::Added || c.ftype == "dir" {
                continue;
            }
            let Some(d) = moves
                .origin_of(&c.path_str())
                .and_then(|o| deleted.get(o).copied())
            else {
                continue;
            };
            if !gone.insert(d) {
                continue;
            }
            let from = self.out[d].path.clone();
            let old = self.out[d].old.clone();
            let c = &mut self.out[idx];
            c.kind = Kind::Renamed;
            c.from = Some(from);
            c.old = old;
        }
        let mut i = 0;
        self.out.retain(|_| {
            i += 1;
            !gone.contains(&(i - 1))
        });
    }
}

/// (parent, name) of a relative path.
fn split_parent(p: &OsStr) -> (&OsStr, &OsStr) {
    let b = p.as_bytes();
    match b.iter().rposition(|&c| c == b'/') {
        Some(i) => (OsStr::from_bytes(&b[..i]), OsStr::from_bytes(&b[i + 1..])),
        None => (OsStr::new(""), p),
    }
}
