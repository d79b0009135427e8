//! Modes of what callers create: the caller's umask (and a parent's default
//! ACL) decide, exactly as on a local filesystem; the daemon's own umask
//! never shows. Every creating operation is run under umask 000, 002, 022
//! and 077, in a lower directory and in a new one, through the mount and
//! on a local directory with the same tree, and the results compared.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use crate::harness::*;

/// The shared tree, made in the lower and in the local reference dir.
fn seed(root: &Path) {
    fs::create_dir(root.join("shared")).unwrap();
    fs::set_permissions(root.join("shared"), fs::Permissions::from_mode(0o777)).unwrap();
    for (name, mode) in [
        ("open666", 0o666),
        ("exec777", 0o777),
        ("private600", 0o600),
    ] {
        let p = root.join("shared").join(name);
        fs::write(&p, "shared\n").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    }
    for u in UMASKS {
        let d = root.join("shared").join(format!("sub{u}"));
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
    }
}

const UMASKS: [&str; 4] = ["000", "002", "022", "077"];

/// Every creating operation under each umask, in `shared` (a lower
/// directory through the mount) and in a new directory; then the modes.
const SCRIPT: &str = r#"
set -e
for u in 000 002 022 077; do
  (umask $u; mkdir new$u)
  for d in shared new$u; do
    (
      umask $u
      touch $d/touch$u
      echo data > $d/echo$u
      mkfifo $d/fifo$u
      python3 -c 'import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' $d/sock$u
      mkdir $d/dir$u
      mkdir -p $d/deep$u/a/b
      ln -s target $d/link$u
      ln $d/touch$u $d/hard$u
      cp /etc/hostname $d/cp$u
      echo more >> shared/open666
      echo more >> shared/exec777
      echo more >> shared/private600
    )
  done
  (umask $u; mv shared/sub$u shared/moved$u)
done
# Link counts of files only: a merged directory reports nlink 1, as on
# kernel overlayfs.
{ find . -type d -printf '%m %y %p\n'; find . ! -type d -printf '%m %y %n %p\n'; } | sort
"#;

fn modes_through(dir: &Path, runner: &[&str]) -> String {
    let out = Command::new(runner[0])
        .args(&runner[1..])
        .arg("bash")
        .arg("-c")
        .arg(SCRIPT)
        .current_dir(dir)
        .output()
        .expect("run the mode script");
    assert!(
        out.status.success(),
        "mode script failed in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn local_reference(ws: &Workspace, runner: &[&str]) -> String {
    let local = ws.dir.path().join("local");
    fs::create_dir(&local).unwrap();
    seed(&local);
    if runner[0] == "setpriv" {
        sh(ws.dir.path(), "chown -R 65534:65534 local");
        fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    }
    modes_through(&local, runner)
}

fn compare(ws: &Workspace, m: &Mount, runner: &[&str]) {
    let want = local_reference(ws, runner);
    let got = modes_through(m.path(), runner);
    assert_eq!(
        got, want,
        "modes through the mount differ from a local directory"
    );
    // Spot checks that the comparison itself means something.
    assert!(got.contains("666 f 2 ./new000/touch000"), "{got}");
    assert!(got.contains("664 f 1 ./shared/echo002"), "{got}");
    assert!(got.contains("600 f 1 ./new077/echo077"), "{got}");
    assert!(got.contains("775 d ./shared/dir002"), "{got}");
}

fn runner_root() -> Vec<&'static str> {
    vec!["env"]
}

#[test]
fn modes_follow_the_callers_umask_whatever_the_daemons() {
    for daemon_umask in [0o022, 0o077, 0o000] {
        let ws = Workspace::new();
        seed(ws.lower());
        let m = ws.mount_daemon_umask(&[], daemon_umask);
        compare(&ws, &m, &runner_root());
        // Modes as stored in the upper are the ones shown.
        let st = fs::metadata(ws.upper.join("new002/echo002")).unwrap();
        assert_eq!(
            st.permissions().mode() & 0o7777,
            0o664,
            "daemon umask {daemon_umask:o}"
        );
    }
}

#[test]
fn modes_follow_another_users_umask_with_allow_other() {
    let ws = Workspace::new();
    seed(ws.lower());
    sh(ws.dir.path(), "chown -R 65534:65534 lower0 upper");
    fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let m = ws.mount_daemon_umask(&["--allow-other"], 0o077);
    let runner = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    compare(&ws, &m, &runner);
}

/// A default ACL on the parent decides the mode instead of the umask, as
/// on a local filesystem.
#[test]
fn a_default_acl_replaces_the_umask() {
    let ws = Workspace::new();
    fs::create_dir(ws.lower().join("acl")).unwrap();
    let m = ws.mount_daemon_umask(&[], 0o022);
    let local = ws.dir.path().join("local");
    fs::create_dir(&local).unwrap();
    fs::create_dir(local.join("acl")).unwrap();
    let script = "setfacl -d -m u::rwx,g::rwx,o::rwx acl && mkdir acl2 && setfacl -d -m u::rw,g::rw,o::r acl2 && \
        (umask 077; touch acl/f; mkdir acl/d; mkfifo acl/p; touch acl2/f) && \
        stat -c '%a %n' acl/f acl/d acl/p acl2/f";
    let want = sh(&local, script);
    let got = sh(m.path(), script);
    assert_eq!(got, want);
    assert!(got.contains("666 acl/f"), "{got}");
}
