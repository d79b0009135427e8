//! A FUSE filesystem as the lower: what layerfs does for network lowers,
//! tested without a network filesystem. The lower of workspace B is the
//! mountpoint of another layerfs mount A (a `fuse.layerfs` filesystem);
//! a change made to A's own lower directly is, for B, a change made
//! behind its lower's back — as a change made on another host is for a
//! GlusterFS or NFS lower: B's inotify watch on A's mount never hears of
//! it. (`cluster.rs` runs the same checks on a real GlusterFS volume.)

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use layerfs::host::pidfile;

use crate::daemon::{
    as_nobody, chown_tree, mount_args, text, BgMount, DevFuseOpen, DEV_FUSE, NOBODY,
};
use crate::harness::*;

/// `layerfs status --json MNT`, parsed.
pub(crate) fn status_json(mnt: &Path) -> Value {
    let out = Command::new(bin())
        .args(["status", "--json"])
        .arg(mnt)
        .output()
        .expect("run layerfs status");
    assert!(out.status.success(), "status: {}", text(&out));
    serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
}

/// The status of lower #1 of a mount.
pub(crate) fn lower_status(mnt: &Path) -> Value {
    status_json(mnt)["layers"]["lowers"][0].clone()
}

/// Polls every 20 ms until `seen` holds; the time it took, or `None`
/// after `limit`.
pub(crate) fn time_until(limit: Duration, mut seen: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if seen() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A changed lower must show within this: well past `--lower-timeout`
/// (1 s) and well short of the minute a watched lower directory is
/// cached for, which is what a network lower got before.
pub(crate) const VISIBLE_WITHIN: Duration = Duration::from_secs(10);

/// Changes `shared` (the lower of the lower) in four ways and checks that
/// `mnt` shows each within `VISIBLE_WITHIN`, reading through `run`
/// (`sh -c SCRIPT` as the caller of the test). Returns the times taken.
fn changes_show(shared: &Path, mnt: &Path, run: &dyn Fn(&str) -> String) -> Vec<Duration> {
    let m = mnt.display();
    // Warm every cache on the way: listings, names, attributes, pages.
    run(&format!(
        "ls -la {m}/docs >/dev/null; cat {m}/docs/guide.md {m}/docs/old.md >/dev/null; \
         test ! -e {m}/docs/new.md"
    ));
    let mut times = Vec::new();
    fs::write(shared.join("docs/new.md"), "new\n").unwrap();
    times.push(time_until(VISIBLE_WITHIN, || {
        run(&format!("ls {m}/docs")).contains("new.md")
    }));
    fs::write(shared.join("docs/guide.md"), "guide v2, longer\n").unwrap();
    times.push(time_until(VISIBLE_WITHIN, || {
        run(&format!("cat {m}/docs/guide.md")) == "guide v2, longer\n"
    }));
    fs::remove_file(shared.join("docs/old.md")).unwrap();
    times.push(time_until(VISIBLE_WITHIN, || {
        run(&format!("test -e {m}/docs/old.md && echo yes || echo no")) == "no\n"
    }));
    fs::rename(shared.join("docs"), shared.join("manual")).unwrap();
    times.push(time_until(VISIBLE_WITHIN, || {
        run(&format!("ls {m}")).contains("manual")
            && run(&format!("cat {m}/manual/guide.md")) == "guide v2, longer\n"
    }));
    let names = ["new file", "edit", "delete", "renamed dir"];
    times
        .into_iter()
        .zip(names)
        .map(|(t, what)| {
            t.unwrap_or_else(|| {
                panic!("{what} in the shared tree did not show in {m} within {VISIBLE_WITHIN:?}")
            })
        })
        .collect()
}

fn fill(shared: &Path) {
    fs::create_dir_all(shared.join("docs")).unwrap();
    fs::write(shared.join("docs/guide.md"), "guide v1\n").unwrap();
    fs::write(shared.join("docs/old.md"), "old\n").unwrap();
}

#[test]
fn a_fuse_lower_is_served_as_a_network_lower() {
    let a = Workspace::new();
    fill(a.lower());
    let a_mnt = a.mount_with(&["--allow-other"]);

    let mut b = Workspace::new();
    b.lowers = vec![a.mnt.clone()];
    let b_mnt = b.mount();

    // Detected: FUSE, so no watch can see outside changes, and no handles.
    let l = lower_status(b_mnt.path());
    assert_eq!(l["fstype"], "fuse.layerfs", "{l}");
    assert_eq!(l["network"], true, "{l}");
    assert_eq!(l["file_handles"], false, "{l}");
    assert_eq!(l["changes_show_within_ms"], 1000, "{l}");
    assert_eq!(l["state"], "ok", "{l}");
    let out = Command::new(bin())
        .arg("status")
        .arg(b_mnt.path())
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains(
            "fuse.layerfs from layerfs, network: changes made elsewhere show within 1000 ms"
        ),
        "{shown}"
    );
    // A's own lower is local and watched.
    assert_eq!(lower_status(a_mnt.path())["network"], false);

    let times = changes_show(a.lower(), b_mnt.path(), &|script| {
        sh(Path::new("/"), script)
    });
    eprintln!("fuse lower, root daemon: changes showed after {times:?}");
    // The shared tree was never written through B.
    assert!(!a.upper.join("manual").exists() && !a.upper.join("docs").exists());
    drop(b_mnt);
    drop(a_mnt);
}

#[test]
fn an_unprivileged_daemon_serves_a_fuse_lower_as_a_network_lower() {
    let _serial = DEV_FUSE.lock().unwrap_or_else(|e| e.into_inner());
    let a = Workspace::new();
    fill(a.lower());
    fs::set_permissions(a.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let a_mnt = a.mount_with(&["--allow-other"]);

    let mut b = Workspace::new();
    b.lowers = vec![a.mnt.clone()];
    fs::create_dir(&b.work).unwrap();
    fs::set_permissions(b.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    chown_tree(b.dir.path()).unwrap();
    let _dev = DevFuseOpen::new();
    let out = as_nobody(&bin(), &mount_args(&b, &[]));
    let _b_mnt = BgMount {
        mnt: b.mnt.clone(),
        pid: pidfile::find_daemon(&b.mnt, Some(NOBODY)),
    };
    assert!(out.status.success(), "unprivileged mount: {}", text(&out));

    let st = as_nobody(
        &bin(),
        &[
            "status".into(),
            "--json".into(),
            b.mnt.display().to_string(),
        ],
    );
    let v: Value = serde_json::from_slice(&st.stdout).unwrap_or_else(|_| panic!("{}", text(&st)));
    assert_eq!(v["layers"]["lowers"][0]["network"], true, "{v}");

    let run = |script: &str| {
        let o = as_nobody(Path::new("/bin/sh"), &["-c".into(), script.into()]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let times = changes_show(a.lower(), &b.mnt, &run);
    eprintln!("fuse lower, unprivileged daemon: changes showed after {times:?}");
    // The caller's own work lands in B's upper, not in A.
    let o = as_nobody(
        Path::new("/bin/sh"),
        &[
            "-c".into(),
            format!("echo mine > {}/mine.md", b.mnt.display()),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(b.upper.join("mine.md").exists());
    assert!(!a.lower().join("mine.md").exists() && !a.upper.join("mine.md").exists());
    let o = as_nobody(&bin(), &["umount".into(), b.mnt.display().to_string()]);
    assert!(o.status.success(), "{}", text(&o));
    drop(a_mnt);
}

/// Sends SIGCONT to a stopped daemon when dropped, so a failing test
/// never leaves a mount whose daemon cannot answer its unmount.
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        // SAFETY: kill only sends a signal to a process this test started.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

#[test]
fn a_lower_that_stops_answering_does_not_stall_upper_work() {
    let a = Workspace::new();
    fill(a.lower());
    for i in 0..8 {
        fs::write(a.lower().join(format!("docs/f{i}")), format!("{i}\n")).unwrap();
    }
    let a_mnt = a.mount_with(&["--allow-other"]);
    let mut b = Workspace::new();
    b.lowers = vec![a.mnt.clone()];
    // An upper-only directory the kernel has not looked up yet: reaching
    // it means a lookup in the merged root, which also asks the lower.
    fs::create_dir(b.upper.join("work")).unwrap();
    fs::write(b.upper.join("work/before"), "kept\n").unwrap();
    let b_mnt = b.mount_with(&["--threads", "4"]);
    let m = b_mnt.path().to_path_buf();

    // A's daemon stops answering: every request B makes on its lower
    // hangs, as on a network filesystem whose server froze.
    // SAFETY: a signal to the daemon this test started.
    assert_eq!(unsafe { libc::kill(a_mnt.pid() as i32, libc::SIGSTOP) }, 0);
    let resume = Resume(a_mnt.pid());
    // Six readers of one file: the kernel sends one lookup for them all,
    // so the hung lower holds one of B's three lower slots and leaves the
    // other two free.
    let mut readers = Vec::new();
    for _ in 0..6 {
        let p = m.join("docs/f0");
        readers.push(std::thread::spawn(move || {
            let t = Instant::now();
            (
                fs::read_to_string(&p).map_err(|e| e.raw_os_error()),
                t.elapsed(),
            )
        }));
    }
    // However few slots the stuck readers hold (their lookups of `docs`
    // share one), once one has been stuck for the stall limit and a probe
    // of the lower's root has gone unanswered, the daemon knows the lower
    // does not answer. Wait for that (status probes too), so that the
    // upper-only work below starts after it, whatever the machine's load.
    assert!(
        eventually(Duration::from_secs(60), || {
            let st = status_json(&m);
            st["layers"]["stalled_requests"].as_u64() >= Some(1)
                && st["layers"]["lowers"][0]["not_answering_seconds"].as_u64() >= Some(3)
        }),
        "the daemon never saw the lower stop answering: {}",
        status_json(&m)
    );

    // Upper-only work goes on without waiting for the lower: names the
    // upper holds resolve without it, though slots are free.
    let t = Instant::now();
    let out = bash(
        Path::new("/"),
        &format!(
            "set -e; cd {m}/work; timeout 60 sh -c 'echo new > new; cat new before; mkdir -p d/e; \
             echo x > d/e/f; ls; mv new renamed; rm before; ls'",
            m = m.display()
        ),
    );
    let upper_time = t.elapsed();
    assert!(out.status.success(), "upper-only work failed: {out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "new\nkept\nbefore\nd\nnew\nd\nrenamed\n"
    );
    assert!(
        upper_time < Duration::from_secs(30),
        "upper-only work took {upper_time:?}"
    );

    // A read of the lower now fails at once with ETIMEDOUT.
    let t = Instant::now();
    let e = fs::read_to_string(m.join("docs/f7")).expect_err("the lower does not answer");
    assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT), "{e}");
    assert!(t.elapsed() < Duration::from_secs(30));
    let st = status_json(&m);
    assert!(st["layers"]["refused_requests"].as_u64() > Some(0), "{st}");

    // The lower answers again: the requests that waited complete, and
    // the lower reads again.
    drop(resume);
    let mut done = 0;
    for r in readers {
        let (res, took) = r.join().unwrap();
        match res {
            Ok(_) => done += 1,
            Err(e) => assert_eq!(e, Some(libc::ETIMEDOUT), "after {took:?}"),
        }
    }
    assert!(done >= 1, "no waiting reader completed");
    assert!(
        eventually(Duration::from_secs(20), || fs::read_to_string(
            m.join("docs/f7")
        )
        .is_ok_and(|s| s == "7\n")),
        "the lower did not read again"
    );
    assert_eq!(fs::read_to_string(m.join("work/renamed")).unwrap(), "new\n");
    drop(b_mnt);
    drop(a_mnt);
}
