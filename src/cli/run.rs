//! `layerfs run`: arguments and help; the work is in `crate::run`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::config;
use crate::run::binds::BindArg;
use crate::run::Options;

const RUN_HELP: &str = "\
Examples:
  # a throwaway copy of the shared tree: changes vanish afterwards
  layerfs run --lower /srv/shared --ephemeral -- make test

  # the agent's persistent workspace, JSON summary, limits
  layerfs run --lower /srv/shared --upper ~/ws/upper --cwd src \\
              --max-output 64K --timeout 5m --memory 2G --pids 512 \\
              --json -- cargo build

  # undo per command: a checkpoint before it, `layerfs undo` takes it back
  layerfs run --lower /srv/shared --upper ~/ws/upper --checkpoint -- make fmt
  layerfs undo ~/ws/upper

  # a throwaway fork of checkpoint `start` of ~/ws/upper
  layerfs run --fork ~/ws/upper:start --ephemeral -- make test

  # offline, with staged inputs read-only and a kept package cache
  layerfs run --lower /srv/shared --upper ~/ws/upper --no-network \\
              --ro-bind /tmp/inputs:/inputs --home ~/agent-home \\
              -- npm install --offline /inputs/pkg.tgz

The command runs in private mount, pid and IPC namespaces where the
workspace is the only writable place: the rest of the host is read-only,
/tmp, /dev/shm and /run are private (one tmpfs of --tmp-size, gone
afterwards; /run hides the host's service sockets), /proc shows only the
sandbox's processes, the kernel's settings in /proc/sys and /sys are
read-only and its sensitive files masked, and the workspace's own upper,
work and state directories are hidden. As root, the command keeps root's
file permissions but not the capabilities to mount or to administer the
host. The workspace appears at /workspace (--at PATH to choose), whatever
its mountpoint on the host is (for --upper DIR without a live mount,
.DIR-NAME.layerfs-mnt beside DIR; a live mount of the same upper is used
as it is and left mounted); that host path is hidden. TMPDIR is /tmp and
LAYERFS_WORKSPACE names the workspace's path in the sandbox; HOME is a
private directory at /home/sandbox (--home). Host paths come in only
through --ro-bind and --bind, checked as you. When the command exits,
every process it left behind is killed; a command that keeps writing past
--max-output is stopped (--overflow).

The command runs in a session of its own and never gets the caller's
terminal: when stdin, stdout or stderr is a terminal, it gets a
pseudo-terminal of the sandbox on those, which layerfs run relays (the
caller's terminal in raw mode meanwhile; window size followed; Ctrl-C
goes to the command through it). Other output is relayed as it comes.
Ctrl-C or SIGTERM sent to layerfs run stop the command (after 5 s, or at
a second one, it is killed) and still unmount. As a user other than root
this needs unprivileged user namespaces (and fusermount3 to mount).

Exit status: the command's own; 128+N if signal N ended it (137 when
stopped for its output or killed by the OOM killer at --memory); 124 if
--timeout killed it; 125 if layerfs run itself failed (mounting, sandbox);
126 if the command could not be executed, 127 if it was not found; 2 for a
usage error (a --cwd outside the workspace too).";

#[derive(Args, Debug)]
#[command(after_help = RUN_HELP)]
// One of --upper and --ephemeral: a missing one names both.
#[command(group(clap::ArgGroup::new("place").required(true).args(["upper", "ephemeral"])))]
pub struct RunCmd {
    /// Read-only lower layer; repeat for more, the first given is topmost.
    #[arg(
        long = "lower",
        value_name = "DIR",
        required_unless_present = "fork",
        conflicts_with = "fork"
    )]
    lowers: Vec<PathBuf>,

    /// Run in a new fork of checkpoint NAME of WORKSPACE (a mountpoint,
    /// upper or state dir): its lowers are the checkpoint's layers over
    /// WORKSPACE's shared lowers, its upper the --upper given (missing or
    /// empty; kept afterwards) or, with --ephemeral, a temporary one.
    #[arg(long, value_name = "WORKSPACE:NAME", value_parser = parse_fork)]
    fork: Option<(PathBuf, String)>,

    /// Take a checkpoint of the workspace (live, on the mount the command
    /// runs in) right before the command: `layerfs undo UPPER` afterwards
    /// goes back to the state before it. Recorded in `layerfs log`; its
    /// name is printed on stderr (and is `checkpoint` in --json).
    #[arg(long, requires = "upper")]
    checkpoint: bool,

    /// Persistent upper directory: the command's changes land and stay
    /// here. A live mount of it is reused (with the same lowers). Give it
    /// or --ephemeral.
    #[arg(long, value_name = "DIR", conflicts_with = "ephemeral")]
    upper: Option<PathBuf>,

    /// Use a temporary upper, removed afterwards (unless --keep), instead
    /// of --upper.
    #[arg(long)]
    ephemeral: bool,

    /// With --ephemeral: keep the temporary upper and say where it is.
    #[arg(long, requires = "ephemeral")]
    keep: bool,

    /// Path policy file for the mount (hide/readonly/protect rules).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,

    /// Working directory of the command, relative to the workspace root;
    /// refused if it leads outside the workspace [default: the root].
    #[arg(long, value_name = "SUBDIR")]
    cwd: Option<PathBuf>,

    /// Where the command sees the workspace: an absolute path in the
    /// sandbox, made there if the host has no such directory (not under
    /// /proc, /sys or /dev).
    #[arg(long, value_name = "PATH", default_value = "/workspace")]
    at: PathBuf,

    /// Relay only the first BYTES of output (stdout and stderr together,
    /// e.g. 64K, 1M); the rest is counted and dropped, and a note on
    /// stderr says so.
    #[arg(long, value_name = "BYTES", value_parser = config::parse_size)]
    max_output: Option<u64>,

    /// What happens to a command that keeps writing past --max-output:
    /// `stop` (kill it once its output passes 64 times the cap, at least
    /// 1 MiB, or 10 s after passing the cap; exit 137) or `discard` (keep
    /// it running, dropping the rest).
    #[arg(long, value_name = "stop|discard", default_value = "stop",
          value_parser = ["stop", "discard"], requires = "max_output")]
    overflow: String,

    /// Kill the command and everything it started after this long
    /// (e.g. 30s, 5m, 1h), and exit 124.
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout)]
    timeout: Option<Duration>,

    /// Share the host's network (the default).
    #[arg(long, overrides_with = "no_network")]
    network: bool,

    /// Run in a network namespace of its own: loopback only.
    #[arg(long, overrides_with = "network")]
    no_network: bool,

    /// Memory the sandbox's private /tmp, /dev/shm and /run may hold
    /// together (e.g. 512M, 2G; at least 1M) [default: a quarter of the
    /// machine's memory, MemTotal in /proc/meminfo].
    #[arg(long, value_name = "SIZE", value_parser = parse_tmp_size)]
    tmp_size: Option<u64>,

    /// Memory the command and everything it starts may use together
    /// (e.g. 512M, 2G); beyond it the kernel's OOM killer ends a process,
    /// reported as such. Needs a cgroup (root, or cgroup v2 delegation).
    #[arg(long, value_name = "SIZE", value_parser = config::parse_size)]
    memory: Option<u64>,

    /// Most processes (and threads) the command may have at once.
    #[arg(long, value_name = "N", value_parser = crate::run::cgroup::parse_pids)]
    pids: Option<u64>,

    /// CPU time per 100 ms period, in CPUs (e.g. 0.5, 2).
    #[arg(long, value_name = "N", value_parser = crate::run::cgroup::parse_cpus)]
    cpus: Option<f64>,

    /// Let symlinks in the workspace point under PREFIX too (repeatable),
    /// besides the policy's allow-host list (by default /usr, /bin, /lib,
    /// /lib64, /opt): e.g. a pyenv, conda or ~/.local interpreter that
    /// `python3 -m venv` links to. Not for a live mount (its policy is its
    /// own).
    #[arg(long = "allow-host", value_name = "PREFIX")]
    allow_host: Vec<PathBuf>,

    /// Bind a host path into the sandbox read-only, at SANDBOX or at the
    /// same path (repeatable). Refused for the workspace's own directories.
    #[arg(long = "ro-bind", value_name = "HOST[:SANDBOX]")]
    ro_binds: Vec<OsString>,

    /// Bind a host path into the sandbox writable (repeatable), e.g. a
    /// package cache; only where you may write, never a lower or the
    /// workspace's own directories, nor /proc, /sys or /dev.
    #[arg(long = "bind", value_name = "HOST[:SANDBOX]")]
    binds: Vec<OsString>,

    /// The command's HOME: `private` (a fresh empty directory per run, at
    /// /home/sandbox), `host` (yours, read-only like the rest of the host)
    /// or a DIR of yours kept between runs (bound writable at
    /// /home/sandbox).
    #[arg(long, value_name = "private|host|DIR", default_value = "private",
          value_parser = crate::run::binds::Home::parse)]
    home: crate::run::binds::Home,

    /// Set NAME to VALUE in the command's environment (repeatable; last
    /// wins; overrides what layerfs run sets).
    #[arg(long = "env", value_name = "NAME=VALUE",
          value_parser = parse_env)]
    env: Vec<(OsString, OsString)>,

    /// Start the command's environment empty but for --env-keep names,
    /// --env values, TMPDIR, LAYERFS_WORKSPACE, HOME and a default PATH.
    #[arg(long)]
    env_clear: bool,

    /// With --env-clear: keep NAME from your environment (repeatable).
    #[arg(long = "env-keep", value_name = "NAME", requires = "env_clear")]
    env_keep: Vec<OsString>,

    /// At the end, print one JSON object on stdout: exit_code, signal,
    /// truncated, output_bytes, kept_bytes, duration_ms, upper, mountpoint, timed_out,
    /// output_stopped, resources (with --memory/--pids/--cpus: peak
    /// memory, CPU time, limits hit, OOM kills; else null), checkpoint
    /// (with --checkpoint: its name), and error when layerfs run failed.
    #[arg(long)]
    json: bool,

    /// The command to run and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// Parses `--timeout`: a humantime duration (`30s`, `5m`, `1h 30m`,
/// `500ms`) or a bare number of seconds; never zero.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let d = match t.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Duration::from_secs_f64(secs),
        Ok(_) => return Err(format!("invalid duration `{s}`")),
        Err(_) => humantime::parse_duration(t)
            .map_err(|e| format!("invalid duration `{s}`: {e} (e.g. 30s, 5m, 1h)"))?,
    };
    if d.is_zero() {
        return Err(format!("invalid duration `{s}`: must be more than zero"));
    }
    Ok(d)
}

/// Parses `--fork WORKSPACE:NAME` (a checkpoint's name has no `:`).
fn parse_fork(s: &str) -> Result<(PathBuf, String), String> {
    match s.rsplit_once(':') {
        Some((w, n)) if !w.is_empty() && !n.is_empty() => Ok((PathBuf::from(w), n.to_string())),
        _ => Err(format!(
            "invalid --fork `{s}`: give WORKSPACE:NAME, a workspace and one of its \
             checkpoints (layerfs checkpoint list WORKSPACE)"
        )),
    }
}

fn parse_env(s: &str) -> Result<(OsString, OsString), crate::run::env::AssignmentError> {
    crate::run::env::parse_assignment(std::ffi::OsStr::new(s))
}

/// The smallest `--tmp-size`.
const MIN_TMP_SIZE: u64 = 1 << 20;

/// Parses `--tmp-size`: a size with an optional unit, at least 1M (a
/// tmpfs of size 0 would be unlimited).
pub fn parse_tmp_size(s: &str) -> Result<u64, String> {
    let n = config::parse_size(s).map_err(|e| e.to_string())?;
    if n < MIN_TMP_SIZE {
        return Err(format!(
            "invalid size `{s}`: the sandbox's /tmp needs at least 1M (e.g. 512M, 2G)"
        ));
    }
    Ok(n)
}

impl RunCmd {
    pub fn run(self) -> i32 {
        crate::run::execute(Options {
            lowers: self.lowers,
            fork: self.fork,
            checkpoint: self.checkpoint,
            upper: self.upper,
            keep: self.keep,
            policy: self.policy,
            cwd: self.cwd.unwrap_or_default(),
            at: self.at,
            max_output: self.max_output,
            overflow_discard: self.overflow == "discard",
            timeout: self.timeout,
            network: !self.no_network,
            json: self.json,
            tmp_size: self.tmp_size,
            binds: bind_args(&self.ro_binds, false)
                .chain(bind_args(&self.binds, true))
                .collect(),
            home: self.home,
            allow_host: self.allow_host,
            limits: crate::run::cgroup::Limits {
                memory: self.memory,
                pids: self.pids,
                cpus: self.cpus,
            },
            env: crate::run::env::EnvPlan {
                clear: self.env_clear,
                keep: self.env_keep,
                set: self.env,
            },
            command: self.command,
        })
    }
}

fn bind_args(v: &[OsString], writable: bool) -> impl Iterator<Item = BindArg> + '_ {
    v.iter().map(move |a| {
        let (host, sandbox) = crate::run::binds::parse(a);
        BindArg {
            host,
            sandbox,
            writable,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_with_units_or_as_seconds() {
        assert_eq!(parse_timeout("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_timeout("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_timeout("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_timeout("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("soon").is_err());
    }

    #[test]
    fn a_fork_is_a_workspace_and_a_checkpoint_name() {
        assert_eq!(
            parse_fork("/w/a:b:start").unwrap(),
            (PathBuf::from("/w/a:b"), "start".to_string())
        );
        for bad in ["start", ":start", "/w:", ""] {
            assert!(parse_fork(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tmp_sizes_need_a_unit_or_bytes_and_at_least_a_mebibyte() {
        assert_eq!(parse_tmp_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_tmp_size("2G").unwrap(), 2 << 30);
        for bad in ["0", "4K", "lots", "-1M", ""] {
            assert!(parse_tmp_size(bad).is_err(), "{bad}");
        }
    }
}
