//! Walking a directory tree on disk: the one tree walker layerfs has
//! (`Walker`), the recursive removal built on it (`remove_tree`), and the
//! opening of a relative path of any length (`open_rel`).
//!
//! Invariant, for every daemon thread and every command: **no code
//! recurses over the depth of a directory tree** (nor over a chain of
//! inodes). A tree is as deep as whoever writes it wants — an agent makes
//! 20,000 nested directories through the mount in a loop of `mkdir; cd`,
//! and whoever can write the upper makes them directly — while a thread's
//! stack holds a few thousand frames at best: one recursion per level
//! aborts the daemon and leaves the mount answering `ENOTCONN` for
//! everyone. So every walk over a tree goes through `Walker`, whose stack
//! is a `Vec` on the heap: depth is bounded by memory only.
//!
//! Invariants of the walker itself:
//! - Every step is relative to a directory fd (`openat2` beneath it,
//!   `RESOLVE_NO_SYMLINKS`); a path string is never handed to the kernel
//!   whole, so a tree deeper than `PATH_MAX` is walked like any other, and
//!   a symlink is never followed.
//! - Bounded fds: only the start directory and the `OPEN_LEVELS` deepest
//!   levels hold an fd; a level above them gets its fd back, when the walk
//!   returns to it, by opening `..` of the child being left and checking
//!   that it is the very directory (device and inode) walked through
//!   before. A directory moved meanwhile ends the walk with an error rather
//!   than walking or removing anything outside the tree.
//! - Each directory is listed once, when it is entered; its entries wait
//!   on the heap (names only), non-directories before directories.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use super::sys::{self, DirEntry, Stat};

/// Stack size of the threads the daemon starts to walk trees (control
/// connections: gc, reset, restore, usage scans; invalidations): set
/// explicitly, so it does not depend on `RUST_MIN_STACK`. It is headroom,
/// not the guarantee: the invariant above is, and the deep-tree tests
/// (`tests/it/deep.rs`) drive every walk and the mount's requests 20,000
/// levels deep. The threads that serve requests (fuser's workers, parked
/// writes) keep std's default, 2 MiB (fuser has no setting for it), and
/// hold to the same invariant.
pub const THREAD_STACK: usize = 8 << 20;

/// How many levels below the start keep their directory fd open.
pub const OPEN_LEVELS: usize = 16;

/// Whether a stat describes a directory.
pub fn is_dir(st: &Stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// The file type bits (`S_IFMT`) of entry `e` of directory `dir`: from
/// the listing's type where it gives one, else from a stat.
pub fn entry_mode(dir: &impl AsFd, e: &DirEntry) -> io::Result<u32> {
    match e.dtype {
        libc::DT_DIR => Ok(libc::S_IFDIR),
        libc::DT_REG => Ok(libc::S_IFREG),
        libc::DT_LNK => Ok(libc::S_IFLNK),
        libc::DT_FIFO => Ok(libc::S_IFIFO),
        libc::DT_SOCK => Ok(libc::S_IFSOCK),
        libc::DT_BLK => Ok(libc::S_IFBLK),
        libc::DT_CHR => Ok(libc::S_IFCHR),
        _ => Ok(sys::fstatat(dir, &e.name)?.st_mode & libc::S_IFMT),
    }
}

/// Longest piece of a relative path handed to one `openat2` (below
/// `PATH_MAX`, 4096 with its NUL).
const CHUNK: usize = 4000;

/// Opens the relative path `rel` (components separated by `/`; empty is
/// `root` itself) beneath `root` with `flags` (`O_NOFOLLOW` added, no
/// symlink followed anywhere, never leaving `root`), however long `rel` is:
/// a path beyond `PATH_MAX` is opened a piece at a time, each piece relative
/// to the directory the previous one reached.
pub fn open_rel(root: &impl AsFd, rel: &OsStr, flags: i32) -> io::Result<OwnedFd> {
    let b = rel.as_bytes();
    let b = &b[b.iter().position(|&c| c != b'/').unwrap_or(b.len())..];
    if b.is_empty() {
        return sys::open_beneath(root, OsStr::new("."), flags, 0);
    }
    if b.len() <= CHUNK {
        return sys::open_beneath(root, OsStr::from_bytes(b), flags, 0);
    }
    let mut cur: Option<OwnedFd> = None;
    let mut rest = b;
    while rest.len() > CHUNK {
        // Cut at the last `/` within the chunk (a name is at most 255 bytes).
        let cut = rest[..CHUNK]
            .iter()
            .rposition(|&c| c == b'/')
            .filter(|&i| i > 0)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENAMETOOLONG))?;
        let piece = OsStr::from_bytes(&rest[..cut]);
        let dir_flags = libc::O_PATH | libc::O_DIRECTORY;
        cur = Some(match &cur {
            None => sys::open_beneath(root, piece, dir_flags, 0)?,
            Some(d) => sys::open_beneath(d, piece, dir_flags, 0)?,
        });
        rest = &rest[cut + 1..];
        rest = &rest[rest.iter().position(|&c| c != b'/').unwrap_or(rest.len())..];
    }
    let last = if rest.is_empty() {
        OsStr::new(".")
    } else {
        OsStr::from_bytes(rest)
    };
    match &cur {
        None => sys::open_beneath(root, last, flags, 0),
        Some(d) => sys::open_beneath(d, last, flags, 0),
    }
}

/// The stat of `rel` beneath `root` (not following symlinks), any length.
pub fn stat_rel(root: &impl AsFd, rel: &OsStr) -> io::Result<Stat> {
    sys::fstat(&open_rel(root, rel, libc::O_PATH)?)
}

/// What `Walker::step` found.
#[derive(Debug)]
pub enum Step {
    /// An entry of the current directory (`Walker::dir`, `Walker::path`).
    /// `Walker::descend` enters it when it is a directory; otherwise the
    /// walk goes on with the next entry.
    Entry(DirEntry),
    /// Every entry of the directory with this name was returned (and every
    /// subdirectory entered was left): it is left, and the current
    /// directory is its parent again.
    Leave(OsString),
}

/// One directory on the walk's stack.
struct Level {
    /// Its name in its parent ("" for the start).
    name: OsString,
    /// `O_RDONLY | O_DIRECTORY`; `None` once evicted (see the module doc).
    fd: Option<OwnedFd>,
    /// (device, inode), to check a reopened fd.
    id: (u64, u64),
    /// Entries not returned yet, the next one last.
    pending: Vec<DirEntry>,
    /// Length of `Walker::path` before this level's name was appended.
    path_len: usize,
}

/// A depth-first walk over one directory tree; see the module doc for its
/// invariants. Driven by its caller:
///
/// ```text
/// while let Some(step) = w.step()? {
///     match step {
///         Step::Entry(e) => if <a directory to enter> { w.descend(&e.name)? },
///         Step::Leave(name) => { /* `name` in w.dir()? is done */ }
///     }
/// }
/// ```
pub struct Walker {
    levels: Vec<Level>,
    /// Path of the current directory relative to the start ("" there).
    path: Vec<u8>,
    /// Levels `evicted..` (and level 0) hold fds; `1..evicted` do not.
    evicted: usize,
    /// Give a directory the caller owns but cannot list or change owner
    /// access first (`remove_tree`).
    grant_owner: bool,
}

impl Walker {
    /// A walk over the directory behind `dir` (any fd of it, `O_PATH` too).
    pub fn new(dir: &impl AsFd) -> io::Result<Walker> {
        let fd = sys::open_dir(dir)?;
        Walker::start(fd, false)
    }

    fn start(fd: OwnedFd, grant_owner: bool) -> io::Result<Walker> {
        let level = Level::enter(OsString::new(), fd, 0, grant_owner)?;
        Ok(Walker {
            levels: vec![level],
            path: Vec::new(),
            evicted: 1,
            grant_owner,
        })
    }

    /// How many levels below the start the current directory is.
    pub fn depth(&self) -> usize {
        self.levels.len() - 1
    }

    /// The current directory's path relative to the start ("" there).
    pub fn path(&self) -> &OsStr {
        OsStr::from_bytes(&self.path)
    }

    /// The path of `name` in the current directory, relative to the start.
    pub fn child_path(&self, name: &OsStr) -> OsString {
        let mut p = Vec::with_capacity(self.path.len() + 1 + name.len());
        p.extend_from_slice(&self.path);
        if !p.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(name.as_bytes());
        OsString::from_vec(p)
    }

    /// The names still to come in the current directory.
    pub fn pending(&self) -> impl Iterator<Item = &OsStr> {
        self.top().pending.iter().map(|e| e.name.as_os_str())
    }

    fn top(&self) -> &Level {
        self.levels.last().expect("the start level stays")
    }

    /// The current directory's fd (reopened if it was evicted: only after
    /// `Leave`, and `step` already did that).
    pub fn dir(&self) -> io::Result<&OwnedFd> {
        self.top()
            .fd
            .as_ref()
            .ok_or_else(|| io::Error::other("walk: the current directory has no fd"))
    }

    /// The next entry of the current directory, or the end of it.
    /// `None` once the start directory has no entries left.
    pub fn step(&mut self) -> io::Result<Option<Step>> {
        let depth = self.levels.len() - 1;
        if let Some(e) = self.levels[depth].pending.pop() {
            return Ok(Some(Step::Entry(e)));
        }
        if depth == 0 {
            return Ok(None);
        }
        // Leave the current directory; give its parent its fd back first,
        // through `..` of this one, checked to be the directory we came by.
        if self.levels[depth - 1].fd.is_none() {
            let child = self.levels[depth]
                .fd
                .as_ref()
                .expect("the deepest level is open");
            let fd = sys::openat2(
                child,
                OsStr::new(".."),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
                sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS,
            )?;
            let st = sys::fstat(&fd)?;
            let parent = &mut self.levels[depth - 1];
            if (st.st_dev, st.st_ino) != parent.id {
                return Err(io::Error::other(format!(
                    "a directory was moved during the walk (its parent at {} is no longer \
                     the one walked through); nothing outside the tree was touched",
                    String::from_utf8_lossy(&self.path[..self.levels[depth].path_len])
                )));
            }
            parent.fd = Some(fd);
            self.evicted = depth - 1;
        }
        let left = self.levels.pop().expect("depth > 0");
        self.path.truncate(left.path_len);
        self.evicted = self.evicted.min(self.levels.len());
        Ok(Some(Step::Leave(left.name)))
    }

    /// Enters the subdirectory `name` of the current directory (just
    /// returned as an entry): its entries come next.
    pub fn descend(&mut self, name: &OsStr) -> io::Result<()> {
        let fd = open_child(self.dir()?, name, self.grant_owner)?;
        let path_len = self.path.len();
        let level = Level::enter(name.to_os_string(), fd, path_len, self.grant_owner)?;
        if !self.path.is_empty() {
            self.path.push(b'/');
        }
        self.path.extend_from_slice(name.as_bytes());
        self.levels.push(level);
        // Keep the start and the OPEN_LEVELS deepest levels open.
        while self.levels.len() - self.evicted > OPEN_LEVELS {
            self.levels[self.evicted].fd = None;
            self.evicted += 1;
        }
        Ok(())
    }
}

impl Level {
    fn enter(name: OsString, fd: OwnedFd, path_len: usize, grant_owner: bool) -> io::Result<Level> {
        let st = sys::fstat(&fd)?;
        let mut pending = match sys::read_dir(&fd) {
            Err(e) if grant_owner && e.raw_os_error() == Some(libc::EACCES) => {
                grant_access(&fd, &st)?;
                sys::read_dir(&fd)?
            }
            r => r?,
        };
        // Popped from the end: directories last in the walk, so they go first here.
        pending.sort_by_key(|e| e.dtype != libc::DT_DIR);
        Ok(Level {
            name,
            fd: Some(fd),
            id: (st.st_dev, st.st_ino),
            pending,
            path_len,
        })
    }
}

/// Opens the directory `name` in `dir` for listing, never following a
/// symlink. With `grant_owner`, a directory the caller owns but may not
/// read or search is given owner access first.
fn open_child(dir: &impl AsFd, name: &OsStr, grant_owner: bool) -> io::Result<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY;
    match sys::open_beneath(dir, name, flags, 0) {
        Err(e) if grant_owner && e.raw_os_error() == Some(libc::EACCES) => {
            let p = sys::open_path(dir, name)?;
            grant_access(&p, &sys::fstat(&p)?)?;
            sys::open_beneath(dir, name, flags, 0)
        }
        r => r,
    }
}

/// Adds owner read, write and search to a directory the caller owns
/// (`chmod 0555` or `0000` left by a command): as `rm -rf` does not, an
/// unprivileged owner could otherwise not remove what it made.
fn grant_access(fd: &OwnedFd, st: &Stat) -> io::Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    if st.st_uid != me || st.st_mode & 0o700 == 0o700 {
        return Err(io::Error::from_raw_os_error(libc::EACCES));
    }
    sys::fchmod(fd, (st.st_mode & 0o7777) | 0o700)
}

/// Removes `name` in `dir` and, if it is a directory, everything beneath
/// it (fd-relative, no symlink followed, any depth, bounded fds). A
/// directory the caller owns but may not change is given owner access
/// first. `ENOENT` for `name` itself is an error; the caller decides.
pub fn remove_tree(dir: &impl AsFd, name: &OsStr) -> io::Result<()> {
    let st = sys::fstatat(dir, name)?;
    if !is_dir(&st) {
        return sys::unlinkat(dir, name, false);
    }
    let mut w = Walker::start(open_child(dir, name, true)?, true)?;
    while let Some(step) = w.step()? {
        match step {
            Step::Entry(e) => {
                if entry_mode(w.dir()?, &e)? == libc::S_IFDIR {
                    w.descend(&e.name)?;
                } else {
                    unlink_in(w.dir()?, &e.name, false)?;
                }
            }
            Step::Leave(n) => unlink_in(w.dir()?, &n, true)?,
        }
    }
    drop(w);
    unlink_in(dir, name, true)
}

/// `remove_tree` of a path: its parent directory is opened by path (the
/// caller's choice, as at mount time), all the rest is fd-relative. A path
/// that does not exist is fine.
pub fn remove_path(p: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a path to remove", p.display()),
        ));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let gone = |e: &io::Error| e.raw_os_error() == Some(libc::ENOENT);
    let dir = match sys::open_root(parent) {
        Err(e) if gone(&e) => return Ok(()),
        r => r?,
    };
    match remove_tree(&dir, name) {
        Err(e) if gone(&e) => Ok(()),
        r => r,
    }
}

/// `unlinkat`, giving the directory owner write access first if that is
/// what it lacks (see `grant_access`); an entry already gone is fine.
fn unlink_in(dir: &impl AsFd, name: &OsStr, is_dir: bool) -> io::Result<()> {
    let r = match sys::unlinkat(dir, name, is_dir) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            let fd = sys::open_path(dir, OsStr::new("."))?;
            grant_access(&fd, &sys::fstat(&fd)?).map_err(|_| e)?;
            sys::unlinkat(dir, name, is_dir)
        }
        r => r,
    };
    match r {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn mkdirs(root: &OwnedFd, depth: usize) -> OwnedFd {
        let mut fd = sys::open_dir(root).unwrap();
        for _ in 0..depth {
            sys::mkdirat(&fd, OsStr::new("d"), 0o755).unwrap();
            fd = sys::open_beneath(&fd, OsStr::new("d"), libc::O_RDONLY | libc::O_DIRECTORY, 0)
                .unwrap();
        }
        fd
    }

    /// A tree deeper than PATH_MAX and wider than one level, walked with
    /// bounded fds, on a thread with a small stack.
    #[test]
    fn walks_and_removes_a_deep_tree_on_a_small_stack() {
        // A path of 5,000 bytes: beyond PATH_MAX.
        const LEVELS: usize = 2500;
        let t = tempfile::tempdir().unwrap();
        let root = sys::open_root(t.path()).unwrap();
        let bottom = mkdirs(&root, LEVELS);
        std::fs::write(format!("/proc/self/fd/{}/leaf", bottom.as_raw_fd()), b"x").unwrap();
        sys::mkdirat(&bottom, OsStr::new("e"), 0o755).unwrap();
        drop(bottom);
        std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || {
                let mut w = Walker::new(&root).unwrap();
                let (mut dirs, mut files, mut max_fds, mut deepest) = (0, 0, 0, 0);
                while let Some(s) = w.step().unwrap() {
                    if let Step::Entry(e) = s {
                        if e.dtype == libc::DT_DIR {
                            dirs += 1;
                            w.descend(&e.name).unwrap();
                            deepest = deepest.max(w.depth());
                        } else {
                            files += 1;
                            assert_eq!(w.path().len(), 2 * LEVELS - 1);
                        }
                        let open = w.levels.iter().filter(|l| l.fd.is_some()).count();
                        max_fds = max_fds.max(open);
                    }
                }
                assert_eq!((dirs, files, deepest), (LEVELS + 1, 1, LEVELS + 1));
                assert_eq!(max_fds, OPEN_LEVELS + 1, "fds held by the walk");
                let rel = OsString::from("d/".repeat(LEVELS) + "leaf");
                assert!(rel.len() > libc::PATH_MAX as usize);
                assert_eq!(stat_rel(&root, &rel).unwrap().st_size, 1);
                remove_tree(&root, OsStr::new("d")).unwrap();
                assert!(sys::read_dir(&root).unwrap().is_empty());
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn a_directory_moved_during_the_walk_ends_it() {
        let t = tempfile::tempdir().unwrap();
        let root = sys::open_root(t.path()).unwrap();
        drop(mkdirs(&root, OPEN_LEVELS + 4));
        sys::mkdirat(&root, OsStr::new("other"), 0o755).unwrap();
        let mut w = Walker::new(&root).unwrap();
        while w.depth() < OPEN_LEVELS + 4 {
            match w.step().unwrap().unwrap() {
                Step::Entry(e) if e.name == "d" => w.descend(&e.name).unwrap(),
                _ => {}
            }
        }
        // Move the chain below the (evicted) first level elsewhere.
        sys::renameat2(
            &sys::open_path(&root, OsStr::new("d")).unwrap(),
            OsStr::new("d"),
            &sys::open_path(&root, OsStr::new("other")).unwrap(),
            OsStr::new("d"),
            0,
        )
        .unwrap();
        let err = loop {
            match w.step() {
                Ok(Some(_)) => {}
                Ok(None) => panic!("the walk went on through a moved directory"),
                Err(e) => break e,
            }
        };
        assert!(err.to_string().contains("moved during the walk"), "{err}");
    }

    /// One recursive removal: none of std's (`remove_dir_all` holds an fd
    /// per level and, in places, recurses) and no second `remove_tree`.
    #[test]
    fn every_removal_of_a_tree_goes_through_this_module() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut dirs = vec![src];
        let mut found = Vec::new();
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                    continue;
                }
                if p.extension().is_none_or(|x| x != "rs") || p.ends_with("layer/walk.rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                for (i, line) in text.lines().enumerate() {
                    if line.contains("remove_dir_all(") || line.contains("fn remove_tree") {
                        found.push(format!("{}:{}: {}", p.display(), i + 1, line.trim()));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "use layer::walk::remove_tree/remove_path:\n{}",
            found.join("\n")
        );
    }
}
