//! `layerfs squash`: merges a workspace's oldest checkpoint layers into
//! one, so a name is looked up in a bounded number of layers however many
//! checkpoints were taken (DESIGN.md §5, "Checkpoints, forks and undo").
//!
//! The merged layer is built aside (`.NAME.squash` in the store) from the
//! layers it replaces, topmost first, as kernel overlayfs would show them
//! over whatever lies below: the topmost entry of a name wins; a whiteout
//! or any other non-directory hides the name in the older layers (it is
//! kept, so it still hides the shared lowers); a directory merges with
//! the directories of that name below it until one is opaque or hidden
//! (the merged directory is then opaque), following redirects (the merged
//! directory then carries the redirect that applies below the merged
//! layers). Files are hard links to the frozen ones: nothing is copied,
//! and a frozen layer never changes (`state::frozen`).
//!
//! The steps, each crash point leaving the old stack or the new one:
//! 1. the merged tree in `.NAME.squash`, synced (`syncfs`);
//! 2. its record `NAME.json`, then the rename to `NAME` (an unused layer);
//! 3. the records of the kept layers above it, naming `NAME` below them
//!    (a fork of one of them shows the same tree either way);
//! 4. the stack with `NAME` in place of the merged layers: the switch;
//! 5. the merged layers removed (nothing stacks on them any more).
//!
//! A crash before 4 leaves the old stack and, at worst, an unused layer
//! or a `.squash` directory, which the next squash removes; after 4 the
//! old layers are unused and the next squash removes them too.
//!
//! The upper is left as it is, changes and all: its origin records name
//! their layers (`c:NAME`, `s:K`, `overlay::origin`), and a name merged
//! away is found in the layer that holds it now (the record's `includes`,
//! `frozen::origins`), so they read the same over either stack and no
//! step rewrites them. Only records of version 1, which index the stack,
//! would read wrong after it: a squash over an upper that may hold them
//! is refused (`require_named_origins`).

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::checkpoint::{self, Layers, LiveError};
use super::frozen::{self, io_ctx, Record, StackError};
use super::workspace::Workspace;
use crate::layer::ops;
use crate::layer::safedir::SafeDir;
use crate::layer::sys;
use crate::overlay::origin::{MOVED_IN_NAMES, MOVED_IN_VALUE, MOVED_IN_XATTR};

/// What a squash did.
pub struct Squashed {
    /// The new layer.
    pub name: String,
    /// The layers it replaced, topmost first.
    pub merged: Vec<String>,
}

/// What the daemon of a mounted workspace does around the switch of a
/// squash (`daemon::layers`): the merged layer is built while the mount
/// serves; only the switch happens with writes paused.
pub trait Live {
    /// Pauses writes until the squash returns.
    fn pause(&mut self) -> Result<(), LiveError>;
    /// Right after the stack on disk switched: serves `layer` in place of
    /// the `merged` layers below the `keep` newest.
    fn commit(&mut self, keep: usize, merged: usize, layer: &Path) -> Result<(), LiveError>;
}

/// `layerfs squash` of `ws` whether it is mounted or not: a mounted
/// workspace's daemon squashes live (`daemon::layers`).
pub fn take(ws: &Workspace, keep: usize) -> Result<Option<Squashed>, StackError> {
    match ws.client() {
        Some(client) => {
            let v: super::protocol::SquashDone =
                client?.call(&super::protocol::Request::Squash { keep })?;
            Ok((!v.name.is_empty()).then_some(Squashed {
                name: v.name,
                merged: v.merged,
            }))
        }
        None => squash(ws, keep, None),
    }
}

/// The file in a workspace's state dir saying that its upper holds no
/// origin record of version 1 (`overlay::origin`): the upper root's
/// device, inode and birth time, in hex. A checkpoint, an undo or a
/// restore that puts another directory in the upper's place leaves it
/// saying nothing: that directory is another file, even if its inode
/// number is the old upper's, recycled (its birth time differs). On a
/// filesystem that keeps no birth time nothing is noted, and every squash
/// searches.
const NAMED_ORIGINS: &str = "origins-named";

/// Refuses a squash over an upper that may hold origin records of version
/// 1: they index the stack they were written under, which the squash
/// changes (a layerfs from before records named their layers wrote them;
/// this one never does). The upper is searched only when the state dir
/// does not say it holds none (`NAMED_ORIGINS`), which, when `note`, it
/// says from then on. A live mount's daemon searches with writes paused
/// (no record moves meanwhile).
fn require_named_origins(ws: &Workspace, note: bool) -> Result<(), StackError> {
    let what = || format!("cannot read {}", ws.upper.display());
    let up = sys::open_root(&ws.upper).map_err(io_ctx(what()))?;
    let st = sys::fstat(&up).map_err(io_ctx(what()))?;
    let born = sys::birth_time(&up).map_err(io_ctx(what()))?;
    let id = born.map(|(s, ns)| format!("{:x}-{:x}-{s:x}.{ns:x}\n", st.st_dev, st.st_ino));
    let noted = id.is_some()
        && ws
            .dir
            .open_file(NAMED_ORIGINS, libc::O_RDONLY, 0)
            .and_then(|mut f| {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut f, &mut text).map(|_| text)
            })
            .is_ok_and(|t| Some(t) == id);
    if noted {
        return Ok(());
    }
    if let Some(path) = first_indexed_origin(&up).map_err(io_ctx(what()))? {
        return Err(StackError::Refused(format!(
            "upper {} holds files copied up by an older layerfs ({} and maybe more): their \
             origin records name lowers by their place in the stack, which a squash changes; \
             take a checkpoint first (layerfs checkpoint {}), then squash",
            ws.upper.display(),
            path.to_string_lossy(),
            ws.upper.display()
        )));
    }
    if let (true, Some(id)) = (note, id) {
        // Best effort: without it, the next squash searches again.
        if let Err(e) = ws.dir.replace_file_unsynced(NAMED_ORIGINS, id.as_bytes()) {
            tracing::debug!("squash: cannot note the upper's origin records: {e}");
        }
    }
    Ok(())
}

/// The path of the first regular file under `upper` whose origin record
/// names its layer by index (version 1), if any.
fn first_indexed_origin(upper: &OwnedFd) -> std::io::Result<Option<OsString>> {
    use crate::layer::walk::{entry_mode, Step, Walker};
    use crate::overlay::origin::{LayerRef, Origin};
    let mut w = Walker::new(upper)?;
    while let Some(step) = w.step()? {
        let Step::Entry(e) = step else { continue };
        match entry_mode(w.dir()?, &e)? {
            libc::S_IFDIR => w.descend(&e.name)?,
            libc::S_IFREG => {
                let o = Origin::read_at(w.dir()?, &e.name);
                if o.is_some_and(|o| matches!(o.layer, LayerRef::Index(_))) {
                    return Ok(Some(w.child_path(&e.name)));
                }
            }
            _ => {}
        }
    }
    Ok(None)
}

/// `layerfs squash`: merges every layer of `ws`'s stack below its `keep`
/// newest into one. `Ok(None)` when fewer than two would be merged.
/// Refused when a layer to merge is stood on by anything but this
/// workspace's own stack, and when the upper may hold origin records of
/// version 1 (`require_named_origins`); the upper's changes stay as they
/// are (their records name their layers, `frozen::origins`). A mounted
/// workspace's daemon passes `live`: the layer is built while the mount
/// serves, then, writes paused, the stack is switched and served (`Live`).
pub fn squash(
    ws: &Workspace,
    keep: usize,
    mut live: Option<&mut dyn Live>,
) -> Result<Option<Squashed>, StackError> {
    crate::failpoint::init();
    let _lock = match (&ws.mountpoint, &live) {
        (_, Some(_)) => None,
        (Some(mp), None) => {
            return Err(StackError::Refused(format!(
                "{} is mounted: a squash of a live mount goes through its daemon (give the \
                 mountpoint or the upper to layerfs, not this library call)",
                mp.display()
            )))
        }
        (None, None) => Some(checkpoint::lock_upper(&ws.upper)?),
    };
    checkpoint::finish_pending(&ws.dir, &ws.upper, &ws.work)?;
    let Layers { store, mut stack } = checkpoint::open(&ws.dir, None, false)
        .map_err(|_| StackError::Refused("this workspace has no checkpoint".into()))?;
    checkpoint::settle(&store, &stack, &ws.upper)?;
    sweep(&store, &ws.dir, &ws.upper);
    store.sweep_aside();
    require_named_origins(ws, live.is_none())?;
    if stack.layers.len() < keep + 2 {
        return Ok(None);
    }
    let kept: Vec<String> = stack.layers[..keep].to_vec();
    let merged: Vec<String> = stack.layers[keep..].to_vec();
    for l in &merged {
        let others: Vec<String> = store
            .users(l, Some(&ws.dir))?
            .into_iter()
            .filter(|u| !stack.layers.iter().any(|k| *u == format!("checkpoint {k}")))
            .collect();
        if !others.is_empty() {
            return Err(StackError::Refused(format!(
                "checkpoint {l} is also stood on by {}: squashing it would take it from \
                 them; squash fewer layers (--keep) or remove those first",
                others.join(", ")
            )));
        }
    }
    let name = crate::state::snapshot_id::generate(|n| {
        store.taken(n) || store.dir.stat(tmp_name(n, &ws.dir)).is_ok()
    });
    let tmp = tmp_name(&name, &ws.dir);
    build(&store, &merged, &tmp)?;
    crate::failpoint::crash("squash", "built");
    let top = store.record(&merged[0])?;
    let mut includes: Vec<String> = Vec::new();
    for m in &merged {
        let held = store.record(m)?.map(|r| r.holds()).unwrap_or_default();
        for n in std::iter::once(m.clone()).chain(held) {
            if !includes.contains(&n) {
                includes.push(n);
            }
        }
    }
    let shared = checkpoint::shared_lowers(ws, &stack);
    store.write_record(&Record {
        name: name.clone(),
        below: Vec::new(),
        lowers: shared,
        created: top.as_ref().map_or(0, |r| r.created),
        upper: ws.upper.clone(),
        squashed: merged.clone(),
        includes,
    })?;
    store.place(&tmp, &name)?;
    crate::failpoint::crash("squash", "layer");
    store.hold(&name, &ws.dir)?;
    if let Some(l) = live.as_deref_mut() {
        // Writes paused from here until the new stack is served: a copy-up
        // meanwhile named its layer (`c:NAME` finds the merged layer
        // after the switch), and no record moves while the upper is
        // searched for indexed ones. An unused layer left here is removed
        // by the next squash (`sweep`).
        l.pause()?;
        if let Err(e) = require_named_origins(ws, true) {
            let _ = store.remove(&name);
            return Err(e);
        }
    }
    for (i, k) in kept.iter().enumerate() {
        if let Some(mut r) = store.record(k)? {
            r.below = kept[i + 1..]
                .iter()
                .cloned()
                .chain([name.clone()])
                .collect();
            store.write_record(&r)?;
        }
    }
    crate::failpoint::crash("squash", "records");
    stack.layers = kept.into_iter().chain([name.clone()]).collect();
    frozen::write(&ws.dir, &stack)?;
    crate::failpoint::crash("squash", "stack");
    if let Some(l) = live {
        l.commit(keep, merged.len(), &store.path().join(&name))
            .map_err(|source| StackError::LiveSquashUnserved { source })?;
    }
    for l in &merged {
        // A fork of a merged checkpoint made since the check above keeps
        // it (and the layers below it): the next squash's `sweep` removes
        // it once nothing stacks on it.
        store.remove_unused(l, Some(&ws.dir))?;
        crate::failpoint::crash("squash", "remove");
    }
    Ok(Some(Squashed { name, merged }))
}

/// Builds in the store the directory `tmp` (new) holding the merge of
/// `layers` (topmost first) as kernel overlayfs would show them over what
/// lies below, and syncs it (`syncfs`). Used by `squash` and by `export`
/// of a checkpoint that stands on others.
pub(crate) fn build(store: &frozen::Store, layers: &[String], tmp: &str) -> Result<(), StackError> {
    let roots: Vec<OwnedFd> = layers
        .iter()
        .map(|l| {
            sys::open_path(&store.dir, OsStr::new(l)).map_err(io_ctx(format!(
                "cannot open layer {}",
                store.dir.shown(l).display()
            )))
        })
        .collect::<Result<_, _>>()?;
    let out = build_from(&store.dir, &roots, tmp)?;
    let what = || format!("cannot build {}", store.dir.shown(tmp).display());
    crate::sys::syncfs(sys::open_dir(&out).map_err(io_ctx(what()))?).map_err(io_ctx(what()))?;
    Ok(())
}

/// Builds in `dir` the directory `tmp` (new) holding the merge of the
/// layers whose roots are `roots` (topmost first), as `build` does, but
/// not synced; returns it (`O_PATH`). The roots must be on `dir`'s
/// filesystem (files are hard links). Also used for the view `diff
/// --base shared` compares (`state::ops`).
pub(crate) fn build_from(
    dir: &SafeDir,
    roots: &[OwnedFd],
    tmp: &str,
) -> Result<OwnedFd, StackError> {
    let like = sys::fstat(&roots[0]).map_err(io_ctx("cannot stat the top merged layer"))?;
    let what = || format!("cannot build {}", dir.shown(tmp).display());
    sys::mkdirat(dir, OsStr::new(tmp), 0o700).map_err(io_ctx(what()))?;
    let out = sys::open_path(dir, OsStr::new(tmp)).map_err(io_ctx(what()))?;
    let merge = Merge { roots };
    merge
        .dir(&out, &like, &roots[..1], roots, b"/", false)
        .map_err(io_ctx(what()))?;
    Ok(out)
}

/// Where the layer `name` is built for the workspace whose state dir is
/// `state` (`.NAME.DEV-INO.squash`: a squash sweeps only its own).
fn tmp_name(name: &str, state: &SafeDir) -> String {
    format!(".{name}.{}.squash", tmp_tag(state))
}

fn tmp_tag(state: &SafeDir) -> String {
    let (dev, ino) = state.id();
    format!("{dev:x}-{ino:x}")
}

/// Removes what an interrupted squash of this workspace (state dir
/// `state`, upper `upper`) left in the store: its `.squash` directories;
/// layers a squash of it made that nothing stacks on (a crash before the
/// switch); and the layers a squash merged that nothing stacks on any
/// more (a crash after it). Best effort: what cannot be removed now is
/// left for the next squash.
fn sweep(store: &frozen::Store, state: &SafeDir, upper: &Path) {
    let Ok(entries) = store.dir.read_dir() else {
        return;
    };
    let ours = format!(".{}.squash", tmp_tag(state));
    let mut records = Vec::new();
    for e in &entries {
        let n = e.name.to_string_lossy();
        if n.starts_with('.') && n.ends_with(&ours) {
            let _ = crate::layer::walk::remove_tree(&store.dir, &e.name);
        } else if let Some(layer) = n.strip_suffix(".json") {
            if let Ok(Some(r)) = store.record(layer) {
                if r.upper == upper && !r.squashed.is_empty() {
                    records.push(r);
                }
            }
        }
    }
    let remove_unused = |l: &str| {
        if store.taken(l) {
            let _ = store.remove_unused(l, None);
        }
    };
    for r in records {
        remove_unused(&r.name);
        for gone in &r.squashed {
            remove_unused(gone);
        }
    }
}

/// The layers being merged, topmost first.
struct Merge<'a> {
    roots: &'a [OwnedFd],
}

/// Whether `st` is a directory.
fn is_dir(st: &sys::Stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

impl Merge<'_> {
    /// Fills `out` (empty, made for the directory whose layers' parts are
    /// `dirs`, topmost first) and gives it the metadata of `like` (the
    /// topmost part) and of `meta` (its parts, for the xattrs). `path`:
    /// the directory's path in the layers below the merged ones; `closed`:
    /// nothing below the merged layers shows in it (it or a parent is
    /// opaque), so a whiteout in it hides nothing and is left out (kernel
    /// overlayfs lists a lone lower directory as it is, whiteouts too).
    fn dir(
        &self,
        out: &OwnedFd,
        like: &sys::Stat,
        meta: &[OwnedFd],
        dirs: &[OwnedFd],
        path: &[u8],
        closed: bool,
    ) -> std::io::Result<()> {
        let mut names: Vec<OsString> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for d in dirs {
            for e in sys::read_dir(d)? {
                if seen.insert(e.name.clone()) {
                    names.push(e.name);
                }
            }
        }
        for name in names {
            self.entry(out, dirs, &name, path, closed)?;
        }
        let top = sys::open_dir(&meta[0])?;
        let dst = sys::open_dir(out)?;
        copy_dir_xattrs(&top, &dst)?;
        // A file moved into this directory in an older layer lies in the
        // merge too: the moved-in mark (a hint to read its origin record,
        // `overlay::origin`) is kept if any part has it.
        if dirs[1..].iter().any(has_moved_in) && !has_moved_in(&meta[0]) {
            sys::setxattr(&dst, &mark(MOVED_IN_XATTR), MOVED_IN_VALUE, 0)?;
        }
        sys::fchown(&dst, Some(like.st_uid), Some(like.st_gid))?;
        sys::fchmod(&dst, like.st_mode & 0o7777)?;
        let times = [
            libc::timespec {
                tv_sec: like.st_atime,
                tv_nsec: like.st_atime_nsec,
            },
            libc::timespec {
                tv_sec: like.st_mtime,
                tv_nsec: like.st_mtime_nsec,
            },
        ];
        sys::futimens(&dst, &times)
    }

    /// The merged entry `name` of the directory whose parts are `dirs`.
    fn entry(
        &self,
        out: &OwnedFd,
        dirs: &[OwnedFd],
        name: &OsStr,
        parent_path: &[u8],
        parent_closed: bool,
    ) -> std::io::Result<()> {
        let natural = child_path(parent_path, name.as_bytes());
        let mut path = natural.clone();
        let mut parts: Vec<OwnedFd> = Vec::new();
        let mut top: Option<sys::Stat> = None;
        let mut closed = false;
        let mut i = 0;
        let mut redirected_below: Option<usize> = None;
        while i < dirs.len() {
            let found = match redirected_below {
                // Below a redirect: the layer's directory at the path it names.
                Some(_) => self.at_path(i, &path)?,
                None => match sys::fstatat(&dirs[i], name) {
                    Ok(st) => Some((sys::open_path(&dirs[i], name)?, st)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => return Err(e),
                },
            };
            i += 1;
            let Some((fd, st)) = found else { continue };
            if !is_dir(&st) {
                if top.is_none() {
                    // The topmost is a file, symlink, device or whiteout:
                    // it hides the older layers' (and the shared lowers').
                    if parent_closed && ops::is_whiteout(&st) {
                        return Ok(());
                    }
                    return sys::linkat(&dirs[i - 1], name, out, name);
                }
                // A non-directory below the directory: hidden by it.
                closed = true;
                break;
            }
            if top.is_none() {
                top = Some(st);
            }
            let rd = sys::open_dir(&fd)?;
            let opaque = ops::is_opaque(&rd);
            let redirect = if opaque { None } else { ops::redirect(&rd) };
            parts.push(fd);
            if opaque {
                closed = true;
                break;
            }
            if let Some(r) = redirect {
                let r = r.as_bytes();
                path = if r.first() == Some(&b'/') {
                    r.to_vec()
                } else {
                    child_path(parent_path, r)
                };
                redirected_below = Some(i);
            }
        }
        let Some(top) = top else { return Ok(()) };
        sys::mkdirat(out, name, 0o700)?;
        let child = sys::open_path(out, name)?;
        let rd = sys::open_dir(&child)?;
        if closed && !parent_closed {
            sys::setxattr(&rd, &mark("opaque"), ops::OPAQUE_VALUE, 0)?;
        } else if !parent_closed && path != natural {
            sys::setxattr(&rd, &mark("redirect"), &path, 0)?;
        }
        let (first, _) = parts.split_at(1);
        self.dir(&child, &top, first, &parts, &path, closed || parent_closed)
    }

    /// The directory at `path` (absolute, in the layers' terms) in merged
    /// layer `i`, if there is one.
    fn at_path(&self, i: usize, path: &[u8]) -> std::io::Result<Option<(OwnedFd, sys::Stat)>> {
        let rel = path.strip_prefix(b"/").unwrap_or(path);
        if rel.is_empty() {
            let fd = sys::open_path(&self.roots[i], OsStr::new("."))?;
            let st = sys::fstat(&fd)?;
            return Ok(Some((fd, st)));
        }
        match sys::open_beneath(
            &self.roots[i],
            OsStr::from_bytes(rel),
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        ) {
            Ok(fd) => {
                let st = sys::fstat(&fd)?;
                Ok(Some((fd, st)))
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

fn child_path(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = parent.to_vec();
    if p.last() != Some(&b'/') {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// Whether directory `d` carries the moved-in mark, in either spelling.
fn has_moved_in(d: &OwnedFd) -> bool {
    MOVED_IN_NAMES.iter().any(|n| {
        let n = CString::new(*n).expect("no NUL");
        sys::getxattr(d, &n).is_ok()
    })
}

/// An overlay mark in the spelling a mount by this user writes.
fn mark(what: &str) -> CString {
    let prefix = if nix::unistd::geteuid().is_root() {
        ops::PRIVATE_PREFIXES[0]
    } else {
        ops::PRIVATE_PREFIXES[1]
    };
    CString::new(format!("{prefix}{what}")).expect("no NUL")
}

/// The xattrs of directory `src` on `dst`, but its opaque and redirect
/// marks (the merge decides those).
fn copy_dir_xattrs(src: &OwnedFd, dst: &OwnedFd) -> std::io::Result<()> {
    let list = match sys::flistxattr(src) {
        Ok(l) => l,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(()),
        Err(e) => return Err(e),
    };
    for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let is_mark = ops::PRIVATE_PREFIXES.iter().any(|p| {
            let p = p.as_bytes();
            name == [p, b"opaque"].concat().as_slice()
                || name == [p, b"redirect"].concat().as_slice()
        });
        if is_mark {
            continue;
        }
        let Ok(cname) = CString::new(name) else {
            continue;
        };
        if let Ok(v) = sys::getxattr(src, &cname) {
            sys::setxattr(dst, &cname, &v, 0)?;
        }
    }
    Ok(())
}
