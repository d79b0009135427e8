//! Read ahead across small lower files: while a caller opens the small
//! lower files of a directory one after another (tar c, grep -r, a build
//! reading its sources), the next files of that directory are asked into
//! the lower's page cache, so the disk works ahead of the walk and the
//! page fill at their OPEN (`io_mode::prefill`) finds them there instead
//! of waiting for the disk one file at a time.
//!
//! Rules (each relied on below):
//! - Hints only. What is read ahead is the lower files' own pages, asked
//!   with `POSIX_FADV_WILLNEED`; nothing a program sees through the mount
//!   depends on it (each OPEN still reads the file as it is then). A lower
//!   changed meanwhile costs at most a wasted read.
//! - Triggered by opens: a walk that only stats (find, ls -lR) reads no
//!   file data. The trigger is the first open of a small lower file that
//!   `io_mode` fills (not on a network lower, in a watched directory); its
//!   hint names the file and the lower directory it was found in. A
//!   listing (READDIR, READDIRPLUS from offset 0) starts a read ahead of
//!   the directory's first files only for a caller that filled a file
//!   within `READER_TIME` (`reading`; the caller is the thread id FUSE
//!   gives), never for LOOKUP.
//! - Never blocking a request thread: a hint goes into a bounded queue
//!   and is dropped when the queue is full; an open of a file asked
//!   already sends none while half of what was asked is left after it
//!   (`Mark`), so the thread is not woken once per file. One thread
//!   of its own, started at the first hint, does the listing and the
//!   opens, at the request threads' priorities (the walk waits for what it
//!   reads).
//! - Bounded: per directory a cursor in the lower directory's listing, in
//!   the order `getdents` gives it (the merged listing keeps it, so a walk
//!   through the mount opens that directory's lower files in this order),
//!   read a step at a time (a directory of 100,000 names is never held
//!   whole), with the files asked ahead of the last one opened: at most
//!   `AHEAD_FILES` files and `AHEAD_BYTES` bytes, each at most the fill's
//!   size limit; the window starts at `FIRST_WINDOW` files and grows
//!   fourfold while the opens follow it. At most `CURSORS` directories at once
//!   (least recently used dropped), all dropped after `IDLE` without hints.
//! - A directory whose opens do not follow its listing (the name is not
//!   found within `SCAN_MAX` entries ahead) is left alone until its cursor
//!   is dropped: a program reading files in another order gets no reads
//!   it did not ask for, past the first window.
//! - Stops at unmount: dropping `Prefetch` closes the queue and joins the
//!   thread, which checks between files.

use std::collections::{HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::layer::real::RealFd;
use crate::layer::sys;

/// Hints waiting for the thread; more are dropped.
const QUEUE: usize = 256;
/// How long a caller counts as reading small lower files after its last
/// open of one (`Prefetch::reading`).
const READER_TIME: Duration = Duration::from_secs(1);
/// Callers remembered as reading.
const READERS: usize = 8;
/// Directories with a cursor at once.
const CURSORS: usize = 16;
/// Cursors are dropped (their directory fds closed) after this long
/// without a hint. Short: a walk's opens come milliseconds apart, and a
/// daemon whose callers stopped reading should hold no more descriptors
/// than the inodes the kernel still knows (the stress run checks it a
/// second after its last operation).
const IDLE: Duration = Duration::from_millis(500);
/// Files asked ahead of the last one opened in a directory, at most.
const AHEAD_FILES: usize = 32;
/// Bytes asked ahead of the last one opened in a directory, at most.
const AHEAD_BYTES: u64 = 4 << 20;
/// Files asked ahead at the first open seen in a directory.
const FIRST_WINDOW: usize = 4;
/// Entries of a listing looked through for an opened name before the
/// directory is taken as not read in its listing's order.
const SCAN_MAX: usize = 8192;
/// `getdents64` buffer of the thread.
const STEP_BYTES: usize = 16 << 10;

/// Which lower directory: the merged directory's node id and the lower's
/// index.
type Key = (u64, usize);

/// An open of a small lower file: `name` in the lower directory `dir`,
/// which is lower `layer` of the merged directory `dir_id`; or, with no
/// name, a listing of that directory by a caller reading small files.
pub struct Hint {
    pub dir_id: u64,
    pub layer: usize,
    pub dir: Arc<RealFd>,
    pub name: Option<OsString>,
}

impl Hint {
    fn key(&self) -> Key {
        (self.dir_id, self.layer)
    }
}

/// The read-ahead thread and what it shares with the request threads
/// (started at the first hint).
pub struct Prefetch {
    /// Files larger than this are never read ahead.
    file_max: u64,
    shared: Arc<Shared>,
    thread: OnceLock<Mutex<Option<JoinHandle<()>>>>,
    /// Callers that opened small lower files lately, with when.
    readers: Mutex<VecDeque<(u32, Instant)>>,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    work: Condvar,
    /// What the thread asked per directory, as the request threads see
    /// it: an open of a file asked, with enough still asked after it,
    /// needs no hint (and wakes nobody).
    marks: Mutex<HashMap<Key, Mark>>,
}

#[derive(Default)]
struct Queue {
    hints: VecDeque<Hint>,
    closed: bool,
}

/// A directory's cursor as the request threads see it.
#[derive(Default)]
struct Mark {
    /// Not read in listing order: no hints.
    off: bool,
    /// Files asked and not yet opened, in listing order.
    asked: VecDeque<OsString>,
    /// A hint is sent once no more than this many are left asked.
    low: usize,
    /// A hint for more was sent and not yet taken up.
    sent: bool,
}

impl Prefetch {
    pub fn new(file_max: u64) -> Prefetch {
        Prefetch {
            file_max,
            shared: Arc::default(),
            thread: OnceLock::new(),
            readers: Mutex::new(VecDeque::new()),
        }
    }

    /// Whether caller `pid` opened a small lower file within
    /// `READER_TIME`: a walk that reads, whose listings may start a read
    /// ahead (a walk that only stats never opens one).
    pub fn reading(&self, pid: u32) -> bool {
        self.readers
            .lock()
            .iter()
            .any(|(p, t)| *p == pid && t.elapsed() < READER_TIME)
    }

    /// Passes an open (or a listing) by caller `pid` on to the thread, if
    /// it needs it; never waits (a full queue drops the hint).
    pub fn hint(&self, h: Hint, pid: u32) {
        if h.name.is_some() {
            let mut r = self.readers.lock();
            r.retain(|(p, _)| *p != pid);
            if r.len() >= READERS {
                r.pop_back();
            }
            r.push_front((pid, Instant::now()));
        }
        if !self.wanted(&h) {
            return;
        }
        self.thread.get_or_init(|| Mutex::new(self.start()));
        let mut q = self.shared.queue.lock();
        if q.closed || q.hints.len() >= QUEUE {
            return;
        }
        q.hints.push_back(h);
        drop(q);
        self.shared.work.notify_one();
    }

    /// Whether the thread must hear of this open: not when the file was
    /// asked already and enough are asked after it, nor in a directory
    /// left alone.
    fn wanted(&self, h: &Hint) -> bool {
        let mut marks = self.shared.marks.lock();
        let Some(m) = marks.get_mut(&h.key()) else {
            return true;
        };
        // A listing of a directory read ahead already adds nothing.
        let Some(name) = h.name.as_ref().filter(|_| !m.off) else {
            return false;
        };
        let Some(j) = m.asked.iter().position(|n| n == name) else {
            // Beyond what was asked (the walk ran ahead) or elsewhere.
            return true;
        };
        m.asked.drain(..=j);
        if m.sent || m.asked.len() > m.low {
            return false;
        }
        m.sent = true;
        true
    }

    fn start(&self) -> Option<JoinHandle<()>> {
        let shared = self.shared.clone();
        let file_max = self.file_max;
        let thread = std::thread::Builder::new()
            .name("prefetch".into())
            .spawn(move || serve(shared, file_max));
        match thread {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::debug!("no read-ahead thread: {e}");
                self.shared.queue.lock().closed = true;
                None
            }
        }
    }
}

impl Drop for Prefetch {
    /// Stops the thread: it ends its current file, drops its cursors
    /// (their fds) and returns.
    fn drop(&mut self) {
        self.shared.queue.lock().closed = true;
        self.shared.work.notify_all();
        if let Some(t) = self.thread.take().and_then(|t| t.into_inner()) {
            let _ = t.join();
        }
    }
}

fn serve(shared: Arc<Shared>, file_max: u64) {
    let mut ahead = Ahead {
        cursors: VecDeque::new(),
        buf: vec![0u8; STEP_BYTES],
        file_max,
        shared,
    };
    loop {
        let mut q = ahead.shared.queue.lock();
        while q.hints.is_empty() && !q.closed {
            if ahead.shared.work.wait_for(&mut q, IDLE).timed_out() && q.hints.is_empty() {
                drop(q);
                ahead.cursors.clear();
                ahead.shared.marks.lock().clear();
                q = ahead.shared.queue.lock();
            }
        }
        if q.closed {
            return;
        }
        let Some(h) = q.hints.pop_front() else {
            continue;
        };
        drop(q);
        ahead.hint(h);
    }
}

/// The thread's state: the cursors, most recently used first.
struct Ahead {
    cursors: VecDeque<Cursor>,
    buf: Vec<u8>,
    file_max: u64,
    shared: Arc<Shared>,
}

/// Where the reading ahead of one lower directory stands.
struct Cursor {
    key: Key,
    /// The directory, opened for reading: its position is how far the
    /// listing was read (`None` once it is off).
    dir: Option<OwnedFd>,
    /// Entries read from the listing and not yet looked at.
    listed: VecDeque<sys::DirEntry>,
    end: bool,
    /// Files asked ahead, not yet opened, in listing order, with sizes.
    asked: VecDeque<(OsString, u64)>,
    asked_bytes: u64,
    window: usize,
}

impl Ahead {
    fn stopped(&self) -> bool {
        self.shared.queue.lock().closed
    }

    fn hint(&mut self, h: Hint) {
        let key = h.key();
        let found = self.cursors.iter().position(|c| c.key == key);
        let mut cur = match found {
            // A listing of a directory with a cursor: nothing new.
            Some(_) if h.name.is_none() => return,
            Some(i) => self.cursors.remove(i).expect("position found"),
            None => match h.dir.get().and_then(|d| sys::open_dir(d.as_ref())) {
                Ok(d) => Cursor {
                    key,
                    dir: Some(d),
                    listed: VecDeque::new(),
                    end: false,
                    asked: VecDeque::new(),
                    asked_bytes: 0,
                    window: 0,
                },
                Err(e) => {
                    tracing::debug!(dir = h.dir_id, "no read-ahead: {e}");
                    return;
                }
            },
        };
        if cur.dir.is_some() {
            let at = match &h.name {
                Some(n) => cur.seek(n, &mut self.buf),
                // A listing: from its first file.
                None => {
                    cur.window = FIRST_WINDOW;
                    true
                }
            };
            if at {
                self.fill(&mut cur);
            } else {
                // Not read in listing order: left alone (the cursor stays,
                // off, so later opens here cost nothing).
                cur.dir = None;
                cur.listed.clear();
                cur.asked.clear();
            }
        }
        self.publish(&cur);
        self.cursors.push_front(cur);
        if self.cursors.len() > CURSORS {
            if let Some(old) = self.cursors.pop_back() {
                self.shared.marks.lock().remove(&old.key);
            }
        }
    }

    /// Shows the request threads what is asked now.
    fn publish(&self, cur: &Cursor) {
        let mark = Mark {
            off: cur.dir.is_none(),
            asked: cur.asked.iter().map(|(n, _)| n.clone()).collect(),
            low: cur.asked.len() / 2,
            sent: false,
        };
        self.shared.marks.lock().insert(cur.key, mark);
    }

    /// Asks the files after the last one opened until the window is full.
    fn fill(&mut self, cur: &mut Cursor) {
        while cur.asked.len() < cur.window && cur.asked_bytes < AHEAD_BYTES && !self.stopped() {
            let Some(e) = cur.next(&mut self.buf) else {
                return;
            };
            if e.dtype != libc::DT_REG && e.dtype != libc::DT_UNKNOWN {
                continue;
            }
            let Some(dir) = cur.dir.as_ref() else {
                return;
            };
            if let Some(len) = ask(dir, &e.name, self.file_max) {
                cur.asked_bytes += len;
                cur.asked.push_back((e.name, len));
            }
        }
    }
}

impl Cursor {
    /// Moves past `name`, just opened: true when it was found ahead, in
    /// the files asked or within `SCAN_MAX` entries of the listing.
    fn seek(&mut self, name: &OsStr, buf: &mut [u8]) -> bool {
        if let Some(j) = self.asked.iter().position(|(n, _)| n == name) {
            for (_, len) in self.asked.drain(..=j) {
                self.asked_bytes -= len;
            }
            // The opens follow the listing: a wider window.
            self.window = (self.window * 4).clamp(FIRST_WINDOW, AHEAD_FILES);
            return true;
        }
        // The first open seen here, or one beyond what was asked (the
        // walk ran ahead): what was asked is behind it now.
        self.asked.clear();
        self.asked_bytes = 0;
        self.window = self.window.max(FIRST_WINDOW);
        for _ in 0..SCAN_MAX {
            match self.next(buf) {
                Some(e) if e.name == name => return true,
                Some(_) => {}
                None => return false,
            }
        }
        false
    }

    /// The next entry of the listing, read a step at a time.
    fn next(&mut self, buf: &mut [u8]) -> Option<sys::DirEntry> {
        loop {
            if let Some(e) = self.listed.pop_front() {
                return Some(e);
            }
            if self.end {
                return None;
            }
            let step = sys::read_dir_step(self.dir.as_ref()?, buf);
            match step {
                Ok(es) if !es.is_empty() => self.listed.extend(es),
                _ => self.end = true,
            }
        }
    }
}

/// Asks the kernel to read `name` in `dir` into the page cache if it is a
/// nonempty regular file of at most `max` bytes; its size if it asked.
/// Opened `O_PATH` first and checked, so nothing but a regular file is
/// ever opened for reading (opening a device or a FIFO can act).
fn ask(dir: &OwnedFd, name: &OsStr, max: u64) -> Option<u64> {
    let path = sys::open_path(dir, name).ok()?;
    let st = sys::fstat(&path).ok()?;
    let len = st.st_size as u64;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || len == 0 || len > max {
        return None;
    }
    let fd = sys::reopen(&path, libc::O_RDONLY | libc::O_NONBLOCK).ok()?;
    sys::will_need(&fd, len).ok()?;
    Some(len)
}
