//! Checkpoints, undo and forks of an unmounted workspace (DESIGN.md §5,
//! "Checkpoints, forks and undo"). The format of stacks and stores is
//! `state::frozen`; this file owns the steps that change them, in an order
//! a kill -9 at any moment cannot turn into a view that was never there.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::frozen::{self, io_ctx, Record, Stack, StackError, Store};
use super::workspace::Workspace;
use crate::layer::safedir::SafeDir;
use crate::layer::sys;

/// A workspace's stack and store, as the commands here use them.
pub struct Layers {
    pub store: Store,
    pub stack: Stack,
}

/// Opens the store of the workspace whose state dir is `state`: the one
/// its stack names, else `given` (`--layers DIR`), else `STATE/layers`
/// (created when `create`). A `given` store other than the stack's is
/// refused: one workspace stands on one store.
pub fn open(state: &SafeDir, given: Option<&Path>, create: bool) -> Result<Layers, StackError> {
    let current = frozen::read(state)?;
    if let (Some(s), Some(g)) = (&current, given) {
        let g = std::fs::canonicalize(g).unwrap_or_else(|_| g.to_path_buf());
        if g != s.store {
            return Err(StackError::Refused(format!(
                "this workspace stacks on layers in {}, not {}: leave out --layers (a \
                 workspace uses one layer store)",
                s.store.display(),
                g.display()
            )));
        }
    }
    let path = match (&current, given) {
        (Some(s), _) => s.store.clone(),
        (None, Some(g)) => g.to_path_buf(),
        (None, None) => state.path().join(frozen::STORE_DIR),
    };
    let store = Store::open(&path, create)?;
    let stack = current.unwrap_or_else(|| Stack {
        store: std::fs::canonicalize(store.path()).unwrap_or_else(|_| path.clone()),
        layers: Vec::new(),
        pending_undo: None,
        repeats: 0,
    });
    Ok(Layers { store, stack })
}

/// What the daemon of a mounted workspace does around the steps on disk
/// of a checkpoint or an undo (`daemon::layers`), with its writes paused;
/// an unmounted workspace is locked instead (`lock_upper`).
pub trait Live {
    /// Before the step that changes the view on disk: `fresh` is the
    /// empty directory that will be the upper. An error leaves the
    /// workspace as it was.
    fn prepare(&mut self, fresh: OwnedFd) -> Result<(), LiveError>;
    /// Right after the view changed on disk: serve it. `frozen`: the new
    /// layer's path (a checkpoint); `dropped`: how many frozen layers an
    /// undo took off the top. An error after a checkpoint's exchange puts
    /// the old upper back.
    fn commit(&mut self, frozen: Option<&Path>, dropped: usize) -> Result<(), LiveError>;
}

pub use super::frozen::LiveError;

/// Locks an unmounted workspace's upper, or, mounted, requires the
/// daemon's half (`live`): the CLI sends a mounted workspace's request to
/// its daemon, which calls back here with `live`.
fn guard(
    ws: &Workspace,
    live: &Option<&mut dyn Live>,
    what: &str,
) -> Result<Option<std::fs::File>, StackError> {
    match (&ws.mountpoint, live) {
        (_, Some(_)) => Ok(None),
        (Some(mp), None) => Err(StackError::Refused(format!(
            "{} is mounted: {what} of a live mount goes through its daemon (give the \
             mountpoint or the upper to layerfs, not this library call)",
            mp.display()
        ))),
        (None, None) => lock_upper(&ws.upper).map(Some),
    }
}

/// The upper's parent (open) and its name in it.
fn upper_at(upper: &Path) -> Result<(OwnedFd, &OsStr), StackError> {
    let (Some(parent), Some(name)) = (upper.parent(), upper.file_name()) else {
        return Err(StackError::Refused(format!(
            "upper {} has no parent",
            upper.display()
        )));
    };
    let fd = sys::open_root(parent).map_err(io_ctx(format!("cannot open {}", parent.display())))?;
    Ok((fd, name))
}

/// Locks the upper as a mount does (`host::holder`: a daemon on its way
/// out is waited for), so no mount starts on it while the stack changes;
/// released when dropped.
pub fn lock_upper(upper: &Path) -> Result<std::fs::File, StackError> {
    crate::host::holder::lock(
        upper,
        |h| {
            StackError::Refused(format!(
                "upper {} is in use by a layerfs mount ({}); unmount it first ({})",
                upper.display(),
                h.describe(),
                h.umount_hint()
            ))
        },
        &mut |m| tracing::warn!("{m}"),
    )
}

/// Makes the empty directory `name` in `dir` with the mode and owner of
/// `like` (the upper root it will stand in for).
fn fresh_dir(dir: &impl std::os::fd::AsFd, name: &OsStr, like: &sys::Stat) -> std::io::Result<()> {
    sys::mkdirat(dir, name, 0o700)?;
    let fd = sys::open_beneath(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    let res = sys::fchown(&fd, Some(like.st_uid), Some(like.st_gid))
        .and_then(|()| sys::fchmod(&fd, like.st_mode & 0o7777));
    if res.is_err() {
        let _ = sys::unlinkat(dir, name, true);
    }
    res
}

/// When a checkpoint's steps reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Each step is synced before the next: the checkpoint is durable
    /// when `checkpoint` returns (`layerfs checkpoint`).
    Now,
    /// The same steps in the same order, none waited for; `sync_taken`
    /// makes them durable after (a per-command checkpoint of `layerfs run
    /// --checkpoint`, whose daemon syncs once it has answered). A kill -9
    /// loses nothing (the kernel holds what was written); a power loss
    /// before the sync leaves what the upper's filesystem wrote of the
    /// steps, in their order on a filesystem that journals its metadata
    /// in order (ext4, xfs, btrfs): the old stack or the new one, as a
    /// kill -9 at a step would.
    Deferred,
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `layerfs checkpoint`: freezes the upper of the unmounted workspace
/// `ws` into the layer `name` (generated when `None`) and returns the
/// name. The steps (each crash point shows the same view):
/// 1. the record, pending (`.NAME.pending.json`: the name is taken, the
///    checkpoint is no one's yet);
/// 2. `NAME/`, empty, with the upper root's mode and owner;
/// 3. the hold and the stack with `NAME` on top (an empty layer: same
///    view): the checkpoint exists from here;
/// 4. the upper exchanged with `NAME/` (the old upper is the layer, the
///    upper is empty: same view);
/// 5. the record published (`NAME.json`), both parents synced.
///
/// A kill -9 before 3 leaves the old stack and a pending checkpoint on
/// no stack; after it, the new stack, maybe with the record still
/// pending. Either is settled by the workspace's next checkpoint, undo
/// or squash (`settle`): nothing is left for the user to remove.
///
/// A mounted workspace's daemon passes `live`: between steps 2 and 3 it
/// opens what it will serve (`Live::prepare`), right after step 4 it
/// serves the new stack over the fresh upper (`Live::commit`); if that
/// fails, the exchange is undone, the old stack written back and the
/// pending checkpoint removed.
/// `durability`: whether the steps are synced as they go (`Durability`).
pub fn checkpoint(
    ws: &Workspace,
    name: Option<&str>,
    layers: Option<&Path>,
    mut live: Option<&mut dyn Live>,
    durability: Durability,
) -> Result<String, StackError> {
    let synced = durability == Durability::Now;
    crate::failpoint::init();
    let _lock = guard(ws, &live, "a checkpoint")?;
    finish_pending(&ws.dir, &ws.upper, &ws.work)?;
    let Layers { store, mut stack } = open(&ws.dir, layers, true)?;
    settle(&store, &stack, &ws.upper)?;
    if name.is_none() && !stack.layers.is_empty() && upper_is_empty(&ws.upper)? {
        // Nothing changed since the top layer: it is this checkpoint too.
        // No layer, no swap, nothing to sync (`Stack::repeats`).
        stack.repeats = stack.repeats.saturating_add(1);
        frozen::write_unsynced(&ws.dir, &stack)?;
        return Ok(stack.layers[0].clone());
    }
    let name = store.new_name(name)?;
    let (parent, upper_name) = upper_at(&ws.upper)?;
    let root = sys::fstatat(&parent, upper_name)
        .map_err(io_ctx(format!("cannot stat {}", ws.upper.display())))?;
    if root.st_dev != store.dir.id().0 {
        return Err(StackError::Refused(format!(
            "layer store {} is not on the filesystem of upper {}: a checkpoint moves the \
             upper into the store without copying it; give --layers DIR on the upper's \
             filesystem",
            store.path().display(),
            ws.upper.display()
        )));
    }
    let record = Record {
        name: name.clone(),
        below: stack.layers.clone(),
        lowers: shared_lowers(ws, &stack),
        created: now(),
        upper: ws.upper.clone(),
        squashed: Vec::new(),
        includes: Vec::new(),
    };
    store.write_pending(&record, synced)?;
    crate::failpoint::crash("checkpoint", "record");
    fresh_dir(&store.dir, OsStr::new(&name), &root).map_err(io_ctx(format!(
        "cannot create {}",
        store.dir.shown(&name).display()
    )))?;
    crate::failpoint::crash("checkpoint", "layer");
    if let Some(l) = live.as_deref_mut() {
        let fresh = sys::open_path(&store.dir, OsStr::new(&name)).map_err(io_ctx(format!(
            "cannot open {}",
            store.dir.shown(&name).display()
        )));
        if let Err(e) = fresh.and_then(|fd| l.prepare(fd).map_err(StackError::from)) {
            let _ = store.discard(&name);
            return Err(e);
        }
    }
    let below = stack.clone();
    stack.layers.insert(0, name.clone());
    stack.repeats = 0;
    if synced {
        store.hold(&name, &ws.dir)?;
        frozen::write(&ws.dir, &stack)?;
    } else {
        store.hold_unsynced(&name, &ws.dir)?;
        frozen::write_unsynced(&ws.dir, &stack)?;
    }
    crate::failpoint::crash("checkpoint", "stack");
    sys::renameat2(
        &parent,
        upper_name,
        &store.dir,
        OsStr::new(&name),
        sys::RENAME_EXCHANGE,
    )
    .map_err(io_ctx(format!(
        "cannot exchange upper {} with {}",
        ws.upper.display(),
        store.dir.shown(&name).display()
    )))?;
    crate::failpoint::crash("checkpoint", "exchange");
    if let Some(l) = live {
        let frozen = store.path().join(&name);
        if let Err(e) = l.commit(Some(&frozen), 0) {
            let back = sys::renameat2(
                &parent,
                upper_name,
                &store.dir,
                OsStr::new(&name),
                sys::RENAME_EXCHANGE,
            );
            return Err(match back {
                Ok(()) => {
                    let back = if synced {
                        frozen::write(&ws.dir, &below)
                    } else {
                        frozen::write_unsynced(&ws.dir, &below)
                    };
                    // Off the stack again: the pending checkpoint is no
                    // one's (else the next `settle` keeps it).
                    if back.is_ok() {
                        let _ = store.discard(&name);
                    }
                    StackError::LiveCheckpointTakenBack { source: e }
                }
                Err(back) => StackError::LiveCheckpointStuck {
                    source: e,
                    back,
                    name,
                },
            });
        }
    }
    // On the stack and served: the checkpoint is taken. A failure here
    // leaves the record pending, which the next `settle` publishes.
    if let Err(e) = store.publish(&name) {
        tracing::warn!("checkpoint {name}: {e}");
    }
    if synced {
        sync_dir(&parent);
        sync_dir(&store.dir);
    }
    Ok(name)
}

/// Settles the checkpoints of the workspace with upper `upper` (whose
/// stack is `stack`, no undo pending) that a crash left pending in
/// `store`. Called with the workspace locked or by its daemon (no
/// checkpoint of it is under way) by the next `checkpoint`, `undo` and
/// `squash`, before they read the store.
///
/// The rule, from the steps of `checkpoint`: a pending record on disk
/// means that checkpoint was killed (or failed) before step 5. Its stack
/// names it iff step 3 was done; then it is this workspace's checkpoint
/// and the record is published. Otherwise the old stack stands and the
/// checkpoint was never anyone's (nothing can fork, list, export or
/// stack on a pending checkpoint: they all need its published record),
/// so its layer, hold and record are removed and its name is free. A
/// layer that is not empty is never removed, only published (after a
/// power loss on a filesystem that does not keep the steps in order,
/// the exchange may have outlived the stack's write: the layer is then
/// the upper's tree). Checkpoints of other workspaces sharing the store
/// (another `upper` in the record) are theirs to settle.
pub(crate) fn settle(store: &Store, stack: &Stack, upper: &Path) -> Result<(), StackError> {
    for r in store.pending() {
        if r.upper != upper {
            continue;
        }
        let on_stack = stack.layers.contains(&r.name) || stack.effective().contains(&r.name);
        if on_stack || !layer_is_empty(store, &r.name)? {
            tracing::info!(
                "checkpoint {}: finishing it (a crash left it pending)",
                r.name
            );
            store.publish(&r.name)?;
            store
                .dir
                .sync()
                .map_err(io_ctx(format!("cannot sync {}", store.path().display())))?;
        } else {
            tracing::info!(
                "checkpoint {}: removing it (a crash left it pending, on no stack)",
                r.name
            );
            store.discard(&r.name)?;
        }
    }
    Ok(())
}

/// Whether the layer directory `name` in `store` is missing or empty.
fn layer_is_empty(store: &Store, name: &str) -> Result<bool, StackError> {
    let what = || format!("cannot list {}", store.dir.shown(name).display());
    let fd = match sys::open_beneath(
        &store.dir,
        OsStr::new(name),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
    ) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(io_ctx(what())(e)),
    };
    Ok(sys::read_dir(&fd).map_err(io_ctx(what()))?.is_empty())
}

/// Makes the checkpoint `name` of `ws`, taken with `Durability::Deferred`,
/// durable: its record and hold, its layer's name in the store, the
/// stack, and the exchange (the upper's parent). Safe to call while
/// later checkpoints or undos run (what they removed is skipped).
pub fn sync_taken(ws: &Workspace, name: &str) -> Result<(), StackError> {
    let Layers { store, .. } = open(&ws.dir, None, false)?;
    store.sync_layer(name)?;
    frozen::sync_stack(&ws.dir)?;
    let (parent, _) = upper_at(&ws.upper)?;
    sys::open_dir(&parent)
        .and_then(|fd| std::fs::File::from(fd).sync_all())
        .map_err(io_ctx(format!(
            "cannot sync {}",
            ws.upper.parent().unwrap_or(&ws.upper).display()
        )))
}

/// `layerfs checkpoint` of `ws` whether it is mounted or not: a mounted
/// workspace's daemon takes it live (`daemon::layers`), an unmounted one
/// is checkpointed here. Returns the checkpoint's name. `durability`:
/// `Deferred` lets a daemon sync after it answered; an unmounted
/// workspace's checkpoint is always durable when this returns.
pub fn take(
    ws: &Workspace,
    name: Option<&str>,
    layers: Option<&Path>,
    durability: Durability,
) -> Result<String, StackError> {
    match ws.client() {
        Some(client) => {
            let layers = layers.map(|p| std::path::absolute(p).unwrap_or(p.to_path_buf()));
            let v: super::protocol::Checkpointed =
                client?.call(&super::protocol::Request::Checkpoint {
                    name: name.map(String::from),
                    layers: layers.map(|p| p.to_string_lossy().into_owned()),
                    deferred: durability == Durability::Deferred,
                })?;
            Ok(v.name)
        }
        None => checkpoint(ws, name, layers, None, Durability::Now),
    }
}

/// Removes from the layer store of `ws` what dead processes left aside
/// (`Store::sweep_aside`: an interrupted import, export or diff), if it
/// has a store; returns their paths.
pub fn sweep_aside(ws: &Workspace) -> Vec<PathBuf> {
    match open(&ws.dir, None, false) {
        Ok(Layers { store, .. }) => store
            .sweep_aside()
            .into_iter()
            .map(|n| store.path().join(n))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Whether the upper directory holds nothing (no change since the top
/// layer, or since the shared lowers without one).
pub(crate) fn upper_is_empty(upper: &Path) -> Result<bool, StackError> {
    let fd = sys::open_root(upper).map_err(io_ctx(format!("cannot open {}", upper.display())))?;
    Ok(sys::read_dir(&fd)
        .map_err(io_ctx(format!("cannot list {}", upper.display())))?
        .is_empty())
}

/// The shared lowers of `ws` (its lowers without its frozen layers).
pub fn shared_of(ws: &Workspace) -> Result<Vec<PathBuf>, StackError> {
    Ok(match frozen::read(&ws.dir)? {
        Some(stack) => shared_lowers(ws, &stack),
        None => ws.lowers.clone(),
    })
}

/// The shared lowers of `ws`: its lowers without the frozen layers
/// (`Workspace::resolve` puts the stack's on top).
pub fn shared_lowers(ws: &Workspace, stack: &Stack) -> Vec<PathBuf> {
    let frozen: Vec<PathBuf> = stack
        .effective()
        .iter()
        .map(|n| stack.store.join(n))
        .collect();
    ws.lowers
        .iter()
        .filter(|l| !frozen.contains(l))
        .cloned()
        .collect()
}

/// fsync of a directory whose entries changed; a failure is a warning
/// (the change is made, only its durability before the next sync is in
/// doubt).
fn sync_dir(d: &impl std::os::fd::AsFd) {
    if let Err(e) = sys::open_dir(d).and_then(|fd| std::fs::File::from(fd).sync_all()) {
        tracing::warn!("checkpoint: cannot sync a directory: {e}");
    }
}

/// Where the workspace goes back to: the checkpoint `to`, or the latest
/// one, or, when nothing changed since the latest (an empty upper), the
/// one below it. Returns the new stack (`to` on top).
fn undo_target(
    stack: &Stack,
    to: Option<&str>,
    upper_empty: bool,
) -> Result<Vec<String>, StackError> {
    let layers = &stack.layers;
    let at = match to {
        Some(n) => {
            layers
                .iter()
                .position(|l| l == n)
                .ok_or_else(|| StackError::NoSuchCheckpoint {
                    name: n.into(),
                    has: layers.clone(),
                })?
        }
        None if layers.is_empty() => return Err(StackError::NoCheckpoint),
        None if upper_empty && layers.len() > 1 => 1,
        None if upper_empty => {
            return Err(StackError::NothingToUndo {
                oldest: layers[0].clone(),
            })
        }
        None => 0,
    };
    Ok(layers[at..].to_vec())
}

/// `layerfs undo` of an unmounted workspace: decides the stack to go back
/// to, writes it as pending (the decision is durable before anything
/// changes), then finishes it (`finish_pending`). Returns the checkpoint
/// the workspace now stands on and how many checkpoints it took off.
/// A mounted workspace's daemon passes `live` (see `finish_pending_live`).
pub fn undo(
    ws: &Workspace,
    to: Option<&str>,
    live: Option<&mut dyn Live>,
) -> Result<(String, usize), StackError> {
    crate::failpoint::init();
    let _lock = guard(ws, &live, "an undo")?;
    finish_pending(&ws.dir, &ws.upper, &ws.work)?;
    let Layers { store, mut stack } = open(&ws.dir, None, false).map_err(|e| match e {
        StackError::Refused(_) => StackError::Refused("this workspace has no checkpoint".into()),
        e => e,
    })?;
    settle(&store, &stack, &ws.upper)?;
    let empty = upper_is_empty(&ws.upper)?;
    if empty && to.is_none() && stack.repeats > 0 && !stack.layers.is_empty() {
        // The latest checkpoint was the top layer again (nothing changed
        // before it): taking it back changes nothing but the count.
        stack.repeats -= 1;
        frozen::write(&ws.dir, &stack)?;
        return Ok((stack.layers[0].clone(), 0));
    }
    let target = undo_target(&stack, to, empty)?;
    let dropped: Vec<String> = stack.layers[..stack.layers.len() - target.len()].to_vec();
    let landed = target[0].clone();
    if !dropped.is_empty() {
        stack.repeats = 0;
    }
    stack.pending_undo = Some(target);
    frozen::write(&ws.dir, &stack)?;
    crate::failpoint::crash("undo", "pending");
    finish_pending_live(&ws.dir, &ws.upper, &ws.work, live)?;
    for d in &dropped {
        store.remove_unused(d, Some(&ws.dir))?;
    }
    Ok((landed, dropped.len()))
}

/// Finishes an undo that was decided (`pending` in the stack): empties
/// the upper (exchanged with an empty directory in the work dir, the old
/// tree then removed from there) and writes the stack without `pending`.
/// Idempotent: a crash anywhere is finished by the next call (every
/// command that reads a stack, and every mount, calls it first).
pub fn finish_pending(state: &SafeDir, upper: &Path, work: &Path) -> Result<(), StackError> {
    finish_pending_live(state, upper, work, None)
}

/// `finish_pending` on a mounted workspace: `live` opens the empty
/// directory before the exchange (`Live::prepare`) and serves the shorter
/// stack over it once the stack is written (`Live::commit`), before the
/// undone tree is removed (files open in it read on).
pub fn finish_pending_live(
    state: &SafeDir,
    upper: &Path,
    work: &Path,
    mut live: Option<&mut dyn Live>,
) -> Result<(), StackError> {
    let Some(mut stack) = frozen::read(state)? else {
        return Ok(());
    };
    let Some(target) = stack.pending_undo.take() else {
        return Ok(());
    };
    let work = SafeDir::open(work, crate::layer::safedir::Role::Work)?.ok_or_else(|| {
        StackError::Refused(format!(
            "work dir {} does not exist; mount the workspace once to create it",
            work.display()
        ))
    })?;
    let (parent, upper_name) = upper_at(upper)?;
    let root = sys::fstatat(&parent, upper_name)
        .map_err(io_ctx(format!("cannot stat {}", upper.display())))?;
    let tmp = format!(".layerfs-undo.{}", std::process::id());
    let tmp = OsStr::new(&tmp);
    if work.stat(tmp).is_ok() {
        crate::layer::walk::remove_tree(&work, tmp).map_err(io_ctx(format!(
            "cannot remove {}",
            work.shown(tmp).display()
        )))?;
    }
    fresh_dir(&work, tmp, &root).map_err(io_ctx(format!(
        "cannot create {}",
        work.shown(tmp).display()
    )))?;
    if let Some(l) = live.as_deref_mut() {
        let fd = sys::open_path(&work, tmp)
            .map_err(io_ctx(format!("cannot open {}", work.shown(tmp).display())))?;
        if let Err(e) = l.prepare(fd) {
            let _ = sys::unlinkat(&work, tmp, true);
            return Err(e.into());
        }
    }
    let dropped = stack.layers.len().saturating_sub(target.len());
    sys::renameat2(&parent, upper_name, &work, tmp, sys::RENAME_EXCHANGE).map_err(io_ctx(
        format!(
            "cannot exchange upper {} with an empty directory",
            upper.display()
        ),
    ))?;
    sync_dir(&parent);
    sync_dir(&work);
    crate::failpoint::crash("undo", "exchange");
    stack.layers = target;
    frozen::write(state, &stack)?;
    crate::failpoint::crash("undo", "stack");
    if let Some(l) = live {
        l.commit(None, dropped)
            .map_err(|source| StackError::LiveUndoUnserved { source })?;
    }
    crate::layer::walk::remove_tree(&work, tmp).map_err(io_ctx(format!(
        "cannot remove the undone upper {}",
        work.shown(tmp).display()
    )))
}

/// The frozen layers a mount of the workspace with state dir `state`
/// serves above its shared lowers, topmost first, after finishing a
/// pending undo; each must be a directory.
pub fn mount_layers(state: &Path, upper: &Path, work: &Path) -> Result<Vec<PathBuf>, StackError> {
    let Some(dir) = SafeDir::open(state, crate::layer::safedir::Role::State)? else {
        return Ok(Vec::new());
    };
    finish_pending(&dir, upper, work)?;
    let layers = frozen::frozen_paths(&dir)?;
    for l in &layers {
        if !l.is_dir() {
            return Err(StackError::Refused(format!(
                "checkpoint layer {} of this workspace's stack ({}) is missing; restore it, \
                 or remove {} to mount without the checkpoints",
                l.display(),
                dir.shown(frozen::STACK_FILE).display(),
                dir.shown(frozen::STACK_FILE).display()
            )));
        }
    }
    Ok(layers)
}

/// `layerfs checkpoint rm`: removes the layer `name` from the store of
/// `ws`, refused while any workspace (this one included) or checkpoint
/// stacks on it.
pub fn remove(ws: &Workspace, name: &str) -> Result<(), StackError> {
    let Layers { store, .. } = open(&ws.dir, None, false)?;
    if !store.taken(name) {
        return Err(StackError::Refused(format!(
            "no checkpoint {name} in {}",
            store.path().display()
        )));
    }
    if store.is_pending(name) {
        return Err(StackError::Refused(format!(
            "checkpoint {name} in {} is being taken, or was interrupted: the next \
             checkpoint, undo or squash of its workspace finishes or removes it",
            store.path().display()
        )));
    }
    let users = store.remove_unused(name, None)?;
    if !users.is_empty() {
        return Err(StackError::Refused(format!(
            "checkpoint {name} is in use by {}; undo past it (layerfs undo --to) or remove \
             what stands on it first",
            users.join(", ")
        )));
    }
    Ok(())
}

/// The checkpoints `ws` stands on, topmost first.
pub fn list(ws: &Workspace) -> Result<Vec<Record>, StackError> {
    let Some(stack) = frozen::read(&ws.dir)? else {
        return Ok(Vec::new());
    };
    let store = Store::open(&stack.store, false)?;
    stack
        .effective()
        .iter()
        .map(|n| {
            Ok(store.record(n)?.unwrap_or_else(|| Record {
                name: n.clone(),
                below: Vec::new(),
                lowers: Vec::new(),
                created: 0,
                upper: PathBuf::new(),
                squashed: Vec::new(),
                includes: Vec::new(),
            }))
        })
        .collect()
}

/// A fork whose holds are linked and whose stack is staged beside its
/// place, neither yet durable (`stage_fork`). Until `place` has run the
/// new workspace is no fork: it has no stack, and its holds are stale.
pub struct StagedFork {
    state: SafeDir,
    holds: Vec<SafeDir>,
    layers: Vec<PathBuf>,
    /// The store's lock, shared, from before the layers were looked up
    /// until the stack is placed (`Store::lock_for_fork`). In the `fork`
    /// command's daemon it is the inherited descriptor: the command's
    /// copy closing does not release it.
    _lock: frozen::StoreLock,
}

impl StagedFork {
    /// The frozen layers the fork stacks on, topmost first.
    pub fn layers(&self) -> &[PathBuf] {
        &self.layers
    }

    /// The stack's content synced, then the holds' directories, then the
    /// stack renamed into place: the fork exists from here, and the
    /// store's lock is let go.
    pub fn place(self) -> Result<(), StackError> {
        crate::failpoint::crash("fork", "placing");
        let holds = self.holds;
        frozen::place_new(&self.state, || holds.iter().try_for_each(SafeDir::sync))?;
        crate::failpoint::crash("fork", "stack");
        Ok(())
    }
}

/// Prepares a fork of the checkpoint `name` of `ws`: the new workspace's
/// state dir (`new_state`) gets the checkpoint's stack and a hold on each
/// layer, staged; `StagedFork::place` finishes it. Returns the staged
/// fork and the shared lowers to mount it with. No tree is read or
/// copied.
///
/// The order is the fork's safety: the holds are made first, so a kill -9
/// at any point leaves no stack (no fork; its holds are stale and
/// `Store::users` drops them) or the whole fork; and they are durable
/// before the stack is renamed into place, so after a power loss a stack
/// never stands on a layer `checkpoint rm` or `squash` could remove. It
/// costs one wait for the disk, in `place`: the stack's content is synced
/// first (on a journaling filesystem that commits the holds' links with
/// it, so their directories' fsyncs right after find nothing left to
/// write), and the rename is made durable by the mount that follows
/// (`frozen::stage_new`). The `fork` command's daemon places it while it
/// starts (`daemon::start_placing`); `fork_at` places it at once.
pub fn stage_fork(
    ws: &Workspace,
    name: &str,
    new_state: SafeDir,
) -> Result<(StagedFork, Vec<PathBuf>), StackError> {
    crate::failpoint::init();
    let Layers { store, stack } = open(&ws.dir, None, false)?;
    let lock = store.lock_for_fork()?;
    let record = store.checkpoint(name)?;
    if frozen::read(&new_state)?.is_some() {
        return Err(StackError::Refused(format!(
            "{} belongs to a workspace that stacks on layers already; give a new --upper",
            new_state.path().display()
        )));
    }
    let layers = record.stack();
    let mut holds = Vec::new();
    for l in &layers {
        if !store.has_layer(l) {
            return Err(StackError::Refused(format!(
                "checkpoint {name} stands on {l}, which is missing from {}",
                store.path().display()
            )));
        }
        holds.extend(store.hold_unsynced(l, &new_state)?);
    }
    crate::failpoint::crash("fork", "holds");
    let new = Stack {
        store: stack.store.clone(),
        layers,
        pending_undo: None,
        repeats: 0,
    };
    frozen::stage_new(&new_state, &new)?;
    let paths = new.effective().iter().map(|n| new.store.join(n)).collect();
    Ok((
        StagedFork {
            state: new_state,
            holds,
            layers: paths,
            _lock: lock,
        },
        record.lowers,
    ))
}

/// A new workspace at `upper` (missing or empty; created) forked from
/// checkpoint `name` of `ws`: its default state dir gets the stack
/// (`stage_fork`, placed at once). Returns the canonical upper, the
/// shared lowers to mount it with and the frozen layers' paths (topmost
/// first).
pub fn fork_at(
    ws: &Workspace,
    name: &str,
    upper: &Path,
) -> Result<(PathBuf, Vec<PathBuf>, Vec<PathBuf>), StackError> {
    let (upper, lowers, staged) = fork_at_staged(ws, name, upper)?;
    let layers = staged.layers().to_vec();
    staged.place()?;
    Ok((upper, lowers, layers))
}

/// `fork_at` with the fork staged, not placed (`stage_fork`): for the
/// `fork` command, whose daemon places it while it starts.
pub fn fork_at_staged(
    ws: &Workspace,
    name: &str,
    upper: &Path,
) -> Result<(PathBuf, Vec<PathBuf>, StagedFork), StackError> {
    let empty = std::fs::create_dir_all(upper)
        .and_then(|()| {
            let mut entries = std::fs::read_dir(upper)?;
            Ok(entries.next().is_none())
        })
        .map_err(io_ctx(format!("cannot create {}", upper.display())))?;
    if !empty {
        return Err(StackError::ForkNotEmpty {
            upper: upper.to_path_buf(),
        });
    }
    let upper = std::fs::canonicalize(upper).map_err(io_ctx(upper.display()))?;
    let state = super::workspace::create_state_dir(&super::workspace::default_state_dir(&upper))?;
    let (staged, lowers) = stage_fork(ws, name, state)?;
    Ok((upper, lowers, staged))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(l: &[&str]) -> Stack {
        Stack {
            store: PathBuf::from("/s"),
            layers: l.iter().map(|s| s.to_string()).collect(),
            pending_undo: None,
            repeats: 0,
        }
    }

    #[test]
    fn undo_goes_to_the_latest_then_steps_back() {
        let s = stack(&["c", "b", "a"]);
        assert_eq!(undo_target(&s, None, false).unwrap(), ["c", "b", "a"]);
        assert_eq!(undo_target(&s, None, true).unwrap(), ["b", "a"]);
        assert_eq!(undo_target(&s, Some("a"), false).unwrap(), ["a"]);
        assert!(undo_target(&s, Some("x"), false).is_err());
        assert!(undo_target(&stack(&["a"]), None, true).is_err());
        assert!(undo_target(&stack(&[]), None, false).is_err());
    }
}
