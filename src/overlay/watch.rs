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
//!
//! Watches are bounded per mount (`cap`, `--max-watches`). The kernel
//! counts them against the daemon's uid for the whole host
//! (`fs.inotify.max_user_watches`): unbounded, a user walking a large
//! lower through an `--allow-other` mount would leave every other process
//! of that uid (other workspaces' daemons, systemd path units) failing
//! with ENOSPC. A directory a new watch would take beyond the cap is left
//! unwatched: it falls back to `--lower-timeout`, exactly as a network
//! lower or an unwatchable directory does, and is tried again at its next
//! lookup. A directory the kernel forgets gives its watches back
//! (`Overlay::forget` → `unwatch`).

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
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

/// Which inode registered a merged directory's watches: the address of
/// its `Inode`, unique among live inodes. A node id can be forgotten and
/// looked up again at once (a new inode, same id); the forget's `unwatch`
/// must leave the new inode's watches alone.
pub type Owner = usize;

/// The watches registered for one merged directory.
struct Registered {
    owner: Owner,
    wds: Vec<i32>,
    /// Left unwatched because the cap was reached.
    over_cap: bool,
}

#[derive(Default)]
struct State {
    /// Invariant: at most `cap` entries, so the kernel holds at most
    /// `cap` watches for this instance (one per entry; a wd the kernel
    /// gives again for a directory already watched adds none). Checked
    /// before every `inotify_add_watch`, under this state's lock.
    by_wd: HashMap<i32, Watched>,
    by_dir: HashMap<u64, Registered>,
}

/// The default watch cap: a sixteenth of the host's per-user limit
/// (`fs.inotify.max_user_watches`, shared by every process of the
/// daemon's uid), at most 65,536 (about 64 MiB of kernel memory with the
/// inodes a watch pins); 512 where the limit cannot be read (a sixteenth
/// of the kernel's smallest default, 8192). Sixteen mounts at their caps
/// together take the host's limit: a host serving more shared mounts
/// sets `--max-watches` lower, or raises the limit.
pub fn default_cap() -> usize {
    std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .map_or(512, |n| (n / 16).min(65_536))
}

/// How the watch is doing, for `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Watches held now.
    pub used: usize,
    pub cap: usize,
    /// Merged directories the kernel holds that are unwatched because
    /// the cap was reached.
    pub dirs_over_cap: usize,
}

pub struct LowerWatch {
    fd: OwnedFd,
    /// The most watches this instance holds (`--max-watches`).
    cap: usize,
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
    /// A new inotify instance holding at most `cap` watches, or `None`
    /// where inotify is unavailable (the short timeout then applies
    /// everywhere).
    pub fn new(cap: usize) -> Option<LowerWatch> {
        // For tests of the fallback, and for hosts where inotify watches
        // are scarce.
        if std::env::var_os("LAYERFS_NO_LOWER_WATCH").is_some() {
            return None;
        }
        let fd = match crate::sys::inotify_init() {
            Ok(fd) => fd,
            Err(e) => {
                tracing::warn!(
                    "inotify unavailable ({e}): lower changes show after --lower-timeout"
                );
                return None;
            }
        };
        Some(LowerWatch {
            fd,
            cap,
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

    /// How many watches are held, the cap, and the directories left
    /// unwatched for it.
    pub fn usage(&self) -> Usage {
        let st = self.state.lock();
        Usage {
            used: st.by_wd.len(),
            cap: self.cap,
            dirs_over_cap: st.by_dir.values().filter(|r| r.over_cap).count(),
        }
    }

    /// Watches the lower directories of merged directory `dir` (its inode
    /// `owner`), replacing what was registered for it. True when every
    /// one is watched. When a watch would pass the cap, the directory
    /// keeps none (partial watches would not make it trusted) and is
    /// counted as over the cap.
    pub fn watch(&self, dir: u64, owner: Owner, lowers: &[Arc<RealFd>]) -> bool {
        let mut st = self.state.lock();
        Self::drop_dir(&self.fd, &mut st, dir);
        let mut wds = Vec::with_capacity(lowers.len());
        let mut all = true;
        let mut over_cap = false;
        for l in lowers {
            if st.by_wd.len() >= self.cap {
                over_cap = true;
                break;
            }
            let Ok(fd) = l.get() else {
                all = false;
                continue;
            };
            let path = sys::proc_path(fd.as_ref());
            let wd = match crate::sys::inotify_add_watch(self.fd.as_fd(), &path, MASK) {
                Ok(wd) => wd,
                Err(e) => {
                    tracing::debug!(dir, "inotify_add_watch: {e}");
                    all = false;
                    continue;
                }
            };
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
        if over_cap {
            // Give back what this directory took: alone they are useless.
            Self::release(&self.fd, &mut st, dir, std::mem::take(&mut wds));
            tracing::debug!(dir, cap = self.cap, "watch cap reached: not watched");
        }
        st.by_dir.insert(
            dir,
            Registered {
                owner,
                wds,
                over_cap,
            },
        );
        all && !over_cap
    }

    /// The kernel forgot merged directory `dir` (inode `owner`): its
    /// watches go when no other merged directory needs them. Nothing
    /// happens if another inode registered `dir` since.
    pub fn unwatch(&self, dir: u64, owner: Owner) {
        let mut st = self.state.lock();
        if st.by_dir.get(&dir).is_some_and(|r| r.owner == owner) {
            Self::drop_dir(&self.fd, &mut st, dir);
        }
    }

    fn drop_dir(fd: &OwnedFd, st: &mut State, dir: u64) {
        let wds = st.by_dir.remove(&dir).map(|r| r.wds).unwrap_or_default();
        Self::release(fd, st, dir, wds);
    }

    /// Merged directory `dir` no longer needs watches `wds`: each goes
    /// when no other merged directory needs it.
    fn release(fd: &OwnedFd, st: &mut State, dir: u64, wds: Vec<i32>) {
        for wd in wds {
            if let Some(w) = st.by_wd.get_mut(&wd) {
                w.merged.remove(&dir);
                if w.merged.is_empty() {
                    st.by_wd.remove(&wd);
                    crate::sys::inotify_rm_watch(fd.as_fd(), wd);
                }
            }
        }
    }

    /// Blocks until the kernel reports changes, and returns them.
    pub fn next_changes(&self) -> io::Result<Vec<Change>> {
        let events = crate::sys::inotify_read(self.fd.as_fd())?;
        let mut out = Vec::new();
        let mut st = self.state.lock();
        for ev in events {
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
                        if let Some(r) = st.by_dir.get_mut(d) {
                            r.wds.retain(|x| *x != ev.wd);
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
            if ev.name.is_empty() {
                let gone = ev.mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0;
                out.push(Change::Dir { dirs, gone });
            } else {
                out.push(Change::Entry {
                    dirs,
                    name: OsString::from_vec(ev.name),
                    lower: w.dir.get().ok(),
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::Layer;

    #[test]
    fn watches_stay_within_the_cap_and_a_forget_gives_them_back() {
        let dir = tempfile::tempdir().unwrap();
        let layer = Layer::open(dir.path(), "lower dir").unwrap();
        let lowers: Vec<Arc<RealFd>> = (0..4)
            .map(|i| {
                let p = dir.path().join(format!("d{i}"));
                std::fs::create_dir(&p).unwrap();
                RealFd::new(sys::open_root(&p).unwrap(), &layer.mount)
            })
            .collect();
        let w = LowerWatch::new(2).unwrap();
        assert!(w.watch(10, 100, &lowers[0..1]));
        assert!(w.watch(11, 101, &lowers[1..2]));
        // A third watch would pass the cap: the directory keeps none.
        assert!(!w.watch(12, 102, &lowers[2..3]));
        // Two lowers, room for none: neither is kept.
        assert!(!w.watch(13, 103, &lowers[2..4]));
        let u = w.usage();
        assert_eq!((u.used, u.cap, u.dirs_over_cap), (2, 2, 2), "{u:?}");
        // At the cap even a lower directory watched for another merged
        // directory is refused (knowing would take an add first).
        assert!(!w.watch(14, 104, &lowers[0..1]));
        assert_eq!(w.usage().used, 2);
        w.unwatch(14, 104);
        // A forget by an inode that no longer owns the id changes nothing.
        w.unwatch(11, 999);
        assert_eq!(w.usage().used, 2);
        w.unwatch(11, 101);
        assert_eq!(w.usage().used, 1);
        // Below the cap, a lower directory already watched costs nothing.
        assert!(w.watch(14, 104, &lowers[0..1]));
        assert_eq!(w.usage().used, 1);
        // The room is taken again at the next lookup of a refused one.
        assert!(w.watch(12, 102, &lowers[2..3]));
        let u = w.usage();
        assert_eq!((u.used, u.dirs_over_cap), (2, 1), "{u:?}");
        // The shared watch stays while one of its directories needs it.
        w.unwatch(10, 100);
        assert_eq!(w.usage().used, 2);
        w.unwatch(13, 103);
        assert_eq!(w.usage().dirs_over_cap, 0);
        // Cap 0 watches nothing, but a directory with no lowers is fine.
        let none = LowerWatch::new(0).unwrap();
        assert!(!none.watch(10, 100, &lowers[0..1]));
        assert!(none.watch(11, 101, &[]));
        assert_eq!(none.usage().used, 0);
    }
}
