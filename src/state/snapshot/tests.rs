//! Unit tests of saving, scanning and extracting archives.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use super::archive::time_record;
use super::extract::{parse_time, safe_rel, unhex};
use super::*;
use crate::layer::safedir::{Role, SafeDir};
use crate::policy::Policy;

/// A raw header with any name (the tar crate refuses `..` in names).
fn raw(name: &str, kind: tar::EntryType, link: Option<&str>) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    if let Some(l) = link {
        h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
    }
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1);
    h.set_size(if kind == tar::EntryType::Regular {
        1
    } else {
        0
    });
    h.set_cksum();
    h
}

fn archive(entries: &[(&str, tar::EntryType, Option<&str>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, link) in entries {
        let h = raw(name, *kind, *link);
        let data: &[u8] = if *kind == tar::EntryType::Regular {
            b"x"
        } else {
            b""
        };
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

fn try_extract(
    entries: &[(&str, tar::EntryType, Option<&str>)],
) -> (tempfile::TempDir, Result<u64, String>) {
    let t = tempfile::tempdir().unwrap();
    let dst = t.path().join("dst");
    let (d, _) = SafeDir::create(&dst, Role::Staging, 0o700).unwrap();
    let root = RootMeta::of(&dst).unwrap();
    let mut report = Report::default();
    let r = extract(
        &archive(entries)[..],
        &d,
        &Policy::default(),
        root,
        &mut report,
    );
    (t, r.map_err(|e| e.to_string()))
}

#[test]
fn a_tampered_archive_is_an_archive_error_naming_the_entry() {
    type Entries<'a> = &'a [(&'a str, T, Option<&'a str>)];
    let cases: &[(Entries, &str)] = &[
        (
            &[("./", T::Directory, None), ("../evil", T::Regular, None)],
            "../evil",
        ),
        (
            &[("./", T::Directory, None), ("d/x", T::Regular, None)],
            "d/x",
        ),
        (
            &[("./", T::Directory, None), ("h", T::Link, Some("later"))],
            "h",
        ),
        (
            &[
                ("./", T::Directory, None),
                ("x", T::Regular, None),
                ("x", T::Regular, None),
            ],
            "x",
        ),
        (&[("x", T::Regular, None)], "root entry"),
    ];
    for (entries, names) in cases {
        let t = tempfile::tempdir().unwrap();
        let dst = t.path().join("dst");
        let (d, _) = SafeDir::create(&dst, Role::Staging, 0o700).unwrap();
        let root = RootMeta::of(&dst).unwrap();
        let e = extract(
            &archive(entries)[..],
            &d,
            &Policy::default(),
            root,
            &mut Report::default(),
        )
        .expect_err("a tampered archive was extracted");
        assert!(
            matches!(&e, SnapshotError::Archive(m) if m.contains(names)),
            "{entries:?}: {e:?}"
        );
    }
}

use tar::EntryType as T;

#[test]
fn tampered_archives_stay_inside() {
    let cases: &[&[(&str, T, Option<&str>)]] = &[
        &[("./", T::Directory, None), ("../evil", T::Regular, None)],
        &[("./", T::Directory, None), ("/abs", T::Regular, None)],
        // A file beneath a symlink of the archive.
        &[
            ("./", T::Directory, None),
            ("l", T::Symlink, Some("..")),
            ("l/evil", T::Regular, None),
        ],
        // A hard link to something outside or not yet extracted.
        &[
            ("./", T::Directory, None),
            ("h", T::Link, Some("../outside")),
        ],
        &[
            ("./", T::Directory, None),
            ("h", T::Link, Some("later")),
            ("later", T::Regular, None),
        ],
        // A directory's contents before the directory.
        &[("./", T::Directory, None), ("d/x", T::Regular, None)],
        // No root entry: not one of ours.
        &[("x", T::Regular, None)],
    ];
    for c in cases {
        let (t, r) = try_extract(c);
        let e = r.expect_err("a tampered archive was extracted");
        assert!(
            [
                "unsafe path",
                "does not follow",
                "not an earlier file",
                "no root entry"
            ]
            .iter()
            .any(|w| e.contains(w)),
            "{c:?}: {e}"
        );
        let outside: Vec<_> = fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(outside, vec![OsString::from("dst")], "{c:?} wrote outside");
        assert!(!t.path().join("dst/evil").exists() && !t.path().join("evil").exists());
    }
    let (t, r) = try_extract(&[
        ("./", T::Directory, None),
        ("d", T::Directory, None),
        ("d/x", T::Regular, None),
        ("y", T::Link, Some("d/x")),
    ]);
    assert_eq!(r, Ok(4));
    assert_eq!(fs::read(t.path().join("dst/y")).unwrap(), b"x");
}

#[test]
fn archive_paths_are_made_safe() {
    for (raw, want) in [("./", ""), ("a//b/./c/", "a/b/c"), ("./x", "x"), (".", "")] {
        assert_eq!(
            safe_rel(Path::new(raw)).map_err(|e| e.to_string()),
            Ok(PathBuf::from(want)),
            "{raw}"
        );
    }
    for raw in ["/etc", "a/../b", "..", "a/.."] {
        assert!(safe_rel(Path::new(raw)).is_err(), "{raw}");
    }
}

#[test]
fn hex_xattr_values_decode() {
    assert_eq!(unhex(b"610a62"), Some(b"a\nb".to_vec()));
    assert_eq!(unhex(b"FF00"), Some(vec![0xff, 0]));
    assert_eq!(unhex(b"abc"), None);
    assert_eq!(unhex(b"zz"), None);
}

#[test]
fn times_parse() {
    let t = parse_time(b"1700000000.123456789").unwrap();
    assert_eq!((t.tv_sec, t.tv_nsec), (1_700_000_000, 123_456_789));
    let t = parse_time(b"5.5").unwrap();
    assert_eq!((t.tv_sec, t.tv_nsec), (5, 500_000_000));
    assert_eq!(
        parse_time(&time_record(-3, 7)).map(|t| (t.tv_sec, t.tv_nsec)),
        Some((-3, 7))
    );
    assert!(parse_time(b"x").is_none());
}
