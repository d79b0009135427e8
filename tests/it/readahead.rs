//! The mount's readahead (`--readahead`, `daemon::readahead`): raised as
//! root to 2 MiB after the INIT handshake, so a cold sequential read of a
//! big lower file sends one READ per MiB (the largest the kernel sends)
//! instead of one per 128 KiB, with the same data.

use std::fs;
use std::path::{Path, PathBuf};

use crate::harness::*;
use crate::lower_passthrough::{pattern, reads};

/// The readahead file of the mount at `mnt` (its connection's bdi, named
/// by the device number /proc/self/mountinfo gives: root cannot stat
/// another user's FUSE mount).
fn bdi_file(mnt: &Path) -> PathBuf {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dev = info
        .lines()
        .rev()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.get(4).map(Path::new) == Some(mnt))
        .map(|f| f[2].to_string())
        .unwrap_or_else(|| panic!("{} is not mounted", mnt.display()));
    PathBuf::from(format!("/sys/class/bdi/{dev}/read_ahead_kb"))
}

/// The readahead of the mount at `mnt`, in KiB.
pub(crate) fn readahead_kb(mnt: &Path) -> u64 {
    let f = bdi_file(mnt);
    fs::read_to_string(&f)
        .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
        .trim()
        .parse()
        .unwrap()
}

/// Reads `big.bin` through a fresh mount (nothing of it cached by the
/// kernel's FUSE inode yet) with dd bs=1M and compares it with the lower
/// file; returns the READ requests that took.
fn cold_read(ws: &Workspace, m: &Mount) -> u64 {
    let before = reads(m.path());
    let out = sh(
        m.path(),
        &format!(
            "dd if=big.bin bs=1M status=none | cmp - '{}' && echo same",
            ws.lower().join("big.bin").display()
        ),
    );
    assert_eq!(out.trim(), "same", "{out}");
    reads(m.path()) - before
}

#[test]
fn a_cold_read_of_a_big_lower_file_sends_one_read_per_mib() {
    let ws = Workspace::new();
    // 8 MiB: a 2 MiB pattern, four times.
    fs::write(ws.lower().join("big.bin"), pattern().repeat(4)).unwrap();

    let m = ws.mount();
    assert_eq!(readahead_kb(m.path()), 2048);
    let n = cold_read(&ws, &m);
    // 4 windows of 2 MiB, each sent as 2 READs of 1 MiB.
    assert!(
        (8..=10).contains(&n),
        "{n} READs for 8 MiB at 2 MiB readahead"
    );
    drop(m);

    // 0 keeps the kernel's 128 KiB: 64 READs.
    let m = ws.mount_with(&["--readahead", "0"]);
    assert_eq!(readahead_kb(m.path()), 128);
    let n = cold_read(&ws, &m);
    assert!(n >= 60, "{n} READs for 8 MiB at 128 KiB readahead");
    drop(m);

    // The mount option sets it too.
    let m = ws.mount_with(&["-o", "readahead=512K"]);
    assert_eq!(readahead_kb(m.path()), 512);
    let n = cold_read(&ws, &m);
    assert!((16..=20).contains(&n), "{n} READs for 8 MiB at 512 KiB");
    drop(m);
}
