//! `--allow-host PREFIX`: absolute symlink targets the workspace may hold
//! beyond the policy's `allow-host` list (by default `/usr`, `/bin`,
//! `/lib`, `/lib64`, `/opt`), e.g. an interpreter under pyenv, conda, uv or
//! `~/.local` that `python3 -m venv` links to.
//!
//! The mount takes its policy from a file, so a run that adds prefixes
//! mounts with a copy of `--policy` (or an empty one) plus one
//! `allow-host` line per prefix, written to the run's private directory
//! and checked like any policy file. A live mount keeps the policy it was
//! mounted with: adding prefixes to it is refused, naming the fix.

use std::fs;
use std::path::{Path, PathBuf};

use crate::policy::{Policy, PolicyError};

/// Why the run's extended policy cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    /// Reading the `--policy` file.
    #[error("--policy {}: {source}", path.display())]
    Policy {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An `--allow-host` prefix that cannot be a policy line.
    #[error("--allow-host {}: give an absolute path without spaces or `#`", .0.display())]
    Prefix(PathBuf),
    /// The policy with the prefixes added does not parse.
    #[error("--allow-host: {0}")]
    Check(#[source] PolicyError),
    #[error("writing {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A live mount keeps the policy it was mounted with.
    #[error(
        "--allow-host cannot change the policy of the live mount at {}: add `{}` to its policy \
         file and remount it, or unmount it and let layerfs run mount",
        mountpoint.display(),
        prefixes
            .iter()
            .map(|p| format!("allow-host {}", p.display()))
            .collect::<Vec<_>>()
            .join("`, `")
    )]
    LiveMount {
        mountpoint: PathBuf,
        prefixes: Vec<PathBuf>,
    },
}

/// Writes the policy the run mounts with into `dir`; returns its path.
pub fn extended_policy(
    policy: Option<&Path>,
    prefixes: &[PathBuf],
    dir: &Path,
) -> Result<PathBuf, HostsError> {
    let mut text = match policy {
        Some(p) => fs::read_to_string(p).map_err(|source| HostsError::Policy {
            path: p.to_path_buf(),
            source,
        })?,
        None => String::new(),
    };
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    for p in prefixes {
        let shown = p
            .to_str()
            .filter(|s| p.is_absolute() && !s.chars().any(|c| c.is_whitespace() || c == '#'));
        let Some(s) = shown else {
            return Err(HostsError::Prefix(p.clone()));
        };
        text.push_str(&format!("allow-host {s}\n"));
    }
    Policy::parse(&text).map_err(HostsError::Check)?;
    let path = dir.join("policy");
    match fs::write(&path, text) {
        Ok(()) => Ok(path),
        Err(source) => Err(HostsError::Write { path, source }),
    }
}

/// Why a live mount cannot take `--allow-host`.
pub fn refused_for_live(mountpoint: &Path, prefixes: &[PathBuf]) -> HostsError {
    HostsError::LiveMount {
        mountpoint: mountpoint.to_path_buf(),
        prefixes: prefixes.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_appended_to_the_policy_and_checked() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().join("base");
        fs::write(&base, "hide **/.env").unwrap();
        let p = extended_policy(Some(&base), &[PathBuf::from("/root/.pyenv")], d.path()).unwrap();
        assert_eq!(
            fs::read_to_string(p).unwrap(),
            "hide **/.env\nallow-host /root/.pyenv\n"
        );
        for bad in ["rel", "/a b", "/a#b"] {
            assert!(
                extended_policy(None, &[PathBuf::from(bad)], d.path()).is_err(),
                "{bad}"
            );
        }
    }
}
