//! Open files and directories: handles, read/write, fsync, fallocate,
//! lseek, copy_file_range, directory listings, readlink and statfs.
//!
//! A read-only open never copies up; an open for writing (or with
//! `O_TRUNC`) copies up first. A handle opened on a lower file switches to
//! the upper copy once one exists, so readers see writes made through
//! other handles after a copy-up.
//!
//! Each handle keeps an fd of its own, opened with the caller's flags,
//! for as long as it is open — not one reopened from the object's
//! `RealFd` on use: a reopened fd is not the same open file. It would fail
//! with `ESTALE` once the file was removed or replaced behind the mount
//! (in a lower, by a restore), where the open file keeps reading what it
//! opened, and an `fsync` through it would miss a write-back error that
//! another fd of the file had already reported. Handles are bounded
//! instead: each takes a share of the daemon's fds for its caller's uid
//! first (`share`), and one over its share is refused with `EMFILE`.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::copy_up::{Data, Halt, NoHalt};
use super::guard::Op;
use super::inode::Inode;
use super::listing::DirEntry;
use super::share::{Charge, Shares};
use super::{err, Ctx, Errno, Overlay, Result};
use crate::layer::sys;

pub struct FileHandle {
    pub inode: Arc<Inode>,
    /// The real open file; replaced by the upper copy for lower readers.
    fd: RwLock<Arc<OwnedFd>>,
    on_upper: std::sync::atomic::AtomicBool,
    pub writable: bool,
    /// Who opened it.
    pub uid: u32,
    /// Bytes written through the daemon since the journal last took them.
    written: AtomicU64,
    /// The opener's share of the daemon's fds, given back with `fd`.
    _charge: Charge,
}

pub enum Handle {
    File(FileHandle),
}

/// What an fsync or fsyncdir syncs (`Overlay::fsync_target`,
/// `fsyncdir_target`), kept open until the sync has ended: the request
/// threads sync it at once (`sync`), an io_uring queue thread submits the
/// sync on its ring and hands its result to `synced`.
pub struct SyncTarget {
    fd: SyncFd,
    /// `fdatasync` rather than `fsync`.
    pub datasync: bool,
    /// The handle the file was opened through, open while the sync runs.
    _handle: Option<Arc<Handle>>,
}

enum SyncFd {
    Shared(Arc<OwnedFd>),
    Own(OwnedFd),
}

impl SyncTarget {
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        match &self.fd {
            SyncFd::Shared(fd) => fd.as_fd(),
            SyncFd::Own(fd) => fd.as_fd(),
        }
    }

    /// Syncs now, on the calling thread.
    pub fn sync(self) -> Result<()> {
        let r = sys::fsync(&self.fd(), self.datasync);
        self.synced(r)
    }

    /// The request's answer from the sync's result.
    pub fn synced(self, r: std::io::Result<()>) -> Result<()> {
        Ok(r?)
    }
}

const SHARDS: usize = 32;

/// Open handles by number.
pub struct Handles {
    next: AtomicU64,
    shards: Vec<Mutex<HashMap<u64, Arc<Handle>>>>,
    /// Each caller's share of the daemon's fds for open files.
    pub shares: Arc<Shares>,
}

impl Handles {
    pub fn new(shares: Arc<Shares>) -> Handles {
        Handles {
            next: AtomicU64::new(1),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            shares,
        }
    }

    fn insert(&self, h: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.shards[fh as usize % SHARDS]
            .lock()
            .insert(fh, Arc::new(h));
        fh
    }

    pub fn get(&self, fh: u64) -> Result<Arc<Handle>> {
        self.shards[fh as usize % SHARDS]
            .lock()
            .get(&fh)
            .cloned()
            .ok_or(Errno(libc::EBADF))
    }

    fn remove(&self, fh: u64) -> Option<Arc<Handle>> {
        self.shards[fh as usize % SHARDS].lock().remove(&fh)
    }

    /// The objects that handles open for writing (passthrough or not)
    /// refer to, with the uid holding each, each pair once.
    pub fn writers(&self) -> Vec<(Arc<Inode>, u32)> {
        let mut out: Vec<(Arc<Inode>, u32)> = Vec::new();
        for shard in &self.shards {
            for h in shard.lock().values() {
                let Handle::File(f) = h.as_ref();
                if f.writable && !out.iter().any(|(i, u)| i.id == f.inode.id && *u == f.uid) {
                    out.push((f.inode.clone(), f.uid));
                }
            }
        }
        out
    }

    /// Takes one fd of `uid`'s share for a handle about to be opened
    /// (`EMFILE` beyond it; see `share`).
    pub fn charge(&self, uid: u32) -> Result<Charge> {
        self.shares.charge(uid)
    }

    /// Bytes written through handle `fh` since the last call (the journal
    /// records writes per open file, at fsync and close).
    pub fn take_written(&self, fh: u64) -> u64 {
        match self.get(fh).ok().as_deref() {
            Some(Handle::File(f)) => f.written.swap(0, Ordering::Relaxed),
            None => 0,
        }
    }

    /// The inode and real fd behind an open handle.
    pub fn target(&self, fh: u64) -> Option<(Arc<Inode>, Arc<OwnedFd>)> {
        match self.get(fh).ok()?.as_ref() {
            Handle::File(f) => Some((f.inode.clone(), f.fd.read().clone())),
        }
    }

    /// The real fd of a handle open for writing (for ftruncate).
    pub fn writable_fd(&self, fh: u64) -> Option<Arc<OwnedFd>> {
        match self.get(fh).ok()?.as_ref() {
            Handle::File(f) if f.writable => Some(f.fd.read().clone()),
            _ => None,
        }
    }
}

/// What an open produced, for the adapter's caching decisions.
pub struct Opened {
    pub fh: u64,
    /// The real file lives in the upper (eligible for passthrough).
    pub upper: bool,
    pub fd: Arc<OwnedFd>,
    /// Opened for writing (or truncating).
    pub writable: bool,
    /// The caller's uid.
    pub uid: u32,
}

/// Whether an open with these flags changes the file (copies it up).
pub fn wants_write(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0
}

/// Flags for opening the real file: the kernel computes append offsets
/// itself, so the real fd is opened without `O_APPEND` (Linux pwrite on an
/// `O_APPEND` fd ignores the offset). `O_DIRECT` stays with the kernel too:
/// it already sends the caller's aligned requests uncached, while the
/// daemon's own buffers are not aligned, so an `O_DIRECT` real fd would
/// refuse them with EINVAL. Passthrough I/O keeps the caller's `O_DIRECT`
/// because the kernel applies the caller's flags to the backing file.
fn real_flags(flags: i32) -> i32 {
    flags & (libc::O_ACCMODE | libc::O_TRUNC | libc::O_SYNC | libc::O_DSYNC | libc::O_NONBLOCK)
}

/// From this size on, a copy-up is long work: the adapter runs an open
/// that needs one on its copy pool rather than on a request thread
/// (`fuse::long`). Below it a copy takes a few milliseconds at most.
pub const LONG_COPY: u64 = 8 << 20;

/// From this many entries on, building a directory's listing takes tens
/// of milliseconds or more (see `lists_long`).
pub const LONG_LISTING: usize = 10_000;

/// A lower directory this large (about 10,000 short names on ext4) is
/// taken for a long listing before it was ever listed.
pub const LONG_DIR_BYTES: u64 = 256 << 10;

/// The most one `copy_file_range` through the mount copies: a short count
/// is legal and callers loop, so one call holds a thread (and the kernel's
/// lock on the destination file) only as long as this takes.
pub const COPY_RANGE_MAX: u64 = super::copy_up::CHUNK;

impl Overlay {
    /// Whether opening `id` with `flags` would copy up at least
    /// `LONG_COPY` bytes of data: a regular file with no upper copy yet,
    /// opened for writing without `O_TRUNC`. One `fstat` of the lower.
    pub fn open_copies_long(&self, id: u64, flags: i32) -> bool {
        if !wants_write(flags) || flags & libc::O_TRUNC != 0 {
            return false;
        }
        self.inode(id).is_ok_and(|i| self.copy_up_long(&i))
    }

    /// Whether copying `inode` up copies at least `LONG_COPY` bytes of
    /// data: a regular file with no upper copy yet, that large.
    pub(super) fn copy_up_long(&self, inode: &Inode) -> bool {
        if inode.kind != libc::S_IFREG || inode.upper().is_some() {
            return false;
        }
        let lower = inode.real.read().lowers.first().map(|(_, fd)| fd.clone());
        let Some(Ok(fd)) = lower.map(|l| l.get()) else {
            return false;
        };
        sys::fstat(fd.as_ref()).is_ok_and(|st| st.st_size as u64 >= LONG_COPY)
    }

    pub fn open(&self, ctx: &Ctx, id: u64, flags: i32) -> Result<Opened> {
        self.open_halting(ctx, id, flags, &NoHalt)
    }

    /// `open`, with the copy-up it may need abandoned (`EINTR`, nothing
    /// left behind) as soon as `halt` says so.
    pub fn open_halting(&self, ctx: &Ctx, id: u64, flags: i32, halt: &dyn Halt) -> Result<Opened> {
        let inode = self.inode(id)?;
        if inode.is_dir() && wants_write(flags) {
            return err(libc::EISDIR);
        }
        // Before anything changes (a copy-up, a truncation): a caller over
        // its share gets EMFILE and nothing else happens.
        let charge = self.files.charge(ctx.uid)?;
        let (fd, upper) = if wants_write(flags) {
            self.guard_inode(ctx, Op::Write, &inode)?;
            let trunc = flags & libc::O_TRUNC != 0;
            let data = if trunc { Data::Empty } else { Data::All };
            let upper = self.copy_up_halting(&inode, data, halt)?;
            if trunc {
                if let Ok(st) = sys::fstat(upper.as_ref()) {
                    let _ = self.quota.charge_resize(st.st_size as u64, 0);
                }
            }
            (sys::reopen(upper.as_ref(), real_flags(flags))?, true)
        } else {
            let real = self.real_fd(&inode)?;
            let upper = inode.upper().is_some();
            let f = real_flags(flags);
            let fd = if upper {
                sys::reopen(real.as_ref(), f)?
            } else {
                sys::reopen(real.as_ref(), f | libc::O_NOATIME)
                    .or_else(|_| sys::reopen(real.as_ref(), f))?
            };
            (fd, upper)
        };
        self.insert_handle(inode, fd, upper, flags, charge)
    }

    /// Registers a file just created (`create`) as an open handle; the
    /// creator's share was taken before the file was (`Handles::charge`).
    pub fn adopt(&self, id: u64, fd: OwnedFd, flags: i32, charge: Charge) -> Result<Opened> {
        let inode = self.inode(id)?;
        self.insert_handle(inode, fd, true, flags, charge)
    }

    fn insert_handle(
        &self,
        inode: Arc<Inode>,
        fd: OwnedFd,
        upper: bool,
        flags: i32,
        charge: Charge,
    ) -> Result<Opened> {
        let fd = Arc::new(fd);
        let uid = charge.uid();
        let fh = self.files.insert(Handle::File(FileHandle {
            inode,
            fd: RwLock::new(fd.clone()),
            on_upper: upper.into(),
            writable: wants_write(flags),
            uid,
            written: AtomicU64::new(0),
            _charge: charge,
        }));
        Ok(Opened {
            fh,
            upper,
            fd,
            writable: wants_write(flags),
            uid,
        })
    }

    pub(super) fn file(&self, fh: u64) -> Result<(Arc<Handle>, Arc<OwnedFd>)> {
        let h = self.files.get(fh)?;
        let fd = match h.as_ref() {
            Handle::File(f) => {
                if !f.on_upper.load(Ordering::Acquire) {
                    if let Ok(Some(u)) = f.inode.upper_fd() {
                        // The file was copied up since this handle opened.
                        if let Ok(nfd) = sys::reopen(u.as_ref(), libc::O_RDONLY) {
                            *f.fd.write() = Arc::new(nfd);
                            f.on_upper.store(true, Ordering::Release);
                        }
                    }
                }
                f.fd.read().clone()
            }
        };
        Ok((h, fd))
    }

    pub fn read(&self, fh: u64, off: u64, size: u32) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; size as usize];
        let n = self.read_into(fh, off, &mut buf)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// `read` into `buf` (its length the size asked): the bytes read,
    /// fewer only at the end of the file.
    pub fn read_into(&self, fh: u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        let (_h, fd) = self.file(fh)?;
        let mut done = 0;
        while done < buf.len() {
            let n = sys::pread(fd.as_ref(), &mut buf[done..], off + done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }

    pub fn write(&self, fh: u64, off: u64, data: &[u8]) -> Result<u32> {
        let (h, fd) = self.file(fh)?;
        let charged = if self.quota.bytes_limited() {
            let size = sys::fstat(fd.as_ref())?.st_size as u64;
            let end = off + data.len() as u64;
            if end > size {
                self.quota.charge_resize(size, end)?;
                Some((size, end))
            } else {
                None
            }
        } else {
            None
        };
        match sys::pwrite(fd.as_ref(), data, off) {
            Ok(n) => {
                let Handle::File(f) = h.as_ref();
                f.written.fetch_add(n as u64, Ordering::Relaxed);
                Ok(n as u32)
            }
            Err(e) => {
                if let Some((a, b)) = charged {
                    let _ = self.quota.charge_resize(b, a);
                }
                Err(e.into())
            }
        }
    }

    /// Closing a file on a FUSE or network lower may wait on that
    /// filesystem (FUSE sends a flush at close): a release running
    /// without network lowers (`reach::Pass::Without`, the lower does not
    /// answer) closes it on a thread of its own, so no worker waits.
    pub fn release(&self, fh: u64) {
        let h = self.files.remove(fh);
        if h.is_some() && crate::layer::reach::without_network() {
            let closer = std::thread::Builder::new()
                .name("lower-close".into())
                .spawn(move || drop(h));
            if let Err(e) = closer {
                tracing::warn!("cannot close a lower file off the request thread: {e}");
            }
        }
    }

    /// What an fsync(2) of `fh` syncs: the handle's file (its upper copy
    /// once there is one), `datasync` as asked.
    pub fn fsync_target(&self, fh: u64, datasync: bool) -> Result<SyncTarget> {
        let (h, fd) = self.file(fh)?;
        Ok(SyncTarget {
            fd: SyncFd::Shared(fd),
            datasync,
            _handle: Some(h),
        })
    }

    pub fn fallocate(&self, fh: u64, mode: i32, off: u64, len: u64) -> Result<()> {
        let (_h, fd) = self.file(fh)?;
        if self.quota.bytes_limited()
            && mode & libc::FALLOC_FL_KEEP_SIZE == 0
            && mode & libc::FALLOC_FL_PUNCH_HOLE == 0
        {
            let size = sys::fstat(fd.as_ref())?.st_size as u64;
            if off + len > size {
                self.quota.charge_resize(size, off + len)?;
            }
        }
        Ok(sys::fallocate(fd.as_ref(), mode, off, len)?)
    }

    pub fn lseek(&self, fh: u64, off: i64, whence: i32) -> Result<i64> {
        let (_h, fd) = self.file(fh)?;
        Ok(sys::lseek(fd.as_ref(), off, whence)?)
    }

    pub fn copy_file_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u32> {
        let (_a, src) = self.file(fh_in)?;
        let (out, dst) = self.file(fh_out)?;
        let len = len.min(COPY_RANGE_MAX) as usize;
        if self.quota.bytes_limited() {
            let size = sys::fstat(dst.as_ref())?.st_size as u64;
            if off_out + len as u64 > size {
                self.quota.charge_resize(size, off_out + len as u64)?;
            }
        }
        let mut si = off_in as i64;
        let mut so = off_out as i64;
        let n = sys::copy_file_range(src.as_ref(), &mut si, dst.as_ref(), &mut so, len)?;
        let Handle::File(f) = out.as_ref();
        f.written.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n as u32)
    }

    /// Opens a directory: its merged listing is taken now, once.
    /// The listing a readdir at `offset` reads from, with its directory.
    ///
    /// The kernel opens directories without asking the daemon (see
    /// `fuse::opendir`) and caches their listings itself, so a listing is
    /// read start to end only to fill that cache. Offsets are positions in
    /// one listing: a read from offset 0 takes a fresh one, later reads
    /// continue the one kept on the directory, so a fill in several
    /// requests neither repeats nor skips an entry.
    pub fn dir_listing(&self, id: u64, offset: u64) -> Result<(Arc<Inode>, Arc<Vec<DirEntry>>)> {
        let inode = self.inode(id)?;
        if !inode.is_dir() {
            return err(libc::ENOTDIR);
        }
        if offset != 0 {
            let kept = inode.listing.lock().clone();
            if let Some(l) = kept {
                return Ok((inode, l));
            }
        }
        let list = self.shared_listing(&inode)?;
        *inode.listing.lock() = Some(list.clone());
        Ok((inode, list))
    }

    /// A fresh listing of `dir`, built once for concurrent readers: a
    /// reader arriving while another builds it (or reads the result)
    /// waits and takes the same one, if no mutation ended and the policy
    /// did not change since its build began (`WriteGate::epoch`) — then
    /// it is exactly what this reader would have built. Otherwise it
    /// builds its own. The result is dropped when its last reader is done,
    /// so it never outlives the readers that overlapped it (a later reader
    /// sees later changes from outside the mount, too).
    fn shared_listing(&self, dir: &Inode) -> Result<Arc<Vec<DirEntry>>> {
        use std::sync::atomic::Ordering::AcqRel;
        let epoch = self.gate.epoch();
        dir.listing_readers.fetch_add(1, AcqRel);
        let mut slot = dir.shared_listing.lock();
        let list = match &*slot {
            Some((built, list)) if *built == epoch => Ok(list.clone()),
            _ => self.visible_entries(dir).map(Arc::new).inspect(|list| {
                dir.listing_len
                    .store(list.len(), std::sync::atomic::Ordering::Relaxed);
                *slot = Some((epoch, list.clone()));
            }),
        };
        if dir.listing_readers.fetch_sub(1, AcqRel) == 1 {
            *slot = None;
        }
        list
    }

    /// Whether a listing of `id` from its start is long work: its last
    /// listing had `LONG_LISTING` entries or more, or, before its first,
    /// its topmost lower directory is `LONG_DIR_BYTES` or more (one
    /// `fstat`; a directory's size grows with its entries on ext4, xfs
    /// and tmpfs alike). The adapter then builds it on the copy pool
    /// (`fuse::long`).
    pub fn lists_long(&self, id: u64) -> bool {
        let Ok(dir) = self.inode(id) else {
            return false;
        };
        match dir.listing_len.load(std::sync::atomic::Ordering::Relaxed) {
            0 => {
                let lower = dir.real.read().lowers.first().map(|(_, fd)| fd.clone());
                let Some(Ok(fd)) = lower.map(|l| l.get()) else {
                    return false;
                };
                sys::fstat(fd.as_ref()).is_ok_and(|st| st.st_size as u64 >= LONG_DIR_BYTES)
            }
            n => n >= LONG_LISTING,
        }
    }

    /// The kernel read a listing to its end: it keeps its own copy now.
    pub fn dir_listing_done(&self, dir: &Inode) {
        dir.listing.lock().take();
    }

    /// Merged entries of `dir` without the names the policy hides.
    fn visible_entries(&self, dir: &Inode) -> Result<Vec<DirEntry>> {
        let mut list = self.merged_entries(dir)?;
        let policy = self.policy();
        if policy.has_path_rules() {
            let base = self.path_of(dir);
            list.retain(|e| {
                let p = if base.is_empty() {
                    e.name.to_string_lossy().into_owned()
                } else {
                    format!("{base}/{}", e.name.to_string_lossy())
                };
                policy.classify(&p).hidden.is_none()
            });
        }
        Ok(list)
    }

    /// What fsync(2) of a directory syncs (opened without the daemon: no
    /// handle): its upper, opened anew.
    ///
    /// A directory removed since it was opened has nothing left to sync,
    /// and fsync of it succeeds, as on a local filesystem: its upper's
    /// cached fd was closed at the removal (`RealFd::release`) and its
    /// handle no longer opens (`ESTALE`), which is not an error here.
    ///
    /// `None`: nothing to sync (no upper, or removed), which succeeds.
    /// A directory is always synced whole (`datasync` is not asked).
    pub fn fsyncdir_target(&self, id: u64) -> Result<Option<SyncTarget>> {
        let inode = self.inode(id)?;
        let upper = match inode.upper_fd() {
            Ok(u) => u,
            Err(e) if e.raw_os_error() == Some(libc::ESTALE) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let Some(u) = upper else { return Ok(None) };
        Ok(Some(SyncTarget {
            fd: SyncFd::Own(sys::open_dir(u.as_ref())?),
            datasync: false,
            _handle: None,
        }))
    }

    pub fn readlink(&self, id: u64) -> Result<std::ffi::OsString> {
        let inode = self.inode(id)?;
        if inode.kind != libc::S_IFLNK {
            return err(libc::EINVAL);
        }
        Ok(sys::readlink_fd(self.real_fd(&inode)?.as_ref())?)
    }

    pub fn statfs(&self) -> Result<libc::statvfs> {
        Ok(sys::fstatfs(&self.upper.layer.root)?)
    }
}
