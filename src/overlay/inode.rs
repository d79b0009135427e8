//! The inode table: one `Inode` per node id the kernel knows, with the real
//! files behind it in each layer.
//!
//! Node ids are stable for the life of the mount and double as `st_ino`:
//! an object's id is derived from the (device, inode) of the file that
//! gives it its identity — the upper file if it has one, else the topmost
//! lower one — and a copy-up records the new upper file as an alias of the
//! id it had, so `st_ino` never changes when a file is copied up.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;

use crate::layer::real::RealFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

pub const ROOT_ID: u64 = 1;

/// The real files behind one overlay object.
#[derive(Debug, Default, Clone)]
pub struct Real {
    /// `O_PATH` fd of the upper file or directory, once there is one.
    pub upper: Option<Arc<RealFd>>,
    /// For a non-directory: the lower file it reads from (layer index, fd).
    /// For a directory: every lower directory merged into it, topmost first.
    pub lowers: Vec<(usize, Arc<RealFd>)>,
    /// The directory hides lower entries of the same name (opaque mark).
    pub opaque: bool,
    /// For a directory: where its lower directories live, as an absolute
    /// path from the lower roots ("/a/b"); what a redirect mark names.
    pub lower_path: Option<LowerPath>,
}

/// A lower path ("/a/b"; the root is "") as a chain of nodes shared with
/// the parent directory's: a directory's path is its parent's plus one
/// node, so N nested directories cost N nodes, not N paths of growing
/// length (quadratic: 400 MB for 20,000 one-letter levels, more than the
/// daemon can hold for 20,000 levels of long names).
#[derive(Clone, Default)]
pub struct LowerPath(Option<Arc<PathNode>>);

pub struct PathNode {
    parent: LowerPath,
    /// One or more components, without a leading `/`.
    seg: Box<OsStr>,
}

impl LowerPath {
    /// The lower roots' own path, "".
    pub fn root() -> LowerPath {
        LowerPath(None)
    }

    /// An absolute path as a redirect mark names it ("/a/b").
    pub fn absolute(p: &OsStr) -> LowerPath {
        LowerPath::root().child(p)
    }

    /// This path followed by `seg` (a name, or several joined by `/`).
    pub fn child(&self, seg: &OsStr) -> LowerPath {
        use std::os::unix::ffi::OsStrExt;
        let b = seg.as_bytes();
        let b = &b[b.iter().position(|&c| c != b'/').unwrap_or(b.len())..];
        if b.is_empty() {
            return self.clone();
        }
        LowerPath(Some(Arc::new(PathNode {
            parent: self.clone(),
            seg: OsStr::from_bytes(b).into(),
        })))
    }

    pub fn is_root(&self) -> bool {
        self.0.is_none()
    }

    /// The path as bytes: "/a/b", or "" for the root.
    pub fn to_os_string(&self) -> OsString {
        let mut segs = Vec::new();
        let mut cur = self.0.as_deref();
        while let Some(n) = cur {
            segs.push(&*n.seg);
            cur = n.parent.0.as_deref();
        }
        let mut out = OsString::new();
        for s in segs.iter().rev() {
            out.push("/");
            out.push(s);
        }
        out
    }
}

impl std::fmt::Debug for LowerPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.to_os_string())
    }
}

/// A long chain of nodes is unlinked in a loop, as for `Inode`.
impl Drop for PathNode {
    fn drop(&mut self) {
        let mut next = self.parent.0.take();
        while let Some(n) = next {
            next = match Arc::try_unwrap(n) {
                Ok(mut node) => node.parent.0.take(),
                Err(_) => None,
            };
        }
    }
}

impl Real {
    pub fn has_lower(&self) -> bool {
        !self.lowers.is_empty()
    }

    /// The file that gives the object its identity: the upper file if it
    /// has one, else the topmost lower one.
    pub fn identity(&self) -> Option<&Arc<RealFd>> {
        self.upper.as_ref().or(self.lowers.first().map(|(_, f)| f))
    }
}

/// Where an object was last seen in the tree (for policy paths, for
/// copying up parents, and for where a copy-up puts the object). Hard links
/// share one inode; `parent`/`name` is the last name seen, `others` the
/// other names seen for a non-directory.
///
/// Invariant relied on by copy-up: `parent`/`name` names the object while
/// any name seen does — a removed or replaced name is dropped
/// (`Inode::name_gone`) and another known one takes its place.
#[derive(Debug, Clone)]
pub struct Loc {
    pub parent: Option<Arc<Inode>>,
    pub name: OsString,
    pub others: Vec<(Arc<Inode>, OsString)>,
}

/// Bumped whenever a directory's `Loc` changes (after the change): a path
/// built from the locations seen at one value stays right while the value
/// does (`Overlay::path_of` caches directory paths under it).
static DIR_LOC_EPOCH: AtomicU64 = AtomicU64::new(0);

/// See `DIR_LOC_EPOCH`.
pub fn dir_loc_epoch() -> u64 {
    DIR_LOC_EPOCH.load(Ordering::Acquire)
}

/// How many other names of one object are remembered (hard links).
const MAX_OTHER_NAMES: usize = 64;

impl Loc {
    fn is(&self, parent_id: u64, name: &OsStr) -> bool {
        self.parent.as_ref().map(|p| p.id) == Some(parent_id) && self.name == name
    }
}

#[derive(Debug)]
pub struct Inode {
    pub id: u64,
    /// `S_IFMT` bits: the type never changes for an id.
    pub kind: u32,
    pub lookups: AtomicU64,
    pub real: RwLock<Real>,
    pub loc: RwLock<Loc>,
    /// Held while this object is copied up: one copy-up per inode at a
    /// time; others wait and then find the upper in place.
    pub copy_up: Mutex<()>,
    /// For a directory: the listing the kernel is reading (see
    /// `Overlay::dir_listing`).
    pub listing: Mutex<Option<Arc<Vec<super::listing::DirEntry>>>>,
    /// For a directory: the listing last built from offset 0, with the
    /// write gate's epoch when its build began, shared with openers that
    /// arrive while it is built or used (see `Overlay::dir_listing`).
    pub shared_listing: Mutex<Option<(u64, Arc<Vec<super::listing::DirEntry>>)>>,
    /// Readers waiting for or using `shared_listing`.
    pub listing_readers: std::sync::atomic::AtomicUsize,
    /// Entries in the last listing built (`Overlay::lists_long`).
    pub listing_len: std::sync::atomic::AtomicUsize,
    /// Open-mode bookkeeping for FUSE passthrough (see `file`).
    pub io: Mutex<IoState>,
    /// For a directory: every lower directory merged into it is watched
    /// for outside changes (see `watch`), so what lies under it may be
    /// cached for long.
    pub watched: AtomicBool,
    /// The lower layers whose directories were last registered for watching.
    pub watched_layers: Mutex<Option<Vec<usize>>>,
    /// For a watched directory: the newest mtime (seconds, nanoseconds) of
    /// its lower directories, read when the watch was registered and again
    /// by the watcher at each change it reports (`Overlay::read_lower_mtime`),
    /// so a stat of it costs no syscall per lower.
    pub lower_mtime: Mutex<Option<(i64, i64)>>,
    /// For a directory removed while the kernel still holds it (an open
    /// fd, a shell's cwd): its attributes when it was removed, link count
    /// 0. Its upper fd was let go (`RealFd::release`), so this is what a
    /// stat of it answers, and nothing may change it (`Overlay::copy_up`
    /// refuses with `ENOENT`).
    pub removed: Removed,
}

/// `Inode::removed`: asked on every GETATTR and every copy-up, set only
/// when a directory the kernel holds is removed. The flag answers the
/// common case (never removed) without a lock; the saved attributes sit
/// behind the mutex, read only while the flag is up.
///
/// Invariant: the flag is changed only with the mutex held, and is up
/// exactly while the mutex holds `Some`. A reader that sees the flag down
/// while a removal is being recorded is ordered before that removal, as it
/// would have been had it taken the mutex first.
#[derive(Debug, Default)]
pub struct Removed {
    set: AtomicBool,
    stat: Mutex<Option<crate::layer::sys::Stat>>,
}

impl Removed {
    /// The attributes the directory had when it was removed, if it was.
    pub fn get(&self) -> Option<crate::layer::sys::Stat> {
        if !self.set.load(Ordering::Acquire) {
            return None;
        }
        *self.stat.lock()
    }

    pub fn is_set(&self) -> bool {
        self.get().is_some()
    }

    /// The directory was removed, with these attributes (link count 0).
    pub fn set(&self, st: crate::layer::sys::Stat) {
        let mut g = self.stat.lock();
        *g = Some(st);
        self.set.store(true, Ordering::Release);
    }

    /// Another directory stands at its place now (`Overlay::re_resolve`).
    pub fn clear(&self) {
        let mut g = self.stat.lock();
        *g = None;
        self.set.store(false, Ordering::Release);
    }
}

/// The last reference to a chain of inodes (a deep directory the kernel
/// forgot bottom up, or the whole table at unmount) would drop each parent
/// from inside its child's drop: unlink the chain in a loop instead, so a
/// tree thousands of levels deep cannot overflow a thread's stack.
impl Drop for Inode {
    fn drop(&mut self) {
        let mut next = self.loc.get_mut().parent.take();
        while let Some(p) = next {
            next = match Arc::try_unwrap(p) {
                Ok(mut parent) => parent.loc.get_mut().parent.take(),
                Err(_) => None,
            };
        }
    }
}

/// How the kernel currently has this inode open: cached opens served by
/// the daemon and passthrough opens may not coexist on one inode.
#[derive(Debug, Default)]
pub struct IoState {
    pub cached_opens: u32,
    /// Handles passing this object's data file through (kept by
    /// `fuse::io_mode`): the kernel holds that file as the node's backing
    /// until the last of them is released, so the node may not stand for
    /// another file meanwhile (`Overlay::re_resolve`).
    pub passthrough_opens: u32,
    /// Shared backing id while passthrough opens exist (kernel rule: one
    /// backing file per inode at a time).
    pub backing: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// (mtime, size) seen at the last open, to keep the page cache when
    /// the file did not change.
    pub last_seen: Option<(i64, i64, u64)>,
    /// The kernel may hold pages of this node: a daemon-served open was
    /// answered once. Never cleared: a node id the kernel forgot comes
    /// back as a new `Inode`, with a new kernel inode and no pages.
    pub paged: bool,
}

impl Inode {
    pub fn new(
        id: u64,
        kind: u32,
        real: Real,
        parent: Option<Arc<Inode>>,
        name: OsString,
    ) -> Inode {
        Inode {
            id,
            kind,
            lookups: AtomicU64::new(0),
            real: RwLock::new(real),
            loc: RwLock::new(Loc {
                parent,
                name,
                others: Vec::new(),
            }),
            copy_up: Mutex::new(()),
            io: Mutex::new(IoState::default()),
            listing: Mutex::new(None),
            shared_listing: Mutex::new(None),
            listing_readers: Default::default(),
            listing_len: Default::default(),
            watched: AtomicBool::new(false),
            watched_layers: Mutex::new(None),
            lower_mtime: Mutex::new(None),
            removed: Removed::default(),
        }
    }

    pub fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }

    pub fn upper(&self) -> Option<Arc<RealFd>> {
        self.real.read().upper.clone()
    }

    /// The `O_PATH` fd of the upper copy, if there is one.
    pub fn upper_fd(&self) -> std::io::Result<Option<Arc<OwnedFd>>> {
        self.upper().map(|u| u.get()).transpose()
    }

    pub fn parent(&self) -> Option<Arc<Inode>> {
        self.loc.read().parent.clone()
    }

    /// `name` in `parent` was found to name this object (a lookup). A
    /// non-directory keeps its previous name among the others: it may be a
    /// hard link to the same object.
    pub fn seen_at(&self, parent: &Arc<Inode>, name: &OsStr) {
        let mut loc = self.loc.write();
        if loc.is(parent.id, name) {
            return;
        }
        loc.others
            .retain(|(p, n)| !(p.id == parent.id && n == name));
        let prev_parent = loc.parent.replace(parent.clone());
        let prev_name = std::mem::replace(&mut loc.name, name.to_os_string());
        if let Some(p) = prev_parent.filter(|_| !self.is_dir()) {
            if loc.others.len() >= MAX_OTHER_NAMES {
                loc.others.remove(0);
            }
            loc.others.push((p, prev_name));
        }
        self.loc_changed();
    }

    fn loc_changed(&self) {
        if self.is_dir() {
            DIR_LOC_EPOCH.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The object moved to `name` in `parent` (rename): its old name, the
    /// last seen, is gone.
    pub fn moved_to(&self, parent: &Arc<Inode>, name: &OsStr) {
        let mut loc = self.loc.write();
        loc.others
            .retain(|(p, n)| !(p.id == parent.id && n == name));
        loc.parent = Some(parent.clone());
        loc.name = name.to_os_string();
        self.loc_changed();
    }

    /// `name` in directory `parent_id` no longer names this object
    /// (unlinked, or replaced by a rename): another known name, if any,
    /// becomes the one copy-up uses.
    pub fn name_gone(&self, parent_id: u64, name: &OsStr) {
        let mut loc = self.loc.write();
        loc.others
            .retain(|(p, n)| !(p.id == parent_id && n == name));
        if loc.is(parent_id, name) {
            if let Some((p, n)) = loc.others.pop() {
                loc.parent = Some(p);
                loc.name = n;
                self.loc_changed();
            }
        }
    }
}

const SHARDS: usize = 64;

/// Node id → inode, sharded so lookups on different ids never contend.
pub struct InodeTable {
    shards: Vec<RwLock<HashMap<u64, Arc<Inode>>>>,
}

impl Default for InodeTable {
    fn default() -> Self {
        InodeTable {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
        }
    }
}

impl InodeTable {
    fn shard(&self, id: u64) -> &RwLock<HashMap<u64, Arc<Inode>>> {
        let h = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        &self.shards[h as usize % SHARDS]
    }

    pub fn get(&self, id: u64) -> Option<Arc<Inode>> {
        self.shard(id).read().get(&id).cloned()
    }

    /// Returns the inode for `id` and counts one kernel lookup on it,
    /// inserting `make()` if absent. `None` when the table holds another
    /// object under `id` (another type, or `same` says it is not this
    /// object): the caller must choose another id, since the kernel may
    /// still hold the old object by it.
    ///
    /// `same` may take the inode's own locks, so it runs outside the shard
    /// lock; the lookup is counted only if the inode is still the one
    /// checked.
    pub fn get_or_insert(
        &self,
        id: u64,
        kind: u32,
        same: impl Fn(&Inode) -> bool,
        make: impl FnOnce() -> Inode,
    ) -> Option<(Arc<Inode>, bool)> {
        loop {
            let seen = self.get(id);
            if let Some(i) = &seen {
                if i.kind != kind || !same(i) {
                    return None;
                }
            }
            let mut map = self.shard(id).write();
            match (map.get(&id), seen) {
                (Some(cur), Some(i)) if Arc::ptr_eq(cur, &i) => {
                    i.lookups.fetch_add(1, Ordering::AcqRel);
                    return Some((i, false));
                }
                (None, None) => {
                    let i = Arc::new(make());
                    i.lookups.store(1, Ordering::Release);
                    map.insert(id, i.clone());
                    return Some((i, true));
                }
                // Inserted or replaced meanwhile: check again.
                _ => continue,
            }
        }
    }

    pub fn insert_root(&self, root: Inode) {
        root.lookups.store(1 << 40, Ordering::Release);
        self.shard(ROOT_ID).write().insert(ROOT_ID, Arc::new(root));
    }

    /// The kernel forgot `n` lookups of `id`; drop it when none remain.
    /// Returns the inode when this was its last lookup.
    pub fn forget(&self, id: u64, n: u64) -> Option<Arc<Inode>> {
        if id == ROOT_ID {
            return None;
        }
        let mut map = self.shard(id).write();
        if let Some(i) = map.get(&id) {
            let prev = i
                .lookups
                .fetch_sub(n.min(i.lookups.load(Ordering::Acquire)), Ordering::AcqRel);
            if prev <= n {
                return map.remove(&id);
            }
        }
        None
    }

    /// Every inode the kernel holds now (a snapshot).
    pub fn all(&self) -> Vec<Arc<Inode>> {
        self.shards
            .iter()
            .flat_map(|s| s.read().values().cloned().collect::<Vec<_>>())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Maps the (device, inode) of a real file to its node id.
///
/// Most ids are derived from the real file's (device, inode number). Two
/// kinds of exceptions are remembered as aliases: an upper file made by
/// copy-up keeps the id of the lower file it copies, and a file whose
/// derived id is still held by the kernel for another object (the inode
/// number was recycled after the old file was removed) gets a fresh id.
///
/// Invariant: an alias names one real file, not an inode number. It
/// records that file's handle (which carries the inode's generation) and
/// is used only for a file with the same handle, so a later file that
/// reuses the inode number never inherits it; removals through the mount
/// also drop the alias of a file's last link at once.
///
/// A third kind: each name of a lower file with several links is an
/// object of its own (see `namei::split_name`), whose id is kept here by
/// the file's (device, inode) and the name's place in the lowers, for the
/// life of the mount (its `st_ino` never changes while mounted). The map
/// grows with the names of such files looked up, one entry each.
#[derive(Default)]
pub struct IdMap {
    devs: RwLock<Vec<u64>>,
    aliases: RwLock<HashMap<(u64, u64), Alias>>,
    overflow: Mutex<HashMap<(u64, u64), u64>>,
    next_overflow: AtomicU64,
    names: RwLock<HashMap<(u64, u64), NameIds>>,
    any_names: AtomicBool,
}

/// The ids of the names of one lower file, by where each lies in the lowers.
type NameIds = HashMap<Vec<u8>, u64>;

struct Alias {
    id: u64,
    /// The aliased file's handle; `None` where the filesystem gives none.
    handle: Option<Box<[u8]>>,
}

/// Where an id came from (see `IdMap::id_of`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSource {
    /// An alias recorded for exactly this file.
    Alias,
    /// Derived from the inode number, which another object may have had.
    Derived,
}

impl IdMap {
    /// The node id of the real file (dev, ino), without checking that an
    /// alias still names the same file: for directory entries' `d_ino` and
    /// cache invalidation, never for deciding which object a file is.
    pub fn id(&self, dev: u64, ino: u64) -> u64 {
        if let Some(a) = self.aliases.read().get(&(dev, ino)) {
            return a.id;
        }
        self.derived(dev, ino)
    }

    /// The node id of the real file `file` whose (dev, ino) are given: its
    /// alias if one was recorded for this very file, else the derived id.
    /// An alias left by an earlier file with the same inode number is
    /// dropped.
    pub fn id_of(&self, dev: u64, ino: u64, file: Option<&RealFd>) -> (u64, IdSource) {
        let handle = file.and_then(|f| f.handle());
        {
            let aliases = self.aliases.read();
            match aliases.get(&(dev, ino)) {
                None => return (self.derived(dev, ino), IdSource::Derived),
                Some(a) if a.handle.as_deref() == handle => return (a.id, IdSource::Alias),
                Some(_) => {}
            }
        }
        let mut aliases = self.aliases.write();
        if let Some(a) = aliases.get(&(dev, ino)) {
            if a.handle.as_deref() == handle {
                return (a.id, IdSource::Alias);
            }
            aliases.remove(&(dev, ino));
        }
        (self.derived(dev, ino), IdSource::Derived)
    }

    fn derived(&self, dev: u64, ino: u64) -> u64 {
        let tag = self.tag(dev);
        if ino < (1 << 48) && tag < (1 << 15) {
            return (tag << 48) | ino;
        }
        // Inode numbers beyond 48 bits: number them from the top of the space.
        let mut o = self.overflow.lock();
        *o.entry((dev, ino)).or_insert_with(|| self.fresh())
    }

    /// Gives the real file (dev, ino) — `file` — an id of its own because
    /// its derived id belongs to another object; the same file asking
    /// again (a concurrent lookup) gets the same id.
    pub fn reassign(&self, dev: u64, ino: u64, file: &RealFd) -> u64 {
        let handle = file.handle();
        let mut aliases = self.aliases.write();
        if let Some(a) = aliases.get(&(dev, ino)) {
            if a.handle.as_deref() == handle {
                return a.id;
            }
        }
        let id = self.fresh();
        let handle = handle.map(Box::from);
        aliases.insert((dev, ino), Alias { id, handle });
        id
    }

    /// The object `old` no longer stands for the real file (dev, ino) —
    /// `file` — (it was detached from it: `Overlay::re_resolve`): if the
    /// file's alias names `old`, the file gets a fresh id, so its next
    /// lookup makes a new object instead of finding `old` again.
    pub fn renew(&self, dev: u64, ino: u64, file: &RealFd, old: u64) {
        let handle = file.handle();
        let mut aliases = self.aliases.write();
        if aliases
            .get(&(dev, ino))
            .is_some_and(|a| a.id == old && a.handle.as_deref() == handle)
        {
            let id = self.fresh();
            let handle = handle.map(Box::from);
            aliases.insert((dev, ino), Alias { id, handle });
        }
    }

    /// A fresh id for an object without a real file (never expected).
    pub fn reassign_anonymous(&self) -> u64 {
        self.fresh()
    }

    /// An id no real file derives to and no other object has had.
    fn fresh(&self) -> u64 {
        (1 << 63) | self.next_overflow.fetch_add(1, Ordering::Relaxed)
    }

    fn tag(&self, dev: u64) -> u64 {
        if let Some(p) = self.devs.read().iter().position(|&d| d == dev) {
            return p as u64 + 1;
        }
        let mut devs = self.devs.write();
        if let Some(p) = devs.iter().position(|&d| d == dev) {
            return p as u64 + 1;
        }
        devs.push(dev);
        devs.len() as u64
    }

    /// Records that the real file (dev, ino) — `file` — is the object `id`.
    pub fn alias(&self, dev: u64, ino: u64, file: &RealFd, id: u64) {
        let handle = file.handle().map(Box::from);
        self.aliases
            .write()
            .insert((dev, ino), Alias { id, handle });
    }

    /// The real file (dev, ino) lost its last link: forget its alias, so
    /// a new file given the same inode number starts afresh.
    pub fn unalias(&self, dev: u64, ino: u64) {
        self.aliases.write().remove(&(dev, ino));
    }

    /// How many aliases are remembered (for tests and status).
    pub fn aliases(&self) -> usize {
        self.aliases.read().len()
    }

    /// The id of one name of the lower file (dev, ino) that has several
    /// links, `path` being where the name lies in the lowers: a fresh id
    /// the first time, the same one afterwards.
    pub fn name_id(&self, dev: u64, ino: u64, path: &[u8]) -> u64 {
        if let Some(id) = self.known_name_id(dev, ino, path) {
            return id;
        }
        let mut names = self.names.write();
        let of_file = names.entry((dev, ino)).or_default();
        if let Some(id) = of_file.get(path) {
            return *id;
        }
        let id = self.fresh();
        of_file.insert(path.to_vec(), id);
        self.any_names.store(true, Ordering::Release);
        id
    }

    /// Whether any name has an id of its own (a cheap test before
    /// `known_name_id`).
    pub fn has_name_ids(&self) -> bool {
        self.any_names.load(Ordering::Acquire)
    }

    /// `name_id` if one was given, without giving one.
    pub fn known_name_id(&self, dev: u64, ino: u64, path: &[u8]) -> Option<u64> {
        if !self.any_names.load(Ordering::Acquire) {
            return None;
        }
        self.names.read().get(&(dev, ino))?.get(path).copied()
    }

    /// Every id the real file (dev, ino) may be known by: its own, and
    /// those of its names that are objects of their own.
    pub fn ids_of_file(&self, dev: u64, ino: u64) -> Vec<u64> {
        let mut ids = vec![self.id(dev, ino)];
        if self.any_names.load(Ordering::Acquire) {
            if let Some(of_file) = self.names.read().get(&(dev, ino)) {
                ids.extend(of_file.values().copied());
            }
        }
        ids
    }

    /// The name of (dev, ino) known by `id` no longer is that lower file
    /// (its object lives on as an upper file under other names): the name
    /// gets a new id when looked up again.
    pub fn forget_name_id(&self, dev: u64, ino: u64, id: u64) {
        if let Some(of_file) = self.names.write().get_mut(&(dev, ino)) {
            of_file.retain(|_, v| *v != id);
        }
    }
}
