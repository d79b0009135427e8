//! `layerfs run`: run one command in a sandboxed workspace and report how
//! it went — mount the workspace (or reuse its live mount), run the command
//! in the sandbox (`crate::sandbox`) relaying its output, unmount, clean up.
//!
//! Order of a run: stop signals blocked first (so a Ctrl-C at any point
//! still ends with the workspace unmounted), arguments checked, user
//! namespaces probed (unprivileged), workspace acquired, command
//! supervised, workspace released, temporary files removed, summary.

pub mod binds;
pub mod cgroup;
mod daemon;
pub mod env;
mod hosts;
mod live;
pub mod outcome;
mod relay;
mod rundir;
mod signals;
mod supervise;
mod terminal;

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::unistd::geteuid;

use crate::sandbox::{cwd, places, userns};
use daemon::{OwnMount, Plan};
use live::LiveMount;
use outcome::{End, Failure, Outcome};
use relay::Relay;
use rundir::RunDir;
use signals::StopSignals;

/// A step of preparing the run's workspace that failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("upper {} has no name to place a mountpoint beside it", .0.display())]
    UpperWithoutName(PathBuf),
    /// The persistent upper's mountpoint already holds a mount that is
    /// not a layerfs mount of the caller's (`owner`: its uid, if known).
    #[error(
        "run mountpoint {} is already a {fstype} mount of {}: unmount it first (umount {})",
        mountpoint.display(),
        owner.map_or_else(|| "another user".to_string(), |u| format!("uid {u}")),
        mountpoint.display()
    )]
    MountpointTaken {
        mountpoint: PathBuf,
        fstype: String,
        owner: Option<u32>,
    },
    /// The mountpoint beside the upper, refused by its rules.
    #[error(transparent)]
    Mountpoint(#[from] crate::layer::safedir::SafeDirError),
    /// The workspace of the upper, not found.
    #[error(transparent)]
    Workspace(#[from] crate::state::workspace::WorkspaceError),
    #[error(
        "--checkpoint: the workspace of {} is not served at {}",
        upper.display(),
        mountpoint.display()
    )]
    NotServed { upper: PathBuf, mountpoint: PathBuf },
    /// The checkpoint before the command.
    #[error("--checkpoint: {0}")]
    Checkpoint(#[source] crate::state::ops::OpsError),
}

/// What `layerfs run` was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// Empty with `fork`.
    pub lowers: Vec<PathBuf>,
    /// `--fork WORKSPACE:NAME`: run in a new fork of that checkpoint.
    pub fork: Option<(PathBuf, String)>,
    /// `--checkpoint`: checkpoint the workspace before the command.
    pub checkpoint: bool,
    /// `None` with `--ephemeral`.
    pub upper: Option<PathBuf>,
    pub keep: bool,
    pub policy: Option<PathBuf>,
    pub cwd: PathBuf,
    /// Where the command sees the workspace (`--at`).
    pub at: PathBuf,
    pub max_output: Option<u64>,
    /// `--overflow discard`: keep a command running past `--max-output`.
    pub overflow_discard: bool,
    pub timeout: Option<Duration>,
    pub network: bool,
    pub json: bool,
    /// `--tmp-size`; `None`: `default_tmp_size()`.
    pub tmp_size: Option<u64>,
    /// `--bind` and `--ro-bind`, in the order given.
    pub binds: Vec<binds::BindArg>,
    pub home: binds::Home,
    pub env: env::EnvPlan,
    /// `--memory`, `--pids`, `--cpus`.
    pub limits: cgroup::Limits,
    /// `--allow-host`: more prefixes absolute symlink targets may lie in.
    pub allow_host: Vec<PathBuf>,
    pub command: Vec<OsString>,
}

/// The default `--tmp-size`: a quarter of the machine's memory (`MemTotal`),
/// rounded down to whole MiB, or 1 GiB when that cannot be read. Whole MiB:
/// tmpfs rounds a size up to whole pages, so an unaligned quarter (most
/// `MemTotal`s) would show in `df` as a little more than layerfs asked for.
pub fn default_tmp_size() -> u64 {
    const MIB: u64 = 1 << 20;
    fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024 / 4 / MIB * MIB)
        })
        .filter(|b| *b > 0)
        .unwrap_or(1 << 30)
}

/// A line on stderr; a closed stderr is ignored rather than a panic.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// Runs it all; returns the exit code.
pub fn execute(opts: Options) -> i32 {
    let (outcome, stdout_at_line_start) = match StopSignals::install() {
        Ok(stop) => run(&opts, &stop),
        Err(e) => (Outcome::failed(Failure::Runtime(e.to_string())), true),
    };
    summarize(&opts, &outcome, stdout_at_line_start);
    outcome.exit_code()
}

fn run(opts: &Options, stop: &StopSignals) -> (Outcome, bool) {
    let fail = |f: Failure| (Outcome::failed(f), true);
    let cwd = match cwd::check(&opts.cwd) {
        Ok(c) => c,
        Err(e) => return fail(Failure::Usage(e.to_string())),
    };
    let at = match places::check(&opts.at, "--at") {
        Ok(a) => a,
        Err(e) => return fail(Failure::Usage(e.to_string())),
    };
    if !geteuid().is_root() {
        if let Err(e) = userns::probe() {
            return fail(Failure::Runtime(e.to_string()));
        }
    }
    let rundir = match RunDir::create() {
        Ok(d) => d,
        Err(e) => return fail(Failure::Runtime(e.to_string())),
    };
    let mut relay = Relay::new(opts.max_output);
    let mut outcome = match Workspace::acquire(opts, &rundir, stop) {
        Err(end) => Outcome {
            end,
            ..Outcome::failed(Failure::Runtime(String::new()))
        },
        Ok(mut ws) => {
            let checkpoint = if opts.checkpoint {
                ws.checkpoint().map(Some)
            } else {
                Ok(None)
            };
            let (ran, resources) = match &checkpoint {
                Ok(_) => launch(opts, &ws, &rundir, (&at, &cwd), &mut relay, stop),
                Err(e) => (
                    supervise::Ran {
                        end: End::Failed(Failure::Runtime(e.to_string())),
                        duration: Duration::ZERO,
                    },
                    None,
                ),
            };
            for w in ws.release() {
                say!("layerfs run: warning: {w}");
            }
            Outcome {
                end: ran.end,
                output_bytes: relay.total(),
                kept_bytes: relay.kept(),
                duration: ran.duration,
                upper: Some(ws.upper.clone()),
                mountpoint: Some(ws.mountpoint.clone()),
                checkpoint: checkpoint.ok().flatten(),
                resources,
            }
        }
    };
    if opts.upper.is_none() && outcome.upper.is_none() {
        outcome.upper = Some(rundir.ephemeral_upper());
    }
    if opts.upper.is_none() && opts.keep {
        for w in rundir.remove_transient() {
            say!("layerfs run: warning: {w}");
        }
        say!(
            "layerfs run: kept the workspace in {dir}: upper {upper} (`layerfs diff {upper}` \
             shows its changes; remove {dir} when done)",
            dir = rundir.path().display(),
            upper = rundir.ephemeral_upper().display()
        );
    } else if let Err(w) = rundir.remove() {
        say!("layerfs run: warning: {w}");
    }
    (outcome, relay.stdout_at_line_start())
}

/// Checks the binds, makes the cgroup and runs the command in the sandbox;
/// with what it used when limits were asked for. `places`: the workspace's
/// place in the sandbox and the checked `--cwd`.
fn launch(
    opts: &Options,
    ws: &Workspace,
    rundir: &RunDir,
    places: (&Path, &Path),
    relay: &mut Relay,
    stop: &StopSignals,
) -> (supervise::Ran, Option<(cgroup::Usage, Duration)>) {
    let (at, cwd) = places;
    let failed = |f: Failure| supervise::Ran {
        end: End::Failed(f),
        duration: Duration::ZERO,
    };
    let hide = ws.private_dirs(rundir);
    let mut private = hide.clone();
    private.push(ws.mountpoint.clone());
    let fence = binds::Fence {
        private: &private,
        lowers: &ws.lowers,
        at,
    };
    let binds = match checked_binds(opts, &fence) {
        Ok(b) => b,
        Err(e) => return (failed(Failure::Usage(e.to_string())), None),
    };
    let cg = if opts.limits.any() {
        match cgroup::Cgroup::create(opts.limits) {
            Ok(c) => Some(c),
            Err(e) => return (failed(Failure::Runtime(e.to_string())), None),
        }
    } else {
        None
    };
    let launch = supervise::Launch {
        workspace: &ws.mountpoint,
        at,
        stage: rundir.stage(),
        cwd,
        network: opts.network,
        command: &opts.command,
        timeout: opts.timeout,
        tmp_size: opts.tmp_size.unwrap_or_else(default_tmp_size),
        hide: &hide,
        binds: &binds,
        home: &opts.home,
        env: &opts.env,
        stop_on_overflow: !opts.overflow_discard,
        cgroup: cg.as_ref(),
    };
    let ran = supervise::run(&launch, relay, stop);
    (ran, cg.map(|c| (c.usage(), c.setup)))
}

/// `--home DIR`, `--bind` and `--ro-bind`, each checked as the caller.
fn checked_binds(
    opts: &Options,
    fence: &binds::Fence<'_>,
) -> Result<Vec<crate::sandbox::binds::Bind>, binds::BindArgError> {
    let mut out = Vec::new();
    if let binds::Home::Dir(d) = &opts.home {
        let home = binds::BindArg {
            host: d.clone(),
            sandbox: Some(PathBuf::from(crate::sandbox::binds::HOME)),
            writable: true,
        };
        out.push(binds::check(&home, fence, "--home")?);
    }
    for b in &opts.binds {
        let what = if b.writable { "--bind" } else { "--ro-bind" };
        out.push(binds::check(b, fence, what)?);
    }
    Ok(out)
}

/// Messages on stderr and the `--json` object on stdout.
fn summarize(opts: &Options, o: &Outcome, stdout_at_line_start: bool) {
    match &o.end {
        End::Failed(f) => say!("layerfs run: {}", f.message()),
        End::TimedOut => say!(
            "layerfs run: timed out after {}; killed the command and every process it started",
            humantime::format_duration(opts.timeout.unwrap_or_default())
        ),
        End::Stopped(sig) => say!(
            "layerfs run: stopped by {}; killed the command and every process it started",
            signal_name(*sig)
        ),
        End::OutputStopped => say!(
            "layerfs run: output ran past --max-output {} and went on: stopped the command \
             and every process it started after {} bytes (at {} bytes or {} s past the cap; \
             --overflow discard keeps it running)",
            opts.max_output.unwrap_or(0),
            o.output_bytes,
            relay::stop_bound(opts.max_output.unwrap_or(0)),
            relay::STOP_AFTER.as_secs()
        ),
        End::Exited(_) | End::Signaled(_) => {}
    }
    if let Some((u, _)) = &o.resources {
        if u.oom_kills > 0 {
            say!(
                "layerfs run: the out-of-memory killer killed {} process(es) of the command: \
                 it needed more than --memory {}",
                u.oom_kills,
                opts.limits.memory.unwrap_or(0)
            );
        }
        if u.limits_hit.contains(&"pids") {
            say!(
                "layerfs run: the command reached --pids {}: creating more processes failed",
                opts.limits.pids.unwrap_or(0)
            );
        }
    }
    if o.truncated() {
        say!(
            "layerfs run: output truncated by --max-output: relayed the first {} of {} bytes \
             (stdout and stderr together); {} bytes dropped",
            o.kept_bytes,
            o.output_bytes,
            o.output_bytes - o.kept_bytes
        );
    }
    if opts.json {
        let mut out = String::new();
        if !stdout_at_line_start {
            out.push('\n');
        }
        out.push_str(&format!("{}\n", o.to_json()));
        // A closed stdout (`| head`) is no reason to fail or panic.
        let _ = std::io::stdout().lock().write_all(out.as_bytes());
    }
}

fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

/// A path made absolute and resolved where it exists, for comparing with
/// what a live mount recorded (`layerfs mount` canonicalizes too).
fn canonical(p: &Path) -> PathBuf {
    fs::canonicalize(p)
        .or_else(|_| std::path::absolute(p))
        .unwrap_or_else(|_| p.to_path_buf())
}

/// The stable mountpoint of a persistent upper when no live mount exists:
/// a hidden sibling, like the default work and state dirs. Stable across
/// runs, so absolute paths tools record in the workspace (a Python venv,
/// build caches) stay valid from one run to the next.
pub fn default_mountpoint(upper: &Path) -> Result<PathBuf, RunError> {
    let name = upper
        .file_name()
        .ok_or_else(|| RunError::UpperWithoutName(upper.to_path_buf()))?;
    let parent = upper.parent().unwrap_or(Path::new("/"));
    Ok(parent.join(format!(".{}.layerfs-mnt", name.to_string_lossy())))
}

/// Makes (or checks) the mountpoint beside a persistent upper. The mount
/// daemon names it by path, so it must be where it was checked when the
/// mount happens: it is created with `mkdirat` (or found) without
/// following a link at its name, must be the caller's and writable only
/// by them, and nobody else may be able to rename anything on the way to
/// it (`SafeDir::create_stable`). Otherwise whoever can write the upper's
/// parent could plant `.NAME.layerfs-mnt -> /some/dir` and have the
/// workspace mounted over a directory of their choosing. A stale layerfs
/// mount of the caller's left there by a killed run is left to the mount
/// daemon, which detaches it.
fn persistent_mountpoint(mp: &Path) -> Result<(), RunError> {
    use crate::layer::safedir::{Role, SafeDir};
    if let Some(m) = crate::host::mounts::find(mp) {
        let mine = m.is_layerfs() && m.owner_uid() == Some(geteuid().as_raw());
        if !mine {
            return Err(RunError::MountpointTaken {
                mountpoint: mp.to_path_buf(),
                fstype: m.fstype.clone(),
                owner: m.owner_uid(),
            });
        }
        return Ok(SafeDir::stable_parent_fd(mp, Role::RunMountpoint).map(drop)?);
    }
    Ok(SafeDir::create_stable(mp, Role::RunMountpoint, 0o755).map(drop)?)
}

/// How the run holds its workspace mount.
enum Held {
    /// Somebody else's live mount: left alone.
    Live,
    /// Mounted by this run: unmounted at the end.
    Own(OwnMount),
}

struct Workspace {
    upper: PathBuf,
    /// Its lowers: the shared ones, and for a fork its frozen layers.
    lowers: Vec<PathBuf>,
    mountpoint: PathBuf,
    held: Held,
    /// A persistent upper's mountpoint directory, removed again if empty.
    made_mountpoint: Option<PathBuf>,
}

impl Workspace {
    fn acquire(opts: &Options, rundir: &RunDir, stop: &StopSignals) -> Result<Workspace, End> {
        let runtime = |m: String| End::Failed(Failure::Runtime(m));
        let mut lowers: Vec<PathBuf> = opts.lowers.iter().map(|l| canonical(l)).collect();
        let mut policy = opts.policy.as_deref().map(canonical);
        // A fork's upper is made here, with its stack; then it mounts like
        // any upper (the mount adds the stack's layers to the lowers).
        let mut frozen = Vec::new();
        if let Some((source, name)) = &opts.fork {
            let upper = opts
                .upper
                .clone()
                .unwrap_or_else(|| rundir.ephemeral_upper());
            let src = crate::state::workspace::Workspace::resolve(source)
                .map_err(|e| runtime(e.to_string()))?;
            let (_, shared, layers) = crate::state::checkpoint::fork_at(&src, name, &upper)
                .map_err(|e| runtime(e.to_string()))?;
            lowers = shared;
            frozen = layers;
            policy = policy.or(src.policy);
        }
        let (upper, mountpoint) = match &opts.upper {
            None => {
                let (u, m) = (rundir.ephemeral_upper(), rundir.ephemeral_mountpoint());
                for d in [&u, &m] {
                    daemon::ensure_dir(d)
                        .map_err(|e| runtime(format!("creating {}: {e}", d.display())))?;
                }
                (u, m)
            }
            Some(u) => {
                let upper = canonical(u);
                if !upper.is_dir() {
                    return Err(runtime(format!(
                        "upper {} does not exist or is not a directory: create it (mkdir -p {}) \
                         or use --ephemeral",
                        u.display(),
                        u.display()
                    )));
                }
                if let Some(live) =
                    live::find(&upper, &lowers, policy.as_deref()).map_err(End::Failed)?
                {
                    if !opts.allow_host.is_empty() {
                        let e = hosts::refused_for_live(&live.mountpoint, &opts.allow_host);
                        return Err(End::Failed(Failure::Usage(e.to_string())));
                    }
                    return Ok(Workspace::live(upper, live));
                }
                let mp = default_mountpoint(&upper).map_err(|e| runtime(e.to_string()))?;
                (upper, mp)
            }
        };
        let made = opts.upper.is_some().then(|| mountpoint.clone());
        if opts.upper.is_some() {
            persistent_mountpoint(&mountpoint).map_err(|e| runtime(e.to_string()))?;
        } else {
            daemon::ensure_dir(&mountpoint).map_err(|e| {
                runtime(format!("creating mountpoint {}: {e}", mountpoint.display()))
            })?;
        }
        let mount_policy = if opts.allow_host.is_empty() {
            policy.clone()
        } else {
            Some(
                hosts::extended_policy(policy.as_deref(), &opts.allow_host, rundir.path())
                    .map_err(|e| {
                        remove_empty_dir(made.as_deref());
                        End::Failed(Failure::Usage(e.to_string()))
                    })?,
            )
        };
        let plan = Plan {
            lowers: &lowers,
            upper: &upper,
            policy: mount_policy.as_deref(),
            mountpoint: &mountpoint,
        };
        match daemon::start(&plan, rundir, stop) {
            Ok(own) => Ok(Workspace {
                upper,
                lowers: lowers.into_iter().chain(frozen).collect(),
                mountpoint,
                held: Held::Own(own),
                made_mountpoint: made,
            }),
            // A concurrent run mounted the same upper first: use its mount.
            Err(End::Failed(f)) if daemon::is_busy_error(&f) => {
                remove_empty_dir(made.as_deref());
                match live::find(&upper, &lowers, policy.as_deref()).map_err(End::Failed)? {
                    Some(live) => Ok(Workspace::live(upper, live)),
                    None => Err(End::Failed(f)),
                }
            }
            Err(end) => {
                remove_empty_dir(made.as_deref());
                Err(end)
            }
        }
    }

    fn live(upper: PathBuf, live: LiveMount) -> Workspace {
        tracing::debug!(
            "running in the live mount {} (daemon pid {})",
            live.mountpoint.display(),
            live.pid
        );
        Workspace {
            upper,
            lowers: live.lowers,
            mountpoint: live.mountpoint.clone(),
            held: Held::Live,
            made_mountpoint: None,
        }
    }

    /// The host directories the command must not see: the workspace's
    /// upper, work and state directories (the state directory holds the
    /// daemon's control socket, which trusts any process of the caller's
    /// uid) and the run's temporary directory. Those the daemon recorded,
    /// and the default ones beside the upper.
    fn private_dirs(&self, rundir: &RunDir) -> Vec<PathBuf> {
        let mut dirs = vec![rundir.path().to_path_buf(), self.upper.clone()];
        if let Ok(desc) = crate::state::workspace::Workspace::resolve(&self.mountpoint) {
            dirs.extend([desc.upper, desc.work, desc.state]);
        }
        dirs.push(crate::state::workspace::default_state_dir(&self.upper));
        if let Ok(work) = crate::config::default_work_dir(&self.upper) {
            dirs.push(work);
        }
        dirs
    }

    /// `--checkpoint`: checkpoints the mounted workspace through its
    /// daemon and records it in the journal; returns its name.
    fn checkpoint(&self) -> Result<String, RunError> {
        // By its upper: a daemon this run started is not registered under
        // the name `layerfs` (it runs as /proc/self/exe), so its mountpoint
        // does not lead to its state dir.
        let ws = crate::state::workspace::Workspace::resolve(&self.upper)?;
        if ws.mountpoint.is_none() {
            return Err(RunError::NotServed {
                upper: self.upper.clone(),
                mountpoint: self.mountpoint.clone(),
            });
        }
        // Durable once the daemon has answered and synced: the command
        // need not wait for the disk (docs/branch.md, "Speed").
        let done = crate::state::ops::checkpoint(
            &ws,
            None,
            None,
            None,
            crate::state::checkpoint::Durability::Deferred,
        )
        .map_err(RunError::Checkpoint)?;
        for w in &done.warnings {
            say!("layerfs run: warning: {w}");
        }
        let name = done.value;
        say!(
            "layerfs run: checkpoint {name} taken before the command (`layerfs undo {}` goes \
             back to it)",
            self.upper.display()
        );
        Ok(name)
    }

    /// Unmounts what this run mounted; returns warnings.
    fn release(&mut self) -> Vec<String> {
        let warnings = match &mut self.held {
            Held::Live => Vec::new(),
            Held::Own(own) => own.stop(),
        };
        remove_empty_dir(self.made_mountpoint.as_deref());
        warnings
    }
}

fn remove_empty_dir(p: Option<&Path>) {
    if let Some(p) = p {
        let _ = fs::remove_dir(p);
    }
}
