//! `layerfs run` through the real binary: exit codes and signals, output
//! relay and truncation, `--json`, `--timeout` killing the whole tree,
//! `--cwd` escapes, the sandbox's read-only host and private /tmp, the
//! ephemeral upper, reuse of a live mount, stop signals, `--no-network`,
//! as root and as the unprivileged user `tests` (through user namespaces).
//!
//! Workspaces live under /var/tmp, not /tmp: inside the sandbox /tmp is a
//! private tmpfs, so paths under the host's /tmp would not be there to
//! try writing.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::daemon::{DevFuseOpen, DEV_FUSE};
use crate::harness::{bin, eventually, is_mounted, Workspace};

/// Who runs `layerfs run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    Root,
    /// The unprivileged user `tests`.
    Tests,
}

pub(crate) fn tests_ids() -> (u32, u32) {
    let u = nix::unistd::User::from_name("tests")
        .expect("look up user tests")
        .expect("user `tests` is missing: useradd -M tests (.ci/run does)");
    (u.uid.as_raw(), u.gid.as_raw())
}

/// A workspace outside /tmp; for `Tests` owned by that user.
pub(crate) fn workspace_for(caller: Caller) -> Workspace {
    let ws = Workspace::with_lowers_in(1, Path::new("/var/tmp"));
    if caller == Caller::Tests {
        fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let (uid, gid) = tests_ids();
        chown_tree(ws.dir.path(), uid, gid);
    }
    ws
}

pub(crate) fn chown_tree(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
    if fs::symlink_metadata(p).unwrap().is_dir() {
        for e in fs::read_dir(p).unwrap() {
            chown_tree(&e.unwrap().path(), uid, gid);
        }
    }
}

/// `layerfs run ARGS` as `caller`, not yet started.
pub(crate) fn run_cmd(caller: Caller, args: &[&str]) -> Command {
    let mut cmd = match caller {
        Caller::Root => Command::new(bin()),
        Caller::Tests => {
            let (uid, gid) = tests_ids();
            let mut c = Command::new("setpriv");
            c.args([
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".into(),
                "--".into(),
            ])
            .arg(bin());
            c
        }
    };
    cmd.arg("run")
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("TMPDIR")
        .current_dir("/")
        .stdin(Stdio::null());
    cmd
}

/// A started `layerfs run`, killed (and so unmounted by its daemon's
/// parent-death signal) if a test ends while it still runs.
pub(crate) struct Running(Option<Child>);

impl Running {
    pub(crate) fn start(mut cmd: Command) -> Running {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        Running(Some(cmd.spawn().expect("start layerfs run")))
    }

    /// Starts `cmd` with the standard streams it was given.
    pub(crate) fn spawn(mut cmd: Command) -> Running {
        Running(Some(cmd.spawn().expect("start layerfs run")))
    }

    fn pid(&self) -> i32 {
        self.0.as_ref().unwrap().id() as i32
    }

    /// Waits at most `limit` for it to end (a hung run fails the test).
    pub(crate) fn finish(mut self, limit: Duration) -> Output {
        let mut child = self.0.take().unwrap();
        let deadline = Instant::now() + limit;
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!("layerfs run did not end within {limit:?}: {}", text(&out));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `layerfs run ARGS` as `caller` and waits (60 s at most).
pub(crate) fn run_as(caller: Caller, args: &[&str]) -> Output {
    let _fuse = (caller == Caller::Tests).then(OpenFuse::new);
    Running::start(run_cmd(caller, args)).finish(Duration::from_secs(60))
}

fn run(args: &[&str]) -> Output {
    run_as(Caller::Root, args)
}

/// `sh -c SCRIPT` run as `caller` in `ws` (its upper, or `--ephemeral`),
/// with extra `flags`.
pub(crate) fn sh_as(
    caller: Caller,
    ws: &Workspace,
    ephemeral: bool,
    flags: &[&str],
    script: &str,
) -> Output {
    let mut a = vec!["--lower", s(ws.lower())];
    if ephemeral {
        a.push("--ephemeral");
    } else {
        a.extend(["--upper", s(&ws.upper)]);
    }
    a.extend_from_slice(flags);
    a.extend(["--", "sh", "-c", script]);
    run_as(caller, &a)
}

/// /dev/fuse opened to everyone (as distributions ship it) while an
/// unprivileged test mounts; serialized with the other tests that do.
pub(crate) struct OpenFuse {
    _dev: DevFuseOpen,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl OpenFuse {
    pub(crate) fn new() -> OpenFuse {
        let serial = DEV_FUSE.lock().unwrap_or_else(|e| e.into_inner());
        OpenFuse {
            _dev: DevFuseOpen::new(),
            _serial: serial,
        }
    }
}

pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub(crate) fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        stdout(o),
        stderr(o)
    )
}

/// The `--json` object: the last line of stdout.
pub(crate) fn json_of(o: &Output) -> Value {
    let out = stdout(o);
    let last = out
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no output: {}", text(o)));
    serde_json::from_str(last).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(o)))
}

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The run whose `--json` output this is left neither its temporary
/// directory nor a mount behind.
fn assert_cleaned_up(o: &Output) {
    let v = json_of(o);
    let mnt = PathBuf::from(v["mountpoint"].as_str().expect("a mountpoint"));
    assert!(!is_mounted(&mnt), "{} left mounted", mnt.display());
    if let Some(dir) = v["upper"]
        .as_str()
        .map(Path::new)
        .and_then(Path::parent)
        .filter(|d| s(d).contains("layerfs-run."))
    {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}

/// The mountpoint `layerfs run` uses for a persistent upper.
pub(crate) fn run_mountpoint(upper: &Path) -> PathBuf {
    layerfs::run::default_mountpoint(upper).unwrap()
}

#[test]
fn exit_codes_signals_and_output_are_the_commands() {
    let ws = workspace_for(Caller::Root);
    let lower = s(ws.lower());
    let root = Caller::Root;
    let out = sh_as(root, &ws, true, &[], "echo to-stdout; echo to-stderr >&2");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(stdout(&out), "to-stdout\n");
    assert_eq!(stderr(&out), "to-stderr\n");

    let out = sh_as(root, &ws, true, &[], "exit 3");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));

    for (sig, code) in [("KILL", 137), ("TERM", 143)] {
        let out = sh_as(root, &ws, true, &["--json"], &format!("kill -{sig} $$"));
        assert_eq!(out.status.code(), Some(code), "{}", text(&out));
        assert_eq!(json_of(&out)["signal"], code - 128, "{}", text(&out));
    }

    let out = run(&[
        "--lower",
        lower,
        "--ephemeral",
        "--json",
        "--",
        "no-such-command-xyz",
    ]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out));
    assert_cleaned_up(&out);
    assert!(
        stderr(&out).contains("no-such-command-xyz: command not found"),
        "{}",
        text(&out)
    );
    fs::write(ws.lower().join("not-exec"), "#!/bin/sh\n").unwrap();
    let out = run(&["--lower", lower, "--ephemeral", "--", "./not-exec"]);
    assert_eq!(out.status.code(), Some(126), "{}", text(&out));
}

#[test]
fn json_reports_every_field_after_the_commands_output() {
    let ws = workspace_for(Caller::Root);
    let script = "printf no-newline; sleep 0.2; exit 5";
    let out = sh_as(Caller::Root, &ws, false, &["--json"], script);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    let o = stdout(&out);
    assert!(
        o.starts_with("no-newline\n{"),
        "the JSON starts a line of its own: {o}"
    );
    let v = json_of(&out);
    assert_eq!(v["exit_code"], 5);
    assert!(v["signal"].is_null());
    assert_eq!(v["truncated"], false);
    assert_eq!(v["output_bytes"], 10);
    assert!(v["duration_ms"].as_u64().unwrap() >= 200, "{v}");
    assert_eq!(v["upper"], s(&ws.upper));
    assert_eq!(v["mountpoint"], s(&run_mountpoint(&ws.upper)));
    assert_eq!(v["timed_out"], false);
    assert!(v.get("error").is_none(), "{v}");

    // A failure before the command ran is an object with `error`.
    let out = run(&[
        "--lower",
        s(ws.lower()),
        "--upper",
        "/nonexistent/upper",
        "--json",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let v = json_of(&out);
    assert!(
        v["error"].as_str().unwrap().contains("does not exist"),
        "{v}"
    );
}

#[test]
fn max_output_keeps_the_first_bytes_of_both_streams_and_says_so() {
    let ws = workspace_for(Caller::Root);
    let script = "printf 0123456; sleep 0.1; printf abcdef >&2; sleep 0.1; \
                  head -c 100000 /dev/zero";
    let flags = ["--max-output", "10", "--json"];
    let out = sh_as(Caller::Root, &ws, true, &flags, script);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let o = stdout(&out);
    assert!(o.starts_with("0123456\n{"), "{o}");
    let e = stderr(&out);
    assert!(e.starts_with("abc"), "{e}");
    assert!(
        e.contains("output truncated") && e.contains("first 10 of 100013 bytes"),
        "{e}"
    );
    let v = json_of(&out);
    assert_eq!(v["truncated"], true);
    assert_eq!(v["output_bytes"], 100013);
}

#[test]
fn timeout_kills_the_whole_tree_and_exits_124() {
    let ws = workspace_for(Caller::Root);
    let marker = "3131.25";
    let script = format!("sh -c 'sleep {marker}' & sleep {marker} & echo started > started; wait");
    let begun = Instant::now();
    let out = sh_as(
        Caller::Root,
        &ws,
        false,
        &["--timeout", "3s", "--json"],
        &script,
    );
    assert_eq!(out.status.code(), Some(124), "{}", text(&out));
    assert!(
        begun.elapsed() < Duration::from_secs(30),
        "{:?}",
        begun.elapsed()
    );
    assert!(ws.upper.join("started").exists(), "the command never ran");
    let v = json_of(&out);
    assert_eq!(v["timed_out"], true, "{v}");
    assert_eq!(v["exit_code"], 124);
    assert!(
        stderr(&out).contains("timed out after 3s"),
        "{}",
        text(&out)
    );
    let left = Command::new("pgrep")
        .args(["-f", &format!("sleep {marker}")])
        .output()
        .unwrap();
    assert!(
        stdout(&left).trim().is_empty(),
        "sleeps survived: {}",
        stdout(&left)
    );
    assert!(!is_mounted(&run_mountpoint(&ws.upper)));
}

#[test]
fn cwd_must_stay_inside_the_workspace() {
    let ws = workspace_for(Caller::Root);
    fs::create_dir_all(ws.lower().join("src/deep")).unwrap();
    std::os::unix::fs::symlink("/etc", ws.lower().join("out")).unwrap();
    std::os::unix::fs::symlink("src/deep", ws.lower().join("in")).unwrap();
    let lower = s(ws.lower());
    let out = run(&[
        "--lower",
        lower,
        "--ephemeral",
        "--cwd",
        "src/deep",
        "--",
        "pwd",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // The workspace is at /workspace in the sandbox now, not at its host
    // mountpoint's path (issue 19): --cwd is relative to that.
    assert_eq!(
        stdout(&out).trim_end(),
        "/workspace/src/deep",
        "{}",
        text(&out)
    );
    let out = run(&["--lower", lower, "--ephemeral", "--cwd", "in", "--", "ls"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a link inside is fine: {}",
        text(&out)
    );
    for (cwd, says) in [
        ("..", "leaves the workspace"),
        ("src/../../x", "leaves the workspace"),
        ("/etc", "absolute path"),
        ("out", "through a symlink"),
        ("nope", "no such directory"),
    ] {
        let out = run(&[
            "--lower",
            lower,
            "--ephemeral",
            "--json",
            "--cwd",
            cwd,
            "--",
            "touch",
            "ran",
        ]);
        assert_eq!(out.status.code(), Some(2), "--cwd {cwd}: {}", text(&out));
        assert!(stderr(&out).contains(says), "--cwd {cwd}: {}", text(&out));
        assert!(json_of(&out)["error"].as_str().unwrap().contains(says));
        if matches!(cwd, "out" | "nope") {
            // Refused inside the sandbox, after mounting: cleaned up too.
            assert_cleaned_up(&out);
        }
    }
}

/// Inside the sandbox, tries writing each path and prints `ok PATH` or
/// `fail PATH: ERROR`.
fn probe_script(paths: &[&Path]) -> String {
    let list: Vec<String> = paths.iter().map(|p| format!("'{}'", p.display())).collect();
    format!(
        "for p in {}; do if e=$( (echo x > \"$p\") 2>&1 ); then echo \"ok $p\"; \
         else echo \"fail $p: $e\"; fi; done",
        list.join(" ")
    )
}

fn outcome_of<'a>(out: &'a str, p: &Path) -> &'a str {
    let key = format!(" {}", p.display());
    out.lines()
        .find(|l| l.contains(&format!("{key}:")) || l.ends_with(&key))
        .unwrap_or_else(|| panic!("no line for {}: {out}", p.display()))
}

fn only_the_workspace_is_writable(caller: Caller) {
    let ws = workspace_for(caller);
    fs::write(ws.lower().join("shared.txt"), "shared\n").unwrap();
    if caller == Caller::Tests {
        let (uid, gid) = tests_ids();
        chown_tree(ws.dir.path(), uid, gid);
    }
    let mnt = run_mountpoint(&ws.upper);
    let tag = format!("{}-{}", std::process::id(), caller as u8);
    let outside = [
        PathBuf::from(format!("/etc/layerfs-probe-{tag}")),
        PathBuf::from(format!("/usr/layerfs-probe-{tag}")),
        PathBuf::from(format!("/var/tmp/layerfs-probe-{tag}")),
        ws.lower().join("direct.txt"),
        ws.upper.join("direct.txt"),
        ws.dir.path().join("beside.txt"),
        PathBuf::from("/dev/layerfs-probe"),
        // The host mountpoint's path is hidden: the workspace is reached
        // at /workspace only.
        mnt.join("via-host-path.txt"),
    ];
    let inside = [
        PathBuf::from("/workspace/new.txt"),
        PathBuf::from("/workspace/shared.txt"),
        PathBuf::from(format!("/tmp/private-{tag}")),
        PathBuf::from(format!("/dev/shm/private-{tag}")),
    ];
    let root_home = PathBuf::from(format!("/root/layerfs-probe-{tag}"));
    let mut all: Vec<&Path> = outside.iter().map(|p| p.as_path()).collect();
    all.extend(inside.iter().map(|p| p.as_path()));
    all.push(&root_home);
    let mut script = probe_script(&all);
    // Neither can the command undo the read-only mounts.
    script.push_str(
        "; if mount -o remount,rw / 2>/dev/null || mount -o remount,bind,rw / 2>/dev/null; \
         then echo REMOUNTED; fi; id -u",
    );
    let out = sh_as(caller, &ws, false, &[], &script);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let o = stdout(&out);
    for p in &outside {
        let line = outcome_of(&o, p);
        assert!(
            line.contains("Read-only file system"),
            "{caller:?}: {line}\n{o}"
        );
    }
    for p in &inside {
        assert!(outcome_of(&o, p).starts_with("ok "), "{caller:?}: {o}");
    }
    let home = outcome_of(&o, &root_home);
    match caller {
        Caller::Root => assert!(home.contains("Read-only file system"), "{home}"),
        // /root is 0700: the search is refused before the write.
        Caller::Tests => assert!(home.contains("ermission denied"), "{home}"),
    }
    assert!(!o.contains("REMOUNTED"), "{o}");
    let want_uid = match caller {
        Caller::Root => 0,
        Caller::Tests => tests_ids().0,
    };
    assert_eq!(o.lines().last().unwrap(), want_uid.to_string(), "{o}");

    // The writes through the workspace are in the upper, owned by the caller.
    assert_eq!(fs::read_to_string(ws.upper.join("new.txt")).unwrap(), "x\n");
    assert_eq!(
        fs::read_to_string(ws.upper.join("shared.txt")).unwrap(),
        "x\n"
    );
    assert_eq!(
        fs::metadata(ws.upper.join("new.txt")).unwrap().uid(),
        want_uid
    );
    assert_eq!(
        fs::read_to_string(ws.lower().join("shared.txt")).unwrap(),
        "shared\n"
    );
    for p in outside.iter().chain([&inside[2], &inside[3], &root_home]) {
        assert!(!p.exists(), "{} exists on the host", p.display());
    }
    // /tmp was the sandbox's own: a second run starts with an empty one.
    let out = sh_as(
        caller,
        &ws,
        false,
        &[],
        "ls -A /tmp | grep -v '^layerfs-run' | wc -l",
    );
    assert_eq!(stdout(&out).trim(), "0", "{}", text(&out));
    assert!(!is_mounted(&mnt));
    assert!(!mnt.exists(), "the run's mountpoint dir is removed again");
}

#[test]
fn as_root_only_the_workspace_is_writable() {
    only_the_workspace_is_writable(Caller::Root);
}

#[test]
fn as_an_unprivileged_user_only_the_workspace_is_writable() {
    only_the_workspace_is_writable(Caller::Tests);
}

#[test]
fn an_ephemeral_upper_is_removed_unless_kept() {
    for caller in [Caller::Root, Caller::Tests] {
        let ws = workspace_for(caller);
        let lower = s(ws.lower());
        // A directory left without write permission is removed too.
        let script = "echo e > made; mkdir -p ro/sub && chmod 0555 ro/sub ro";
        let out = sh_as(caller, &ws, true, &["--json"], script);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let upper = PathBuf::from(json_of(&out)["upper"].as_str().unwrap());
        let dir = upper.parent().unwrap().to_path_buf();
        assert!(s(&dir).contains("layerfs-run."), "{}", dir.display());
        assert!(!dir.exists(), "{} is left", dir.display());

        let out = sh_as(caller, &ws, true, &["--keep", "--json"], "echo k > made");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let upper = PathBuf::from(json_of(&out)["upper"].as_str().unwrap());
        let dir = upper.parent().unwrap().to_path_buf();
        assert!(stderr(&out).contains(&format!("kept the workspace in {}", dir.display())));
        assert_eq!(fs::read_to_string(upper.join("made")).unwrap(), "k\n");
        assert!(!ws.lower().join("made").exists());
        // The kept workspace is an ordinary unmounted one.
        let diff = Command::new(bin())
            .arg("diff")
            .arg(&upper)
            .output()
            .unwrap();
        assert_eq!(stdout(&diff), "A made\n", "{}", text(&diff));
        assert!(!dir.join("mnt").exists() && !dir.join("stage").exists());
        assert!(!is_mounted(&dir.join("mnt")));
        // A later run leaves a kept directory alone.
        let out = run_as(caller, &["--lower", lower, "--ephemeral", "--", "true"]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(upper.join("made").exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn a_killed_runs_temporary_dir_is_swept_by_the_next_run() {
    let ws = workspace_for(Caller::Root);
    let lower = s(ws.lower());
    let mut cmd = run_cmd(
        Caller::Root,
        &[
            "--lower",
            lower,
            "--ephemeral",
            "--",
            "sh",
            "-c",
            "echo up > up; exec sleep 3132.5",
        ],
    );
    cmd.env("TMPDIR", ws.dir.path());
    let r = Running::start(cmd);
    let found = eventually(Duration::from_secs(20), || {
        fs::read_dir(ws.dir.path()).unwrap().flatten().any(|e| {
            e.file_name().to_string_lossy().starts_with("layerfs-run.")
                && e.path().join("upper/up").exists()
        })
    });
    assert!(found, "the command never started");
    let pid = r.pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = r.finish(Duration::from_secs(10));
    // The daemon unmounts on its parent's death; the sandbox dies with it.
    assert!(
        eventually(Duration::from_secs(10), || {
            let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
            !info.contains(s(ws.dir.path()))
        }),
        "the workspace stayed mounted"
    );
    assert!(eventually(Duration::from_secs(10), || {
        let o = Command::new("pgrep")
            .args(["-f", "sleep 3132.5"])
            .output()
            .unwrap();
        stdout(&o).trim().is_empty()
    }));
    let left = |d: &Path| {
        fs::read_dir(d)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("layerfs-run."))
            .count()
    };
    assert_eq!(
        left(ws.dir.path()),
        1,
        "the killed run's directory is there"
    );
    let mut next = run_cmd(
        Caller::Root,
        &["--lower", lower, "--ephemeral", "--", "true"],
    );
    next.env("TMPDIR", ws.dir.path());
    let out = Running::start(next).finish(Duration::from_secs(60));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(left(ws.dir.path()), 0, "the stale directory was swept");
}

#[test]
fn a_live_mount_of_the_upper_is_used_and_left_mounted() {
    let ws = workspace_for(Caller::Root);
    fs::write(ws.lower().join("shared.txt"), "shared\n").unwrap();
    let m = ws.mount();
    let script = "pwd; cat shared.txt; echo from-run > run.txt";
    let out = sh_as(Caller::Root, &ws, false, &["--json"], script);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(json_of(&out)["mountpoint"], s(&ws.mnt));
    // The live mount, too, is seen at /workspace (issue 19), not at its
    // host path.
    assert!(
        stdout(&out).starts_with("/workspace\nshared\n"),
        "{}",
        text(&out)
    );
    assert!(is_mounted(&ws.mnt), "the live mount was left alone");
    assert_eq!(fs::read_to_string(m.p("run.txt")).unwrap(), "from-run\n");
    assert!(!run_mountpoint(&ws.upper).exists());

    // Other lowers or another policy than the live mount's are refused.
    let other = ws.dir.path().join("other");
    fs::create_dir(&other).unwrap();
    let out = run(&["--lower", s(&other), "--upper", s(&ws.upper), "--", "true"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        stderr(&out).contains("give the same --lower list"),
        "{}",
        text(&out)
    );
    let policy = ws.dir.path().join("policy");
    fs::write(&policy, "hide **/.env\n").unwrap();
    let out = run(&[
        "--lower",
        s(ws.lower()),
        "--upper",
        s(&ws.upper),
        "--policy",
        s(&policy),
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(stderr(&out).contains("not --policy"), "{}", text(&out));
    assert!(is_mounted(&ws.mnt));
    assert!(m.unmount());
}

fn sigterm_unmounts(caller: Caller) {
    let ws = workspace_for(caller);
    let mnt = run_mountpoint(&ws.upper);
    let _fuse = (caller == Caller::Tests).then(OpenFuse::new);
    let r = Running::start(run_cmd(
        caller,
        &[
            "--lower",
            s(ws.lower()),
            "--upper",
            s(&ws.upper),
            "--json",
            "--",
            "sh",
            "-c",
            "echo up > up; exec sleep 3133.5",
        ],
    ));
    assert!(
        eventually(Duration::from_secs(20), || ws.upper.join("up").exists()),
        "the command never started"
    );
    assert!(is_mounted(&mnt));
    // setpriv execs layerfs, so the pid is layerfs run's either way.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(r.pid()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = r.finish(Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(143), "{}", text(&out));
    assert_eq!(json_of(&out)["signal"], 15);
    assert!(!is_mounted(&mnt), "{caller:?}: still mounted after SIGTERM");
    let o = Command::new("pgrep")
        .args(["-f", "sleep 3133.5"])
        .output()
        .unwrap();
    assert!(stdout(&o).trim().is_empty(), "{}", stdout(&o));
}

#[test]
fn sigterm_stops_the_command_and_still_unmounts() {
    sigterm_unmounts(Caller::Root);
    sigterm_unmounts(Caller::Tests);
}

#[test]
fn a_terminal_ctrl_c_reaches_the_command_once_and_unmounts() {
    let ws = workspace_for(Caller::Root);
    let mnt = run_mountpoint(&ws.upper);
    // `script` gives layerfs run a terminal; ^C written to it makes the
    // terminal send SIGINT to the whole foreground group. `script` starts
    // the command with `$SHELL -c`; `exec` leaves no shell in that group,
    // whose own SIGINT handling differs between shells (dash dies of it),
    // and `script -e` passes layerfs run's exit code on.
    let inner = format!(
        "exec {} run --lower {} --upper {} -- sh -c 'trap \"echo INT; exit 9\" INT; echo up > up; \
         sleep 3134.5 & wait'",
        bin().display(),
        ws.lower().display(),
        ws.upper.display()
    );
    // With SIGINT at its default even when the suite itself was started
    // ignoring it (a `&` job): an ignored SIGINT is inherited, and
    // `layerfs run` rightly keeps it ignored for the command.
    let mut child = Command::new("env")
        .args([
            "--default-signal=INT",
            "script",
            "-qfec",
            &inner,
            "/dev/null",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("run script(1)");
    let _guard = KillGroup(child.id() as i32);
    assert!(
        eventually(Duration::from_secs(20), || ws.upper.join("up").exists()),
        "the command never started"
    );
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"\x03").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let o = stdout(&out);
    assert_eq!(o.matches("INT").count(), 1, "one SIGINT, not two: {o}");
    assert_eq!(out.status.code(), Some(9), "{o}");
    assert!(!is_mounted(&mnt));
}

/// Kills a process group when dropped.
pub(crate) struct KillGroup(pub(crate) i32);

impl Drop for KillGroup {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.0),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

#[test]
fn no_network_leaves_only_loopback() {
    for caller in [Caller::Root, Caller::Tests] {
        let ws = workspace_for(caller);
        let script = "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '; echo --; \
                      ls /sys/class/net";
        let out = sh_as(caller, &ws, true, &["--no-network"], script);
        assert_eq!(out.status.code(), Some(0), "{caller:?}: {}", text(&out));
        assert_eq!(stdout(&out), "lo\n--\nlo\n", "{caller:?}: {}", text(&out));
        // Loopback is up: a socket can listen and be reached on 127.0.0.1.
        let out = run_as(
            caller,
            &[
                "--lower",
                s(ws.lower()),
                "--ephemeral",
                "--no-network",
                "--",
                "python3",
                "-c",
                "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); \
                 c=socket.create_connection(s.getsockname()); print('connected')",
            ],
        );
        assert_eq!(stdout(&out), "connected\n", "{caller:?}: {}", text(&out));
    }
    // By default the host's network is shared: its interfaces show.
    let ws = workspace_for(Caller::Root);
    let host = fs::read_to_string("/proc/net/dev").unwrap().lines().count();
    let out = run(&[
        "--lower",
        s(ws.lower()),
        "--ephemeral",
        "--",
        "cat",
        "/proc/net/dev",
    ]);
    assert_eq!(stdout(&out).lines().count(), host, "{}", text(&out));
}

#[test]
fn without_user_namespaces_an_unprivileged_run_says_why_before_mounting() {
    let ws = workspace_for(Caller::Tests);
    let (uid, gid) = tests_ids();
    // A user namespace whose limit for namespaces below it is 0: inside
    // it, `tests` cannot create one, as on a machine that forbids them.
    let inner = format!(
        "read go; exec sh -c 'echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv \
         --reuid={uid} --regid={gid} --clear-groups {bin} run --lower {lower} --upper {upper} \
         -- true'",
        bin = bin().display(),
        lower = ws.lower().display(),
        upper = ws.upper.display()
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &inner])
        .env("RUST_LOG", "warn")
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: unshare is a plain system call, async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map_err(Into::into)
        });
    }
    let mut child = cmd.spawn().expect("start a user namespace");
    let pid = child.id();
    fs::write(format!("/proc/{pid}/uid_map"), "0 0 4294967295").unwrap();
    fs::write(format!("/proc/{pid}/gid_map"), "0 0 4294967295").unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let e = stderr(&out);
    assert!(
        e.contains("cannot create a user namespace") && e.contains("max_user_namespaces"),
        "{e}"
    );
    assert!(!run_mountpoint(&ws.upper).exists(), "nothing was mounted");
}
