//! How a command ends: the one place that turns a subcommand's outcome
//! into the process's exit status and its error line.
//!
//! Every subcommand's `run` returns `Result<i32, CliError>`: `Ok` carries
//! the status of a command that finished (0, or one it passes through: the
//! daemon's, the sandboxed command's), `Err` a failure, which `finish`
//! prints as `layerfs CMD: message` and maps to its status: 2 for a usage
//! error (the command line is wrong), 1 for any other failure. The helper
//! `mount.fuse.layerfs` keeps mount(8)'s own statuses (`mount_helper`).
//!
//! Every error line starts `layerfs CMD: ` (`layerfs snapshot save: `), or
//! `layerfs: ` where no command was recognised; clap's own usage errors
//! too (`clap_outcome`). The helper's lines start `mount.fuse.layerfs: `,
//! the name mount(8) ran.

use std::fmt::Display;

/// The status of a command that did what it was asked.
pub(crate) const EXIT_OK: i32 = 0;
/// The status of a command that failed.
pub(crate) const EXIT_FAILURE: i32 = 1;
/// The status of a command line that is wrong (clap uses it too).
pub(crate) const EXIT_USAGE: i32 = 2;

/// A subcommand's outcome: the status it ends with, or why it failed.
pub(crate) type Outcome = Result<i32, CliError>;

/// Why a step of a command failed, before `or_fail` names the command: a
/// library's error passed on whole (`?` boxes any), or the command's own
/// text with its context (`format!(…).into()`).
pub(crate) type Failed = Box<dyn std::error::Error + Send + Sync>;

/// Which kind of failure, and so which exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The command line is wrong: exit 2.
    Usage,
    /// The command could not do its work: exit 1.
    Failure,
}

/// A subcommand's failure, with the command it belongs to (`snapshot
/// save`, `fs cat`) so the message says where it came from.
#[derive(Debug)]
pub(crate) struct CliError {
    cmd: String,
    kind: Kind,
    message: String,
}

impl CliError {
    /// A wrong command line (exit 2).
    pub(crate) fn usage(cmd: impl Into<String>, message: impl Display) -> CliError {
        CliError::new(cmd, Kind::Usage, message)
    }

    /// A command that could not do its work (exit 1).
    pub(crate) fn failure(cmd: impl Into<String>, message: impl Display) -> CliError {
        CliError::new(cmd, Kind::Failure, message)
    }

    pub(crate) fn new(cmd: impl Into<String>, kind: Kind, message: impl Display) -> CliError {
        CliError {
            cmd: cmd.into(),
            kind,
            message: message.to_string(),
        }
    }

    /// The exit status this failure ends the process with.
    pub(crate) fn code(&self) -> i32 {
        match self.kind {
            Kind::Usage => EXIT_USAGE,
            Kind::Failure => EXIT_FAILURE,
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", prefix(&self.cmd), self.message)
    }
}

/// The start of every error line: `layerfs CMD`, or `layerfs` for none.
pub(crate) fn prefix(cmd: &str) -> String {
    if cmd.is_empty() {
        "layerfs".to_string()
    } else {
        format!("layerfs {cmd}")
    }
}

/// Ends a command line clap refused (or `--help`/`--version`, printed to
/// stdout with status 0): its error under the command's prefix instead of
/// clap's `error: `, then the usage lines clap adds; status 2.
pub(crate) fn clap_outcome(e: &clap::Error, cmd: &str) -> i32 {
    if !e.use_stderr() {
        let _ = e.print();
        return EXIT_OK;
    }
    let text = e.render().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    eprint!("{}: {text}", prefix(cmd));
    EXIT_USAGE
}

/// Attaches the command to an error: `.or_fail("diff")?`.
pub(crate) trait Context<T> {
    /// Any error of this result is the command's failure (exit 1).
    fn or_fail(self, cmd: &str) -> Result<T, CliError>;
    /// Any error of this result is a usage error (exit 2).
    fn or_usage(self, cmd: &str) -> Result<T, CliError>;
}

impl<T, E: Display> Context<T> for Result<T, E> {
    fn or_fail(self, cmd: &str) -> Result<T, CliError> {
        self.map_err(|e| CliError::failure(cmd, e))
    }

    fn or_usage(self, cmd: &str) -> Result<T, CliError> {
        self.map_err(|e| CliError::usage(cmd, e))
    }
}

/// Ends a subcommand: its status, or its error printed (`print_error`)
/// and the status of that kind of failure.
pub(crate) fn finish(outcome: Outcome) -> i32 {
    match outcome {
        Ok(code) => code,
        Err(e) => {
            super::print_error(&e.cmd, &e.message);
            e.code()
        }
    }
}

/// A refused mount configuration: a wrong command line (`Usage`, exit 2)
/// or a system state that does not allow the mount (`Invalid`, exit 1).
pub(crate) fn config_error(cmd: &str, e: crate::config::ConfigError) -> CliError {
    use crate::config::ConfigError;
    match e {
        ConfigError::Usage(m) => CliError::usage(cmd, m),
        ConfigError::Invalid(m) => CliError::failure(cmd, m),
    }
}

/// A command that finished with nothing of its own to report: status 0.
pub(crate) fn done(r: Result<(), CliError>) -> Outcome {
    r.map(|()| EXIT_OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_the_documented_statuses() {
        assert_eq!(CliError::usage("x", "m").code(), 2);
        assert_eq!(CliError::failure("x", "m").code(), 1);
        assert_eq!(finish(Ok(7)), 7);
        assert_eq!(finish(Err(CliError::usage("x", "m"))), 2);
        assert_eq!(finish(Err(CliError::failure("x", "m"))), 1);
        let e: Result<(), _> = Err::<(), _>("no such dir").or_fail("snapshot save");
        assert_eq!(
            e.unwrap_err().to_string(),
            "layerfs snapshot save: no such dir"
        );
        assert_eq!(CliError::usage("", "m").to_string(), "layerfs: m");
    }
}
