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
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;

use crate::layer::sys;
use crate::layer::walk::Walker;
use crate::quote::quote_os;
use crate::state::scratch::Scratch;

/// The layers `diff` reads (their home is `layer::stack`; named here too
/// for the commands that open them to diff, reset or gc).
pub use crate::layer::stack::Layers;

mod compare;
mod renames;
mod shared;
mod walk;

pub(crate) use compare::{read_full, same_bytes};
pub use shared::{shared_entries, SharedEntry};
use walk::{dir_marks, Frame, Walk};

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

/// What limits a diff.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub scratch: Scratch,
    /// Only these paths (and what lies beneath them); empty = everything.
    pub paths: Vec<OsString>,
    /// Moves the journal saw, to label an added file that continues a
    /// deleted shared one as its rename (`state::moves`).
    pub moves: Option<super::moves::Moves>,
    /// The names of these lowers, to find the layer an upper's origin
    /// record names (they find moves and drift). For a merged view (`diff
    /// --base shared`), whose records name lowers of the workspace's
    /// stack, the records are followed through its checkpoint layers to
    /// the shared lowers (`Origins::shared_view`). `None`: no records
    /// are read (moves come from the journal only, no drift shows).
    pub origins: Option<crate::state::frozen::origins::Origins>,
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

/// Computes the diff of a workspace's upper against its lowers.
///
/// One walk of the upper (`layer::walk`, iterative and fd-relative: any
/// depth), with the shared version of each directory beside it; a path is
/// only ever opened from the directory holding it, never as a whole.
pub fn diff(layers: &Layers, filter: &Filter) -> Result<Vec<Change>, DiffError> {
    let mut base = Vec::new();
    for (i, l) in layers.lowers.iter().enumerate() {
        let fd = sys::open_path(l, OsStr::new("."))
            .map_err(|source| DiffError::OpenLower { index: i, source })?;
        base.push((i, fd));
    }
    let mut walker = Walker::new(&layers.upper).map_err(DiffError::UpperRoot)?;
    let marks = dir_marks(walker.dir().map_err(DiffError::UpperRoot)?);
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
        .map_err(|(path, source)| DiffError::Read { path, source })?;
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

/// Why a diff stopped: which layer or upper path could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// The lower `index` (0: the topmost) cannot be opened.
    #[error("cannot open lower dir #{}: {source}", index + 1)]
    OpenLower {
        index: usize,
        #[source]
        source: io::Error,
    },
    /// The upper's root cannot be opened or listed.
    #[error("cannot read the upper root: {0}")]
    UpperRoot(#[source] io::Error),
    /// A path of the upper ("" its root) cannot be read.
    #[error("cannot read {}: {source}", describe(path))]
    Read {
        path: OsString,
        #[source]
        source: io::Error,
    },
}

fn describe(p: &OsStr) -> String {
    if p.is_empty() {
        "the upper root".into()
    } else {
        format!("upper path {}", p.to_string_lossy())
    }
}
