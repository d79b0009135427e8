//! systemd readiness notification (`sd_notify`), spoken by hand over the
//! datagram socket named by `NOTIFY_SOCKET`: READY=1, RELOADING=1,
//! STOPPING=1. Without `NOTIFY_SOCKET` every call does nothing.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

#[derive(Clone, Default)]
pub struct SdNotify {
    addr: Option<SocketAddr>,
}

impl SdNotify {
    /// Reads `NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace).
    pub fn from_env() -> SdNotify {
        let Some(raw) = std::env::var_os("NOTIFY_SOCKET") else {
            return SdNotify::default();
        };
        let raw = raw.to_string_lossy().into_owned();
        let addr = if let Some(name) = raw.strip_prefix('@') {
            SocketAddr::from_abstract_name(name.as_bytes())
        } else {
            SocketAddr::from_pathname(&raw)
        };
        match addr {
            Ok(a) => SdNotify { addr: Some(a) },
            Err(e) => {
                tracing::warn!("NOTIFY_SOCKET={raw} is not usable: {e}");
                SdNotify::default()
            }
        }
    }

    /// Sends one notification (newline-separated `KEY=value` lines).
    pub fn send(&self, state: &str) {
        let Some(addr) = &self.addr else { return };
        let sent = UnixDatagram::unbound().and_then(|s| s.send_to_addr(state.as_bytes(), addr));
        if let Err(e) = sent {
            tracing::warn!("sd_notify {:?}: {e}", state.lines().next().unwrap_or(""));
        }
    }

    /// RELOADING=1 with the timestamp systemd asks for since v253.
    pub fn reloading(&self) {
        let usec = crate::sys::monotonic_usec();
        self.send(&format!("RELOADING=1\nMONOTONIC_USEC={usec}"));
    }
}
