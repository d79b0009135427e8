//! What the sandbox's processes tell `layerfs run`, one line each over the
//! report pipe, and what `layerfs run` asks of the sandbox's init over the
//! control pipe.
//!
//! Lines are shorter than `PIPE_BUF`, so each write is atomic even though
//! the monitor, the init and the command's process (until its exec) share
//! the pipe.

use std::fs::File;
use std::io::Write;

/// One line of the report pipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// The init's pid, as `layerfs run` (the host pid namespace) sees it.
    InitPid(i32),
    /// The sandbox is built; the command is about to start.
    Started,
    /// Setting up the sandbox failed; nothing ran.
    Failed(String),
    /// The command line is wrong (a `--cwd` outside the workspace, …).
    Usage(String),
    /// The command could not be executed (errno, message).
    ExecFailed(i32, String),
    /// The command exited with this code.
    Exited(i32),
    /// A signal ended the command.
    Signaled(i32),
}

/// Longest message text sent (the whole line must stay below PIPE_BUF).
const MAX_TEXT: usize = 3000;

fn one_line(msg: &str) -> String {
    let mut s = msg.replace('\n', "; ");
    if s.len() > MAX_TEXT {
        let mut cut = MAX_TEXT;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

impl Report {
    pub fn to_line(&self) -> String {
        match self {
            Report::InitPid(p) => format!("pid {p}\n"),
            Report::Started => "started\n".into(),
            Report::Failed(m) => format!("failed {}\n", one_line(m)),
            Report::Usage(m) => format!("usage {}\n", one_line(m)),
            Report::ExecFailed(errno, m) => format!("exec {errno} {}\n", one_line(m)),
            Report::Exited(c) => format!("exit {c}\n"),
            Report::Signaled(s) => format!("signal {s}\n"),
        }
    }

    /// Parses one line (without its newline); `None` for anything else.
    pub fn parse(line: &str) -> Option<Report> {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let num = || rest.trim().parse::<i32>().ok();
        Some(match word {
            "pid" => Report::InitPid(num()?),
            "started" => Report::Started,
            "failed" => Report::Failed(rest.to_string()),
            "usage" => Report::Usage(rest.to_string()),
            "exec" => {
                let (errno, msg) = rest.split_once(' ').unwrap_or((rest, ""));
                Report::ExecFailed(errno.parse().ok()?, msg.to_string())
            }
            "exit" => Report::Exited(num()?),
            "signal" => Report::Signaled(num()?),
            _ => return None,
        })
    }
}

/// The write end of the report pipe.
pub struct Reporter(File);

impl Reporter {
    pub fn new(f: File) -> Reporter {
        Reporter(f)
    }

    /// Sends one report; a vanished reader (`layerfs run` died) is ignored:
    /// the kernel's parent-death signal ends the sandbox then.
    pub fn send(&self, r: &Report) {
        let _ = (&self.0).write_all(r.to_line().as_bytes());
    }

    pub fn file(&self) -> &File {
        &self.0
    }
}

/// A control request to the init: forward signal N to the command.
pub fn forward_request(sig: i32) -> String {
    format!("signal {sig}\n")
}

/// Parses a control request line.
pub fn parse_forward(line: &str) -> Option<i32> {
    line.strip_prefix("signal ")?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_report_round_trips_through_its_line() {
        for r in [
            Report::InitPid(4242),
            Report::Started,
            Report::Failed("mount /tmp: EPERM".into()),
            Report::Usage("--cwd ../x leaves the workspace".into()),
            Report::ExecFailed(2, "nosuch: not found".into()),
            Report::Exited(3),
            Report::Signaled(9),
        ] {
            let line = r.to_line();
            assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
            assert_eq!(Report::parse(line.trim_end_matches('\n')), Some(r));
        }
        assert_eq!(Report::parse("exit x"), None);
        assert_eq!(Report::parse("bogus 1"), None);
    }

    #[test]
    fn messages_stay_on_one_short_line() {
        let r = Report::Failed(format!("a\nb{}", "é".repeat(4000)));
        let line = r.to_line();
        assert_eq!(line.matches('\n').count(), 1);
        assert!(line.len() < 4096);
        assert_eq!(parse_forward(&forward_request(15)), Some(15));
    }
}
