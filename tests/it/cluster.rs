//! The shared lower on a real GlusterFS volume (the short version of
//! `scripts/cluster-test`): a one-brick volume on this host, one client
//! mount as the workspaces' lower and a second client mount standing in
//! for another host (its changes raise no inotify event on the first).
//! Three workspaces run an agent-like workload over it; the second mount
//! updates the shared tree; one workspace's snapshot moves to another;
//! the volume is stopped and started under load. Skipped, with the
//! reason, where glusterd cannot run (`.ci/run` installs it).

use std::collections::BTreeMap;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::*;
use crate::netlower::{lower_status, status_json, time_until, VISIBLE_WITHIN};

/// Runs `gluster --mode=script ARGS` (bounded by `timeout`).
fn gluster(args: &[&str]) -> Result<String, String> {
    let out = Command::new("timeout")
        .arg("60")
        .arg("gluster")
        .arg("--mode=script")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("gluster: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("gluster {}: {}", args.join(" "), text.trim()))
    }
}

/// A GlusterFS volume served from this host, with its client mounts and
/// glusterd if this test started it. Dropping it unmounts the client
/// mounts, stops and deletes the volume, and stops the glusterd it
/// started (by its pid).
pub(crate) struct Gluster {
    dir: tempfile::TempDir,
    pub name: String,
    glusterd: Option<u32>,
    created: bool,
    mounts: Vec<PathBuf>,
}

impl Gluster {
    /// Starts glusterd (unless one answers already) and a one-brick
    /// volume; `Err` is why GlusterFS cannot run here (glusterd missing,
    /// not starting, no address for a brick).
    pub(crate) fn start() -> Result<Gluster, String> {
        if Command::new("glusterd").arg("--version").output().is_err() {
            return Err("glusterd is not installed (apt-get install glusterfs-server)".into());
        }
        let dir = tempfile::Builder::new()
            .prefix("layerfs-gluster.")
            .tempdir_in(test_root())
            .map_err(|e| e.to_string())?;
        let mut g = Gluster {
            name: format!("layerfs-test-{}", std::process::id()),
            dir,
            glusterd: None,
            created: false,
            mounts: Vec::new(),
        };
        if gluster(&["pool", "list"]).is_err() {
            let pidfile = g.dir.path().join("glusterd.pid");
            let st = Command::new("glusterd")
                .arg("-p")
                .arg(&pidfile)
                .status()
                .map_err(|e| format!("glusterd: {e}"))?;
            if !st.success() {
                return Err(format!("glusterd exited with {st}"));
            }
            g.glusterd = fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            if !eventually(Duration::from_secs(30), || {
                gluster(&["pool", "list"]).is_ok()
            }) {
                return Err("glusterd started but does not answer `gluster pool list`".into());
            }
        }
        // glusterd refuses loopback brick addresses: the host's own.
        let out = Command::new("hostname")
            .arg("-I")
            .output()
            .map_err(|e| e.to_string())?;
        let addr = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .map(String::from)
            .ok_or("this host has no network address for a brick (hostname -I)")?;
        // From here on GlusterFS runs: a failure is the test's, not a
        // reason to skip (the guard cleans up as the panic unwinds).
        let brick = g.dir.path().join("brick");
        fs::create_dir(&brick).unwrap();
        let spec = format!("{addr}:{}", brick.display());
        gluster(&["volume", "create", &g.name, &spec, "force"]).unwrap();
        g.created = true;
        // Without upcall invalidation a client keeps answering the old
        // name of an object another client renamed for as long as its
        // kernel holds the object (docs/scale-out.md).
        for opt in [
            "features.cache-invalidation",
            "performance.cache-invalidation",
        ] {
            gluster(&["volume", "set", &g.name, opt, "on"]).unwrap();
        }
        gluster(&["volume", "start", &g.name]).unwrap();
        Ok(g)
    }

    /// Mounts the volume with the GlusterFS FUSE client at a new directory.
    pub(crate) fn mount(&mut self, name: &str) -> Result<PathBuf, String> {
        let at = self.dir.path().join(name);
        fs::create_dir(&at).map_err(|e| e.to_string())?;
        let out = Command::new("timeout")
            .arg("60")
            .args(["mount", "-t", "glusterfs"])
            .arg(format!("127.0.0.1:/{}", self.name))
            .arg(&at)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "mount -t glusterfs: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        self.mounts.push(at.clone());
        Ok(at)
    }

    pub(crate) fn stop_volume(&self) {
        gluster(&["volume", "stop", &self.name]).unwrap();
    }

    pub(crate) fn start_volume(&self) {
        gluster(&["volume", "start", &self.name]).unwrap();
    }
}

impl Drop for Gluster {
    fn drop(&mut self) {
        for m in self.mounts.iter().rev() {
            let ok = Command::new("umount")
                .arg(m)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(m).status();
            }
        }
        if self.created {
            let _ = gluster(&["volume", "stop", &self.name, "force"]);
            if let Err(e) = gluster(&["volume", "delete", &self.name]) {
                eprintln!("cluster test cleanup: {e}");
            }
        }
        if let Some(pid) = self.glusterd {
            // SAFETY: signals to the glusterd this test started, by its pid.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            let gone = eventually(Duration::from_secs(10), || {
                !Path::new(&format!("/proc/{pid}")).exists()
            });
            if !gone {
                // SAFETY: as above.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    }
}

/// Every file and directory under `root` with a hash of its content:
/// equal manifests mean an equal tree.
fn manifest(root: &Path) -> BTreeMap<String, u64> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, u64>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let ft = e.file_type().unwrap();
            let mut h = std::collections::hash_map::DefaultHasher::new();
            if ft.is_dir() {
                "dir".hash(&mut h);
                out.insert(rel, h.finish());
                walk(root, &p, out);
            } else if ft.is_symlink() {
                fs::read_link(&p).unwrap().hash(&mut h);
                out.insert(rel, h.finish());
            } else {
                fs::read(&p).unwrap().hash(&mut h);
                out.insert(rel, h.finish());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The shared tree: skills and knowledge in markdown, a git repository
/// and a small C project.
fn fill_shared(v: &Path) {
    sh(
        v,
        "set -e
         mkdir -p skills knowledge/old repo proj
         for s in grep git make; do printf '# Skill %s\\nUse the %s tool.\\n' $s $s > skills/$s.md; done
         printf '# Notes\\n' > knowledge/notes.md
         printf 'old topic\\n' > knowledge/old/topic.md
         cd repo && git init -q && printf 'shared repo\\n' > README
         git add README && git -c user.name=admin -c user.email=admin@x commit -qm init && cd ..
         printf '#include <stdio.h>\\nint main(void) { puts(\"hello\"); return 0; }\\n' > proj/hello.c
         printf 'hello: hello.c\\n\\tcc -o hello hello.c\\n' > proj/Makefile",
    );
}

/// An agent's turn in workspace `k`: read and grep the shared tree, edit
/// and create files, commit in the shared repository, build.
fn agent(mnt: &Path, k: usize) -> String {
    sh(
        mnt,
        &format!(
            "set -e
             grep -rl tool skills | sort | tr '\\n' ' '; echo
             echo 'ws {k}' >> knowledge/notes.md
             echo 'agent {k}' > agent-{k}.txt
             cd repo && echo 'change {k}' >> README && git add README
             git -c user.name=ws{k} -c user.email=ws{k}@x commit -qm 'ws {k}' && cd ..
             make -s -C proj && ./proj/hello"
        ),
    )
}

#[test]
fn a_glusterfs_volume_as_the_shared_lower() {
    let mut g = match Gluster::start() {
        Ok(g) => g,
        Err(why) => {
            eprintln!("skipped: GlusterFS cannot run here: {why}");
            return;
        }
    };
    let lower = g.mount("client").expect("first client mount");
    let other_host = g.mount("other-host").expect("second client mount");
    fill_shared(&other_host);
    let shared_before = manifest(&other_host);

    let mut workspaces = Vec::new();
    for _ in 0..3 {
        let mut ws = Workspace::new();
        ws.lowers = vec![lower.clone()];
        workspaces.push(ws);
    }
    let mounts: Vec<Mount> = workspaces.iter().map(|w| w.mount()).collect();

    // Detected as a network lower: short cache timeout, no file handles.
    let l = lower_status(mounts[0].path());
    assert_eq!(l["fstype"], "fuse.glusterfs", "{l}");
    assert_eq!(l["network"], true, "{l}");
    assert_eq!(l["file_handles"], false, "{l}");
    assert_eq!(l["state"], "ok", "{l}");

    // The workload, in every workspace at once.
    let outs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = mounts
            .iter()
            .enumerate()
            .map(|(k, m)| s.spawn(move || agent(m.path(), k)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (k, m) in mounts.iter().enumerate() {
        assert_eq!(
            outs[k], "skills/git.md skills/grep.md skills/make.md \nhello\n",
            "ws {k}"
        );
        let p = m.path();
        assert_eq!(
            fs::read_to_string(p.join("knowledge/notes.md")).unwrap(),
            format!("# Notes\nws {k}\n"),
            "ws {k} sees only its own edit"
        );
        let agents = sh(p, "ls agent-*");
        assert_eq!(
            agents,
            format!("agent-{k}.txt\n"),
            "ws {k} sees another's file"
        );
        assert_eq!(
            sh(p, "git -C repo log --format=%s"),
            format!("ws {k}\ninit\n")
        );
        assert_eq!(sh(p, "git -C repo status --porcelain"), "");
    }
    assert_eq!(
        manifest(&other_host),
        shared_before,
        "the volume was written through a workspace"
    );

    // The other host updates the shared tree; every workspace shows each
    // change within the bound (--lower-timeout plus the GlusterFS
    // client's own caching).
    let ws_paths: Vec<PathBuf> = mounts.iter().map(|m| m.path().to_path_buf()).collect();
    type Seen = Box<dyn Fn(&Path) -> bool + Sync>;
    let updates: [(&str, &str, Seen); 4] = [
        (
            "new file",
            "echo 'new skill' > skills/new.md",
            Box::new(|m: &Path| {
                fs::read_dir(m.join("skills"))
                    .unwrap()
                    .any(|e| e.unwrap().file_name() == "new.md")
            }),
        ),
        (
            "edit",
            "echo 'Use grep -r.' >> skills/grep.md",
            Box::new(|m: &Path| {
                fs::read_to_string(m.join("skills/grep.md"))
                    .unwrap()
                    .contains("grep -r")
            }),
        ),
        (
            "delete",
            "rm skills/make.md",
            Box::new(|m: &Path| !m.join("skills/make.md").exists()),
        ),
        (
            "renamed dir",
            "mv knowledge/old knowledge/archive",
            // The old name is checked in the listing: a GlusterFS client
            // itself may go on resolving the old name of an object another
            // client renamed while the new one is in use (docs/scale-out.md).
            Box::new(|m: &Path| {
                let names: Vec<_> = fs::read_dir(m.join("knowledge"))
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect();
                m.join("knowledge/archive/topic.md").exists()
                    && names.iter().any(|n| n == "archive")
                    && !names.iter().any(|n| n == "old")
            }),
        ),
    ];
    for (what, script, seen) in &updates {
        // Warm the workspaces' caches with the state before.
        for p in &ws_paths {
            let _ = seen(p);
            sh(
                p,
                "ls -l skills knowledge > /dev/null; cat skills/grep.md > /dev/null",
            );
        }
        sh(&other_host, script);
        let times: Vec<Duration> = std::thread::scope(|s| {
            let hs: Vec<_> = ws_paths
                .iter()
                .map(|p| s.spawn(|| time_until(VISIBLE_WITHIN, || seen(p))))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap()
                        .unwrap_or_else(|| panic!("{what} not seen within {VISIBLE_WITHIN:?}"))
                })
                .collect()
        });
        eprintln!("glusterfs lower: {what} seen by the workspaces after {times:?}");
    }
    let shared_now = manifest(&other_host);
    assert!(shared_now.contains_key("skills/new.md") && !shared_now.contains_key("skills/make.md"));
    // The workspaces' own changes still stand over the updated tree.
    for (k, p) in ws_paths.iter().enumerate() {
        assert_eq!(
            fs::read_to_string(p.join(format!("agent-{k}.txt"))).unwrap(),
            format!("agent {k}\n")
        );
    }

    // A snapshot saved in workspace 0 restores in workspace 1 (another
    // host): the snapshot is a plain file, copied like any other.
    let state = |w: &Workspace| w.dir.path().join(".upper.layerfs-state/snapshots");
    let out = Command::new(bin())
        .args(["snapshot", "save"])
        .arg(&ws_paths[0])
        .arg("handover")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    fs::create_dir_all(state(&workspaces[1])).unwrap();
    fs::copy(
        state(&workspaces[0]).join("handover.tar"),
        state(&workspaces[1]).join("handover.tar"),
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["snapshot", "restore"])
        .arg(&ws_paths[1])
        .arg("handover")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let p1 = &ws_paths[1];
    assert_eq!(sh(p1, "ls agent-*"), "agent-0.txt\n");
    assert_eq!(
        fs::read_to_string(p1.join("knowledge/notes.md")).unwrap(),
        "# Notes\nws 0\n"
    );
    assert_eq!(sh(p1, "git -C repo log --format=%s"), "ws 0\ninit\n");
    assert_eq!(sh(p1, "./proj/hello"), "hello\n");
    assert_eq!(
        manifest(&other_host),
        shared_now,
        "the volume was written through a workspace"
    );

    // The volume goes away under load and comes back.
    fs::create_dir(ws_paths[2].join("work")).unwrap();
    fs::create_dir(ws_paths[0].join("own")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, p) = (stop.clone(), ws_paths[0].join("skills/git.md"));
        std::thread::spawn(move || {
            let mut log = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = fs::read_to_string(&p)
                    .map(|_| ())
                    .map_err(|e| e.raw_os_error());
                log.push((r, t.elapsed()));
                std::thread::sleep(Duration::from_millis(50));
            }
            log
        })
    };
    let writer = {
        let (stop, p) = (stop.clone(), ws_paths[2].join("work"));
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let f = p.join(format!("f{}", n % 20));
                let r = fs::write(&f, format!("{n}\n")).and_then(|_| fs::read_to_string(&f));
                if !matches!(&r, Ok(s) if *s == format!("{n}\n")) {
                    failures.push(format!("{f:?}: {r:?}"));
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            (n, failures)
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    g.stop_volume();
    let p0 = &ws_paths[0];
    let lost = eventually(Duration::from_secs(15), || {
        fs::read_to_string(p0.join("skills/grep.md")).is_err()
            && lower_status(p0)["state"] == "lost"
    });
    assert!(
        lost,
        "status did not report the lost lower: {}",
        status_json(p0)
    );
    let e = fs::read_to_string(p0.join("skills/git.md")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // Names the upper holds resolve without the lower.
    assert_eq!(
        fs::read_to_string(p0.join("agent-0.txt")).unwrap(),
        "agent 0\n"
    );
    let listing = sh(p0, "ls");
    assert!(listing.contains("agent-0.txt"), "{listing}");
    let commit = sh(
        &p0.join("own"),
        "git init -q g && cd g && echo a > a && git add a && \
         git -c user.name=t -c user.email=t@x commit -qm offline && git log --format=%s",
    );
    assert_eq!(commit, "offline\n");
    let text = Command::new(bin()).arg("status").arg(p0).output().unwrap();
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("LOST since"),
        "{text:?}"
    );
    // A new workspace over the lost lower is refused, saying why.
    let late = Workspace::new();
    let refused = Command::new(bin())
        .args(["mount", "--lower"])
        .arg(&lower)
        .arg("--upper")
        .arg(&late.upper)
        .arg(&late.mnt)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("does not reach its server"), "{why}");
    assert!(!is_mounted(&late.mnt));
    std::thread::sleep(Duration::from_secs(2));

    g.start_volume();
    let back = eventually(Duration::from_secs(60), || {
        fs::read_to_string(p0.join("skills/git.md")).is_ok() && lower_status(p0)["state"] == "ok"
    });
    assert!(back, "the lower did not come back: {}", status_json(p0));
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let reads = reader.join().unwrap();
    let (writes, failures) = writer.join().unwrap();
    assert!(
        failures.is_empty(),
        "upper-only work failed while the volume was away: {failures:?}"
    );
    assert!(writes > 20, "the writer hardly ran: {writes}");
    let slowest = reads.iter().map(|(_, t)| *t).max().unwrap_or_default();
    assert!(
        slowest < Duration::from_secs(10),
        "a lower read hung for {slowest:?}"
    );
    assert!(
        reads.iter().any(|(r, _)| r.is_err()),
        "no read saw the volume gone"
    );
    for (r, t) in &reads {
        assert!(
            matches!(r, Ok(()) | Err(Some(libc::EIO | libc::ETIMEDOUT))),
            "read gave {r:?} after {t:?}"
        );
    }
    assert!(
        matches!(reads.last(), Some((Ok(()), _))),
        "reads did not recover"
    );
    // After it is back the merged view is whole again.
    assert!(sh(p0, "ls").contains("skills"));
    let log = workspaces[0].daemon_log();
    assert!(log.contains("is lost") && log.contains("is back"), "{log}");
    assert_eq!(
        manifest(&other_host),
        shared_now,
        "the volume was written through a workspace"
    );
    drop(mounts);
}
