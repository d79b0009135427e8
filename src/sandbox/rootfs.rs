//! The sandbox's file tree, built in its private mount namespace and then
//! made its root with `pivot_root`:
//!
//! - `/`: a recursive clone of the host's whole mount tree, every mount of
//!   it read-only, `nosuid` and `nodev` (`mount_setattr(AT_RECURSIVE)`,
//!   one call for every submount, where `MS_REMOUNT|MS_RDONLY` would need a
//!   remount per submount and miss hidden ones);
//! - the workspace: its own clone, attached at `--at` (`/workspace` by
//!   default; made where the host has no such directory, see `places`),
//!   writable — the only writable place of the host. Its host mountpoint
//!   is hidden like the private directories below, so the command never
//!   sees the host's name for it;
//! - `/tmp`, `/dev/shm` and `/run` (and `/var/run` where it is a directory
//!   of its own): directories of one private tmpfs of `--tmp-size`, so
//!   together they hold at most that much, gone with the sandbox. `/run`
//!   hides the host's service sockets (D-Bus, systemd, Docker,
//!   `/run/user/UID`); a `/etc/resolv.conf` that points into it stays
//!   readable;
//! - `/dev`: see `devices`; `/proc`: a new proc of the sandbox's pid
//!   namespace; with `--no-network`, `/sys`: a new sysfs of its network
//!   namespace (so `/sys/class/net` shows loopback only); the kernel's
//!   global files in both masked or read-only (see `masks`);
//! - `--bind`/`--ro-bind` host paths and the private home (`binds`);
//! - the workspace's upper, work and state directories and the run's
//!   temporary directory: hidden behind empty read-only tmpfs mounts.
//!
//! Both clones are taken before anything is mounted over the host's paths
//! (the workspace may live under `/tmp`). The host's old root is detached
//! after the pivot, so no path leads back to it.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::binds::{self, Bind};
use super::error::SandboxError;
use super::places::{inside, Kind, Places};
use super::sys::{self, At};
use super::{devices, masks};

/// What the tree is built from.
pub struct Layout<'a> {
    /// The workspace mountpoint on the host (absolute).
    pub workspace: &'a Path,
    /// Where the command sees the workspace (checked by `places::check`).
    pub at: &'a Path,
    /// An empty directory of the host to build the new root on.
    pub stage: &'a Path,
    /// Mount a sysfs of the sandbox's own network namespace.
    pub fresh_sysfs: bool,
    /// Bytes the private tmpfs behind `/tmp`, `/dev/shm` and `/run` holds.
    pub tmp_size: u64,
    /// Host directories the command must not see.
    pub hide: &'a [PathBuf],
    /// Checked host paths to bind in.
    pub binds: &'a [Bind],
    /// Mount a private home directory (of the private tmpfs) at
    /// `binds::HOME`.
    pub private_home: bool,
}

/// Builds the tree and pivots into it. Runs in the sandbox's init, which
/// holds `CAP_SYS_ADMIN` over the new mount namespace and is pid 1 of the
/// new pid namespace (a proc mount shows the pid namespace of its mounter).
///
/// Long on purpose: the mounts must happen in this order (private, clone,
/// read-only, scratch, /dev, /proc, /sys, hiding, binds, the workspace,
/// seal, pivot) and each step says why it comes where it does.
pub fn build(l: &Layout<'_>) -> Result<(), SandboxError> {
    // Nothing done here may propagate back to the host's mounts.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(SandboxError::Private)?;

    let root = sys::clone_tree(Path::new("/"))
        .map_err(|e| SandboxError::mount_api("cloning the host's mount tree", e))?;
    sys::set_mount_attr(
        At::Fd(root.as_fd()),
        true,
        libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
        0,
    )
    .map_err(|e| SandboxError::mount_api("making the host's mounts read-only", e))?;
    let ws = sys::clone_tree(l.workspace).map_err(|e| {
        SandboxError::mount_api(
            format!("cloning the workspace {}", l.workspace.display()),
            e,
        )
    })?;
    // Facts about the host's /run, read before anything covers it.
    let var_run_is_dir = fs::symlink_metadata("/var/run").is_ok_and(|m| m.is_dir());
    let resolv = fs::canonicalize("/etc/resolv.conf")
        .ok()
        .filter(|p| under_run(p));
    let mut scratch = Scratch::create(l.stage, l.tmp_size, var_run_is_dir, l.private_home)?;

    sys::attach(root.as_fd(), l.stage).map_err(|e| {
        SandboxError::mount_api(
            format!("attaching the new root on {}", l.stage.display()),
            e,
        )
    })?;
    // The DNS configuration /run is about to hide, as the read-only clone
    // shows it.
    let resolv = match resolv {
        Some(p) => Some((
            sys::clone_tree(&inside(l.stage, &p))
                .map_err(|e| SandboxError::mount_api(format!("keeping {}", p.display()), e))?,
            p,
        )),
        None => None,
    };

    attach_dir(scratch.tmp, &inside(l.stage, Path::new("/tmp")), "/tmp")?;
    let run_dir = inside(l.stage, Path::new("/run"));
    if run_dir.is_dir() {
        attach_dir(scratch.run, &run_dir, "/run")?;
    }
    if let Some(var_run) = scratch.var_run {
        attach_dir(var_run, &inside(l.stage, Path::new("/var/run")), "/var/run")?;
    }
    if let Some((file, path)) = resolv {
        show_file(file, &inside(l.stage, &path))
            .map_err(|source| SandboxError::KeepReadable { path, source })?;
    }

    devices::populate(&inside(l.stage, Path::new("/dev")), scratch.shm)?;

    let proc_dir = inside(l.stage, Path::new("/proc"));
    mount(
        Some("proc"),
        &proc_dir,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(SandboxError::Proc)?;
    masks::protect_proc(&proc_dir)?;

    let sys_dir = inside(l.stage, Path::new("/sys"));
    if l.fresh_sysfs {
        mount(
            Some("sysfs"),
            &sys_dir,
            Some("sysfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .map_err(SandboxError::Sysfs)?;
    }
    masks::protect_sys(&sys_dir)?;

    let mut hide = l.hide.to_vec();
    hide.push(l.workspace.to_path_buf());
    let hidden = masks::hide(l.stage, &hide)?;

    // Last, so nothing mounted above (a /tmp holding it) covers it; inside
    // a hidden directory its place is made in the hiding tmpfs before that
    // is sealed.
    let mut places = Places::default();
    if let Some(home) = scratch.home.take() {
        binds::attach_private_home(l.stage, &mut places, home)?;
    }
    binds::attach(l.stage, &mut places, l.binds)?;
    let target =
        places
            .ensure(l.stage, l.at, Kind::Dir)
            .map_err(|source| SandboxError::PlaceWorkspace {
                at: l.at.to_path_buf(),
                source,
            })?;
    sys::attach(ws.as_fd(), &target).map_err(|e| {
        SandboxError::mount_api(format!("attaching the workspace at {}", l.at.display()), e)
    })?;
    hidden.seal()?;
    places.seal()?;

    pivot(l.stage)
}

/// Whether a host path lies in `/run` or `/var/run`, which the sandbox
/// replaces.
fn under_run(p: &Path) -> bool {
    p.starts_with("/run") || p.starts_with("/var/run")
}

/// The private tmpfs behind `/tmp`, `/dev/shm` and `/run`: one superblock,
/// so `--tmp-size` bounds them together, each a detached bind of one of
/// its directories.
struct Scratch {
    tmp: OwnedFd,
    shm: OwnedFd,
    run: OwnedFd,
    var_run: Option<OwnedFd>,
    /// The private home directory, when asked for.
    home: Option<OwnedFd>,
}

impl Scratch {
    /// Mounts the tmpfs on `stage` (still empty), makes its directories,
    /// clones them and detaches the tmpfs again.
    fn create(stage: &Path, size: u64, var_run: bool, home: bool) -> Result<Scratch, SandboxError> {
        // Inodes cost kernel memory that `size` does not count: one per
        // 8 KiB of the budget, and never fewer than a small tree needs.
        let inodes = (size / 8192).max(16_384);
        mount(
            Some("tmpfs"),
            stage,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(format!("mode=0755,size={size},nr_inodes={inodes}").as_str()),
        )
        .map_err(|source| SandboxError::Tmpfs { size, source })?;
        let made = (|| {
            let dir = |name: &str, mode: u32| -> Result<OwnedFd, SandboxError> {
                let p = stage.join(name);
                fs::create_dir(&p).map_err(|source| SandboxError::Create {
                    path: p.clone(),
                    source,
                })?;
                fs::set_permissions(&p, fs::Permissions::from_mode(mode)).map_err(|source| {
                    SandboxError::Chmod {
                        path: p.clone(),
                        source,
                    }
                })?;
                sys::clone_tree(&p)
                    .map_err(|e| SandboxError::mount_api(format!("binding {name}"), e))
            };
            let run = dir("run", 0o755)?;
            let var_run = if var_run {
                Some(
                    sys::clone_tree(&stage.join("run"))
                        .map_err(|e| SandboxError::mount_api("binding /var/run", e))?,
                )
            } else {
                None
            };
            Ok(Scratch {
                tmp: dir("tmp", 0o1777)?,
                shm: dir("shm", 0o1777)?,
                run,
                var_run,
                home: if home {
                    Some(dir("home", 0o700)?)
                } else {
                    None
                },
            })
        })();
        umount2(stage, MntFlags::MNT_DETACH).map_err(|source| SandboxError::DetachTmpfs {
            stage: stage.to_path_buf(),
            source,
        })?;
        made
    }
}

/// Attaches a detached directory mount on `target` (an existing directory).
fn attach_dir(tree: OwnedFd, target: &Path, shown: &str) -> Result<(), SandboxError> {
    sys::attach(tree.as_fd(), target)
        .map_err(|e| SandboxError::mount_api(format!("mounting the private {shown}"), e))
}

/// Attaches a detached file mount at `target`, creating its parents and an
/// empty file to mount on.
fn show_file(file: OwnedFd, target: &Path) -> std::io::Result<()> {
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::File::create(target)?;
    sys::attach(file.as_fd(), target)
}

/// Makes `stage` the root and detaches the old one.
fn pivot(stage: &Path) -> Result<(), SandboxError> {
    let chdir = |path: &Path| {
        nix::unistd::chdir(path).map_err(|source| SandboxError::Chdir {
            path: path.to_path_buf(),
            source,
        })
    };
    chdir(stage)?;
    // pivot_root(".", "."): the old root ends up stacked on the new one at
    // "/", and unmounting "." takes it away.
    nix::unistd::pivot_root(".", ".").map_err(SandboxError::PivotRoot)?;
    umount2(".", MntFlags::MNT_DETACH).map_err(SandboxError::DetachHostRoot)?;
    chdir(Path::new("/"))
}
