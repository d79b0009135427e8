//! The systemd template unit `systemd/layerfs@.service`, checked without
//! systemd as pid 1 (it is not on these machines):
//!
//! - `systemd-analyze verify` of the template and of the instances
//!   `layerfs@alice` and `layerfs@alice@s42`, with no warning (the
//!   `ExecStart=` binary and the `Documentation=` man pages resolve: a
//!   private mount namespace shows the built binary at /usr/local/bin and
//!   MANPATH the generated pages);
//! - `systemd-analyze security --offline=true`: the exposure stays below
//!   `MAX_EXPOSURE` (the test prints the whole table) and the same unit
//!   without its hardening block scores far worse;
//! - no directive that gives the service its own mount namespace (the
//!   workspace would then be mounted only inside the service);
//! - the confinement the unit asks for, reproduced by hand: the unit's own
//!   `ExecStart=` runs under `setpriv --no-new-privs` with the unit's
//!   `CapabilityBoundingSet=`, traced by strace, while callers (root and
//!   the user `tests`) copy up, chown, keep setgid bits and file
//!   capabilities, rename lower directories, take a snapshot and reload
//!   the policy; every system call it made must be in the unit's
//!   `SystemCallFilter=`, and every socket it opened in
//!   `RestrictAddressFamilies=`. Dropping CAP_CHOWN and CAP_SETFCAP makes
//!   the same copy-ups fail or lose the capability, so the check can fail.
//!
//! Not reproduced here: `DevicePolicy=`/`DeviceAllow=` (the device cgroup
//! systemd would set up) and the network namespace of `PrivateNetwork=`.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::daemon::{text, FgDaemon};
use crate::harness::{bin, eventually, is_mounted};

const UNIT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/layerfs@.service");

/// The exposure `systemd-analyze security` may give the unit at most
/// (0 = fully confined, 10 = unconfined; 3.7 when this was written).
const MAX_EXPOSURE: f64 = 4.0;

/// Directives that put a service into a mount namespace of its own, from
/// which systemd lets no mount propagate to the host (systemd.exec(5)).
const NAMESPACING: [&str; 22] = [
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "ReadWritePaths",
    "ReadOnlyPaths",
    "InaccessiblePaths",
    "ExecPaths",
    "NoExecPaths",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectProc",
    "ProcSubset",
    "PrivateIPC",
    "TemporaryFileSystem",
    "BindPaths",
    "BindReadOnlyPaths",
    "DynamicUser",
    "RootDirectory",
    "LogNamespace",
];

/// Values of `Key=` lines in the unit's [Service] section.
fn service(text: &str, key: &str) -> Vec<String> {
    let mut in_service = false;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
            continue;
        }
        if !in_service || line.starts_with('#') {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            if k.trim() == key {
                out.push(v.trim().to_string());
            }
        }
    }
    out
}

/// A directory with the unit (and instance links to it), the built binary
/// for /usr/local/bin, and the man pages for MANPATH.
struct UnitEnv {
    dir: tempfile::TempDir,
}

impl UnitEnv {
    fn new(unit_text: &str) -> UnitEnv {
        let dir = tempfile::tempdir().unwrap();
        let units = dir.path().join("units");
        let bins = dir.path().join("bin");
        fs::create_dir(&units).unwrap();
        fs::create_dir(&bins).unwrap();
        fs::write(units.join("layerfs@.service"), unit_text).unwrap();
        for inst in ["layerfs@alice.service", "layerfs@alice@s42.service"] {
            std::os::unix::fs::symlink("layerfs@.service", units.join(inst)).unwrap();
        }
        std::os::unix::fs::symlink(bin(), bins.join("layerfs")).unwrap();
        let gen = dir.path().join("gen");
        let out = Command::new(bin()).arg("man").arg(&gen).output().unwrap();
        assert!(out.status.success(), "layerfs man: {}", text(&out));
        for (ext, sec) in [("1", "man1"), ("8", "man8")] {
            let d = dir.path().join("man").join(sec);
            fs::create_dir_all(&d).unwrap();
            for e in fs::read_dir(&gen).unwrap().flatten() {
                if e.path().extension().is_some_and(|x| x == ext) {
                    fs::rename(e.path(), d.join(e.file_name())).unwrap();
                }
            }
        }
        UnitEnv { dir }
    }

    fn unit(&self, name: &str) -> PathBuf {
        self.dir.path().join("units").join(name)
    }

    /// `systemd-analyze ARGS` where /usr/local/bin/layerfs is the binary
    /// under test.
    fn analyze(&self, args: &[&str]) -> Output {
        let script = format!(
            "mount -t overlay layerfs-test-bin -o ro,lowerdir={}:/usr/local/bin /usr/local/bin \
             && exec systemd-analyze \"$@\"",
            self.dir.path().join("bin").display()
        );
        Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "bash",
                "-c",
                &script,
                "analyze",
            ])
            .args(args)
            .env("MANPATH", self.dir.path().join("man"))
            .env("SYSTEMD_COLORS", "0")
            .output()
            .expect("run systemd-analyze (systemd package)")
    }

    /// The overall exposure `systemd-analyze security` reports.
    fn exposure(&self, out: &Output) -> f64 {
        let all = String::from_utf8_lossy(&out.stdout).to_string();
        let line = all
            .lines()
            .find(|l| l.contains("Overall exposure level"))
            .unwrap_or_else(|| panic!("no exposure in: {}", text(out)));
        line.split(':')
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("cannot read the exposure in {line}"))
    }
}

#[test]
fn the_unit_and_its_instances_verify_without_warnings() {
    let env = UnitEnv::new(&fs::read_to_string(UNIT).unwrap());
    for unit in [
        "layerfs@.service",
        "layerfs@alice.service",
        "layerfs@alice@s42.service",
    ] {
        let path = env.unit(unit);
        let out = env.analyze(&["verify", path.to_str().unwrap()]);
        assert!(out.status.success(), "verify {unit}: {}", text(&out));
        assert!(
            out.stderr.is_empty() && out.stdout.is_empty(),
            "verify {unit} warns: {}",
            text(&out)
        );
    }
    // The check sees mistakes: a misspelt directive and system call group.
    let broken = fs::read_to_string(UNIT)
        .unwrap()
        .replace("NoNewPrivileges=yes", "NoNewPrivilege=yes")
        .replace("@system-service", "@system-servic");
    let env = UnitEnv::new(&broken);
    let out = env.analyze(&[
        "verify",
        env.unit("layerfs@alice.service").to_str().unwrap(),
    ]);
    let all = text(&out);
    assert!(all.contains("NoNewPrivilege"), "{all}");
    assert!(all.contains("@system-servic"), "{all}");
}

#[test]
fn the_unit_security_exposure_stays_low_and_the_hardening_is_what_lowers_it() {
    let unit_text = fs::read_to_string(UNIT).unwrap();
    let env = UnitEnv::new(&unit_text);
    let unit = env.unit("layerfs@alice@s42.service");
    // --threshold counts tenths: 40 is an exposure of 4.0.
    let threshold = ((MAX_EXPOSURE * 10.0) as u32).to_string();
    let out = env.analyze(&[
        "security",
        "--offline=true",
        "--no-pager",
        "--threshold",
        &threshold,
        unit.to_str().unwrap(),
    ]);
    // The record: the whole table, in the test's output.
    println!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(out.status.success(), "{}", text(&out));
    let exposure = env.exposure(&out);
    assert!(
        exposure < MAX_EXPOSURE,
        "exposure {exposure}: {}",
        text(&out)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    for confined in [
        "✓ NoNewPrivileges=",
        "✓ CapabilityBoundingSet=~CAP_SYS_MODULE",
        "✓ CapabilityBoundingSet=~CAP_NET_ADMIN",
        "✓ RestrictAddressFamilies=~AF_(INET|INET6)",
        "✓ PrivateNetwork=",
        "✓ IPAddressDeny=",
        "✓ RestrictNamespaces=~user",
        "✓ SystemCallArchitectures=",
        "✓ MemoryDenyWriteExecute=",
        "✓ LockPersonality=",
        "✓ RestrictRealtime=",
        "✓ ProtectClock=",
        "✓ ProtectHostname=",
        "✓ SystemCallFilter=~@swap",
        "✓ SystemCallFilter=~@reboot",
        "✓ SystemCallFilter=~@module",
    ] {
        assert!(
            table.contains(confined),
            "not confined: {confined}\n{table}"
        );
    }

    // Without its hardening block the same unit is far more exposed.
    let bare: String = {
        let (head, rest) = unit_text.split_once("# --- Hardening").unwrap();
        let install = rest.find("[Install]").unwrap();
        format!("{head}{}", &rest[install..])
    };
    let env = UnitEnv::new(&bare);
    let unit = env.unit("layerfs@alice@s42.service");
    let out = env.analyze(&[
        "security",
        "--offline=true",
        "--no-pager",
        unit.to_str().unwrap(),
    ]);
    let bare_exposure = env.exposure(&out);
    assert!(
        bare_exposure > exposure + 4.0,
        "hardened {exposure}, bare {bare_exposure}"
    );
}

#[test]
fn the_unit_gives_the_service_no_mount_namespace() {
    let unit = fs::read_to_string(UNIT).unwrap();
    for key in NAMESPACING {
        assert!(
            service(&unit, key).is_empty(),
            "{key}= would mount the workspace inside the service's own namespace only"
        );
    }
    assert_eq!(service(&unit, "PrivateMounts"), vec!["no".to_string()]);
    for flags in service(&unit, "MountFlags") {
        assert_eq!(flags, "shared");
    }
}

// ---------------------------------------------------------------------------
// The confinement, reproduced with setpriv and traced with strace
// ---------------------------------------------------------------------------

/// Every system call `SystemCallFilter=` lets through: its groups expanded
/// with `systemd-analyze syscall-filter`.
fn allowed_syscalls(filter: &[String]) -> BTreeSet<String> {
    let out = Command::new("systemd-analyze")
        .args(["syscall-filter", "--no-pager"])
        .output()
        .expect("run systemd-analyze syscall-filter");
    let mut groups: HashMap<String, Vec<String>> = HashMap::new();
    let mut current = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if line.starts_with('@') {
            current = Some(line.trim().to_string());
            groups.entry(line.trim().to_string()).or_default();
        } else if !line.starts_with(' ') {
            current = None;
        } else if let Some(g) = &current {
            let item = line.trim();
            if !item.is_empty() && !item.starts_with('#') {
                groups.get_mut(g).unwrap().push(item.to_string());
            }
        }
    }
    let mut allowed = BTreeSet::new();
    let mut todo: Vec<String> = filter
        .iter()
        .flat_map(|l| l.split_whitespace().map(str::to_string))
        .collect();
    todo.push("@default".into());
    let mut seen = BTreeSet::new();
    while let Some(item) = todo.pop() {
        assert!(
            !item.starts_with('~'),
            "deny lists are not modelled: {item}"
        );
        if let Some(g) = item.strip_prefix('@').map(|_| item.clone()) {
            if seen.insert(g.clone()) {
                todo.extend(
                    groups
                        .get(&g)
                        .cloned()
                        .unwrap_or_else(|| panic!("systemd-analyze knows no group {g}")),
                );
            }
        } else {
            allowed.insert(item);
        }
    }
    allowed
}

/// The system calls in an strace -f log after `marker` (the exec of the
/// daemon), and the address families of its socket() calls.
fn traced(log: &str, marker: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut calls = BTreeSet::new();
    let mut families = BTreeSet::new();
    let mut started = false;
    for line in log.lines() {
        if !started {
            started = line.contains(marker);
            continue;
        }
        let rest = line
            .split_once(char::is_whitespace)
            .map_or("", |(_, r)| r)
            .trim_start();
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() || !rest[name.len()..].starts_with('(') {
            continue;
        }
        if name == "socket" || name == "socketpair" {
            let fam: String = rest[name.len() + 1..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            families.insert(fam);
        }
        calls.insert(name);
    }
    assert!(started, "the trace never shows `{marker}`");
    (calls, families)
}

/// A lower tree that needs every capability of the unit to copy up.
struct Layers {
    dir: tempfile::TempDir,
    lower: PathBuf,
    upper_root: PathBuf,
    mount_root: PathBuf,
    policy: PathBuf,
    tests_uid: u32,
}

impl Layers {
    fn new() -> Layers {
        let dir = tempfile::Builder::new()
            .prefix("layerfs-unit.")
            .tempdir()
            .unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let tests = nix::unistd::User::from_name("tests")
            .unwrap()
            .expect("the `tests` user (useradd -M tests, as .ci/run does)");
        let (uid, gid) = (tests.uid.as_raw(), tests.gid.as_raw());
        let lower = dir.path().join("lower");
        let chown = |p: &Path| std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
        fs::create_dir_all(lower.join("owned")).unwrap();
        chown(&lower.join("owned"));
        fs::write(lower.join("owned/secret"), "one\n").unwrap();
        chown(&lower.join("owned/secret"));
        fs::set_permissions(
            lower.join("owned/secret"),
            fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        fs::create_dir(lower.join("group")).unwrap();
        chown(&lower.join("group"));
        fs::set_permissions(lower.join("group"), fs::Permissions::from_mode(0o2775)).unwrap();
        fs::create_dir_all(lower.join("pkg/sub")).unwrap();
        fs::write(lower.join("pkg/sub/file"), "pkg\n").unwrap();
        fs::write(lower.join("gone.txt"), "gone\n").unwrap();
        fs::write(lower.join("shared.txt"), "shared\n").unwrap();
        fs::copy("/bin/true", lower.join("tool")).unwrap();
        let setcap = Command::new("setcap")
            .arg("cap_net_raw+ep")
            .arg(lower.join("tool"))
            .output()
            .expect("run setcap (libcap2-bin)");
        assert!(setcap.status.success(), "setcap: {}", text(&setcap));
        let policy = dir.path().join("policy");
        fs::write(&policy, "hide **/.env\n").unwrap();
        Layers {
            upper_root: dir.path().join("data"),
            mount_root: dir.path().join("run"),
            lower,
            policy,
            tests_uid: uid,
            dir,
        }
    }

    /// The unit's ExecStart= for instance `inst`, with the test's roots,
    /// lower and binary, and `--allow-other --policy FILE` as LAYERFS_OPTS.
    fn exec_start(&self, unit: &str, inst: &str) -> Vec<String> {
        let line = service(unit, "ExecStart").pop().expect("ExecStart=");
        let mut argv = Vec::new();
        for word in line.split_whitespace() {
            match word {
                "/usr/local/bin/layerfs" => argv.push(bin().display().to_string()),
                "$LAYERFS_OPTS" => argv.extend([
                    "--allow-other".to_string(),
                    "--policy".into(),
                    self.policy.display().to_string(),
                ]),
                w => argv.push(
                    w.replace("%i", inst)
                        .replace("${LAYERFS_LOWER}", &self.lower.display().to_string())
                        .replace(
                            "${LAYERFS_UPPER_ROOT}",
                            &self.upper_root.display().to_string(),
                        )
                        .replace(
                            "${LAYERFS_MOUNT_ROOT}",
                            &self.mount_root.display().to_string(),
                        ),
                ),
            }
        }
        assert!(
            !argv.iter().any(|a| a.contains('$') || a.contains('%')),
            "{argv:?}"
        );
        argv
    }

    /// Starts the daemon as the unit would: no new privileges, the unit's
    /// capability bounding set (minus `drop`), optionally under strace.
    fn start(&self, unit: &str, inst: &str, drop: &[&str], trace: Option<&Path>) -> FgDaemon {
        let caps: Vec<String> = service(unit, "CapabilityBoundingSet")
            .iter()
            .flat_map(|l| l.split_whitespace().map(str::to_string))
            .filter(|c| !drop.contains(&c.as_str()))
            .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
            .collect();
        let mut cmd = match trace {
            Some(log) => {
                let mut c = Command::new("strace");
                c.args(["-f", "-qq", "-o"])
                    .arg(log)
                    .arg("--")
                    .arg("setpriv");
                c
            }
            None => Command::new("setpriv"),
        };
        assert_eq!(service(unit, "NoNewPrivileges"), vec!["yes".to_string()]);
        // The unit's UMask= too: the instance directories must still let
        // the user reach the mountpoint.
        let umask = service(unit, "UMask")
            .pop()
            .map(|m| u32::from_str_radix(&m, 8).expect("UMask= in octal"))
            .unwrap_or(0o022);
        // SAFETY: umask is async-signal-safe and changes only the child.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                libc::umask(umask as libc::mode_t);
                Ok(())
            });
        }
        cmd.arg("--no-new-privs")
            .arg("--inh-caps=-all")
            .arg(format!("--bounding-set=-all,{}", caps.join(",")))
            .arg("--")
            .args(self.exec_start(unit, inst))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(self.dir.path().join(format!("{inst}.log"))).unwrap());
        let mnt = self.mountpoint(inst);
        let mut child = cmd.spawn().expect("spawn setpriv (util-linux) / strace");
        let live = eventually(Duration::from_secs(30), || {
            is_mounted(&mnt) || matches!(child.try_wait(), Ok(Some(_)))
        });
        let d = FgDaemon {
            mnt: mnt.clone(),
            child: Some(child),
        };
        assert!(
            live && is_mounted(&mnt),
            "the unit's ExecStart did not mount: {}",
            self.log(inst)
        );
        d
    }

    /// USER[/sessions/SESSION] below `root`: the unit's naming scheme.
    fn instance_dir(root: &Path, inst: &str) -> PathBuf {
        match inst.split_once('@') {
            Some((user, session)) => root.join(user).join("sessions").join(session),
            None => root.join(inst),
        }
    }

    fn mountpoint(&self, inst: &str) -> PathBuf {
        Layers::instance_dir(&self.mount_root, inst).join("mnt")
    }

    fn upper(&self, inst: &str) -> PathBuf {
        Layers::instance_dir(&self.upper_root, inst).join("upper")
    }

    fn log(&self, inst: &str) -> String {
        fs::read_to_string(self.dir.path().join(format!("{inst}.log"))).unwrap_or_default()
    }
}

fn sh(script: &str) -> Output {
    Command::new("bash")
        .args(["-c", script])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

#[test]
fn the_units_confinement_still_serves_the_workspace_with_only_allowed_syscalls() {
    let unit = fs::read_to_string(UNIT).unwrap();
    let layers = Layers::new();
    let inst = "alice@s1";
    let trace = layers.dir.path().join("trace");
    let mut daemon = layers.start(&unit, inst, &[], Some(&trace));
    let m = layers.mountpoint(inst);
    let script = format!(
        "set -e; M={m}; t() {{ setpriv --reuid=tests --regid=tests --clear-groups -- \"$@\"; }}\n\
         cat $M/shared.txt >/dev/null\n\
         t sh -c \"echo two >> $M/owned/secret\"\n\
         t touch -d 2001-01-01 $M/owned/secret\n\
         t setfattr -n user.note -v hi $M/owned/secret\n\
         t sh -c \"echo new > $M/group/new\"\n\
         chmod 700 $M/tool\n\
         rm $M/gone.txt\n\
         mv $M/pkg $M/pkg2\n\
         ln $M/shared.txt $M/link.txt\n\
         mkfifo $M/fifo\n\
         {bin} status $M >/dev/null\n\
         {bin} snapshot save $M snap1 >/dev/null\n\
         {bin} diff $M >/dev/null\n",
        m = m.display(),
        bin = bin().display()
    );
    let out = sh(&script);
    assert!(out.status.success(), "{}\n{}", text(&out), layers.log(inst));
    let pid = layerfs::host::pidfile::find_daemon(&m, None).expect("daemon pid");
    // SAFETY: SIGHUP (policy reload) to the daemon this test started.
    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    std::thread::sleep(Duration::from_millis(200));
    let um = Command::new("umount").arg(&m).output().unwrap();
    assert!(um.status.success(), "umount: {}", text(&um));
    let status = daemon
        .wait(Duration::from_secs(20))
        .expect("the daemon exits after umount");
    assert!(status.success(), "daemon: {status}: {}", layers.log(inst));

    let up = layers.upper(inst);
    for d in [
        m.parent().unwrap(),
        layers.mount_root.join("alice").as_path(),
    ] {
        let mode = fs::metadata(d).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o755, "{} under UMask=0077", d.display());
    }
    let secret = up.join("owned/secret");
    assert_eq!(fs::read_to_string(&secret).unwrap(), "one\ntwo\n");
    assert_eq!(fs::metadata(&secret).unwrap().uid(), layers.tests_uid);
    assert!(xattr::get(&secret, "user.note").unwrap().is_some());
    assert_eq!(
        fs::metadata(up.join("group")).unwrap().mode() & 0o2000,
        0o2000,
        "the copied-up setgid directory lost its bit"
    );
    let getcap = Command::new("getcap")
        .arg(up.join("tool"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&getcap.stdout).contains("cap_net_raw"),
        "file capability lost on copy-up: {}",
        text(&getcap)
    );
    assert!(xattr::get(up.join("pkg2"), "trusted.overlay.redirect")
        .unwrap()
        .is_some());
    assert!(
        !layers.log(inst).contains("not permitted"),
        "{}",
        layers.log(inst)
    );

    let log = fs::read_to_string(&trace).unwrap();
    let (calls, families) = traced(&log, &format!("execve(\"{}\"", bin().display()));
    let allowed = allowed_syscalls(&service(&unit, "SystemCallFilter"));
    let refused: Vec<&String> = calls.iter().filter(|c| !allowed.contains(*c)).collect();
    assert!(
        refused.is_empty(),
        "the daemon made system calls SystemCallFilter= refuses: {refused:?} (all: {calls:?})"
    );
    assert!(
        calls.contains("mount") && calls.contains("fchown"),
        "{calls:?}"
    );
    let families_allowed: Vec<String> = service(&unit, "RestrictAddressFamilies")
        .iter()
        .flat_map(|l| l.split_whitespace().map(str::to_string))
        .collect();
    for f in &families {
        assert!(
            families_allowed.contains(f),
            "socket family {f} outside RestrictAddressFamilies={families_allowed:?}"
        );
    }
    assert!(families.contains("AF_UNIX"), "{families:?}");
}

#[test]
fn without_cap_chown_and_cap_setfcap_the_same_copy_ups_fail() {
    let unit = fs::read_to_string(UNIT).unwrap();
    let layers = Layers::new();
    let inst = "bob";
    let _daemon = layers.start(&unit, inst, &["CAP_CHOWN", "CAP_SETFCAP"], None);
    let m = layers.mountpoint(inst);
    let out = sh(&format!(
        "setpriv --reuid=tests --regid=tests --clear-groups -- sh -c 'echo two >> {m}/owned/secret'",
        m = m.display()
    ));
    assert!(
        !out.status.success(),
        "copy-up without CAP_CHOWN: {}",
        text(&out)
    );
    let out = sh(&format!("chmod 700 {}/tool", m.display()));
    assert!(out.status.success(), "{}", text(&out));
    let getcap = Command::new("getcap")
        .arg(layers.upper(inst).join("tool"))
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&getcap.stdout).contains("cap_net_raw"),
        "file capability copied up without CAP_SETFCAP?"
    );
}

#[test]
fn instance_names_are_single_safe_segments_checked_before_anything_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let lower = dir.path().join("lower");
    fs::create_dir(&lower).unwrap();
    let (data, run) = (dir.path().join("data"), dir.path().join("run"));
    for (name, needle) in [
        ("..", "starts with `.`"),
        ("a/b", "character '/'"),
        ("", "empty user"),
        ("-rf", "starts with `-`"),
        ("alice@..", "session `..`"),
        ("alice@s1@s2", "character '@'"),
        ("alice\\x2ds1", "systemd-escape"),
    ] {
        let out = Command::new(bin())
            .args(["mount", &format!("--instance={name}"), "-o"])
            .arg(format!("lowerdir={}", lower.display()))
            .arg("--upper-root")
            .arg(&data)
            .arg("--mount-root")
            .arg(&run)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{name:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("instance name `{name}`")) && err.contains(needle),
            "{name:?}: {err}"
        );
        assert!(
            !data.exists() && !run.exists(),
            "{name:?} created directories"
        );
    }
    let out = Command::new(bin())
        .args(["mount", "--upper-root", "/x", "/mnt"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("give --instance"));
}
