//! POSIX conformance: runs pjdfstest against a layerfs mount through
//! `scripts/pjdfstest`, which mounts, always unmounts, reruns a failing case
//! once on its own and compares with `scripts/pjdfstest-layerfs-expected.txt`.

use std::path::Path;
use std::process::Command;

use crate::harness;

#[test]
fn pjdfstest_layerfs() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/pjdfstest");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--target")
        .arg("layerfs")
        .arg("--layerfs")
        .arg(harness::bin())
        .env("LAYERFS_TEST_DIR", harness::test_root())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} --target layerfs failed ({}); install pjdfstest with \
         `cargo install pjdfstest` if it is missing\n--- stdout:\n{stdout}\n--- stderr:\n{stderr}",
        script.display(),
        out.status
    );
    // Keep the summary (and any "passes now" notes) visible with --nocapture.
    println!("{stdout}");
}
