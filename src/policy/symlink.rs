//! Symlink containment (`symlinks contained`): whether a new link's target
//! stays inside the workspace, decided from the text of the target alone.
//!
//! Lexical resolution is only sound while every component walked is a real
//! directory. The link's own directory and its ancestors are (the link is
//! being created there), so leading `..` components are resolved; after a
//! name, a `..` is refused, because the name may be a symlink (to the root,
//! say) whose `..` leaves the workspace. Absolute targets must lie beneath
//! an `allow-host` prefix and contain no `..`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::HostPrefix;

/// Whether `target`, stored in a link at `link_rel`, stays contained.
pub(super) fn is_contained(link_rel: &str, target: &OsStr, allow_host: &[HostPrefix]) -> bool {
    let target = target.as_bytes();
    if target.is_empty() {
        // The kernel refuses empty targets itself (ENOENT).
        return true;
    }
    if target[0] == b'/' {
        absolute_allowed(target, allow_host)
    } else {
        relative_contained(link_rel, target)
    }
}

/// The significant components of a target: no empty or `.` components.
fn components(target: &[u8]) -> impl Iterator<Item = &[u8]> {
    target
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
}

/// How many components `rel` has (its depth beneath the root).
pub(super) fn depth(rel: &str) -> usize {
    rel.split('/').filter(|c| !c.is_empty()).count()
}

fn relative_contained(link_rel: &str, target: &[u8]) -> bool {
    // Depth of the link's directory beneath the root.
    let mut depth = depth(link_rel).saturating_sub(1);
    let mut past_leading_dotdots = false;
    for component in components(target) {
        if component == b".." {
            if past_leading_dotdots || depth == 0 {
                return false;
            }
            depth -= 1;
        } else {
            past_leading_dotdots = true;
        }
    }
    true
}

fn absolute_allowed(target: &[u8], allow_host: &[HostPrefix]) -> bool {
    let parts: Vec<&[u8]> = components(target).collect();
    if parts.contains(&&b".."[..]) {
        return false;
    }
    allow_host.iter().any(|prefix| {
        prefix.components.len() <= parts.len()
            && prefix
                .components
                .iter()
                .zip(&parts)
                .all(|(p, t)| p.as_bytes() == *t)
    })
}

#[cfg(test)]
mod tests {
    use crate::policy::{Policy, RuleRef};
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    fn ok(link: &str, target: &str) -> bool {
        Policy::default()
            .check_symlink(link, OsStr::new(target))
            .is_ok()
    }

    #[test]
    fn relative_targets() {
        assert!(!ok("a/b/link", "../../../etc/passwd"));
        assert!(ok("a/b/link", "../../etc/passwd"));
        assert!(!ok("link", "../x"));
        assert!(!ok("link", "a/../../x"));
        assert!(ok("node_modules/.bin/tool", "../pkg/bin/tool"));
        assert!(ok("a/link", "./../b/./c"));
        assert!(ok("link", "sub/dir/file"));
        assert!(ok("link", "."));
        assert!(ok("a/b/link", "../.."));
        assert!(!ok("a/b/link", "../../.."));
    }

    #[test]
    fn dotdot_after_a_name_is_refused() {
        // `d` could be a link to the root; then `d/..` would leave the mount.
        assert!(!ok("link", "d/.."));
        assert!(!ok("a/b/link", "../x/../y"));
    }

    #[test]
    fn absolute_targets() {
        assert!(!ok("l", "/etc/shadow"));
        assert!(!ok("l", "/"));
        assert!(ok("l", "/usr/bin/python3"));
        assert!(ok("venv/bin/python", "/usr/bin/python3"));
        assert!(ok("l", "/usr"));
        assert!(ok("l", "//usr//lib/./x"));
        assert!(!ok("l", "/usrx/bin"));
        assert!(!ok("l", "/usr/../etc"));
        assert!(!ok("l", "/usr/../etc/passwd"));
        assert!(!ok("l", "/usr/lib/../bin/x"));
        assert!(ok("l", "/lib64/ld-linux-x86-64.so.2"));
        assert!(ok("l", "/opt/tool"));
    }

    #[test]
    fn empty_and_non_utf8_targets() {
        assert!(ok("l", ""));
        assert!(Policy::default()
            .check_symlink("l", OsStr::from_bytes(b"caf\xe9"))
            .is_ok());
        assert!(Policy::default()
            .check_symlink("l", OsStr::from_bytes(b"/etc/\xff"))
            .is_err());
    }

    #[test]
    fn denial_names_the_rule() {
        let denial = Policy::default()
            .check_symlink("l", OsStr::new("/etc/passwd"))
            .unwrap_err();
        assert_eq!(denial.errno, libc::EPERM);
        assert_eq!(
            denial.rule,
            RuleRef {
                line: 0,
                text: "symlinks contained".into()
            }
        );
        let p = Policy::parse("hide x\nsymlinks contained\n").unwrap();
        let denial = p.check_symlink("l", OsStr::new("../x")).unwrap_err();
        assert_eq!(denial.rule.line, 2);
    }

    #[test]
    fn symlinks_any_allows_everything() {
        let p = Policy::parse("symlinks any\n").unwrap();
        assert!(p.check_symlink("l", OsStr::new("/etc/shadow")).is_ok());
        assert!(p.check_symlink("l", OsStr::new("../../x")).is_ok());
    }
}
