//! The adapter's side of the journal: after each mutating request it
//! takes what the core noted (copy-ups, policy denials), adds what only
//! the request knows (op, path, result, and the caller: the pid, uid and
//! gid of the request header, and the command name the process gave
//! itself) and hands events to the sink. Writes are coalesced per open
//! file: one event at close, and at fsync at most once per
//! `FSYNC_ROW_EVERY`, with the bytes the daemon wrote (passthrough writes
//! bypass the daemon: their event has no byte count and is recorded when
//! the file changed). Counters for `status` are kept whether or not a
//! journal is on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use crate::layer::sys;
use crate::overlay::events::{self, EvOp, Event, Note, Sink};
use crate::overlay::{Ctx, Overlay};

/// How long a pid's command name is trusted (pids are reused).
const COMM_TTL: Duration = Duration::from_secs(2);
/// At most one write event per open file in this time at fsync: a
/// database commits (writes and fsyncs) hundreds of times a second, and
/// a row per commit would make the journal write as often as the
/// program. Writes an fsync leaves unrecorded are recorded by the next
/// fsync after this time, or at close.
const FSYNC_ROW_EVERY: Duration = Duration::from_secs(1);
const SHARDS: usize = 16;

/// An open file whose writes are recorded at fsync and close.
struct Track {
    /// Node id of the file.
    ino: u64,
    /// The opener.
    who: Caller,
    passthrough: bool,
    /// (mtime s, mtime ns, size) last seen, for passthrough handles.
    seen: Option<(i64, i64, u64)>,
    /// When an fsync last looked for writes to record (`fsynced`).
    fsynced: Option<Instant>,
}

/// Seconds of request counts kept for the rate.
const RATE_SLOTS: usize = 16;

/// Requests per second of uptime, in a ring of per-second counters the
/// request path fills: `status`'s requests per second with no sampling
/// thread, so an idle daemon is never woken for it. A count that lands
/// exactly as its slot turns over to a new second may be lost (the rate is
/// a display, not an account; `requests` is exact).
pub struct RateRing {
    start: Instant,
    /// The second (of uptime, from 1) each slot counts; 0 = unused.
    secs: [AtomicU64; RATE_SLOTS],
    counts: [AtomicU64; RATE_SLOTS],
}

impl Default for RateRing {
    fn default() -> RateRing {
        RateRing {
            start: Instant::now(),
            secs: Default::default(),
            counts: Default::default(),
        }
    }
}

impl RateRing {
    fn tick(&self) {
        let sec = self.start.elapsed().as_secs() + 1;
        let i = sec as usize % RATE_SLOTS;
        if self.secs[i].load(Ordering::Relaxed) != sec
            && self.secs[i].swap(sec, Ordering::Relaxed) != sec
        {
            self.counts[i].store(0, Ordering::Relaxed);
        }
        self.counts[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests per second over the last `window` seconds (at most
    /// `RATE_SLOTS - 1`; less right after the mount).
    pub fn per_second(&self, window: u64) -> f64 {
        let window = window.clamp(1, RATE_SLOTS as u64 - 1);
        let up = self.start.elapsed();
        let now = up.as_secs() + 1;
        let sum: u64 = (0..RATE_SLOTS)
            .filter(|&i| {
                let s = self.secs[i].load(Ordering::Relaxed);
                s != 0 && s + window > now && s <= now
            })
            .map(|i| self.counts[i].load(Ordering::Relaxed))
            .sum();
        // The current second is partly over: the span is the complete
        // seconds in the window plus that part.
        let span = (up.as_secs_f64()).min((window - 1) as f64 + up.subsec_nanos() as f64 / 1e9);
        if span <= 0.0 {
            0.0
        } else {
            sum as f64 / span
        }
    }
}

/// The FUSE operations layerfs serves, by the name of their `Filesystem`
/// method, the most frequent first: `OpCounts::count` finds an operation
/// by scanning this list.
pub const OPS: [&str; 38] = [
    "lookup",
    "getattr",
    "getxattr",
    "open",
    "release",
    "read",
    "write",
    "setattr",
    "forget",
    "create",
    "readdirplus",
    "readdir",
    "unlink",
    "rename",
    "flush",
    "fsync",
    "mkdir",
    "rmdir",
    "link",
    "symlink",
    "readlink",
    "mknod",
    "opendir",
    "releasedir",
    "fsyncdir",
    "statfs",
    "setxattr",
    "listxattr",
    "removexattr",
    "access",
    "getlk",
    "setlk",
    "bmap",
    "ioctl",
    "poll",
    "fallocate",
    "lseek",
    "copy_file_range",
];

/// Requests received, per operation, since the mount: what `status
/// --json` reports as `counters.by_op` and what `scripts/bench` uses to
/// count the round trips each workload costs.
pub struct OpCounts([AtomicU64; OPS.len()]);

impl Default for OpCounts {
    fn default() -> Self {
        OpCounts(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl OpCounts {
    fn count(&self, op: &str) {
        match OPS.iter().position(|o| *o == op) {
            Some(i) => self.0[i].fetch_add(1, Ordering::Relaxed),
            None => {
                debug_assert!(false, "operation {op} missing from OPS");
                0
            }
        };
    }

    /// The operations seen so far with their counts.
    pub fn seen(&self) -> Vec<(&'static str, u64)> {
        OPS.iter()
            .zip(&self.0)
            .map(|(op, n)| (*op, n.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

/// Who made a request, as a journal row names them.
#[derive(Clone)]
struct Caller {
    pid: u32,
    uid: u32,
    gid: u32,
    comm: Arc<str>,
}

#[derive(Default)]
pub struct Recorder {
    sink: OnceLock<Arc<dyn Sink>>,
    comms: Mutex<HashMap<u32, (Arc<str>, Instant)>>,
    tracks: [Mutex<HashMap<u64, Track>>; SHARDS],
    pub rate: RateRing,
    pub requests: AtomicU64,
    pub by_op: OpCounts,
    pub copy_ups: AtomicU64,
    pub denials: AtomicU64,
}

fn seen(fd: &impl std::os::fd::AsFd) -> Option<(i64, i64, u64)> {
    sys::fstat(fd)
        .ok()
        .map(|st| (st.st_mtime, st.st_mtime_nsec, st.st_size as u64))
}

impl Recorder {
    pub fn set_sink(&self, sink: Arc<dyn Sink>) {
        let _ = self.sink.set(sink);
    }

    /// Whether events are recorded (paths are computed only then).
    pub fn on(&self) -> bool {
        self.sink.get().is_some()
    }

    /// Counts one request of operation `op` (for `status`'s counters and
    /// requests per second). Every request passes here once, before its
    /// handler runs (`contain::Admit::seen`).
    pub fn tick(&self, op: &str) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.by_op.count(op);
        self.rate.tick();
    }

    /// The command name of `pid`, cached briefly.
    fn comm(&self, pid: u32) -> Arc<str> {
        if pid == 0 {
            return Arc::from("-");
        }
        let now = Instant::now();
        if let Some((c, t)) = self.comms.lock().get(&pid) {
            if now.duration_since(*t) < COMM_TTL {
                return c.clone();
            }
        }
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| s.trim_end().to_string())
            .unwrap_or_else(|_| "?".into());
        let name: Arc<str> = Arc::from(name);
        let mut comms = self.comms.lock();
        if comms.len() > 4096 {
            comms.retain(|_, (_, t)| now.duration_since(*t) < COMM_TTL);
        }
        comms.insert(pid, (name.clone(), now));
        name
    }

    /// The caller of request `c`, its command name looked up.
    fn caller(&self, c: &Ctx) -> Caller {
        Caller {
            pid: c.pid,
            uid: c.uid,
            gid: c.gid,
            comm: self.comm(c.pid),
        }
    }

    fn emit(&self, ev: Event) {
        if let Some(s) = self.sink.get() {
            s.record(ev);
        }
    }

    /// Ends a mutating request: records what the core noted (copy-ups
    /// first), then one event per `(op, bytes)` for the request itself,
    /// carrying the rule of a policy denial. `path` is `None` when the
    /// journal is off (only the counters move then).
    pub fn done(
        &self,
        c: &Ctx,
        rows: &[(EvOp, Option<u64>)],
        path: Option<String>,
        to: Option<String>,
        errno: i32,
    ) {
        let notes = events::take_notes();
        let mut rule = None;
        let who = path.as_ref().map(|_| self.caller(c));
        let now = SystemTime::now();
        for n in notes {
            match n {
                Note::CopyUp { path: p } => {
                    self.copy_ups.fetch_add(1, Ordering::Relaxed);
                    if let Some(who) = &who {
                        self.emit(Event {
                            time: now,
                            op: EvOp::CopyUp,
                            path: p,
                            to: None,
                            errno: 0,
                            bytes: None,
                            pid: who.pid,
                            uid: who.uid,
                            gid: who.gid,
                            comm: who.comm.clone(),
                            rule: None,
                        });
                    }
                }
                Note::Denied { rule: r, .. } => {
                    self.denials.fetch_add(1, Ordering::Relaxed);
                    rule = Some(r);
                }
            }
        }
        let (Some(path), Some(who)) = (path, who) else {
            return;
        };
        for (op, bytes) in rows {
            self.emit(Event {
                time: now,
                op: *op,
                path: path.clone(),
                to: to.clone(),
                errno,
                bytes: *bytes,
                pid: who.pid,
                uid: who.uid,
                gid: who.gid,
                comm: who.comm.clone(),
                rule: rule.clone(),
            });
        }
    }

    /// A file was opened for writing: its writes are recorded later.
    pub fn opened(&self, ov: &Overlay, fh: u64, c: &Ctx, passthrough: bool) {
        if !self.on() {
            return;
        }
        let seen = if passthrough {
            ov.files().target(fh).and_then(|(_, fd)| seen(fd.as_ref()))
        } else {
            None
        };
        let ino = ov.files().target(fh).map_or(0, |(i, _)| i.id);
        let t = Track {
            ino,
            who: self.caller(c),
            passthrough,
            seen,
            fsynced: None,
        };
        self.tracks[fh as usize % SHARDS].lock().insert(fh, t);
    }

    /// Passthrough handles open on node `ino`.
    fn passthrough_handles(&self, ino: u64) -> Vec<u64> {
        let mut out = Vec::new();
        for shard in &self.tracks {
            let shard = shard.lock();
            out.extend(
                shard
                    .iter()
                    .filter(|(_, t)| t.passthrough && t.ino == ino)
                    .map(|(fh, _)| *fh),
            );
        }
        out
    }

    /// Around a setattr of node `ino`: passthrough writes are noticed by
    /// the file's mtime and size changing, which a truncate or utimes
    /// changes too. Before it, writes made so far are recorded; after it
    /// (`after`), the new mtime and size become the baseline.
    pub fn around_setattr(&self, ov: &Overlay, ino: u64, after: bool) {
        if !self.on() {
            return;
        }
        for fh in self.passthrough_handles(ino) {
            if after {
                let now = ov.files().target(fh).and_then(|(_, fd)| seen(fd.as_ref()));
                if let Some(t) = self.tracks[fh as usize % SHARDS].lock().get_mut(&fh) {
                    t.seen = now;
                }
            } else {
                self.writes(ov, fh, None, false);
            }
        }
    }

    /// An fsync of `fh` by `by`: records its writes since the last
    /// record, unless an fsync of it did so less than `FSYNC_ROW_EVERY`
    /// ago (they are then recorded by a later fsync or at close).
    pub fn fsynced(&self, ov: &Overlay, fh: u64, by: &Ctx) {
        if !self.on() {
            return;
        }
        let now = Instant::now();
        {
            let mut shard = self.tracks[fh as usize % SHARDS].lock();
            let Some(t) = shard.get_mut(&fh) else { return };
            if t.fsynced
                .is_some_and(|at| now.duration_since(at) < FSYNC_ROW_EVERY)
            {
                return;
            }
            t.fsynced = Some(now);
        }
        self.writes(ov, fh, Some(by), false);
    }

    /// Records the writes made through `fh` since the last record (at
    /// fsync, and at close with `closing`), attributed to `by` (the
    /// fsync's or release's caller) when the kernel names a process
    /// other than the opener, else to the opener. Call before the core
    /// releases the handle.
    pub fn writes(&self, ov: &Overlay, fh: u64, by: Option<&Ctx>, closing: bool) {
        if !self.on() {
            return;
        }
        let mut shard = self.tracks[fh as usize % SHARDS].lock();
        let track = if closing {
            shard.remove(&fh)
        } else {
            shard.get_mut(&fh).map(|t| Track {
                ino: t.ino,
                who: t.who.clone(),
                passthrough: t.passthrough,
                seen: t.seen,
                fsynced: t.fsynced,
            })
        };
        drop(shard);
        let Some(t) = track else { return };
        let Some((inode, fd)) = ov.files().target(fh) else {
            return;
        };
        let bytes = if t.passthrough {
            let now = seen(fd.as_ref());
            if now == t.seen {
                return;
            }
            if !closing {
                if let Some(t) = self.tracks[fh as usize % SHARDS].lock().get_mut(&fh) {
                    t.seen = now;
                }
            }
            None
        } else {
            match ov.files().take_written(fh) {
                0 => return,
                n => Some(n),
            }
        };
        // The closing process when the kernel says who it is, else the
        // opener (the pid, ids and name always of one and the same caller).
        let who = match by {
            Some(c) if c.pid != 0 && c.pid != t.who.pid => self.caller(c),
            _ => t.who,
        };
        self.emit(Event {
            time: SystemTime::now(),
            op: EvOp::Write,
            path: ov.path_of(&inode),
            to: None,
            errno: 0,
            bytes,
            pid: who.pid,
            uid: who.uid,
            gid: who.gid,
            comm: who.comm,
            rule: None,
        });
    }
}

#[cfg(test)]
mod rate_tests {
    use super::*;

    #[test]
    fn rate_counts_the_recent_seconds_only() {
        let r = RateRing::default();
        assert_eq!(r.per_second(10), 0.0);
        for _ in 0..500 {
            r.tick();
        }
        std::thread::sleep(Duration::from_millis(300));
        let rate = r.per_second(10);
        // 500 requests in the first ~0.3 s of uptime.
        assert!(rate > 500.0 && rate < 2000.0, "{rate}");
        // Requests older than the window do not count.
        std::thread::sleep(Duration::from_millis(2100));
        assert_eq!(r.per_second(1), 0.0);
        assert!(r.per_second(10) > 100.0);
    }
}
