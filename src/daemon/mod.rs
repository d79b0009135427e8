//! The daemon: mounting, readiness, signals, pid file and stale-mount
//! handling around one `fuser` session.
//!
//! Order matters here. Signals are blocked before any thread exists (so
//! only the signal thread sees them); a background daemon forks before any
//! thread exists; the layers are opened before the mount (so mounting over
//! a lower still works); readiness is reported only after the FUSE
//! handshake, so a `layerfs mount` that returned 0 has a live mountpoint.

pub mod control;
pub mod exclusive;
mod layers;
pub mod logging;
pub mod mounts;
pub mod notify;
pub mod readahead;
mod reset;
pub mod restore;
mod served;
mod service;
mod signals;

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use nix::unistd::ForkResult;

use crate::config::Config;
use crate::fuse::{session_config, Contained, LayerFs};
use crate::host::pidfile::PidFile;
use crate::layer::safedir::SafeDir;
use notify::SdNotify;

/// Why the mount failed, or its serving ended in error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("log file {}: {source}", path.display())]
    Log {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("pipe: {0}")]
    Pipe(#[source] std::io::Error),
    #[error("fork: {0}")]
    Fork(#[source] std::io::Error),
    /// The background daemon exited without a word; `log`: where it
    /// logged, if anywhere.
    #[error(
        "the daemon exited before the mount was live ({})",
        log.as_ref().map_or_else(
            || "rerun with --foreground to see why".to_string(),
            |p| format!("see {}", p.display())
        )
    )]
    ExitedEarly { log: Option<PathBuf> },
    /// What the background daemon reported before it exited.
    #[error("{0}")]
    Child(String),
    #[error(transparent)]
    Claim(#[from] exclusive::ClaimError),
    #[error("blocking signals: {0}")]
    Signals(#[source] nix::Error),
    /// The state dir, refused by its rules.
    #[error(transparent)]
    StateDir(#[from] crate::layer::safedir::SafeDirError),
    #[error(
        "state dir {} vanished before the mount started; mount again",
        .0.display()
    )]
    StateDirVanished(PathBuf),
    /// Another daemon answers on the control socket.
    #[error(transparent)]
    ControlInUse(control::BindError),
    /// Opening the layers and starting the filesystem.
    #[error(transparent)]
    Filesystem(crate::overlay::OverlayError),
    #[error(transparent)]
    Mount(#[from] mounts::MountError),
    #[error("duplicating the FUSE fd: {0}")]
    DupFuse(#[source] std::io::Error),
    #[error("FUSE handshake on {} failed: {source}", mountpoint.display())]
    Handshake {
        mountpoint: PathBuf,
        source: std::io::Error,
    },
    #[error("starting the service thread: {0}")]
    ServiceThread(#[source] std::io::Error),
    /// The fork's stack could not be made durable and put in place.
    #[error(transparent)]
    Placing(crate::state::frozen::StackError),
    #[error("serving {} failed: {source}", mountpoint.display())]
    Serve {
        mountpoint: PathBuf,
        source: std::io::Error,
    },
}

/// Mounts and serves `cfg`. In background mode the calling process
/// returns as soon as the mount is live (or failed) while a detached child
/// keeps serving. `Err` is why the mount failed or ended in error, for the
/// caller to print with its own prefix (`layerfs mount: `,
/// `mount.fuse.layerfs: `): the one exit path of `cli::exit`.
pub fn start(cfg: Config) -> Result<(), DaemonError> {
    start_placing(cfg, None)
}

/// `start` of a fork whose stack is staged (`checkpoint::stage_fork`):
/// the daemon places it while it starts, so the wait for the disk that
/// makes the fork durable runs beside the daemon's own start-up; the
/// mount is described (whose state dir fsync makes the stack's rename
/// durable) and appears only once it is placed.
pub fn start_placing(
    cfg: Config,
    staged: Option<crate::state::checkpoint::StagedFork>,
) -> Result<(), DaemonError> {
    let log = open_log(&cfg)?;
    if cfg.foreground {
        if let Some(f) = &log {
            redirect_fd(f.as_raw_fd(), libc::STDERR_FILENO);
        }
        let notify = SdNotify::from_env();
        serve(&cfg, &notify, staged, || {}).inspect_err(|e| {
            forget_created_work(&cfg);
            if log.is_some() {
                // The log file's own record; the caller prints it too.
                tracing::error!("{e}");
            }
        })
    } else {
        // A daemon still letting go of this workspace is waited for here,
        // where the wait can be told on the terminal; the child claims
        // for itself once it is gone.
        exclusive::claim_noting(&cfg, &mut |m| eprintln!("layerfs: {m}")).inspect_err(|_| {
            forget_created_work(&cfg);
        })?;
        background(cfg, log, staged)
    }
}

/// A mount that failed removes the work dir `layerfs mount` created for
/// it, if it is still empty (a refused mount leaves nothing behind).
fn forget_created_work(cfg: &Config) {
    if cfg.created_work {
        let _ = std::fs::remove_dir(&cfg.work);
    }
}

fn open_log(cfg: &Config) -> Result<Option<File>, DaemonError> {
    let Some(path) = &cfg.log_file else {
        return Ok(None);
    };
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(Some)
        .map_err(|source| DaemonError::Log {
            path: path.clone(),
            source,
        })
}

fn redirect_fd(from: i32, to: i32) {
    let _ = nix::unistd::dup2(from, to);
}

/// Forks; the child detaches and serves, the parent waits on a pipe for
/// "ok" (mount live) or the error text.
fn background(
    cfg: Config,
    log: Option<File>,
    staged: Option<crate::state::checkpoint::StagedFork>,
) -> Result<(), DaemonError> {
    let (mut reader, writer) = std::io::pipe().map_err(DaemonError::Pipe)?;
    // Nothing has spawned a thread before `start` (checked by the fork).
    match crate::sys::fork_single_threaded() {
        Err(e) => Err(DaemonError::Fork(e)),
        Ok(ForkResult::Parent { child }) => {
            drop(writer);
            let mut answer = String::new();
            let _ = reader.read_to_string(&mut answer);
            if answer.trim() == "ok" {
                return Ok(());
            }
            let _ = nix::sys::wait::waitpid(child, None);
            if answer.trim().is_empty() {
                Err(DaemonError::ExitedEarly {
                    log: cfg.log_file.clone(),
                })
            } else {
                Err(DaemonError::Child(answer.trim().to_string()))
            }
        }
        Ok(ForkResult::Child) => {
            drop(reader);
            let _ = nix::unistd::setsid();
            let _ = nix::unistd::chdir("/");
            if let Ok(null) = OpenOptions::new().read(true).write(true).open("/dev/null") {
                redirect_fd(null.as_raw_fd(), libc::STDIN_FILENO);
                redirect_fd(null.as_raw_fd(), libc::STDOUT_FILENO);
                let err = log.as_ref().map_or(null.as_raw_fd(), |f| f.as_raw_fd());
                redirect_fd(err, libc::STDERR_FILENO);
            }
            drop(log);
            let mut writer = Some(writer);
            let notify = SdNotify::from_env();
            let res = serve(&cfg, &notify, staged, || {
                if let Some(mut w) = writer.take() {
                    let _ = w.write_all(b"ok\n");
                }
            });
            let code = match res {
                Ok(()) => 0,
                Err(e) => {
                    forget_created_work(&cfg);
                    tracing::error!("{e}");
                    if let Some(mut w) = writer.take() {
                        let _ = w.write_all(e.to_string().as_bytes());
                    }
                    1
                }
            };
            std::process::exit(code);
        }
    }
}

/// `workspace.json` names the mountpoint while this lives, and no
/// mountpoint once it is dropped (the daemon is done, whichever way).
struct Described<'a>(&'a Config, &'a SafeDir);

/// A description staged and durable, not yet in place
/// (`Described::stage`): its wait for the disk overlaps a fork's placing.
struct Staged<'a> {
    cfg: &'a Config,
    state: &'a SafeDir,
    ok: bool,
}

impl<'a> Described<'a> {
    /// The mountpoint's description written aside and synced, and the
    /// state dir recorded on the upper and the mountpoint.
    fn stage(cfg: &'a Config, state: &'a SafeDir) -> Staged<'a> {
        record_places(cfg);
        let ok = crate::state::workspace::stage_description(state, &description(cfg, true))
            .inspect_err(|e| undescribed(cfg, e))
            .is_ok();
        Staged { cfg, state, ok }
    }
}

impl<'a> Staged<'a> {
    /// The description put in place and the state dir synced.
    fn place(self) -> Described<'a> {
        if self.ok {
            if let Err(e) = crate::state::workspace::place_description(self.state) {
                undescribed(self.cfg, &e);
            }
        }
        Described(self.cfg, self.state)
    }
}

impl Drop for Described<'_> {
    fn drop(&mut self) {
        if let Err(e) =
            crate::state::workspace::write_description(self.1, &description(self.0, false))
        {
            undescribed(self.0, &e);
        }
    }
}

/// What the state dir's `workspace.json` says of this mount, naming the
/// mountpoint while `mounted`.
fn description(cfg: &Config, mounted: bool) -> crate::state::workspace::Description<'_> {
    crate::state::workspace::Description {
        upper: &cfg.upper,
        lowers: &cfg.lowers,
        work: &cfg.work,
        mountpoint: mounted.then_some(cfg.mountpoint.as_path()),
        last_mountpoint: Some(&cfg.mountpoint),
        policy: cfg.policy_file.as_deref(),
        scratch: &cfg.scratch,
    }
}

/// Before the mount covers the mountpoint: both directories say where
/// the state is (`state::place`), for commands run later.
fn record_places(cfg: &Config) {
    let unrecorded = |dir: &std::path::Path, e: std::io::Error| {
        format!(
            "cannot record the state dir on {}: {e}; once unmounted, state commands given \
             it need --state {}",
            dir.display(),
            cfg.state.display()
        )
    };
    if let Err(e) = crate::state::place::record(&cfg.upper, &cfg.state) {
        tracing::warn!("{}", unrecorded(&cfg.upper, e));
    }
    // A mountpoint may belong to someone else (or sit on a filesystem
    // without xattrs): the upper's record is the one that matters.
    if let Err(e) = crate::state::place::record(&cfg.mountpoint, &cfg.state) {
        tracing::debug!("{}", unrecorded(&cfg.mountpoint, e));
    }
}

/// A description that could not be written is logged: the mount serves
/// on.
fn undescribed(cfg: &Config, e: &std::io::Error) {
    tracing::warn!(
        "cannot write {}/workspace.json: {e}; state commands given the upper directory \
         will not find this workspace",
        cfg.state.display()
    );
}

/// Starts the io_uring queues when INIT agreed to them; otherwise says
/// why `/dev/fuse` serves. Requests wait in the kernel (INIT agreed) until
/// the queues are up or have been given up, so this runs before the
/// session serves.
fn start_uring(
    handle: &crate::fuse::FsHandle,
    dev: &std::os::fd::OwnedFd,
    acl: fuser::SessionACL,
    threads: usize,
) -> Option<crate::fuse::uring::Transport> {
    let n = handle.negotiated()?;
    if !n.uring {
        tracing::warn!(
            "--io-uring: serving through /dev/fuse instead: {}",
            n.uring_refused.unwrap_or("the kernel did not agree to it")
        );
        return None;
    }
    // The queue threads answer the frequent requests themselves (`fast`;
    // not on a mount with a network lower), unless LAYERFS_URING_NO_FAST
    // is set (to measure what that saves, and for the tests that compare).
    let fast: Option<std::sync::Arc<dyn crate::fuse::uring::Fast>> =
        if std::env::var_os("LAYERFS_URING_NO_FAST").is_some() {
            None
        } else {
            handle
                .queue_answers(acl)
                .map(|a| std::sync::Arc::new(a) as std::sync::Arc<dyn crate::fuse::uring::Fast>)
        };
    match crate::fuse::uring::start(dev, n.init, acl, threads, fast, |side| {
        handle.queue_view(side)
    }) {
        Ok(t) => {
            tracing::info!(
                "serving through io_uring: {} queues of {} entries",
                t.stats.queues,
                t.stats.depth
            );
            handle.set_uring(t.stats.clone());
            Some(t)
        }
        Err(e) => {
            tracing::warn!("--io-uring: serving through /dev/fuse instead: {e}");
            None
        }
    }
}

/// Mounts, serves until unmounted, and cleans up. `on_ready` runs once the
/// mountpoint answers requests. An `Err` is the message for the user.
///
/// Long on purpose: the daemon's start-up order is the contract (state
/// dir, control socket, layers, description, mount, queues, ready, serve,
/// clean up) and each step's comment says why it comes where it does;
/// the steps themselves are calls into their modules.
fn serve(
    cfg: &Config,
    notify: &SdNotify,
    staged: Option<crate::state::checkpoint::StagedFork>,
    on_ready: impl FnOnce(),
) -> Result<(), DaemonError> {
    signals::block().map_err(DaemonError::Signals)?;
    // A fork's stack is made durable and put in place beside the start-up
    // (its fsyncs wait for the disk, the steps below for the CPU), and
    // waited for before the mount is described.
    let placing = staged.map(|f| std::thread::spawn(move || f.place()));
    // Before the layers are opened: opening clears the work dir.
    let _claim = exclusive::claim(cfg)?;
    // The state dir, checked again and held open: the control socket,
    // the journal and workspace.json are reached through its descriptor.
    let state_dir = std::sync::Arc::new(
        crate::state::workspace::open_state_dir(&cfg.state)?
            .ok_or_else(|| DaemonError::StateDirVanished(cfg.state.clone()))?,
    );
    // The control socket first: a workspace another daemon serves is
    // refused before anything is mounted.
    let control = match control::bind(state_dir.clone()) {
        Ok(c) => Some(c),
        Err(e @ control::BindError::InUse { .. }) => return Err(DaemonError::ControlInUse(e)),
        Err(e) => {
            tracing::warn!(
                "{e}; status, pause and the other state commands will not reach this mount"
            );
            None
        }
    };
    let fs = LayerFs::new(cfg).map_err(DaemonError::Filesystem)?;
    let handle = fs.handle();
    let journal = cfg.journal.clone().map(|opts| {
        let j = crate::state::journal::Journal::start_in_later(state_dir.clone(), opts);
        handle.set_journal(j.clone());
        j
    });
    // Staged (and its wait for the disk taken) beside a fork's placing;
    // in place only after it.
    let describing = Described::stage(cfg, &state_dir);
    if let Some(p) = placing {
        p.join()
            .unwrap_or_else(|_| {
                Err(crate::state::frozen::StackError::Refused(
                    "placing the fork's stack panicked".into(),
                ))
            })
            .map_err(DaemonError::Placing)?;
    }
    // Described and registered before the mount appears, so a state
    // command run as soon as the mountpoint is live finds both; its
    // state dir fsync also makes a fork's stack rename durable.
    let _described = describing.place();
    let pid_file = match PidFile::create(&cfg.mountpoint, &cfg.state) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!("no pid file (layerfs umount will not wait for this daemon): {e}");
            None
        }
    };
    let session_cfg = session_config(cfg);
    let acl = session_cfg.acl;

    let fd = mounts::mount_fuse(cfg)?;
    // The queues of `--io-uring` need the connection's fd after the
    // session has taken it.
    let dev = if cfg.io_uring {
        match fd.try_clone() {
            Ok(d) => Some(d),
            Err(e) => {
                let _ = crate::host::mounts::detach(&cfg.mountpoint);
                return Err(DaemonError::DupFuse(e));
            }
        }
    } else {
        None
    };
    let session = match fuser::Session::from_fd(Contained(fs), fd, acl, session_cfg) {
        Ok(s) => s,
        Err(e) => {
            let _ = crate::host::mounts::detach(&cfg.mountpoint);
            return Err(DaemonError::Handshake {
                mountpoint: cfg.mountpoint.clone(),
                source: e,
            });
        }
    };
    handle.set_notifier(session.notifier());
    // After the INIT reply (which can only lower the readahead) and before
    // the mount is announced: a file takes the value at its open.
    readahead::apply(&cfg.mountpoint, cfg.readahead);
    let transport = dev.and_then(|dev| start_uring(&handle, &dev, acl, cfg.threads));

    let reloads = std::sync::Arc::new(signals::Reloads::default());
    let ctx = signals::SignalContext {
        mountpoint: cfg.mountpoint.clone(),
        handle: handle.clone(),
        policy_file: cfg.policy_file.clone(),
        notify: notify.clone(),
        reloads: reloads.clone(),
    };
    let served = control.as_ref().and_then(|c| match c.listener() {
        Ok(l) => {
            let daemon = served::Daemon::new(cfg, handle.clone(), journal.clone(), reloads);
            Some((l, std::sync::Arc::new(daemon)))
        }
        Err(e) => {
            tracing::warn!(
                "cannot serve the control socket: {e}; status, pause and the other state \
                 commands will not reach this mount"
            );
            None
        }
    });
    if let Err(e) = service::spawn(ctx, served, handle.lower_watch()) {
        let _ = crate::host::mounts::detach(&cfg.mountpoint);
        return Err(DaemonError::ServiceThread(e));
    }

    tracing::info!(
        "serving {} (upper {}, {} lower layer(s), {} threads, pid {})",
        cfg.mountpoint.display(),
        cfg.upper.display(),
        cfg.lowers.len(),
        cfg.threads,
        std::process::id()
    );
    on_ready();
    // Opened only now: making, counting or trimming the database would
    // otherwise compete with the description's syncs above.
    if let Some(j) = &journal {
        j.begin();
    }
    notify.send(&format!(
        "READY=1\nSTATUS=serving {}\nMAINPID={}",
        cfg.mountpoint.display(),
        std::process::id()
    ));

    let result = session.run();
    notify.send("STOPPING=1");
    if let Some(t) = transport {
        // The queues end with the connection; a request they still serve
        // finishes before the journal is flushed.
        t.join(std::time::Duration::from_secs(5));
    }
    drop(control);
    if let Some(j) = &journal {
        if !j.flush(std::time::Duration::from_secs(5)) {
            tracing::warn!(
                "the journal did not finish writing within 5 s; its last events are lost"
            );
        }
    }
    drop(pid_file);
    match result {
        Ok(()) => {
            tracing::info!("{} unmounted; exiting", cfg.mountpoint.display());
            Ok(())
        }
        Err(e) => {
            // The session died under a live mount: do not leave it behind.
            if crate::host::mounts::find(&cfg.mountpoint).is_some_and(|m| m.is_layerfs()) {
                let _ = crate::host::mounts::detach(&cfg.mountpoint);
            }
            Err(DaemonError::Serve {
                mountpoint: cfg.mountpoint.clone(),
                source: e,
            })
        }
    }
}
