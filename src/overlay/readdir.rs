//! Merged directory listings: the union of all layers' entries, the
//! higher layer winning a name, whiteouts and the overlay's own names never
//! listed. The kernel caches listings itself and reads one from the daemon
//! only to fill that cache (see `Overlay::dir_listing`): offsets are
//! positions in one listing taken at offset 0, so a fill in several
//! requests neither repeats nor skips an entry; `seekdir` and short buffers
//! are then served from the kernel's copy.

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::Arc;

use super::inode::Inode;
use super::Overlay;
use super::Result;
use crate::layer::{reach, sys};

/// What a name seen in a higher layer does to the same name below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// Listed as a directory: lower directories of that name merge in.
    Dir,
    /// A whiteout or a non-directory: nothing below shows.
    Blocked,
}

/// One merged entry: name, `S_IFMT` type and the node id it will have.
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: OsString,
    pub kind: u32,
    pub id: u64,
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

impl Overlay {
    /// Every entry of a directory as seen through the mount, without `.`
    /// and `..`, including names the policy hides (callers filter).
    pub fn merged_entries(&self, dir: &Inode) -> Result<Vec<DirEntry>> {
        let real = dir.real.read().clone();
        let mut out = Vec::new();
        // One record per name seen so far (one copy of each name, not one
        // per set: a listing of a million names is built in one pass).
        let mut marks: HashMap<OsString, Mark> = HashMap::new();
        let mut layers: Vec<(u64, Arc<crate::layer::real::RealFd>)> = Vec::new();
        if let Some(u) = &real.upper {
            layers.push((self.upper.layer.dev, u.clone()));
        }
        for (i, fd) in &real.lowers {
            layers.push((self.lowers[*i].dev, fd.clone()));
        }
        for (n, (dev, real_fd)) in layers.iter().enumerate() {
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
                let id = self.ids.id(*dev, e.ino);
                let m = if dtype == libc::DT_DIR {
                    Mark::Dir
                } else {
                    Mark::Blocked
                };
                marks.insert(e.name.clone(), m);
                out.push(DirEntry {
                    name: e.name,
                    kind: dtype_to_kind(dtype),
                    id,
                });
            }
        }
        Ok(out)
    }
}
