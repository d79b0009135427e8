//! A workspace that is mounted already: `layerfs run --upper U` runs in
//! the live mount of `U` instead of mounting it a second time (which the
//! upper's lock refuses), and leaves that mount alone afterwards.
//!
//! The live mount is found through the lock its daemon holds on the upper
//! (whatever `--state` it uses) and the registry entry naming its
//! mountpoint, then checked against the layers and policy asked for: a
//! run never silently uses other lowers or another policy.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::host::{holder, mounts};
use crate::state::workspace::Workspace;

use super::outcome::Failure;

/// A live layerfs mount of the upper.
#[derive(Debug)]
pub struct LiveMount {
    pub mountpoint: PathBuf,
    pub pid: u32,
    /// All its lowers: its checkpoints' layers, then the shared lowers.
    pub lowers: Vec<PathBuf>,
}

/// How long a daemon that holds the upper may take to register and mount.
const SETTLE: Duration = Duration::from_secs(5);

/// The live mount of `upper` (canonical), if there is one, checked against
/// `lowers` and `policy` (canonical).
pub fn find(
    upper: &Path,
    lowers: &[PathBuf],
    policy: Option<&Path>,
) -> Result<Option<LiveMount>, Failure> {
    let deadline = Instant::now() + SETTLE;
    let (pid, mountpoint) = loop {
        match holder::serving_daemon(upper) {
            None => return Ok(None),
            Some((pid, Some(mp))) if mounts::find(&mp).is_some_and(|m| m.is_layerfs()) => {
                break (pid, mp)
            }
            Some((pid, mp)) if Instant::now() >= deadline => {
                return Err(Failure::Runtime(match mp {
                    Some(mp) => format!(
                        "upper {} is held by layerfs daemon pid {pid}, which has not mounted \
                         {} after {SETTLE:?}; unmount it (layerfs umount {}) or wait for it",
                        upper.display(),
                        mp.display(),
                        mp.display()
                    ),
                    None => format!(
                        "upper {} is in use by layerfs daemon pid {pid}, whose mount this user \
                         cannot look up (it belongs to another user?); run as the user who \
                         mounted it",
                        upper.display()
                    ),
                }));
            }
            Some(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let ws = Workspace::resolve(&mountpoint).map_err(|e| Failure::Runtime(e.to_string()))?;
    // The checkpoints it stands on are its own; the shared lowers must match.
    let shared = crate::state::checkpoint::shared_of(&ws)
        .map_err(|e| Failure::Runtime(format!("{}: {e}", mountpoint.display())))?;
    if shared != lowers {
        return Err(Failure::Runtime(format!(
            "upper {} is mounted at {} with lower(s) {}, not {}: give the same --lower list, \
             or unmount it first (layerfs umount {})",
            upper.display(),
            mountpoint.display(),
            shown(&shared),
            shown(lowers),
            mountpoint.display()
        )));
    }
    if let Some(p) = policy {
        if ws.policy.as_deref() != Some(p) {
            return Err(Failure::Runtime(format!(
                "upper {} is mounted at {} with {}, not --policy {}: run without --policy to \
                 use the live mount's, or unmount it first (layerfs umount {})",
                upper.display(),
                mountpoint.display(),
                ws.policy
                    .as_ref()
                    .map_or("no policy file".to_string(), |q| format!(
                        "policy {}",
                        q.display()
                    )),
                p.display(),
                mountpoint.display()
            )));
        }
    }
    Ok(Some(LiveMount {
        mountpoint,
        pid,
        lowers: ws.lowers,
    }))
}

fn shown(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
