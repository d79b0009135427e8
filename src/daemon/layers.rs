//! The control socket's `checkpoint` and `undo`: the daemon's half of
//! `layerfs checkpoint` and `layerfs undo` on a live mount.
//!
//! The steps on disk are `state::checkpoint`'s, the very ones an
//! unmounted workspace goes through, in the same crash-safe order (a
//! kill -9 of the daemon at any step leaves the old view or the new one
//! for the next mount). The daemon runs them with writes paused and
//! every file open for writing through the mount closed (`restore::
//! quiesce`; for a checkpoint, every user's: a write after it would land
//! in the frozen layer), and adds its part through `checkpoint::Live`:
//! - before the view changes on disk, it opens what it will serve: the
//!   empty directory that becomes the upper (and locks it as the mount's
//!   upper, `exclusive`) and, for a checkpoint, the served upper as the
//!   new frozen layer (the same directory, about to be renamed into the
//!   layer store: nothing is copied);
//! - right after, it serves the new stack (`Overlay::set_lowers`) over
//!   the new upper root (`replace_upper_root`) and re-resolves every inode
//!   the kernel holds (`refresh_paths`).
//!
//! Then, writes resumed, the kernel's caches are dropped as after a live
//! restore (`restore::invalidate_swapped`). Files open for reading keep
//! reading what they opened; every new lookup and open sees the new view.
//!
//! Refused on a read-only mount and on a mount with a network lower
//! (whose probes name lowers by their index in the stack).

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::restore::{held_dirs, invalidate_swapped, open_upper_parent, quiesce, RestoreError};
use super::served::Daemon;
use crate::layer::{sys, Layer, LayerError};
use crate::state::checkpoint::{self, Durability, Live, LiveError};
use crate::state::frozen::StackError;
use crate::state::protocol::{Checkpointed, Request, SquashDone, Undone};
use crate::state::workspace::Workspace;

/// Why a live checkpoint, undo or squash was refused or failed; `what`
/// names the operation ("a checkpoint", "an undo", "a squash").
#[derive(Debug, thiserror::Error)]
pub enum LayersError {
    #[error(
        "the workspace is mounted read-only: {what} changes its upper; unmount it (layerfs \
         umount {}), then retry",
        mountpoint.display()
    )]
    ReadOnly {
        what: &'static str,
        mountpoint: PathBuf,
    },
    #[error(
        "a lower of this mount is on a network filesystem: {what} of such a live mount is not \
         supported; unmount it (layerfs umount {}), retry, and mount it again",
        mountpoint.display()
    )]
    NetworkLower {
        what: &'static str,
        mountpoint: PathBuf,
    },
    #[error(transparent)]
    Workspace(#[from] crate::state::workspace::WorkspaceError),
    /// Reaching the upper's parent, or quiescing the mount.
    #[error(transparent)]
    Quiesce(#[from] RestoreError),
    /// The steps on disk (`state::checkpoint`, `state::squash`).
    #[error(transparent)]
    State(#[from] StackError),
    #[error("{0:?} is neither a checkpoint nor an undo")]
    NotLayers(Request),
    /// Opening (`what`: "open", "lock") the empty directory that becomes
    /// the upper.
    #[error("cannot {what} the new upper dir: {source}")]
    NewUpper {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("the new upper dir was not opened before the exchange")]
    NewUpperNotOpened,
    /// Opening a layer to serve.
    #[error(transparent)]
    Layer(#[from] LayerError),
    /// Serving the new upper root (the core's message).
    #[error(transparent)]
    UpperRoot(crate::overlay::OverlayError),
    #[error("cannot encode the reply: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("the mount serves {served} layers, fewer than the {needed} squashed and kept")]
    FewerLayers { served: usize, needed: usize },
    #[error("cannot open the upper dir being served: {0}")]
    ServedUpper(#[source] std::io::Error),
}

/// The steps on disk (`checkpoint::Live`, `squash::Live`) carry the
/// daemon's error whole.
impl From<LayersError> for LiveError {
    fn from(e: LayersError) -> LiveError {
        LiveError::new(e)
    }
}

/// `Request::Checkpoint` or `Request::Undo`: see the module comment.
pub fn serve(daemon: &Daemon, req: &Request) -> Result<Value, LayersError> {
    let undo = matches!(req, Request::Undo { .. });
    let deferred = matches!(req, Request::Checkpoint { deferred: true, .. });
    let ov = daemon.fs.overlay();
    let what = if undo { "an undo" } else { "a checkpoint" };
    if ov.read_only() {
        return Err(LayersError::ReadOnly {
            what,
            mountpoint: daemon.mountpoint.clone(),
        });
    }
    if ov.reach().is_some() {
        return Err(LayersError::NetworkLower {
            what,
            mountpoint: daemon.mountpoint.clone(),
        });
    }
    let ws = Workspace::resolve_in(&daemon.upper, &daemon.state).map_err(LayersError::from)?;
    if daemon.upper.parent().is_none() {
        let e = RestoreError::UpperWithoutParent(daemon.upper.clone());
        return Err(LayersError::from(e));
    }
    let (parent, _, upper_name) = open_upper_parent(&daemon.upper).map_err(LayersError::from)?;
    let pause = quiesce(daemon, &parent, upper_name, !undo).map_err(LayersError::from)?;
    let dirs_before = held_dirs(ov);
    let mut swap = Swap {
        daemon,
        root: None,
        claim: None,
        frozen: None,
        checkpoint: !undo,
        swapped: false,
    };
    let out: Result<Done, LayersError> = match req {
        Request::Undo { to } => checkpoint::undo(&ws, to.as_deref(), Some(&mut swap))
            .map(|(at, dropped)| {
                Done::Undone(Undone {
                    at,
                    dropped,
                    ..Undone::default()
                })
            })
            .map_err(LayersError::from),
        Request::Checkpoint {
            name,
            layers,
            deferred,
        } => checkpoint::checkpoint(
            &ws,
            name.as_deref(),
            layers.as_deref().map(Path::new),
            Some(&mut swap),
            if *deferred {
                Durability::Deferred
            } else {
                Durability::Now
            },
        )
        .map(|name| {
            Done::Checkpointed(Checkpointed {
                name,
                ..Checkpointed::default()
            })
        })
        .map_err(LayersError::from),
        other => Err(LayersError::NotLayers(other.clone())),
    };
    drop(pause);
    let mut out = out?;
    // Nothing was swapped (a checkpoint or undo with nothing changed,
    // `Stack::repeats`): the kernel's caches are still true.
    let inv = if swap.swapped {
        invalidate_swapped(daemon, &dirs_before)
    } else {
        Default::default()
    };
    if let (Done::Checkpointed(c), true) = (&out, deferred && swap.swapped) {
        sync_after(ws, c.name.clone());
    }
    let out = match &mut out {
        Done::Undone(u) => {
            u.invalidated = inv;
            serde_json::to_value(u)
        }
        Done::Checkpointed(c) => {
            c.invalidated = inv;
            serde_json::to_value(c)
        }
    }
    .map_err(LayersError::Encode)?;
    tracing::info!("{what} of the live mount: {out}");
    Ok(out)
}

/// A new frozen layer at `path` (in the layer store, or the served upper
/// about to move there), opened to serve under the name of its path's
/// last segment.
fn open_layer(path: &Path) -> Result<Layer, LayersError> {
    let mut layer = Layer::open(path, "checkpoint layer")?;
    layer.name = Some(crate::layer::LayerName::checkpoint_at(path));
    Ok(layer)
}

/// Makes the deferred checkpoint `name` durable (`checkpoint::sync_taken`)
/// on a thread of its own: the answer does not wait for the disk, and
/// neither do the requests served meanwhile (writes are not paused).
fn sync_after(ws: Workspace, name: String) {
    let spawned = std::thread::Builder::new()
        .name("checkpoint-sync".into())
        .stack_size(crate::layer::walk::THREAD_STACK)
        .spawn(move || {
            if let Err(e) = checkpoint::sync_taken(&ws, &name) {
                tracing::warn!("checkpoint {name}: cannot make it durable: {e}");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("checkpoint: cannot start syncing it: {e}");
    }
}

/// What a checkpoint or an undo answers.
enum Done {
    Checkpointed(Checkpointed),
    Undone(Undone),
}

/// The daemon's part of the steps (`checkpoint::Live`).
struct Swap<'a> {
    daemon: &'a Daemon,
    /// The new upper root, opened before the exchange.
    root: Option<OwnedFd>,
    /// Its lock, as the mount's upper.
    claim: Option<std::fs::File>,
    /// A checkpoint's new layer: the served upper, opened by its path
    /// before the exchange moves it into the store.
    frozen: Option<Layer>,
    checkpoint: bool,
    /// Whether `commit` ran (the view was swapped).
    swapped: bool,
}

impl Live for Swap<'_> {
    fn prepare(&mut self, fresh: OwnedFd) -> Result<(), LiveError> {
        let new_upper = |what| move |source| LayersError::NewUpper { what, source };
        let dir = std::fs::File::from(sys::open_dir(&fresh).map_err(new_upper("open"))?);
        crate::sys::flock(&dir, libc::LOCK_EX | libc::LOCK_NB).map_err(new_upper("lock"))?;
        if self.checkpoint {
            // Still the served upper: the exchange moves it into the store.
            self.frozen = Some(open_layer(&self.daemon.upper)?);
        }
        self.claim = Some(dir);
        self.root = Some(fresh);
        Ok(())
    }

    fn commit(&mut self, frozen: Option<&Path>, dropped: usize) -> Result<(), LiveError> {
        self.swapped = true;
        let ov = self.daemon.fs.overlay();
        let old = ov.lowers();
        let new: Vec<Arc<Layer>> = match frozen {
            Some(path) => {
                let mut layer = match self.frozen.take() {
                    Some(l) => l,
                    None => open_layer(path)?,
                };
                layer.path = path.to_path_buf();
                layer.name = Some(crate::layer::LayerName::checkpoint_at(path));
                std::iter::once(Arc::new(layer))
                    .chain(old.iter().cloned())
                    .collect()
            }
            None => old.iter().skip(dropped).cloned().collect(),
        };
        let root = self.root.take().ok_or(LayersError::NewUpperNotOpened)?;
        ov.set_lowers(new);
        if let Err(e) = ov.replace_upper_root(root) {
            ov.set_lowers(old.to_vec());
            return Err(LayersError::UpperRoot(e).into());
        }
        // A file passed through from the upper is in the new layer now:
        // its node is detached from the name (`Overlay::re_resolve`).
        ov.refresh_paths(&[std::ffi::OsString::new()]);
        if let Some(c) = self.claim.take() {
            self.daemon.upper_claims.lock().push(c);
        }
        Ok(())
    }
}

/// `Request::Squash`: `state::squash` with the daemon's part (`Resquash`):
/// the merged layer is built while the mount serves; writes are paused
/// only for the switch, during which the daemon serves the new stack and
/// re-resolves every held inode. The view does not change; the kernel's
/// caches are dropped after as after a checkpoint (the directories under
/// the held inodes are new ones). Files open for reading in a merged
/// layer read on (their inodes are linked into the new layer).
pub fn serve_squash(daemon: &Daemon, keep: usize) -> Result<Value, LayersError> {
    let ov = daemon.fs.overlay();
    if ov.reach().is_some() {
        return Err(LayersError::NetworkLower {
            what: "a squash",
            mountpoint: daemon.mountpoint.clone(),
        });
    }
    let ws = Workspace::resolve_in(&daemon.upper, &daemon.state).map_err(LayersError::from)?;
    let dirs_before = held_dirs(ov);
    let mut re = Resquash {
        daemon,
        pause: None,
        swapped: false,
    };
    let out = crate::state::squash::squash(&ws, keep, Some(&mut re));
    let swapped = re.swapped;
    drop(re);
    let done = out.map_err(LayersError::from)?;
    let mut reply = SquashDone::default();
    if let Some(s) = done {
        reply.name = s.name;
        reply.merged = s.merged;
    }
    if swapped {
        reply.invalidated = invalidate_swapped(daemon, &dirs_before);
    }
    tracing::info!("squash of the live mount: {reply:?}");
    serde_json::to_value(&reply).map_err(LayersError::Encode)
}

/// The daemon's part of a live squash (`squash::Live`).
struct Resquash<'a> {
    daemon: &'a Daemon,
    pause: Option<crate::overlay::gate::PauseGuard<'a>>,
    swapped: bool,
}

impl crate::state::squash::Live for Resquash<'_> {
    fn pause(&mut self) -> Result<(), LiveError> {
        self.pause = Some(self.daemon.fs.overlay().pause_writes());
        Ok(())
    }

    fn commit(&mut self, keep: usize, merged: usize, layer: &Path) -> Result<(), LiveError> {
        let ov = self.daemon.fs.overlay();
        let old = ov.lowers();
        if old.len() < keep + merged {
            return Err(LayersError::FewerLayers {
                served: old.len(),
                needed: keep + merged,
            }
            .into());
        }
        let new_layer = Arc::new(open_layer(layer)?);
        let new: Vec<Arc<Layer>> = old[..keep]
            .iter()
            .cloned()
            .chain(std::iter::once(new_layer))
            .chain(old[keep + merged..].iter().cloned())
            .collect();
        // The root's parts are set, not looked up: the same upper root
        // over the new stack.
        let root = ov
            .upper_root()
            .and_then(|r| sys::open_path(r.as_ref(), std::ffi::OsStr::new(".")))
            .map_err(LayersError::ServedUpper)?;
        self.swapped = true;
        ov.set_lowers(new);
        if let Err(e) = ov.replace_upper_root(root) {
            ov.set_lowers(old.to_vec());
            return Err(LayersError::UpperRoot(e).into());
        }
        ov.refresh_paths(&[std::ffi::OsString::new()]);
        Ok(())
    }
}
