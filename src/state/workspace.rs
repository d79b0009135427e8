//! Stand-in for state-core's `Workspace` (same signature), replaced when
//! that branch is merged: resolves an upper directory through the
//! `workspace.json` of its default state directory.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    pub upper: PathBuf,
    pub lowers: Vec<PathBuf>,
    pub work: PathBuf,
    pub state: PathBuf,
    pub mountpoint: Option<PathBuf>,
    pub scratch: Vec<String>,
}

pub fn default_state_dir(upper: &Path) -> PathBuf {
    let name = upper
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into());
    upper
        .parent()
        .unwrap_or(Path::new("/"))
        .join(format!(".{name}.layerfs-state"))
}

impl Workspace {
    pub fn resolve(arg: &Path) -> Result<Workspace, String> {
        let upper = std::fs::canonicalize(arg).map_err(|e| format!("{}: {e}", arg.display()))?;
        let state = default_state_dir(&upper);
        let text = std::fs::read_to_string(state.join("workspace.json"))
            .map_err(|e| format!("{}: {e}", state.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let p = |k: &str| PathBuf::from(v[k].as_str().unwrap_or_default());
        Ok(Workspace {
            upper: p("upper"),
            lowers: v["lowers"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str())
                        .map(PathBuf::from)
                        .collect()
                })
                .unwrap_or_default(),
            work: p("work"),
            state,
            mountpoint: None,
            scratch: v["scratch"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default(),
        })
    }
}
