//! `layerfs mount --instance NAME`: the workspace of a user (`alice`) or of
//! one of their sessions (`alice@s42`) under configurable roots, as the
//! systemd template unit mounts it (`config::instance` owns the scheme and
//! the checks on NAME). The directories are created if missing.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use clap::Args;

use crate::config::instance::Instance;
use crate::config::{ConfigError, MountArgs};

#[derive(Args, Debug)]
pub struct InstanceArgs {
    /// Mount the workspace of USER or USER@SESSION: upper, work and state
    /// under --upper-root/USER[/sessions/SESSION]/, the mountpoint at
    /// --mount-root/USER[/sessions/SESSION]/mnt (created if missing).
    /// USER and SESSION: 1-64 of A-Z a-z 0-9 . _ -, not starting with . or -.
    #[arg(
        long,
        value_name = "NAME",
        conflicts_with_all = ["upper", "work", "state", "mountpoint"]
    )]
    pub instance: Option<String>,

    /// Root of the instances' uppers, work and state dirs (with --instance)
    /// [default: /var/lib/layerfs].
    #[arg(long, value_name = "DIR")]
    pub upper_root: Option<PathBuf>,

    /// Root of the instances' mountpoints (with --instance)
    /// [default: /run/layerfs].
    #[arg(long, value_name = "DIR")]
    pub mount_root: Option<PathBuf>,
}

/// Default of --upper-root.
pub const DEFAULT_UPPER_ROOT: &str = "/var/lib/layerfs";
/// Default of --mount-root.
pub const DEFAULT_MOUNT_ROOT: &str = "/run/layerfs";

impl InstanceArgs {
    /// Fills in the instance's directories (creating them); without
    /// --instance, leaves `args` as it is.
    pub fn apply(&self, args: &mut MountArgs) -> Result<(), ConfigError> {
        let Some(name) = &self.instance else {
            if self.upper_root.is_some() || self.mount_root.is_some() {
                return Err(ConfigError::Usage(
                    "--upper-root and --mount-root place the directories of an --instance; \
                     give --instance USER[@SESSION] too"
                        .into(),
                ));
            }
            return Ok(());
        };
        let inst = Instance::parse(name).map_err(|e| ConfigError::Usage(e.to_string()))?;
        let upper_root = self
            .upper_root
            .clone()
            .unwrap_or_else(|| DEFAULT_UPPER_ROOT.into());
        let mount_root = self
            .mount_root
            .clone()
            .unwrap_or_else(|| DEFAULT_MOUNT_ROOT.into());
        for (root, flag) in [(&upper_root, "--upper-root"), (&mount_root, "--mount-root")] {
            if !root.is_absolute() {
                return Err(ConfigError::Usage(format!(
                    "{flag} {}: give an absolute directory",
                    root.display()
                )));
            }
        }
        let p = inst.paths(&upper_root, &mount_root);
        make_dirs(&p.upper, 0o755)?;
        make_dirs(&p.mountpoint, 0o755)?;
        // The daemon's log keeps it; the terminal shows only warnings.
        tracing::debug!(
            "instance {inst}: upper {}, mountpoint {}",
            p.upper.display(),
            p.mountpoint.display()
        );
        args.upper = Some(p.upper);
        args.work = Some(p.work);
        args.state = Some(p.state);
        args.mountpoint = p.mountpoint;
        Ok(())
    }
}

/// `mkdir -p` giving what it creates exactly `mode`, whatever the umask
/// (the unit runs with UMask=0077, and a user must be able to reach the
/// mountpoint through its parents).
fn make_dirs(dir: &Path, mode: u32) -> Result<(), ConfigError> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.exists()).collect();
    for d in missing.into_iter().rev() {
        let made = match fs::DirBuilder::new().mode(mode).create(d) {
            Ok(()) => fs::set_permissions(d, fs::Permissions::from_mode(mode)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(e),
        };
        made.map_err(|e| ConfigError::Invalid(format!("cannot create {}: {e}", d.display())))?;
    }
    Ok(())
}
