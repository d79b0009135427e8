//! Extracting an archive beneath a checked directory under the
//! workspace's policy (see the module invariants above).

use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::ffi::{CString, OsStr, OsString};
use std::hash::BuildHasher;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::chain::{child_rel, Chain};
use super::report::{is_root, xattr_verdict, Kind, Report};
use super::{ctx, plain, SnapshotError, PAX_XATTR, PAX_XATTR_HEX};
use crate::layer::ops::{self};
use crate::layer::safedir::SafeDir;
use crate::layer::sys;
use crate::policy::Policy;

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
    pub fn of(p: &Path) -> Result<RootMeta, SnapshotError> {
        let m =
            std::fs::symlink_metadata(p).map_err(ctx(format!("cannot stat {}", p.display())))?;
        if !m.is_dir() {
            return Err(format!("{} is not a directory", p.display()).into());
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
    fn owner(
        &mut self,
        fd: &impl AsFd,
        uid: u32,
        gid: u32,
        rel: &Path,
    ) -> Result<(), SnapshotError> {
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
            Err(e) => Err(format!("cannot chown {:?}: {e}", rel).into()),
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
    ) -> Result<(), SnapshotError> {
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
                        .map_err(plain(format!("cannot set xattr {shown:?} on {rel:?}")))?;
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
    ) -> Result<(), SnapshotError> {
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
                .map_err(plain(format!("cannot stat {:?}", chain.path)))?;
        }
        Ok(())
    }

    /// Applies the current directory's deferred mode and times.
    fn finish_dir(&mut self, chain: &mut Chain<Option<DirMeta>>) -> Result<(), SnapshotError> {
        let Some(m) = chain.meta_mut().take() else {
            return Ok(());
        };
        let shown = PathBuf::from(OsStr::from_bytes(&chain.path));
        let fd = chain
            .fd()
            .map_err(plain(format!("cannot reopen {shown:?}")))?;
        sys::fchmod(fd, m.mode).map_err(plain(format!("cannot chmod {shown:?}")))?;
        sys::futimens(fd, &m.times).map_err(plain(format!("cannot set times of {shown:?}")))
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

fn duplicate(raw: &Path) -> SnapshotError {
    SnapshotError::Archive(format!(
        "entry {:?} appears twice in the archive (or replaces an earlier one)",
        raw
    ))
}

/// The walk's directories: each level carries the mode and times it gets
/// once everything beneath it exists.
type Dirs = Chain<Option<DirMeta>>;

/// One entry's header and PAX records, read before anything is made.
struct EntryMeta {
    /// The path as the archive spells it (for messages).
    raw_path: PathBuf,
    /// The same made safe (`safe_rel`); "" is the root.
    rel: PathBuf,
    mode: u32,
    uid: u32,
    gid: u32,
    /// atime, mtime: the header's whole seconds unless a PAX record is
    /// finer.
    times: [libc::timespec; 2],
    xattrs: Vec<(OsString, Vec<u8>)>,
}

impl EntryMeta {
    fn read<R: Read>(entry: &mut tar::Entry<'_, R>) -> Result<EntryMeta, SnapshotError> {
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
            return Err(format!("entry {:?} has an impossible owner {uid}:{gid}", raw_path).into());
        };
        let hdr_mtime = h.mtime().unwrap_or(0) as i64;
        let whole = libc::timespec {
            tv_sec: hdr_mtime,
            tv_nsec: 0,
        };
        let mut times = [whole, whole];
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
        Ok(EntryMeta {
            raw_path,
            rel,
            mode,
            uid,
            gid,
            times,
            xattrs,
        })
    }

    /// The message for a failed system call while making this entry (an
    /// existing name is a duplicate entry).
    fn io_err(&self, what: &str) -> impl FnOnce(io::Error) -> SnapshotError + '_ {
        let what = what.to_string();
        move |source: io::Error| {
            if source.raw_os_error() == Some(libc::EEXIST) {
                duplicate(&self.raw_path)
            } else {
                SnapshotError::Io {
                    what: format!("cannot {what} {:?}", self.raw_path),
                    source,
                    hint: "",
                }
            }
        }
    }
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
) -> Result<u64, SnapshotError> {
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
    let mut chain: Dirs = Chain::new(root_fd, None);
    let mut ex = Extractor {
        policy,
        report,
        skipped: HashSet::new(),
        hasher: RandomState::new(),
    };
    let mut n = 0u64;
    // Set once the root entry is read (it must come first).
    let mut root_times: Option<[libc::timespec; 2]> = None;
    for entry in ar.entries().map_err(ctx("cannot read the archive"))? {
        let mut entry = entry.map_err(ctx("cannot read the archive"))?;
        let kind = entry.header().entry_type();
        if kind == tar::EntryType::XGlobalHeader {
            continue;
        }
        let m = EntryMeta::read(&mut entry)?;
        if m.rel.as_os_str().is_empty() {
            if !kind.is_dir() || root_times.is_some() || n > 0 {
                return Err(SnapshotError::Archive(format!(
                    "unexpected root entry {:?}",
                    m.raw_path
                )));
            }
            ex.root_entry(&mut chain, &m, root)?;
            root_times = Some(m.times);
        } else if root_times.is_none() {
            return Err(SnapshotError::Archive(
                "the archive has no root entry `./` first: not a layerfs snapshot".into(),
            ));
        } else {
            ex.entry(&mut chain, &mut entry, kind, &m)?;
        }
        n += 1;
    }
    if root_times.is_none() {
        return Err(SnapshotError::Archive(
            "the archive has no root entry `./`: not a layerfs snapshot".into(),
        ));
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

/// Making one entry of each kind. A handler that leaves the entry out
/// reports it (`skip`) and returns `Ok`; an error fails the restore.
impl Extractor<'_> {
    /// The archive's root entry: its xattrs go on the staging dir; its mode
    /// and owner are the upper root's own (`root`), reported if they differ.
    fn root_entry(
        &mut self,
        chain: &mut Dirs,
        m: &EntryMeta,
        root: RootMeta,
    ) -> Result<(), SnapshotError> {
        let fd = chain.fd().map_err(ctx("cannot open the staging dir"))?;
        let fd = fd.try_clone().map_err(ctx("cannot open the staging dir"))?;
        self.xattrs(&fd, Kind::Dir, &m.xattrs, &m.rel)?;
        let (mode, uid, gid) = (m.mode, m.uid, m.gid);
        if (mode, uid, gid) != (root.mode, root.uid, root.gid) {
            self.report.add(
                &m.rel,
                "root-kept",
                format!(
                    "the archive's root has mode {mode:04o} and owner {uid}:{gid}; the \
                     upper's root keeps mode {:04o} and owner {}:{}",
                    root.mode, root.uid, root.gid
                ),
            );
        }
        Ok(())
    }

    /// Any entry but the root: the chain is moved to its parent (which must
    /// be a directory extracted before it), then it is made by its kind.
    fn entry<R: Read>(
        &mut self,
        chain: &mut Dirs,
        entry: &mut tar::Entry<'_, R>,
        kind: tar::EntryType,
        m: &EntryMeta,
    ) -> Result<(), SnapshotError> {
        let bytes = m.rel.as_os_str().as_bytes();
        let (parent, name) = match bytes.iter().rposition(|&b| b == b'/') {
            Some(i) => (&bytes[..i], &bytes[i + 1..]),
            None => (&b""[..], bytes),
        };
        let name = OsStr::from_bytes(name);
        self.navigate(chain, parent).map_err(|e| {
            SnapshotError::Archive(format!(
                "entry {:?} does not follow its directory in the archive: {e}",
                m.raw_path
            ))
        })?;
        match kind {
            tar::EntryType::Directory => self.directory(chain, name, m),
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                self.regular(chain, entry, name, m)
            }
            tar::EntryType::Link => self.hard_link(chain, entry, name, m),
            tar::EntryType::Symlink => self.symlink(chain, entry, name, m),
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                self.node(chain, entry, kind, name, m)
            }
            other => Err(format!("entry {:?} has unsupported type {:?}", m.raw_path, other).into()),
        }
    }

    fn directory(
        &mut self,
        chain: &mut Dirs,
        name: &OsStr,
        m: &EntryMeta,
    ) -> Result<(), SnapshotError> {
        let fd = {
            let parent = chain.fd().map_err(m.io_err("reopen the parent of"))?;
            sys::mkdirat(parent, name, 0o700).map_err(m.io_err("create directory"))?;
            sys::open_beneath(parent, name, libc::O_PATH | libc::O_DIRECTORY, 0)
                .map_err(m.io_err("open directory"))?
        };
        self.owner(&fd, m.uid, m.gid, &m.rel)?;
        self.xattrs(&fd, Kind::Dir, &m.xattrs, &m.rel)?;
        // The chain enters the new directory: in the archive's depth-first
        // order, its contents come next.
        chain
            .push(
                name.to_os_string(),
                fd,
                Some(DirMeta {
                    mode: self.policy.allowed_mode(m.mode, true),
                    times: m.times,
                }),
            )
            .map_err(m.io_err("stat directory"))
    }

    fn regular<R: Read>(
        &mut self,
        chain: &mut Dirs,
        entry: &mut tar::Entry<'_, R>,
        name: &OsStr,
        m: &EntryMeta,
    ) -> Result<(), SnapshotError> {
        let target = {
            let parent = chain.fd().map_err(m.io_err("reopen the parent of"))?;
            let mut p = PathBuf::from(format!("/proc/self/fd/{}", parent.as_raw_fd()));
            p.push(name);
            p
        };
        // Created with O_EXCL through the parent's descriptor; the tar
        // reader writes the data and seeks over holes.
        let f = match entry.unpack(&target) {
            Ok(tar::Unpacked::File(f)) => f,
            Ok(_) => return Err(format!("cannot write {:?}", m.raw_path).into()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(duplicate(&m.raw_path))
            }
            Err(e) => return Err(format!("cannot write {:?}: {e}", m.raw_path).into()),
        };
        if !m.xattrs.is_empty() && !is_root() {
            // user.* xattrs need write permission on the file.
            sys::fchmod(&f, 0o600).map_err(m.io_err("chmod"))?;
        }
        self.owner(&f, m.uid, m.gid, &m.rel)?;
        self.xattrs(&f, Kind::File, &m.xattrs, &m.rel)?;
        // After chown, which clears setuid/setgid.
        let allowed = self.file_mode(m.mode, &m.rel);
        sys::fchmod(&f, allowed).map_err(m.io_err("chmod"))?;
        sys::futimens(&f, &m.times).map_err(m.io_err("set times of"))
    }

    fn hard_link<R: Read>(
        &mut self,
        chain: &mut Dirs,
        entry: &mut tar::Entry<'_, R>,
        name: &OsStr,
        m: &EntryMeta,
    ) -> Result<(), SnapshotError> {
        let (rel, raw_path) = (&m.rel, &m.raw_path);
        let target = entry
            .link_name()
            .map_err(ctx("bad link name in the archive"))?
            .ok_or_else(|| format!("hard link {:?} without a target", raw_path))?
            .into_owned();
        let trel = safe_rel(&target)?;
        if trel.as_os_str().is_empty() {
            return Err(format!("hard link {:?} names the root", raw_path).into());
        }
        if self.was_skipped(&trel) {
            self.skip(
                rel,
                "link-skipped",
                format!("a hard link to {:?}, which was left out", trel),
            );
            return Ok(());
        }
        let not_earlier = || {
            SnapshotError::Archive(format!(
                "hard link {:?} names {:?}, which is not an earlier file of the archive",
                raw_path, target
            ))
        };
        let (tdir, tname) = open_parent_of(&chain.root, &trel).map_err(|_| not_earlier())?;
        let st = sys::fstatat(&tdir, tname).map_err(|_| not_earlier())?;
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            return Err(not_earlier());
        }
        // A hard link to a symlink is that symlink at a new name, where its
        // target may lead out: checked again there.
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            let link_target = sys::open_path(&tdir, tname)
                .and_then(|fd| sys::readlink_fd(&fd))
                .map_err(m.io_err("read the symlink linked by"))?;
            if let Err(d) = self
                .policy
                .check_symlink(&rel.to_string_lossy(), &link_target)
            {
                self.skip(
                    rel,
                    "symlink-skipped",
                    format!(
                        "a hard link to the symlink {:?}, which points at {:?}: outside what \
                         the policy allows from here ({})",
                        trel, link_target, d.rule
                    ),
                );
                return Ok(());
            }
        }
        let parent = chain.fd().map_err(m.io_err("reopen the parent of"))?;
        sys::linkat(&tdir, tname, parent, name).map_err(m.io_err("link"))
    }

    fn symlink<R: Read>(
        &mut self,
        chain: &mut Dirs,
        entry: &mut tar::Entry<'_, R>,
        name: &OsStr,
        m: &EntryMeta,
    ) -> Result<(), SnapshotError> {
        let target = entry
            .link_name()
            .map_err(ctx("bad link target in the archive"))?
            .ok_or_else(|| format!("symlink {:?} without a target", m.raw_path))?
            .into_owned();
        if let Err(d) = self
            .policy
            .check_symlink(&m.rel.to_string_lossy(), target.as_os_str())
        {
            self.skip(
                &m.rel,
                "symlink-skipped",
                format!(
                    "it points at {:?}, outside what the policy allows ({})",
                    target, d.rule
                ),
            );
            return Ok(());
        }
        let parent = chain.fd().map_err(m.io_err("reopen the parent of"))?;
        let parent = parent
            .try_clone()
            .map_err(m.io_err("reopen the parent of"))?;
        sys::symlinkat(target.as_os_str(), &parent, name).map_err(m.io_err("create symlink"))?;
        let fd = sys::open_path(&parent, name).map_err(m.io_err("open symlink"))?;
        self.owner(&fd, m.uid, m.gid, &m.rel)?;
        self.xattrs(&fd, Kind::Symlink, &m.xattrs, &m.rel)?;
        sys::utimensat_nofollow(&parent, name, &m.times).map_err(m.io_err("set times of"))
    }

    /// A character or block device (a 0/0 character device is a whiteout,
    /// always made) or a fifo.
    fn node<R: Read>(
        &mut self,
        chain: &mut Dirs,
        entry: &mut tar::Entry<'_, R>,
        kind: tar::EntryType,
        name: &OsStr,
        m: &EntryMeta,
    ) -> Result<(), SnapshotError> {
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
            if let Err(d) = self.policy.check_device() {
                self.skip(
                    &m.rel,
                    "device-skipped",
                    format!("a {what} device {major}:{minor} ({})", d.rule),
                );
                return Ok(());
            }
        }
        let parent = chain.fd().map_err(m.io_err("reopen the parent of"))?;
        let parent = parent
            .try_clone()
            .map_err(m.io_err("reopen the parent of"))?;
        match sys::mknodat(&parent, name, fmt | 0o600, rdev) {
            Ok(()) => {}
            Err(e) if device && e.raw_os_error() == Some(libc::EPERM) => {
                self.skip(
                    &m.rel,
                    "device-skipped",
                    format!("a {what} device {major}:{minor}: you may not create it ({e})"),
                );
                return Ok(());
            }
            Err(e) => return Err(m.io_err("create node")(e)),
        }
        let fd = sys::open_path(&parent, name).map_err(m.io_err("open node"))?;
        self.owner(&fd, m.uid, m.gid, &m.rel)?;
        self.xattrs(&fd, Kind::Node, &m.xattrs, &m.rel)?;
        let allowed = self.file_mode(m.mode, &m.rel);
        sys::fchmod(&fd, allowed).map_err(m.io_err("chmod"))?;
        sys::utimensat_nofollow(&parent, name, &m.times).map_err(m.io_err("set times of"))
    }
}

/// Bytes from lowercase or uppercase hex (`PAX_XATTR_HEX`).
pub(super) fn unhex(v: &[u8]) -> Option<Vec<u8>> {
    if !v.len().is_multiple_of(2) {
        return None;
    }
    v.chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).ok()?, 16).ok())
        .collect()
}

/// A PAX time record (`SECS[.FRACTION]`); `None` for anything else (the
/// header's whole seconds then stand).
pub(super) fn parse_time(v: &[u8]) -> Option<libc::timespec> {
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
pub(super) fn safe_rel(p: &Path) -> Result<PathBuf, SnapshotError> {
    let b = p.as_os_str().as_bytes();
    if b.first() == Some(&b'/') {
        return Err(SnapshotError::Archive(format!(
            "unsafe path {:?} in the archive",
            p
        )));
    }
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    for c in b.split(|&x| x == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                return Err(SnapshotError::Archive(format!(
                    "unsafe path {:?} in the archive",
                    p
                )))
            }
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
