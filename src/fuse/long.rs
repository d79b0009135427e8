//! The copy pool: long data work runs here, on a few threads of its own,
//! not on the FUSE request threads. An open that copies up a large lower
//! file (`Overlay::open_copies_long`) and a large `copy_file_range` are
//! handed over with their reply object (fuser's replies are `Send`); the
//! request thread returns at once and serves the next request, so a
//! `stat` or a small read elsewhere in the mount never queues behind
//! someone's gigabyte.
//!
//! Rules (each relied on by the code below):
//! - Bounded: at most `threads` pool threads, started as work arrives,
//!   each at a lower CPU and I/O priority than the request threads.
//! - Fair: queued jobs are taken per uid, round robin, and one uid runs at
//!   most `threads - 1` jobs at once (at least one): another user's copies
//!   always find a thread, however many copies one user starts.
//! - Nothing is lost: a job that cannot get a thread of its own (thread
//!   creation failed and none runs) runs on the caller's thread instead;
//!   a job that panics is logged and its reply, dropped unsent, answers
//!   `EIO`, as on a request thread (`contain`).
//!
//! A long copy-up is watched by `Watch` between chunks (see
//! `overlay::copy_up::Halt`): it stops when its caller has been killed
//! (nothing half-done becomes visible), and when a pause of writes waits
//! for it, in which case the job waits for the pause to end and starts the
//! copy again, so a snapshot never waits for someone's copy and the copy
//! is not lost.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::overlay::copy_up::Halt;
use crate::overlay::gate::WriteGate;

type Job = Box<dyn FnOnce() + Send>;

pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    work: Condvar,
    threads: usize,
    /// The most jobs one uid runs at once.
    per_uid: usize,
}

#[derive(Default)]
struct State {
    queued: HashMap<u32, VecDeque<Job>>,
    /// Uids with queued jobs, in the order they get their next turn.
    turn: VecDeque<u32>,
    running: HashMap<u32, usize>,
    spawned: usize,
    idle: usize,
    closed: bool,
}

impl State {
    /// The next job by the rules above: the first uid in turn order that
    /// is under its share of threads; it goes to the back of the turn.
    fn next(&mut self, per_uid: usize) -> Option<(u32, Job)> {
        let at = self
            .turn
            .iter()
            .position(|u| self.running.get(u).copied().unwrap_or(0) < per_uid)?;
        let uid = self.turn.remove(at)?;
        let queue = self.queued.get_mut(&uid)?;
        let job = queue.pop_front()?;
        if queue.is_empty() {
            self.queued.remove(&uid);
        } else {
            self.turn.push_back(uid);
        }
        *self.running.entry(uid).or_default() += 1;
        Some((uid, job))
    }

    fn finished(&mut self, uid: u32) {
        if let Some(n) = self.running.get_mut(&uid) {
            *n -= 1;
            if *n == 0 {
                self.running.remove(&uid);
            }
        }
    }
}

impl Pool {
    /// A pool of at most `threads` threads (at least 2, so that one uid's
    /// share, `threads - 1`, leaves another uid a thread).
    pub fn new(threads: usize) -> Pool {
        let threads = threads.max(2);
        Pool {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                work: Condvar::new(),
                threads,
                per_uid: threads - 1,
            }),
        }
    }

    /// Runs `job` on a pool thread, for `uid`, in its turn.
    pub fn submit(&self, uid: u32, job: impl FnOnce() + Send + 'static) {
        let mut st = self.inner.state.lock();
        st.queued.entry(uid).or_default().push_back(Box::new(job));
        if !st.turn.contains(&uid) {
            st.turn.push_back(uid);
        }
        if st.idle == 0 && st.spawned < self.inner.threads {
            let inner = self.inner.clone();
            let spawned = std::thread::Builder::new()
                .name("long-copy".into())
                .spawn(move || serve(inner));
            match spawned {
                Ok(_) => st.spawned += 1,
                Err(e) if st.spawned == 0 => {
                    tracing::warn!(
                        "cannot start a copy thread: {e}; copying on the request thread"
                    );
                    let mine = st.queued.remove(&uid).unwrap_or_default();
                    st.turn.retain(|u| *u != uid);
                    drop(st);
                    mine.into_iter().for_each(run);
                    return;
                }
                Err(e) => tracing::warn!("cannot start another copy thread: {e}"),
            }
        }
        self.inner.work.notify_all();
    }
}

impl Drop for Pool {
    /// The threads end once the jobs queued are done.
    fn drop(&mut self) {
        self.inner.state.lock().closed = true;
        self.inner.work.notify_all();
    }
}

fn serve(inner: Arc<Inner>) {
    // Copies yield the CPU and the disk to the request threads.
    if let Err(e) = crate::layer::sys::background_thread() {
        tracing::debug!("copy thread keeps its priority: {e}");
    }
    let mut st = inner.state.lock();
    loop {
        if let Some((uid, job)) = st.next(inner.per_uid) {
            MutexGuard::unlocked(&mut st, || run(job));
            st.finished(uid);
            // A job of this uid waiting for its share may go now.
            inner.work.notify_all();
            continue;
        }
        if st.closed && st.queued.is_empty() {
            return;
        }
        st.idle += 1;
        inner.work.wait(&mut st);
        st.idle -= 1;
    }
}

fn run(job: Job) {
    if catch_unwind(AssertUnwindSafe(job)).is_err() {
        tracing::error!("a long copy panicked; its request got EIO, the mount keeps serving");
    }
}

/// Why a watched copy stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// The calling process was killed (or is gone).
    CallerGone,
    /// A pause of writes waits for the copy's pass through the gate.
    PauseWanted,
}

/// The `Halt` of a copy run for a caller: stops it when a pause of writes
/// waits, or when the caller has a fatal signal pending or is gone. (A
/// process killed while the kernel waits for this request stays alive,
/// in uninterruptible sleep, until the request is answered: its pending
/// `SIGKILL` is what shows it is dying.)
pub struct Watch<'a> {
    pid: u32,
    gate: &'a WriteGate,
    why: AtomicU8,
}

impl<'a> Watch<'a> {
    pub fn new(pid: u32, gate: &'a WriteGate) -> Watch<'a> {
        Watch {
            pid,
            gate,
            why: AtomicU8::new(0),
        }
    }

    /// Why the copy was stopped, if it was.
    pub fn stopped(&self) -> Option<Stopped> {
        match self.why.load(Ordering::Relaxed) {
            1 => Some(Stopped::CallerGone),
            2 => Some(Stopped::PauseWanted),
            _ => None,
        }
    }
}

impl Halt for Watch<'_> {
    fn halt(&self) -> bool {
        let why = if self.gate.paused() {
            2
        } else if caller_gone(self.pid) {
            1
        } else {
            return false;
        };
        self.why.store(why, Ordering::Relaxed);
        true
    }
}

/// Whether thread `pid` (as FUSE names a caller) no longer exists or has a
/// fatal signal pending. Pid 0 (a caller outside the daemon's pid
/// namespace) is never taken for gone.
fn caller_gone(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    let status = match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(s) => s,
        Err(e) => return e.kind() == std::io::ErrorKind::NotFound,
    };
    let kill = 1u64 << (libc::SIGKILL - 1);
    status.lines().any(|l| {
        let pending = l
            .strip_prefix("SigPnd:")
            .or_else(|| l.strip_prefix("ShdPnd:"));
        pending
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|bits| bits & kill != 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// One uid's jobs never take every thread: with its share busy, the
    /// other uid's job runs.
    #[test]
    fn one_uid_leaves_a_thread_to_another() {
        let pool = Pool::new(3);
        let (release, held) = mpsc::channel::<()>();
        let held = Arc::new(Mutex::new(held));
        let (started, starts) = mpsc::channel::<u32>();
        for _ in 0..4 {
            let (held, started) = (held.clone(), started.clone());
            pool.submit(7, move || {
                started.send(7).unwrap();
                let _ = held.lock().recv();
            });
        }
        assert_eq!(starts.recv().unwrap(), 7);
        assert_eq!(starts.recv().unwrap(), 7);
        let started2 = started.clone();
        pool.submit(8, move || started2.send(8).unwrap());
        assert_eq!(
            starts.recv().unwrap(),
            8,
            "uid 8 ran while uid 7 held its share"
        );
        for _ in 0..4 {
            release.send(()).unwrap();
        }
        assert_eq!(starts.recv().unwrap(), 7, "uid 7's queued jobs still run");
        assert_eq!(starts.recv().unwrap(), 7);
    }

    #[test]
    fn a_live_caller_is_not_gone_and_a_missing_one_is() {
        assert!(!caller_gone(std::process::id()));
        assert!(!caller_gone(0));
        assert!(caller_gone(u32::MAX / 2));
    }
}
