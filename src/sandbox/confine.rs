//! What the command's process gives up just before it execs, beyond the
//! namespaces and the tree:
//!
//! - the caller's session keyring (it joins a new, empty one), which it
//!   could otherwise read and change;
//! - with Landlock ABI 6 or later, connecting to abstract Unix sockets
//!   bound outside the sandbox (`LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`): with
//!   the host's network namespace shared, those are the host's services
//!   (D-Bus, X11, container runtimes) that no mount can hide. On an older
//!   kernel, or with Landlock disabled, this step is skipped;
//! - as root, every capability outside Docker's default set (moby,
//!   daemon/pkg/oci/caps/defaults.go), `CAP_SYS_ADMIN` first: the command
//!   can make no mount and no namespace other than a user namespace, in
//!   which every mount it inherits is locked.

use super::sys;

/// A step of confining the command that failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("leaving the caller's session keyring: {0}")]
    Keyring(#[source] std::io::Error),
    #[error("restricting abstract Unix sockets with Landlock: {0}")]
    Landlock(#[source] std::io::Error),
    #[error("dropping root's capabilities for the command: {0}")]
    Capabilities(#[source] std::io::Error),
}

/// `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET` (Landlock ABI 6).
const LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1;
/// The first Landlock ABI with scopes.
const LANDLOCK_SCOPES_ABI: i64 = 6;

/// Docker's default capabilities, by number: what root keeps in the
/// sandbox.
const ROOT_CAPABILITIES: [(u32, &str); 14] = [
    (0, "CAP_CHOWN"),
    (1, "CAP_DAC_OVERRIDE"),
    (3, "CAP_FOWNER"),
    (4, "CAP_FSETID"),
    (5, "CAP_KILL"),
    (6, "CAP_SETGID"),
    (7, "CAP_SETUID"),
    (8, "CAP_SETPCAP"),
    (10, "CAP_NET_BIND_SERVICE"),
    (13, "CAP_NET_RAW"),
    (18, "CAP_SYS_CHROOT"),
    (27, "CAP_MKNOD"),
    (29, "CAP_AUDIT_WRITE"),
    (31, "CAP_SETFCAP"),
];

/// Whether this kernel lets the sandbox refuse abstract Unix sockets of the
/// host.
pub fn scopes_abstract_sockets() -> bool {
    sys::landlock_abi().is_some_and(|v| v >= LANDLOCK_SCOPES_ABI)
}

/// Applies the above to the calling process (the command's, before exec),
/// which still holds every capability in the sandbox's user namespace;
/// `root`: the command runs as uid 0.
pub fn command(root: bool) -> Result<(), ConfineError> {
    // A kernel without keyrings (ENOSYS) has nothing to leave.
    if let Err(e) = sys::join_new_session_keyring() {
        if e.raw_os_error() != Some(libc::ENOSYS) {
            return Err(ConfineError::Keyring(e));
        }
    }
    if scopes_abstract_sockets() {
        sys::landlock_restrict_scopes(LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET)
            .map_err(ConfineError::Landlock)?;
    }
    if root {
        let keep = ROOT_CAPABILITIES
            .iter()
            .fold(0u64, |m, (cap, _)| m | (1u64 << cap));
        sys::limit_capabilities(keep).map_err(ConfineError::Capabilities)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_keeps_no_capability_that_administers_mounts_or_the_kernel() {
        let kept: Vec<u32> = ROOT_CAPABILITIES.iter().map(|(c, _)| *c).collect();
        // CAP_SYS_ADMIN, CAP_SYS_MODULE, CAP_SYS_RAWIO, CAP_SYS_PTRACE,
        // CAP_NET_ADMIN, CAP_DAC_READ_SEARCH.
        for cap in [21, 16, 17, 19, 12, 2] {
            assert!(!kept.contains(&cap), "{cap}");
        }
    }
}
