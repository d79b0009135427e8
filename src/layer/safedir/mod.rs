//! Checked directories: the state dir, the work dir, `snapshots/`, the
//! mountpoint `layerfs run` makes beside an upper, the pid directory. They
//! usually sit beside the upper, in a directory other users may be able to
//! write (`--upper /tmp/x`), so none is trusted as found.
//!
//! A `SafeDir` is opened once, checked, and then used only through its file
//! descriptor:
//! - the directory is reached from its parent with `O_NOFOLLOW |
//!   O_DIRECTORY` (created first with `mkdirat`, mode 0700, when the caller
//!   asks), so a symbolic link planted at its name is refused, never
//!   followed;
//! - it must be owned by the user running layerfs, or by root (root could
//!   change anything anyway); a root caller accepts only root's own, so
//!   another user can never steer root's writes through a directory they
//!   own;
//! - it must not be writable by group or others, who could otherwise swap
//!   files inside it (a snapshot between `save` and `restore`, say);
//! - everything inside is reached relative to the descriptor: `openat2`
//!   beneath it with `O_NOFOLLOW` and no symlinks, `mkdirat`, `renameat2`,
//!   `unlinkat`; the callers that can only take a path (SQLite, a Unix
//!   socket's bind and connect, the tar reader's file creation) get
//!   `/proc/self/fd/N/NAME`, which the kernel resolves through the very
//!   directory the descriptor holds, whatever happens to its name.
//!
//! Where layerfs itself must name the directory by path later (`layerfs
//! run` hands its mountpoint to mount(2); a staging dir beside the upper is
//! exchanged with it by name), `SafeDir::create_stable` also requires that
//! nobody else can rename anything on the way to it: every directory from
//! `/` down to the parent is owned by the caller or root and is either not
//! writable by group and others or sticky (as `/tmp` is: there nobody may
//! rename or remove another user's entries).
//!
//! Each refusal names the directory, says what is wrong and how to fix it.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::sys;

mod error;
pub use error::SafeDirError;

/// What a checked directory is for: names it in messages and says how to
/// fix a refused one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The workspace state directory (`--state`).
    State,
    /// The work directory (`--work`).
    Work,
    /// `snapshots/` in the state directory.
    Snapshots,
    /// The mountpoint `layerfs run` keeps beside an upper.
    RunMountpoint,
    /// A restore's staging directory, or the directory that holds it.
    Staging,
    /// The directory of a daemon's pid file.
    PidDir,
    /// A store of frozen layers (checkpoints): `layers/` in the state
    /// directory or `--layers DIR`.
    Layers,
}

impl Role {
    fn what(self) -> &'static str {
        match self {
            Role::State => "state dir",
            Role::Work => "work dir",
            Role::Snapshots => "snapshots dir",
            Role::RunMountpoint => "run mountpoint",
            Role::Staging => "staging dir",
            Role::PidDir => "pid dir",
            Role::Layers => "layer store",
        }
    }

    /// The way out besides removing the offending directory.
    fn elsewhere(self) -> &'static str {
        match self {
            Role::State | Role::Snapshots => {
                ", or give --state DIR in a directory only you can write"
            }
            Role::Work => ", or give --work DIR in a directory only you can write",
            Role::RunMountpoint => {
                ", or keep the upper in a directory only you can write (or use --ephemeral)"
            }
            Role::Staging => ", or keep the upper in a directory only you can write",
            Role::PidDir => "",
            Role::Layers => ", or give --layers DIR in a directory only you can write",
        }
    }
}

/// An open, checked directory (see the module comment). The descriptor is
/// `O_PATH`: enough for every `*at` call and for `/proc/self/fd/N` paths.
pub struct SafeDir {
    fd: OwnedFd,
    path: PathBuf,
    role: Role,
    dev: u64,
    ino: u64,
    uid: u32,
    /// A user trusted besides the caller and root (`open_trusting`),
    /// also for the directories inside.
    extra: Option<u32>,
}

impl fmt::Debug for SafeDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SafeDir")
            .field("path", &self.path)
            .field("role", &self.role)
            .field("fd", &self.fd.as_raw_fd())
            .finish()
    }
}

impl PartialEq for SafeDir {
    fn eq(&self, other: &Self) -> bool {
        (self.dev, self.ino) == (other.dev, other.ino)
    }
}

impl Eq for SafeDir {}

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Whether a directory owned by `uid` may hold layerfs's state for the
/// caller: the caller's own, or root's.
pub fn trusted_owner(uid: u32) -> bool {
    uid == euid() || uid == 0
}

/// `uid 1001 (tests)`.
fn who(uid: u32) -> String {
    match nix::unistd::User::from_uid(uid.into()) {
        Ok(Some(u)) => format!("uid {uid} ({})", u.name),
        _ => format!("uid {uid}"),
    }
}

fn shell_quote(p: &Path) -> String {
    let s = p.to_string_lossy();
    if s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@,".contains(&b))
    {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Why an existing directory is refused, or `None` when it passes: the
/// owner and mode rules of the module comment (`extra`: one more trusted
/// owner, see `open_trusting`).
fn leaf_problem(st: &sys::Stat, extra: Option<u32>) -> Option<String> {
    if !trusted_owner(st.st_uid) && extra != Some(st.st_uid) {
        if euid() == 0 {
            let name = nix::unistd::User::from_uid(st.st_uid.into())
                .ok()
                .flatten()
                .map_or_else(|| st.st_uid.to_string(), |u| u.name);
            return Some(format!(
                "belongs to {}, not to root: layerfs running as root never uses another \
                 user's directory, which that user could redirect. If the workspace is that \
                 user's, run the command as them (`setpriv --reuid={name} --regid={name} \
                 --init-groups layerfs …`); if not, someone planted it",
                who(st.st_uid)
            ));
        }
        return Some(format!(
            "belongs to {}, not to you ({}): another user may have planted it",
            who(st.st_uid),
            who(euid())
        ));
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        let by = match (mode & 0o020 != 0, mode & 0o002 != 0) {
            (true, true) => "group and others",
            (true, false) => "its group",
            _ => "others",
        };
        return Some(format!(
            "is writable by {by} (mode {mode:04o}): they could replace what layerfs keeps in it"
        ));
    }
    None
}

/// How to fix a refused directory.
fn fix(path: &Path, problem_is_mode: bool, role: Role) -> String {
    if problem_is_mode {
        format!(
            "check what it holds and run `chmod go-w {}`{}",
            shell_quote(path),
            role.elsewhere()
        )
    } else {
        format!(
            "check what it holds and remove it (`rm -r {}`; a directory in a sticky \
             directory like /tmp can only be removed by its owner or root){}",
            shell_quote(path),
            role.elsewhere()
        )
    }
}

/// Splits `path` (made absolute, `.` dropped) into its parent and its last
/// name, which must be a plain name.
fn split(path: &Path, role: Role) -> Result<(PathBuf, OsString, PathBuf), SafeDirError> {
    let abs = std::path::absolute(path).map_err(|e| SafeDirError::io(role, path, e))?;
    let abs: PathBuf = abs
        .components()
        .filter(|c| *c != Component::CurDir)
        .collect();
    match (abs.parent(), abs.components().next_back()) {
        (Some(parent), Some(Component::Normal(name))) => {
            Ok((parent.to_path_buf(), name.to_os_string(), abs.clone()))
        }
        _ => Err(SafeDirError::NoPlainName {
            role,
            path: path.to_path_buf(),
        }),
    }
}

fn o_path_dir() -> i32 {
    libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW
}

impl SafeDir {
    /// Opens the existing directory `path` and checks it; `Ok(None)` when
    /// nothing is at that name.
    pub fn open(path: &Path, role: Role) -> Result<Option<SafeDir>, SafeDirError> {
        Self::open_trusting(path, role, None)
    }

    /// `open`, trusting the user `extra` as well as the caller and root
    /// (here and in `subdir`s). For a root caller looking at the state of
    /// a workspace whose owner controls it anyway (the caller then checks
    /// that the workspace is that user's); what root writes goes through
    /// strictly checked directories only (the work dir, `stable` ones).
    pub fn open_trusting(
        path: &Path,
        role: Role,
        extra: Option<u32>,
    ) -> Result<Option<SafeDir>, SafeDirError> {
        let (parent, name, abs) = split(path, role)?;
        let pfd = match sys::open_root(&parent) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(SafeDirError::io(role, &abs, e)),
        };
        Self::open_in(&pfd, &name, abs, role, extra)
    }

    /// Opens `path`, creating it first (mode `mode`, never more than
    /// 0755) when it is missing; returns whether it was created. The
    /// parent must exist.
    pub fn create(path: &Path, role: Role, mode: u32) -> Result<(SafeDir, bool), SafeDirError> {
        let (parent, name, abs) = split(path, role)?;
        let pfd = sys::open_root(&parent).map_err(|e| SafeDirError::Parent {
            role,
            path: abs.clone(),
            parent: parent.clone(),
            source: e,
        })?;
        Self::create_in(&pfd, &name, abs, role, mode, None)
    }

    /// `create`, for a directory layerfs later names by path (see the
    /// module comment): every directory on the way to it must keep others
    /// from renaming its entries.
    pub fn create_stable(
        path: &Path,
        role: Role,
        mode: u32,
    ) -> Result<(SafeDir, bool), SafeDirError> {
        let (parent, name, abs) = split(path, role)?;
        let pfd = stable_parent(&parent, &abs, role)?;
        Self::create_in(&pfd, &name, abs, role, mode, None)
    }

    /// Only the check `create_stable` makes of the way to `path` (for a
    /// name that is a mountpoint already), returning a descriptor of the
    /// parent it checked.
    pub fn stable_parent_fd(path: &Path, role: Role) -> Result<OwnedFd, SafeDirError> {
        let (parent, _, abs) = split(path, role)?;
        stable_parent(&parent, &abs, role)
    }

    /// Opens the existing directory `name` in the directory `parent` and
    /// checks it; `shown` names it in messages.
    pub fn open_at(
        parent: &OwnedFd,
        name: &OsStr,
        shown: PathBuf,
        role: Role,
    ) -> Result<SafeDir, SafeDirError> {
        let missing = SafeDirError::Missing {
            role,
            path: shown.clone(),
        };
        Self::open_in(
            parent,
            single_name(name).map_err(SafeDirError::Name)?,
            shown,
            role,
            None,
        )?
        .ok_or(missing)
    }

    fn create_in(
        pfd: &OwnedFd,
        name: &OsStr,
        abs: PathBuf,
        role: Role,
        mode: u32,
        extra: Option<u32>,
    ) -> Result<(SafeDir, bool), SafeDirError> {
        let created = match sys::mkdirat(pfd, name, mode & 0o755) {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => false,
            Err(e) => {
                return Err(SafeDirError::Create {
                    role,
                    path: abs,
                    source: e,
                })
            }
        };
        match Self::open_in(pfd, name, abs.clone(), role, extra)? {
            Some(d) => Ok((d, created)),
            None => Err(SafeDirError::Vanished { role, path: abs }),
        }
    }

    fn open_in(
        pfd: &OwnedFd,
        name: &OsStr,
        abs: PathBuf,
        role: Role,
        extra: Option<u32>,
    ) -> Result<Option<SafeDir>, SafeDirError> {
        let fd = match sys::openat2(pfd, name, o_path_dir(), 0, 0) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                return Err(not_a_dir(pfd, name, &abs, role));
            }
            Err(e) => return Err(SafeDirError::io(role, &abs, e)),
        };
        Self::checked(fd, abs, role, extra).map(Some)
    }

    fn checked(
        fd: OwnedFd,
        path: PathBuf,
        role: Role,
        extra: Option<u32>,
    ) -> Result<SafeDir, SafeDirError> {
        let st = sys::fstat(&fd).map_err(|e| SafeDirError::io(role, &path, e))?;
        if let Some(problem) = leaf_problem(&st, extra) {
            let is_mode = trusted_owner(st.st_uid) || extra == Some(st.st_uid);
            if !is_mode && euid() == 0 {
                return Err(SafeDirError::OthersForRoot {
                    role,
                    path,
                    problem,
                });
            }
            return Err(SafeDirError::Untrusted {
                role,
                path,
                problem,
                is_mode,
            });
        }
        Ok(SafeDir {
            fd,
            path,
            role,
            dev: st.st_dev,
            ino: st.st_ino,
            uid: st.st_uid,
            extra,
        })
    }

    /// The directory `name` inside this one, checked the same way (created
    /// with `mode` when `create` and missing; `Ok(None)` when missing and
    /// not created).
    pub fn subdir(
        &self,
        name: &str,
        role: Role,
        create: Option<u32>,
    ) -> Result<Option<SafeDir>, SafeDirError> {
        let abs = self.path.join(name);
        let name = OsStr::new(name);
        match create {
            Some(mode) => {
                Self::create_in(&self.fd, name, abs, role, mode, self.extra).map(|(d, _)| Some(d))
            }
            None => Self::open_in(&self.fd, name, abs, role, self.extra),
        }
    }

    /// The descriptor, for a caller that keeps only it.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// The path it was opened by (for messages; never used to reach it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path()/name`, for messages.
    pub fn shown(&self, name: impl AsRef<OsStr>) -> PathBuf {
        self.path.join(name.as_ref())
    }

    /// Its owner (the caller or root).
    pub fn owner(&self) -> u32 {
        self.uid
    }

    /// (device, inode) of the directory.
    pub fn id(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    /// `/proc/self/fd/N/NAME`: a path to `name` in this directory that
    /// the kernel resolves through the descriptor, for calls that take
    /// only a path. Valid while this `SafeDir` lives.
    pub fn fd_path(&self, name: impl AsRef<OsStr>) -> PathBuf {
        let mut p = PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()));
        p.push(name.as_ref());
        p
    }

    /// Opens the file `name` in this directory (a single name; never
    /// following a symlink) with `flags` (`O_CREAT` uses `mode`).
    pub fn open_file(&self, name: impl AsRef<OsStr>, flags: i32, mode: u32) -> io::Result<File> {
        let name = single_name(name.as_ref())?;
        sys::open_beneath(&self.fd, name, flags | libc::O_NOCTTY, mode).map(File::from)
    }

    /// lstat of `name` in this directory.
    pub fn stat(&self, name: impl AsRef<OsStr>) -> io::Result<sys::Stat> {
        sys::fstatat(&self.fd, single_name(name.as_ref())?)
    }

    /// Removes the non-directory `name`.
    pub fn remove_file(&self, name: impl AsRef<OsStr>) -> io::Result<()> {
        sys::unlinkat(&self.fd, single_name(name.as_ref())?, false)
    }

    /// Removes the empty directory `name`.
    pub fn remove_dir(&self, name: impl AsRef<OsStr>) -> io::Result<()> {
        sys::unlinkat(&self.fd, single_name(name.as_ref())?, true)
    }

    /// Makes the directory `name` (mode never more than 0755).
    pub fn mkdir(&self, name: impl AsRef<OsStr>, mode: u32) -> io::Result<()> {
        sys::mkdirat(&self.fd, single_name(name.as_ref())?, mode & 0o755)
    }

    /// `renameat2` of `from` to `to`, both in this directory.
    pub fn rename(
        &self,
        from: impl AsRef<OsStr>,
        to: impl AsRef<OsStr>,
        flags: u32,
    ) -> io::Result<()> {
        sys::renameat2(
            &self.fd,
            single_name(from.as_ref())?,
            &self.fd,
            single_name(to.as_ref())?,
            flags,
        )
    }

    /// Replaces the file `name` with `bytes` atomically: a temporary file
    /// (`.NAME.tmp`, mode 0600), fsynced, renamed over `name`, and this
    /// directory fsynced. A reader sees the old content or the new one,
    /// never a part, also after a crash.
    pub fn replace_file(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.replace_file_then_sync_later(name, bytes, || Ok(()))?;
        self.sync()
    }

    /// `replace_file` up to the rename: the new content is durable before
    /// it can replace the old, and `before_rename` runs between (to make
    /// durable what must be before the new file is); the rename itself is
    /// durable once this directory is next fsynced. For a caller that has
    /// that fsync made anyway (a later `replace_file` here) and may lose
    /// the rename in a power loss.
    pub fn replace_file_then_sync_later(
        &self,
        name: &str,
        bytes: &[u8],
        before_rename: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        self.stage_file(name, bytes)?;
        self.place_staged(name, before_rename)
    }

    /// The first half of `replace_file_then_sync_later`: the new content
    /// in its temporary file (`.NAME.tmp`), not yet synced; `name` is
    /// untouched. `place_staged` finishes it, maybe in another thread.
    pub fn stage_file(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        let tmp = format!(".{name}.tmp");
        let mut f = self.open_file(&tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o600)?;
        f.write_all(bytes)
    }

    /// The second half: the staged content made durable, `before_rename`
    /// run, and the file renamed over `name`.
    pub fn place_staged(
        &self,
        name: &str,
        before_rename: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        self.sync_staged(name)?;
        before_rename()?;
        self.rename_staged(name)
    }

    /// The staged content of `name` (`stage_file`) made durable.
    pub fn sync_staged(&self, name: &str) -> io::Result<()> {
        self.open_file(format!(".{name}.tmp"), libc::O_RDONLY, 0)?
            .sync_all()
    }

    /// The staged file renamed over `name`; durable once this directory
    /// is next fsynced.
    pub fn rename_staged(&self, name: &str) -> io::Result<()> {
        self.rename(format!(".{name}.tmp"), name, 0)
    }

    /// `replace_file` without the fsyncs: atomic (a reader sees the old
    /// file or the new one), not yet durable when it returns. For what a
    /// crash may lose without harm.
    pub fn replace_file_unsynced(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        let tmp = format!(".{name}.tmp");
        let mut f = self.open_file(&tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o600)?;
        f.write_all(bytes)?;
        drop(f);
        self.rename(&tmp, name, 0)
    }

    /// The names in this directory.
    pub fn read_dir(&self) -> io::Result<Vec<sys::DirEntry>> {
        sys::read_dir(&self.fd)
    }

    /// fsync of the directory (its entries are durable).
    pub fn sync(&self) -> io::Result<()> {
        File::from(sys::open_dir(&self.fd)?).sync_all()
    }

    /// A readable descriptor of the directory itself (for `flock`,
    /// `syncfs`, `fstatvfs`).
    pub fn open_self(&self) -> io::Result<File> {
        sys::open_dir(&self.fd).map(File::from)
    }

    /// Whether `path` still names this very directory.
    pub fn is_at(&self, path: &Path) -> bool {
        std::fs::symlink_metadata(path).is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.dev(), m.ino()) == (self.dev, self.ino)
        })
    }
}

impl AsFd for SafeDir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for SafeDir {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

/// A path for messages: `/proc/self/fd/N/REST` (a `SafeDir::fd_path`)
/// shows as the directory the descriptor holds, joined with `REST`; any
/// other path as it is.
pub fn shown_path(p: &Path) -> PathBuf {
    let Ok(rest) = p.strip_prefix("/proc/self/fd") else {
        return p.to_path_buf();
    };
    let mut parts = rest.components();
    let Some(Component::Normal(n)) = parts.next() else {
        return p.to_path_buf();
    };
    match std::fs::read_link(Path::new("/proc/self/fd").join(n)) {
        Ok(dir) => dir.join(parts.as_path()),
        Err(_) => p.to_path_buf(),
    }
}

/// A name inside a checked directory is one plain component.
fn single_name(name: &OsStr) -> io::Result<&OsStr> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') || b.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a single file name"),
        ));
    }
    Ok(name)
}

/// The message for a name that is no directory: a symlink (with its
/// target) or something else.
fn not_a_dir(pfd: &OwnedFd, name: &OsStr, abs: &Path, role: Role) -> SafeDirError {
    let st = sys::fstatat(pfd, name).ok();
    let path = abs.to_path_buf();
    if st.is_some_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFLNK) {
        let target = sys::open_path(pfd, name)
            .and_then(|fd| sys::readlink_fd(&fd))
            .ok()
            .map(PathBuf::from);
        SafeDirError::Symlink {
            role,
            path,
            target,
            owner: st.map(|s| s.st_uid),
        }
    } else {
        SafeDirError::NotADirectory { role, path }
    }
}

/// Opens `parent` after checking that no one but the caller and root can
/// rename anything from `/` down to it (see the module comment). `abs` and
/// `role` name the directory this is for.
fn stable_parent(parent: &Path, abs: &Path, role: Role) -> Result<OwnedFd, SafeDirError> {
    let way = |step: String, source| SafeDirError::Way {
        role,
        path: abs.to_path_buf(),
        step,
        source,
    };
    let canon = std::fs::canonicalize(parent)
        .map_err(|e| way(format!("cannot resolve its parent {}", parent.display()), e))?;
    let mut cur = sys::open_root(Path::new("/")).map_err(|e| way("cannot open /".into(), e))?;
    let mut at = PathBuf::from("/");
    let mut names = canon.components().filter_map(|c| match c {
        Component::Normal(n) => Some(n.to_os_string()),
        _ => None,
    });
    loop {
        let st = sys::fstat(&cur).map_err(|e| SafeDirError::WayStat {
            at: at.clone(),
            source: e,
        })?;
        let mode = st.st_mode & 0o7777;
        if !trusted_owner(st.st_uid) {
            return Err(SafeDirError::WayForeign {
                role,
                path: abs.to_path_buf(),
                at,
                owner: st.st_uid,
            });
        }
        if mode & 0o022 != 0 && mode & libc::S_ISVTX == 0 {
            return Err(SafeDirError::WayWritable {
                role,
                path: abs.to_path_buf(),
                at,
                mode,
            });
        }
        let Some(name) = names.next() else {
            return Ok(cur);
        };
        at.push(&name);
        cur = sys::openat2(&cur, &name, o_path_dir(), 0, 0).map_err(|e| {
            SafeDirError::WayChanged {
                role,
                path: abs.to_path_buf(),
                at: at.clone(),
                source: e,
            }
        })?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn creates_private_and_refuses_what_others_could_control() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("s");
        let (d, created) = SafeDir::create(&p, Role::State, 0o700).unwrap();
        assert!(created);
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o700);
        let (_, again) = SafeDir::create(&p, Role::State, 0o700).unwrap();
        assert!(!again);
        // Files inside go through the descriptor, never following links.
        std::os::unix::fs::symlink("/etc/hostname", p.join("l")).unwrap();
        let e = d.open_file("l", libc::O_RDONLY, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
        assert!(d.open_file("../s", libc::O_RDONLY, 0).is_err());

        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = SafeDir::open(&p, Role::State).unwrap_err().to_string();
        assert!(
            e.contains("writable by group and others") && e.contains("chmod go-w"),
            "{e}"
        );

        let l = t.path().join("link");
        std::os::unix::fs::symlink(t.path(), &l).unwrap();
        let e = SafeDir::create(&l, Role::Work, 0o700)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is a symbolic link") && e.contains("--work DIR"),
            "{e}"
        );
        assert!(SafeDir::open(&t.path().join("none"), Role::State)
            .unwrap()
            .is_none());
    }

    #[test]
    fn stable_parents_must_keep_others_from_renaming() {
        let t = tempfile::tempdir().unwrap();
        let shared = t.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = SafeDir::create_stable(&shared.join("m"), Role::RunMountpoint, 0o755)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("without the sticky bit") && e.contains("chmod +t"),
            "{e}"
        );
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        SafeDir::create_stable(&shared.join("m"), Role::RunMountpoint, 0o755).unwrap();
    }
}
