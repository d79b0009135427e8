//! The kernel side of a layerfs mount: finding mounts in
//! /proc/self/mountinfo, attaching /dev/fuse to the mountpoint (mount(2) as
//! root, the setuid `fusermount3` helper otherwise) and unmounting.

use std::fs::{self, OpenOptions};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::mount::{MntFlags, MsFlags};

use crate::config::Config;

/// Filesystem type of a layerfs mount as /proc/self/mountinfo shows it.
pub const FSTYPE: &str = "fuse.layerfs";
/// Mount source (`fsname`) of a layerfs mount.
pub const SOURCE: &str = "layerfs";
/// The setuid helper that mounts FUSE filesystems for unprivileged users.
const FUSERMOUNT: &str = "fusermount3";

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
    pub super_options: String,
}

impl MountEntry {
    pub fn is_layerfs(&self) -> bool {
        self.fstype == FSTYPE
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
    Some(MountEntry {
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

/// Attaches a new FUSE connection to `cfg.mountpoint` and returns the
/// /dev/fuse descriptor to serve it on. The kernel queues FUSE_INIT at once;
/// the mount answers requests only after the session's handshake.
pub fn mount_fuse(cfg: &Config) -> Result<OwnedFd, String> {
    if privileged() {
        mount_privileged(cfg)
    } else {
        mount_with_fusermount(cfg)
    }
}

fn mount_privileged(cfg: &Config) -> Result<OwnedFd, String> {
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")
        .map_err(|e| format!("open /dev/fuse: {e}"))?;
    let fd = OwnedFd::from(dev);
    let mut data = format!(
        "fd={},rootmode=40000,user_id={},group_id={},default_permissions",
        fd.as_raw_fd(),
        nix::unistd::geteuid(),
        nix::unistd::getegid()
    );
    if cfg.allow_other {
        data.push_str(",allow_other");
    }
    // Layer devices and setuid bits are not served through the mount.
    let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if cfg.read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    if cfg.no_exec {
        flags |= MsFlags::MS_NOEXEC;
    }
    nix::mount::mount(
        Some(SOURCE),
        &cfg.mountpoint,
        Some(FSTYPE),
        flags,
        Some(data.as_str()),
    )
    .map_err(|e| format!("mount {} ({FSTYPE}): {e}", cfg.mountpoint.display()))?;
    Ok(fd)
}

/// Unprivileged mount: `fusermount3` opens /dev/fuse, mounts it, and hands
/// the descriptor back over the socket named by `_FUSE_COMMFD`.
fn mount_with_fusermount(cfg: &Config) -> Result<OwnedFd, String> {
    let (ours, theirs) =
        UnixStream::pair().map_err(|e| format!("socketpair for {FUSERMOUNT}: {e}"))?;
    let mut opts = format!("fsname={SOURCE},subtype=layerfs,default_permissions");
    if cfg.allow_other {
        opts.push_str(",allow_other");
    }
    if cfg.read_only {
        opts.push_str(",ro");
    }
    if cfg.no_exec {
        opts.push_str(",noexec");
    }
    let their_fd = theirs.as_raw_fd();
    let mut cmd = Command::new(FUSERMOUNT);
    cmd.arg("-o")
        .arg(&opts)
        .arg("--")
        .arg(&cfg.mountpoint)
        .env("_FUSE_COMMFD", their_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // The helper's end of the socket stays open across its exec.
    crate::sys::ExecSetup::new().keep(their_fd).apply(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => {
            format!("{FUSERMOUNT} not found: install fuse3 (apt-get install fuse3) or run as root")
        }
        _ => format!("cannot run {FUSERMOUNT}: {e}"),
    })?;
    drop(theirs);
    let received = crate::sys::receive_fd(ours.as_fd());
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for {FUSERMOUNT}: {e}"))?;
    match received {
        Ok(Some(fd)) if status.success() => Ok(fd),
        Ok(Some(_)) | Ok(None) => Err(format!(
            "{FUSERMOUNT} failed to mount {} ({status}): {}",
            cfg.mountpoint.display(),
            stderr.trim()
        )),
        Err(e) => Err(format!(
            "receiving /dev/fuse from {FUSERMOUNT}: {e}; {}",
            stderr.trim()
        )),
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
    }
}
