//! What the sandbox hides or freezes beyond the read-only clone of the
//! host's mounts: the kernel's global interfaces under `/proc` and `/sys`,
//! and the workspace's private directories.
//!
//! The kernel lists are Docker's defaults — moby's `MaskedPaths` and
//! `ReadonlyPaths` (daemon/pkg/oci/defaults.go), which runc applies: a
//! masked directory shows an empty read-only tmpfs, a masked file the null
//! device; a read-only path is bound on itself read-only. On top of those,
//! every other directory and every writable file at `/proc`'s top level is
//! made read-only too, so a global file a newer kernel adds there is not
//! writable from the sandbox by default. The per-process directories stay
//! writable where the kernel lets a process change itself (`oom_score_adj`,
//! `comm`, the id maps of a nested user namespace, …): they show only the
//! sandbox's own processes.
//!
//! Invariant relied on: as root these mounts are made before the init
//! enters its locking user namespace, so the kernel locks them there (no
//! unmount, no read-write remount, no non-recursive bind that would show
//! what they cover, no new proc or sysfs mount while they hide part of the
//! old one); as a user they belong to the sandbox's user namespace, in
//! which the command holds no capability.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};

use super::sys::{self, At};

/// moby's `MaskedPaths` under `/proc`.
const MASKED_PROC: [&str; 10] = [
    "acpi",
    "asound",
    "interrupts",
    "kcore",
    "keys",
    "latency_stats",
    "sched_debug",
    "scsi",
    "timer_list",
    "timer_stats",
];

/// moby's `MaskedPaths` under `/sys` (plus each CPU's `thermal_throttle`,
/// found at run time, as moby does).
const MASKED_SYS: [&str; 2] = ["devices/virtual/powercap", "firmware"];

/// moby's `ReadonlyPaths`, all under `/proc`.
const READ_ONLY_PROC: [&str; 5] = ["bus", "fs", "irq", "sys", "sysrq-trigger"];

/// Flags of every mask and read-only bind.
const LOCKED_DOWN: u64 = libc::MOUNT_ATTR_RDONLY
    | libc::MOUNT_ATTR_NOSUID
    | libc::MOUNT_ATTR_NODEV
    | libc::MOUNT_ATTR_NOEXEC;

use super::error::SandboxError;

fn mount_err(
    what: &'static str,
    target: &Path,
    e: impl Into<super::sys::SysError>,
) -> SandboxError {
    SandboxError::mount(what, target, e)
}

/// Covers `path` (if it exists): a directory with an empty read-only
/// tmpfs, anything else with a read-only bind of the host's null device.
/// Runs before the pivot, while the host's `/dev/null` is at that path.
fn mask(path: &Path) -> Result<(), SandboxError> {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return Ok(());
    };
    if meta.is_dir() {
        mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("mode=0555,size=4k"),
        )
        .map_err(|e| mount_err("masking", path, e))
    } else {
        mount(
            Some("/dev/null"),
            path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| mount_err("masking", path, e))?;
        // No `nodev` here: reading a masked file reads the null device.
        sys::set_mount_attr(
            At::Path(path),
            false,
            libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NOEXEC,
            0,
        )
        .map_err(|e| mount_err("making read-only the mask of", path, e))
    }
}

/// Binds `path` (if it exists) on itself, read-only with every mount below.
fn read_only(path: &Path) -> Result<(), SandboxError> {
    if fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    mount(
        Some(path),
        path,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| mount_err("binding", path, e))?;
    sys::set_mount_attr(At::Path(path), true, LOCKED_DOWN, 0)
        .map_err(|e| mount_err("making read-only", path, e))
}

/// Whether a top-level `/proc` entry belongs to processes (`PID`, `self`,
/// `thread-self`) rather than to the whole machine.
fn is_per_process(name: &str) -> bool {
    name == "self" || name == "thread-self" || name.bytes().all(|b| b.is_ascii_digit())
}

/// Masks and freezes the sandbox's fresh `/proc` at `proc_dir`.
pub fn protect_proc(proc_dir: &Path) -> Result<(), SandboxError> {
    for name in MASKED_PROC {
        mask(&proc_dir.join(name))?;
    }
    for name in READ_ONLY_PROC {
        read_only(&proc_dir.join(name))?;
    }
    let entries = fs::read_dir(proc_dir).map_err(|source| SandboxError::List {
        path: proc_dir.to_path_buf(),
        source,
    })?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if is_per_process(&name)
            || MASKED_PROC.contains(&name.as_ref())
            || READ_ONLY_PROC.contains(&name.as_ref())
        {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        let writable_file = meta.is_file() && meta.permissions().mode() & 0o222 != 0;
        // Symlinks (`mounts`, `net`) lead into a per-process directory.
        if meta.is_dir() || writable_file {
            read_only(&entry.path())?;
        }
    }
    Ok(())
}

/// Masks what moby masks of the sandbox's `/sys` at `sys_dir` (read-only
/// already: the host's clone, or a sysfs mounted read-only).
pub fn protect_sys(sys_dir: &Path) -> Result<(), SandboxError> {
    for rel in MASKED_SYS {
        mask(&sys_dir.join(rel))?;
    }
    let cpus = sys_dir.join("devices/system/cpu");
    if let Ok(entries) = fs::read_dir(&cpus) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let is_cpu = name
                .to_str()
                .and_then(|n| n.strip_prefix("cpu"))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
            if is_cpu {
                mask(&entry.path().join("thermal_throttle"))?;
            }
        }
    }
    Ok(())
}

/// Host directories hidden behind empty tmpfs mounts, writable until
/// `seal` so the workspace's mountpoint can be made inside one of them.
pub struct Hidden {
    mounts: Vec<PathBuf>,
}

/// Hides each of `dirs` (absolute host paths, the workspace's upper, work
/// and state directories and the run's temporary directory) under the new
/// root at `stage`: the command can neither read them past the policy nor
/// reach the daemon's control socket in them. A directory already hidden
/// by another, or not visible in the sandbox at all (under `/tmp`), is
/// skipped.
pub fn hide(stage: &Path, dirs: &[PathBuf]) -> Result<Hidden, SandboxError> {
    // The host's view is still at "/": resolve symlinks there, so each
    // path names what the clone shows under the stage.
    let mut canon: Vec<PathBuf> = dirs
        .iter()
        .filter_map(|d| fs::canonicalize(d).ok())
        .filter(|d| d.parent().is_some())
        .collect();
    canon.sort_by_key(|d| d.components().count());
    canon.dedup();
    let mut hidden = Hidden { mounts: Vec::new() };
    let mut done: Vec<PathBuf> = Vec::new();
    for d in canon {
        if done.iter().any(|h| d.starts_with(h)) {
            continue;
        }
        let target = super::places::inside(stage, &d);
        if !fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        mount(
            Some("tmpfs"),
            &target,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("mode=0755,size=64k"),
        )
        .map_err(|e| mount_err("hiding", &d, e))?;
        hidden.mounts.push(target);
        done.push(d);
    }
    Ok(hidden)
}

impl Hidden {
    /// Makes every hiding tmpfs read-only (the mounts inside them keep
    /// their own flags).
    pub fn seal(self) -> Result<(), SandboxError> {
        for m in &self.mounts {
            sys::set_mount_attr(At::Path(m), false, LOCKED_DOWN, 0)
                .map_err(|e| mount_err("making read-only", m, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_process_entries_are_told_from_global_ones() {
        for n in ["1", "4242", "self", "thread-self"] {
            assert!(is_per_process(n), "{n}");
        }
        for n in ["sys", "mtrr", "pressure", "1a", "net"] {
            assert!(!is_per_process(n), "{n}");
        }
    }
}
