//! The container recipe of docs/operations.md ("Containers"): a live
//! workspace, mounted by root with `--allow-other`, bind-mounted into a sandbox with its own mount,
//! pid and user namespaces that runs as an unprivileged uid — once with
//! util-linux `unshare`, once with bubblewrap (`bwrap`, as container
//! runtimes build it). Inside, the kernel enforces the files' modes
//! (`default_permissions`): the sandbox's user cannot write root's 0644
//! file nor create in root's directory, and can write its own. Without
//! `--allow-other` the sandbox cannot even reach the workspace.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::harness::Workspace;
use crate::run::{chown_tree, tests_ids};

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A workspace whose lower holds root's `root-file` (0644) in root's root
/// directory, and `team/`, a directory of the user `tests`.
fn prepared() -> Workspace {
    let ws = Workspace::with_lowers_in(1, Path::new("/var/tmp"));
    fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(ws.lower().join("root-file"), "root's\n").unwrap();
    fs::set_permissions(
        ws.lower().join("root-file"),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let team = ws.lower().join("team");
    fs::create_dir(&team).unwrap();
    let (uid, gid) = tests_ids();
    chown_tree(&team, uid, gid);
    ws
}

/// What the sandbox does in the workspace (its working directory): each
/// step prints its result.
const WORK: &str = "id -u; cat root-file; \
    (echo x >> root-file) 2>/dev/null && echo wrote-root-file || echo root-file-denied; \
    (: > made-in-root) 2>/dev/null && echo created-in-root || echo root-dir-denied; \
    echo mine > team/mine.txt && cat team/mine.txt; \
    ls /proc | grep -c '^[0-9]'";

/// Checks the sandbox's report and the upper.
fn check(ws: &Workspace, out: &Output) {
    assert!(out.status.success(), "{}", text(out));
    let o = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = o.lines().collect();
    let (uid, _) = tests_ids();
    assert_eq!(
        &lines[..5],
        &[
            uid.to_string().as_str(),
            "root's",
            "root-file-denied",
            "root-dir-denied",
            "mine"
        ],
        "{}",
        text(out)
    );
    // Its own pid namespace: a handful of processes, not the host's.
    let procs: usize = lines[5].parse().unwrap();
    assert!(procs < 10, "{procs} processes visible: {}", text(out));
    let mine = ws.upper.join("team/mine.txt");
    assert_eq!(fs::metadata(&mine).unwrap().uid(), uid);
    assert_eq!(
        fs::read_to_string(ws.lower().join("root-file")).unwrap(),
        "root's\n"
    );
    assert!(!ws.upper.join("made-in-root").exists());
}

/// `cmd` run as the user `tests`.
fn as_tests(program: &str, args: &[String]) -> Output {
    let (uid, gid) = tests_ids();
    Command::new("setpriv")
        .args([
            format!("--reuid={uid}"),
            format!("--regid={gid}"),
            "--clear-groups".into(),
            "--".into(),
            program.into(),
        ])
        .args(args)
        .current_dir("/")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"))
}

/// bwrap arguments for a container-like root: the host's /usr, /etc and
/// its top-level links to them, new /proc, /dev and /tmp, the workspace at
/// /workspace.
fn bwrap_args(mnt: &Path) -> Vec<String> {
    let mut a: Vec<String> = [
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
        "--ro-bind",
        "/etc",
        "/etc",
    ]
    .map(String::from)
    .to_vec();
    for top in ["bin", "sbin", "lib", "lib64"] {
        let host = PathBuf::from("/").join(top);
        match fs::read_link(&host) {
            Ok(target) => a.extend([
                "--symlink".into(),
                target.display().to_string(),
                host.display().to_string(),
            ]),
            Err(_) if host.is_dir() => a.extend([
                "--ro-bind".into(),
                host.display().to_string(),
                host.display().to_string(),
            ]),
            Err(_) => {}
        }
    }
    a.extend(
        [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "--bind",
            mnt.to_str().unwrap(),
            "/workspace",
            "--chdir",
            "/workspace",
            "sh",
            "-c",
            WORK,
        ]
        .map(String::from),
    );
    a
}

#[test]
fn an_unshare_sandbox_works_in_an_allow_other_workspace_with_modes_enforced() {
    let ws = prepared();
    let m = ws.mount_with(&["--allow-other"]);
    let boxdir = ws.dir.path().join("box");
    fs::create_dir(&boxdir).unwrap();
    let (uid, gid) = tests_ids();
    chown_tree(&boxdir, uid, gid);
    // Root of a user namespace of its own (mapped to `tests`), it binds the
    // workspace into its private mount namespace, then drops to `tests`
    // inside a nested user namespace and works there.
    let script = format!(
        "mount --bind '{mnt}' '{b}' && exec unshare --user --map-user={uid} \
         --map-group={gid} sh -c \"cd '{b}' && {work}\"",
        mnt = m.path().display(),
        b = boxdir.display(),
        work = WORK.replace('"', "\\\"")
    );
    let out = as_tests(
        "unshare",
        &[
            "--user",
            "--map-root-user",
            "--mount",
            "--pid",
            "--fork",
            "--mount-proc",
            "sh",
            "-c",
            &script,
        ]
        .map(String::from),
    );
    check(&ws, &out);
    assert!(m.unmount());
}

#[test]
fn a_bubblewrap_container_works_in_an_allow_other_workspace_with_modes_enforced() {
    if Command::new("bwrap").arg("--version").output().is_err() {
        panic!("bwrap is missing: apt-get install bubblewrap (.ci/run does)");
    }
    let ws = prepared();
    let m = ws.mount_with(&["--allow-other"]);
    let out = as_tests("bwrap", &bwrap_args(m.path()));
    check(&ws, &out);
    assert!(m.unmount());
}

#[test]
fn without_allow_other_a_container_cannot_reach_the_workspace() {
    if Command::new("bwrap").arg("--version").output().is_err() {
        panic!("bwrap is missing: apt-get install bubblewrap (.ci/run does)");
    }
    let ws = prepared();
    let m = ws.mount();
    let out = as_tests("bwrap", &bwrap_args(m.path()));
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{}",
        text(&out)
    );
    assert!(!ws.upper.join("team/mine.txt").exists());
    assert!(m.unmount());
}
