//! What `diff` prints for people: a new directory as one line with the
//! number of entries it holds, and `--stat`, the counts and bytes of the
//! changes per top-level entry with their totals. `--json` and `--files`
//! keep every entry (`state::diff` computes them; this module only folds
//! them).
//!
//! The folding rules, the one home for both views:
//! - an added directory (`A`) is *collapsed*: its line stands for every
//!   added entry beneath it, which are counted, not printed; a change of
//!   another kind beneath it (a shared file renamed into it, `R`) keeps its
//!   own line, since it also says where something went;
//! - a directory the user named as a PATH is not collapsed (its entries are
//!   what was asked for; added directories inside it still are);
//! - `--files` lists every entry: those of an added directory, and every
//!   shared entry beneath a deleted directory (`D dir/x`) or a renamed one
//!   (`R old/x -> new/x`) that no other change speaks for
//!   (`with_entries_beneath`);
//! - `--stat` counts what `--files` lists; bytes are the sizes of regular
//!   files: `+` the new versions of added and modified files, `-` the
//!   shared versions of modified and deleted ones; a rename moves its
//!   bytes, it adds or removes none.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use crate::layer::stack::{stat_in, Layers};
use crate::quote::quote_os;
use crate::state::diff::{shared_entries, Change, Claimed, Kind};
use crate::state::scratch::Scratch;

/// One line of the folded view.
pub enum Line<'a> {
    /// A change printed as `diff --files` prints it.
    One(&'a Change),
    /// An added directory and the number of added entries beneath it.
    Tree(&'a Change, usize),
}

impl Line<'_> {
    /// `A path/ (N entries)` for a collapsed directory, else the change's
    /// own line.
    pub fn text(&self) -> String {
        match self {
            Line::One(c) => c.text_line(),
            Line::Tree(c, 0) => format!("A {}/ (empty)", quote_os(&c.path)),
            Line::Tree(c, 1) => format!("A {}/ (1 entry)", quote_os(&c.path)),
            Line::Tree(c, n) => format!("A {}/ ({n} entries)", quote_os(&c.path)),
        }
    }
}

/// The ancestors of a relative path, nearest first (`a/b/c` → `a/b`, `a`).
fn ancestors(p: &OsStr) -> impl Iterator<Item = &OsStr> {
    let b = p.as_bytes();
    (0..b.len())
        .rev()
        .filter(move |&i| b[i] == b'/')
        .map(move |i| OsStr::from_bytes(&b[..i]))
}

/// Folds `changes` (sorted by path, as `diff::diff` returns them): each
/// added directory not named in `named` becomes one `Tree` line for
/// itself and the added entries beneath it.
pub fn fold<'a>(changes: &'a [Change], named: &[OsString]) -> Vec<Line<'a>> {
    // The outermost collapsed directory holding each path.
    let mut trees: HashMap<&OsStr, usize> = HashMap::new();
    let mut under = vec![None; changes.len()];
    for (i, c) in changes.iter().enumerate() {
        // Parents sort before their children (a prefix sorts first), so a
        // directory's tree is known before its entries are seen.
        let outer = ancestors(&c.path)
            .filter_map(|a| trees.get(a).copied())
            .last();
        if c.kind == Kind::Added {
            under[i] = outer;
        }
        if outer.is_none()
            && c.kind == Kind::Added
            && c.ftype == "dir"
            && !named.iter().any(|n| n == &c.path)
        {
            trees.insert(c.path.as_os_str(), i);
        }
    }
    let mut counts = vec![0usize; changes.len()];
    for t in under.iter().flatten() {
        counts[*t] += 1;
    }
    changes
        .iter()
        .enumerate()
        .filter(|(i, _)| under[*i].is_none())
        .map(|(i, c)| {
            if trees.get(c.path.as_os_str()) == Some(&i) {
                Line::Tree(c, counts[i])
            } else {
                Line::One(c)
            }
        })
        .collect()
}

/// Counts of one group of `--stat` (a top-level entry, or the total).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub added: u64,
    pub modified: u64,
    pub deleted: u64,
    pub renamed: u64,
    pub metadata: u64,
    /// Bytes of the new versions of added and modified regular files.
    pub bytes_added: u64,
    /// Bytes of the shared versions of modified and deleted regular files.
    pub bytes_removed: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.added += o.added;
        self.modified += o.modified;
        self.deleted += o.deleted;
        self.renamed += o.renamed;
        self.metadata += o.metadata;
        self.bytes_added += o.bytes_added;
        self.bytes_removed += o.bytes_removed;
    }

    /// One `--stat --json` line: `path` names the group; the totals' line
    /// has `"total": true` and no path.
    pub fn json(&self, name: Option<&str>) -> serde_json::Value {
        let mut v = serde_json::json!({
            "added": self.added,
            "modified": self.modified,
            "deleted": self.deleted,
            "renamed": self.renamed,
            "metadata": self.metadata,
            "bytes_added": self.bytes_added,
            "bytes_removed": self.bytes_removed,
        });
        match name {
            Some(n) => v["path"] = n.into(),
            None => v["total"] = true.into(),
        }
        v
    }
}

/// `--stat`: the counts per top-level entry (`dir/` for a directory,
/// sorted) and their total.
pub struct Stat {
    pub groups: BTreeMap<String, Counts>,
    pub total: Counts,
}

/// The size of a regular file at `rel` in a layer, 0 for anything else
/// or anything gone since the diff.
fn file_size(root: &std::os::fd::OwnedFd, rel: &OsStr) -> u64 {
    match stat_in(root, rel) {
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG => st.st_size as u64,
        _ => 0,
    }
}

/// `changes` (sorted by path) with every shared entry beneath each deleted
/// directory (`D dir/x`) and each renamed one (`R old/x -> new/x`) as a
/// change of its own, sorted again: what `diff --files` lists. An entry
/// another change speaks for (moved out, edited, deleted by itself,
/// `Claimed`), one whose path already has a change, and scratch paths are
/// left to those.
pub fn with_entries_beneath(
    layers: &Layers,
    changes: Vec<Change>,
    scratch: &Scratch,
) -> Vec<Change> {
    let claimed = Claimed::of(&changes);
    let have: HashSet<OsString> = changes.iter().map(|c| c.path.clone()).collect();
    let mut extra = Vec::new();
    for c in &changes {
        let root = match (c.kind, &c.from, c.old()) {
            (_, _, _) if c.ftype != "dir" => continue,
            (Kind::Deleted, _, Some((_, old))) => old,
            (Kind::Renamed, Some(from), _) => from.as_os_str(),
            _ => continue,
        };
        for e in shared_entries(layers, root, |p| claimed.contains(p)) {
            let Some(child) = c.beneath(&e.sub, e.layer, e.ftype) else {
                continue;
            };
            if !have.contains(&child.path) && !scratch.matches_os(&child.path) {
                extra.push(child);
            }
        }
    }
    if extra.is_empty() {
        return changes;
    }
    let mut all = changes;
    all.extend(extra);
    all.sort_by(|a, b| a.path.cmp(&b.path));
    all
}

/// The group of a path: its first component, with `/` when that is a
/// directory of the workspace (the entry itself a directory, or deeper).
fn group_of(c: &Change) -> String {
    let b = c.path.as_bytes();
    match b.iter().position(|&x| x == b'/') {
        Some(i) => format!("{}/", quote_os(OsStr::from_bytes(&b[..i]))),
        None if c.ftype == "dir" => format!("{}/", quote_os(&c.path)),
        None => quote_os(&c.path).to_string(),
    }
}

/// Counts `changes` (every entry, as `--files` lists them:
/// `with_entries_beneath`) per top-level entry; sizes are read from the
/// layers.
pub fn stat(layers: &Layers, changes: &[Change]) -> Stat {
    let mut groups: BTreeMap<String, Counts> = BTreeMap::new();
    for c in changes {
        let mut n = Counts::default();
        let new_size = || {
            if c.is_new() && c.ftype == "file" {
                file_size(&layers.upper, &c.path)
            } else {
                0
            }
        };
        let old_size = || match c.old() {
            Some((l, p)) => file_size(&layers.lowers[l], p),
            None => 0,
        };
        match c.kind {
            Kind::Added => {
                n.added = 1;
                n.bytes_added = new_size();
            }
            Kind::Modified => {
                n.modified = 1;
                n.bytes_added = new_size();
                n.bytes_removed = old_size();
            }
            Kind::Deleted => {
                n.deleted = 1;
                n.bytes_removed = old_size();
            }
            Kind::Renamed => n.renamed = 1,
            Kind::Metadata => n.metadata = 1,
        }
        groups.entry(group_of(c)).or_default().add(&n);
    }
    let mut total = Counts::default();
    for g in groups.values() {
        total.add(g);
    }
    Stat { groups, total }
}

impl Stat {
    /// The table: one row per group, then `total`.
    pub fn text(&self) -> String {
        let width = self
            .groups
            .keys()
            .map(|k| k.chars().count())
            .max()
            .unwrap_or(0)
            .max(5);
        let mut s = format!(
            "{:<width$}  {:>7} {:>8} {:>7} {:>7} {:>8} {:>11} {:>11}\n",
            "path", "added", "modified", "deleted", "renamed", "metadata", "+bytes", "-bytes"
        );
        let row = |name: &str, c: &Counts| {
            format!(
                "{name:<width$}  {:>7} {:>8} {:>7} {:>7} {:>8} {:>11} {:>11}\n",
                c.added,
                c.modified,
                c.deleted,
                c.renamed,
                c.metadata,
                crate::quote::bytes(c.bytes_added),
                crate::quote::bytes(c.bytes_removed)
            )
        };
        for (k, c) in &self.groups {
            s.push_str(&row(k, c));
        }
        s.push_str(&row("total", &self.total));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestors_nearest_first() {
        let a: Vec<&OsStr> = ancestors(OsStr::new("a/b/c")).collect();
        assert_eq!(a, [OsStr::new("a/b"), OsStr::new("a")]);
        assert_eq!(ancestors(OsStr::new("top")).count(), 0);
    }

    #[test]
    fn human_sizes() {
        assert_eq!(crate::quote::bytes(0), "0 B");
        assert_eq!(crate::quote::bytes(1023), "1023 B");
        assert_eq!(crate::quote::bytes(1536), "1.5 KiB");
        assert_eq!(crate::quote::bytes(3 * 1024 * 1024), "3.0 MiB");
    }
}
