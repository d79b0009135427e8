//! A workspace as the state commands see it: its layers, its state
//! directory and, when it is mounted, its mountpoint.
//!
//! The state directory (default `.<upper-name>.layerfs-state` beside the
//! upper, or wherever `--state` puts it) holds `workspace.json`, written
//! atomically at every mount and unmount, naming the upper and the last
//! mountpoint. A live mount is found through the daemon's registry entry
//! (the pid file names the state directory); an unmounted workspace
//! through the record its upper and its mountpoint carry
//! (`state::place`), else the default state dir beside the upper.
//!
//! The state directory is opened once as a checked `SafeDir` (not a
//! symlink, owned by the caller or root, not writable by others) and every
//! file in it (`workspace.json`, `control.sock`, `journal.db`,
//! `snapshots/`) is reached through that descriptor, never by its name
//! again: see `layer::safedir`.

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::control::SOCKET_FILE;
use crate::host::{mounts, pidfile};
use crate::layer::safedir::{Role, SafeDir, SafeDirError};

/// Name of the description file in a state directory.
pub const WORKSPACE_FILE: &str = "workspace.json";
/// Name of the journal database in a state directory.
pub const JOURNAL_FILE: &str = "journal.db";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    pub upper: PathBuf,
    pub lowers: Vec<PathBuf>,
    pub work: PathBuf,
    pub state: PathBuf,
    /// Some(..) only when a live daemon serves it.
    pub mountpoint: Option<PathBuf>,
    /// Where it was last mounted (mounted now or not).
    pub last_mountpoint: Option<PathBuf>,
    pub scratch: Vec<String>,
    /// The `--policy` file it was mounted with.
    pub policy: Option<PathBuf>,
    /// The state directory, checked and open (`state` is its path, for
    /// messages).
    pub dir: Arc<SafeDir>,
}

/// The default state directory: a hidden sibling of the upper, like the
/// default work dir, so it is outside the upper and the lowers.
pub fn default_state_dir(upper: &Path) -> PathBuf {
    let name = upper
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into());
    let parent = upper.parent().unwrap_or(Path::new("/"));
    parent.join(format!(".{name}.layerfs-state"))
}

/// Creates the state directory (mode 0700) if it is missing, and opens it
/// checked (`SafeDir`): an existing one that is a symlink, belongs to
/// another user or is writable by others is refused.
pub fn create_state_dir(dir: &Path) -> Result<SafeDir, SafeDirError> {
    SafeDir::create(dir, Role::State, 0o700).map(|(d, _)| d)
}

/// Opens an existing state directory, checked; `Ok(None)` when missing.
pub fn open_state_dir(dir: &Path) -> Result<Option<SafeDir>, SafeDirError> {
    SafeDir::open(dir, Role::State)
}

/// What `workspace.json` holds.
#[derive(Debug, Clone)]
pub struct Description<'a> {
    pub upper: &'a Path,
    pub lowers: &'a [PathBuf],
    pub work: &'a Path,
    pub mountpoint: Option<&'a Path>,
    /// Where it is (or was last) mounted, kept after the unmount; `None`
    /// for a workspace only the in-process tools have opened.
    pub last_mountpoint: Option<&'a Path>,
    pub policy: Option<&'a Path>,
    pub scratch: &'a [String],
}

impl Description<'_> {
    fn record(&self) -> Record {
        let s = |p: &Path| p.to_string_lossy().into_owned();
        Record {
            upper: s(self.upper),
            lowers: self.lowers.iter().map(|p| s(p)).collect(),
            work: s(self.work),
            mountpoint: self.mountpoint.map(s),
            last_mountpoint: self.last_mountpoint.map(s),
            policy: self.policy.map(s),
            scratch: self.scratch.to_vec(),
        }
    }
}

/// `workspace.json` on disk. Fields added since the first layerfs that
/// wrote it (`last_mountpoint`, `policy`, `scratch`) have defaults, so an
/// older file still loads; unknown fields (a newer layerfs's) are
/// ignored. `upper`, `lowers` and `work` are required.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    upper: String,
    lowers: Vec<String>,
    work: String,
    #[serde(default)]
    mountpoint: Option<String>,
    #[serde(default)]
    last_mountpoint: Option<String>,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    scratch: Vec<String>,
}

/// Writes `workspace.json` atomically: a temporary file, fsynced, renamed
/// over the old one, and the directory fsynced. A reader sees the old or
/// the new description, never a partial one.
pub fn write_description(state: &SafeDir, d: &Description<'_>) -> io::Result<()> {
    stage_description(state, d)?;
    place_description(state)
}

/// The first half of `write_description`: the new content written aside
/// and made durable; `workspace.json` is untouched. A daemon starting
/// stages it while a fork's stack is placed (`daemon::serve`), so the two
/// waits for the disk overlap.
pub fn stage_description(state: &SafeDir, d: &Description<'_>) -> io::Result<()> {
    let mut text = serde_json::to_string_pretty(&d.record()).map_err(io::Error::other)?;
    text.push('\n');
    state.stage_file(WORKSPACE_FILE, text.as_bytes())?;
    state.sync_staged(WORKSPACE_FILE)
}

/// The second half: the staged description renamed into place, and the
/// state dir synced (which makes every rename in it durable, a fork's
/// stack included).
pub fn place_description(state: &SafeDir) -> io::Result<()> {
    state.rename_staged(WORKSPACE_FILE)?;
    state.sync()
}

fn parse_description(state: Arc<SafeDir>, text: &str) -> Result<Workspace, WorkspaceError> {
    let file = state.shown(WORKSPACE_FILE);
    let r: Record = serde_json::from_str(text).map_err(|source| {
        let what = if source.is_data() {
            "not a workspace description"
        } else {
            "not valid JSON"
        };
        WorkspaceError::BadDescription { file, what, source }
    })?;
    // Frozen layers (checkpoints) on top of the shared lowers: what the
    // mount serves, and what diff and reset compare the upper with.
    let lowers = super::frozen::frozen_paths(&state)?
        .into_iter()
        .chain(r.lowers.into_iter().map(PathBuf::from))
        .collect();
    Ok(Workspace {
        upper: PathBuf::from(r.upper),
        lowers,
        work: PathBuf::from(r.work),
        state: state.path().to_path_buf(),
        mountpoint: r.mountpoint.map(PathBuf::from),
        last_mountpoint: r.last_mountpoint.map(PathBuf::from),
        scratch: r.scratch,
        policy: r.policy.map(PathBuf::from),
        dir: state,
    })
}

/// Reads the description in a state directory; `None` when it has none.
fn read_description(state: Arc<SafeDir>) -> Result<Option<Workspace>, WorkspaceError> {
    let file = state.shown(WORKSPACE_FILE);
    let mut text = String::new();
    match state
        .open_file(WORKSPACE_FILE, libc::O_RDONLY, 0)
        .and_then(|mut f| f.read_to_string(&mut text))
    {
        Ok(_) => parse_description(state, &text).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            Err(WorkspaceError::Foreign { file })
        }
        Err(e) => Err(WorkspaceError::Io {
            path: file,
            source: e,
        }),
    }
}

/// The state directory of the live layerfs mount at `mountpoint`, from the
/// daemon's registry entry (its pid file).
pub fn state_of_mount(mountpoint: &Path) -> Option<PathBuf> {
    let owner = mounts::find(mountpoint).and_then(|m| m.owner_uid());
    pidfile::find_entry(mountpoint, owner).and_then(|e| e.state)
}

/// Whether a daemon answers (or would answer, for its owner) on the
/// control socket of `state`.
fn socket_live(state: &SafeDir) -> bool {
    match std::os::unix::net::UnixStream::connect(state.fd_path(SOCKET_FILE)) {
        Ok(_) => true,
        Err(e) => e.kind() == io::ErrorKind::PermissionDenied,
    }
}

/// Opens an existing state dir to read what it says (`Ok(None)` when
/// missing). Root may read another user's (`SafeDir::open_trusting`): a
/// user's workspace, or their daemon's control socket; `Workspace::resolve`
/// then makes sure the workspace it describes is that user's
/// (`check_owner`).
pub fn open_state_to_read(state: &Path) -> Result<Option<SafeDir>, SafeDirError> {
    use std::os::unix::fs::MetadataExt;
    let extra = if nix::unistd::geteuid().is_root() {
        std::fs::symlink_metadata(state).ok().map(|m| m.uid())
    } else {
        None
    };
    SafeDir::open_trusting(state, Role::State, extra)
}

/// Connects to the daemon serving the workspace whose state directory is
/// `state_dir` (opened checked; root may talk to a user's daemon, see
/// `open_state_to_read`).
pub fn connect(state_dir: &Path) -> Result<super::control::Client, WorkspaceError> {
    match open_state_to_read(state_dir)? {
        Some(dir) => Ok(super::control::Client::connect_dir(&dir)?),
        None => Err(WorkspaceError::NoStateDir {
            state: state_dir.to_path_buf(),
        }),
    }
}

/// Opens the state dir `state` of a workspace, which must exist.
fn existing_state(
    state: &Path,
    what: impl FnOnce() -> WorkspaceError,
) -> Result<Arc<SafeDir>, WorkspaceError> {
    match open_state_to_read(state)? {
        Some(d) => Ok(Arc::new(d)),
        None => Err(what()),
    }
}

/// A state dir of another user (which only root accepts) must describe a
/// workspace whose upper that user owns: its `workspace.json` cannot point
/// root at anyone else's files.
fn check_owner(ws: &Workspace) -> Result<(), WorkspaceError> {
    use std::os::unix::fs::MetadataExt;
    let owner = ws.dir.owner();
    if crate::layer::safedir::trusted_owner(owner) {
        return Ok(());
    }
    match std::fs::symlink_metadata(&ws.upper) {
        Ok(m) if m.uid() == owner => Ok(()),
        _ => Err(WorkspaceError::ForeignUpper {
            state: ws.state.clone(),
            owner,
            upper: ws.upper.clone(),
        }),
    }
}

impl Workspace {
    /// A live layerfs mountpoint (asked through its daemon / registry), an
    /// upper directory or an unmounted mountpoint (the state dir it
    /// records, `state::place`, else the upper's default one), or a state
    /// directory itself. Errors say what to do.
    pub fn resolve(arg: &Path) -> Result<Workspace, WorkspaceError> {
        let abs = std::path::absolute(arg).map_err(|e| WorkspaceError::io(arg, e))?;
        let canon = std::fs::canonicalize(&abs).unwrap_or(abs.clone());
        if let Some(m) = mounts::find(&canon).or_else(|| mounts::find(&abs)) {
            if !m.is_layerfs() {
                return Err(WorkspaceError::NotLayerfs {
                    path: canon,
                    fstype: m.fstype,
                });
            }
            let state =
                state_of_mount(&m.mount_point).ok_or_else(|| WorkspaceError::NoRegistryEntry {
                    mountpoint: m.mount_point.clone(),
                })?;
            let dir = existing_state(&state, || WorkspaceError::StateGone {
                mountpoint: m.mount_point.clone(),
                state: state.clone(),
            })?;
            let mut ws = read_description(dir)?.ok_or_else(|| WorkspaceError::NoDescription {
                mountpoint: m.mount_point.clone(),
                state: state.clone(),
            })?;
            check_owner(&ws)?;
            ws.mountpoint = Some(m.mount_point);
            return Ok(ws);
        }
        if !canon.is_dir() {
            return Err(WorkspaceError::NoSuchDirectory {
                path: arg.to_path_buf(),
            });
        }
        // The state directory itself (it holds a workspace.json), or an
        // upper or unmounted mountpoint with the state dir it records
        // (`state::place`), else an upper with its default one.
        // (A directory this user may not search is taken as a state dir
        // too: reading it then says whose it is.)
        let is_state_dir = match std::fs::symlink_metadata(canon.join(WORKSPACE_FILE)) {
            Ok(_) => true,
            Err(e) => e.kind() == io::ErrorKind::PermissionDenied,
        };
        if is_state_dir {
            return Workspace::from_state(&canon, None);
        }
        match super::place::recorded(&canon) {
            Some(state) => Workspace::from_state(&state, Some(&canon)),
            None => Workspace::from_state(&default_state_dir(&canon), Some(&canon)),
        }
    }

    /// `resolve` with the state dir given (`--state DIR`): `arg` must be
    /// that workspace's upper, its mountpoint (live or last) or the state
    /// dir itself.
    pub fn resolve_in(arg: &Path, state: &Path) -> Result<Workspace, WorkspaceError> {
        let abs = |p: &Path| {
            std::path::absolute(p)
                .map(|a| std::fs::canonicalize(&a).unwrap_or(a))
                .map_err(|e| WorkspaceError::io(p, e))
        };
        let (canon, state) = (abs(arg)?, abs(state)?);
        let of = (canon != state).then_some(canon.as_path());
        Workspace::from_state(&state, of)
    }

    /// The workspace described in the state dir `state`; when it was
    /// reached from the directory `of` (an upper or a mountpoint), the
    /// description must name `of` as one or the other.
    fn from_state(state: &Path, of: Option<&Path>) -> Result<Workspace, WorkspaceError> {
        let shown = of.unwrap_or(state);
        let missing = || WorkspaceError::NotAWorkspace {
            shown: shown.to_path_buf(),
            state: state.to_path_buf(),
        };
        let dir = existing_state(state, missing)?;
        let mut ws = read_description(dir)?.ok_or_else(missing)?;
        if let Some(of) = of {
            if ws.upper != of && ws.last_mountpoint.as_deref() != Some(of) {
                return Err(WorkspaceError::Moved {
                    state: state.to_path_buf(),
                    upper: ws.upper,
                    of: of.to_path_buf(),
                });
            }
        }
        ws.state = state.to_path_buf();
        check_owner(&ws)?;
        ws.mountpoint = ws.mountpoint.take().filter(|mp| {
            mounts::find(mp).is_some_and(|m| m.is_layerfs())
                && state_of_mount(mp).is_none_or(|s| s == ws.state)
                && socket_live(&ws.dir)
        });
        Ok(ws)
    }

    /// A client on the live daemon's control socket, if it is mounted.
    pub fn client(
        &self,
    ) -> Option<Result<crate::state::control::Client, crate::state::control::ControlError>> {
        self.mountpoint.as_ref()?;
        Some(crate::state::control::Client::connect_dir(&self.dir))
    }

    /// Path of the journal database, through the state dir's descriptor
    /// (valid while this `Workspace` lives).
    pub fn journal_path(&self) -> PathBuf {
        self.dir.fd_path(JOURNAL_FILE)
    }

    /// The work dir, opened checked (it must exist).
    pub fn work_dir(&self) -> Result<SafeDir, WorkspaceError> {
        SafeDir::open(&self.work, Role::Work)?.ok_or_else(|| WorkspaceError::NoWorkDir {
            work: self.work.clone(),
        })
    }
}

/// Why a workspace could not be found or read: which path, what is wrong,
/// and what to do. The text is what the commands print.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// A checked directory (state or work dir) was refused.
    #[error(transparent)]
    Dir(#[from] SafeDirError),
    /// The frozen layers recorded in the state dir cannot be read.
    #[error(transparent)]
    Frozen(#[from] super::frozen::StackError),
    /// The system refused a call on `path`.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    /// `workspace.json` does not parse (`what`: as JSON, or as a
    /// description).
    #[error("{}: {what} ({source}); remount the workspace to rewrite it", file.display())]
    BadDescription {
        file: PathBuf,
        what: &'static str,
        source: serde_json::Error,
    },
    /// `workspace.json` is another user's.
    #[error(
        "{}: permission denied: the workspace belongs to another user; run as that user \
         (or root)",
        file.display()
    )]
    Foreign { file: PathBuf },
    /// The daemon's control socket did not answer.
    #[error(transparent)]
    Control(#[from] super::control::ControlError),
    /// `connect` to a state dir that is not there.
    #[error(
        "no state dir {}: the workspace is not mounted (or was never mounted)",
        state.display()
    )]
    NoStateDir { state: PathBuf },
    /// Root reading a user's state dir that names an upper not theirs.
    #[error(
        "state dir {} belongs to uid {owner}, but the upper it names ({}) does not: \
         refused; run the command as uid {owner}",
        state.display(),
        upper.display()
    )]
    ForeignUpper {
        state: PathBuf,
        owner: u32,
        upper: PathBuf,
    },
    /// A mount of another file system.
    #[error(
        "{} is a {fstype} mount, not a layerfs workspace; give a layerfs mountpoint or an \
         upper directory",
        path.display()
    )]
    NotLayerfs { path: PathBuf, fstype: String },
    /// A layerfs mount whose daemon's pid file cannot be read.
    #[error(
        "{} is a layerfs mount but its daemon's registry entry cannot be read (it \
         belongs to another user, or the daemon is gone); run as the user who \
         mounted it, or give the upper directory",
        mountpoint.display()
    )]
    NoRegistryEntry { mountpoint: PathBuf },
    /// A live mount whose state dir was removed.
    #[error(
        "{}: its state dir {} is gone; remount the workspace",
        mountpoint.display(),
        state.display()
    )]
    StateGone { mountpoint: PathBuf, state: PathBuf },
    /// A live mount whose state dir has no `workspace.json`.
    #[error(
        "{}: no {WORKSPACE_FILE} in state dir {}; remount the workspace",
        mountpoint.display(),
        state.display()
    )]
    NoDescription { mountpoint: PathBuf, state: PathBuf },
    /// The argument is not a directory.
    #[error(
        "{}: no such directory; give a layerfs mountpoint or the upper directory of a \
         workspace",
        path.display()
    )]
    NoSuchDirectory { path: PathBuf },
    /// A directory with no workspace recorded for it.
    #[error(
        "{} is not a layerfs mountpoint, and {} has no {WORKSPACE_FILE}: give a live \
         mountpoint, or the upper directory or mountpoint of a workspace mounted at \
         least once (with --state DIR mounts from before this layerfs version, give \
         --state DIR too)",
        shown.display(),
        state.display()
    )]
    NotAWorkspace { shown: PathBuf, state: PathBuf },
    /// A state dir that describes another upper (copied or moved).
    #[error(
        "state dir {} describes the workspace of upper {}, not {}: it was copied \
         or moved; remount the workspace (layerfs mount … --upper {}) to rewrite it",
        state.display(),
        upper.display(),
        of.display(),
        of.display()
    )]
    Moved {
        state: PathBuf,
        upper: PathBuf,
        of: PathBuf,
    },
    /// The work dir is missing.
    #[error(
        "work dir {} does not exist; mount the workspace once to create it",
        work.display()
    )]
    NoWorkDir { work: PathBuf },
}

impl WorkspaceError {
    fn io(path: &Path, source: io::Error) -> Self {
        WorkspaceError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_hidden_sibling() {
        assert_eq!(
            default_state_dir(Path::new("/var/lib/x/upper")),
            PathBuf::from("/var/lib/x/.upper.layerfs-state")
        );
    }

    #[test]
    fn description_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(create_state_dir(&dir.path().join("s")).unwrap());
        let lowers = vec![PathBuf::from("/l0"), PathBuf::from("/l1")];
        let scratch = vec!["tmp/**".to_string()];
        let d = Description {
            upper: Path::new("/u"),
            lowers: &lowers,
            work: Path::new("/w"),
            mountpoint: Some(Path::new("/m")),
            last_mountpoint: Some(Path::new("/m")),
            policy: None,
            scratch: &scratch,
        };
        write_description(&state, &d).unwrap();
        let ws = read_description(state.clone()).unwrap().unwrap();
        assert_eq!(ws.upper, PathBuf::from("/u"));
        assert_eq!(ws.lowers, lowers);
        assert_eq!(ws.mountpoint, Some(PathBuf::from("/m")));
        assert_eq!(ws.last_mountpoint, Some(PathBuf::from("/m")));
        assert_eq!(ws.scratch, scratch);
        let text = std::fs::read_to_string(dir.path().join("s").join(WORKSPACE_FILE)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(v["policy"].is_null());
    }

    #[test]
    fn an_older_description_still_loads_and_unknown_fields_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(create_state_dir(&dir.path().join("s")).unwrap());
        // As the first layerfs wrote it: no last_mountpoint, policy or
        // scratch; and a field of some newer layerfs.
        let old = r#"{
  "upper": "/u",
  "lowers": ["/l0"],
  "work": "/w",
  "mountpoint": "/m",
  "newer_field": {"x": 1}
}
"#;
        std::fs::write(dir.path().join("s").join(WORKSPACE_FILE), old).unwrap();
        let ws = read_description(state.clone()).unwrap().unwrap();
        assert_eq!(ws.upper, PathBuf::from("/u"));
        assert_eq!(ws.lowers, vec![PathBuf::from("/l0")]);
        assert_eq!(ws.work, PathBuf::from("/w"));
        assert_eq!(ws.mountpoint, Some(PathBuf::from("/m")));
        assert_eq!(ws.last_mountpoint, None);
        assert_eq!(ws.policy, None);
        assert!(ws.scratch.is_empty());
    }

    #[test]
    fn a_description_without_its_layers_is_refused_saying_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(create_state_dir(&dir.path().join("s")).unwrap());
        let file = dir.path().join("s").join(WORKSPACE_FILE);
        for (text, says) in [
            (r#"{"lowers": [], "work": "/w"}"#, "upper"),
            ("{", "not valid JSON"),
        ] {
            std::fs::write(&file, text).unwrap();
            let e = read_description(state.clone()).unwrap_err();
            assert!(matches!(e, WorkspaceError::BadDescription { .. }), "{e:?}");
            let e = e.to_string();
            assert!(e.contains(says), "{e}");
            assert!(e.contains("remount the workspace to rewrite it"), "{e}");
        }
    }
}
