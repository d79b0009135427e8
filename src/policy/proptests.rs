//! Property tests (proptest) of the policy: the parser on arbitrary text,
//! round trips of rendered policies, path classification against a model
//! built from globset alone, and symlink containment against a model of
//! every tree the link could be resolved in. `PROPTEST_CASES` sets the
//! number of cases; `scripts/fuzz` runs them long.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use proptest::prelude::*;

use super::rules::PathKind;
use super::{DeviceMode, Policy, SuidMode, SymlinkMode};

// ------------------------------------------------------------ the parser

/// Lines that look like policy lines: keywords, near-keywords, globs,
/// quota values and junk, with odd whitespace and comments.
fn policy_like_line() -> impl Strategy<Value = String> {
    let word = prop_oneof![
        Just("hide".to_string()),
        Just("readonly".to_string()),
        Just("protect".to_string()),
        Just("symlinks".to_string()),
        Just("allow-host".to_string()),
        Just("devices".to_string()),
        Just("suid".to_string()),
        Just("quota".to_string()),
        Just("contained".to_string()),
        Just("any".to_string()),
        Just("none".to_string()),
        Just("allow".to_string()),
        Just("deny".to_string()),
        Just("strip".to_string()),
        "(bytes|inodes|files)=[0-9]{0,22}[kKmMgGtTbB]?",
        "[a-z*?/.\\[\\]{}!\\\\#,-]{1,12}",
        "/[a-z./]{0,10}",
        any::<String>(),
    ];
    (
        prop::collection::vec(word, 0..5),
        prop::sample::select(vec![" ", "\t", "  ", " \u{a0} ", "\u{3000}"]),
        prop::option::of("#[^\n]{0,10}"),
    )
        .prop_map(|(words, sep, comment)| {
            let mut line = words.join(sep);
            if let Some(c) = comment {
                line.push(' ');
                line.push_str(&c);
            }
            line
        })
}

fn policy_like_text() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(policy_like_line(), 0..8),
        prop::sample::select(vec!["\n", "\r\n", "\n\n"]),
    )
        .prop_map(|(lines, eol)| lines.join(eol))
}

/// Everything a parsed policy offers must answer without panicking.
fn exercise(p: &Policy, paths: &[String]) {
    for rel in paths {
        let _ = p.classify(rel);
        let _ = p.subtree_rule(rel);
        let _ = p.explain(rel);
        let _ = p.check_symlink(rel, OsStr::new(rel));
    }
}

/// An error names an existing line of the text and says something.
fn check_error(text: &str, e: &super::PolicyError) -> Result<(), TestCaseError> {
    let lines = text.lines().count();
    prop_assert!(
        e.line >= 1 && e.line <= lines,
        "error names line {} of a {lines}-line text: {e}",
        e.line
    );
    prop_assert!(!e.kind.to_string().trim().is_empty(), "empty message");
    let prefix = format!("line {}: ", e.line);
    prop_assert!(e.to_string().starts_with(&prefix), "{}", e);
    Ok(())
}

proptest! {
    #[test]
    fn fuzz_policy_arbitrary_text_never_panics(text in any::<String>(), paths in prop::collection::vec("[a-z./*]{0,12}", 0..4)) {
        match Policy::parse(&text) {
            Ok(p) => exercise(&p, &paths),
            Err(e) => check_error(&text, &e)?,
        }
    }

    #[test]
    fn fuzz_policy_like_text_never_panics(text in policy_like_text(), paths in prop::collection::vec("[a-z./*]{0,12}", 0..4)) {
        match Policy::parse(&text) {
            Ok(p) => exercise(&p, &paths),
            Err(e) => check_error(&text, &e)?,
        }
    }
}

// ------------------------------------------------------------ round trip

/// A policy as data, rendered to text and parsed back.
#[derive(Debug, Clone)]
enum Line {
    Path(PathKind, String),
    Symlinks(bool),
    Devices(bool),
    Suid(bool),
    AllowHost(Option<Vec<String>>),
    Quota(Option<(u64, &'static str)>, Option<(u64, &'static str)>),
    Comment(String),
    Blank,
}

fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_.-]{1,6}".prop_filter("not . or ..", |c| c != "." && c != ".."),
        Just("*".to_string()),
        Just("**".to_string()),
        Just("*.md".to_string()),
        Just("?x".to_string()),
        Just("[ab]c".to_string()),
        Just("{x,y}".to_string()),
        Just("issue#12".to_string()),
    ]
}

fn pattern() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        prop::collection::vec(component(), 1..4),
        any::<bool>(),
    )
        .prop_map(|(lead, comps, trail)| {
            let mut p = comps.join("/");
            if lead {
                p.insert(0, '/');
            }
            if trail {
                p.push('/');
            }
            p
        })
}

fn quota_value() -> impl Strategy<Value = Option<(u64, &'static str)>> {
    prop::option::of((
        0u64..100_000,
        prop::sample::select(vec!["", "k", "K", "m", "G", "t"]),
    ))
}

fn line() -> impl Strategy<Value = Line> {
    let kind = prop::sample::select(vec![PathKind::Hide, PathKind::Readonly, PathKind::Protect]);
    prop_oneof![
        4 => (kind, pattern()).prop_map(|(k, p)| Line::Path(k, p)),
        1 => any::<bool>().prop_map(Line::Symlinks),
        1 => any::<bool>().prop_map(Line::Devices),
        1 => any::<bool>().prop_map(Line::Suid),
        1 => prop::option::of(prop::collection::vec("[a-z0-9]{1,5}", 0..3)).prop_map(Line::AllowHost),
        1 => (quota_value(), quota_value())
            .prop_filter("quota needs a key", |(b, i)| b.is_some() || i.is_some())
            .prop_map(|(b, i)| Line::Quota(b, i)),
        1 => "[^\n\r]{0,20}".prop_map(Line::Comment),
        1 => Just(Line::Blank),
    ]
}

fn render(lines: &[Line], sep: &str) -> String {
    let mut out = String::new();
    for l in lines {
        let text = match l {
            Line::Path(k, p) => {
                let kw = match k {
                    PathKind::Hide => "hide",
                    PathKind::Readonly => "readonly",
                    PathKind::Protect => "protect",
                };
                format!("{kw}{sep}{p}")
            }
            Line::Symlinks(c) => format!("symlinks{sep}{}", if *c { "contained" } else { "any" }),
            Line::Devices(a) => format!("devices{sep}{}", if *a { "allow" } else { "deny" }),
            Line::Suid(a) => format!("suid{sep}{}", if *a { "allow" } else { "strip" }),
            Line::AllowHost(None) => format!("allow-host{sep}none"),
            Line::AllowHost(Some(c)) => format!("allow-host{sep}/{}", c.join("/")),
            Line::Quota(b, i) => {
                let mut t = "quota".to_string();
                if let Some((n, s)) = b {
                    t.push_str(&format!("{sep}bytes={n}{s}"));
                }
                if let Some((n, s)) = i {
                    t.push_str(&format!("{sep}inodes={n}{s}"));
                }
                t
            }
            Line::Comment(c) => format!("#{c}"),
            Line::Blank => String::new(),
        };
        out.push_str(&text);
        out.push('\n');
    }
    out
}

fn scale(suffix: &str, base: u64) -> u64 {
    match suffix.to_ascii_uppercase().as_str() {
        "" => 1,
        "K" => base,
        "M" => base.pow(2),
        "G" => base.pow(3),
        _ => base.pow(4),
    }
}

proptest! {
    /// A rendered valid policy parses, and the parsed policy holds exactly
    /// what was rendered: every rule with its line and text, every
    /// setting from its last line, the allow-host list, the quota.
    #[test]
    fn fuzz_policy_rendered_round_trips(lines in prop::collection::vec(line(), 0..12), sep in prop::sample::select(vec![" ", "\t", "   "])) {
        let text = render(&lines, sep);
        let p = match Policy::parse(&text) {
            Ok(p) => p,
            Err(e) => return Err(TestCaseError::fail(format!("valid policy refused: {e}\n{text}"))),
        };
        let mut rules = Vec::new();
        let mut symlinks = (SymlinkMode::Contained, 0);
        let mut devices = (DeviceMode::Deny, 0);
        let mut suid = (SuidMode::Strip, 0);
        let mut hosts: Vec<Vec<String>> = super::DEFAULT_ALLOW_HOST
            .iter()
            .map(|h| h[1..].split('/').map(str::to_string).collect())
            .collect();
        let mut quota = super::Quota::default();
        for (i, l) in lines.iter().enumerate() {
            let line = i + 1;
            match l {
                Line::Path(k, _) => rules.push((*k, line)),
                Line::Symlinks(c) => symlinks = (if *c { SymlinkMode::Contained } else { SymlinkMode::Any }, line),
                Line::Devices(a) => devices = (if *a { DeviceMode::Allow } else { DeviceMode::Deny }, line),
                Line::Suid(a) => suid = (if *a { SuidMode::Allow } else { SuidMode::Strip }, line),
                Line::AllowHost(None) => hosts.clear(),
                Line::AllowHost(Some(c)) => hosts.push(c.clone()),
                Line::Quota(b, i) => {
                    // A quota line sets the keys it names (each line is
                    // independent; a later line overrides a key).
                    if let Some((n, s)) = b {
                        quota.bytes = Some(n * scale(s, 1024));
                    }
                    if let Some((n, s)) = i {
                        quota.inodes = Some(n * scale(s, 1000));
                    }
                }
                Line::Comment(_) | Line::Blank => {}
            }
        }
        let got: Vec<(PathKind, usize)> = (0..rules.len())
            .map(|i| (p.paths.kind(i), p.paths.rule(i).line))
            .collect();
        prop_assert_eq!(&got, &rules, "{}", text);
        for (i, (_, line)) in rules.iter().enumerate() {
            let want = text.lines().nth(line - 1).unwrap().split_whitespace().collect::<Vec<_>>().join(" ");
            prop_assert_eq!(&p.paths.rule(i).text, &want);
        }
        prop_assert_eq!((p.symlinks.value, p.symlinks.rule.line), symlinks);
        prop_assert_eq!((p.devices.value, p.devices.rule.line), devices);
        prop_assert_eq!((p.suid.value, p.suid.rule.line), suid);
        let got_hosts: Vec<Vec<String>> = p.allow_host.iter().map(|h| h.components.clone()).collect();
        prop_assert_eq!(got_hosts, hosts);
        prop_assert_eq!(p.quota(), quota);
    }
}

// ------------------------------------------------------------ classification

/// Small alphabets so that patterns and paths meet often.
fn path_component() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b", "c", "ab", "ba", ".x", "a.md", "[", "{a"])
        .prop_map(str::to_string)
}

fn rel_path() -> impl Strategy<Value = String> {
    prop::collection::vec(path_component(), 1..5).prop_map(|c| c.join("/"))
}

fn glob_component() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "a", "b", "c", "ab", ".x", "*", "**", "?", "a*", "*b", "[ab]", "{a,b}", "{a,c/b}", "*.md",
        "\\[", "\\{a",
    ])
    .prop_map(str::to_string)
}

fn glob_pattern() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        prop::collection::vec(glob_component(), 1..4),
        any::<bool>(),
    )
        .prop_map(|(lead, comps, trail)| {
            let mut p = comps.join("/");
            if lead {
                p.insert(0, '/');
            }
            if trail {
                p.push('/');
            }
            p
        })
}

fn kind() -> impl Strategy<Value = PathKind> {
    prop::sample::select(vec![PathKind::Hide, PathKind::Readonly, PathKind::Protect])
}

fn keyword(k: PathKind) -> &'static str {
    match k {
        PathKind::Hide => "hide",
        PathKind::Readonly => "readonly",
        PathKind::Protect => "protect",
    }
}

/// The model of classification (policy/mod.rs, rules.rs): a path is in a
/// class when it or an ancestor matches the rule's own glob, compiled
/// alone by globset; the latest such rule is reported.
fn model_class(rules: &[(PathKind, globset::GlobMatcher)], rel: &str) -> [Option<usize>; 3] {
    let mut best = [None, None, None];
    let comps: Vec<&str> = rel.split('/').collect();
    for (i, (k, m)) in rules.iter().enumerate() {
        if (1..=comps.len()).any(|n| m.is_match(comps[..n].join("/"))) {
            let slot = match k {
                PathKind::Hide => 0,
                PathKind::Readonly => 1,
                PathKind::Protect => 2,
            };
            best[slot] = Some(i + 1);
        }
    }
    best
}

/// A pattern's own glob, by the rules of rules.rs's header: anchored when
/// it has a `/` (a trailing one aside), else a name at any depth.
fn model_matcher(pattern: &str) -> globset::GlobMatcher {
    let trimmed = pattern.trim_end_matches('/');
    let body = trimmed.strip_prefix('/').unwrap_or(trimmed);
    let glob = if trimmed.contains('/') {
        body.to_string()
    } else {
        format!("**/{body}")
    };
    globset::GlobBuilder::new(&glob)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .unwrap()
        .compile_matcher()
}

fn classes(p: &Policy, rel: &str) -> [Option<usize>; 3] {
    let c = p.classify(rel);
    [
        c.hidden.map(|r| r.line),
        c.readonly.map(|r| r.line),
        c.protected.map(|r| r.line),
    ]
}

proptest! {
    /// classify (fast literal paths, the `P` + `P/**` glob set) agrees
    /// with the ancestor-by-ancestor model for every path.
    #[test]
    fn fuzz_classify_agrees_with_model(
        rules in prop::collection::vec((kind(), glob_pattern()), 1..6),
        paths in prop::collection::vec(rel_path(), 1..12),
    ) {
        let text: String = rules.iter().map(|(k, p)| format!("{} {p}\n", keyword(*k))).collect();
        let policy = match Policy::parse(&text) {
            Ok(p) => p,
            // Patterns globset refuses must be refused with their line.
            Err(e) => {
                check_error(&text, &e)?;
                prop_assert!(e.kind.to_string().contains("bad glob"), "{}", e);
                return Ok(());
            }
        };
        let model: Vec<(PathKind, globset::GlobMatcher)> =
            rules.iter().map(|(k, p)| (*k, model_matcher(p))).collect();
        for rel in &paths {
            prop_assert_eq!(classes(&policy, rel), model_class(&model, rel), "path {} under\n{}", rel, text);
        }
    }

    /// A readonly or protect rule anchored at the root (not `**/…`) that
    /// classes something strictly beneath directory D, where D itself is
    /// not classed by it, is reported by `subtree_rule(D)`: renaming or
    /// removing D is then checked against it.
    #[test]
    fn fuzz_subtree_rule_covers_anchored_rules(
        rules in prop::collection::vec((kind(), glob_pattern()), 1..5),
        dir in rel_path(),
        tail in rel_path(),
    ) {
        let text: String = rules.iter().map(|(k, p)| format!("{} {p}\n", keyword(*k))).collect();
        let Ok(policy) = Policy::parse(&text) else { return Ok(()) };
        let inner = format!("{dir}/{tail}");
        let c = policy.classify(&inner);
        for r in [c.readonly, c.protected].into_iter().flatten() {
            let index = r.line - 1;
            let pattern = rules[index].1.trim_end_matches('/');
            let anchored = pattern.contains('/') && !pattern.trim_start_matches('/').starts_with("**");
            if !anchored {
                continue;
            }
            let got = policy.subtree_rule(&dir);
            prop_assert!(
                got.as_ref().is_some_and(|g| g.line >= r.line),
                "{inner} is classed by line {} but subtree_rule({dir}) = {got:?}\n{text}", r.line
            );
        }
    }
}

// ------------------------------------------------------------ symlinks

/// The model of `symlinks contained` for relative targets: resolve the
/// target from the link's directory in every tree it could meet. The
/// link's directory and its ancestors are real directories; each name in
/// the target may be a real directory or a symlink to anywhere inside the
/// workspace, the worst case being the root (then a `..` leaves). The
/// target is contained when no tree lets the walk go above the root.
fn model_relative_safe(link_dir_depth: usize, target: &[u8]) -> bool {
    // The lowest depth any tree can have reached: after a name it is the
    // root's (that name may be a link to the root); `..` climbs one.
    let mut lowest = link_dir_depth as i64;
    for c in target.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                lowest -= 1;
                if lowest < 0 {
                    return false;
                }
            }
            _ => lowest = 0,
        }
    }
    true
}

/// The model for absolute targets: normalise the text as a path string
/// and test it against each prefix string; any `..` is refused because a
/// component before it may be a symlink on the host.
fn model_absolute_allowed(target: &[u8], prefixes: &[String]) -> bool {
    let mut norm = Vec::new();
    for c in target.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return false,
            name => {
                norm.push(b'/');
                norm.extend_from_slice(name);
            }
        }
    }
    prefixes.iter().any(|p| {
        let p = p.as_bytes();
        p == b"/" || norm == p || (norm.starts_with(p) && norm.get(p.len()) == Some(&b'/'))
    })
}

fn target_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"..".to_vec()),
        Just(b".".to_vec()),
        Just(b"".to_vec()),
        Just(b"usr".to_vec()),
        Just(b"usrx".to_vec()),
        Just(b"etc".to_vec()),
        Just(b"a".to_vec()),
        Just(b"...".to_vec()),
        Just(b"..a".to_vec()),
        Just(vec![0xff, b'.', b'.']),
        prop::collection::vec(
            any::<u8>().prop_filter("no slash, no NUL", |b| *b != b'/' && *b != 0),
            1..4
        ),
    ];
    (any::<bool>(), prop::collection::vec(piece, 0..7)).prop_map(|(abs, pieces)| {
        let mut t = if abs { b"/".to_vec() } else { Vec::new() };
        t.extend(pieces.join(&b'/'));
        t
    })
}

fn link_rel() -> impl Strategy<Value = String> {
    prop::collection::vec("[a-z]{1,3}", 1..5).prop_map(|c| c.join("/"))
}

proptest! {
    /// `check_symlink` accepts a target exactly when the models say no
    /// tree lets it resolve outside the workspace (or outside the
    /// allow-host prefixes).
    #[test]
    fn fuzz_symlink_containment_matches_model(link in link_rel(), target in target_bytes(), hosts in prop::collection::vec(prop::sample::select(vec!["/usr", "/usr/lib", "/opt/x", "/", "/a"]), 0..3)) {
        let mut text = "allow-host none\n".to_string();
        for h in &hosts {
            text.push_str(&format!("allow-host {h}\n"));
        }
        let policy = Policy::parse(&text).unwrap();
        let got = policy.check_symlink(&link, OsStr::from_bytes(&target)).is_ok();
        let want = if target.is_empty() {
            true
        } else if target[0] == b'/' {
            let prefixes: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
            model_absolute_allowed(&target, &prefixes)
        } else {
            model_relative_safe(link.split('/').count() - 1, &target)
        };
        prop_assert_eq!(got, want, "link {} -> {:?}, hosts {:?}", link, String::from_utf8_lossy(&target), hosts);
    }

    /// A contained relative target, resolved lexically from the link's
    /// directory with every name a real directory, stays inside the root.
    #[test]
    fn fuzz_contained_link_resolves_inside(link in link_rel(), target in target_bytes()) {
        let target: Vec<u8> = target.into_iter().skip_while(|&b| b == b'/').collect();
        let ok = Policy::default().check_symlink(&link, OsStr::from_bytes(&target)).is_ok();
        if ok {
            let mut stack: Vec<&[u8]> = link.split('/').map(str::as_bytes).collect();
            stack.pop();
            for c in target.split(|&b| b == b'/') {
                match c {
                    b"" | b"." => {}
                    b".." => { prop_assert!(stack.pop().is_some(), "{link} -> {:?} climbs out", String::from_utf8_lossy(&target)); }
                    name => stack.push(name),
                }
            }
        }
    }
}

// ------------------------------------------------------------ moves

/// What a move must keep: the kinds of class of a path (not the rules).
fn kinds(p: &Policy, rel: &str) -> [bool; 3] {
    let c = p.classify(rel);
    [
        c.hidden.is_some(),
        c.readonly.is_some(),
        c.protected.is_some(),
    ]
}

/// Moves between paths of the small alphabet, so that rules fire.
fn move_paths() -> impl Strategy<Value = (String, String, Vec<String>)> {
    (
        rel_path(),
        rel_path(),
        prop::collection::vec(rel_path(), 1..8),
    )
}

proptest! {
    /// When `unproven_move_rule(OLD, NEW)` proves a move harmless, every
    /// path beneath is classed alike at both places: `OLD/X` and `NEW/X`
    /// have the same kinds for every X (the static test is sound; a walk
    /// is skipped only on a proof).
    #[test]
    fn fuzz_unproven_move_rule_is_sound(
        rules in prop::collection::vec((kind(), glob_pattern()), 1..5),
        (old, new, tails) in move_paths(),
    ) {
        let text: String = rules.iter().map(|(k, p)| format!("{} {p}\n", keyword(*k))).collect();
        let Ok(policy) = Policy::parse(&text) else { return Ok(()) };
        if policy.unproven_move_rule(&old, &new).is_some() {
            return Ok(());
        }
        for x in &tails {
            let (a, b) = (format!("{old}/{x}"), format!("{new}/{x}"));
            prop_assert_eq!(kinds(&policy, &a), kinds(&policy, &b), "{} vs {} proven alike under\n{}", a, b, text);
        }
    }

    /// The static test proves the common moves: under rules that match a
    /// name at any depth, a move between two paths holding none of the
    /// names is proven (no walk for `mv build out` under `hide .env`).
    #[test]
    fn fuzz_unproven_move_rule_proves_name_rules(
        names in prop::collection::vec(prop::sample::select(vec![".env", "secrets", "*.key", "**/cfg/**", "**/node_modules"]), 1..4),
        // Components none of the names can match (two letters at most).
        old in prop::collection::vec("[a-z]{1,2}", 1..4),
        new in prop::collection::vec("[a-z]{1,2}", 1..4),
    ) {
        let text: String = names.iter().map(|n| format!("hide {n}\n")).collect();
        let policy = Policy::parse(&text).unwrap();
        prop_assert_eq!(policy.unproven_move_rule(&old.join("/"), &new.join("/")), None, "{}", text);
    }

    /// When `move_may_uncontain(OLD, NEW)` says no, every target contained
    /// at `OLD/X` is contained at `NEW/X` (a walk for symlinks is skipped
    /// only then).
    #[test]
    fn fuzz_move_may_uncontain_is_sound(
        old in link_rel(),
        new in link_rel(),
        tail in link_rel(),
        target in target_bytes(),
    ) {
        let policy = Policy::default();
        if policy.move_may_uncontain(&old, &new) {
            return Ok(());
        }
        let t = OsStr::from_bytes(&target);
        let (a, b) = (format!("{old}/{tail}"), format!("{new}/{tail}"));
        if policy.check_symlink(&a, t).is_ok() {
            prop_assert!(policy.check_symlink(&b, t).is_ok(), "{a} -> {:?} contained, {b} not", String::from_utf8_lossy(&target));
        }
        prop_assert!(policy.moved_symlink(&a, &b, t).is_ok());
    }
}
