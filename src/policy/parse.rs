//! The policy file format: one rule a line, `#` comments, blank lines.
//!
//! A `#` at the start of a line or after whitespace starts a comment, so a
//! pattern may contain `#` (`issue#12`). Keywords are lower case. Settings
//! (`symlinks`, `devices`, `suid`, `quota`) may repeat; the later line wins.

use super::error::{AmountError, LineError};
use super::rules::{compile_rule, PathKind, PathRules};
use super::{DeviceMode, HostPrefix, Policy, PolicyError, RuleRef, Setting, SuidMode, SymlinkMode};

pub(super) fn parse(text: &str) -> Result<Policy, PolicyError> {
    let mut policy = Policy::default();
    let mut path_rules = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let words: Vec<&str> = strip_comment(raw).split_whitespace().collect();
        let Some((&keyword, args)) = words.split_first() else {
            continue;
        };
        let rule = RuleRef {
            line,
            text: words.join(" "),
        };
        let error = |kind: LineError| PolicyError { line, kind };
        match keyword {
            "hide" | "readonly" | "protect" => {
                let kind = match keyword {
                    "hide" => PathKind::Hide,
                    "readonly" => PathKind::Readonly,
                    _ => PathKind::Protect,
                };
                let pattern =
                    one_arg(keyword, args, "a glob such as `secrets/**`").map_err(error)?;
                path_rules.push(compile_rule(kind, pattern, rule).map_err(|e| error(e.into()))?);
            }
            "symlinks" => {
                let value = one_arg(keyword, args, "`contained` or `any`").map_err(error)?;
                let mode = match value {
                    "contained" => SymlinkMode::Contained,
                    "any" => SymlinkMode::Any,
                    other => return Err(error(bad_value(keyword, other, "`contained` or `any`"))),
                };
                policy.symlinks = Setting { value: mode, rule };
            }
            "devices" => {
                let value = one_arg(keyword, args, "`deny` or `allow`").map_err(error)?;
                let mode = match value {
                    "deny" => DeviceMode::Deny,
                    "allow" => DeviceMode::Allow,
                    other => return Err(error(bad_value(keyword, other, "`deny` or `allow`"))),
                };
                policy.devices = Setting { value: mode, rule };
            }
            "suid" => {
                let value = one_arg(keyword, args, "`strip` or `allow`").map_err(error)?;
                let mode = match value {
                    "strip" => SuidMode::Strip,
                    "allow" => SuidMode::Allow,
                    other => return Err(error(bad_value(keyword, other, "`strip` or `allow`"))),
                };
                policy.suid = Setting { value: mode, rule };
            }
            "allow-host" => {
                let value = one_arg(keyword, args, "an absolute path such as `/usr`, or `none`")
                    .map_err(error)?;
                if value == "none" {
                    policy.allow_host.clear();
                } else {
                    let components = host_prefix(value).map_err(error)?;
                    policy.allow_host.push(HostPrefix { components });
                }
            }
            "scratch" => {
                let pattern = one_arg(keyword, args, "a glob such as `build/**`").map_err(error)?;
                super::pattern::Pattern::parse(pattern).map_err(|e| error(e.into()))?;
                policy.scratch.push(pattern.to_string());
                policy.scratch_rules.push(rule);
            }
            "quota" => {
                parse_quota(args, &mut policy).map_err(error)?;
                policy.quota_rule = Some(rule);
            }
            other => return Err(error(LineError::UnknownRule(other.to_string()))),
        }
    }
    policy.paths = PathRules::build(path_rules)?;
    Ok(policy)
}

/// The line without its comment: `#` at the start or after whitespace.
fn strip_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'#' && (i == 0 || bytes[i - 1].is_ascii_whitespace()) {
            return &line[..i];
        }
    }
    line
}

fn one_arg<'a>(
    keyword: &str,
    args: &[&'a str],
    expected: &'static str,
) -> Result<&'a str, LineError> {
    match args {
        [one] => Ok(one),
        [] => Err(LineError::NoArgument {
            keyword: keyword.to_string(),
            expected,
        }),
        [_, extra @ ..] => Err(LineError::ExtraArgument {
            keyword: keyword.to_string(),
            extra: extra.join(" "),
            expected,
        }),
    }
}

fn bad_value(keyword: &str, value: &str, expected: &'static str) -> LineError {
    LineError::BadValue {
        keyword: keyword.to_string(),
        value: value.to_string(),
        expected,
    }
}

/// An `allow-host` prefix as components; `/` alone gives none (everything).
fn host_prefix(value: &str) -> Result<Vec<String>, LineError> {
    let Some(rest) = value.strip_prefix('/') else {
        return Err(LineError::HostNotAbsolute(value.to_string()));
    };
    let mut components = Vec::new();
    for component in rest.split('/') {
        match component {
            "" | "." => {}
            ".." => return Err(LineError::HostClimbs(value.to_string())),
            name => components.push(name.to_string()),
        }
    }
    Ok(components)
}

/// `quota bytes=SIZE inodes=COUNT`, either key optional, at least one.
fn parse_quota(args: &[&str], policy: &mut Policy) -> Result<(), LineError> {
    if args.is_empty() {
        return Err(LineError::QuotaNoArgument);
    }
    let mut seen_bytes = false;
    let mut seen_inodes = false;
    for arg in args {
        let Some((key, value)) = arg.split_once('=') else {
            return Err(LineError::QuotaNotKeyValue(arg.to_string()));
        };
        let (seen, base) = match key {
            "bytes" => (&mut seen_bytes, 1024),
            "inodes" => (&mut seen_inodes, 1000),
            other => return Err(LineError::QuotaKey(other.to_string())),
        };
        if *seen {
            return Err(LineError::QuotaTwice(key.to_string()));
        }
        *seen = true;
        let amount = parse_amount(value, base).map_err(|source| LineError::QuotaAmount {
            key: key.to_string(),
            value: value.to_string(),
            source,
        })?;
        if key == "bytes" {
            policy.quota.bytes = Some(amount);
        } else {
            policy.quota.inodes = Some(amount);
        }
    }
    Ok(())
}

/// A whole number with an optional suffix K, M, G or T (either case),
/// multiplied by powers of `base`.
pub(crate) fn parse_amount(value: &str, base: u64) -> Result<u64, AmountError> {
    let (digits, power) = match value.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&value[..value.len() - 1], 1),
        Some('M') => (&value[..value.len() - 1], 2),
        Some('G') => (&value[..value.len() - 1], 3),
        Some('T') => (&value[..value.len() - 1], 4),
        _ => (value, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AmountError::NotANumber);
    }
    let number: u64 = digits.parse().map_err(|_| AmountError::TooLarge)?;
    base.checked_pow(power)
        .and_then(|scale| number.checked_mul(scale))
        .ok_or(AmountError::TooLarge)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    fn err(text: &str) -> PolicyError {
        Policy::parse(text).unwrap_err()
    }

    #[test]
    fn every_keyword() {
        let p = Policy::parse(
            "# a policy\n\
             hide       **/.env          # invisible\n\
             readonly   skills/**\n\
             protect    notes/**\n\
             symlinks   any\n\
             allow-host /nix/store\n\
             devices    allow\n\
             suid       allow\n\
             quota      bytes=10G inodes=1M\n",
        )
        .unwrap();
        assert!(p.has_path_rules());
        let c = p.classify("a/.env");
        assert_eq!(c.hidden.unwrap().line, 2);
        assert_eq!(
            p.classify("skills/x").readonly.unwrap().text,
            "readonly skills/**"
        );
        assert_eq!(p.classify("notes/x").protected.unwrap().line, 4);
        assert_eq!(p.symlinks.value, SymlinkMode::Any);
        assert_eq!(p.symlinks.rule.line, 5);
        assert_eq!(p.allow_host.len(), 6);
        assert_eq!(p.allow_host[5].display(), "/nix/store");
        assert!(p.check_device().is_ok());
        assert!(!p.strip_suid());
        assert_eq!(p.quota().bytes, Some(10 << 30));
        assert_eq!(p.quota().inodes, Some(1_000_000));
    }

    #[test]
    fn scratch_lines() {
        let p = Policy::parse("scratch build/**\nscratch *.o # objects\n").unwrap();
        assert_eq!(p.scratch(), ["build/**", "*.o"]);
        assert!(!p.has_path_rules(), "scratch is not an access rule");
        let e = err("hide x\nscratch a/../b\n");
        assert_eq!(e.line, 2);
        assert!(e.kind.to_string().contains(".."), "{}", e.kind);
        assert_eq!(err("scratch\n").line, 1);
    }

    #[test]
    fn settings_later_line_wins() {
        let p = Policy::parse("devices allow\nsuid allow\ndevices deny\nsuid strip\nsymlinks any\nsymlinks contained\n").unwrap();
        assert_eq!(p.check_device().unwrap_err().rule.line, 3);
        assert!(p.strip_suid());
        assert_eq!(p.symlinks.rule.line, 6);
        let p = Policy::parse("quota bytes=1K\nquota inodes=5\n").unwrap();
        assert_eq!(
            p.quota(),
            super::super::Quota {
                bytes: Some(1024),
                inodes: Some(5)
            }
        );
    }

    #[test]
    fn allow_host_adds_and_none_clears() {
        let p = Policy::parse("allow-host none\nallow-host /nix/store/\n").unwrap();
        assert_eq!(p.allow_host.len(), 1);
        assert!(p.check_symlink("l", OsStr::new("/nix/store/abc")).is_ok());
        assert!(p.check_symlink("l", OsStr::new("/usr/bin/env")).is_err());
        let p = Policy::parse("allow-host none\n").unwrap();
        assert!(p.check_symlink("l", OsStr::new("/usr/bin/env")).is_err());
        let p = Policy::parse("allow-host /\n").unwrap();
        assert!(p.check_symlink("l", OsStr::new("/etc/passwd")).is_ok());
    }

    #[test]
    fn comments() {
        assert_eq!(strip_comment("hide a # c"), "hide a ");
        assert_eq!(strip_comment("#hide a"), "");
        assert_eq!(strip_comment("hide issue#12"), "hide issue#12");
        assert_eq!(strip_comment("hide a\t#c"), "hide a\t");
        let p = Policy::parse("hide issue#12 # the tracker dump\n").unwrap();
        assert!(p.classify("x/issue#12").hidden.is_some());
    }

    #[test]
    fn malformed_lines_name_line_and_problem() {
        let e = err("hide a\n\nhidden x\n");
        assert_eq!(e.line, 3);
        assert!(e.kind.to_string().contains("unknown rule `hidden`"), "{e}");
        assert!(
            e.kind
                .to_string()
                .contains("expected one of hide, readonly"),
            "{e}"
        );
        assert_eq!(e.to_string().split(':').next(), Some("line 3"));

        let e = err("readonly\n");
        assert_eq!(e.line, 1);
        assert!(e.kind.to_string().contains("needs an argument"), "{e}");

        let e = err("# x\nprotect a b\n");
        assert_eq!(e.line, 2);
        assert!(e.kind.to_string().contains("extra `b`"), "{e}");

        let e = err("hide ok\nhide a[b\n");
        assert_eq!(e.line, 2);
        assert!(e.kind.to_string().contains("bad glob `a[b`"), "{e}");

        let e = err("hide ../x\n");
        assert!(e.kind.to_string().contains("`..`"), "{e}");

        let e = err("symlinks maybe\n");
        assert!(
            e.kind.to_string().contains("expected `contained` or `any`"),
            "{e}"
        );
        let e = err("devices\n");
        assert!(
            e.kind.to_string().contains("expected `deny` or `allow`"),
            "{e}"
        );
        let e = err("suid keep\n");
        assert!(
            e.kind.to_string().contains("expected `strip` or `allow`"),
            "{e}"
        );
        let e = err("symlinks any contained\n");
        assert!(e.kind.to_string().contains("extra"), "{e}");

        let e = err("\n\nallow-host usr\n");
        assert_eq!(e.line, 3);
        assert!(e.kind.to_string().contains("absolute"), "{e}");
        let e = err("allow-host /usr/../etc\n");
        assert!(e.kind.to_string().contains("`..`"), "{e}");
        let e = err("allow-host\n");
        assert!(e.kind.to_string().contains("needs an argument"), "{e}");

        let e = err("Hide x\n");
        assert!(e.kind.to_string().contains("unknown rule `Hide`"), "{e}");
    }

    #[test]
    fn quota_suffixes() {
        assert_eq!(parse_amount("0", 1024), Ok(0));
        assert_eq!(parse_amount("512", 1024), Ok(512));
        assert_eq!(parse_amount("1k", 1024), Ok(1024));
        assert_eq!(parse_amount("1K", 1000), Ok(1000));
        assert_eq!(parse_amount("3m", 1024), Ok(3 << 20));
        assert_eq!(parse_amount("10G", 1024), Ok(10 << 30));
        assert_eq!(parse_amount("2t", 1024), Ok(2 << 40));
        assert_eq!(parse_amount("1M", 1000), Ok(1_000_000));
        assert!(parse_amount("", 1024).is_err());
        assert!(parse_amount("G", 1024).is_err());
        assert!(parse_amount("1.5G", 1024).is_err());
        assert!(parse_amount("-1", 1024).is_err());
        assert!(parse_amount("10GB", 1024).is_err());
        assert!(parse_amount("99999999999T", 1024).is_err());
        assert!(parse_amount("99999999999999999999", 1024).is_err());
    }

    #[test]
    fn quota_errors() {
        let p = Policy::parse("quota inodes=2k\n").unwrap();
        assert_eq!(p.quota().bytes, None);
        assert_eq!(p.quota().inodes, Some(2000));
        let e = err("quota\n");
        assert!(e.kind.to_string().contains("needs an argument"), "{e}");
        let e = err("\nquota bytes=ten\n");
        assert_eq!(e.line, 2);
        assert!(e.kind.to_string().contains("bytes=`ten`"), "{e}");
        assert!(e.kind.to_string().contains("not a number"), "{e}");
        let e = err("quota files=3\n");
        assert!(e.kind.to_string().contains("unknown key `files`"), "{e}");
        let e = err("quota bytes=1 bytes=2\n");
        assert!(e.kind.to_string().contains("twice"), "{e}");
        let e = err("quota 10G\n");
        assert!(e.kind.to_string().contains("not KEY=VALUE"), "{e}");
    }
}
