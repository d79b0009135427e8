//! Resource limits of one `layerfs run` (`--memory`, `--pids`, `--cpus`):
//! a cgroup made for the run, which the sandbox's first process joins
//! before it starts anything, read for `--json`'s `resources` when the
//! sandbox is gone, and removed.
//!
//! cgroup v2 where `/sys/fs/cgroup/cgroup.controllers` exists: a child of
//! the caller's own cgroup (root's, or a delegated subtree such as a
//! systemd user session's), with the controllers enabled in its parent.
//! Otherwise cgroup v1: a child of the caller's cgroup in each controller
//! hierarchy needed (`memory` and `cpuacct` always, for the report; `pids`
//! and `cpu` for their limits). Where no cgroup can be made (v1 as a user,
//! v2 without delegation) a run that asked for a limit is refused, never
//! run unlimited.
//!
//! Joining: moving a process between cgroups makes the kernel wait for an
//! RCU grace period (about 10 ms here), so it is overlapped with building
//! the sandbox's tree: once the sandbox reports its init's pid, `layerfs
//! run` writes it to each group's `cgroup.procs` and then sends the init
//! one byte on a pipe; the init forks the command only after that byte
//! (and gives up at EOF), so every process of the command is born in the
//! group. The monitor above the init stays outside: it only waits.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const ROOT: &str = "/sys/fs/cgroup";

/// The limits asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    /// Bytes of memory (swap included where the kernel counts it).
    pub memory: Option<u64>,
    pub pids: Option<u64>,
    /// CPUs' worth of time per period (e.g. 0.5, 2).
    pub cpus: Option<f64>,
}

impl Limits {
    pub fn any(&self) -> bool {
        self.memory.is_some() || self.pids.is_some() || self.cpus.is_some()
    }

    /// The options asked for, for messages.
    fn named(&self) -> String {
        let mut v = Vec::new();
        if let Some(m) = self.memory {
            v.push(format!("--memory {m}"));
        }
        if let Some(p) = self.pids {
            v.push(format!("--pids {p}"));
        }
        if let Some(c) = self.cpus {
            v.push(format!("--cpus {c}"));
        }
        v.join(", ")
    }
}

/// The scheduler period `--cpus` quotas are given in: 100 ms.
const CPU_PERIOD_US: u64 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// One made group: per v1 controller, or the one v2 group.
struct Group {
    /// The v1 controller (`""` for v2).
    controller: &'static str,
    dir: PathBuf,
}

/// The run's cgroup.
pub struct Cgroup {
    version: Version,
    groups: Vec<Group>,
    /// Each group's `cgroup.procs`, open for writing.
    procs: Vec<File>,
    limits: Limits,
    /// How long making it took.
    pub setup: Duration,
}

/// What the run used, for `--json`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    pub memory_peak: Option<u64>,
    pub cpu_time: Option<Duration>,
    /// Which limits the command ran into: `memory`, `pids`, `cpu`.
    pub limits_hit: Vec<&'static str>,
    pub oom_kills: u64,
}

impl Usage {
    pub fn to_json(&self, setup: Duration) -> Value {
        json!({
            "memory_peak_bytes": self.memory_peak,
            "cpu_time_ms": self.cpu_time.map(|d| d.as_millis() as u64),
            "limits_hit": self.limits_hit,
            "oom_killed": self.oom_kills > 0,
            "oom_kills": self.oom_kills,
            "setup_us": setup.as_micros() as u64,
        })
    }
}

/// The caller's cgroup path in hierarchy `key` (`""` for v2, else a v1
/// controller name) from `/proc/self/cgroup`.
fn own_path(key: &str) -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = if key.is_empty() {
            ctrls.is_empty()
        } else {
            ctrls.split(',').any(|c| c == key)
        };
        hit.then(|| PathBuf::from(path.trim_start_matches('/')))
    })
}

/// Why no cgroup could be made for a run: the run is refused, never run
/// without the limits asked for.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot make a cgroup for {limits}: {why}; layerfs run does not run without the \
     limits asked for (cgroup v1 needs root; cgroup v2 a delegated subtree, e.g. \
     a systemd user session: systemd-run --user --scope layerfs run ...)"
)]
pub struct CgroupError {
    /// The limits asked for, as given (`--memory 1G --pids 20`).
    pub limits: String,
    pub why: SetupError,
}

/// The step of making a run's cgroup that failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("no cgroup v1 {0} hierarchy in /proc/self/cgroup")]
    NoV1Hierarchy(&'static str),
    #[error("no cgroup v2 entry in /proc/self/cgroup")]
    NoV2Entry,
    #[error("mkdir {}: {source}", dir.display())]
    Mkdir { dir: PathBuf, source: io::Error },
    #[error("writing {value} to {}: {source}", file.display())]
    Write {
        file: PathBuf,
        value: String,
        source: io::Error,
    },
    #[error("{}: {source}", dir.display())]
    OpenProcs { dir: PathBuf, source: io::Error },
}

/// A `--cpus` or `--pids` value that is not a limit.
#[derive(Debug, thiserror::Error)]
pub enum LimitArgError {
    #[error("invalid --cpus `{0}`: a number of CPUs, at least 0.01 (e.g. 0.5, 2)")]
    Cpus(String),
    #[error("invalid --pids `{0}`: a number of processes, at least 1")]
    Pids(String),
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), SetupError> {
    fs::write(dir.join(file), value).map_err(|source| SetupError::Write {
        file: dir.join(file),
        value: value.to_string(),
        source,
    })
}

fn read(dir: &Path, file: &str) -> Option<String> {
    fs::read_to_string(dir.join(file)).ok()
}

fn read_u64(dir: &Path, file: &str) -> Option<u64> {
    read(dir, file)?.trim().parse().ok()
}

/// The value of `key` in a flat keyed file (`memory.events`, `cpu.stat`).
fn keyed(dir: &Path, file: &str, key: &str) -> Option<u64> {
    read(dir, file)?.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

impl Cgroup {
    /// Makes the run's cgroup with `limits` (at least one asked for).
    pub fn create(limits: Limits) -> Result<Cgroup, CgroupError> {
        let started = Instant::now();
        let version = if Path::new(ROOT).join("cgroup.controllers").exists() {
            Version::V2
        } else {
            Version::V1
        };
        let name = format!("layerfs-run.{}", std::process::id());
        let mut cg = Cgroup {
            version,
            groups: Vec::new(),
            procs: Vec::new(),
            limits,
            setup: Duration::ZERO,
        };
        let refuse = |why: SetupError| CgroupError {
            limits: limits.named(),
            why,
        };
        match version {
            Version::V2 => cg.make_v2(&name).map_err(refuse)?,
            Version::V1 => cg.make_v1(&name).map_err(refuse)?,
        }
        for g in &cg.groups {
            let f = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(g.dir.join("cgroup.procs"))
                .map_err(|source| {
                    refuse(SetupError::OpenProcs {
                        dir: g.dir.clone(),
                        source,
                    })
                })?;
            cg.procs.push(f);
        }
        cg.setup = started.elapsed();
        Ok(cg)
    }

    fn make_group(
        &mut self,
        controller: &'static str,
        parent: PathBuf,
        name: &str,
    ) -> Result<PathBuf, SetupError> {
        let dir = parent.join(name);
        fs::create_dir(&dir).map_err(|source| SetupError::Mkdir {
            dir: dir.clone(),
            source,
        })?;
        self.groups.push(Group {
            controller,
            dir: dir.clone(),
        });
        Ok(dir)
    }

    fn make_v1(&mut self, name: &str) -> Result<(), SetupError> {
        let l = self.limits;
        let mut wanted = vec!["memory", "cpuacct"];
        if l.pids.is_some() {
            wanted.push("pids");
        }
        if l.cpus.is_some() {
            wanted.push("cpu");
        }
        for ctrl in wanted {
            let hier = Path::new(ROOT).join(ctrl);
            let own = own_path(ctrl).ok_or(SetupError::NoV1Hierarchy(ctrl))?;
            let dir = self.make_group(ctrl, hier.join(own), name)?;
            match ctrl {
                "memory" => {
                    if let Some(m) = l.memory {
                        write(&dir, "memory.limit_in_bytes", &m.to_string())?;
                        // With swap accounting, swap counts too: the limit
                        // ends in an OOM kill rather than in swapping.
                        if dir.join("memory.memsw.limit_in_bytes").exists() {
                            write(&dir, "memory.memsw.limit_in_bytes", &m.to_string())?;
                        }
                    }
                }
                "pids" => write(&dir, "pids.max", &l.pids.unwrap_or(0).to_string())?,
                "cpu" => {
                    let quota = (l.cpus.unwrap_or(1.0) * CPU_PERIOD_US as f64).round() as u64;
                    write(&dir, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
                    write(&dir, "cpu.cfs_quota_us", &quota.max(1000).to_string())?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn make_v2(&mut self, name: &str) -> Result<(), SetupError> {
        let l = self.limits;
        let own = own_path("").ok_or(SetupError::NoV2Entry)?;
        let parent = Path::new(ROOT).join(own);
        let mut enable = vec!["+memory", "+cpu"];
        if l.pids.is_some() {
            enable.push("+pids");
        }
        // The parent holds the caller itself: controllers are enabled for
        // its children only where the kernel allows it (the root, or a
        // delegated group); a refusal surfaces when a limit is written.
        for c in &enable {
            let _ = fs::write(parent.join("cgroup.subtree_control"), c);
        }
        let dir = self.make_group("", parent, name)?;
        if let Some(m) = l.memory {
            write(&dir, "memory.max", &m.to_string())?;
            if dir.join("memory.swap.max").exists() {
                write(&dir, "memory.swap.max", "0")?;
            }
        }
        if let Some(p) = l.pids {
            write(&dir, "pids.max", &p.to_string())?;
        }
        if let Some(c) = l.cpus {
            let quota = (c * CPU_PERIOD_US as f64).round() as u64;
            write(
                &dir,
                "cpu.max",
                &format!("{} {CPU_PERIOD_US}", quota.max(1000)),
            )?;
        }
        Ok(())
    }

    /// Copies of each group's `cgroup.procs` (close-on-exec), for the
    /// sandbox's first process to join (`sys::ExecSetup::join_cgroups`).
    pub fn join_handles(&self) -> std::io::Result<Vec<File>> {
        self.procs.iter().map(File::try_clone).collect()
    }

    fn dir(&self, controller: &str) -> Option<&Path> {
        self.groups
            .iter()
            .find(|g| g.controller == controller || self.version == Version::V2)
            .map(|g| g.dir.as_path())
    }

    /// What the run used; read once the sandbox is gone.
    pub fn usage(&self) -> Usage {
        let mut u = Usage::default();
        let l = self.limits;
        match self.version {
            Version::V1 => {
                if let Some(d) = self.dir("memory") {
                    u.memory_peak = read_u64(d, "memory.max_usage_in_bytes");
                    u.oom_kills = keyed(d, "memory.oom_control", "oom_kill").unwrap_or(0);
                    if l.memory.is_some() && read_u64(d, "memory.failcnt").unwrap_or(0) > 0 {
                        u.limits_hit.push("memory");
                    }
                }
                if let Some(d) = self.dir("cpuacct") {
                    u.cpu_time = read_u64(d, "cpuacct.usage").map(Duration::from_nanos);
                }
                if let Some(d) = self.dir("pids") {
                    if keyed(d, "pids.events", "max").unwrap_or(0) > 0 {
                        u.limits_hit.push("pids");
                    }
                }
                if let Some(d) = self.dir("cpu") {
                    if keyed(d, "cpu.stat", "nr_throttled").unwrap_or(0) > 0 {
                        u.limits_hit.push("cpu");
                    }
                }
            }
            Version::V2 => {
                if let Some(d) = self.dir("") {
                    u.memory_peak = read_u64(d, "memory.peak");
                    u.oom_kills = keyed(d, "memory.events", "oom_kill").unwrap_or(0);
                    u.cpu_time = keyed(d, "cpu.stat", "usage_usec").map(Duration::from_micros);
                    if l.memory.is_some() && keyed(d, "memory.events", "max").unwrap_or(0) > 0 {
                        u.limits_hit.push("memory");
                    }
                    if l.pids.is_some() && keyed(d, "pids.events", "max").unwrap_or(0) > 0 {
                        u.limits_hit.push("pids");
                    }
                    if l.cpus.is_some() && keyed(d, "cpu.stat", "nr_throttled").unwrap_or(0) > 0 {
                        u.limits_hit.push("cpu");
                    }
                }
            }
        }
        if u.oom_kills > 0 && !u.limits_hit.contains(&"memory") {
            u.limits_hit.insert(0, "memory");
        }
        u
    }
}

/// Moves process `pid` (the sandbox's init, in the caller's pid
/// namespace) into each group of `procs` (`join_handles`).
pub fn join_pid(procs: &[File], pid: i32) -> std::io::Result<()> {
    for mut f in procs {
        f.write_all(pid.to_string().as_bytes())?;
    }
    Ok(())
}

impl Drop for Cgroup {
    /// Removes the groups (empty once the sandbox is gone; a process still
    /// leaving is waited for briefly).
    fn drop(&mut self) {
        self.procs.clear();
        for g in self.groups.iter().rev() {
            for _ in 0..50 {
                match fs::remove_dir(&g.dir) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    _ => break,
                }
            }
        }
    }
}

/// Parses `--cpus`: a positive number of CPUs (e.g. 0.5, 2).
pub fn parse_cpus(s: &str) -> Result<f64, LimitArgError> {
    match s.trim().parse::<f64>() {
        Ok(c) if c.is_finite() && c >= 0.01 => Ok(c),
        _ => Err(LimitArgError::Cpus(s.to_string())),
    }
}

/// Parses `--pids`: at least 1.
pub fn parse_pids(s: &str) -> Result<u64, LimitArgError> {
    match s.trim().parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(LimitArgError::Pids(s.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpus_and_pids_parse_positive() {
        assert_eq!(parse_cpus("0.5").unwrap(), 0.5);
        assert_eq!(parse_cpus("2").unwrap(), 2.0);
        for bad in ["0", "-1", "x", "inf"] {
            assert!(parse_cpus(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_pids("20").unwrap(), 20);
        assert!(parse_pids("0").is_err());
    }

    #[test]
    fn refusals_name_the_limits_the_step_and_what_to_do() {
        assert_eq!(
            parse_cpus("0").unwrap_err().to_string(),
            "invalid --cpus `0`: a number of CPUs, at least 0.01 (e.g. 0.5, 2)"
        );
        let e = CgroupError {
            limits: "--pids 20".into(),
            why: SetupError::Mkdir {
                dir: PathBuf::from("/sys/fs/cgroup/x"),
                source: io::Error::from_raw_os_error(libc::EACCES),
            },
        };
        let m = e.to_string();
        assert!(
            m.starts_with("cannot make a cgroup for --pids 20: mkdir /sys/fs/cgroup/x: "),
            "{m}"
        );
        assert!(m.contains("systemd-run --user --scope layerfs run"), "{m}");
    }

    #[test]
    fn an_oom_kill_counts_as_hitting_the_memory_limit() {
        let u = Usage {
            oom_kills: 1,
            ..Usage::default()
        };
        let v = u.to_json(Duration::from_micros(1500));
        assert_eq!(v["oom_killed"], true);
        assert_eq!(v["setup_us"], 1500);
    }
}
