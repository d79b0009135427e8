//! Change events: what the journal records, as the core sees it. The core
//! knows nothing of where events go (a `Sink`, the SQLite journal in the
//! daemon); it only notes, during a request, what happened inside it that
//! the adapter cannot see from outside — a copy-up, a policy denial and
//! its rule — and the adapter turns those notes and the request itself
//! (op, path, result, caller) into events.
//!
//! Notes are kept per thread: a request runs on one thread from start to
//! reply (a request parked by a pause runs whole on its parking thread),
//! and the adapter takes the notes when the request ends, so notes never
//! cross requests.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::SystemTime;

/// The kind of change an event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvOp {
    Create,
    /// Writes through one open file, coalesced: one event at fsync or close.
    Write,
    Truncate,
    Unlink,
    Rename,
    Link,
    Symlink,
    Mkdir,
    Rmdir,
    Mknod,
    Chmod,
    Chown,
    Utimes,
    Setxattr,
    Removexattr,
    CopyUp,
    /// The journal itself lost events (`bytes` holds how many).
    Dropped,
    /// Retention deleted rows: the journal's one such row holds how many
    /// in all (`bytes`) and the span of their times (`oldest`/`newest`).
    Trimmed,
    /// Undo operations, written by the command that ran them
    /// (`journal::record_undo`): `path` says what (the paths, the
    /// snapshot), `bytes` how many entries.
    Reset,
    Gc,
    SnapshotSave,
    SnapshotRestore,
    /// A checkpoint (`path`: its name) and an undo (`path`: the checkpoint
    /// gone back to, `bytes`: how many checkpoints it took off the stack).
    Checkpoint,
    Undo,
    /// A command the agent tools ran in the workspace's sandbox
    /// (`tools::Workspace::execute`): `path` is the command, `bytes` its
    /// exit code; the rows of its changes follow from the mount.
    Exec,
}

impl EvOp {
    /// The name the journal and `layerfs log --op` use.
    pub fn name(self) -> &'static str {
        match self {
            EvOp::Create => "create",
            EvOp::Write => "write",
            EvOp::Truncate => "truncate",
            EvOp::Unlink => "unlink",
            EvOp::Rename => "rename",
            EvOp::Link => "link",
            EvOp::Symlink => "symlink",
            EvOp::Mkdir => "mkdir",
            EvOp::Rmdir => "rmdir",
            EvOp::Mknod => "mknod",
            EvOp::Chmod => "chmod",
            EvOp::Chown => "chown",
            EvOp::Utimes => "utimes",
            EvOp::Setxattr => "setxattr",
            EvOp::Removexattr => "removexattr",
            EvOp::CopyUp => "copy-up",
            EvOp::Dropped => "journal-dropped",
            EvOp::Trimmed => "journal-trimmed",
            EvOp::Reset => "reset",
            EvOp::Gc => "gc",
            EvOp::SnapshotSave => "snapshot-save",
            EvOp::SnapshotRestore => "snapshot-restore",
            EvOp::Checkpoint => "checkpoint",
            EvOp::Undo => "undo",
            EvOp::Exec => "exec",
        }
    }

    /// Every op, in the order `layerfs log --help` lists them.
    pub const ALL: [EvOp; 25] = [
        EvOp::Create,
        EvOp::Write,
        EvOp::Truncate,
        EvOp::Unlink,
        EvOp::Rename,
        EvOp::Link,
        EvOp::Symlink,
        EvOp::Mkdir,
        EvOp::Rmdir,
        EvOp::Mknod,
        EvOp::Chmod,
        EvOp::Chown,
        EvOp::Utimes,
        EvOp::Setxattr,
        EvOp::Removexattr,
        EvOp::CopyUp,
        EvOp::Dropped,
        EvOp::Trimmed,
        EvOp::Reset,
        EvOp::Gc,
        EvOp::SnapshotSave,
        EvOp::SnapshotRestore,
        EvOp::Checkpoint,
        EvOp::Undo,
        EvOp::Exec,
    ];
}

/// One recorded change (or refused attempt).
#[derive(Debug, Clone)]
pub struct Event {
    pub time: SystemTime,
    pub op: EvOp,
    /// Path relative to the mount root.
    pub path: String,
    /// The new name (rename, link), the target (symlink) or the attribute
    /// name (setxattr, removexattr).
    pub to: Option<String>,
    /// 0 for success, else the errno the caller got.
    pub errno: i32,
    /// Bytes written (write, as counted by the daemon), new size (truncate).
    pub bytes: Option<u64>,
    /// The caller as the kernel gives it in the request header: the
    /// thread group id and the filesystem uid and gid. The uid and gid
    /// are what attributes a row (a process names itself; its ids it
    /// cannot choose).
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    /// The caller's command name (/proc/PID/comm), as the process set it.
    pub comm: Arc<str>,
    /// The policy rule that refused the change.
    pub rule: Option<String>,
}

/// Where events go. `record` must never block: it is called on the
/// request path.
pub trait Sink: Send + Sync {
    fn record(&self, ev: Event);
}

/// What the core noted during the current request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    CopyUp {
        path: String,
    },
    Denied {
        path: String,
        rule: String,
        errno: i32,
    },
}

thread_local! {
    static NOTES: RefCell<Vec<Note>> = const { RefCell::new(Vec::new()) };
}

/// Notes something for the request running on this thread.
pub fn note(n: Note) {
    NOTES.with(|v| v.borrow_mut().push(n));
}

/// Takes this thread's notes (empty, without allocating, when none).
pub fn take_notes() -> Vec<Note> {
    NOTES.with(|v| std::mem::take(&mut *v.borrow_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_per_thread_and_taken_once() {
        note(Note::CopyUp { path: "a".into() });
        let other = std::thread::spawn(take_notes).join().unwrap();
        assert!(other.is_empty());
        assert_eq!(take_notes(), vec![Note::CopyUp { path: "a".into() }]);
        assert!(take_notes().is_empty());
    }
}
