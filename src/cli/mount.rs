//! `layerfs mount`: arguments, then config validation and the daemon.

use super::exit::{config_error, Context, Outcome, EXIT_OK};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::config::{self, MountArgs};
use crate::daemon;

const MOUNT_HELP: &str = "\
Examples:
  layerfs mount --lower /srv/shared --upper /ws/upper /ws/mnt
  layerfs mount --lower /srv/team --lower /srv/base --upper /ws/upper \\
                --policy /etc/layerfs/policy /ws/mnt
  layerfs mount -o lowerdir=/srv/team:/srv/base,upperdir=/ws/upper,workdir=/ws/work /ws/mnt
  layerfs mount --foreground --log-file /var/log/layerfs.log ...   (for systemd)
  layerfs mount --instance alice@s42 -o lowerdir=/srv/layerfs/lower
      (upper /var/lib/layerfs/alice/sessions/s42/upper, mounted at
       /run/layerfs/alice/sessions/s42/mnt: the systemd unit's scheme)

Without --foreground the command returns once the mountpoint is live and a
daemon keeps serving it in the background; stop it with `layerfs umount`.
SIGTERM or SIGINT to the daemon unmount cleanly; SIGHUP reloads --policy.
A stale mount left by a crashed daemon on MOUNTPOINT is detached first.";

#[derive(Args, Debug)]
#[command(after_help = MOUNT_HELP)]
pub struct MountCmd {
    /// Read-only lower layer; repeat for more, the first given is topmost.
    #[arg(long = "lower", value_name = "DIR")]
    lowers: Vec<PathBuf>,

    /// Writable upper directory: every change lands here (kernel-overlay format).
    #[arg(long, value_name = "DIR")]
    upper: Option<PathBuf>,

    /// Work directory on the upper's filesystem, outside the upper
    /// [default: .<upper-name>.layerfs-work next to the upper, created if missing].
    #[arg(long, value_name = "DIR")]
    work: Option<PathBuf>,

    /// Workspace state directory: control socket, journal, snapshots; outside
    /// the upper and the lowers [default: .<upper-name>.layerfs-state next to
    /// the upper, created mode 0700 if missing].
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,

    /// Keep no change journal (for benchmarking, or where no record is wanted).
    #[arg(long)]
    no_journal: bool,

    /// Trim the journal (oldest rows first) beyond this size, e.g. 64M, 1G.
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = config::parse_size)]
    journal_max_size: u64,

    /// Delete journal rows older than this, e.g. 30d, 12h.
    #[arg(long, value_name = "AGE", default_value = "30days", value_parser = config::parse_age)]
    journal_max_age: Duration,

    /// Serve in this process until unmounted or SIGTERM (for systemd, Type=notify).
    #[arg(short, long)]
    foreground: bool,

    /// Let other users (not only the one mounting) use the mount.
    #[arg(long)]
    allow_other: bool,

    /// Mount over a directory that is not empty, hiding its files while
    /// mounted (without it, a non-empty MOUNTPOINT is refused).
    #[arg(long)]
    nonempty: bool,

    /// Mount read-only.
    #[arg(long)]
    read_only: bool,

    /// Path policy file (hide/readonly/protect rules); SIGHUP reloads it
    /// [default: built-in safe defaults].
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,

    /// FUSE worker threads [default: 4; more for a workspace many
    /// processes use at once].
    #[arg(long, value_name = "N")]
    threads: Option<usize>,

    /// Serve requests through one io_uring queue per CPU, answered on the
    /// caller's CPU (FUSE over io_uring). Needs a kernel that offers it:
    /// root must first set /sys/module/fuse/parameters/enable_uring to Y,
    /// which layerfs never does itself. Without the offer the mount
    /// serves through /dev/fuse and says so in its log and `status`.
    #[arg(long)]
    io_uring: bool,

    /// Read-only opens of lower files of 1 MiB or more go straight to the
    /// lower file (FUSE passthrough, as root): their reads never reach the
    /// daemon.
    /// Trade-off: while a lower file is open this way, opening it for
    /// writing or truncating it fails with ETXTBSY ("text file busy")
    /// until those descriptors are closed. Without this option only files
    /// that cannot be copied up (a read-only mount, a `readonly` rule)
    /// are read this way.
    #[arg(long)]
    lower_passthrough: bool,

    /// How soon changes made to a lower from outside become visible
    /// through the mount where they cannot be watched, e.g. 1s, 500ms.
    /// Local lower directories are watched with inotify: changes there
    /// show at once, and the kernel may cache their entries for
    /// max(this, 60s). A network or FUSE lower (NFS, GlusterFS, CephFS,
    /// …) is never watched (changes made on other hosts raise no inotify
    /// event): its changes show within this plus its client's own
    /// caching.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = config::parse_duration)]
    lower_timeout: Duration,

    /// The most inotify watches the mount holds on lower directories
    /// [default: a sixteenth of fs.inotify.max_user_watches, at most
    /// 65536]. The kernel counts watches against the daemon's user for
    /// the whole host; beyond this cap a directory is not watched and its
    /// outside changes show within --lower-timeout, so no walk through a
    /// shared mount can use up the host's watches. 0 watches nothing.
    #[arg(long, value_name = "N")]
    max_watches: Option<usize>,

    /// How far the kernel reads ahead of a sequential reader of a file on
    /// the mount, e.g. 2M, 512K; 0 keeps the kernel's 128 KiB. A larger
    /// readahead sends a cold read as fewer, larger READ requests (up to
    /// 1 MiB each, the largest the kernel sends) and, beyond 1 MiB,
    /// several of them at once. Set as root through /sys/class/bdi; a
    /// mount made by another user keeps the kernel's value and says so in
    /// its log.
    #[arg(long, value_name = "SIZE", default_value = "2M", value_parser = config::parse_size)]
    readahead: u64,

    /// Write the daemon's log here instead of stderr (background: /dev/null).
    #[arg(long, value_name = "FILE")]
    log_file: Option<PathBuf>,

    /// Comma-separated mount options, kernel-overlay style:
    /// lowerdir=A:B (first topmost), upperdir=DIR, workdir=DIR, and
    /// layerfs's own state=, policy=, scratch=, log_file=, threads=, io_uring,
    /// lower_passthrough,
    /// lower_timeout=, max_watches=, readahead=, journal_max_size=,
    /// journal_max_age=,
    /// no_journal,
    /// allow_other, nonempty, ro, noexec (each as its long option); generic mount
    /// options (rw, nosuid, nodev, noatime, _netdev, nofail, user, x-*, …)
    /// are accepted and ignored. The same options work in fstab through
    /// mount.fuse.layerfs(8).
    #[arg(short = 'o', value_name = "OPTS")]
    options: Vec<String>,

    /// Scratch paths: a glob (policy-style, relative to the mount root;
    /// repeatable) whose contents `layerfs diff` and snapshots leave out
    /// and `layerfs gc` empties, e.g. `target/**`.
    #[arg(long = "scratch", value_name = "GLOB")]
    scratch: Vec<String>,

    #[command(flatten)]
    instance: super::instance::InstanceArgs,

    /// Where to mount the union: an existing, empty directory (see
    /// --nonempty).
    // Not required by clap: `validate` names everything missing at once.
    #[arg(value_name = "MOUNTPOINT")]
    mountpoint: Option<PathBuf>,
}

impl MountCmd {
    /// Whether log lines will reach the terminal (for colouring).
    pub fn logs_to_terminal(&self) -> bool {
        self.foreground && self.log_file.is_none()
    }

    pub fn run(self) -> Outcome {
        let mut args = MountArgs {
            lowers: self.lowers,
            upper: self.upper,
            work: self.work,
            state: self.state,
            journal: (!self.no_journal).then(|| crate::state::journal::Options {
                max_bytes: self.journal_max_size,
                max_age: self.journal_max_age,
                ..Default::default()
            }),
            mountpoint: self.mountpoint.unwrap_or_default(),
            foreground: self.foreground,
            allow_other: self.allow_other,
            nonempty: self.nonempty,
            read_only: self.read_only,
            no_exec: false,
            policy_file: self.policy,
            threads: self.threads,
            io_uring: self.io_uring,
            lower_passthrough: self.lower_passthrough,
            lower_timeout: Some(self.lower_timeout),
            max_watches: self.max_watches,
            readahead: Some(self.readahead),
            log_file: self.log_file,
            options: self.options,
            scratch: self.scratch,
        };
        let refused = |e| config_error("mount", e);
        self.instance.apply(&mut args).map_err(refused)?;
        let cfg = config::validate(args).map_err(refused)?;
        daemon::start(cfg).or_fail("mount").map(|()| EXIT_OK)
    }
}
