//! Watching lower directories for changes made from outside the mount (an
//! administrator updating the shared tree).
//!
//! The kernel caches names, attributes and directory listings for as long
//! as the daemon allows. For objects that live only in the upper that can
//! be long: only this daemon changes them. Lower directories can change
//! behind the daemon's back, so without a watch their entries are trusted
//! only for the short `--lower-timeout`. With an inotify watch on every
//! lower directory merged into a directory, each change there is reported
//! to the daemon, which invalidates what the kernel holds (see
//! `fuse::watcher`), and the long timeout is safe for that directory.
//!
//! Invariant: `Inode::watched` is true only while every lower directory of
//! that merged directory has a live watch registered for its id here; the
//! short timeout applies to entries under any other directory.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::layer::real::RealFd;
use crate::layer::sys;

/// Events that change what a lookup, stat, readdir or read would return.
const MASK: u32 = libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_MODIFY
    | libc::IN_ATTRIB
    | libc::IN_CLOSE_WRITE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR;

/// One lower directory under watch.
struct Watched {
    /// The lower directory itself, to find which child an event names.
    dir: Arc<RealFd>,
    /// The merged directories (node ids) it is part of.
    merged: HashSet<u64>,
}

#[derive(Default)]
struct State {
    by_wd: HashMap<i32, Watched>,
    by_dir: HashMap<u64, Vec<i32>>,
}

pub struct LowerWatch {
    fd: OwnedFd,
    state: Mutex<State>,
    /// Someone consumes the events (the FUSE watcher thread runs); until
    /// then no directory counts as watched.
    live: AtomicBool,
}

/// A change reported by the kernel, resolved to merged directories.
#[derive(Debug)]
pub enum Change {
    /// `name` in each of `dirs` appeared, went, or changed; `lower` is the
    /// lower directory it lives in (to find the object it names).
    Entry {
        dirs: Vec<u64>,
        name: OsString,
        lower: Option<Arc<OwnedFd>>,
    },
    /// The lower directory itself changed, was removed or moved.
    Dir { dirs: Vec<u64>, gone: bool },
    /// Events were dropped (queue overflow): anything may have changed.
    Overflow,
}

impl LowerWatch {
    /// A new inotify instance, or `None` where inotify is unavailable (the
    /// short timeout then applies everywhere).
    pub fn new() -> Option<LowerWatch> {
        // For tests of the fallback, and for hosts where inotify watches
        // are scarce.
        if std::env::var_os("LAYERFS_NO_LOWER_WATCH").is_some() {
            return None;
        }
        // SAFETY: inotify_init1 takes only flags; a non-negative result is
        // a new fd that nothing else owns.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        if fd < 0 {
            tracing::warn!(
                "inotify unavailable ({}): lower changes show after --lower-timeout",
                io::Error::last_os_error()
            );
            return None;
        }
        Some(LowerWatch {
            // SAFETY: fd was just returned by inotify_init1 and is owned here only.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            state: Mutex::new(State::default()),
            live: AtomicBool::new(false),
        })
    }

    /// The inotify fd, for a poll that waits for changes to read.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }

    /// Whether events are being consumed (the service thread reads them).
    pub fn set_live(&self, live: bool) {
        self.live.store(live, Ordering::Release);
    }

    pub fn live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Watches the lower directories of merged directory `dir`, replacing
    /// what was registered for it. True when every one is watched.
    pub fn watch(&self, dir: u64, lowers: &[Arc<RealFd>]) -> bool {
        let mut st = self.state.lock();
        Self::drop_dir(&self.fd, &mut st, dir);
        let mut wds = Vec::with_capacity(lowers.len());
        let mut all = true;
        for l in lowers {
            let Ok(fd) = l.get() else {
                all = false;
                continue;
            };
            let path = sys::proc_path(fd.as_ref());
            // SAFETY: path is a valid NUL-terminated string; the call only
            // reads it.
            let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), path.as_ptr(), MASK) };
            if wd < 0 {
                let e = io::Error::last_os_error();
                tracing::debug!(dir, "inotify_add_watch: {e}");
                all = false;
                continue;
            }
            st.by_wd
                .entry(wd)
                .or_insert_with(|| Watched {
                    dir: l.clone(),
                    merged: HashSet::new(),
                })
                .merged
                .insert(dir);
            wds.push(wd);
        }
        st.by_dir.insert(dir, wds);
        all
    }

    /// The kernel forgot merged directory `dir`: its watches go when no
    /// other merged directory needs them.
    pub fn unwatch(&self, dir: u64) {
        let mut st = self.state.lock();
        Self::drop_dir(&self.fd, &mut st, dir);
    }

    fn drop_dir(fd: &OwnedFd, st: &mut State, dir: u64) {
        for wd in st.by_dir.remove(&dir).unwrap_or_default() {
            if let Some(w) = st.by_wd.get_mut(&wd) {
                w.merged.remove(&dir);
                if w.merged.is_empty() {
                    st.by_wd.remove(&wd);
                    // SAFETY: plain integers; a stale wd only yields EINVAL.
                    unsafe { libc::inotify_rm_watch(fd.as_raw_fd(), wd) };
                }
            }
        }
    }

    /// Blocks until the kernel reports changes, and returns them.
    pub fn next_changes(&self) -> io::Result<Vec<Change>> {
        let mut buf = vec![0u8; 64 * 1024];
        let n = loop {
            // SAFETY: buf is writable for its whole length.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                )
            };
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        };
        let mut out = Vec::new();
        let head = std::mem::size_of::<libc::inotify_event>();
        let mut off = 0;
        let mut st = self.state.lock();
        while off + head <= n {
            // SAFETY: the kernel wrote a whole inotify_event header at off
            // (checked against n); read_unaligned copes with the byte buffer.
            let ev: libc::inotify_event =
                unsafe { std::ptr::read_unaligned(buf[off..].as_ptr() as *const _) };
            let name_bytes = &buf[off + head..(off + head + ev.len as usize).min(n)];
            off += head + ev.len as usize;
            if ev.mask & libc::IN_Q_OVERFLOW != 0 {
                out.push(Change::Overflow);
                continue;
            }
            if ev.mask & libc::IN_IGNORED != 0 {
                // The watch is gone (its directory was removed): the merged
                // directories that relied on it are no longer watched.
                if let Some(w) = st.by_wd.remove(&ev.wd) {
                    let dirs: Vec<u64> = w.merged.into_iter().collect();
                    for d in &dirs {
                        if let Some(v) = st.by_dir.get_mut(d) {
                            v.retain(|x| *x != ev.wd);
                        }
                    }
                    out.push(Change::Dir { dirs, gone: true });
                }
                continue;
            }
            let Some(w) = st.by_wd.get(&ev.wd) else {
                continue;
            };
            let dirs: Vec<u64> = w.merged.iter().copied().collect();
            let end = name_bytes
                .iter()
                .position(|b| *b == 0)
                .unwrap_or(name_bytes.len());
            if end == 0 {
                let gone = ev.mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0;
                out.push(Change::Dir { dirs, gone });
            } else {
                out.push(Change::Entry {
                    dirs,
                    name: OsStr::from_bytes(&name_bytes[..end]).to_os_string(),
                    lower: w.dir.get().ok(),
                });
            }
        }
        Ok(out)
    }
}
