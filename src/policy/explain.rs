//! The human report behind `layerfs policy explain FILE PATH`: which rule
//! decides hide / readonly / protect for a path, which `scratch` lines
//! match it, and the global settings.
//! The text has no trailing newline (the caller prints it with `println!`).

use std::fmt::Write;

use super::{DeviceMode, Policy, SuidMode, SymlinkMode};

/// A path to explain that climbs out of the mount root.
#[derive(Debug, thiserror::Error)]
#[error("path `{0}` has a `..` segment; give the path relative to the mount root")]
struct ClimbingPath(String);

/// Accepts the forms a person types (`/a/b`, `./a/b/`, `a//b`) and returns
/// the mount-relative form, or an error for a `..` segment.
fn normalize(path: &str) -> Result<String, ClimbingPath> {
    let mut parts = Vec::new();
    for component in path.split('/') {
        match component {
            "" | "." => {}
            ".." => return Err(ClimbingPath(path.to_string())),
            name => parts.push(name),
        }
    }
    Ok(parts.join("/"))
}

pub(super) fn explain(policy: &Policy, path: &str) -> String {
    let rel = match normalize(path) {
        Ok(rel) => rel,
        Err(e) => return e.to_string(),
    };
    let shown = if rel.is_empty() {
        "/ (the mount root)"
    } else {
        &rel
    };
    let mut out = String::new();
    let best = policy.paths.best_matches(&rel);
    if best.hide.is_none() && best.readonly.is_none() && best.protect.is_none() {
        let _ = writeln!(out, "path `{shown}`: no rule: visible and writable");
    } else {
        let _ = writeln!(out, "path `{shown}`:");
        let line = |hit: Option<usize>, effect: &str| match hit {
            None => "no".to_string(),
            Some(rule) => {
                let matched = policy.paths.matched_prefix(rule, &rel).unwrap_or(&rel);
                let via = if matched == rel {
                    "matches the path".to_string()
                } else {
                    format!("matches the ancestor `{matched}`")
                };
                format!("yes, by {} ({via}): {effect}", policy.paths.rule(rule))
            }
        };
        let _ = writeln!(
            out,
            "  hidden:    {}",
            line(
                best.hide,
                "lookup answers ENOENT, never listed, creation EACCES"
            )
        );
        let _ = writeln!(
            out,
            "  readonly:  {}",
            line(best.readonly, "every change is EROFS")
        );
        let _ = writeln!(
            out,
            "  protected: {}",
            line(
                best.protect,
                "entries from a lower cannot be deleted or renamed away (EPERM)"
            )
        );
    }
    if let Some(rule) = policy.subtree_rule(&rel).filter(|_| !rel.is_empty()) {
        let _ = writeln!(
            out,
            "  as a directory: renaming or removing it is refused ({rule} guards content beneath it)"
        );
    }
    out.push_str(&scratch(policy, &rel));
    out.push_str(&settings(policy));
    out.truncate(out.trim_end().len());
    out
}

/// The `scratch` lines that match `rel` or one of its ancestors, and what
/// that means for the path; nothing when the policy has no scratch line.
fn scratch(policy: &Policy, rel: &str) -> String {
    if policy.scratch.is_empty() {
        return String::new();
    }
    let hits: Vec<String> = policy
        .scratch
        .iter()
        .zip(&policy.scratch_rules)
        .filter_map(|(pattern, rule)| {
            let matched = scratch_match(pattern, rel)?;
            let via = if matched == rel {
                "matches the path".to_string()
            } else {
                format!("matches the ancestor `{matched}`")
            };
            Some(format!("{rule} ({via})"))
        })
        .collect();
    if hits.is_empty() {
        return "  scratch:   no\n".to_string();
    }
    format!(
        "  scratch:   yes, by {}: disposable; left out of diff and snapshots, \
         emptied by `layerfs gc`\n",
        hits.join(", and ")
    )
}

/// The outermost of `rel` and its ancestors that `pattern` matches (the
/// scratch rule of `super::pattern::PathSet`), if any.
fn scratch_match<'a>(pattern: &str, rel: &'a str) -> Option<&'a str> {
    let set = super::pattern::PathSet::new(&[pattern.to_string()]).ok()?;
    if !set.matches(rel) {
        return None;
    }
    let ends = rel
        .match_indices('/')
        .map(|(i, _)| i)
        .chain(std::iter::once(rel.len()));
    ends.map(|i| &rel[..i]).find(|prefix| set.matches(prefix))
}

fn settings(policy: &Policy) -> String {
    let mut out = String::from("settings:\n");
    let symlinks = match policy.symlinks.value {
        SymlinkMode::Any => "any: every symlink target is allowed".to_string(),
        SymlinkMode::Contained => {
            let hosts = if policy.allow_host.is_empty() {
                "none".to_string()
            } else {
                policy
                    .allow_host
                    .iter()
                    .map(|h| h.display())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            format!(
                "contained: targets climbing above the mount root are EPERM; \
                 absolute targets allowed under: {hosts}"
            )
        }
    };
    let _ = writeln!(out, "  symlinks: {symlinks} [{}]", policy.symlinks.rule);
    let devices = match policy.devices.value {
        DeviceMode::Deny => "deny: block and character devices are EPERM",
        DeviceMode::Allow => "allow: device nodes may be created",
    };
    let _ = writeln!(out, "  devices:  {devices} [{}]", policy.devices.rule);
    let suid = match policy.suid.value {
        SuidMode::Strip => "strip: setuid/setgid bits are dropped",
        SuidMode::Allow => "allow: setuid/setgid bits are kept",
    };
    let _ = writeln!(out, "  suid:     {suid} [{}]", policy.suid.rule);
    let quota = policy.quota;
    let limit =
        |v: Option<u64>, base: u64| v.map_or("unlimited".to_string(), |n| with_suffix(n, base));
    match &policy.quota_rule {
        None => {
            let _ = writeln!(out, "  quota:    none");
        }
        Some(rule) => {
            let _ = writeln!(
                out,
                "  quota:    bytes {}, inodes {}; beyond them EDQUOT [{rule}]",
                limit(quota.bytes, 1024),
                limit(quota.inodes, 1000)
            );
        }
    }
    out
}

/// `n` with its largest exact suffix in powers of `base`: `10737418240 (10G)`.
fn with_suffix(n: u64, base: u64) -> String {
    let mut scaled = n;
    let mut suffix = None;
    for s in ["K", "M", "G", "T"] {
        if scaled == 0 || !scaled.is_multiple_of(base) {
            break;
        }
        scaled /= base;
        suffix = Some(s);
    }
    match suffix {
        Some(s) => format!("{n} ({scaled}{s})"),
        None => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = "hide secrets\nreadonly skills/**\nprotect notes/**\nreadonly *.md\n\
                          devices allow\nquota bytes=1K\n";

    #[test]
    fn no_rule() {
        let p = Policy::parse(POLICY).unwrap();
        let text = p.explain("src/main.rs");
        assert!(
            text.starts_with("path `src/main.rs`: no rule: visible and writable\n"),
            "{text}"
        );
        assert!(text.contains("symlinks: contained"), "{text}");
        assert!(text.contains("/usr, /bin, /lib, /lib64, /opt"), "{text}");
        assert!(text.contains("[default `symlinks contained`]"), "{text}");
        assert!(text.contains("devices:  allow"), "{text}");
        assert!(text.contains("[line 5: `devices allow`]"), "{text}");
        assert!(text.contains("suid:     strip"), "{text}");
        assert!(text.contains("bytes 1024 (1K), inodes unlimited"), "{text}");
        assert_eq!(with_suffix(10 << 30, 1024), "10737418240 (10G)");
        assert_eq!(with_suffix(1_000_000, 1000), "1000000 (1M)");
        assert_eq!(with_suffix(1500, 1000), "1500");
        assert_eq!(with_suffix(0, 1000), "0");
    }

    #[test]
    fn names_rule_and_ancestor() {
        let p = Policy::parse(POLICY).unwrap();
        let text = p.explain("/secrets/a/b");
        assert!(
            text.contains(
                "hidden:    yes, by line 1: `hide secrets` (matches the ancestor `secrets`)"
            ),
            "{text}"
        );
        assert!(text.contains("readonly:  no"), "{text}");
        let text = p.explain("skills/README.md");
        assert!(
            text.contains("readonly:  yes, by line 4: `readonly *.md` (matches the path)"),
            "{text}"
        );
        let text = p.explain("notes/");
        assert!(text.contains("path `notes`: no rule"), "{text}");
        assert!(
            text.contains("as a directory: renaming or removing it is refused (line 3"),
            "{text}"
        );
        let text = p.explain("notes/a");
        assert!(text.contains("protected: yes, by line 3"), "{text}");
    }

    #[test]
    fn names_matching_scratch_lines() {
        let p = Policy::parse("hide secrets\nscratch build/**\nscratch *.o\n").unwrap();
        let text = p.explain("build/out/x.o");
        assert!(
            text.contains(
                "scratch:   yes, by line 2: `scratch build/**` (matches the ancestor `build/out`), \
                 and line 3: `scratch *.o` (matches the path): disposable; left out of diff and \
                 snapshots, emptied by `layerfs gc`"
            ),
            "{text}"
        );
        assert!(p.explain("src/main.rs").contains("scratch:   no"));
        assert!(!Policy::default().explain("build/x").contains("scratch"));
    }

    #[test]
    fn root_and_bad_paths() {
        let p = Policy::default();
        let text = p.explain("/");
        assert!(
            text.starts_with("path `/ (the mount root)`: no rule"),
            "{text}"
        );
        assert!(text.contains("quota:    none"), "{text}");
        assert!(p.explain("a/../b").contains("`..` segment"));
        let p = Policy::parse("symlinks any\nsuid allow\nallow-host none\n").unwrap();
        let text = p.explain("x");
        assert!(text.contains("symlinks: any"), "{text}");
        assert!(text.contains("suid:     allow"), "{text}");
    }
}
