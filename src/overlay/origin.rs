//! The origin record: what a copied-up regular file was copied from.
//!
//! At copy-up the upper copy gets a private xattr (`<prefix>layerfs.origin`,
//! the prefix being `trusted.overlay.` or `user.overlay.` like the other
//! marks) naming the lower original: its layer, its path in that layer,
//! and its identity then (inode number, size, mtime, ctime). `diff` reads
//! it to tell whether the shared original changed after the copy-up
//! (drift: an administrator updated the lower) and where a moved file came
//! from.
//!
//! The layer is named, not indexed (version 2): `c:NAME` for a checkpoint
//! layer (its name in the layer store), `s:K` for the K-th shared lower
//! (`layer::LayerName`). A squash changes the indices of the layers below
//! the ones it keeps, never these names: `state::frozen::origins` finds
//! the layer a name stands for in the stack of now (a checkpoint merged
//! into a squashed layer lives on in it). Records of version 1 name the
//! layer by its index in the stack they were written under; they are read
//! as such, and a squash over an upper that may hold them is refused
//! (`state::squash`).
//!
//! Invariants:
//! - The name lies in the overlay's private namespace, so the mount never
//!   lists, reads, sets nor removes it (`Upper::is_private_xattr`), and it
//!   is never copied from a lower (`copy_xattrs` skips private names).
//! - It is not one of kernel overlayfs's own names (`origin`, `impure`,
//!   `metacopy`, …): the kernel ignores unknown `overlay.*` names, so
//!   `mount -t overlay` of the same upper shows the same tree.
//! - ctime cannot be set by anyone, so a changed original is always seen
//!   (an original replaced by another file differs in inode or ctime even
//!   if its inode number is recycled).

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use super::inode::Inode;
use super::{Overlay, Result};
use crate::layer::sys::{self, Stat};
use crate::layer::{Layer, LayerName};

/// The xattr name after the private prefix.
pub const ORIGIN_XATTR: &str = "layerfs.origin";

/// Both spellings of the record's full name (root and unprivileged daemons).
pub const ORIGIN_NAMES: [&str; 2] = [
    "trusted.overlay.layerfs.origin",
    "user.overlay.layerfs.origin",
];

/// The mark (after the private prefix) on an upper directory into which a
/// file carrying an origin record was renamed or linked. `diff` looks for
/// moved shared files only in directories so marked, so a diff of a large
/// upper reads no xattr of the (many) new files elsewhere. A mark may
/// outlive the moved file (it is only a hint to look); a directory that
/// holds a moved file always has it, because the mark is set before the
/// rename or link that brings the file in, and it travels with the
/// directory when the directory itself moves.
pub const MOVED_IN_XATTR: &str = "layerfs.moved-in";

/// The value of the moved-in mark.
pub const MOVED_IN_VALUE: &[u8] = b"y";

/// Both spellings of the moved-in mark.
pub const MOVED_IN_NAMES: [&str; 2] = [
    "trusted.overlay.layerfs.moved-in",
    "user.overlay.layerfs.moved-in",
];

/// The lower layer an origin record names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LayerRef {
    /// Its index (0 = topmost) in the stack the record was written under
    /// (version 1 records: read, never written any more).
    Index(usize),
    /// Its name (version 2): the same whatever the stack does around it.
    Named(LayerName),
}

/// The identity of a lower original at copy-up time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The lower layer the original was in.
    pub layer: LayerRef,
    /// Its path in that layer, `/`-separated with a leading `/`.
    pub path: OsString,
    pub ino: u64,
    pub size: i64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

/// Whether `n` can be a checkpoint's name in a record: one plain path
/// segment of the characters layer names are made of (`[A-Za-z0-9._-]`,
/// not starting with a dot).
fn is_layer_name(n: &str) -> bool {
    !n.is_empty()
        && !n.starts_with('.')
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl Origin {
    pub fn new(layer: LayerRef, path: OsString, st: &Stat) -> Origin {
        Origin {
            layer,
            path,
            ino: st.st_ino,
            size: st.st_size,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }

    /// `v2 LAYER INO SIZE MSEC.MNSEC CSEC.CNSEC PATH`, LAYER being `c:NAME`
    /// or `s:K` (the path last, raw bytes, so it may hold any character);
    /// a record naming its layer by index is written as version 1, `v1`
    /// and the index.
    pub fn encode(&self) -> Vec<u8> {
        let layer = match &self.layer {
            LayerRef::Index(i) => format!("v1 {i}"),
            LayerRef::Named(LayerName::Checkpoint(n)) => format!("v2 c:{n}"),
            LayerRef::Named(LayerName::Shared(k)) => format!("v2 s:{k}"),
        };
        let mut v = format!(
            "{layer} {} {} {}.{} {}.{} ",
            self.ino, self.size, self.mtime.0, self.mtime.1, self.ctime.0, self.ctime.1
        )
        .into_bytes();
        v.extend_from_slice(self.path.as_bytes());
        v
    }

    pub fn decode(raw: &[u8]) -> Option<Origin> {
        let mut parts = raw.splitn(7, |&b| b == b' ');
        let version = parts.next()?;
        let mut num = || -> Option<&[u8]> { parts.next() };
        let text = |b: &[u8]| std::str::from_utf8(b).ok().map(str::to_owned);
        let layer = text(num()?)?;
        let layer = match version {
            b"v1" => LayerRef::Index(layer.parse().ok()?),
            b"v2" => LayerRef::Named(match layer.split_once(':')? {
                ("c", n) if is_layer_name(n) => LayerName::Checkpoint(n.to_string()),
                ("s", k) if k.bytes().all(|b| b.is_ascii_digit()) => {
                    LayerName::Shared(k.parse().ok()?)
                }
                _ => return None,
            }),
            _ => return None,
        };
        let ino = text(num()?)?.parse().ok()?;
        let size = text(num()?)?.parse().ok()?;
        let pair = |s: String| -> Option<(i64, i64)> {
            let (a, b) = s.split_once('.')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        };
        let mtime = pair(text(num()?)?)?;
        let ctime = pair(text(num()?)?)?;
        let path = OsString::from_vec(num()?.to_vec());
        Some(Origin {
            layer,
            path,
            ino,
            size,
            mtime,
            ctime,
        })
    }

    /// Whether `raw` is a record this overlay writes: it decodes and its
    /// path is an absolute path of plain names (`Upper`'s lower-path form).
    pub fn is_valid(raw: &[u8]) -> bool {
        Origin::decode(raw).is_some_and(|o| crate::layer::ops::is_plain_abs_path(o.path.as_bytes()))
    }

    /// Whether `st` (the lower file found at `path` in `layer` now) is still
    /// the original the copy was made from, unchanged.
    pub fn matches(&self, st: &Stat) -> bool {
        self.ino == st.st_ino
            && self.size == st.st_size
            && self.mtime == (st.st_mtime, st.st_mtime_nsec)
            && self.ctime == (st.st_ctime, st.st_ctime_nsec)
    }

    /// The record of `name` in `dir`, if it has one. Most upper files have
    /// no xattrs at all: one `listxattrat` call answers for them.
    pub fn read_at(dir: &OwnedFd, name: &OsStr) -> Option<Origin> {
        let list = sys::listxattr_at(dir, name).ok()?;
        let has = list
            .split(|&b| b == 0)
            .any(|n| ORIGIN_NAMES.iter().any(|o| o.as_bytes() == n));
        if !has {
            return None;
        }
        Origin::read(&sys::open_path(dir, name).ok()?)
    }

    /// Reads the record of the file behind `fd`, in either spelling.
    pub fn read(fd: &impl std::os::fd::AsRawFd) -> Option<Origin> {
        ORIGIN_NAMES.iter().find_map(|n| {
            let name = CString::new(*n).expect("no NUL");
            sys::getxattr(fd, &name)
                .ok()
                .and_then(|v| Origin::decode(&v))
        })
    }
}

impl Overlay {
    /// Stores the origin record on a regular file copy being built as `tmp`
    /// in the work dir, from `st` (the lower original's attributes). Other
    /// kinds get none (directories have their redirect, symlinks cannot
    /// carry `user.*` xattrs). An upper without xattr support loses only
    /// drift detection, never the copy-up: failures are logged, not returned.
    pub(super) fn record_origin(&self, inode: &Inode, tmp: &OsStr, st: &Stat) -> Result<()> {
        let Some(origin) = lower_origin(&self.lowers(), inode, st) else {
            return Ok(());
        };
        let stored = sys::open_path(&self.upper.work, tmp).and_then(|fd| {
            sys::setxattr(&fd, &self.upper.xattr(ORIGIN_XATTR), &origin.encode(), 0)
        });
        if let Err(e) = stored {
            tracing::debug!(path = %self.path_of(inode), "origin record not stored: {e}");
        }
        Ok(())
    }

    /// Before the upper regular file `file` replaces `replaced` by rename
    /// (an atomic save: `sed -i`, editors' temp file plus rename): a file
    /// without an origin record of its own inherits the base it replaces,
    /// that is the replaced upper copy's record, or, when the replaced file
    /// is still the shared one, a record of that shared file now. So diff
    /// still sees drift of the shared original, however the edit was made.
    /// A file with its own record (a moved copy-up) keeps it. Best effort
    /// like `record_origin`: failures are logged, not returned.
    ///
    /// Relies on: `replaced` is still in place (called before the rename),
    /// so its upper copy and lower file are the ones the name showed.
    pub(super) fn inherit_origin(&self, file: &std::os::fd::OwnedFd, replaced: &Inode) {
        let name = self.upper.xattr(ORIGIN_XATTR);
        if sys::getxattr(file, &name).is_ok() {
            return;
        }
        match sys::fstat(file) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG => {}
            _ => return,
        }
        let record = match replaced.upper_fd() {
            Ok(Some(up)) => match sys::getxattr(up.as_ref(), &name) {
                Ok(v) if Origin::is_valid(&v) => v,
                _ => return,
            },
            Ok(None) => {
                let lower = replaced.real.read().lowers.first().map(|(_, l)| l.clone());
                let Some(st) = lower
                    .and_then(|l| l.get().ok())
                    .and_then(|fd| sys::fstat(fd.as_ref()).ok())
                else {
                    return;
                };
                match lower_origin(&self.lowers(), replaced, &st) {
                    Some(o) => o.encode(),
                    None => return,
                }
            }
            Err(_) => return,
        };
        if let Err(e) = sys::setxattr(file, &name, &record, 0) {
            tracing::debug!(path = %self.path_of(replaced), "origin record not inherited: {e}");
        }
    }
}

/// The origin record of the lower regular file behind `inode` (whose
/// attributes are `st`): its layer, by the name it has in `lowers` (the
/// stack served), and its path from its parent's lower path. `None` for
/// other kinds (directories have their redirect, symlinks cannot carry
/// `user.*` xattrs) and for objects without a lower.
fn lower_origin(lowers: &[std::sync::Arc<Layer>], inode: &Inode, st: &Stat) -> Option<Origin> {
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    let index = inode.real.read().lowers.first().map(|(i, _)| *i)?;
    let layer = match lowers.get(index).and_then(|l| l.name.clone()) {
        Some(name) => LayerRef::Named(name),
        None => LayerRef::Index(index),
    };
    let dir_path = inode
        .parent()
        .and_then(|p| p.real.read().lower_path.clone())?;
    let mut path = dir_path.to_os_string();
    path.push("/");
    path.push(&inode.loc.read().name);
    Some(Origin::new(layer, path, st))
}

impl Overlay {
    /// Before the upper file `file` gets a name in the upper directory
    /// `dir` (rename or link): if it carries an origin record, marks `dir`
    /// as holding a moved shared file (see `MOVED_IN_XATTR`). An upper
    /// without xattr support loses only rename detection in `diff`, never
    /// the operation: failures are logged, not returned.
    pub(super) fn note_moved_in(&self, file: &impl AsRawFd, dir: &impl AsRawFd) {
        if sys::getxattr(file, &self.upper.xattr(ORIGIN_XATTR)).is_err() {
            return;
        }
        let mark = self.upper.xattr(MOVED_IN_XATTR);
        if sys::getxattr(dir, &mark).is_ok() {
            return;
        }
        if let Err(e) = sys::setxattr(dir, &mark, MOVED_IN_VALUE, 0) {
            tracing::debug!("moved-in mark not stored: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_odd_path() {
        let mut st: Stat = crate::layer::sys::zeroed_stat();
        st.st_ino = 42;
        st.st_size = 7;
        st.st_mtime = 1_700_000_000;
        st.st_mtime_nsec = 5;
        st.st_ctime = 1_700_000_001;
        st.st_ctime_nsec = 999_999_999;
        for layer in [
            LayerRef::Index(1),
            LayerRef::Named(LayerName::Checkpoint("c-1.x_y".into())),
            LayerRef::Named(LayerName::Shared(3)),
        ] {
            let o = Origin::new(layer.clone(), OsString::from("/a b/c\nd e"), &st);
            let back = Origin::decode(&o.encode()).expect("decodes");
            assert_eq!(back, o);
            assert!(back.matches(&st));
        }
        let o = Origin::new(LayerRef::Index(1), OsString::from("/x"), &st);
        assert_eq!(
            o.encode(),
            b"v1 1 42 7 1700000000.5 1700000001.999999999 /x"
        );
        st.st_ctime_nsec = 0;
        assert!(!o.matches(&st));
        assert!(Origin::decode(b"v1 1 2").is_none());
        for bad in [
            &b"v3 1 2 3 4.5 6.7 /x"[..],
            b"v2 1 2 3 4.5 6.7 /x",
            b"v2 c: 2 3 4.5 6.7 /x",
            b"v2 c:../up 2 3 4.5 6.7 /x",
            b"v2 c:.hidden 2 3 4.5 6.7 /x",
            b"v2 s:+1 2 3 4.5 6.7 /x",
            b"v2 x:1 2 3 4.5 6.7 /x",
        ] {
            assert!(Origin::decode(bad).is_none(), "{bad:?}");
        }
        assert_eq!(
            Origin::decode(b"v2 c:c1 2 3 4.5 6.7 /x").map(|o| o.layer),
            Some(LayerRef::Named(LayerName::Checkpoint("c1".into())))
        );
    }
}
