//! One upper, one mount (a second mount of an upper or work dir in use is
//! refused, naming the daemon holding it; a killed daemon never blocks
//! the next mount; a refused mount leaves no work dir behind) and panic
//! containment (a request handler that panics fails that request with
//! EIO, is logged, and the mount keeps serving).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::harness::{bin, errno, is_mounted, Workspace};

/// A second `layerfs mount` (background mode: returns once live or
/// refused); unmounts it on drop if it was accepted after all.
struct Second {
    mnt: PathBuf,
    out: Output,
}

impl Second {
    fn mount(ws: &Workspace, upper: &Path, work: &Path, name: &str) -> Second {
        let mnt = ws.dir.path().join(name);
        // (A stale mountpoint answers ENOTCONN: leave it to the mount.)
        let _ = fs::create_dir_all(&mnt);
        let out = Command::new(bin())
            .arg("mount")
            .arg("--lower")
            .arg(ws.lower())
            .arg("--upper")
            .arg(upper)
            .arg("--work")
            .arg(work)
            .arg(&mnt)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .expect("run layerfs mount");
        Second { mnt, out }
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
}

impl Drop for Second {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = Command::new(bin()).arg("umount").arg(&self.mnt).status();
        }
    }
}

#[test]
fn a_second_mount_of_an_upper_in_use_is_refused_naming_the_first() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("f"), b"lower").unwrap();
    let m = ws.mount();
    // Same upper, its own (new) work dir and mountpoint.
    let work2 = ws.dir.path().join("work2");
    let second = Second::mount(&ws, &ws.upper, &work2, "mnt2");
    assert!(!is_mounted(&second.mnt), "the same upper was mounted twice");
    assert_eq!(second.out.status.code(), Some(1));
    let err = second.stderr();
    assert!(
        err.contains("upper dir") && err.contains("already in use"),
        "{err}"
    );
    assert!(err.contains(&format!("pid {}", m.pid())), "{err}");
    assert!(!work2.exists(), "the refused mount left its work dir");
    // The first mount is unaffected.
    fs::write(m.p("f"), b"upper").unwrap();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"upper");
}

#[test]
fn a_work_dir_in_use_is_refused_even_with_another_upper() {
    let ws = Workspace::new();
    let m = ws.mount();
    let upper2 = ws.dir.path().join("upper2");
    fs::create_dir(&upper2).unwrap();
    let second = Second::mount(&ws, &upper2, &ws.work, "mnt2");
    assert!(!is_mounted(&second.mnt), "one work dir served two mounts");
    let err = second.stderr();
    assert!(
        err.contains("work dir") && err.contains("already in use"),
        "{err}"
    );
    assert!(err.contains(&format!("pid {}", m.pid())), "{err}");
    // The default work dir (next to the upper) is shared the same way.
    drop(m);
    let a = Second::mount(&ws, &ws.upper, &ws.work, "mnt-a");
    assert!(is_mounted(&a.mnt), "{}", a.stderr());
    let b = Second::mount(&ws, &ws.upper, &ws.work, "mnt-b");
    assert!(!is_mounted(&b.mnt));
    assert!(b.stderr().contains("already in use"), "{}", b.stderr());
}

#[test]
fn an_upper_mounts_again_after_its_daemon_was_killed() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("f"), b"lower").unwrap();
    let m = ws.mount();
    fs::write(m.p("f"), b"written").unwrap();
    // SAFETY: kill(2) on the daemon this test started.
    unsafe { libc::kill(m.pid() as i32, libc::SIGKILL) };
    // The dead daemon's locks went with it; the stale mountpoint is
    // recovered by the next mount of the same upper.
    let again = Second::mount(&ws, &ws.upper, &ws.work, "mnt");
    assert!(is_mounted(&again.mnt), "{}", again.stderr());
    assert_eq!(fs::read(again.mnt.join("f")).unwrap(), b"written");
    drop(again);
    drop(m);
}

#[test]
fn a_mount_refused_for_its_work_dir_leaves_no_work_dir_behind() {
    let ws = Workspace::new();
    // Inside the upper.
    let inside = ws.upper.join("work");
    let r = Second::mount(&ws, &ws.upper, &inside, "mnt");
    assert!(!is_mounted(&r.mnt));
    assert!(r.stderr().contains("nest"), "{}", r.stderr());
    assert!(!inside.exists(), "left {}", inside.display());
    // On another filesystem (tmpfs), when the upper is not on one.
    let shm = Path::new("/dev/shm");
    let upper_dev = std::os::unix::fs::MetadataExt::dev(&fs::metadata(&ws.upper).unwrap());
    if shm.is_dir() && std::os::unix::fs::MetadataExt::dev(&fs::metadata(shm).unwrap()) != upper_dev
    {
        let other = shm.join(format!("layerfs-test-work-{}", std::process::id()));
        let r = Second::mount(&ws, &ws.upper, &other, "mnt");
        assert!(!is_mounted(&r.mnt));
        assert!(
            r.stderr().contains("different filesystem"),
            "{}",
            r.stderr()
        );
        assert!(!other.exists(), "left {}", other.display());
    }
    // A work dir that existed before a refusal is left alone.
    fs::create_dir(&inside).unwrap();
    let r = Second::mount(&ws, &ws.upper, &inside, "mnt");
    assert!(!is_mounted(&r.mnt));
    assert!(
        inside.is_dir(),
        "removed a work dir the mount did not create"
    );
}

// ------------------------------------------------------------------ panics

/// Runs `f` on another thread and waits for it, failing (instead of
/// hanging the test run) if the mount stopped answering.
fn answered<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: no answer from the mount in 60 s (hung)")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: unexpected result"),
    }
}

#[test]
fn a_panicking_lookup_fails_with_eio_is_logged_and_the_mount_keeps_serving() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("f"), b"lower").unwrap();
    let m = ws.mount_env(
        &["--threads", "2"],
        &[("LAYERFS_FAILPOINT", "panic:lookup:boom")],
    );
    assert!(
        ws.daemon_log().contains("failpoint armed"),
        "{}",
        ws.daemon_log()
    );
    // More panics than worker threads: without containment each panic
    // ended a worker and the mount hung once none was left.
    for i in 0..6 {
        let p = m.p("boom");
        let e = answered("stat boom", move || fs::metadata(p).unwrap_err());
        assert_eq!(errno(&e), libc::EIO, "panic {i}");
        let f = m.p("f");
        let data = answered("read f", move || fs::read(f).unwrap());
        assert_eq!(data, b"lower");
    }
    let log = ws.daemon_log();
    assert!(
        log.contains("request handler panicked") && log.contains("lookup"),
        "{log}"
    );
    assert!(log.contains("failpoint lookup:\"boom\" hit"), "{log}");
    // Everything else still works, including creating the name itself
    // elsewhere, and the daemon unmounts cleanly.
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/g"), b"g").unwrap();
    assert_eq!(fs::read(m.p("d/g")).unwrap(), b"g");
    assert!(
        m.unmount(),
        "the daemon did not exit cleanly after the panics"
    );
}

#[test]
fn a_copy_up_that_panics_holding_its_lock_fails_with_eio_and_can_be_retried() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("f"), b"lower").unwrap();
    fs::write(ws.lower().join("other"), b"other").unwrap();
    let m = ws.mount_env(&[], &[("LAYERFS_FAILPOINT", "panic:copy_up:f")]);
    // Twice: the copy-up lock the first panic held was released, so the
    // second attempt panics again instead of waiting forever.
    for _ in 0..2 {
        let p = m.p("f");
        let e = answered("write f", move || fs::write(p, b"x").unwrap_err());
        assert_eq!(errno(&e), libc::EIO);
    }
    // Nothing half-copied is visible; the file still reads from the lower.
    assert_eq!(fs::read(m.p("f")).unwrap(), b"lower");
    assert!(!ws.upper.join("f").exists());
    fs::write(m.p("other"), b"changed").unwrap();
    assert_eq!(fs::read(ws.upper.join("other")).unwrap(), b"changed");
    let log = ws.daemon_log();
    assert!(log.contains("request handler panicked"), "{log}");
    drop(m);
    // The next mount clears the work dir the panicked copy-up left.
    let m = ws.mount();
    assert_eq!(fs::read_dir(&ws.work).unwrap().count(), 0);
    fs::write(m.p("f"), b"now").unwrap();
    assert_eq!(fs::read(ws.upper.join("f")).unwrap(), b"now");
}
