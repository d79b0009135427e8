//! How opened files are served: FUSE passthrough or through the daemon.
//!
//! Passthrough (reads and writes go straight to the backing file, never
//! reaching the daemon) is used for regular files that live in the upper,
//! when running as root. Lower files are served through the daemon with
//! the kernel page cache: a passthrough open would pin the lower file as
//! the inode's backing file, and the kernel allows one backing file per
//! inode at a time, so a later open for writing (which copies up) could
//! not switch to the upper copy.
//!
//! Kernel rule relied on here: cached (daemon-served) opens and
//! passthrough opens of one inode may not coexist. While an inode has
//! cached opens, new opens of it are cached too; passthrough opens of one
//! inode share one backing id.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use fuser::{BackingId, FileHandle, FopenFlags, Generation, ReplyCreate, ReplyOpen};
use parking_lot::Mutex;

use crate::layer::sys;
use crate::overlay::file::Opened;
use crate::overlay::{Entry, Overlay};

#[derive(Default)]
struct State {
    /// Node id → its shared backing id while passthrough opens exist.
    backing: HashMap<u64, Weak<BackingId>>,
    /// Handle → backing id it holds (dropped at release).
    held: HashMap<u64, Arc<BackingId>>,
    /// Handles served by the daemon, by node id (count).
    cached: HashMap<u64, u32>,
    cached_handles: HashMap<u64, u64>,
    /// Passthrough handles open for writing → node id. Their writes never
    /// reach the daemon, so a pause waits for them to close.
    pt_writers: HashMap<u64, u64>,
}

pub struct IoModes {
    wanted: bool,
    enabled: AtomicBool,
    state: Mutex<State>,
}

enum Mode {
    Passthrough(Arc<BackingId>),
    Cached(FopenFlags),
}

impl IoModes {
    pub fn new(root: bool) -> IoModes {
        let disabled = std::env::var_os("LAYERFS_NO_PASSTHROUGH").is_some();
        IoModes {
            wanted: root && !disabled,
            enabled: AtomicBool::new(false),
            state: Mutex::new(State::default()),
        }
    }

    pub fn passthrough_wanted(&self) -> bool {
        self.wanted
    }

    pub fn set_passthrough(&self, on: bool) {
        self.enabled.store(on, Ordering::Release);
    }

    /// Decides the mode of a new open of node `id` and books it.
    fn decide(
        &self,
        ov: &Overlay,
        id: u64,
        o: &Opened,
        open_backing: impl FnOnce(&std::os::fd::OwnedFd) -> std::io::Result<BackingId>,
    ) -> Mode {
        let mut st = self.state.lock();
        let cached_now = st.cached.get(&id).copied().unwrap_or(0);
        let regular = ov
            .inode(id)
            .map(|i| i.kind == libc::S_IFREG)
            .unwrap_or(false);
        if self.enabled.load(Ordering::Acquire) && o.upper && regular && cached_now == 0 {
            let existing = st.backing.get(&id).and_then(Weak::upgrade);
            let backing = match existing {
                Some(b) => Some(b),
                None => match open_backing(o.fd.as_ref()) {
                    Ok(b) => {
                        let b = Arc::new(b);
                        st.backing.insert(id, Arc::downgrade(&b));
                        Some(b)
                    }
                    Err(e) => {
                        tracing::debug!(id, "passthrough refused: {e}");
                        None
                    }
                },
            };
            if let Some(b) = backing {
                st.held.insert(o.fh, b.clone());
                if o.writable {
                    st.pt_writers.insert(o.fh, id);
                }
                return Mode::Passthrough(b);
            }
        }
        if st.backing.get(&id).and_then(Weak::upgrade).is_some() {
            // A passthrough open exists and a backing could not be shared:
            // serving this one through the daemon would be refused by the
            // kernel; the caller gets direct I/O through the daemon instead.
            tracing::debug!(id, "mixed open while passthrough is active");
        }
        *st.cached.entry(id).or_insert(0) += 1;
        st.cached_handles.insert(o.fh, id);
        drop(st);
        Mode::Cached(self.cache_flags(ov, id, o))
    }

    /// Keeps the page cache when the file did not change since it was
    /// last opened (same mtime and size) — except for a file on a network
    /// lower, whose client may serve data older than the attributes it
    /// reports (GlusterFS keeps small files in a data cache its upcalls do
    /// not invalidate): pages kept then would keep that old data for as
    /// long as the attributes stay the same. Such files are re-read at
    /// every open (close-to-open, as NFS).
    fn cache_flags(&self, ov: &Overlay, id: u64, o: &Opened) -> FopenFlags {
        if !o.upper && ov.involves_remote(id) {
            return FopenFlags::empty();
        }
        let Ok(st) = sys::fstat(o.fd.as_ref()) else {
            return FopenFlags::empty();
        };
        let Ok(inode) = ov.inode(id) else {
            return FopenFlags::empty();
        };
        let now = (st.st_mtime, st.st_mtime_nsec, st.st_size as u64);
        let mut io = inode.io.lock();
        let keep = io.last_seen == Some(now);
        io.last_seen = Some(now);
        if keep {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        }
    }

    /// Replies to an open; `before_reply` learns whether it is passthrough
    /// before the kernel can use the handle.
    pub fn reply_open(
        &self,
        ov: &Overlay,
        id: u64,
        o: Opened,
        reply: ReplyOpen,
        before_reply: impl FnOnce(bool),
    ) {
        let mode = self.decide(ov, id, &o, |fd| reply.open_backing(fd));
        before_reply(matches!(mode, Mode::Passthrough(_)));
        match mode {
            Mode::Passthrough(b) => {
                reply.opened_passthrough(FileHandle(o.fh), FopenFlags::empty(), &b)
            }
            Mode::Cached(flags) => reply.opened(FileHandle(o.fh), flags),
        }
    }

    pub fn reply_create(
        &self,
        ov: &Overlay,
        e: &Entry,
        ttl: Duration,
        o: Opened,
        reply: ReplyCreate,
        before_reply: impl FnOnce(bool),
    ) {
        let attr = super::convert::attr(&e.st);
        let mode = self.decide(ov, e.id, &o, |fd| reply.open_backing(fd));
        before_reply(matches!(mode, Mode::Passthrough(_)));
        match mode {
            Mode::Passthrough(b) => reply.created_passthrough(
                &ttl,
                &attr,
                Generation(0),
                FileHandle(o.fh),
                FopenFlags::empty(),
                &b,
            ),
            Mode::Cached(flags) => {
                reply.created(&ttl, &attr, Generation(0), FileHandle(o.fh), flags)
            }
        }
    }

    /// Node ids of passthrough handles open for writing.
    pub fn passthrough_writers(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.state.lock().pt_writers.values().copied().collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    pub fn release(&self, _ov: &Overlay, id: u64, fh: u64) {
        let mut st = self.state.lock();
        st.pt_writers.remove(&fh);
        if st.held.remove(&fh).is_some() {
            if st.backing.get(&id).is_some_and(|w| w.strong_count() == 0) {
                st.backing.remove(&id);
            }
            return;
        }
        if let Some(id) = st.cached_handles.remove(&fh) {
            if let Some(n) = st.cached.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    st.cached.remove(&id);
                }
            }
        }
    }
}
