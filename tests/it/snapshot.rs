//! `layerfs snapshot`: save/restore roundtrips seen through real mounts,
//! unsafe IDs, kill -9 during a save, a full state dir.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::hash::{Hash, Hasher};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::harness::{bin, eventually, layerfs, sh, Tmpfs, Workspace};
fn snap(args: &[&str]) -> Output {
    let mut a: Vec<&OsStr> = vec![OsStr::new("snapshot")];
    a.extend(args.iter().map(OsStr::new));
    layerfs(&a)
}

/// `layerfs snapshot ARGS` under another umask (restores must not depend on it).
fn snap_umask(umask: &str, args: &[&str]) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(format!("umask {umask}; exec \"$0\" snapshot \"$@\""))
        .arg(bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run layerfs")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "layerfs failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn state_dir(ws: &Workspace) -> PathBuf {
    ws.dir.path().join(".upper.layerfs-state")
}

fn snapshots(ws: &Workspace) -> Vec<OsString> {
    let mut v: Vec<OsString> = match fs::read_dir(state_dir(ws).join("snapshots")) {
        Ok(rd) => rd.map(|e| e.unwrap().file_name()).collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// Mounts and unmounts once, so the state dir and its workspace.json exist
/// (how `layerfs snapshot UPPER` finds an unmounted workspace).
fn register(ws: &Workspace) {
    drop(ws.mount());
    assert!(state_dir(ws).join("workspace.json").exists());
}

/// One object as seen through the mount.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Obj {
    kind: u32,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    blocks_nonzero: bool,
    mtime: (i64, i64),
    content: u64,
    target: Option<OsString>,
    xattrs: Vec<(OsString, Vec<u8>)>,
    rdev: u64,
    /// First path (in walk order) of the hard-link group, for nlink > 1.
    link_group: Option<String>,
}

/// Every object under `root` (not following symlinks), by relative path.
fn walk(root: &Path) -> BTreeMap<String, Obj> {
    let mut out = BTreeMap::new();
    let mut groups: BTreeMap<u64, String> = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut names: Vec<OsString> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for n in names.into_iter().rev() {
            let r = rel.join(&n);
            let p = root.join(&r);
            let m = fs::symlink_metadata(&p).unwrap();
            let kind = m.mode() & libc::S_IFMT;
            let key = format!("{:?}", r.as_os_str());
            let content = if m.is_file() {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                fs::read(&p).unwrap().hash(&mut h);
                h.finish()
            } else {
                0
            };
            let link_group = (!m.is_dir() && m.nlink() > 1)
                .then(|| groups.entry(m.ino()).or_insert_with(|| key.clone()).clone());
            let mut xattrs: Vec<(OsString, Vec<u8>)> = if m.file_type().is_symlink() {
                Vec::new()
            } else {
                xattr::list(&p)
                    .unwrap()
                    .map(|n| {
                        let v = xattr::get(&p, &n).unwrap().unwrap_or_default();
                        (n, v)
                    })
                    .collect()
            };
            xattrs.sort();
            out.insert(
                key,
                Obj {
                    kind,
                    mode: m.mode() & 0o7777,
                    uid: m.uid(),
                    gid: m.gid(),
                    size: if m.is_dir() { 0 } else { m.size() },
                    blocks_nonzero: m.blocks() > 0,
                    mtime: (m.mtime(), m.mtime_nsec()),
                    content,
                    target: m
                        .file_type()
                        .is_symlink()
                        .then(|| fs::read_link(&p).unwrap().into()),
                    xattrs,
                    rdev: m.rdev(),
                    link_group,
                },
            );
            if m.is_dir() {
                stack.push(r);
            }
        }
    }
    // Directory mtimes through the mount mix layers; every other field
    // must match exactly.
    out
}

/// Lower content every roundtrip test starts from.
fn populate_lower(lower: &Path) {
    sh(
        lower,
        "mkdir -p a b/sub c keep && echo one > a/1 && echo two > a/2 && echo x > b/x \
         && echo deep > b/sub/d && echo y > c/y && echo k > keep/k && echo gone > del \
         && ln -s a/1 lsym && echo shared > keep/shared",
    );
}

/// Changes of every kind, made through the mount.
fn change_everything(m: &Path) {
    sh(
        m,
        "set -e
         rm del                               # whiteout
         mv b b2                              # redirect (renamed lower dir)
         rm -rf c && mkdir c && echo z > c/z  # opaque dir
         echo more >> a/1                     # copy-up
         rm keep/shared                       # whiteout inside a lower dir
         echo n > n1 && ln n1 n2 && ln n1 a/n3   # hard links
         ln -s a/1 s1
         echo p > perm && chmod 4751 perm
         mkdir sticky && chmod 1777 sticky
         mkdir ro && echo r > ro/f && chmod 555 ro
         echo x > xa && setfattr -n user.k -v 'v 1' xa && setfattr -n user.bin -v 0sAAEC/w== xa
         setfattr -n user.dir -v d a
         echo o > owned && chown 65534:65534 owned
         mkfifo fifo
         truncate -s 5M sparse && echo tail >> sparse
         echo t > timed && touch -d '2001-02-03 04:05:06.123456789' timed
         long=$(printf 'd%.0s' $(seq 1 120)); mkdir -p \"$long/$long\" && echo L > \"$long/$long/$long.txt\"
         ln -s \"$long/$long/$long.txt\" longlink
         printf 'nl' > \"$(printf 'new\\nline')\"
         printf 'bin' > \"$(printf 'x\\377y')\"
         echo e > 'sp ace'",
    );
}

#[test]
fn snapshot_roundtrip_gives_the_same_view() {
    let ws = Workspace::new();
    populate_lower(ws.lower());
    let m = ws.mount();
    change_everything(m.path());
    let before = walk(m.path());
    assert!(
        before.values().any(|o| o.link_group.is_some()) && before.len() > 20,
        "{before:#?}"
    );
    // The view the marks make: whiteouts hide, the redirect renames, the
    // opaque dir hides its lower contents.
    let has = |v: &BTreeMap<String, Obj>, p: &str| v.contains_key(&format!("{p:?}"));
    for p in ["b2/sub/d", "c/z", "a/1", "keep/k", "n2", "perm"] {
        assert!(has(&before, p), "{p} missing");
    }
    for p in ["del", "b", "c/y", "keep/shared"] {
        assert!(!has(&before, p), "{p} present");
    }
    drop(m);
    let upper = ws.upper.to_str().unwrap();
    let out = ok(&snap(&["save", upper, "s1"]));
    assert!(out.contains("saved snapshot s1"), "{out}");

    // Change it all again, then go back.
    let m = ws.mount();
    sh(
        m.path(),
        "chmod -R u+w . && rm -rf ./* && echo junk > junk && mkdir b && echo back > b/x",
    );
    assert_ne!(walk(m.path()), before);
    drop(m);
    let out = ok(&snap_umask("000", &["restore", upper, "s1"]));
    assert!(out.contains("restored snapshot s1"), "{out}");
    let m = ws.mount();
    let after = walk(m.path());
    for (k, v) in &before {
        let mut a = after.get(k).cloned();
        // A merged directory's mtime can come from its lower.
        if let Some(a) = a.as_mut().filter(|a| a.kind == libc::S_IFDIR) {
            a.mtime = v.mtime;
        }
        assert_eq!(a.as_ref(), Some(v), "{k} differs after restore");
    }
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    for p in ["del", "b", "c/y", "keep/shared", "junk"] {
        assert!(!has(&after, p), "{p} present after restore");
    }
    // The upper holds the overlay's own marks again (the view depends on them).
    drop(m);
    let wh = fs::symlink_metadata(ws.upper.join("del")).unwrap();
    assert_eq!((wh.mode() & libc::S_IFMT, wh.rdev()), (libc::S_IFCHR, 0));
    let sparse = fs::metadata(ws.upper.join("sparse")).unwrap();
    assert!(
        sparse.blocks() * 512 < 1 << 20,
        "sparse file not kept sparse"
    );
    // No staging leftovers anywhere beside the upper.
    let stray: Vec<_> = fs::read_dir(ws.dir.path())
        .unwrap()
        .chain(fs::read_dir(&ws.work).unwrap())
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("restore"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn snapshot_list_rm_and_existing_ids() {
    let ws = Workspace::new();
    register(&ws);
    fs::write(ws.upper.join("f"), "x").unwrap();
    let upper = ws.upper.to_str().unwrap();
    ok(&snap(&["save", upper, "one"]));
    let again = snap(&["save", upper, "one"]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already exists"),
        "{again:?}"
    );
    ok(&snap(&["save", "--force", upper, "one"]));
    let auto = ok(&snap(&["save", upper]));
    let auto_id = auto.split_whitespace().nth(2).unwrap().to_string();
    let json = ok(&snap(&["list", "--json", upper]));
    let rows: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "{json}");
    for r in &rows {
        assert!(r["size"].as_u64().unwrap() > 0);
        assert_eq!(r["entries"].as_u64(), Some(2), "{r}");
        assert!(r["time"].as_str().unwrap().ends_with('Z'));
    }
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert!(
        ids.contains(&"one") && ids.contains(&auto_id.as_str()),
        "{ids:?}"
    );
    let text = ok(&snap(&["list", upper]));
    assert!(text.starts_with("ID") && text.contains("one"), "{text}");
    ok(&snap(&["rm", upper, "one"]));
    let gone = snap(&["rm", upper, "one"]);
    assert!(String::from_utf8_lossy(&gone.stderr).contains("no snapshot `one`"));
    let missing = snap(&["restore", upper, "one"]);
    assert!(!missing.status.success());
    assert_eq!(
        snapshots(&ws),
        vec![OsString::from(format!("{auto_id}.tar"))]
    );
}

#[test]
fn snapshot_unsafe_ids_are_refused_before_anything_is_written() {
    let ws = Workspace::new();
    register(&ws);
    fs::write(ws.upper.join("f"), "x").unwrap();
    let listing = |d: &Path| -> Vec<OsString> {
        let mut v: Vec<OsString> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    let (state_before, dir_before) = (listing(&state_dir(&ws)), listing(ws.dir.path()));
    let long = "x".repeat(300);
    let bad: Vec<OsString> = vec![
        "../x".into(),
        "a/b".into(),
        ".hidden".into(),
        "".into(),
        ".".into(),
        "..".into(),
        long.into(),
        "a\nb".into(),
        "a b".into(),
        "/abs".into(),
        OsString::from_vec(b"a\xffb".to_vec()),
    ];
    for id in &bad {
        for cmd in ["save", "restore", "rm"] {
            let out = layerfs(&[
                OsStr::new("snapshot"),
                OsStr::new(cmd),
                ws.upper.as_os_str(),
                id,
            ]);
            assert_eq!(out.status.code(), Some(1), "{cmd} {id:?}: {out:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("invalid snapshot ID"), "{cmd} {id:?}: {err}");
        }
    }
    // Nothing written: no snapshots dir, no file anywhere beside the upper.
    assert_eq!(listing(&state_dir(&ws)), state_before);
    assert!(!state_dir(&ws).join("snapshots").exists());
    assert_eq!(listing(ws.dir.path()), dir_before);
    assert_eq!(listing(&ws.upper), vec![OsString::from("f")]);
}

#[test]
fn snapshot_kill9_during_save_leaves_nothing_partial() {
    let ws = Workspace::new();
    register(&ws);
    // Enough data that the save is still writing when it is killed.
    let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + 1) as u8).collect();
    for i in 0..96 {
        fs::write(ws.upper.join(format!("big{i}")), &chunk).unwrap();
    }
    let upper = ws.upper.to_str().unwrap();
    let snaps = state_dir(&ws).join("snapshots");
    for id in ["k1", "k2"] {
        let mut child = Command::new(bin())
            .args(["snapshot", "save", upper, id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let tmp = snaps.join(format!(".{id}.tar.tmp"));
        assert!(
            eventually(Duration::from_secs(20), || fs::metadata(&tmp)
                .is_ok_and(|m| m.len() > 0)),
            "save never started writing"
        );
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success(), "the save finished before it was killed");
        assert!(!snaps.join(format!("{id}.tar")).exists());
    }
    // Leftovers never show in list.
    assert_eq!(ok(&snap(&["list", "--json", upper])), "");
    // A later save of the same ID is not tripped up; it also clears the
    // other killed save's leftover.
    ok(&snap(&["save", upper, "k1"]));
    assert_eq!(snapshots(&ws), vec![OsString::from("k1.tar")]);
    ok(&snap(&["save", upper, "k2"]));
    assert_eq!(
        snapshots(&ws),
        vec![OsString::from("k1.tar"), OsString::from("k2.tar")]
    );
    let json = ok(&snap(&["list", "--json", upper]));
    assert_eq!(json.lines().count(), 2, "{json}");
}

#[test]
fn snapshot_full_state_dir_leaves_no_partial_snapshot() {
    let ws = Workspace::new();
    register(&ws);
    let _full = Tmpfs::new(&state_dir(&ws).join("snapshots"), "1m");
    let chunk: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
    fs::write(ws.upper.join("big"), &chunk).unwrap();
    let upper = ws.upper.to_str().unwrap();
    let out = snap(&["save", upper, "full"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no space left"), "{err}");
    assert!(snapshots(&ws).is_empty(), "{:?}", snapshots(&ws));
    // Once there is room, the same ID saves.
    fs::write(ws.upper.join("big"), "small").unwrap();
    ok(&snap(&["save", upper, "full"]));
    assert_eq!(snapshots(&ws), vec![OsString::from("full.tar")]);
}

#[test]
fn snapshot_roundtrip_as_another_user() {
    // The unprivileged convention: user.overlay.* marks, files owned by the
    // caller; save and restore run as that user.
    let ws = Workspace::new();
    sh(
        ws.dir.path(),
        "mkdir -p upper/d/e && echo hi > upper/d/f && ln upper/d/f upper/g \
         && mknod upper/wh c 0 0 && setfattr -n user.overlay.opaque -v y upper/d \
         && chmod 0444 upper/d/f && setfattr -n user.overlay.redirect -v /x upper/d/e \
         && chmod 555 upper/d/e && chown -R 65534:65534 upper && chmod 0777 . \
         && chmod 0755 upper",
    );
    // An unmounted workspace's description, as `mount` writes it, in a
    // state dir of that user.
    let state = state_dir(&ws);
    fs::create_dir(&state).unwrap();
    let desc = serde_json::json!({
        "upper": ws.upper, "lowers": [ws.lower()], "work": ws.work,
        "mountpoint": null, "policy": null, "scratch": [],
    });
    fs::write(state.join("workspace.json"), desc.to_string()).unwrap();
    sh(
        ws.dir.path(),
        "chown -R 65534:65534 .upper.layerfs-state && chmod 0700 .upper.layerfs-state",
    );
    let before = walk(&ws.upper);
    let as_nobody = |args: &[&str]| {
        Command::new("bash")
            .arg("-c")
            .arg("umask 077; exec setpriv --reuid=65534 --regid=65534 --clear-groups \"$@\"")
            .arg("bash")
            .arg(bin())
            .arg("snapshot")
            .args(args)
            .output()
            .unwrap()
    };
    let upper = ws.upper.to_str().unwrap();
    ok(&as_nobody(&["save", upper, "u1"]));
    sh(&ws.upper, "chmod -R u+w . && rm -rf d && echo new > new");
    ok(&as_nobody(&["restore", upper, "u1"]));
    let after = walk(&ws.upper);
    assert_eq!(after, before);
    let m = fs::metadata(state_dir(&ws)).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (65534, 0o700));
    assert_eq!(
        fs::metadata(ws.upper.join("d/f"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o444
    );
}

#[test]
fn snapshot_keeps_xattr_values_holding_a_newline() {
    // A POSIX ACL naming uid 10 holds the byte 0x0a, as does any value
    // with a newline: the archive must still restore, with the values.
    let ws = Workspace::new();
    register(&ws);
    sh(
        &ws.upper,
        "echo x > f && setfacl -m u:10:r f && setfattr -n user.nl -v \"$(printf 'a\\nb')\" f \
         && mkdir d && setfacl -d -m u:10:rx d",
    );
    let before = walk(&ws.upper);
    let upper = ws.upper.to_str().unwrap();
    ok(&snap(&["save", upper, "nl"]));
    sh(&ws.upper, "rm -rf f d");
    ok(&snap(&["restore", upper, "nl"]));
    assert_eq!(walk(&ws.upper), before);
    assert_eq!(
        xattr::get(ws.upper.join("f"), "user.nl").unwrap(),
        Some(b"a\nb".to_vec())
    );
}

/// Record size of the writers: not a divisor of the page size, so a write
/// cut anywhere shows.
const RECORD: usize = 3001;

fn record(writer: usize, seq: usize) -> Vec<u8> {
    let mut r = format!("w{writer} {seq:08} ").into_bytes();
    r.resize(RECORD - 1, b'a' + writer as u8);
    r.push(b'\n');
    r
}

/// Checks that `data` is records 0, 1, 2, … of `writer`; returns how many.
fn check_records(name: &str, writer: usize, data: &[u8]) -> usize {
    assert_eq!(
        data.len() % RECORD,
        0,
        "{name}: {} bytes, a partial record",
        data.len()
    );
    for (seq, r) in data.chunks(RECORD).enumerate() {
        assert!(
            r == record(writer, seq).as_slice(),
            "{name}: record {seq} is not writer {writer}'s"
        );
    }
    data.len() / RECORD
}

#[test]
fn snapshot_save_while_8_writers_append_is_consistent() {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let ws = Workspace::new();
    let m = ws.mount();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let path = m.p(&format!("w{w}.log"));
            let count = m.p(&format!("w{w}.count"));
            let tmp = m.p(&format!("w{w}.count.tmp"));
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut seq = 0;
                while !stop.load(Ordering::Relaxed) {
                    // Open, one whole-record write, close: as `echo >> f`.
                    let mut f = fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                        .unwrap();
                    f.write_all(&record(w, seq)).unwrap();
                    drop(f);
                    seq += 1;
                    // Then the count of records, replaced by a rename:
                    // the two files are updated together.
                    fs::write(&tmp, format!("{seq}\n")).unwrap();
                    fs::rename(&tmp, &count).unwrap();
                }
                seq
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mnt = m.path().to_str().unwrap().to_string();
    // Without the pause, about one save in ten catches a record half
    // written (the file's size grows page by page during a write).
    const SAVES: usize = 8;
    for i in 0..SAVES {
        ok(&snap(&["save", &mnt, &format!("live{i}")]));
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let written: Vec<usize> = writers.into_iter().map(|t| t.join().unwrap()).collect();
    let mut seen = Vec::new();
    for i in 0..SAVES {
        let p = state_dir(&ws).join(format!("snapshots/live{i}.tar"));
        let mut ar = tar::Archive::new(fs::File::open(&p).unwrap());
        let mut total = 0;
        let mut logs: BTreeMap<usize, usize> = BTreeMap::new();
        let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            let Some(rest) = name.strip_prefix('w') else {
                continue;
            };
            if let Some(w) = rest.strip_suffix(".log") {
                let w: usize = w.parse().unwrap();
                let n = check_records(&name, w, &data);
                logs.insert(w, n);
                total += n;
            } else if let Some(w) = rest.strip_suffix(".count") {
                let text = String::from_utf8(data).unwrap();
                let n: usize = text
                    .strip_suffix('\n')
                    .and_then(|t| t.parse().ok())
                    .unwrap_or_else(|| panic!("live{i}: {name} holds {text:?}"));
                counts.insert(w.parse().unwrap(), n);
            } else if rest.ends_with(".count.tmp") {
                // Caught between its creation and its rename: empty (the
                // write not yet done) or the whole line.
                let text = String::from_utf8(data).unwrap();
                assert!(
                    text.is_empty()
                        || text
                            .strip_suffix('\n')
                            .is_some_and(|t| t.parse::<usize>().is_ok()),
                    "live{i}: {name} holds {text:?}"
                );
            }
        }
        // A writer's count file says how many whole records its log held
        // (or one fewer: caught between the append and the rename).
        for (w, &n) in &logs {
            let c = counts.get(w).copied().unwrap_or(0);
            assert!(
                n == c || n == c + 1,
                "live{i}: w{w}.log has {n} records, w{w}.count says {c}"
            );
        }
        seen.push(total);
    }
    // The snapshots saw the writers progress, and writing went on after
    // each pause.
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert!(
        seen[0] > 0 && written.iter().sum::<usize>() > seen[SAVES - 1],
        "{seen:?} {written:?}"
    );
    // The mount's files are whole records too.
    for (w, &n) in written.iter().enumerate() {
        let data = fs::read(m.p(&format!("w{w}.log"))).unwrap();
        assert_eq!(check_records("mount", w, &data), n);
        assert_eq!(
            fs::read_to_string(m.p(&format!("w{w}.count"))).unwrap(),
            format!("{n}\n")
        );
    }
}

/// Asserts that the walk `got` is `want`, but for directories' mtimes (a
/// merged directory's mtime through the mount can come from its lower).
fn same_view(got: &BTreeMap<String, Obj>, want: &BTreeMap<String, Obj>, what: &str) {
    for (k, v) in want {
        let mut a = got.get(k).cloned();
        if let Some(a) = a.as_mut().filter(|a| a.kind == libc::S_IFDIR) {
            a.mtime = v.mtime;
        }
        assert_eq!(a.as_ref(), Some(v), "{what}: {k} differs");
    }
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{what}: other names"
    );
}

fn no_staging_left(ws: &Workspace) {
    let stray: Vec<_> = fs::read_dir(ws.dir.path())
        .unwrap()
        .chain(fs::read_dir(&ws.work).unwrap())
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("restore"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn snapshot_restore_on_a_live_mount_shows_the_snapshot_at_once() {
    use std::io::{Read, Seek};
    let ws = Workspace::new();
    populate_lower(ws.lower());
    let m = ws.mount();
    change_everything(m.path());
    sh(
        m.path(),
        "echo one > a/f && echo snap-only > only && echo k > kept",
    );
    let mnt = m.path().to_str().unwrap().to_string();
    let out = ok(&snap(&["save", &mnt, "s1"]));
    assert!(out.contains("saved snapshot s1"), "{out}");
    let snap_view = walk(m.path());

    // Changes after the snapshot, each kind: an edit, a removal, a
    // whiteout replaced by a file, a new file and directory, a copy-up,
    // a directory removed, a renamed directory.
    sh(
        m.path(),
        "set -e; echo two > a/f; rm only; echo back > del; echo new > new; mkdir nd \
         && echo n > nd/x; echo edited >> keep/k; chmod -R u+w ro; rm -rf ro; mv a a2",
    );
    // Cached by the kernel: the absence of `only` and `a`, the presence
    // of `new`, `del`, `a2` and their attributes and pages.
    for p in ["only", "a/f"] {
        assert!(fs::metadata(m.p(p)).is_err(), "{p}");
    }
    for p in ["new", "del", "nd/x", "keep/k", "a2/f"] {
        fs::read(m.p(p)).unwrap();
    }
    let before_restore = walk(m.path());
    assert_ne!(before_restore, snap_view);
    // A file open for reading keeps what it opened.
    let mut held = fs::File::open(m.p("a2/f")).unwrap();

    let out = ok(&snap(&["restore", &mnt, "s1"]));
    assert!(out.contains("restored snapshot s1"), "{out}");
    // At once, through the same mount and the same cached names.
    same_view(&walk(m.path()), &snap_view, "live restore");
    let read = |p: &str| fs::read_to_string(m.p(p)).unwrap();
    assert_eq!(read("a/f"), "one\n");
    assert_eq!(read("only"), "snap-only\n");
    assert_eq!(read("kept"), "k\n");
    assert_eq!(read("keep/k"), "k\n");
    assert_eq!(read("a/1"), "one\nmore\n");
    assert_eq!(read("ro/f"), "r\n");
    for p in ["del", "new", "nd", "a2", "keep/shared", "c/y"] {
        assert!(
            fs::symlink_metadata(m.p(p)).is_err(),
            "{p} still shows after the restore"
        );
    }
    let mut s = String::new();
    held.rewind().unwrap();
    held.read_to_string(&mut s).unwrap();
    assert_eq!(s, "two\n", "an open file changed under its reader");
    drop(held);
    no_staging_left(&ws);

    // Create/unlink cycles after the restore: inode numbers of the
    // discarded tree come back; each name must show its own content.
    for round in 0..3 {
        for i in 0..150 {
            fs::write(m.p(&format!("c{i}")), format!("round {round} file {i}\n")).unwrap();
        }
        for i in 0..150 {
            assert_eq!(read(&format!("c{i}")), format!("round {round} file {i}\n"));
            if i % 2 == round % 2 {
                fs::remove_file(m.p(&format!("c{i}"))).unwrap();
            }
        }
        assert_eq!(read("a/f"), "one\n");
        assert_eq!(read("only"), "snap-only\n");
    }
    for i in 0..150 {
        let _ = fs::remove_file(m.p(&format!("c{i}")));
    }
    // The upper itself is the snapshot's tree: a fresh mount agrees.
    let live = walk(m.path());
    same_view(&live, &snap_view, "after cycles");
    drop(m);
    let m = ws.mount();
    same_view(&walk(m.path()), &snap_view, "remounted");
}

#[test]
fn snapshot_restore_on_a_live_mount_refuses_while_a_file_is_open_for_writing() {
    use std::io::Write;
    let ws = Workspace::new();
    fs::write(ws.lower().join("l"), "lower").unwrap();
    let m = ws.mount();
    fs::write(m.p("a"), "one").unwrap();
    let mnt = m.path().to_str().unwrap();
    ok(&snap(&["save", mnt, "s"]));
    fs::write(m.p("a"), "two").unwrap();
    let view = walk(m.path());
    let mut w = fs::OpenOptions::new().append(true).open(m.p("a")).unwrap();
    let out = snap(&["restore", mnt, "s"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    // Each file is named with the uid holding it (the owner's own here:
    // only the owner's files open for writing hold a restore up).
    assert!(
        err.contains("open for writing") && err.contains(": a (uid 0);") && err.contains("retry"),
        "{err}"
    );
    // Nothing changed, nothing left behind, writing goes on.
    assert_eq!(walk(m.path()), view);
    no_staging_left(&ws);
    w.write_all(b"+").unwrap();
    drop(w);
    assert_eq!(fs::read_to_string(m.p("a")).unwrap(), "two+");
    ok(&snap(&["restore", mnt, "s"]));
    assert_eq!(fs::read_to_string(m.p("a")).unwrap(), "one");
    assert_eq!(fs::read_to_string(m.p("l")).unwrap(), "lower");
}

/// Snapshots leave out the same scratch paths as diff and gc: the
/// policy's `scratch` lines as well as `--scratch`, with the one pattern
/// language (a name without `/` matches at any depth).
#[test]
fn snapshot_save_leaves_out_the_policy_scratch_paths() {
    let ws = Workspace::new();
    fs::write(ws.lower().join("shared.txt"), "s\n").unwrap();
    let policy = crate::harness::policy_file(&ws, "scratch build/**\nscratch *.o\n");
    let m = ws.mount_with(&["--policy", policy.to_str().unwrap(), "--scratch", "tmp"]);
    sh(
        m.path(),
        "mkdir -p build/x src/tmp && echo o > build/o && echo o > build/x/p && echo m > src/m.o \
         && echo t > src/tmp/t && echo k > keep.txt && echo s2 >> shared.txt",
    );
    let diff = ok(&layerfs(&[OsStr::new("diff"), m.path().as_os_str()]));
    assert_eq!(
        diff,
        "A build/ (empty)\nA keep.txt\nM shared.txt\nA src/ (empty)\n"
    );
    ok(&snap(&["save", m.path().to_str().unwrap(), "s1"]));
    let tar = state_dir(&ws).join("snapshots/s1.tar");
    let listing = crate::harness::sh(ws.dir.path(), &format!("tar -tf {}", tar.display()));
    let names: Vec<&str> = listing.lines().map(|l| l.trim_end_matches('/')).collect();
    for kept in ["build", "keep.txt", "shared.txt", "src"] {
        assert!(names.contains(&kept), "{kept} missing: {names:?}");
    }
    for gone in [
        "build/o",
        "build/x",
        "build/x/p",
        "src/m.o",
        "src/tmp",
        "src/tmp/t",
    ] {
        assert!(!names.contains(&gone), "{gone} archived: {names:?}");
    }
}
