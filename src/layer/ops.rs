//! Every change layerfs makes to the upper layer goes through `Upper`: the
//! whiteouts, opaque and redirect marks of the kernel-overlayfs format, and
//! the work directory where new objects are built before being renamed into
//! place. Each wrapper logs at `trace` level.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{sys, Layer};

/// The writable layer and its work directory.
#[derive(Debug)]
pub struct Upper {
    pub layer: Layer,
    /// `O_PATH` fd of the work dir: same filesystem as the upper, outside it.
    pub work: OwnedFd,
    /// `trusted.overlay.` as root, `user.overlay.` unprivileged (the
    /// kernel's `userxattr` convention).
    pub xattr_prefix: &'static str,
    /// Whether whiteouts can be made as 0/0 character devices.
    pub whiteout_dev: bool,
    tmp_seq: AtomicU64,
}

/// Mode of the kernel-overlayfs whiteout: a character device 0/0.
pub const WHITEOUT_MODE: u32 = libc::S_IFCHR;

/// Whether a stat describes a whiteout (character device 0/0).
pub fn is_whiteout(st: &sys::Stat) -> bool {
    is_whiteout_node(st.st_mode & libc::S_IFMT, st.st_rdev)
}

/// Whether a node of type `fmt` (`S_IFMT` bits) and device number `rdev`
/// is a whiteout.
pub fn is_whiteout_node(fmt: u32, rdev: u64) -> bool {
    fmt == libc::S_IFCHR && rdev == 0
}

/// The prefixes of the overlay's private xattrs: `trusted.overlay.` (a
/// root daemon) and `user.overlay.` (an unprivileged one).
pub const PRIVATE_PREFIXES: [&str; 2] = ["trusted.overlay.", "user.overlay."];

/// The value of the opaque mark.
pub const OPAQUE_VALUE: &[u8] = b"y";

/// Whether `v` is an absolute path of plain names as a lower path is
/// written in the marks (`/` alone is the root): no `.`, `..` or empty
/// name, no NUL, at most `PATH_MAX` bytes.
pub fn is_plain_abs_path(v: &[u8]) -> bool {
    if v == b"/" {
        return true;
    }
    v.len() <= libc::PATH_MAX as usize
        && v.first() == Some(&b'/')
        && !v.contains(&0)
        && v[1..]
            .split(|&b| b == b'/')
            .all(|n| !n.is_empty() && n != b"." && n != b"..")
}

/// Whether `v` is a redirect mark this overlay follows (`resolve` in
/// `overlay::namei`): an absolute lower path as `set_redirect` writes it,
/// or a single plain name (the kernel's form for a move within one
/// directory).
pub fn is_valid_redirect(v: &[u8]) -> bool {
    is_plain_abs_path(v)
        || (!v.is_empty()
            && v.len() <= 255
            && v != b"."
            && v != b".."
            && !v.contains(&b'/')
            && !v.contains(&0))
}

/// An overlay mark of an upper or lower object, in either spelling
/// (`trusted.overlay.` as written by a root daemon, `user.overlay.` by an
/// unprivileged one): how the state commands read a workspace that any
/// daemon may have written.
pub fn mark(fd: &impl std::os::fd::AsRawFd, what: &str) -> Option<Vec<u8>> {
    PRIVATE_PREFIXES.iter().find_map(|p| {
        let name = CString::new(format!("{p}{what}")).expect("no NUL");
        sys::getxattr(fd, &name).ok()
    })
}

/// Whether a directory carries the opaque mark, in either spelling.
pub fn is_opaque(fd: &impl std::os::fd::AsRawFd) -> bool {
    mark(fd, "opaque").is_some_and(|v| v == OPAQUE_VALUE)
}

/// A directory's redirect mark, in either spelling.
pub fn redirect(fd: &impl std::os::fd::AsRawFd) -> Option<OsString> {
    use std::os::unix::ffi::OsStrExt;
    mark(fd, "redirect").map(|v| OsStr::from_bytes(&v).to_os_string())
}

impl Upper {
    pub fn new(layer: Layer, work: OwnedFd, privileged: bool) -> Upper {
        Upper {
            layer,
            work,
            xattr_prefix: if privileged {
                "trusted.overlay."
            } else {
                "user.overlay."
            },
            whiteout_dev: true,
            tmp_seq: AtomicU64::new(0),
        }
    }

    /// Name of one of the overlay's private xattrs (`opaque`, `redirect`).
    pub fn xattr(&self, what: &str) -> CString {
        CString::new(format!("{}{what}", self.xattr_prefix)).expect("no NUL")
    }

    /// A fresh temporary name in the work dir.
    pub fn tmp_name(&self) -> OsString {
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        OsString::from(format!("#{:x}.{n}", std::process::id()))
    }

    /// Clears the work dir of leftovers of an earlier run (a copy-up or
    /// removal interrupted by a crash never became visible).
    pub fn clean_work(&self) -> io::Result<()> {
        for e in sys::read_dir(&self.work)? {
            if let Err(err) = super::walk::remove_tree(&self.work, &e.name) {
                tracing::warn!("cannot clean work dir entry {:?}: {err}", e.name);
            }
        }
        Ok(())
    }

    /// Makes a whiteout named `name` in `dir`.
    pub fn whiteout(&self, dir: &impl AsFd, name: &OsStr) -> io::Result<()> {
        tracing::trace!(?name, "whiteout");
        sys::mknodat(dir, name, WHITEOUT_MODE, 0)
    }

    /// Replaces whatever non-directory is at `name` in `dir` by a whiteout,
    /// atomically (built in the work dir, renamed over).
    pub fn whiteout_over(&self, dir: &impl AsFd, name: &OsStr) -> io::Result<()> {
        let tmp = self.tmp_name();
        self.whiteout(&self.work, &tmp)?;
        if let Err(e) = sys::renameat2(&self.work, &tmp, dir, name, 0) {
            let _ = sys::unlinkat(&self.work, &tmp, false);
            return Err(e);
        }
        Ok(())
    }

    /// Replaces the directory at `name` in `dir` by a whiteout: the
    /// directory is swapped into the work dir atomically, then removed there.
    pub fn whiteout_over_dir(&self, dir: &impl AsFd, name: &OsStr) -> io::Result<()> {
        let tmp = self.tmp_name();
        self.whiteout(&self.work, &tmp)?;
        if let Err(e) = sys::renameat2(&self.work, &tmp, dir, name, sys::RENAME_EXCHANGE) {
            let _ = sys::unlinkat(&self.work, &tmp, false);
            return Err(e);
        }
        super::walk::remove_tree(&self.work, &tmp)
    }

    /// Removes the upper directory `name` in `dir` together with the
    /// whiteouts it still holds (it is empty as seen through the mount).
    pub fn remove_dir(&self, dir: &impl AsFd, name: &OsStr) -> io::Result<()> {
        match sys::unlinkat(dir, name, true) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                let tmp = self.tmp_name();
                sys::renameat2(dir, name, &self.work, &tmp, 0)?;
                super::walk::remove_tree(&self.work, &tmp)
            }
            r => r,
        }
    }

    /// Removes all whiteouts inside an upper dir that is empty as seen
    /// through the mount, so a rename may replace it.
    pub fn clear_whiteouts(&self, dir: &impl AsFd) -> io::Result<()> {
        for e in sys::read_dir(dir)? {
            let st = sys::fstatat(dir, &e.name)?;
            if is_whiteout(&st) {
                sys::unlinkat(dir, &e.name, false)?;
            }
        }
        Ok(())
    }

    pub fn set_opaque(&self, dir: &impl std::os::fd::AsRawFd) -> io::Result<()> {
        sys::setxattr(dir, &self.xattr("opaque"), OPAQUE_VALUE, 0)
    }

    pub fn is_opaque(&self, dir: &impl std::os::fd::AsRawFd) -> bool {
        matches!(sys::getxattr(dir, &self.xattr("opaque")), Ok(v) if v == OPAQUE_VALUE)
    }

    pub fn set_redirect(&self, dir: &impl std::os::fd::AsRawFd, target: &str) -> io::Result<()> {
        sys::setxattr(dir, &self.xattr("redirect"), target.as_bytes(), 0)
    }

    pub fn redirect(&self, dir: &impl std::os::fd::AsRawFd) -> Option<String> {
        sys::getxattr(dir, &self.xattr("redirect"))
            .ok()
            .and_then(|v| String::from_utf8(v).ok())
    }

    /// Whether an xattr name belongs to the overlay itself (never shown or
    /// settable through the mount, in either convention).
    pub fn is_private_xattr(name: &[u8]) -> bool {
        PRIVATE_PREFIXES
            .iter()
            .any(|p| name.starts_with(p.as_bytes()))
    }
}
