//! `--no-network`: the sandbox's own network namespace holds only the
//! loopback interface, which starts down; bring it up so programs that
//! talk to themselves over 127.0.0.1 (test servers, language servers)
//! still work.

use super::error::SandboxError;
use super::sys;

pub fn loopback_up() -> Result<(), SandboxError> {
    sys::interface_up("lo").map_err(SandboxError::Loopback)
}
