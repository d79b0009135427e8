//! `layerfs run`: where things appear in the sandbox — the workspace at
//! `/workspace` (or `--at PATH`) whatever its host mountpoint, with project
//! tools that name a project after its directory working at the root.

use std::fs;

use crate::run::{run_as, s, sh_as, stderr, stdout, text, workspace_for, Caller};

#[test]
fn the_workspace_is_at_workspace_and_npm_init_works_at_its_root() {
    for caller in [Caller::Root, Caller::Tests] {
        let ws = workspace_for(caller);
        let out = sh_as(
            caller,
            &ws,
            false,
            &["--no-network"],
            "pwd; echo $LAYERFS_WORKSPACE; npm init -y >/dev/null && echo npm-ok",
        );
        assert_eq!(out.status.code(), Some(0), "{caller:?}: {}", text(&out));
        assert_eq!(
            stdout(&out),
            "/workspace\n/workspace\nnpm-ok\n",
            "{caller:?}: {}",
            text(&out)
        );
        let pkg = fs::read_to_string(ws.upper.join("package.json")).unwrap();
        assert!(pkg.contains("\"name\": \"workspace\""), "{pkg}");
    }
}

#[test]
fn cargo_init_works_at_the_workspace_root() {
    let ws = workspace_for(Caller::Root);
    // cargo is root's rustup install here: its toolchains are found
    // through RUSTUP_HOME, which the command inherits.
    let out = sh_as(
        Caller::Root,
        &ws,
        false,
        &["--no-network"],
        "cargo init --vcs none -q && cargo metadata --offline --no-deps \
         --format-version 1 | grep -o '\"name\":\"workspace\"' | head -1",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(stdout(&out), "\"name\":\"workspace\"\n", "{}", text(&out));
    assert!(ws.upper.join("Cargo.toml").exists());
    assert!(ws.upper.join("src/main.rs").exists());
}

#[test]
fn at_places_the_workspace_where_the_host_has_no_such_directory() {
    for caller in [Caller::Root, Caller::Tests] {
        let ws = workspace_for(caller);
        fs::write(ws.lower().join("shared.txt"), "shared\n").unwrap();
        let at = format!("/srv/layerfs-at-{}/proj", std::process::id());
        let script = "pwd; cat shared.txt; echo made > made.txt; \
             (touch /srv/beside 2>&1 || true); test -e /etc/passwd && echo etc-ok";
        let out = sh_as(caller, &ws, false, &["--at", &at], script);
        assert_eq!(out.status.code(), Some(0), "{caller:?}: {}", text(&out));
        let o = stdout(&out);
        assert!(o.starts_with(&format!("{at}\nshared\n")), "{caller:?}: {o}");
        // The directory made for it shows the host's other entries and is
        // read-only like the rest of the host.
        assert!(o.contains("Read-only file system"), "{caller:?}: {o}");
        assert!(o.ends_with("etc-ok\n"), "{caller:?}: {o}");
        assert_eq!(
            fs::read_to_string(ws.upper.join("made.txt")).unwrap(),
            "made\n"
        );
        assert!(!std::path::Path::new(&at).exists(), "made on the host");
    }
}

#[test]
fn at_must_be_an_absolute_path_outside_the_kernels_trees() {
    let ws = workspace_for(Caller::Root);
    for (at, says) in [
        ("rel", "absolute path"),
        ("/", "root"),
        ("/a/../b", "`..`"),
        ("/proc/w", "/proc belongs to the sandbox"),
        ("/dev/w", "/dev belongs to the sandbox"),
    ] {
        let out = run_as(
            Caller::Root,
            &[
                "--lower",
                s(ws.lower()),
                "--ephemeral",
                "--at",
                at,
                "--",
                "true",
            ],
        );
        assert_eq!(out.status.code(), Some(2), "--at {at}: {}", text(&out));
        assert!(stderr(&out).contains(says), "--at {at}: {}", text(&out));
    }
}
