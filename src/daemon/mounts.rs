//! Attaching a new FUSE connection to a mountpoint: mount(2) as root,
//! the setuid `fusermount3` helper otherwise. Finding and unmounting
//! mounts is `host::mounts`.

use std::fs::OpenOptions;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use nix::mount::MsFlags;

use crate::config::Config;
use crate::host::mounts::{privileged, FSTYPE, FUSERMOUNT, SOURCE};

/// Why a new FUSE connection could not be attached to the mountpoint.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("open /dev/fuse: {0}")]
    OpenFuse(#[source] io::Error),
    #[error("mount {} ({}): {source}", mountpoint.display(), FSTYPE)]
    Mount {
        mountpoint: PathBuf,
        source: nix::Error,
    },
    #[error("socketpair for {FUSERMOUNT}: {0}")]
    Socketpair(#[source] io::Error),
    #[error("{FUSERMOUNT} not found: install fuse3 (apt-get install fuse3) or run as root")]
    NoFusermount,
    #[error("cannot run {FUSERMOUNT}: {0}")]
    Spawn(#[source] io::Error),
    #[error("waiting for {FUSERMOUNT}: {0}")]
    Wait(#[source] io::Error),
    /// The helper did not mount: its exit status and what it said.
    #[error(
        "{} failed to mount {} ({status}): {stderr}",
        FUSERMOUNT,
        mountpoint.display()
    )]
    Refused {
        mountpoint: PathBuf,
        status: std::process::ExitStatus,
        stderr: String,
    },
    /// The helper's descriptor did not arrive; with what it said.
    #[error("receiving /dev/fuse from {}: {source}; {stderr}", FUSERMOUNT)]
    Receive { source: io::Error, stderr: String },
}

/// Attaches a new FUSE connection to `cfg.mountpoint` and returns the
/// /dev/fuse descriptor to serve it on. The kernel queues FUSE_INIT at once;
/// the mount answers requests only after the session's handshake.
pub fn mount_fuse(cfg: &Config) -> Result<OwnedFd, MountError> {
    if privileged() {
        mount_privileged(cfg)
    } else {
        mount_with_fusermount(cfg)
    }
}

fn mount_privileged(cfg: &Config) -> Result<OwnedFd, MountError> {
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")
        .map_err(MountError::OpenFuse)?;
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
    .map_err(|source| MountError::Mount {
        mountpoint: cfg.mountpoint.clone(),
        source,
    })?;
    Ok(fd)
}

/// Unprivileged mount: `fusermount3` opens /dev/fuse, mounts it, and hands
/// the descriptor back over the socket named by `_FUSE_COMMFD`.
fn mount_with_fusermount(cfg: &Config) -> Result<OwnedFd, MountError> {
    let (ours, theirs) = UnixStream::pair().map_err(MountError::Socketpair)?;
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
        io::ErrorKind::NotFound => MountError::NoFusermount,
        _ => MountError::Spawn(e),
    })?;
    drop(theirs);
    let received = crate::sys::receive_fd(ours.as_fd());
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    let status = child.wait().map_err(MountError::Wait)?;
    let stderr = stderr.trim().to_string();
    match received {
        Ok(Some(fd)) if status.success() => Ok(fd),
        Ok(Some(_)) | Ok(None) => Err(MountError::Refused {
            mountpoint: cfg.mountpoint.clone(),
            status,
            stderr,
        }),
        Err(source) => Err(MountError::Receive { source, stderr }),
    }
}
