//! `reset`: discard the upper's changes under some paths, so they show the
//! shared version again.
//!
//! For each path: whatever the upper holds there goes (a file, a whiteout,
//! a whole upper directory with the whiteouts, opaque and redirect marks
//! beneath it); a renamed shared directory (redirect mark) or a moved
//! shared file (origin record) also gets its old name back (the whiteout
//! left there by the rename is removed). A path
//! that exists only in the upper is thereby removed.
//!
//! All access is fd-relative beneath the upper root and never follows a
//! symlink (`layer::sys`). An upper directory is first renamed into the
//! work dir, then removed there: the view never shows it half removed.
//!
//! A path whose ancestor is deleted, replaced by a non-directory, or opaque
//! over a shared entry of that path cannot come back alone: that is refused,
//! naming the ancestor to reset instead.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::layer::ops::{is_opaque, is_whiteout, redirect};
use crate::layer::stack::{base_lookup, join, join_lower, lowers_at_path, Base, Layers};
use crate::layer::sys;
use crate::overlay::origin::Origin;

/// Why a reset (or `gc`) stopped: the path, the step and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    #[error(
        "path {} is outside the workspace; give a path relative to the workspace root",
        .0.display()
    )]
    Outside(PathBuf),
    #[error(
        "path {} contains `..`; give a path inside the workspace, relative to its root",
        .0.display()
    )]
    DotDot(PathBuf),
    #[error("cannot open the upper root: {0}")]
    OpenUpperRoot(io::Error),
    #[error("cannot read the upper root: {0}")]
    ReadUpperRoot(io::Error),
    #[error("cannot open lower dir #{}: {source}", index + 1)]
    OpenLower { index: usize, source: io::Error },
    /// `what` the upper path could not be: read, opened, removed.
    #[error("cannot {what} upper path {path}: {source}")]
    Upper {
        what: &'static str,
        path: String,
        source: io::Error,
    },
    #[error("cannot read the shared {path}: {source}")]
    Shared { path: String, source: io::Error },
    #[error("cannot remove the whiteout at {path}: {source}")]
    Whiteout { path: String, source: io::Error },
    /// A directory above `path` is deleted or no longer a directory
    /// (`why`): that directory is what can be reset.
    #[error("{dir} {why}, so {path} cannot come back alone; reset {dir} instead")]
    NotAlone {
        dir: String,
        why: &'static str,
        path: String,
    },
    /// An opaque directory above `path` hides the shared version.
    #[error(
        "{dir} replaced the shared directory (it is opaque), so the shared {path} cannot come \
         back alone; reset {dir} instead"
    )]
    Opaque { dir: String, path: String },
    #[error(
        "the reset is done, but its old upper directory {name} in the work dir could not be \
         removed: {source} (it is removed at the next mount)"
    )]
    MovedAway { name: String, source: io::Error },
}

fn upper_err(what: &'static str, rel: &OsStr) -> impl FnOnce(io::Error) -> ResetError {
    let path = display(rel);
    move |source| ResetError::Upper { what, path, source }
}

/// `normalize` for each command-line path of a workspace, whose absolute
/// paths may name it by its mountpoint (when mounted) or its upper.
pub fn normalize_all(
    ws: &super::workspace::Workspace,
    args: &[std::path::PathBuf],
) -> Result<Vec<OsString>, ResetError> {
    let mut roots = vec![ws.upper.as_path()];
    if let Some(m) = &ws.mountpoint {
        roots.insert(0, m.as_path());
    }
    args.iter().map(|p| normalize(p, &roots)).collect()
}

/// Turns a command-line path into a path relative to the workspace root
/// ("" = the root itself). Absolute paths are accepted inside the given
/// roots (mountpoint, upper); `..` never is.
pub fn normalize(arg: &Path, roots: &[&Path]) -> Result<OsString, ResetError> {
    let rel: &Path = if arg.is_absolute() {
        roots
            .iter()
            .find_map(|r| arg.strip_prefix(r).ok())
            .ok_or_else(|| ResetError::Outside(arg.to_path_buf()))?
    } else {
        arg
    };
    let mut out = OsString::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => {
                if !out.is_empty() {
                    out.push("/");
                }
                out.push(n);
            }
            Component::CurDir => {}
            Component::ParentDir => return Err(ResetError::DotDot(arg.to_path_buf())),
            Component::RootDir | Component::Prefix(_) => {
                return Err(ResetError::Outside(arg.to_path_buf()))
            }
        }
    }
    Ok(out)
}

fn display(rel: &OsStr) -> String {
    if rel.is_empty() {
        "the workspace root".into()
    } else {
        rel.to_string_lossy().into_owned()
    }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

fn tmp_name() -> OsString {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    OsString::from(format!("#reset.{:x}.{n}", std::process::id()))
}

/// Removes the upper object `name` in `dir`: a directory is moved into the
/// work dir, so it disappears from the upper at once, and is named in
/// `moved_away` for `remove_moved_away`.
fn remove_upper(
    dir: &OwnedFd,
    name: &OsStr,
    work: &OwnedFd,
    is_dir: bool,
    moved_away: &mut Vec<OsString>,
) -> io::Result<()> {
    if !is_dir {
        return sys::unlinkat(dir, name, false);
    }
    let tmp = tmp_name();
    sys::renameat2(dir, name, work, &tmp, sys::RENAME_NOREPLACE)?;
    moved_away.push(tmp);
    Ok(())
}

/// What resets did.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    /// Paths (relative to the root) whose view changed: the reset paths
    /// and, for a renamed directory, its old name.
    pub changed: Vec<OsString>,
    /// Upper directories moved into the work dir (their names there), out
    /// of the view already; `remove_moved_away` removes them.
    pub moved_away: Vec<OsString>,
}

/// Removes the directories a reset moved into `work`. Apart from the
/// reset itself: the mount's daemon first drops its own fds of the
/// objects in them (`Overlay::refresh_paths`) and lets writes go on, since
/// removing a tree that open fds still pin costs the kernel a walk of the
/// pinned part per directory removed (quadratic in the depth). A tree
/// left behind by a crash meanwhile goes with the work dir's cleaning at
/// the next mount.
pub fn remove_moved_away(work: &OwnedFd, names: &[OsString]) -> Result<(), ResetError> {
    for n in names {
        crate::layer::walk::remove_tree(work, n).map_err(|source| ResetError::MovedAway {
            name: n.to_string_lossy().into_owned(),
            source,
        })?;
    }
    Ok(())
}

/// Where the walk to a path's parent ended.
struct Parent {
    upper: OwnedFd,
    base: Base,
    base_path: Option<OsString>,
    /// The nearest opaque ancestor (or the parent itself), if any.
    opaque: Option<OsString>,
}

/// Walks the upper (and the shared version beside it) to the parent of
/// `rel`. `Ok(None)`: the upper has nothing there, nothing to reset.
fn walk_parent(layers: &Layers, rel: &OsStr) -> Result<Option<Parent>, ResetError> {
    let root = sys::open_path(&layers.upper, OsStr::new(".")).map_err(ResetError::OpenUpperRoot)?;
    let mut base: Base = Vec::new();
    for (i, l) in layers.lowers.iter().enumerate() {
        let fd = sys::open_path(l, OsStr::new("."))
            .map_err(|source| ResetError::OpenLower { index: i, source })?;
        base.push((i, fd));
    }
    let mut cur = Parent {
        opaque: is_opaque(&root).then(OsString::new),
        upper: root,
        base,
        base_path: Some(OsString::new()),
    };
    let comps: Vec<&[u8]> = rel.as_bytes().split(|&b| b == b'/').collect();
    let mut walked = OsString::new();
    for comp in &comps[..comps.len().saturating_sub(1)] {
        let name = OsStr::from_bytes(comp);
        walked = join(&walked, name);
        let st = match sys::fstatat(&cur.upper, name) {
            Ok(s) => s,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT)) => return Ok(None),
            Err(e) => return Err(upper_err("read", &walked)(e)),
        };
        if is_whiteout(&st) {
            return Err(ResetError::NotAlone {
                dir: display(&walked),
                why: "is deleted in this workspace",
                path: display(rel),
            });
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(ResetError::NotAlone {
                dir: display(&walked),
                why: "is no longer a directory in this workspace",
                path: display(rel),
            });
        }
        let fd = sys::open_path(&cur.upper, name).map_err(upper_err("open", &walked))?;
        let nlowers = layers.lowers.len();
        let (base, base_path) = match redirect(&fd) {
            Some(r) => {
                let old = if r.as_bytes().starts_with(b"/") {
                    r
                } else {
                    join_lower(cur.base_path.as_deref().unwrap_or(OsStr::new("")), &r)
                };
                (lowers_at_path(layers, &old), Some(old))
            }
            None => {
                let b =
                    base_lookup(&cur.base, nlowers, name).map_err(|source| ResetError::Shared {
                        path: display(&walked),
                        source,
                    })?;
                let dirs = match b {
                    Some(b) if b.st.st_mode & libc::S_IFMT == libc::S_IFDIR => b.dirs,
                    _ => Vec::new(),
                };
                (dirs, cur.base_path.as_ref().map(|p| join_lower(p, name)))
            }
        };
        let opaque = if is_opaque(&fd) {
            Some(walked.clone())
        } else {
            cur.opaque.take()
        };
        cur = Parent {
            upper: fd,
            base,
            base_path,
            opaque,
        };
    }
    Ok(Some(cur))
}

/// Resets one path (relative to the root; "" resets everything) of the
/// workspace whose layers are `layers`, using `work` (on the upper's
/// filesystem) to take directories out of the view atomically. What it
/// did is added to `out`, also when it fails part way.
pub fn reset_path(
    layers: &Layers,
    work: &OwnedFd,
    rel: &OsStr,
    out: &mut Outcome,
) -> Result<(), ResetError> {
    if rel.is_empty() {
        let root =
            sys::open_path(&layers.upper, OsStr::new(".")).map_err(ResetError::OpenUpperRoot)?;
        for p in ["trusted.overlay.opaque", "user.overlay.opaque"] {
            let name = std::ffi::CString::new(p).expect("no NUL");
            let _ = sys::removexattr(&root, &name);
        }
        for e in sys::read_dir(&root).map_err(ResetError::ReadUpperRoot)? {
            reset_path(layers, work, &e.name, out)?;
        }
        out.changed.push(OsString::new());
        return Ok(());
    }
    let Some(parent) = walk_parent(layers, rel)? else {
        return Ok(());
    };
    let name = OsStr::from_bytes(rel.as_bytes().rsplit(|&b| b == b'/').next().unwrap_or(b""));
    let shared = base_lookup(&parent.base, layers.lowers.len(), name)
        .map_err(|source| ResetError::Shared {
            path: display(rel),
            source,
        })?
        .is_some();
    if let (true, Some(op)) = (shared, &parent.opaque) {
        return Err(ResetError::Opaque {
            dir: display(op),
            path: display(rel),
        });
    }
    let st = match sys::fstatat(&parent.upper, name) {
        Ok(s) => s,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        Err(e) => return Err(upper_err("read", rel)(e)),
    };
    let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
    let moved_from = if is_dir {
        sys::open_path(&parent.upper, name)
            .ok()
            .and_then(|fd| redirect(&fd))
            .map(|r| {
                if r.as_bytes().starts_with(b"/") {
                    r
                } else {
                    join_lower(parent.base_path.as_deref().unwrap_or(OsStr::new("")), &r)
                }
            })
    } else if st.st_mode & libc::S_IFMT == libc::S_IFREG {
        // A moved shared file: its origin record names the old path.
        sys::open_path(&parent.upper, name)
            .ok()
            .and_then(|fd| Origin::read(&fd))
            .map(|o| o.path)
            .filter(|p| p.as_bytes().get(1..) != Some(rel.as_bytes()))
    } else {
        None
    };
    remove_upper(&parent.upper, name, work, is_dir, &mut out.moved_away)
        .map_err(upper_err("remove", rel))?;
    out.changed.push(rel.to_os_string());
    if let Some(old) = moved_from {
        let old_rel =
            OsStr::from_bytes(old.as_bytes().strip_prefix(b"/").unwrap_or(old.as_bytes()))
                .to_os_string();
        if unhide_moved(layers, &old_rel)? {
            out.changed.push(old_rel);
        }
    }
    Ok(())
}

/// Removes the whiteout a directory rename left at the old name `rel`, if
/// it is still there and nothing else took the name.
fn unhide_moved(layers: &Layers, rel: &OsStr) -> Result<bool, ResetError> {
    let Ok(Some(parent)) = walk_parent(layers, rel) else {
        return Ok(false);
    };
    if parent.opaque.is_some() {
        return Ok(false);
    }
    let name = OsStr::from_bytes(rel.as_bytes().rsplit(|&b| b == b'/').next().unwrap_or(b""));
    match sys::fstatat(&parent.upper, name) {
        Ok(st) if is_whiteout(&st) => {
            sys::unlinkat(&parent.upper, name, false).map_err(|source| ResetError::Whiteout {
                path: display(rel),
                source,
            })?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Empties the scratch paths of a workspace: every topmost upper entry
/// matching a pattern is reset (removed from the upper, so the path shows
/// its shared version, or nothing). What was reset is added to `done`,
/// also when a later one fails; `remove_moved_away` finishes it.
pub fn gc(
    layers: &Layers,
    work: &std::os::fd::OwnedFd,
    scratch: &super::scratch::Scratch,
    done: &mut Outcome,
) -> Result<(), ResetError> {
    use crate::layer::walk::{entry_mode, Step, Walker};
    let mut found = Vec::new();
    if scratch.is_empty() {
        return Ok(());
    }
    let ctx = |w: &Walker, source: std::io::Error| ResetError::Upper {
        what: "read",
        path: w.path().to_string_lossy().into_owned(),
        source,
    };
    let mut w = Walker::new(&layers.upper).map_err(ResetError::ReadUpperRoot)?;
    while let Some(step) = w.step().map_err(|e| ctx(&w, e))? {
        let Step::Entry(e) = step else { continue };
        let p = w.child_path(&e.name);
        if scratch.matches_os(&p) {
            found.push(p);
        } else if entry_mode(w.dir().map_err(|err| ctx(&w, err))?, &e)
            .map_err(|err| ctx(&w, err))?
            == libc::S_IFDIR
        {
            w.descend(&e.name).map_err(|err| ctx(&w, err))?;
        }
    }
    found.sort();
    for p in found {
        reset_path(layers, work, &p, done)?;
    }
    Ok(())
}
