//! The sandbox's `/dev`: a small read-only tmpfs holding only the device
//! nodes programs expect (each a bind of the host's node), a private
//! `devpts` instance for pseudo-terminals (the command's terminal comes
//! from it, see `terminal`) and a private `/dev/shm` (a directory of the
//! sandbox's private tmpfs, see `rootfs`).
//!
//! The host's `/dev` is not shown: as root, raw disks there would be
//! writable however read-only the mounts above them are.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::symlink;
use std::path::Path;

use nix::mount::{mount, MsFlags};

use super::error::SandboxError;
use super::sys::SysError;
use super::sys::{self, At};

/// Host device nodes bound into the sandbox (skipped if the host lacks one).
const NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// Links every Linux system has in `/dev`.
const LINKS: [(&str, &str); 5] = [
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("ptmx", "pts/ptmx"),
];

fn mount_err(fs: &'static str, target: &Path, e: impl Into<SysError>) -> SandboxError {
    SandboxError::MountOn {
        fs,
        path: target.to_path_buf(),
        source: e.into(),
    }
}

fn create_err(path: &Path) -> impl FnOnce(std::io::Error) -> SandboxError + '_ {
    move |source| SandboxError::Create {
        path: path.to_path_buf(),
        source,
    }
}

fn read_only_err(path: &Path) -> impl FnOnce(std::io::Error) -> SandboxError + '_ {
    move |source| SandboxError::ReadOnly {
        path: path.to_path_buf(),
        source,
    }
}

/// Builds the sandbox's `/dev` at `dev` (the new root's `/dev`), while the
/// host's `/dev` is still reachable at `/dev`; `shm` is the detached
/// directory mount to show at `/dev/shm`.
pub fn populate(dev: &Path, shm: OwnedFd) -> Result<(), SandboxError> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC | MsFlags::MS_NODEV;
    mount(Some("tmpfs"), dev, Some("tmpfs"), flags, Some("mode=0755"))
        .map_err(|e| mount_err("a tmpfs", dev, e))?;
    for name in NODES {
        let host = Path::new("/dev").join(name);
        if fs::symlink_metadata(&host).is_err() {
            continue;
        }
        let node = dev.join(name);
        fs::File::create(&node).map_err(create_err(&node))?;
        mount(
            Some(&host),
            &node,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|source| SandboxError::BindNode {
            host: host.clone(),
            path: node.clone(),
            source,
        })?;
        sys::set_mount_attr(
            At::Path(&node),
            false,
            libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NOEXEC,
            0,
        )
        .map_err(read_only_err(&node))?;
    }
    let pts = dev.join("pts");
    fs::create_dir(&pts).map_err(create_err(&pts))?;
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(|e| mount_err("devpts", &pts, e))?;
    let shm_dir = dev.join("shm");
    fs::create_dir(&shm_dir).map_err(create_err(&shm_dir))?;
    sys::attach(shm.as_fd(), &shm_dir).map_err(|e| mount_err("a tmpfs", &shm_dir, e))?;
    for (name, target) in LINKS {
        let link = dev.join(name);
        symlink(target, &link).map_err(create_err(&link))?;
    }
    // Nothing may be created in /dev itself from now on; the mounts in it
    // (pts, shm, the nodes) keep their own flags.
    sys::set_mount_attr(At::Path(dev), false, libc::MOUNT_ATTR_RDONLY, 0)
        .map_err(read_only_err(dev))
}
