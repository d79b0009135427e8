//! Merged directory listings: the union of all layers' entries, the
//! higher layer winning a name, whiteouts and the overlay's own names never
//! listed. The kernel caches listings itself and reads one from the daemon
//! only to fill that cache (see `Overlay::dir_listing`): offsets are
//! positions in one listing taken at offset 0, so a fill in several
//! requests neither repeats nor skips an entry; `seekdir` and short buffers
//! are then served from the kernel's copy.
//!
//! Also the walk of the union view beneath a directory (`walk_union`),
//! which a directory move uses to check what it moves (`move_guard`).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::inode::{Inode, Real};
use super::listing::DirEntry;
use super::namei::{dir_key, name_key_in};
use super::{Errno, Overlay, Result};
use crate::layer::{reach, sys};

/// What a name seen in a higher layer does to the same name below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// Listed as a directory: lower directories of that name merge in.
    Dir,
    /// A whiteout or a non-directory: nothing below shows.
    Blocked,
}

fn dtype_to_kind(d: u8) -> u32 {
    match d {
        libc::DT_DIR => libc::S_IFDIR,
        libc::DT_LNK => libc::S_IFLNK,
        libc::DT_CHR => libc::S_IFCHR,
        libc::DT_BLK => libc::S_IFBLK,
        libc::DT_FIFO => libc::S_IFIFO,
        libc::DT_SOCK => libc::S_IFSOCK,
        _ => libc::S_IFREG,
    }
}

/// One entry of a merged listing, as `merge` meets it.
struct Merged<'a> {
    name: OsString,
    kind: u32,
    /// Device and inode number of the entry in the layer listing it.
    dev: u64,
    ino: u64,
    /// The layer directory listing it, and whether it is a lower one.
    layer: &'a Arc<OwnedFd>,
    from_lower: bool,
}

/// One entry met by `Overlay::walk_union`.
pub struct Met<'a> {
    /// Path relative to the walked directory (`a/b`).
    pub rel: &'a str,
    pub name: &'a OsStr,
    /// `S_IFMT` type.
    pub kind: u32,
    /// The real files of the directory holding the entry.
    pub dir: &'a Real,
    /// The layer directory the entry was listed from.
    pub layer: &'a Arc<OwnedFd>,
    /// For a directory: its own real files (what a descent lists).
    pub real: Option<&'a Real>,
}

impl Overlay {
    /// Every entry of a directory as seen through the mount, without `.`
    /// and `..`, including names the policy hides (callers filter).
    pub(super) fn merged_entries(&self, dir: &Inode) -> Result<Vec<DirEntry>> {
        let real = dir.real.read().clone();
        let names = self.ids.has_name_ids();
        let dir_key = names.then(|| dir_key(real.lower_path.as_ref(), dir.id));
        let mut out = Vec::new();
        self.merge(&real, |m| {
            // One name of a lower file with several links that was looked
            // up is an object of its own (`namei::split_name`): its id.
            let own = dir_key
                .as_deref()
                .filter(|_| m.from_lower && m.kind != libc::S_IFDIR)
                .and_then(|dk| {
                    self.ids
                        .known_name_id(m.dev, m.ino, &name_key_in(dk, &m.name))
                });
            let id = own.unwrap_or_else(|| self.ids.id(m.dev, m.ino));
            out.push(DirEntry {
                name: m.name,
                kind: m.kind,
                id,
            });
        })?;
        Ok(out)
    }

    /// The union of the layers' listings of the directory whose real files
    /// are `real`: each visible name once, from the highest layer that has
    /// it, whiteouts and what they hide left out.
    fn merge(&self, real: &Real, mut each: impl FnMut(Merged<'_>)) -> Result<()> {
        // One record per name seen so far (one copy of each name, not one
        // per set: a listing of a million names is built in one pass).
        let mut marks: HashMap<OsString, Mark> = HashMap::new();
        let mut layers: Vec<(u64, Arc<crate::layer::real::RealFd>)> = Vec::new();
        if let Some(u) = &real.upper {
            layers.push((self.upper.layer.dev, u.clone()));
        }
        let lowers = self.lowers();
        for (i, fd) in &real.lowers {
            // An index past the stack: `real` predates a live undo that
            // shortened it (and is re-resolved right after); the device
            // only picks inode numbers.
            let dev = lowers.get(*i).map_or(self.upper.layer.dev, |l| l.dev);
            layers.push((dev, fd.clone()));
        }
        for (n, (dev, real_fd)) in layers.iter().enumerate() {
            let from_lower = n > 0 || real.upper.is_none();
            let listed = real_fd
                .get()
                .and_then(|fd| sys::read_dir(fd.as_ref()).map(|l| (fd, l)));
            let (fd, listed) = match listed {
                Ok(x) => x,
                // A lower out of reach under a directory the upper holds:
                // list the upper's part (see `namei::resolve`).
                Err(e)
                    if n > 0
                        && real.upper.is_some()
                        && e.raw_os_error().is_some_and(reach::is_unreachable) =>
                {
                    self.lower_trouble(true);
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            for e in listed {
                let mark = marks.get(&e.name).copied();
                if mark == Some(Mark::Blocked) {
                    continue;
                }
                let mut dtype = e.dtype;
                if dtype == libc::DT_CHR || dtype == libc::DT_UNKNOWN {
                    if let Ok(st) = sys::fstatat(fd.as_ref(), &e.name) {
                        if crate::layer::ops::is_whiteout(&st) {
                            marks.insert(e.name, Mark::Blocked);
                            continue;
                        }
                        dtype = match st.st_mode & libc::S_IFMT {
                            libc::S_IFDIR => libc::DT_DIR,
                            libc::S_IFCHR => libc::DT_CHR,
                            libc::S_IFLNK => libc::DT_LNK,
                            libc::S_IFBLK => libc::DT_BLK,
                            libc::S_IFIFO => libc::DT_FIFO,
                            libc::S_IFSOCK => libc::DT_SOCK,
                            _ => libc::DT_REG,
                        };
                    }
                }
                if mark == Some(Mark::Dir) {
                    // A lower entry under a higher directory of the same
                    // name: merged, already listed; a lower non-directory
                    // ends the merge below it.
                    if dtype != libc::DT_DIR {
                        marks.insert(e.name, Mark::Blocked);
                    }
                    continue;
                }
                let m = if dtype == libc::DT_DIR {
                    Mark::Dir
                } else {
                    Mark::Blocked
                };
                marks.insert(e.name.clone(), m);
                each(Merged {
                    name: e.name,
                    kind: dtype_to_kind(dtype),
                    dev: *dev,
                    ino: e.ino,
                    layer: &fd,
                    from_lower,
                });
            }
        }
        Ok(())
    }

    /// Walks the union view beneath the directory whose real files are
    /// `root`, as the mount shows it (hidden names included: they exist),
    /// calling `visit` for every entry. `visit` gets the state of the
    /// directory holding the entry (`root_state` for the top) and answers,
    /// for a directory, `Some(state)` to walk into it with that state; it
    /// may end the walk with an error.
    ///
    /// Iterative: a stack of directories still to list, holding each
    /// one's real files (layer handles, not open fds) — never recursion,
    /// so a tree thousands of levels deep cannot overflow a worker's
    /// stack. A name that vanishes while the walk runs is skipped.
    pub(super) fn walk_union<S>(
        &self,
        root: Real,
        root_state: S,
        mut visit: impl FnMut(&Met<'_>, &S) -> Result<Option<S>>,
    ) -> Result<()> {
        let mut stack: Vec<(String, Real, S)> = vec![(String::new(), root, root_state)];
        while let Some((base, dir, state)) = stack.pop() {
            let mut listed = Vec::new();
            match self.merge(&dir, |m| listed.push((m.name, m.kind, m.layer.clone()))) {
                Ok(()) => {}
                Err(Errno(libc::ENOENT)) | Err(Errno(libc::ENOTDIR)) => continue,
                Err(e) => return Err(e),
            }
            for (name, kind, layer) in listed {
                let rel = if base.is_empty() {
                    name.to_string_lossy().into_owned()
                } else {
                    format!("{base}/{}", name.to_string_lossy())
                };
                let own = if kind == libc::S_IFDIR {
                    match self.resolve_in(&dir, &name) {
                        Ok(Some(r)) if r.st.st_mode & libc::S_IFMT == libc::S_IFDIR => Some(r.real),
                        Ok(_) | Err(Errno(libc::ENOENT)) | Err(Errno(libc::ENOTDIR)) => continue,
                        Err(e) => return Err(e),
                    }
                } else {
                    None
                };
                let met = Met {
                    rel: &rel,
                    name: &name,
                    kind,
                    dir: &dir,
                    layer: &layer,
                    real: own.as_ref(),
                };
                if let Some(inner) = visit(&met, &state)? {
                    if let Some(own) = own {
                        stack.push((rel, own, inner));
                    }
                }
            }
        }
        Ok(())
    }
}
