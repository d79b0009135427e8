//! Sharing a mount: a workspace served with `--allow-other`, used by
//! another user (`tests`, uid 1001) acting as a hostile co-tenant would.
//! What they do must stay within the mount's own bounds (the inotify
//! watch cap, the journal's size cap) and be attributed to them in the
//! journal, whatever their processes call themselves.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::harness::layerfs_quiet;
use crate::harness::{eventually, Mount, Workspace};
use crate::state::{log_rows, poll_log, state_dir, status_json, stderr, stdout, Control};

const TESTS_UID: u64 = 1001;

/// A workspace another user can reach (tempdirs are 0700).
fn shared_workspace() -> Workspace {
    let ws = Workspace::new();
    fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    for l in &ws.lowers {
        fs::set_permissions(l, fs::Permissions::from_mode(0o755)).unwrap();
    }
    ws
}

/// A directory of the mount everyone may write in.
fn public_dir(m: &Mount) -> PathBuf {
    let p = m.p("pub");
    fs::create_dir(&p).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o777)).unwrap();
    p
}

/// Runs `args` as user `tests` in `dir`.
fn as_tests(dir: &Path, args: &[&str]) -> Output {
    Command::new("runuser")
        .args(["-u", "tests", "--"])
        .args(args)
        .env("RUST_LOG", "warn")
        .current_dir(dir)
        .output()
        .expect("run runuser")
}

fn rows_of<'a>(rows: &'a [Value], op: &str, path: &str) -> Vec<&'a Value> {
    rows.iter()
        .filter(|r| r["op"] == json!(op) && r["path"] == json!(path))
        .collect()
}

// ------------------------------------------------------------ attribution

/// A user's copy of `dash` named `git` writes rows whose comm says `git`;
/// the uid and gid the kernel gives with each request say who it was.
#[test]
fn journal_rows_carry_the_callers_uid_and_gid_whatever_the_process_calls_itself() {
    let ws = shared_workspace();
    let m = ws.mount_with(&["--allow-other"]);
    let public = public_dir(&m);
    let tools = ws.dir.path().join("tools");
    fs::create_dir(&tools).unwrap();
    let git = tools.join("git");
    fs::copy("/bin/dash", &git).unwrap();
    fs::set_permissions(&git, fs::Permissions::from_mode(0o755)).unwrap();
    let out = as_tests(
        &public,
        &[git.to_str().unwrap(), "-c", "echo theirs > theirs.txt"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    fs::write(m.p("mine.txt"), "mine").unwrap();

    let rows = poll_log(m.path(), |r| {
        !rows_of(r, "write", "pub/theirs.txt").is_empty()
            && !rows_of(r, "write", "mine.txt").is_empty()
    });
    for op in ["create", "write"] {
        for r in rows_of(&rows, op, "pub/theirs.txt") {
            assert_eq!(r["comm"], json!("git"), "{r}");
            assert_eq!(r["uid"], json!(TESTS_UID), "{r}");
            assert_eq!(r["gid"], json!(TESTS_UID), "{r}");
            assert_eq!(r["user"], json!("tests"), "{r}");
        }
        for r in rows_of(&rows, op, "mine.txt") {
            assert_eq!(r["uid"], json!(0), "{r}");
            assert_eq!(r["gid"], json!(0), "{r}");
            assert_eq!(r["user"], json!("root"), "{r}");
        }
    }

    // Text output: one line a row, the uid (and its name) on it.
    let out = layerfs_quiet(&[
        "log",
        "--path",
        "pub/theirs.txt",
        m.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 2, "{text}");
    for line in text.lines() {
        assert!(line.contains("uid 1001 (tests) gid 1001"), "{line}");
        assert!(line.contains("(git)"), "{line}");
    }

    // Filters by number and by name select exactly that user's rows.
    let mnt = m.path();
    for sel in ["tests", "1001"] {
        let theirs = log_rows(mnt, &["--uid", sel]);
        assert!(theirs.len() >= 2, "{theirs:#?}");
        assert!(
            theirs.iter().all(|r| r["uid"] == json!(TESTS_UID)),
            "{theirs:#?}"
        );
    }
    let root_rows = log_rows(mnt, &["--uid", "root"]);
    assert!(!rows_of(&root_rows, "create", "mine.txt").is_empty());
    assert!(rows_of(&root_rows, "create", "pub/theirs.txt").is_empty());
    let out = layerfs_quiet(&["log", "--uid", "no-such-user-here", mnt.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no-such-user-here"),
        "{}",
        stderr(&out)
    );
    drop(m);
}

/// The columns of the journal before uid and gid were recorded.
const OLD_SCHEMA: &str = "
CREATE TABLE events (
    id     INTEGER PRIMARY KEY,
    time   INTEGER NOT NULL,
    op     TEXT NOT NULL,
    path   TEXT NOT NULL,
    \"to\"   TEXT,
    result TEXT NOT NULL,
    bytes  INTEGER,
    pid    INTEGER,
    comm   TEXT,
    rule   TEXT
);
CREATE INDEX events_time ON events(time);
";

fn micros_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// A journal written by an older layerfs (no uid or gid columns) is read
/// as it is, and a mount adds the columns without losing its rows.
#[test]
fn an_old_journal_without_uid_columns_is_read_and_migrated() {
    let ws = Workspace::new();
    // A workspace mounted before (its state dir describes it), whose
    // journal an older layerfs wrote.
    assert!(ws.mount().unmount());
    let state = state_dir(&ws);
    let db = state.join("journal.db");
    for f in ["journal.db", "journal.db-wal", "journal.db-shm"] {
        let _ = fs::remove_file(state.join(f));
    }
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        c.execute_batch(OLD_SCHEMA).unwrap();
        c.execute(
            "INSERT INTO events (time, op, path, result, pid, comm)
             VALUES (?1, 'create', 'old.txt', 'ok', 42, 'vim')",
            [micros_now() - 3_600_000_000],
        )
        .unwrap();
    }
    fs::set_permissions(&db, fs::Permissions::from_mode(0o600)).unwrap();

    // Read before any mount touched it.
    let rows = log_rows(&ws.upper, &[]);
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert!(rows[0]["uid"].is_null(), "{rows:#?}");
    let out = layerfs_quiet(&["log", ws.upper.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("pid 42 (vim)"), "{}", stdout(&out));

    let m = ws.mount();
    fs::write(m.p("new.txt"), "new").unwrap();
    let rows = poll_log(m.path(), |r| !rows_of(r, "create", "new.txt").is_empty());
    let old = rows_of(&rows, "create", "old.txt");
    assert_eq!(old.len(), 1, "the old row survives: {rows:#?}");
    assert!(old[0]["uid"].is_null(), "{rows:#?}");
    assert_eq!(old[0]["comm"], json!("vim"));
    assert_eq!(rows_of(&rows, "create", "new.txt")[0]["uid"], json!(0));
    // A uid filter never matches a row that does not know its uid.
    let mine = log_rows(m.path(), &["--uid", "0"]);
    assert!(rows_of(&mine, "create", "old.txt").is_empty(), "{mine:#?}");
    assert!(!rows_of(&mine, "create", "new.txt").is_empty(), "{mine:#?}");
    assert!(m.unmount());
    // And the migrated journal mounts again.
    let m = ws.mount();
    fs::write(m.p("again.txt"), "again").unwrap();
    poll_log(m.path(), |r| {
        !rows_of(r, "create", "again.txt").is_empty() && !rows_of(r, "create", "old.txt").is_empty()
    });
    drop(m);
}

// ------------------------------------------------------------- trimming

fn time_of(v: &Value) -> SystemTime {
    humantime::parse_rfc3339(v.as_str().unwrap_or_else(|| panic!("no time: {v}"))).unwrap()
}

/// Every event written is either still a row or counted by the one
/// `journal-trimmed` row: `rows + trimmed == written`, for a journal this
/// mount started.
fn assert_accounted(m: &Mount) -> Vec<Value> {
    let mut last = (Vec::new(), Value::Null);
    let ok = eventually(Duration::from_secs(20), || {
        let status = status_json(m.path());
        let rows = log_rows(m.path(), &[]);
        let trimmed: u64 = rows
            .iter()
            .filter(|r| r["op"] == json!("journal-trimmed"))
            .map(|r| r["bytes"].as_u64().unwrap())
            .sum();
        let kept = rows
            .iter()
            .filter(|r| r["op"] != json!("journal-trimmed"))
            .count() as u64;
        let written = status["journal"]["written"].as_u64().unwrap();
        last = (rows, status);
        kept + trimmed == written && written > 0
    });
    let (rows, status) = last;
    assert!(
        ok,
        "rows and trimmed counts do not add up to the rows written: {}\n{rows:#?}",
        status["journal"]
    );
    assert_eq!(
        status["journal"]["dropped"],
        json!(0),
        "{}",
        status["journal"]
    );
    rows
}

/// Trimming by size leaves a row saying how many rows of what time span
/// went, so evidence never vanishes without a trace.
#[test]
fn trimming_by_size_leaves_a_row_saying_how_many_rows_of_what_time_went() {
    let ws = Workspace::new();
    let m = ws.mount_with(&["--journal-max-size", "64K"]);
    crate::harness::sh(m.path(), "for i in $(seq 1500); do echo x > f$i; done");
    poll_log(m.path(), |r| {
        !rows_of(r, "write", "f1500").is_empty()
            && r.iter().any(|x| x["op"] == json!("journal-trimmed"))
    });
    let rows = assert_accounted(&m);
    assert!(rows_of(&rows, "create", "f1").is_empty(), "f1 was trimmed");
    let trims: Vec<&Value> = rows
        .iter()
        .filter(|r| r["op"] == json!("journal-trimmed"))
        .collect();
    assert_eq!(trims.len(), 1, "one row counts every trim: {trims:#?}");
    let first_kept = rows
        .iter()
        .find(|r| r["op"] != json!("journal-trimmed"))
        .unwrap();
    for t in &trims {
        assert!(t["bytes"].as_u64().unwrap() > 0, "{t}");
        assert!(time_of(&t["oldest"]) <= time_of(&t["newest"]), "{t}");
        assert!(time_of(&t["newest"]) <= time_of(&first_kept["time"]), "{t}");
        assert_eq!(t["result"], json!("ok"), "{t}");
        assert_eq!(t["comm"], json!("layerfs"), "{t}");
        assert_eq!(t["uid"], json!(0), "{t}");
    }
    // The text line says it in words.
    let out = layerfs_quiet(&["log", "--op", "journal-trimmed", m.path().to_str().unwrap()]);
    let text = stdout(&out);
    assert!(
        text.lines().all(|l| l.contains(" rows trimmed, from ")),
        "{text}"
    );
    drop(m);
}

/// Trimming by age says the same: the count and the span of what went.
#[test]
fn trimming_by_age_leaves_a_row_saying_how_many_rows_of_what_time_went() {
    let ws = Workspace::new();
    let m = ws.mount_with(&["--journal-max-age", "2s"]);
    fs::write(m.p("old.txt"), "old").unwrap();
    let old = poll_log(m.path(), |r| !rows_of(r, "write", "old.txt").is_empty());
    assert!(m.unmount());
    std::thread::sleep(Duration::from_secs(3));
    let m = ws.mount_with(&["--journal-max-age", "2s"]);
    fs::write(m.p("new.txt"), "new").unwrap();
    let rows = poll_log(m.path(), |r| {
        !rows_of(r, "create", "new.txt").is_empty()
            && r.iter().any(|x| x["op"] == json!("journal-trimmed"))
    });
    assert!(rows_of(&rows, "create", "old.txt").is_empty(), "{rows:#?}");
    let t = rows
        .iter()
        .find(|r| r["op"] == json!("journal-trimmed"))
        .unwrap();
    assert_eq!(t["bytes"], json!(old.len()), "{t} after {old:#?}");
    assert_eq!(t["oldest"], old[0]["time"], "{t}");
    assert_eq!(t["newest"], old[old.len() - 1]["time"], "{t}");
    drop(m);
}

/// The database and its WAL, as the state dir holds them now.
fn journal_bytes(state: &Path) -> u64 {
    ["journal.db", "journal.db-wal"]
        .iter()
        .map(|f| fs::metadata(state.join(f)).map(|m| m.len()).unwrap_or(0))
        .sum()
}

/// Watches `f` in the background until the guard is dropped; returns the
/// largest value seen.
struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<u64>>,
}

impl Sampler {
    fn start(every: Duration, f: impl Fn() -> u64 + Send + 'static) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut max = 0;
            while !s.load(Ordering::Relaxed) {
                max = max.max(f());
                std::thread::sleep(every);
            }
            max.max(f())
        });
        Sampler {
            stop,
            handle: Some(handle),
        }
    }

    fn max(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().unwrap().join().unwrap()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Another user floods the mount with creates and unlinks: the journal
/// (database and WAL together) stays within its cap plus one batch, and
/// what it trimmed is counted.
#[test]
fn a_flood_by_another_user_keeps_the_journal_within_its_cap() {
    const CAP: u64 = 1 << 20;
    let ws = shared_workspace();
    let m = ws.mount_with(&["--allow-other", "--journal-max-size", "1M"]);
    let public = public_dir(&m);
    let state = state_dir(&ws);
    let sizes = {
        let state = state.clone();
        Sampler::start(Duration::from_millis(2), move || journal_bytes(&state))
    };
    let n = 12_000;
    let out = as_tests(
        &public,
        &[
            "perl",
            "-e",
            "for my $i (1..$ARGV[0]) { open(my $f, '>', \"f$i\") or die \"f$i: $!\"; \
             close $f; unlink \"f$i\" or die \"f$i: $!\" }",
            &n.to_string(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let last = format!("pub/f{n}");
    let rows = poll_log(m.path(), |r| !rows_of(r, "unlink", &last).is_empty());
    let max = sizes.max();
    // The bound layerfs states: the cap plus one batch (a sixteenth of the
    // cap), as database and WAL together.
    assert!(
        max <= CAP + CAP / 16,
        "journal.db + WAL reached {max} bytes with a {CAP}-byte cap"
    );
    assert!(journal_bytes(&state) <= CAP, "{}", journal_bytes(&state));
    let trims: Vec<&Value> = rows
        .iter()
        .filter(|r| r["op"] == json!("journal-trimmed"))
        .collect();
    assert_eq!(trims.len(), 1, "the flood outgrew the cap: {trims:#?}");
    // The rows left name the flooder.
    assert!(rows_of(&rows, "unlink", &last)[0]["uid"] == json!(TESTS_UID));
    assert_accounted(&m);
    drop(m);
}

// ------------------------------------------------------------ inotify

/// The inotify watches the kernel holds for process `pid` (from the
/// fdinfo of its inotify descriptors): the daemon's own count is not
/// taken on trust.
fn kernel_watches(pid: u32) -> u64 {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0;
    };
    fds.filter_map(|e| fs::read_to_string(e.ok()?.path()).ok())
        .map(|info| {
            info.lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count() as u64
        })
        .sum()
}

fn watch_status(m: &Mount) -> Value {
    status_json(m.path())["watches"].clone()
}

/// Whether this process (root) can still add an inotify watch.
fn root_can_watch(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: inotify_init1 takes flags only; the path is NUL-terminated
    // and only read; the fd is closed here and owned by nothing else.
    unsafe {
        let fd = libc::inotify_init1(libc::IN_CLOEXEC);
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        let wd = libc::inotify_add_watch(fd, path.as_ptr(), libc::IN_CREATE);
        libc::close(fd);
        wd >= 0
    }
}

/// Another user walks a lower with more directories than the mount's
/// watch cap: the daemon never holds more watches than the cap (by its
/// own count and by the kernel's), root can still add watches, and a
/// change in a directory left unwatched still shows within the lower
/// timeout. Watches of directories the kernel forgets are removed.
#[test]
fn a_walk_by_another_user_stays_within_the_watch_cap_and_the_rest_revalidates() {
    const CAP: u64 = 100;
    let ws = shared_workspace();
    // 15 directories of 20 leaves each, 316 with the root.
    let mut leaves = Vec::new();
    for a in 0..15 {
        for b in 0..20 {
            let d = format!("d{a:02}/s{b:02}");
            fs::create_dir_all(ws.lower().join(&d)).unwrap();
            fs::write(ws.lower().join(&d).join("f"), "f").unwrap();
            leaves.push(d);
        }
    }
    let m = ws.mount_with(&[
        "--allow-other",
        "--max-watches",
        "100",
        "--lower-timeout",
        "1s",
    ]);
    let w = watch_status(&m);
    assert_eq!(w["cap"], json!(CAP), "{w}");
    let pid = m.pid();
    let kernel = Sampler::start(Duration::from_millis(2), move || kernel_watches(pid));
    let mnt = m.path().to_str().unwrap().to_string();
    let counts = {
        let mnt = mnt.clone();
        Sampler::start(Duration::from_millis(20), move || {
            let out = layerfs_quiet(&["status", "--json", &mnt]);
            serde_json::from_str::<Value>(stdout(&out).trim())
                .ok()
                .and_then(|v| v["watches"]["used"].as_u64())
                .unwrap_or(0)
        })
    };
    // The walk, and a negative lookup of `late` in every directory (a
    // name the kernel may cache as absent).
    let walk = "find . -type d | while read d; do test -e \"$d/late\" && exit 1; done; \
                find . -type d | wc -l";
    let out = as_tests(m.path(), &["sh", "-c", walk]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "316");
    let kernel_max = kernel.max();
    let counted_max = counts.max();
    assert!(kernel_max <= CAP, "the kernel held {kernel_max} watches");
    assert!(kernel_max > 0, "nothing was watched");
    assert!(counted_max <= CAP, "status said {counted_max} watches");
    let w = watch_status(&m);
    assert!(w["used"].as_u64().unwrap() <= CAP, "{w}");
    assert_eq!(w["used"].as_u64().unwrap(), kernel_watches(pid), "{w}");
    assert!(
        w["dirs_over_cap"].as_u64().unwrap() > 0,
        "some directories are beyond the cap: {w}"
    );
    assert!(root_can_watch(ws.dir.path()));

    // Every leaf, watched or not, shows a change made in its lower (and
    // only there: a change in a watched parent would refresh its
    // children's attributes and hide a stale leaf). Its name was looked
    // up as absent and its listing read before.
    for d in &leaves {
        fs::write(ws.lower().join(d).join("late"), "late").unwrap();
    }
    let check = "n=0; for d in d*/s*; do test -e \"$d/late\" || n=$((n+1)); done; \
                 echo $n $(find . -name late | wc -l)";
    let want = format!("0 {}", leaves.len());
    let mut seen = String::new();
    let shown = eventually(Duration::from_secs(5), || {
        let out = as_tests(m.path(), &["sh", "-c", check]);
        seen = stdout(&out).trim().to_string();
        seen == want
    });
    assert!(
        shown,
        "lower changes not shown within 5 s (missing, listed): {seen}"
    );

    // Directories the kernel forgets give their watches back.
    let mut c = Control::connect(&state_dir(&ws));
    let v = c.ask(json!({"cmd": "invalidate_all"}));
    assert_eq!(v["ok"], json!(true), "{v}");
    let mut last = Value::Null;
    let freed = eventually(Duration::from_secs(10), || {
        last = watch_status(&m);
        last["used"].as_u64().unwrap() <= 1 && kernel_watches(pid) <= 1
    });
    assert!(freed, "watches kept after the kernel forgot: {last}");
    assert_eq!(last["dirs_over_cap"], json!(0), "{last}");
    drop(m);
}

/// The default cap follows the host's per-user limit: a sixteenth of
/// `fs.inotify.max_user_watches`, at most 65,536.
#[test]
fn the_default_watch_cap_is_a_share_of_the_host_limit() {
    let ws = Workspace::new();
    let m = ws.mount();
    let host: u64 = fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let w = watch_status(&m);
    assert_eq!(w["cap"], json!((host / 16).min(65_536)), "{w}");
    // The text form says it too.
    let out = layerfs_quiet(&["status", m.path().to_str().unwrap()]);
    let text = stdout(&out);
    assert!(
        text.lines()
            .any(|l| l.starts_with("watches") && l.contains(&format!("of {}", w["cap"]))),
        "{text}"
    );
    drop(m);
}
