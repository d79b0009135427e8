//! Attaching a new FUSE connection to a mountpoint: mount(2) as root,
//! the setuid `fusermount3` helper otherwise. Finding and unmounting
//! mounts is `host::mounts`.

use std::fs::OpenOptions;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};

use nix::mount::MsFlags;

use crate::config::Config;
use crate::host::mounts::{privileged, FSTYPE, FUSERMOUNT, SOURCE};

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
