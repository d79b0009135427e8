//! Snapshot archives from someone else (moved from another host, or
//! swapped in): `layerfs snapshot restore` applies the workspace's policy
//! as the mount does, reports every change by name, and never leaves in
//! the upper what the policy forbids. A crafted archive, as root and as
//! the user `tests`; an archive fuzz (fixed seed and case count here,
//! `LAYERFS_ARCHIVE_FUZZ_CASES` / `LAYERFS_ARCHIVE_FUZZ_SEED` or
//! `scripts/fuzz-archive` for a campaign); and a tree deeper than
//! `PATH_MAX` saved and restored.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use crate::harness::Workspace;
use crate::trust::{layerfs_as, s, sh_as, stderr, tests_user, text, Who, ROOT};

/// An unmounted workspace of `who` (upper, state dir with its
/// workspace.json, work dir) whose snapshots the test writes itself.
struct Ws {
    ws: Workspace,
    who: Who,
    state: PathBuf,
    /// A file outside the upper that nothing may link to or overwrite.
    sentinel: PathBuf,
}

impl Ws {
    fn new(who: Who, policy: Option<&str>) -> Ws {
        Ws::new_in(who, policy, Path::new("/var/tmp"))
    }

    fn new_in(who: Who, policy: Option<&str>, root: &Path) -> Ws {
        let ws = Workspace::with_lowers_in(1, root);
        fs::set_permissions(ws.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let state = ws.dir.path().join(".upper.layerfs-state");
        fs::create_dir_all(state.join("snapshots")).unwrap();
        fs::create_dir(&ws.work).unwrap();
        let policy_path = policy.map(|p| {
            let f = ws.dir.path().join("policy");
            fs::write(&f, p).unwrap();
            f
        });
        let desc = serde_json::json!({
            "upper": ws.upper, "lowers": [ws.lower()], "work": ws.work,
            "mountpoint": null, "policy": policy_path, "scratch": [],
        });
        fs::write(state.join("workspace.json"), desc.to_string()).unwrap();
        for p in [&state, &state.join("snapshots"), &ws.work] {
            fs::set_permissions(p, fs::Permissions::from_mode(0o700)).unwrap();
        }
        // A root mode the archive's own never matches by chance.
        fs::set_permissions(&ws.upper, fs::Permissions::from_mode(0o751)).unwrap();
        // The workspace dir is the user's: a restore renames in it.
        chown_tree(ws.dir.path(), who);
        let sentinel = ws.dir.path().join("sentinel");
        fs::write(&sentinel, "outside\n").unwrap();
        Ws {
            ws,
            who,
            state,
            sentinel,
        }
    }

    /// Puts `tar` in as snapshot `id` (the caller's file, 0600).
    fn put(&self, id: &str, tar: &[u8]) {
        let p = self.state.join("snapshots").join(format!("{id}.tar"));
        fs::write(&p, tar).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&p, Some(self.who.uid), Some(self.who.gid)).unwrap();
    }

    /// `layerfs snapshot restore UPPER ID`.
    fn restore(&self, id: &str) -> Output {
        layerfs_as(self.who, &["snapshot", "restore", s(&self.ws.upper), id])
    }

    /// The same with `--json`: the report of what was changed.
    fn restore_json(&self, id: &str) -> Output {
        layerfs_as(
            self.who,
            &["snapshot", "restore", "--json", s(&self.ws.upper), id],
        )
    }

    fn root_meta(&self) -> (u32, u32, u32) {
        let m = fs::symlink_metadata(&self.ws.upper).unwrap();
        (m.mode() & 0o7777, m.uid(), m.gid())
    }
}

fn chown_tree(p: &Path, who: Who) {
    std::os::unix::fs::lchown(p, Some(who.uid), Some(who.gid)).unwrap();
    if fs::symlink_metadata(p).unwrap().is_dir() {
        for e in fs::read_dir(p).unwrap() {
            chown_tree(&e.unwrap().path(), who);
        }
    }
}

// ---------------------------------------------------------------------------
// Building archives with raw headers (any name, any type, any size)
// ---------------------------------------------------------------------------

/// One PAX record: `LEN KEY=VALUE\n`, LEN counting itself.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3;
    let mut len = body + body.to_string().len();
    if len.to_string().len() != body.to_string().len() {
        len += 1;
    }
    let mut r = format!("{len} {key}=").into_bytes();
    r.extend_from_slice(value);
    r.push(b'\n');
    r
}

/// An entry to write: its raw path, type byte, mode, owner, link target,
/// device numbers, data, PAX records.
#[derive(Clone, Debug, Default)]
struct E {
    path: Vec<u8>,
    kind: u8,
    mode: u32,
    uid: u64,
    gid: u64,
    link: Vec<u8>,
    dev: (u32, u32),
    data: Vec<u8>,
    pax: Vec<(String, Vec<u8>)>,
    /// A size for the header other than the data's (an absurd one).
    declared: Option<u64>,
}

impl E {
    fn new(path: &str, kind: u8) -> E {
        E {
            path: path.as_bytes().to_vec(),
            kind,
            mode: if kind == b'5' { 0o755 } else { 0o644 },
            ..E::default()
        }
    }
    fn mode(mut self, m: u32) -> E {
        self.mode = m;
        self
    }
    fn owner(mut self, uid: u64, gid: u64) -> E {
        self.uid = uid;
        self.gid = gid;
        self
    }
    fn link(mut self, l: &str) -> E {
        self.link = l.as_bytes().to_vec();
        self
    }
    fn dev(mut self, major: u32, minor: u32) -> E {
        self.dev = (major, minor);
        self
    }
    fn data(mut self, d: &[u8]) -> E {
        self.data = d.to_vec();
        self
    }
    fn xattr(mut self, name: &str, value: &[u8]) -> E {
        self.pax
            .push((format!("SCHILY.xattr.{name}"), value.to_vec()));
        self
    }
}

/// Writes entries as a GNU tar; paths or link targets longer than the
/// header holds go in PAX `path`/`linkpath` records.
fn tar_of(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut pax: Vec<u8> = Vec::new();
        for (k, v) in &e.pax {
            pax.extend(pax_record(k, v));
        }
        if e.path.len() > 100 {
            pax.extend(pax_record("path", &e.path));
        }
        if e.link.len() > 100 {
            pax.extend(pax_record("linkpath", &e.link));
        }
        if !pax.is_empty() {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::XHeader);
            h.as_mut_bytes()[..9].copy_from_slice(b"PaxHeader");
            h.set_size(pax.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append(&h, &pax[..]).unwrap();
        }
        let mut h = tar::Header::new_gnu();
        let name = &e.path[..e.path.len().min(100)];
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        let link = &e.link[..e.link.len().min(100)];
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        h.set_entry_type(tar::EntryType::new(e.kind));
        h.set_mode(e.mode);
        h.set_uid(e.uid);
        h.set_gid(e.gid);
        h.set_mtime(1_000_000);
        if e.kind == b'3' || e.kind == b'4' {
            h.set_device_major(e.dev.0).unwrap();
            h.set_device_minor(e.dev.1).unwrap();
        }
        h.set_size(e.declared.unwrap_or(e.data.len() as u64));
        h.set_cksum();
        if e.declared.is_some() {
            // The header claims more than follows: written raw.
            let raw = b.get_mut();
            raw.extend_from_slice(h.as_bytes());
            raw.extend_from_slice(&e.data);
            let pad = (512 - raw.len() % 512) % 512;
            raw.extend(std::iter::repeat_n(0u8, pad));
            continue;
        }
        b.append(&h, &e.data[..]).unwrap();
    }
    b.into_inner().unwrap()
}

// ---------------------------------------------------------------------------
// What the restored upper may hold (checked on disk, independently of
// layerfs's code)
// ---------------------------------------------------------------------------

/// Whether a symlink at `rel` pointing at `target` stays inside the
/// workspace as the default policy (`symlinks contained`) wants: a
/// relative target climbs with leading `..` only, never above the root; an
/// absolute one lies under /usr, /bin, /lib, /lib64 or /opt with no `..`.
fn contained(rel: &str, target: &[u8]) -> bool {
    let t = String::from_utf8_lossy(target);
    if let Some(abs) = t.strip_prefix('/') {
        let first = abs.split('/').next().unwrap_or("");
        return ["usr", "bin", "lib", "lib64", "opt"].contains(&first)
            && !abs.split('/').any(|c| c == "..");
    }
    let mut depth = rel.matches('/').count() as i64;
    let mut climbing = true;
    for c in t.split('/') {
        match c {
            "" | "." => {}
            ".." if climbing => depth -= 1,
            ".." => return false,
            _ => climbing = false,
        }
        if depth < 0 {
            return false;
        }
    }
    true
}

/// An overlay mark's value as the overlay writes it.
fn valid_mark(what: &str, value: &[u8], is_dir: bool, is_file: bool) -> bool {
    let plain_abs = |v: &[u8]| {
        v == b"/"
            || (v.first() == Some(&b'/')
                && v[1..]
                    .split(|&b| b == b'/')
                    .all(|n| !n.is_empty() && n != b"." && n != b".."))
    };
    match what {
        "opaque" | "layerfs.moved-in" => is_dir && value == b"y",
        "redirect" => {
            is_dir
                && (plain_abs(value)
                    || (!value.is_empty()
                        && value != b"."
                        && value != b".."
                        && !value.contains(&b'/')))
        }
        "layerfs.origin" => {
            // v1 LAYER INO SIZE M.N C.N /PATH
            let parts: Vec<&[u8]> = value.splitn(7, |&b| b == b' ').collect();
            is_file && parts.len() == 7 && parts[0] == b"v1" && plain_abs(parts[6])
        }
        _ => false,
    }
}

/// Walks the upper (not following symlinks) and returns every way it
/// breaks the default policy; `outside` are files whose inode nothing in
/// the upper may share.
fn violations(upper: &Path, outside: &[&Path]) -> Vec<String> {
    let forbidden_inodes: BTreeSet<(u64, u64)> = outside
        .iter()
        .filter_map(|p| fs::symlink_metadata(p).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect();
    let mut bad = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = upper.join(&rel);
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) => {
                bad.push(format!("cannot list {rel:?}: {e}"));
                continue;
            }
        };
        for e in rd {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let p = upper.join(&r);
            let m = fs::symlink_metadata(&p).unwrap();
            let ft = m.file_type();
            let rs = r.to_string_lossy().into_owned();
            if ft.is_block_device() || (ft.is_char_device() && m.rdev() != 0) {
                bad.push(format!("{rs}: a device node {:x}", m.rdev()));
            }
            if !ft.is_dir() && m.mode() & 0o6000 != 0 {
                bad.push(format!("{rs}: mode {:o}", m.mode() & 0o7777));
            }
            if forbidden_inodes.contains(&(m.dev(), m.ino())) {
                bad.push(format!("{rs}: a link to a file outside the upper"));
            }
            if ft.is_symlink() {
                let t = fs::read_link(&p).unwrap();
                if !contained(&rs, t.as_os_str().as_bytes()) {
                    bad.push(format!("{rs}: a symlink to {t:?}"));
                }
            }
            if let Ok(names) = xattr::list(&p) {
                for n in names {
                    let n = n.to_string_lossy().into_owned();
                    let v = xattr::get(&p, &n).ok().flatten().unwrap_or_default();
                    let mark = n
                        .strip_prefix("trusted.overlay.")
                        .or_else(|| n.strip_prefix("user.overlay."));
                    let ok = match mark {
                        Some(w) => valid_mark(w, &v, ft.is_dir(), ft.is_file()),
                        None => {
                            (n.starts_with("user.") && (ft.is_dir() || ft.is_file()))
                                || n == "system.posix_acl_access"
                                || (n == "system.posix_acl_default" && ft.is_dir())
                        }
                    };
                    if !ok {
                        bad.push(format!(
                            "{rs}: xattr {n} = {:?}",
                            String::from_utf8_lossy(&v)
                        ));
                    }
                }
            }
            if ft.is_dir() {
                stack.push(r);
            }
        }
    }
    bad
}

fn json_of(o: &Output) -> Value {
    let out = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(out.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(o)))
}

/// (path, change) pairs of a restore's --json report.
fn changes(v: &Value) -> BTreeSet<(String, String)> {
    v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_string(),
                c["change"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn origin_record() -> Vec<u8> {
    b"v1 0 42 7 1700000000.0 1700000000.0 /shared/f".to_vec()
}

/// What a hostile archive holds: device nodes like /dev/mem, a setuid
/// root shell, a setgid file, a world-writable root, private and trusted
/// xattrs (valid and not), a file capability, a symlink out, and the
/// layerfs marks in their valid forms, which must survive.
fn crafted() -> Vec<u8> {
    let sh = fs::read("/bin/sh").unwrap();
    tar_of(&[
        E::new("./", b'5').mode(0o777).owner(0, 0),
        E::new("mem", b'3').dev(1, 1).mode(0o666),
        E::new("sda", b'4').dev(8, 0).mode(0o666),
        E::new("wh", b'3').dev(0, 0).mode(0),
        E::new("fifo", b'6').mode(0o644),
        E::new("rootshell", b'0').mode(0o4755).owner(0, 0).data(&sh),
        E::new("sgid", b'0').mode(0o2755).data(b"x"),
        E::new("d", b'5').xattr("trusted.overlay.redirect", b"../../etc"),
        E::new("o", b'5').xattr("trusted.overlay.opaque", b"y"),
        E::new("r", b'5').xattr("trusted.overlay.redirect", b"/shared"),
        E::new("bad-opaque", b'5').xattr("user.overlay.opaque", b"x"),
        E::new("t", b'0')
            .data(b"t")
            .xattr("trusted.foo", b"1")
            .xattr("user.ok", b"1")
            .xattr(
                "security.capability",
                &[
                    1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                ],
            )
            .xattr("trusted.overlay.upper", b"x")
            .xattr("trusted.overlay.layerfs.origin", &origin_record()),
        E::new("junk-origin", b'0')
            .data(b"j")
            .xattr("user.overlay.layerfs.origin", b"v1 0 x ../../etc"),
        E::new("esc", b'2').link("/etc/shadow"),
        E::new("up", b'2').link("../../etc"),
        E::new("in", b'2').link("d"),
        E::new("usr", b'2').link("/usr/bin/env"),
        E::new("h", b'1').link("rootshell"),
        E::new("hmem", b'1').link("mem"),
        // Contained where it stands; a hard link would move it to the
        // top, where the same target leads out (found by the fuzz).
        E::new("deep", b'5'),
        E::new("deep/d2", b'5'),
        E::new("deep/d2/ok", b'2').link("../.."),
        E::new("moved", b'1').link("deep/d2/ok"),
    ])
}

fn crafted_archive_is_restored_as_the_policy_allows(who: Who) {
    let w = Ws::new(who, None);
    w.put("evil", &crafted());
    let root_before = w.root_meta();
    let out = w.restore("evil");
    assert!(out.status.success(), "{}", text(&out));
    let up = &w.ws.upper;
    let bad = violations(up, &[&w.sentinel, Path::new("/etc/shadow")]);
    assert!(bad.is_empty(), "{bad:#?}");
    assert_eq!(w.root_meta(), root_before, "the upper root's mode changed");
    assert_eq!(
        fs::read_link(up.join("deep/d2/ok")).unwrap(),
        Path::new("../..")
    );
    for gone in ["mem", "sda", "esc", "up", "hmem", "moved"] {
        assert!(
            fs::symlink_metadata(up.join(gone)).is_err(),
            "{gone} restored"
        );
    }
    let wh = fs::symlink_metadata(up.join("wh")).unwrap();
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
    assert!(fs::symlink_metadata(up.join("fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    let m = fs::metadata(up.join("rootshell")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o755);
    assert_eq!(fs::metadata(up.join("h")).unwrap().ino(), m.ino());
    assert_eq!(
        fs::metadata(up.join("sgid")).unwrap().mode() & 0o7777,
        0o755
    );
    assert_eq!(fs::read_link(up.join("in")).unwrap(), Path::new("d"));
    assert_eq!(
        fs::read_link(up.join("usr")).unwrap(),
        Path::new("/usr/bin/env")
    );
    // The overlay's marks in their valid forms stay, in the restoring
    // user's spelling; the others go.
    let prefix = if who == ROOT { "trusted" } else { "user" };
    let get = |p: &str, n: &str| xattr::get(up.join(p), n).unwrap();
    assert_eq!(
        get("o", &format!("{prefix}.overlay.opaque")),
        Some(b"y".to_vec())
    );
    assert_eq!(
        get("r", &format!("{prefix}.overlay.redirect")),
        Some(b"/shared".to_vec())
    );
    assert_eq!(
        get("t", &format!("{prefix}.overlay.layerfs.origin")),
        Some(origin_record())
    );
    assert_eq!(get("t", "user.ok"), Some(b"1".to_vec()));
    for (p, n) in [
        ("d", "trusted.overlay.redirect"),
        ("d", "user.overlay.redirect"),
        ("t", "trusted.foo"),
        ("t", "security.capability"),
        ("t", "trusted.overlay.upper"),
        ("bad-opaque", "user.overlay.opaque"),
        ("junk-origin", "user.overlay.layerfs.origin"),
    ] {
        assert_eq!(get(p, n), None, "{p}: {n} restored");
    }
    // Every change is reported by name, on stderr and in --json (a
    // second restore of the same archive makes the same changes).
    let err = stderr(&out);
    assert!(
        err.contains("device-skipped: \"mem\"") && err.contains("suid-stripped: \"rootshell\""),
        "{err}"
    );
    let out = w.restore_json("evil");
    assert!(out.status.success(), "{}", text(&out));
    let v = json_of(&out);
    let got = changes(&v);
    let mut want = vec![
        ("mem", "device-skipped"),
        ("sda", "device-skipped"),
        ("rootshell", "suid-stripped"),
        ("sgid", "suid-stripped"),
        ("d", "xattr-dropped"),
        ("bad-opaque", "xattr-dropped"),
        ("t", "xattr-dropped"),
        ("junk-origin", "xattr-dropped"),
        ("esc", "symlink-skipped"),
        ("up", "symlink-skipped"),
        ("hmem", "link-skipped"),
        ("moved", "symlink-skipped"),
        ("", "root-kept"),
    ];
    if who != ROOT {
        // Root's files cannot be given away by another user.
        want.push(("rootshell", "owner-kept"));
    }
    for (p, c) in want {
        assert!(
            got.contains(&(p.to_string(), c.to_string())),
            "{p} {c} not reported: {v:#}"
        );
    }
}

#[test]
fn as_root_a_crafted_snapshot_is_restored_only_as_the_policy_allows() {
    crafted_archive_is_restored_as_the_policy_allows(ROOT);
}

#[test]
fn as_a_user_a_crafted_snapshot_is_restored_only_as_the_policy_allows() {
    crafted_archive_is_restored_as_the_policy_allows(tests_user());
}

#[test]
fn a_policy_that_allows_devices_and_suid_lets_them_through_a_restore() {
    // The same policy the mount applies: what it allows, a restore keeps.
    let w = Ws::new(ROOT, Some("devices allow\nsuid allow\nsymlinks any\n"));
    w.put("evil", &crafted());
    let out = w.restore("evil");
    assert!(out.status.success(), "{}", text(&out));
    let up = &w.ws.upper;
    assert_eq!(
        fs::symlink_metadata(up.join("mem")).unwrap().rdev(),
        libc::makedev(1, 1)
    );
    assert_eq!(
        fs::metadata(up.join("rootshell")).unwrap().mode() & 0o7777,
        0o4755
    );
    assert_eq!(
        fs::read_link(up.join("esc")).unwrap(),
        Path::new("/etc/shadow")
    );
    // Never, whatever the policy: private xattrs that are not layerfs's
    // marks, and the root's mode.
    assert_eq!(
        xattr::get(up.join("d"), "trusted.overlay.redirect").unwrap(),
        None
    );
    assert_eq!(xattr::get(up.join("t"), "trusted.foo").unwrap(), None);
    assert_eq!(fs::metadata(up).unwrap().mode() & 0o7777, 0o751);
    let out = w.restore_json("evil");
    let got = changes(&json_of(&out));
    assert!(
        !got.iter().any(|(p, _)| p == "mem" || p == "rootshell"),
        "{got:?}"
    );
}

#[test]
fn archives_that_would_exhaust_memory_or_disk_are_refused_before_extraction() {
    let w = Ws::new(ROOT, Some("quota bytes=1M inodes=100\n"));
    fs::write(w.ws.upper.join("kept"), "kept\n").unwrap();
    let root = E::new("./", b'5').mode(0o751);
    // A PAX record set declared at 1 GiB: read whole, it would take that
    // much memory (the archive itself is small: it ends early).
    let mut huge_pax = tar_of(std::slice::from_ref(&root));
    // (Without the end-of-archive blocks.)
    huge_pax.truncate(huge_pax.len() - 1024);
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::XHeader);
    h.set_size(1 << 30);
    h.set_cksum();
    huge_pax.extend_from_slice(h.as_bytes());
    huge_pax.extend_from_slice(&pax_record("path", b"x"));
    huge_pax.resize(huge_pax.len().div_ceil(512) * 512 + 1024, 0);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("huge-pax", huge_pax, "bytes of metadata"),
        (
            "absurd-size",
            tar_of(&[
                root.clone(),
                E {
                    declared: Some(1 << 40),
                    ..E::new("big", b'0').data(b"tiny")
                },
            ]),
            "truncated",
        ),
        (
            "over-quota",
            tar_of(&[root.clone(), E::new("big", b'0').data(&vec![7u8; 2 << 20])]),
            "quota (bytes=1048576)",
        ),
        (
            "too-many",
            tar_of(
                &std::iter::once(root.clone())
                    .chain((0..150).map(|i| E::new(&format!("f{i}"), b'0')))
                    .collect::<Vec<_>>(),
            ),
            "quota (inodes=100)",
        ),
    ];
    for (id, tar, why) in cases {
        w.put(id, &tar);
        let out = w.restore(id);
        assert_eq!(out.status.code(), Some(1), "{id}: {}", text(&out));
        assert!(stderr(&out).contains(why), "{id}: {}", text(&out));
        assert_eq!(fs::read_dir(&w.ws.upper).unwrap().count(), 1, "{id}");
        assert!(w.ws.upper.join("kept").exists());
        assert_eq!(
            fs::read_dir(&w.ws.work).unwrap().count(),
            0,
            "{id}: staging left"
        );
    }
}

// ---------------------------------------------------------------------------
// Archive fuzz
// ---------------------------------------------------------------------------

/// xorshift64*: a fixed seed gives the same archives everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The xattrs generated entries carry: the overlay's marks valid and not,
/// other private and trusted names, capabilities, labels, odd namespaces.
fn fuzz_xattrs() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("user.k", b"v".to_vec()),
        ("user.overlay.opaque", b"y".to_vec()),
        ("trusted.overlay.opaque", b"y".to_vec()),
        ("trusted.overlay.opaque", b"n".to_vec()),
        ("trusted.overlay.redirect", b"/a".to_vec()),
        ("trusted.overlay.redirect", b"../../etc".to_vec()),
        ("user.overlay.redirect", b"sib".to_vec()),
        ("user.overlay.redirect", b"/a/./b".to_vec()),
        ("trusted.overlay.layerfs.origin", origin_record()),
        ("trusted.overlay.layerfs.origin", b"v1 garbage".to_vec()),
        ("trusted.overlay.layerfs.moved-in", b"y".to_vec()),
        ("trusted.overlay.metacopy", b"".to_vec()),
        ("user.overlay.whiteout", b"".to_vec()),
        ("trusted.evil", b"1".to_vec()),
        (
            "security.capability",
            vec![
                1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ],
        ),
        (
            "security.selinux",
            b"system_u:object_r:shadow_t:s0".to_vec(),
        ),
        ("system.nfs4_acl", b"x".to_vec()),
        ("weird.ns", b"1".to_vec()),
    ]
}

/// One generated archive. Most are well formed (each entry under a
/// directory made before it), with hostile content: devices, setuid and
/// setgid modes, odd and private xattrs, symlinks out, hard links to each
/// other and to entries left out, foreign owners, long and deep names.
/// The rest are hostile in form too: `..`, absolute and
/// through-a-symlink paths, links out of the tree, duplicate names, a
/// directory replaced by a file, no or a bad root entry, unknown types,
/// absurd sizes, truncation.
fn gen_archive(rng: &mut Rng, escape: &Path) -> Vec<u8> {
    let esc = escape.to_string_lossy().into_owned();
    let long = "L".repeat(240);
    let deep: String = (0..60).map(|i| format!("deep{i}/")).collect();
    let plain_names = [
        "a",
        "b",
        "c",
        "x",
        "y",
        "l",
        long.as_str(),
        "sp ace",
        "nl\nx",
    ];
    let targets: Vec<String> = vec![
        "a".into(),
        "a/x".into(),
        "../escape".into(),
        "/etc/passwd".into(),
        "/usr/bin/env".into(),
        "..".into(),
        "../..".into(),
        "a/../..".into(),
        esc.clone(),
        "b/z".into(),
        "l".into(),
        deep.clone(),
        format!("{}..", "../".repeat(70)),
    ];
    let xattrs = fuzz_xattrs();
    let hostile_form = rng.chance(30);
    let mut entries: Vec<E> = Vec::new();
    if !(hostile_form && rng.chance(15)) {
        let root_kind = if hostile_form && rng.chance(20) {
            b'0'
        } else {
            b'5'
        };
        entries.push(E::new("./", root_kind).mode(*rng.pick(&[0o777, 0o755, 0o700, 0o4777])));
    }
    // Directories made so far and files (any non-directory) so far.
    let mut dirs: Vec<String> = vec![String::new()];
    let mut files: Vec<String> = Vec::new();
    let n = 1 + rng.below(16);
    for _ in 0..n {
        let kind = *rng.pick(b"5550002213346");
        let path = if hostile_form && rng.chance(35) {
            rng.pick(&[
                "../escape".to_string(),
                esc.clone(),
                format!("{esc}/x"),
                "a/../../escape".into(),
                "l/through-link".into(),
                "".into(),
                "nodir/x".into(),
                format!("{deep}f"),
            ])
            .clone()
        } else if rng.chance(3) {
            // A deep chain of directories, then something at its bottom.
            let mut p = rng.pick(&dirs).clone();
            for i in 0..(20 + rng.below(60)) {
                p = if p.is_empty() {
                    format!("deep{i}")
                } else {
                    format!("{p}/deep{i}")
                };
                entries.push(E::new(&p, b'5'));
            }
            dirs.push(p.clone());
            format!("{p}/bottom")
        } else {
            let parent = rng.pick(&dirs).clone();
            let name = rng.pick(&plain_names);
            if parent.is_empty() {
                name.to_string()
            } else {
                format!("{parent}/{name}")
            }
        };
        if !hostile_form && (dirs.contains(&path) || files.contains(&path)) {
            continue;
        }
        let mut e = E::new(&path, kind)
            .mode(*rng.pick(&[0o644, 0o755, 0o4755, 0o2755, 0o6777, 0o1777, 0o0, 0o7777]))
            .owner(
                *rng.pick(&[0, 0, 1000, 65534]),
                *rng.pick(&[0, 0, 1000, 65534]),
            );
        match kind {
            b'5' => dirs.push(path.clone()),
            b'0' => {
                e.data = vec![b'd'; *rng.pick(&[0usize, 1, 511, 513, 4096])];
                files.push(path.clone());
            }
            b'2' => {
                e.link = rng.pick(&targets).as_bytes().to_vec();
                files.push(path.clone());
            }
            b'1' => {
                e.link = match files.is_empty() || (hostile_form && rng.chance(40)) {
                    true => rng.pick(&targets).as_bytes().to_vec(),
                    false => rng.pick(&files).as_bytes().to_vec(),
                };
                files.push(path.clone());
            }
            b'3' | b'4' => {
                e.dev = *rng.pick(&[(0, 0), (0, 0), (1, 1), (1, 3), (8, 0)]);
                files.push(path.clone());
            }
            _ => files.push(path.clone()),
        }
        if hostile_form && rng.chance(10) {
            e.kind = *rng.pick(b"VgM7");
        }
        for _ in 0..rng.below(3) {
            let (k, v) = rng.pick(&xattrs);
            e = e.xattr(k, v);
        }
        if rng.chance(10) {
            let t = *rng.pick(&["1.5", "x", "-3.-1", "99999999999999999999"]);
            e.pax.push(("mtime".into(), t.as_bytes().to_vec()));
        }
        if hostile_form && rng.chance(8) {
            e.uid = 1 << 33;
        }
        if hostile_form && e.kind == b'0' && rng.chance(15) {
            e.declared = Some(*rng.pick(&[1u64 << 40, 1 << 62, 8 << 30]));
        }
        entries.push(e);
        // The same name again: a directory replaced by a file, a duplicate.
        if hostile_form && rng.chance(10) {
            let last = entries.last().unwrap().clone();
            entries.push(E {
                kind: b'0',
                data: b"r".to_vec(),
                ..last
            });
        }
    }
    let mut tar = tar_of(&entries);
    if hostile_form && rng.chance(20) {
        let cut = rng.below(tar.len().max(1));
        tar.truncate(cut);
    }
    tar
}

fn archive_fuzz(who: Who, cases: u64, seed: u64) {
    let w = Ws::new(who, None);
    let escape = w.ws.dir.path().join("escape");
    let mut rng = Rng(seed | 1);
    let outside_before: BTreeSet<String> =
        crate::trust::names(w.ws.dir.path()).into_iter().collect();
    let (mut restored, mut refused) = (0u64, 0u64);
    for case in 0..cases {
        let tar = gen_archive(&mut rng, &escape);
        let id = format!("c{case}");
        w.put(&id, &tar);
        let before = crate::trust::names(&w.ws.upper);
        let root_before = w.root_meta();
        let out = w.restore(&id);
        let what = || format!("case {case} (seed {seed}): {}", text(&out));
        match out.status.code() {
            Some(0) => restored += 1,
            Some(1) => {
                refused += 1;
                if std::env::var_os("LAYERFS_ARCHIVE_FUZZ_VERBOSE").is_some() {
                    eprintln!("case {case}: {}", stderr(&out).trim_end());
                }
                assert!(
                    stderr(&out).starts_with("layerfs snapshot restore: "),
                    "{}",
                    what()
                );
                assert_eq!(crate::trust::names(&w.ws.upper), before, "{}", what());
            }
            _ => panic!("neither restored nor refused: {}", what()),
        }
        assert!(!stderr(&out).contains("panicked"), "{}", what());
        let bad = violations(&w.ws.upper, &[&w.sentinel, Path::new("/etc/passwd")]);
        assert!(bad.is_empty(), "{bad:#?}\n{}", what());
        assert_eq!(w.root_meta(), root_before, "root changed: {}", what());
        let outside: BTreeSet<String> = crate::trust::names(w.ws.dir.path()).into_iter().collect();
        assert_eq!(
            outside,
            outside_before,
            "written outside the upper: {}",
            what()
        );
        assert!(!Path::new("/var/tmp/escape").exists(), "{}", what());
        assert_eq!(
            fs::read_dir(&w.ws.work).unwrap().count(),
            0,
            "staging left: {}",
            what()
        );
        assert_eq!(fs::read(&w.sentinel).unwrap(), b"outside\n");
        fs::remove_file(w.state.join("snapshots").join(format!("{id}.tar"))).unwrap();
    }
    eprintln!(
        "archive fuzz as uid {}: {cases} archives (seed {seed}): {restored} restored, {refused} \
         refused, no violation",
        who.uid
    );
    assert!(restored > 0 && refused > 0, "the generator lost its mix");
}

#[test]
fn archive_fuzz_as_root_never_leaves_what_the_policy_forbids() {
    let cases = env_u64("LAYERFS_ARCHIVE_FUZZ_CASES", 150);
    archive_fuzz(
        ROOT,
        cases,
        env_u64("LAYERFS_ARCHIVE_FUZZ_SEED", 0x5eed_0001),
    );
}

#[test]
fn archive_fuzz_as_a_user_never_leaves_what_the_policy_forbids() {
    let cases = env_u64("LAYERFS_ARCHIVE_FUZZ_CASES", 150) / 3;
    archive_fuzz(
        tests_user(),
        cases,
        env_u64("LAYERFS_ARCHIVE_FUZZ_SEED", 0x5eed_0001) ^ 0xff,
    );
}

// ---------------------------------------------------------------------------
// Deep trees
// ---------------------------------------------------------------------------

/// Opens (`make`: creates) `levels` nested directories `dd` under `root`,
/// each relative to the one above (no path longer than a name), and
/// returns the deepest.
fn deep_chain(root: &Path, levels: u64, make: bool) -> fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    let mut cur = fs::File::open(root).unwrap();
    for i in 0..levels {
        if make {
            fs::create_dir(fd_path(&cur, "dd")).unwrap();
        }
        cur = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(fd_path(&cur, "dd"))
            .unwrap_or_else(|e| panic!("level {}: {e}", i + 1));
    }
    cur
}

/// `name` in the directory `dir` is open on, by a short path.
fn fd_path(dir: &fs::File, name: &str) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()))
}

/// A tree deeper than PATH_MAX (`LAYERFS_DEEP_LEVELS` levels of `dd`,
/// 2500 here: 7.5 KB of path) is saved and restored whole, with a file, a
/// symlink and a hard link at the bottom.
#[test]
fn a_tree_deeper_than_path_max_is_saved_and_restored() {
    let levels = env_u64("LAYERFS_DEEP_LEVELS", 2500);
    // On a tmpfs: the root filesystem here discards at every unlink, and
    // removing thousands of nested directories from it takes seconds.
    let place = tempfile::Builder::new()
        .prefix("layerfs-test.")
        .tempdir_in("/var/tmp")
        .unwrap();
    // Room for the archive (each entry holds its whole path) and the tree.
    let mib = 64 + levels * levels * 3 / 500_000;
    let _tmpfs = crate::harness::Tmpfs::new(place.path(), &format!("{mib}M"));
    fs::set_permissions(place.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let w = Ws::new_in(ROOT, None, place.path());
    let up = s(&w.ws.upper);
    let bottom = deep_chain(&w.ws.upper, levels, true);
    fs::write(fd_path(&bottom, "f"), "bottom\n").unwrap();
    std::os::unix::fs::symlink("f", fd_path(&bottom, "l")).unwrap();
    fs::hard_link(fd_path(&bottom, "f"), fd_path(&bottom, "h")).unwrap();
    fs::set_permissions(fd_path(&bottom, "f"), fs::Permissions::from_mode(0o4755)).unwrap();
    drop(bottom);
    let t = std::time::Instant::now();
    let out = layerfs_as(ROOT, &["snapshot", "save", up, "deep"]);
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("{levels} levels: saved in {:?}", t.elapsed());
    let out = sh_as(ROOT, &format!("rm -rf {up}/dd && echo other > {up}/other"));
    assert!(out.status.success(), "{}", text(&out));
    let t = std::time::Instant::now();
    let out = w.restore_json("deep");
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("{levels} levels: restored in {:?}", t.elapsed());
    assert!(!w.ws.upper.join("other").exists());
    let bottom = deep_chain(&w.ws.upper, levels, false);
    assert!(
        fs::symlink_metadata(fd_path(&bottom, "dd")).is_err(),
        "deeper than saved"
    );
    assert_eq!(fs::read(fd_path(&bottom, "f")).unwrap(), b"bottom\n");
    assert_eq!(
        fs::read_link(fd_path(&bottom, "l")).unwrap(),
        Path::new("f")
    );
    let m = fs::metadata(fd_path(&bottom, "f")).unwrap();
    // The file's setuid bit went with the default policy (suid strip).
    assert_eq!((m.nlink(), m.mode() & 0o7777), (2, 0o755));
    drop(bottom);
    assert_eq!(
        changes(&json_of(&out)).len(),
        1,
        "only the stripped setuid bit is reported"
    );
    // Removed by rm(1), which walks iteratively, before the temporary
    // directory's own (recursive) removal.
    let out = sh_as(ROOT, &format!("rm -rf {up}/dd"));
    assert!(out.status.success(), "{}", text(&out));
}
