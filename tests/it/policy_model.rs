//! Model-based property test of the path policy under a real mount: random
//! sequences of mkdir, create, write, truncate, chmod, setxattr, rename
//! (files and directories, plain and exchange, up, down and sideways, into
//! and out of ruled regions), link, symlink (relative targets with `..`),
//! unlink and rmdir, under a random policy (hide / readonly / protect
//! rules, `**`-leading and anchored, over a small alphabet of names so the
//! rules fire) over a random lower holding hidden files with secret
//! markers, readonly and protected files, symlinks and hard links.
//!
//! After every step the mount is walked and the invariants checked:
//! - nothing hidden is readable under any name: no visible file holds a
//!   secret marker, no visible symlink's target is a hidden one's;
//! - every readonly lower file is still visible (by its st_ino, which
//!   never changes while mounted) at a path classed readonly, with its
//!   content unchanged;
//! - every protected shared file is still visible at a protected path;
//! - every symlink is contained where it stands now (resolved lexically
//!   here, independently of the daemon's own check);
//! - where the outcome is clear from the paths alone (a new name, a write,
//!   a removal or a file rename in or out of a class), the mount did what
//!   the model says;
//! - the daemon still serves, and at the end the lower is unchanged.
//!
//! The default run uses a fixed seed and a few cases; `scripts/fuzz
//! --model` runs long campaigns with `LAYERFS_FUZZ_CASES`,
//! `LAYERFS_FUZZ_SEED` and `LAYERFS_FUZZ_STEPS`. A failing case prints its
//! seed, policy, lower and the operations up to the failure, shortened to
//! the fewest steps that still fail.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use layerfs::policy::Policy;

use crate::harness::{is_mounted, policy_file, Workspace};

/// xorshift64*: small, seeded, good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(splitmix(seed) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Names of everything, so that rules and paths meet.
const NAMES: [&str; 7] = ["a", "b", "sec", "cfg", "keep", "f", "g.key"];

/// A random name of the alphabet.
fn any_name(rng: &mut Rng) -> &'static str {
    NAMES[rng.below(NAMES.len())]
}

const HIDE: [&str; 6] = [
    "sec/**",
    "**/sec/**",
    "sec",
    "a/sec/**",
    "*.key",
    "**/b/sec",
];
const READONLY: [&str; 5] = ["cfg/**", "**/cfg/**", "a/cfg/**", "**/cfg", "b/*/cfg/**"];
const PROTECT: [&str; 4] = ["keep/**", "**/keep/**", "a/keep/**", "keep"];

const SECRET: &str = "SECRET";

fn random_policy(rng: &mut Rng) -> String {
    let mut text = String::new();
    for _ in 0..1 + rng.below(4) {
        let line = match rng.below(3) {
            0 => format!("hide {}", rng.pick(&HIDE)),
            1 => format!("readonly {}", rng.pick(&READONLY)),
            _ => format!("protect {}", rng.pick(&PROTECT)),
        };
        text.push_str(&line);
        text.push('\n');
    }
    text
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn depth(rel: &str) -> usize {
    rel.split('/').filter(|c| !c.is_empty()).count()
}

fn parent_of(rel: &str) -> &str {
    rel.rfind('/').map_or("", |i| &rel[..i])
}

/// Whether a relative target, stored in a link at `link`, stays inside the
/// root when resolved lexically with every name a real directory (the
/// generator and the operations only make targets of leading `..` and
/// names; anything else is judged as escaping).
fn lexically_contained(link: &str, target: &str) -> bool {
    if target.starts_with('/') {
        return false;
    }
    let mut at = depth(link).saturating_sub(1) as i64;
    let mut past_names = false;
    for c in target.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if c == ".." {
            if past_names {
                return false;
            }
            at -= 1;
            if at < 0 {
                return false;
            }
        } else {
            past_names = true;
        }
    }
    true
}

/// The random lower: what was made and what the invariants track.
struct Lower {
    /// A description, for the report.
    listing: Vec<String>,
}

fn make_lower(rng: &mut Rng, root: &Path, policy: &Policy) -> Lower {
    let mut listing = Vec::new();
    let mut dirs = vec![String::new()];
    let mut files: Vec<String> = Vec::new();
    let mut serial = 0;
    let mut i = 0;
    while i < dirs.len() {
        let dir = dirs[i].clone();
        i += 1;
        if depth(&dir) >= 4 {
            continue;
        }
        let wanted = if dir.is_empty() {
            3 + rng.below(3)
        } else {
            rng.below(4)
        };
        for _ in 0..wanted {
            let name = any_name(rng);
            let rel = join(&dir, name);
            if fs::symlink_metadata(root.join(&rel)).is_ok() {
                continue;
            }
            serial += 1;
            let hidden = policy.classify(&rel).hidden.is_some();
            match rng.below(20) {
                0..=7 => {
                    fs::create_dir(root.join(&rel)).unwrap();
                    dirs.push(rel.clone());
                    listing.push(format!("{rel}/"));
                }
                8..=16 => {
                    let content = if hidden {
                        format!("{SECRET}-{serial}\n")
                    } else {
                        format!("L-{serial}\n")
                    };
                    fs::write(root.join(&rel), &content).unwrap();
                    files.push(rel.clone());
                    listing.push(format!("{rel}: {}", content.trim()));
                }
                _ => {
                    let target = if hidden {
                        format!("{SECRET}-{serial}")
                    } else {
                        let up = rng.below(depth(&dir) + 1);
                        let mut t = "../".repeat(up);
                        t.push_str(any_name(rng));
                        t
                    };
                    std::os::unix::fs::symlink(&target, root.join(&rel)).unwrap();
                    listing.push(format!("{rel} -> {target}"));
                }
            }
        }
    }
    // Every hidden directory holds a secret, so that showing it shows one.
    for dir in &dirs {
        if !dir.is_empty() && policy.classify(dir).hidden.is_some() {
            let rel = join(dir, "m");
            if fs::symlink_metadata(root.join(&rel)).is_err() {
                fs::write(root.join(&rel), format!("{SECRET}-dir\n")).unwrap();
                listing.push(format!("{rel}: {SECRET}-dir"));
            }
        }
    }
    // Hard links between visible names (a pnpm store, `cp -al`), maybe
    // across classes.
    for _ in 0..rng.below(3) {
        if files.is_empty() {
            break;
        }
        let from = rng.pick(&files).clone();
        let dir = rng.pick(&dirs).clone();
        let to = join(&dir, any_name(rng));
        if policy.classify(&from).hidden.is_some()
            || policy.classify(&to).hidden.is_some()
            || fs::symlink_metadata(root.join(&to)).is_ok()
        {
            continue;
        }
        if fs::hard_link(root.join(&from), root.join(&to)).is_ok() {
            listing.push(format!("{to} == {from} (hard link)"));
        }
    }
    listing.sort();
    Lower { listing }
}

/// One visible entry of the mount.
#[derive(Debug, Clone)]
struct Seen {
    kind: char,
    ino: u64,
    /// File content or link target (lossy text).
    data: String,
}

/// Walks the mount (iteratively), reading every file and link.
fn walk(mnt: &Path) -> io::Result<BTreeMap<String, Seen>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![String::new()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(mnt.join(&dir))? {
            let e = e?;
            let rel = join(&dir, &e.file_name().to_string_lossy());
            let p = mnt.join(&rel);
            let md = fs::symlink_metadata(&p)?;
            let (kind, data) = if md.is_dir() {
                stack.push(rel.clone());
                ('d', String::new())
            } else if md.file_type().is_symlink() {
                ('l', fs::read_link(&p)?.to_string_lossy().into_owned())
            } else {
                ('f', String::from_utf8_lossy(&fs::read(&p)?).into_owned())
            };
            out.insert(
                rel,
                Seen {
                    kind,
                    ino: md.ino(),
                    data,
                },
            );
        }
    }
    Ok(out)
}

/// One operation of a sequence.
#[derive(Debug, Clone)]
enum Op {
    Mkdir(String),
    Create(String),
    Append(String),
    Truncate(String),
    Chmod(String),
    SetXattr(String),
    Rename(String, String),
    Exchange(String, String),
    Link(String, String),
    Symlink(String, String),
    Unlink(String),
    Rmdir(String),
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Mkdir(p) => write!(f, "mkdir {p}"),
            Op::Create(p) => write!(f, "create {p}"),
            Op::Append(p) => write!(f, "append {p}"),
            Op::Truncate(p) => write!(f, "truncate {p}"),
            Op::Chmod(p) => write!(f, "chmod 600 {p}"),
            Op::SetXattr(p) => write!(f, "setxattr user.t {p}"),
            Op::Rename(a, b) => write!(f, "rename {a} -> {b}"),
            Op::Exchange(a, b) => write!(f, "exchange {a} <-> {b}"),
            Op::Link(a, b) => write!(f, "link {a} -> {b}"),
            Op::Symlink(p, t) => write!(f, "symlink {p} -> {t}"),
            Op::Unlink(p) => write!(f, "unlink {p}"),
            Op::Rmdir(p) => write!(f, "rmdir {p}"),
        }
    }
}

/// A random operation on what the mount shows now.
fn random_op(rng: &mut Rng, seen: &BTreeMap<String, Seen>) -> Op {
    let of = |k: char| -> Vec<String> {
        seen.iter()
            .filter(|(_, s)| s.kind == k)
            .map(|(p, _)| p.clone())
            .collect()
    };
    let (files, dirs, links) = (of('f'), of('d'), of('l'));
    let mut all_dirs = dirs.clone();
    all_dirs.push(String::new());
    let any: Vec<String> = seen.keys().cloned().collect();
    let new_name = |rng: &mut Rng| {
        let dir = rng.pick(&all_dirs).clone();
        join(&dir, any_name(rng))
    };
    let file = |rng: &mut Rng| {
        if files.is_empty() {
            new_name(rng)
        } else {
            rng.pick(&files).clone()
        }
    };
    let entry = |rng: &mut Rng| {
        if any.is_empty() {
            new_name(rng)
        } else {
            rng.pick(&any).clone()
        }
    };
    match rng.below(16) {
        0 => Op::Mkdir(new_name(rng)),
        1 => Op::Create(new_name(rng)),
        2 => Op::Append(file(rng)),
        3 => Op::Truncate(file(rng)),
        4 => Op::Chmod(file(rng)),
        5 => Op::SetXattr(file(rng)),
        6..=8 => {
            // Directories most: moving them up, down and across is where
            // classes and links are at stake.
            let from = if !dirs.is_empty() && rng.chance(70) {
                rng.pick(&dirs).clone()
            } else {
                entry(rng)
            };
            Op::Rename(from, new_name(rng))
        }
        9 => Op::Exchange(entry(rng), entry(rng)),
        10 => Op::Link(file(rng), new_name(rng)),
        11 | 12 => {
            let at = new_name(rng);
            let up = rng.below(depth(&at) + 2);
            let mut target = "../".repeat(up);
            target.push_str(any_name(rng));
            Op::Symlink(at, target)
        }
        13 => Op::Unlink(if links.is_empty() || rng.chance(50) {
            file(rng)
        } else {
            rng.pick(&links).clone()
        }),
        14 => Op::Rmdir(if dirs.is_empty() {
            new_name(rng)
        } else {
            rng.pick(&dirs).clone()
        }),
        _ => {
            // Exchange two directories, one of them often shallow.
            if dirs.len() >= 2 {
                Op::Exchange(rng.pick(&dirs).clone(), rng.pick(&dirs).clone())
            } else {
                Op::Mkdir(new_name(rng))
            }
        }
    }
}

fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let (ca, cb) = (c(a), c(b));
    // SAFETY: both CStrings outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Runs `op` through the mount; the errno, or 0.
fn apply(mnt: &Path, op: &Op, step: usize) -> i32 {
    let p = |r: &str| mnt.join(r);
    let r: io::Result<()> = match op {
        Op::Mkdir(a) => fs::create_dir(p(a)),
        Op::Create(a) => fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(p(a))
            .and_then(|mut f| f.write_all(format!("U-{step}\n").as_bytes())),
        Op::Append(a) => fs::OpenOptions::new()
            .append(true)
            .open(p(a))
            .and_then(|mut f| f.write_all(format!("+{step}\n").as_bytes())),
        Op::Truncate(a) => fs::OpenOptions::new()
            .write(true)
            .open(p(a))
            .and_then(|f| f.set_len(1)),
        Op::Chmod(a) => fs::set_permissions(p(a), fs::Permissions::from_mode(0o600)),
        Op::SetXattr(a) => xattr::set(p(a), "user.t", b"1"),
        Op::Rename(a, b) => fs::rename(p(a), p(b)),
        Op::Exchange(a, b) => exchange(&p(a), &p(b)),
        Op::Link(a, b) => fs::hard_link(p(a), p(b)),
        Op::Symlink(a, t) => std::os::unix::fs::symlink(t, p(a)),
        Op::Unlink(a) => fs::remove_file(p(a)),
        Op::Rmdir(a) => fs::remove_dir(p(a)),
    };
    match r {
        Ok(()) => 0,
        Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
    }
}

/// What the policy makes of a path, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Kinds {
    hidden: bool,
    readonly: bool,
    protected: bool,
}

fn kinds(policy: &Policy, rel: &str) -> Kinds {
    let c = policy.classify(rel);
    Kinds {
        hidden: c.hidden.is_some(),
        readonly: c.readonly.is_some(),
        protected: c.protected.is_some(),
    }
}

/// The outcome the model is sure of, if any: `Some(0)` success,
/// `Some(errno)` a refusal. Only outcomes decided by the paths' classes
/// and what the mount shows are predicted; the rest (directory moves,
/// removals of shared protected entries) is left to the invariants.
fn predict(policy: &Policy, seen: &BTreeMap<String, Seen>, op: &Op) -> Option<i32> {
    let k = |r: &str| kinds(policy, r);
    let plain = |r: &str| k(r) == Kinds::default();
    let exists = |r: &str| seen.contains_key(r);
    let dir_exists = |r: &str| r.is_empty() || seen.get(r).is_some_and(|s| s.kind == 'd');
    // A new name in a visible directory: an existing name is EEXIST
    // before the mount is asked (the kernel knows it); a hidden one looks
    // absent to the kernel, and the policy refuses it.
    let new_name = |r: &str| -> Option<i32> {
        if !dir_exists(parent_of(r)) {
            return None;
        }
        if exists(r) {
            return Some(libc::EEXIST);
        }
        if k(r).hidden {
            return Some(libc::EACCES);
        }
        if k(r).readonly {
            return Some(libc::EROFS);
        }
        Some(0)
    };
    let is_file = |r: &str| seen.get(r).is_some_and(|s| s.kind == 'f');
    match op {
        Op::Mkdir(a) | Op::Create(a) => new_name(a),
        Op::Symlink(a, t) => {
            if !dir_exists(parent_of(a)) || exists(a) {
                return new_name(a);
            }
            if !lexically_contained(a, t) {
                return Some(libc::EPERM);
            }
            new_name(a)
        }
        Op::Append(a) | Op::Truncate(a) | Op::Chmod(a) | Op::SetXattr(a) if is_file(a) => {
            Some(if k(a).readonly { libc::EROFS } else { 0 })
        }
        Op::Unlink(a) if is_file(a) => {
            if k(a).readonly {
                Some(libc::EROFS)
            } else if plain(a) {
                Some(0)
            } else {
                None
            }
        }
        Op::Rmdir(a) if seen.get(a).is_some_and(|s| s.kind == 'd') && k(a).readonly => {
            Some(libc::EROFS)
        }
        Op::Rename(a, b) if exists(a) && !exists(b) && dir_exists(parent_of(b)) => {
            // The kernel refuses a directory moved beneath itself first.
            if b.starts_with(&format!("{a}/")) {
                return Some(libc::EINVAL);
            }
            if k(a).readonly {
                return Some(libc::EROFS);
            }
            // A directory's own checks (what it holds) may come first.
            if !plain(a) || !is_file(a) && seen[a.as_str()].kind != 'l' {
                return None;
            }
            if k(b).hidden {
                return Some(libc::EACCES);
            }
            if k(b).readonly {
                return Some(libc::EROFS);
            }
            // A plain file to a plain name (a symlink's containment is
            // the invariants' business).
            if is_file(a) && plain(b) {
                return Some(0);
            }
            None
        }
        Op::Link(a, b) if is_file(a) && !exists(b) && dir_exists(parent_of(b)) => {
            if k(a).readonly {
                return Some(libc::EROFS);
            }
            if k(b).hidden {
                return Some(libc::EACCES);
            }
            if k(b).readonly {
                return Some(libc::EROFS);
            }
            if plain(a) && plain(b) {
                return Some(0);
            }
            None
        }
        _ => None,
    }
}

/// What the invariants track from the first walk.
struct Tracked {
    /// st_ino → content of each readonly file shown at the start.
    readonly: HashMap<u64, (String, String)>,
    /// Each protected file shown at the start (all come from the lower
    /// then): where it is now, followed through the moves that succeeded,
    /// and the st_ino shown there.
    protected: Vec<Shared>,
}

struct Shared {
    first: String,
    now: String,
    ino: u64,
    /// Unlinked (its upper copy dropped): the shared version shows again,
    /// maybe as another object (a copy that lives on under other names
    /// keeps the old one).
    reverted: bool,
}

fn track(policy: &Policy, seen: &BTreeMap<String, Seen>) -> Tracked {
    let mut t = Tracked {
        readonly: HashMap::new(),
        protected: Vec::new(),
    };
    for (rel, s) in seen {
        if s.kind != 'f' {
            continue;
        }
        let c = kinds(policy, rel);
        if c.readonly {
            t.readonly.insert(s.ino, (rel.clone(), s.data.clone()));
        }
        if c.protected {
            t.protected.push(Shared {
                first: rel.clone(),
                now: rel.clone(),
                ino: s.ino,
                reverted: false,
            });
        }
    }
    t
}

/// `path` after `from` was renamed to `to`, if it was at or beneath it.
fn moved(path: &str, from: &str, to: &str) -> Option<String> {
    if path == from {
        Some(to.to_string())
    } else {
        path.strip_prefix(from)
            .filter(|rest| rest.starts_with('/'))
            .map(|rest| format!("{to}{rest}"))
    }
}

/// Follows the tracked entries through an operation that succeeded.
fn follow(tracked: &mut Tracked, op: &Op) {
    for shared in &mut tracked.protected {
        match op {
            Op::Rename(a, b) => {
                if let Some(p) = moved(&shared.now, a, b) {
                    shared.now = p;
                }
            }
            Op::Exchange(a, b) => {
                if let Some(p) = moved(&shared.now, a, b).or_else(|| moved(&shared.now, b, a)) {
                    shared.now = p;
                }
            }
            Op::Unlink(a) if *a == shared.now => shared.reverted = true,
            _ => {}
        }
    }
}

/// Every invariant of the header on the walk `seen`; the problems found.
fn check(policy: &Policy, tracked: &Tracked, seen: &BTreeMap<String, Seen>) -> Vec<String> {
    let mut bad = Vec::new();
    // An object may have several names (hard links made through the
    // mount): every one is listed.
    let mut by_ino: HashMap<u64, Vec<(&String, &Seen)>> = HashMap::new();
    for (p, s) in seen {
        by_ino.entry(s.ino).or_default().push((p, s));
    }
    for (rel, s) in seen {
        if s.data.contains(SECRET) {
            bad.push(format!("hidden content visible at {rel}: {:?}", s.data));
        }
        if kinds(policy, rel).hidden {
            bad.push(format!("{rel} is classed hidden but visible"));
        }
        if s.kind == 'l' && !lexically_contained(rel, &s.data) {
            bad.push(format!("symlink {rel} -> {} escapes the workspace", s.data));
        }
    }
    // A readonly file cannot be linked or moved out of its class: each of
    // its names is readonly, with the content it had.
    for (ino, (was, content)) in &tracked.readonly {
        let names = by_ino.get(ino).map(Vec::as_slice).unwrap_or_default();
        if names.is_empty() {
            bad.push(format!("readonly file first at {was} is gone"));
        }
        for (rel, s) in names {
            if !kinds(policy, rel).readonly {
                bad.push(format!(
                    "readonly file first at {was} is at {rel}, not readonly"
                ));
            }
            if &s.data != content {
                bad.push(format!(
                    "readonly file first at {was} (now {rel}) changed: {content:?} -> {:?}",
                    s.data
                ));
            }
        }
    }
    // A protected shared entry is never gone: where the moves that
    // succeeded took it, the same object is still shown (or, after its
    // upper copy was unlinked, the shared version), at a protected path.
    for shared in &tracked.protected {
        let Shared {
            first, now, ino, ..
        } = shared;
        match seen.get(now) {
            None => bad.push(format!(
                "protected shared file first at {first} is gone from {now}"
            )),
            Some(s) => {
                if !kinds(policy, now).protected {
                    bad.push(format!(
                        "protected shared file first at {first} is at {now}, not protected"
                    ));
                }
                if s.ino != *ino && !shared.reverted {
                    bad.push(format!(
                        "protected shared file first at {first} was replaced at {now} (st_ino {ino} -> {})",
                        s.ino
                    ));
                }
            }
        }
    }
    bad
}

fn errname(e: i32) -> String {
    if e == 0 {
        return "ok".into();
    }
    let s = io::Error::from_raw_os_error(e).to_string();
    format!("errno {e} ({s})")
}

/// The outcome of one case: the operations run and the first finding.
struct Outcome {
    ops: Vec<Op>,
    finding: Option<String>,
    stats: Stats,
}

/// What a run did, for the summary line.
#[derive(Default, Clone, Copy)]
struct Stats {
    succeeded: usize,
    refused: usize,
    predicted: usize,
}

/// Runs one case: a fresh lower, policy and mount from `seed`, then
/// `steps` random operations, or exactly `replay` if given.
fn run_case(seed: u64, steps: usize, replay: Option<&[Op]>) -> (Outcome, String) {
    let mut rng = Rng::new(seed);
    let ws = Workspace::new();
    let text = random_policy(&mut rng);
    let policy = Policy::parse(&text).expect("generated policies parse");
    let lower = make_lower(&mut rng, ws.lower(), &policy);
    let context = format!(
        "seed {seed:#x}\npolicy:\n{}lower:\n  {}",
        text.lines().map(|l| format!("  {l}\n")).collect::<String>(),
        lower.listing.join("\n  ")
    );
    let lower_before = snapshot(ws.lower());
    let pf = policy_file(&ws, &text);
    let m = ws.mount_with(&["--policy", pf.to_str().unwrap()]);
    let mut ops = Vec::new();
    let mut stats = Stats::default();
    let first = match walk(m.path()) {
        Ok(s) => s,
        Err(e) => {
            let finding = Some(format!("walk of the fresh mount failed: {e}"));
            return (
                Outcome {
                    ops,
                    finding,
                    stats,
                },
                context,
            );
        }
    };
    let mut tracked = track(&policy, &first);
    let mut seen = first;
    let mut finding = None;
    let total = replay.map_or(steps, <[Op]>::len);
    for step in 0..total {
        let op = match replay {
            Some(r) => r[step].clone(),
            None => random_op(&mut rng, &seen),
        };
        let want = predict(&policy, &seen, &op);
        let before = seen.clone();
        let got = apply(m.path(), &op, step);
        ops.push(op.clone());
        if got == 0 {
            stats.succeeded += 1;
        } else {
            stats.refused += 1;
        }
        if let Some(want) = want {
            stats.predicted += 1;
            if want != got {
                finding = Some(format!(
                    "step {step}: `{op}` gave {}, the model says {}",
                    errname(got),
                    errname(want)
                ));
                break;
            }
        }
        if !is_mounted(m.path()) {
            finding = Some(format!("step {step}: `{op}`: the daemon stopped serving"));
            break;
        }
        seen = match walk(m.path()) {
            Ok(s) => s,
            Err(e) => {
                finding = Some(format!(
                    "step {step}: `{op}`: walking the mount failed: {e}"
                ));
                break;
            }
        };
        // A rename or exchange between two names of one object does
        // nothing (rename(2)): nothing to follow.
        let same_object = match &op {
            Op::Rename(a, b) | Op::Exchange(a, b) => {
                matches!((before.get(a), before.get(b)), (Some(x), Some(y)) if x.ino == y.ino)
            }
            _ => false,
        };
        if got == 0 && !same_object {
            follow(&mut tracked, &op);
        }
        let bad = check(&policy, &tracked, &seen);
        // A reverted entry is whatever object shows there now.
        for shared in &mut tracked.protected {
            if shared.reverted {
                if let Some(s) = seen.get(&shared.now) {
                    shared.ino = s.ino;
                }
                shared.reverted = false;
            }
        }
        if !bad.is_empty() {
            finding = Some(format!(
                "step {step}: after `{op}` ({}):\n    {}",
                errname(got),
                bad.join("\n    ")
            ));
            break;
        }
    }
    let clean = m.unmount();
    if finding.is_none() && !clean {
        finding = Some("the daemon exited with a failure".into());
    }
    if finding.is_none() && snapshot(ws.lower()) != lower_before {
        finding = Some("the lower changed".into());
    }
    (
        Outcome {
            ops,
            finding,
            stats,
        },
        context,
    )
}

/// Everything in a lower: path → type, mode, content or target.
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![String::new()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = fs::read_dir(root.join(&dir)) else {
            continue;
        };
        for e in rd.flatten() {
            let rel = join(&dir, &e.file_name().to_string_lossy());
            let p = root.join(&rel);
            let Ok(md) = fs::symlink_metadata(&p) else {
                continue;
            };
            let what = if md.is_dir() {
                stack.push(rel.clone());
                "dir".to_string()
            } else if md.file_type().is_symlink() {
                format!("-> {:?}", fs::read_link(&p).ok())
            } else {
                format!("{:?}", fs::read(&p).ok())
            };
            out.insert(rel, format!("{what} {:o} {}", md.mode(), md.nlink()));
        }
    }
    out
}

/// Shortens a failing sequence: drops steps (halves, then single steps)
/// while the case still fails. Returns the shortest failing sequence found
/// and its finding.
fn shrink(seed: u64, ops: Vec<Op>, finding: String) -> (Vec<Op>, String) {
    let mut best = (ops, finding);
    let mut chunk = best.0.len() / 2;
    let mut tries = 0;
    while chunk >= 1 && tries < 60 {
        let mut i = 0;
        let mut shrunk = false;
        while i + chunk <= best.0.len() && tries < 60 {
            let mut candidate = best.0.clone();
            candidate.drain(i..i + chunk);
            tries += 1;
            let (o, _) = run_case(seed, 0, Some(&candidate));
            if let Some(f) = o.finding {
                best = (o.ops, f);
                shrunk = true;
            } else {
                i += chunk;
            }
        }
        if !shrunk {
            chunk /= 2;
        }
    }
    best
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

#[test]
fn policy_holds_under_random_operation_sequences() {
    let cases = env_u64("LAYERFS_FUZZ_CASES").unwrap_or(12);
    let seed = env_u64("LAYERFS_FUZZ_SEED").unwrap_or(0x1a7e_2f50);
    let steps = env_u64("LAYERFS_FUZZ_STEPS").unwrap_or(40) as usize;
    let mut executed = 0;
    let mut total = Stats::default();
    let mut findings = Vec::new();
    for case in 0..cases {
        let case_seed = splitmix(seed.wrapping_add(case));
        let (outcome, context) = run_case(case_seed, steps, None);
        executed += outcome.ops.len();
        total.succeeded += outcome.stats.succeeded;
        total.refused += outcome.stats.refused;
        total.predicted += outcome.stats.predicted;
        if let Some(finding) = outcome.finding {
            let (ops, finding) = shrink(case_seed, outcome.ops, finding);
            let listed: Vec<String> = ops.iter().map(|o| format!("  {o}")).collect();
            findings.push(format!(
                "case {case} ({context})\noperations ({}):\n{}\nfinding: {finding}",
                ops.len(),
                listed.join("\n")
            ));
            if findings.len() >= 3 {
                break;
            }
        }
    }
    eprintln!(
        "policy model: seed {seed:#x}, {cases} cases, {executed} operations \
         ({} succeeded, {} refused, {} outcomes predicted), {} findings",
        total.succeeded,
        total.refused,
        total.predicted,
        findings.len()
    );
    assert!(
        findings.is_empty(),
        "{} finding(s):\n\n{}",
        findings.len(),
        findings.join("\n\n")
    );
}
