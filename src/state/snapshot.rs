//! Snapshots: a tar of the upper directory in the state dir's `snapshots/`,
//! and restoring one as the upper.
//!
//! What an archive keeps, per object of the upper (walked without ever
//! following a symlink): its type (directory, regular file, symlink, hard
//! link to an earlier entry, character/block device — the 0/0 whiteouts —
//! and fifo; sockets are skipped with a warning), permission bits with
//! setuid/setgid/sticky, numeric owner and group, mtime and atime to the
//! nanosecond (PAX `mtime`/`atime` records; the ustar header keeps whole
//! seconds for other tools), every xattr the caller can read (PAX
//! `SCHILY.xattr.NAME` records, as GNU tar writes them: this includes the
//! overlay's `opaque`/`redirect` marks and POSIX ACLs), symlink targets,
//! device numbers, and the holes of sparse files (GNU sparse entries; a
//! restored file has the same holes). Not kept: ctime (no one can set it)
//! and the inode numbers. Paths matching the workspace's scratch globs are
//! left out (a matching directory with everything beneath it).
//!
//! Invariants:
//! - A snapshot file `ID.tar` is complete or absent: it is written as
//!   `.ID.tar.tmp`, fsynced, renamed into place and the directory fsynced.
//!   A `.ID.tar.tmp` is held with `flock` while its save runs, so a later
//!   save removes any unlocked leftover (a killed save) and never mistakes
//!   a running save's file for one. `list` shows only `*.tar` names whose
//!   stem is a valid ID (never a dot file).
//! - `restore` never modifies the upper in place: the archive is extracted
//!   into a staging directory on the upper's filesystem, synced, and
//!   exchanged with the upper by one `renameat2(RENAME_EXCHANGE)`; before
//!   the exchange the upper is untouched, after it the upper is the whole
//!   restored tree. The old tree is removed afterwards (a crash leaves it
//!   in the work dir, which `mount` cleans).
//! - Extraction creates every object itself beneath the staging dir: an
//!   entry whose path is absolute, has a `..` component, or lies under
//!   anything but a directory extracted before it, or a hard link to
//!   anything but a non-directory extracted before it, is refused, so a
//!   tampered archive cannot write outside the staging dir.

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use super::snapshot_id;
use crate::layer::sys;

const PAX_XATTR: &str = "SCHILY.xattr.";
const IO_BUF: usize = 1 << 20;

/// The `snapshots/` directory of a state dir.
pub fn dir(state: &Path) -> PathBuf {
    state.join("snapshots")
}

/// Path of snapshot `id` (a validated ID) in a state dir.
pub fn path(state: &Path, id: &str) -> PathBuf {
    dir(state).join(format!("{id}.tar"))
}

fn tmp_name(id: &str) -> String {
    format!(".{id}.tar.tmp")
}

/// Paths left out of snapshots: gitignore-style globs relative to the
/// workspace root (`*` stays within one component, `**` crosses them).
#[derive(Clone, Default)]
pub struct Exclude {
    set: Option<GlobSet>,
}

impl Exclude {
    pub fn new(globs: &[String]) -> Result<Exclude, String> {
        if globs.is_empty() {
            return Ok(Exclude { set: None });
        }
        let mut b = GlobSetBuilder::new();
        for g in globs {
            let glob = GlobBuilder::new(g.trim_start_matches('/'))
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| format!("invalid scratch glob `{g}`: {e}"))?;
            b.add(glob);
        }
        let set = b
            .build()
            .map_err(|e| format!("invalid scratch globs: {e}"))?;
        Ok(Exclude { set: Some(set) })
    }

    /// Whether `rel` (relative to the upper root) is left out.
    pub fn excludes(&self, rel: &Path) -> bool {
        self.set.as_ref().is_some_and(|s| s.is_match(rel))
    }
}

/// Options of a save.
pub struct SaveOptions {
    pub exclude: Exclude,
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

/// Creates `snapshots/` (and the state dir, mode 0700) if missing.
fn ensure_dir(state: &Path) -> Result<PathBuf, String> {
    let d = dir(state);
    match fs::symlink_metadata(&d) {
        Ok(m) if m.is_dir() => return Ok(d),
        Ok(_) => return Err(format!("{} exists and is not a directory", d.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(ctx(format!("cannot stat {}", d.display()))(e)),
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&d)
        .or_else(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                Ok(())
            } else {
                Err(e)
            }
        })
        .map_err(ctx(format!("cannot create {}", d.display())))?;
    Ok(d)
}

fn fsync_dir(d: &Path) -> io::Result<()> {
    File::open(d)?.sync_all()
}

fn flock(f: &File, op: libc::c_int) -> io::Result<()> {
    // SAFETY: flock on an fd we own; no memory is passed.
    if unsafe { libc::flock(f.as_raw_fd(), op) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Removes leftovers of killed saves: `.ID.tar.tmp` files no running save
/// holds locked.
fn remove_stale_tmps(d: &Path) {
    let Ok(rd) = fs::read_dir(d) else { return };
    for e in rd.flatten() {
        let name = e.file_name();
        let b = name.as_bytes();
        if !(b.starts_with(b".") && b.ends_with(b".tar.tmp")) {
            continue;
        }
        let p = e.path();
        let Ok(f) = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&p)
        else {
            continue;
        };
        if flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
            let _ = fs::remove_file(&p);
        }
    }
}

/// Whether snapshot `id` exists.
pub fn exists(state: &Path, id: &str) -> bool {
    fs::symlink_metadata(path(state, id)).is_ok()
}

/// Writes snapshot `id` of the upper into the state dir. The caller holds
/// whatever makes the upper still (the daemon's write pause, or no mount)
/// for the duration of the call.
pub fn save(upper: &Path, state: &Path, id: &str, opts: &SaveOptions) -> Result<Info, String> {
    snapshot_id::validate(OsStr::new(id))?;
    let d = ensure_dir(state)?;
    let final_path = path(state, id);
    if !opts.force && fs::symlink_metadata(&final_path).is_ok() {
        return Err(format!(
            "snapshot `{id}` already exists ({}): choose another ID, remove it first \
             (layerfs snapshot rm WORKSPACE {id}) or pass --force",
            final_path.display()
        ));
    }
    remove_stale_tmps(&d);
    let tmp_path = d.join(tmp_name(id));
    let tmp = OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp_path)
        .map_err(ctx(format!("cannot create {}", tmp_path.display())))?;
    flock(&tmp, libc::LOCK_EX | libc::LOCK_NB).map_err(|_| {
        format!(
            "another `snapshot save` of `{id}` is running (it holds {}); wait for it to finish",
            tmp_path.display()
        )
    })?;
    // Invariant: from here on, every failure removes the temporary file.
    let result = (|| -> Result<u64, String> {
        tmp.set_len(0)
            .map_err(ctx(format!("cannot truncate {}", tmp_path.display())))?;
        let bar = progress_bar(opts.progress, None, &format!("saving {id}"));
        let out = BufWriter::with_capacity(IO_BUF, bar.wrap_write(EarlyWriteback::new(&tmp)));
        let (out, entries) = write_archive(upper, out, &opts.exclude)?;
        let inner = out
            .into_inner()
            .map_err(|e| ctx(format!("cannot write {}", tmp_path.display()))(e.into_error()))?;
        drop(inner);
        bar.finish_and_clear();
        tmp.sync_all()
            .map_err(ctx(format!("cannot sync {}", tmp_path.display())))?;
        Ok(entries)
    })();
    let entries = match result {
        Ok(n) => n,
        Err(e) => {
            let _ = fs::remove_file(&tmp_path);
            return Err(e);
        }
    };
    let flags = if opts.force { 0 } else { sys::RENAME_NOREPLACE };
    let dfd = sys::open_root(&d).map_err(ctx(format!("cannot open {}", d.display())))?;
    if let Err(e) = sys::renameat2(
        &dfd,
        OsStr::new(&tmp_name(id)),
        &dfd,
        OsStr::new(&format!("{id}.tar")),
        flags,
    ) {
        let _ = fs::remove_file(&tmp_path);
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
    fsync_dir(&d).map_err(ctx(format!("cannot sync {}", d.display())))?;
    drop(tmp);
    let mut info = info_of(state, id)?;
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
            // SAFETY: sync_file_range on an fd we own, over bytes we wrote;
            // a failure only loses the head start (fsync follows anyway).
            unsafe {
                libc::sync_file_range(
                    self.f.as_raw_fd(),
                    self.started as libc::off64_t,
                    (self.written - self.started) as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WRITE,
                )
            };
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

/// Writes the tar of `upper` to `out`: the root as `./`, then every object
/// depth-first in name order, a directory before what it holds. Returns the
/// writer and the number of entries.
pub fn write_archive<W: Write>(
    upper: &Path,
    out: W,
    exclude: &Exclude,
) -> Result<(W, u64), String> {
    let mut w = ArchiveWriter {
        b: tar::Builder::new(out),
        upper: upper.to_path_buf(),
        links: HashMap::new(),
        entries: 0,
        exclude,
    };
    w.b.mode(tar::HeaderMode::Complete);
    w.b.follow_symlinks(false);
    w.b.sparse(true);
    let root = fs::symlink_metadata(upper)
        .map_err(ctx(format!("cannot stat upper dir {}", upper.display())))?;
    if !root.is_dir() {
        return Err(format!("upper {} is not a directory", upper.display()));
    }
    w.dir(Path::new(""), &root)?;
    w.b.finish().map_err(ctx("cannot finish the archive"))?;
    let n = w.entries;
    let out = w.b.into_inner().map_err(ctx("cannot finish the archive"))?;
    Ok((out, n))
}

struct ArchiveWriter<'a, W: Write> {
    b: tar::Builder<W>,
    upper: PathBuf,
    /// (dev, ino) of multiply-linked objects → their first path.
    links: HashMap<(u64, u64), PathBuf>,
    entries: u64,
    exclude: &'a Exclude,
}

/// Name of an object in the archive: `./` for the root, `rel` below.
fn archive_name(rel: &Path) -> PathBuf {
    if rel.as_os_str().is_empty() {
        PathBuf::from("./")
    } else {
        rel.to_path_buf()
    }
}

fn header_for(meta: &fs::Metadata) -> tar::Header {
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

impl<W: Write> ArchiveWriter<'_, W> {
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
        meta: &fs::Metadata,
        xattrs: Vec<(OsString, Vec<u8>)>,
    ) -> Result<(), String> {
        let mut recs: Vec<(String, Vec<u8>)> = vec![
            ("mtime".into(), time_record(meta.mtime(), meta.mtime_nsec())),
            ("atime".into(), time_record(meta.atime(), meta.atime_nsec())),
        ];
        for (name, value) in xattrs {
            match name.to_str() {
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

    fn dir(&mut self, rel: &Path, meta: &fs::Metadata) -> Result<(), String> {
        let full = self.full(rel);
        let xattrs = read_xattrs_path(&full)?;
        self.pax(rel, meta, xattrs)?;
        let mut h = header_for(meta);
        h.set_size(0);
        self.b
            .append_data(&mut h, archive_name(rel), io::empty())
            .map_err(ctx(format!("cannot archive {}", full.display())))?;
        self.entries += 1;
        let mut names: Vec<OsString> = fs::read_dir(&full)
            .map_err(ctx(format!("cannot list {}", full.display())))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()
            .map_err(ctx(format!("cannot list {}", full.display())))?;
        names.sort();
        for name in names {
            let child = rel.join(&name);
            if self.exclude.excludes(&child) {
                continue;
            }
            let cfull = self.full(&child);
            let m = match fs::symlink_metadata(&cfull) {
                Ok(m) => m,
                // Removed from outside meanwhile (only possible when the
                // upper is changed behind the mount's back).
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(ctx(format!("cannot stat {}", cfull.display()))(e)),
            };
            if m.is_dir() {
                self.dir(&child, &m)?;
            } else {
                self.non_dir(&child, &m)?;
            }
        }
        Ok(())
    }

    fn non_dir(&mut self, rel: &Path, meta: &fs::Metadata) -> Result<(), String> {
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
            let mut f =
                open_nofollow(&full).map_err(ctx(format!("cannot open {}", full.display())))?;
            let fm = f
                .metadata()
                .map_err(ctx(format!("cannot stat {}", full.display())))?;
            if !fm.is_file() || fm.ino() != meta.ino() {
                return Err(format!(
                    "{} changed while being archived (the upper was modified outside the mount); retry",
                    full.display()
                ));
            }
            let xattrs = read_xattrs_fd(&f, &full)?;
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
                    .append_file(&name, &mut f)
                    .map_err(ctx(format!("cannot archive {}", full.display())))?;
                let now = f.metadata().map(|m| m.len()).unwrap_or(0);
                if now != fm.len() {
                    return Err(changed());
                }
            } else {
                // Exactly the size in the header, whatever happens to the
                // file meanwhile: the archive stays well-formed.
                let mut h = header_for(&fm);
                let mut data = ExactReader {
                    inner: (&f).take(fm.len()),
                    short: false,
                };
                self.b
                    .append_data(&mut h, &name, &mut data)
                    .map_err(ctx(format!("cannot archive {}", full.display())))?;
                if data.short {
                    return Err(changed());
                }
            }
        } else if ft.is_symlink() {
            let target = fs::read_link(&full)
                .map_err(ctx(format!("cannot read symlink {}", full.display())))?;
            let xattrs = read_xattrs_path(&full)?;
            self.pax(rel, meta, xattrs)?;
            let mut h = header_for(meta);
            h.set_size(0);
            self.b
                .append_link(&mut h, &name, &target)
                .map_err(ctx(format!("cannot archive {}", full.display())))?;
        } else if ft.is_char_device() || ft.is_block_device() || ft.is_fifo() {
            let xattrs = read_xattrs_path(&full)?;
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

fn open_nofollow(p: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOATIME | libc::O_CLOEXEC)
        .open(p);
    match f {
        // O_NOATIME needs ownership of the file.
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(p),
        r => r,
    }
}

fn xattr_ctx(p: &Path) -> impl FnOnce(io::Error) -> String + '_ {
    move |e| format!("cannot read xattrs of {}: {e}", p.display())
}

/// Every xattr of `p` (never following a symlink), name order.
fn read_xattrs_path(p: &Path) -> Result<Vec<(OsString, Vec<u8>)>, String> {
    let mut out = Vec::new();
    let names = match xattr::list(p) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(out),
        Err(e) => return Err(xattr_ctx(p)(e)),
    };
    for n in names {
        if let Some(v) = xattr::get(p, &n).map_err(xattr_ctx(p))? {
            out.push((n, v));
        }
    }
    out.sort();
    Ok(out)
}

fn read_xattrs_fd(f: &File, p: &Path) -> Result<Vec<(OsString, Vec<u8>)>, String> {
    use xattr::FileExt;
    let mut out = Vec::new();
    let names = match f.list_xattr() {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(out),
        Err(e) => return Err(xattr_ctx(p)(e)),
    };
    for n in names {
        if let Some(v) = f.get_xattr(&n).map_err(xattr_ctx(p))? {
            out.push((n, v));
        }
    }
    out.sort();
    Ok(out)
}

/// Info about snapshot `id` from its file (entries not counted).
pub fn info_of(state: &Path, id: &str) -> Result<Info, String> {
    let p = path(state, id);
    let m = fs::symlink_metadata(&p).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            format!(
                "no snapshot `{id}` in {} (see: layerfs snapshot list WORKSPACE)",
                dir(state).display()
            )
        } else {
            ctx(format!("cannot stat {}", p.display()))(e)
        }
    })?;
    if !m.is_file() {
        return Err(format!("{} is not a regular file", p.display()));
    }
    Ok(Info {
        id: id.to_string(),
        size: m.len(),
        time: m.mtime(),
        entries: None,
    })
}

/// Counts the entries of an archive, reading only its headers.
pub fn count_entries(state: &Path, id: &str) -> Result<u64, String> {
    let p = path(state, id);
    let f = File::open(&p).map_err(ctx(format!("cannot open {}", p.display())))?;
    let mut ar = tar::Archive::new(f);
    let mut n = 0;
    for e in ar
        .entries_with_seek()
        .map_err(ctx(format!("cannot read {}", p.display())))?
    {
        e.map_err(ctx(format!("cannot read {}", p.display())))?;
        n += 1;
    }
    Ok(n)
}

/// Every snapshot in the state dir, oldest first (then by ID).
pub fn list(state: &Path, count: bool) -> Result<Vec<Info>, String> {
    let d = dir(state);
    let rd = match fs::read_dir(&d) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ctx(format!("cannot list {}", d.display()))(e)),
    };
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(ctx(format!("cannot list {}", d.display())))?;
        let name = e.file_name();
        let Some(id) = name.as_bytes().strip_suffix(b".tar") else {
            continue;
        };
        let Ok(id) = snapshot_id::validate(OsStr::from_bytes(id)) else {
            continue;
        };
        let mut info = match info_of(state, id) {
            Ok(i) => i,
            Err(_) => continue,
        };
        if count {
            info.entries = count_entries(state, id).ok();
        }
        out.push(info);
    }
    out.sort_by(|a, b| (a.time, &a.id).cmp(&(b.time, &b.id)));
    Ok(out)
}

/// Removes snapshot `id`.
pub fn remove(state: &Path, id: &str) -> Result<(), String> {
    info_of(state, id)?;
    let p = path(state, id);
    fs::remove_file(&p).map_err(ctx(format!("cannot remove {}", p.display())))?;
    fsync_dir(&dir(state)).map_err(ctx(format!("cannot sync {}", dir(state).display())))
}

/// Where a restore builds its staging tree: inside `work` when it is on
/// the upper's filesystem (mount cleans leftovers there), else beside the
/// upper.
fn staging_parent(upper: &Path, work: Option<&Path>) -> Result<PathBuf, String> {
    let upper_dev = fs::symlink_metadata(upper)
        .map_err(ctx(format!("cannot stat upper dir {}", upper.display())))?
        .dev();
    if let Some(w) = work {
        if fs::symlink_metadata(w).is_ok_and(|m| m.is_dir() && m.dev() == upper_dev) {
            return Ok(w.to_path_buf());
        }
    }
    let parent = upper
        .parent()
        .ok_or_else(|| format!("upper dir {} has no parent directory", upper.display()))?;
    let m =
        fs::symlink_metadata(parent).map_err(ctx(format!("cannot stat {}", parent.display())))?;
    if m.dev() != upper_dev {
        return Err(format!(
            "upper dir {} is a mount point: it cannot be replaced atomically; restore into a workspace whose upper is a plain directory",
            upper.display()
        ));
    }
    Ok(parent.to_path_buf())
}

/// A snapshot extracted into a staging directory beside the upper (on its
/// filesystem), synced, ready to be exchanged with it.
pub struct Staged {
    pub info: Info,
    /// Where the staging dir is (the work dir, or the upper's parent).
    pub parent: PathBuf,
    /// Its name there (`.layerfs-restore.PID.NANOS`).
    pub name: OsString,
}

impl Staged {
    pub fn path(&self) -> PathBuf {
        self.parent.join(&self.name)
    }
}

/// Extracts snapshot `id` into a new staging directory (in `work` when it
/// is on the upper's filesystem, else beside the upper) and syncs it. On
/// error nothing is left behind.
pub fn stage(
    upper: &Path,
    work: Option<&Path>,
    state: &Path,
    id: &str,
    progress: bool,
) -> Result<Staged, String> {
    snapshot_id::validate(OsStr::new(id))?;
    let info = info_of(state, id)?;
    let parent = staging_parent(upper, work)?;
    let staging_name = OsString::from(format!(
        "{}{}.{}",
        crate::daemon::restore::STAGING_PREFIX,
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    ));
    let staging = parent.join(&staging_name);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(ctx(format!(
            "cannot create staging dir {}",
            staging.display()
        )))?;
    // Invariant: every failure removes the staging tree.
    let extracted = (|| -> Result<(), String> {
        let p = path(state, id);
        let f = File::open(&p).map_err(ctx(format!("cannot open {}", p.display())))?;
        let bar = progress_bar(progress, Some(info.size), &format!("restoring {id}"));
        extract(BufReader::with_capacity(IO_BUF, bar.wrap_read(f)), &staging)
            .map_err(|e| format!("snapshot {}: {e}", p.display()))?;
        bar.finish_and_clear();
        let sfd =
            File::open(&staging).map_err(ctx(format!("cannot open {}", staging.display())))?;
        // One syncfs makes the whole staging tree durable before it
        // becomes the upper (cheaper than an fsync per file).
        // SAFETY: syncfs on an fd we own.
        if unsafe { libc::syncfs(sfd.as_raw_fd()) } != 0 {
            return Err(ctx(format!("cannot sync {}", staging.display()))(
                io::Error::last_os_error(),
            ));
        }
        Ok(())
    })();
    if let Err(e) = extracted {
        let _ = crate::layer::walk::remove_path(&staging);
        return Err(e);
    }
    Ok(Staged {
        info,
        parent,
        name: staging_name,
    })
}

/// Replaces the upper by the contents of snapshot `id`, atomically (see
/// the module invariants). The upper must not be in use by a daemon (a
/// live mount's daemon does the exchange itself: `daemon::restore`).
pub fn restore(
    upper: &Path,
    work: Option<&Path>,
    state: &Path,
    id: &str,
    progress: bool,
) -> Result<Info, String> {
    let upper_name = upper
        .file_name()
        .ok_or_else(|| format!("upper dir {} has no name", upper.display()))?;
    let upper_parent = upper
        .parent()
        .ok_or_else(|| format!("upper dir {} has no parent directory", upper.display()))?;
    let staged = stage(upper, work, state, id, progress)?;
    let staging = staged.path();
    let pfd = sys::open_root(&staged.parent)
        .map_err(ctx(format!("cannot open {}", staged.parent.display())))?;
    let ufd = sys::open_root(upper_parent)
        .map_err(ctx(format!("cannot open {}", upper_parent.display())))?;
    if let Err(e) = sys::renameat2(&pfd, &staged.name, &ufd, upper_name, sys::RENAME_EXCHANGE) {
        let _ = crate::layer::walk::remove_path(&staging);
        return Err(ctx(format!(
            "cannot exchange {} with upper dir {}",
            staging.display(),
            upper.display()
        ))(e));
    }
    for d in [upper_parent, staged.parent.as_path()] {
        fsync_dir(d).map_err(ctx(format!("cannot sync {}", d.display())))?;
    }
    // `staging` now holds the old upper.
    crate::layer::walk::remove_path(&staging).map_err(ctx(format!(
        "restored, but cannot remove the old upper (now {}); remove it by hand",
        staging.display()
    )))?;
    Ok(staged.info)
}

/// Metadata applied to a directory once everything beneath it exists.
struct DirMeta {
    path: PathBuf,
    mode: u32,
    uid: u32,
    gid: u32,
    times: [libc::timespec; 2],
}

fn parse_time(v: &[u8]) -> Option<libc::timespec> {
    let s = std::str::from_utf8(v).ok()?;
    let (secs, frac) = s.split_once('.').unwrap_or((s, "0"));
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

/// A relative path of the archive made safe: `./` prefixes dropped, only
/// normal components; "" is the root.
fn safe_rel(p: &Path) -> Result<PathBuf, String> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            _ => return Err(format!("unsafe path {:?} in the archive", p)),
        }
    }
    Ok(out)
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn lchown(p: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let c = cpath(p)?;
    // SAFETY: c is a valid C string; lchown never follows a symlink.
    if unsafe { libc::lchown(c.as_ptr(), uid, gid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_times(p: &Path, times: &[libc::timespec; 2]) -> io::Result<()> {
    let c = cpath(p)?;
    // SAFETY: c and times are valid; AT_SYMLINK_NOFOLLOW sets the link's own times.
    if unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn mknod(p: &Path, mode: u32, dev: libc::dev_t) -> io::Result<()> {
    let c = cpath(p)?;
    // SAFETY: c is a valid C string; mknod creates a new node (fails if present).
    if unsafe { libc::mknod(c.as_ptr(), mode, dev) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Sets owner, tolerating EPERM for an unprivileged caller (objects keep
/// the caller as owner, as the daemon's own objects do).
fn chown_tolerant(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) && !is_root() => Ok(()),
        r => r,
    }
}

fn set_xattr_on(
    set: impl Fn(&OsStr, &[u8]) -> io::Result<()>,
    name: &OsStr,
    value: &[u8],
    p: &Path,
) -> io::Result<()> {
    match set(name, value) {
        // security.* labels and capabilities need privileges the caller
        // may not have; they are not part of the overlay's view.
        Err(_) if name.as_bytes().starts_with(b"security.") && !is_root() => {
            eprintln!(
                "layerfs snapshot: warning: cannot restore xattr {:?} of {}",
                name,
                p.display()
            );
            Ok(())
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("cannot set xattr {:?} on {}: {e}", name, p.display()),
        )),
        Ok(()) => Ok(()),
    }
}

/// Extracts an archive made by `write_archive` into the existing, empty
/// directory `dst` (its root entry sets `dst`'s own metadata).
pub fn extract<R: Read>(r: R, dst: &Path) -> Result<u64, String> {
    let mut ar = tar::Archive::new(r);
    ar.set_preserve_mtime(false);
    ar.set_preserve_permissions(false);
    ar.set_preserve_ownerships(false);
    ar.set_unpack_xattrs(false);
    ar.set_overwrite(false);
    let mut dirs: HashSet<PathBuf> = HashSet::new();
    let mut files: HashSet<PathBuf> = HashSet::new();
    let mut dir_meta: Vec<DirMeta> = Vec::new();
    let mut n = 0u64;
    let mut saw_root = false;
    for entry in ar.entries().map_err(ctx("cannot read the archive"))? {
        let mut entry = entry.map_err(ctx("cannot read the archive"))?;
        let raw_path = entry
            .path()
            .map_err(ctx("bad path in the archive"))?
            .into_owned();
        let rel = safe_rel(&raw_path)?;
        let kind = entry.header().entry_type();
        let h = entry.header();
        let mode = h.mode().map_err(ctx("bad mode in the archive"))? & 0o7777;
        let uid = h.uid().map_err(ctx("bad uid in the archive"))? as u32;
        let gid = h.gid().map_err(ctx("bad gid in the archive"))? as u32;
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
                } else if key == b"mtime" {
                    times[1] = parse_time(ext.value_bytes()).unwrap_or(times[1]);
                } else if key == b"atime" {
                    times[0] = parse_time(ext.value_bytes()).unwrap_or(times[0]);
                }
            }
        }
        let full = if rel.as_os_str().is_empty() {
            dst.to_path_buf()
        } else {
            dst.join(&rel)
        };
        if rel.as_os_str().is_empty() {
            if !kind.is_dir() || saw_root {
                return Err(format!("unexpected root entry {:?}", raw_path));
            }
            saw_root = true;
        } else {
            let parent = rel.parent().unwrap_or(Path::new(""));
            if !dirs.contains(parent) {
                return Err(format!(
                    "entry {:?} does not follow its directory in the archive",
                    raw_path
                ));
            }
        }
        let io_err = |what: &str| {
            let full = full.clone();
            let what = what.to_string();
            move |e: io::Error| format!("cannot {what} {}: {e}", full.display())
        };
        match kind {
            tar::EntryType::Directory => {
                if !rel.as_os_str().is_empty() {
                    fs::DirBuilder::new()
                        .mode(0o700)
                        .create(&full)
                        .map_err(io_err("create directory"))?;
                }
                for (k, v) in &xattrs {
                    set_xattr_on(|k, v| xattr::set(&full, k, v), k, v, &full)
                        .map_err(|e| e.to_string())?;
                }
                dirs.insert(rel.clone());
                dir_meta.push(DirMeta {
                    path: full,
                    mode,
                    uid,
                    gid,
                    times,
                });
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let f = match entry.unpack(&full).map_err(io_err("write"))? {
                    tar::Unpacked::File(f) => f,
                    _ => return Err(format!("cannot write {}", full.display())),
                };
                use std::os::unix::fs::fchown;
                use xattr::FileExt;
                if !xattrs.is_empty() && !is_root() {
                    // user.* xattrs need write permission on the file.
                    f.set_permissions(fs::Permissions::from_mode(0o600))
                        .map_err(io_err("chmod"))?;
                }
                chown_tolerant(fchown(&f, Some(uid), Some(gid))).map_err(io_err("chown"))?;
                for (k, v) in &xattrs {
                    set_xattr_on(|k, v| f.set_xattr(k, v), k, v, &full)
                        .map_err(|e| e.to_string())?;
                }
                // After chown, which clears setuid/setgid.
                f.set_permissions(fs::Permissions::from_mode(mode))
                    .map_err(io_err("chmod"))?;
                sys::futimens(&f, &times).map_err(io_err("set times of"))?;
                files.insert(rel.clone());
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(ctx("bad link name in the archive"))?
                    .ok_or_else(|| format!("hard link {:?} without a target", raw_path))?;
                let trel = safe_rel(&target)?;
                if !files.contains(&trel) {
                    return Err(format!(
                        "hard link {:?} names {:?}, which is not an earlier file of the archive",
                        raw_path, target
                    ));
                }
                fs::hard_link(dst.join(&trel), &full).map_err(io_err("link"))?;
                files.insert(rel.clone());
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(ctx("bad link target in the archive"))?
                    .ok_or_else(|| format!("symlink {:?} without a target", raw_path))?;
                std::os::unix::fs::symlink(&target, &full).map_err(io_err("create symlink"))?;
                chown_tolerant(lchown(&full, uid, gid)).map_err(io_err("chown"))?;
                for (k, v) in &xattrs {
                    set_xattr_on(|k, v| xattr::set(&full, k, v), k, v, &full)
                        .map_err(|e| e.to_string())?;
                }
                set_times(&full, &times).map_err(io_err("set times of"))?;
                files.insert(rel.clone());
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                let h = entry.header();
                let major = h.device_major().ok().flatten().unwrap_or(0);
                let minor = h.device_minor().ok().flatten().unwrap_or(0);
                let fmt = match kind {
                    tar::EntryType::Char => libc::S_IFCHR,
                    tar::EntryType::Block => libc::S_IFBLK,
                    _ => libc::S_IFIFO,
                };
                mknod(&full, fmt | 0o600, libc::makedev(major, minor))
                    .map_err(io_err("create device node"))?;
                chown_tolerant(lchown(&full, uid, gid)).map_err(io_err("chown"))?;
                for (k, v) in &xattrs {
                    set_xattr_on(|k, v| xattr::set(&full, k, v), k, v, &full)
                        .map_err(|e| e.to_string())?;
                }
                fs::set_permissions(&full, fs::Permissions::from_mode(mode))
                    .map_err(io_err("chmod"))?;
                set_times(&full, &times).map_err(io_err("set times of"))?;
                files.insert(rel.clone());
            }
            tar::EntryType::XGlobalHeader => continue,
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
    // Deepest first, so setting a directory's times comes after every
    // change beneath it, and a read-only mode after its children exist.
    for d in dir_meta.iter().rev() {
        let err = |what: &str| {
            let p = d.path.clone();
            let what = what.to_string();
            move |e: io::Error| format!("cannot {what} {}: {e}", p.display())
        };
        chown_tolerant(lchown(&d.path, d.uid, d.gid)).map_err(err("chown"))?;
        fs::set_permissions(&d.path, fs::Permissions::from_mode(d.mode)).map_err(err("chmod"))?;
        set_times(&d.path, &d.times).map_err(err("set times of"))?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        fs::create_dir(&dst).unwrap();
        let r = extract(&archive(entries)[..], &dst);
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
    fn exclude_globs() {
        let e = Exclude::new(&["tmp/**".into(), "**/*.log".into(), "/cache".into()]).unwrap();
        for p in ["tmp/a", "tmp/a/b", "x.log", "a/b/c.log", "cache"] {
            assert!(e.excludes(Path::new(p)), "{p}");
        }
        for p in ["tmp", "a/tmp/x", "log", "cache2", "a/cache"] {
            assert!(!e.excludes(Path::new(p)), "{p}");
        }
        assert!(!Exclude::new(&[]).unwrap().excludes(Path::new("x")));
        assert!(Exclude::new(&["a/[".into()]).is_err());
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
