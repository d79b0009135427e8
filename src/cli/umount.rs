//! `layerfs umount`: unmount a layerfs mountpoint and wait until the daemon
//! that served it has exited.

use super::exit::{CliError, Context};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;

use crate::config;
use crate::host::{mounts, pidfile};

const UMOUNT_HELP: &str = "\
Examples:
  layerfs umount /ws/mnt
  layerfs umount --lazy /ws/mnt      # detach now even if files are open

Fails if MOUNTPOINT is not a layerfs mount, or is busy (a process has a file
open or its working directory there) unless --lazy is given.";

#[derive(Args, Debug)]
#[command(after_help = UMOUNT_HELP)]
pub struct UmountCmd {
    /// Detach the mount even while it is busy; the daemon exits once the
    /// last open file is closed.
    #[arg(short, long)]
    lazy: bool,

    /// How long to wait for the daemon to exit.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = config::parse_duration)]
    timeout: Duration,

    /// The mountpoint to unmount.
    #[arg(value_name = "MOUNTPOINT")]
    mountpoint: PathBuf,
}

/// The absolute mountpoint path as mountinfo spells it. Canonicalizes the
/// parent only, so a disconnected mount (ENOTCONN) still resolves.
fn mountpoint_path(p: &Path) -> io::Result<PathBuf> {
    let abs = std::path::absolute(p)?;
    match std::fs::canonicalize(&abs) {
        Ok(c) => Ok(c),
        Err(_) => match (abs.parent(), abs.file_name()) {
            (Some(parent), Some(name)) => Ok(std::fs::canonicalize(parent)?.join(name)),
            _ => Ok(abs),
        },
    }
}

impl UmountCmd {
    pub fn run(self) -> Result<(), CliError> {
        self.unmount().or_fail("umount")
    }

    fn unmount(&self) -> Result<(), String> {
        let mnt = mountpoint_path(&self.mountpoint)
            .map_err(|e| format!("{}: {e}", self.mountpoint.display()))?;
        let entry =
            mounts::find(&mnt).ok_or_else(|| format!("{} is not mounted", mnt.display()))?;
        if !entry.is_layerfs() {
            return Err(format!(
                "{} is a {} mount, not layerfs; use umount(8)",
                mnt.display(),
                entry.fstype
            ));
        }
        let pid = pidfile::find_daemon(&mnt, entry.owner_uid());
        mounts::unmount(&mnt, self.lazy).map_err(|e| {
            if e.raw_os_error() == Some(libc::EBUSY) || e.kind() == io::ErrorKind::ResourceBusy {
                format!(
                    "{} is busy: a process has a file open or its working directory there; \
                     close them, or use `layerfs umount --lazy`",
                    mnt.display()
                )
            } else {
                format!("unmounting {}: {e}", mnt.display())
            }
        })?;
        let Some(pid) = pid else {
            tracing::debug!(
                "no pid file for {}; not waiting for a daemon",
                mnt.display()
            );
            return Ok(());
        };
        let deadline = Instant::now() + self.timeout;
        while pidfile::is_daemon_alive(pid) {
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} is unmounted, but its daemon (pid {pid}) is still running after {:?}{}",
                    mnt.display(),
                    self.timeout,
                    if self.lazy {
                        " (files are still open on the detached mount)"
                    } else {
                        ""
                    }
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}
