//! What a lower layer's filesystem can and cannot do, found out once when
//! the mount starts (`Caps::probe`), so a network or FUSE lower is served
//! on purpose rather than as if it were a local disk.
//!
//! What matters, and what layerfs does about each:
//! - **Outside changes raise no inotify event** on a network filesystem
//!   (NFS, CIFS, CephFS, 9p, GlusterFS, …) when they are made on another
//!   host, nor on any FUSE filesystem when they are made behind its daemon
//!   (a second client mount of a GlusterFS volume, the backing store of a
//!   FUSE daemon). Such a lower is `remote`: its directories are never
//!   counted as watched, so their entries get the short `--lower-timeout`
//!   instead of the long one (see `overlay::watch`).
//! - **File handles** (`name_to_handle_at`/`open_by_handle_at`) reopen an
//!   object the daemon let go of. On FUSE they work only while the kernel
//!   still caches the object, unless the FUSE server declares export
//!   support, which cannot be checked from user space: a FUSE lower, or
//!   one that gives no handle, keeps an fd on every object the kernel
//!   holds instead (`RealFd` pins it).
//! - **xattrs**: without them a lower simply has none to show or copy up.
//! - **Inode numbers** must tell the lower's files apart: a lower that
//!   gives two different files the same number is refused (layerfs would
//!   take one for the other). Whether numbers stay the same after the
//!   kernel forgets a file is known only per filesystem type; on an
//!   unknown one it is logged as a caveat.
//! - **`openat2` with `RESOLVE_BENEATH`** and **`O_PATH`** carry the
//!   guarantee that no symlink leads the daemon out of a layer; they are
//!   the kernel's, not the filesystem's, and a layer that cannot be opened
//!   with them is refused when it is opened (`Layer::open`).

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use super::sys;
use super::LayerError;

/// `statfs` magic numbers of network and FUSE filesystems (linux/magic.h
/// and the filesystems' own sources).
const REMOTE_MAGIC: &[(i64, &str)] = &[
    (0x6573_5546, "fuse"),
    (0x6969, "nfs"),
    (0x517b, "smb"),
    (0xff53_4d42, "cifs"),
    (0xfe53_4d42, "smb2"),
    (0x00c3_6400, "ceph"),
    (0x0102_1997, "9p"),
    (0x5346_414f, "afs"),
    (0x6b41_4653, "afs"),
    (0x7375_7245, "coda"),
    (0x7461_636f, "ocfs2"),
    (0x0116_1970, "gfs2"),
    (0x0bd0_0bd0, "lustre"),
    (0x2003_0528, "orangefs"),
];
const FUSE_MAGIC: i64 = 0x6573_5546;

/// Filesystem types (as /proc/self/mountinfo names them) whose changes
/// may come from elsewhere, besides every `fuse.*`.
const REMOTE_TYPES: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "ceph",
    "9p",
    "afs",
    "coda",
    "ocfs2",
    "gfs2",
    "lustre",
    "glusterfs",
    "beegfs",
    "gpfs",
    "orangefs",
    "virtiofs",
    "fuse",
    "fuseblk",
];

/// Filesystem types known to keep a file's inode number for its life.
const STABLE_INO_TYPES: &[&str] = &[
    "ext2",
    "ext3",
    "ext4",
    "xfs",
    "btrfs",
    "tmpfs",
    "zfs",
    "f2fs",
    "bcachefs",
    "jfs",
    "nfs",
    "nfs4",
    "ceph",
    "9p",
    // GlusterFS derives inode numbers from each file's GFID.
    "fuse.glusterfs",
    "glusterfs",
    // JuiceFS numbers inodes in its metadata engine.
    "fuse.juicefs",
];

/// Whether a lower's inode numbers stay with a file for its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inodes {
    Stable,
    /// Not known for this filesystem type: a file's number may change
    /// after the kernel forgets it (what the mount shows follows it).
    Unknown,
}

/// What one lower's filesystem offers.
#[derive(Debug, Clone)]
pub struct Caps {
    /// Type as /proc/self/mountinfo names it (`ext4`, `fuse.glusterfs`).
    pub fstype: String,
    /// Mount source (`/dev/vda`, `host:/volume`).
    pub source: String,
    /// Changes made elsewhere raise no inotify event here.
    pub remote: bool,
    /// File handles reopen objects the kernel has forgotten.
    pub handles: bool,
    pub xattrs: bool,
    pub inodes: Inodes,
}

impl Caps {
    /// Probes the filesystem of the layer root `root` (an `O_PATH` fd of
    /// `path`); `dir` is a readable fd of the same directory. An error is
    /// the message refusing the lower, naming it and what to do.
    pub fn probe(
        root: &OwnedFd,
        dir: &OwnedFd,
        path: &Path,
        what: &str,
    ) -> Result<Caps, LayerError> {
        let magic = sys::fstatfs_type(root).map_err(|source| LayerError::Statfs {
            what: what.to_string(),
            path: path.to_path_buf(),
            source,
        })?;
        let (fstype, source) = mount_of(root).unwrap_or_else(|| {
            let name = REMOTE_MAGIC.iter().find(|(m, _)| *m == magic);
            (name.map_or("unknown", |(_, n)| n).to_string(), "?".into())
        });
        let remote = REMOTE_MAGIC.iter().any(|(m, _)| *m == magic) || is_remote_type(&fstype);
        let handles =
            magic != FUSE_MAGIC && !fstype.starts_with("fuse") && sys::name_to_handle(root).is_ok();
        let xattrs = !matches!(
            sys::listxattr(root).map_err(|e| e.raw_os_error()),
            Err(Some(libc::ENOTSUP))
        );
        let inodes = if STABLE_INO_TYPES.contains(&fstype.as_str())
            || (fstype.starts_with("cifs") || fstype == "smb3") && mount_option(root, "serverino")
        {
            Inodes::Stable
        } else {
            Inodes::Unknown
        };
        if let Some((a, b, ino)) = shared_inode(dir) {
            return Err(LayerError::SharedInodes {
                what: what.to_string(),
                path: path.to_path_buf(),
                fstype,
                ino,
                names: Box::new([
                    a.to_string_lossy().into_owned(),
                    b.to_string_lossy().into_owned(),
                ]),
            });
        }
        Ok(Caps {
            fstype,
            source,
            remote,
            handles,
            xattrs,
            inodes,
        })
    }

    /// A local filesystem with every capability (tests, and the upper).
    pub fn local() -> Caps {
        Caps {
            fstype: "local".into(),
            source: String::new(),
            remote: false,
            handles: true,
            xattrs: true,
            inodes: Inodes::Stable,
        }
    }

    /// One line for the log: what the daemon does about this lower.
    pub fn describe(&self) -> String {
        let mut s = format!("{} from {}", self.fstype, self.source);
        if self.remote {
            s.push_str(
                "; changes made elsewhere raise no inotify event here: they show within \
                 --lower-timeout plus the filesystem's own client caching",
            );
        }
        if !self.handles {
            s.push_str("; no reusable file handles: one fd is kept per object the kernel holds");
        }
        if !self.xattrs {
            s.push_str("; no xattrs");
        }
        if self.inodes == Inodes::Unknown {
            s.push_str(
                "; inode numbers not known to be stable: a shared file's st_ino may change \
                 after the kernel forgets it",
            );
        }
        s
    }
}

fn is_remote_type(fstype: &str) -> bool {
    fstype.starts_with("fuse.") || REMOTE_TYPES.contains(&fstype)
}

/// The mount id of the mount an fd lies on (`mnt_id:` in fdinfo).
fn mount_id(fd: &impl AsRawFd) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The mountinfo line of the mount `fd` lies on, split at its ` - `:
/// (fields before, fields after).
fn mountinfo_line(fd: &impl AsRawFd) -> Option<(Vec<String>, Vec<String>)> {
    let id = mount_id(fd)?.to_string();
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let line = table
        .lines()
        .find(|l| l.split(' ').next() == Some(id.as_str()))?;
    let (head, tail) = line.split_once(" - ")?;
    let words = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
    Some((words(head), words(tail)))
}

/// (type, source) of the mount `fd` lies on.
fn mount_of(fd: &impl AsRawFd) -> Option<(String, String)> {
    let (_, tail) = mountinfo_line(fd)?;
    Some((tail.first()?.clone(), tail.get(1)?.replace("\\040", " ")))
}

/// Whether the mount `fd` lies on has super option `opt`.
fn mount_option(fd: &impl AsRawFd, opt: &str) -> bool {
    mountinfo_line(fd)
        .and_then(|(_, tail)| tail.get(2).cloned())
        .is_some_and(|o| o.split(',').any(|x| x == opt))
}

/// Two entries among the first few of directory `dir` that are different
/// files but report one inode number (hard links, which share it by
/// right, are told apart by their link count).
fn shared_inode(dir: &OwnedFd) -> Option<(std::ffi::OsString, std::ffi::OsString, u64)> {
    let entries = sys::read_dir(dir).ok()?;
    let mut seen: Vec<(std::ffi::OsString, sys::Stat)> = Vec::new();
    for e in entries.into_iter().take(32) {
        let Ok(st) = sys::fstatat(dir, &e.name) else {
            continue;
        };
        seen.push((e.name, st));
    }
    let (a, b) = duplicate(&seen)?;
    Some((seen[a].0.clone(), seen[b].0.clone(), seen[a].1.st_ino))
}

/// The positions of two entries that cannot be one file yet share an
/// inode number: a directory among them, two types, or a file with a
/// single link.
fn duplicate(seen: &[(std::ffi::OsString, sys::Stat)]) -> Option<(usize, usize)> {
    for (i, (_, a)) in seen.iter().enumerate() {
        for (j, (_, b)) in seen.iter().enumerate().skip(i + 1) {
            if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino) {
                continue;
            }
            let fmt = |s: &sys::Stat| s.st_mode & libc::S_IFMT;
            let can_be_links =
                fmt(a) == fmt(b) && fmt(a) != libc::S_IFDIR && a.st_nlink > 1 && b.st_nlink > 1;
            if !can_be_links {
                return Some((i, j));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn st(ino: u64, mode: u32, nlink: u64) -> sys::Stat {
        let mut s: sys::Stat = sys::zeroed_stat();
        s.st_ino = ino;
        s.st_mode = mode;
        s.st_nlink = nlink as _;
        s
    }

    #[test]
    fn hard_links_share_a_number_by_right() {
        let seen = vec![
            (OsString::from("a"), st(7, libc::S_IFREG, 2)),
            (OsString::from("b"), st(7, libc::S_IFREG, 2)),
            (OsString::from("c"), st(8, libc::S_IFDIR, 2)),
        ];
        assert!(duplicate(&seen).is_none());
    }

    #[test]
    fn different_files_with_one_number_are_found() {
        let single = vec![
            (OsString::from("a"), st(7, libc::S_IFREG, 1)),
            (OsString::from("b"), st(7, libc::S_IFREG, 1)),
        ];
        assert_eq!(duplicate(&single), Some((0, 1)));
        let types = vec![
            (OsString::from("d"), st(3, libc::S_IFDIR, 2)),
            (OsString::from("f"), st(3, libc::S_IFREG, 2)),
        ];
        assert!(duplicate(&types).is_some());
        let dirs = vec![
            (OsString::from("d"), st(3, libc::S_IFDIR, 2)),
            (OsString::from("e"), st(3, libc::S_IFDIR, 2)),
        ];
        assert!(duplicate(&dirs).is_some());
    }

    #[test]
    fn local_directory_is_local() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("x"), "1").unwrap();
        std::fs::create_dir(d.path().join("y")).unwrap();
        let root = sys::open_root(d.path()).unwrap();
        let dir = sys::open_dir(&root).unwrap();
        let caps = Caps::probe(&root, &dir, d.path(), "lower dir").unwrap();
        assert!(!caps.remote, "{caps:?}");
        assert!(caps.handles, "{caps:?}");
        assert_ne!(caps.fstype, "unknown");
    }
}
