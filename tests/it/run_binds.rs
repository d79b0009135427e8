//! `layerfs run`: inputs and caches in, explicitly — `--ro-bind`,
//! `--bind`, `--home`, `--env`/`--env-clear`/`--env-keep` — used offline
//! under `--no-network` by npm and cargo, and the binds refused: another
//! user's directory, the workspace's own directories, a lower written.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::run::{
    chown_tree, run_as, s, sh_as, stderr, stdout, tests_ids, text, workspace_for, Caller,
};

/// A packed npm package `hello-1.0.0.tgz` in `dir`.
fn npm_package(dir: &Path) {
    let src = dir.join("hello");
    fs::create_dir_all(&src).unwrap();
    fs::write(
        src.join("package.json"),
        r#"{"name":"hello","version":"1.0.0","main":"index.js"}"#,
    )
    .unwrap();
    fs::write(src.join("index.js"), "module.exports = 'hi from hello';\n").unwrap();
    let out = Command::new("npm")
        .args(["pack", "--silent", "./hello"])
        .current_dir(dir)
        .output()
        .expect("npm (.ci/run installs it)");
    assert!(out.status.success(), "npm pack: {:?}", out);
}

#[test]
fn npm_installs_offline_from_a_read_only_input_into_a_writable_cache() {
    for caller in [Caller::Root, Caller::Tests] {
        let ws = workspace_for(caller);
        let inputs = ws.dir.path().join("inputs");
        let cache = ws.dir.path().join("cache");
        fs::create_dir(&cache).unwrap();
        npm_package(&inputs);
        if caller == Caller::Tests {
            let (uid, gid) = tests_ids();
            chown_tree(ws.dir.path(), uid, gid);
        }
        let ro = format!("{}:/inputs", inputs.display());
        let rw = format!("{}:/cache", cache.display());
        let script = "npm init -y >/dev/null && npm install --offline --no-audit --no-fund \
             --cache /cache/npm /inputs/hello-1.0.0.tgz >/dev/null && \
             node -e 'console.log(require(\"hello\"))' && \
             (touch /inputs/x 2>&1 || true)";
        let flags = ["--no-network", "--ro-bind", &ro, "--bind", &rw];
        let out = sh_as(caller, &ws, false, &flags, script);
        assert_eq!(out.status.code(), Some(0), "{caller:?}: {}", text(&out));
        let o = stdout(&out);
        assert!(o.starts_with("hi from hello\n"), "{caller:?}: {o}");
        assert!(o.contains("Read-only file system"), "{caller:?}: {o}");
        assert!(ws.upper.join("node_modules/hello/index.js").exists());
        assert!(cache.join("npm/_cacache").is_dir(), "the cache was written");
        assert!(!inputs.join("x").exists());
    }
}

#[test]
fn cargo_builds_offline_with_a_read_only_path_dependency_and_a_target_cache() {
    let ws = workspace_for(Caller::Root);
    let inputs = ws.dir.path().join("inputs/greet");
    fs::create_dir_all(inputs.join("src")).unwrap();
    fs::write(
        inputs.join("Cargo.toml"),
        "[package]\nname = \"greet\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    fs::write(
        inputs.join("src/lib.rs"),
        "pub fn greet() -> &'static str { \"hi from greet\" }\n",
    )
    .unwrap();
    let cache = ws.dir.path().join("cache");
    fs::create_dir(&cache).unwrap();
    let ro = format!("{}:/inputs", ws.dir.path().join("inputs").display());
    let rw = format!("{}:/cache", cache.display());
    let script = "cargo init --vcs none -q && \
         echo 'greet = { path = \"/inputs/greet\" }' >> Cargo.toml && \
         echo 'fn main() { println!(\"{}\", greet::greet()); }' > src/main.rs && \
         cargo run -q --offline";
    let flags = [
        "--no-network",
        "--ro-bind",
        &ro,
        "--bind",
        &rw,
        "--env",
        "CARGO_TARGET_DIR=/cache/target",
    ];
    let out = sh_as(Caller::Root, &ws, false, &flags, script);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(stdout(&out), "hi from greet\n", "{}", text(&out));
    assert!(cache.join("target/debug/workspace").exists());
    assert!(!ws.upper.join("target").exists(), "built into the cache");
}

#[test]
fn home_is_private_per_run_or_a_kept_directory() {
    for caller in [Caller::Root, Caller::Tests] {
        let ws = workspace_for(caller);
        let script = "echo $HOME; ls -A ~ | wc -l; echo kept > ~/.note";
        let out = sh_as(caller, &ws, true, &[], script);
        assert_eq!(out.status.code(), Some(0), "{caller:?}: {}", text(&out));
        assert_eq!(
            stdout(&out),
            "/home/sandbox\n0\n",
            "{caller:?}: {}",
            text(&out)
        );
        // Private: the next run starts with an empty home again.
        let out = sh_as(caller, &ws, true, &[], script);
        assert_eq!(
            stdout(&out),
            "/home/sandbox\n0\n",
            "{caller:?}: {}",
            text(&out)
        );

        let home = ws.dir.path().join("home");
        fs::create_dir(&home).unwrap();
        if caller == Caller::Tests {
            let (uid, gid) = tests_ids();
            chown_tree(&home, uid, gid);
        }
        let flags = ["--home", s(&home)];
        let out = sh_as(caller, &ws, true, &flags, script);
        assert_eq!(
            stdout(&out),
            "/home/sandbox\n0\n",
            "{caller:?}: {}",
            text(&out)
        );
        let out = sh_as(caller, &ws, true, &flags, "cat ~/.note");
        assert_eq!(stdout(&out), "kept\n", "{caller:?}: {}", text(&out));
        assert_eq!(fs::read_to_string(home.join(".note")).unwrap(), "kept\n");

        let out = sh_as(caller, &ws, true, &["--home", "host"], "echo $HOME");
        // (setpriv leaves the variable as the test's.)
        let want = std::env::var("HOME").unwrap_or_default();
        assert_eq!(stdout(&out).trim_end(), want, "{caller:?}: {}", text(&out));
    }
}

#[test]
fn env_sets_clears_and_keeps_names() {
    let ws = workspace_for(Caller::Root);
    let out = sh_as(
        Caller::Root,
        &ws,
        true,
        &["--env", "A=1", "--env", "A=2", "--env", "TMPDIR=/var/tmp"],
        "echo $A $TMPDIR; test -n \"$RUST_LOG\" && echo inherited",
    );
    assert_eq!(stdout(&out), "2 /var/tmp\ninherited\n", "{}", text(&out));
    let out = sh_as(
        Caller::Root,
        &ws,
        true,
        &["--env-clear", "--env-keep", "RUST_LOG", "--env", "B=x"],
        "env | sort | cut -d= -f1 | tr '\\n' ' '",
    );
    assert_eq!(
        stdout(&out),
        "B HOME LAYERFS_WORKSPACE PATH PWD RUST_LOG TMPDIR ",
        "{}",
        text(&out)
    );
}

#[test]
fn binds_are_refused_where_the_caller_may_not_write_or_the_workspace_lives() {
    for caller in [Caller::Root, Caller::Tests] {
        let ws = workspace_for(caller);
        // Root's, 0755: the user `tests` may not write it.
        let roots = Path::new("/var/tmp").join(format!("layerfs-roots-{}", std::process::id()));
        fs::create_dir_all(&roots).unwrap();
        let (lower, upper) = (s(ws.lower()), s(&ws.upper));
        let all = ws.dir.path().display().to_string();
        let r = roots.display().to_string();
        let mut cases: Vec<(Vec<String>, &str)> = vec![
            (
                vec!["--bind".into(), format!("{lower}:/l")],
                "overlaps the lower",
            ),
            (
                vec!["--ro-bind".into(), format!("{upper}:/u")],
                "own directory",
            ),
            (
                vec!["--ro-bind".into(), format!("{all}:/all")],
                "own directory",
            ),
            (vec!["--bind".into(), format!("{r}:/run/x")], "private /run"),
            (
                vec!["--bind".into(), format!("{r}:/workspace/x")],
                "overlaps the workspace",
            ),
        ];
        if caller == Caller::Tests {
            cases.push((
                vec!["--bind".into(), format!("{r}:/c")],
                "you may not write it",
            ));
            cases.push((vec!["--home".into(), r.clone()], "you may not write it"));
        }
        for (flags, says) in cases {
            let mut args = vec!["--lower", lower, "--upper", upper];
            args.extend(flags.iter().map(|f| f.as_str()));
            args.extend(["--", "touch", "ran"]);
            let out = run_as(caller, &args);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{caller:?} {flags:?}: {}",
                text(&out)
            );
            assert!(
                stderr(&out).contains(says),
                "{caller:?} {flags:?}: {}",
                text(&out)
            );
            assert!(!ws.upper.join("ran").exists(), "{flags:?}: the command ran");
        }
        fs::remove_dir(&roots).unwrap();
    }
}

#[test]
fn allow_host_lets_links_reach_an_interpreter_outside_the_default_prefixes() {
    for caller in [Caller::Root, Caller::Tests] {
        let ws = workspace_for(caller);
        let tools = ws.dir.path().join("tools");
        fs::create_dir(&tools).unwrap();
        let tool = tools.join("python9");
        let script = format!("ln -s {} py 2>&1 && readlink py", tool.display());
        let out = sh_as(caller, &ws, false, &[], &script);
        assert_ne!(out.status.code(), Some(0), "{caller:?}: {}", text(&out));
        let flags = ["--allow-host", s(&tools)];
        let out = sh_as(caller, &ws, false, &flags, &script);
        assert_eq!(out.status.code(), Some(0), "{caller:?}: {}", text(&out));
        assert_eq!(stdout(&out).trim_end(), s(&tool), "{caller:?}");
    }
    // python3 -m venv links to root's pyenv interpreter instead of
    // copying it.
    let ws = workspace_for(Caller::Root);
    let py = String::from_utf8(
        Command::new("python3")
            .args(["-c", "import sys; print(sys.base_prefix)"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let script = "python3 -m venv v 2>&1 && test -L v/bin/python3 && echo linked";
    let out = sh_as(
        Caller::Root,
        &ws,
        true,
        &["--allow-host", py.trim()],
        script,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stdout(&out).ends_with("linked\n"), "{}", text(&out));
}

#[test]
fn allow_host_is_refused_for_a_live_mount() {
    let ws = workspace_for(Caller::Root);
    let m = ws.mount();
    let flags = ["--allow-host", "/srv/tools"];
    let out = sh_as(Caller::Root, &ws, false, &flags, "true");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        stderr(&out).contains("cannot change the policy of the live mount"),
        "{}",
        text(&out)
    );
    assert!(m.unmount());
}

/// docs/run.md, "Running as another user over a shared lower": git refuses a
/// root-owned repository to the user `tests`, and `safe.directory` through
/// `GIT_CONFIG_*` lets it in without a writable home.
#[test]
fn another_user_trusts_a_root_owned_repository_through_git_config_env() {
    let ws = workspace_for(Caller::Tests);
    let lower = ws.dir.path().join("root-lower");
    fs::create_dir(&lower).unwrap();
    let git = |args: &[&str]| {
        let o = Command::new("git")
            .args(["-c", "user.email=a@b", "-c", "user.name=a"])
            .args(args)
            .current_dir(&lower)
            .output()
            .unwrap();
        assert!(o.status.success(), "git {args:?}: {o:?}");
    };
    git(&["init", "-q"]);
    git(&["commit", "-q", "--allow-empty", "-m", "x"]);
    let base = ["--lower", s(&lower), "--upper", s(&ws.upper)];
    let mut args = base.to_vec();
    args.extend(["--", "git", "status", "--short", "--branch"]);
    let out = run_as(Caller::Tests, &args);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stderr(&out).contains("dubious ownership"), "{}", text(&out));
    let mut args = base.to_vec();
    args.extend([
        "--env",
        "GIT_CONFIG_COUNT=1",
        "--env",
        "GIT_CONFIG_KEY_0=safe.directory",
        "--env",
        "GIT_CONFIG_VALUE_0=/workspace",
        "--",
        "git",
        "status",
        "--short",
        "--branch",
    ]);
    let out = run_as(Caller::Tests, &args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stdout(&out).starts_with("## "), "{}", text(&out));
}

#[test]
fn pip_installs_offline_from_a_read_only_wheel_into_a_writable_bind() {
    let ws = workspace_for(Caller::Root);
    let inputs = ws.dir.path().join("inputs");
    let cache = ws.dir.path().join("cache");
    fs::create_dir(&inputs).unwrap();
    fs::create_dir(&cache).unwrap();
    // A pure-Python wheel, made by hand (no build backend, no network).
    let make = format!(
        "import zipfile\n\
         w = zipfile.ZipFile('{}/hello-1.0-py3-none-any.whl', 'w')\n\
         w.writestr('hello/__init__.py', 'GREETING = \"hi from hello\"\\n')\n\
         w.writestr('hello-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: hello\\nVersion: 1.0\\n')\n\
         w.writestr('hello-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n\
         w.writestr('hello-1.0.dist-info/RECORD', '')\n\
         w.close()\n",
        inputs.display()
    );
    let o = Command::new("python3")
        .args(["-c", &make])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    // The interpreter itself, not a pyenv shim (which writes its shims
    // directory, read-only in the sandbox).
    let py = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    let py = String::from_utf8(py.stdout).unwrap();
    let py = py.trim();
    let script = format!(
        "{py} -m pip install -q --root-user-action=ignore --no-index --find-links /inputs \
         --target /cache/site hello && PYTHONPATH=/cache/site {py} -c \
         'import hello; print(hello.GREETING)'"
    );
    let ro = format!("{}:/inputs", inputs.display());
    let rw = format!("{}:/cache", cache.display());
    let flags = ["--no-network", "--ro-bind", &ro, "--bind", &rw];
    let out = sh_as(Caller::Root, &ws, true, &flags, &script);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(stdout(&out), "hi from hello\n", "{}", text(&out));
    assert!(cache.join("site/hello/__init__.py").exists());
}
