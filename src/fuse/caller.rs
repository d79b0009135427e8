//! What the daemon reads of a request's caller itself, where the kernel's
//! own checks do not reach: its effective capabilities and its groups, from
//! `/proc/PID/status`.
//!
//! The caller is blocked in its system call while the daemon answers, so
//! the pid is its own. A caller the daemon cannot vouch for (pid 0: outside
//! the daemon's pid namespace; another user namespace, whose capabilities
//! do not count here; a process gone; an unreadable status) has no
//! credentials (`None`), and each user of this module errs on the side of
//! a caller without privileges.

use std::os::unix::fs::MetadataExt;

/// `CAP_DAC_OVERRIDE`'s bit in a `CapEff` mask (linux/capability.h).
pub const CAP_DAC_OVERRIDE: u32 = 1;
/// `CAP_DAC_READ_SEARCH`'s bit.
pub const CAP_DAC_READ_SEARCH: u32 = 2;
/// `CAP_FSETID`'s bit.
pub const CAP_FSETID: u32 = 4;

/// A caller's credentials as the kernel counts them in the daemon's user
/// namespace.
pub struct Creds {
    caps: u64,
    groups: Vec<u32>,
}

impl Creds {
    /// Those of process `pid`, if it can be vouched for (see the module).
    pub fn of(pid: u32) -> Option<Creds> {
        if pid == 0 {
            return None;
        }
        let theirs = std::fs::metadata(format!("/proc/{pid}/ns/user")).ok()?;
        let ours = std::fs::metadata("/proc/self/ns/user").ok()?;
        if (theirs.dev(), theirs.ino()) != (ours.dev(), ours.ino()) {
            return None;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name));
        let caps = u64::from_str_radix(field("CapEff:")?.trim(), 16).ok()?;
        let groups = field("Groups:")?
            .split_whitespace()
            .map(|g| g.parse().ok())
            .collect::<Option<Vec<u32>>>()?;
        Some(Creds { caps, groups })
    }

    pub fn has_cap(&self, bit: u32) -> bool {
        self.caps & (1 << bit) != 0
    }

    /// Whether `gid` is among its supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.groups.contains(&gid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_read_and_unknown_callers_are_not() {
        let me = Creds::of(std::process::id()).expect("this process");
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
            .unwrap();
        assert_eq!(me.has_cap(CAP_FSETID), eff & (1 << CAP_FSETID) != 0);
        assert_eq!(
            me.has_cap(CAP_DAC_OVERRIDE),
            eff & (1 << CAP_DAC_OVERRIDE) != 0
        );
        for g in nix::unistd::getgroups().unwrap() {
            assert!(me.in_group(g.as_raw()));
        }
        assert!(Creds::of(0).is_none());
        assert!(Creds::of(u32::MAX).is_none());
    }
}
