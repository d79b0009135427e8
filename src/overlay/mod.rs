//! The union core: lookup across layers, merged readdir, copy-up,
//! whiteouts and opaque directories, rename and links. It knows nothing
//! about FUSE: every operation takes a caller context and node ids and
//! returns plain data or an errno, so it runs without a mount.

pub mod attr;
pub mod copy_up;
pub mod dir;
mod error;
pub mod events;
pub mod file;
pub mod gate;
pub mod guard;
pub mod inode;
pub mod listing;
pub mod mode;
pub mod move_guard;
pub mod namei;
pub mod origin;
pub mod quota;
pub mod readdir;
pub mod refresh;
mod remove;
mod rename;
pub mod share;
pub mod watch;
pub mod xattr;

#[cfg(test)]
mod tests;

use std::ffi::OsStr;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::layer::ops::Upper;
use crate::layer::safedir::Role;
use crate::layer::{sys, Layer};
use crate::policy::Policy;

pub use error::OverlayError;
pub use inode::{Inode, ROOT_ID};

/// An errno, the currency of every core operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl From<io::Error> for Errno {
    /// A lower's transport error (its network filesystem lost its server)
    /// becomes `EIO`; see `reach::note`.
    fn from(e: io::Error) -> Errno {
        Errno(crate::layer::reach::note(
            e.raw_os_error().unwrap_or(libc::EIO),
        ))
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", io::Error::from_raw_os_error(self.0))
    }
}

impl std::error::Error for Errno {}

pub type Result<T> = std::result::Result<T, Errno>;

pub fn err<T>(errno: i32) -> Result<T> {
    Err(Errno(errno))
}

/// Every object the kernel holds keeps an `O_PATH` fd per layer it lives
/// in, so a walk over a large tree needs many fds: raise the limit as far
/// as allowed (to `fs.nr_open` as root, to the hard limit otherwise).
fn raise_fd_limit() {
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((cur, max)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    // Failure leaves the limit as it was: then at least the soft limit
    // goes up to the hard one.
    if setrlimit(Resource::RLIMIT_NOFILE, nr_open.max(cur), nr_open.max(max)).is_err() {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, max, max);
    }
}

/// The uids that count as the mount owner for the shares of the daemon's
/// fds (`share`) and for passthrough writes (`fuse::io_mode`): the
/// daemon's user and the user owning the upper directory (root is added
/// by `Shares`). Read once, at mount.
fn share_owners(upper_root: &impl std::os::fd::AsFd) -> Vec<u32> {
    let mut owners = vec![nix::unistd::geteuid().as_raw()];
    if let Ok(st) = sys::fstat(upper_root) {
        owners.push(st.st_uid);
    }
    owners
}

/// Who asks: the caller's credentials and pid from the request.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub umask: u32,
}

impl Ctx {
    pub fn root() -> Ctx {
        Ctx {
            uid: 0,
            gid: 0,
            pid: 0,
            umask: 0o022,
        }
    }
}

/// What the kernel gets back for an object: its id and attributes, and
/// whether it involves a lower layer (for cache timeouts).
#[derive(Debug, Clone)]
pub struct Entry {
    pub id: u64,
    pub st: sys::Stat,
    pub lower: bool,
}

/// Which inode registered a directory's watches (see `watch::Owner`).
fn watch_owner(dir: &Inode) -> watch::Owner {
    dir as *const Inode as usize
}

pub struct Overlay {
    upper: Upper,
    /// The lower layers, topmost first. Replaced whole, with writes
    /// paused, by a live checkpoint or undo (`set_lowers`): a layer's
    /// index in an inode's `Real` is its index in the vector current when
    /// the inode was resolved, so every held inode is re-resolved right
    /// after a replacement (`refresh_paths`). Read it through `lowers()`.
    stack: RwLock<Arc<Vec<Arc<Layer>>>>,
    inodes: inode::InodeTable,
    ids: inode::IdMap,
    policy: RwLock<Arc<Policy>>,
    quota: quota::Usage,
    read_only: bool,
    files: file::Handles,
    /// Running as root: owners can be set, trusted xattrs written.
    privileged: bool,
    /// Watches on lower directories, where inotify is available.
    watch: Option<watch::LowerWatch>,
    /// Network lowers: lost/back probes and request admission (`None`
    /// when every lower is local).
    reach: Option<Arc<crate::layer::reach::Reach>>,
    /// Held shared by every mutating operation; a pause holds it exclusively.
    gate: gate::WriteGate,
    /// Held shared by whatever adds a name; exclusively by a directory
    /// move that walks what it moves (see `guard::MoveLock`).
    moves: guard::MoveLock,
}

/// The door to the overlay's parts for the adapters above it (fuse,
/// daemon, state, tools): read access only; the fields stay private so
/// that only the overlay replaces or rebuilds them.
impl Overlay {
    pub fn upper(&self) -> &Upper {
        &self.upper
    }
    pub fn inodes(&self) -> &inode::InodeTable {
        &self.inodes
    }
    pub fn ids(&self) -> &inode::IdMap {
        &self.ids
    }
    pub fn quota(&self) -> &quota::Usage {
        &self.quota
    }
    /// Mounted read-only: every change is refused with EROFS.
    pub fn read_only(&self) -> bool {
        self.read_only
    }
    pub fn files(&self) -> &file::Handles {
        &self.files
    }
    pub fn watch(&self) -> Option<&watch::LowerWatch> {
        self.watch.as_ref()
    }
    pub fn reach(&self) -> Option<&Arc<crate::layer::reach::Reach>> {
        self.reach.as_ref()
    }
    pub fn gate(&self) -> &gate::WriteGate {
        &self.gate
    }
}

/// What an overlay is built from: the layers, checked beforehand (see
/// `config::validate`), and how to serve them.
#[derive(Debug, Clone)]
pub struct Options {
    /// Lower dirs, topmost first.
    pub lowers: Vec<PathBuf>,
    /// How many of the topmost lowers are checkpoint layers (the rest are
    /// shared): what origin records call each (`layer::LayerName`).
    pub checkpoints: usize,
    pub upper: PathBuf,
    /// The work dir, beside the upper on the same filesystem.
    pub work: PathBuf,
    pub policy: Policy,
    pub read_only: bool,
    /// Request threads (bounds the probes of network lowers).
    pub threads: usize,
    /// The cap on inotify watches of lower dirs (`None`: the default).
    pub max_watches: Option<usize>,
}

impl Overlay {
    /// Opens the layers named by the options (the message names the
    /// layer and the problem) and sets up the root object.
    pub fn new(cfg: &Options) -> std::result::Result<Overlay, OverlayError> {
        raise_fd_limit();
        let upper_layer = Layer::open(&cfg.upper, "upper dir")?;
        // Checked as `layerfs mount` checked it (not a symlink, ours, not
        // writable by others): copy-ups are built in it.
        let work = crate::layer::safedir::SafeDir::open(&cfg.work, Role::Work)?
            .ok_or_else(|| OverlayError::NoWorkDir {
                work: cfg.work.clone(),
            })?
            .into_fd();
        let work_st = sys::fstat(&work).map_err(|source| OverlayError::StatWork {
            work: cfg.work.clone(),
            source,
        })?;
        if work_st.st_dev != upper_layer.dev {
            return Err(OverlayError::WorkElsewhere {
                work: cfg.work.clone(),
                upper: cfg.upper.clone(),
            });
        }
        let mut lowers = Vec::new();
        let names = crate::layer::LayerName::of_stack(&cfg.lowers, cfg.checkpoints);
        for ((i, l), name) in cfg.lowers.iter().enumerate().zip(names) {
            let mut layer = Layer::open(l, &format!("lower dir #{}", i + 1))?;
            layer.name = Some(name);
            tracing::info!(
                "lower #{} {}: {}",
                i + 1,
                l.display(),
                layer.caps.describe()
            );
            lowers.push(layer);
        }
        let remote = lowers
            .iter()
            .enumerate()
            .filter(|(_, l)| l.caps.remote)
            .map(|(i, l)| (i, l.path.clone(), l.caps.fstype.clone(), l.mount.clone()))
            .collect();
        let reach = crate::layer::reach::Reach::new(remote, cfg.threads);
        let privileged = nix::unistd::geteuid().is_root();
        let upper = Upper::new(upper_layer, work, privileged);
        upper
            .clean_work()
            .map_err(|source| OverlayError::CleanWork {
                work: cfg.work.clone(),
                source,
            })?;
        let policy = Arc::new(cfg.policy.clone());
        let quota = quota::Usage::new(policy.quota());
        let owners = share_owners(&upper.layer.root);
        let ov = Overlay {
            upper,
            stack: RwLock::new(Arc::new(lowers.into_iter().map(Arc::new).collect())),
            inodes: Default::default(),
            ids: Default::default(),
            policy: RwLock::new(policy),
            quota,
            read_only: cfg.read_only,
            files: file::Handles::new(share::Shares::new(owners)),
            privileged,
            watch: watch::LowerWatch::new(cfg.max_watches.unwrap_or_else(watch::default_cap)),
            reach,
            gate: Default::default(),
            moves: Default::default(),
        };
        ov.init_root()?;
        if ov.quota.limited() {
            ov.quota
                .scan(&ov.upper.layer.root)
                .map_err(OverlayError::MeasureUsage)?;
        }
        Ok(ov)
    }

    fn init_root(&self) -> std::result::Result<(), OverlayError> {
        let upper = sys::open_path(&self.upper.layer.root, OsStr::new("."))
            .map_err(OverlayError::UpperRoot)?;
        let opaque = self.upper.is_opaque(&upper);
        let mut lowers = Vec::new();
        if !opaque {
            for (i, l) in self.lowers().iter().enumerate() {
                let fd = sys::open_path(&l.root, OsStr::new(".")).map_err(|source| {
                    OverlayError::LowerRoot {
                        lower: l.path.clone(),
                        source,
                    }
                })?;
                lowers.push((i, crate::layer::real::RealFd::new(fd, &l.mount)));
            }
        }
        let real = inode::Real {
            upper: Some(crate::layer::real::RealFd::new(
                upper,
                &self.upper.layer.mount,
            )),
            lowers,
            opaque,
            lower_path: Some(inode::LowerPath::root()),
        };
        self.inodes.insert_root(Inode::new(
            ROOT_ID,
            libc::S_IFDIR,
            real,
            None,
            Default::default(),
        ));
        if let Some(root) = self.inodes.get(ROOT_ID) {
            self.watch_dir(&root);
        }
        Ok(())
    }

    /// Pauses every mutating operation until the guard is dropped (after
    /// those in flight have finished). Readers go on. Passthrough writes
    /// bypass the daemon: `fuse::FsHandle::pause_writes` also waits for
    /// those opens to close.
    pub fn pause_writes(&self) -> gate::PauseGuard<'_> {
        self.gate.pause()
    }

    /// The lower layers as served now, topmost first.
    pub fn lowers(&self) -> Arc<Vec<Arc<Layer>>> {
        self.stack.read().clone()
    }

    /// Serves `lowers` (topmost first) from now on. Call with writes
    /// paused, then re-resolve every held inode (`replace_upper_root`,
    /// `refresh_paths(&[""])`): the indices inodes hold refer to the old
    /// vector until then.
    pub fn set_lowers(&self, lowers: Vec<Arc<Layer>>) {
        *self.stack.write() = Arc::new(lowers);
    }

    pub fn policy(&self) -> Arc<Policy> {
        self.policy.read().clone()
    }

    pub fn set_policy(&self, p: Policy) {
        self.quota.set_limits(p.quota());
        *self.policy.write() = Arc::new(p);
        // Listings built under the old rules are not shared any more.
        self.gate.bump();
    }

    /// The inode for a node id the kernel holds; ESTALE if it was forgotten.
    pub fn inode(&self, id: u64) -> Result<Arc<Inode>> {
        self.inodes.get(id).ok_or(Errno(libc::ESTALE))
    }

    pub fn forget(&self, id: u64, n: u64) {
        if let Some(gone) = self.inodes.forget(id, n) {
            if let (true, Some(w)) = (gone.is_dir(), &self.watch) {
                w.unwatch(id, watch_owner(&gone));
            }
        }
    }

    /// (Re)registers the watches on a directory's lower directories after
    /// its lowers were (re)resolved; see `watch` for the invariant.
    ///
    /// A directory looked up again with the same layers, still watched,
    /// keeps its watches: the common case costs no lock and no syscall.
    /// (A lower directory replaced in place ends its watch, which clears
    /// `watched`; a lower appearing or going changes the layers.)
    ///
    /// A directory with a lower on a remote filesystem (`netfs`) is never
    /// watched: a watch there would not see changes made elsewhere.
    fn watch_dir(&self, dir: &Inode) {
        let mut watched_layers = dir.watched_layers.lock();
        let (lowers, layers): (Vec<_>, Vec<usize>) = {
            let real = dir.real.read();
            let same = watched_layers
                .as_deref()
                .is_some_and(|w| w.iter().copied().eq(real.lowers.iter().map(|(i, _)| *i)));
            let settled = dir.watched.load(std::sync::atomic::Ordering::Acquire)
                || self.any_remote(real.lowers.iter().map(|(i, _)| *i));
            if same && settled {
                return;
            }
            real.lowers.iter().map(|(i, l)| (l.clone(), *i)).unzip()
        };
        let ok = match &self.watch {
            _ if self.any_remote(layers.iter().copied()) => {
                if let Some(w) = &self.watch {
                    w.unwatch(dir.id, watch_owner(dir));
                }
                false
            }
            Some(w) => w.watch(dir.id, watch_owner(dir), &lowers),
            None => lowers.is_empty(),
        };
        *watched_layers = Some(layers);
        if ok {
            // Read after the watches are in place: a change from now on is
            // reported, and the watcher reads the mtimes again.
            self.read_lower_mtime(dir);
        }
        dir.watched.store(ok, std::sync::atomic::Ordering::Release);
    }

    /// Watch usage for `status` (`None` without inotify).
    pub fn watch_usage(&self) -> Option<watch::Usage> {
        self.watch.as_ref().map(|w| w.usage())
    }

    /// Whether any of these lower layers is on a remote filesystem.
    fn any_remote(&self, mut layers: impl Iterator<Item = usize>) -> bool {
        self.reach.is_some() && layers.any(|i| self.lowers().get(i).is_some_and(|l| l.caps.remote))
    }

    /// Whether a request about object `id` may have to reach a remote
    /// lower: a directory merging one (lookups and listings read it), or
    /// a file not copied up that lives on one. Cheap when no lower is
    /// remote.
    pub fn involves_remote(&self, id: u64) -> bool {
        if self.reach.is_none() {
            return false;
        }
        let Some(inode) = self.inodes.get(id) else {
            return false;
        };
        let real = inode.real.read();
        (inode.is_dir() || real.upper.is_none())
            && self.any_remote(real.lowers.iter().map(|(i, _)| *i))
    }

    /// A lower could not be reached; `degraded`: an answer was given
    /// without it. The network lowers are probed (see `reach`).
    fn lower_trouble(&self, degraded: bool) {
        if let Some(r) = &self.reach {
            r.suspect(degraded);
        }
    }

    /// Whether names in directory `id` may be cached for long: its lower
    /// directories are all watched (or it has none).
    pub fn dir_watched(&self, id: u64) -> bool {
        self.inodes.get(id).is_some_and(|d| self.trusted(&d))
    }

    /// Whether directory `dir` is watched and its changes are acted on.
    fn trusted(&self, dir: &Inode) -> bool {
        dir.watched.load(std::sync::atomic::Ordering::Acquire)
            && self.watch.as_ref().is_none_or(|w| w.live())
    }

    /// Whether an object's name and attributes need the short timeout
    /// (see `volatile_in`).
    pub fn volatile(&self, inode: &Inode) -> bool {
        let parent = inode.parent();
        self.volatile_in(
            parent.as_deref().unwrap_or(inode),
            inode,
            inode.real.read().has_lower(),
        )
    }

    /// Whether the entry of `inode` in directory `parent` needs the short
    /// timeout, for its name and its attributes alike (one reply carries
    /// both): it involves a lower (`lower`), and either `parent` is not
    /// watched (the name may change unseen) or `inode` is a directory not
    /// watched itself (its mtime may change unseen; the kernel keeps a
    /// directory's cached listing until it sees a new mtime, so without
    /// this a listing under a watched parent would stay stale as long as
    /// the parent's entries are trusted). A directory beyond the watch
    /// cap under a watched parent is the common case of the second.
    fn volatile_in(&self, parent: &Inode, inode: &Inode, lower: bool) -> bool {
        lower && (!self.trusted(parent) || (inode.is_dir() && !self.trusted(inode)))
    }

    /// Gives a new upper object its owner. An unprivileged daemon cannot
    /// give files away: its objects keep the daemon's own owner.
    fn own(&self, fd: &impl std::os::fd::AsFd, uid: Option<u32>, gid: Option<u32>) -> Result<()> {
        match sys::fchown(fd, uid, gid) {
            Err(e) if !self.privileged && e.raw_os_error() == Some(libc::EPERM) => Ok(()),
            r => Ok(r?),
        }
    }

    fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return err(libc::EROFS);
        }
        Ok(())
    }
}
