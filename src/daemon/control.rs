//! The control socket server: `control.sock` in the workspace's state
//! directory, JSON lines (one request object, one response object per
//! line; see `state::control` for the client). Each connection gets a
//! thread of its own; a request is dispatched by its `cmd`.
//!
//! Access: the socket is mode 0600 in a 0700 directory, owned by the
//! daemon's user, and each connection's peer uid (SO_PEERCRED) must be
//! that user's or root's, so another user gets a clear refusal.
//!
//! A pause belongs to the connection that took it: it ends with `resume`
//! or when the connection closes, so a killed client never leaves the
//! mount paused.

use std::fs;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

use super::served::{invalidate_bounded, Daemon};
use crate::layer::safedir::SafeDir;
use crate::overlay::gate::PauseGuard;
use crate::state::control::SOCKET_FILE;
use crate::state::protocol::{
    Counters, Holder, LayersStatus, LowerStatus, Paused, Request, Resumed, Status, Transport,
    UpperUsage, Watches,
};

/// How long `pause` waits for passthrough write opens to close (the mount
/// owner's only, see `fuse::io_mode`), unless the request says otherwise
/// (`wait_ms`).
const DEFAULT_DRAIN: Duration = Duration::from_secs(5);

/// The bound socket, removed when dropped (at daemon exit) if it is still
/// the one this daemon created.
pub struct ControlSocket {
    listener: UnixListener,
    /// The checked state dir the socket is in, reached through its
    /// descriptor (`layer::safedir`).
    dir: Arc<SafeDir>,
    id: (u64, u64),
}

/// Why a request failed: the message the client gets.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("cannot encode the reply: {0}")]
    Encode(#[source] serde_json::Error),
    #[error(transparent)]
    Reset(#[from] super::reset::LiveResetError),
    #[error(transparent)]
    Restore(#[from] super::restore::RestoreError),
    #[error(transparent)]
    Layers(#[from] super::layers::LayersError),
}

/// Why the socket (`socket`, as shown to the user) could not be bound.
/// Only `InUse` refuses the mount; with any other the mount can still
/// serve, without its control socket.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// Another daemon answers on it: this workspace is mounted already.
    /// `holder`: the pid and mountpoint it reported, if it answered.
    #[error(
        "another layerfs daemon serves this workspace: its control socket {} answers ({}); \
         unmount it first ({}), or give this mount another --state DIR",
        socket.display(),
        holder.as_ref().map_or_else(
            || "its daemon".to_string(),
            |(pid, mnt)| format!("pid {pid}, mounted at {mnt}")
        ),
        holder.as_ref().map_or_else(
            || "layerfs umount MOUNTPOINT".to_string(),
            |(_, mnt)| format!("layerfs umount {mnt}")
        )
    )]
    InUse {
        socket: PathBuf,
        holder: Option<(u64, String)>,
    },
    #[error(
        "{} exists and is not a socket: move it away (the state dir holds the control socket \
         there)",
        .0.display()
    )]
    NotASocket(PathBuf),
    #[error("removing stale {}: {source}", socket.display())]
    RemoveStale { socket: PathBuf, source: io::Error },
    #[error("control socket {}: {source}", socket.display())]
    Connect { socket: PathBuf, source: io::Error },
    #[error(
        "cannot create control socket {}: {source} (is the state dir writable?)",
        socket.display()
    )]
    Create { socket: PathBuf, source: io::Error },
    #[error("{}: {source}", socket.display())]
    Stat { socket: PathBuf, source: io::Error },
}

/// Binds `control.sock` in the checked state dir `state`. A stale socket
/// (nothing listening) is replaced; a live one means another daemon
/// serves this workspace.
pub fn bind(dir: Arc<SafeDir>) -> Result<ControlSocket, BindError> {
    // Reached through the directory's descriptor; `shown` only names it.
    let path = dir.fd_path(SOCKET_FILE);
    let shown = dir.shown(SOCKET_FILE);
    if let Ok(st) = dir.stat(SOCKET_FILE) {
        if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return Err(BindError::NotASocket(shown));
        }
        match UnixStream::connect(&path) {
            Ok(s) => {
                return Err(BindError::InUse {
                    socket: shown,
                    holder: ask_status(s),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                tracing::info!("replacing stale control socket {}", shown.display());
                if let Err(source) = dir.remove_file(SOCKET_FILE) {
                    return Err(BindError::RemoveStale {
                        socket: shown,
                        source,
                    });
                }
            }
            Err(source) => {
                return Err(BindError::Connect {
                    socket: shown,
                    source,
                })
            }
        }
    }
    // Created 0600 from the start: no moment where others may connect.
    // The previous mask is restored right after the bind.
    use nix::sys::stat::{umask, Mode};
    let old = umask(Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(&path);
    umask(old);
    let listener = match bound {
        Ok(l) => l,
        Err(source) => {
            return Err(BindError::Create {
                socket: shown,
                source,
            })
        }
    };
    let _ = fs::set_permissions(&path, fs::Permissions::from_mode(0o600));
    let st = dir.stat(SOCKET_FILE).map_err(|source| BindError::Stat {
        socket: shown,
        source,
    })?;
    Ok(ControlSocket {
        listener,
        dir,
        id: (st.st_dev, st.st_ino),
    })
}

/// The pid and mountpoint a live daemon reports on its socket (briefly:
/// a daemon that does not answer within a second is left unnamed).
fn ask_status(s: UnixStream) -> Option<(u64, String)> {
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
    let mut w = s.try_clone().ok()?;
    send(&mut w, &serde_json::to_value(Request::Status).ok()?).ok()?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).ok()?;
    let v: Status = serde_json::from_str(&line).ok()?;
    Some((v.pid?.into(), v.mountpoint?))
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let ours = self
            .dir
            .stat(SOCKET_FILE)
            .map(|st| (st.st_dev, st.st_ino) == self.id)
            .unwrap_or(false);
        if ours {
            let _ = self.dir.remove_file(SOCKET_FILE);
        }
    }
}

/// Per-connection state: the pause this connection holds, if any.
pub struct Conn<'a> {
    pause: Option<PauseGuard<'a>>,
}

impl ControlSocket {
    /// The listening socket, non-blocking, for the service thread's poll
    /// (`daemon::service`).
    pub fn listener(&self) -> io::Result<UnixListener> {
        let l = self.listener.try_clone()?;
        l.set_nonblocking(true)?;
        Ok(l)
    }
}

/// Accepts every connection waiting on `listener` (non-blocking) and
/// serves each on a thread of its own. Accepted sockets are blocking.
pub fn accept_ready(listener: &UnixListener, daemon: &Arc<Daemon>) {
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!("control socket accept: {e}");
                return;
            }
        };
        if let Err(e) = stream.set_nonblocking(false) {
            tracing::warn!("control socket: {e}");
            continue;
        }
        let d = daemon.clone();
        // Runs gc, reset, restore and usage scans: see walk::THREAD_STACK.
        let spawned = std::thread::Builder::new()
            .name("control-conn".into())
            .stack_size(crate::layer::walk::THREAD_STACK)
            .spawn(move || serve_conn(stream, &d));
        if let Err(e) = spawned {
            tracing::warn!("control socket: cannot serve a connection: {e}");
        }
    }
}

/// The peer's uid and pid (SO_PEERCRED).
fn peer(s: &UnixStream) -> io::Result<(u32, i32)> {
    let cred = nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials)?;
    Ok((cred.uid(), cred.pid()))
}

/// Whether the process `pid` is gone or dying (its main thread exited).
/// A pausing client killed while one of its threads waits on a paused
/// write cannot exit (the kernel waits for the daemon's answer), so its
/// socket never closes: the pause must end when the process dies.
fn dying(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_none_or(|state| matches!(state, 'Z' | 'X' | 'x')),
        Err(_) => true,
    }
}

/// How long a refused peer has to send its request before the refusal.
const REFUSED_READ: Duration = Duration::from_secs(1);

/// Polling interval for a paused connection's client (see `dying`).
const PEER_POLL: Duration = Duration::from_millis(100);

fn send(w: &mut UnixStream, v: &Value) -> io::Result<()> {
    let mut line = v.to_string();
    line.push('\n');
    w.write_all(line.as_bytes())
}

fn serve_conn(stream: UnixStream, daemon: &Daemon) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let pid = match peer(&stream) {
        Ok((uid, pid)) if uid == daemon.uid || uid == 0 => pid,
        Ok((uid, _)) => {
            let msg = format!(
                "permission denied: this workspace's daemon runs as uid {}, you are uid {uid}; \
                 run the command as that user or as root",
                daemon.uid
            );
            // Take the request first (bounded in time and size): answering
            // and closing before the client has written would fail its
            // write with EPIPE instead of showing it this message.
            let _ = stream.set_read_timeout(Some(REFUSED_READ));
            let _ =
                BufReader::new(io::Read::take(&stream, 64 * 1024)).read_line(&mut String::new());
            let _ = send(&mut writer, &json!({"ok": false, "error": msg}));
            return;
        }
        Err(e) => {
            tracing::warn!("control socket: cannot read the peer's credentials: {e}");
            return;
        }
    };
    let mut conn = Conn { pause: None };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        // While this connection holds a pause, wake up to check that its
        // client still lives.
        let timeout = conn.pause.as_ref().map(|_| PEER_POLL);
        let _ = reader.get_ref().set_read_timeout(timeout);
        match reader.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                // A partial line stays in `line` for the next read.
                if dying(pid) {
                    tracing::info!("pausing client (pid {pid}) died: writes resume");
                    break;
                }
                continue;
            }
            Err(_) => break,
        }
        let line = std::mem::take(&mut line);
        if line.trim().is_empty() {
            continue;
        }
        let answered = match Request::parse(&line) {
            Ok(r) => dispatch(daemon, &mut conn, &r).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let answer = match answered {
            Ok(mut v) => {
                if let Some(o) = v.as_object_mut() {
                    o.insert("ok".into(), Value::Bool(true));
                }
                v
            }
            Err(e) => json!({"ok": false, "error": e}),
        };
        if send(&mut writer, &answer).is_err() {
            break;
        }
    }
    if conn.pause.take().is_some() {
        tracing::info!("control connection closed while paused: writes resume");
    }
}

/// The reply as it goes on the wire (before the `ok` marker is added).
fn reply(r: impl Serialize) -> Result<Value, RequestError> {
    serde_json::to_value(r).map_err(RequestError::Encode)
}

/// Answers one request. An `Err` is the message for the client.
pub fn dispatch<'a>(
    daemon: &'a Daemon,
    conn: &mut Conn<'a>,
    req: &Request,
) -> Result<Value, RequestError> {
    match req {
        Request::Status => reply(status(daemon, conn)),
        Request::Pause { wait_ms } => {
            if conn.pause.is_some() {
                return reply(Paused {
                    paused: true,
                    ..Paused::default()
                });
            }
            let wait = wait_ms.map(Duration::from_millis).unwrap_or(DEFAULT_DRAIN);
            let (guard, busy) = daemon.fs.pause_writes(wait);
            conn.pause = Some(guard);
            tracing::info!(
                busy = busy.len(),
                "writes paused through the control socket"
            );
            // `busy`: the paths; `holders`: each with the uid holding it.
            reply(Paused {
                paused: true,
                busy: busy.iter().map(|(p, _)| p.clone()).collect(),
                holders: busy
                    .into_iter()
                    .map(|(path, uid)| Holder { path, uid })
                    .collect(),
            })
        }
        Request::Resume => {
            let resumed = conn.pause.take().is_some();
            if resumed {
                tracing::info!("writes resumed through the control socket");
            }
            reply(Resumed { resumed })
        }
        Request::Invalidate { paths } => {
            let (fs, paths) = (daemon.fs.clone(), paths.clone());
            reply(invalidate_bounded(move || fs.invalidate_paths(&paths)))
        }
        Request::Reset { paths } => reply(super::reset::serve(daemon, paths, false)?),
        Request::Gc => reply(super::reset::serve(daemon, &[], true)?),
        Request::Restore { staging } => reply(super::restore::serve(daemon, staging)?),
        Request::Checkpoint { .. } | Request::Undo { .. } => Ok(super::layers::serve(daemon, req)?),
        Request::Squash { keep } => Ok(super::layers::serve_squash(daemon, *keep)?),
        Request::InvalidateAll => {
            let fs = daemon.fs.clone();
            reply(invalidate_bounded(move || fs.invalidate_all()))
        }
    }
}

fn status(daemon: &Daemon, conn: &Conn<'_>) -> Status {
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let ov = daemon.fs.overlay();
    let (requests, copy_ups, denials) = daemon.fs.counters();
    Status {
        mountpoint: Some(s(&daemon.mountpoint)),
        upper: Some(s(&daemon.upper)),
        lowers: daemon.lowers.iter().map(|l| s(l)).collect(),
        work: Some(s(&daemon.work)),
        state: Some(s(&daemon.state)),
        policy: daemon.policy_file.as_deref().map(s),
        policy_reload_failure: daemon.reloads.failure(),
        pid: Some(std::process::id()),
        uid: Some(daemon.uid),
        started: Some(humantime::format_rfc3339_seconds(daemon.started_at).to_string()),
        uptime_seconds: daemon.started.elapsed().as_secs_f64(),
        paused: ov.gate().paused(),
        paused_by_you: conn.pause.is_some(),
        read_only: ov.read_only(),
        upper_usage: Some(upper_usage(ov)),
        layers: Some(layers(ov, daemon.lower_timeout)),
        watches: Some(watches(ov)),
        counters: Some(Counters {
            requests,
            requests_per_second: (daemon.rate() * 10.0).round() / 10.0,
            by_op: daemon
                .fs
                .requests_by_op()
                .into_iter()
                .map(|(op, n)| (op.to_string(), n))
                .collect(),
            copy_ups,
            denials,
        }),
        journal: Some(match &daemon.journal {
            Some(j) => j.health(),
            None => crate::state::journal::HealthReport::disabled(),
        }),
        transport: Some(transport(&daemon.fs)),
        // The daemon's fds and each caller's share of them for open files
        // (`layer::fds`, `overlay::share`).
        descriptors: Some(crate::layer::fds::report()),
        open_files: Some(ov.files().shares.report()),
    }
}

/// The inotify watches on lower directories: how many are held, the cap
/// (`--max-watches`), and the directories left to `--lower-timeout`
/// because the cap was reached.
fn watches(ov: &crate::overlay::Overlay) -> Watches {
    match ov.watch_usage() {
        Some(u) => Watches {
            enabled: true,
            live: Some(ov.watch().is_some_and(|w| w.live())),
            used: Some(u.used as u64),
            cap: Some(u.cap as u64),
            dirs_over_cap: Some(u.dirs_over_cap as u64),
        },
        None => Watches::default(),
    }
}

/// How requests reach the daemon: `/dev/fuse`, or io_uring queues (and
/// why not, when `--io-uring` was asked for and is not in use).
fn transport(fs: &crate::fuse::FsHandle) -> Transport {
    let n = fs.negotiated();
    match fs.uring() {
        Some(u) => Transport {
            kind: "io_uring".into(),
            queues: Some(u.queues as u64),
            entries_per_queue: Some(u.depth as u64),
            ring_requests: Some(
                u.requests
                    .iter()
                    .map(|n| n.load(std::sync::atomic::Ordering::Relaxed))
                    .collect(),
            ),
            ring_answered: Some(
                u.answered
                    .iter()
                    .map(|n| n.load(std::sync::atomic::Ordering::Relaxed))
                    .collect(),
            ),
            ..Transport::default()
        },
        None => Transport {
            kind: "/dev/fuse".into(),
            io_uring_requested: Some(fs.uring_requested()),
            io_uring_refused: n
                .and_then(|n| n.uring_refused)
                .or_else(|| {
                    (fs.uring_requested() && n.is_some_and(|n| n.uring))
                        .then_some("the queues could not be set up (see the daemon's log)")
                })
                .map(String::from),
            ..Transport::default()
        },
    }
}

/// Each lower's filesystem, how soon outside changes show through the
/// mount, and, for a network lower, whether it answers (probed now, for
/// at most half a second: status answers even while a lower hangs).
fn layers(ov: &crate::overlay::Overlay, lower_timeout: Duration) -> LayersStatus {
    let conditions = match ov.reach() {
        Some(r) => {
            r.check(Duration::from_millis(500));
            r.conditions()
        }
        None => Vec::new(),
    };
    let lowers = ov
        .lowers()
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let c = conditions.iter().find(|c| c.index == i);
            let lost = c.and_then(|c| c.lost.clone());
            LowerStatus {
                path: l.path.to_string_lossy().into_owned(),
                fstype: l.caps.fstype.clone(),
                source: l.caps.source.clone(),
                network: l.caps.remote,
                // Where a watch cannot see outside changes, the kernel
                // trusts entries for --lower-timeout (plus whatever the
                // network filesystem's own client caches).
                changes_show_within_ms: l.caps.remote.then_some(lower_timeout.as_millis() as u64),
                file_handles: l.caps.handles,
                xattrs: l.caps.xattrs,
                stable_inodes: l.caps.inodes == crate::layer::netfs::Inodes::Stable,
                state: if lost.is_some() { "lost" } else { "ok" }.into(),
                lost_since: lost
                    .as_ref()
                    .map(|(t, _)| humantime::format_rfc3339_seconds(*t).to_string()),
                error: lost.map(|(_, e)| e),
                not_answering_seconds: c.and_then(|c| c.not_answering).map(|d| d.as_secs()),
            }
        })
        .collect();
    LayersStatus {
        lowers,
        refused_requests: ov
            .reach()
            .as_ref()
            .map(|r| r.refused.load(std::sync::atomic::Ordering::Relaxed)),
        stalled_requests: ov.reach().map(|r| r.stalled() as u64),
    }
}

/// Bytes and inodes the upper holds (whiteouts are free), with the quota
/// limits when the policy sets them. Without a quota the upper is
/// measured now (a walk of the upper).
fn upper_usage(ov: &crate::overlay::Overlay) -> UpperUsage {
    let limits = ov.quota().limits();
    let (bytes, inodes, measured) = if ov.quota().limited() {
        let (b, i) = ov.quota().used();
        (Some(b), Some(i), "counted")
    } else {
        let u = crate::overlay::quota::Usage::new(Default::default());
        match ov.upper_root().and_then(|r| u.scan(r.as_ref())) {
            Ok(()) => {
                let (b, i) = u.used();
                (Some(b), Some(i), "measured")
            }
            Err(e) => {
                tracing::warn!("status: cannot measure the upper: {e}");
                (None, None, "unknown")
            }
        }
    };
    UpperUsage {
        bytes,
        inodes,
        how: measured.into(),
        quota_bytes: limits.bytes,
        quota_inodes: limits.inodes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_in_use_names_the_daemon_that_answered_or_says_it_did_not() {
        let socket = PathBuf::from("/s/control.sock");
        let named = BindError::InUse {
            socket: socket.clone(),
            holder: Some((42, "/mnt/w".into())),
        };
        assert_eq!(
            named.to_string(),
            "another layerfs daemon serves this workspace: its control socket /s/control.sock \
             answers (pid 42, mounted at /mnt/w); unmount it first (layerfs umount /mnt/w), or \
             give this mount another --state DIR"
        );
        let unnamed = BindError::InUse {
            socket,
            holder: None,
        };
        assert!(
            unnamed
                .to_string()
                .contains("answers (its daemon); unmount it first (layerfs umount MOUNTPOINT)"),
            "{unnamed}"
        );
    }
}
