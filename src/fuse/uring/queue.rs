//! One io_uring queue: the thread that owns a CPU's ring entries.
//!
//! Each entry is a header buffer and a payload buffer registered with the
//! kernel. A completed entry holds a request: the thread hands it, laid
//! out as `/dev/fuse` would have delivered it, to this queue's request
//! threads over a socket pair, and hands their reply back to the kernel
//! with COMMIT_AND_FETCH, which also re-arms the entry. A request `Fast`
//! answers is committed at once, or, for a sync, once the sync it
//! submitted on this ring has completed; the entry waits meanwhile while
//! the others serve.
//!
//! Invariant: an entry is owned by the kernel from REGISTER or
//! COMMIT_AND_FETCH until its completion, and by this thread from then
//! until the next COMMIT_AND_FETCH; the thread reads or writes an entry's
//! buffers only while it owns it. The buffers never move (they are heap
//! allocations that are never resized) and outlive the ring: the kernel
//! keeps their addresses from REGISTER on.

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use nix::sys::socket::{sendmsg, MsgFlags};

use super::abi::{self, OutHeader, ReqHeader};
use super::{Answer, Fast, QueueSide, Req, Stats, UringError, SCRATCH};
use zerocopy::FromZeros;

/// `user_data` of the pending receive on the socket pair; entries use
/// their index, and the sync an entry's request waits for (`Answer::Sync`)
/// the index with this bit set.
const RECV: u64 = u64::MAX;
const SYNC: u64 = 1 << 32;

struct Entry {
    header: Box<ReqHeader>,
    payload: Vec<u8>,
    /// The iovec pair REGISTER points at.
    iov: [libc::iovec; 2],
}

impl Entry {
    fn new(payload: usize) -> Entry {
        let mut header = Box::new(ReqHeader::new_zeroed());
        let mut payload = vec![0u8; payload];
        let iov = [
            libc::iovec {
                iov_base: std::ptr::from_mut::<ReqHeader>(&mut header).cast(),
                iov_len: std::mem::size_of::<ReqHeader>(),
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload.len(),
            },
        ];
        Entry {
            header,
            payload,
            iov,
        }
    }
}

pub struct Queue {
    pub qid: u16,
    /// The `/dev/fuse` connection's fd (a duplicate: any fd of the
    /// connection serves its rings).
    pub dev: Arc<OwnedFd>,
    /// What the requests this queue serves know of it (for `fast`'s opens).
    pub side: Arc<QueueSide>,
    /// This queue's end of the socket pair to its request threads.
    pub sock: OwnedFd,
    pub depth: usize,
    pub payload: usize,
    pub stats: Arc<Stats>,
    /// DESTROY requests to send when the ring ends: one per request thread.
    pub workers: usize,
    /// Requests this thread answers itself.
    pub fast: Option<std::sync::Arc<dyn Fast>>,
}

struct Run {
    q: Queue,
    entries: Vec<Entry>,
    reply: Vec<u8>,
    /// Requests handed to the request threads: unique → (entry, the
    /// commit id the kernel gave it).
    inflight: HashMap<u64, (usize, u64)>,
    /// Set once the request threads are gone: requests then fail with EIO.
    threads_gone: bool,
    live: usize,
    /// Where `Fast` writes a reply.
    scratch: Vec<u8>,
    /// Per entry, the sync on the ring its request waits for: the
    /// request's commit id and unique, and what makes the answer.
    syncs: Vec<Option<Waiting>>,
}

struct Waiting {
    commit_id: u64,
    unique: u64,
    done: Box<dyn FnOnce(i32) -> Result<(), i32> + Send>,
}

impl Queue {
    /// Registers the entries, reports whether the kernel took them on
    /// `registered`, then serves until the connection ends.
    pub fn run(self, registered: mpsc::Sender<Result<(), UringError>>) {
        super::pin(self.qid as usize);
        let qid = self.qid;
        let entries = (0..self.depth).map(|_| Entry::new(self.payload)).collect();
        let reply = vec![0u8; self.payload + 4096];
        let scratch = vec![0u8; SCRATCH.max(self.payload)];
        let syncs = (0..self.depth).map(|_| None).collect();
        let mut run = Run {
            live: self.depth,
            q: self,
            entries,
            reply,
            inflight: HashMap::new(),
            threads_gone: false,
            scratch,
            syncs,
        };
        // Declared after `run`, so dropped before it: the buffers the
        // kernel may still write (a pending receive) outlive the ring.
        let mut ring = match new_ring(run.q.depth) {
            Ok(r) => r,
            Err(e) => {
                let _ = registered.send(Err(UringError::CreateRing { qid, source: e }));
                return;
            }
        };
        match run.register(&mut ring) {
            Ok(()) => {
                let _ = registered.send(Ok(()));
            }
            Err(e) => {
                let _ = registered.send(Err(e));
                return;
            }
        }
        run.serve(&mut ring);
        run.end_workers();
        drop(ring);
        if run.live > 0 {
            // Serving stopped with entries still registered: the kernel
            // may write into them until the connection ends, so their
            // buffers are never freed.
            std::mem::forget(std::mem::take(&mut run.entries));
        }
    }
}

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

fn new_ring(depth: usize) -> io::Result<Ring> {
    // 128-byte entries: the FUSE command lives in the second half. One
    // thread submits and reaps everything, so the kernel may run the
    // completion work only when that thread waits for it.
    IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build((2 * depth + 4).next_power_of_two() as u32)
}

impl Run {
    fn dev(&self) -> RawFd {
        self.q.dev.as_raw_fd()
    }

    fn register(&mut self, ring: &mut Ring) -> Result<(), UringError> {
        let qid = self.q.qid;
        for i in 0..self.entries.len() {
            let mut sqe = opcode::UringCmd80::new(types::Fd(self.dev()), abi::CMD_REGISTER)
                .cmd(abi::cmd_req(0, self.q.qid))
                .addr(Some(self.entries[i].iov.as_ptr() as u64))
                .build()
                .user_data(i as u64);
            set_len(&mut sqe, 2);
            self.push(ring, &sqe);
        }
        self.push_recv(ring);
        ring.submit()
            .map_err(|source| UringError::Submit { qid, source })?;
        // A refused registration completes at once; an accepted one only
        // when its first request arrives. Accepted entries are the
        // kernel's to fill from now on, so they are served (and their
        // buffers kept) even when others were refused; only a queue with
        // none at all fails, which leaves the kernel's ring not ready.
        let mut refused = None;
        for cqe in ring.completion() {
            if cqe.user_data() != RECV && cqe.result() < 0 {
                refused = Some(io::Error::from_raw_os_error(-cqe.result()));
                self.live -= 1;
            }
        }
        match refused {
            Some(source) if self.live == 0 => Err(UringError::Refused { qid, source }),
            Some(e) => {
                tracing::warn!(
                    "queue {}: the kernel refused {} of its {} ring entries: {e}",
                    self.q.qid,
                    self.entries.len() - self.live,
                    self.entries.len()
                );
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn push(&mut self, ring: &mut Ring, sqe: &squeue::Entry128) {
        loop {
            // SAFETY: every buffer an entry points at (iovecs, header,
            // payload, the reply buffer) lives in `self` and outlives the
            // ring, which `Queue::run` drops first (see the module note);
            // a sync points at no memory, and its fd stays open until its
            // completion (`Waiting::done` holds it).
            if unsafe { ring.submission().push(sqe) }.is_ok() {
                return;
            }
            // Full: hand what is queued to the kernel and retry.
            if let Err(e) = ring.submit() {
                tracing::warn!("queue {}: submitting: {e}", self.q.qid);
            }
        }
    }

    fn push_recv(&mut self, ring: &mut Ring) {
        if self.threads_gone {
            return;
        }
        let sqe = opcode::Recv::new(
            types::Fd(self.q.sock.as_raw_fd()),
            self.reply.as_mut_ptr(),
            self.reply.len() as u32,
        )
        .build()
        .user_data(RECV);
        self.push(ring, &squeue::Entry128::from(sqe));
    }

    fn serve(&mut self, ring: &mut Ring) {
        let mut done = Vec::with_capacity(2 * self.entries.len() + 4);
        while self.live > 0 {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                // Interrupted, or completions to reap first: reap.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                    ) => {}
                Err(e) => {
                    tracing::error!("queue {}: waiting for requests: {e}", self.q.qid);
                    return;
                }
            }
            done.clear();
            done.extend(ring.completion().map(|c| (c.user_data(), c.result())));
            for &(ud, res) in &done {
                if ud == RECV {
                    self.received(ring, res);
                } else if ud & SYNC != 0 {
                    self.synced(ring, (ud & !SYNC) as usize, res);
                } else if res < 0 {
                    // The connection ended (ENOTCONN), the ring's thread
                    // is going (ECANCELED), or the kernel refused a
                    // commit: the entry is out of service for good.
                    if res != -libc::ENOTCONN && res != -libc::ECANCELED {
                        tracing::warn!(
                            "queue {}: ring entry ended: {}",
                            self.q.qid,
                            io::Error::from_raw_os_error(-res)
                        );
                    }
                    self.live -= 1;
                } else {
                    self.forward(ring, ud as usize);
                }
            }
        }
    }

    /// Hands entry `i`'s request to the request threads, laid out as on
    /// `/dev/fuse`: the in-header, the first argument (from `op_in`), then
    /// the rest (from the payload).
    fn forward(&mut self, ring: &mut Ring, i: usize) {
        if let Some(n) = self.q.stats.requests.get(self.q.qid as usize) {
            n.fetch_add(1, Ordering::Relaxed);
        }
        let e = &self.entries[i];
        let h = &e.header;
        let head = h.request();
        let (len, opcode, unique) = (head.len as usize, head.opcode, head.unique);
        let psz = h.ring_ent_in_out.payload_sz as usize;
        let commit_id = h.ring_ent_in_out.commit_id;
        let first = len
            .checked_sub(abi::IN_HEADER_LEN + psz)
            .filter(|&n| n <= abi::OP_IN_LEN && psz <= e.payload.len());
        let Some(first) = first else {
            tracing::error!(
                "queue {}: request {unique} (opcode {opcode}) has inconsistent sizes: \
                 len {len}, payload {psz}",
                self.q.qid
            );
            return self.fail(ring, i, commit_id, unique, libc::EIO);
        };
        // (Extensions after the arguments, which layerfs does not ask
        // for, are left to fuser.)
        if let (Some(fast), 0) = (&self.q.fast, head.total_extlen) {
            let req = Req {
                opcode,
                nodeid: head.nodeid,
                uid: head.uid,
                gid: head.gid,
                pid: head.pid,
            };
            let arg = &h.op_in[..first];
            let rest = &e.payload[..psz];
            if let Some(a) = fast.answer(&self.q.side, req, arg, rest, &mut self.scratch) {
                if let Some(n) = self.q.stats.answered.get(self.q.qid as usize) {
                    n.fetch_add(1, Ordering::Relaxed);
                }
                return match a {
                    Answer::Now(r) => self.answered(ring, i, commit_id, unique, r),
                    Answer::Sync(s) => self.sync(ring, i, commit_id, unique, s),
                };
            }
        }
        if self.threads_gone {
            return self.fail(ring, i, commit_id, unique, libc::EIO);
        }
        let parts = [
            IoSlice::new(h.request_bytes()),
            IoSlice::new(&h.op_in[..first]),
            IoSlice::new(&e.payload[..psz]),
        ];
        self.inflight.insert(unique, (i, commit_id));
        let sent = loop {
            match sendmsg::<()>(
                self.q.sock.as_raw_fd(),
                &parts,
                &[],
                MsgFlags::empty(),
                None,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => break r,
            }
        };
        if let Err(e) = sent {
            tracing::error!(
                "queue {}: the request threads are gone ({e}); failing requests with EIO",
                self.q.qid
            );
            self.threads_gone = true;
            self.inflight.remove(&unique);
            self.fail(ring, i, commit_id, unique, libc::EIO);
        }
    }

    /// A reply from a request thread (or the end of the socket pair).
    fn received(&mut self, ring: &mut Ring, res: i32) {
        if res == -libc::EINTR || res == -libc::EAGAIN {
            return self.push_recv(ring);
        }
        if res <= 0 {
            if !self.threads_gone {
                tracing::error!(
                    "queue {}: the request threads closed their socket ({}); \
                     failing requests with EIO",
                    self.q.qid,
                    io::Error::from_raw_os_error(-res)
                );
            }
            self.threads_gone = true;
            let stuck: Vec<_> = self.inflight.drain().collect();
            for (unique, (i, commit_id)) in stuck {
                self.fail(ring, i, commit_id, unique, libc::EIO);
            }
            return;
        }
        let n = res as usize;
        let Some(OutHeader { unique, .. }) = abi::reply_header(&self.reply[..n]) else {
            tracing::error!("queue {}: a {n}-byte reply is too short", self.q.qid);
            return self.push_recv(ring);
        };
        match self.inflight.remove(&unique) {
            Some((i, commit_id)) => self.commit(ring, i, commit_id, n),
            None => tracing::error!(
                "queue {}: a reply to request {unique}, which is not waiting",
                self.q.qid
            ),
        }
        self.push_recv(ring);
    }

    /// Copies the reply in `self.reply[..n]` into entry `i` and commits it.
    fn commit(&mut self, ring: &mut Ring, i: usize, commit_id: u64, n: usize) {
        let out = &self.reply[..n];
        let head = abi::reply_header(out).expect("`received` checked its length");
        let body = &out[abi::OUT_HEADER_LEN..];
        let e = &mut self.entries[i];
        if body.len() > e.payload.len() {
            tracing::error!(
                "queue {}: a {}-byte reply does not fit the ring's buffer",
                self.q.qid,
                body.len()
            );
            return self.fail(ring, i, commit_id, head.unique, libc::EIO);
        }
        e.header.set_reply(head, body.len());
        e.payload[..body.len()].copy_from_slice(body);
        self.commit_entry(ring, i, commit_id);
    }

    /// Commits what `Fast` answered (from `self.scratch`).
    fn answered(
        &mut self,
        ring: &mut Ring,
        i: usize,
        commit_id: u64,
        unique: u64,
        r: Result<usize, i32>,
    ) {
        let n = match r {
            Ok(n) => n,
            Err(errno) => return self.fail(ring, i, commit_id, unique, errno),
        };
        let e = &mut self.entries[i];
        if n > e.payload.len() {
            tracing::error!(
                "queue {}: a {n}-byte answer does not fit the ring's buffer",
                self.q.qid
            );
            return self.fail(ring, i, commit_id, unique, libc::EIO);
        }
        let out = OutHeader {
            len: (abi::OUT_HEADER_LEN + n) as u32,
            error: 0,
            unique,
        };
        e.header.set_reply(out, n);
        e.payload[..n].copy_from_slice(&self.scratch[..n]);
        self.commit_entry(ring, i, commit_id);
    }

    /// Submits entry `i`'s sync on the ring; its completion (`synced`)
    /// answers the request. The entry stays this thread's, uncommitted,
    /// meanwhile: the kernel serves the queue's other entries as usual.
    fn sync(&mut self, ring: &mut Ring, i: usize, commit_id: u64, unique: u64, s: super::SyncOp) {
        let flags = if s.datasync {
            types::FsyncFlags::DATASYNC
        } else {
            types::FsyncFlags::empty()
        };
        let sqe = opcode::Fsync::new(types::Fd(s.fd))
            .flags(flags)
            .build()
            .user_data(SYNC | i as u64);
        self.syncs[i] = Some(Waiting {
            commit_id,
            unique,
            done: s.done,
        });
        self.push(ring, &squeue::Entry128::from(sqe));
    }

    /// Entry `i`'s sync completed with `res`: answers its request.
    fn synced(&mut self, ring: &mut Ring, i: usize, res: i32) {
        let Some(w) = self.syncs.get_mut(i).and_then(Option::take) else {
            return tracing::error!("queue {}: a sync no entry waits for", self.q.qid);
        };
        match (w.done)(res) {
            Ok(()) => self.answered(ring, i, w.commit_id, w.unique, Ok(0)),
            Err(errno) => self.fail(ring, i, w.commit_id, w.unique, errno),
        }
    }

    /// Answers entry `i`'s request with `errno` and re-arms the entry.
    fn fail(&mut self, ring: &mut Ring, i: usize, commit_id: u64, unique: u64, errno: i32) {
        let e = &mut self.entries[i];
        let out = OutHeader {
            len: abi::OUT_HEADER_LEN as u32,
            error: -errno,
            unique,
        };
        e.header.set_reply(out, 0);
        self.commit_entry(ring, i, commit_id);
    }

    fn commit_entry(&mut self, ring: &mut Ring, i: usize, commit_id: u64) {
        let sqe = opcode::UringCmd80::new(types::Fd(self.dev()), abi::CMD_COMMIT_AND_FETCH)
            .cmd(abi::cmd_req(commit_id, self.q.qid))
            .build()
            .user_data(i as u64);
        self.push(ring, &sqe);
    }

    /// Ends this queue's request threads: each takes one DESTROY and
    /// returns. Their replies are not read.
    fn end_workers(&mut self) {
        if self.threads_gone {
            return;
        }
        for n in 0..self.q.workers {
            let msg = abi::destroy_request(u64::MAX - n as u64);
            let _ = sendmsg::<()>(
                self.q.sock.as_raw_fd(),
                &[IoSlice::new(&msg)],
                &[],
                MsgFlags::MSG_DONTWAIT,
                None,
            );
        }
    }
}

/// Sends the kernel a registration for a queue that does not exist: its
/// refusal turns io_uring off for the connection (see `super::give_up`).
pub fn refuse_rings(dev: &OwnedFd) -> io::Result<()> {
    let entry = Entry::new(8192);
    // Declared after the entry, so dropped before it.
    let mut ring = new_ring(1)?;
    let mut sqe = opcode::UringCmd80::new(types::Fd(dev.as_raw_fd()), abi::CMD_REGISTER)
        .cmd(abi::cmd_req(0, u16::MAX))
        .addr(Some(entry.iov.as_ptr() as u64))
        .build();
    set_len(&mut sqe, 2);
    // SAFETY: the entry (iovecs and buffers) lives until the ring is
    // dropped at the end of this function, after the kernel has answered.
    unsafe { ring.submission().push(&sqe) }
        .map_err(|_| io::Error::other("submission queue full"))?;
    ring.submit_and_wait(1)?;
    let res = ring.completion().next().map(|c| c.result());
    match res {
        Some(r) if r < 0 => Ok(()),
        _ => Err(io::Error::other(
            "the kernel accepted a queue that does not exist",
        )),
    }
}

/// Sets the SQE's `len` field, which the FUSE REGISTER command reads as
/// the number of iovecs at `addr` (the io-uring crate's command builder
/// leaves it 0).
fn set_len(sqe: &mut squeue::Entry128, len: u32) {
    // SAFETY: `squeue::Entry128` is `#[repr(C)]` and starts with the
    // kernel's 64-byte `struct io_uring_sqe`, whose `len` is the u32 at
    // byte 24 (include/uapi/linux/io_uring.h); the write stays inside the
    // 128-byte value and is unaligned-safe.
    unsafe {
        let p = (sqe as *mut squeue::Entry128).cast::<u8>().add(24);
        std::ptr::write_unaligned(p.cast::<u32>(), len);
    }
}
