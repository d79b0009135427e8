//! One upper, one mount (a second mount of an upper or work dir in use is
//! refused, naming the daemon holding it; a killed daemon never blocks
//! the next mount; a refused mount leaves no work dir behind).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::harness::{bin, is_mounted, Workspace};

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
