//! `execute`: a shell command run in the workspace through `layerfs run`'s
//! sandbox, its output (stdout and stderr together, in arrival order) cut
//! at `max_output`, its exit code, and whether the timeout killed it.
//!
//! The command is handed to the `layerfs` binary (`layerfs run --upper …
//! --json -- /bin/sh -c COMMAND`), never run in this process: the sandbox's
//! namespaces, the mount and the supervision are `layerfs run`'s, in one
//! place. A workspace a daemon serves is run in through that mount; an
//! unmounted one is mounted by `run` for the command's duration, after
//! `Workspace::execute` has let go of the in-process core (see DESIGN.md,
//! "The agent tools"). Either way `/dev/fuse` is needed.
//!
//! Reading the answer: `run`'s stdout and stderr are one pipe, so the
//! command's output arrives interleaved as the command wrote it; after it
//! come `run`'s own notes (timeout, truncation) and, last, its `--json`
//! line, whose `kept_bytes` says where the command's output ends.

use std::ffi::OsString;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{Result, ToolError, What};

/// Seconds a command may run when no timeout is given.
pub const DEFAULT_TIMEOUT: f64 = 120.0;
/// Output bytes kept when no `max_output` is given.
pub const DEFAULT_MAX_OUTPUT: u64 = 64 * 1024;
/// The longest timeout accepted (a day).
const MAX_TIMEOUT: f64 = 86_400.0;

fn default_timeout() -> f64 {
    DEFAULT_TIMEOUT
}

fn default_max_output() -> u64 {
    DEFAULT_MAX_OUTPUT
}

/// `execute`: a command for `/bin/sh -c`, run at the workspace root (or
/// `cwd`, relative to it).
#[derive(Debug, Clone, Deserialize)]
pub struct ExecuteRequest {
    pub command: String,
    /// Seconds before the command and everything it started are killed.
    #[serde(default = "default_timeout")]
    pub timeout: f64,
    /// Bytes of output kept; the rest is counted and dropped.
    #[serde(default = "default_max_output")]
    pub max_output: u64,
    /// Working directory, relative to the workspace root.
    #[serde(default)]
    pub cwd: Option<String>,
}

impl ExecuteRequest {
    /// `command` with the default timeout and output cap.
    pub fn new(command: &str) -> ExecuteRequest {
        ExecuteRequest {
            command: command.into(),
            timeout: DEFAULT_TIMEOUT,
            max_output: DEFAULT_MAX_OUTPUT,
            cwd: None,
        }
    }
}

/// What `execute` gives back.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExecuteResult {
    /// The command's stdout and stderr together, as they arrived, at most
    /// `max_output` bytes (invalid UTF-8 replaced).
    pub output: String,
    /// The command's exit code; 128+N for signal N; 124 when the timeout
    /// killed it, 137 when it was stopped for its output.
    pub exit_code: i32,
    /// Output went past `max_output` and was cut.
    pub truncated: bool,
    /// All the output the command wrote, kept or not.
    pub output_bytes: u64,
    pub timed_out: bool,
    pub duration_ms: u64,
    /// What `layerfs run` said about the run (the timeout, the cut), empty
    /// when nothing.
    pub notes: String,
}

/// Where a command runs: the workspace as `layerfs run` names it.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub lowers: Vec<PathBuf>,
    pub upper: PathBuf,
    /// Given to `run` only for an unmounted workspace (a live mount's
    /// policy is its own, and `run` refuses another).
    pub policy: Option<PathBuf>,
    pub mounted: bool,
    pub binary: PathBuf,
}

/// The `layerfs` binary `execute` runs: this process's when it is
/// layerfs, else `layerfs` on `PATH`.
pub(crate) fn default_binary() -> PathBuf {
    match std::env::current_exe() {
        Ok(p) if p.file_name().is_some_and(|n| n == "layerfs") => p,
        _ => PathBuf::from("layerfs"),
    }
}

/// Checks a request before anything runs.
pub(crate) fn check(req: &ExecuteRequest) -> Result<()> {
    if req.command.trim().is_empty() {
        return Err(ToolError::new(
            "execute",
            What::Exec("the command is empty".into()),
        ));
    }
    if !(req.timeout > 0.0 && req.timeout <= MAX_TIMEOUT) {
        return Err(ToolError::new(
            "execute",
            What::Exec(format!(
                "timeout {} s: give a number of seconds above 0, at most {MAX_TIMEOUT}",
                req.timeout
            )),
        ));
    }
    Ok(())
}

/// Runs the command through `layerfs run` and reads its answer.
pub(crate) fn run(t: &Target, req: &ExecuteRequest) -> Result<ExecuteResult> {
    let mut args: Vec<OsString> = vec!["run".into()];
    for l in &t.lowers {
        args.extend(["--lower".into(), l.into()]);
    }
    args.extend(["--upper".into(), t.upper.clone().into_os_string()]);
    if let (false, Some(p)) = (t.mounted, &t.policy) {
        args.extend(["--policy".into(), p.into()]);
    }
    if let Some(cwd) = &req.cwd {
        args.extend(["--cwd".into(), cwd.into()]);
    }
    args.extend([
        "--timeout".into(),
        format!("{}ms", (req.timeout * 1000.0).ceil() as u64).into(),
        // run's --max-output of 0 keeps nothing, as asked.
        "--max-output".into(),
        req.max_output.to_string().into(),
        "--json".into(),
        "--".into(),
        "/bin/sh".into(),
        "-c".into(),
        req.command.clone().into(),
    ]);
    let (mut reader, writer) = std::io::pipe().map_err(|e| io_fail("a pipe", e))?;
    let writer2 = writer.try_clone().map_err(|e| io_fail("a pipe", e))?;
    let mut child = Command::new(&t.binary)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(writer2)
        .spawn()
        .map_err(|e| {
            ToolError::new(
                "execute",
                What::Exec(format!(
                    "cannot start {} run: {e} (is layerfs installed?)",
                    t.binary.display()
                )),
            )
        })?;
    let mut all = Vec::new();
    let read = reader.read_to_end(&mut all);
    let status = child.wait();
    read.map_err(|e| io_fail("the command's output", e))?;
    let status = status.map_err(|e| io_fail("layerfs run", e))?;
    parse(&all, status.code())
}

fn io_fail(what: &str, e: std::io::Error) -> ToolError {
    ToolError::new("execute", What::Exec(format!("reading {what} failed: {e}")))
}

/// Splits `run`'s stream into the command's output, `run`'s notes and its
/// JSON line.
fn parse(all: &[u8], code: Option<i32>) -> Result<ExecuteResult> {
    let body = all.strip_suffix(b"\n").unwrap_or(all);
    let start = body.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let json: Option<Value> = serde_json::from_slice(&body[start..]).ok();
    let Some(v) = json.filter(|v| v.get("exit_code").is_some()) else {
        return Err(ToolError::new(
            "execute",
            What::Exec(format!(
                "layerfs run ended ({}) without its summary: {}",
                code.map_or("killed".to_string(), |c| format!("exit {c}")),
                String::from_utf8_lossy(all).trim_end()
            )),
        ));
    };
    if let Some(err) = v.get("error").and_then(Value::as_str) {
        return Err(ToolError::new(
            "execute",
            What::Exec(format!(
                "the command could not run: {err} (execute needs /dev/fuse and the sandbox of \
                 `layerfs run`)"
            )),
        ));
    }
    let u = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let kept = (u("kept_bytes") as usize).min(start);
    let notes = String::from_utf8_lossy(&body[kept..start])
        .trim()
        .to_string();
    Ok(ExecuteResult {
        output: String::from_utf8_lossy(&body[..kept]).into_owned(),
        exit_code: v.get("exit_code").and_then(Value::as_i64).unwrap_or(-1) as i32,
        truncated: v.get("truncated").and_then(Value::as_bool).unwrap_or(false),
        output_bytes: u("output_bytes"),
        timed_out: v.get("timed_out").and_then(Value::as_bool).unwrap_or(false),
        duration_ms: u("duration_ms"),
        notes,
    })
}

/// The journal row's `path`: the command, on one line, bounded.
pub(crate) fn shown(command: &str) -> String {
    let one: String = command
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(500)
        .collect();
    one
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_ends_where_run_says_and_notes_are_kept_apart() {
        let all = b"hello\nworld\nlayerfs run: output truncated by --max-output\n\
                    {\"exit_code\":0,\"truncated\":true,\"output_bytes\":20,\"kept_bytes\":8}\n";
        let r = parse(all, Some(0)).unwrap();
        assert_eq!(r.output, "hello\nwo");
        assert!(r.truncated);
        assert_eq!(r.output_bytes, 20);
        assert!(r.notes.contains("truncated"), "{}", r.notes);
    }

    #[test]
    fn a_run_without_summary_or_with_an_error_is_an_exec_error() {
        let e = parse(b"boom\n", Some(125)).unwrap_err();
        assert_eq!(e.kind(), "exec");
        assert!(e.to_string().contains("boom"), "{e}");
        let e = parse(b"{\"exit_code\":125,\"error\":\"no fuse\"}\n", Some(125)).unwrap_err();
        assert!(e.to_string().contains("no fuse"), "{e}");
    }
}
