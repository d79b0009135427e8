//! Differential test: one seeded random sequence of operations runs on a
//! layerfs mount and on a kernel overlayfs mount (`redirect_dir=on`) of
//! identical lowers. Every result (Ok or errno) must agree, and so must the full
//! views (names, types, modes, sizes, contents, symlink targets, link counts,
//! hard-link groups, xattrs), compared every few operations and at the end.
//! Afterwards layerfs is unmounted and its lower+upper are mounted with kernel
//! overlayfs, which must show the tree layerfs showed (on-disk format check).
//!
//! Environment: LAYERFS_DIFF_SEEDS ("1-200" or "3,7,9"; default 1-10),
//! LAYERFS_DIFF_OPS (per seed; default 3000), LAYERFS_DIFF_EVERY (full view
//! compare period; default 100), LAYERFS_DIFF_SHRINK=0 (do not minimise a
//! failing sequence), LAYERFS_DIFF_SUBJECT=overlay (check the generator and
//! the checker: kernel overlayfs against itself). `scripts/differential` runs
//! long campaigns.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt;
use std::fs;
use std::io::Write;
use std::os::fd::IntoRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{self, KernelOverlay, Mount, Workspace};

/// Names used at every level of the generated trees.
const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
/// Depth of generated paths (renames may move entries deeper).
const MAX_DEPTH: usize = 3;
/// How many of the last operations a failure report shows.
const HISTORY: usize = 12;
/// The watchdog kills the layerfs daemon after this long without progress.
const STALL: Duration = Duration::from_secs(60);
/// Time spent at most on minimising a failing sequence.
const SHRINK_BUDGET: Duration = Duration::from_secs(120);

#[test]
fn differential_against_kernel_overlay() {
    let cfg = Settings::from_env();
    let started = Instant::now();
    let mut failures = Vec::new();
    for &seed in &cfg.seeds {
        let t = Instant::now();
        match run_seed(&cfg, seed) {
            Ok(stats) => println!(
                "differential: seed {seed}: {} ops agree ({:.1} s): {stats}",
                cfg.ops,
                t.elapsed().as_secs_f64()
            ),
            Err(f) => {
                println!("differential: seed {seed}: MISMATCH\n{f}");
                failures.push(f);
            }
        }
    }
    println!(
        "differential: {} seeds, {} failed, {:.1} s",
        cfg.seeds.len(),
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    if let Some(first) = failures.first() {
        let mut report = first.to_string();
        if cfg.shrink {
            report.push_str(&shrink(&cfg, first));
        }
        let seeds: Vec<String> = failures.iter().map(|f| f.seed.to_string()).collect();
        panic!(
            "differential mismatch (failing seeds: {})\n{report}",
            seeds.join(",")
        );
    }
}

// ---------------------------------------------------------------------------
// Settings

struct Settings {
    seeds: Vec<u64>,
    ops: usize,
    every: usize,
    shrink: bool,
    subject: SubjectKind,
}

#[derive(Clone, Copy, PartialEq)]
enum SubjectKind {
    Layerfs,
    Overlay,
    /// Kernel overlayfs without redirect_dir: renaming a lower directory is
    /// EXDEV there, so this subject must fail (a self-test of the checker).
    OverlayNoRedirect,
}

impl SubjectKind {
    fn name(self) -> &'static str {
        match self {
            SubjectKind::Layerfs => "layerfs",
            SubjectKind::Overlay => "overlay(subject)",
            SubjectKind::OverlayNoRedirect => "overlay(no redirect_dir)",
        }
    }
}

impl Settings {
    fn from_env() -> Settings {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let seeds = var("LAYERFS_DIFF_SEEDS")
            .map(|s| parse_seeds(&s))
            .unwrap_or_else(|| (1..=10).collect());
        let num = |k: &str, d: usize| {
            var(k).map_or(d, |v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("{k}={v}: not a number: {e}"))
            })
        };
        Settings {
            seeds,
            ops: num("LAYERFS_DIFF_OPS", 3000),
            every: num("LAYERFS_DIFF_EVERY", 100).max(1),
            shrink: var("LAYERFS_DIFF_SHRINK").as_deref() != Some("0"),
            subject: match var("LAYERFS_DIFF_SUBJECT").as_deref() {
                None | Some("layerfs") => SubjectKind::Layerfs,
                Some("overlay") => SubjectKind::Overlay,
                Some("overlay-noredirect") => SubjectKind::OverlayNoRedirect,
                Some(o) => {
                    panic!("LAYERFS_DIFF_SUBJECT={o}: want layerfs, overlay or overlay-noredirect")
                }
            },
        }
    }
}

/// "1-200", "3,7,9" or a mix ("1-5,42").
fn parse_seeds(s: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let n = |x: &str| -> u64 {
            x.trim()
                .parse()
                .unwrap_or_else(|e| panic!("LAYERFS_DIFF_SEEDS: bad seed {x:?}: {e}"))
        };
        match part.split_once('-') {
            Some((a, b)) => out.extend(n(a)..=n(b)),
            None => out.push(n(part)),
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Seeded PRNG (splitmix64)

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x9E37_79B9_7F4A_7C15)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }

    fn name(&mut self) -> &'static str {
        NAMES[self.below(NAMES.len() as u64) as usize]
    }
}

// ---------------------------------------------------------------------------
// Operations

#[derive(Clone, Copy, Debug, PartialEq)]
enum RenameFlags {
    Plain,
    NoReplace,
    Exchange,
}

#[derive(Clone, Debug)]
enum Op {
    CreateWrite {
        path: String,
        len: u64,
        fill: u8,
        mode: u32,
        umask: u32,
    },
    WriteAt {
        path: String,
        off: u64,
        len: u64,
        fill: u8,
    },
    Append {
        path: String,
        len: u64,
        fill: u8,
    },
    Truncate {
        path: String,
        len: u64,
    },
    Read {
        path: String,
    },
    Mkdir {
        path: String,
        mode: u32,
        umask: u32,
    },
    Rmdir {
        path: String,
    },
    Unlink {
        path: String,
    },
    Rename {
        from: String,
        to: String,
        flags: RenameFlags,
    },
    Link {
        from: String,
        to: String,
    },
    Symlink {
        target: String,
        path: String,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    SetXattr {
        path: String,
        value: String,
        follow: bool,
    },
    RemoveXattr {
        path: String,
    },
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::CreateWrite {
                path,
                len,
                fill,
                mode,
                umask,
            } => {
                write!(
                    f,
                    "create+write {path} len={len} fill={fill} mode={mode:o} umask={umask:03o}"
                )
            }
            Op::WriteAt {
                path,
                off,
                len,
                fill,
            } => write!(f, "pwrite {path} off={off} len={len} fill={fill}"),
            Op::Append { path, len, fill } => write!(f, "append {path} len={len} fill={fill}"),
            Op::Truncate { path, len } => write!(f, "truncate {path} {len}"),
            Op::Read { path } => write!(f, "read {path}"),
            Op::Mkdir { path, mode, umask } => write!(f, "mkdir {path} {mode:o} umask={umask:03o}"),
            Op::Rmdir { path } => write!(f, "rmdir {path}"),
            Op::Unlink { path } => write!(f, "unlink {path}"),
            Op::Rename { from, to, flags } => write!(f, "rename {from} {to} {flags:?}"),
            Op::Link { from, to } => write!(f, "link {from} {to}"),
            Op::Symlink { target, path } => write!(f, "symlink {target} {path}"),
            Op::Chmod { path, mode } => write!(f, "chmod {path} {mode:o}"),
            Op::SetXattr {
                path,
                value,
                follow,
            } => {
                let call = if *follow { "setxattr" } else { "lsetxattr" };
                write!(f, "{call} {path} user.x={value}")
            }
            Op::RemoveXattr { path } => write!(f, "removexattr {path} user.x"),
        }
    }
}

/// The callers' umasks new files and directories are made under.
const UMASKS: [u32; 4] = [0o000, 0o002, 0o022, 0o077];

/// Runs `f` under `umask` in this thread only: the thread gets a private
/// fs context (`unshare(CLONE_FS)`) once, so other tests' threads keep
/// theirs.
fn with_umask<T>(umask: u32, f: impl FnOnce() -> T) -> T {
    thread_local! {
        static PRIVATE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    PRIVATE.with(|p| {
        if !p.get() {
            // SAFETY: detaches this thread's cwd, root and umask only.
            let rc = unsafe { libc::unshare(libc::CLONE_FS) };
            assert_eq!(
                rc,
                0,
                "unshare(CLONE_FS): {}",
                std::io::Error::last_os_error()
            );
            p.set(true);
        }
    });
    // SAFETY: umask has no preconditions; it affects this thread only now.
    let old = unsafe { libc::umask(umask as libc::mode_t) };
    let r = f();
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    r
}

/// Ok(value) — bytes written, a content hash for reads, 0 otherwise — or errno.
type OpResult = Result<u64, i32>;

fn show(r: &OpResult) -> String {
    match r {
        Ok(v) => format!("Ok({v})"),
        Err(e) => format!("Err({})", errno_name(*e)),
    }
}

fn errno_name(e: i32) -> String {
    format!("{:?}", nix::errno::Errno::from_raw(e))
}

/// File data written by the operations: a pattern that depends on `fill`.
fn data(len: u64, fill: u8) -> Vec<u8> {
    (0..len)
        .map(|i| fill.wrapping_add((i % 251) as u8))
        .collect()
}

fn io_errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

fn last_errno() -> i32 {
    io_errno(std::io::Error::last_os_error())
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("test paths contain no NUL")
}

fn libc_result(rc: libc::c_int) -> OpResult {
    if rc < 0 {
        Err(last_errno())
    } else {
        Ok(0)
    }
}

/// Close explicitly so that an error reported at close (flush) is seen.
fn close(f: fs::File) -> OpResult {
    // SAFETY: the fd was just taken out of the File and is closed once.
    libc_result(unsafe { libc::close(f.into_raw_fd()) })
}

/// Apply `op` to the tree under `root` and return its result.
fn apply(root: &Path, op: &Op) -> OpResult {
    let at = |p: &str| root.join(p);
    match op {
        Op::CreateWrite {
            path,
            len,
            fill,
            mode,
            umask,
        } => {
            let mut f = with_umask(*umask, || {
                fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(*mode)
                    .open(at(path))
            })
            .map_err(io_errno)?;
            f.write_all(&data(*len, *fill)).map_err(io_errno)?;
            close(f)?;
            Ok(*len)
        }
        Op::WriteAt {
            path,
            off,
            len,
            fill,
        } => {
            let f = fs::OpenOptions::new()
                .write(true)
                .open(at(path))
                .map_err(io_errno)?;
            f.write_all_at(&data(*len, *fill), *off).map_err(io_errno)?;
            close(f)?;
            Ok(*len)
        }
        Op::Append { path, len, fill } => {
            let mut f = fs::OpenOptions::new()
                .append(true)
                .open(at(path))
                .map_err(io_errno)?;
            f.write_all(&data(*len, *fill)).map_err(io_errno)?;
            close(f)?;
            Ok(*len)
        }
        Op::Truncate { path, len } => {
            let p = cpath(&at(path));
            // SAFETY: p is a valid NUL-terminated path.
            libc_result(unsafe { libc::truncate(p.as_ptr(), *len as libc::off_t) })
        }
        Op::Read { path } => fs::read(at(path)).map(|d| fnv(&d)).map_err(io_errno),
        Op::Mkdir { path, mode, umask } => with_umask(*umask, || {
            fs::DirBuilder::new().mode(*mode).create(at(path))
        })
        .map(|_| 0)
        .map_err(io_errno),
        Op::Rmdir { path } => fs::remove_dir(at(path)).map(|_| 0).map_err(io_errno),
        Op::Unlink { path } => fs::remove_file(at(path)).map(|_| 0).map_err(io_errno),
        Op::Rename { from, to, flags } => {
            let (a, b) = (cpath(&at(from)), cpath(&at(to)));
            let flags = match flags {
                RenameFlags::Plain => 0,
                RenameFlags::NoReplace => libc::RENAME_NOREPLACE,
                RenameFlags::Exchange => libc::RENAME_EXCHANGE,
            };
            // SAFETY: valid NUL-terminated paths relative to AT_FDCWD.
            libc_result(unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    a.as_ptr(),
                    libc::AT_FDCWD,
                    b.as_ptr(),
                    flags,
                )
            })
        }
        Op::Link { from, to } => fs::hard_link(at(from), at(to)).map(|_| 0).map_err(io_errno),
        Op::Symlink { target, path } => std::os::unix::fs::symlink(target, at(path))
            .map(|_| 0)
            .map_err(io_errno),
        Op::Chmod { path, mode } => {
            fs::set_permissions(at(path), fs::Permissions::from_mode(*mode))
                .map(|_| 0)
                .map_err(io_errno)
        }
        Op::SetXattr {
            path,
            value,
            follow,
        } => {
            let p = cpath(&at(path));
            let name = c"user.x";
            let v = value.as_bytes();
            // SAFETY: valid path and name; value pointer and length match.
            libc_result(unsafe {
                if *follow {
                    libc::setxattr(p.as_ptr(), name.as_ptr(), v.as_ptr().cast(), v.len(), 0)
                } else {
                    libc::lsetxattr(p.as_ptr(), name.as_ptr(), v.as_ptr().cast(), v.len(), 0)
                }
            })
        }
        Op::RemoveXattr { path } => {
            let p = cpath(&at(path));
            // SAFETY: valid path and name.
            libc_result(unsafe { libc::removexattr(p.as_ptr(), c"user.x".as_ptr()) })
        }
    }
}

fn fnv(d: &[u8]) -> u64 {
    d.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

// ---------------------------------------------------------------------------
// Generation: the lower tree and the operations

/// Write the seeded lower tree into `dir` (files, directories, symlinks,
/// user xattrs; no hard links: those split on copy-up by design).
fn gen_lower(seed: u64, dir: &Path) {
    let mut rng = Rng::new(seed ^ 0x1057_0000_0000_0000);
    gen_lower_dir(&mut rng, dir, 1);
}

fn gen_lower_dir(rng: &mut Rng, dir: &Path, depth: usize) {
    for name in NAMES {
        let p = dir.join(name);
        let roll = rng.below(100);
        if roll < 32 {
            let len = if rng.chance(80) {
                rng.below(3000)
            } else {
                rng.below(20_000)
            };
            let fill = rng.below(256) as u8;
            fs::write(&p, data(len, fill)).unwrap();
            let mode = *rng.pick(&[0o644, 0o600, 0o755, 0o444, 0o640]);
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
            if rng.chance(20) {
                lower_xattr(&p, rng);
            }
        } else if roll < 60 && depth < MAX_DEPTH {
            fs::create_dir(&p).unwrap();
            gen_lower_dir(rng, &p, depth + 1);
            let mode = *rng.pick(&[0o755, 0o700, 0o750, 0o775]);
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
            if rng.chance(15) {
                lower_xattr(&p, rng);
            }
        } else if roll < 68 {
            std::os::unix::fs::symlink(symlink_target(rng), &p).unwrap();
        }
    }
}

fn lower_xattr(p: &Path, rng: &mut Rng) {
    let v = format!("lower{}", rng.below(1000));
    let c = cpath(p);
    // SAFETY: valid path and name; value pointer and length match.
    let rc = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            c"user.x".as_ptr(),
            v.as_ptr().cast(),
            v.len(),
            0,
        )
    };
    assert_eq!(rc, 0, "lsetxattr {}: {}", p.display(), last_errno());
}

/// A relative symlink target that only descends ("b" or "b/c"): wherever the
/// link is moved, following it stays inside the mount.
fn symlink_target(rng: &mut Rng) -> String {
    if rng.chance(60) {
        rng.name().to_string()
    } else {
        format!("{}/{}", rng.name(), rng.name())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    Char(u64),
    Block(u64),
}

/// The entries of the reference tree that operations pick from.
struct Known {
    entries: Vec<(String, Kind)>,
}

impl Known {
    /// Names and types under `root` (no contents: this runs after every op).
    fn list(root: &Path) -> Known {
        fn walk(root: &Path, rel: &str, out: &mut Vec<(String, Kind)>) {
            let Ok(rd) = fs::read_dir(root.join(rel)) else {
                return;
            };
            let mut names: Vec<String> = rd
                .filter_map(|d| d.ok())
                .map(|d| d.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            for n in names {
                let child = if rel.is_empty() {
                    n
                } else {
                    format!("{rel}/{n}")
                };
                let Ok(md) = fs::symlink_metadata(root.join(&child)) else {
                    continue;
                };
                let ft = md.file_type();
                let kind = if ft.is_dir() {
                    Kind::Dir
                } else if ft.is_symlink() {
                    Kind::Symlink
                } else if ft.is_file() {
                    Kind::File
                } else {
                    Kind::Fifo
                };
                out.push((child.clone(), kind));
                if kind == Kind::Dir {
                    walk(root, &child, out);
                }
            }
        }
        let mut entries = Vec::new();
        walk(root, "", &mut entries);
        Known { entries }
    }

    fn of(&self, kind: Kind) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|(_, k)| *k == kind)
            .map(|(p, _)| p.as_str())
            .collect()
    }

    fn random_path(rng: &mut Rng) -> String {
        let depth = 1 + rng.below(MAX_DEPTH as u64) as usize;
        (0..depth).map(|_| rng.name()).collect::<Vec<_>>().join("/")
    }

    /// Mostly an existing entry of `kind`, else any existing one, else random.
    fn existing(&self, rng: &mut Rng, kind: Option<Kind>) -> String {
        if let Some(k) = kind {
            let v = self.of(k);
            if !v.is_empty() && rng.chance(80) {
                return rng.pick(&v).to_string();
            }
        }
        if !self.entries.is_empty() && rng.chance(85) {
            return rng.pick(&self.entries).0.clone();
        }
        Known::random_path(rng)
    }

    /// A name inside an existing directory (which may exist already).
    fn fresh(&self, rng: &mut Rng) -> String {
        let mut dirs: Vec<&str> = self
            .of(Kind::Dir)
            .into_iter()
            .filter(|d| d.split('/').count() < MAX_DEPTH)
            .collect();
        dirs.push("");
        if rng.chance(90) {
            let d = *rng.pick(&dirs);
            let n = rng.name();
            if d.is_empty() {
                n.to_string()
            } else {
                format!("{d}/{n}")
            }
        } else {
            Known::random_path(rng)
        }
    }
}

fn gen_len(rng: &mut Rng) -> u64 {
    match rng.below(10) {
        0 => 0,
        1..=6 => rng.below(300),
        7 | 8 => rng.below(5000),
        _ => rng.below(40_000),
    }
}

fn gen_op(rng: &mut Rng, known: &Known) -> Op {
    let file = Some(Kind::File);
    let fill = rng.below(256) as u8;
    match rng.below(100) {
        0..=9 => {
            let path = if rng.chance(50) {
                known.fresh(rng)
            } else {
                known.existing(rng, file)
            };
            Op::CreateWrite {
                path,
                len: gen_len(rng),
                fill,
                mode: *rng.pick(&[0o644, 0o666, 0o777, 0o600]),
                umask: *rng.pick(&UMASKS),
            }
        }
        10..=17 => Op::WriteAt {
            path: known.existing(rng, file),
            off: rng.below(20_000),
            len: gen_len(rng).min(8192),
            fill,
        },
        18..=22 => Op::Append {
            path: known.existing(rng, file),
            len: gen_len(rng).min(8192),
            fill,
        },
        23..=28 => Op::Truncate {
            path: known.existing(rng, file),
            len: if rng.chance(50) {
                rng.below(300)
            } else {
                rng.below(30_000)
            },
        },
        29..=33 => Op::Read {
            path: known.existing(rng, file),
        },
        34..=42 => Op::Mkdir {
            path: known.fresh(rng),
            mode: *rng.pick(&[0o755, 0o777, 0o700, 0o750]),
            umask: *rng.pick(&UMASKS),
        },
        43..=48 => Op::Rmdir {
            path: known.existing(rng, Some(Kind::Dir)),
        },
        49..=56 => {
            let kind = if rng.chance(50) { file } else { None };
            Op::Unlink {
                path: known.existing(rng, kind),
            }
        }
        57..=71 => {
            let from = known.existing(rng, None);
            let to = match rng.below(10) {
                0..=3 => known.existing(rng, None),
                4..=8 => known.fresh(rng),
                _ => Known::random_path(rng),
            };
            let flags = match rng.below(10) {
                0 => RenameFlags::NoReplace,
                1 => RenameFlags::Exchange,
                _ => RenameFlags::Plain,
            };
            Op::Rename { from, to, flags }
        }
        72..=77 => Op::Link {
            from: known.existing(rng, file),
            to: known.fresh(rng),
        },
        78..=83 => Op::Symlink {
            target: symlink_target(rng),
            path: known.fresh(rng),
        },
        84..=90 => Op::Chmod {
            path: known.existing(rng, None),
            mode: *rng.pick(&[0o644, 0o600, 0o755, 0o700, 0o444, 0o4755, 0o2755, 0o1777]),
        },
        91..=96 => Op::SetXattr {
            path: known.existing(rng, None),
            value: format!("v{}", rng.below(1000)),
            follow: rng.chance(80),
        },
        _ => Op::RemoveXattr {
            path: known.existing(rng, None),
        },
    }
}

// ---------------------------------------------------------------------------
// Views: what a tree looks like through a mount

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    kind: Kind,
    mode: u32,
    /// Files: size and content hash; symlinks: target; others: empty.
    size: u64,
    hash: u64,
    target: String,
    /// Non-directories only (directory link counts are not compared).
    nlink: u64,
    /// Every listed xattr with its value.
    xattrs: BTreeMap<String, String>,
    /// An error met while looking at this entry.
    err: Option<String>,
}

impl Entry {
    fn error(what: &str, e: i32) -> Entry {
        Entry {
            kind: Kind::File,
            mode: 0,
            size: 0,
            hash: 0,
            target: String::new(),
            nlink: 0,
            xattrs: BTreeMap::new(),
            err: Some(format!("{what}: {}", errno_name(e))),
        }
    }
}

#[derive(Debug, Default, PartialEq)]
struct View {
    /// Path relative to the mount ("" is the root) → entry.
    entries: BTreeMap<String, Entry>,
    /// Groups of paths that are one inode (hard links), each sorted.
    links: Vec<Vec<String>>,
}

fn view(root: &Path) -> View {
    let mut v = View::default();
    let mut inodes: BTreeMap<(u64, u64), Vec<String>> = BTreeMap::new();
    view_entry(root, "", &mut v, &mut inodes);
    v.links = inodes.into_values().filter(|g| g.len() > 1).collect();
    v.links.sort();
    v
}

fn view_entry(
    root: &Path,
    rel: &str,
    v: &mut View,
    inodes: &mut BTreeMap<(u64, u64), Vec<String>>,
) {
    let p = if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    };
    let md = match fs::symlink_metadata(&p) {
        Ok(m) => m,
        Err(e) => {
            v.entries
                .insert(rel.to_string(), Entry::error("lstat", io_errno(e)));
            return;
        }
    };
    let ft = md.file_type();
    use std::os::unix::fs::FileTypeExt;
    let kind = if ft.is_file() {
        Kind::File
    } else if ft.is_dir() {
        Kind::Dir
    } else if ft.is_symlink() {
        Kind::Symlink
    } else if ft.is_fifo() {
        Kind::Fifo
    } else if ft.is_socket() {
        Kind::Socket
    } else if ft.is_char_device() {
        Kind::Char(md.rdev())
    } else {
        Kind::Block(md.rdev())
    };
    let mut e = Entry {
        kind,
        mode: md.mode() & 0o7777,
        size: 0,
        hash: 0,
        target: String::new(),
        nlink: if kind == Kind::Dir { 0 } else { md.nlink() },
        xattrs: BTreeMap::new(),
        err: None,
    };
    match kind {
        Kind::File => {
            e.size = md.len();
            match fs::read(&p) {
                Ok(d) => {
                    e.hash = fnv(&d);
                    if d.len() as u64 != md.len() {
                        e.err = Some(format!("read {} bytes, st_size {}", d.len(), md.len()));
                    }
                }
                Err(err) => e.err = Some(format!("read: {}", errno_name(io_errno(err)))),
            }
        }
        Kind::Symlink => match fs::read_link(&p) {
            Ok(t) => e.target = t.to_string_lossy().into_owned(),
            Err(err) => e.err = Some(format!("readlink: {}", errno_name(io_errno(err)))),
        },
        _ => {}
    }
    match xattrs(&p) {
        Ok(x) => e.xattrs = x,
        Err(err) => e.err = Some(err),
    }
    if kind != Kind::Dir {
        inodes
            .entry((md.dev(), md.ino()))
            .or_default()
            .push(rel.to_string());
    }
    v.entries.insert(rel.to_string(), e);
    if kind == Kind::Dir {
        let rd = match fs::read_dir(&p) {
            Ok(rd) => rd,
            Err(err) => {
                v.entries.insert(
                    format!("{rel}/<readdir>"),
                    Entry::error("readdir", io_errno(err)),
                );
                return;
            }
        };
        let mut names = Vec::new();
        for d in rd {
            match d {
                Ok(d) => names.push(d.file_name().to_string_lossy().into_owned()),
                Err(err) => {
                    v.entries.insert(
                        format!("{rel}/<readdir>"),
                        Entry::error("readdir", io_errno(err)),
                    );
                }
            }
        }
        names.sort();
        let before = names.len();
        names.dedup();
        if names.len() != before {
            v.entries.insert(
                format!("{rel}/<readdir>"),
                Entry::error("readdir listed a name twice", libc::EIO),
            );
        }
        for n in names {
            let child = if rel.is_empty() {
                n
            } else {
                format!("{rel}/{n}")
            };
            view_entry(root, &child, v, inodes);
        }
    }
}

/// All xattrs of `p` (not following a symlink), values as lossy text.
pub(crate) fn xattrs(p: &Path) -> Result<BTreeMap<String, String>, String> {
    let c = cpath(p);
    let mut buf = vec![0u8; 4096];
    // SAFETY: buf is writable for buf.len() bytes.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(format!("llistxattr: {}", errno_name(last_errno())));
    }
    let mut out = BTreeMap::new();
    for name in buf[..n as usize]
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
    {
        let cname = CString::new(name).expect("xattr names have no NUL");
        let mut val = vec![0u8; 4096];
        // SAFETY: val is writable for val.len() bytes.
        let m = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                cname.as_ptr(),
                val.as_mut_ptr().cast(),
                val.len(),
            )
        };
        let value = if m < 0 {
            format!("<{}>", errno_name(last_errno()))
        } else {
            String::from_utf8_lossy(&val[..m as usize]).into_owned()
        };
        out.insert(String::from_utf8_lossy(name).into_owned(), value);
    }
    Ok(out)
}

/// Differences between two views, at most `limit` lines, with the first
/// differing byte of a file whose contents differ.
fn diff_views(
    a_name: &str,
    a: &View,
    a_root: &Path,
    b_name: &str,
    b: &View,
    b_root: &Path,
) -> String {
    let limit = 12;
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<&String> =
        a.entries.keys().chain(b.entries.keys()).collect();
    for k in keys {
        let shown = if k.is_empty() { "/" } else { k.as_str() };
        match (a.entries.get(k), b.entries.get(k)) {
            (Some(x), None) => out.push(format!("  only in {a_name}: {shown} {x:?}")),
            (None, Some(y)) => out.push(format!("  only in {b_name}: {shown} {y:?}")),
            (Some(x), Some(y)) if x != y => {
                let mut line = format!("  {shown}:\n    {a_name}: {x:?}\n    {b_name}: {y:?}");
                if x.kind == Kind::File && y.kind == Kind::File && x.hash != y.hash {
                    line.push_str(&first_difference(&a_root.join(k), &b_root.join(k)));
                }
                out.push(line);
            }
            _ => {}
        }
    }
    if a.links != b.links {
        out.push(format!(
            "  hard-link groups differ:\n    {a_name}: {:?}\n    {b_name}: {:?}",
            a.links, b.links
        ));
    }
    let n = out.len();
    out.truncate(limit);
    if n > limit {
        out.push(format!("  … {} more differences", n - limit));
    }
    out.join("\n")
}

fn first_difference(a: &Path, b: &Path) -> String {
    match (fs::read(a), fs::read(b)) {
        (Ok(x), Ok(y)) => {
            let i = x
                .iter()
                .zip(&y)
                .position(|(p, q)| p != q)
                .unwrap_or(x.len().min(y.len()));
            format!(
                "\n    first difference at byte {i}: {:?} vs {:?} (lengths {} and {})",
                x.get(i),
                y.get(i),
                x.len(),
                y.len()
            )
        }
        _ => String::new(),
    }
}

// ---------------------------------------------------------------------------
// Mounts

enum Subject {
    Layerfs(Mount),
    Overlay(KernelOverlay),
}

/// Kills the layerfs daemon when no operation completes for `STALL`, so a
/// hung request fails the test (ENOTCONN) instead of hanging it.
struct Watchdog {
    progress: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    fired: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(pid: u32) -> Watchdog {
        let progress = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let fired = Arc::new(AtomicBool::new(false));
        let (p, s, f) = (progress.clone(), stop.clone(), fired.clone());
        let thread = std::thread::spawn(move || {
            let mut last = (0, Instant::now());
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let now = p.load(Ordering::Relaxed);
                if now != last.0 {
                    last = (now, Instant::now());
                } else if last.1.elapsed() > STALL && pid != 0 {
                    f.store(true, Ordering::Relaxed);
                    // SAFETY: plain kill(2) of the daemon this test started.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                    return;
                }
            }
        });
        Watchdog {
            progress,
            stop,
            fired,
            thread: Some(thread),
        }
    }

    fn tick(&self) {
        self.progress.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The two mounts of one run. Mount guards come first so they drop (unmount)
/// before the workspaces are removed.
struct Session {
    watchdog: Option<Watchdog>,
    subject: Option<Subject>,
    reference: KernelOverlay,
    subject_name: &'static str,
    subject_ws: Workspace,
    _reference_ws: Workspace,
}

impl Session {
    fn start(seed: u64, kind: SubjectKind) -> Result<Session, String> {
        let subject_ws = Workspace::new();
        let reference_ws = Workspace::new();
        gen_lower(seed, subject_ws.lower());
        gen_lower(seed, reference_ws.lower());
        let reference = KernelOverlay::mount(
            &[reference_ws.lower()],
            &reference_ws.upper,
            &reference_ws.work,
            &reference_ws.mnt,
        )?;
        let (subject, watchdog) = match kind {
            SubjectKind::Layerfs => {
                let policy = harness::policy_file(
                    &subject_ws,
                    "# POSIX semantics for the differential test\n\
                     symlinks any\ndevices allow\nsuid allow\n",
                );
                let policy = policy.to_string_lossy().into_owned();
                let m = subject_ws
                    .try_mount_with(&["--policy", &policy])
                    .map_err(|e| format!("layerfs mount: {e}"))?;
                let w = Watchdog::start(m.pid());
                (Subject::Layerfs(m), Some(w))
            }
            SubjectKind::Overlay | SubjectKind::OverlayNoRedirect => (
                Subject::Overlay(KernelOverlay::mount_with(
                    &[subject_ws.lower()],
                    &subject_ws.upper,
                    &subject_ws.work,
                    &subject_ws.mnt,
                    if kind == SubjectKind::Overlay {
                        "redirect_dir=on"
                    } else {
                        "redirect_dir=off"
                    },
                )?),
                None,
            ),
        };
        Ok(Session {
            watchdog,
            subject: Some(subject),
            reference,
            subject_name: kind.name(),
            subject_ws,
            _reference_ws: reference_ws,
        })
    }

    fn subject_root(&self) -> &Path {
        &self.subject_ws.mnt
    }

    fn reference_root(&self) -> &Path {
        self.reference.path()
    }

    fn apply(&self, op: &Op) -> (OpResult, OpResult) {
        let s = apply(self.subject_root(), op);
        let r = apply(self.reference_root(), op);
        if let Some(w) = &self.watchdog {
            w.tick();
        }
        (s, r)
    }

    fn stalled(&self) -> bool {
        self.watchdog
            .as_ref()
            .is_some_and(|w| w.fired.load(Ordering::Relaxed))
    }

    /// Compare the full views; Err(description) when they differ.
    fn compare_views(&self) -> Result<View, String> {
        let s = view(self.subject_root());
        let r = view(self.reference_root());
        if let Some(w) = &self.watchdog {
            w.tick();
        }
        if s == r {
            return Ok(s);
        }
        Err(format!(
            "views differ ({} vs kernel overlay):\n{}",
            self.subject_name,
            diff_views(
                self.subject_name,
                &s,
                self.subject_root(),
                "overlay",
                &r,
                self.reference_root()
            )
        ))
    }

    /// Unmount the subject and mount its lower+upper with kernel overlayfs:
    /// it must show `shown`, what the subject showed last.
    fn remount_check(&mut self, shown: &View) -> Result<(), String> {
        self.watchdog = None;
        let clean = match self.subject.take() {
            Some(Subject::Layerfs(m)) => m.unmount(),
            Some(Subject::Overlay(o)) => {
                drop(o);
                true
            }
            None => true,
        };
        let work2 = self.subject_ws.dir.path().join("work2");
        let o = KernelOverlay::mount(
            &[self.subject_ws.lower()],
            &self.subject_ws.upper,
            &work2,
            &self.subject_ws.mnt,
        )
        .map_err(|e| format!("kernel overlay of {}'s upper: {e}", self.subject_name))?;
        let v = view(o.path());
        let result = if &v == shown {
            Ok(())
        } else {
            Err(format!(
                "kernel overlay of {name}'s lower+upper differs from what {name} showed:\n{}",
                diff_views(self.subject_name, shown, o.path(), "remount", &v, o.path()),
                name = self.subject_name
            ))
        };
        drop(o);
        if !clean {
            return Err(format!("{} did not unmount cleanly", self.subject_name));
        }
        result
    }
}

// ---------------------------------------------------------------------------
// Running a seed

/// A mismatch: where it happened and what led there.
struct Failure {
    seed: u64,
    subject: &'static str,
    /// Index of the operation whose results differed, if it was a result.
    at: Option<usize>,
    what: String,
    /// The operations applied, with both results (the last one failed when
    /// `at` is set).
    history: Vec<(Op, OpResult, OpResult)>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.history.len();
        match self.at {
            Some(i) => writeln!(
                f,
                "seed {}: operation #{i} gave different results",
                self.seed
            )?,
            None => writeln!(f, "seed {}: after {n} operations", self.seed)?,
        }
        writeln!(f, "{}", self.what)?;
        writeln!(f, "last operations ({} vs overlay):", self.subject)?;
        for (i, (op, s, r)) in self
            .history
            .iter()
            .enumerate()
            .skip(n.saturating_sub(HISTORY))
        {
            let mark = if s != r { "  <-- differs" } else { "" };
            writeln!(f, "  #{i} {op}: {} / {}{mark}", show(s), show(r))?;
        }
        write!(
            f,
            "rerun: LAYERFS_DIFF_SEEDS={} LAYERFS_DIFF_OPS={} scripts/differential",
            self.seed,
            n.max(1)
        )
    }
}

/// Run one seed; on success, a summary of the results seen.
fn run_seed(cfg: &Settings, seed: u64) -> Result<String, Failure> {
    let fail = |at, what: String, history: Vec<_>| Failure {
        seed,
        subject: cfg.subject.name(),
        at,
        what,
        history,
    };
    let mut session = Session::start(seed, cfg.subject).map_err(|e| fail(None, e, Vec::new()))?;
    let mut rng = Rng::new(seed);
    let mut history = Vec::with_capacity(cfg.ops);
    let mut known = Known::list(session.reference_root());
    let mut last_view = None;
    for i in 0..cfg.ops {
        let op = gen_op(&mut rng, &known);
        let (s, r) = session.apply(&op);
        history.push((op.clone(), s, r));
        if s != r {
            let what = format!(
                "{op}\n  {}: {}\n  overlay: {}{}",
                cfg.subject.name(),
                show(&s),
                show(&r),
                if session.stalled() {
                    "\n  (watchdog killed the daemon after a stall)"
                } else {
                    ""
                }
            );
            return Err(fail(Some(i), what, history));
        }
        if (i + 1) % cfg.every == 0 || i + 1 == cfg.ops {
            match session.compare_views() {
                Ok(v) => last_view = Some(v),
                Err(what) => return Err(fail(None, what, history)),
            }
        }
        known = Known::list(session.reference_root());
    }
    let shown = match last_view {
        Some(v) => v,
        None => session
            .compare_views()
            .map_err(|what| fail(None, what, history.clone()))?,
    };
    session
        .remount_check(&shown)
        .map_err(|what| fail(None, what, history.clone()))?;
    Ok(result_stats(&history))
}

/// "N ok, M failed (ENOENT 12, EEXIST 3, …)".
fn result_stats(history: &[(Op, OpResult, OpResult)]) -> String {
    let mut errs: BTreeMap<String, usize> = BTreeMap::new();
    let mut ok = 0;
    for (_, r, _) in history {
        match r {
            Ok(_) => ok += 1,
            Err(e) => *errs.entry(errno_name(*e)).or_default() += 1,
        }
    }
    let mut errs: Vec<(String, usize)> = errs.into_iter().collect();
    errs.sort_by_key(|e| std::cmp::Reverse(e.1));
    let list: Vec<String> = errs.iter().map(|(e, n)| format!("{e} {n}")).collect();
    format!(
        "{ok} ok, {} errors ({})",
        history.len() - ok,
        list.join(", ")
    )
}

/// Replay fixed operations on fresh mounts; Some(failure) if they mismatch.
fn replay(cfg: &Settings, seed: u64, ops: &[Op]) -> Option<Failure> {
    let fail = |at, what, history| Failure {
        seed,
        subject: cfg.subject.name(),
        at,
        what,
        history,
    };
    // A mount that does not come up is not the mismatch being minimised.
    let mut session = Session::start(seed, cfg.subject).ok()?;
    let mut history = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let (s, r) = session.apply(op);
        history.push((op.clone(), s, r));
        if s != r {
            let what = format!(
                "{op}\n  {}: {}\n  overlay: {}",
                cfg.subject.name(),
                show(&s),
                show(&r)
            );
            return Some(fail(Some(i), what, history));
        }
    }
    match session.compare_views() {
        Err(what) => Some(fail(None, what, history)),
        Ok(shown) => session
            .remount_check(&shown)
            .err()
            .map(|what| fail(None, what, history)),
    }
}

/// Minimise the operations of a failure (drop chunks while it still fails),
/// within `SHRINK_BUDGET`, and describe the result.
fn shrink(cfg: &Settings, f: &Failure) -> String {
    let started = Instant::now();
    let mut ops: Vec<Op> = f.history.iter().map(|h| h.0.clone()).collect();
    let mut last = match replay(cfg, f.seed, &ops) {
        Some(x) => x,
        None => return "\n(minimising: the failure did not reproduce on a replay)".into(),
    };
    let mut chunk = ops.len().div_ceil(2);
    'outer: while chunk >= 1 {
        let mut i = 0;
        while i < ops.len() {
            if started.elapsed() > SHRINK_BUDGET {
                break 'outer;
            }
            let mut trial = ops.clone();
            trial.drain(i..(i + chunk).min(ops.len()));
            match replay(cfg, f.seed, &trial) {
                Some(x) => {
                    // Keep only what led to the mismatch.
                    trial.truncate(x.history.len());
                    ops = trial;
                    last = x;
                }
                None => i += chunk,
            }
        }
        if chunk == 1 {
            break;
        }
        chunk = chunk.div_ceil(2).min(chunk - 1).max(1);
    }
    let mut s = format!(
        "\n\nminimal reproduction found in {:.0} s: lower generated from seed {}, then {} operation(s):\n",
        started.elapsed().as_secs_f64(),
        f.seed,
        ops.len()
    );
    for (i, (op, a, b)) in last.history.iter().enumerate() {
        s.push_str(&format!("  #{i} {op}: {} / {}\n", show(a), show(b)));
    }
    s.push_str(&format!("mismatch: {}\n", last.what));
    s.push_str(&describe_lower(f.seed, &ops));
    s
}

/// The generated lower entries the operations name (and their parents).
fn describe_lower(seed: u64, ops: &[Op]) -> String {
    let Ok(tmp) = tempfile::tempdir() else {
        return String::new();
    };
    gen_lower(seed, tmp.path());
    let mut paths = std::collections::BTreeSet::new();
    for op in ops {
        let names: Vec<&String> = match op {
            Op::Rename { from, to, .. } | Op::Link { from, to } => vec![from, to],
            Op::CreateWrite { path, .. }
            | Op::WriteAt { path, .. }
            | Op::Append { path, .. }
            | Op::Truncate { path, .. }
            | Op::Read { path }
            | Op::Mkdir { path, .. }
            | Op::Rmdir { path }
            | Op::Unlink { path }
            | Op::Symlink { path, .. }
            | Op::Chmod { path, .. }
            | Op::SetXattr { path, .. }
            | Op::RemoveXattr { path } => vec![path],
        };
        for n in names {
            let mut prefix = String::new();
            for c in n.split('/') {
                if !prefix.is_empty() {
                    prefix.push('/');
                }
                prefix.push_str(c);
                paths.insert(prefix.clone());
            }
        }
    }
    let mut out = String::from("lower entries these operations name:\n");
    for p in paths {
        let full = tmp.path().join(&p);
        let what = match fs::symlink_metadata(&full) {
            Err(_) => continue,
            Ok(m) if m.is_dir() => format!("dir {:o}", m.mode() & 0o7777),
            Ok(m) if m.file_type().is_symlink() => format!(
                "symlink -> {}",
                fs::read_link(&full)
                    .map(|t| t.display().to_string())
                    .unwrap_or_default()
            ),
            Ok(m) => format!("file {:o} {} bytes", m.mode() & 0o7777, m.len()),
        };
        let x = xattrs(&full).unwrap_or_default();
        let x = if x.is_empty() {
            String::new()
        } else {
            format!(" {x:?}")
        };
        out.push_str(&format!("  {p}: {what}{x}\n"));
    }
    out
}
