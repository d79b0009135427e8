//! The walk shared by saving and extracting: the directories from a root
//! down to the current one, each reached from its parent by name.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{ctx, SnapshotError, WINDOW};
use crate::layer::sys;

/// The directories from a root down to the current one of a walk, each
/// reached from its parent by name (`openat2` beneath it, no symlink
/// followed) and known by (device, inode). Only the deepest `WINDOW` keep
/// a descriptor, so a tree deeper than the open-file limit can be walked;
/// a level whose descriptor was closed is reopened from the nearest open
/// ancestor and must still be the same directory. Each level carries the
/// walk's own data `M`.
pub(super) struct Chain<M> {
    pub(super) root: OwnedFd,
    root_meta: M,
    pub(super) levels: Vec<Level<M>>,
    /// The current directory's path relative to the root, `/`-joined.
    pub(super) path: Vec<u8>,
}

pub(super) struct Level<M> {
    pub(super) name: OsString,
    fd: Option<OwnedFd>,
    id: (u64, u64),
    pub(super) meta: M,
}

impl<M> Chain<M> {
    pub(super) fn new(root: OwnedFd, root_meta: M) -> Chain<M> {
        Chain {
            root,
            root_meta,
            levels: Vec::new(),
            path: Vec::new(),
        }
    }

    pub(super) fn depth(&self) -> usize {
        self.levels.len()
    }

    /// Enters `name`, whose descriptor is `fd`.
    pub(super) fn push(&mut self, name: OsString, fd: OwnedFd, meta: M) -> io::Result<()> {
        let st = sys::fstat(&fd)?;
        if !self.levels.is_empty() {
            self.path.push(b'/');
        }
        self.path.extend_from_slice(name.as_bytes());
        self.levels.push(Level {
            name,
            fd: Some(fd),
            id: (st.st_dev, st.st_ino),
            meta,
        });
        let n = self.levels.len();
        if n > WINDOW {
            self.levels[n - 1 - WINDOW].fd = None;
        }
        Ok(())
    }

    /// Leaves the current directory for its parent.
    pub(super) fn pop(&mut self) -> Option<Level<M>> {
        let l = self.levels.pop()?;
        let keep = if self.levels.is_empty() {
            0
        } else {
            self.path.len() - l.name.len() - 1
        };
        self.path.truncate(keep);
        Some(l)
    }

    /// The walk's data of the current directory.
    pub(super) fn meta_mut(&mut self) -> &mut M {
        match self.levels.last_mut() {
            Some(l) => &mut l.meta,
            None => &mut self.root_meta,
        }
    }

    /// The current directory's descriptor (reopened if it was closed).
    pub(super) fn fd(&mut self) -> io::Result<&OwnedFd> {
        let n = self.levels.len();
        if n == 0 {
            return Ok(&self.root);
        }
        if self.levels[n - 1].fd.is_none() {
            self.reopen()?;
        }
        self.levels[n - 1]
            .fd
            .as_ref()
            .ok_or_else(|| io::Error::other("directory descriptor lost"))
    }

    pub(super) fn reopen(&mut self) -> io::Result<()> {
        let n = self.levels.len();
        let from = self
            .levels
            .iter()
            .rposition(|l| l.fd.is_some())
            .map_or(0, |i| i + 1);
        for k in from..n {
            let fd = {
                let parent = if k == 0 {
                    &self.root
                } else {
                    self.levels[k - 1]
                        .fd
                        .as_ref()
                        .ok_or_else(|| io::Error::other("directory descriptor lost"))?
                };
                sys::open_beneath(
                    parent,
                    &self.levels[k].name,
                    libc::O_PATH | libc::O_DIRECTORY,
                    0,
                )?
            };
            let st = sys::fstat(&fd)?;
            if (st.st_dev, st.st_ino) != self.levels[k].id {
                return Err(io::Error::other(
                    "a directory was replaced while being walked",
                ));
            }
            self.levels[k].fd = Some(fd);
            // Only the window stays open (the parent was needed for this one).
            if k > 0 && k - 1 + WINDOW < n {
                self.levels[k - 1].fd = None;
            }
        }
        Ok(())
    }
}

/// `parent/name` as a relative path (`parent` `/`-joined, "" the root).
pub(super) fn child_rel(parent: &[u8], name: &OsStr) -> PathBuf {
    let mut b = parent.to_vec();
    if !b.is_empty() {
        b.push(b'/');
    }
    b.extend_from_slice(name.as_bytes());
    PathBuf::from(OsStr::from_bytes(&b))
}

/// The names in a directory, sorted in reverse (the walk pops the first).
pub(super) fn names_rev(fd: &OwnedFd, shown: &Path) -> Result<Vec<OsString>, SnapshotError> {
    let mut names: Vec<OsString> = sys::read_dir(fd)
        .map_err(ctx(format!("cannot list {}", shown.display())))?
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort_unstable_by(|a, b| b.cmp(a));
    Ok(names)
}
