//! How a `layerfs run` ended, its exit code and its `--json` object.
//!
//! Exit codes follow timeout(1) and env(1), so the command's own codes
//! (1, 2, …) keep their meaning for the caller: the command's code, 128+N
//! for a signal N (137, as for SIGKILL, when its output ran past
//! `--max-output` and it was stopped), 124 for `--timeout`, 125 when `layerfs run` itself
//! failed, 126 / 127 when the command could not be executed / was not
//! found, and 2 for a usage error found before anything ran.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use super::cgroup::Usage;

/// Exit code when `--timeout` killed the command.
pub const TIMEOUT_EXIT: i32 = 124;
/// Exit code when the command was stopped for its output: 128 + SIGKILL.
pub const OUTPUT_STOPPED_EXIT: i32 = 128 + libc::SIGKILL;
/// Exit code when `layerfs run` itself failed.
pub const FAILURE_EXIT: i32 = 125;
/// Exit code of a usage error.
pub const USAGE_EXIT: i32 = 2;

/// Why nothing (or not all) ran, worded for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The command line is wrong (exit 2).
    Usage(String),
    /// `layerfs run` could not do its job (exit 125).
    Runtime(String),
    /// The command could not be executed (126) or found (127).
    Exec(i32, String),
}

impl Failure {
    pub fn exit_code(&self) -> i32 {
        match self {
            Failure::Usage(_) => USAGE_EXIT,
            Failure::Runtime(_) => FAILURE_EXIT,
            Failure::Exec(code, _) => *code,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Failure::Usage(m) | Failure::Runtime(m) | Failure::Exec(_, m) => m,
        }
    }
}

/// How the command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    Exited(i32),
    Signaled(i32),
    /// `--timeout` passed and the sandbox was killed.
    TimedOut,
    /// Its output ran past `--max-output` and went on (`relay::stop_bound`):
    /// the sandbox was killed.
    OutputStopped,
    /// `layerfs run` was asked to stop (signal N) and had to kill the
    /// sandbox before the command ended.
    Stopped(i32),
    /// Nothing ran, or the sandbox failed.
    Failed(Failure),
}

/// Everything the summary reports.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub end: End,
    /// Bytes the command wrote to stdout and stderr together.
    pub output_bytes: u64,
    /// Bytes of it relayed (the first `--max-output`).
    pub kept_bytes: u64,
    pub duration: Duration,
    pub upper: Option<PathBuf>,
    pub mountpoint: Option<PathBuf>,
    /// The checkpoint `--checkpoint` took before the command.
    pub checkpoint: Option<String>,
    /// With a limit asked for: what the run used, and how long making its
    /// cgroup took.
    pub resources: Option<(Usage, Duration)>,
}

impl Outcome {
    pub fn failed(f: Failure) -> Outcome {
        Outcome {
            end: End::Failed(f),
            output_bytes: 0,
            kept_bytes: 0,
            duration: Duration::ZERO,
            upper: None,
            mountpoint: None,
            checkpoint: None,
            resources: None,
        }
    }

    pub fn truncated(&self) -> bool {
        self.kept_bytes < self.output_bytes
    }

    pub fn exit_code(&self) -> i32 {
        match &self.end {
            End::Exited(c) => *c,
            End::Signaled(s) | End::Stopped(s) => 128 + s,
            End::TimedOut => TIMEOUT_EXIT,
            End::OutputStopped => OUTPUT_STOPPED_EXIT,
            End::Failed(f) => f.exit_code(),
        }
    }

    /// The `--json` object.
    pub fn to_json(&self) -> Value {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.to_string_lossy().into_owned());
        let signal = match &self.end {
            End::Signaled(s) => Some(*s),
            _ => None,
        };
        let mut v = json!({
            "exit_code": self.exit_code(),
            "signal": signal,
            "truncated": self.truncated(),
            "output_bytes": self.output_bytes,
            "kept_bytes": self.kept_bytes,
            "duration_ms": self.duration.as_millis() as u64,
            "upper": path(&self.upper),
            "mountpoint": path(&self.mountpoint),
            "timed_out": self.end == End::TimedOut,
            "output_stopped": self.end == End::OutputStopped,
            "resources": self.resources.as_ref().map(|(u, setup)| u.to_json(*setup)),
        });
        if let Some(c) = &self.checkpoint {
            v["checkpoint"] = Value::String(c.clone());
        }
        if let End::Failed(f) = &self.end {
            v["error"] = Value::String(f.message().to_string());
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(end: End) -> Outcome {
        Outcome {
            end,
            output_bytes: 10,
            kept_bytes: 4,
            duration: Duration::from_millis(1500),
            upper: Some(PathBuf::from("/u")),
            mountpoint: None,
            checkpoint: None,
            resources: None,
        }
    }

    #[test]
    fn exit_codes_follow_the_command_and_timeout_conventions() {
        assert_eq!(outcome(End::Exited(3)).exit_code(), 3);
        assert_eq!(outcome(End::Signaled(9)).exit_code(), 137);
        assert_eq!(outcome(End::Stopped(15)).exit_code(), 143);
        assert_eq!(outcome(End::TimedOut).exit_code(), 124);
        assert_eq!(outcome(End::OutputStopped).exit_code(), 137);
        assert_eq!(
            outcome(End::OutputStopped).to_json()["output_stopped"],
            true
        );
        assert_eq!(
            outcome(End::Failed(Failure::Runtime("x".into()))).exit_code(),
            125
        );
        assert_eq!(
            outcome(End::Failed(Failure::Usage("x".into()))).exit_code(),
            2
        );
        assert_eq!(
            outcome(End::Failed(Failure::Exec(127, "x".into()))).exit_code(),
            127
        );
    }

    #[test]
    fn json_has_every_field() {
        let v = outcome(End::Signaled(9)).to_json();
        assert_eq!(v["exit_code"], 137);
        assert_eq!(v["signal"], 9);
        assert_eq!(v["truncated"], true);
        assert_eq!(v["output_bytes"], 10);
        assert_eq!(v["kept_bytes"], 4);
        assert_eq!(v["duration_ms"], 1500);
        assert_eq!(v["upper"], "/u");
        assert_eq!(v["timed_out"], false);
        assert!(v.get("error").is_none());
        let f = outcome(End::Failed(Failure::Runtime("no".into()))).to_json();
        assert_eq!(f["error"], "no");
        assert!(f["signal"].is_null());
    }
}
