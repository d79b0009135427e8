//! Workspace instances: the naming scheme that maps a user, and optionally
//! one of their sessions, to an upper, work dir, state dir and mountpoint
//! under two configurable roots. `layerfs mount --instance NAME` and the
//! systemd template unit (`layerfs@NAME.service`, NAME from `%i`) use it.
//!
//! ```text
//! NAME        = USER | USER@SESSION
//! USER@…      → UPPER_ROOT/USER[/sessions/SESSION]/{upper,work,state}
//!               MOUNT_ROOT/USER[/sessions/SESSION]/mnt
//! ```
//!
//! Every segment is checked before any path is built from it: 1 to 64
//! characters of `A-Z a-z 0-9 . _ -`, not starting with `.` or `-`. So a
//! name can never climb out of its root (`..`), reach into another user's
//! directory (`a/b`), hide (`.x`) or pass for an option (`-x`), and a
//! session's directories (under `sessions/`) never meet its user's own
//! `upper`, `work`, `state` or `mnt`.

use std::fmt;
use std::path::{Path, PathBuf};

/// Longest USER or SESSION segment.
pub const MAX_SEGMENT: usize = 64;

/// A checked instance name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub user: String,
    pub session: Option<String>,
}

/// The directories of one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstancePaths {
    pub upper: PathBuf,
    pub work: PathBuf,
    pub state: PathBuf,
    pub mountpoint: PathBuf,
}

/// An instance name that is refused: the name, which segment (`user` or
/// `session`), and the rule it breaks.
#[derive(Debug, thiserror::Error)]
#[error("instance name `{name}`: {problem} ({}){}", rule(what), problem.hint())]
pub struct InstanceNameError {
    pub name: String,
    /// `user` or `session`.
    pub what: &'static str,
    pub problem: SegmentProblem,
}

/// How a segment breaks the rule.
#[derive(Debug, thiserror::Error)]
pub enum SegmentProblem {
    #[error("empty {what}")]
    Empty { what: &'static str },
    #[error("{what} `{segment}` is {} characters long", segment.len())]
    TooLong { what: &'static str, segment: String },
    #[error("character {c:?} not allowed in {what} `{segment}`")]
    Character {
        what: &'static str,
        segment: String,
        c: char,
    },
    #[error("{what} `{segment}` starts with `{}`", &segment[..1])]
    Leading { what: &'static str, segment: String },
}

impl SegmentProblem {
    /// What to do about a backslash: systemd's escapes are not undone.
    fn hint(&self) -> &'static str {
        match self {
            SegmentProblem::Character { c: '\\', .. } => {
                " (layerfs@.service passes %i as written: pick a name systemd-escape leaves alone)"
            }
            _ => "",
        }
    }
}

/// The rule a segment must follow, for messages.
fn rule(what: &str) -> String {
    format!(
        "a {what} is 1-{MAX_SEGMENT} characters of A-Z a-z 0-9 . _ -, not starting with \
         `.` or `-`"
    )
}

/// Checks one segment of `name`; the error names the segment and the rule.
fn check_segment(what: &'static str, s: &str, name: &str) -> Result<(), InstanceNameError> {
    let refuse = |problem| {
        Err(InstanceNameError {
            name: name.to_string(),
            what,
            problem,
        })
    };
    let segment = s.to_string();
    if s.is_empty() {
        return refuse(SegmentProblem::Empty { what });
    }
    if s.len() > MAX_SEGMENT {
        return refuse(SegmentProblem::TooLong { what, segment });
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return refuse(SegmentProblem::Character { what, segment, c });
    }
    if s.starts_with('.') || s.starts_with('-') {
        return refuse(SegmentProblem::Leading { what, segment });
    }
    Ok(())
}

impl Instance {
    /// Parses and checks `USER` or `USER@SESSION`.
    pub fn parse(name: &str) -> Result<Instance, InstanceNameError> {
        let (user, session) = match name.split_once('@') {
            Some((u, s)) => (u, Some(s)),
            None => (name, None),
        };
        check_segment("user", user, name)?;
        if let Some(s) = session {
            check_segment("session", s, name)?;
        }
        Ok(Instance {
            user: user.to_string(),
            session: session.map(str::to_string),
        })
    }

    /// The instance's directory below either root.
    fn relative(&self) -> PathBuf {
        let mut p = PathBuf::from(&self.user);
        if let Some(s) = &self.session {
            p.push("sessions");
            p.push(s);
        }
        p
    }

    /// Where the instance's layers, state and mountpoint live.
    pub fn paths(&self, upper_root: &Path, mount_root: &Path) -> InstancePaths {
        let data = upper_root.join(self.relative());
        InstancePaths {
            upper: data.join("upper"),
            work: data.join("work"),
            state: data.join("state"),
            mountpoint: mount_root.join(self.relative()).join("mnt"),
        }
    }
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.session {
            Some(s) => write!(f, "{}@{s}", self.user),
            None => f.write_str(&self.user),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_and_sessions_map_under_their_roots() {
        let i = Instance::parse("alice").unwrap();
        let p = i.paths(Path::new("/var/lib/layerfs"), Path::new("/run/layerfs"));
        assert_eq!(p.upper, PathBuf::from("/var/lib/layerfs/alice/upper"));
        assert_eq!(p.work, PathBuf::from("/var/lib/layerfs/alice/work"));
        assert_eq!(p.state, PathBuf::from("/var/lib/layerfs/alice/state"));
        assert_eq!(p.mountpoint, PathBuf::from("/run/layerfs/alice/mnt"));
        let s = Instance::parse("alice@s42").unwrap();
        assert_eq!(s.to_string(), "alice@s42");
        let p = s.paths(Path::new("/data"), Path::new("/ws"));
        assert_eq!(p.upper, PathBuf::from("/data/alice/sessions/s42/upper"));
        assert_eq!(p.mountpoint, PathBuf::from("/ws/alice/sessions/s42/mnt"));
        // A session named like the user's own directories stays apart.
        let u = Instance::parse("alice@upper").unwrap();
        let p = u.paths(Path::new("/d"), Path::new("/m"));
        assert_eq!(p.upper, PathBuf::from("/d/alice/sessions/upper/upper"));
    }

    #[test]
    fn unsafe_names_are_refused_naming_the_rule() {
        for (name, needle) in [
            ("", "empty user"),
            ("..", "starts with `.`"),
            (".", "starts with `.`"),
            (".hidden", "starts with `.`"),
            ("-rf", "starts with `-`"),
            ("a/b", "character '/'"),
            ("alice@", "empty session"),
            ("@s1", "empty user"),
            ("alice@..", "session `..` starts with `.`"),
            ("alice@s1@s2", "character '@'"),
            ("alice@a/../..", "character '/'"),
            ("al ice", "character ' '"),
            ("alice\\x2dbob", "systemd-escape"),
            ("é", "character 'é'"),
        ] {
            let e = Instance::parse(name).expect_err(name).to_string();
            assert!(e.contains(needle), "{name:?}: {e}");
            assert!(e.contains(&format!("`{name}`")), "{name:?}: {e}");
        }
        let long = "a".repeat(MAX_SEGMENT + 1);
        assert!(Instance::parse(&long).is_err());
        assert!(Instance::parse(&"a".repeat(MAX_SEGMENT)).is_ok());
        for ok in ["alice", "a.b-c_d", "u1000@2024-06-01T10.00", "A@B"] {
            assert!(Instance::parse(ok).is_ok(), "{ok}");
        }
    }
}
