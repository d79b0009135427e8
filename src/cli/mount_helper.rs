//! `mount.fuse.layerfs`: the layerfs binary acting as mount(8)'s helper for
//! filesystem type `fuse.layerfs`, chosen by the name it was started under
//! (a symlink `/sbin/mount.fuse.layerfs` made by `layerfs install-helpers`).
//!
//! mount(8) looks for `/sbin/mount.TYPE` by absolute path and runs it as
//! `mount.fuse.layerfs SOURCE DIR [-sfnv] [-N NS] [-o OPTIONS]` with its own
//! fixed `PATH`, so `mount -t fuse.layerfs` and fstab lines never depend on
//! the caller's `PATH` (fuse3's generic `mount.fuse3` would instead run a
//! program named `layerfs` found on `PATH`). mount(8) leaves out `noauto`,
//! `x-*` and the other options meant for itself and passes the rest, plus
//! generic ones such as `rw`, `_netdev`, `nofail` or `user`, which
//! `config::apply_mount_options` accepts and ignores.
//!
//! The helper mounts exactly as `layerfs mount -o OPTIONS DIR` does: it
//! returns once the mountpoint answers, a daemon serves it in the
//! background, and a plain `umount DIR` ends the FUSE session, after which
//! the daemon exits. Exit status follows mount(8)'s contract for helpers,
//! since mount passes it on: 0 mounted, 1 bad invocation or options, 32
//! the mount failed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::Parser;

use crate::config::{self, ConfigError, MountArgs};
use crate::daemon;

/// The name mount(8) runs for `-t fuse.layerfs`.
pub const HELPER_NAME: &str = "mount.fuse.layerfs";
/// The filesystem type the helper serves.
const FSTYPE: &str = "fuse.layerfs";

/// mount(8)'s exit status for a bad invocation (usage, options).
pub const EXIT_USAGE: i32 = 1;
/// mount(8)'s exit status for a failed mount.
pub const EXIT_FAIL: i32 = 32;

const ABOUT: &str = "mount(8) helper for layerfs: mounts a fuse.layerfs filesystem";

const LONG_ABOUT: &str = "\
mount(8) runs this helper for `mount -t fuse.layerfs` and for fstab lines of \
type fuse.layerfs. It mounts a copy-on-write union of the lower directories \
and the upper directory given in the options, returns once the mountpoint is \
live, and leaves a layerfs daemon serving it; `umount DIR` unmounts it and \
the daemon exits. It is the layerfs binary itself, installed as a symlink \
named mount.fuse.layerfs in /sbin (`layerfs install-helpers`).";

const AFTER_HELP: &str = "\
Examples:
  mount -t fuse.layerfs -o lowerdir=/srv/team:/srv/base,upperdir=/ws/upper,workdir=/ws/work \\
        layerfs /ws/mnt
  umount /ws/mnt

  # /etc/fstab
  layerfs /ws/mnt fuse.layerfs lowerdir=/srv/base,upperdir=/ws/upper,workdir=/ws/work,allow_other 0 0

The options are those of `layerfs mount -o`: lowerdir=, upperdir=, workdir=,
state=, policy=, scratch=, log_file=, threads=, lower_timeout=, max_watches=,
readahead=, journal_max_size=, journal_max_age=, no_journal, allow_other,
nonempty, ro, noexec.
Generic options mount(8) passes on (rw, nosuid, nodev, noatime, _netdev,
nofail, user, …) are ignored; any other option is refused.
Exit status: 0 mounted, 1 bad invocation or options, 32 mount failed.";

/// mount(8)'s calling convention for helpers.
#[derive(Parser, Debug)]
#[command(
    name = HELPER_NAME,
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = AFTER_HELP
)]
pub struct HelperCli {
    /// The fstab source field; conventionally `layerfs`. The layers come
    /// from the options, so any word is accepted.
    #[arg(value_name = "SOURCE")]
    source: String,

    /// The mountpoint: an existing directory.
    #[arg(value_name = "DIR")]
    dir: PathBuf,

    /// Sloppy: drop unknown mount options with a warning instead of
    /// refusing the mount.
    #[arg(short = 's')]
    sloppy: bool,

    /// Fake: check the options and say what would be mounted, mount nothing.
    #[arg(short = 'f')]
    fake: bool,

    /// No mtab update (layerfs writes none; accepted for mount(8)).
    #[arg(short = 'n')]
    no_mtab: bool,

    /// Verbose: say what is being mounted.
    #[arg(short = 'v')]
    verbose: bool,

    /// Comma-separated mount options (see MOUNT OPTIONS).
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,

    /// Filesystem type; must be fuse.layerfs.
    #[arg(short = 't', value_name = "TYPE")]
    fstype: Option<String>,

    /// Mount namespace to mount in (mount -N); not supported.
    #[arg(short = 'N', value_name = "NAMESPACE")]
    namespace: Option<String>,
}

/// Whether the process was started under the helper's name (argv[0]).
pub fn invoked_as_helper(argv0: Option<&OsString>) -> bool {
    argv0
        .and_then(|a| Path::new(a).file_name().map(|n| n == HELPER_NAME))
        .unwrap_or(false)
}

/// Runs the helper with this process's arguments; returns the exit status.
pub fn run() -> i32 {
    let cli = match HelperCli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { EXIT_USAGE } else { 0 };
        }
    };
    crate::daemon::logging::init(false);
    // The daemon forked below is a layerfs daemon like any other: `layerfs
    // umount`, `status` and the pid registry know it by the name `layerfs`
    // (the kernel would otherwise call it `mount.fuse.laye`).
    if let Err(e) = nix::sys::prctl::set_name(c"layerfs") {
        tracing::warn!("cannot name the process `layerfs`: {e}");
    }
    match cli.mount() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{HELPER_NAME}: {e}");
            match e {
                ConfigError::Usage(_) => EXIT_USAGE,
                ConfigError::Invalid(_) => EXIT_FAIL,
            }
        }
    }
}

impl HelperCli {
    fn mount(self) -> Result<i32, ConfigError> {
        if let Some(t) = &self.fstype {
            if t != FSTYPE {
                return Err(ConfigError::Usage(format!(
                    "-t {t}: this helper mounts only {FSTYPE}"
                )));
            }
        }
        if let Some(ns) = &self.namespace {
            return Err(ConfigError::Usage(format!(
                "-N {ns}: mounting into another namespace is not supported; run mount inside \
                 it instead (e.g. nsenter --mount=/proc/PID/ns/mnt mount …)"
            )));
        }
        let options = if self.sloppy {
            let (kept, dropped) = config::split_known_options(&self.options);
            for d in dropped {
                eprintln!("{HELPER_NAME}: ignoring unknown mount option `{d}` (-s)");
            }
            kept
        } else {
            self.options.clone()
        };
        let mut args = MountArgs {
            options,
            mountpoint: self.dir.clone(),
            journal: Some(crate::state::journal::Options::default()),
            ..MountArgs::default()
        };
        if self.fake {
            // Only the options: validate() would create the work and
            // state directories.
            config::apply_mount_options(&mut args)?;
            if args.lowers.is_empty() || args.upper.is_none() {
                return Err(ConfigError::Usage(
                    "lowerdir= and upperdir= are required, e.g. \
                     -o lowerdir=/srv/base,upperdir=/ws/upper"
                        .into(),
                ));
            }
            self.say(&args, "would mount");
            return Ok(0);
        }
        if self.verbose {
            let mut shown = args.clone();
            config::apply_mount_options(&mut shown)?;
            self.say(&shown, "mounting");
        }
        let cfg = config::validate(args)?;
        daemon::start(cfg)
            .map(|()| 0)
            .map_err(|e| ConfigError::Invalid(e.to_string()))
    }

    fn say(&self, args: &MountArgs, what: &str) {
        let lowers: Vec<String> = args
            .lowers
            .iter()
            .map(|l| l.display().to_string())
            .collect();
        println!(
            "{HELPER_NAME}: {what} {} (source {}): lowers {}, upper {}",
            self.dir.display(),
            self.source,
            lowers.join(":"),
            args.upper
                .as_deref()
                .map_or("?".into(), |u| u.display().to_string())
        );
    }
}

/// A note for `layerfs SOURCE DIR -o …`, which is how fuse3's generic
/// `mount.fuse3` starts a FUSE filesystem it found on `PATH`: layerfs
/// mounts through its own helper instead, found without `PATH`.
pub fn mount_fuse3_hint(args: &[OsString]) -> Option<String> {
    // mount.fuse3 always passes the mountpoint absolute and, for layerfs
    // (which needs lowerdir=), an -o list.
    let looks_like_helper_call = args.len() >= 3
        && !args[1].to_string_lossy().starts_with('-')
        && Path::new(&args[2]).is_absolute()
        && args[3..].iter().any(|a| a == "-o");
    looks_like_helper_call.then(|| {
        format!(
            "`layerfs {} {} …` looks like mount(8) reaching layerfs through fuse3's \
             mount.fuse3, which layerfs does not take: install layerfs's own helper once \
             with `layerfs install-helpers` (a symlink /sbin/{HELPER_NAME}), then \
             `mount -t {FSTYPE} …` and fstab use it, whatever PATH is",
            args[1].to_string_lossy(),
            args[2].to_string_lossy()
        )
    })
}
