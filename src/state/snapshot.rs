//! Snapshots: a tar of the upper directory in the state dir's `snapshots/`,
//! and restoring one as the upper.
//!
//! What an archive keeps, per object of the upper (walked without ever
//! following a symlink): its type (directory, regular file, symlink, hard
//! link to an earlier entry, character/block device — the 0/0 whiteouts —
//! and fifo; sockets are skipped with a warning), permission bits with
//! setuid/setgid/sticky, numeric owner and group, mtime and atime to the
//! nanosecond (PAX `mtime`/`atime` records; the ustar header keeps whole
//! seconds for other tools), every xattr the caller can read of
//! directories, files, devices and fifos (PAX `SCHILY.xattr.NAME` records,
//! as GNU tar writes them, or `LAYERFS.xattr.hex.NAME` for a value holding
//! a newline, which the tar reader could not read back: this includes the
//! overlay's `opaque`/`redirect` marks and POSIX ACLs; a symlink's own
//! xattrs are not kept), symlink
//! targets, device numbers, and the holes of sparse files (GNU sparse
//! entries; a restored file has the same holes). Not kept: ctime (no one
//! can set it) and the inode numbers. Paths matching the workspace's
//! scratch globs are left out (a matching directory with everything
//! beneath it).
//!
//! Invariants:
//! - The state dir and `snapshots/` are checked directories
//!   (`layer::safedir`): every snapshot file is opened, created, renamed
//!   and removed through their descriptors, never through a path another
//!   user could redirect.
//! - A snapshot file `ID.tar` is complete or absent: it is written as
//!   `.ID.tar.tmp`, fsynced, renamed into place and the directory fsynced.
//!   A `.ID.tar.tmp` is held with `flock` while its save runs, so a later
//!   save removes any unlocked leftover (a killed save) and never mistakes
//!   a running save's file for one. `list` shows only `*.tar` names whose
//!   stem is a valid ID (never a dot file).
//! - Save and extraction walk iteratively and reach every object relative
//!   to its parent directory's descriptor (`Chain`), so a tree deeper than
//!   `PATH_MAX` (or than the open-file limit) is archived and restored
//!   whole, and no symlink inside it is ever followed.
//! - `restore` never modifies the upper in place: the archive is extracted
//!   into a staging directory on the upper's filesystem, synced, and
//!   exchanged with the upper by one `renameat2(RENAME_EXCHANGE)`; before
//!   the exchange the upper is untouched, after it the upper is the whole
//!   restored tree. The old tree is removed afterwards (a crash leaves it
//!   in the work dir, which `mount` cleans).
//! - An archive is untrusted input (it may come from another host, or have
//!   been replaced): before anything is extracted a pass over its headers
//!   (`prescan`) bounds the metadata any one entry carries (`META_LIMIT`),
//!   and checks its entries and data fit the workspace's quota and the
//!   upper's free space; extraction creates every object itself beneath the
//!   staging dir, and an entry whose path is absolute, has a `..`
//!   component, lies under anything but a directory extracted before it,
//!   repeats an earlier name, or is a hard link to anything but a
//!   non-directory extracted before it, fails the restore (the upper stays
//!   as it was).
//! - The restored tree holds only what the workspace's policy lets the
//!   mount create (`Policy`): no device node but the overlay's 0/0
//!   whiteouts unless `devices allow`; no setuid/setgid bit on anything but
//!   a directory, and no file capability, unless `suid allow`; no symlink
//!   the `symlinks` rule refuses; of the private xattrs only the overlay's
//!   own marks, each on the kind of object it belongs to and in the form
//!   its reader parses (`ops::is_valid_redirect`, `Origin::is_valid`, …);
//!   no other `trusted.*`, `security.*` or `system.*` xattr but POSIX
//!   ACLs; owners only as the restoring user may set them; the upper
//!   root's own mode and owner unchanged. Every entry left out or changed
//!   is reported by name (`Report`).

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::hash::BuildHasher;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::scratch::Scratch;

use super::snapshot_id;
use crate::layer::ops::{self, PRIVATE_PREFIXES};
use crate::layer::safedir::{Role, SafeDir};
use crate::layer::sys;
use crate::overlay::origin::{Origin, MOVED_IN_VALUE, MOVED_IN_XATTR, ORIGIN_XATTR};
use crate::policy::Policy;

const PAX_XATTR: &str = "SCHILY.xattr.";
/// An xattr whose value holds a newline, hex-encoded: the tar reader
/// splits PAX records at newlines, so `SCHILY.xattr.NAME` with such a
/// value (a POSIX ACL naming uid 10, say) could not be read back. Other
/// tools skip the record and lose only that xattr.
const PAX_XATTR_HEX: &str = "LAYERFS.xattr.hex.";
const IO_BUF: usize = 1 << 20;
/// Most bytes of metadata (one PAX record set, one long name or link
/// name) a single entry may carry. Such records are read whole into
/// memory, so this bounds what an archive can make a restore allocate; a
/// path deeper than `PATH_MAX` (tens of KiB) or a file's xattrs (64 KiB
/// each at most) stay far below it.
pub const META_LIMIT: u64 = 8 << 20;
/// Directories along a walk that keep an open descriptor (`Chain`).
const WINDOW: usize = 64;
/// Changes a `Report` lists by name; beyond this they are only counted.
const MAX_LISTED: usize = 1000;
/// The name of `snapshots/` in the state dir.
const SNAPSHOTS: &str = "snapshots";
/// Name prefix of the staging directories a restore extracts into (the
/// daemon's live restore checks the names it is given against it).
pub const STAGING_PREFIX: &str = ".layerfs-restore.";

/// The `snapshots/` directory of a state dir (for messages).
pub fn dir(state: &Path) -> PathBuf {
    state.join(SNAPSHOTS)
}

/// Path of snapshot `id` (a validated ID) in a state dir (for messages).
pub fn path(state: &Path, id: &str) -> PathBuf {
    dir(state).join(file_name(id))
}

fn file_name(id: &str) -> String {
    format!("{id}.tar")
}

fn tmp_name(id: &str) -> String {
    format!(".{id}.tar.tmp")
}

/// `snapshots/` in the checked state dir, itself checked; created (0700)
/// when `create`, else `None` when missing.
pub fn snapshots_dir(state: &SafeDir, create: bool) -> Result<Option<SafeDir>, String> {
    state.subdir(SNAPSHOTS, Role::Snapshots, create.then_some(0o700))
}

/// Options of a save.
pub struct SaveOptions {
    /// Paths left out: the workspace's scratch paths.
    pub exclude: Scratch,
    /// Replace an existing snapshot of the same ID.
    pub force: bool,
    /// Show a progress bar on stderr (a terminal).
    pub progress: bool,
}

/// What one snapshot holds, for `list` and for reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    pub id: String,
    /// Archive size in bytes.
    pub size: u64,
    /// When the snapshot was completed (the file's mtime), Unix seconds.
    pub time: i64,
    /// Archive entries (objects of the upper, the root included).
    pub entries: Option<u64>,
}

impl Info {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "size": self.size,
            "time": snapshot_id::rfc3339(self.time),
            "entries": self.entries,
        })
    }
}

fn ctx(what: impl std::fmt::Display) -> impl FnOnce(io::Error) -> String {
    move |e| {
        let hint = match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => " (no space left: free some and retry)",
            Some(libc::EACCES) | Some(libc::EPERM) => {
                " (permission denied: run as the workspace's owner)"
            }
            Some(libc::EROFS) => " (read-only filesystem)",
            _ => "",
        };
        format!("{what}: {e}{hint}")
    }
}

fn flock(f: &File, op: libc::c_int) -> io::Result<()> {
    crate::sys::flock(f, op)
}

/// Removes leftovers of killed saves: `.ID.tar.tmp` files no running save
/// holds locked.
fn remove_stale_tmps(d: &SafeDir) {
    let Ok(entries) = d.read_dir() else { return };
    for e in entries {
        let b = e.name.as_bytes();
        if !(b.starts_with(b".") && b.ends_with(b".tar.tmp")) {
            continue;
        }
        let Ok(f) = d.open_file(&e.name, libc::O_RDONLY, 0) else {
            continue;
        };
        if flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
            let _ = d.remove_file(&e.name);
        }
    }
}

/// Whether snapshot `id` exists.
pub fn exists(state: &SafeDir, id: &str) -> bool {
    matches!(snapshots_dir(state, false), Ok(Some(d)) if d.stat(file_name(id)).is_ok())
}

/// Writes snapshot `id` of the upper into the checked state dir. The
/// caller holds whatever makes the upper still (the daemon's write pause,
/// or no mount) for the duration of the call.
pub fn save(upper: &Path, state: &SafeDir, id: &str, opts: &SaveOptions) -> Result<Info, String> {
    snapshot_id::validate(OsStr::new(id))?;
    let d = snapshots_dir(state, true)?
        .ok_or_else(|| format!("cannot create {}", dir(state.path()).display()))?;
    let final_name = file_name(id);
    let final_path = d.shown(&final_name);
    if !opts.force && d.stat(&final_name).is_ok() {
        return Err(format!(
            "snapshot `{id}` already exists ({}): choose another ID, remove it first \
             (layerfs snapshot rm WORKSPACE {id}) or pass --force",
            final_path.display()
        ));
    }
    remove_stale_tmps(&d);
    let tmp = tmp_name(id);
    let tmp_path = d.shown(&tmp);
    let f = d
        .open_file(&tmp, libc::O_WRONLY | libc::O_CREAT, 0o600)
        .map_err(ctx(format!("cannot create {}", tmp_path.display())))?;
    flock(&f, libc::LOCK_EX | libc::LOCK_NB).map_err(|_| {
        format!(
            "another `snapshot save` of `{id}` is running (it holds {}); wait for it to finish",
            tmp_path.display()
        )
    })?;
    // Invariant: from here on, every failure removes the temporary file.
    let result = (|| -> Result<u64, String> {
        f.set_len(0)
            .map_err(ctx(format!("cannot truncate {}", tmp_path.display())))?;
        let bar = progress_bar(opts.progress, None, &format!("saving {id}"));
        let out = BufWriter::with_capacity(IO_BUF, bar.wrap_write(EarlyWriteback::new(&f)));
        let (out, entries) = write_archive(upper, out, &opts.exclude)?;
        let inner = out
            .into_inner()
            .map_err(|e| ctx(format!("cannot write {}", tmp_path.display()))(e.into_error()))?;
        drop(inner);
        bar.finish_and_clear();
        f.sync_all()
            .map_err(ctx(format!("cannot sync {}", tmp_path.display())))?;
        Ok(entries)
    })();
    let entries = match result {
        Ok(n) => n,
        Err(e) => {
            let _ = d.remove_file(&tmp);
            return Err(e);
        }
    };
    let flags = if opts.force { 0 } else { sys::RENAME_NOREPLACE };
    if let Err(e) = d.rename(&tmp, &final_name, flags) {
        let _ = d.remove_file(&tmp);
        if e.raw_os_error() == Some(libc::EEXIST) {
            return Err(format!(
                "snapshot `{id}` was created by someone else meanwhile; choose another ID or pass --force"
            ));
        }
        return Err(ctx(format!(
            "cannot rename {} into place",
            tmp_path.display()
        ))(e));
    }
    d.sync()
        .map_err(ctx(format!("cannot sync {}", d.path().display())))?;
    drop(f);
    let mut info = info_in(&d, id)?;
    info.entries = Some(entries);
    Ok(info)
}

/// A file writer that starts the disk writes of what it has written every
/// few MiB (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which does not wait),
/// so the final fsync finds little left to write: disk writes overlap the
/// walk instead of following it.
struct EarlyWriteback<'a> {
    f: &'a File,
    written: u64,
    started: u64,
}

impl<'a> EarlyWriteback<'a> {
    const STEP: u64 = 8 << 20;

    fn new(f: &'a File) -> Self {
        EarlyWriteback {
            f,
            written: 0,
            started: 0,
        }
    }
}

impl Write for EarlyWriteback<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = (&mut &*self.f).write(buf)?;
        self.written += n as u64;
        if self.written - self.started >= Self::STEP {
            // A failure only loses the head start (fsync follows anyway).
            let _ = crate::sys::start_writeback(self.f, self.started, self.written - self.started);
            self.started = self.written;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn progress_bar(show: bool, total: Option<u64>, msg: &str) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = match total {
        Some(n) => indicatif::ProgressBar::new(n).with_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        ),
        None => indicatif::ProgressBar::new_spinner().with_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {msg}: {bytes} {bytes_per_sec} {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        ),
    };
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    bar.set_message(msg.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

/// The directories from a root down to the current one of a walk, each
/// reached from its parent by name (`openat2` beneath it, no symlink
/// followed) and known by (device, inode). Only the deepest `WINDOW` keep
/// a descriptor, so a tree deeper than the open-file limit can be walked;
/// a level whose descriptor was closed is reopened from the nearest open
/// ancestor and must still be the same directory. Each level carries the
/// walk's own data `M`.
struct Chain<M> {
    root: OwnedFd,
    root_meta: M,
    levels: Vec<Level<M>>,
    /// The current directory's path relative to the root, `/`-joined.
    path: Vec<u8>,
}

struct Level<M> {
    name: OsString,
    fd: Option<OwnedFd>,
    id: (u64, u64),
    meta: M,
}

impl<M> Chain<M> {
    fn new(root: OwnedFd, root_meta: M) -> Chain<M> {
        Chain {
            root,
            root_meta,
            levels: Vec::new(),
            path: Vec::new(),
        }
    }

    fn depth(&self) -> usize {
        self.levels.len()
    }

    /// Enters `name`, whose descriptor is `fd`.
    fn push(&mut self, name: OsString, fd: OwnedFd, meta: M) -> io::Result<()> {
        let st = sys::fstat(&fd)?;
        if !self.levels.is_empty() {
            self.path.push(b'/');
        }
        self.path.extend_from_slice(name.as_bytes());
        self.levels.push(Level {
            name,
            fd: Some(fd),
            id: (st.st_dev, st.st_ino),
            meta,
        });
        let n = self.levels.len();
        if n > WINDOW {
            self.levels[n - 1 - WINDOW].fd = None;
        }
        Ok(())
    }

    /// Leaves the current directory for its parent.
    fn pop(&mut self) -> Option<Level<M>> {
        let l = self.levels.pop()?;
        let keep = if self.levels.is_empty() {
            0
        } else {
            self.path.len() - l.name.len() - 1
        };
        self.path.truncate(keep);
        Some(l)
    }

    /// The walk's data of the current directory.
    fn meta_mut(&mut self) -> &mut M {
        match self.levels.last_mut() {
            Some(l) => &mut l.meta,
            None => &mut self.root_meta,
        }
    }

    /// The current directory's descriptor (reopened if it was closed).
    fn fd(&mut self) -> io::Result<&OwnedFd> {
        let n = self.levels.len();
        if n == 0 {
            return Ok(&self.root);
        }
        if self.levels[n - 1].fd.is_none() {
            self.reopen()?;
        }
        self.levels[n - 1]
            .fd
            .as_ref()
            .ok_or_else(|| io::Error::other("directory descriptor lost"))
    }

    fn reopen(&mut self) -> io::Result<()> {
        let n = self.levels.len();
        let from = self
            .levels
            .iter()
            .rposition(|l| l.fd.is_some())
            .map_or(0, |i| i + 1);
        for k in from..n {
            let fd = {
                let parent = if k == 0 {
                    &self.root
                } else {
                    self.levels[k - 1]
                        .fd
                        .as_ref()
                        .ok_or_else(|| io::Error::other("directory descriptor lost"))?
                };
                sys::open_beneath(
                    parent,
                    &self.levels[k].name,
                    libc::O_PATH | libc::O_DIRECTORY,
                    0,
                )?
            };
            let st = sys::fstat(&fd)?;
            if (st.st_dev, st.st_ino) != self.levels[k].id {
                return Err(io::Error::other(
                    "a directory was replaced while being walked",
                ));
            }
            self.levels[k].fd = Some(fd);
            // Only the window stays open (the parent was needed for this one).
            if k > 0 && k - 1 + WINDOW < n {
                self.levels[k - 1].fd = None;
            }
        }
        Ok(())
    }
}

/// `parent/name` as a relative path (`parent` `/`-joined, "" the root).
fn child_rel(parent: &[u8], name: &OsStr) -> PathBuf {
    let mut b = parent.to_vec();
    if !b.is_empty() {
        b.push(b'/');
    }
    b.extend_from_slice(name.as_bytes());
    PathBuf::from(OsStr::from_bytes(&b))
}

/// The names in a directory, sorted in reverse (the walk pops the first).
fn names_rev(fd: &OwnedFd, shown: &Path) -> Result<Vec<OsString>, String> {
    let mut names: Vec<OsString> = sys::read_dir(fd)
        .map_err(ctx(format!("cannot list {}", shown.display())))?
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort_unstable_by(|a, b| b.cmp(a));
    Ok(names)
}

/// Writes the tar of `upper` to `out`: the root as `./`, then every object
/// depth-first in name order, a directory before what it holds. Returns the
/// writer and the number of entries. Iterative, every object reached
/// relative to its parent's descriptor (`Chain`).
pub fn write_archive<W: Write>(
    upper: &Path,
    out: W,
    exclude: &Scratch,
) -> Result<(W, u64), String> {
    let mut w = ArchiveWriter {
        b: tar::Builder::new(out),
        upper: upper.to_path_buf(),
        links: HashMap::new(),
        entries: 0,
    };
    w.b.mode(tar::HeaderMode::Complete);
    w.b.follow_symlinks(false);
    w.b.sparse(true);
    let root =
        sys::open_root(upper).map_err(ctx(format!("cannot open upper dir {}", upper.display())))?;
    let root_file = File::from(
        root.try_clone()
            .map_err(ctx(format!("cannot open upper dir {}", upper.display())))?,
    );
    let meta = root_file
        .metadata()
        .map_err(ctx(format!("cannot stat upper dir {}", upper.display())))?;
    if !meta.is_dir() {
        return Err(format!("upper {} is not a directory", upper.display()));
    }
    w.dir(&root_file, Path::new(""), &meta)?;
    let names = names_rev(&root, upper)?;
    let mut chain = Chain::new(root, names);
    loop {
        let Some(name) = chain.meta_mut().pop() else {
            if chain.pop().is_none() {
                break;
            }
            continue;
        };
        let rel = child_rel(&chain.path, &name);
        if exclude.matches_os(rel.as_os_str()) {
            continue;
        }
        let full = w.full(&rel);
        let parent = chain.fd().map_err(ctx(format!(
            "cannot reopen the directory of {}",
            full.display()
        )))?;
        let f = match sys::open_path(parent, &name) {
            Ok(fd) => File::from(fd),
            // Removed from outside meanwhile (only possible when the
            // upper is changed behind the mount's back).
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(ctx(format!("cannot open {}", full.display()))(e)),
        };
        let m = f
            .metadata()
            .map_err(ctx(format!("cannot stat {}", full.display())))?;
        if m.is_dir() {
            w.dir(&f, &rel, &m)?;
            let fd = OwnedFd::from(f);
            let names = names_rev(&fd, &full)?;
            chain
                .push(name, fd, names)
                .map_err(ctx(format!("cannot stat {}", full.display())))?;
        } else {
            w.non_dir(&f, &rel, &m)?;
        }
    }
    w.b.finish().map_err(ctx("cannot finish the archive"))?;
    let n = w.entries;
    let out = w.b.into_inner().map_err(ctx("cannot finish the archive"))?;
    Ok((out, n))
}

struct ArchiveWriter<W: Write> {
    b: tar::Builder<W>,
    upper: PathBuf,
    /// (dev, ino) of multiply-linked objects → their first path.
    links: HashMap<(u64, u64), PathBuf>,
    entries: u64,
}

/// Name of an object in the archive: `./` for the root, `rel` below.
fn archive_name(rel: &Path) -> PathBuf {
    if rel.as_os_str().is_empty() {
        PathBuf::from("./")
    } else {
        rel.to_path_buf()
    }
}

fn header_for(meta: &std::fs::Metadata) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_metadata_in_mode(meta, tar::HeaderMode::Complete);
    // Seconds before 1970 do not fit the header: the PAX record has them.
    if meta.mtime() < 0 {
        h.set_mtime(0);
    }
    h
}

fn time_record(secs: i64, nsec: i64) -> Vec<u8> {
    format!("{secs}.{nsec:09}").into_bytes()
}

impl<W: Write> ArchiveWriter<W> {
    /// The object's path, for messages.
    fn full(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() {
            self.upper.clone()
        } else {
            self.upper.join(rel)
        }
    }

    /// The PAX records of an object: its times and xattrs.
    fn pax(
        &mut self,
        rel: &Path,
        meta: &std::fs::Metadata,
        xattrs: Vec<(OsString, Vec<u8>)>,
    ) -> Result<(), String> {
        let mut recs: Vec<(String, Vec<u8>)> = vec![
            ("mtime".into(), time_record(meta.mtime(), meta.mtime_nsec())),
            ("atime".into(), time_record(meta.atime(), meta.atime_nsec())),
        ];
        for (name, value) in xattrs {
            match name.to_str() {
                Some(n) if value.contains(&b'\n') => {
                    let hex: String = value.iter().map(|b| format!("{b:02x}")).collect();
                    recs.push((format!("{PAX_XATTR_HEX}{n}"), hex.into_bytes()))
                }
                Some(n) => recs.push((format!("{PAX_XATTR}{n}"), value)),
                None => eprintln!(
                    "layerfs snapshot: warning: xattr {:?} of {} is not UTF-8 and is not saved",
                    name,
                    self.full(rel).display()
                ),
            }
        }
        self.b
            .append_pax_extensions(recs.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
            .map_err(ctx("cannot write the archive"))
    }

    /// A directory's own entry (`f` is an `O_PATH` descriptor of it).
    fn dir(&mut self, f: &File, rel: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
        let full = self.full(rel);
        let mut xattrs = read_xattrs(f, &full)?;
        // Where the state lives is the place's, not the workspace's.
        xattrs.retain(|(n, _)| !crate::state::place::is_record(n.as_bytes()));
        self.pax(rel, meta, xattrs)?;
        let mut h = header_for(meta);
        h.set_size(0);
        self.b
            .append_data(&mut h, archive_name(rel), io::empty())
            .map_err(ctx(format!("cannot archive {}", full.display())))?;
        self.entries += 1;
        Ok(())
    }

    /// Anything but a directory (`f` is an `O_PATH` descriptor of it,
    /// opened without following a symlink).
    fn non_dir(&mut self, f: &File, rel: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
        let full = self.full(rel);
        let name = archive_name(rel);
        if meta.nlink() > 1 {
            if let Some(first) = self.links.get(&(meta.dev(), meta.ino())) {
                let mut h = tar::Header::new_gnu();
                h.set_metadata_in_mode(meta, tar::HeaderMode::Complete);
                h.set_entry_type(tar::EntryType::Link);
                h.set_size(0);
                let first = archive_name(first);
                self.b
                    .append_link(&mut h, &name, &first)
                    .map_err(ctx(format!("cannot archive {}", full.display())))?;
                self.entries += 1;
                return Ok(());
            }
            self.links
                .insert((meta.dev(), meta.ino()), rel.to_path_buf());
        }
        let ft = meta.file_type();
        use std::os::unix::fs::FileTypeExt;
        if ft.is_file() {
            // The same inode, opened for reading through its descriptor.
            let mut data =
                reopen_for_reading(f).map_err(ctx(format!("cannot open {}", full.display())))?;
            let fm = data
                .metadata()
                .map_err(ctx(format!("cannot stat {}", full.display())))?;
            let xattrs = read_xattrs(&data, &full)?;
            self.pax(rel, &fm, xattrs)?;
            let changed = || {
                format!(
                    "{} changed size while being archived (the upper was modified outside the mount); retry",
                    full.display()
                )
            };
            if fm.blocks() * 512 < fm.len() && fm.mtime() >= 0 {
                // Sparse: the tar crate writes the data map (SEEK_DATA/HOLE)
                // and reads each data extent; the header has the size.
                self.b
                    .append_file(&name, &mut data)
                    .map_err(ctx(format!("cannot archive {}", full.display())))?;
                let now = data.metadata().map(|m| m.len()).unwrap_or(0);
                if now != fm.len() {
                    return Err(changed());
                }
            } else {
                // Exactly the size in the header, whatever happens to the
                // file meanwhile: the archive stays well-formed.
                let mut h = header_for(&fm);
                let mut exact = ExactReader {
                    inner: (&data).take(fm.len()),
                    short: false,
                };
                self.b
                    .append_data(&mut h, &name, &mut exact)
                    .map_err(ctx(format!("cannot archive {}", full.display())))?;
                if exact.short {
                    return Err(changed());
                }
            }
        } else if ft.is_symlink() {
            let target = sys::readlink_fd(f)
                .map_err(ctx(format!("cannot read symlink {}", full.display())))?;
            self.pax(rel, meta, Vec::new())?;
            let mut h = header_for(meta);
            h.set_size(0);
            self.b
                .append_link(&mut h, &name, &target)
                .map_err(ctx(format!("cannot archive {}", full.display())))?;
        } else if ft.is_char_device() || ft.is_block_device() || ft.is_fifo() {
            let xattrs = read_xattrs(f, &full)?;
            self.pax(rel, meta, xattrs)?;
            let mut h = header_for(meta);
            h.set_size(0);
            let rdev = meta.rdev();
            h.set_device_major(libc::major(rdev))
                .and_then(|_| h.set_device_minor(libc::minor(rdev)))
                .map_err(ctx(format!("cannot archive {}", full.display())))?;
            self.b
                .append_data(&mut h, &name, io::empty())
                .map_err(ctx(format!("cannot archive {}", full.display())))?;
        } else {
            eprintln!(
                "layerfs snapshot: warning: {} is a socket and is not saved",
                full.display()
            );
            return Ok(());
        }
        self.entries += 1;
        Ok(())
    }
}

/// Yields exactly the bytes its `Take` allows, zero-filled (and flagged)
/// if the file ends early.
struct ExactReader<R: Read> {
    inner: io::Take<R>,
    short: bool,
}

impl<R: Read> Read for ExactReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (self.inner.limit() as usize).min(buf.len());
        if want == 0 {
            return Ok(0);
        }
        match self.inner.read(&mut buf[..want])? {
            0 => {
                self.short = true;
                buf[..want].fill(0);
                self.inner.set_limit(self.inner.limit() - want as u64);
                Ok(want)
            }
            n => Ok(n),
        }
    }
}

/// Opens the regular file behind the `O_PATH` descriptor `f` for reading
/// (the same inode: through `/proc/self/fd`), without touching its atime
/// where the caller may.
fn reopen_for_reading(f: &File) -> io::Result<File> {
    match sys::reopen(f, libc::O_RDONLY | libc::O_NOATIME) {
        // O_NOATIME needs ownership of the file.
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => sys::reopen(f, libc::O_RDONLY),
        r => r,
    }
    .map(File::from)
}

/// Every xattr of the object behind `fd` (any descriptor, `O_PATH`
/// included; never a symlink), in name order.
fn read_xattrs(fd: &impl AsRawFd, p: &Path) -> Result<Vec<(OsString, Vec<u8>)>, String> {
    let err = |e: io::Error| format!("cannot read xattrs of {}: {e}", p.display());
    let mut out = Vec::new();
    let list = match sys::listxattr(fd) {
        Ok(l) => l,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(out),
        Err(e) => return Err(err(e)),
    };
    for n in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = CString::new(n).map_err(|_| format!("bad xattr name of {}", p.display()))?;
        match sys::getxattr(fd, &name) {
            Ok(v) => out.push((OsStr::from_bytes(n).to_os_string(), v)),
            // Removed meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            Err(e) => return Err(err(e)),
        }
    }
    out.sort();
    Ok(out)
}

/// Info about snapshot `id` in the checked `snapshots/` (entries not
/// counted).
fn info_in(d: &SafeDir, id: &str) -> Result<Info, String> {
    let name = file_name(id);
    let p = d.shown(&name);
    let st = d.stat(&name).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            format!(
                "no snapshot `{id}` in {} (see: layerfs snapshot list WORKSPACE)",
                d.path().display()
            )
        } else {
            ctx(format!("cannot stat {}", p.display()))(e)
        }
    })?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(format!("{} is not a regular file", p.display()));
    }
    Ok(Info {
        id: id.to_string(),
        size: st.st_size as u64,
        time: st.st_mtime,
        entries: None,
    })
}

/// Info about snapshot `id` of the checked state dir.
pub fn info_of(state: &SafeDir, id: &str) -> Result<Info, String> {
    match snapshots_dir(state, false)? {
        Some(d) => info_in(&d, id),
        None => Err(format!(
            "no snapshot `{id}`: {} does not exist (see: layerfs snapshot list WORKSPACE)",
            dir(state.path()).display()
        )),
    }
}

/// Opens snapshot `id` for reading, never following a symlink.
fn open_snapshot(d: &SafeDir, id: &str) -> Result<File, String> {
    let name = file_name(id);
    d.open_file(&name, libc::O_RDONLY, 0)
        .map_err(ctx(format!("cannot open {}", d.shown(&name).display())))
}

/// Every snapshot in the state dir, oldest first (then by ID); `count`
/// counts each one's entries (reading only headers, `prescan`).
pub fn list(state: &SafeDir, count: bool) -> Result<Vec<Info>, String> {
    let Some(d) = snapshots_dir(state, false)? else {
        return Ok(Vec::new());
    };
    let entries = d
        .read_dir()
        .map_err(ctx(format!("cannot list {}", d.path().display())))?;
    let mut out = Vec::new();
    for e in entries {
        let Some(id) = e.name.as_bytes().strip_suffix(b".tar") else {
            continue;
        };
        let Ok(id) = snapshot_id::validate(OsStr::from_bytes(id)) else {
            continue;
        };
        let mut info = match info_in(&d, id) {
            Ok(i) => i,
            Err(_) => continue,
        };
        if count {
            info.entries = open_snapshot(&d, id)
                .and_then(|f| prescan(&f))
                .ok()
                .map(|s| s.entries);
        }
        out.push(info);
    }
    out.sort_by(|a, b| (a.time, &a.id).cmp(&(b.time, &b.id)));
    Ok(out)
}

/// Removes snapshot `id`.
pub fn remove(state: &SafeDir, id: &str) -> Result<(), String> {
    let d = snapshots_dir(state, false)?
        .ok_or_else(|| format!("no snapshot `{id}` in {}", dir(state.path()).display()))?;
    info_in(&d, id)?;
    let name = file_name(id);
    d.remove_file(&name)
        .map_err(ctx(format!("cannot remove {}", d.shown(&name).display())))?;
    d.sync()
        .map_err(ctx(format!("cannot sync {}", d.path().display())))
}

/// What a pass over an archive's headers found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scan {
    /// Entries the tar reader will yield (extension records not counted).
    pub entries: u64,
    /// Bytes of file data stored in the archive.
    pub data_bytes: u64,
}

/// Reads the archive's headers only (one `pread` per header, seeking over
/// data) and checks its framing before anything is extracted: every
/// extension record (PAX `x`/`g`, GNU long name `L` and long link `K`),
/// which the tar reader loads whole into memory, is at most `META_LIMIT`
/// bytes; no entry's data runs past the end of the file. The framing is
/// the tar reader's (tar 0.4, non-raw iteration): a PAX `size` overrides
/// the next entry's size, GNU sparse entries have extension blocks after
/// their header, and the headers themselves are parsed by `tar::Header`.
pub fn prescan(f: &File) -> Result<Scan, String> {
    const BLOCK: u64 = 512;
    let len = f.metadata().map_err(ctx("cannot stat the archive"))?.len();
    let truncated = |at: u64| {
        format!(
            "the archive is truncated (it ends at byte {len}, an entry at byte {at} goes \
             beyond): not a complete snapshot"
        )
    };
    let mut scan = Scan::default();
    let mut pos = 0u64;
    let mut pax_size: Option<u64> = None;
    let (mut long_name, mut long_link, mut pax) = (false, false, false);
    let mut block = [0u8; BLOCK as usize];
    loop {
        let got = read_full_at(f, &mut block, pos).map_err(ctx("cannot read the archive"))?;
        if got == 0 {
            break;
        }
        if got < block.len() || pos + BLOCK > len {
            return Err(truncated(pos));
        }
        if block.iter().all(|&b| b == 0) {
            break;
        }
        let at = pos;
        let h = tar::Header::from_byte_slice(&block);
        let sum = block[..148]
            .iter()
            .chain(&block[156..])
            .fold(0u32, |a, b| a + *b as u32)
            + 8 * 32;
        if h.cksum().ok() != Some(sum) {
            return Err(format!(
                "the archive's header at byte {at} is damaged (checksum mismatch): not a \
                 complete snapshot"
            ));
        }
        pos += BLOCK;
        let ty = h.entry_type();
        let extension = ty.is_gnu_longname()
            || ty.is_gnu_longlink()
            || ty.is_pax_local_extensions()
            || ty.is_pax_global_extensions();
        let recognized = h.as_gnu().is_some() || h.as_ustar().is_some();
        let mut size = h
            .entry_size()
            .map_err(|e| format!("the archive's header at byte {at}: {e}"))?;
        if !extension {
            if let Some(s) = pax_size {
                size = s;
            }
        }
        if extension && size > META_LIMIT {
            return Err(format!(
                "the archive's entry at byte {at} declares {size} bytes of metadata (PAX \
                 records or a long name), more than the {} MiB layerfs reads: refused",
                META_LIMIT >> 20
            ));
        }
        let padded = size
            .checked_add(BLOCK - 1)
            .map(|s| s & !(BLOCK - 1))
            .ok_or_else(|| format!("the archive's entry at byte {at} has an absurd size"))?;
        let consumed = recognized
            && (ty.is_gnu_longname() || ty.is_gnu_longlink() || ty.is_pax_local_extensions());
        if consumed {
            let seen = if ty.is_gnu_longname() {
                &mut long_name
            } else if ty.is_gnu_longlink() {
                &mut long_link
            } else {
                &mut pax
            };
            if *seen {
                return Err(format!(
                    "the archive has two extension records for one entry (at byte {at})"
                ));
            }
            *seen = true;
            if ty.is_pax_local_extensions() {
                let mut data = vec![0u8; size as usize];
                if read_full_at(f, &mut data, pos).map_err(ctx("cannot read the archive"))?
                    < data.len()
                {
                    return Err(truncated(at));
                }
                pax_size = pax_value_size(&data);
            }
        } else {
            if ty.is_gnu_sparse() {
                let gnu = h
                    .as_gnu()
                    .ok_or_else(|| format!("sparse entry at byte {at} without a GNU header"))?;
                if gnu.is_extended() {
                    loop {
                        let got = read_full_at(f, &mut block, pos)
                            .map_err(ctx("cannot read the archive"))?;
                        if got < block.len() {
                            return Err(truncated(at));
                        }
                        pos += BLOCK;
                        // `GnuExtSparseHeader::isextended`, after 21 24-byte records.
                        if block[21 * 24] != 1 {
                            break;
                        }
                    }
                }
            }
            scan.entries += 1;
            if matches!(
                ty,
                tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse
            ) {
                scan.data_bytes = scan.data_bytes.saturating_add(size);
            }
            pax_size = None;
            (long_name, long_link, pax) = (false, false, false);
        }
        pos = pos
            .checked_add(padded)
            .filter(|&p| p <= len)
            .ok_or_else(|| truncated(at))?;
    }
    if long_name || long_link || pax {
        return Err(
            "the archive ends with extension records for an entry that is missing: not a \
             complete snapshot"
                .into(),
        );
    }
    Ok(scan)
}

/// The `size` record of a PAX record set, read as the tar reader reads it
/// (the first `size` key decides; a value that does not parse is none).
fn pax_value_size(data: &[u8]) -> Option<u64> {
    for ext in tar::PaxExtensions::new(data) {
        let ext = ext.ok()?;
        if ext.key() != Ok("size") {
            continue;
        }
        return ext.value().ok()?.parse().ok();
    }
    None
}

/// Reads as much of `buf` as the file has at `off`.
fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// What a restore left out of the archive or changed, by name: everything
/// the workspace's policy (or the restoring user's rights) did not let
/// through as the archive had it.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The first `MAX_LISTED` changes, in archive order.
    pub changes: Vec<Change>,
    /// Every change, counted by kind.
    pub counts: std::collections::BTreeMap<&'static str, u64>,
}

/// One change: the entry's path in the archive, what happened
/// (`device-skipped`, `suid-stripped`, `xattr-dropped`, `owner-kept`,
/// `symlink-skipped`, `link-skipped`, `root-kept`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: PathBuf,
    pub kind: &'static str,
    pub detail: String,
}

impl Report {
    fn add(&mut self, path: &Path, kind: &'static str, detail: String) {
        *self.counts.entry(kind).or_default() += 1;
        if self.changes.len() < MAX_LISTED {
            self.changes.push(Change {
                path: path.to_path_buf(),
                kind,
                detail,
            });
        }
    }

    /// Whether nothing was left out or changed.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Changes counted but not listed.
    pub fn omitted(&self) -> u64 {
        self.counts.values().sum::<u64>() - self.changes.len() as u64
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "changes": self.changes.iter().map(|c| serde_json::json!({
                "path": c.path.to_string_lossy(),
                "change": c.kind,
                "detail": c.detail,
            })).collect::<Vec<_>>(),
            "counts": self.counts,
            "omitted": self.omitted(),
        })
    }

    /// Lines for the terminal: at most `max` changes (paths quoted with
    /// control characters escaped), then what was left unlisted.
    pub fn lines(&self, max: usize) -> Vec<String> {
        let mut out: Vec<String> = self
            .changes
            .iter()
            .take(max)
            .map(|c| {
                let p = if c.path.as_os_str().is_empty() {
                    "./".to_string()
                } else {
                    format!("{:?}", c.path.to_string_lossy())
                };
                format!("{}: {p}: {}", c.kind, c.detail)
            })
            .collect();
        let more = self.counts.values().sum::<u64>() - out.len() as u64;
        if more > 0 {
            let counts: Vec<String> = self
                .counts
                .iter()
                .map(|(k, n)| format!("{n} {k}"))
                .collect();
            out.push(format!(
                "… {more} more not listed (all: {}; --json lists up to {MAX_LISTED})",
                counts.join(", ")
            ));
        }
        out
    }
}

/// What kind of object an xattr sits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Symlink,
    /// A device node or a fifo.
    Node,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Dir => "directory",
            Kind::File => "regular file",
            Kind::Symlink => "symlink",
            Kind::Node => "device or fifo",
        }
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether the xattr `name` = `value` may be restored on an object of
/// `kind` under `policy`: `Ok(name to set)` (an overlay mark is written in
/// the restoring user's spelling: `trusted.overlay.` as root, else
/// `user.overlay.`, as the mount would write it), or `Err(why not)`.
fn xattr_verdict(
    name: &[u8],
    value: &[u8],
    kind: Kind,
    policy: &Policy,
) -> Result<Vec<u8>, String> {
    if kind == Kind::Symlink {
        return Err("a symlink's xattrs are not restored".into());
    }
    if let Some(mark) = PRIVATE_PREFIXES
        .iter()
        .find_map(|p| name.strip_prefix(p.as_bytes()))
    {
        let valid = match mark {
            b"opaque" => kind == Kind::Dir && value == ops::OPAQUE_VALUE,
            b"redirect" => kind == Kind::Dir && ops::is_valid_redirect(value),
            m if m == MOVED_IN_XATTR.as_bytes() => kind == Kind::Dir && value == MOVED_IN_VALUE,
            m if m == ORIGIN_XATTR.as_bytes() => kind == Kind::File && Origin::is_valid(value),
            _ => {
                return Err("the overlay's private namespace holds only layerfs's own marks".into())
            }
        };
        if !valid {
            return Err(format!(
                "not a valid {} mark for a {}: the overlay writes it differently",
                String::from_utf8_lossy(mark),
                kind.name()
            ));
        }
        let prefix = if is_root() {
            PRIVATE_PREFIXES[0]
        } else {
            PRIVATE_PREFIXES[1]
        };
        let mut n = prefix.as_bytes().to_vec();
        n.extend_from_slice(mark);
        return Ok(n);
    }
    if name.starts_with(b"trusted.") {
        return Err("trusted.* xattrs are privileged and not layerfs's marks".into());
    }
    if name == b"security.capability" {
        if policy.strip_suid() {
            return Err(format!(
                "a file capability grants privilege like a setuid bit ({})",
                policy.suid_rule()
            ));
        }
        return if kind == Kind::File {
            Ok(name.to_vec())
        } else {
            Err("a capability belongs on a regular file".into())
        };
    }
    if name.starts_with(b"security.") {
        return Err("security labels are not restored".into());
    }
    if name == b"system.posix_acl_access" || name == b"system.posix_acl_default" {
        return match kind {
            Kind::Dir => Ok(name.to_vec()),
            Kind::File | Kind::Node if name == b"system.posix_acl_access" => Ok(name.to_vec()),
            _ => Err("a default ACL belongs on a directory".into()),
        };
    }
    if name.starts_with(b"user.") {
        // The kernel keeps user.* on files and directories only.
        return if matches!(kind, Kind::Dir | Kind::File) {
            Ok(name.to_vec())
        } else {
            Err("user.* xattrs belong on files and directories".into())
        };
    }
    Err("not an xattr namespace a workspace keeps".into())
}

/// The upper root's own mode and owner: a restore keeps them, whatever
/// the archive's root entry says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootMeta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl RootMeta {
    /// Those of the directory at `p` (not following a symlink).
    pub fn of(p: &Path) -> Result<RootMeta, String> {
        let m =
            std::fs::symlink_metadata(p).map_err(ctx(format!("cannot stat {}", p.display())))?;
        if !m.is_dir() {
            return Err(format!("{} is not a directory", p.display()));
        }
        Ok(RootMeta {
            mode: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
        })
    }
}

/// Mode and times applied to a directory once everything beneath it
/// exists (a read-only mode would stop its children being made; their
/// creation would change its times).
struct DirMeta {
    mode: u32,
    times: [libc::timespec; 2],
}

/// The state of one extraction besides the directory chain.
struct Extractor<'a> {
    policy: &'a Policy,
    report: &'a mut Report,
    /// Hashes of the paths of entries left out (hard links to them are
    /// left out too), keyed per process so an archive cannot aim at
    /// collisions.
    skipped: HashSet<u64>,
    hasher: RandomState,
}

impl Extractor<'_> {
    fn skip(&mut self, rel: &Path, kind: &'static str, detail: String) {
        self.skipped
            .insert(self.hasher.hash_one(rel.as_os_str().as_bytes()));
        self.report.add(rel, kind, detail);
    }

    fn was_skipped(&self, rel: &Path) -> bool {
        self.skipped
            .contains(&self.hasher.hash_one(rel.as_os_str().as_bytes()))
    }

    /// Gives the object behind `fd` the archive's owner, as far as the
    /// restoring user may: another user's ids are kept as the caller's
    /// (and reported) when the kernel refuses them.
    fn owner(&mut self, fd: &impl AsFd, uid: u32, gid: u32, rel: &Path) -> Result<(), String> {
        match sys::fchown(fd, Some(uid), Some(gid)) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) && !is_root() => {
                self.report.add(
                    rel,
                    "owner-kept",
                    format!(
                        "owner {uid}:{gid} cannot be given by uid {}; it stays yours",
                        nix::unistd::geteuid()
                    ),
                );
                Ok(())
            }
            Err(e) => Err(format!("cannot chown {:?}: {e}", rel)),
        }
    }

    /// Sets the xattrs the policy lets through (`xattr_verdict`) on the
    /// object behind `fd`; reports the others.
    fn xattrs(
        &mut self,
        fd: &impl AsRawFd,
        kind: Kind,
        xattrs: &[(OsString, Vec<u8>)],
        rel: &Path,
    ) -> Result<(), String> {
        for (name, value) in xattrs {
            let shown = String::from_utf8_lossy(name.as_bytes()).into_owned();
            match xattr_verdict(name.as_bytes(), value, kind, self.policy) {
                Ok(set) => {
                    let Ok(c) = CString::new(set) else {
                        self.report.add(
                            rel,
                            "xattr-dropped",
                            format!("{shown:?}: a NUL in its name"),
                        );
                        continue;
                    };
                    sys::setxattr(fd, &c, value, 0)
                        .map_err(|e| format!("cannot set xattr {shown:?} on {:?}: {e}", rel))?;
                }
                Err(why) => self
                    .report
                    .add(rel, "xattr-dropped", format!("{shown:?}: {why}")),
            }
        }
        Ok(())
    }

    /// The mode the policy lets a non-directory keep; reports a stripped
    /// setuid/setgid bit.
    fn file_mode(&mut self, mode: u32, rel: &Path) -> u32 {
        let allowed = self.policy.allowed_mode(mode, false);
        if allowed != mode {
            self.report.add(
                rel,
                "suid-stripped",
                format!(
                    "mode {mode:04o} restored as {allowed:04o} ({})",
                    self.policy.suid_rule()
                ),
            );
        }
        allowed
    }

    /// Moves `chain` to the directory `parent` (relative, `/`-joined):
    /// the directories left are completed (`finish_dir`), the ones
    /// entered are opened beneath their parents, never through a symlink.
    fn navigate(
        &mut self,
        chain: &mut Chain<Option<DirMeta>>,
        parent: &[u8],
    ) -> Result<(), String> {
        if chain.path == parent {
            return Ok(());
        }
        let comps: Vec<&[u8]> = if parent.is_empty() {
            Vec::new()
        } else {
            parent.split(|&b| b == b'/').collect()
        };
        let common = chain
            .levels
            .iter()
            .zip(&comps)
            .take_while(|(l, c)| l.name.as_bytes() == **c)
            .count();
        while chain.depth() > common {
            self.finish_dir(chain)?;
            chain.pop();
        }
        for c in &comps[common..] {
            let name = OsStr::from_bytes(c);
            let opened = chain
                .fd()
                .and_then(|p| sys::open_beneath(p, name, libc::O_PATH | libc::O_DIRECTORY, 0));
            let fd = opened.map_err(|e| {
                format!(
                    "{:?} is not a directory extracted before it ({e})",
                    child_rel(&chain.path, name)
                )
            })?;
            chain
                .push(name.to_os_string(), fd, None)
                .map_err(|e| format!("cannot stat {:?}: {e}", chain.path))?;
        }
        Ok(())
    }

    /// Applies the current directory's deferred mode and times.
    fn finish_dir(&mut self, chain: &mut Chain<Option<DirMeta>>) -> Result<(), String> {
        let Some(m) = chain.meta_mut().take() else {
            return Ok(());
        };
        let shown = PathBuf::from(OsStr::from_bytes(&chain.path));
        let fd = chain
            .fd()
            .map_err(|e| format!("cannot reopen {:?}: {e}", shown))?;
        sys::fchmod(fd, m.mode).map_err(|e| format!("cannot chmod {:?}: {e}", shown))?;
        sys::futimens(fd, &m.times).map_err(|e| format!("cannot set times of {:?}: {e}", shown))
    }
}

/// The directory holding `rel`'s last name, opened from `root` beneath it
/// (no symlink, no `..`), and that name.
fn open_parent_of<'r>(root: &OwnedFd, rel: &'r Path) -> io::Result<(OwnedFd, &'r OsStr)> {
    let bytes = rel.as_os_str().as_bytes();
    let (parent, name) = match bytes.iter().rposition(|&b| b == b'/') {
        Some(i) => (&bytes[..i], &bytes[i + 1..]),
        None => (&b""[..], bytes),
    };
    let name = OsStr::from_bytes(name);
    let dir_flags = libc::O_PATH | libc::O_DIRECTORY;
    if parent.is_empty() {
        return Ok((
            sys::open_beneath(root, OsStr::new("."), dir_flags, 0)?,
            name,
        ));
    }
    if parent.len() < 4000 {
        let fd = sys::openat2(
            root,
            OsStr::from_bytes(parent),
            dir_flags | libc::O_NOFOLLOW,
            0,
            sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS,
        )?;
        return Ok((fd, name));
    }
    // Deeper than one path lookup may go: a name at a time.
    let mut cur = sys::open_beneath(root, OsStr::new("."), dir_flags, 0)?;
    for c in parent.split(|&b| b == b'/') {
        cur = sys::open_beneath(&cur, OsStr::from_bytes(c), dir_flags, 0)?;
    }
    Ok((cur, name))
}

fn duplicate(raw: &Path) -> String {
    format!(
        "entry {:?} appears twice in the archive (or replaces an earlier one)",
        raw
    )
}

/// Extracts an archive into the existing, empty, checked directory `dst`
/// under `policy` (see the module invariants), and gives `dst` the mode
/// and owner `root` at the end. Everything left out or changed goes to
/// `report`. Returns the number of entries.
pub fn extract<R: Read>(
    r: R,
    dst: &SafeDir,
    policy: &Policy,
    root: RootMeta,
    report: &mut Report,
) -> Result<u64, String> {
    let mut ar = tar::Archive::new(r);
    ar.set_preserve_mtime(false);
    ar.set_preserve_permissions(false);
    ar.set_preserve_ownerships(false);
    ar.set_unpack_xattrs(false);
    ar.set_overwrite(false);
    let root_fd = dst
        .as_fd()
        .try_clone_to_owned()
        .map_err(ctx("cannot duplicate the staging dir's descriptor"))?;
    let mut chain: Chain<Option<DirMeta>> = Chain::new(root_fd, None);
    let mut ex = Extractor {
        policy,
        report,
        skipped: HashSet::new(),
        hasher: RandomState::new(),
    };
    let mut n = 0u64;
    let mut root_times: Option<[libc::timespec; 2]> = None;
    let mut saw_root = false;
    for entry in ar.entries().map_err(ctx("cannot read the archive"))? {
        let mut entry = entry.map_err(ctx("cannot read the archive"))?;
        let kind = entry.header().entry_type();
        if kind == tar::EntryType::XGlobalHeader {
            continue;
        }
        let raw_path = entry
            .path()
            .map_err(ctx("bad path in the archive"))?
            .into_owned();
        let rel = safe_rel(&raw_path)?;
        let h = entry.header();
        let mode = h.mode().map_err(ctx("bad mode in the archive"))? & 0o7777;
        let uid = h.uid().map_err(ctx("bad uid in the archive"))?;
        let gid = h.gid().map_err(ctx("bad gid in the archive"))?;
        let (Ok(uid), Ok(gid)) = (u32::try_from(uid), u32::try_from(gid)) else {
            return Err(format!(
                "entry {:?} has an impossible owner {uid}:{gid}",
                raw_path
            ));
        };
        let hdr_mtime = h.mtime().unwrap_or(0) as i64;
        let mut times = [
            libc::timespec {
                tv_sec: hdr_mtime,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: hdr_mtime,
                tv_nsec: 0,
            },
        ];
        let mut xattrs: Vec<(OsString, Vec<u8>)> = Vec::new();
        if let Some(exts) = entry
            .pax_extensions()
            .map_err(ctx("bad PAX records in the archive"))?
        {
            for ext in exts {
                let ext = ext.map_err(ctx("bad PAX record in the archive"))?;
                let key = ext.key_bytes();
                if let Some(name) = key.strip_prefix(PAX_XATTR.as_bytes()) {
                    xattrs.push((
                        OsStr::from_bytes(name).to_os_string(),
                        ext.value_bytes().to_vec(),
                    ));
                } else if let Some(name) = key.strip_prefix(PAX_XATTR_HEX.as_bytes()) {
                    let value = unhex(ext.value_bytes()).ok_or_else(|| {
                        format!(
                            "entry {:?}: a bad hex xattr record in the archive",
                            raw_path
                        )
                    })?;
                    xattrs.push((OsStr::from_bytes(name).to_os_string(), value));
                } else if key == b"mtime" {
                    times[1] = parse_time(ext.value_bytes()).unwrap_or(times[1]);
                } else if key == b"atime" {
                    times[0] = parse_time(ext.value_bytes()).unwrap_or(times[0]);
                }
            }
        }
        if rel.as_os_str().is_empty() {
            if !kind.is_dir() || saw_root || n > 0 {
                return Err(format!("unexpected root entry {:?}", raw_path));
            }
            saw_root = true;
            let fd = chain.fd().map_err(ctx("cannot open the staging dir"))?;
            let fd = fd.try_clone().map_err(ctx("cannot open the staging dir"))?;
            ex.xattrs(&fd, Kind::Dir, &xattrs, &rel)?;
            if (mode, uid, gid) != (root.mode, root.uid, root.gid) {
                ex.report.add(
                    &rel,
                    "root-kept",
                    format!(
                        "the archive's root has mode {mode:04o} and owner {uid}:{gid}; the \
                         upper's root keeps mode {:04o} and owner {}:{}",
                        root.mode, root.uid, root.gid
                    ),
                );
            }
            root_times = Some(times);
            n += 1;
            continue;
        }
        if !saw_root {
            return Err("the archive has no root entry `./` first: not a layerfs snapshot".into());
        }
        let bytes = rel.as_os_str().as_bytes();
        let (parent, name) = match bytes.iter().rposition(|&b| b == b'/') {
            Some(i) => (&bytes[..i], &bytes[i + 1..]),
            None => (&b""[..], bytes),
        };
        let name = OsStr::from_bytes(name);
        ex.navigate(&mut chain, parent).map_err(|e| {
            format!(
                "entry {:?} does not follow its directory in the archive: {e}",
                raw_path
            )
        })?;
        let io_err = |what: &str| {
            let what = what.to_string();
            let raw = raw_path.clone();
            move |e: io::Error| {
                if e.raw_os_error() == Some(libc::EEXIST) {
                    duplicate(&raw)
                } else {
                    format!("cannot {what} {:?}: {e}", raw)
                }
            }
        };
        match kind {
            tar::EntryType::Directory => {
                let fd = {
                    let parent = chain.fd().map_err(io_err("reopen the parent of"))?;
                    sys::mkdirat(parent, name, 0o700).map_err(io_err("create directory"))?;
                    sys::open_beneath(parent, name, libc::O_PATH | libc::O_DIRECTORY, 0)
                        .map_err(io_err("open directory"))?
                };
                ex.owner(&fd, uid, gid, &rel)?;
                ex.xattrs(&fd, Kind::Dir, &xattrs, &rel)?;
                // The chain enters the new directory: in the archive's
                // depth-first order, its contents come next.
                chain
                    .push(
                        name.to_os_string(),
                        fd,
                        Some(DirMeta {
                            mode: policy.allowed_mode(mode, true),
                            times,
                        }),
                    )
                    .map_err(io_err("stat directory"))?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let target = {
                    let parent = chain.fd().map_err(io_err("reopen the parent of"))?;
                    let mut p = PathBuf::from(format!("/proc/self/fd/{}", parent.as_raw_fd()));
                    p.push(name);
                    p
                };
                // Created with O_EXCL through the parent's descriptor; the
                // tar reader writes the data and seeks over holes.
                let f = match entry.unpack(&target) {
                    Ok(tar::Unpacked::File(f)) => f,
                    Ok(_) => return Err(format!("cannot write {:?}", raw_path)),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        return Err(duplicate(&raw_path))
                    }
                    Err(e) => return Err(format!("cannot write {:?}: {e}", raw_path)),
                };
                if !xattrs.is_empty() && !is_root() {
                    // user.* xattrs need write permission on the file.
                    sys::fchmod(&f, 0o600).map_err(io_err("chmod"))?;
                }
                ex.owner(&f, uid, gid, &rel)?;
                ex.xattrs(&f, Kind::File, &xattrs, &rel)?;
                // After chown, which clears setuid/setgid.
                let allowed = ex.file_mode(mode, &rel);
                sys::fchmod(&f, allowed).map_err(io_err("chmod"))?;
                sys::futimens(&f, &times).map_err(io_err("set times of"))?;
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(ctx("bad link name in the archive"))?
                    .ok_or_else(|| format!("hard link {:?} without a target", raw_path))?
                    .into_owned();
                let trel = safe_rel(&target)?;
                if trel.as_os_str().is_empty() {
                    return Err(format!("hard link {:?} names the root", raw_path));
                }
                if ex.was_skipped(&trel) {
                    ex.skip(
                        &rel,
                        "link-skipped",
                        format!("a hard link to {:?}, which was left out", trel),
                    );
                    n += 1;
                    continue;
                }
                let not_earlier = || {
                    format!(
                        "hard link {:?} names {:?}, which is not an earlier file of the archive",
                        raw_path, target
                    )
                };
                let (tdir, tname) =
                    open_parent_of(&chain.root, &trel).map_err(|_| not_earlier())?;
                let st = sys::fstatat(&tdir, tname).map_err(|_| not_earlier())?;
                if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                    return Err(not_earlier());
                }
                // A hard link to a symlink is that symlink at a new name,
                // where its target may lead out: checked again there.
                if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                    let link_target = sys::open_path(&tdir, tname)
                        .and_then(|fd| sys::readlink_fd(&fd))
                        .map_err(io_err("read the symlink linked by"))?;
                    if let Err(d) = policy.check_symlink(&rel.to_string_lossy(), &link_target) {
                        ex.skip(
                            &rel,
                            "symlink-skipped",
                            format!(
                                "a hard link to the symlink {:?}, which points at {:?}: outside \
                                 what the policy allows from here ({})",
                                trel, link_target, d.rule
                            ),
                        );
                        n += 1;
                        continue;
                    }
                }
                let parent = chain.fd().map_err(io_err("reopen the parent of"))?;
                sys::linkat(&tdir, tname, parent, name).map_err(io_err("link"))?;
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(ctx("bad link target in the archive"))?
                    .ok_or_else(|| format!("symlink {:?} without a target", raw_path))?
                    .into_owned();
                if let Err(d) = policy.check_symlink(&rel.to_string_lossy(), target.as_os_str()) {
                    ex.skip(
                        &rel,
                        "symlink-skipped",
                        format!(
                            "it points at {:?}, outside what the policy allows ({})",
                            target, d.rule
                        ),
                    );
                    n += 1;
                    continue;
                }
                let parent = chain.fd().map_err(io_err("reopen the parent of"))?;
                let parent = parent.try_clone().map_err(io_err("reopen the parent of"))?;
                sys::symlinkat(target.as_os_str(), &parent, name)
                    .map_err(io_err("create symlink"))?;
                let fd = sys::open_path(&parent, name).map_err(io_err("open symlink"))?;
                ex.owner(&fd, uid, gid, &rel)?;
                ex.xattrs(&fd, Kind::Symlink, &xattrs, &rel)?;
                sys::utimensat_nofollow(&parent, name, &times).map_err(io_err("set times of"))?;
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                let h = entry.header();
                let major = h.device_major().ok().flatten().unwrap_or(0);
                let minor = h.device_minor().ok().flatten().unwrap_or(0);
                let rdev = libc::makedev(major, minor);
                let fmt = match kind {
                    tar::EntryType::Char => libc::S_IFCHR,
                    tar::EntryType::Block => libc::S_IFBLK,
                    _ => libc::S_IFIFO,
                };
                let device = fmt != libc::S_IFIFO && !ops::is_whiteout_node(fmt, rdev);
                let what = if fmt == libc::S_IFBLK {
                    "block"
                } else {
                    "character"
                };
                if device {
                    if let Err(d) = policy.check_device() {
                        ex.skip(
                            &rel,
                            "device-skipped",
                            format!("a {what} device {major}:{minor} ({})", d.rule),
                        );
                        n += 1;
                        continue;
                    }
                }
                let parent = chain.fd().map_err(io_err("reopen the parent of"))?;
                let parent = parent.try_clone().map_err(io_err("reopen the parent of"))?;
                match sys::mknodat(&parent, name, fmt | 0o600, rdev) {
                    Ok(()) => {}
                    Err(e) if device && e.raw_os_error() == Some(libc::EPERM) => {
                        ex.skip(
                            &rel,
                            "device-skipped",
                            format!("a {what} device {major}:{minor}: you may not create it ({e})"),
                        );
                        n += 1;
                        continue;
                    }
                    Err(e) => return Err(io_err("create node")(e)),
                }
                let fd = sys::open_path(&parent, name).map_err(io_err("open node"))?;
                ex.owner(&fd, uid, gid, &rel)?;
                ex.xattrs(&fd, Kind::Node, &xattrs, &rel)?;
                let allowed = ex.file_mode(mode, &rel);
                sys::fchmod(&fd, allowed).map_err(io_err("chmod"))?;
                sys::utimensat_nofollow(&parent, name, &times).map_err(io_err("set times of"))?;
            }
            other => {
                return Err(format!(
                    "entry {:?} has unsupported type {:?}",
                    raw_path, other
                ))
            }
        }
        n += 1;
    }
    if !saw_root {
        return Err("the archive has no root entry `./`: not a layerfs snapshot".into());
    }
    // Deepest first, so a directory's times are set after every change
    // beneath it, and a read-only mode after its children exist.
    while chain.depth() > 0 {
        ex.finish_dir(&mut chain)?;
        chain.pop();
    }
    let rootfd = chain.fd().map_err(ctx("cannot open the staging dir"))?;
    let rootfd = rootfd
        .try_clone()
        .map_err(ctx("cannot open the staging dir"))?;
    ex.owner(&rootfd, root.uid, root.gid, Path::new(""))?;
    sys::fchmod(&rootfd, root.mode).map_err(ctx("cannot chmod the staging dir"))?;
    if let Some(t) = root_times {
        sys::futimens(&rootfd, &t).map_err(ctx("cannot set the times of the staging dir"))?;
    }
    Ok(n)
}

/// Refuses a restore that would not fit: more file data or entries than
/// the workspace's quota allows, or than the upper's filesystem has room
/// for (`parent` is a descriptor on it).
fn check_room(
    parent: &OwnedFd,
    scan: &Scan,
    policy: &Policy,
    archive: &Path,
    where_: &Path,
) -> Result<(), String> {
    let q = policy.quota();
    if let Some(limit) = q.bytes.filter(|&b| scan.data_bytes > b) {
        return Err(format!(
            "snapshot {} holds {} bytes of file data, more than the workspace's quota \
             (bytes={limit}); raise the quota in its policy file to restore it",
            archive.display(),
            scan.data_bytes
        ));
    }
    if let Some(limit) = q.inodes.filter(|&i| scan.entries > i) {
        return Err(format!(
            "snapshot {} holds {} entries, more than the workspace's quota (inodes={limit}); \
             raise the quota in its policy file to restore it",
            archive.display(),
            scan.entries
        ));
    }
    let st = sys::fstatfs(parent).map_err(ctx(format!("cannot statfs {}", where_.display())))?;
    #[allow(clippy::unnecessary_cast)]
    let (free, files, ffree) = (
        st.f_bavail as u64 * st.f_frsize as u64,
        st.f_files as u64,
        st.f_favail as u64,
    );
    if scan.data_bytes > free {
        return Err(format!(
            "snapshot {} needs {} bytes for its files, and the filesystem of {} has {free} \
             free: free some space and retry",
            archive.display(),
            scan.data_bytes,
            where_.display()
        ));
    }
    if files > 0 && scan.entries > ffree {
        return Err(format!(
            "snapshot {} holds {} entries, and the filesystem of {} has {ffree} free inodes: \
             free some and retry",
            archive.display(),
            scan.entries,
            where_.display()
        ));
    }
    Ok(())
}

/// Where a restore builds its staging tree: in the workspace's work dir
/// (checked, and created 0700 if missing as `mount` would) when it is on
/// the upper's filesystem, since `mount` cleans leftovers there; else
/// beside the upper, but only where nobody else can rename entries (the
/// staging dir is exchanged with the upper by name). Returns its path (for
/// messages), a descriptor and whether it is the work dir.
fn staging_parent(upper: &Path, work: Option<&Path>) -> Result<(PathBuf, OwnedFd, bool), String> {
    let upper_dev = std::fs::symlink_metadata(upper)
        .map_err(ctx(format!("cannot stat upper dir {}", upper.display())))?
        .dev();
    if let Some(w) = work {
        let (d, _) = SafeDir::create(w, Role::Work, 0o700)?;
        if d.id().0 == upper_dev {
            return Ok((w.to_path_buf(), d.into_fd(), true));
        }
    }
    let parent = upper
        .parent()
        .ok_or_else(|| format!("upper dir {} has no parent directory", upper.display()))?;
    let pfd = SafeDir::stable_parent_fd(upper, Role::Staging)?;
    let st = sys::fstat(&pfd).map_err(ctx(format!("cannot stat {}", parent.display())))?;
    if st.st_dev != upper_dev {
        return Err(format!(
            "upper dir {} is a mount point: it cannot be replaced atomically; restore into a workspace whose upper is a plain directory",
            upper.display()
        ));
    }
    Ok((parent.to_path_buf(), pfd, false))
}

/// A snapshot extracted into a staging directory beside the upper (on its
/// filesystem), synced, ready to be exchanged with it.
pub struct Staged {
    pub info: Info,
    /// What the policy left out of the archive or changed.
    pub report: Report,
    /// Where the staging dir is (the work dir, or the upper's parent), for
    /// messages.
    pub parent: PathBuf,
    /// Whether that is the workspace's work dir.
    pub in_work: bool,
    /// A descriptor of it: the staging dir is reached through it.
    parent_fd: OwnedFd,
    /// Its name there (`.layerfs-restore.PID.NANOS`).
    pub name: OsString,
}

impl Staged {
    /// The staging dir's path, for messages.
    pub fn path(&self) -> PathBuf {
        self.parent.join(&self.name)
    }

    /// A path to the staging dir through its parent's descriptor (to
    /// remove it), valid while this lives.
    pub fn fd_path(&self) -> PathBuf {
        let mut p = PathBuf::from(format!("/proc/self/fd/{}", self.parent_fd.as_raw_fd()));
        p.push(&self.name);
        p
    }

    /// Removes the staging dir (after an exchange: the old upper).
    pub fn remove(&self) -> io::Result<()> {
        crate::layer::walk::remove_path(&self.fd_path())
    }
}

/// Extracts snapshot `id` of the checked state dir into a new staging
/// directory (see `staging_parent`) under the workspace's `policy`, and
/// syncs it. On error nothing is left behind.
pub fn stage(
    upper: &Path,
    work: Option<&Path>,
    state: &SafeDir,
    id: &str,
    policy: &Policy,
    progress: bool,
) -> Result<Staged, String> {
    snapshot_id::validate(OsStr::new(id))?;
    let snaps = snapshots_dir(state, false)?.ok_or_else(|| {
        format!(
            "no snapshot `{id}`: {} does not exist (see: layerfs snapshot list WORKSPACE)",
            dir(state.path()).display()
        )
    })?;
    let mut info = info_in(&snaps, id)?;
    let shown = snaps.shown(file_name(id));
    let f = open_snapshot(&snaps, id)?;
    let scan = prescan(&f).map_err(|e| format!("snapshot {}: {e}", shown.display()))?;
    info.entries = Some(scan.entries);
    let root = RootMeta::of(upper)?;
    let (parent, parent_fd, in_work) = staging_parent(upper, work)?;
    check_room(&parent_fd, &scan, policy, &shown, &parent)?;
    let name = OsString::from(format!(
        "{}{}.{}",
        STAGING_PREFIX,
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    ));
    sys::mkdirat(&parent_fd, &name, 0o700).map_err(ctx(format!(
        "cannot create staging dir {}",
        parent.join(&name).display()
    )))?;
    let mut staged = Staged {
        info,
        report: Report::default(),
        parent,
        in_work,
        parent_fd,
        name,
    };
    // Invariant: every failure removes the staging tree.
    let extracted = (|| -> Result<(), String> {
        let staging = SafeDir::open_at(
            &staged.parent_fd,
            &staged.name,
            staged.path(),
            Role::Staging,
        )?;
        let bar = progress_bar(progress, Some(staged.info.size), &format!("restoring {id}"));
        extract(
            BufReader::with_capacity(IO_BUF, bar.wrap_read(f)),
            &staging,
            policy,
            root,
            &mut staged.report,
        )
        .map_err(|e| format!("snapshot {}: {e}", shown.display()))?;
        bar.finish_and_clear();
        // One syncfs makes the whole staging tree durable before it
        // becomes the upper (cheaper than an fsync per file).
        let sfd = staging
            .open_self()
            .map_err(ctx(format!("cannot open {}", staging.path().display())))?;
        crate::sys::syncfs(&sfd)
            .map_err(ctx(format!("cannot sync {}", staging.path().display())))?;
        Ok(())
    })();
    if let Err(e) = extracted {
        let _ = staged.remove();
        return Err(e);
    }
    Ok(staged)
}

/// Replaces the upper by the contents of snapshot `id`, atomically (see
/// the module invariants), under the workspace's `policy`. The upper must
/// not be in use by a daemon (a live mount's daemon does the exchange
/// itself: `daemon::restore`).
pub fn restore(
    upper: &Path,
    work: Option<&Path>,
    state: &SafeDir,
    id: &str,
    policy: &Policy,
    progress: bool,
) -> Result<(Info, Report), String> {
    let upper_name = upper
        .file_name()
        .ok_or_else(|| format!("upper dir {} has no name", upper.display()))?;
    let upper_parent = upper
        .parent()
        .ok_or_else(|| format!("upper dir {} has no parent directory", upper.display()))?;
    let staged = stage(upper, work, state, id, policy, progress)?;
    let ufd = sys::open_root(upper_parent)
        .map_err(ctx(format!("cannot open {}", upper_parent.display())))?;
    if let Err(e) = sys::renameat2(
        &staged.parent_fd,
        &staged.name,
        &ufd,
        upper_name,
        sys::RENAME_EXCHANGE,
    ) {
        let _ = staged.remove();
        return Err(ctx(format!(
            "cannot exchange {} with upper dir {}",
            staged.path().display(),
            upper.display()
        ))(e));
    }
    for (fd, d) in [
        (&ufd, upper_parent),
        (&staged.parent_fd, staged.parent.as_path()),
    ] {
        sys::open_dir(fd)
            .and_then(|f| File::from(f).sync_all())
            .map_err(ctx(format!("cannot sync {}", d.display())))?;
    }
    // The staging dir now holds the old upper.
    staged.remove().map_err(ctx(format!(
        "restored, but cannot remove the old upper (now {}); remove it by hand",
        staged.path().display()
    )))?;
    Ok((staged.info, staged.report))
}

/// Bytes from lowercase or uppercase hex (`PAX_XATTR_HEX`).
fn unhex(v: &[u8]) -> Option<Vec<u8>> {
    if !v.len().is_multiple_of(2) {
        return None;
    }
    v.chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).ok()?, 16).ok())
        .collect()
}

/// A PAX time record (`SECS[.FRACTION]`); `None` for anything else (the
/// header's whole seconds then stand).
fn parse_time(v: &[u8]) -> Option<libc::timespec> {
    let s = std::str::from_utf8(v).ok()?;
    let (secs, frac) = s.split_once('.').unwrap_or((s, "0"));
    if frac.is_empty() || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: i64 = secs.parse().ok()?;
    let mut digits: String = frac.chars().take(9).collect();
    while digits.len() < 9 {
        digits.push('0');
    }
    let nsec: i64 = digits.parse().ok()?;
    Some(libc::timespec {
        tv_sec: secs,
        tv_nsec: nsec,
    })
}

/// A relative path of the archive made safe: `.` and empty components
/// dropped (`./x`, `a//b`), only plain names; "" is the root. An absolute
/// path or a `..` component is refused. (Byte by byte: an entry's path may
/// have tens of thousands of components.)
fn safe_rel(p: &Path) -> Result<PathBuf, String> {
    let b = p.as_os_str().as_bytes();
    if b.first() == Some(&b'/') {
        return Err(format!("unsafe path {:?} in the archive", p));
    }
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    for c in b.split(|&x| x == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err(format!("unsafe path {:?} in the archive", p)),
            _ => {
                if !out.is_empty() {
                    out.push(b'/');
                }
                out.extend_from_slice(c);
            }
        }
    }
    Ok(PathBuf::from(OsStr::from_bytes(&out)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A raw header with any name (the tar crate refuses `..` in names).
    fn raw(name: &str, kind: tar::EntryType, link: Option<&str>) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(l) = link {
            h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1);
        h.set_size(if kind == tar::EntryType::Regular {
            1
        } else {
            0
        });
        h.set_cksum();
        h
    }

    fn archive(entries: &[(&str, tar::EntryType, Option<&str>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, link) in entries {
            let h = raw(name, *kind, *link);
            let data: &[u8] = if *kind == tar::EntryType::Regular {
                b"x"
            } else {
                b""
            };
            b.append(&h, data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn try_extract(
        entries: &[(&str, tar::EntryType, Option<&str>)],
    ) -> (tempfile::TempDir, Result<u64, String>) {
        let t = tempfile::tempdir().unwrap();
        let dst = t.path().join("dst");
        let (d, _) = SafeDir::create(&dst, Role::Staging, 0o700).unwrap();
        let root = RootMeta::of(&dst).unwrap();
        let mut report = Report::default();
        let r = extract(
            &archive(entries)[..],
            &d,
            &Policy::default(),
            root,
            &mut report,
        );
        (t, r)
    }

    use tar::EntryType as T;

    #[test]
    fn tampered_archives_stay_inside() {
        let cases: &[&[(&str, T, Option<&str>)]] = &[
            &[("./", T::Directory, None), ("../evil", T::Regular, None)],
            &[("./", T::Directory, None), ("/abs", T::Regular, None)],
            // A file beneath a symlink of the archive.
            &[
                ("./", T::Directory, None),
                ("l", T::Symlink, Some("..")),
                ("l/evil", T::Regular, None),
            ],
            // A hard link to something outside or not yet extracted.
            &[
                ("./", T::Directory, None),
                ("h", T::Link, Some("../outside")),
            ],
            &[
                ("./", T::Directory, None),
                ("h", T::Link, Some("later")),
                ("later", T::Regular, None),
            ],
            // A directory's contents before the directory.
            &[("./", T::Directory, None), ("d/x", T::Regular, None)],
            // No root entry: not one of ours.
            &[("x", T::Regular, None)],
        ];
        for c in cases {
            let (t, r) = try_extract(c);
            let e = r.expect_err("a tampered archive was extracted");
            assert!(
                [
                    "unsafe path",
                    "does not follow",
                    "not an earlier file",
                    "no root entry"
                ]
                .iter()
                .any(|w| e.contains(w)),
                "{c:?}: {e}"
            );
            let outside: Vec<_> = fs::read_dir(t.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(outside, vec![OsString::from("dst")], "{c:?} wrote outside");
            assert!(!t.path().join("dst/evil").exists() && !t.path().join("evil").exists());
        }
        let (t, r) = try_extract(&[
            ("./", T::Directory, None),
            ("d", T::Directory, None),
            ("d/x", T::Regular, None),
            ("y", T::Link, Some("d/x")),
        ]);
        assert_eq!(r, Ok(4));
        assert_eq!(fs::read(t.path().join("dst/y")).unwrap(), b"x");
    }

    #[test]
    fn archive_paths_are_made_safe() {
        for (raw, want) in [("./", ""), ("a//b/./c/", "a/b/c"), ("./x", "x"), (".", "")] {
            assert_eq!(safe_rel(Path::new(raw)), Ok(PathBuf::from(want)), "{raw}");
        }
        for raw in ["/etc", "a/../b", "..", "a/.."] {
            assert!(safe_rel(Path::new(raw)).is_err(), "{raw}");
        }
    }

    #[test]
    fn hex_xattr_values_decode() {
        assert_eq!(unhex(b"610a62"), Some(b"a\nb".to_vec()));
        assert_eq!(unhex(b"FF00"), Some(vec![0xff, 0]));
        assert_eq!(unhex(b"abc"), None);
        assert_eq!(unhex(b"zz"), None);
    }

    #[test]
    fn times_parse() {
        let t = parse_time(b"1700000000.123456789").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (1_700_000_000, 123_456_789));
        let t = parse_time(b"5.5").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (5, 500_000_000));
        assert_eq!(
            parse_time(&time_record(-3, 7)).map(|t| (t.tv_sec, t.tv_nsec)),
            Some((-3, 7))
        );
        assert!(parse_time(b"x").is_none());
    }
}
