//! A file held open through FUSE passthrough while a live `reset`, `undo`
//! or `snapshot restore` replaces the real file behind its name: the
//! kernel allows one backing file per FUSE inode while passthrough opens
//! are live, so the name must become a new object (`Overlay::re_resolve`).
//! The reader keeps reading what it opened, a new open reads what the
//! view shows (never `EIO`, never the old data), and a write-open writes
//! where the view shows it — with and without `--lower-passthrough`.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::harness::*;
use crate::netlower::status_json;

/// READ requests the daemon has served so far.
fn reads(mnt: &Path) -> u64 {
    status_json(mnt)["counters"]["by_op"]["read"]
        .as_u64()
        .unwrap_or(0)
}

/// `n` bytes (2 MiB: large enough for lower passthrough) of a pattern
/// that differs with `seed`.
fn data(seed: u8) -> Vec<u8> {
    (0..(2u32 << 20))
        .map(|i| (i / 4096 + i % 251) as u8 ^ seed)
        .collect()
}

/// Runs `layerfs ARGS`, which must succeed.
fn ok(args: &[&dyn AsRef<std::ffi::OsStr>]) {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    let out = layerfs(&args);
    assert!(
        out.status.success(),
        "layerfs {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Reads the whole of `f` from its start.
fn read_from_start(f: &mut fs::File) -> Vec<u8> {
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut v = Vec::new();
    f.read_to_end(&mut v).unwrap();
    v
}

/// Replaces the data of `f` through the mount.
fn write_through(m: &Mount, rel: &str, content: &[u8]) {
    fs::write(m.p(rel), content).unwrap();
}

/// Opens `f` for reading and checks that it is passed through (its read
/// reaches no daemon) and reads `want`.
fn hold(m: &Mount, want: &[u8], what: &str) -> fs::File {
    let before = reads(m.path());
    let mut f = fs::File::open(m.p("f")).unwrap();
    assert!(read_from_start(&mut f) == want, "{what}: the reader's data");
    assert_eq!(
        reads(m.path()) - before,
        0,
        "{what}: the reader is not passed through"
    );
    f
}

/// What must hold after `op` replaced `f` under a reader that opened
/// `old`: the view shows `new`.
fn check_after(m: &Mount, reader: &mut fs::File, old: &[u8], new: &[u8], what: &str) {
    assert!(
        read_from_start(reader) == old,
        "{what}: the reader no longer reads what it opened"
    );
    let got = fs::read(m.p("f")).unwrap_or_else(|e| panic!("{what}: a new open: {e}"));
    assert!(got == new, "{what}: a new open reads the old data");
    // A second reader opened now, beside the first.
    let mut second = fs::File::open(m.p("f")).unwrap();
    assert!(read_from_start(&mut second) == new, "{what}: a second open");
    drop(second);
    let mut w = open_for_writing(m, what);
    w.write_all(b"MORE").unwrap();
    drop(w);
    let mut want = new.to_vec();
    want.extend_from_slice(b"MORE");
    assert!(
        fs::read(m.p("f")).unwrap() == want,
        "{what}: the write is not where the view shows it"
    );
    assert!(
        read_from_start(reader) == old,
        "{what}: the write reached the reader's old file"
    );
}

/// Opens `f` for appending. With `--lower-passthrough` the new readers
/// above passed the lower file through; their RELEASE reaches the daemon
/// after `close` returned, and an open for writing before it is refused
/// with `ETXTBSY` once `begin_write`'s wait is over (on a loaded machine):
/// that refusal is retried, any other error fails.
fn open_for_writing(m: &Mount, what: &str) -> fs::File {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match fs::OpenOptions::new().append(true).open(m.p("f")) {
            Ok(w) => return w,
            Err(e) if errno(&e) == libc::ETXTBSY && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => panic!("{what}: an open for writing: {e}"),
        }
    }
}

fn both_modes(test: impl Fn(&[&str], &str)) {
    test(&[], "default");
    test(&["--lower-passthrough"], "--lower-passthrough");
}

#[test]
fn a_live_reset_under_a_passthrough_reader_makes_the_name_a_new_file() {
    both_modes(|flags, mode| {
        let ws = Workspace::new();
        let (shared, mine) = (data(0), data(1));
        fs::write(ws.lower().join("f"), &shared).unwrap();
        let m = ws.mount_with(flags);
        write_through(&m, "f", &mine);
        let mut reader = hold(&m, &mine, mode);
        ok(&[&"reset", &m.path(), &"f"]);
        check_after(&m, &mut reader, &mine, &shared, &format!("reset, {mode}"));
        let mut want = shared.clone();
        want.extend_from_slice(b"MORE");
        assert!(
            fs::read(ws.upper.join("f")).unwrap() == want,
            "reset, {mode}: the upper"
        );
        drop(reader);
        assert!(m.unmount());
    });
}

#[test]
fn a_live_restore_under_a_passthrough_reader_makes_the_name_a_new_file() {
    both_modes(|flags, mode| {
        let ws = Workspace::new();
        let (shared, saved, later) = (data(0), data(1), data(2));
        fs::write(ws.lower().join("f"), &shared).unwrap();
        let m = ws.mount_with(flags);
        write_through(&m, "f", &saved);
        ok(&[&"snapshot", &"save", &m.path(), &"s1"]);
        write_through(&m, "f", &later);
        let mut reader = hold(&m, &later, mode);
        ok(&[&"snapshot", &"restore", &m.path(), &"s1"]);
        let what = format!("restore, {mode}");
        check_after(&m, &mut reader, &later, &saved, &what);
        drop(reader);
        assert!(m.unmount());
    });
}

#[test]
fn a_live_restore_under_a_lower_passthrough_reader_shows_the_restored_file() {
    // The reader holds the shared file itself as its backing.
    let ws = Workspace::new();
    let (shared, saved) = (data(0), data(1));
    fs::write(ws.lower().join("f"), &shared).unwrap();
    let m = ws.mount_with(&["--lower-passthrough"]);
    write_through(&m, "f", &saved);
    ok(&[&"snapshot", &"save", &m.path(), &"s1"]);
    ok(&[&"reset", &m.path(), &"f"]);
    let mut reader = hold(&m, &shared, "lower reader");
    ok(&[&"snapshot", &"restore", &m.path(), &"s1"]);
    check_after(
        &m,
        &mut reader,
        &shared,
        &saved,
        "restore over a lower reader",
    );
    assert!(
        fs::read(ws.lower().join("f")).unwrap() == shared,
        "a write reached the lower"
    );
    drop(reader);
    assert!(m.unmount());
}

#[test]
fn a_live_undo_under_a_passthrough_reader_makes_the_name_a_new_file() {
    both_modes(|flags, mode| {
        let ws = Workspace::new();
        let (shared, kept, later) = (data(0), data(1), data(2));
        fs::write(ws.lower().join("f"), &shared).unwrap();
        let m = ws.mount_with(flags);
        write_through(&m, "f", &kept);
        ok(&[&"checkpoint", &m.path(), &"c1"]);
        write_through(&m, "f", &later);
        let mut reader = hold(&m, &later, mode);
        ok(&[&"undo", &m.path()]);
        let what = format!("undo, {mode}");
        check_after(&m, &mut reader, &later, &kept, &what);
        drop(reader);
        assert!(m.unmount());
    });
}

#[test]
fn a_live_checkpoint_under_a_passthrough_reader_lets_writes_go_to_the_new_upper() {
    both_modes(|flags, mode| {
        let ws = Workspace::new();
        let (shared, mine) = (data(0), data(1));
        fs::write(ws.lower().join("f"), &shared).unwrap();
        let m = ws.mount_with(flags);
        write_through(&m, "f", &mine);
        let mut reader = hold(&m, &mine, mode);
        ok(&[&"checkpoint", &m.path(), &"c1"]);
        // The view is unchanged; a write now goes into the new upper,
        // never into the frozen layer the reader reads.
        check_after(
            &m,
            &mut reader,
            &mine,
            &mine,
            &format!("checkpoint, {mode}"),
        );
        drop(reader);
        assert!(m.unmount());
    });
}
