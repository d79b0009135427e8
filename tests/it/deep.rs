//! Deep trees: a tree 20,000 levels deep — far beyond PATH_MAX, so every
//! step must be relative to a directory fd — made through the mount by an
//! agent or directly in the upper by whoever can write it, is handled by
//! every command (gc, reset, diff, the run directory's cleanup, the quota
//! scan, status) and by the mount (lookups, listings, copy-up, `find` and
//! `rm -rf` through it, unmount). Before, a recursion per level overflowed
//! the stack of the thread walking the tree: the daemon aborted and the
//! mount answered ENOTCONN for everyone.
//!
//! Each test checks the result and that the daemon still serves. The
//! trees are made by `mkdirat`/`openat` in a loop (`harness::descend`),
//! on a tmpfs of the test's own: fast to make, and dropped whole at the
//! end (no recursive removal in the test itself).

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::harness::{descend, layerfs, open_in, read_all, Mount, Tmpfs, Workspace};

/// Levels of the deep trees: a path of them is 40,000 bytes, ten times
/// PATH_MAX.
const LEVELS: usize = 20_000;

/// A workspace on a tmpfs of its own. Dropping it unmounts the tmpfs
/// first (fields drop in order), so the deep trees go at once; a `Mount`
/// made from it is dropped before it, being declared after.
struct DeepWs {
    tmp: Tmpfs,
    ws: Workspace,
}

impl DeepWs {
    fn new() -> DeepWs {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let root = PathBuf::from(format!(
            "/var/tmp/layerfs-deep.{}.{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let tmp = Tmpfs::new(&root, "4g");
        fs::set_permissions(
            tmp.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        DeepWs {
            ws: Workspace::with_lowers_in(1, tmp.path()),
            tmp,
        }
    }
}

/// `d/d/…/d` (`levels` components).
fn deep_rel(levels: usize) -> String {
    vec!["d"; levels].join("/")
}

/// Makes `dir/d/d/…` (`levels` deep) with a file `leaf` holding `text` at
/// the bottom.
fn make_chain(dir: &Path, levels: usize, text: &str) {
    let bottom = descend(dir, levels, true);
    write!(
        open_in(&bottom, c"leaf", libc::O_CREAT | libc::O_WRONLY),
        "{text}"
    )
    .unwrap();
}

/// The names in the directory behind `fd`.
fn names_at(fd: &OwnedFd) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout)
            .chars()
            .take(2000)
            .collect::<String>(),
        String::from_utf8_lossy(&o.stderr)
            .chars()
            .take(2000)
            .collect::<String>()
    )
}

/// Runs `layerfs ARGS`, which must succeed; its stdout.
fn ok(args: &[&OsStr]) -> String {
    let o = layerfs(args);
    assert!(o.status.success(), "layerfs {args:?}: {}", text(&o));
    String::from_utf8(o.stdout).unwrap()
}

/// The daemon still runs, the mount answers, and `status` works.
fn assert_alive(d: &DeepWs, m: &Mount) {
    // SAFETY: kill with signal 0 only checks that the process exists.
    let alive = unsafe { libc::kill(m.pid() as libc::pid_t, 0) } == 0;
    assert!(alive, "the daemon is gone:\n{}", d.ws.daemon_log());
    let p = m.p("still-serving");
    fs::write(&p, b"yes")
        .unwrap_or_else(|e| panic!("the mount stopped serving ({e}):\n{}", d.ws.daemon_log()));
    assert_eq!(fs::read(&p).unwrap(), b"yes");
    fs::remove_file(&p).unwrap();
    let st = ok(&["status".as_ref(), m.path().as_os_str()]);
    assert!(st.contains("mountpoint"), "{st}");
}

fn status_json(m: &Mount) -> serde_json::Value {
    let out = ok(&["status".as_ref(), "--json".as_ref(), m.path().as_os_str()]);
    serde_json::from_str(out.lines().next().unwrap()).unwrap()
}

// -------------------------------------------------------------------- gc

/// `gc` of a scratch tree 20,000 levels deep made through the mount: it
/// overflowed the control connection's stack and killed the daemon.
#[test]
fn gc_empties_a_scratch_tree_20000_levels_deep_made_through_the_mount() {
    let d = DeepWs::new();
    let m = d.ws.mount_with(&["--scratch", "target/**"]);
    fs::create_dir(m.p("target")).unwrap();
    fs::write(m.p("kept.txt"), "kept").unwrap();
    make_chain(&m.p("target"), LEVELS, "leaf\n");
    let out = ok(&["gc".as_ref(), m.path().as_os_str()]);
    assert_eq!(out, "emptied target/d\n");
    assert_alive(&d, &m);
    assert!(names(&m.p("target")).is_empty());
    assert!(names(&d.ws.upper.join("target")).is_empty());
    assert!(names(&d.ws.work).is_empty(), "left in the work dir");
    assert_eq!(fs::read_to_string(m.p("kept.txt")).unwrap(), "kept");
    // The emptied name can be made again, as deep.
    make_chain(&m.p("target"), 100, "again\n");
    assert!(m.unmount(), "the daemon did not exit cleanly");
}

/// The same made directly in the upper, before the mount.
#[test]
fn gc_empties_a_scratch_tree_20000_levels_deep_made_in_the_upper() {
    let d = DeepWs::new();
    fs::create_dir(d.ws.upper.join("target")).unwrap();
    make_chain(&d.ws.upper.join("target"), LEVELS, "leaf\n");
    let m = d.ws.mount_with(&["--scratch", "target/**"]);
    let out = ok(&["gc".as_ref(), m.path().as_os_str()]);
    assert_eq!(out, "emptied target/d\n");
    assert_alive(&d, &m);
    assert!(names(&m.p("target")).is_empty());
    assert!(names(&d.ws.upper.join("target")).is_empty());
    assert!(m.unmount(), "the daemon did not exit cleanly");
}

// ----------------------------------------------------------------- reset

/// `reset` of a path 5,000 levels down a 20,000-level tree made through
/// the mount (the path itself is 10,000 bytes), then of the tree's top.
#[test]
fn reset_of_a_deep_path_and_of_the_parent_of_a_deep_tree() {
    let d = DeepWs::new();
    let m = d.ws.mount();
    fs::create_dir(m.p("work")).unwrap();
    make_chain(&m.p("work"), LEVELS, "leaf\n");
    let deep = format!("work/{}", deep_rel(5_000));
    assert!(deep.len() > libc::PATH_MAX as usize);
    let out = ok(&["reset".as_ref(), m.path().as_os_str(), deep.as_ref()]);
    assert!(out.contains(&deep), "{}", &out[..out.len().min(300)]);
    assert_alive(&d, &m);
    // Through the mount: the chain stops above the reset path ...
    let above = descend(&m.p("work"), 4_999, false);
    assert!(
        names_at(&above).is_empty(),
        "work/d… still holds the reset path"
    );
    drop(above);
    // ... and in the upper too.
    let above = descend(&d.ws.upper.join("work"), 4_999, false);
    assert!(names_at(&above).is_empty());
    drop(above);
    // The top of the tree: it was only in the upper, so it is gone.
    ok(&["reset".as_ref(), m.path().as_os_str(), "work".as_ref()]);
    assert_alive(&d, &m);
    assert!(!m.p("work").exists());
    assert_eq!(names(&d.ws.upper), Vec::<String>::new());
    assert!(names(&d.ws.work).is_empty(), "left in the work dir");
    assert!(m.unmount(), "the daemon did not exit cleanly");
}

// ------------------------------------------------------------------ diff

/// A tree 20,000 levels deep in both the lower and the upper (as copy-up
/// leaves it), one file changed and one added at the bottom: `diff` names
/// exactly those, in text, `--json` and `--patch`.
#[test]
fn diff_finds_the_changes_at_the_bottom_of_a_tree_20000_levels_deep() {
    let d = DeepWs::new();
    make_chain(d.ws.lower(), LEVELS, "old\n");
    make_chain(&d.ws.upper, LEVELS, "new\n");
    let bottom = descend(&d.ws.upper, LEVELS, false);
    writeln!(
        open_in(&bottom, c"added", libc::O_CREAT | libc::O_WRONLY),
        "added"
    )
    .unwrap();
    drop(bottom);
    let m = d.ws.mount();
    let rel = deep_rel(LEVELS);
    let mnt = m.path().as_os_str();
    let out = ok(&["diff".as_ref(), mnt]);
    assert_eq!(out, format!("A {rel}/added\nM {rel}/leaf\n"));
    let out = ok(&["diff".as_ref(), "--json".as_ref(), mnt]);
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{out:.300}");
    assert_eq!(lines[0]["path"], format!("{rel}/added"));
    assert_eq!(lines[0]["change"], "added");
    assert_eq!(lines[1]["path"], format!("{rel}/leaf"));
    assert_eq!(lines[1]["change"], "modified");
    assert_eq!(lines[1]["conflict"], false);
    let patch = ok(&["diff".as_ref(), "--patch".as_ref(), mnt]);
    assert!(patch.contains("\n-old\n+new\n"), "{patch:.300}");
    assert!(patch.contains("\n+added\n"), "{patch:.300}");
    assert_alive(&d, &m);
    // The mount shows the same: the upper's leaf at the bottom.
    let bottom = descend(m.path(), LEVELS, false);
    assert_eq!(read_all(open_in(&bottom, c"leaf", libc::O_RDONLY)), "new\n");
    drop(bottom);
    assert!(m.unmount(), "the daemon did not exit cleanly");
}

/// Two branches, each deeper than the levels whose shared directories
/// the diff keeps open: after the first, the shared version of their
/// parent is reopened to compare the second.
#[test]
fn diff_compares_a_second_deep_branch_after_a_first() {
    let d = DeepWs::new();
    for (layer, text) in [(d.ws.lower(), "old"), (d.ws.upper.as_path(), "new")] {
        for branch in ["a", "b", "c"] {
            let dir = layer.join("x").join(branch);
            fs::create_dir_all(&dir).unwrap();
            make_chain(&dir, 40, text);
        }
    }
    let m = d.ws.mount();
    let out = ok(&["diff".as_ref(), m.path().as_os_str()]);
    let rel = deep_rel(40);
    assert_eq!(
        out,
        format!("M x/a/{rel}/leaf\nM x/b/{rel}/leaf\nM x/c/{rel}/leaf\n")
    );
    assert_alive(&d, &m);
}

/// A new tree deeper than PATH_MAX: every level is one `A` line, in
/// `--files` text and `--json`, with its whole path; plain `diff` folds the
/// tree into one line that counts them.
#[test]
fn diff_lists_every_level_of_a_new_tree_deeper_than_path_max() {
    let d = DeepWs::new();
    let m = d.ws.mount();
    let levels = 3_000;
    make_chain(m.path(), levels, "x\n");
    let mnt = m.path().as_os_str();
    let out = ok(&["diff".as_ref(), mnt]);
    assert_eq!(out, format!("A {}/ ({levels} entries)\n", deep_rel(1)));
    let out = ok(&["diff".as_ref(), "--files".as_ref(), mnt]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), levels + 1);
    for (i, l) in lines[..levels].iter().enumerate() {
        assert_eq!(*l, format!("A {}", deep_rel(i + 1)));
    }
    assert_eq!(lines[levels], format!("A {}/leaf", deep_rel(levels)));
    let out = ok(&["diff".as_ref(), "--json".as_ref(), mnt]);
    let json: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(json.len(), levels + 1);
    assert_eq!(json[levels - 1]["path"], deep_rel(levels));
    assert_eq!(json[levels - 1]["type"], "dir");
    assert_eq!(json[levels]["type"], "file");
    assert_alive(&d, &m);
}

// ------------------------------------------------- run directory cleanup

/// `layerfs run --ephemeral` whose command builds a tree 20,000 levels
/// deep: the run's cleanup removes its whole directory.
#[test]
fn an_ephemeral_runs_cleanup_removes_a_tree_20000_levels_deep() {
    let d = DeepWs::new();
    let tmpdir = d.tmp.path().join("tmp");
    fs::create_dir(&tmpdir).unwrap();
    let script = format!(
        "import os\n\
         fd = os.open('.', os.O_RDONLY | os.O_DIRECTORY)\n\
         for _ in range({LEVELS}):\n\
         \x20   os.mkdir('d', dir_fd=fd)\n\
         \x20   n = os.open('d', os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)\n\
         \x20   os.close(fd)\n\
         \x20   fd = n\n\
         os.close(os.open('leaf', os.O_CREAT | os.O_WRONLY, dir_fd=fd))\n\
         print('built')\n"
    );
    let o = std::process::Command::new(crate::harness::bin())
        .args(["run", "--json", "--lower"])
        .arg(d.ws.lower())
        .args(["--ephemeral", "--", "python3", "-c", &script])
        .env("TMPDIR", &tmpdir)
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.starts_with("built\n"), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let upper = PathBuf::from(v["upper"].as_str().unwrap());
    assert!(upper.starts_with(&tmpdir), "{}", upper.display());
    assert!(!upper.exists(), "{} is left", upper.display());
    assert!(
        names(&tmpdir).is_empty(),
        "the run left {:?} ({})",
        names(&tmpdir),
        text(&o)
    );
}

// ---------------------------------------------------------------- copy-up

/// Writing a file at the bottom of a lower tree 5,000 levels deep copies
/// its whole chain of parents up; `diff` then names that one file.
#[test]
fn a_write_at_the_bottom_of_a_lower_tree_5000_levels_deep_copies_up_and_diffs() {
    let d = DeepWs::new();
    let levels = 5_000;
    make_chain(d.ws.lower(), levels, "leaf\n");
    let m = d.ws.mount();
    let bottom = descend(m.path(), levels, false);
    writeln!(
        open_in(&bottom, c"leaf", libc::O_WRONLY | libc::O_APPEND),
        "more"
    )
    .unwrap();
    assert_eq!(
        read_all(open_in(&bottom, c"leaf", libc::O_RDONLY)),
        "leaf\nmore\n"
    );
    drop(bottom);
    let up = descend(&d.ws.upper, levels, false);
    assert_eq!(
        read_all(open_in(&up, c"leaf", libc::O_RDONLY)),
        "leaf\nmore\n"
    );
    drop(up);
    let low = descend(d.ws.lower(), levels, false);
    assert_eq!(read_all(open_in(&low, c"leaf", libc::O_RDONLY)), "leaf\n");
    drop(low);
    let out = ok(&["diff".as_ref(), m.path().as_os_str()]);
    assert_eq!(out, format!("M {}/leaf\n", deep_rel(levels)));
    assert_alive(&d, &m);
    assert!(m.unmount(), "the daemon did not exit cleanly");
}

// ----------------------------------------------------------- quota, usage

/// The quota scan at mount counts every level of a tree 20,000 levels
/// deep in the upper, and the limit then holds exactly.
#[test]
fn the_quota_scan_at_mount_counts_a_tree_20000_levels_deep() {
    let d = DeepWs::new();
    make_chain(&d.ws.upper, LEVELS, "12345");
    let policy = d.ws.dir.path().join("policy");
    // 20,000 directories and one file, and room for 9 more.
    fs::write(&policy, format!("quota inodes={}\n", LEVELS + 10)).unwrap();
    let m = d.ws.mount_with(&["--policy", policy.to_str().unwrap()]);
    let v = status_json(&m);
    assert_eq!(v["upper_usage"]["inodes"], LEVELS + 1, "{v}");
    assert_eq!(v["upper_usage"]["bytes"], 5, "{v}");
    for i in 0..9 {
        fs::write(m.p(&format!("f{i}")), "").unwrap();
    }
    let e = fs::write(m.p("one-too-many"), "").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EDQUOT), "{e}");
    // Without a quota, status measures the upper (a walk of it) each time.
    drop(m);
    let m = d.ws.mount();
    let v = status_json(&m);
    assert_eq!(v["upper_usage"]["inodes"], LEVELS + 10, "{v}");
    assert_eq!(v["upper_usage"]["how"], "measured", "{v}");
    assert_alive(&d, &m);
}

// ------------------------------------------------------- through the mount

/// `find` and `rm -rf` through the mount over a tree 20,000 levels deep
/// that lies partly in the lower and partly in the upper; then unmount.
#[test]
fn find_and_rm_rf_through_the_mount_over_a_tree_20000_levels_deep() {
    let d = DeepWs::new();
    let half = LEVELS / 2;
    make_chain(d.ws.lower(), half, "low\n");
    make_chain(&d.ws.upper, LEVELS, "up\n");
    let m = d.ws.mount();
    let run = |script: &str| crate::harness::sh(m.path(), script);
    // A leaf at the bottom of each layer's part.
    assert_eq!(run("find d -name leaf | wc -l").trim(), "2");
    assert_eq!(
        run("find d -type d | wc -l")
            .trim()
            .parse::<usize>()
            .unwrap(),
        LEVELS
    );
    let bottom = descend(m.path(), LEVELS, false);
    assert_eq!(read_all(open_in(&bottom, c"leaf", libc::O_RDONLY)), "up\n");
    drop(bottom);
    assert_alive(&d, &m);
    run("rm -rf d");
    assert!(names(m.path()).is_empty());
    // The lower part is hidden by one whiteout, the upper part is gone.
    assert_eq!(names(&d.ws.upper), vec!["d".to_string()]);
    let st = fs::symlink_metadata(d.ws.upper.join("d")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &st.file_type()
    ));
    let low = descend(d.ws.lower(), half, false);
    assert_eq!(names_at(&low), vec!["leaf".to_string()]);
    drop(low);
    assert_alive(&d, &m);
    assert!(m.unmount(), "the daemon did not exit cleanly");
}

/// The daemon's resident memory (KiB).
fn rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A chain of 20,000 directories made through the mount costs the daemon
/// memory linear in its depth (each directory's lower path was a string
/// of its own, and each journal event carried the whole path: 1.1 GB
/// resident); unmounting while the kernel holds the whole chain (the inode
/// table drops it at once) ends the daemon cleanly.
#[test]
fn a_chain_of_20000_directories_costs_linear_memory_and_unmounts_cleanly() {
    let d = DeepWs::new();
    let m = d.ws.mount();
    make_chain(m.path(), LEVELS, "x");
    let rss = rss_kib(m.pid());
    assert!(
        rss < 200 * 1024,
        "daemon VmRSS {rss} KiB after a 20,000-level chain"
    );
    // Held open at the bottom while the mount is detached.
    let bottom = descend(m.path(), LEVELS, false);
    assert_alive(&d, &m);
    let st = std::process::Command::new("umount")
        .arg("-l")
        .arg(m.path())
        .status()
        .unwrap();
    assert!(st.success());
    drop(bottom);
    assert!(
        m.unmount(),
        "the daemon did not exit cleanly:\n{}",
        d.ws.daemon_log()
    );
}
