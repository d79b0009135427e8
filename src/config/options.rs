//! The `-o` mount options: splitting at unescaped commas, the options
//! layerfs reads, the generic ones it accepts and ignores, and folding them
//! into the long-option fields of `MountArgs`.

use std::path::PathBuf;

use super::values::{parse_age, parse_duration, parse_size};
use super::{usage, ConfigError, MountArgs};

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
pub const LAYERFS_OPTIONS: [(&str, Option<&str>, &str); 21] = [
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
        "lower_passthrough",
        None,
        "read-only opens of lower files bypass the daemon (as --lower-passthrough)",
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
        "readahead",
        Some("SIZE"),
        "the mount's readahead, 0 for the kernel's (as --readahead)",
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
///
/// Long on purpose: one arm per `-o` key, so the whole option table and
/// its conflicts with the long options are read in one place.
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
            "lower_passthrough" => {
                flag(value)?;
                args.lower_passthrough = true;
            }
            "lower_timeout" => {
                args.lower_timeout =
                    Some(parse_duration(&need(value)?).map_err(|e| bad(e.to_string()))?);
            }
            "max_watches" => {
                let v = need(value)?;
                let n: usize = v
                    .parse()
                    .map_err(|_| bad(format!("`{v}` is not a number of watches")))?;
                args.max_watches = Some(n);
            }
            "readahead" => {
                args.readahead = Some(parse_size(&need(value)?).map_err(|e| bad(e.to_string()))?);
            }
            "journal_max_size" => {
                let size = parse_size(&need(value)?).map_err(|e| bad(e.to_string()))?;
                if let Some(j) = &mut args.journal {
                    j.max_bytes = size;
                }
            }
            "journal_max_age" => {
                let age = parse_age(&need(value)?).map_err(|e| bad(e.to_string()))?;
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
        "readahead" => "2M",
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
