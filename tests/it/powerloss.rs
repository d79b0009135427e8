//! Power loss: the upper and work dir live on an ext4 image; while the
//! crash scenario's workload runs (large copy-up, lower-dir rename,
//! whiteouts, opaque dir, link copy-ups, fsynced appends) the image is
//! captured at random moments as the block device holds it, the way a
//! power cut would leave it; each capture must pass `e2fsck -fn` after its
//! journal replay and, mounted under layerfs with the same lower, show no
//! partial copy-up, no half-renamed directory, every record whose fsync
//! returned before the capture, an empty work dir, and the tree kernel
//! overlayfs shows for it.
//!
//! How a capture is taken: the ext4 image file sits on a btrfs filesystem
//! (itself an image); `cp --reflink=always` clones it. A clone takes the
//! file's inode lock and waits for writes in flight, so it is one instant
//! of what the loop device has completed — dirty pages still in ext4's
//! page cache are not in it, exactly as after a power cut. (`fsfreeze`
//! would first write back every dirty page, so a copy of a frozen image is
//! a clean shutdown, not a power loss. What no capture here can model is a
//! disk cache that loses part of the completed but unflushed writes:
//! replaying a write log to each flush, as dm-log-writes does, needs
//! device-mapper, which this kernel lacks.)
//!
//! `scripts/powerloss [ROUNDS [CUTS]]` runs long campaigns; the default run
//! does one round with two captures. Knobs: LAYERFS_POWERLOSS_ROUNDS,
//! LAYERFS_POWERLOSS_CUTS (captures per round), LAYERFS_POWERLOSS_SEED,
//! LAYERFS_POWERLOSS_BIG_MIB (the large lower file: 16 MiB by default,
//! 64 in the script), LAYERFS_POWERLOSS_SPAN_MS.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::crash::{env_u64, tree_view, view_diff, Rng, Scenario, Workers};
use crate::fulldisk::{run, LoopFs};
use crate::harness::KernelOverlay;
use crate::harness::*;

/// One capture: the clone of the image and the progress seen before it.
struct Cut {
    img: PathBuf,
    progress: String,
    at: Duration,
}

/// Checks one capture: journal replay, e2fsck, layerfs over it, kernel
/// overlayfs over it. Returns the violations.
fn check_cut(ws: &mut Workspace, sc: &Scenario, cut: &Cut, n: usize) -> Vec<String> {
    let mut bad = Vec::new();
    let mnt = ws.dir.path().join(format!("cut{n}"));
    fs::create_dir_all(&mnt).unwrap();
    // Mounting replays the journal, as the first boot after the cut would.
    let copy = LoopFs::attach(&cut.img, &mnt, "");
    copy.umount();
    let out = Command::new("e2fsck")
        .args(["-fn"])
        .arg(&cut.img)
        .output()
        .unwrap();
    if !out.status.success() {
        bad.push(format!(
            "e2fsck -fn after the journal replay: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
        return bad;
    }
    copy.mount("");
    ws.upper = mnt.join("upper");
    ws.work = mnt.join("work");
    let m = match ws.try_mount_with(&[]) {
        Ok(m) => m,
        Err(e) => {
            bad.push(format!("layerfs over the capture: {e}"));
            return bad;
        }
    };
    let debris: Vec<_> = fs::read_dir(&ws.work)
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    if !debris.is_empty() {
        bad.push(format!("work dir not empty after the mount: {debris:?}"));
    }
    bad.extend(sc.check(&m.path, &cut.progress));
    let view = tree_view(&m.path);
    if !m.unmount() {
        bad.push("the daemon over the capture did not exit cleanly".into());
    }
    let kmnt = ws.dir.path().join("kmnt");
    match KernelOverlay::mount(&[ws.lower()], &ws.upper, &mnt.join("kwork"), &kmnt) {
        Ok(k) => {
            let kview = tree_view(&kmnt);
            drop(k);
            bad.extend(view_diff(&view, &kview));
        }
        Err(e) => bad.push(e),
    }
    drop(copy);
    let _ = fs::remove_file(&cut.img);
    bad
}

/// One round: a fresh ext4 upper, the workload, `cuts` captures at random
/// moments of it; then each capture is checked.
/// Returns how many captures came while the workload still ran.
fn round(
    ws: &mut Workspace,
    sc: &Scenario,
    host: &Path,
    span: u64,
    rng: &mut Rng,
    cuts: u64,
) -> u64 {
    let up = LoopFs::new(host, "up", 256, &["mkfs.ext4", "-q"], "");
    ws.upper = up.mnt.join("upper");
    ws.work = up.mnt.join("work");
    fs::create_dir(&ws.upper).unwrap();
    fs::create_dir(&ws.work).unwrap();
    // The empty upper and work dir exist on disk before the workload
    // starts (a cut before that would lose them: not layerfs's doing).
    run(Command::new("sync").arg("-f").arg(&up.mnt));
    let progress = ws.dir.path().join("progress");
    fs::write(&progress, b"").unwrap();
    let m = ws.mount();
    let mut moments: Vec<u64> = (0..cuts).map(|_| rng.below(span)).collect();
    moments.sort();
    let start = Instant::now();
    let mut workers = Workers::start(&m.path, &progress);
    let mut taken = Vec::new();
    let mut mid = 0;
    for (i, at) in moments.iter().enumerate() {
        let at = Duration::from_micros(*at);
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        // Everything the workload reported before the clone starts was
        // fsynced before it.
        let seen = fs::read_to_string(&progress).unwrap();
        mid += (workers.running() > 0) as u64;
        let img = host.join(format!("cut{i}.img"));
        run(Command::new("cp")
            .arg("--reflink=always")
            .arg(&up.img)
            .arg(&img));
        taken.push(Cut {
            img,
            progress: seen,
            at: start.elapsed(),
        });
    }
    assert!(
        workers.wait(Duration::from_secs(120)),
        "workload did not finish"
    );
    assert!(workers.all_succeeded(), "workload failed");
    drop(workers);
    drop(m);
    drop(up);
    for (i, cut) in taken.iter().enumerate() {
        let bad = check_cut(ws, sc, cut, i);
        assert!(
            bad.is_empty(),
            "capture {i} at {} ms:\n{}\ndaemon log: {}",
            cut.at.as_millis(),
            bad.join("\n"),
            ws.daemon_log()
        );
    }
    mid
}

/// LAYERFS_POWERLOSS_SEED, or a seed from the clock (printed by each test
/// so a failing run can be repeated).
fn seed() -> u64 {
    env_u64(
        "LAYERFS_POWERLOSS_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
}

/// Captures of the upper's block device taken mid-workload, as a power cut
/// would leave it, are consistent (e2fsck), and layerfs over them shows
/// nothing partial and every fsynced record.
#[test]
fn a_power_cut_mid_workload_leaves_a_consistent_upper_with_every_fsynced_write() {
    let rounds = env_u64("LAYERFS_POWERLOSS_ROUNDS", 1);
    let cuts = env_u64("LAYERFS_POWERLOSS_CUTS", 2);
    let seed = seed();
    let big_mib = env_u64("LAYERFS_POWERLOSS_BIG_MIB", 16);
    let mut ws = Workspace::new();
    let sc = Scenario::build(ws.lower(), big_mib);
    // Cut moments fall in the first LAYERFS_POWERLOSS_SPAN_MS of the
    // workload (it takes about 3 s on this kind of machine).
    let span = env_u64("LAYERFS_POWERLOSS_SPAN_MS", 3000) * 1000;
    let host = LoopFs::new(ws.dir.path(), "host", 2048, &["mkfs.btrfs", "-q"], "");
    eprintln!("powerloss: seed {seed}, {rounds} rounds x {cuts} cuts");
    let mut rng = Rng::new(seed);
    let t0 = Instant::now();
    let mut mid = 0;
    for r in 1..=rounds {
        mid += round(&mut ws, &sc, &host.mnt, span, &mut rng, cuts);
        if r % 10 == 0 {
            eprintln!(
                "powerloss: {r} rounds ({} cuts, {mid} mid-workload) clean, {} s",
                r * cuts,
                t0.elapsed().as_secs()
            );
        }
    }
    eprintln!(
        "powerloss: {rounds} rounds, {} cuts ({mid} mid-workload) clean, seed {seed}, {} s",
        rounds * cuts,
        t0.elapsed().as_secs()
    );
}

/// `layerfs run --checkpoint` of commands that each change files, on an
/// ext4 upper, captured at random moments: the checkpoints of `run` are
/// not synced before the command starts (`Durability::Deferred`), so this
/// is what a power cut may leave of them. Each capture must mount (its
/// stack names only layers it holds, its records read), and show the
/// commands' files as a prefix of the commands: never a file of an
/// earlier command lost while a later one's is there.
/// Captures the image of `up` (which lives on `host`, a btrfs) `cuts`
/// times, at moments drawn from `seed` within `span` of now, as a power
/// cut would leave it (see the module comment); returns the captures in
/// the order taken.
fn capture_at_random(
    host: &LoopFs,
    up: &LoopFs,
    cuts: u64,
    seed: u64,
    span: Duration,
) -> Vec<PathBuf> {
    let mut rng = Rng::new(seed);
    let start = Instant::now();
    let mut moments: Vec<u64> = (0..cuts)
        .map(|_| rng.below(span.as_micros() as u64))
        .collect();
    moments.sort();
    let mut taken = Vec::new();
    for (i, at) in moments.iter().enumerate() {
        if let Some(wait) = Duration::from_micros(*at).checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let img = host.mnt.join(format!("cut{i}.img"));
        run(Command::new("cp")
            .arg("--reflink=always")
            .arg(&up.img)
            .arg(&img));
        taken.push(img);
    }
    taken
}

#[test]
fn a_power_cut_during_run_checkpoints_leaves_a_prefix_of_the_commands() {
    let cuts = env_u64("LAYERFS_POWERLOSS_CUTS", 2).max(2);
    let seed = seed();
    let mut ws = crate::run::workspace_for(crate::run::Caller::Root);
    let host = LoopFs::new(ws.dir.path(), "host", 1024, &["mkfs.btrfs", "-q"], "");
    let up = LoopFs::new(&host.mnt, "up", 256, &["mkfs.ext4", "-q"], "");
    ws.upper = up.mnt.join("upper");
    ws.work = up.mnt.join("work");
    fs::create_dir(&ws.upper).unwrap();
    fs::create_dir(&ws.work).unwrap();
    run(Command::new("sync").arg("-f").arg(&up.mnt));
    let m = ws.mount();
    let (lower, upper) = (
        ws.lower().to_str().unwrap().to_string(),
        ws.upper.to_str().unwrap().to_string(),
    );
    let commands = 40;
    let worker = std::thread::spawn(move || {
        for i in 1..=commands {
            let script = format!("echo {i} >> f && echo {i} > n{i}");
            let out = crate::run::run_as(
                crate::run::Caller::Root,
                &[
                    "--lower",
                    &lower,
                    "--upper",
                    &upper,
                    "--checkpoint",
                    "--",
                    "sh",
                    "-c",
                    &script,
                ],
            );
            assert!(out.status.success(), "{}", crate::run::text(&out));
        }
    });
    eprintln!("powerloss of run checkpoints: seed {seed}, {cuts} cuts");
    let taken = capture_at_random(&host, &up, cuts, seed, Duration::from_secs(3));
    worker.join().expect("the commands failed");
    drop(m);
    up.umount();
    let mut mid = 0;
    for (i, img) in taken.iter().enumerate() {
        // At the upper's own path: the stack names its store by path.
        let copy = LoopFs::attach(img, &up.mnt, "");
        let m = ws
            .try_mount_with(&[])
            .unwrap_or_else(|e| panic!("capture {i}: layerfs over it: {e}"));
        let names: Vec<usize> = (1..=commands)
            .filter(|n| m.p(&format!("n{n}")).exists())
            .collect();
        let k = names.len();
        mid += (k > 0 && k < commands) as u64;
        assert_eq!(
            names,
            (1..=k).collect::<Vec<_>>(),
            "capture {i}: the commands' files are not a prefix\ndaemon log: {}",
            ws.daemon_log()
        );
        if k > 0 {
            let f = fs::read_to_string(m.p("f"))
                .unwrap_or_else(|e| panic!("capture {i}: f is lost after {k} commands: {e}"));
            // An append that was not synced may leave the file's new size
            // without its data (zeros where ext4 had not written the
            // block back): not a checkpoint's doing.
            let f = f.trim_end_matches('\0');
            let all: String = (1..=commands).map(|n| format!("{n}\n")).collect();
            assert!(all.starts_with(f), "capture {i}: f is {f:?}");
        }
        let list = layerfs(&[
            std::ffi::OsStr::new("checkpoint"),
            "list".as_ref(),
            ws.upper.as_os_str(),
        ]);
        assert!(
            list.status.success(),
            "capture {i}: checkpoint list: {}",
            String::from_utf8_lossy(&list.stderr)
        );
        assert!(m.unmount(), "capture {i}: the daemon did not exit cleanly");
        drop(copy);
        let _ = fs::remove_file(img);
    }
    eprintln!("powerloss of run checkpoints: {cuts} cuts ({mid} mid-way) clean, seed {seed}");
}

/// A new workspace's journal is made without waiting for the disk
/// (`journal::schema::open_rw`). Workspaces are made one after another on
/// an ext4 image, each mounted for the first time, written to and
/// unmounted, while the image is captured at random moments: in every
/// capture, every workspace there mounts again, and its journal records a
/// new change (a journal lost or torn by the cut is started anew, never
/// left refusing).
#[test]
fn a_power_cut_while_new_workspaces_make_their_journals_leaves_each_one_journaling() {
    let cuts = env_u64("LAYERFS_POWERLOSS_CUTS", 2).max(2);
    let seed = seed();
    let ws = Workspace::new();
    fs::write(ws.lower().join("shared"), "shared\n").unwrap();
    let host = LoopFs::new(ws.dir.path(), "host", 1024, &["mkfs.btrfs", "-q"], "");
    let up = LoopFs::new(&host.mnt, "up", 256, &["mkfs.ext4", "-q"], "");
    run(Command::new("sync").arg("-f").arg(&up.mnt));
    let made = 40;
    let (lower, root, mnts) = (
        ws.lower().to_path_buf(),
        up.mnt.clone(),
        ws.dir.path().join("mnts"),
    );
    let worker = std::thread::spawn(move || {
        for i in 0..made {
            let upper = root.join(format!("w{i}")).join("upper");
            let mnt = mnts.join(format!("w{i}"));
            fs::create_dir_all(&upper).unwrap();
            fs::create_dir_all(&mnt).unwrap();
            let guard = crate::checkpoint::Fork(mnt.clone());
            crate::checkpoint::ok(&[&"mount", &"--lower", &lower, &"--upper", &upper, &mnt]);
            fs::write(mnt.join("a"), "a\n").unwrap();
            drop(guard);
        }
    });
    eprintln!("powerloss of new journals: seed {seed}, {cuts} cuts");
    let taken = capture_at_random(&host, &up, cuts, seed, Duration::from_secs(2));
    worker.join().expect("making the workspaces failed");
    up.umount();
    let mut checked = 0;
    for (i, img) in taken.iter().enumerate() {
        let copy = LoopFs::attach(img, &up.mnt, "");
        for w in 0..made {
            let upper = up.mnt.join(format!("w{w}")).join("upper");
            if !upper.is_dir() {
                continue;
            }
            let mnt = ws.dir.path().join("again").join(format!("c{i}w{w}"));
            fs::create_dir_all(&mnt).unwrap();
            let guard = crate::checkpoint::Fork(mnt.clone());
            let out = layerfs(&[
                "mount".as_ref(),
                "--lower".as_ref(),
                ws.lower().as_os_str(),
                "--upper".as_ref(),
                upper.as_os_str(),
                mnt.as_os_str(),
            ]);
            assert!(
                out.status.success(),
                "capture {i}, workspace {w}: mount: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            fs::write(mnt.join("after"), "after\n").unwrap();
            crate::state::poll_log(&mnt, |rows| {
                rows.iter()
                    .any(|r| r["path"] == "after" && (r["op"] == "create" || r["op"] == "write"))
            });
            drop(guard);
            checked += 1;
        }
        drop(copy);
        let _ = fs::remove_file(img);
    }
    assert!(checked > 0, "no capture held a workspace");
    eprintln!(
        "powerloss of new journals: {cuts} cuts, {checked} workspaces journaling, seed {seed}"
    );
}
