//! Lookup: finding a name across the layers. The upper is searched first,
//! then each lower top-down; a whiteout in a higher layer hides everything
//! below it, an opaque directory hides lower entries of its own name, a
//! non-directory ends the search, and a redirected directory (renamed
//! through the mount) finds its lower directories at the path its redirect
//! mark names rather than under its own name.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;

use super::inode::{IdSource, Inode, LowerPath, Real};
use super::{err, Ctx, Entry, Errno, Overlay, Result};
use crate::layer::ops::is_whiteout;
use crate::layer::reach;
use crate::layer::real::RealFd;
use crate::layer::stack;
use crate::layer::sys::{self, Stat};
use crate::layer::walk::is_dir;

/// What a name resolves to before it becomes an inode.
pub struct Resolved {
    /// Attributes of the file that gives the object its identity.
    pub st: Stat,
    pub real: Real,
    /// A lower was out of reach: `real` holds the upper's part only.
    pub degraded: bool,
}

/// Whether the inode `i` is the object that `real` resolves to: the file
/// that gives `real` its identity is the inode's upper file, or the lower
/// file the inode reads from or was copied up from.
fn same_object(i: &Inode, real: &Real) -> bool {
    let Some(ident) = real.identity() else {
        return false;
    };
    let cur = i.real.read();
    cur.upper.as_ref().is_some_and(|u| u.same_file(ident))
        || cur.lowers.first().is_some_and(|(_, l)| l.same_file(ident))
}

/// For one name of a lower file with several links (`st_nlink` > 1, not
/// copied up): where that name lies in the lowers, which keys the object
/// of its own the name gets (`IdMap::name_id`). `None` for every other
/// object.
///
/// Why (DESIGN.md §2, "Hard links in a lower"): each name of such a file
/// is a separate object through the mount, as in kernel overlayfs without
/// `index`, whose copy-up breaks the link too. The kernel then holds one
/// inode per name, so every write, truncate, chmod or setxattr reaches the
/// daemon through the name it was opened by and is judged by that name's
/// class; a write through one name copies up that name alone, and the
/// other names keep the shared content. With one object for all names, an
/// open through a cached name is judged by whichever name was looked up
/// last (a readonly name written through a free alias). Names linked
/// through the mount are upper hard links: one object, as on any
/// filesystem; a link between names of different classes is refused.
fn split_name(parent: &Inode, name: &OsStr, r: &Resolved) -> Option<Vec<u8>> {
    if is_dir(&r.st) || r.st.st_nlink <= 1 || r.real.upper.is_some() || !r.real.has_lower() {
        return None;
    }
    Some(name_key(
        parent.real.read().lower_path.as_ref(),
        parent.id,
        name,
    ))
}

/// Where `name` lies in the lowers, in the directory `dir_id` whose lower
/// path is `lower_path`: the key of a name's own object (`split_name`).
pub(super) fn name_key(lower_path: Option<&LowerPath>, dir_id: u64, name: &OsStr) -> Vec<u8> {
    name_key_in(&dir_key(lower_path, dir_id), name)
}

/// The directory part of `name_key`, for keying many names of one
/// directory (a listing) without rebuilding the path each time.
pub(super) fn dir_key(lower_path: Option<&LowerPath>, dir_id: u64) -> Vec<u8> {
    match lower_path {
        Some(p) => p.to_os_string().into_vec(),
        // A lower file always lies in a directory with a lower path; if
        // not, the directory object stands for the place.
        None => format!("#{dir_id}").into_bytes(),
    }
}

/// `name_key` from the directory's `dir_key`.
pub(super) fn name_key_in(dir: &[u8], name: &OsStr) -> Vec<u8> {
    let mut path = Vec::with_capacity(dir.len() + 1 + name.len());
    path.extend_from_slice(dir);
    path.push(b'/');
    path.extend_from_slice(name.as_bytes());
    path
}

fn not_found(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR))
}

impl Overlay {
    pub fn lookup(&self, _ctx: &Ctx, parent_id: u64, name: &OsStr) -> Result<Entry> {
        super::guard::check_name(name)?;
        let parent = self.inode(parent_id)?;
        if !parent.is_dir() {
            return err(libc::ENOTDIR);
        }
        if self.is_hidden_child(&parent, name) {
            return err(libc::ENOENT);
        }
        let r = self.resolve(&parent, name)?.ok_or(Errno(libc::ENOENT))?;
        Ok(self.instantiate(&parent, name, r))
    }

    /// Finds `name` in the directory `parent` across the layers; `None`
    /// when no layer has it (or a whiteout hides it).
    pub fn resolve(&self, parent: &Inode, name: &OsStr) -> Result<Option<Resolved>> {
        let preal = parent.real.read().clone();
        self.resolve_in(&preal, name)
    }

    /// `resolve` in the directory whose real files are `preal` (a walk of
    /// a subtree resolves directories no inode stands for).
    ///
    /// Long on purpose: the lookup is one pass down the stack (upper,
    /// then each lower until a whiteout, an opaque directory or a
    /// non-directory stops it, following redirects), and its state
    /// (what was found, the redirect in force, degraded lowers) is carried
    /// from layer to layer.
    pub(super) fn resolve_in(&self, preal: &Real, name: &OsStr) -> Result<Option<Resolved>> {
        // One view of the stack for the whole lookup; an index it does not
        // have comes from a parent resolved before a live checkpoint or
        // undo replaced the stack (`Overlay::set_lowers`): ESTALE, and the
        // kernel looks the name up again through the refreshed parent.
        let lowers = self.lowers();
        let mount = |i: usize| lowers.get(i).map(|l| &l.mount).ok_or(Errno(libc::ESTALE));
        let mut real = Real::default();
        let mut st: Option<Stat> = None;
        let mut redirect: Option<String> = None;
        let mut degraded = false;
        if let Some(u) = &preal.upper {
            let u = u.get()?;
            match sys::fstatat(u.as_ref(), name) {
                Ok(s) if is_whiteout(&s) => return Ok(None),
                Ok(s) => {
                    let fd = sys::open_path(u.as_ref(), name)?;
                    if is_dir(&s) {
                        real.opaque = self.upper.is_opaque(&fd);
                        redirect = self.upper.redirect(&fd);
                    }
                    real.upper = Some(RealFd::new(fd, &self.upper.layer.mount));
                    if !is_dir(&s) || real.opaque {
                        return Ok(Some(Resolved {
                            st: s,
                            real,
                            degraded: false,
                        }));
                    }
                    st = Some(s);
                }
                Err(e) if not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        // The lower path of this name: where a directory's lower parts live.
        let redirected = |r: &str| -> Option<LowerPath> {
            if r.starts_with('/') {
                Some(LowerPath::absolute(OsStr::new(r)))
            } else {
                preal.lower_path.as_ref().map(|p| p.child(OsStr::new(r)))
            }
        };
        let lower_path = match &redirect {
            Some(r) => redirected(r),
            None => preal.lower_path.as_ref().map(|p| p.child(name)),
        };
        if redirect.is_some() {
            if let Some(path) = &lower_path {
                self.lowers_at_path(&lowers, path, 0, &mut real);
            }
        } else {
            for (i, pfd) in &preal.lowers {
                let s = match pfd.get().and_then(|pfd| sys::fstatat(pfd.as_ref(), name)) {
                    Ok(s) => s,
                    Err(e) if not_found(&e) => continue,
                    // A lower out of reach: a directory the upper holds is
                    // answered with the upper's part alone (briefly
                    // cached; see `layer::reach`), so upper-only work
                    // goes on while a network lower is lost.
                    Err(e)
                        if st.is_some() && e.raw_os_error().is_some_and(reach::is_unreachable) =>
                    {
                        degraded = true;
                        break;
                    }
                    Err(e) => return Err(e.into()),
                };
                if is_whiteout(&s) {
                    break;
                }
                let pfd = pfd.get()?;
                let have_object = st.is_some();
                if !is_dir(&s) {
                    if !have_object {
                        let fd = sys::open_path(pfd.as_ref(), name)?;
                        real.lowers.push((*i, RealFd::new(fd, mount(*i)?)));
                        st = Some(s);
                    }
                    break;
                }
                if have_object && !st.as_ref().is_some_and(is_dir) {
                    break;
                }
                let fd = sys::open_path(pfd.as_ref(), name)?;
                let last = *i + 1 == lowers.len();
                let opaque = !last && self.upper.is_opaque(&fd);
                // A frozen layer (a checkpoint) is a former upper: a
                // directory renamed there carries a redirect, and the
                // layers below hold its contents at the path it names,
                // as in a middle layer of kernel overlayfs.
                let moved = if last || opaque {
                    None
                } else {
                    self.upper.redirect(&fd)
                };
                real.lowers.push((*i, RealFd::new(fd, mount(*i)?)));
                if st.is_none() {
                    st = Some(s);
                }
                if opaque {
                    break;
                }
                if let Some(r) = moved {
                    // `lower_path` stays the path in the topmost lower
                    // (what a redirect made through the mount names).
                    if let Some(path) = redirected(&r) {
                        self.lowers_at_path(&lowers, &path, *i + 1, &mut real);
                    }
                    break;
                }
            }
        }
        let Some(st) = st else {
            return Ok(None);
        };
        if is_dir(&st) {
            real.lower_path = lower_path;
        }
        if degraded {
            self.lower_trouble(true);
        }
        Ok(Some(Resolved { st, real, degraded }))
    }

    /// Lower directories at an absolute lower path ("/a/b"), for a
    /// redirected directory, from the lower `from` down
    /// (`layer::stack::dirs_at_path`, reading the marks in this mount's
    /// spelling; a frozen layer's redirect or opaque mark on the way acts
    /// as in a middle layer of kernel overlayfs).
    fn lowers_at_path(
        &self,
        lowers: &[Arc<crate::layer::Layer>],
        path: &LowerPath,
        from: usize,
        real: &mut Real,
    ) {
        let path = path.to_os_string();
        let roots = lowers.iter().map(|l| &l.root);
        for (i, fd) in stack::dirs_at_path(roots, from, &path, &self.upper) {
            real.lowers.push((i, RealFd::new(fd, &lowers[i].mount)));
        }
    }

    /// Turns a resolved name into an inode the kernel holds (one more
    /// lookup counted on it) and the entry to reply with.
    pub(super) fn instantiate(&self, parent: &Arc<Inode>, name: &OsStr, r: Resolved) -> Entry {
        let kind = r.st.st_mode & libc::S_IFMT;
        let lower = r.real.has_lower();
        let degraded = r.degraded;
        let (mut id, mut source) = self.first_id(parent, name, &r);
        // The resolved files, until they go into a new inode.
        let pending = std::cell::RefCell::new(Some(r.real));
        let (inode, fresh) = loop {
            let got = self.inodes.get_or_insert(
                id,
                kind,
                |i| {
                    source == IdSource::Alias
                        || pending.borrow().as_ref().is_some_and(|p| same_object(i, p))
                },
                || {
                    Inode::new(
                        id,
                        kind,
                        pending.borrow_mut().take().unwrap_or_default(),
                        Some(parent.clone()),
                        name.to_os_string(),
                    )
                },
            );
            match got {
                Some(got) => break got,
                // The kernel still holds another object by this id (its
                // file is gone and the inode number was recycled).
                None => {
                    id = match pending.borrow().as_ref() {
                        Some(p) => self.reassign(&r.st, p),
                        None => self.ids.reassign_anonymous(),
                    };
                    source = IdSource::Alias;
                }
            }
        };
        let pending = pending.into_inner();
        if !fresh {
            if let Some(mut real) = pending {
                let mut cur = inode.real.write();
                // A copy-up may have finished since `resolve` looked: never
                // drop an upper file the inode already has.
                if real.upper.is_none() {
                    real.upper = cur.upper.clone();
                }
                // Nor the lower directories it knows, for a lower that
                // could not be reached just now.
                if degraded {
                    real.lowers = std::mem::take(&mut cur.lowers);
                }
                *cur = real;
            }
            inode.seen_at(parent, name);
        }
        if inode.is_dir() {
            self.watch_dir(&inode);
        }
        // Lower entries under a watched directory are as stable as upper
        // ones: an outside change there is invalidated when it happens
        // (`volatile_in` says when not). A degraded answer is trusted as
        // briefly as a lower entry.
        let lower = self.volatile_in(parent, &inode, lower) || degraded;
        let st = self.fix_stat(&inode, r.st);
        Entry { id, st, lower }
    }

    /// The id a resolved object is first tried under (see `instantiate`):
    /// its own name's id for one name of a lower file with several links,
    /// else the id of the file that gives it its identity.
    fn first_id(&self, parent: &Inode, name: &OsStr, r: &Resolved) -> (u64, IdSource) {
        if let Some(path) = split_name(parent, name, r) {
            // Checked like a derived id: `same_object` tells whether an
            // inode under it still is this lower file.
            let id = self.ids.name_id(r.st.st_dev, r.st.st_ino, &path);
            return (id, IdSource::Derived);
        }
        self.ids.id_of(
            r.st.st_dev,
            r.st.st_ino,
            r.real.identity().map(|f| f.as_ref()),
        )
    }

    /// The node id of a resolved object (`name` in `parent`) without
    /// instantiating it: the id the kernel knows it by, or the id it will
    /// get.
    pub(super) fn object_id(&self, parent: &Inode, name: &OsStr, r: &Resolved) -> u64 {
        let kind = r.st.st_mode & libc::S_IFMT;
        let (id, source) = self.first_id(parent, name, r);
        if source == IdSource::Alias {
            return id;
        }
        match self.inodes.get(id) {
            Some(i) if i.kind != kind || !same_object(&i, &r.real) => self.reassign(&r.st, &r.real),
            _ => id,
        }
    }

    /// A fresh id for the object `real` resolves to (see `IdMap::reassign`).
    fn reassign(&self, st: &Stat, real: &Real) -> u64 {
        match real.identity() {
            Some(f) => self.ids.reassign(st.st_dev, st.st_ino, f.as_ref()),
            // Unreachable: a resolved object has an upper or a lower file.
            None => self.ids.reassign_anonymous(),
        }
    }

    /// Attributes as the mount shows them: the node id as `st_ino`, and
    /// `nlink` 1 for directories merged from several layers (their real
    /// link counts do not add up).
    pub fn fix_stat(&self, inode: &Inode, mut st: Stat) -> Stat {
        st.st_ino = inode.id;
        if !inode.is_dir() && st.st_nlink > 1 {
            // One name of a lower file with several links is an object of
            // its own (see `split_name`): it has one link.
            let real = inode.real.read();
            if real.upper.is_none() && real.has_lower() {
                st.st_nlink = 1;
            }
        }
        if inode.is_dir() {
            let real = inode.real.read();
            let layers = real.upper.is_some() as usize + real.lowers.len();
            if layers > 1 {
                st.st_nlink = 1;
            }
            // A merged directory reports the newest mtime of its layers: an
            // outside change to a lower then shows as a new mtime, which
            // makes the kernel drop its cached listing (it compares mtimes
            // when a listing is read again). Watched directories too: the
            // watch invalidates this mount's kernel cache, but a client
            // stacked on this mount (another layerfs whose lower it is, an
            // NFS export, `make`) sees only the mtime; with the upper's
            // alone a rename in a shared directory left such a client's
            // cached listing stale for good. A watched directory's lower
            // mtime is the one the watcher last read (it reads it again
            // before it invalidates the kernel's copy); an unwatched one's
            // is read here, one fstat per lower.
            if !real.lowers.is_empty() {
                let kept = match self.trusted(inode) {
                    true => *inode.lower_mtime.lock(),
                    false => None,
                };
                let lower = kept.or_else(|| newest_mtime(&real.lowers));
                if let Some(m) = lower.filter(|m| *m > (st.st_mtime, st.st_mtime_nsec)) {
                    (st.st_mtime, st.st_mtime_nsec) = m;
                }
            }
        }
        st
    }

    /// Reads the newest mtime of directory `dir`'s lower directories into
    /// `Inode::lower_mtime`, which `fix_stat` reports for a watched
    /// directory. Called when its watches are registered and by the
    /// watcher, off the request path, for each change it reports there.
    pub fn read_lower_mtime(&self, dir: &Inode) {
        // Taken apart from `lower_mtime`: `fix_stat` takes that lock
        // inside `real`'s.
        let lowers = dir.real.read().lowers.clone();
        // Held while reading: of two readers, the later value is stored.
        let mut kept = dir.lower_mtime.lock();
        *kept = newest_mtime(&lowers);
    }

    /// The path of an object relative to the mount root ("" for the root),
    /// from the names it was last seen under.
    ///
    /// Built from the nearest ancestor whose path is cached (`PathCache`),
    /// so a walk down a tree thousands of levels deep — each request asks
    /// for the path of a child of the directory asked about just before —
    /// costs a copy of the path per request, not a lock and a name per
    /// level; no recursion over the depth.
    pub fn path_of(&self, inode: &Inode) -> String {
        if inode.id == super::ROOT_ID {
            return String::new();
        }
        let epoch = super::inode::dir_loc_epoch();
        let (own, parent) = {
            let loc = inode.loc.read();
            (loc.name.clone(), loc.parent.clone())
        };
        // Names from the parent up to (not including) the root or the
        // nearest ancestor with a cached path.
        let mut names: Vec<OsString> = Vec::new();
        let mut prefix: Option<Arc<str>> = None;
        // Whether the parent's own entry answered (nothing to cache then).
        let mut parent_cached = false;
        let mut cur = parent.clone();
        while let Some(p) = cur {
            if p.id == super::ROOT_ID {
                parent_cached = names.is_empty();
                break;
            }
            if let Some((hit, own_entry)) = PATHS.get(&p, epoch) {
                prefix = Some(hit);
                parent_cached = names.is_empty() && own_entry;
                break;
            }
            let loc = p.loc.read();
            if loc.parent.is_none() {
                break;
            }
            names.push(loc.name.clone());
            cur = loc.parent.clone();
        }
        let mut s = String::from(prefix.as_deref().unwrap_or(""));
        for n in names.iter().rev() {
            if !s.is_empty() {
                s.push('/');
            }
            s.push_str(&n.to_string_lossy());
        }
        if let (false, Some(p)) = (parent_cached, &parent) {
            PATHS.put(p, epoch, &s);
        }
        if !s.is_empty() {
            s.push('/');
        }
        s.push_str(&own.to_string_lossy());
        s
    }

    /// The path of `name` inside `parent`, relative to the mount root.
    pub fn child_path(&self, parent: &Inode, name: &OsStr) -> String {
        let p = self.path_of(parent);
        if p.is_empty() {
            name.to_string_lossy().into_owned()
        } else {
            format!("{p}/{}", name.to_string_lossy())
        }
    }
}

/// The paths of a few directories asked about lately, each valid while no
/// directory moved since (`inode::dir_loc_epoch`). Entries hold a `Weak`
/// of their inode (and of its parent): while one does, no other inode can
/// have its address. A directory's path is found from its own entry or,
/// walking back up a tree (`rm -rf` removes bottom up), from the entry of
/// one of its subdirectories.
struct PathCache {
    slots: parking_lot::Mutex<Vec<PathEntry>>,
}

struct PathEntry {
    dir: std::sync::Weak<Inode>,
    parent: std::sync::Weak<Inode>,
    epoch: u64,
    path: Arc<str>,
}

/// How many directory paths `PathCache` holds, and the longest it keeps.
const PATH_CACHE_SLOTS: usize = 8;
const PATH_CACHE_MAX: usize = 4 << 20;

static PATHS: PathCache = PathCache {
    slots: parking_lot::const_mutex(Vec::new()),
};

impl PathCache {
    /// The path of `dir`, and whether it was its own entry.
    fn get(&self, dir: &Arc<Inode>, epoch: u64) -> Option<(Arc<str>, bool)> {
        let slots = self.slots.lock();
        let valid = slots.iter().filter(|e| e.epoch == epoch);
        let mut child = None;
        for e in valid {
            if std::ptr::eq(e.dir.as_ptr(), Arc::as_ptr(dir)) {
                return Some((e.path.clone(), true));
            }
            if std::ptr::eq(e.parent.as_ptr(), Arc::as_ptr(dir)) {
                child = Some(e.path.clone());
            }
        }
        // A subdirectory's path less its last name (names hold no `/`).
        let p = child?;
        p.rfind('/').map(|i| (Arc::from(&p[..i]), false))
    }

    fn put(&self, dir: &Arc<Inode>, epoch: u64, path: &str) {
        if path.len() > PATH_CACHE_MAX {
            return;
        }
        let parent = dir
            .loc
            .read()
            .parent
            .as_ref()
            .map(Arc::downgrade)
            .unwrap_or_default();
        let entry = PathEntry {
            dir: Arc::downgrade(dir),
            parent,
            epoch,
            path: Arc::from(path),
        };
        let mut slots = self.slots.lock();
        slots.retain(|e| e.epoch == epoch && !std::ptr::eq(e.dir.as_ptr(), Arc::as_ptr(dir)));
        if slots.len() >= PATH_CACHE_SLOTS {
            slots.remove(0);
        }
        slots.push(entry);
    }
}

/// The newest mtime (seconds, nanoseconds) of these lower directories,
/// one fstat each; `None` when none could be read.
fn newest_mtime(lowers: &[(usize, Arc<RealFd>)]) -> Option<(i64, i64)> {
    lowers
        .iter()
        .filter_map(|(_, l)| l.get().ok().and_then(|fd| sys::fstat(fd.as_ref()).ok()))
        .map(|ls| (ls.st_mtime, ls.st_mtime_nsec))
        .max()
}
