//! The walk of the upper beside the shared version of each directory.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use crate::layer::ops::{is_opaque, is_whiteout, mark, redirect};
use crate::layer::stack::{
    base_lookup, base_names, join_lower, lowers_at_path, rel_of, Base, BaseEntry,
};
use crate::layer::sys::{self, Stat};
use crate::layer::walk::{self, is_dir, Step, Walker};

use super::{describe, type_name, Change, Filter, Kind, Layers};

pub(super) struct Walk<'a> {
    pub(super) layers: &'a Layers,
    pub(super) filter: &'a Filter,
    pub(super) out: Vec<Change>,
    /// Regular files added: moved shared files when their origin record
    /// names a deleted original.
    pub(super) added_files: Vec<usize>,
    /// Deleted shared non-directories by their (layer, lower path).
    pub(super) deleted: HashMap<(usize, OsString), usize>,
    /// The shared version of each directory on the walker's stack.
    pub(super) frames: Vec<Frame>,
}

/// The shared version an upper directory being walked is compared with
/// (the upper directory itself is the walker's current one).
pub(super) struct Frame {
    /// Its lower directories (`O_PATH`), topmost first; empty once
    /// evicted (`BASE_OPEN`), see `Walk::base`.
    pub(super) base: Base,
    /// (layer, device, inode) of each lower directory, to reopen them.
    pub(super) base_ids: Vec<(usize, u64, u64)>,
    /// Lower path of `base` (`/a/b`, "" for the root); `None` if none.
    pub(super) base_path: Option<OsString>,
    /// Whether shared entries missing from the upper are deleted (the
    /// directory, or one above it, is opaque).
    pub(super) hides: bool,
    /// Whether a moved copied-up file may stand here (the directory has the
    /// moved-in mark): only then are its new files' origins read.
    pub(super) moved_in: bool,
}

/// How many of the deepest frames keep their lower directories open (as
/// the walker keeps its upper ones, `walk::OPEN_LEVELS`).
pub(super) const BASE_OPEN: usize = walk::OPEN_LEVELS;

impl Frame {
    pub(super) fn new(
        base: Base,
        base_path: Option<OsString>,
        hides: bool,
        moved_in: bool,
    ) -> Frame {
        // An fd that cannot be stat'ed gets an id no reopened one matches.
        let base_ids = base
            .iter()
            .map(|(i, fd)| sys::fstat(fd).map_or((*i, 0, 0), |st| (*i, st.st_dev, st.st_ino)))
            .collect();
        Frame {
            base,
            base_ids,
            base_path,
            hides,
            moved_in,
        }
    }
}

pub(super) type WalkResult = Result<(), (OsString, io::Error)>;

/// The overlay marks of one upper directory, read with one `listxattr`
/// (most directories have no xattrs at all: no further call).
#[derive(Default)]
pub(super) struct DirMarks {
    pub(super) opaque: bool,
    pub(super) redirect: Option<OsString>,
    /// A copied-up file was renamed or linked into it (`MOVED_IN_XATTR`).
    pub(super) moved_in: bool,
}

pub(super) fn dir_marks(fd: &OwnedFd) -> DirMarks {
    let Ok(list) = sys::flistxattr(fd) else {
        // No listing (no xattr support): ask for each mark by name.
        return DirMarks {
            opaque: is_opaque(fd),
            redirect: redirect(fd),
            moved_in: mark(fd, crate::overlay::origin::MOVED_IN_XATTR).is_some(),
        };
    };
    let mut m = DirMarks::default();
    for name in list.split(|&b| b == 0) {
        let what = name
            .strip_prefix(b"trusted.overlay.")
            .or_else(|| name.strip_prefix(b"user.overlay."));
        match what {
            Some(b"opaque") => m.opaque = m.opaque || is_opaque(fd),
            Some(b"redirect") => m.redirect = m.redirect.take().or_else(|| redirect(fd)),
            Some(w) if w == crate::overlay::origin::MOVED_IN_XATTR.as_bytes() => m.moved_in = true,
            _ => {}
        }
    }
    m
}

/// The file type bits of a directory entry type, where it is certain (a
/// character device may be a whiteout and needs a stat).
fn mode_of_dtype(dtype: u8) -> Option<u32> {
    match dtype {
        libc::DT_REG => Some(libc::S_IFREG),
        libc::DT_DIR => Some(libc::S_IFDIR),
        libc::DT_LNK => Some(libc::S_IFLNK),
        libc::DT_FIFO => Some(libc::S_IFIFO),
        libc::DT_SOCK => Some(libc::S_IFSOCK),
        libc::DT_BLK => Some(libc::S_IFBLK),
        _ => None,
    }
}

impl Walk<'_> {
    pub(super) fn push(&mut self, c: Change) -> usize {
        self.out.push(c);
        self.out.len() - 1
    }

    /// Walks the upper from the root, whose shared version is `root`.
    pub(super) fn run(&mut self, w: &mut Walker, root: Frame) -> WalkResult {
        self.enter(w, root)?;
        loop {
            let step = w.step().map_err(|e| (w.path().to_os_string(), e))?;
            match step {
                None => return Ok(()),
                Some(Step::Leave(_)) => {
                    self.frames.pop();
                }
                Some(Step::Entry(e)) => self.entry(w, e)?,
            }
        }
    }

    /// The walker just entered a directory whose shared version is `f`:
    /// the shared entries it hides are deleted.
    pub(super) fn enter(&mut self, w: &Walker, f: Frame) -> WalkResult {
        let depth = self.frames.len();
        if depth >= BASE_OPEN {
            self.frames[depth - BASE_OPEN].base.clear();
        }
        self.frames.push(f);
        let f = self.frames.last().expect("just pushed");
        if !f.hides {
            return Ok(());
        }
        let nlowers = self.layers.lowers.len();
        let names: std::collections::HashSet<&OsStr> = w.pending().collect();
        let mut gone = Vec::new();
        for n in base_names(&f.base).map_err(|e| (w.path().to_os_string(), e))? {
            if names.contains(n.as_os_str()) {
                continue;
            }
            let rel = w.child_path(&n);
            if self.filter.scratch.matches_os(&rel) {
                continue;
            }
            let Some(b) = base_lookup(&f.base, nlowers, &n).map_err(|e| (rel.clone(), e))? else {
                continue;
            };
            let base_rel = f.base_path.as_ref().map(|p| rel_of(&join_lower(p, &n)));
            gone.push(Change {
                path: rel,
                kind: Kind::Deleted,
                from: None,
                ftype: type_name(b.st.st_mode),
                conflict: false,
                old: base_rel.map(|r| (b.layer, r)),
                new: false,
            });
        }
        self.out.extend(gone);
        Ok(())
    }

    /// The current frame's lower directories, reopened if they were
    /// evicted: by their lower path from each layer root (any length,
    /// `walk::open_rel`), checked to be the very directories seen before.
    pub(super) fn base(&mut self, w: &Walker) -> io::Result<&Base> {
        let f = self.frames.last_mut().expect("a frame per level");
        if f.base.len() < f.base_ids.len() {
            let rel = rel_of(f.base_path.as_deref().unwrap_or(OsStr::new("")));
            let mut base = Vec::new();
            for &(i, dev, ino) in &f.base_ids {
                let fd = walk::open_rel(
                    &self.layers.lowers[i],
                    &rel,
                    libc::O_PATH | libc::O_DIRECTORY,
                )?;
                let st = sys::fstat(&fd)?;
                if (st.st_dev, st.st_ino) != (dev, ino) {
                    return Err(io::Error::other(format!(
                        "the shared version of {} changed during the diff; run it again",
                        describe(w.path())
                    )));
                }
                base.push((i, fd));
            }
            f.base = base;
        }
        Ok(&f.base)
    }

    /// One entry of the walker's current directory.
    pub(super) fn entry(&mut self, w: &mut Walker, e: sys::DirEntry) -> WalkResult {
        let rel = w.child_path(&e.name);
        if self.filter.scratch.matches_os(&rel) || !self.filter.enters(&rel) {
            return Ok(());
        }
        let ectx = |err: io::Error| (rel.clone(), err);
        let nlowers = self.layers.lowers.len();
        let dir = w.dir().map_err(ectx)?;
        let base_empty = self.frames.last().is_some_and(|f| f.base_ids.is_empty());
        // In a directory without a shared version (new), the entry
        // type from the listing is enough: no stat per entry.
        let st = match mode_of_dtype(e.dtype) {
            Some(mode) if base_empty => {
                let mut st: Stat = crate::layer::sys::zeroed_stat();
                st.st_mode = mode;
                st
            }
            _ => sys::fstatat(dir, &e.name).map_err(ectx)?,
        };
        let base = if base_empty {
            None
        } else {
            let b = self.base(w).map_err(ectx)?;
            base_lookup(b, nlowers, &e.name).map_err(ectx)?
        };
        let f = self.frames.last().expect("a frame per level");
        let base_rel = f
            .base_path
            .as_ref()
            .map(|p| rel_of(&join_lower(p, &e.name)));
        if is_whiteout(&st) {
            if let Some(b) = base {
                let idx = self.push(Change {
                    path: rel,
                    kind: Kind::Deleted,
                    from: None,
                    ftype: type_name(b.st.st_mode),
                    conflict: false,
                    old: base_rel.clone().map(|r| (b.layer, r)),
                    new: false,
                });
                if let (false, Some(r)) = (is_dir(&b.st), base_rel) {
                    self.deleted.insert((b.layer, r), idx);
                }
            }
            return Ok(());
        }
        if is_dir(&st) {
            return self.child_dir(w, &e.name, rel, &st, base);
        }
        let moved_in = f.moved_in;
        match base {
            None => {
                let idx = self.push(Change {
                    path: rel,
                    kind: Kind::Added,
                    from: None,
                    ftype: type_name(st.st_mode),
                    conflict: false,
                    old: None,
                    new: true,
                });
                if moved_in && st.st_mode & libc::S_IFMT == libc::S_IFREG {
                    self.added_files.push(idx);
                }
            }
            Some(b) => {
                let old = base_rel.map(|r| (b.layer, r));
                let dir = w.dir().map_err(ectx)?;
                let kind = if is_dir(&b.st) {
                    Some(Kind::Modified)
                } else {
                    self.compare(dir, &e.name, &st, &b, old.as_ref())
                        .map_err(ectx)?
                };
                let conflict =
                    st.st_mode & libc::S_IFMT == libc::S_IFREG && self.drifted(dir, &e.name);
                if let Some(kind) = kind {
                    self.push(Change {
                        path: rel,
                        kind,
                        from: None,
                        ftype: type_name(st.st_mode),
                        conflict,
                        old,
                        new: true,
                    });
                }
            }
        }
        Ok(())
    }

    /// A directory entry `name` of the walker's current directory: its own
    /// line, then the walker enters it.
    pub(super) fn child_dir(
        &mut self,
        w: &mut Walker,
        name: &OsStr,
        rel: OsString,
        st: &Stat,
        base: Option<BaseEntry>,
    ) -> WalkResult {
        let parent_path = self.frames.last().and_then(|f| f.base_path.clone());
        let parent_hides = self.frames.last().is_some_and(|f| f.hides);
        w.descend(name).map_err(|e| (rel.clone(), e))?;
        let fd = w.dir().map_err(|e| (rel.clone(), e))?;
        let marks = dir_marks(fd);
        let opaque = marks.opaque;
        if let Some(r) = marks.redirect {
            let old_lower = if r.as_bytes().starts_with(b"/") {
                r
            } else {
                join_lower(parent_path.as_deref().unwrap_or(OsStr::new("")), &r)
            };
            let from = rel_of(&old_lower);
            let base = lowers_at_path(self.layers, &old_lower);
            self.push(Change {
                path: rel,
                kind: Kind::Renamed,
                from: Some(from),
                ftype: "dir",
                conflict: false,
                old: None,
                new: true,
            });
            let f = Frame::new(base, Some(old_lower), opaque, marks.moved_in);
            return self.enter(w, f);
        }
        let base_path = parent_path.as_ref().map(|p| join_lower(p, name));
        let old = match (&base, &base_path) {
            (Some(b), Some(p)) => Some((b.layer, rel_of(p))),
            _ => None,
        };
        let (kind, sub_base, hides) = match base {
            Some(b) if is_dir(&b.st) => {
                let same = self.same_meta(fd, st, &b.dirs[0].1, &b.st, false);
                let kind = (!same).then_some(Kind::Metadata);
                (kind, b.dirs, parent_hides || opaque)
            }
            Some(_) => (Some(Kind::Modified), Vec::new(), false),
            None => (Some(Kind::Added), Vec::new(), false),
        };
        if let Some(kind) = kind {
            self.push(Change {
                path: rel,
                kind,
                from: None,
                ftype: "dir",
                conflict: false,
                old,
                new: true,
            });
        }
        self.enter(w, Frame::new(sub_base, base_path, hides, marks.moved_in))
    }
}
