//! The control protocol, client side: JSON lines over the daemon's
//! `control.sock` in the state directory. One request object per line,
//! one response object per line: `{"ok": true, ...}` or
//! `{"ok": false, "error": "message"}`. The messages are typed in
//! `state::protocol` (`Client::call`); `Client::request` sends and
//! returns them as raw JSON.
//!
//! The socket is mode 0600 in a 0700 directory, owned by the daemon's
//! user; the daemon also checks the caller's uid (SO_PEERCRED), so only
//! that user and root may use it.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use super::protocol::Request;
use crate::layer::safedir::SafeDir;

/// How long a request may take before the client gives up (a pause waits
/// for write opens to drain first).
const REPLY_TIMEOUT: Duration = Duration::from_secs(120);

/// Every response's envelope: `ok`, and the daemon's message when not.
#[derive(Deserialize)]
struct Outcome {
    #[serde(default)]
    ok: bool,
    #[serde(default)]
    error: Option<String>,
}

/// The control socket's name in the state dir.
pub const SOCKET_FILE: &str = "control.sock";

pub struct Client {
    path: PathBuf,
    /// How long a reply may take (`REPLY_TIMEOUT` unless `answer_within`).
    timeout: Duration,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

/// Why a request through the control socket got no answer, or was
/// refused: which socket, and what to do. The text is what the state
/// commands print.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The socket belongs to another user (`owner`, where known).
    #[error(
        "permission denied on control socket {}: it belongs to the user who mounted the \
         workspace{}; run the command as that user or as root",
        path.display(),
        owner.map_or_else(String::new, |u| format!(" (uid {u})"))
    )]
    Foreign { path: PathBuf, owner: Option<u32> },
    /// No socket: nothing is mounted there.
    #[error(
        "no control socket at {}: the workspace is not mounted (or its daemon is gone)",
        path.display()
    )]
    NoSocket { path: PathBuf },
    /// A socket with no daemon behind it.
    #[error(
        "nothing listens on control socket {}: the daemon is gone; unmount and mount the \
         workspace again",
        path.display()
    )]
    NoListener { path: PathBuf },
    /// Another failure of the connection.
    #[error("control socket {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The daemon closed the connection without answering.
    #[error("control socket {}: the daemon closed the connection", path.display())]
    Closed { path: PathBuf },
    /// No answer within `within`.
    #[error(
        "control socket {}: no answer within {within:?}: the daemon is stopped (SIGSTOP, a \
         debugger) or stuck; `layerfs umount --lazy` detaches the mount",
        path.display()
    )]
    NoAnswer { path: PathBuf, within: Duration },
    /// The answer is not JSON.
    #[error("control socket {}: bad response ({source}): {answer}", path.display())]
    BadResponse {
        path: PathBuf,
        answer: String,
        #[source]
        source: serde_json::Error,
    },
    /// The answer is not the reply `req` expects.
    #[error("control socket {}: bad reply to {req} ({source})", path.display())]
    BadReply {
        path: PathBuf,
        req: Value,
        #[source]
        source: serde_json::Error,
    },
    /// The request could not be encoded.
    #[error(transparent)]
    Encode(serde_json::Error),
    /// The daemon refused the request: its message.
    #[error("{0}")]
    Refused(String),
    /// The daemon refused the request and gave no message.
    #[error("the daemon refused the request without saying why")]
    RefusedSilently,
}

/// The error for a socket that cannot be used, saying what to do.
fn connect_error(path: &Path, e: io::Error) -> ControlError {
    let path = path.to_path_buf();
    match e.kind() {
        io::ErrorKind::PermissionDenied => {
            let owner = path.metadata().ok().map(|m| m.uid()).or_else(|| {
                path.parent()
                    .and_then(|d| d.metadata().ok())
                    .map(|m| m.uid())
            });
            ControlError::Foreign { path, owner }
        }
        io::ErrorKind::NotFound => ControlError::NoSocket { path },
        io::ErrorKind::ConnectionRefused => ControlError::NoListener { path },
        _ => ControlError::Io { path, source: e },
    }
}

impl Client {
    /// Connects through the checked state dir `dir`: the socket is reached
    /// through its descriptor, not by the directory's name.
    pub fn connect_dir(dir: &SafeDir) -> Result<Client, ControlError> {
        let path = dir.shown(SOCKET_FILE);
        let stream =
            UnixStream::connect(dir.fd_path(SOCKET_FILE)).map_err(|e| connect_error(&path, e))?;
        let _ = stream.set_read_timeout(Some(REPLY_TIMEOUT));
        let writer = stream.try_clone().map_err(|source| ControlError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(Client {
            path,
            timeout: REPLY_TIMEOUT,
            reader: BufReader::new(stream),
            writer,
        })
    }

    /// Sends one request and returns the daemon's response; an
    /// `{"ok": false}` response becomes `Err(its error message)`.
    pub fn request(&mut self, req: &Value) -> Result<Value, ControlError> {
        let mut line = serde_json::to_string(req).map_err(ControlError::Encode)?;
        line.push('\n');
        // A daemon that refuses the caller may answer and close before
        // the request is written: its answer is still read, and says why.
        let sent = self.writer.write_all(line.as_bytes());
        let mut answer = String::new();
        match (self.reader.read_line(&mut answer), sent) {
            (Ok(n), _) if n > 0 => {}
            (_, Err(e)) => return Err(self.lost(e)),
            (Ok(_), Ok(())) => {
                return Err(ControlError::Closed {
                    path: self.path.clone(),
                })
            }
            (Err(e), Ok(())) => return Err(self.lost(e)),
        }
        let v: Value = match serde_json::from_str(&answer) {
            Ok(v) => v,
            Err(source) => {
                return Err(ControlError::BadResponse {
                    path: self.path.clone(),
                    answer,
                    source,
                })
            }
        };
        match Outcome::deserialize(&v) {
            Ok(Outcome { ok: true, .. }) => Ok(v),
            Ok(Outcome { error: Some(e), .. }) => Err(ControlError::Refused(e)),
            _ => Err(ControlError::RefusedSilently),
        }
    }

    /// Sends one typed request and reads the reply as `R` (fields the
    /// daemon does not send take their defaults; ones this client does
    /// not know are ignored).
    pub fn call<R: DeserializeOwned>(&mut self, req: &Request) -> Result<R, ControlError> {
        let req = serde_json::to_value(req).map_err(ControlError::Encode)?;
        let v = self.request(&req)?;
        serde_json::from_value(v).map_err(|source| ControlError::BadReply {
            path: self.path.clone(),
            req,
            source,
        })
    }

    /// Gives up on replies after `limit` instead of `REPLY_TIMEOUT`: for
    /// requests any live daemon answers at once (status), so that a
    /// stopped or stuck one is reported rather than waited for.
    pub fn answer_within(mut self, limit: Duration) -> Client {
        self.timeout = limit;
        let _ = self.reader.get_ref().set_read_timeout(Some(limit));
        self
    }

    fn lost(&self, e: io::Error) -> ControlError {
        let path = self.path.clone();
        if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut {
            ControlError::NoAnswer {
                path,
                within: self.timeout,
            }
        } else {
            ControlError::Io { path, source: e }
        }
    }
}
