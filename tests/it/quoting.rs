//! Names chosen by whoever writes the workspace never reach a terminal
//! raw: `log`, `diff`, `diff --patch`, `status`, `reset` and errors escape
//! control characters, terminal controls and invalid UTF-8 (a name holding
//! `\n2026-…  unlink …` must not forge a journal line, `\e[2K\e[1A` must
//! not rewrite the screen), `--json` keeps the names as they are, and a
//! patch with such names still applies with `git apply`.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use crate::harness::{eventually, layerfs_quiet, Workspace};

/// A name that would forge a whole journal line if printed raw.
const FORGED: &str = "x\n2026-12-04T00:00:00.000000Z  unlink      y  ok  pid 1 (init)";
/// Erase the line, move up: rewrites what the reader saw.
const ERASE: &str = "\x1b[2K\x1b[1Aclean";
/// A right-to-left override: `a<RLO>txt.exe` shows as `aexe.txt`.
const BIDI: &str = "a\u{202e}txt.exe";
fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Fails with the offending line when `out` holds a byte a terminal would
/// act on: C0 controls but the line feed, DEL, C1 controls, bidi controls.
fn assert_printable(what: &str, out: &[u8]) {
    let text = String::from_utf8(out.to_vec())
        .unwrap_or_else(|e| panic!("{what} printed invalid UTF-8: {e}"));
    for line in text.lines() {
        let bad = line
            .chars()
            .find(|&c| (c.is_control() && c != '\n') || ('\u{202a}'..='\u{202e}').contains(&c));
        assert!(bad.is_none(), "{what} printed {bad:?} raw in {line:?}");
    }
}

fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l:?}: {e}")))
        .collect()
}

#[test]
fn log_diff_status_and_reset_escape_what_names_hold() {
    let mut ws = Workspace::new();
    // The mountpoint's own name reaches `status`.
    let mnt = ws.dir.path().join("m\x1b[2Knt");
    fs::create_dir(&mnt).unwrap();
    ws.mnt = mnt;
    fs::write(ws.lower().join("shared.txt"), "shared\n").unwrap();
    let m = ws.mount();
    let names: Vec<&[u8]> = vec![
        FORGED.as_bytes(),
        ERASE.as_bytes(),
        BIDI.as_bytes(),
        b"bad\xff",
        b"back\\slash \"quoted\"",
    ];
    for n in &names {
        fs::write(m.path().join(OsStr::from_bytes(n)), "x\n").unwrap();
    }
    fs::rename(m.p("shared.txt"), m.path().join(ERASE.to_string() + "2")).unwrap();
    // A process whose name is an escape sequence writes too: its comm
    // (the executable's file name) goes into every row it causes.
    let evil = ws.dir.path().join("\x1b[31mgit");
    fs::copy("/bin/sh", &evil).unwrap();
    let st = Command::new(&evil)
        .arg("-c")
        .arg("echo hi > \"$1\"")
        .arg("sh")
        .arg(m.p("by-evil-comm"))
        .status()
        .unwrap();
    assert!(st.success());

    let mnt = m.path().as_os_str();
    // The journal is written in the background: wait for every row.
    let mut rows = Vec::new();
    assert!(
        eventually(Duration::from_secs(20), || {
            rows = json_lines(&layerfs_quiet(&[os("log"), os("--json"), mnt]));
            rows.iter().any(|r| r["path"] == "by-evil-comm")
                && rows.iter().any(|r| r["op"] == "rename")
                && rows.iter().any(|r| r["path"] == FORGED)
        }),
        "the journal never recorded the names: {rows:#?}"
    );
    // --json keeps the names as they are (JSON escapes them itself).
    assert!(rows.iter().any(|r| r["path"] == ERASE), "{rows:#?}");
    assert!(rows.iter().any(|r| r["comm"] == "\x1b[31mgit"), "{rows:#?}");

    let log = layerfs_quiet(&[os("log"), mnt]);
    assert!(log.status.success());
    assert_printable("log", &log.stdout);
    let text = String::from_utf8_lossy(&log.stdout).into_owned();
    // One line per row: a name cannot forge one.
    assert_eq!(text.lines().count(), rows.len(), "{text}");
    for line in text.lines() {
        assert!(
            line.len() > 27 && line.as_bytes()[4] == b'-' && line.as_bytes()[10] == b'T',
            "a line that is not a record: {line:?}\n{text}"
        );
    }
    assert!(text.contains("\"x\\n2026-12-04T00:00:00.000000Z"), "{text}");
    assert!(text.contains("\"\\033[2K\\033[1Aclean\""), "{text}");
    assert!(text.contains("(\"\\033[31mgit\")"), "{text}");

    let diff = layerfs_quiet(&[os("diff"), mnt]);
    assert!(diff.status.success());
    assert_printable("diff", &diff.stdout);
    let diff_json = json_lines(&layerfs_quiet(&[os("diff"), os("--json"), mnt]));
    let text = String::from_utf8_lossy(&diff.stdout).into_owned();
    assert_eq!(text.lines().count(), diff_json.len(), "{text}");
    assert!(text.contains("A \"bad\\377\""), "{text}");
    assert!(
        text.contains("A \"back\\\\slash \\\"quoted\\\"\""),
        "{text}"
    );
    assert!(text.contains("A \"a\\342\\200\\256txt.exe\""), "{text}");
    assert!(
        text.contains("R shared.txt -> \"\\033[2K\\033[1Aclean2\""),
        "{text}"
    );
    assert!(
        diff_json.iter().any(|c| c["path"] == BIDI),
        "--json keeps the name: {diff_json:#?}"
    );

    let patch = layerfs_quiet(&[os("diff"), os("--patch"), mnt]);
    assert!(patch.status.success());
    assert_printable("diff --patch", &patch.stdout);

    let status = layerfs_quiet(&[os("status"), mnt]);
    assert!(status.status.success());
    assert_printable("status", &status.stdout);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("m\\033[2Knt"), "{text}");

    let reset = layerfs_quiet(&[os("reset"), mnt, OsStr::from_bytes(ERASE.as_bytes())]);
    assert!(reset.status.success(), "{reset:?}");
    assert_printable("reset", &reset.stdout);
    assert!(
        String::from_utf8_lossy(&reset.stdout).contains("reset \"\\033[2K\\033[1Aclean\""),
        "{reset:?}"
    );
    assert!(!m.path().join(ERASE).exists());

    // Errors name paths too: escaped on stderr.
    let missing = layerfs_quiet(&[os("diff"), os("/nonexistent/\x1b[2Kgone")]);
    assert!(!missing.status.success());
    assert_printable("an error", &missing.stderr);
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("\\033[2Kgone"),
        "{missing:?}"
    );
}

#[test]
fn a_patch_with_odd_names_applies_to_the_exact_bytes() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("tab\tname"), "one\ntwo\n").unwrap();
    fs::write(ws.lower().join("gone\x1bx"), "bye\n").unwrap();
    fs::write(ws.lower().join(OsStr::from_bytes(b"lat\xe9n1")), "l\n").unwrap();
    let m = ws.mount();
    let added: Vec<&[u8]> = vec![
        b"new\nline.txt",
        b"bad\xff.txt",
        b"quo\"te\\d.txt",
        "bidi\u{202e}.txt".as_bytes(),
    ];
    for n in &added {
        fs::write(m.path().join(OsStr::from_bytes(n)), b"added\n").unwrap();
    }
    fs::write(m.p("tab\tname"), "one\nTWO\n").unwrap();
    fs::remove_file(m.p("gone\x1bx")).unwrap();
    fs::write(m.path().join(OsStr::from_bytes(b"lat\xe9n1")), "L\n").unwrap();

    let patch = layerfs_quiet(&[os("diff"), os("--patch"), m.path().as_os_str()]);
    assert!(patch.status.success(), "{patch:?}");
    assert_printable("diff --patch", &patch.stdout);

    // The lower, copied, plus the patch, is the workspace.
    let copy = crate::harness::apply_patch(ws.dir.path(), ws.lower(), &patch.stdout);
    for n in &added {
        assert_eq!(
            fs::read(copy.join(OsStr::from_bytes(n))).ok().as_deref(),
            Some(&b"added\n"[..]),
            "{:?}",
            String::from_utf8_lossy(n)
        );
    }
    assert_eq!(
        fs::read_to_string(copy.join("tab\tname")).unwrap(),
        "one\nTWO\n"
    );
    assert!(!copy.join("gone\x1bx").exists());
    assert_eq!(
        fs::read(copy.join(OsStr::from_bytes(b"lat\xe9n1"))).unwrap(),
        b"L\n"
    );
    let mut listed: Vec<Vec<u8>> = fs::read_dir(&copy)
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    let mut want: Vec<Vec<u8>> = fs::read_dir(m.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    listed.sort();
    want.sort();
    assert_eq!(listed, want, "the applied tree differs from the mount");
}
