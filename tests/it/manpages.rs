//! Manual pages: `layerfs man DIR` writes one page per visible subcommand
//! (from the clap definitions), layerfs-policy(5) and mount.fuse.layerfs(8),
//! and each renders with man(1) without a groff warning; shell completions
//! come from the same definitions.

use std::process::Command;

use crate::harness::bin;

/// The subcommands `layerfs --help` lists.
fn listed_subcommands() -> Vec<String> {
    let out = Command::new(bin()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).to_string();
    help.split("Commands:")
        .nth(1)
        .expect("--help lists commands")
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect()
}

/// `man -l FILE` as plain text, with man's warnings on stderr, in the
/// caller's locale or, with `c_locale`, under `LC_ALL=C` (plain ASCII
/// output, as on a machine with no locale set).
fn render(page: &std::path::Path, c_locale: bool) -> (String, String) {
    let mut cmd = Command::new("man");
    if c_locale {
        cmd.env_remove("LANG")
            .env_remove("LANGUAGE")
            .env("LC_ALL", "C");
    }
    let out = cmd
        .args(["--warnings", "-l"])
        .arg(page)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
        .expect("run man (apt-get install man-db)");
    assert!(out.status.success(), "man -l {}", page.display());
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn man_pages_cover_every_subcommand_and_the_mount_helper_and_render() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .arg("man")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let subs = listed_subcommands();
    assert!(subs.contains(&"mount".to_string()), "{subs:?}");
    assert!(
        subs.contains(&"man".to_string()),
        "--help lists man: {subs:?}"
    );
    let mut pages = vec![
        "layerfs.1".to_string(),
        "mount.fuse.layerfs.8".to_string(),
        "layerfs-policy.5".to_string(),
    ];
    pages.extend(subs.iter().map(|s| format!("layerfs-{s}.1")));
    pages.extend(
        [
            "policy-check",
            "policy-explain",
            "snapshot-save",
            "snapshot-restore",
        ]
        .iter()
        .map(|s| format!("layerfs-{s}.1")),
    );
    for page in &pages {
        let path = dir.path().join(page);
        assert!(path.exists(), "{page} was not written");
        for c_locale in [false, true] {
            let (text, warnings) = render(&path, c_locale);
            assert!(
                warnings.trim().is_empty(),
                "{page} (C locale: {c_locale}): {warnings}"
            );
            assert!(
                text.contains("NAME") && text.contains("SYNOPSIS"),
                "{page}: {text}"
            );
        }
    }
    // The synopsis names what each option takes, and no empty brackets.
    for page in &pages {
        let (text, _) = render(&dir.path().join(page), true);
        let synopsis: String = text
            .split("SYNOPSIS")
            .nth(1)
            .and_then(|t| t.split("\nDESCRIPTION").next())
            .unwrap_or_else(|| panic!("{page}: no SYNOPSIS"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            !synopsis.contains(" ]") && !synopsis.contains("[]"),
            "{page}: {synopsis}"
        );
    }

    // Words as man sets them, whatever its justification adds between them.
    let flat = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
    let (mount, _) = render(&dir.path().join("layerfs-mount.1"), false);
    let mount = flat(&mount);
    for needle in [
        "--lower",
        "--upper",
        "--allow-other",
        "--policy",
        "policy=",
        "[--lower DIR]",
        "[-o OPTS]",
    ] {
        assert!(
            mount.contains(needle),
            "layerfs-mount(1) lacks {needle}:\n{mount}"
        );
    }
    let (helper, _) = render(&dir.path().join("mount.fuse.layerfs.8"), false);
    let helper = flat(&helper);
    for needle in [
        "MOUNT OPTIONS",
        "lowerdir=DIR[:DIR",
        "upperdir=DIR",
        "policy=FILE",
        "no_journal",
        "_netdev",
        "x-systemd.requires",
        "FSTAB",
        "EXIT STATUS",
        "32",
        "layerfs install-helpers",
        "[-s]",
        "[-o OPTIONS]",
    ] {
        assert!(
            helper.contains(needle),
            "mount.fuse.layerfs(8) lacks {needle}:\n{helper}"
        );
    }
    // The policy file's page: every rule kind, the globs, precedence and
    // an example, and the other pages point at it.
    let (policy, _) = render(&dir.path().join("layerfs-policy.5"), false);
    let policy = flat(&policy);
    for needle in [
        "LAYERFS-POLICY(5)",
        "hide PATTERN",
        "readonly PATTERN",
        "protect PATTERN",
        "scratch PATTERN",
        "symlinks contained|any",
        "allow-host PREFIX|none",
        "devices deny|allow",
        "suid strip|allow",
        "quota bytes=SIZE inodes=COUNT",
        "PATTERNS",
        "** as a whole component",
        "PRECEDENCE",
        "later line wins",
        "EXAMPLES",
        "hide **/.env # secrets stay invisible",
    ] {
        assert!(
            policy.contains(needle),
            "layerfs-policy(5) lacks {needle}:\n{policy}"
        );
    }
    let (check, _) = render(&dir.path().join("layerfs-policy-check.1"), false);
    assert!(check.contains("layerfs-policy(5)"), "{check}");
}

/// `layerfs completions SHELL` for every shell clap knows; the bash script
/// sourced in bash completes subcommands and their options.
#[test]
fn shell_completions_are_generated_and_complete_in_bash() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(bin())
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("layerfs") && text.contains("snapshot"),
            "{shell}"
        );
    }
    let out = Command::new(bin())
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("layerfs completions: ") && err.contains("bash"),
        "{err}"
    );

    let script = format!(
        r#"source <("{bin}" completions bash)
complete_words() {{
  COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMP_LINE="$*"; COMP_POINT=${{#COMP_LINE}}
  COMPREPLY=(); _layerfs layerfs "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
  printf '%s
' "${{COMPREPLY[@]}}"
}}
echo "== top"; complete_words layerfs sn
echo "== snapshot"; complete_words layerfs snapshot re
echo "== diff"; complete_words layerfs diff --st"#,
        bin = bin().display()
    );
    let out = Command::new("bash").args(["-c", &script]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let section = |name: &str| -> Vec<String> {
        text.split(&format!("== {name}\n"))
            .nth(1)
            .unwrap_or("")
            .lines()
            .take_while(|l| !l.starts_with("== "))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(section("top"), ["snapshot"], "{text}");
    assert_eq!(section("snapshot"), ["restore"], "{text}");
    let diff = section("diff");
    assert!(diff.iter().any(|w| w == "--stat"), "{text}");
    assert!(diff.iter().any(|w| w == "--state"), "{text}");
}
