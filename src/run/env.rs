//! The command's environment: the caller's (or, with `--env-clear`, only
//! the names `--env-keep` keeps), then what `layerfs run` sets (`TMPDIR`,
//! `LAYERFS_WORKSPACE`, `HOME` unless `--home host`), then each
//! `--env NAME=VALUE` in order, which may override any of them.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

/// `PATH` after `--env-clear` when neither kept nor set.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What the options asked for.
#[derive(Debug, Clone, Default)]
pub struct EnvPlan {
    pub clear: bool,
    pub keep: Vec<OsString>,
    pub set: Vec<(OsString, OsString)>,
}

/// An `--env` value that is not `NAME=VALUE`.
#[derive(Debug, thiserror::Error)]
#[error("--env {}: expected NAME=VALUE", .0.to_string_lossy())]
pub struct AssignmentError(pub OsString);

/// Parses `--env NAME=VALUE`: a name without `=` and not empty.
pub fn parse_assignment(s: &OsStr) -> Result<(OsString, OsString), AssignmentError> {
    let b = s.as_bytes();
    match b.iter().position(|c| *c == b'=') {
        Some(i) if i > 0 => Ok((
            OsStr::from_bytes(&b[..i]).to_os_string(),
            OsStr::from_bytes(&b[i + 1..]).to_os_string(),
        )),
        _ => Err(AssignmentError(s.to_os_string())),
    }
}

impl EnvPlan {
    /// Applies the plan to `cmd`, with `fixed` the values layerfs sets.
    pub fn apply(&self, cmd: &mut Command, fixed: &[(&str, &OsStr)]) {
        if self.clear {
            let kept: Vec<(OsString, OsString)> = self
                .keep
                .iter()
                .filter_map(|k| std::env::var_os(k).map(|v| (k.clone(), v)))
                .collect();
            cmd.env_clear();
            cmd.envs(kept);
            if !self.keep.iter().any(|k| k == "PATH") {
                cmd.env("PATH", DEFAULT_PATH);
            }
        }
        for (k, v) in fixed {
            cmd.env(k, v);
        }
        for (k, v) in &self.set {
            cmd.env(k, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_need_a_name() {
        assert_eq!(
            parse_assignment(OsStr::new("A=b=c")).unwrap(),
            ("A".into(), "b=c".into())
        );
        assert_eq!(
            parse_assignment(OsStr::new("A=")).unwrap(),
            ("A".into(), "".into())
        );
        assert!(parse_assignment(OsStr::new("=x")).is_err());
        assert!(parse_assignment(OsStr::new("A")).is_err());
    }

    #[test]
    fn clear_keeps_only_what_is_named_and_set_wins() {
        let plan = EnvPlan {
            clear: true,
            keep: vec!["LAYERFS_ENV_TEST_NONE".into()],
            set: vec![("TMPDIR".into(), "/t".into())],
        };
        let mut cmd = Command::new("true");
        plan.apply(&mut cmd, &[("TMPDIR", OsStr::new("/tmp"))]);
        let envs: Vec<_> = cmd.get_envs().collect();
        assert!(envs.contains(&(OsStr::new("TMPDIR"), Some(OsStr::new("/t")))));
        assert!(envs.contains(&(OsStr::new("PATH"), Some(OsStr::new(DEFAULT_PATH)))));
    }
}
