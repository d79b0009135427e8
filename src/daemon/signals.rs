//! Signal handling for a serving daemon: SIGTERM, SIGINT and SIGHUP are
//! blocked in every thread (the mask is set before any thread exists and
//! inherited) and read from a signalfd by the service thread
//! (`daemon::service`). TERM/INT unmount the mountpoint, which ends the
//! session loop; HUP reloads the policy file.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use nix::sys::signal::{SigSet, SigmaskHow, Signal};

use super::notify::SdNotify;
use crate::fuse::FsHandle;
use crate::host::mounts;
use crate::policy::Policy;
use crate::state::protocol::ReloadFailure;

/// The signals the daemon handles itself.
pub fn handled() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.add(Signal::SIGHUP);
    set
}

/// Blocks the handled signals in the calling thread; threads spawned
/// afterwards inherit the mask. Call before anything spawns a thread.
pub fn block() -> nix::Result<()> {
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&handled()), None)
}

/// What the signal thread acts on.
pub struct SignalContext {
    pub mountpoint: PathBuf,
    pub handle: FsHandle,
    pub policy_file: Option<PathBuf>,
    pub notify: SdNotify,
    /// What the last reload did, for `status` (shared with `served::Daemon`).
    pub reloads: Arc<Reloads>,
}

/// The last failed policy reload, until one succeeds: the daemon serves
/// the previous policy meanwhile, and `status` says so.
#[derive(Default)]
pub struct Reloads(Mutex<Option<(SystemTime, String)>>);

impl Reloads {
    fn failed(&self, error: String) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((SystemTime::now(), error));
    }

    fn succeeded(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The last failure, if the last reload failed.
    pub fn failure(&self) -> Option<ReloadFailure> {
        let last = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        last.map(|(at, error)| {
            let at = humantime::format_rfc3339_seconds(at).to_string();
            ReloadFailure {
                message: format!(
                    "policy reload failed at {at}: {error}; serving the previous policy"
                ),
                failed_at: at,
                error,
            }
        })
    }
}

/// Acts on one handled signal.
pub fn handle(ctx: &SignalContext, sig: Signal) {
    match sig {
        Signal::SIGTERM | Signal::SIGINT => stop(ctx, sig),
        Signal::SIGHUP => reload(ctx),
        _ => {}
    }
}

fn stop(ctx: &SignalContext, sig: Signal) {
    tracing::info!("{sig}: unmounting {}", ctx.mountpoint.display());
    ctx.notify.send("STOPPING=1");
    if let Err(e) = mounts::unmount_or_detach(&ctx.mountpoint) {
        tracing::error!("{sig}: unmounting {} failed: {e}", ctx.mountpoint.display());
    }
}

fn reload(ctx: &SignalContext) {
    let Some(path) = &ctx.policy_file else {
        tracing::info!("SIGHUP: no --policy file was given; nothing to reload");
        return;
    };
    ctx.notify.reloading();
    match Policy::load(path) {
        Ok(policy) => {
            ctx.handle.reload_policy(policy);
            ctx.reloads.succeeded();
            tracing::info!("SIGHUP: policy reloaded from {}", path.display());
        }
        Err(e) => {
            tracing::error!("SIGHUP: policy not reloaded, the previous one stays: {e}");
            ctx.reloads.failed(e.to_string());
        }
    }
    ctx.notify.send("READY=1");
}
