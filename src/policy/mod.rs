//! The path policy (DESIGN.md §4): parsing a policy file and answering pure
//! questions about it — how a path is classed (hidden / readonly /
//! protected), whether a symlink target stays inside the workspace, whether
//! device nodes and setuid bits are allowed, and the upper's quota. No I/O
//! other than `Policy::load`.
//!
//! Layout: `parse` (the file format), `pattern` (the one glob language, also
//! for scratch paths), `rules` (glob matching of path rules),
//! `symlink` (target containment), `explain` (the human report).
//!
//! Choices where DESIGN.md is silent, written down here:
//! - The mount root itself is never hidden, readonly or protected; rules
//!   apply to entries beneath it.
//! - A trailing `/` on a pattern ("directories only" in gitignore) is
//!   accepted and ignored: the pattern matches files of that name too.
//! - Negation (`!pattern`) is not supported and is a parse error (write `\!`
//!   for a name that starts with `!`); "later rules win" decides which rule
//!   is reported when several match.
//! - `allow-host PREFIX` adds to the list (the defaults included);
//!   `allow-host none` clears it, later lines add again.
//! - Quota suffixes: bytes use powers of 1024 (`10G` = 10 GiB), inodes use
//!   powers of 1000 (`1M` = 1,000,000); suffixes are case-insensitive.

mod error;
mod explain;
pub(crate) mod parse;
pub mod pattern;
#[cfg(test)]
mod proptests;
mod rules;
mod symlink;

use std::ffi::OsStr;
use std::fmt;
use std::path::Path;

pub use error::{AmountError, LineError, LoadError, PatternError, PolicyError};
use rules::PathRules;

/// One rule of a policy file, kept for messages ("line 3: readonly skills/**").
/// Line 0 is a built-in default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRef {
    pub line: usize,
    pub text: String,
}

impl RuleRef {
    fn default_rule(text: &str) -> RuleRef {
        RuleRef {
            line: 0,
            text: text.to_string(),
        }
    }
}

impl fmt::Display for RuleRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "default `{}`", self.text)
        } else {
            write!(f, "line {}: `{}`", self.line, self.text)
        }
    }
}

/// What the path rules say about one path (relative to the mount root).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathClass {
    pub hidden: Option<RuleRef>,
    pub readonly: Option<RuleRef>,
    pub protected: Option<RuleRef>,
}

/// A refusal: the errno to answer and the rule that decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub errno: i32,
    pub rule: RuleRef,
}

/// Upper usage limits; `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    pub bytes: Option<u64>,
    pub inodes: Option<u64>,
}

/// `symlinks contained|any`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SymlinkMode {
    Contained,
    Any,
}

/// `devices deny|allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeviceMode {
    Deny,
    Allow,
}

/// `suid strip|allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SuidMode {
    Strip,
    Allow,
}

/// A setting and the rule (or default) it comes from.
#[derive(Debug, Clone)]
struct Setting<T> {
    value: T,
    rule: RuleRef,
}

impl<T> Setting<T> {
    fn default_to(value: T, text: &str) -> Setting<T> {
        Setting {
            value,
            rule: RuleRef::default_rule(text),
        }
    }
}

/// One `allow-host` prefix, as path components (`/` alone = no components).
#[derive(Debug, Clone)]
struct HostPrefix {
    components: Vec<String>,
}

impl HostPrefix {
    fn display(&self) -> String {
        format!("/{}", self.components.join("/"))
    }
}

const DEFAULT_ALLOW_HOST: [&str; 5] = ["/usr", "/bin", "/lib", "/lib64", "/opt"];

/// A parsed policy. `Default` is the safe default policy of DESIGN.md §4.
#[derive(Debug, Clone)]
pub struct Policy {
    paths: PathRules,
    symlinks: Setting<SymlinkMode>,
    allow_host: Vec<HostPrefix>,
    devices: Setting<DeviceMode>,
    suid: Setting<SuidMode>,
    quota: Quota,
    quota_rule: Option<RuleRef>,
    /// `scratch GLOB` lines: paths diff and snapshots leave out, gc empties.
    scratch: Vec<String>,
    /// The line of each `scratch` pattern, in the same order.
    scratch_rules: Vec<RuleRef>,
}

impl Default for Policy {
    fn default() -> Policy {
        let allow_host = DEFAULT_ALLOW_HOST
            .iter()
            .map(|prefix| HostPrefix {
                components: prefix[1..].split('/').map(str::to_string).collect(),
            })
            .collect();
        Policy {
            paths: PathRules::default(),
            symlinks: Setting::default_to(SymlinkMode::Contained, "symlinks contained"),
            allow_host,
            devices: Setting::default_to(DeviceMode::Deny, "devices deny"),
            suid: Setting::default_to(SuidMode::Strip, "suid strip"),
            quota: Quota::default(),
            quota_rule: None,
            scratch: Vec::new(),
            scratch_rules: Vec::new(),
        }
    }
}

impl Policy {
    /// Parses the text of a policy file; errors name the line.
    pub fn parse(text: &str) -> Result<Policy, PolicyError> {
        parse::parse(text)
    }

    /// Reads and parses a policy file; errors name the file and the line.
    pub fn load(path: &Path) -> Result<Policy, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Policy::parse(&text).map_err(|source| LoadError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The `scratch` patterns, in file order.
    pub fn scratch(&self) -> &[String] {
        &self.scratch
    }

    /// Whether any hide / readonly / protect rule exists; when false,
    /// `classify` always answers the empty class and callers may skip it.
    pub fn has_path_rules(&self) -> bool {
        !self.paths.is_empty()
    }

    /// Classes `rel` (relative to the mount root, no leading `/`, "" = root).
    /// A path is in a class when it or one of its ancestors matches a rule
    /// of that class; the latest such rule in the file is reported.
    pub fn classify(&self, rel: &str) -> PathClass {
        let best = self.paths.best_matches(rel);
        PathClass {
            hidden: best.hide.map(|index| self.paths.rule(index).clone()),
            readonly: best.readonly.map(|index| self.paths.rule(index).clone()),
            protected: best.protect.map(|index| self.paths.rule(index).clone()),
        }
    }

    /// A readonly or protect rule anchored at the root that could match
    /// something strictly beneath the directory `dir_rel`, so that removing
    /// or renaming the directory as a whole is refused outright.
    /// Conservative for anchored rules; rules that match at any depth
    /// (`readonly *.lock`, `protect **/keep/**`) are not reported: a move
    /// is checked against every rule by `unproven_move_rule` and
    /// `class_change`, and removals entry by entry.
    pub fn subtree_rule(&self, dir_rel: &str) -> Option<RuleRef> {
        self.paths
            .subtree_rule(dir_rel)
            .map(|index| self.paths.rule(index).clone())
    }

    /// The rule that keeps this module from proving that moving the object
    /// at `old` to `new` leaves the class of everything beneath it as it
    /// was (`old/X` and `new/X` alike for every X): then the mover compares
    /// the two entry by entry (`class_change`). `None` is a proof. The
    /// object itself is not covered: compare `old` and `new` directly.
    /// See `PathRules::unproven_for_move` for what is proven and how.
    pub fn unproven_move_rule(&self, old: &str, new: &str) -> Option<RuleRef> {
        self.paths
            .unproven_for_move(old, new)
            .map(|index| self.paths.rule(index).clone())
    }

    /// The refusal a move (rename, exchange, link) earns by giving an
    /// existing object at `old` the path `new` when the two are classed
    /// differently: the class of a path never changes by moving it or an
    /// ancestor. Kinds are compared, not rules (`readonly a/**` and
    /// `readonly *.md` class alike). Protection is compared only for an
    /// object that comes from a lower (`shared`, asked only then: a lower
    /// entry, or an upper copy of one): it is about shared entries, and
    /// the user's own are not protected anywhere. A readonly difference is EROFS, as every readonly refusal;
    /// a hidden or protected one is EPERM. The rule named is the one that
    /// classes one of the two paths.
    pub fn class_change(
        &self,
        old: &str,
        new: &str,
        shared: impl FnOnce() -> bool,
    ) -> Option<Denial> {
        if !self.has_path_rules() {
            return None;
        }
        let (a, b) = (self.classify(old), self.classify(new));
        let differs = |x: &Option<RuleRef>, y: &Option<RuleRef>| match (x, y) {
            (Some(r), None) | (None, Some(r)) => Some(r.clone()),
            _ => None,
        };
        if let Some(rule) = differs(&a.readonly, &b.readonly) {
            return Some(Denial {
                errno: libc::EROFS,
                rule,
            });
        }
        if let Some(rule) = differs(&a.hidden, &b.hidden) {
            return Some(Denial {
                errno: libc::EPERM,
                rule,
            });
        }
        match differs(&a.protected, &b.protected) {
            Some(rule) if shared() => Some(Denial {
                errno: libc::EPERM,
                rule,
            }),
            _ => None,
        }
    }

    /// Whether moving a directory from `old` to `new` could make a symlink
    /// beneath it escape: only under `symlinks contained`, and only when
    /// the directory becomes shallower (a relative target's leading `..`
    /// climb from the link's directory; absolute targets do not depend on
    /// where the link stands). Otherwise every link beneath stays exactly
    /// as contained as it was.
    pub fn move_may_uncontain(&self, old: &str, new: &str) -> bool {
        self.symlinks.value == SymlinkMode::Contained && symlink::depth(new) < symlink::depth(old)
    }

    /// The refusal a directory move earns for a symlink beneath it, with
    /// `target`, going from `old` to `new`: it was contained at `old` and
    /// is not at `new`. A link that was not contained where it stood
    /// (lower content, or one made under `symlinks any`) is not the move's
    /// doing.
    pub fn moved_symlink(&self, old: &str, new: &str, target: &OsStr) -> Result<(), Denial> {
        match self.check_symlink(new, target) {
            Err(d) if self.check_symlink(old, target).is_ok() => Err(d),
            _ => Ok(()),
        }
    }

    /// Whether a new symlink at `link_rel` may point at `target`.
    ///
    /// Under `symlinks contained` (the default):
    /// - a relative target may start with `..` components, which climb from
    ///   the link's directory and must not climb above the mount root; a
    ///   `..` after a name is refused, because that name may itself be a
    ///   symlink (to the root, say) and then the `..` would lead out of the
    ///   workspace whatever the lexical path says;
    /// - an absolute target must equal or lie beneath an `allow-host`
    ///   prefix (component-wise: `/usr` allows `/usr/bin` but not `/usrx`)
    ///   and must not contain `..` at all;
    /// - an empty target is left to the filesystem (the kernel refuses it).
    pub fn check_symlink(&self, link_rel: &str, target: &OsStr) -> Result<(), Denial> {
        if self.symlinks.value == SymlinkMode::Any {
            return Ok(());
        }
        if symlink::is_contained(link_rel, target, &self.allow_host) {
            Ok(())
        } else {
            Err(Denial {
                errno: libc::EPERM,
                rule: self.symlinks.rule.clone(),
            })
        }
    }

    /// Whether block and character devices may be created (`devices`).
    pub fn check_device(&self) -> Result<(), Denial> {
        match self.devices.value {
            DeviceMode::Allow => Ok(()),
            DeviceMode::Deny => Err(Denial {
                errno: libc::EPERM,
                rule: self.devices.rule.clone(),
            }),
        }
    }

    /// Whether setuid/setgid bits must be dropped (`suid strip`).
    pub fn strip_suid(&self) -> bool {
        self.suid.value == SuidMode::Strip
    }

    /// The mode bits that may stick on an object under `suid`: with
    /// `strip`, setuid and setgid go from everything but directories (a
    /// directory's setgid bit only makes new entries inherit its group).
    /// The mount and a snapshot restore both apply this.
    pub fn allowed_mode(&self, mode: u32, is_dir: bool) -> u32 {
        if !is_dir && self.strip_suid() {
            mode & !(libc::S_ISUID | libc::S_ISGID)
        } else {
            mode
        }
    }

    /// The rule behind the `suid` setting, for messages.
    pub fn suid_rule(&self) -> &RuleRef {
        &self.suid.rule
    }

    /// The upper's usage limits (`quota`).
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// A human report of which rules decide `rel` and the global settings;
    /// used by `layerfs policy explain FILE PATH`.
    pub fn explain(&self, rel: &str) -> String {
        explain::explain(self, rel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_safe() {
        let p = Policy::default();
        assert!(!p.has_path_rules());
        assert_eq!(p.classify("a/b"), PathClass::default());
        assert_eq!(p.check_device().unwrap_err().errno, libc::EPERM);
        assert_eq!(p.check_device().unwrap_err().rule.line, 0);
        assert!(p.strip_suid());
        assert_eq!(p.quota(), Quota::default());
        assert!(p.check_symlink("l", OsStr::new("/usr/bin/python3")).is_ok());
        assert!(p.check_symlink("l", OsStr::new("/etc/passwd")).is_err());
        assert_eq!(p.subtree_rule("a"), None);
    }

    #[test]
    fn empty_file_is_the_default() {
        let p = Policy::parse("# nothing\n\n   \n").unwrap();
        assert!(!p.has_path_rules());
        assert!(p.strip_suid());
        assert!(p.check_device().is_err());
        assert_eq!(p.allow_host.len(), DEFAULT_ALLOW_HOST.len());
    }

    #[test]
    fn rule_ref_display() {
        assert_eq!(
            RuleRef::default_rule("devices deny").to_string(),
            "default `devices deny`"
        );
        let r = RuleRef {
            line: 3,
            text: "readonly skills/**".into(),
        };
        assert_eq!(r.to_string(), "line 3: `readonly skills/**`");
    }

    #[test]
    fn load_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.policy");
        std::fs::write(&file, "hide .env\nhidden x\n").unwrap();
        let err = Policy::load(&file).unwrap_err().to_string();
        assert!(err.contains("p.policy"), "{err}");
        assert!(err.contains("line 2:"), "{err}");
        let err = Policy::load(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing"), "{err}");
        std::fs::write(&file, "readonly skills/**\n").unwrap();
        let p = Policy::load(&file).unwrap();
        assert!(p.classify("skills/a").readonly.is_some());
    }
}
