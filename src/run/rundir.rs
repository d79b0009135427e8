//! The private temporary directory of one `layerfs run`
//! (`$TMPDIR/layerfs-run.XXXXXX`, mode 0700): the sandbox's staging
//! mountpoint, the readiness socket and log of a daemon it starts, and with
//! `--ephemeral` the workspace itself (upper, work and state dirs beside
//! it, mountpoint).
//!
//! A run killed with SIGKILL cannot remove its directory; its `owner`
//! file (pid and start time of the run) lets the next run of the same user
//! recognize it as stale and remove it. A `--keep` directory has no owner
//! file and is never swept.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::layer::walk::remove_path;

/// A step on the run's temporary directory that failed.
#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    #[error(
        "cannot create a temporary directory {}: {source} (set TMPDIR to a writable directory)",
        template.display()
    )]
    Create {
        template: PathBuf,
        source: nix::Error,
    },
    #[error("writing {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("creating {}: {source}", path.display())]
    Mkdir { path: PathBuf, source: io::Error },
    #[error("cannot remove {}: {source}", path.display())]
    Remove { path: PathBuf, source: io::Error },
}

pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    pub fn create() -> Result<RunDir, RunDirError> {
        sweep_stale(&std::env::temp_dir());
        let template = std::env::temp_dir().join(format!("{PREFIX}XXXXXX"));
        let path = match nix::unistd::mkdtemp(&template) {
            Ok(p) => p,
            Err(source) => return Err(RunDirError::Create { template, source }),
        };
        let dir = RunDir { path };
        let me = std::process::id();
        let owner = format!("{me} {}\n", start_time(me).unwrap_or(0));
        let owner_file = dir.path.join(OWNER);
        fs::write(&owner_file, owner).map_err(|source| RunDirError::Write {
            path: owner_file,
            source,
        })?;
        fs::create_dir(dir.stage()).map_err(|source| RunDirError::Mkdir {
            path: dir.stage(),
            source,
        })?;
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The empty directory the sandbox builds its root on.
    pub fn stage(&self) -> PathBuf {
        self.path.join("stage")
    }

    /// Where an ephemeral workspace's upper lives.
    pub fn ephemeral_upper(&self) -> PathBuf {
        self.path.join("upper")
    }

    /// An ephemeral workspace's mountpoint.
    pub fn ephemeral_mountpoint(&self) -> PathBuf {
        self.path.join("mnt")
    }

    /// The readiness socket of a daemon this run starts.
    pub fn notify_socket(&self) -> PathBuf {
        self.path.join("notify.sock")
    }

    /// The log (stderr) of a daemon this run starts.
    pub fn daemon_log(&self) -> PathBuf {
        self.path.join("daemon.log")
    }

    /// Removes everything but an ephemeral workspace's upper, work and
    /// state dirs (`--keep`).
    pub fn remove_transient(&self) -> Vec<RunDirError> {
        let mut errors = Vec::new();
        for p in [
            self.stage(),
            self.ephemeral_mountpoint(),
            self.notify_socket(),
            self.path.join(OWNER),
        ] {
            let r = match fs::symlink_metadata(&p) {
                Ok(md) if md.is_dir() => fs::remove_dir(&p),
                Ok(_) => fs::remove_file(&p),
                Err(_) => Ok(()),
            };
            if let Err(source) = r {
                errors.push(RunDirError::Remove { path: p, source });
            }
        }
        errors
    }

    /// Removes the whole directory.
    pub fn remove(self) -> Result<(), RunDirError> {
        // Fd-relative at any depth; directories the command left without
        // owner write or search permission (`chmod 0555`) are given it back.
        remove_path(&self.path).map_err(|source| RunDirError::Remove {
            path: self.path,
            source,
        })
    }
}

const PREFIX: &str = "layerfs-run.";
/// The file naming the run that owns a run dir.
const OWNER: &str = "owner";

/// Start time of process `pid` (clock ticks since boot, field 22 of
/// /proc/PID/stat): with the pid, it names one process even after pids
/// are reused.
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the run recorded in `owner` text is gone.
fn owner_gone(text: &str) -> bool {
    let mut f = text.split_whitespace();
    let (Some(pid), Some(start)) = (
        f.next().and_then(|p| p.parse::<u32>().ok()),
        f.next().and_then(|s| s.parse::<u64>().ok()),
    ) else {
        return false;
    };
    start_time(pid) != Some(start)
}

/// Removes the run dirs in `tmp` that this user's killed runs left.
fn sweep_stale(tmp: &Path) {
    let me = nix::unistd::geteuid().as_raw();
    let Ok(entries) = fs::read_dir(tmp) else {
        return;
    };
    let mounted: Vec<PathBuf> = crate::host::mounts::list()
        .map(|l| l.into_iter().map(|m| m.mount_point).collect())
        .unwrap_or_default();
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let dir = e.path();
        let Ok(md) = fs::symlink_metadata(&dir) else {
            continue;
        };
        if !md.is_dir() || md.uid() != me {
            continue;
        }
        // No owner file: kept with --keep, or a run just starting.
        let Ok(owner) = fs::read_to_string(dir.join(OWNER)) else {
            continue;
        };
        if !owner_gone(&owner) || mounted.iter().any(|m| m.starts_with(&dir)) {
            continue;
        }
        match remove_path(&dir) {
            Ok(()) => tracing::info!("removed {}, left by a killed layerfs run", dir.display()),
            Err(e) => tracing::warn!("cannot remove stale {}: {e}", dir.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_owner_is_kept_and_a_dead_one_is_gone() {
        let me = std::process::id();
        let start = start_time(me).expect("own start time");
        assert!(!owner_gone(&format!("{me} {start}")));
        assert!(owner_gone(&format!("{me} {}", start + 1)));
        assert!(!owner_gone("garbage"));
    }
}
