//! Read ahead across small lower files (`fuse::prefetch`): opening the
//! small lower files of a directory in its listing's order makes the
//! daemon ask the next ones into the lower's page cache. Seen from outside
//! the mount, with the lower files' own page-cache residency (`mincore` on
//! a mapping of the LOWER file): files not yet opened become resident, a
//! walk that only stats reads nothing, what is read through the mount is
//! the file as it is when opened, and an unmount with reads ahead under
//! way ends the daemon.

use std::fs;
use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::basic::fsutil::write;
use crate::harness::{eventually, Workspace};

/// Files per test directory, each a few KiB (below the 128 KiB fill limit).
const FILES: usize = 40;

fn content(i: usize, salt: u8) -> Vec<u8> {
    (0..3000 + i * 97)
        .map(|k| (k % 251) as u8 ^ i as u8 ^ salt)
        .collect()
}

/// A lower directory `rel` of `FILES` small files.
fn fill_dir(ws: &Workspace, rel: &str) {
    for i in 0..FILES {
        write(&ws.lower().join(format!("{rel}/f{i:03}")), &content(i, 0));
    }
}

/// Drops the page cache of every file under `dir` (written back first),
/// file by file: nothing else on the machine is evicted.
fn drop_pages(dir: &Path) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            drop_pages(&p);
            continue;
        }
        let f = fs::File::open(&p).unwrap();
        f.sync_all().unwrap();
        // SAFETY: plain syscall on an fd the File holds.
        let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(r, 0, "fadvise DONTNEED {}", p.display());
    }
}

/// Pages of `p` in the page cache (`mincore` on a shared read mapping).
fn resident(p: &Path) -> usize {
    let f = fs::File::open(p).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    if len == 0 {
        return 0;
    }
    // SAFETY: a fresh shared read-only mapping of a file we hold open;
    // nothing reads through it, it is only asked for residency and unmapped.
    unsafe {
        let addr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(addr, libc::MAP_FAILED, "mmap {}", p.display());
        let pages = len.div_ceil(4096);
        let mut vec = vec![0u8; pages];
        let r = libc::mincore(addr, len, vec.as_mut_ptr());
        libc::munmap(addr, len);
        assert_eq!(r, 0, "mincore {}", p.display());
        vec.iter().filter(|b| **b & 1 != 0).count()
    }
}

/// The directory's names as the mount lists them (its lower's order).
fn listed(m_dir: &Path) -> Vec<String> {
    fs::read_dir(m_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

/// Whether dropping pages works where the tests run (not on tmpfs, whose
/// pages are the files themselves): otherwise residency shows nothing.
fn pages_can_drop(ws: &Workspace, rel: &str, probe: &str) -> bool {
    drop_pages(&ws.lower().join(rel));
    let p = ws.lower().join(probe);
    if resident(&p) == 0 {
        return true;
    }
    eprintln!("skipped: the test dir's pages cannot be dropped (tmpfs?)");
    false
}

fn lower_files_resident(ws: &Workspace, rel: &str, names: &[String]) -> Vec<String> {
    names
        .iter()
        .filter(|n| resident(&ws.lower().join(format!("{rel}/{n}"))) > 0)
        .cloned()
        .collect()
}

/// A mount over a lower directory `d` of `FILES` small files, its names in
/// the mount's listing order, its lower pages dropped; `None` where pages
/// cannot be dropped.
fn mounted_dir(ws: &Workspace) -> Option<(crate::harness::Mount, Vec<String>)> {
    fill_dir(ws, "d");
    let m = ws.mount();
    let names = listed(&m.p("d"));
    assert_eq!(names.len(), FILES);
    pages_can_drop(ws, "d", "d/f000").then_some((m, names))
}

/// Opening the first files of a directory in its listing's order makes
/// files not yet opened resident in the lower's page cache. (Without read
/// ahead, only the files opened are.)
#[test]
fn opening_small_lower_files_in_order_reads_the_next_ones_ahead() {
    let ws = Workspace::new();
    let Some((m, names)) = mounted_dir(&ws) else {
        return;
    };
    for n in &names[..3] {
        let i: usize = n[1..].parse().unwrap();
        assert!(fs::read(m.p(&format!("d/{n}"))).unwrap() == content(i, 0));
    }
    let rest = &names[3..];
    assert!(
        eventually(Duration::from_secs(5), || {
            !lower_files_resident(&ws, "d", rest).is_empty()
        }),
        "no file after the three opened became resident"
    );
    // Read ahead follows the walk: by its end every file was asked.
    for n in rest {
        let i: usize = n[1..].parse().unwrap();
        assert!(fs::read(m.p(&format!("d/{n}"))).unwrap() == content(i, 0));
    }
    drop(m);
}

/// A caller reading small lower files that lists another directory (a
/// walk entering it) has that directory's first files read ahead before
/// it opens any of them. (Without it, only files of directories with an
/// open are.)
#[test]
fn a_reading_walk_entering_a_directory_reads_its_first_files_ahead() {
    let ws = Workspace::new();
    fill_dir(&ws, "e");
    let Some((m, names)) = mounted_dir(&ws) else {
        return;
    };
    drop_pages(&ws.lower().join("e"));
    for n in &names[..2] {
        fs::read(m.p(&format!("d/{n}"))).unwrap();
    }
    let e_names = listed(&m.p("e"));
    assert!(
        eventually(Duration::from_secs(5), || {
            !lower_files_resident(&ws, "e", &e_names).is_empty()
        }),
        "no file of the directory listed became resident"
    );
    drop(m);
}

/// A walk that only stats (find, ls -lR) reads no file data: nothing
/// becomes resident.
#[test]
fn a_walk_that_only_stats_reads_nothing_ahead() {
    let ws = Workspace::new();
    fill_dir(&ws, "a");
    fill_dir(&ws, "a/b");
    let m = ws.mount();
    if !pages_can_drop(&ws, "a", "a/b/f000") {
        return;
    }
    let out = std::process::Command::new("ls")
        .arg("-lR")
        .arg(m.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = std::process::Command::new("find")
        .arg(m.path())
        .args(["-type", "f", "-printf", "%s %m\n"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        out.stdout.iter().filter(|b| **b == b'\n').count(),
        2 * FILES
    );
    std::thread::sleep(Duration::from_millis(500));
    for rel in ["a", "a/b"] {
        let names: Vec<String> = (0..FILES).map(|i| format!("f{i:03}")).collect();
        let hot = lower_files_resident(&ws, rel, &names);
        assert!(hot.is_empty(), "{rel}: read by a stat-only walk: {hot:?}");
    }
    drop(m);
}

/// Read ahead is a hint only: a lower file changed (in place, or replaced
/// by a rename) after the files before it were opened and read ahead is
/// read through the mount as it is when it is opened.
#[test]
fn a_lower_file_changed_during_the_walk_reads_as_changed() {
    let ws = Workspace::new();
    let Some((m, names)) = mounted_dir(&ws) else {
        return;
    };
    let idx = |n: &str| -> usize { n[1..].parse().unwrap() };
    for n in &names[..4] {
        assert!(fs::read(m.p(&format!("d/{n}"))).unwrap() == content(idx(n), 0));
    }
    // Asked ahead by now (see the first test); then changed outside.
    let (inplace, renamed) = (&names[5], &names[6]);
    eventually(Duration::from_secs(5), || {
        resident(&ws.lower().join(format!("d/{inplace}"))) > 0
    });
    let lower = |n: &str| -> PathBuf { ws.lower().join(format!("d/{n}")) };
    fs::write(lower(inplace), content(idx(inplace), 7)).unwrap();
    let tmp = ws.lower().join("d-new");
    fs::write(&tmp, content(idx(renamed) + 1, 9)).unwrap();
    fs::rename(&tmp, lower(renamed)).unwrap();
    for (n, want) in [
        (inplace, content(idx(inplace), 7)),
        (renamed, content(idx(renamed) + 1, 9)),
    ] {
        let p = m.p(&format!("d/{n}"));
        assert!(
            eventually(Duration::from_secs(3), || fs::read(&p)
                .is_ok_and(|d| d == want)),
            "{n}: the change did not show through the mount"
        );
    }
    // The rest reads as it always was.
    for n in &names[4..] {
        if n != inplace && n != renamed {
            assert!(fs::read(m.p(&format!("d/{n}"))).unwrap() == content(idx(n), 0));
        }
    }
    drop(m);
}

/// Unmounting while reads ahead are under way ends the daemon cleanly.
#[test]
fn unmount_with_reads_ahead_under_way_ends_the_daemon() {
    let ws = Workspace::new();
    for d in 0..20 {
        fill_dir(&ws, &format!("t/d{d:02}"));
    }
    let m = ws.mount();
    let pid = m.pid();
    let mut dirs = listed(&m.p("t"));
    dirs.sort();
    if !pages_can_drop(&ws, "t", "t/d00/f000") {
        return;
    }
    // The first files of every directory: each starts a read ahead.
    for d in &dirs {
        for n in listed(&m.p(&format!("t/{d}"))).iter().take(2) {
            let mut f = fs::File::open(m.p(&format!("t/{d}/{n}"))).unwrap();
            let mut buf = Vec::new();
            f.read_to_end(&mut buf).unwrap();
        }
    }
    assert!(m.unmount(), "the daemon exits with success");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "no daemon left"
    );
}
