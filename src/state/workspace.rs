//! A workspace as the state commands see it: its layers, its state
//! directory and, when it is mounted, its mountpoint.
//!
//! The state directory (default `.<upper-name>.layerfs-state` beside the
//! upper) holds `workspace.json`, written atomically at every mount, so an
//! unmounted workspace can be found from its upper directory. A live mount
//! is found through the daemon's registry entry (the pid file names the
//! state directory), which is how `--state` elsewhere still resolves.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::daemon::{mounts, pidfile};

/// Name of the description file in a state directory.
pub const WORKSPACE_FILE: &str = "workspace.json";
/// Name of the control socket in a state directory.
pub const SOCKET_FILE: &str = "control.sock";
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
    pub scratch: Vec<String>,
    /// The `--policy` file it was mounted with.
    pub policy: Option<PathBuf>,
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

/// Creates the state directory (mode 0700) if it is missing.
pub fn create_state_dir(dir: &Path) -> io::Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// What `workspace.json` holds.
#[derive(Debug, Clone)]
pub struct Description<'a> {
    pub upper: &'a Path,
    pub lowers: &'a [PathBuf],
    pub work: &'a Path,
    pub mountpoint: Option<&'a Path>,
    pub policy: Option<&'a Path>,
    pub scratch: &'a [String],
}

impl Description<'_> {
    fn to_json(&self) -> Value {
        let s = |p: &Path| p.to_string_lossy().into_owned();
        json!({
            "upper": s(self.upper),
            "lowers": self.lowers.iter().map(|p| s(p)).collect::<Vec<_>>(),
            "work": s(self.work),
            "mountpoint": self.mountpoint.map(s),
            "policy": self.policy.map(s),
            "scratch": self.scratch,
        })
    }
}

/// Writes `workspace.json` atomically: a temporary file, fsynced, renamed
/// over the old one, and the directory fsynced. A reader sees the old or
/// the new description, never a partial one.
pub fn write_description(state: &Path, d: &Description<'_>) -> io::Result<()> {
    let tmp = state.join(format!(".{WORKSPACE_FILE}.tmp"));
    let dst = state.join(WORKSPACE_FILE);
    let mut text = serde_json::to_string_pretty(&d.to_json()).map_err(io::Error::other)?;
    text.push('\n');
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, &dst)?;
    fs::File::open(state)?.sync_all()
}

fn parse_description(state: &Path, text: &str) -> Result<Workspace, String> {
    let file = state.join(WORKSPACE_FILE);
    let bad = |what: &str| {
        format!(
            "{}: {what}; remount the workspace to rewrite it",
            file.display()
        )
    };
    let v: Value = serde_json::from_str(text).map_err(|e| bad(&format!("not valid JSON ({e})")))?;
    let path = |k: &str| -> Result<PathBuf, String> {
        v.get(k)
            .and_then(Value::as_str)
            .map(PathBuf::from)
            .ok_or_else(|| bad(&format!("no \"{k}\" path")))
    };
    let lowers = v
        .get("lowers")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no \"lowers\" list"))?
        .iter()
        .map(|l| {
            l.as_str()
                .map(PathBuf::from)
                .ok_or_else(|| bad("a lower is not a path"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let scratch = v
        .get("scratch")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|g| g.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    Ok(Workspace {
        upper: path("upper")?,
        lowers,
        work: path("work")?,
        state: state.to_path_buf(),
        mountpoint: v
            .get("mountpoint")
            .and_then(Value::as_str)
            .map(PathBuf::from),
        scratch,
        policy: v.get("policy").and_then(Value::as_str).map(PathBuf::from),
    })
}

/// Reads the description in a state directory; `None` when it has none.
fn read_description(state: &Path) -> Result<Option<Workspace>, String> {
    let file = state.join(WORKSPACE_FILE);
    match fs::read_to_string(&file) {
        Ok(text) => parse_description(state, &text).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Err(format!(
            "{}: permission denied: the workspace belongs to another user; run as that user \
             (or root)",
            file.display()
        )),
        Err(e) => Err(format!("{}: {e}", file.display())),
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
fn socket_live(state: &Path) -> bool {
    match std::os::unix::net::UnixStream::connect(state.join(SOCKET_FILE)) {
        Ok(_) => true,
        Err(e) => e.kind() == io::ErrorKind::PermissionDenied,
    }
}

impl Workspace {
    /// A live layerfs mountpoint (asked through its daemon / registry) or an
    /// upper directory (its default state dir's workspace.json); a state
    /// directory itself is accepted too. Errors say what to do.
    pub fn resolve(arg: &Path) -> Result<Workspace, String> {
        let abs = std::path::absolute(arg).map_err(|e| format!("{}: {e}", arg.display()))?;
        let canon = fs::canonicalize(&abs).unwrap_or(abs.clone());
        if let Some(m) = mounts::find(&canon).or_else(|| mounts::find(&abs)) {
            if !m.is_layerfs() {
                return Err(format!(
                    "{} is a {} mount, not a layerfs workspace; give a layerfs mountpoint or an \
                     upper directory",
                    canon.display(),
                    m.fstype
                ));
            }
            let state = state_of_mount(&m.mount_point).ok_or_else(|| {
                format!(
                    "{} is a layerfs mount but its daemon's registry entry cannot be read (it \
                     belongs to another user, or the daemon is gone); run as the user who \
                     mounted it, or give the upper directory",
                    m.mount_point.display()
                )
            })?;
            let mut ws = read_description(&state)?.ok_or_else(|| {
                format!(
                    "{}: no {WORKSPACE_FILE} in state dir {}; remount the workspace",
                    m.mount_point.display(),
                    state.display()
                )
            })?;
            ws.mountpoint = Some(m.mount_point);
            return Ok(ws);
        }
        if !canon.is_dir() {
            return Err(format!(
                "{}: no such directory; give a layerfs mountpoint or the upper directory of a \
                 workspace",
                arg.display()
            ));
        }
        // The state directory itself, or an upper with its default one.
        let (state, ws) = match read_description(&canon)? {
            Some(ws) => (canon.clone(), ws),
            None => {
                let state = default_state_dir(&canon);
                match read_description(&state)? {
                    Some(ws) => (state, ws),
                    None => {
                        return Err(format!(
                            "{} is not a layerfs mountpoint, and {} has no {WORKSPACE_FILE}: give \
                             a live mountpoint, or the upper directory of a workspace mounted at \
                             least once (with --state DIR, give that DIR)",
                            canon.display(),
                            state.display()
                        ))
                    }
                }
            }
        };
        let mut ws = ws;
        ws.state = state;
        ws.mountpoint = ws.mountpoint.take().filter(|mp| {
            mounts::find(mp).is_some_and(|m| m.is_layerfs())
                && state_of_mount(mp).is_none_or(|s| s == ws.state)
                && socket_live(&ws.state)
        });
        Ok(ws)
    }

    /// A client on the live daemon's control socket, if it is mounted.
    pub fn client(&self) -> Option<Result<crate::state::control::Client, String>> {
        self.mountpoint.as_ref()?;
        Some(crate::state::control::Client::connect(&self.state))
    }

    /// Path of the journal database.
    pub fn journal_path(&self) -> PathBuf {
        self.state.join(JOURNAL_FILE)
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
        let lowers = vec![PathBuf::from("/l0"), PathBuf::from("/l1")];
        let scratch = vec!["tmp/**".to_string()];
        let d = Description {
            upper: Path::new("/u"),
            lowers: &lowers,
            work: Path::new("/w"),
            mountpoint: Some(Path::new("/m")),
            policy: None,
            scratch: &scratch,
        };
        write_description(dir.path(), &d).unwrap();
        let ws = read_description(dir.path()).unwrap().unwrap();
        assert_eq!(ws.upper, PathBuf::from("/u"));
        assert_eq!(ws.lowers, lowers);
        assert_eq!(ws.mountpoint, Some(PathBuf::from("/m")));
        assert_eq!(ws.scratch, scratch);
        let text = fs::read_to_string(dir.path().join(WORKSPACE_FILE)).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(v["policy"].is_null());
    }
}
