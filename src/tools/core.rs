//! The tools on an unmounted workspace: the overlay core in this process.
//!
//! Invariant (one core per upper, `daemon::exclusive`): a `CoreStore`
//! holds the upper's and the work dir's locks, exactly as a mount's
//! daemon does, for as long as it lives; a mount of the workspace meanwhile
//! is refused naming this process, and this process never opens a core
//! on an upper a daemon serves (`Workspace::open` attaches to that mount
//! instead).
//!
//! Every object the core hands out counts one lookup, as the kernel's
//! would; `Held` gives it back (`forget`) when the call is done, so the
//! inode table holds nothing between calls.

use std::ffi::OsStr;
use std::sync::Arc;

use super::error::{Result, ToolError, What};
use super::path::RelPath;
use super::store::{Meta, Store};
use crate::daemon::exclusive::Claim;
use crate::layer::sys::{self, Stat};
use crate::overlay::dir::NewKind;
use crate::overlay::events::{self, EvOp, Event, Note, Sink};
use crate::overlay::{Ctx, Errno, Overlay, ROOT_ID};
use crate::state::journal::Journal;

/// Bytes per core read or write call (the most a FUSE request carries).
const CHUNK: usize = 1 << 20;

pub(crate) struct CoreStore {
    ov: Overlay,
    ctx: Ctx,
    /// The journal, when the workspace has a state dir.
    journal: Option<Arc<Journal>>,
    /// Who the journal's rows name as the caller (`CLIENT:TOOL`).
    client: String,
    // Dropped last: the locks outlive the core.
    _claim: Claim,
}

/// One counted lookup of object `id`, given back on drop.
struct Held<'a> {
    ov: &'a Overlay,
    id: u64,
    st: Stat,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.id != ROOT_ID {
            self.ov.forget(self.id, 1);
        }
    }
}

impl Held<'_> {
    fn is(&self, kind: u32) -> bool {
        self.st.st_mode & libc::S_IFMT == kind
    }
}

impl CoreStore {
    pub fn new(ov: Overlay, claim: Claim, journal: Option<Arc<Journal>>, client: &str) -> Self {
        let ctx = Ctx {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
            pid: std::process::id(),
            umask: 0o022,
        };
        CoreStore {
            ov,
            ctx,
            journal,
            client: client.to_string(),
            _claim: claim,
        }
    }

    /// Walks `p` from the root, name by name; a symlink or a file before
    /// the last name ends the walk.
    fn walk(&self, p: &RelPath) -> Result<Held<'_>> {
        let (st, _) = self
            .ov
            .getattr(ROOT_ID, None)
            .map_err(|e| fail(p, e, None))?;
        let mut cur = Held {
            ov: &self.ov,
            id: ROOT_ID,
            st,
        };
        for seg in p.segments() {
            if cur.is(libc::S_IFLNK) {
                return Err(ToolError::new(p, What::Symlink));
            }
            if !cur.is(libc::S_IFDIR) {
                return Err(ToolError::new(p, What::NotADirectory));
            }
            let e = self
                .ov
                .lookup(&self.ctx, cur.id, OsStr::new(seg))
                .map_err(|e| fail(p, e, None))?;
            cur = Held {
                ov: &self.ov,
                id: e.id,
                st: e.st,
            };
        }
        Ok(cur)
    }

    /// The directory that holds `p`, and `p`'s last name.
    fn parent<'p>(&self, p: &'p RelPath) -> Result<(Held<'_>, &'p str)> {
        let (dir, name) = p
            .split_last()
            .ok_or_else(|| ToolError::new(p, What::BadPath("the workspace root itself")))?;
        let d = self.walk(&dir).map_err(|e| e.about(p))?;
        if d.is(libc::S_IFLNK) {
            return Err(ToolError::new(p, What::Symlink));
        }
        if !d.is(libc::S_IFDIR) {
            return Err(ToolError::new(p, What::NotADirectory));
        }
        Ok((d, name))
    }

    /// Ends a change: takes what the core noted (copy-ups, the rule of a
    /// denial), journals the rows, and turns a failure into the error.
    fn done<T>(
        &self,
        tool: &str,
        rows: &[(EvOp, Option<u64>)],
        p: &RelPath,
        to: Option<&RelPath>,
        r: crate::overlay::Result<T>,
    ) -> Result<T> {
        let mut rule = None;
        let comm: Arc<str> = Arc::from(format!("{}:{tool}", self.client));
        let now = std::time::SystemTime::now();
        let event = |op, path: String, to: Option<String>, errno, bytes, rule| Event {
            time: now,
            op,
            path,
            to,
            errno,
            bytes,
            pid: self.ctx.pid,
            uid: self.ctx.uid,
            gid: self.ctx.gid,
            comm: comm.clone(),
            rule,
        };
        for n in events::take_notes() {
            match n {
                Note::CopyUp { path } => {
                    if let Some(j) = &self.journal {
                        j.record(event(EvOp::CopyUp, path, None, 0, None, None));
                    }
                }
                Note::Denied { rule: r, .. } => rule = Some(r),
            }
        }
        let errno = r.as_ref().err().map_or(0, |e| e.0);
        if let Some(j) = &self.journal {
            for (op, bytes) in rows {
                let to = to.map(|t| t.as_str().to_string());
                let ev = event(*op, p.as_str().to_string(), to, errno, *bytes, rule.clone());
                j.record(ev);
            }
        }
        r.map_err(|e| fail(p, e, rule))
    }
}

impl Drop for CoreStore {
    /// The journal's rows are written by its own thread: they are all on
    /// disk before the process that made them goes on (or exits).
    fn drop(&mut self) {
        if let Some(j) = &self.journal {
            j.flush(std::time::Duration::from_secs(5));
        }
    }
}

fn fail(p: &RelPath, e: Errno, rule: Option<String>) -> ToolError {
    ToolError::errno(p, e.0, rule)
}

impl Store for CoreStore {
    fn stat(&self, p: &RelPath) -> Result<Meta> {
        Ok(Meta::of(&self.walk(p)?.st))
    }

    fn list(&self, p: &RelPath) -> Result<Vec<(String, Meta)>> {
        let dir = self.walk(p)?;
        if dir.is(libc::S_IFLNK) {
            return Err(ToolError::new(p, What::Symlink));
        }
        if !dir.is(libc::S_IFDIR) {
            return Err(ToolError::new(p, What::NotADirectory));
        }
        let (_, entries) = self
            .ov
            .dir_listing(dir.id, 0)
            .map_err(|e| fail(p, e, None))?;
        let mut out = Vec::with_capacity(entries.len());
        for e in entries.iter() {
            // A name gone since the listing is left out.
            if let Ok(child) = self.ov.lookup(&self.ctx, dir.id, &e.name) {
                let held = Held {
                    ov: &self.ov,
                    id: child.id,
                    st: child.st,
                };
                out.push((e.name.to_string_lossy().into_owned(), Meta::of(&held.st)));
            }
        }
        Ok(out)
    }

    fn read_range(&self, p: &RelPath, offset: u64, limit: u64) -> Result<Vec<u8>> {
        let f = self.walk(p)?;
        if f.is(libc::S_IFLNK) {
            return Err(ToolError::new(p, What::Symlink));
        }
        if f.is(libc::S_IFDIR) {
            return Err(ToolError::new(p, What::IsADirectory));
        }
        let o = self
            .ov
            .open(&self.ctx, f.id, libc::O_RDONLY)
            .map_err(|e| fail(p, e, None))?;
        let left = (f.st.st_size.max(0) as u64).saturating_sub(offset);
        let mut data = Vec::with_capacity(left.min(limit) as usize);
        let r = loop {
            let want = (limit - data.len() as u64).min(CHUNK as u64) as u32;
            if want == 0 {
                break Ok(());
            }
            match self.ov.read(o.fh, offset + data.len() as u64, want) {
                Ok(b) if b.is_empty() => break Ok(()),
                Ok(b) => data.extend_from_slice(&b),
                Err(e) => break Err(fail(p, e, None)),
            }
        };
        self.ov.release(o.fh);
        r.map(|()| data)
    }

    fn create(&self, tool: &str, p: &RelPath, data: &[u8], mode: u32) -> Result<()> {
        let (dir, name) = self.parent(p)?;
        let _pass = self.ov.gate().enter();
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
        let made = self.ov.files().charge(self.ctx.uid).and_then(|charge| {
            let kind = NewKind::File { mode, flags };
            let (entry, fd) = self
                .ov
                .create_object(&self.ctx, dir.id, OsStr::new(name), kind)?;
            Ok((entry, fd, charge))
        });
        let (entry, fd, charge) = self.done(tool, &[(EvOp::Create, None)], p, None, made)?;
        let _held = Held {
            ov: &self.ov,
            id: entry.id,
            st: entry.st,
        };
        let fd = fd.ok_or_else(|| ToolError::new(p, What::Io(libc::EIO)))?;
        let written = self.ov.adopt(entry.id, fd, flags, charge).and_then(|o| {
            let mut r = Ok(());
            for (i, chunk) in data.chunks(CHUNK).enumerate() {
                if let Err(e) = self.ov.write(o.fh, (i * CHUNK) as u64, chunk) {
                    r = Err(e);
                    break;
                }
            }
            self.ov.release(o.fh);
            r
        });
        let bytes = Some(data.len() as u64);
        self.done(tool, &[(EvOp::Write, bytes)], p, None, written)
    }

    fn remove(&self, tool: &str, p: &RelPath, is_dir: bool) -> Result<()> {
        let (dir, name) = self.parent(p)?;
        let _pass = self.ov.gate().enter();
        let name = OsStr::new(name);
        let (op, r) = if is_dir {
            (EvOp::Rmdir, self.ov.rmdir(&self.ctx, dir.id, name))
        } else {
            (EvOp::Unlink, self.ov.unlink(&self.ctx, dir.id, name))
        };
        self.done(tool, &[(op, None)], p, None, r)
    }

    fn rename(&self, tool: &str, from: &RelPath, to: &RelPath, noreplace: bool) -> Result<()> {
        let (fdir, fname) = self.parent(from)?;
        let (tdir, tname) = self.parent(to)?;
        let _pass = self.ov.gate().enter();
        let flags = if noreplace { sys::RENAME_NOREPLACE } else { 0 };
        let r = self.ov.rename(
            &self.ctx,
            fdir.id,
            OsStr::new(fname),
            tdir.id,
            OsStr::new(tname),
            flags,
        );
        self.done(tool, &[(EvOp::Rename, None)], from, Some(to), r)
    }

    fn mkdir(&self, tool: &str, p: &RelPath) -> Result<()> {
        let (dir, name) = self.parent(p)?;
        let _pass = self.ov.gate().enter();
        let kind = NewKind::Dir { mode: 0o777 };
        let r = self
            .ov
            .create_object(&self.ctx, dir.id, OsStr::new(name), kind);
        let (entry, _) = self.done(tool, &[(EvOp::Mkdir, None)], p, None, r)?;
        drop(Held {
            ov: &self.ov,
            id: entry.id,
            st: entry.st,
        });
        Ok(())
    }
}
