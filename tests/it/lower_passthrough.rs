//! Lower passthrough (`fuse::io_mode`): read-only opens of lower files
//! passed through to the kernel, so their reads never reach the daemon —
//! always where no copy-up can come (a read-only mount, a `readonly`
//! rule), for every lower file with `--lower-passthrough`. What a program
//! sees stays right: the data, a copy-up once the readers are gone, and
//! `ETXTBSY` (never the kernel's `EIO`) for a change of the data while
//! they read.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::harness::*;
use crate::netlower::status_json;

/// READ requests the daemon has served so far.
pub(crate) fn reads(mnt: &Path) -> u64 {
    status_json(mnt)["counters"]["by_op"]["read"]
        .as_u64()
        .unwrap_or(0)
}

/// 2 MiB of a pattern that differs at every 4 KiB page.
pub(crate) fn pattern() -> Vec<u8> {
    (0..(2u32 << 20))
        .map(|i| (i / 4096 + i % 251) as u8)
        .collect()
}

/// Reads `rel` through the mount; returns the READ requests that took.
fn read_counting(m: &Mount, rel: &str, want: &[u8]) -> u64 {
    let before = reads(m.path());
    let got = fs::read(m.p(rel)).unwrap();
    assert!(got == want, "{rel}: wrong data through the mount");
    reads(m.path()) - before
}

#[test]
fn lower_passthrough_reads_never_reach_the_daemon() {
    let ws = Workspace::new();
    let data = pattern();
    fs::write(ws.lower().join("big.bin"), &data).unwrap();
    // The default: lower files are read through the daemon.
    let m = ws.mount();
    assert!(read_counting(&m, "big.bin", &data) > 0);
    drop(m);
    let m = ws.mount_with(&["--lower-passthrough"]);
    assert_eq!(read_counting(&m, "big.bin", &data), 0);
    // Read at an offset, and by another program: the lower file's data.
    let mut f = fs::File::open(m.p("big.bin")).unwrap();
    f.seek(SeekFrom::Start(12345)).unwrap();
    let mut part = vec![0; 100];
    f.read_exact(&mut part).unwrap();
    assert_eq!(part, data[12345..12445]);
    let lower = ws.lower().join("big.bin");
    let out = sh(
        m.path(),
        &format!("cmp big.bin '{}' && echo same", lower.display()),
    );
    assert_eq!(out.trim(), "same", "{out}");
    drop(f);
    drop(m);
}

#[test]
fn small_lower_files_stay_with_the_daemon_and_keep_their_semantics() {
    // Below 1 MiB a backing file costs more than it saves: such files are
    // read through the daemon even with --lower-passthrough, and a reader
    // opened before a copy-up reads the upper copy afterwards. Up to
    // 128 KiB their pages are filled at their first open, so they send no
    // READ at all (posix::the_first_open_of_a_small_lower_file_fills_its_pages):
    // the same holds for such a reader.
    let ws = Workspace::new();
    let files = [("small.txt", 256 << 10), ("tiny.txt", 64 << 10)];
    for (name, len) in files {
        fs::write(ws.lower().join(name), vec![b's'; len]).unwrap();
    }
    let m = ws.mount_with(&["--lower-passthrough"]);
    for (name, len) in files {
        let small = vec![b's'; len];
        let reads = read_counting(&m, name, &small);
        assert_eq!(reads > 0, len > 128 << 10, "{name}: {reads} READs");
        let mut reader = fs::File::open(m.p(name)).unwrap();
        let mut w = fs::OpenOptions::new().write(true).open(m.p(name)).unwrap();
        w.write_all(b"UPPER").unwrap();
        drop(w);
        let mut got = Vec::new();
        reader.read_to_end(&mut got).unwrap();
        assert_eq!(&got[..5], b"UPPER", "{name}");
        assert!(got[5..] == small[5..], "{name}");
    }
    drop(m);
}

#[test]
fn lower_files_that_cannot_be_copied_up_are_passed_through_by_default() {
    let ws = Workspace::new();
    let data = pattern();
    fs::create_dir(ws.lower().join("ro")).unwrap();
    fs::write(ws.lower().join("ro/big.bin"), &data).unwrap();
    fs::write(ws.lower().join("big.bin"), &data).unwrap();
    // A read-only mount: every lower file.
    let m = ws.mount_with(&["--read-only"]);
    assert_eq!(read_counting(&m, "big.bin", &data), 0);
    drop(m);
    // A `readonly` rule: the files it covers, not the others.
    let policy = policy_file(&ws, "readonly ro/**\n");
    let m = ws.mount_with(&["--policy", policy.to_str().unwrap()]);
    assert_eq!(read_counting(&m, "ro/big.bin", &data), 0);
    assert!(read_counting(&m, "big.bin", &data) > 0);
    let e = fs::OpenOptions::new()
        .write(true)
        .open(m.p("ro/big.bin"))
        .unwrap_err();
    assert_eq!(errno(&e), libc::EROFS, "{e}");
    drop(m);
}

#[test]
fn copy_up_waits_for_lower_passthrough_readers_and_never_shows_eio() {
    let ws = Workspace::new();
    let data = pattern();
    fs::write(ws.lower().join("f.bin"), &data).unwrap();
    let m = ws.mount_with(&["--lower-passthrough"]);
    let before = reads(m.path());
    let mut reader = fs::File::open(m.p("f.bin")).unwrap();
    let mut head = vec![0; 4096];
    reader.read_exact(&mut head).unwrap();
    assert_eq!(head, data[..4096]);
    // The documented trade-off: no change of the data while it is read
    // through the lower file — ETXTBSY, and nothing was copied up.
    for (what, r) in [
        (
            "open for writing",
            fs::OpenOptions::new().write(true).open(m.p("f.bin")).err(),
        ),
        (
            "append",
            fs::OpenOptions::new().append(true).open(m.p("f.bin")).err(),
        ),
        (
            "truncate",
            nix::unistd::truncate(&m.p("f.bin"), 10)
                .err()
                .map(std::io::Error::from),
        ),
    ] {
        let e = r.unwrap_or_else(|| panic!("{what} succeeded while a reader holds the lower file"));
        assert_eq!(errno(&e), libc::ETXTBSY, "{what}: {e}");
    }
    assert!(!ws.upper.join("f.bin").exists(), "copied up anyway");
    // A change of metadata copies up; the data stays the lower file's, and
    // a new read-only open shares the backing (no EIO) with the right data.
    fs::set_permissions(m.p("f.bin"), fs::Permissions::from_mode(0o600)).unwrap();
    assert!(ws.upper.join("f.bin").exists());
    let again = fs::read(m.p("f.bin")).unwrap();
    assert!(again == data, "new read-only open after a metadata copy-up");
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).unwrap();
    assert!(rest == data[4096..], "the first reader's data");
    assert_eq!(reads(m.path()), before, "reads reached the daemon");
    // Once the readers are gone, the file opens for writing and every new
    // open reads the upper copy.
    drop(reader);
    let mut w = fs::OpenOptions::new()
        .write(true)
        .open(m.p("f.bin"))
        .unwrap();
    w.write_all(b"CHANGED").unwrap();
    // A reader opened while it is open for writing: the upper file, and
    // what was just written.
    let mut r2 = fs::File::open(m.p("f.bin")).unwrap();
    let mut seven = [0u8; 7];
    r2.read_exact(&mut seven).unwrap();
    assert_eq!(&seven, b"CHANGED");
    drop(w);
    drop(r2);
    let now = fs::read(m.p("f.bin")).unwrap();
    assert_eq!(&now[..7], b"CHANGED");
    assert!(now[7..] == data[7..]);
    assert_eq!(
        fs::read(ws.lower().join("f.bin")).unwrap(),
        data,
        "lower changed"
    );
    // Truncating by path works again too.
    fs::OpenOptions::new()
        .write(true)
        .open(m.p("f.bin"))
        .unwrap()
        .set_len(3)
        .unwrap();
    assert_eq!(fs::read(m.p("f.bin")).unwrap(), b"CHA");
    drop(m);
}

#[test]
fn without_lower_passthrough_a_reader_sees_the_copy_up() {
    // The default keeps what kernel overlayfs does: a descriptor opened
    // read-only before a copy-up reads the upper copy afterwards.
    let ws = Workspace::new();
    fs::write(ws.lower().join("f.txt"), "lower data\n").unwrap();
    let m = ws.mount();
    let mut reader = fs::File::open(m.p("f.txt")).unwrap();
    let mut w = fs::OpenOptions::new()
        .write(true)
        .open(m.p("f.txt"))
        .unwrap();
    w.write_all(b"UPPER").unwrap();
    drop(w);
    let mut got = String::new();
    reader.read_to_string(&mut got).unwrap();
    assert_eq!(got, "UPPER data\n");
    drop(m);
}

#[test]
fn a_reload_lifting_readonly_while_a_write_is_decided_never_copies_up_under_readers() {
    for how in ["truncate", "open"] {
        reload_while_a_write_is_decided(how);
    }
}

/// The change (`open` for writing, or `truncate` by path) is let through
/// because the rule refuses it anyway, and held there; the reload lifts
/// the rule before its policy check. It must be refused (busy), never
/// copied up under the readers.
fn reload_while_a_write_is_decided(how: &'static str) {
    let ws = Workspace::new();
    fs::create_dir(ws.lower().join("ro")).unwrap();
    fs::write(ws.lower().join("ro/f.bin"), pattern()).unwrap();
    let pf = policy_file(&ws, "readonly ro/**\n");
    let gate = ws.dir.path().join("gate");
    fs::write(&gate, "").unwrap();
    let reached = ws.dir.path().join("gate.reached");
    let m = ws.mount_env(
        &["--policy", pf.to_str().unwrap()],
        &[
            ("LAYERFS_FAILPOINT", "hold:open_write:ro/f.bin"),
            ("LAYERFS_FAILPOINT_WHILE", gate.to_str().unwrap()),
        ],
    );
    let before = reads(m.path());
    let mut reader = fs::File::open(m.p("ro/f.bin")).unwrap();
    let target = m.p("ro/f.bin");
    let writer = std::thread::spawn(move || {
        if how == "open" {
            fs::OpenOptions::new()
                .write(true)
                .open(target)
                .map(drop)
                .map_err(|e| errno(&e))
        } else {
            nix::unistd::truncate(&target, 0).map_err(|e| e as i32)
        }
    });
    assert!(
        eventually(Duration::from_secs(10), || reached.exists()),
        "the open for writing never reached the daemon's hold"
    );
    fs::write(&pf, "# no rules\n").unwrap();
    // SAFETY: kill takes only integers and touches no memory; the pid (> 0) is the daemon's.
    assert_eq!(
        unsafe { libc::kill(m.pid() as libc::pid_t, libc::SIGHUP) },
        0
    );
    // The reload is in force once another file under ro/ can be written.
    fs::write(ws.lower().join("ro/g"), "g\n").unwrap();
    assert!(eventually(Duration::from_secs(5), || fs::OpenOptions::new(
    )
    .append(true)
    .open(m.p("ro/g"))
    .is_ok()));
    fs::remove_file(&gate).unwrap();
    assert_eq!(writer.join().unwrap(), Err(libc::ETXTBSY), "{how}");
    assert!(
        !ws.upper.join("ro/f.bin").exists(),
        "{how}: copied up under the readers"
    );
    let mut got = Vec::new();
    reader.read_to_end(&mut got).unwrap();
    assert!(got == pattern());
    assert_eq!(reads(m.path()), before, "reads reached the daemon");
    drop(reader);
    drop(m);
}

#[test]
fn a_reloaded_policy_that_lifts_readonly_refuses_writes_while_read_through() {
    let ws = Workspace::new();
    let data = pattern();
    fs::create_dir(ws.lower().join("ro")).unwrap();
    fs::write(ws.lower().join("ro/f.bin"), &data).unwrap();
    let pf = policy_file(&ws, "readonly ro/**\n");
    let m = ws.mount_with(&["--policy", pf.to_str().unwrap()]);
    let before = reads(m.path());
    let mut reader = fs::File::open(m.p("ro/f.bin")).unwrap();
    let open_write = || {
        fs::OpenOptions::new()
            .write(true)
            .open(m.p("ro/f.bin"))
            .map_err(|e| errno(&e))
    };
    assert_eq!(open_write().err(), Some(libc::EROFS));
    // The rule goes away while the file is read through the lower file:
    // an open for writing is then refused as busy, not with EIO, and
    // nothing is copied up.
    fs::write(&pf, "# no rules\n").unwrap();
    // SAFETY: kill takes only integers and touches no memory; the pid (> 0) is the daemon's.
    assert_eq!(
        unsafe { libc::kill(m.pid() as libc::pid_t, libc::SIGHUP) },
        0
    );
    assert!(eventually(Duration::from_secs(5), || open_write().err()
        != Some(libc::EROFS)));
    assert_eq!(open_write().err(), Some(libc::ETXTBSY));
    assert!(!ws.upper.join("ro/f.bin").exists());
    let mut got = Vec::new();
    reader.read_to_end(&mut got).unwrap();
    assert!(got == data);
    assert_eq!(reads(m.path()), before, "reads reached the daemon");
    drop(reader);
    let mut w = fs::OpenOptions::new()
        .write(true)
        .open(m.p("ro/f.bin"))
        .unwrap();
    w.write_all(b"new").unwrap();
    drop(w);
    assert_eq!(&fs::read(m.p("ro/f.bin")).unwrap()[..3], b"new");
    drop(m);
}
