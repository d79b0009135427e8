//! The workspace's file tools as a library: list, read with line
//! numbers, write (create-only unless told), edit by unique match, grep,
//! glob, delete, rename, mkdir, stat, exists — for agents and scripts that
//! reach a workspace without a mount (`layerfs fs`, `layerfs serve --mcp`).
//!
//! Where the calls run (decided once, at `open`; see DESIGN.md, "The
//! agent tools"):
//! - an unmounted workspace: the overlay core runs in this process
//!   (`core`), holding the upper's and work dir's locks as a mount's
//!   daemon does; no `/dev/fuse` is needed;

//! - a workspace a daemon serves: every call is a system call on its
//!   mount (`mounted`), so the daemon's policy, quota and journal apply
//!   and changes either way are seen at once. There is never a second
//!   core on one upper (`daemon::exclusive`).
//!
//! Paths are checked before anything is touched (`path::RelPath`).
//! Changes to one path are serialized (`Workspace::lock`); a `Workspace`
//! is safe to share between threads.

mod core;
pub mod error;
pub mod exec;
mod mounted;
mod open;
pub mod path;
pub mod request;
mod search;
pub mod state;
pub mod store;
mod text;

use std::path::{Path, PathBuf};

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard};

use error::Result;
pub use error::{ToolError, What};
pub use exec::{ExecuteRequest, ExecuteResult};
use open::{open_err, Lost, NotStarted, Reclaim};
pub use open::{Layers, OpenOptions};
pub use path::RelPath;
pub use request::*;
pub use state::*;
use store::{Kind, Store};

use crate::policy::pattern::PathSet;
use crate::policy::Policy;

/// Stripes of the per-path change locks.
const STRIPES: usize = 64;

/// An open workspace: the tools on its union view.
pub struct Workspace {
    /// Swapped only by `execute`, which lends an unmounted workspace to
    /// `layerfs run` for the command's duration (write-locked meanwhile,
    /// so the other calls wait for the command).
    store: RwLock<Box<dyn Store>>,
    read_only: bool,
    /// Where `execute` runs commands.
    target: exec::Target,
    /// How to take the core back after `execute` (in-process only).
    reclaim: Option<Reclaim>,
    /// The journal's database, for `execute`'s row.
    journal_db: Option<PathBuf>,
    client: String,
    /// Scratch paths (the policy's and the workspace's `--scratch`).
    scratch: PathSet,
    /// Where the calls go when a daemon serves the workspace.
    mountpoint: Option<PathBuf>,
    /// The policy, for the state operations' checks (the core and the
    /// mount apply it to every change themselves).
    policy: Policy,
    /// The upper and the state dir, to read the workspace's description
    /// for the state operations (`state`).
    state_at: Option<(PathBuf, PathBuf)>,
    locks: Vec<Mutex<()>>,
}

impl Workspace {
    /// The store, for one call (recursive: a call may nest another while
    /// `execute` waits for the write lock).
    fn store(&self) -> RwLockReadGuard<'_, Box<dyn Store>> {
        self.store.read_recursive()
    }

    /// The live mount the calls go through; `None` when the core runs in
    /// this process.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// # std::fs::create_dir(lower.join("src"))?;
    /// # std::fs::write(lower.join("src/main.rs"), "fn main() {}\n")?;
    /// use layerfs::tools::{Layers, OpenOptions};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// assert_eq!(ws.mountpoint(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn mountpoint(&self) -> Option<&Path> {
        self.mountpoint.as_deref()
    }

    /// Serializes changes to one path (and to whatever shares its stripe).
    fn lock(&self, p: &RelPath) -> MutexGuard<'_, ()> {
        self.locks[self.lock_index(p)].lock()
    }

    /// Refuses the state operation `tool` on a read-only workspace.
    fn writable(&self, tool: &str) -> Result<()> {
        match self.read_only {
            true => Err(ToolError::new(tool, What::ReadOnly)),
            false => Ok(()),
        }
    }

    /// Runs `f` with an unmounted workspace's core stopped (its locks
    /// released, its journal flushed: `f` may change the upper and the
    /// stack as the command line would, or mount it), the other calls
    /// waiting meanwhile; then starts the core again on what `f` left.
    /// A workspace a daemon serves just runs `f`.
    fn lent<T>(&self, f: impl FnOnce() -> T) -> T {
        let Some(reclaim) = &self.reclaim else {
            return f();
        };
        let mut store = self.store.write();
        // Dropping the core releases the upper's and work dir's locks and
        // ends its journal writer.
        *store = Box::new(Lost(ToolError::new(
            "workspace",
            What::Exec("the workspace is lent to another operation".into()),
        )));
        let r = f();
        *store = match reclaim.start(&self.client) {
            Ok(s) => s,
            Err(NotStarted::Served(mp)) => Box::new(Lost(open_err(
                mp.display(),
                "a mount took the workspace meanwhile; open it again by that mountpoint",
            ))),
            Err(NotStarted::Failed(e)) => Box::new(Lost(e)),
        };
        r
    }

    /// Checks `raw` for a change: the path rule, and the read-only mode.
    fn changing(&self, raw: &str) -> Result<RelPath> {
        let p = RelPath::parse(raw)?;
        if self.read_only {
            return Err(ToolError::new(&p, What::ReadOnly));
        }
        if p.is_root() {
            return Err(ToolError::new(
                raw,
                What::BadPath("the workspace root itself"),
            ));
        }
        Ok(p)
    }

    /// The entries of a directory (union view: upper wins, whiteouts and
    /// hidden paths left out), in name order.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// # std::fs::create_dir(lower.join("src"))?;
    /// # std::fs::write(lower.join("src/main.rs"), "fn main() {}\n")?;
    /// use layerfs::tools::{Layers, OpenOptions};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// let names: Vec<_> = ws.ls("/")?.into_iter().map(|e| e.path).collect();
    /// assert_eq!(names, ["notes.txt", "src"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ls(&self, path: &str) -> Result<Vec<Entry>> {
        let p = RelPath::parse(path)?;
        let mut v = self.store().list(&p)?;
        v.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(v.iter()
            .map(|(n, m)| search::entry(&p.join(n), m))
            .collect())
    }

    /// Numbered lines of a text file (`     1\tline`), `offset` lines
    /// skipped, at most `limit`; a binary file is reported, not dumped.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// # std::fs::create_dir(lower.join("src"))?;
    /// # std::fs::write(lower.join("src/main.rs"), "fn main() {}\n")?;
    /// use layerfs::tools::{Layers, OpenOptions};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// let r = ws.read(&layerfs::tools::ReadRequest { path: "notes.txt".into(), offset: 1, limit: 1 })?;
    /// assert_eq!(r.content, "     2\tbeta");
    /// assert!(r.truncated);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read(&self, req: &ReadRequest) -> Result<ReadResult> {
        let p = RelPath::parse(&req.path)?;
        let data = self.store().read(&p)?;
        let size = data.len() as u64;
        let path = p.as_str().to_string();
        let Some(text) = text::as_text(&data) else {
            return Ok(ReadResult {
                path,
                content: String::new(),
                lines: 0,
                total_lines: 0,
                truncated: false,
                binary: true,
                size,
            });
        };
        let (content, lines, total_lines) = text::numbered(text, req.offset, req.limit);
        Ok(ReadResult {
            path,
            content,
            lines,
            total_lines,
            truncated: req.offset + lines < total_lines,
            binary: false,
            size,
        })
    }

    /// The raw bytes of a file: at most `limit` bytes (all when `None`)
    /// from byte `offset` on; none past its end.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// # std::fs::create_dir(lower.join("src"))?;
    /// # std::fs::write(lower.join("src/main.rs"), "fn main() {}\n")?;
    /// use layerfs::tools::{Layers, OpenOptions};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// assert_eq!(ws.read_raw("src/main.rs", 0, None)?, b"fn main() {}\n");
    /// assert_eq!(ws.read_raw("src/main.rs", 3, Some(4))?, b"main");
    /// assert_eq!(ws.read_raw("src/main.rs", 100, None)?, b"");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read_raw(&self, path: &str, offset: u64, limit: Option<u64>) -> Result<Vec<u8>> {
        let p = RelPath::parse(path)?;
        self.store()
            .read_range(&p, offset, limit.unwrap_or(u64::MAX))
    }

    /// Creates a file; an existing one is an error naming it unless
    /// `overwrite`, which replaces it atomically (its mode kept).
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// # std::fs::create_dir(lower.join("src"))?;
    /// # std::fs::write(lower.join("src/main.rs"), "fn main() {}\n")?;
    /// use layerfs::tools::{Layers, OpenOptions};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// use layerfs::tools::{WriteRequest, What};
    /// let req = WriteRequest { path: "new.txt".into(), content: "hi\n".into(), overwrite: false };
    /// assert!(ws.write(&req)?.created);
    /// assert_eq!(ws.write(&req).unwrap_err().what, What::Exists);
    /// ws.write(&WriteRequest { overwrite: true, ..req })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write(&self, req: &WriteRequest) -> Result<WriteResult> {
        let p = self.changing(&req.path)?;
        let _l = self.lock(&p);
        let data = req.content.as_bytes();
        let created = match self.store().create("write", &p, data, 0o666) {
            Ok(()) => true,
            Err(e) if e.what == What::Exists && req.overwrite => {
                self.replace("write", &p, data)?;
                false
            }
            Err(e) => return Err(e),
        };
        Ok(WriteResult {
            path: p.as_str().to_string(),
            bytes: data.len() as u64,
            created,
        })
    }

    /// Replaces file `p`'s content atomically: a temporary file beside it,
    /// renamed over it (a reader sees the old or the new file, never
    /// half). Callers hold `p`'s lock.
    fn replace(&self, tool: &str, p: &RelPath, data: &[u8]) -> Result<()> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let meta = self.store().stat(p)?;
        match meta.kind {
            Kind::File => {}
            Kind::Dir => return Err(ToolError::new(p, What::IsADirectory)),
            Kind::Symlink => return Err(ToolError::new(p, What::Symlink)),
            Kind::Other => return Err(ToolError::new(p, What::Io(libc::EINVAL))),
        }
        let (dir, name) = p.split_last().expect("not the root");
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(&format!(".{name}.layerfs-{}-{n}.tmp", std::process::id()));
        self.store()
            .create(tool, &tmp, data, meta.mode)
            .map_err(|e| e.about(p))?;
        self.store().rename(tool, &tmp, p, false).map_err(|e| {
            let _ = self.store().remove(tool, &tmp, false);
            e.about(p)
        })
    }

    /// Replaces `old_string` by `new_string`: exactly one occurrence
    /// unless `replace_all`; zero or several are errors saying how many.
    /// Atomic, as `write` with `overwrite`.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// # std::fs::create_dir(lower.join("src"))?;
    /// # std::fs::write(lower.join("src/main.rs"), "fn main() {}\n")?;
    /// use layerfs::tools::{Layers, OpenOptions};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// use layerfs::tools::{EditRequest, What};
    /// let mut req = EditRequest { path: "notes.txt".into(), old_string: "alpha".into(),
    ///     new_string: "gamma".into(), replace_all: false };
    /// assert_eq!(ws.edit(&req).unwrap_err().what, What::Matches(2));
    /// req.replace_all = true;
    /// assert_eq!(ws.edit(&req)?.replacements, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn edit(&self, req: &EditRequest) -> Result<EditResult> {
        let p = self.changing(&req.path)?;
        let _l = self.lock(&p);
        let data = self.store().read(&p)?;
        let old = text::as_text(&data).ok_or_else(|| ToolError::new(&p, What::Binary))?;
        let (new, n) = text::replace(old, &req.old_string, &req.new_string, req.replace_all)
            .map_err(|w| ToolError::new(&p, w))?;
        self.replace("edit", &p, new.as_bytes())?;
        Ok(EditResult {
            path: p.as_str().to_string(),
            replacements: n,
        })
    }

    /// Searches text files for a literal string (or a regex on request).
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// # std::fs::create_dir(lower.join("src"))?;
    /// # std::fs::write(lower.join("src/main.rs"), "fn main() {}\n")?;
    /// use layerfs::tools::{Layers, OpenOptions};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// use layerfs::tools::GrepRequest;
    /// let r = ws.grep(&GrepRequest::new("alpha"))?;
    /// assert_eq!(r.matches.len(), 2);
    /// assert_eq!((r.matches[1].path.as_str(), r.matches[1].line), ("notes.txt", 3));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn grep(&self, req: &GrepRequest) -> Result<GrepResult> {
        let base = RelPath::parse(&req.path)?;
        search::grep(self.store().as_ref(), &base, req, &self.scratch)
    }

    /// The entries under `path` whose path relative to it matches the
    /// pattern, in walk order.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// # std::fs::create_dir(lower.join("src"))?;
    /// # std::fs::write(lower.join("src/main.rs"), "fn main() {}\n")?;
    /// use layerfs::tools::{Layers, OpenOptions};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// let found = ws.glob(&layerfs::tools::GlobRequest::new("**/*.rs"))?;
    /// assert_eq!(found[0].path, "src/main.rs");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn glob(&self, req: &GlobRequest) -> Result<Vec<Entry>> {
        let base = RelPath::parse(&req.path)?;
        search::glob(self.store().as_ref(), &base, &req.pattern)
    }

    /// Removes a file, or a directory (with everything in it when
    /// `recursive`; an empty one otherwise).
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// # std::fs::create_dir(lower.join("src"))?;
    /// # std::fs::write(lower.join("src/main.rs"), "fn main() {}\n")?;
    /// use layerfs::tools::{Layers, OpenOptions};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// ws.delete("src", true)?;
    /// assert!(!ws.exists("src/main.rs")?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn delete(&self, path: &str, recursive: bool) -> Result<()> {
        let p = self.changing(path)?;
        let _l = self.lock(&p);
        if self.store().stat(&p)?.kind != Kind::Dir {
            return self.store().remove("delete", &p, false);
        }
        if recursive {
            let mut inside = Vec::new();
            let none = PathSet::default();
            search::walk(self.store().as_ref(), &p, &none, &mut |q, m| {
                inside.push((q.clone(), m.kind == Kind::Dir));
                Ok(())
            })?;
            // Walk order puts a directory before what it holds.
            for (q, dir) in inside.iter().rev() {
                self.store().remove("delete", q, *dir)?;
            }
        }
        self.store().remove("delete", &p, true)
    }

    /// Renames an entry; an existing destination is an error unless
    /// `overwrite`.
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// # std::fs::create_dir(lower.join("src"))?;
    /// # std::fs::write(lower.join("src/main.rs"), "fn main() {}\n")?;
    /// use layerfs::tools::{Layers, OpenOptions};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// ws.rename("notes.txt", "src/notes.md", false)?;
    /// assert!(ws.exists("src/notes.md")?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rename(&self, from: &str, to: &str, overwrite: bool) -> Result<()> {
        let (f, t) = (self.changing(from)?, self.changing(to)?);
        if f == t {
            // As rename(2) through the kernel answers: the name exists,
            // so without `overwrite` that is the error; with it, nothing
            // to do. (The core is never asked: the kernel never asks it.)
            self.store().stat(&f)?;
            return match overwrite {
                true => Ok(()),
                false => Err(ToolError::new(&t, What::Exists)),
            };
        }
        // Both stripes, in one order, so two renames never wait in a circle.
        let (a, b) = (self.lock_index(&f), self.lock_index(&t));
        let _first = self.locks[a.min(b)].lock();
        let _second = (a != b).then(|| self.locks[a.max(b)].lock());
        self.store().rename("rename", &f, &t, !overwrite)
    }

    fn lock_index(&self, p: &RelPath) -> usize {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        BuildHasherDefault::<DefaultHasher>::default().hash_one(p) as usize % STRIPES
    }

    /// Creates a directory; with `parents`, the missing ones above it too
    /// (and an existing directory is no error).
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// # std::fs::create_dir(lower.join("src"))?;
    /// # std::fs::write(lower.join("src/main.rs"), "fn main() {}\n")?;
    /// use layerfs::tools::{Layers, OpenOptions};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// ws.mkdir("a/b/c", true)?;
    /// assert_eq!(ws.stat("a/b")?.kind, layerfs::tools::store::Kind::Dir);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        let p = self.changing(path)?;
        if !parents {
            return self.store().mkdir("mkdir", &p);
        }
        let mut cur = RelPath::root();
        for seg in p.segments() {
            cur = cur.join(seg);
            match self.store().mkdir("mkdir", &cur) {
                Err(e) if e.what == What::Exists => {
                    if self.store().stat(&cur)?.kind != Kind::Dir {
                        return Err(ToolError::new(&cur, What::NotADirectory));
                    }
                }
                r => r?,
            }
        }
        Ok(())
    }

    /// What an entry is (a symlink is described, not followed).
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// # std::fs::create_dir(lower.join("src"))?;
    /// # std::fs::write(lower.join("src/main.rs"), "fn main() {}\n")?;
    /// use layerfs::tools::{Layers, OpenOptions};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// assert_eq!(ws.stat("notes.txt")?.size, 23);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stat(&self, path: &str) -> Result<Entry> {
        let p = RelPath::parse(path)?;
        let m = self.store().stat(&p)?;
        Ok(search::entry(&p, &m))
    }

    /// Whether an entry exists (hidden paths do not).
    ///
    /// ```
    /// # let d = tempfile::tempdir()?;
    /// # let (lower, upper) = (d.path().join("lower"), d.path().join("upper"));
    /// # std::fs::create_dir(&lower)?;
    /// # std::fs::create_dir(&upper)?;
    /// # std::fs::write(lower.join("notes.txt"), "alpha\nbeta\nalpha again\n")?;
    /// # std::fs::create_dir(lower.join("src"))?;
    /// # std::fs::write(lower.join("src/main.rs"), "fn main() {}\n")?;
    /// use layerfs::tools::{Layers, OpenOptions};
    /// let ws = layerfs::Workspace::open_layers(&Layers::new(vec![lower], upper), &OpenOptions::default())?;
    /// assert!(ws.exists("/notes.txt")?);
    /// assert!(!ws.exists("nothing")?);
    /// assert!(ws.exists("../etc").is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn exists(&self, path: &str) -> Result<bool> {
        match self.store().stat(&RelPath::parse(path)?) {
            Ok(_) => Ok(true),
            Err(e) if e.what == What::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl Workspace {
    /// Runs a shell command in the workspace's sandbox (`layerfs run`:
    /// the workspace at `/workspace`, the rest of the host read-only, the
    /// policy enforced by the mount), killed with everything it started
    /// after `timeout` seconds, its output cut at `max_output` bytes.
    /// An unmounted workspace is lent to `layerfs run` for the command's
    /// duration: the in-process core is stopped (its locks released, its
    /// journal flushed), `run` mounts, runs and unmounts, and the core is
    /// started again; the other calls wait meanwhile. A mounted one is
    /// run in through its mount. Journaled as an `exec` row naming
    /// `CLIENT:execute`, the command and its exit code.
    pub fn execute(&self, req: &ExecuteRequest) -> Result<ExecuteResult> {
        if self.read_only {
            return Err(ToolError::new("execute", What::ReadOnly));
        }
        exec::check(req)?;
        let result = self.lent(|| exec::run(&self.target, req));
        if let (Ok(r), Some(db)) = (&result, &self.journal_db) {
            let comm = format!("{}:execute", self.client);
            let what = exec::shown(&req.command);
            let code = r.exit_code.max(0) as u64;
            if let Err(e) = crate::state::journal::record_as(
                db,
                crate::overlay::events::EvOp::Exec,
                &what,
                code,
                &comm,
            ) {
                tracing::warn!("execute: not recorded in the journal: {e}");
            }
        }
        result
    }
}
