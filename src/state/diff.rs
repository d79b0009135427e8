//! `diff`: what the upper changes against the lowers, computed from the
//! upper itself (so it is right with the journal off or lost).
//!
//! The *shared version* of a path is what the lowers alone show there; the
//! diff compares the mount's view with it, walking only the upper:
//! - a whiteout over a shared entry: `D` (a shared directory removed with
//!   `rm -rf` is one `D` line, not one per file);
//! - an opaque directory (it replaced a shared one): the shared entries it
//!   no longer shows are `D`; its own entries are compared as usual;
//! - a directory with a redirect mark: `R old -> new` (a shared directory
//!   renamed); its contents are compared with the shared directory at the
//!   old path, so only what changed inside it is listed;
//! - an upper entry where the shared version has none: `A`; every entry of
//!   a new directory is listed;
//! - an upper entry where the shared version has one (a copy-up, or a new
//!   object over a deleted one): `M` when the content differs (file bytes,
//!   symlink target, device number) or the type changed (the `type` field
//!   is the new type); else `T` when the metadata differs: permission bits,
//!   owner (only in a root-owned upper: an unprivileged daemon cannot give
//!   copies the original owner), xattrs outside the overlay's namespace and,
//!   for non-directories, mtime (so `touch` alone is a `T`). atime and ctime
//!   never count; directory times never count (they change with any entry);
//! - a new file whose origin record names a shared file that is deleted in
//!   the view: `R old -> new` (a moved file, found without the journal);
//! - drift: a copied-up file whose shared original changed after the
//!   copy-up (its origin record no longer matches) has `conflict: true`.
//!
//! Scratch paths are left out. Names that are not UTF-8 are shown lossily.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use crate::layer::ops::{is_opaque, is_whiteout, mark, redirect};
use crate::layer::stack::{
    base_lookup, base_names, join_lower, lowers_at_path, rel_of, stat_in, Base, BaseEntry,
};
use crate::layer::sys::{self, Stat};
use crate::layer::walk::{self, is_dir, Step, Walker};
use crate::overlay::origin::Origin;
use crate::quote::quote_os;
use crate::state::scratch::Scratch;

/// The layers `diff` reads (their home is `layer::stack`; named here too
/// for the commands that open them to diff, reset or gc).
pub use crate::layer::stack::Layers;

/// The kind of a change, as `diff` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Added,
    Modified,
    Deleted,
    Renamed,
    Metadata,
}

impl Kind {
    pub fn letter(self) -> char {
        match self {
            Kind::Added => 'A',
            Kind::Modified => 'M',
            Kind::Deleted => 'D',
            Kind::Renamed => 'R',
            Kind::Metadata => 'T',
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            Kind::Added => "added",
            Kind::Modified => "modified",
            Kind::Deleted => "deleted",
            Kind::Renamed => "renamed",
            Kind::Metadata => "metadata",
        }
    }
}

/// One changed path.
#[derive(Debug, Clone)]
pub struct Change {
    /// Path relative to the mount root.
    pub path: OsString,
    pub kind: Kind,
    /// The old path of a rename.
    pub from: Option<OsString>,
    /// `file`, `dir`, `symlink`, `fifo`, `socket`, `char`, `block`.
    pub ftype: &'static str,
    pub conflict: bool,
    /// The shared version (layer, path in it without leading `/`), if any.
    old: Option<(usize, OsString)>,
    /// Whether the upper holds the new version at `path`.
    new: bool,
}

impl Change {
    pub fn path_str(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }

    /// The shared version: its layer and its path there (relative).
    pub fn old(&self) -> Option<(usize, &OsStr)> {
        self.old.as_ref().map(|(l, p)| (*l, p.as_os_str()))
    }

    /// Whether the upper holds the new version at `path`.
    pub fn is_new(&self) -> bool {
        self.new
    }

    pub fn from_str(&self) -> Option<String> {
        self.from.as_ref().map(|f| f.to_string_lossy().into_owned())
    }

    /// Writes `text_line` and a newline to `out`.
    pub fn write_text(&self, out: &mut impl std::io::Write) -> io::Result<()> {
        out.write_all(self.text_line().as_bytes())?;
        out.write_all(b"\n")
    }

    /// `A path`, `R old -> new`, with ` (conflict)` when the shared
    /// original drifted. Names are quoted where they need it
    /// (`crate::quote`), so a name can never forge a line.
    pub fn text_line(&self) -> String {
        let mut s = match &self.from {
            Some(f) => format!(
                "{} {} -> {}",
                self.kind.letter(),
                quote_os(f),
                quote_os(&self.path)
            ),
            None => format!("{} {}", self.kind.letter(), quote_os(&self.path)),
        };
        if self.conflict {
            s.push_str(" (conflict)");
        }
        s
    }

    /// The `--json` line: `{"path", "change", "from"?, "type", "conflict"}`.
    pub fn json_line(&self) -> String {
        let q = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
        let from = match self.from_str() {
            Some(f) => format!(",\"from\":{}", q(&f)),
            None => String::new(),
        };
        format!(
            "{{\"path\":{},\"change\":\"{}\"{from},\"type\":\"{}\",\"conflict\":{}}}",
            q(&self.path_str()),
            self.kind.word(),
            self.ftype,
            self.conflict
        )
    }

    pub fn json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "path": self.path_str(),
            "change": self.kind.word(),
            "type": self.ftype,
            "conflict": self.conflict,
        });
        if let Some(f) = self.from_str() {
            v["from"] = serde_json::Value::String(f);
        }
        v
    }
}

impl Change {
    /// The change of an entry beneath this deleted or renamed shared
    /// directory, at `sub` below it (`D dir/sub`, `R old/sub -> new/sub`);
    /// its shared version is in `layer`. `None` for other changes.
    pub fn beneath(&self, sub: &OsStr, layer: usize, ftype: &'static str) -> Option<Change> {
        let below = |dir: &OsStr| crate::layer::stack::join(dir, sub);
        let (from, old_dir) = match (self.kind, &self.from, self.old()) {
            (Kind::Deleted, _, Some((_, old))) if self.ftype == "dir" => (None, old),
            (Kind::Renamed, Some(from), _) if self.ftype == "dir" => {
                (Some(below(from)), from.as_os_str())
            }
            _ => return None,
        };
        Some(Change {
            path: below(&self.path),
            kind: self.kind,
            from,
            ftype,
            conflict: false,
            old: Some((layer, below(old_dir))),
            // The shared version, seen through the directory's new name or
            // gone: the upper holds nothing at `path`.
            new: false,
        })
    }
}

/// One entry of a shared tree (`shared_entries`): its path below the
/// tree's root, the layer it is shown from, its type and, for a regular
/// file, its size.
pub struct SharedEntry {
    pub sub: OsString,
    pub layer: usize,
    pub ftype: &'static str,
    pub size: u64,
}

/// Every entry beneath the shared directory at lower path `rel` (relative,
/// no leading `/`), merged across the lowers as the mount shows them,
/// parents before their children; a directory for which `skip` (given its
/// lower path) answers true is left out with all beneath it. Unreadable
/// parts are left out.
pub fn shared_entries(
    layers: &Layers,
    rel: &OsStr,
    skip: impl Fn(&OsStr) -> bool,
) -> Vec<SharedEntry> {
    let nlowers = layers.lowers.len();
    let mut out = Vec::new();
    let mut stack = vec![OsString::new()];
    while let Some(sub) = stack.pop() {
        let dir = if sub.is_empty() {
            rel.to_os_string()
        } else {
            crate::layer::stack::join(rel, &sub)
        };
        let mut abs = OsString::from("/");
        abs.push(&dir);
        let base = lowers_at_path(layers, &abs);
        let Ok(names) = base_names(&base) else {
            continue;
        };
        for n in names.iter().rev() {
            let Ok(Some(e)) = base_lookup(&base, nlowers, n) else {
                continue;
            };
            let child = if sub.is_empty() {
                n.clone()
            } else {
                crate::layer::stack::join(&sub, n)
            };
            if skip(&crate::layer::stack::join(rel, &child)) {
                continue;
            }
            if is_dir(&e.st) {
                stack.push(child.clone());
            }
            let ftype = type_name(e.st.st_mode);
            let size = if ftype == "file" {
                e.st.st_size as u64
            } else {
                0
            };
            out.push(SharedEntry {
                sub: child,
                layer: e.layer,
                ftype,
                size,
            });
        }
    }
    out
}

/// Shared paths (relative, no leading `/`) some change speaks for: a walk
/// of a renamed or deleted directory's shared tree leaves them, and what
/// lies beneath them, to that change (`diff --patch`, `diff --files`).
pub struct Claimed(std::collections::HashSet<OsString>);

impl Claimed {
    pub fn of(changes: &[Change]) -> Claimed {
        let mut set = std::collections::HashSet::new();
        for c in changes {
            let dir = c.ftype == "dir";
            match (dir, c.kind, c.old()) {
                (true, Kind::Renamed, _) => set.extend(c.from.clone()),
                // A directory's own change claims its shared path only when
                // it replaced it (deleted, or a file turned into a directory).
                (true, Kind::Deleted | Kind::Modified, Some((_, p))) => {
                    set.insert(p.to_os_string());
                }
                (false, _, Some((_, p))) => {
                    set.insert(p.to_os_string());
                }
                _ => {}
            }
        }
        Claimed(set)
    }

    pub fn contains(&self, p: &OsStr) -> bool {
        self.0.contains(p)
    }
}

/// The overlay marks of one upper directory, read with one `listxattr`
/// (most directories have no xattrs at all: no further call).
#[derive(Default)]
struct DirMarks {
    opaque: bool,
    redirect: Option<OsString>,
    /// A copied-up file was renamed or linked into it (`MOVED_IN_XATTR`).
    moved_in: bool,
}

fn dir_marks(fd: &OwnedFd) -> DirMarks {
    let Ok(list) = sys::flistxattr(fd) else {
        // No listing (no xattr support): ask for each mark by name.
        return DirMarks {
            opaque: is_opaque(fd),
            redirect: redirect(fd),
            moved_in: mark(fd, crate::overlay::origin::MOVED_IN_XATTR).is_some(),
        };
    };
    let mut m = DirMarks::default();
    for name in list.split(|&b| b == 0) {
        let what = name
            .strip_prefix(b"trusted.overlay.")
            .or_else(|| name.strip_prefix(b"user.overlay."));
        match what {
            Some(b"opaque") => m.opaque = m.opaque || is_opaque(fd),
            Some(b"redirect") => m.redirect = m.redirect.take().or_else(|| redirect(fd)),
            Some(w) if w == crate::overlay::origin::MOVED_IN_XATTR.as_bytes() => m.moved_in = true,
            _ => {}
        }
    }
    m
}

pub fn type_name(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "file",
        libc::S_IFDIR => "dir",
        libc::S_IFLNK => "symlink",
        libc::S_IFIFO => "fifo",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "char",
        libc::S_IFBLK => "block",
        _ => "unknown",
    }
}

/// The file type bits of a directory entry type, where it is certain (a
/// character device may be a whiteout and needs a stat).
fn mode_of_dtype(dtype: u8) -> Option<u32> {
    match dtype {
        libc::DT_REG => Some(libc::S_IFREG),
        libc::DT_DIR => Some(libc::S_IFDIR),
        libc::DT_LNK => Some(libc::S_IFLNK),
        libc::DT_FIFO => Some(libc::S_IFIFO),
        libc::DT_SOCK => Some(libc::S_IFSOCK),
        libc::DT_BLK => Some(libc::S_IFBLK),
        _ => None,
    }
}

/// Whether two regular files (same size) have the same bytes.
pub(crate) fn same_bytes(a: &OwnedFd, b: &OwnedFd) -> io::Result<bool> {
    let mut ba = vec![0u8; 256 * 1024];
    let mut bb = vec![0u8; 256 * 1024];
    let mut off = 0u64;
    loop {
        let n = read_full(a, &mut ba, off)?;
        let m = read_full(b, &mut bb[..n.max(1)], off)?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
        off += n as u64;
    }
}

pub(crate) fn read_full(fd: &OwnedFd, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let n = sys::pread(fd, &mut buf[got..], off + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

/// The xattrs outside the overlay's namespace, sorted.
fn user_xattrs(fd: &impl std::os::fd::AsRawFd) -> Vec<(Vec<u8>, Vec<u8>)> {
    let Ok(list) = sys::listxattr(fd) else {
        return Vec::new();
    };
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = list
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty() && !crate::layer::ops::Upper::is_private_xattr(n))
        .filter_map(|n| {
            let c = CString::new(n).ok()?;
            Some((n.to_vec(), sys::getxattr(fd, &c).ok()?))
        })
        .collect();
    out.sort();
    out
}

/// What limits a diff.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub scratch: Scratch,
    /// Only these paths (and what lies beneath them); empty = everything.
    pub paths: Vec<OsString>,
    /// Moves the journal saw, to label an added file that continues a
    /// deleted shared one as its rename (`state::moves`).
    pub moves: Option<super::moves::Moves>,
    /// Whether the upper's origin records name entries of these lowers
    /// (they find moves and drift). False for a merged view whose records
    /// name lowers by their place in stacks of other depths (`diff --base
    /// shared`): moves then come from the journal only, and no drift shows.
    pub origins: bool,
}

impl Filter {
    fn wants(&self, p: &OsStr) -> bool {
        self.paths.is_empty() || self.paths.iter().any(|w| is_at_or_under(p, w))
    }

    /// Whether anything at or under directory `dir` can be wanted.
    fn enters(&self, dir: &OsStr) -> bool {
        self.paths.is_empty()
            || self
                .paths
                .iter()
                .any(|w| is_at_or_under(dir, w) || is_at_or_under(w, dir))
    }
}

/// Whether `p` is `dir` or lies beneath it ("" is the root).
pub fn is_at_or_under(p: &OsStr, dir: &OsStr) -> bool {
    let (p, d) = (p.as_bytes(), dir.as_bytes());
    d.is_empty() || p == d || (p.starts_with(d) && p.get(d.len()) == Some(&b'/'))
}

struct Walk<'a> {
    layers: &'a Layers,
    filter: &'a Filter,
    out: Vec<Change>,
    /// Regular files added: moved shared files when their origin record
    /// names a deleted original.
    added_files: Vec<usize>,
    /// Deleted shared non-directories by their (layer, lower path).
    deleted: HashMap<(usize, OsString), usize>,
    /// The shared version of each directory on the walker's stack.
    frames: Vec<Frame>,
}

/// The shared version an upper directory being walked is compared with
/// (the upper directory itself is the walker's current one).
struct Frame {
    /// Its lower directories (`O_PATH`), topmost first; empty once
    /// evicted (`BASE_OPEN`), see `Walk::base`.
    base: Base,
    /// (layer, device, inode) of each lower directory, to reopen them.
    base_ids: Vec<(usize, u64, u64)>,
    /// Lower path of `base` (`/a/b`, "" for the root); `None` if none.
    base_path: Option<OsString>,
    /// Whether shared entries missing from the upper are deleted (the
    /// directory, or one above it, is opaque).
    hides: bool,
    /// Whether a moved copied-up file may stand here (the directory has the
    /// moved-in mark): only then are its new files' origins read.
    moved_in: bool,
}

/// How many of the deepest frames keep their lower directories open (as
/// the walker keeps its upper ones, `walk::OPEN_LEVELS`).
const BASE_OPEN: usize = walk::OPEN_LEVELS;

impl Frame {
    fn new(base: Base, base_path: Option<OsString>, hides: bool, moved_in: bool) -> Frame {
        // An fd that cannot be stat'ed gets an id no reopened one matches.
        let base_ids = base
            .iter()
            .map(|(i, fd)| sys::fstat(fd).map_or((*i, 0, 0), |st| (*i, st.st_dev, st.st_ino)))
            .collect();
        Frame {
            base,
            base_ids,
            base_path,
            hides,
            moved_in,
        }
    }
}

/// Computes the diff of a workspace's upper against its lowers.
///
/// One walk of the upper (`layer::walk`, iterative and fd-relative: any
/// depth), with the shared version of each directory beside it; a path is
/// only ever opened from the directory holding it, never as a whole.
pub fn diff(layers: &Layers, filter: &Filter) -> Result<Vec<Change>, String> {
    let mut base = Vec::new();
    for (i, l) in layers.lowers.iter().enumerate() {
        let fd = sys::open_path(l, OsStr::new("."))
            .map_err(|e| format!("cannot open lower dir #{}: {e}", i + 1))?;
        base.push((i, fd));
    }
    let mut walker =
        Walker::new(&layers.upper).map_err(|e| format!("cannot read the upper root: {e}"))?;
    let marks = dir_marks(
        walker
            .dir()
            .map_err(|e| format!("cannot read the upper root: {e}"))?,
    );
    let mut w = Walk {
        layers,
        filter,
        out: Vec::new(),
        added_files: Vec::new(),
        deleted: HashMap::new(),
        frames: Vec::new(),
    };
    let root = Frame::new(base, Some(OsString::new()), marks.opaque, marks.moved_in);
    w.run(&mut walker, root)
        .map_err(|(p, e)| format!("cannot read {}: {e}", describe(&p)))?;
    w.match_moves();
    if let Some(m) = &filter.moves {
        w.match_journal_moves(m);
    }
    // A renamed shared directory's old name is covered by its `R` line.
    let moved_dirs: std::collections::HashSet<OsString> = w
        .out
        .iter()
        .filter(|c| c.kind == Kind::Renamed && c.ftype == "dir")
        .filter_map(|c| c.from.clone())
        .collect();
    w.out.retain(|c| {
        !(c.kind == Kind::Deleted
            && c.ftype == "dir"
            && c.old.as_ref().is_some_and(|(_, p)| moved_dirs.contains(p)))
    });
    let mut out: Vec<Change> = w
        .out
        .into_iter()
        .filter(|c| filter.wants(&c.path) || c.from.as_ref().is_some_and(|f| filter.wants(f)))
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn describe(p: &OsStr) -> String {
    if p.is_empty() {
        "the upper root".into()
    } else {
        format!("upper path {}", p.to_string_lossy())
    }
}

type WalkResult = Result<(), (OsString, io::Error)>;

impl Walk<'_> {
    fn push(&mut self, c: Change) -> usize {
        self.out.push(c);
        self.out.len() - 1
    }

    /// Walks the upper from the root, whose shared version is `root`.
    fn run(&mut self, w: &mut Walker, root: Frame) -> WalkResult {
        self.enter(w, root)?;
        loop {
            let step = w.step().map_err(|e| (w.path().to_os_string(), e))?;
            match step {
                None => return Ok(()),
                Some(Step::Leave(_)) => {
                    self.frames.pop();
                }
                Some(Step::Entry(e)) => self.entry(w, e)?,
            }
        }
    }

    /// The walker just entered a directory whose shared version is `f`:
    /// the shared entries it hides are deleted.
    fn enter(&mut self, w: &Walker, f: Frame) -> WalkResult {
        let depth = self.frames.len();
        if depth >= BASE_OPEN {
            self.frames[depth - BASE_OPEN].base.clear();
        }
        self.frames.push(f);
        let f = self.frames.last().expect("just pushed");
        if !f.hides {
            return Ok(());
        }
        let nlowers = self.layers.lowers.len();
        let names: std::collections::HashSet<&OsStr> = w.pending().collect();
        let mut gone = Vec::new();
        for n in base_names(&f.base).map_err(|e| (w.path().to_os_string(), e))? {
            if names.contains(n.as_os_str()) {
                continue;
            }
            let rel = w.child_path(&n);
            if self.filter.scratch.matches_os(&rel) {
                continue;
            }
            let Some(b) = base_lookup(&f.base, nlowers, &n).map_err(|e| (rel.clone(), e))? else {
                continue;
            };
            let base_rel = f.base_path.as_ref().map(|p| rel_of(&join_lower(p, &n)));
            gone.push(Change {
                path: rel,
                kind: Kind::Deleted,
                from: None,
                ftype: type_name(b.st.st_mode),
                conflict: false,
                old: base_rel.map(|r| (b.layer, r)),
                new: false,
            });
        }
        self.out.extend(gone);
        Ok(())
    }

    /// The current frame's lower directories, reopened if they were
    /// evicted: by their lower path from each layer root (any length,
    /// `walk::open_rel`), checked to be the very directories seen before.
    fn base(&mut self, w: &Walker) -> io::Result<&Base> {
        let f = self.frames.last_mut().expect("a frame per level");
        if f.base.len() < f.base_ids.len() {
            let rel = rel_of(f.base_path.as_deref().unwrap_or(OsStr::new("")));
            let mut base = Vec::new();
            for &(i, dev, ino) in &f.base_ids {
                let fd = walk::open_rel(
                    &self.layers.lowers[i],
                    &rel,
                    libc::O_PATH | libc::O_DIRECTORY,
                )?;
                let st = sys::fstat(&fd)?;
                if (st.st_dev, st.st_ino) != (dev, ino) {
                    return Err(io::Error::other(format!(
                        "the shared version of {} changed during the diff; run it again",
                        describe(w.path())
                    )));
                }
                base.push((i, fd));
            }
            f.base = base;
        }
        Ok(&f.base)
    }

    /// One entry of the walker's current directory.
    fn entry(&mut self, w: &mut Walker, e: sys::DirEntry) -> WalkResult {
        let rel = w.child_path(&e.name);
        if self.filter.scratch.matches_os(&rel) || !self.filter.enters(&rel) {
            return Ok(());
        }
        let ectx = |err: io::Error| (rel.clone(), err);
        let nlowers = self.layers.lowers.len();
        let dir = w.dir().map_err(ectx)?;
        let base_empty = self.frames.last().is_some_and(|f| f.base_ids.is_empty());
        // In a directory without a shared version (new), the entry
        // type from the listing is enough: no stat per entry.
        let st = match mode_of_dtype(e.dtype) {
            Some(mode) if base_empty => {
                let mut st: Stat = crate::layer::sys::zeroed_stat();
                st.st_mode = mode;
                st
            }
            _ => sys::fstatat(dir, &e.name).map_err(ectx)?,
        };
        let base = if base_empty {
            None
        } else {
            let b = self.base(w).map_err(ectx)?;
            base_lookup(b, nlowers, &e.name).map_err(ectx)?
        };
        let f = self.frames.last().expect("a frame per level");
        let base_rel = f
            .base_path
            .as_ref()
            .map(|p| rel_of(&join_lower(p, &e.name)));
        if is_whiteout(&st) {
            if let Some(b) = base {
                let idx = self.push(Change {
                    path: rel,
                    kind: Kind::Deleted,
                    from: None,
                    ftype: type_name(b.st.st_mode),
                    conflict: false,
                    old: base_rel.clone().map(|r| (b.layer, r)),
                    new: false,
                });
                if let (false, Some(r)) = (is_dir(&b.st), base_rel) {
                    self.deleted.insert((b.layer, r), idx);
                }
            }
            return Ok(());
        }
        if is_dir(&st) {
            return self.child_dir(w, &e.name, rel, &st, base);
        }
        let moved_in = f.moved_in;
        match base {
            None => {
                let idx = self.push(Change {
                    path: rel,
                    kind: Kind::Added,
                    from: None,
                    ftype: type_name(st.st_mode),
                    conflict: false,
                    old: None,
                    new: true,
                });
                if moved_in && st.st_mode & libc::S_IFMT == libc::S_IFREG {
                    self.added_files.push(idx);
                }
            }
            Some(b) => {
                let old = base_rel.map(|r| (b.layer, r));
                let dir = w.dir().map_err(ectx)?;
                let kind = if is_dir(&b.st) {
                    Some(Kind::Modified)
                } else {
                    self.compare(dir, &e.name, &st, &b, old.as_ref())
                        .map_err(ectx)?
                };
                let conflict =
                    st.st_mode & libc::S_IFMT == libc::S_IFREG && self.drifted(dir, &e.name);
                if let Some(kind) = kind {
                    self.push(Change {
                        path: rel,
                        kind,
                        from: None,
                        ftype: type_name(st.st_mode),
                        conflict,
                        old,
                        new: true,
                    });
                }
            }
        }
        Ok(())
    }

    /// A directory entry `name` of the walker's current directory: its own
    /// line, then the walker enters it.
    fn child_dir(
        &mut self,
        w: &mut Walker,
        name: &OsStr,
        rel: OsString,
        st: &Stat,
        base: Option<BaseEntry>,
    ) -> WalkResult {
        let parent_path = self.frames.last().and_then(|f| f.base_path.clone());
        let parent_hides = self.frames.last().is_some_and(|f| f.hides);
        w.descend(name).map_err(|e| (rel.clone(), e))?;
        let fd = w.dir().map_err(|e| (rel.clone(), e))?;
        let marks = dir_marks(fd);
        let opaque = marks.opaque;
        if let Some(r) = marks.redirect {
            let old_lower = if r.as_bytes().starts_with(b"/") {
                r
            } else {
                join_lower(parent_path.as_deref().unwrap_or(OsStr::new("")), &r)
            };
            let from = rel_of(&old_lower);
            let base = lowers_at_path(self.layers, &old_lower);
            self.push(Change {
                path: rel,
                kind: Kind::Renamed,
                from: Some(from),
                ftype: "dir",
                conflict: false,
                old: None,
                new: true,
            });
            let f = Frame::new(base, Some(old_lower), opaque, marks.moved_in);
            return self.enter(w, f);
        }
        let base_path = parent_path.as_ref().map(|p| join_lower(p, name));
        let old = match (&base, &base_path) {
            (Some(b), Some(p)) => Some((b.layer, rel_of(p))),
            _ => None,
        };
        let (kind, sub_base, hides) = match base {
            Some(b) if is_dir(&b.st) => {
                let same = self.same_meta(fd, st, &b.dirs[0].1, &b.st, false);
                let kind = (!same).then_some(Kind::Metadata);
                (kind, b.dirs, parent_hides || opaque)
            }
            Some(_) => (Some(Kind::Modified), Vec::new(), false),
            None => (Some(Kind::Added), Vec::new(), false),
        };
        if let Some(kind) = kind {
            self.push(Change {
                path: rel,
                kind,
                from: None,
                ftype: "dir",
                conflict: false,
                old,
                new: true,
            });
        }
        self.enter(w, Frame::new(sub_base, base_path, hides, marks.moved_in))
    }

    /// `Some(Modified)` when content or type differ, `Some(Metadata)` when
    /// only metadata does, `None` when the upper entry equals the shared one.
    fn compare(
        &self,
        dir: &OwnedFd,
        name: &OsStr,
        st: &Stat,
        b: &BaseEntry,
        old: Option<&(usize, OsString)>,
    ) -> io::Result<Option<Kind>> {
        let fmt = st.st_mode & libc::S_IFMT;
        if fmt != b.st.st_mode & libc::S_IFMT {
            return Ok(Some(Kind::Modified));
        }
        let ufd = sys::open_path(dir, name)?;
        if old.is_none() {
            return Ok(Some(Kind::Modified));
        }
        // The shared file, from the lower directory it was found in.
        let ldir = self
            .frames
            .last()
            .and_then(|f| f.base.iter().find(|(i, _)| *i == b.layer))
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let lfd = sys::open_path(&ldir.1, name)?;
        let content_same = match fmt {
            libc::S_IFREG => {
                st.st_size == b.st.st_size && {
                    let a = sys::reopen(&ufd, libc::O_RDONLY)?;
                    let l = sys::reopen(&lfd, libc::O_RDONLY | libc::O_NOATIME)
                        .or_else(|_| sys::reopen(&lfd, libc::O_RDONLY))?;
                    same_bytes(&a, &l)?
                }
            }
            libc::S_IFLNK => sys::readlink_fd(&ufd)? == sys::readlink_fd(&lfd)?,
            libc::S_IFCHR | libc::S_IFBLK => st.st_rdev == b.st.st_rdev,
            _ => true,
        };
        if !content_same {
            return Ok(Some(Kind::Modified));
        }
        let same = self.same_meta(&ufd, st, &lfd, &b.st, fmt != libc::S_IFLNK);
        Ok((!same).then_some(Kind::Metadata))
    }

    fn same_meta(&self, ufd: &OwnedFd, ust: &Stat, lfd: &OwnedFd, lst: &Stat, times: bool) -> bool {
        let fmt = ust.st_mode & libc::S_IFMT;
        ust.st_mode & 0o7777 == lst.st_mode & 0o7777
            && (!self.layers.compare_owner()
                || (ust.st_uid, ust.st_gid) == (lst.st_uid, lst.st_gid))
            && (!times || (ust.st_mtime, ust.st_mtime_nsec) == (lst.st_mtime, lst.st_mtime_nsec))
            && (fmt == libc::S_IFLNK || user_xattrs(ufd) == user_xattrs(lfd))
    }

    /// Whether the upper file `name` in `dir` has an origin record whose
    /// shared original is no longer what was copied.
    fn drifted(&self, dir: &OwnedFd, name: &OsStr) -> bool {
        if !self.filter.origins {
            return false;
        }
        let Ok(fd) = sys::open_path(dir, name) else {
            return false;
        };
        match Origin::read(&fd) {
            Some(o) => self.origin_drifted(&o),
            None => false,
        }
    }

    fn origin_drifted(&self, o: &Origin) -> bool {
        let Some(root) = self.layers.lowers.get(o.layer) else {
            return true;
        };
        match stat_in(root, &rel_of(&o.path)) {
            Ok(st) => !o.matches(&st),
            Err(_) => true,
        }
    }

    /// Turns an added file whose origin is a deleted shared file into a
    /// rename of it (one added file per deleted original).
    fn match_moves(&mut self) {
        if self.deleted.is_empty() || !self.filter.origins {
            return;
        }
        // Only now, and only when a shared file was deleted, are the added
        // files' xattrs read, and only those in directories with the
        // moved-in mark: other new files cost no call. Candidates come
        // grouped by directory (walk order).
        let mut gone = Vec::new();
        let mut dir: Option<(OsString, OwnedFd)> = None;
        for idx in std::mem::take(&mut self.added_files) {
            let path = self.out[idx].path.clone();
            let (parent, name) = split_parent(&path);
            if dir.as_ref().is_none_or(|(p, _)| p != parent) {
                let fd = walk::open_rel(&self.layers.upper, parent, libc::O_PATH);
                let Ok(fd) = fd else {
                    continue;
                };
                dir = Some((parent.to_os_string(), fd));
            }
            let Some((_, dfd)) = &dir else {
                continue;
            };
            let Some(o) = origin_at(dfd, name) else {
                continue;
            };
            let Some(d) = self.deleted.remove(&(o.layer, rel_of(&o.path))) else {
                continue;
            };
            let conflict = self.origin_drifted(&o);
            let from = self.out[d].path.clone();
            let old = self.out[d].old.clone();
            let c = &mut self.out[idx];
            c.kind = Kind::Renamed;
            c.from = Some(from);
            c.conflict = conflict;
            c.old = old;
            gone.push(d);
        }
        let gone: std::collections::HashSet<usize> = gone.into_iter().collect();
        let mut i = 0;
        self.out.retain(|_| {
            i += 1;
            !gone.contains(&(i - 1))
        });
    }
}

impl Walk<'_> {
    /// Turns an added file the journal saw moved from a deleted shared
    /// file into a rename of it (for files without an origin record, such
    /// as a shared file replaced by an atomic save and then moved).
    fn match_journal_moves(&mut self, moves: &super::moves::Moves) {
        let deleted: HashMap<String, usize> = self
            .out
            .iter()
            .enumerate()
            .filter(|(_, c)| c.kind == Kind::Deleted && c.ftype != "dir")
            .map(|(i, c)| (c.path_str(), i))
            .collect();
        if deleted.is_empty() {
            return;
        }
        let mut gone = std::collections::HashSet::new();
        for idx in 0..self.out.len() {
            let c = &self.out[idx];
            if c.kind != Kind::Added || c.ftype == "dir" {
                continue;
            }
            let Some(d) = moves
                .origin_of(&c.path_str())
                .and_then(|o| deleted.get(o).copied())
            else {
                continue;
            };
            if !gone.insert(d) {
                continue;
            }
            let from = self.out[d].path.clone();
            let old = self.out[d].old.clone();
            let c = &mut self.out[idx];
            c.kind = Kind::Renamed;
            c.from = Some(from);
            c.old = old;
        }
        let mut i = 0;
        self.out.retain(|_| {
            i += 1;
            !gone.contains(&(i - 1))
        });
    }
}

/// (parent, name) of a relative path.
fn split_parent(p: &OsStr) -> (&OsStr, &OsStr) {
    let b = p.as_bytes();
    match b.iter().rposition(|&c| c == b'/') {
        Some(i) => (OsStr::from_bytes(&b[..i]), OsStr::from_bytes(&b[i + 1..])),
        None => (OsStr::new(""), p),
    }
}

/// The origin record of `name` in `dir`, if it has one. Most upper files
/// have no xattrs at all: one `listxattrat` call answers for them.
fn origin_at(dir: &OwnedFd, name: &OsStr) -> Option<Origin> {
    let list = sys::listxattr_at(dir, name).ok()?;
    let has = list.split(|&b| b == 0).any(|n| {
        crate::overlay::origin::ORIGIN_NAMES
            .iter()
            .any(|o| o.as_bytes() == n)
    });
    if !has {
        return None;
    }
    Origin::read(&sys::open_path(dir, name).ok()?)
}
