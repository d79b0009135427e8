//! `layerfs run`: limits that end a command — `--max-output` stopping a
//! command that keeps writing (and `--overflow discard` not), as root and
//! as the user `tests`.

use crate::run::{json_of, sh_as, stderr, stdout, text, workspace_for, Caller};

/// `relay::stop_bound(1000)`: 1 MiB.
const BOUND_1000: u64 = 1 << 20;

#[test]
fn max_output_stops_a_command_that_keeps_writing() {
    for caller in [Caller::Root, Caller::Tests] {
        let ws = workspace_for(caller);
        let out = sh_as(
            caller,
            &ws,
            true,
            &["--max-output", "1000", "--json"],
            "yes",
        );
        assert_eq!(out.status.code(), Some(137), "{caller:?}: {}", text(&out));
        let v = json_of(&out);
        assert_eq!(v["output_stopped"], true, "{v}");
        assert_eq!(v["exit_code"], 137, "{v}");
        assert_eq!(v["truncated"], true, "{v}");
        // Stopped once past the bound; what the command wrote until the
        // kernel's kill reached it is counted on top: at most what fits in
        // its pipes, which are not read again until the sandbox is gone
        // (without that, a loaded host let `yes` write tens of MB more;
        // without the stop it runs forever).
        let total = v["output_bytes"].as_u64().unwrap();
        assert!(
            (BOUND_1000..BOUND_1000 + (2 << 20)).contains(&total),
            "{caller:?}: {total}"
        );
        assert!(
            stderr(&out).contains("ran past --max-output 1000 and went on"),
            "{}",
            text(&out)
        );
    }
}

/// Past the cap but exiting: its own code. Past the cap, far below the
/// bound, then silent: stopped by the clock (10 s). `--overflow discard`:
/// never stopped.
#[test]
fn max_output_stops_only_a_command_that_keeps_going() {
    let ws = workspace_for(Caller::Root);
    let cases: [(&[&str], &str, i32, bool, u64); 3] = [
        (&[], "head -c 50000 /dev/zero; exit 3", 3, false, 50_000),
        (
            &[],
            "head -c 2000 /dev/zero; sleep 600; echo never",
            137,
            true,
            2000,
        ),
        (
            &["--overflow", "discard"],
            "head -c 3000000 /dev/zero; exit 5",
            5,
            false,
            3_000_000,
        ),
    ];
    for (extra, script, code, stopped, bytes) in cases {
        let mut flags = vec!["--max-output", "1000", "--json"];
        flags.extend_from_slice(extra);
        let out = sh_as(Caller::Root, &ws, true, &flags, script);
        assert_eq!(out.status.code(), Some(code), "{script}: {}", text(&out));
        let v = json_of(&out);
        assert_eq!(v["output_stopped"], stopped, "{script}: {v}");
        assert_eq!(v["output_bytes"], bytes, "{script}: {v}");
    }
}

/// The cgroup v1 hierarchies of this process, to check the run's groups
/// are gone afterwards.
fn run_groups_left() -> Vec<String> {
    let mut left = Vec::new();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    for line in own.lines() {
        let mut p = line.splitn(3, ':');
        let (_, ctrl, path) = (p.next(), p.next().unwrap(), p.next().unwrap());
        for c in ["memory", "pids", "cpu", "cpuacct"] {
            if ctrl.split(',').any(|x| x == c) {
                let dir = std::path::Path::new("/sys/fs/cgroup")
                    .join(c)
                    .join(path.trim_start_matches('/'));
                if let Ok(rd) = std::fs::read_dir(&dir) {
                    for e in rd.flatten() {
                        let n = e.file_name().to_string_lossy().into_owned();
                        if n.starts_with("layerfs-run.") {
                            left.push(format!("{c}/{n}"));
                        }
                    }
                }
            }
        }
    }
    left
}

#[test]
fn memory_limit_ends_a_large_allocation_reported_as_oom() {
    let ws = workspace_for(Caller::Root);
    let out = sh_as(
        Caller::Root,
        &ws,
        true,
        &["--memory", "64M", "--json"],
        "python3 -c 'b = bytearray(200 * 1024 * 1024); print(len(b))'",
    );
    assert_eq!(out.status.code(), Some(137), "{}", text(&out));
    let v = json_of(&out);
    let r = &v["resources"];
    assert_eq!(r["oom_killed"], true, "{v}");
    assert!(
        r["limits_hit"]
            .as_array()
            .unwrap()
            .contains(&"memory".into()),
        "{v}"
    );
    assert!(r["memory_peak_bytes"].as_u64().unwrap() <= 64 << 20, "{v}");
    assert!(r["cpu_time_ms"].is_u64(), "{v}");
    assert!(
        stderr(&out).contains("out-of-memory killer killed"),
        "{}",
        text(&out)
    );
    assert!(!stdout(&out).contains("209715200"), "{}", text(&out));
    let mine: Vec<String> = run_groups_left()
        .into_iter()
        .filter(|g| g.ends_with(&format!(".{}", std::process::id())))
        .collect();
    assert!(mine.is_empty(), "{mine:?}");
}

#[test]
fn pids_limit_ends_a_fork_bomb_cleanly() {
    let ws = workspace_for(Caller::Root);
    let out = sh_as(
        Caller::Root,
        &ws,
        true,
        &["--pids", "20", "--json", "--timeout", "120"],
        // The shell itself forks nothing once the bomb is going (a fork of
        // its own would fail at the limit, as the bomb's do): it counts
        // with builtins while the bomb hits the limit.
        "f() { f | f & }; f 2>/dev/null; i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; \
         echo survived",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v = json_of(&out);
    assert_eq!(v["timed_out"], false, "{v}");
    assert!(
        v["resources"]["limits_hit"]
            .as_array()
            .unwrap()
            .contains(&"pids".into()),
        "{v}"
    );
    assert!(stdout(&out).starts_with("survived\n"), "{}", text(&out));
    assert!(stderr(&out).contains("reached --pids 20"), "{}", text(&out));
}

#[test]
fn cpus_limit_throttles_and_a_run_without_limits_reports_none() {
    let ws = workspace_for(Caller::Root);
    let out = sh_as(
        Caller::Root,
        &ws,
        true,
        &["--cpus", "0.2", "--json"],
        "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v = json_of(&out);
    assert!(
        v["resources"]["limits_hit"]
            .as_array()
            .unwrap()
            .contains(&"cpu".into()),
        "{v}"
    );
    let out = sh_as(Caller::Root, &ws, true, &["--json"], "true");
    assert!(json_of(&out)["resources"].is_null(), "{}", text(&out));
}

#[test]
fn a_limit_without_a_cgroup_is_refused_not_ignored() {
    // cgroup v1 here: an unprivileged user cannot make a group.
    if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        eprintln!("cgroup v2 host: the user may have a delegated subtree; not tried");
        return;
    }
    let ws = workspace_for(Caller::Tests);
    for flags in [["--memory", "64M"], ["--pids", "20"]] {
        let mut f = flags.to_vec();
        f.push("--json");
        let out = sh_as(Caller::Tests, &ws, false, &f, "touch ran");
        assert_eq!(out.status.code(), Some(125), "{flags:?}: {}", text(&out));
        assert!(
            stderr(&out).contains("cannot make a cgroup for"),
            "{}",
            text(&out)
        );
        assert!(!ws.upper.join("ran").exists(), "ran without its limit");
    }
}
