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

use crate::policy::Policy;

/// Writes the policy the run mounts with into `dir`; returns its path.
pub fn extended_policy(
    policy: Option<&Path>,
    prefixes: &[PathBuf],
    dir: &Path,
) -> Result<PathBuf, String> {
    let mut text = match policy {
        Some(p) => fs::read_to_string(p).map_err(|e| format!("--policy {}: {e}", p.display()))?,
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
            return Err(format!(
                "--allow-host {}: give an absolute path without spaces or `#`",
                p.display()
            ));
        };
        text.push_str(&format!("allow-host {s}\n"));
    }
    Policy::parse(&text).map_err(|e| format!("--allow-host: {e}"))?;
    let path = dir.join("policy");
    fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path)
}

/// Why a live mount cannot take `--allow-host`.
pub fn refused_for_live(mountpoint: &Path, prefixes: &[PathBuf]) -> String {
    let lines: Vec<String> = prefixes
        .iter()
        .map(|p| format!("allow-host {}", p.display()))
        .collect();
    format!(
        "--allow-host cannot change the policy of the live mount at {}: add `{}` to its \
         policy file and remount it, or unmount it and let layerfs run mount",
        mountpoint.display(),
        lines.join("`, `")
    )
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
