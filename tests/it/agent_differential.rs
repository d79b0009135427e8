//! Differential: the same random sequence of changes through the tools
//! library (`layerfs::Workspace`, the core in-process, no mount) and
//! through a mount (plain system calls) over identical layers gives the
//! same answers, the same union view and the same upper, byte for byte
//! (whiteouts and opaque marks included).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use layerfs::tools::{EditRequest, Layers, OpenOptions, WriteRequest};

use crate::harness::Workspace;

const PATHS: [&str; 12] = [
    "top.txt",
    "new1",
    "d1",
    "d1/f1",
    "d1/f2",
    "d1/new",
    "d2/sub",
    "d2/sub/f3",
    "d2/sub/n",
    "d3",
    "d3/x",
    "d2",
];

/// A small deterministic generator (xorshift64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, v: &[&'a str]) -> &'a str {
        v[(self.next() % v.len() as u64) as usize]
    }
    fn content(&mut self) -> String {
        (0..self.next() % 12)
            .map(|_| ['a', 'b', '\n'][(self.next() % 3) as usize])
            .collect()
    }
}

fn populate(lower: &Path) {
    fs::create_dir_all(lower.join("d1")).unwrap();
    fs::create_dir_all(lower.join("d2/sub")).unwrap();
    fs::write(lower.join("top.txt"), "ab\nba\n").unwrap();
    fs::write(lower.join("d1/f1"), "aaa").unwrap();
    fs::write(lower.join("d1/f2"), "b\n").unwrap();
    fs::write(lower.join("d2/sub/f3"), "ab").unwrap();
}

/// One change through the mount, with the tools' semantics.
fn by_mount(root: &Path, op: u64, p: &str, q: &str, content: &str) -> bool {
    let (pp, qq) = (root.join(p), root.join(q));
    let r: std::io::Result<()> = (|| match op {
        0 => {
            use std::io::Write;
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&pp)?
                .write_all(content.as_bytes())
        }
        1 => {
            if pp.is_dir() {
                return Err(std::io::Error::other("dir"));
            }
            fs::write(&pp, content)
        }
        2 => {
            let old = fs::read_to_string(&pp)?;
            if !old.contains('a') {
                return Err(std::io::Error::other("0 matches"));
            }
            fs::write(&pp, old.replace('a', "b"))
        }
        3 => {
            if fs::symlink_metadata(&pp)?.is_dir() {
                fs::remove_dir(&pp)
            } else {
                fs::remove_file(&pp)
            }
        }
        4 => fs::create_dir(&pp),
        _ => {
            if fs::symlink_metadata(&qq).is_ok() {
                return Err(std::io::Error::other("exists"));
            }
            fs::rename(&pp, &qq)
        }
    })();
    r.is_ok()
}

/// The same change through the library.
fn by_library(ws: &layerfs::Workspace, op: u64, p: &str, q: &str, content: &str) -> bool {
    let write = |overwrite| {
        ws.write(&WriteRequest {
            path: p.into(),
            content: content.into(),
            overwrite,
        })
        .map(drop)
    };
    match op {
        0 => write(false),
        1 => write(true),
        2 => ws
            .edit(&EditRequest {
                path: p.into(),
                old_string: "a".into(),
                new_string: "b".into(),
                replace_all: true,
            })
            .map(drop),
        3 => ws.delete(p, false),
        4 => ws.mkdir(p, false),
        _ => ws.rename(p, q, false),
    }
    .is_ok()
}

/// Every entry under `dir`: kind, content, and the marks overlayfs keeps
/// (whiteouts are 0/0 character devices; opaque directories an xattr).
fn tree(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
            let md = fs::symlink_metadata(&p).unwrap();
            let ft = md.file_type();
            let what = if ft.is_dir() {
                let opaque = xattr::get(&p, "trusted.overlay.opaque").ok().flatten();
                walk(base, &p, out);
                format!("dir opaque={opaque:?}")
            } else if ft.is_char_device() {
                format!("whiteout {}", md.rdev())
            } else {
                format!("file {:?}", fs::read_to_string(&p).unwrap())
            };
            out.insert(rel, what);
        }
    }
    walk(dir, dir, &mut out);
    out
}

#[test]
fn random_changes_through_the_library_and_a_mount_end_the_same() {
    for seed in [1u64, 7, 42, 2026] {
        let a = Workspace::new();
        let b = Workspace::new();
        populate(a.lower());
        populate(b.lower());
        let lib = layerfs::Workspace::open_layers(
            &Layers::new(a.lowers.clone(), a.upper.clone()),
            &OpenOptions::default(),
        )
        .unwrap();
        let m = b.mount();
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        for step in 0..80 {
            let op = rng.next() % 6;
            let (p, q) = (rng.pick(&PATHS), rng.pick(&PATHS));
            let content = rng.content();
            let got_lib = by_library(&lib, op, p, q, &content);
            let got_mount = by_mount(&m.path, op, p, q, &content);
            assert_eq!(
                got_lib, got_mount,
                "seed {seed} step {step}: op {op} {p} {q}: library {got_lib}, mount {got_mount}"
            );
        }
        drop(lib);
        // The union view of the unmounted workspace, through a mount of
        // it, against the mounted one's.
        let view_b = tree(&m.path);
        assert!(m.unmount());
        let ma = a.mount();
        assert_eq!(tree(&ma.path), view_b, "seed {seed}: union views differ");
        assert!(ma.unmount());
        assert_eq!(tree(&a.upper), tree(&b.upper), "seed {seed}: uppers differ");
    }
}
