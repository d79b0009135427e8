//! `layerfs install-helpers`: links `mount.fuse.layerfs` to this binary in
//! the directory mount(8) searches for helpers, so `mount -t fuse.layerfs`
//! and fstab lines work; `--remove` takes the link away again.
//!
//! mount(8) (libmount) looks for helpers only in `/sbin` (and its `fs.d`,
//! `fs` subdirectories), by absolute path; on merged-/usr systems `/sbin`
//! is `/usr/sbin`. The link points at the canonical path of the running
//! binary, so install the binary where it will stay first.

use super::exit::{CliError, Context};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use clap::Args;

use super::mount_helper::HELPER_NAME;

/// Where mount(8) looks for helpers.
const DEFAULT_DIR: &str = "/sbin";

const INSTALL_HELP: &str = "\
Examples:
  install -m 0755 target/release/layerfs /usr/local/bin/layerfs
  /usr/local/bin/layerfs install-helpers      # /sbin/mount.fuse.layerfs -> /usr/local/bin/layerfs
  mount -t fuse.layerfs -o lowerdir=/srv/base,upperdir=/ws/upper layerfs /ws/mnt
  layerfs install-helpers --remove

Without this link, `mount -t fuse.layerfs` falls back to fuse3's mount.fuse3,
which runs `layerfs` from PATH in a way layerfs does not take (and fails with
`layerfs: not found` when PATH lacks it).";

#[derive(Args, Debug)]
#[command(after_help = INSTALL_HELP)]
pub struct InstallCmd {
    /// Directory mount(8) searches for helpers.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_DIR)]
    dir: PathBuf,

    /// Remove the helper link instead of creating it.
    #[arg(long)]
    remove: bool,

    /// Replace (or remove) a mount.fuse.layerfs that is not a link to this
    /// binary.
    #[arg(long)]
    force: bool,
}

/// What is at the helper's path now.
enum Existing {
    Nothing,
    /// A symlink; `ours` when it resolves to the running binary.
    Link {
        target: PathBuf,
        ours: bool,
    },
    Other,
}

fn existing(path: &Path, exe: &Path) -> io::Result<Existing> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Existing::Nothing),
        Err(e) => Err(e),
        Ok(md) if md.file_type().is_symlink() => {
            let target = fs::read_link(path)?;
            let ours = fs::canonicalize(path).is_ok_and(|t| t == exe);
            Ok(Existing::Link { target, ours })
        }
        Ok(_) => Ok(Existing::Other),
    }
}

impl InstallCmd {
    /// Why an existing helper that is not ours is left alone: what it is
    /// (where a link points), and the command that would `what` it.
    fn refusal(&self, link: &Path, now: &Existing, exe: &Path, what: &str) -> String {
        let is = match now {
            Existing::Link { target, .. } => format!("is a link to {}", target.display()),
            _ => "is not a symlink (another program's helper?)".to_string(),
        };
        let mut cmd = format!("{} install-helpers", exe.display());
        if self.dir != Path::new(DEFAULT_DIR) {
            cmd.push_str(&format!(" --dir {}", self.dir.display()));
        }
        if what == "remove" {
            cmd.push_str(" --remove");
        }
        format!(
            "{} {is}, not to this layerfs ({}); to {what} it, run `{cmd} --force`",
            link.display(),
            exe.display()
        )
    }

    pub fn run(self) -> Result<(), CliError> {
        let msg = self.apply().or_fail("install-helpers")?;
        outln!("{msg}");
        Ok(())
    }

    fn apply(&self) -> Result<String, String> {
        let exe = std::env::current_exe()
            .and_then(fs::canonicalize)
            .map_err(|e| format!("cannot find this binary's path: {e}"))?;
        let link = self.dir.join(HELPER_NAME);
        let now = existing(&link, &exe).map_err(|e| format!("{}: {e}", link.display()))?;
        if self.remove {
            return match now {
                Existing::Nothing => Ok(format!("{} is not installed", link.display())),
                Existing::Link { ours: false, .. } | Existing::Other if !self.force => {
                    Err(self.refusal(&link, &now, &exe, "remove"))
                }
                _ => {
                    fs::remove_file(&link).map_err(|e| format!("{}: {e}", link.display()))?;
                    Ok(format!("removed {}", link.display()))
                }
            };
        }
        match now {
            Existing::Link { ours: true, target } => {
                return Ok(format!(
                    "{} -> {} is already installed",
                    link.display(),
                    target.display()
                ))
            }
            Existing::Link { ours: false, .. } | Existing::Other if !self.force => {
                return Err(self.refusal(&link, &now, &exe, "replace"))
            }
            _ => {}
        }
        if !self.dir.is_dir() {
            return Err(format!(
                "{} is not a directory (mount(8) looks for helpers in /sbin)",
                self.dir.display()
            ));
        }
        // Made beside the final name and renamed over it: whoever runs
        // mount meanwhile finds the old helper or the new one, never none.
        let tmp = self
            .dir
            .join(format!(".{HELPER_NAME}.{}", std::process::id()));
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&exe, &tmp)
            .and_then(|()| fs::rename(&tmp, &link))
            .map_err(|e| {
                let _ = fs::remove_file(&tmp);
                format!("cannot link {} -> {}: {e}", link.display(), exe.display())
            })?;
        Ok(format!(
            "linked {} -> {}: `mount -t fuse.layerfs` and fstab lines of type fuse.layerfs \
             now run this layerfs",
            link.display(),
            exe.display()
        ))
    }
}
