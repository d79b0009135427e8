//! The layers of a workspace read on fds, as the state commands (diff,
//! reset, gc) see them whether it is mounted or not: the upper and the
//! lowers opened as roots, and the *shared version* of a path (what the
//! lowers alone show there), looked up as the mount looks up over the lowers:
//! a lower whiteout ends the search, a non-directory ends it, an opaque
//! lower directory stops the merge, a redirect names a lower path.
//!
//! Lower paths are absolute (`/a/b`), as a redirect mark writes them;
//! paths inside a layer are relative (`a/b`). The marks themselves are
//! read in `ops` (one home for the format).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::ops::{is_opaque, is_whiteout, redirect, Upper};
use super::sys::{self, Stat};
use super::walk::{self, is_dir};
use super::LayerError;

/// The layers of an (unmounted or mounted) workspace, opened as fds.
pub struct Layers {
    pub upper: OwnedFd,
    pub lowers: Vec<OwnedFd>,
    /// Owners are compared only in a root-owned upper.
    compare_owner: bool,
}

impl Layers {
    /// Layers from fds the caller already holds (the daemon's own).
    pub fn from_fds(upper: OwnedFd, lowers: Vec<OwnedFd>) -> io::Result<Layers> {
        let st = sys::fstat(&upper)?;
        Ok(Layers {
            upper,
            lowers,
            compare_owner: st.st_uid == 0,
        })
    }

    pub fn open(upper: &Path, lowers: &[PathBuf]) -> Result<Layers, LayerError> {
        let up =
            sys::open_root(upper).map_err(|e| LayerError::io("open", "upper dir", upper, e))?;
        let st = sys::fstat(&up).map_err(|e| LayerError::io("stat", "upper dir", upper, e))?;
        let mut ls = Vec::new();
        for (i, l) in lowers.iter().enumerate() {
            let what = format!("lower dir #{}", i + 1);
            ls.push(sys::open_root(l).map_err(|e| LayerError::io("open", &what, l, e))?);
        }
        Ok(Layers {
            upper: up,
            lowers: ls,
            compare_owner: st.st_uid == 0,
        })
    }

    /// Whether owners count as metadata: only in a root-owned upper (an
    /// unprivileged daemon cannot give copies the original owner).
    pub fn compare_owner(&self) -> bool {
        self.compare_owner
    }
}

fn not_found(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR))
}

/// `dir/name` for paths inside a layer (`""` + `b` = `b`).
pub fn join(dir: &OsStr, name: &OsStr) -> OsString {
    if dir.is_empty() {
        return name.to_os_string();
    }
    let mut p = dir.to_os_string();
    p.push("/");
    p.push(name);
    p
}

/// Lower directories that make up the shared version of one directory,
/// topmost first, with the layer index of each.
pub type Base = Vec<(usize, OwnedFd)>;

/// The shared version of one name.
pub struct BaseEntry {
    pub st: Stat,
    pub layer: usize,
    /// For a directory: its lower directories (merged).
    pub dirs: Base,
}

/// Finds `name` in the shared version of a directory (as lookup does over
/// the lowers alone: a lower whiteout ends the search, a non-directory
/// ends it, an opaque lower directory stops the merge).
pub fn base_lookup(base: &Base, nlowers: usize, name: &OsStr) -> io::Result<Option<BaseEntry>> {
    let mut found: Option<BaseEntry> = None;
    for (i, d) in base {
        let st = match sys::fstatat(d, name) {
            Ok(s) => s,
            Err(e) if not_found(&e) => continue,
            Err(e) => return Err(e),
        };
        if is_whiteout(&st) {
            break;
        }
        if !is_dir(&st) {
            if found.is_none() {
                found = Some(BaseEntry {
                    st,
                    layer: *i,
                    dirs: Vec::new(),
                });
            }
            break;
        }
        if found.as_ref().is_some_and(|f| !is_dir(&f.st)) {
            break;
        }
        let fd = sys::open_path(d, name)?;
        let opaque = *i + 1 < nlowers && is_opaque(&fd);
        match &mut found {
            Some(f) => f.dirs.push((*i, fd)),
            None => {
                found = Some(BaseEntry {
                    st,
                    layer: *i,
                    dirs: vec![(*i, fd)],
                })
            }
        }
        if opaque {
            break;
        }
    }
    Ok(found)
}

/// The names the shared version of a directory shows.
pub fn base_names(base: &Base) -> io::Result<Vec<OsString>> {
    let mut seen: HashMap<OsString, bool> = HashMap::new();
    for (_, d) in base {
        for e in sys::read_dir(d)? {
            if seen.contains_key(&e.name) {
                continue;
            }
            let visible = if e.dtype == libc::DT_CHR {
                !sys::fstatat(d, &e.name).is_ok_and(|s| is_whiteout(&s))
            } else {
                true
            };
            seen.insert(e.name, visible);
        }
    }
    let mut names: Vec<OsString> = seen
        .into_iter()
        .filter_map(|(n, v)| v.then_some(n))
        .collect();
    names.sort();
    Ok(names)
}

/// Lower directories at an absolute lower path (`/a/b`), as a redirected
/// directory finds them.
pub fn lowers_at_path(layers: &Layers, path: &OsStr) -> Base {
    dirs_at_path(layers.lowers.iter(), 0, path, &AnyMarks)
}

/// How a walk across the lowers reads a directory's opaque and redirect
/// marks: the mount reads its own spelling (`Upper`), the state commands
/// either (`AnyMarks`).
pub trait Marks {
    fn is_opaque(&self, dir: &OwnedFd) -> bool;
    fn redirect(&self, dir: &OwnedFd) -> Option<OsString>;
}

/// The marks in either spelling (`trusted.overlay.` or `user.overlay.`).
pub struct AnyMarks;

impl Marks for AnyMarks {
    fn is_opaque(&self, dir: &OwnedFd) -> bool {
        is_opaque(dir)
    }
    fn redirect(&self, dir: &OwnedFd) -> Option<OsString> {
        redirect(dir)
    }
}

/// The mount reads the marks of frozen layers in its own spelling.
impl Marks for Upper {
    fn is_opaque(&self, dir: &OwnedFd) -> bool {
        Upper::is_opaque(self, dir)
    }
    fn redirect(&self, dir: &OwnedFd) -> Option<OsString> {
        Upper::redirect(self, dir).map(OsString::from)
    }
}

/// The components of a `/`-separated path.
pub fn split_path(p: &[u8]) -> Vec<Vec<u8>> {
    p.split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

/// The directories at an absolute lower path (`/a/b`) in each of `roots`
/// (the lowers, topmost first) from the lower `from` down, walked one
/// component at a time: a layer without the path is passed over, and a
/// whiteout on the way ends the search. A lower other than the last may
/// be a frozen layer (a checkpoint, a former upper), whose marks act as in
/// a middle layer of kernel overlayfs: an opaque directory on the way
/// hides the layers below (and stops the merge when it is the directory
/// itself), and a redirect on the way moves the path the layers below
/// hold it at. The mount and the state commands both find a redirect's
/// lowers here; they differ only in which spelling of the marks they read.
pub fn dirs_at_path<'a>(
    roots: impl ExactSizeIterator<Item = &'a OwnedFd>,
    from: usize,
    path: &OsStr,
    marks: &impl Marks,
) -> Base {
    let count = roots.len();
    let mut comps = split_path(path.as_bytes());
    let mut out = Vec::new();
    for (i, root) in roots.enumerate().skip(from) {
        let last = i + 1 == count;
        let step = walk_layer(root, &comps, last, marks);
        if let Some(fd) = step.found {
            out.push((i, fd));
        }
        if step.hides_below {
            break;
        }
        if let Some(moved) = step.moved {
            comps = moved;
        }
    }
    out
}

/// One layer's part of `dirs_at_path`.
struct Step {
    /// The directory at the path in this layer, if it has one.
    found: Option<OwnedFd>,
    /// Where the layers below hold it, when a directory on the way
    /// carries a redirect.
    moved: Option<Vec<Vec<u8>>>,
    /// A whiteout or an opaque directory on the way (or the directory
    /// itself opaque): the layers below add nothing.
    hides_below: bool,
}

fn walk_layer(root: &OwnedFd, comps: &[Vec<u8>], last: bool, marks: &impl Marks) -> Step {
    let step = |found, moved, hides_below| Step {
        found,
        moved,
        hides_below,
    };
    let Ok(mut fd) = sys::open_path(root, OsStr::new(".")) else {
        return step(None, None, false);
    };
    let mut moved = None;
    for (k, comp) in comps.iter().enumerate() {
        let c = OsStr::from_bytes(comp);
        match sys::fstatat(&fd, c) {
            Ok(s) if is_dir(&s) => {}
            Ok(s) if is_whiteout(&s) => return step(None, None, true),
            _ => return step(None, moved, false),
        }
        fd = match sys::open_path(&fd, c) {
            Ok(f) => f,
            Err(_) => return step(None, moved, false),
        };
        // The last lower's marks mean nothing: nothing lies below it.
        if last {
            continue;
        }
        if marks.is_opaque(&fd) {
            let whole = k + 1 == comps.len();
            return step(whole.then_some(fd), None, true);
        }
        if let Some(r) = marks.redirect(&fd) {
            let r = r.as_bytes();
            let mut to = if r.starts_with(b"/") {
                Vec::new()
            } else {
                comps[..k].to_vec()
            };
            to.extend(split_path(r));
            to.extend(comps[k + 1..].iter().cloned());
            moved = Some(to);
        }
    }
    step(Some(fd), moved, false)
}

/// A lower path `/a/b` as a path relative to the layer root (`a/b`).
pub fn rel_of(lower_path: &OsStr) -> OsString {
    let b = lower_path.as_bytes();
    let start = b.iter().position(|&c| c != b'/').unwrap_or(b.len());
    OsStr::from_bytes(&b[start..]).to_os_string()
}

/// The stat of the file at `rel` in a layer, not following symlinks.
pub fn stat_in(root: &OwnedFd, rel: &OsStr) -> io::Result<Stat> {
    walk::stat_rel(root, rel)
}

pub fn open_read(root: &OwnedFd, rel: &OsStr) -> io::Result<OwnedFd> {
    let fd = walk::open_rel(root, rel, libc::O_PATH)?;
    sys::reopen(&fd, libc::O_RDONLY | libc::O_NOATIME).or_else(|_| sys::reopen(&fd, libc::O_RDONLY))
}

/// `dir/name` for lower paths (`/a` + `b` = `/a/b`; "" + `b` = `/b`).
pub fn join_lower(dir: &OsStr, name: &OsStr) -> OsString {
    let mut p = dir.to_os_string();
    p.push("/");
    p.push(name);
    p
}
