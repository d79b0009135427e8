//! mount(8) and fstab through `mount.fuse.layerfs`: real `mount -t
//! fuse.layerfs` and fstab lines, run by util-linux's mount and umount.
//!
//! mount(8) looks for its helper only as `/sbin/mount.fuse.layerfs`, so
//! each test runs in a private mount namespace (`unshare --mount`) where
//! a read-only kernel overlay puts a temporary directory holding the
//! helper link (made by `layerfs install-helpers --dir`) over /sbin, and
//! where the test's fstab is bind-mounted over /etc/fstab. Nothing is
//! installed on the machine; the mounts exist only in the namespace. A
//! guard ends any daemon the test started (found by its workspace path
//! on its command line) and drops libmount's utab lines for the test's
//! mountpoints, should the script stop half-way.

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use layerfs::host::pidfile;

use crate::daemon::{text, DevFuseOpen, DEV_FUSE};
use crate::harness::{bin, eventually, Workspace};

/// Ends what a namespace script left behind under `root` (a test's own
/// temporary directory): daemons serving mounts below it and utab lines
/// naming it.
struct NsGuard {
    root: PathBuf,
}

impl Drop for NsGuard {
    fn drop(&mut self) {
        // With the trailing slash: only paths inside this test's directory.
        let root = format!("{}/", self.root.display());
        for pid in daemons_under(&root) {
            // SAFETY: signalling a daemon this test started (its command
            // line names the test's temporary directory).
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            if !eventually(Duration::from_secs(5), || !pidfile::is_daemon_alive(pid)) {
                // SAFETY: as above.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        drop_utab_lines(&root);
    }
}

/// Live layerfs daemons whose command line mentions `root`.
fn daemons_under(root: &str) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(dir) = fs::read_dir("/proc") else {
        return found;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(root) && pidfile::is_daemon_alive(pid) {
            found.push(pid);
        }
    }
    found
}

/// Removes libmount's utab lines that name `root`, under its lock.
fn drop_utab_lines(root: &str) {
    let utab = Path::new("/run/mount/utab");
    let Ok(text) = fs::read_to_string(utab) else {
        return;
    };
    if !text.contains(root) {
        return;
    }
    let Ok(lock) = fs::File::create("/run/mount/utab.lock") else {
        return;
    };
    // SAFETY: flock on a descriptor this function owns.
    unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
    if let Ok(text) = fs::read_to_string(utab) {
        let kept: String = text
            .lines()
            .filter(|l| !l.contains(root))
            .map(|l| format!("{l}\n"))
            .collect();
        let _ = fs::write(utab, kept);
    }
}

/// A test's helper directory: `layerfs install-helpers --dir` links
/// mount.fuse.layerfs there; returns the directory.
fn install_helper(ws: &Workspace) -> PathBuf {
    let dir = ws.dir.path().join("sbin");
    fs::create_dir(&dir).unwrap();
    let out = Command::new(bin())
        .args(["install-helpers", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "install-helpers: {}", text(&out));
    let link = dir.join("mount.fuse.layerfs");
    assert_eq!(
        fs::canonicalize(&link).unwrap(),
        fs::canonicalize(bin()).unwrap()
    );
    dir
}

/// Runs `script` with bash in a private mount namespace in which
/// `helpers` shows at /sbin and `fstab` (if given) at /etc/fstab.
fn in_namespace(ws: &Workspace, helpers: &Path, fstab: Option<&Path>, script: &str) -> Output {
    let sbin = fs::canonicalize("/sbin").unwrap();
    let mut prelude = format!(
        "set -eu\nmount -t overlay layerfs-test-helpers -o ro,lowerdir={}:{} {}\n",
        helpers.display(),
        sbin.display(),
        sbin.display()
    );
    if let Some(f) = fstab {
        prelude.push_str(&format!("mount --bind {} /etc/fstab\n", f.display()));
    }
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "bash", "-c"])
        .arg(format!("{prelude}{script}"))
        .current_dir(ws.dir.path())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run unshare");
    out
}

/// The value of `KEY=` lines a script printed, in order.
fn values(out: &Output, key: &str) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
        .collect()
}

fn value(out: &Output, key: &str) -> String {
    values(out, key)
        .pop()
        .unwrap_or_else(|| panic!("the script printed no {key}=: {}", text(out)))
}

/// Shell lines printing the daemon of `mnt` (pid and process name) and its
/// mountinfo line, as `PID=`, `COMM=`, `MOUNTINFO=`.
fn report(mnt: &Path) -> String {
    let pidf = Path::new("/run/layerfs/pid").join(pidfile::file_name(mnt));
    format!(
        "pid=$(head -1 {pidf}); echo PID=$pid; echo COMM=$(cat /proc/$pid/comm)\n\
         echo MOUNTINFO=$(grep ' {mnt} ' /proc/self/mountinfo)\n",
        pidf = quote(&pidf),
        mnt = mnt.display()
    )
}

/// `p` single-quoted for the shell (pid file names hold backslashes).
fn quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

fn assert_daemon_exits(out: &Output, key: &str) {
    for pid in values(out, key) {
        let pid: u32 = pid.parse().unwrap();
        assert!(
            eventually(Duration::from_secs(10), || !pidfile::is_daemon_alive(pid)),
            "daemon {pid} still runs after umount: {}",
            text(out)
        );
    }
}

fn populate(ws: &Workspace) {
    fs::write(ws.lowers[0].join("top.txt"), "from the top lower\n").unwrap();
    fs::write(ws.lowers[1].join("base.txt"), "from the base lower\n").unwrap();
    fs::write(ws.lowers[1].join(".env"), "SECRET=1\n").unwrap();
}

#[test]
fn mount_t_fuse_layerfs_with_a_minimal_path_then_umount_stops_the_daemon() {
    let ws = Workspace::with_lowers(2);
    let _guard = NsGuard {
        root: ws.dir.path().to_path_buf(),
    };
    populate(&ws);
    let helpers = install_helper(&ws);
    let opts = format!(
        "lowerdir={}:{},upperdir={},workdir={},_netdev,nofail,x-systemd.requires=remote-fs.target",
        ws.lowers[0].display(),
        ws.lowers[1].display(),
        ws.upper.display(),
        ws.work.display()
    );
    // An empty environment but for a PATH that leads nowhere: mount(8)
    // finds the helper by its absolute path.
    let script = format!(
        "env -i PATH=/nonexistent /usr/bin/mount -t fuse.layerfs -o {opts} layerfs {mnt}\n\
         {report}\
         echo TOP=$(cat {mnt}/top.txt); echo BASE=$(cat {mnt}/base.txt)\n\
         echo written > {mnt}/new.txt\n\
         env -i PATH=/nonexistent /usr/bin/umount {mnt}\n\
         echo AFTER=$(grep -c ' {mnt} ' /proc/self/mountinfo || true)\n",
        mnt = ws.mnt.display(),
        report = report(&ws.mnt),
    );
    let out = in_namespace(&ws, &helpers, None, &script);
    assert!(out.status.success(), "{}", text(&out));
    let info = value(&out, "MOUNTINFO");
    assert!(
        info.contains(" - fuse.layerfs layerfs "),
        "mountinfo: {info}"
    );
    assert_eq!(value(&out, "COMM"), "layerfs");
    assert_eq!(value(&out, "TOP"), "from the top lower");
    assert_eq!(value(&out, "BASE"), "from the base lower");
    assert_eq!(value(&out, "AFTER"), "0");
    assert_daemon_exits(&out, "PID");
    assert_eq!(
        fs::read_to_string(ws.upper.join("new.txt")).unwrap(),
        "written\n"
    );
    assert!(!ws.lowers[0].join("new.txt").exists());
}

#[test]
fn fstab_lines_mount_by_mountpoint_and_mount_a_skips_noauto() {
    let ws = Workspace::with_lowers(2);
    let _guard = NsGuard {
        root: ws.dir.path().to_path_buf(),
    };
    populate(&ws);
    let helpers = install_helper(&ws);
    // A second workspace over the same lowers, marked noauto.
    let upper2 = ws.dir.path().join("upper2");
    let mnt2 = ws.dir.path().join("mnt2");
    fs::create_dir(&upper2).unwrap();
    fs::create_dir(&mnt2).unwrap();
    let policy = ws.dir.path().join("policy");
    fs::write(&policy, "hide **/.env\n").unwrap();
    let state = ws.dir.path().join("state");
    let lowerdir = format!("{}:{}", ws.lowers[0].display(), ws.lowers[1].display());
    let fstab = ws.dir.path().join("fstab");
    fs::write(
        &fstab,
        format!(
            "# layerfs workspaces\n\
             layerfs {mnt} fuse.layerfs lowerdir={lowerdir},upperdir={upper},workdir={work},\
             state={state},policy={policy},allow_other,_netdev,x-systemd.requires=remote-fs.target 0 0\n\
             layerfs {mnt2} fuse.layerfs lowerdir={lowerdir},upperdir={upper2},noauto 0 0\n",
            mnt = ws.mnt.display(),
            upper = ws.upper.display(),
            work = ws.work.display(),
            state = state.display(),
            policy = policy.display(),
            upper2 = upper2.display(),
            mnt2 = mnt2.display(),
        ),
    )
    .unwrap();
    let script = format!(
        "mount -a\n\
         echo AUTO=$(grep -c ' {mnt} ' /proc/self/mountinfo || true)\n\
         echo NOAUTO=$(grep -c ' {mnt2} ' /proc/self/mountinfo || true)\n\
         mount -a\n\
         echo AUTO_AGAIN=$(grep -c ' {mnt} ' /proc/self/mountinfo || true)\n\
         {report}\
         echo ENV_HIDDEN=$(test -e {mnt}/.env && echo no || echo yes)\n\
         echo STATE=$(ls {state})\n\
         echo one > {mnt}/one.txt\n\
         mount {mnt2}\n\
         {report2}\
         echo two > {mnt2}/two.txt\n\
         umount {mnt}\n\
         {bin} umount {mnt2}\n\
         echo LEFT=$(awk -v r={root}/ 'index($5, r) == 1' /proc/self/mountinfo | wc -l)\n",
        mnt = ws.mnt.display(),
        mnt2 = mnt2.display(),
        state = state.display(),
        report = report(&ws.mnt),
        report2 = report(&mnt2),
        bin = bin().display(),
        root = ws.dir.path().display(),
    );
    let out = in_namespace(&ws, &helpers, Some(&fstab), &script);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(value(&out, "AUTO"), "1", "{}", text(&out));
    assert_eq!(value(&out, "NOAUTO"), "0", "noauto mounted: {}", text(&out));
    assert_eq!(value(&out, "AUTO_AGAIN"), "1", "mount -a mounted twice");
    assert_eq!(value(&out, "ENV_HIDDEN"), "yes", "policy= not applied");
    assert!(
        value(&out, "STATE").contains("journal.db"),
        "state= not used"
    );
    let infos = values(&out, "MOUNTINFO");
    assert!(
        infos[0].contains("allow_other"),
        "allow_other not applied: {}",
        infos[0]
    );
    assert_eq!(value(&out, "LEFT"), "0", "mounts left: {}", text(&out));
    assert_daemon_exits(&out, "PID");
    assert_eq!(
        fs::read_to_string(ws.upper.join("one.txt")).unwrap(),
        "one\n"
    );
    assert_eq!(fs::read_to_string(upper2.join("two.txt")).unwrap(), "two\n");
    let utab = fs::read_to_string("/run/mount/utab").unwrap_or_default();
    assert!(
        !utab.contains(&ws.dir.path().display().to_string()),
        "umount left utab lines: {utab}"
    );
}

#[test]
fn a_user_fstab_line_lets_an_unprivileged_user_mount_and_umount() {
    let _serial = DEV_FUSE.lock().unwrap_or_else(|e| e.into_inner());
    let ws = Workspace::new();
    let _guard = NsGuard {
        root: ws.dir.path().to_path_buf(),
    };
    fs::write(ws.lower().join("shared.txt"), "shared\n").unwrap();
    let script = ws.lower().join("x.sh");
    fs::write(&script, "#!/bin/sh\necho ran\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let helpers = install_helper(&ws);
    fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let tests = nix::unistd::User::from_name("tests")
        .unwrap()
        .expect("the `tests` user (useradd -M tests, as .ci/run does)");
    for d in [&ws.upper, &ws.mnt] {
        std::os::unix::fs::chown(d, Some(tests.uid.as_raw()), Some(tests.gid.as_raw())).unwrap();
    }
    // The work and state dirs default to siblings of the upper, in a
    // directory the user cannot write: name ones the user owns.
    let own = ws.dir.path().join("own");
    fs::create_dir(&own).unwrap();
    std::os::unix::fs::chown(&own, Some(tests.uid.as_raw()), Some(tests.gid.as_raw())).unwrap();
    let fstab = ws.dir.path().join("fstab");
    fs::write(
        &fstab,
        format!(
            "layerfs {mnt} fuse.layerfs lowerdir={lower},upperdir={upper},workdir={own}/work,\
             state={own}/state,noauto,user 0 0\n",
            mnt = ws.mnt.display(),
            lower = ws.lower().display(),
            upper = ws.upper.display(),
            own = own.display(),
        ),
    )
    .unwrap();
    let _dev = DevFuseOpen::new();
    let as_tests = "setpriv --reuid=tests --regid=tests --clear-groups";
    let pidf =
        PathBuf::from(format!("/run/user/{}/layerfs", tests.uid)).join(pidfile::file_name(&ws.mnt));
    let pidf_tmp =
        PathBuf::from(format!("/tmp/layerfs-{}", tests.uid)).join(pidfile::file_name(&ws.mnt));
    let script = format!(
        "{as_tests} mount {mnt}\n\
         echo MOUNTINFO=$(grep ' {mnt} ' /proc/self/mountinfo)\n\
         echo PID=$(head -1 {pidf} 2>/dev/null || head -1 {pidf_tmp})\n\
         echo SHARED=$({as_tests} cat {mnt}/shared.txt)\n\
         {as_tests} sh -c 'echo mine > {mnt}/mine.txt'\n\
         echo EXEC=$({as_tests} {mnt}/x.sh 2>&1 || true)\n\
         {as_tests} umount {mnt}\n\
         echo AFTER=$(grep -c ' {mnt} ' /proc/self/mountinfo || true)\n",
        mnt = ws.mnt.display(),
        pidf = quote(&pidf),
        pidf_tmp = quote(&pidf_tmp),
    );
    let out = in_namespace(&ws, &helpers, Some(&fstab), &script);
    assert!(out.status.success(), "{}", text(&out));
    let info = value(&out, "MOUNTINFO");
    assert!(
        info.contains(&format!("user_id={}", tests.uid)),
        "not mounted by the user: {info}"
    );
    // fstab's `user` implies noexec (mount(8) passes it to the helper).
    assert!(info.contains("noexec"), "noexec not applied: {info}");
    assert!(
        value(&out, "EXEC").contains("Permission denied"),
        "{}",
        text(&out)
    );
    assert_eq!(value(&out, "SHARED"), "shared");
    assert_eq!(value(&out, "AFTER"), "0");
    assert_daemon_exits(&out, "PID");
    let mine = ws.upper.join("mine.txt");
    assert_eq!(fs::read_to_string(&mine).unwrap(), "mine\n");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(fs::metadata(&mine).unwrap().uid(), tests.uid.as_raw());
}

#[test]
fn bad_mount_options_are_refused_naming_them_and_nothing_is_mounted() {
    let ws = Workspace::new();
    let _guard = NsGuard {
        root: ws.dir.path().to_path_buf(),
    };
    let helpers = install_helper(&ws);
    let base = format!(
        "lowerdir={},upperdir={}",
        ws.lower().display(),
        ws.upper.display()
    );
    let missing = ws.dir.path().join("missing");
    let script = format!(
        "try() {{ if mount -t fuse.layerfs -o \"$2\" layerfs {mnt} 2>err; then echo $1=0; \
         else echo $1=$?; fi; echo $1_ERR=$(cat err); }}\n\
         try UNKNOWN '{base},frobnicate=1'\n\
         try FLAGVALUE '{base},allow_other=yes'\n\
         try THREADS '{base},threads=many'\n\
         try NOUPPER 'lowerdir={lower}'\n\
         try MISSING 'lowerdir={missing},upperdir={upper}'\n\
         echo MOUNTED=$(grep -c ' {mnt} ' /proc/self/mountinfo || true)\n",
        mnt = ws.mnt.display(),
        lower = ws.lower().display(),
        upper = ws.upper.display(),
        missing = missing.display(),
    );
    let out = in_namespace(&ws, &helpers, None, &script);
    assert!(out.status.success(), "{}", text(&out));
    let expect = [
        ("UNKNOWN", "1", "unknown mount option `frobnicate=1`"),
        ("FLAGVALUE", "1", "allow_other is a flag and takes no value"),
        ("THREADS", "1", "`many` is not a number of threads"),
        ("NOUPPER", "1", "no upper layer"),
        ("MISSING", "32", "does not exist"),
    ];
    for (key, code, needle) in expect {
        assert_eq!(value(&out, key), code, "{key}: {}", text(&out));
        let err = value(&out, &format!("{key}_ERR"));
        assert!(
            err.starts_with("mount.fuse.layerfs: ") && err.contains(needle),
            "{key}: {err}"
        );
    }
    assert_eq!(value(&out, "MOUNTED"), "0");
}

/// The helper's own argv convention, run directly under its name.
fn helper(args: &[&str]) -> Output {
    Command::new(bin())
        .arg0("mount.fuse.layerfs")
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn the_helper_takes_mount_8_flags_fake_sloppy_type_and_namespace() {
    let ws = Workspace::new();
    let mnt = ws.mnt.display().to_string();
    let good = format!(
        "lowerdir={},upperdir={}",
        ws.lower().display(),
        ws.upper.display()
    );
    // -f checks and says, creates and mounts nothing.
    let out = helper(&["layerfs", &mnt, "-f", "-v", "-o", &good]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("would mount"));
    assert!(!ws.dir.path().join(".upper.layerfs-work").exists());
    let out = helper(&["layerfs", &mnt, "-f", "-o", "upperdir=/u"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // -s drops an unknown option with a warning.
    let sloppy = format!("{good},frob");
    let out = helper(&["layerfs", &mnt, "-s", "-f", "-o", &sloppy]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ignoring unknown mount option `frob`"));
    let out = helper(&["layerfs", &mnt, "-f", "-o", &sloppy]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let out = helper(&["layerfs", &mnt, "-t", "fuse.sshfs", "-o", &good]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("mounts only fuse.layerfs"));
    let out = helper(&["layerfs", &mnt, "-N", "/proc/1/ns/mnt", "-o", &good]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not supported"));
    let out = helper(&["layerfs"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(!crate::harness::is_mounted(&ws.mnt));
}

#[test]
fn the_mount_fuse3_calling_convention_points_to_install_helpers() {
    let out = Command::new(bin())
        .args(["layerfs", "/mnt/ws", "-o", "lowerdir=/a,upperdir=/u"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("layerfs install-helpers"), "{err}");
    assert!(err.contains("/sbin/mount.fuse.layerfs"), "{err}");
    // A mistyped subcommand is only that.
    let out = Command::new(bin())
        .args(["mout", "/mnt/ws"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("install-helpers"));
}

#[test]
fn install_helpers_links_replaces_only_with_force_and_removes_its_own_link() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(bin())
            .arg("install-helpers")
            .arg("--dir")
            .arg(dir.path())
            .args(args)
            .output()
            .unwrap()
    };
    let link = dir.path().join("mount.fuse.layerfs");
    let out = run(&[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        fs::canonicalize(&link).unwrap(),
        fs::canonicalize(bin()).unwrap()
    );
    let out = run(&[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("already installed"));
    let out = run(&["--remove"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(fs::symlink_metadata(&link).is_err());

    // Someone else's helper is kept unless --force.
    fs::write(&link, "#!/bin/sh\n").unwrap();
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    let out = run(&["--remove"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(link.exists());
    let out = run(&["--force"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());

    // A link to another program: the refusal says where it points and
    // the command that replaces (or removes) it.
    fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink("/bin/true", &link).unwrap();
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let dir_arg = format!("--dir {}", dir.path().display());
    assert!(
        err.starts_with("layerfs install-helpers: ")
            && err.contains("is a link to /bin/true")
            && err.contains(&format!("install-helpers {dir_arg} --force`")),
        "{err}"
    );
    let out = run(&["--remove"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is a link to /bin/true")
            && err.contains(&format!("install-helpers {dir_arg} --remove --force`")),
        "{err}"
    );
    assert_eq!(fs::read_link(&link).unwrap(), Path::new("/bin/true"));
    let out = Command::new(bin())
        .args(["install-helpers", "--dir", "/nonexistent-dir"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
}
