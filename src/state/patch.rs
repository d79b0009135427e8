//! `diff --patch`: the changes of a workspace as a git-style patch that
//! `git apply` replays on a copy of the lowers.
//!
//! git knows files and symlinks only (by path; directories exist through
//! them) and no renamed directories, so each change is told file by file:
//! - a file change (`A`, `M`, `D`, `R`, `T`) is one file patch from its
//!   shared version (`Change::old`, its path in the lowers, which differs
//!   from the change's path inside a renamed directory: then it is a
//!   rename) to the upper's file;
//! - a renamed directory (`R old -> new`) is a rename of every file of the
//!   shared directory at `old` to the same place under `new`, for the files
//!   no other change speaks for;
//! - a deleted directory (`D dir`), or a directory replaced by a file, is a
//!   deletion of every file of the shared directory no other change speaks
//!   for;
//! - a type change (file to symlink, …) is a deletion and a creation, as
//!   git writes it; metadata git does not keep (owner, times, xattrs, mode
//!   bits other than the owner's execute bit) gives no patch.
//!
//! Invariant: every file of the shared version is spoken for by at most one
//! change: its own file change, else the nearest renamed or deleted
//! directory holding it (`Claimed`), so the patch never renames or deletes
//! one file twice.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use super::diff::{self, Change, Claimed, Kind};
use crate::layer::stack::{self, Layers};
use crate::layer::sys;
use crate::layer::walk::{self, is_dir};
use crate::quote::{quote, quote_os};

/// Above this size a file's patch is not computed (named as too large).
const PATCH_MAX: u64 = 16 << 20;

/// One side of a file patch: where its bytes are, and its name in the tree.
#[derive(Clone, Copy)]
struct Side<'a> {
    root: &'a OwnedFd,
    rel: &'a OsStr,
    name: &'a OsStr,
}

/// The patch of each change, in order ("" for a change git cannot show).
pub fn patches(layers: &Layers, changes: &[Change]) -> Vec<String> {
    let claimed = Claimed::of(changes);
    changes
        .iter()
        .map(|c| change_patch(layers, c, &claimed))
        .collect()
}

fn change_patch(layers: &Layers, c: &Change, claimed: &Claimed) -> String {
    let old = c.old().map(|(layer, rel)| Side {
        root: &layers.lowers[layer],
        rel,
        name: rel,
    });
    let new = c.is_new().then_some(Side {
        root: &layers.upper,
        rel: &c.path,
        name: &c.path,
    });
    let old_is_dir = old.is_some_and(|o| stack::stat_in(o.root, o.rel).is_ok_and(|st| is_dir(&st)));
    let mut out = String::new();
    if c.ftype == "dir" {
        match (c.kind, &c.from, old) {
            (Kind::Renamed, Some(from), _) => tree(layers, from, Some(&c.path), claimed, &mut out),
            (Kind::Deleted, _, Some(o)) => tree(layers, o.rel, None, claimed, &mut out),
            // A file replaced by a directory: the file goes; the
            // directory's own entries are changes of their own.
            (_, _, Some(o)) if !old_is_dir => out.push_str(&file_patch(Some(o), None)),
            _ => {}
        }
        return out;
    }
    let old = match old {
        Some(o) if old_is_dir => {
            tree(layers, o.rel, None, claimed, &mut out);
            None
        }
        o => o,
    };
    out.push_str(&file_patch(old, new));
    out
}

/// Every file of the shared directory at `from` (relative path) that no
/// other change claims: renamed to the same place under `to`, or deleted
/// when `to` is `None`. Walks the merged lowers with a stack of paths (any
/// depth; a directory's lowers are opened only when it is listed).
fn tree(layers: &Layers, from: &OsStr, to: Option<&OsStr>, claimed: &Claimed, out: &mut String) {
    let nlowers = layers.lowers.len();
    let mut stack = vec![OsString::new()];
    while let Some(sub) = stack.pop() {
        let old_dir = join(from, &sub);
        let base = stack::lowers_at_path(layers, &lower_path(&old_dir));
        let Ok(names) = stack::base_names(&base) else {
            continue;
        };
        for n in names.iter().rev() {
            let rel = join(&sub, n);
            let old_rel = join(from, &rel);
            if claimed.contains(&old_rel) {
                continue;
            }
            let Ok(Some(b)) = stack::base_lookup(&base, nlowers, n) else {
                continue;
            };
            if is_dir(&b.st) {
                stack.push(rel);
                continue;
            }
            let old = Side {
                root: &layers.lowers[b.layer],
                rel: &old_rel,
                name: &old_rel,
            };
            let new_name = to.map(|t| join(t, &rel));
            let new = new_name.as_deref().map(|name| Side { name, ..old });
            out.push_str(&file_patch(Some(old), new));
        }
    }
}

fn join(dir: &OsStr, name: &OsStr) -> OsString {
    if dir.is_empty() {
        return name.to_os_string();
    }
    if name.is_empty() {
        return dir.to_os_string();
    }
    stack::join(dir, name)
}

/// A relative path as the absolute lower path `lowers_at_path` takes.
fn lower_path(rel: &OsStr) -> OsString {
    let mut p = OsString::from("/");
    p.push(rel);
    p
}

enum Content {
    Absent,
    Text(String),
    Binary(Vec<u8>),
    TooLarge,
}

impl Content {
    fn of(side: Option<Side>) -> Content {
        let Some(s) = side else {
            return Content::Absent;
        };
        let Ok(pfd) = walk::open_rel(s.root, s.rel, libc::O_PATH) else {
            return Content::Absent;
        };
        let Ok(st) = sys::fstat(&pfd) else {
            return Content::Absent;
        };
        let bytes = match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => match sys::readlink_fd(&pfd) {
                Ok(t) => t.as_bytes().to_vec(),
                Err(_) => return Content::Absent,
            },
            libc::S_IFREG => {
                if st.st_size as u64 > PATCH_MAX {
                    return Content::TooLarge;
                }
                let Ok(fd) = stack::open_read(s.root, s.rel) else {
                    return Content::Absent;
                };
                let mut buf = vec![0u8; st.st_size as usize];
                match diff::read_full(&fd, &mut buf, 0) {
                    Ok(n) => buf.truncate(n),
                    Err(_) => return Content::Absent,
                }
                buf
            }
            _ => return Content::Absent,
        };
        if bytes.contains(&0) {
            return Content::Binary(bytes);
        }
        match String::from_utf8(bytes) {
            Ok(s) => Content::Text(s),
            Err(e) => Content::Binary(e.into_bytes()),
        }
    }

    fn same(&self, other: &Content) -> bool {
        match (self, other) {
            (Content::Text(a), Content::Text(b)) => a == b,
            (Content::Binary(a), Content::Binary(b)) => a == b,
            (Content::Absent, Content::Absent) => true,
            _ => false,
        }
    }
}

/// Whether two files too large for a patch hold the same bytes (a large
/// file moved with its directory is a rename, not a difference).
fn same_large(oc: &Content, nc: &Content, old: Option<Side>, new: Option<Side>) -> bool {
    let (Content::TooLarge, Content::TooLarge, Some(o), Some(n)) = (oc, nc, old, new) else {
        return false;
    };
    let (Ok(a), Ok(b)) = (
        stack::open_read(o.root, o.rel),
        stack::open_read(n.root, n.rel),
    ) else {
        return false;
    };
    let same_size = match (sys::fstat(&a), sys::fstat(&b)) {
        (Ok(x), Ok(y)) => x.st_size == y.st_size,
        _ => false,
    };
    same_size && diff::same_bytes(&a, &b).unwrap_or(false)
}

/// The mode git would record for a side: 100644 or 100755 for regular
/// files, 120000 for symlinks; `None` for anything else.
fn git_mode(side: Option<Side>) -> Option<u32> {
    let s = side?;
    let st = stack::stat_in(s.root, s.rel).ok()?;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG if st.st_mode & 0o100 != 0 => Some(0o100755),
        libc::S_IFREG => Some(0o100644),
        libc::S_IFLNK => Some(0o120000),
        _ => None,
    }
}

/// The patch of one file from `old` to `new` (either may be absent: a
/// creation or a deletion; "" when git would record no difference). A
/// change of type is a deletion and a creation, as git writes it.
fn file_patch(old: Option<Side>, new: Option<Side>) -> String {
    let (old_mode, new_mode) = (git_mode(old), git_mode(new));
    let old = old.filter(|_| old_mode.is_some());
    let new = new.filter(|_| new_mode.is_some());
    if let (Some(a), Some(b)) = (old_mode, new_mode) {
        if a & 0o170000 != b & 0o170000 {
            return file_patch(old, None) + &file_patch(None, new);
        }
    }
    let (Some(a_side), Some(b_side)) = (old.or(new), new.or(old)) else {
        return String::new();
    };
    // Names in git's quoting, which `git apply` reads back to the bytes.
    let prefixed = |prefix: &str, name: &OsStr| {
        let mut b = prefix.as_bytes().to_vec();
        b.extend_from_slice(name.as_bytes());
        quote(&b).into_owned()
    };
    let (a_path, b_path) = (prefixed("a/", a_side.name), prefixed("b/", b_side.name));
    let renamed = old.is_some() && new.is_some() && a_side.name != b_side.name;
    let mut head = format!("diff --git {a_path} {b_path}\n");
    match (old_mode, new_mode) {
        (None, Some(m)) => head.push_str(&format!("new file mode {m:o}\n")),
        (Some(m), None) => head.push_str(&format!("deleted file mode {m:o}\n")),
        (Some(a), Some(b)) if a != b => head.push_str(&format!("old mode {a:o}\nnew mode {b:o}\n")),
        _ => {}
    }
    if renamed {
        head.push_str(&format!(
            "rename from {}\nrename to {}\n",
            quote_os(a_side.name),
            quote_os(b_side.name)
        ));
    }
    let (oc, nc) = (Content::of(old), Content::of(new));
    let both = old.is_some() && new.is_some();
    if both && (oc.same(&nc) || same_large(&oc, &nc, old, new)) {
        return if renamed || old_mode != new_mode {
            head
        } else {
            String::new()
        };
    }
    let a_name = if old.is_some() {
        a_path
    } else {
        "/dev/null".into()
    };
    let b_name = if new.is_some() {
        b_path
    } else {
        "/dev/null".into()
    };
    match (&oc, &nc) {
        (Content::Binary(_), _) | (_, Content::Binary(_)) => {
            head.push_str(&format!("Binary files {a_name} and {b_name} differ\n"));
        }
        (Content::TooLarge, _) | (_, Content::TooLarge) => {
            head.push_str(&format!(
                "Files {a_name} and {b_name} differ (larger than {} MiB, no patch)\n",
                PATCH_MAX >> 20
            ));
        }
        _ => {
            let text = |c: &Content| match c {
                Content::Text(s) => s.clone(),
                _ => String::new(),
            };
            let (o, n) = (text(&oc), text(&nc));
            let diff = similar::TextDiff::from_lines(&o, &n);
            let body = diff
                .unified_diff()
                .context_radius(3)
                .header(&a_name, &b_name)
                .missing_newline_hint(true)
                .to_string();
            head.push_str(&body);
        }
    }
    head
}
