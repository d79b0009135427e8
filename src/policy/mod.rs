//! The path policy: a pure function of (operation, path, layer facts) →
//! allow / deny with the rule that fired. STUB: the policy helper replaces
//! this file's bodies; the public signatures are the contract.

use std::ffi::OsStr;
use std::fmt;
use std::path::Path;

/// One rule of a policy file, kept for messages ("line 3: readonly skills/**").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRef {
    pub line: usize,
    pub text: String,
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

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    pub bytes: Option<u64>,
    pub inodes: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct PolicyError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for PolicyError {}

#[derive(Debug, Clone, Default)]
pub struct Policy {}

impl Policy {
    pub fn parse(_text: &str) -> Result<Policy, PolicyError> {
        Ok(Policy::default())
    }
    pub fn load(path: &Path) -> Result<Policy, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Policy::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
    pub fn has_path_rules(&self) -> bool {
        false
    }
    pub fn classify(&self, _rel: &str) -> PathClass {
        PathClass::default()
    }
    pub fn subtree_rule(&self, _dir_rel: &str) -> Option<RuleRef> {
        None
    }
    pub fn check_symlink(&self, _link_rel: &str, _target: &OsStr) -> Result<(), Denial> {
        Ok(())
    }
    pub fn devices_allowed(&self) -> Option<RuleRef> {
        None
    }
    pub fn suid_allowed(&self) -> bool {
        true
    }
    pub fn quota(&self) -> Quota {
        Quota::default()
    }
    pub fn explain(&self, rel: &str) -> String {
        format!("{rel}: allowed")
    }
}
