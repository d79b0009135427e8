//! Validated mount configuration: what `layerfs mount` (long options or the
//! kernel-overlay style `-o lowerdir=…,upperdir=…,workdir=…`) resolves to.
//!
//! This file owns turning raw command-line values into a `Config`: option
//! parsing (`-o`, durations), path canonicalization and every check that
//! must pass before anything is mounted (layers nest wrongly, work dir on
//! another filesystem, mountpoint busy, `/dev/fuse` missing, bad policy).
//! A stale layerfs mount left on the mountpoint by a crashed daemon is
//! detached here so the new mount can take its place.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use crate::host::mounts;
use crate::layer::safedir::{Role, SafeDir};
use crate::policy::Policy;

/// Everything the daemon and the overlay core need to serve one mount.
/// Paths are absolute and canonical once `validate` has run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Lower layers, topmost first.
    pub lowers: Vec<PathBuf>,
    /// Frozen layers (checkpoints) from the workspace's stack, topmost
    /// first, served above `lowers` (`state::frozen`).
    pub layers: Vec<PathBuf>,
    pub upper: PathBuf,
    /// Work directory on the upper's filesystem, outside the upper tree.
    pub work: PathBuf,
    /// Workspace state directory (control socket, journal, snapshots),
    /// outside the upper, the lowers and the work dir.
    pub state: PathBuf,
    /// The change journal's settings; `None` with `--no-journal`.
    pub journal: Option<crate::state::journal::Options>,
    pub mountpoint: PathBuf,
    pub foreground: bool,
    pub allow_other: bool,
    pub read_only: bool,
    /// `-o noexec`: programs on the mount cannot be executed (`MS_NOEXEC`).
    pub no_exec: bool,
    /// Policy file given with `--policy`, kept for SIGHUP reloads.
    pub policy_file: Option<PathBuf>,
    pub policy: Policy,
    /// FUSE worker threads.
    pub threads: usize,
    /// `--io-uring`: serve requests through per-CPU io_uring queues when
    /// the kernel offers them.
    pub io_uring: bool,
    /// How long the kernel may trust names and attributes of lower entries
    /// before asking again: changes made to a lower from outside show up
    /// through the mount within this time.
    pub lower_timeout: Duration,
    /// `--max-watches`: the most inotify watches the mount holds on lower
    /// directories; `None` = `overlay::watch::default_cap()`.
    pub max_watches: Option<usize>,
    /// Where the daemon logs (`--log-file`); `None` = stderr (foreground)
    /// or nowhere (background).
    pub log_file: Option<PathBuf>,
    /// `layerfs mount` created the work dir: a mount that fails removes it
    /// again (if still empty), so a refused mount leaves nothing behind.
    pub created_work: bool,
    /// `--scratch` globs: paths diff and snapshots leave out, gc empties.
    pub scratch: Vec<String>,
}

/// Default for `--lower-timeout`.
pub const DEFAULT_LOWER_TIMEOUT: Duration = Duration::from_secs(1);

impl Config {
    /// What the overlay core needs of this config.
    pub fn overlay_options(&self) -> crate::overlay::Options {
        crate::overlay::Options {
            lowers: self.layers.iter().chain(&self.lowers).cloned().collect(),
            upper: self.upper.clone(),
            work: self.work.clone(),
            policy: self.policy.clone(),
            read_only: self.read_only,
            threads: self.threads,
            max_watches: self.max_watches,
        }
    }
}

/// Why a mount configuration was refused. `Usage` means the command line
/// itself is wrong; `Invalid` means the system state is (the command line
/// maps them to its exit statuses, `cli::exit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    Usage(String),
    Invalid(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Usage(m) | ConfigError::Invalid(m) => f.write_str(m),
        }
    }
}

fn usage(msg: impl Into<String>) -> ConfigError {
    ConfigError::Usage(msg.into())
}

fn invalid(msg: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(msg.into())
}

/// Raw values of `layerfs mount`, before any check.
#[derive(Debug, Clone, Default)]
pub struct MountArgs {
    pub lowers: Vec<PathBuf>,
    pub upper: Option<PathBuf>,
    pub work: Option<PathBuf>,
    pub state: Option<PathBuf>,
    /// `None` with `--no-journal`.
    pub journal: Option<crate::state::journal::Options>,
    pub mountpoint: PathBuf,
    pub foreground: bool,
    pub allow_other: bool,
    /// `--nonempty` or `-o nonempty`: mount over a directory that holds
    /// files (hiding them while mounted).
    pub nonempty: bool,
    pub read_only: bool,
    /// `-o noexec`.
    pub no_exec: bool,
    pub policy_file: Option<PathBuf>,
    pub threads: Option<usize>,
    /// `--io-uring` or `-o io_uring`.
    pub io_uring: bool,
    pub lower_timeout: Option<Duration>,
    pub max_watches: Option<usize>,
    pub log_file: Option<PathBuf>,
    /// Every `-o` value, in order (each a comma-separated list).
    pub options: Vec<String>,
    pub scratch: Vec<String>,
}

/// Parses a size such as `64M`, `1G` or `4096` (bytes; K, M, G, T are
/// powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    crate::policy::parse::parse_amount(s.trim(), 1024)
        .map_err(|e| format!("invalid size `{s}`: {e}"))
}

/// Parses a retention age such as `30d`, `12h`, `90min` (humantime units).
pub fn parse_age(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("invalid age `{s}`: {e} (e.g. 30d, 12h, 90min)"))
}

/// Parses a duration such as `1s`, `500ms`, `1.5s`, `2m` or `250us`; a bare
/// number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration `{s}`: expected e.g. `1s`, `500ms`, `2m`"))?;
    let secs = match unit.trim() {
        "" | "s" | "sec" => value,
        "ms" => value / 1e3,
        "us" | "µs" => value / 1e6,
        "ns" => value / 1e9,
        "m" | "min" => value * 60.0,
        other => {
            return Err(format!(
                "invalid duration `{s}`: unknown unit `{other}` (use ns, us, ms, s or m)"
            ))
        }
    };
    if !secs.is_finite() || !(0.0..=86_400.0).contains(&secs) {
        return Err(format!(
            "invalid duration `{s}`: must be between 0 and 24 hours"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Splits a `-o` value at unescaped commas (`\,` keeps a comma in a path).
fn split_options(s: &str) -> Vec<String> {
    split_escaped(s, ',')
}

/// Splits at unescaped `sep`; a backslash escapes the next character.
fn split_escaped(s: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(n) if n == sep => cur.push(n),
                Some(n) => {
                    cur.push('\\');
                    cur.push(n);
                }
                None => cur.push('\\'),
            }
        } else if c == sep {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out
}

/// Generic mount(8) options a layerfs mount accepts and ignores: mount(8)
/// passes them on to `mount.fuse.layerfs` from fstab (`user`, `_netdev`,
/// `nofail`, …), and layerfs decides permissions (kernel
/// `default_permissions`), devices and setuid bits (the policy) itself.
pub const IGNORED_OPTIONS: [&str; 35] = [
    "rw",
    "default_permissions",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "diratime",
    "nodiratime",
    "lazytime",
    "nolazytime",
    "sync",
    "async",
    "dirsync",
    "iversion",
    "noiversion",
    "mand",
    "nomand",
    "silent",
    "loud",
    "defaults",
    "auto",
    "noauto",
    "nofail",
    "_netdev",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
];

/// The mount options layerfs itself understands (`-o KEY=VALUE` or `-o
/// FLAG`), as `(key, the value's name or None for a flag, meaning)`: one
/// list for the parser's error message and the mount.fuse.layerfs man page.
pub const LAYERFS_OPTIONS: [(&str, Option<&str>, &str); 19] = [
    (
        "lowerdir",
        Some("DIR[:DIR…]"),
        "lower layers, the first topmost (as --lower)",
    ),
    ("upperdir", Some("DIR"), "the upper directory (as --upper)"),
    ("workdir", Some("DIR"), "the work directory (as --work)"),
    (
        "state",
        Some("DIR"),
        "the workspace state directory (as --state)",
    ),
    ("policy", Some("FILE"), "the path policy file (as --policy)"),
    (
        "scratch",
        Some("GLOB"),
        "a scratch glob, repeatable (as --scratch)",
    ),
    (
        "log_file",
        Some("FILE"),
        "the daemon's log file (as --log-file)",
    ),
    ("threads", Some("N"), "FUSE worker threads (as --threads)"),
    (
        "io_uring",
        None,
        "per-CPU io_uring request queues (as --io-uring)",
    ),
    (
        "lower_timeout",
        Some("DURATION"),
        "trust unwatched lower entries this long (as --lower-timeout)",
    ),
    (
        "max_watches",
        Some("N"),
        "the most inotify watches on lower directories (as --max-watches)",
    ),
    (
        "journal_max_size",
        Some("SIZE"),
        "journal size limit (as --journal-max-size)",
    ),
    (
        "journal_max_age",
        Some("AGE"),
        "journal age limit (as --journal-max-age)",
    ),
    (
        "no_journal",
        None,
        "keep no change journal (as --no-journal)",
    ),
    (
        "allow_other",
        None,
        "let other users use the mount (as --allow-other)",
    ),
    (
        "nonempty",
        None,
        "mount over a directory that is not empty (as --nonempty)",
    ),
    ("ro", None, "mount read-only (as --read-only)"),
    ("noexec", None, "programs on the mount cannot be executed"),
    ("exec", None, "undo an earlier noexec (the default)"),
];

/// Folds the `-o` options into the long-option fields. Kernel-overlay keys
/// (`lowerdir`, `upperdir`, `workdir`) set the layers, layerfs's own keys
/// (`policy=`, `state=`, …, see `LAYERFS_OPTIONS`) the matching long
/// option; generic mount options are accepted and ignored
/// (`IGNORED_OPTIONS`, and `x-*`/`X-*` userspace options); anything else is
/// refused. A path option also given as a long option is refused; a value
/// option (threads, timeouts, journal limits) given by `-o` wins over the
/// long option's default.
pub fn apply_mount_options(args: &mut MountArgs) -> Result<(), ConfigError> {
    let raw = std::mem::take(&mut args.options);
    let mut lowers_from_o: Option<Vec<PathBuf>> = None;
    for opt in raw.iter().flat_map(|s| split_options(s)) {
        // Blanks around keys and flags are forgiven (`-o "ro, nodev"`), but
        // a value is taken verbatim: a path may end in a space, and
        // trimming it would mount a different directory.
        let opt = opt.trim_start();
        if opt.trim_end().is_empty() {
            continue;
        }
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k.trim_end(), Some(v)),
            None => (opt.trim_end(), None),
        };
        let need = |v: Option<&str>| -> Result<String, ConfigError> {
            match v {
                Some(v) if !v.is_empty() => Ok(v.to_string()),
                _ => Err(usage(format!(
                    "-o {key}= needs a value, e.g. -o {key}={}",
                    example_value(key)
                ))),
            }
        };
        let flag = |v: Option<&str>| -> Result<(), ConfigError> {
            match v {
                None => Ok(()),
                Some(_) => Err(usage(format!(
                    "mount option `{opt}`: {key} is a flag and takes no value (write just `{key}`)"
                ))),
            }
        };
        let bad = |what: String| usage(format!("mount option `{opt}`: {what}"));
        match key {
            "lowerdir" => {
                let v = need(value)?;
                let dirs: Vec<PathBuf> = split_escaped(&v, ':')
                    .into_iter()
                    .map(|p| {
                        if p.is_empty() {
                            Err(usage(format!("-o lowerdir={v}: empty layer between `:`")))
                        } else {
                            Ok(PathBuf::from(p))
                        }
                    })
                    .collect::<Result<_, _>>()?;
                lowers_from_o = Some(dirs);
            }
            "upperdir" => set_once(&mut args.upper, need(value)?, "upperdir", "--upper")?,
            "workdir" => set_once(&mut args.work, need(value)?, "workdir", "--work")?,
            "state" => set_once(&mut args.state, need(value)?, "state", "--state")?,
            "policy" => set_once(&mut args.policy_file, need(value)?, "policy", "--policy")?,
            "log_file" => set_once(&mut args.log_file, need(value)?, "log_file", "--log-file")?,
            "scratch" => args.scratch.push(need(value)?),
            "threads" => {
                let v = need(value)?;
                let n: usize = v
                    .parse()
                    .map_err(|_| bad(format!("`{v}` is not a number of threads")))?;
                args.threads = Some(n);
            }
            "io_uring" => {
                flag(value)?;
                args.io_uring = true;
            }
            "lower_timeout" => {
                args.lower_timeout = Some(parse_duration(&need(value)?).map_err(bad)?);
            }
            "max_watches" => {
                let v = need(value)?;
                let n: usize = v
                    .parse()
                    .map_err(|_| bad(format!("`{v}` is not a number of watches")))?;
                args.max_watches = Some(n);
            }
            "journal_max_size" => {
                let size = parse_size(&need(value)?).map_err(bad)?;
                if let Some(j) = &mut args.journal {
                    j.max_bytes = size;
                }
            }
            "journal_max_age" => {
                let age = parse_age(&need(value)?).map_err(bad)?;
                if let Some(j) = &mut args.journal {
                    j.max_age = age;
                }
            }
            "no_journal" => {
                flag(value)?;
                args.journal = None;
            }
            "ro" => {
                flag(value)?;
                args.read_only = true;
            }
            "allow_other" => {
                flag(value)?;
                args.allow_other = true;
            }
            "nonempty" => {
                flag(value)?;
                args.nonempty = true;
            }
            "noexec" => {
                flag(value)?;
                args.no_exec = true;
            }
            "exec" => {
                flag(value)?;
                args.no_exec = false;
            }
            k if IGNORED_OPTIONS.contains(&k) => {
                flag(value)?;
                tracing::debug!("ignoring mount option `{key}`");
            }
            k if k.starts_with("x-") || k.starts_with("X-") => {
                tracing::debug!("ignoring mount option `{opt}`")
            }
            _ => {
                let known: Vec<&str> = LAYERFS_OPTIONS.iter().map(|(k, _, _)| *k).collect();
                return Err(usage(format!(
                    "unknown mount option `{opt}`: layerfs understands {}; it ignores the \
                     generic options mount(8) passes (rw, nosuid, nodev, noatime, _netdev, \
                     nofail, user, x-*, …); see `man mount.fuse.layerfs`",
                    known.join(", ")
                )));
            }
        }
    }
    if let Some(dirs) = lowers_from_o {
        if !args.lowers.is_empty() {
            return Err(usage(
                "lower layers given twice: use either --lower DIR (repeatable) or \
                 -o lowerdir=A:B, not both",
            ));
        }
        args.lowers = dirs;
    }
    Ok(())
}

/// Whether layerfs reads or deliberately ignores the option named `key`.
fn is_known_option(key: &str) -> bool {
    LAYERFS_OPTIONS.iter().any(|(k, _, _)| *k == key)
        || IGNORED_OPTIONS.contains(&key)
        || key.starts_with("x-")
        || key.starts_with("X-")
}

/// Splits `-o` values into the options layerfs knows or ignores (each
/// returned as its own `-o` value, commas escaped again) and the unknown
/// ones (for mount(8)'s sloppy `-s`).
pub fn split_known_options(options: &[String]) -> (Vec<String>, Vec<String>) {
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    for opt in options.iter().flat_map(|s| split_options(s)) {
        let key = opt.split_once('=').map_or(opt.as_str(), |(k, _)| k).trim();
        if key.is_empty() || is_known_option(key) {
            kept.push(opt.replace(',', "\\,"));
        } else {
            dropped.push(opt);
        }
    }
    (kept, dropped)
}

/// A plausible value for `-o KEY=` in an error message.
fn example_value(key: &str) -> &'static str {
    match key {
        "threads" => "8",
        "lower_timeout" => "1s",
        "max_watches" => "1000",
        "journal_max_size" => "64M",
        "journal_max_age" => "30d",
        "scratch" => "target/**",
        _ => "/path",
    }
}

fn set_once(
    slot: &mut Option<PathBuf>,
    value: String,
    key: &str,
    long: &str,
) -> Result<(), ConfigError> {
    if slot.is_some() {
        return Err(usage(format!(
            "{key} given twice: use either {long} or -o {key}=…, not both"
        )));
    }
    *slot = Some(PathBuf::from(value));
    Ok(())
}

/// Default worker thread count: 4, whatever the number of CPUs. Four let
/// requests that wait on disk (cold reads, fsync, a large copy-up) overlap
/// with others; one workspace seldom has more requests in flight. fuser
/// fixes the count for the session's life and an idle worker still is a
/// thread, so a default that grew with the CPUs would give each of many
/// idle workspaces on a large host dozens of threads (`--threads N` raises
/// it for a busy shared workspace).
pub const DEFAULT_THREADS: usize = 4;

pub fn default_threads() -> usize {
    DEFAULT_THREADS
}

/// Makes `p` absolute against the current directory and drops `.`
/// components, without touching the filesystem (works on a stale mount).
fn absolute(p: &Path) -> Result<PathBuf, ConfigError> {
    let abs = std::path::absolute(p)
        .map_err(|e| invalid(format!("{}: cannot resolve path: {e}", p.display())))?;
    Ok(abs
        .components()
        .filter(|c| *c != Component::CurDir)
        .collect())
}

/// Canonical path of an existing directory; `what` names its role.
fn existing_dir(p: &Path, what: &str, flag: &str) -> Result<PathBuf, ConfigError> {
    let md = fs::metadata(p).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => invalid(format!(
            "{what} {} does not exist: create it (mkdir -p {}) or fix {flag}",
            p.display(),
            p.display()
        )),
        // A network filesystem whose server is gone (or a FUSE mount whose
        // daemon died) answers ENOTCONN and the like.
        _ if e
            .raw_os_error()
            .is_some_and(crate::layer::reach::is_transport) =>
        {
            invalid(format!(
                "{what} {}: {e}: its network filesystem does not reach its server (or its \
                 FUSE daemon is gone); mount once it answers",
                p.display()
            ))
        }
        _ => invalid(format!("{what} {}: {e}", p.display())),
    })?;
    if !md.is_dir() {
        return Err(invalid(format!(
            "{what} {} is not a directory (give a directory to {flag})",
            p.display()
        )));
    }
    fs::canonicalize(p).map_err(|e| invalid(format!("{what} {}: {e}", p.display())))
}

/// Whether `inner` is `outer` or below it (both canonical).
fn is_within(inner: &Path, outer: &Path) -> bool {
    inner.starts_with(outer)
}

/// The default work directory: a hidden sibling of the upper, so it is on
/// the same filesystem and outside the upper tree.
pub fn default_work_dir(upper: &Path) -> Result<PathBuf, ConfigError> {
    let name = upper.file_name().ok_or_else(|| {
        usage(format!(
            "upper {} has no name to derive a work dir from; give --work DIR",
            upper.display()
        ))
    })?;
    let parent = upper.parent().unwrap_or(Path::new("/"));
    Ok(parent.join(format!(".{}.layerfs-work", name.to_string_lossy())))
}

/// Checks that `/dev/fuse` is there to open.
fn check_dev_fuse() -> Result<(), ConfigError> {
    match fs::metadata("/dev/fuse") {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(invalid(
            "/dev/fuse is missing: load the FUSE kernel module (`modprobe fuse`) and \
             install fuse3 (`apt-get install fuse3`)",
        )),
        Err(e) => Err(invalid(format!("/dev/fuse: {e}"))),
    }
}

/// Resolves the mountpoint: detaches a stale layerfs mount left by a dead
/// daemon, refuses a live mount, and returns the canonical directory.
/// Mountinfo is consulted before the mountpoint itself is touched, since a
/// dead or hung FUSE mount there may fail or block a stat.
fn resolve_mountpoint(raw: &Path) -> Result<PathBuf, ConfigError> {
    let abs = absolute(raw)?;
    let abs = match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => fs::canonicalize(parent)
            .map(|p| p.join(name))
            .unwrap_or(abs),
        _ => abs,
    };
    if let Some(m) = mounts::find(&abs) {
        if !m.is_stale() {
            return Err(busy(&abs, &m));
        }
        tracing::warn!(
            "{}: stale layerfs mount (its daemon is gone); detaching it",
            abs.display()
        );
        mounts::detach(&abs).map_err(|e| {
            invalid(format!(
                "{}: stale layerfs mount could not be detached: {e}; run `umount -l {}`",
                abs.display(),
                abs.display()
            ))
        })?;
    }
    let mnt = existing_dir(&abs, "mountpoint", "MOUNTPOINT")?;
    match mounts::find(&mnt) {
        Some(m) => Err(busy(&mnt, &m)),
        None => Ok(mnt),
    }
}

/// Refuses a mountpoint that holds anything: the mount would hide it
/// silently (FUSE's own `nonempty` rule). `--nonempty` allows it.
fn check_empty(mnt: &Path) -> Result<(), ConfigError> {
    let mut entries =
        fs::read_dir(mnt).map_err(|e| invalid(format!("mountpoint {}: {e}", mnt.display())))?;
    match entries.next() {
        None => Ok(()),
        Some(e) => {
            let first = e
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .unwrap_or_default();
            Err(invalid(format!(
                "mountpoint {} is not empty (it holds `{first}`{}): the mount would hide \
                 what is there; mount on an empty directory, or give --nonempty \
                 (-o nonempty) to mount over it",
                mnt.display(),
                if entries.next().is_some() {
                    ", …"
                } else {
                    ""
                }
            )))
        }
    }
}

fn busy(mnt: &Path, m: &mounts::MountEntry) -> ConfigError {
    let how = if m.is_layerfs() {
        format!("`layerfs umount {}`", mnt.display())
    } else {
        format!("`umount {}`", mnt.display())
    };
    invalid(format!(
        "mountpoint busy: {} is already a mount ({} from {}); unmount it first with {how}",
        mnt.display(),
        m.fstype,
        m.source
    ))
}

/// Turns raw arguments into a checked `Config`. May create the work
/// directory and detach a stale layerfs mount on the mountpoint.
pub fn validate(mut args: MountArgs) -> Result<Config, ConfigError> {
    apply_mount_options(&mut args)?;
    if args.lowers.is_empty() {
        return Err(usage(
            "no lower layer: give --lower DIR (repeatable, first is topmost) or -o lowerdir=A:B",
        ));
    }
    let upper_raw = args
        .upper
        .clone()
        .ok_or_else(|| usage("no upper layer: give --upper DIR or -o upperdir=DIR"))?;
    if let Some(0) = args.threads {
        return Err(usage("--threads must be at least 1"));
    }
    check_dev_fuse()?;

    let mut lowers = Vec::with_capacity(args.lowers.len());
    for (i, l) in args.lowers.iter().enumerate() {
        let l = existing_dir(l, &format!("lower layer #{}", i + 1), "--lower (lowerdir=)")?;
        if lowers.contains(&l) {
            return Err(usage(format!("lower layer {} is given twice", l.display())));
        }
        lowers.push(l);
    }
    let upper = existing_dir(&upper_raw, "upper", "--upper (upperdir=)")?;
    for l in &lowers {
        if is_within(&upper, l) {
            return Err(invalid(format!(
                "upper {} is inside lower {}: the upper must be outside every lower",
                upper.display(),
                l.display()
            )));
        }
        if is_within(l, &upper) {
            return Err(invalid(format!(
                "lower {} is inside upper {}: the lower must be outside the upper",
                l.display(),
                upper.display()
            )));
        }
    }

    let (work, created_work) = resolve_work(args.work.as_deref(), &upper, &lowers)?;
    let mountpoint = resolve_mountpoint(&args.mountpoint)?;
    if !args.nonempty {
        check_empty(&mountpoint)?;
    }
    if is_within(&mountpoint, &upper) || is_within(&mountpoint, &work) {
        return Err(invalid(format!(
            "mountpoint {} is inside the upper or work dir; mount somewhere outside {} and {}",
            mountpoint.display(),
            upper.display(),
            work.display()
        )));
    }
    for l in &lowers {
        // Mounting over a lower root is allowed (the daemon opens its layers
        // first), but a mountpoint below a lower would make the union
        // contain itself.
        if mountpoint != *l && is_within(&mountpoint, l) {
            return Err(invalid(format!(
                "mountpoint {} is inside lower {}: the mount would contain itself",
                mountpoint.display(),
                l.display()
            )));
        }
    }

    let policy_file = match &args.policy_file {
        Some(p) => Some(
            fs::canonicalize(p)
                .map_err(|e| invalid(format!("policy file {}: {e}", p.display())))?,
        ),
        None => None,
    };
    let policy = match &policy_file {
        Some(p) => Policy::load(p).map_err(|e| invalid(format!("bad policy: {e}")))?,
        None => Policy::default(),
    };
    let state = resolve_state(args.state.as_deref(), &upper, &lowers, &work, &mountpoint)?;
    let layers = crate::state::checkpoint::mount_layers(&state, &upper, &work)
        .map_err(|e| invalid(e.to_string()))?;
    let log_file = match &args.log_file {
        Some(p) => Some(absolute(p)?),
        None => None,
    };
    for g in &args.scratch {
        crate::policy::pattern::Pattern::parse(g).map_err(|e| usage(format!("--scratch: {e}")))?;
    }

    Ok(Config {
        lowers,
        layers,
        upper,
        work,
        state,
        journal: args.journal.clone(),
        mountpoint,
        foreground: args.foreground,
        allow_other: args.allow_other,
        read_only: args.read_only,
        no_exec: args.no_exec,
        policy_file,
        policy,
        threads: args.threads.unwrap_or_else(default_threads),
        io_uring: args.io_uring,
        lower_timeout: args.lower_timeout.unwrap_or(DEFAULT_LOWER_TIMEOUT),
        max_watches: args.max_watches,
        log_file,
        created_work: created_work.keep(),
        scratch: args.scratch,
    })
}

/// A work dir this mount created, removed again (only if empty) when
/// dropped before `keep`: every refusal after its creation goes through
/// an early return.
#[must_use]
struct CreatedDir(Option<PathBuf>);

impl CreatedDir {
    /// The mount goes ahead: keep the directory; says whether it was created.
    fn keep(mut self) -> bool {
        self.0.take().is_some()
    }
}

impl Drop for CreatedDir {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            if let Err(e) = fs::remove_dir(&p) {
                tracing::warn!(
                    "cannot remove the work dir {} made for a refused mount: {e}",
                    p.display()
                );
            }
        }
    }
}

/// Finds or creates (mode 0700) the state directory, checks it (see
/// `layer::safedir`) and checks where it lies: never inside the upper, a
/// lower, the work dir (cleared at every mount) or the mountpoint (the
/// daemon would write through itself).
fn resolve_state(
    given: Option<&Path>,
    upper: &Path,
    lowers: &[PathBuf],
    work: &Path,
    mountpoint: &Path,
) -> Result<PathBuf, ConfigError> {
    let raw = match given {
        Some(s) => absolute(s)?,
        None => crate::state::workspace::default_state_dir(upper),
    };
    // Checked before creating anything, then again once canonical.
    let check = |dir: &Path| -> Result<(), ConfigError> {
        let places = [
            (upper, "the upper"),
            (work, "the work dir"),
            (mountpoint, "the mountpoint"),
        ];
        for (place, what) in places
            .into_iter()
            .chain(lowers.iter().map(|l| (l.as_path(), "a lower")))
        {
            if is_within(dir, place) {
                return Err(invalid(format!(
                    "state dir {} is inside {what} {}: keep workspace state outside the layers, \
                     the work dir and the mountpoint (give another --state DIR)",
                    dir.display(),
                    place.display()
                )));
            }
        }
        Ok(())
    };
    check(&raw)?;
    // Created (0700) or opened without following a link at its name, and
    // refused if another user owns it or could write it (`SafeDir`): it
    // usually sits beside the upper, where others may be able to write.
    crate::state::workspace::create_state_dir(&raw).map_err(invalid)?;
    let state = existing_dir(&raw, "state dir", "--state (state=)")?;
    check(&state)?;
    Ok(state)
}

/// Finds or creates the work dir and checks where it lies. A work dir
/// created here is removed again if this or any later check refuses the
/// mount (the returned guard).
fn resolve_work(
    given: Option<&Path>,
    upper: &Path,
    lowers: &[PathBuf],
) -> Result<(PathBuf, CreatedDir), ConfigError> {
    let raw = match given {
        Some(w) => absolute(w)?,
        None => default_work_dir(upper)?,
    };
    let mut created = CreatedDir(None);
    // Like the state dir: created 0700 or checked as found (`SafeDir`).
    let (_, made) = SafeDir::create(&raw, Role::Work, 0o700).map_err(invalid)?;
    if made {
        tracing::debug!("created work dir {}", raw.display());
        created = CreatedDir(Some(raw.clone()));
    }
    let work = existing_dir(&raw, "work dir", "--work (workdir=)")?;
    if is_within(&work, upper) || is_within(upper, &work) {
        return Err(invalid(format!(
            "work dir {} and upper {} nest: the work dir must be outside the upper tree \
             (and not contain it)",
            work.display(),
            upper.display()
        )));
    }
    for l in lowers {
        if is_within(&work, l) || is_within(l, &work) {
            return Err(invalid(format!(
                "work dir {} and lower {} nest: keep the work dir outside every lower",
                work.display(),
                l.display()
            )));
        }
    }
    let dev = |p: &Path| fs::metadata(p).map(|m| m.dev());
    match (dev(&work), dev(upper)) {
        (Ok(w), Ok(u)) if w == u => Ok((work, created)),
        (Ok(_), Ok(_)) => Err(invalid(format!(
            "work dir {} is on a different filesystem than upper {}: copy-up renames from \
             work into upper, so put the work dir next to the upper",
            work.display(),
            upper.display()
        ))),
        (Err(e), _) | (_, Err(e)) => Err(invalid(format!("work dir {}: {e}", work.display()))),
    }
}

pub mod instance;

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_dir_inside_the_upper_is_refused_in_one_readable_sentence() {
        let dir = tempfile::tempdir().unwrap();
        let upper = dir.path().join("upper");
        let inside = upper.join("state");
        let e = resolve_state(
            Some(&inside),
            &upper,
            &[],
            &dir.path().join("w"),
            &dir.path().join("m"),
        )
        .unwrap_err();
        let ConfigError::Invalid(m) = e else {
            panic!("not a refusal of the system state: {e:?}")
        };
        assert!(
            m.contains("is inside the upper") && m.contains("--state DIR"),
            "{m}"
        );
        assert!(!m.contains("  "), "runs of blanks in {m:?}");
        assert!(!inside.exists(), "nothing created for a refused state dir");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("1h").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    fn opts(o: &str) -> Result<MountArgs, ConfigError> {
        let mut a = MountArgs {
            options: vec![o.to_string()],
            ..MountArgs::default()
        };
        apply_mount_options(&mut a).map(|_| a)
    }

    #[test]
    fn overlay_style_options() {
        let a = opts("lowerdir=/a:/b\\:c,upperdir=/u,workdir=/w,rw,ro,allow_other,nodev").unwrap();
        assert_eq!(a.lowers, vec![PathBuf::from("/a"), PathBuf::from("/b:c")]);
        assert_eq!(a.upper, Some(PathBuf::from("/u")));
        assert_eq!(a.work, Some(PathBuf::from("/w")));
        assert!(a.read_only && a.allow_other);
    }

    #[test]
    fn option_values_keep_their_blanks() {
        // Found by fuzz_rendered_mount_options_round_trip: the whole option
        // was trimmed, so `upperdir=/data/x ` mounted `/data/x`.
        let a = opts("upperdir=/u ,workdir= /w\\,,lowerdir=/a :/b, ro ").unwrap();
        assert_eq!(a.upper, Some(PathBuf::from("/u ")));
        assert_eq!(a.work, Some(PathBuf::from(" /w,")));
        assert_eq!(a.lowers, vec![PathBuf::from("/a "), PathBuf::from("/b")]);
        assert!(a.read_only);
    }

    #[test]
    fn bad_options() {
        assert!(
            matches!(opts("frobnicate"), Err(ConfigError::Usage(m)) if m.contains("frobnicate"))
        );
        assert!(matches!(opts("lowerdir="), Err(ConfigError::Usage(_))));
        assert!(matches!(
            opts("lowerdir=/a::/b"),
            Err(ConfigError::Usage(_))
        ));
        let mut a = MountArgs {
            upper: Some("/u".into()),
            options: vec!["upperdir=/v".into()],
            ..MountArgs::default()
        };
        assert!(apply_mount_options(&mut a).is_err());
    }

    #[test]
    fn layerfs_options_set_the_long_option_fields() {
        let a = opts(
            "rw,lowerdir=/l,upperdir=/u,state=/s,policy=/p,log_file=/log,scratch=a/**,\
             scratch=b\\,c/**,threads=3,lower_timeout=250ms,journal_max_size=1M,noexec,\
             _netdev,nofail,user,owner,X-mount.mkdir,x-systemd.requires=nfs.mount",
        )
        .unwrap();
        assert_eq!(a.state, Some(PathBuf::from("/s")));
        assert_eq!(a.policy_file, Some(PathBuf::from("/p")));
        assert_eq!(a.log_file, Some(PathBuf::from("/log")));
        assert_eq!(a.scratch, vec!["a/**".to_string(), "b,c/**".to_string()]);
        assert_eq!(a.threads, Some(3));
        assert_eq!(a.lower_timeout, Some(Duration::from_millis(250)));
        assert!(a.no_exec);
        // journal_max_size only adjusts a journal that is on.
        assert!(a.journal.is_none());
        let mut j = MountArgs {
            journal: Some(Default::default()),
            options: vec!["journal_max_size=1M,journal_max_age=2h".into()],
            ..MountArgs::default()
        };
        apply_mount_options(&mut j).unwrap();
        let jo = j.journal.as_ref().unwrap();
        assert_eq!(
            (jo.max_bytes, jo.max_age),
            (1 << 20, Duration::from_secs(7200))
        );
        j.options = vec!["no_journal".into()];
        apply_mount_options(&mut j).unwrap();
        assert!(j.journal.is_none());
        assert!(!opts("noexec,exec").unwrap().no_exec);
    }

    #[test]
    fn bad_layerfs_options_name_the_option() {
        for (o, needle) in [
            ("threads=many", "`many` is not a number"),
            ("lower_timeout=soon", "invalid duration"),
            ("journal_max_size=big", "invalid size"),
            ("noexec=1", "takes no value"),
            ("policy=", "-o policy= needs a value"),
            ("frob=1", "unknown mount option `frob=1`"),
        ] {
            match opts(o) {
                Err(ConfigError::Usage(m)) => assert!(m.contains(needle), "{o}: {m}"),
                other => panic!("{o} accepted: {other:?}"),
            }
        }
        let mut a = MountArgs {
            policy_file: Some("/p".into()),
            options: vec!["policy=/q".into()],
            ..MountArgs::default()
        };
        assert!(
            matches!(apply_mount_options(&mut a), Err(ConfigError::Usage(m)) if m.contains("given twice"))
        );
    }

    #[test]
    fn sloppy_split_keeps_known_options_whole() {
        let (kept, dropped) =
            split_known_options(&["lowerdir=/a\\,b,frob,upperdir=/u,x-y=1,zap=2".into()]);
        assert_eq!(dropped, vec!["frob".to_string(), "zap=2".to_string()]);
        let a = opts(&kept.join(",")).unwrap();
        assert_eq!(a.lowers, vec![PathBuf::from("/a,b")]);
        assert_eq!(a.upper, Some(PathBuf::from("/u")));
    }

    #[test]
    fn work_default_is_hidden_sibling() {
        assert_eq!(
            default_work_dir(Path::new("/var/lib/x/upper")).unwrap(),
            PathBuf::from("/var/lib/x/.upper.layerfs-work")
        );
    }
}
