//! Crash campaign: the daemon is killed with SIGKILL at a random moment
//! while copy-ups of a large file, a rename of a lower directory, whiteouts,
//! opaque directories, hard-link copy-ups and fsynced appends are under
//! way; the same upper and work dir are mounted again and must show no
//! partial copy-up, no half-renamed directory, every fsynced record, an
//! empty work dir, and the tree kernel overlayfs shows for the same
//! lower+upper.
//!
//! The default run does a few rounds; `scripts/crash [ROUNDS]` runs long
//! campaigns. Knobs (environment): LAYERFS_CRASH_ROUNDS (default 12),
//! LAYERFS_CRASH_SEED (default: from the clock, printed), LAYERFS_CRASH_BIG_MIB
//! (size of the large lower file, default 64).
//!
//! The scenario (lower tree, workload, invariants) is shared with the
//! power-loss test (`powerloss.rs`).

use std::collections::BTreeMap;
use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;

// ---------------------------------------------------------------------------
// Seeded PRNG (splitmix64)

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

pub fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number")),
        Err(_) => default,
    }
}

// ---------------------------------------------------------------------------
// The scenario: lower tree, workload, invariants

const TREE_FILES: usize = 100;
const TREE_DIRS: usize = 10;
const TREE_SUB: usize = 10;
const RM_FILES: usize = 150;
const OPQ_DIRS: usize = 5;
const OPQ_SUB: usize = 20;
const LINKS: usize = 20;
const RECORDS: usize = 30;

/// Content of the large lower file: a deterministic pattern.
fn big_content(mib: u64) -> Vec<u8> {
    let mut rng = Rng::new(0xB16);
    let mut v = Vec::with_capacity((mib << 20) as usize);
    while v.len() < (mib << 20) as usize {
        v.extend_from_slice(&rng.next().to_le_bytes());
    }
    v
}

fn hash_bytes(b: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

fn hash_file(p: &Path) -> std::io::Result<(u64, u64)> {
    let mut f = fs::File::open(p)?;
    let mut all = Vec::new();
    f.read_to_end(&mut all)?;
    Ok((all.len() as u64, hash_bytes(&all)))
}

/// What the checker knows about the lower tree.
pub struct Scenario {
    /// (size, hash) of `big` as in the lower, and with the appended byte.
    big_orig: (u64, u64),
    big_done: (u64, u64),
    /// Every lower file below `tree/`, relative to it, with its content.
    tree: BTreeMap<String, Vec<u8>>,
}

fn new_record(i: usize) -> String {
    format!("new{i:05}\n")
}

fn low_record(i: usize) -> String {
    format!("low{i:05}\n")
}

impl Scenario {
    /// Builds the lower tree in `lower` (a big file of `big_mib` MiB).
    pub fn build(lower: &Path, big_mib: u64) -> Scenario {
        let big = big_content(big_mib);
        fs::write(lower.join("big"), &big).unwrap();
        let mut done = big.clone();
        done.push(b'x');
        let mut tree = BTreeMap::new();
        fs::create_dir(lower.join("tree")).unwrap();
        for i in 0..TREE_FILES {
            tree.insert(format!("f{i}"), format!("tree {i}\n").into_bytes());
        }
        for d in 0..TREE_DIRS {
            fs::create_dir(lower.join(format!("tree/d{d}"))).unwrap();
            for k in 0..TREE_SUB {
                tree.insert(format!("d{d}/g{k}"), format!("tree {d}/{k}\n").into_bytes());
            }
        }
        for (rel, data) in &tree {
            fs::write(lower.join("tree").join(rel), data).unwrap();
        }
        fs::create_dir(lower.join("rmme")).unwrap();
        for i in 0..RM_FILES {
            fs::write(lower.join(format!("rmme/f{i}")), format!("rm {i}\n")).unwrap();
        }
        fs::create_dir(lower.join("opq")).unwrap();
        for d in 0..OPQ_DIRS {
            fs::create_dir(lower.join(format!("opq/d{d}"))).unwrap();
            for k in 0..OPQ_SUB {
                fs::write(
                    lower.join(format!("opq/d{d}/f{k}")),
                    format!("opq {d}/{k}\n"),
                )
                .unwrap();
            }
        }
        fs::create_dir(lower.join("lnk")).unwrap();
        for i in 0..LINKS {
            fs::write(lower.join(format!("lnk/f{i}")), link_content(i)).unwrap();
        }
        fs::create_dir(lower.join("fs")).unwrap();
        fs::write(lower.join("fs/lower.log"), b"lower\n").unwrap();
        Scenario {
            big_orig: (big.len() as u64, hash_bytes(&big)),
            big_done: (done.len() as u64, hash_bytes(&done)),
            tree,
        }
    }

    /// The shell commands of the workload, each run by its own bash in the
    /// mount; `progress` (outside the mount) gets one line per record whose
    /// fsync returned.
    pub fn workload(progress: &Path) -> Vec<String> {
        let p = progress.display();
        vec![
            // copy-up of the large file, then one byte appended
            "printf x >> big".into(),
            // rename of a lower directory with many entries (redirect)
            "mv tree tree.moved".into(),
            // whiteouts
            "rm -f rmme/*".into(),
            // whiteouts inside, then a whiteout over the dir, then an opaque dir
            "rm -rf opq && mkdir opq && echo new > opq/new".into(),
            // link copy-ups
            format!("for i in $(seq 0 {}); do ln lnk/f$i lnk/l$i || exit 1; done", LINKS - 1),
            // fsynced appends to a new file and to a copied-up lower file
            format!(
                "for i in $(seq 0 {}); do \
                 printf 'new%05d\\n' $i | dd of=fs/new.log oflag=append conv=notrunc,fsync status=none || exit 1; \
                 echo n$i >> '{p}'; \
                 printf 'low%05d\\n' $i | dd of=fs/lower.log oflag=append conv=notrunc,fsync status=none || exit 1; \
                 echo l$i >> '{p}'; \
                 done",
                RECORDS - 1
            ),
        ]
    }

    /// Checks the invariants on a mounted view `root`, given the progress
    /// lines recorded before the crash. Returns every violation found.
    pub fn check(&self, root: &Path, progress: &str) -> Vec<String> {
        let mut bad = Vec::new();
        // No partial copy-up of the large file.
        match hash_file(&root.join("big")) {
            Ok(h) if h == self.big_orig || h == self.big_done => {}
            Ok((len, _)) => bad.push(format!(
                "big: {len} bytes, content neither the lower original ({} bytes) nor the finished copy-up",
                self.big_orig.0
            )),
            Err(e) => bad.push(format!("big: {e}")),
        }
        // The directory rename is all or nothing.
        let old = root.join("tree");
        let new = root.join("tree.moved");
        match (old.exists(), new.exists()) {
            (true, false) => self.check_tree(&old, &mut bad),
            (false, true) => self.check_tree(&new, &mut bad),
            (a, b) => bad.push(format!("tree exists: {a}, tree.moved exists: {b}")),
        }
        // Whiteouts: every remaining entry is an untouched lower file.
        match fs::read_dir(root.join("rmme")) {
            Ok(rd) => {
                for e in rd {
                    let name = e.unwrap().file_name().to_string_lossy().into_owned();
                    let want = name
                        .strip_prefix('f')
                        .and_then(|n| n.parse::<usize>().ok())
                        .filter(|n| *n < RM_FILES)
                        .map(|n| format!("rm {n}\n"));
                    let got = fs::read_to_string(root.join("rmme").join(&name)).ok();
                    if want.is_none() || got != want {
                        bad.push(format!("rmme/{name}: {got:?}, expected {want:?}"));
                    }
                }
            }
            Err(e) => bad.push(format!("rmme: {e}")),
        }
        self.check_opq(root, &mut bad);
        self.check_links(root, &mut bad);
        check_log(
            root,
            "fs/new.log",
            "",
            progress_count(progress, 'n'),
            new_record,
            &mut bad,
        );
        check_log(
            root,
            "fs/lower.log",
            "lower\n",
            progress_count(progress, 'l'),
            low_record,
            &mut bad,
        );
        let mut top: Vec<String> = fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        top.sort();
        for n in &top {
            if !["big", "tree", "tree.moved", "rmme", "opq", "lnk", "fs"].contains(&n.as_str()) {
                bad.push(format!("unexpected top-level entry {n:?}"));
            }
        }
        bad
    }

    fn check_tree(&self, dir: &Path, bad: &mut Vec<String>) {
        let got = files_below(dir);
        if got != self.tree {
            let missing: Vec<_> = self.tree.keys().filter(|k| !got.contains_key(*k)).collect();
            let extra: Vec<_> = got.keys().filter(|k| !self.tree.contains_key(*k)).collect();
            let changed: Vec<_> = got
                .iter()
                .filter(|(k, v)| self.tree.get(*k).is_some_and(|w| w != *v))
                .map(|(k, _)| k)
                .collect();
            bad.push(format!(
                "{}: half-renamed or changed: missing {missing:?}, extra {extra:?}, changed {changed:?}",
                dir.display()
            ));
        }
    }

    fn check_opq(&self, root: &Path, bad: &mut Vec<String>) {
        let dir = root.join("opq");
        if !dir.exists() {
            return; // between rm -rf and mkdir
        }
        let got = files_below(&dir);
        let mut lower_seen = false;
        for (rel, data) in &got {
            if rel == "new" {
                // Never fsynced: after a power cut ext4 may keep its size
                // with the block still unwritten (an unwritten extent reads
                // as zeros), as it would for any program's unsynced write.
                let unwritten = data.len() <= 4 && data.iter().all(|&b| b == 0);
                if data != b"new\n" && !data.is_empty() && !unwritten {
                    bad.push(format!("opq/new: {data:?}"));
                }
                continue;
            }
            lower_seen = true;
            let want = rel
                .strip_prefix('d')
                .and_then(|r| r.split_once("/f"))
                .and_then(|(d, k)| Some((d.parse::<usize>().ok()?, k.parse::<usize>().ok()?)))
                .map(|(d, k)| format!("opq {d}/{k}\n").into_bytes());
            if want.as_deref() != Some(data.as_slice()) {
                bad.push(format!("opq/{rel}: {:?}, expected {want:?}", lossy(data)));
            }
        }
        if lower_seen && got.contains_key("new") {
            bad.push("opq: the new opaque dir shows lower entries".into());
        }
    }

    fn check_links(&self, root: &Path, bad: &mut Vec<String>) {
        for i in 0..LINKS {
            let f = root.join(format!("lnk/f{i}"));
            let l = root.join(format!("lnk/l{i}"));
            let fm = match fs::symlink_metadata(&f) {
                Ok(m) => m,
                Err(e) => {
                    bad.push(format!("lnk/f{i}: {e}"));
                    continue;
                }
            };
            if fs::read(&f).ok().as_deref() != Some(link_content(i).as_slice()) {
                bad.push(format!("lnk/f{i}: content changed"));
            }
            match fs::symlink_metadata(&l) {
                Ok(lm) => {
                    if lm.ino() != fm.ino() || lm.nlink() != 2 || fm.nlink() != 2 {
                        bad.push(format!(
                            "lnk/l{i}: ino {} nlink {}, lnk/f{i}: ino {} nlink {}",
                            lm.ino(),
                            lm.nlink(),
                            fm.ino(),
                            fm.nlink()
                        ));
                    }
                }
                Err(_) if fm.nlink() != 1 => {
                    bad.push(format!("lnk/f{i}: nlink {} without its link", fm.nlink()))
                }
                Err(_) => {}
            }
        }
    }
}

fn link_content(i: usize) -> Vec<u8> {
    format!("link {i}\n").repeat(4096).into_bytes()
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(80)]).into_owned()
}

/// How many records of kind `k` the workload saw fsynced.
fn progress_count(progress: &str, k: char) -> usize {
    progress
        .lines()
        .filter(|l| l.starts_with(k) && l.len() > 1)
        .count()
}

/// An appended log: a prefix of its full content (header + records), at
/// least as long as the records reported fsynced.
fn check_log(
    root: &Path,
    rel: &str,
    header: &str,
    synced: usize,
    record: fn(usize) -> String,
    bad: &mut Vec<String>,
) {
    let full: String = header.to_string() + &(0..RECORDS).map(record).collect::<String>();
    let min = header.len() + (0..synced).map(|i| record(i).len()).sum::<usize>();
    let got = match fs::read(root.join(rel)) {
        Ok(g) => g,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) && min == 0 => return,
        Err(e) => {
            bad.push(format!("{rel}: {e} ({synced} records fsynced)"));
            return;
        }
    };
    if !full.as_bytes().starts_with(&got) {
        bad.push(format!(
            "{rel}: not a prefix of the records: {:?}",
            lossy(&got)
        ));
    }
    if got.len() < min {
        bad.push(format!(
            "{rel}: {} bytes, but {synced} records were fsynced ({min} bytes)",
            got.len()
        ));
    }
}

/// Regular files below `dir` (relative names) with their content.
fn files_below(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    fn go(root: &Path, d: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        let Ok(rd) = fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            match fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => go(root, &p, out),
                Ok(_) => {
                    out.insert(rel, fs::read(&p).unwrap_or_default());
                }
                Err(_) => {}
            }
        }
    }
    go(dir, dir, &mut out);
    out
}

/// Everything comparable between two mounts of one lower+upper: type,
/// permissions, size, link count of non-directories, content hash and
/// symlink targets, by relative path.
pub fn tree_view(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    fn go(root: &Path, d: &Path, out: &mut BTreeMap<String, String>) {
        let mut names: Vec<PathBuf> = fs::read_dir(d)
            .unwrap_or_else(|e| panic!("read_dir {}: {e}", d.display()))
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let m = fs::symlink_metadata(&p).unwrap();
            let t = m.file_type();
            let desc = if t.is_dir() {
                format!("dir {:o}", m.mode() & 0o7777)
            } else if t.is_file() {
                let (len, h) = hash_file(&p).unwrap();
                format!(
                    "file {:o} nlink {} {len} bytes {h:x}",
                    m.mode() & 0o7777,
                    m.nlink()
                )
            } else if t.is_symlink() {
                format!("symlink -> {:?}", fs::read_link(&p).unwrap())
            } else if t.is_char_device() {
                format!("chardev {:x}", m.rdev())
            } else {
                format!("other {:o}", m.mode())
            };
            out.insert(rel, desc);
            if t.is_dir() {
                go(root, &p, out);
            }
        }
    }
    go(root, root, &mut out);
    out
}

/// The differences between two views, one line each (at most 20).
pub fn view_diff(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in a {
        match b.get(k) {
            Some(w) if w == v => {}
            Some(w) => out.push(format!("{k}: layerfs {v} / overlay {w}")),
            None => out.push(format!("{k}: only in layerfs ({v})")),
        }
    }
    for (k, w) in b {
        if !a.contains_key(k) {
            out.push(format!("{k}: only in overlay ({w})"));
        }
    }
    out.truncate(20);
    out
}

/// The workload's shells; killed and reaped on drop.
pub struct Workers(Vec<Child>);

impl Workers {
    pub fn start(dir: &Path, progress: &Path) -> Workers {
        Workers(
            Scenario::workload(progress)
                .into_iter()
                .map(|cmd| {
                    Command::new("bash")
                        .arg("-c")
                        .arg(cmd)
                        .current_dir(dir)
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("spawn bash")
                })
                .collect(),
        )
    }

    /// How many are still running.
    pub fn running(&mut self) -> usize {
        self.0
            .iter_mut()
            .map(|c| matches!(c.try_wait(), Ok(None)) as usize)
            .sum()
    }

    /// Which are still running, in workload order.
    pub fn running_set(&mut self) -> Vec<bool> {
        self.0
            .iter_mut()
            .map(|c| matches!(c.try_wait(), Ok(None)))
            .collect()
    }

    /// Waits until all exited (true) or `limit` passed (false).
    pub fn wait(&mut self, limit: Duration) -> bool {
        eventually(limit, || self.running() == 0)
    }

    /// Whether every shell exited with status 0.
    pub fn all_succeeded(&mut self) -> bool {
        self.0
            .iter_mut()
            .all(|c| matches!(c.try_wait(), Ok(Some(s)) if s.success()))
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// Resets the upper and work dir of `ws` to empty.
fn fresh_upper(ws: &Workspace, kwork: &Path) {
    for d in [&ws.upper, &ws.work, &kwork.to_path_buf()] {
        if d.exists() {
            fs::remove_dir_all(d).unwrap_or_else(|e| panic!("remove {}: {e}", d.display()));
        }
    }
    fs::create_dir(&ws.upper).unwrap();
}

// ---------------------------------------------------------------------------
// The campaign

/// One round: returns which workload commands still ran when the kill
/// came and (without a kill) how long each command took, or the list of
/// violations.
fn round(
    ws: &Workspace,
    sc: &Scenario,
    kill_after: Option<Duration>,
) -> Result<(Vec<bool>, Vec<Duration>), String> {
    let kwork = ws.dir.path().join("kwork");
    let kmnt = ws.dir.path().join("kmnt");
    let progress = ws.dir.path().join("progress");
    fresh_upper(ws, &kwork);
    fs::write(&progress, b"").unwrap();
    let m = ws.try_mount_with(&[])?;
    let start = Instant::now();
    let mut workers = Workers::start(&m.path, &progress);
    let mut mid_way = Vec::new();
    let mut durations = Vec::new();
    match kill_after {
        Some(d) => {
            std::thread::sleep(d);
            mid_way = workers.running_set();
            // SAFETY: kill has no memory preconditions; the pid is our own
            // child (the foreground daemon), not yet reaped.
            let r = unsafe { libc::kill(m.pid() as i32, libc::SIGKILL) };
            if r != 0 {
                return Err(format!(
                    "kill -9 {}: {}",
                    m.pid(),
                    std::io::Error::last_os_error()
                ));
            }
            if !workers.wait(Duration::from_secs(20)) {
                return Err("workers still blocked 20 s after the daemon was killed".into());
            }
        }
        None => {
            // Each command's duration, to aim kills at every one of them.
            let mut done: Vec<Option<Duration>> = vec![None; workers.running_set().len()];
            while done.iter().any(|d| d.is_none()) {
                if start.elapsed() > Duration::from_secs(120) {
                    return Err("workload did not finish within 120 s".into());
                }
                for (i, running) in workers.running_set().into_iter().enumerate() {
                    if !running && done[i].is_none() {
                        done[i] = Some(start.elapsed());
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            durations = done.into_iter().flatten().collect();
            if !workers.all_succeeded() {
                return Err("workload failed without a crash".into());
            }
        }
    }
    drop(workers);
    // The dead mount: detached lazily (the harness's guard), then the same
    // upper and work dir mounted again.
    drop(m);
    let progress_text = fs::read_to_string(&progress).unwrap();
    let m = ws.try_mount_with(&[])?;
    let mut bad = Vec::new();
    let debris: Vec<_> = fs::read_dir(&ws.work)
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    if !debris.is_empty() {
        bad.push(format!("work dir not empty after the remount: {debris:?}"));
    }
    bad.extend(sc.check(&m.path, &progress_text));
    let view = tree_view(&m.path);
    if let Some(k) = view
        .keys()
        .find(|k| k.rsplit('/').next().is_some_and(|n| n.starts_with('#')))
    {
        bad.push(format!("work-dir temporary visible: {k}"));
    }
    drop(m);
    match KernelOverlay::mount(&[ws.lower()], &ws.upper, &kwork, &kmnt) {
        Ok(k) => {
            let kview = tree_view(&kmnt);
            drop(k);
            bad.extend(view_diff(&view, &kview));
        }
        Err(e) => bad.push(e),
    }
    if bad.is_empty() {
        Ok((mid_way, durations))
    } else {
        Err(bad.join("\n"))
    }
}

/// kill -9 of the daemon during copy-ups, renames, whiteouts, opaque dirs,
/// link copy-ups and fsynced appends; remount; nothing partial is visible,
/// nothing fsynced is lost, kernel overlayfs agrees.
#[test]
fn kill_9_at_random_moments_leaves_nothing_partial() {
    let rounds = env_u64("LAYERFS_CRASH_ROUNDS", 12);
    let seed = env_u64(
        "LAYERFS_CRASH_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    );
    let big_mib = env_u64("LAYERFS_CRASH_BIG_MIB", 64);
    let ws = Workspace::new();
    let sc = Scenario::build(ws.lower(), big_mib);
    let t0 = Instant::now();
    // Round 0 runs the workload to its end: the checker must accept the
    // finished state, and its duration sets the range of kill moments.
    let (_, took) = round(&ws, &sc, None).unwrap_or_else(|e| panic!("round 0 (no kill): {e}"));
    eprintln!(
        "crash: seed {seed}, {rounds} rounds, {big_mib} MiB copy-up; without kill the commands took {:?} ms",
        took.iter().map(|d| d.as_millis()).collect::<Vec<_>>()
    );
    let mut rng = Rng::new(seed);
    let mut mid = 0;
    // Per workload command: in how many rounds the kill came while it ran.
    let mut per_op = vec![0u64; Scenario::workload(Path::new("p")).len()];
    for r in 1..=rounds {
        // Aim at one command: a moment within its duration (plus a tenth,
        // so some kills come just after it ended).
        let target = took[rng.below(took.len() as u64) as usize];
        let at = Duration::from_micros(rng.below(target.as_micros() as u64 * 11 / 10 + 1));
        match round(&ws, &sc, Some(at)) {
            Ok((running, _)) => {
                mid += running.iter().any(|x| *x) as u64;
                for (i, x) in running.iter().enumerate() {
                    per_op[i] += *x as u64;
                }
            }
            Err(e) => panic!(
                "round {r} (seed {seed}, kill after {} ms): {e}\ndaemon log: {}",
                at.as_millis(),
                ws.daemon_log()
            ),
        }
        if r % 50 == 0 {
            eprintln!(
                "crash: {r} rounds clean ({mid} killed mid-workload), {} s",
                t0.elapsed().as_secs()
            );
        }
    }
    eprintln!(
        "crash: {rounds} rounds clean ({mid} killed mid-workload), seed {seed}, {} s",
        t0.elapsed().as_secs()
    );
    eprintln!(
        "crash: rounds killed while each ran (copy-up, dir rename, whiteouts, opaque, links, fsync): {per_op:?}"
    );
    assert!(
        rounds == 0 || mid > 0,
        "no kill came while the workload ran"
    );
}
