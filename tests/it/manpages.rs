//! Manual pages: `layerfs man DIR` writes one page per visible subcommand
//! (from the clap definitions) and mount.fuse.layerfs(8), and each renders
//! with man(1) without a groff warning.

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
    let mut pages = vec!["layerfs.1".to_string(), "mount.fuse.layerfs.8".to_string()];
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
    // The hidden generator has no page of its own.
    assert!(!dir.path().join("layerfs-man.1").exists());

    let (mount, _) = render(&dir.path().join("layerfs-mount.1"), false);
    for needle in ["--lower", "--upper", "--allow-other", "--policy", "policy="] {
        assert!(
            mount.contains(needle),
            "layerfs-mount(1) lacks {needle}:\n{mount}"
        );
    }
    let (helper, _) = render(&dir.path().join("mount.fuse.layerfs.8"), false);
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
    ] {
        assert!(
            helper.contains(needle),
            "mount.fuse.layerfs(8) lacks {needle}:\n{helper}"
        );
    }
}
