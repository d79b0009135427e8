//! Temporary stand-in for state-core's `Workspace` (same signatures), so
//! snapshots can be built and tested offline; removed once `state-core`
//! is merged.

use std::path::{Path, PathBuf};

pub struct Workspace {
    pub upper: PathBuf,
    pub lowers: Vec<PathBuf>,
    pub work: PathBuf,
    pub state: PathBuf,
    pub mountpoint: Option<PathBuf>,
    pub scratch: Vec<String>,
}

pub struct Client;

impl Client {
    pub fn request(&mut self, _req: &serde_json::Value) -> Result<serde_json::Value, String> {
        Err("no control socket".into())
    }
}

fn beside(upper: &Path, suffix: &str) -> PathBuf {
    let name = upper.file_name().unwrap_or_default().to_string_lossy();
    upper
        .parent()
        .unwrap_or(Path::new("/"))
        .join(format!(".{name}.layerfs-{suffix}"))
}

pub fn default_state_dir(upper: &Path) -> PathBuf {
    beside(upper, "state")
}

impl Workspace {
    pub fn resolve(arg: &Path) -> Result<Workspace, String> {
        let upper = std::fs::canonicalize(arg).map_err(|e| format!("{}: {e}", arg.display()))?;
        if crate::daemon::mounts::find(&upper).is_some_and(|m| m.is_layerfs()) {
            return Err(format!(
                "{} is a live mount: not supported by this build yet",
                upper.display()
            ));
        }
        Ok(Workspace {
            work: beside(&upper, "work"),
            state: default_state_dir(&upper),
            upper,
            lowers: Vec::new(),
            mountpoint: None,
            scratch: Vec::new(),
        })
    }

    pub fn client(&self) -> Option<Result<Client, String>> {
        None
    }
}
