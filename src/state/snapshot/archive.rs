//! Saving: the tar of the upper written into `snapshots/` (what an archive
//! keeps is listed in the module above).

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::chain::{child_rel, names_rev, Chain};
use super::store::{
    dir, file_name, info_in, remove_stale_tmps, snapshots_dir, tmp_name, Info, SaveOptions,
};
use super::{ctx, progress_bar, SnapshotError, IO_BUF, PAX_XATTR, PAX_XATTR_HEX};
use crate::layer::safedir::SafeDir;
use crate::layer::sys;
use crate::state::scratch::Scratch;
use crate::state::snapshot_id;

/// Writes snapshot `id` of the upper into the checked state dir. The
/// caller holds whatever makes the upper still (the daemon's write pause,
/// or no mount) for the duration of the call.
pub fn save(
    upper: &Path,
    state: &SafeDir,
    id: &str,
    opts: &SaveOptions,
) -> Result<Info, SnapshotError> {
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
        )
        .into());
    }
    remove_stale_tmps(&d);
    let tmp = tmp_name(id);
    let tmp_path = d.shown(&tmp);
    let f = d
        .open_file(&tmp, libc::O_WRONLY | libc::O_CREAT, 0o600)
        .map_err(ctx(format!("cannot create {}", tmp_path.display())))?;
    crate::sys::flock(&f, libc::LOCK_EX | libc::LOCK_NB).map_err(|_| {
        format!(
            "another `snapshot save` of `{id}` is running (it holds {}); wait for it to finish",
            tmp_path.display()
        )
    })?;
    // Invariant: from here on, every failure removes the temporary file.
    let result = (|| -> Result<u64, SnapshotError> {
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
            ).into());
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

/// Writes the tar of `upper` to `out`: the root as `./`, then every object
/// depth-first in name order, a directory before what it holds. Returns the
/// writer and the number of entries. Iterative, every object reached
/// relative to its parent's descriptor (`Chain`).
pub fn write_archive<W: Write>(
    upper: &Path,
    out: W,
    exclude: &Scratch,
) -> Result<(W, u64), SnapshotError> {
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
        return Err(format!("upper {} is not a directory", upper.display()).into());
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

pub(super) fn time_record(secs: i64, nsec: i64) -> Vec<u8> {
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
    ) -> Result<(), SnapshotError> {
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
    fn dir(&mut self, f: &File, rel: &Path, meta: &std::fs::Metadata) -> Result<(), SnapshotError> {
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
    fn non_dir(
        &mut self,
        f: &File,
        rel: &Path,
        meta: &std::fs::Metadata,
    ) -> Result<(), SnapshotError> {
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
                SnapshotError::Refused(format!(
                    "{} changed size while being archived (the upper was modified outside the mount); retry",
                    full.display()
                ))
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
fn read_xattrs(fd: &impl AsRawFd, p: &Path) -> Result<Vec<(OsString, Vec<u8>)>, SnapshotError> {
    let err = |e: io::Error| ctx(format!("cannot read xattrs of {}", p.display()))(e);
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
