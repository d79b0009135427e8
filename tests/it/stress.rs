//! Short stress run (scripts/stress against a harness mount): racing
//! operations on shared lower and new paths, concurrent copy-ups of one
//! lower file, per-worker op sequences checked against a plain directory,
//! and stress-ng filesystem stressors inside the mount. The script's
//! watchdog, daemon-log scan and fd/RSS bounds decide; its report is
//! printed. The long campaign is `scripts/stress SECONDS THREADS`.

use std::path::PathBuf;
use std::process::Command;

use crate::harness::*;

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/stress")
}

#[test]
fn stress_short_run_is_clean() {
    const THREADS: &str = "4";
    let ws = Workspace::new();
    let out = Command::new("python3")
        .arg(script())
        .args(["--prepare", ws.lower().to_str().unwrap(), THREADS])
        .output()
        .expect("run scripts/stress --prepare");
    assert!(out.status.success(), "prepare: {out:?}");
    // The plain directory the per-worker sequences are replayed on.
    let reference = ws.dir.path().join("ref");
    sh(
        ws.dir.path(),
        &format!("cp -a {}/own {}", ws.lower().display(), reference.display()),
    );
    let m = ws.mount();
    let log = ws.mnt.with_file_name("daemon.log");
    let out = Command::new("python3")
        .arg(script())
        .arg("--mnt")
        .arg(m.path())
        .arg("--daemon-pid")
        .arg(m.pid().to_string())
        .arg("--daemon-log")
        .arg(&log)
        .arg("--ref")
        .arg(&reference)
        .args(["12", THREADS])
        .output()
        .expect("run scripts/stress");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{report}");
    assert!(out.status.success(), "stress run failed:\n{report}");
    assert!(report.contains("stress: PASS"), "{report}");
    // Every prepared lower file is untouched by the run.
    assert!(m.unmount(), "daemon exited with an error after the run");
    let again = Command::new("python3")
        .arg(script())
        .args(["--check-lower", ws.lower().to_str().unwrap(), THREADS])
        .output()
        .expect("run scripts/stress --check-lower");
    assert!(again.status.success(), "lower changed: {again:?}");
}

/// The watchdog itself: with the daemon stopped (SIGSTOP) every operation
/// hangs; the run must fail within seconds naming a stuck worker and its
/// operation, not hang with it.
#[test]
fn stress_watchdog_reports_a_hung_mount() {
    let ws = Workspace::new();
    let out = Command::new("python3")
        .arg(script())
        .args(["--prepare", ws.lower().to_str().unwrap(), "2"])
        .output()
        .expect("run scripts/stress --prepare");
    assert!(out.status.success(), "prepare: {out:?}");
    let reference = ws.dir.path().join("ref");
    sh(
        ws.dir.path(),
        &format!("cp -a {}/own {}", ws.lower().display(), reference.display()),
    );
    let m = ws.mount();
    let pid = nix::unistd::Pid::from_raw(m.pid() as i32);
    let report_path = ws.dir.path().join("stress-report");
    let mut child = Command::new("python3")
        .arg(script())
        .arg("--mnt")
        .arg(m.path())
        .arg("--daemon-pid")
        .arg(m.pid().to_string())
        .arg("--daemon-log")
        .arg(ws.mnt.with_file_name("daemon.log"))
        .arg("--ref")
        .arg(&reference)
        .args(["60", "2"])
        .env("LAYERFS_STRESS_NG", "")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&report_path).unwrap())
        .spawn()
        .expect("run scripts/stress");
    std::thread::sleep(std::time::Duration::from_secs(2));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // The script's own exit, not the end of its output: a process it
    // left behind on the stopped mount would keep a pipe open forever.
    let status = child.wait();
    // Let the daemon go on so the guard can unmount it.
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let status = status.expect("wait for scripts/stress");
    let report = std::fs::read_to_string(&report_path).unwrap();
    assert!(!status.success(), "a stopped daemon passed:\n{report}");
    assert!(
        report.contains("watchdog: worker") && report.contains(" stuck "),
        "no stuck worker reported:\n{report}"
    );
    // The failed run's scratch (its stress-ng log) lies in this workspace,
    // which goes with it, never in /tmp.
    let kept = report
        .lines()
        .find_map(|l| l.trim().strip_prefix("(stress-ng log: "))
        .unwrap_or_else(|| panic!("no stress-ng log named:\n{report}"));
    assert!(
        std::path::Path::new(kept).starts_with(ws.dir.path()),
        "scratch outside the workspace: {kept}"
    );
    drop(m);
}
