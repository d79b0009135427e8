//! Why the io_uring queues could not be set up: which queue, which step,
//! and the system's reason. The mount then serves through `/dev/fuse` and
//! logs the text.

use std::io;

/// A step of setting up the queues that failed.
#[derive(Debug, thiserror::Error)]
pub enum UringError {
    /// The possible CPUs (one queue each) could not be read.
    #[error("reading {path}: {source}")]
    ReadCpus {
        path: &'static str,
        source: io::Error,
    },
    #[error("{path}: cannot read `{text}`")]
    ParseCpus { path: &'static str, text: String },
    #[error("duplicating the FUSE fd: {0}")]
    DupDevice(#[source] io::Error),
    #[error("queue {qid}: socket pair: {source}")]
    SocketPair { qid: usize, source: nix::Error },
    #[error("queue {qid}: socket buffer: {source}")]
    SocketBuffer { qid: usize, source: nix::Error },
    #[error(
        "queue {qid}: a socket buffer of {got} bytes cannot carry a {payload}-byte request \
         (raise net.core.wmem_max, or run as root)"
    )]
    SmallSocketBuffer {
        qid: usize,
        got: usize,
        payload: usize,
    },
    #[error("queue {qid}: sending INIT to its request threads: {source}")]
    SendInit { qid: usize, source: nix::Error },
    /// The queue's request threads (its fuser session, or the thread
    /// that runs it) could not be started.
    #[error("queue {qid}: starting its request threads: {source}")]
    RequestThreads { qid: usize, source: io::Error },
    #[error("queue {qid}: reading its INIT reply: {source}")]
    InitReply { qid: usize, source: nix::Error },
    #[error("queue {qid}: its request threads refused INIT")]
    InitRefused { qid: usize },
    #[error("queue {qid}: starting its ring thread: {source}")]
    RingThread { qid: usize, source: io::Error },
    #[error("queue {qid}: no answer from its ring thread")]
    NoAnswer { qid: usize },
    #[error("queue {qid}: creating the ring: {source}")]
    CreateRing { qid: u16, source: io::Error },
    #[error("queue {qid}: submitting the registrations: {source}")]
    Submit { qid: u16, source: io::Error },
    /// The kernel refused every entry of the queue's ring.
    #[error("queue {qid}: the kernel refused its ring entries: {source}")]
    Refused { qid: u16, source: io::Error },
}
