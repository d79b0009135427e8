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

/// The message for a socket that cannot be used, saying what to do.
fn connect_error(path: &Path, e: &io::Error) -> String {
    let p = path.display();
    match e.kind() {
        io::ErrorKind::PermissionDenied => {
            let owner = path.metadata().ok().map(|m| m.uid()).or_else(|| {
                path.parent()
                    .and_then(|d| d.metadata().ok())
                    .map(|m| m.uid())
            });
            let who = owner.map_or_else(String::new, |u| format!(" (uid {u})"));
            format!(
                "permission denied on control socket {p}: it belongs to the user who mounted \
                 the workspace{who}; run the command as that user or as root"
            )
        }
        io::ErrorKind::NotFound => format!(
            "no control socket at {p}: the workspace is not mounted (or its daemon is gone)"
        ),
        io::ErrorKind::ConnectionRefused => format!(
            "nothing listens on control socket {p}: the daemon is gone; unmount and mount \
             the workspace again"
        ),
        _ => format!("control socket {p}: {e}"),
    }
}

impl Client {
    /// Connects through the checked state dir `dir`: the socket is reached
    /// through its descriptor, not by the directory's name.
    pub fn connect_dir(dir: &SafeDir) -> Result<Client, String> {
        let path = dir.shown(SOCKET_FILE);
        let stream =
            UnixStream::connect(dir.fd_path(SOCKET_FILE)).map_err(|e| connect_error(&path, &e))?;
        let _ = stream.set_read_timeout(Some(REPLY_TIMEOUT));
        let writer = stream
            .try_clone()
            .map_err(|e| format!("control socket {}: {e}", path.display()))?;
        Ok(Client {
            path,
            timeout: REPLY_TIMEOUT,
            reader: BufReader::new(stream),
            writer,
        })
    }

    /// Sends one request and returns the daemon's response; an
    /// `{"ok": false}` response becomes `Err(its error message)`.
    pub fn request(&mut self, req: &Value) -> Result<Value, String> {
        let p = self.path.display().to_string();
        let mut line = serde_json::to_string(req).map_err(|e| e.to_string())?;
        line.push('\n');
        // A daemon that refuses the caller may answer and close before
        // the request is written: its answer is still read, and says why.
        let sent = self.writer.write_all(line.as_bytes());
        let mut answer = String::new();
        match (self.reader.read_line(&mut answer), sent) {
            (Ok(n), _) if n > 0 => {}
            (_, Err(e)) => return Err(self.lost(&p, &e)),
            (Ok(_), Ok(())) => {
                return Err(format!(
                    "control socket {p}: the daemon closed the connection"
                ))
            }
            (Err(e), Ok(())) => return Err(self.lost(&p, &e)),
        }
        let v: Value = serde_json::from_str(&answer)
            .map_err(|e| format!("control socket {p}: bad response ({e}): {answer}"))?;
        match Outcome::deserialize(&v) {
            Ok(Outcome { ok: true, .. }) => Ok(v),
            Ok(Outcome { error: Some(e), .. }) => Err(e),
            _ => Err("the daemon refused the request without saying why".into()),
        }
    }

    /// Sends one typed request and reads the reply as `R` (fields the
    /// daemon does not send take their defaults; ones this client does
    /// not know are ignored).
    pub fn call<R: DeserializeOwned>(&mut self, req: &Request) -> Result<R, String> {
        let req = serde_json::to_value(req).map_err(|e| e.to_string())?;
        let v = self.request(&req)?;
        serde_json::from_value(v).map_err(|e| {
            format!(
                "control socket {}: bad reply to {req} ({e})",
                self.path.display()
            )
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

    fn lost(&self, p: &str, e: &io::Error) -> String {
        if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut {
            format!(
                "control socket {p}: no answer within {:?}: the daemon is stopped (SIGSTOP, \
                 a debugger) or stuck; `layerfs umount --lazy` detaches the mount",
                self.timeout
            )
        } else {
            format!("control socket {p}: {e}")
        }
    }
}
