//! `validate`: raw arguments to a checked `Config`, every check in the
//! order it must run (options first, then the layers, the work dir, the
//! mountpoint, the policy, the state dir).

use std::fs;

use super::dirs::{resolve_state, resolve_work};
use super::mountpoint::{check_dev_fuse, check_empty, resolve_mountpoint};
use super::options::apply_mount_options;
use super::paths::{absolute, existing_dir, is_within};
use super::{
    default_threads, invalid, usage, Config, ConfigError, MountArgs, DEFAULT_LOWER_TIMEOUT,
    DEFAULT_READAHEAD,
};
use crate::policy::Policy;

/// Everything the arguments lack of a mount (lowers, upper, mountpoint),
/// named in one usage error.
fn missing_parts(args: &MountArgs) -> Result<(), ConfigError> {
    let mut missing = Vec::new();
    if args.lowers.is_empty() {
        missing.push(
            "no lower layer: give --lower DIR (repeatable, first is topmost) or -o lowerdir=A:B",
        );
    }
    if args.upper.is_none() {
        missing.push("no upper layer: give --upper DIR or -o upperdir=DIR");
    }
    if args.mountpoint.as_os_str().is_empty() {
        missing.push("no mountpoint: give MOUNTPOINT, an existing empty directory, last");
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(usage(format!(
        "{}; e.g. layerfs mount --lower /srv/shared --upper ~/ws/upper ~/ws/mnt",
        missing.join("; ")
    )))
}

/// `p` with its longest existing ancestor made canonical and the rest
/// appended: where `p` will be once created.
fn as_far_as_it_exists(p: &std::path::Path) -> std::path::PathBuf {
    let mut rest = Vec::new();
    let mut cur = p;
    loop {
        if let Ok(c) = fs::canonicalize(cur) {
            return rest.iter().rev().fold(c, |acc, n| acc.join(n));
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                cur = parent;
            }
            _ => return p.to_path_buf(),
        }
    }
}

/// Turns raw arguments into a checked `Config`. May create the work
/// directory and detach a stale layerfs mount on the mountpoint.
///
/// Long on purpose: each check in turn on the raw arguments, in the order
/// the errors should be reported; most checks are helpers of their own.
pub fn validate(mut args: MountArgs) -> Result<Config, ConfigError> {
    apply_mount_options(&mut args)?;
    missing_parts(&args)?;
    let upper_raw = args.upper.clone().unwrap_or_default();
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
    // Before its existence is checked: an upper that does not exist yet
    // inside a lower must not be answered with `mkdir -p` there.
    let upper_probe = as_far_as_it_exists(&absolute(&upper_raw)?);
    for l in &lowers {
        if is_within(&upper_probe, l) {
            return Err(invalid(format!(
                "upper {} is inside lower {}: the upper must be outside every lower (layerfs \
                 never writes to a lower); give --upper (upperdir=) a directory elsewhere, \
                 e.g. beside the mountpoint",
                upper_raw.display(),
                l.display()
            )));
        }
    }
    let upper = existing_dir(&upper_raw, "upper", "--upper (upperdir=)")?;
    for l in &lowers {
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
        lower_passthrough: args.lower_passthrough,
        lower_timeout: args.lower_timeout.unwrap_or(DEFAULT_LOWER_TIMEOUT),
        max_watches: args.max_watches,
        readahead: args.readahead.unwrap_or(DEFAULT_READAHEAD),
        log_file,
        created_work: created_work.keep(),
        scratch: args.scratch,
    })
}
