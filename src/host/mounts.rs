//! The kernel's mount table as layerfs reads and changes it: finding
//! mounts in /proc/self/mountinfo and unmounting (umount2(2) as root, the
//! setuid `fusermount3` helper otherwise). Attaching a new FUSE mount is
//! the daemon's (`daemon::mounts`).

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::mount::MntFlags;

/// Filesystem type of a layerfs mount as /proc/self/mountinfo shows it.
pub const FSTYPE: &str = "fuse.layerfs";
/// Mount source (`fsname`) of a layerfs mount.
pub const SOURCE: &str = "layerfs";
/// The setuid helper that mounts FUSE filesystems for unprivileged users.
pub const FUSERMOUNT: &str = "fusermount3";

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone)]
pub struct MountEntry {
    /// The device number of its superblock (`major:minor`), as `stat`
    /// gives it for files on the mount: for FUSE, the connection's.
    pub dev: (u32, u32),
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
    pub super_options: String,
}

impl MountEntry {
    pub fn is_layerfs(&self) -> bool {
        self.fstype == FSTYPE
    }

    /// A layerfs mount whose daemon is gone: it answers `ENOTCONN`, or
    /// `ECONNABORTED` while the kernel is still tearing the connection
    /// down. This stats the mountpoint: on a live mount whose daemon is
    /// stopped that waits for the daemon, so callers ask only when no
    /// live daemon is registered for it.
    pub fn is_stale(&self) -> bool {
        self.is_layerfs()
            && matches!(
                fs::metadata(&self.mount_point)
                    .err()
                    .and_then(|e| e.raw_os_error()),
                Some(libc::ENOTCONN | libc::ECONNABORTED)
            )
    }

    /// The uid that mounted a FUSE filesystem (`user_id=` option).
    pub fn owner_uid(&self) -> Option<u32> {
        self.super_options
            .split(',')
            .find_map(|o| o.strip_prefix("user_id="))
            .and_then(|v| v.parse().ok())
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space, …).
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn parse_line(line: &str) -> Option<MountEntry> {
    let fields: Vec<&str> = line.split(' ').collect();
    let sep = fields.iter().position(|f| *f == "-")?;
    let mount_point = PathBuf::from(std::ffi::OsStr::from_bytes(&unescape(fields.get(4)?)));
    let (major, minor) = fields.get(2)?.split_once(':')?;
    Some(MountEntry {
        dev: (major.parse().ok()?, minor.parse().ok()?),
        mount_point,
        fstype: fields.get(sep + 1)?.to_string(),
        source: String::from_utf8_lossy(&unescape(fields.get(sep + 2)?)).into_owned(),
        super_options: fields.get(sep + 3).unwrap_or(&"").to_string(),
    })
}

/// Every mount this process can see, in mount order.
pub fn list() -> io::Result<Vec<MountEntry>> {
    let text = fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text.lines().filter_map(parse_line).collect())
}

/// The topmost mount whose mountpoint is exactly `path` (absolute).
pub fn find(path: &Path) -> Option<MountEntry> {
    list()
        .ok()?
        .into_iter()
        .rev()
        .find(|m| m.mount_point == path)
}

/// Whether this process mounts with mount(2) itself (root) or through
/// `fusermount3`.
pub fn privileged() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Unmounts `path`: umount2(2) as root, `fusermount3 -u` otherwise.
/// `lazy` detaches it even while files are open (MNT_DETACH / `-z`).
pub fn unmount(path: &Path, lazy: bool) -> io::Result<()> {
    if privileged() {
        let flags = if lazy {
            MntFlags::MNT_DETACH
        } else {
            MntFlags::empty()
        };
        nix::mount::umount2(path, flags).map_err(io::Error::from)
    } else {
        let mut cmd = Command::new(FUSERMOUNT);
        cmd.arg("-u").arg("-q");
        if lazy {
            cmd.arg("-z");
        }
        let out = cmd
            .arg("--")
            .arg(path)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run {FUSERMOUNT}: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
            let kind = if msg.contains("busy") {
                io::ErrorKind::ResourceBusy
            } else {
                io::ErrorKind::Other
            };
            Err(io::Error::new(kind, format!("{FUSERMOUNT} -u: {msg}")))
        }
    }
}

/// Detaches `path` even if it is busy or its daemon is gone.
pub fn detach(path: &Path) -> io::Result<()> {
    unmount(path, true)
}

/// Unmounts `path`, falling back to a lazy detach when it is busy.
pub fn unmount_or_detach(path: &Path) -> io::Result<()> {
    match unmount(path, false) {
        Err(e)
            if e.raw_os_error() == Some(libc::EBUSY) || e.kind() == io::ErrorKind::ResourceBusy =>
        {
            tracing::warn!("{}: busy, detaching lazily", path.display());
            detach(path)
        }
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_lines() {
        let l = "52 30 0:48 / /tmp/a\\040b rw,nosuid,nodev,relatime shared:1 - fuse.layerfs layerfs rw,user_id=0,group_id=0,default_permissions";
        let m = parse_line(l).unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/tmp/a b"));
        assert!(m.is_layerfs());
        assert_eq!(m.source, "layerfs");
        assert_eq!(m.owner_uid(), Some(0));
        assert_eq!(m.dev, (0, 48));
    }
}
