//! Clearing setuid and setgid bits: the daemon's part under
//! `FUSE_HANDLE_KILLPRIV_V2` (taken in `init`).
//!
//! A local filesystem clears `S_ISUID`, and `S_ISGID` on a
//! group-executable file, when a caller without `CAP_FSETID` writes to
//! the file or truncates it (also by `open(O_TRUNC)`), and on any chown.
//! Without the flag the kernel does it itself, and to know whether there
//! is anything to clear it asks the daemon for `security.capability`
//! before every write syscall: one round trip per write (DESIGN.md §6).
//! With the flag it marks an inode found clean `S_NOSEC` until its next
//! attribute refresh, asks nothing, and hands the clearing to the daemon.
//! How each case reaches the daemon:
//! - a write through the daemon carries `FUSE_WRITE_KILL_SUIDGID` when
//!   its caller lacks `CAP_FSETID`;
//! - a truncate (SETATTR with a size) and an `open(O_TRUNC)` carry
//!   `FATTR_KILL_SUIDGID` / `FUSE_OPEN_KILL_SUIDGID`, which the FUSE
//!   library (fuser 0.18) does not pass on: the daemon asks the caller's
//!   credentials itself (`caller_lacks_fsetid`), and only for a file that
//!   has bits to clear, so the common case reads nothing;
//! - a write, fallocate or copy through passthrough never reaches the
//!   daemon (and the backing write runs with the daemon's credentials):
//!   the kernel, finding bits to clear, sends a SETATTR that sets
//!   nothing (its own clearing, handed over), which the daemon takes as
//!   the request to clear when the caller lacks `CAP_FSETID`;
//! - a chown is the daemon's fchown of the upper copy, on which the
//!   upper's filesystem clears the bits itself.
//!
//! Removing `security.capability` on a write needs nothing: the upper's
//! filesystem removes it on any write, whoever writes.

use super::caller::{Creds, CAP_FSETID};

/// Whether the process `pid` (a request's caller) lacks `CAP_FSETID` as
/// the kernel counts it: held in the daemon's user namespace. A caller the
/// daemon cannot vouch for (`caller::Creds`) counts as lacking it: the
/// bits are cleared, the side a local filesystem errs on for any caller it
/// cannot vouch for.
pub fn caller_lacks_fsetid(pid: u32) -> bool {
    Creds::of(pid).is_none_or(|c| !c.has_cap(CAP_FSETID))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_and_unknown_callers_are_judged() {
        // The test runs as root in the initial namespace: it holds the
        // capability; pid 0 and a pid that cannot exist do not.
        let me = std::process::id();
        assert_eq!(
            caller_lacks_fsetid(me),
            !std::fs::read_to_string("/proc/self/status")
                .unwrap()
                .lines()
                .any(|l| l.starts_with("CapEff:")
                    && u64::from_str_radix(l[7..].trim(), 16).unwrap() & 0x10 != 0)
        );
        assert!(caller_lacks_fsetid(0));
        assert!(caller_lacks_fsetid(u32::MAX));
    }
}
