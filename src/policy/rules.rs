//! Path rules (`hide`, `readonly`, `protect`): gitignore-style patterns
//! compiled into one GlobSet, matched against a path and each ancestor.
//!
//! Pattern semantics are `pattern`'s (the one pattern language); this
//! module adds the fast literal shapes and the move analysis.
//!
//! Moves (`PathRules::unproven_for_move`): whether a rule could class
//! `OLD/X` and `NEW/X` differently for some X is decided from the rule's
//! shape alone where that is cheap to prove, so most directory renames need
//! no look at what the directory holds.

use std::collections::HashMap;

use globset::{Candidate, GlobMatcher, GlobSet, GlobSetBuilder};

use super::error::{LineError, PatternError, PolicyError};
use super::pattern::{build_glob, Pattern};

use super::RuleRef;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PathKind {
    Hide,
    Readonly,
    Protect,
}

/// One parsed path rule, before compilation into the set.
#[derive(Debug, Clone)]
pub(super) struct PathRule {
    pub kind: PathKind,
    pub rule: RuleRef,
    /// The glob as handed to globset (`**/NAME` for basename patterns).
    glob: String,
    /// How the hot path matches it.
    shape: Shape,
    /// Globs matching directories beneath which this rule could match
    /// something (empty for rules that match at any depth).
    containers: Vec<String>,
    /// How the rule behaves when a directory moves.
    moves: MoveShape,
}

/// What is known about a rule for `PathRules::unproven_for_move`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MoveShape {
    /// The rule matches a run of `len` consecutive components at any depth
    /// (`NAME`, `*.key`, `**/a/b`); with `trailing` (`**/a/b/**`) the run
    /// must not end at the path's last component. Each component glob
    /// matches exactly one path component.
    Floating { len: usize, trailing: bool },
    /// Anchored at the root (`skills/**`, `a/*/c`): its `containers` say
    /// under which directories it can match anything.
    Anchored,
    /// Anything else (`**/a/**/b`, a `**/…` pattern with `{`/`[`): a move
    /// is checked entry by entry.
    Unknown,
}

fn move_shape(components: &[&str], anchored: bool) -> MoveShape {
    if !anchored {
        // One component (no `/` at all): a class or alternation cannot
        // hold a `/` either.
        return MoveShape::Floating {
            len: 1,
            trailing: false,
        };
    }
    if components[0] != "**" {
        return MoveShape::Anchored;
    }
    let rest = &components[1..];
    let trailing = rest.last() == Some(&"**");
    let run = if trailing {
        &rest[..rest.len() - 1]
    } else {
        rest
    };
    let plain = |c: &&str| !c.contains("**") && !c.contains(['{', '}', '[', ']']);
    if run.is_empty() || !run.iter().all(plain) {
        return MoveShape::Unknown;
    }
    MoveShape::Floating {
        len: run.len(),
        trailing,
    }
}

/// Literal patterns (the common case) skip globset on the hot path; their
/// meaning is the same as the glob's (a unit test checks the two agree).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Shape {
    /// `NAME` with no glob syntax: some component of the path equals it.
    Name(String),
    /// Anchored `A/B` with no glob syntax: the path is it or lies beneath.
    Path(String),
    /// Anchored `A/B/**` with a literal `A/B`: the path lies beneath `A/B`.
    Beneath(String),
    /// Anything else: matched by globset.
    Glob,
}

fn shape(body: &str, anchored: bool) -> Shape {
    if !anchored {
        return if has_glob_meta(body) {
            Shape::Glob
        } else {
            Shape::Name(body.to_string())
        };
    }
    if !has_glob_meta(body) {
        return Shape::Path(body.to_string());
    }
    if let Some(name) = body.strip_prefix("**/") {
        if !name.contains('/') && !has_glob_meta(name) {
            return Shape::Name(name.to_string());
        }
    }
    match body.strip_suffix("/**") {
        Some(base) if !has_glob_meta(base) => Shape::Beneath(base.to_string()),
        _ => Shape::Glob,
    }
}

/// The latest matching rule (its index) of each class.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct BestMatches {
    pub hide: Option<usize>,
    pub readonly: Option<usize>,
    pub protect: Option<usize>,
}

/// All path rules of a policy, compiled. Rule index = order in the file.
///
/// Literal rules are looked up directly (`names`, `literals`); `set` holds
/// two globs per other rule, `P` and `P/**`, so one match of the full path
/// answers for the path and all its ancestors at once. `matchers` holds
/// `P` alone for every rule, to tell (for `explain`) which ancestor matched.
#[derive(Debug, Clone, Default)]
pub(super) struct PathRules {
    rules: Vec<PathRule>,
    names: HashMap<String, Vec<usize>>,
    literals: Vec<usize>,
    set: GlobSet,
    set_owner: Vec<usize>,
    matchers: Vec<GlobMatcher>,
    containers: GlobSet,
    container_owner: Vec<usize>,
}

/// Parses one pattern of a path rule; the error says what is wrong.
pub(super) fn compile_rule(
    kind: PathKind,
    pattern: &str,
    rule: RuleRef,
) -> Result<PathRule, PatternError> {
    let parsed = Pattern::parse(pattern)?;
    let (body, anchored, glob) = (parsed.body.as_str(), parsed.anchored, parsed.glob.clone());
    let components = parsed.components();
    let shape = shape(body, anchored);
    // Hide rules have containers too: a directory move must not carry
    // hidden entries out of (or visible ones into) what a rule hides.
    let containers = if components[0] == "**" || !anchored {
        Vec::new()
    } else {
        container_globs(&components)
    };
    Ok(PathRule {
        kind,
        rule,
        glob,
        shape,
        containers,
        moves: move_shape(&components, anchored),
    })
}

fn has_glob_meta(component: &str) -> bool {
    component.contains(['*', '?', '[', ']', '{', '}', '\\'])
}

/// Globs matching every directory D such that the anchored pattern could
/// match something strictly beneath D (D itself matching the pattern is
/// left to `best_matches`): D matches a proper prefix of the pattern's
/// components, or lies beneath the components before a `**`.
fn container_globs(components: &[&str]) -> Vec<String> {
    let split_is_safe = components
        .iter()
        .all(|c| !c.contains(['{', '}', '[', ']']) && build_glob(c).is_ok());
    let mut globs = Vec::new();
    if split_is_safe {
        let double_star = components.iter().position(|c| *c == "**");
        let last = double_star.unwrap_or(components.len() - 1);
        for k in 1..=last {
            globs.push(components[..k].join("/"));
        }
        if let Some(j) = double_star {
            globs.push(format!("{}/**", components[..j].join("/")));
        }
    } else {
        // Classes or alternations could hide a `/`: fall back to the literal
        // components before the first one with glob syntax, and treat
        // anything at or beneath that literal prefix as a container.
        let literal = components.iter().take_while(|c| !has_glob_meta(c)).count();
        if literal == 0 {
            globs.push("**".to_string());
        } else {
            for k in 1..=literal {
                globs.push(components[..k].join("/"));
            }
            globs.push(format!("{}/**", components[..literal].join("/")));
        }
    }
    globs
}

impl PathRules {
    /// Compiles the rules (in file order) into one set.
    pub(super) fn build(rules: Vec<PathRule>) -> Result<PathRules, PolicyError> {
        let mut set = GlobSetBuilder::new();
        let mut containers = GlobSetBuilder::new();
        let mut container_owner = Vec::new();
        let mut matchers = Vec::new();
        let mut names: HashMap<String, Vec<usize>> = HashMap::new();
        let mut literals = Vec::new();
        let mut set_owner = Vec::new();
        for (index, rule) in rules.iter().enumerate() {
            let bad = |source: globset::Error| PolicyError {
                line: rule.rule.line,
                kind: LineError::Pattern(PatternError::Glob {
                    pattern: rule.glob.clone(),
                    source,
                }),
            };
            let glob = build_glob(&rule.glob).map_err(bad)?;
            matchers.push(glob.compile_matcher());
            match &rule.shape {
                Shape::Name(name) => names.entry(name.clone()).or_default().push(index),
                Shape::Path(_) | Shape::Beneath(_) => literals.push(index),
                Shape::Glob => {
                    set.add(glob);
                    set.add(build_glob(&format!("{}/**", rule.glob)).map_err(bad)?);
                    set_owner.extend([index, index]);
                }
            }
            for container in &rule.containers {
                // A container glob that does not compile only loses a
                // conservative answer; fall back to "any directory".
                let glob = build_glob(container)
                    .or_else(|_| build_glob("**"))
                    .map_err(|e| PolicyError {
                        line: rule.rule.line,
                        kind: LineError::InternalGlob(e),
                    })?;
                containers.add(glob);
                container_owner.push(index);
            }
        }
        let line = rules.last().map_or(0, |r| r.rule.line);
        let too_big = |e: globset::Error| PolicyError {
            line,
            kind: LineError::TooLarge(e),
        };
        Ok(PathRules {
            set: set.build().map_err(too_big)?,
            containers: containers.build().map_err(too_big)?,
            rules,
            names,
            literals,
            set_owner,
            matchers,
            container_owner,
        })
    }

    pub(super) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub(super) fn rule(&self, index: usize) -> &RuleRef {
        &self.rules[index].rule
    }

    #[cfg(test)]
    pub(super) fn kind(&self, index: usize) -> PathKind {
        self.rules[index].kind
    }

    /// The latest rule of each class matching `rel` or one of its ancestors.
    pub(super) fn best_matches(&self, rel: &str) -> BestMatches {
        let mut best = BestMatches::default();
        if self.rules.is_empty() || rel.is_empty() {
            return best;
        }
        let mut note = |rule: usize| {
            let slot = match self.rules[rule].kind {
                PathKind::Hide => &mut best.hide,
                PathKind::Readonly => &mut best.readonly,
                PathKind::Protect => &mut best.protect,
            };
            if slot.is_none_or(|seen| seen < rule) {
                *slot = Some(rule);
            }
        };
        if !self.names.is_empty() {
            for component in rel.split('/') {
                if let Some(rules) = self.names.get(component) {
                    rules.iter().copied().for_each(&mut note);
                }
            }
        }
        for &rule in &self.literals {
            let (base, itself) = match &self.rules[rule].shape {
                Shape::Path(base) => (base, true),
                Shape::Beneath(base) => (base, false),
                _ => continue,
            };
            if let Some(rest) = rel.strip_prefix(base.as_str()) {
                if (itself && rest.is_empty()) || (rest.len() > 1 && rest.starts_with('/')) {
                    note(rule);
                }
            }
        }
        if !self.set.is_empty() {
            let candidate = Candidate::from_bytes(rel.as_bytes());
            for index in self.set.matches_candidate(&candidate) {
                note(self.set_owner[index]);
            }
        }
        best
    }

    /// The shortest prefix of `rel` (the path or an ancestor) that rule
    /// `index` matches, if any.
    pub(super) fn matched_prefix<'a>(&self, index: usize, rel: &'a str) -> Option<&'a str> {
        let matcher = &self.matchers[index];
        rel.match_indices('/')
            .map(|(i, _)| &rel[..i])
            .chain(std::iter::once(rel))
            .find(|prefix| {
                !prefix.is_empty()
                    && matcher.is_match_candidate(&Candidate::from_bytes(prefix.as_bytes()))
            })
    }

    /// The latest readonly/protect rule that could match something strictly
    /// beneath `dir_rel` (see `Policy::subtree_rule`).
    pub(super) fn subtree_rule(&self, dir_rel: &str) -> Option<usize> {
        let guards = |r: &PathRule| r.kind != PathKind::Hide;
        if dir_rel.is_empty() {
            return self.rules.iter().rposition(guards);
        }
        let best = self.best_matches(dir_rel);
        let mut latest = [best.readonly, best.protect].into_iter().flatten().max();
        let candidate = Candidate::from_bytes(dir_rel.as_bytes());
        for index in self.containers.matches_candidate(&candidate) {
            let owner = self.container_owner[index];
            if guards(&self.rules[owner]) && latest.is_none_or(|l| l < owner) {
                latest = Some(owner);
            }
        }
        latest
    }

    /// Which rules have a container glob matching `dir_rel` (indexed by
    /// rule): those that could match something strictly beneath it.
    fn container_rules(&self, dir_rel: &str) -> Vec<bool> {
        let mut hit = vec![false; self.rules.len()];
        let candidate = Candidate::from_bytes(dir_rel.as_bytes());
        for index in self.containers.matches_candidate(&candidate) {
            hit[self.container_owner[index]] = true;
        }
        hit
    }

    /// The latest rule that cannot be shown, from its shape alone, to class
    /// `old/X` and `new/X` alike for every non-empty relative path X (the
    /// object at `old` moving to `new`, with everything beneath it). `None`
    /// proves the move keeps the class of every path beneath the object;
    /// otherwise the caller compares entry by entry. The object itself
    /// (X empty) is not covered: callers compare `old` and `new` directly.
    ///
    /// Per rule, "alike" is proven when:
    /// - floating (a run of L components at any depth): a run lies within
    ///   `old` exactly when one lies within `new`, and either one does (then
    ///   every path beneath either is classed) or the last L-1 components
    ///   of `old` and `new` are the same (then runs that straddle the end
    ///   of `old`/`new` and the start of X are the same);
    /// - anchored: the rule classes both `old` and `new` (everything
    ///   beneath both is classed), or neither and it can match nothing
    ///   beneath either (no container glob matches them).
    pub(super) fn unproven_for_move(&self, old: &str, new: &str) -> Option<usize> {
        if self.rules.is_empty() {
            return None;
        }
        let containers = std::cell::OnceCell::new();
        let containers =
            || containers.get_or_init(|| (self.container_rules(old), self.container_rules(new)));
        let old_parts: Vec<&str> = old.split('/').collect();
        let new_parts: Vec<&str> = new.split('/').collect();
        let suffix = |parts: &[&str], n: usize| -> Vec<String> {
            parts[parts.len().saturating_sub(n)..]
                .iter()
                .map(|c| c.to_string())
                .collect()
        };
        for (index, rule) in self.rules.iter().enumerate().rev() {
            let alike = match rule.moves {
                MoveShape::Floating { len, trailing } => {
                    // A run within P (for `trailing`: one not ending at the
                    // last component of P/X, X non-empty: P/probe matches).
                    let within = |p: &str| {
                        if trailing {
                            self.matched_prefix(index, &format!("{p}/x")).is_some()
                        } else {
                            self.matched_prefix(index, p).is_some()
                        }
                    };
                    let (a, b) = (within(old), within(new));
                    a == b && (a || suffix(&old_parts, len - 1) == suffix(&new_parts, len - 1))
                }
                MoveShape::Anchored => {
                    let a = self.matched_prefix(index, old).is_some();
                    let b = self.matched_prefix(index, new).is_some();
                    let (c_old, c_new) = containers();
                    (a && b) || (!a && !b && !c_old[index] && !c_new[index])
                }
                MoveShape::Unknown => false,
            };
            if !alike {
                return Some(index);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(spec: &[(PathKind, &str)]) -> PathRules {
        let compiled = spec
            .iter()
            .enumerate()
            .map(|(i, (kind, pattern))| {
                let rule = RuleRef {
                    line: i + 1,
                    text: format!("{kind:?} {pattern}"),
                };
                compile_rule(*kind, pattern, rule).unwrap()
            })
            .collect();
        PathRules::build(compiled).unwrap()
    }

    fn hidden(r: &PathRules, rel: &str) -> Option<usize> {
        r.best_matches(rel).hide
    }

    #[test]
    fn basename_pattern_matches_at_any_depth() {
        let r = rules(&[(PathKind::Hide, ".env")]);
        assert_eq!(hidden(&r, ".env"), Some(0));
        assert_eq!(hidden(&r, "a/b/.env"), Some(0));
        assert_eq!(hidden(&r, "a/.envx"), None);
        assert_eq!(hidden(&r, "x.env"), None);
        // An ancestor named `.env` hides everything beneath it.
        assert_eq!(hidden(&r, "a/.env/key"), Some(0));
    }

    #[test]
    fn star_does_not_cross_slash() {
        let r = rules(&[(PathKind::Hide, "*.key"), (PathKind::Readonly, "src/*.rs")]);
        assert_eq!(hidden(&r, "a/b/x.key"), Some(0));
        let ro = |p: &str| r.best_matches(p).readonly;
        assert_eq!(ro("src/main.rs"), Some(1));
        assert_eq!(ro("src/sub/main.rs"), None);
        assert_eq!(ro("other/src/main.rs"), None);
    }

    #[test]
    fn anchored_pattern_and_leading_slash() {
        let r = rules(&[(PathKind::Hide, "/secrets"), (PathKind::Hide, "a/b")]);
        assert_eq!(hidden(&r, "secrets"), Some(0));
        assert_eq!(hidden(&r, "secrets/a/b"), Some(0));
        assert_eq!(hidden(&r, "x/secrets"), None);
        assert_eq!(hidden(&r, "a/b"), Some(1));
        assert_eq!(hidden(&r, "a/b/c"), Some(1));
        assert_eq!(hidden(&r, "x/a/b"), None);
        assert_eq!(hidden(&r, "a"), None);
        assert_eq!(hidden(&r, ""), None);
    }

    #[test]
    fn double_star() {
        let r = rules(&[
            (PathKind::Hide, "**/.env"),
            (PathKind::Readonly, "skills/**"),
            (PathKind::Protect, "a/**/z"),
        ]);
        assert_eq!(hidden(&r, ".env"), Some(0));
        assert_eq!(hidden(&r, "x/y/.env"), Some(0));
        let b = |p: &str| r.best_matches(p);
        assert!(b("skills").readonly.is_none());
        assert!(b("skills/a").readonly.is_some());
        assert!(b("skills/a/b/c").readonly.is_some());
        assert!(b("skillsx/a").readonly.is_none());
        assert!(b("a/z").protect.is_some());
        assert!(b("a/b/c/z").protect.is_some());
        assert!(b("a/b/c/z/inner").protect.is_some());
        assert!(b("a/b/c").protect.is_none());
    }

    #[test]
    fn classes_and_alternates() {
        let r = rules(&[
            (PathKind::Hide, "id_[rd]sa*"),
            (PathKind::Hide, "*.{pem,key}"),
        ]);
        assert_eq!(hidden(&r, "home/.ssh/id_rsa"), Some(0));
        assert_eq!(hidden(&r, "id_dsa.pub"), Some(0));
        assert_eq!(hidden(&r, "id_ecdsa"), None);
        assert_eq!(hidden(&r, "tls/server.pem"), Some(1));
        assert_eq!(hidden(&r, "tls/server.crt"), None);
    }

    #[test]
    fn trailing_slash_is_ignored() {
        let r = rules(&[(PathKind::Hide, "build/")]);
        assert_eq!(hidden(&r, "x/build"), Some(0));
        assert_eq!(hidden(&r, "x/build/out.o"), Some(0));
    }

    #[test]
    fn later_rule_wins_and_ancestor_reported() {
        let r = rules(&[
            (PathKind::Readonly, "docs/**"),
            (PathKind::Hide, "x"),
            (PathKind::Readonly, "*.md"),
        ]);
        assert_eq!(r.best_matches("docs/a.md").readonly, Some(2));
        assert_eq!(r.matched_prefix(2, "docs/a.md"), Some("docs/a.md"));
        assert_eq!(r.best_matches("docs/sub/file").readonly, Some(0));
        assert_eq!(r.matched_prefix(0, "docs/sub/file"), Some("docs/sub"));
        assert_eq!(r.matched_prefix(2, "docs/sub/file"), None);
    }

    /// The literal fast path means exactly what the glob means.
    #[test]
    fn fast_path_agrees_with_globset() {
        let patterns = [
            ".env",
            "secrets",
            "a/b",
            "/a",
            "a/b/**",
            "skills/**",
            "a/",
            "x.y",
            "**/.env",
            "*.md",
            "a/*/c",
            "a/**/c",
            "a",
            "b",
            "c",
        ];
        let paths = [
            "a",
            "b",
            "c",
            "a/b",
            "a/b/c",
            "a/bc",
            "ab/c",
            "x/a",
            "x/a/b",
            "a/b/c/d",
            ".env",
            "x/.env",
            "x/.env/y",
            ".envx",
            "secrets",
            "secrets/k",
            "x/secrets/k",
            "skills",
            "skills/a",
            "skillsx/a",
            "x.y",
            "x/x.y/z",
            "xx.y",
            "r.md",
            "a/q/c",
            "a/q/c/d",
        ];
        for pattern in patterns {
            let rule = RuleRef {
                line: 1,
                text: pattern.into(),
            };
            let compiled = compile_rule(PathKind::Hide, pattern, rule).unwrap();
            let r = PathRules::build(vec![compiled]).unwrap();
            for path in paths {
                assert_eq!(
                    r.best_matches(path).hide.is_some(),
                    r.matched_prefix(0, path).is_some(),
                    "pattern `{pattern}` on `{path}`"
                );
            }
        }
        let shapes = |p: &str| {
            let rule = RuleRef {
                line: 1,
                text: String::new(),
            };
            compile_rule(PathKind::Hide, p, rule).unwrap().shape
        };
        assert_eq!(shapes(".env"), Shape::Name(".env".into()));
        assert_eq!(shapes("/a/b/"), Shape::Path("a/b".into()));
        assert_eq!(shapes("a/b/**"), Shape::Beneath("a/b".into()));
        assert_eq!(shapes("a/*/**"), Shape::Glob);
        assert_eq!(shapes("**/.env"), Shape::Name(".env".into()));
        assert_eq!(shapes("**/a/b"), Shape::Glob);
        assert_eq!(shapes("\\!x"), Shape::Glob);
    }

    #[test]
    fn bad_patterns() {
        let rule = RuleRef {
            line: 1,
            text: String::new(),
        };
        let err = |p: &str| {
            compile_rule(PathKind::Hide, p, rule.clone())
                .unwrap_err()
                .to_string()
        };
        assert!(err("a/../b").contains("`..`"));
        assert!(err("..").contains("`..`"));
        assert!(err("a/./b").contains("`.`"));
        assert!(err("a//b").contains("empty path segment"));
        assert!(err("/").contains("empty"));
        assert!(err("!x").contains("negation"));
        assert!(err("a[b").contains("bad glob"));
        assert!(err("[abc").contains("bad glob"));
        assert!(err("{a,b").contains("bad glob"));
        assert!(compile_rule(PathKind::Hide, "\\!x", rule).is_ok());
    }

    #[test]
    fn subtree_rules() {
        let r = rules(&[
            (PathKind::Readonly, "skills/**"),
            (PathKind::Protect, "notes/*/keep"),
            (PathKind::Readonly, "*.lock"),
            (PathKind::Hide, "secret/**"),
            (PathKind::Protect, "deep/a/**/b"),
            (PathKind::Readonly, "exact/file"),
        ]);
        assert_eq!(r.subtree_rule("skills"), Some(0));
        assert_eq!(r.subtree_rule("skills/sub"), Some(0));
        assert_eq!(r.subtree_rule("skillsx"), None);
        assert_eq!(r.subtree_rule("notes"), Some(1));
        assert_eq!(r.subtree_rule("notes/x"), Some(1));
        assert_eq!(r.subtree_rule("notes/x/y"), None);
        // Basename-only rules follow the entries wherever they move.
        assert_eq!(r.subtree_rule("vendor"), None);
        // Hide rules never guard renames.
        assert_eq!(r.subtree_rule("secret"), None);
        assert_eq!(r.subtree_rule("deep"), Some(4));
        assert_eq!(r.subtree_rule("deep/a"), Some(4));
        assert_eq!(r.subtree_rule("deep/a/x/y"), Some(4));
        assert_eq!(r.subtree_rule("deep/b"), None);
        assert_eq!(r.subtree_rule("exact"), Some(5));
        // `exact/file` itself is classed (and guarded per entry).
        assert_eq!(r.subtree_rule("exact/file"), Some(5));
        assert_eq!(r.subtree_rule("exact/other"), None);
        assert_eq!(r.subtree_rule(""), Some(5));
    }

    #[test]
    fn subtree_with_class_falls_back_to_literal_prefix() {
        let r = rules(&[
            (PathKind::Readonly, "a/{b,c/d}/e"),
            (PathKind::Readonly, "{x,y}/z"),
        ]);
        assert_eq!(r.subtree_rule("a"), Some(1));
        assert_eq!(r.subtree_rule("a/c"), Some(1));
        // `{x,y}/z` has no literal prefix: every directory is a container.
        assert_eq!(r.subtree_rule("q"), Some(1));
        let r = rules(&[(PathKind::Readonly, "a/{b,c/d}/e")]);
        assert_eq!(r.subtree_rule("a/c"), Some(0));
        assert_eq!(r.subtree_rule("b"), None);
    }
}
