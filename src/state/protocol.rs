//! The control protocol's messages, shared by the client
//! (`state::control`) and the daemon (`daemon::control`): one JSON object
//! a line each way. A request names its command in `"cmd"`; a response
//! is `{"ok": true, ...the reply's fields}` or `{"ok": false, "error"}`.
//!
//! Compatibility, both ways: unknown fields are ignored, and every reply
//! field has a default, so a newer client reads an older daemon's answers
//! (a field that daemon does not send reads as absent) and an older
//! client a newer daemon's. A field is never renamed or given another
//! type; a new one is added with a default.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::layer::fds::Report as Descriptors;
pub use crate::overlay::share::Report as OpenFiles;
pub use crate::state::journal::HealthReport as JournalHealth;

/// One request, tagged by its `"cmd"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// What the daemon serves and how it is doing: `Status`.
    Status,
    /// Pauses writes for as long as the connection holds the pause (or
    /// until `Resume`), waiting up to `wait_ms` for passthrough write
    /// opens to close: `Paused`.
    Pause {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ms: Option<u64>,
    },
    /// Ends this connection's pause: `Resumed`.
    Resume,
    /// Drops the kernel's caches of these paths (relative to the mount):
    /// `Invalidated`.
    Invalidate { paths: Vec<String> },
    /// Drops every cache the kernel holds of the mount: `Invalidated`.
    InvalidateAll,
    /// Resets these paths to the shared version: `Changed`.
    Reset { paths: Vec<String> },
    /// Empties the scratch paths in the upper: `Changed`.
    Gc,
    /// Makes the staging dir `staging` (in the work dir) the upper:
    /// `Restored`.
    Restore { staging: String },
    /// Freezes the upper into a checkpoint layer: `Checkpointed`.
    Checkpoint {
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        layers: Option<String>,
        /// A per-command checkpoint (`layerfs run --checkpoint`): the
        /// daemon answers before its steps are synced and syncs them
        /// after (`checkpoint::Durability::Deferred`). A daemon that does
        /// not know it ignores it and answers once they are synced.
        #[serde(default)]
        deferred: bool,
    },
    /// Drops checkpoint layers back to `to` (else the newest): `Undone`.
    Undo {
        #[serde(default)]
        to: Option<String>,
    },
    /// Merges the layers below the `keep` newest into one and serves
    /// the new stack: `SquashDone`.
    Squash {
        #[serde(default)]
        keep: usize,
    },
}

impl Request {
    /// Every command this protocol knows, as `"cmd"` spells it.
    pub const COMMANDS: &'static [&'static str] = &[
        "status",
        "pause",
        "resume",
        "invalidate",
        "invalidate_all",
        "reset",
        "gc",
        "restore",
        "checkpoint",
        "undo",
        "squash",
    ];

    /// What a well-formed request of `cmd` looks like, for the message
    /// refusing a malformed one.
    pub fn usage(cmd: &str) -> &'static str {
        match cmd {
            "pause" => r#"{"cmd":"pause","wait_ms":N?}"#,
            "invalidate" => r#"{"cmd":"invalidate","paths":["rel/path", ...]}"#,
            "reset" => r#"{"cmd":"reset","paths":["rel/path", ...]}"#,
            "restore" => r#"{"cmd":"restore","staging":NAME} (a staging dir in the work dir)"#,
            "checkpoint" => r#"{"cmd":"checkpoint","name":NAME?,"layers":DIR?}"#,
            "undo" => r#"{"cmd":"undo","to":NAME?}"#,
            "squash" => r#"{"cmd":"squash","keep":N?}"#,
            _ => r#"{"cmd":"CMD"}"#,
        }
    }

    /// Reads one request line. An error is the message for the client,
    /// naming the command and what a well-formed request looks like.
    pub fn parse(line: &str) -> Result<Request, RequestError> {
        let v: serde_json::Value = serde_json::from_str(line).map_err(RequestError::NotJson)?;
        let cmd = v
            .get("cmd")
            .and_then(serde_json::Value::as_str)
            .ok_or(RequestError::NoCommand)?;
        if !Self::COMMANDS.contains(&cmd) {
            return Err(RequestError::UnknownCommand { cmd: cmd.into() });
        }
        let cmd = cmd.to_string();
        serde_json::from_value(v).map_err(|source| RequestError::Malformed { cmd, source })
    }
}

/// Why a request line was refused: the message the daemon sends back,
/// naming the command and what a well-formed request looks like.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("request is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("request has no \"cmd\"")]
    NoCommand,
    #[error(
        "unknown command \"{cmd}\" (this daemon knows {})",
        Request::COMMANDS.join(", ")
    )]
    UnknownCommand { cmd: String },
    /// A known command whose fields do not fit it.
    #[error("bad \"{cmd}\" request ({source}): send {}", Request::usage(cmd))]
    Malformed {
        cmd: String,
        #[source]
        source: serde_json::Error,
    },
}

/// A file open for writing, and the uid holding it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Holder {
    pub path: String,
    pub uid: u32,
}

/// The answer to `Pause`. `busy` (the paths) and `holders` (each with its
/// uid) name the passthrough write opens that did not close in time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Paused {
    pub paused: bool,
    pub busy: Vec<String>,
    pub holders: Vec<Holder>,
}

/// The answer to `Resume`: whether this connection held a pause.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Resumed {
    pub resumed: bool,
}

/// How many kernel cache entries were dropped; `pending` when the
/// invalidation was still running when the daemon answered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Invalidated {
    pub invalidated: u64,
    pub pending: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// The answer to `Reset` and `Gc`: the paths (relative to the mount)
/// whose view changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Changed {
    pub changed: Vec<String>,
}

/// The answer to `Restore`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Restored {
    pub restored: bool,
    #[serde(flatten)]
    pub invalidated: Invalidated,
}

/// The answer to `Checkpoint`: the new checkpoint's name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Checkpointed {
    pub name: String,
    #[serde(flatten)]
    pub invalidated: Invalidated,
}

/// The answer to `Squash`: the new layer (empty when there was nothing
/// to squash) and the layers it replaced, topmost first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SquashDone {
    pub name: String,
    pub merged: Vec<String>,
    #[serde(flatten)]
    pub invalidated: Invalidated,
}

/// The answer to `Undo`: the checkpoint the workspace is at now and how
/// many layers were dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Undone {
    pub at: String,
    pub dropped: usize,
    #[serde(flatten)]
    pub invalidated: Invalidated,
}

/// The last failed policy reload (the previous policy is still served).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReloadFailure {
    pub failed_at: String,
    pub message: String,
    pub error: String,
}

/// Bytes and inodes the upper holds, with the quota limits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct UpperUsage {
    pub bytes: Option<u64>,
    pub inodes: Option<u64>,
    /// `counted` (quota), `measured` (a walk now) or `unknown`.
    pub how: String,
    pub quota_bytes: Option<u64>,
    pub quota_inodes: Option<u64>,
}

/// One lower of a live mount.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LowerStatus {
    pub path: String,
    pub fstype: String,
    pub source: String,
    pub network: bool,
    /// For a network lower: the entries' lifetime in the kernel.
    pub changes_show_within_ms: Option<u64>,
    pub file_handles: bool,
    pub xattrs: bool,
    pub stable_inodes: bool,
    /// `ok` or `lost`.
    pub state: String,
    pub lost_since: Option<String>,
    pub error: Option<String>,
    pub not_answering_seconds: Option<u64>,
}

/// The lowers and the requests a network lower held up.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LayersStatus {
    pub lowers: Vec<LowerStatus>,
    pub refused_requests: Option<u64>,
    pub stalled_requests: Option<u64>,
}

/// The inotify watches on lower directories.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Watches {
    pub enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cap: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dirs_over_cap: Option<u64>,
}

/// Requests served since the mount.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Counters {
    pub requests: u64,
    pub requests_per_second: f64,
    pub by_op: BTreeMap<String, u64>,
    pub copy_ups: u64,
    pub denials: u64,
}

/// How requests reach the daemon: `kind` `io_uring` (with its queues) or
/// `/dev/fuse` (with why not io_uring, when it was asked for).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Transport {
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queues: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entries_per_queue: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ring_requests: Option<Vec<u64>>,
    /// Of `ring_requests`, those each CPU's queue thread answered itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ring_answered: Option<Vec<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_uring_requested: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_uring_refused: Option<String>,
}

/// The answer to `Status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Status {
    pub mountpoint: Option<String>,
    pub upper: Option<String>,
    pub lowers: Vec<String>,
    pub work: Option<String>,
    pub state: Option<String>,
    pub policy: Option<String>,
    pub policy_reload_failure: Option<ReloadFailure>,
    pub pid: Option<u32>,
    pub uid: Option<u32>,
    pub started: Option<String>,
    pub uptime_seconds: f64,
    pub paused: bool,
    pub paused_by_you: bool,
    pub read_only: bool,
    pub upper_usage: Option<UpperUsage>,
    pub layers: Option<LayersStatus>,
    pub watches: Option<Watches>,
    pub counters: Option<Counters>,
    pub journal: Option<JournalHealth>,
    pub transport: Option<Transport>,
    pub descriptors: Option<Descriptors>,
    pub open_files: Option<OpenFiles>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;
    use serde_json::{json, Value};

    /// `value` as it goes over the socket and back.
    fn round_trip<T: Serialize + DeserializeOwned>(value: &T) -> T {
        let line = serde_json::to_string(value).unwrap();
        serde_json::from_str(&line).unwrap()
    }

    #[test]
    fn every_request_round_trips_and_is_tagged_by_cmd() {
        let all = [
            Request::Status,
            Request::Pause { wait_ms: Some(100) },
            Request::Pause { wait_ms: None },
            Request::Resume,
            Request::Invalidate {
                paths: vec!["a/b".into()],
            },
            Request::InvalidateAll,
            Request::Reset {
                paths: vec!["x".into(), "".into()],
            },
            Request::Gc,
            Request::Restore {
                staging: "layerfs-restore.1".into(),
            },
            Request::Checkpoint {
                name: Some("c1".into()),
                layers: Some("/l".into()),
                deferred: false,
            },
            Request::Checkpoint {
                name: None,
                layers: None,
                deferred: true,
            },
            Request::Undo { to: None },
            Request::Squash { keep: 2 },
        ];
        let mut seen = Vec::new();
        for r in &all {
            assert_eq!(&round_trip(r), r);
            let v = serde_json::to_value(r).unwrap();
            let cmd = v["cmd"].as_str().unwrap().to_string();
            assert!(Request::COMMANDS.contains(&cmd.as_str()), "{v}");
            assert_eq!(&Request::parse(&v.to_string()).unwrap(), r);
            seen.push(cmd);
        }
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), Request::COMMANDS.len());
    }

    #[test]
    fn requests_of_older_and_newer_clients_parse() {
        // The literal lines earlier clients sent.
        let old = [
            (r#"{"cmd":"status"}"#, Request::Status),
            (r#"{"cmd":"pause"}"#, Request::Pause { wait_ms: None }),
            (
                r#"{"cmd":"pause","wait_ms":100}"#,
                Request::Pause { wait_ms: Some(100) },
            ),
            (
                r#"{"cmd":"checkpoint","name":null,"layers":null}"#,
                Request::Checkpoint {
                    name: None,
                    layers: None,
                    deferred: false,
                },
            ),
            (r#"{"cmd":"undo","to":null}"#, Request::Undo { to: None }),
            (r#"{"cmd":"undo"}"#, Request::Undo { to: None }),
            // A newer client's extra fields are ignored.
            (r#"{"cmd":"resume","since":3}"#, Request::Resume),
            (
                r#"{"cmd":"reset","paths":["p"],"dry_run":true}"#,
                Request::Reset {
                    paths: vec!["p".into()],
                },
            ),
        ];
        for (line, want) in old {
            assert_eq!(Request::parse(line).unwrap(), want, "{line}");
        }
    }

    #[test]
    fn malformed_requests_say_what_to_send() {
        let e = Request::parse("{").unwrap_err().to_string();
        assert!(e.starts_with("request is not JSON"), "{e}");
        let e = Request::parse(r#"{"paths":[]}"#).unwrap_err().to_string();
        assert_eq!(e, "request has no \"cmd\"");
        let e = Request::parse(r#"{"cmd":"fly"}"#).unwrap_err().to_string();
        assert!(e.contains("unknown command \"fly\""), "{e}");
        assert!(e.contains("checkpoint, undo"), "{e}");
        let e = Request::parse(r#"{"cmd":"reset"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad \"reset\" request"), "{e}");
        assert!(e.contains(r#""paths":["rel/path""#), "{e}");
        let e = Request::parse(r#"{"cmd":"restore","staging":3}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("staging"), "{e}");
    }

    #[test]
    fn every_reply_round_trips() {
        let inv = Invalidated {
            invalidated: 7,
            pending: true,
            warning: None,
        };
        let paused = Paused {
            paused: true,
            busy: vec!["f".into()],
            holders: vec![Holder {
                path: "f".into(),
                uid: 1000,
            }],
        };
        assert_eq!(round_trip(&paused), paused);
        let resumed = Resumed { resumed: true };
        assert_eq!(round_trip(&resumed), resumed);
        assert_eq!(round_trip(&inv), inv);
        let changed = Changed {
            changed: vec!["a".into(), "".into()],
        };
        assert_eq!(round_trip(&changed), changed);
        let restored = Restored {
            restored: true,
            invalidated: inv.clone(),
        };
        assert_eq!(round_trip(&restored), restored);
        // Flattened: the same fields the daemon always sent.
        let v = serde_json::to_value(&restored).unwrap();
        assert_eq!(
            v,
            json!({"restored": true, "invalidated": 7, "pending": true})
        );
        let cp = Checkpointed {
            name: "c1".into(),
            invalidated: inv.clone(),
        };
        assert_eq!(round_trip(&cp), cp);
        let undone = Undone {
            at: "c0".into(),
            dropped: 2,
            invalidated: inv,
        };
        assert_eq!(round_trip(&undone), undone);
        let status = Status {
            mountpoint: Some("/m".into()),
            lowers: vec!["/l".into()],
            pid: Some(4),
            uptime_seconds: 1.5,
            layers: Some(LayersStatus {
                lowers: vec![LowerStatus {
                    path: "/l".into(),
                    state: "ok".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            watches: Some(Watches {
                enabled: true,
                used: Some(3),
                ..Default::default()
            }),
            transport: Some(Transport {
                kind: "/dev/fuse".into(),
                ..Default::default()
            }),
            journal: Some(JournalHealth {
                enabled: Some(true),
                rows: Some(5),
                ..Default::default()
            }),
            descriptors: Some(Descriptors::default()),
            open_files: Some(OpenFiles::default()),
            ..Default::default()
        };
        assert_eq!(round_trip(&status), status);
    }

    #[test]
    fn replies_of_an_older_daemon_read_with_defaults() {
        // The `ok` marker and unknown fields are ignored; missing ones
        // read as absent.
        let v: Status =
            serde_json::from_value(json!({"ok": true, "pid": 9, "future": {"x": 1}})).unwrap();
        assert_eq!(v.pid, Some(9));
        assert!(v.journal.is_none() && v.lowers.is_empty());
        let p: Paused = serde_json::from_value(json!({"ok": true, "paused": true})).unwrap();
        assert!(p.paused && p.holders.is_empty());
        let u: Undone = serde_json::from_value(json!({"ok": true, "at": "c"})).unwrap();
        assert_eq!((u.at.as_str(), u.dropped), ("c", 0));
        let r: Restored = serde_json::from_value(json!({"ok": true})).unwrap();
        assert!(!r.invalidated.pending);
        let _: Value = serde_json::to_value(r).unwrap();
    }
}
