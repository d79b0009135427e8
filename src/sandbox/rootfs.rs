//! The sandbox's file tree, built in its private mount namespace and then
//! made its root with `pivot_root`:
//!
//! - `/`: a recursive clone of the host's whole mount tree, every mount of
//!   it read-only, `nosuid` and `nodev` (`mount_setattr(AT_RECURSIVE)`,
//!   one call for every submount, where `MS_REMOUNT|MS_RDONLY` would need a
//!   remount per submount and miss hidden ones);
//! - the workspace: its own clone, attached at the same absolute path it
//!   has outside, writable — the only writable place of the host;
//! - `/tmp`: a private tmpfs, gone with the sandbox;
//! - `/dev`: see `devices`; `/proc`: a new proc of the sandbox's pid
//!   namespace; with `--no-network`, `/sys`: a new sysfs of its network
//!   namespace (so `/sys/class/net` shows loopback only).
//!
//! Both clones are taken before anything is mounted over the host's paths
//! (the workspace may live under `/tmp`). The host's old root is detached
//! after the pivot, so no path leads back to it.

use std::fs;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::devices;
use super::sys::{self, At};

/// What the tree is built from.
pub struct Layout<'a> {
    /// The workspace mountpoint (absolute), shown at the same path inside.
    pub workspace: &'a Path,
    /// An empty directory of the host to build the new root on.
    pub stage: &'a Path,
    /// Mount a sysfs of the sandbox's own network namespace.
    pub fresh_sysfs: bool,
}

/// `path` (absolute) under the new root at `stage`.
fn inside(stage: &Path, path: &Path) -> PathBuf {
    stage.join(path.strip_prefix("/").unwrap_or(path))
}

fn new_api_error(what: &str, e: std::io::Error) -> String {
    if e.raw_os_error() == Some(libc::ENOSYS) {
        format!(
            "{what}: this kernel lacks the mount API the sandbox needs (open_tree, \
             move_mount, mount_setattr: Linux 5.12 or later)"
        )
    } else {
        format!("{what}: {e}")
    }
}

/// Builds the tree and pivots into it. Runs in the sandbox's init, which
/// holds `CAP_SYS_ADMIN` over the new mount namespace and is pid 1 of the
/// new pid namespace (a proc mount shows the pid namespace of its mounter).
pub fn build(l: &Layout<'_>) -> Result<(), String> {
    // Nothing done here may propagate back to the host's mounts.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("making the sandbox's mounts private: {e}"))?;

    let root = sys::clone_tree(Path::new("/"))
        .map_err(|e| new_api_error("cloning the host's mount tree", e))?;
    sys::set_mount_attr(
        At::Fd(root.as_fd()),
        true,
        libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
        0,
    )
    .map_err(|e| new_api_error("making the host's mounts read-only", e))?;
    let ws = sys::clone_tree(l.workspace).map_err(|e| {
        new_api_error(
            &format!("cloning the workspace {}", l.workspace.display()),
            e,
        )
    })?;

    sys::attach(root.as_fd(), l.stage).map_err(|e| {
        new_api_error(
            &format!("attaching the new root on {}", l.stage.display()),
            e,
        )
    })?;

    let tmp = inside(l.stage, Path::new("/tmp"));
    mount(
        Some("tmpfs"),
        &tmp,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777"),
    )
    .map_err(|e| format!("mounting a private /tmp: {e}"))?;

    devices::populate(&inside(l.stage, Path::new("/dev")))?;

    let proc_dir = inside(l.stage, Path::new("/proc"));
    mount(
        Some("proc"),
        &proc_dir,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| format!("mounting /proc for the sandbox's pid namespace: {e}"))?;

    if l.fresh_sysfs {
        let sys_dir = inside(l.stage, Path::new("/sys"));
        mount(
            Some("sysfs"),
            &sys_dir,
            Some("sysfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .map_err(|e| format!("mounting /sys for the sandbox's network namespace: {e}"))?;
    }

    // Last, so nothing mounted above (a /tmp holding it) covers it.
    let target = inside(l.stage, l.workspace);
    fs::create_dir_all(&target).map_err(|e| {
        format!(
            "cannot place the workspace at {} inside the sandbox: {e}",
            l.workspace.display()
        )
    })?;
    sys::attach(ws.as_fd(), &target).map_err(|e| {
        new_api_error(
            &format!("attaching the workspace at {}", l.workspace.display()),
            e,
        )
    })?;

    pivot(l.stage)
}

/// Makes `stage` the root and detaches the old one.
fn pivot(stage: &Path) -> Result<(), String> {
    nix::unistd::chdir(stage).map_err(|e| format!("chdir {}: {e}", stage.display()))?;
    // pivot_root(".", "."): the old root ends up stacked on the new one at
    // "/", and unmounting "." takes it away.
    nix::unistd::pivot_root(".", ".").map_err(|e| format!("pivot_root into the sandbox: {e}"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| format!("detaching the host's root: {e}"))?;
    nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))
}
