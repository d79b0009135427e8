//! Object identity when the upper filesystem recycles inode numbers: a
//! removed upper file's inode number goes to the next file created, and no
//! object seen through the mount may take over another's identity (node
//! id, `st_ino`, cached attributes or pages) because of it.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::harness::*;

/// Distinct content for shared file `i`, 116 bytes and more.
fn shared_text(i: usize) -> String {
    format!("shared file {i}: {}\n", "glossary entry ".repeat(7 + i % 5))
}

fn upper_ino(ws: &Workspace, rel: &str) -> Option<u64> {
    fs::symlink_metadata(ws.upper.join(rel))
        .ok()
        .map(|m| m.ino())
}

/// The report of the user who found it: edit a protected shared file,
/// remove the edited copy (revert), create a new file that reuses the freed
/// inode number: the shared file must show its own text again.
#[test]
fn reverted_shared_file_keeps_its_own_content_when_a_new_file_reuses_the_inode() {
    let ws = Workspace::new();
    fs::create_dir(ws.lower().join("knowledge")).unwrap();
    let shared = shared_text(0);
    fs::write(ws.lower().join("knowledge/glossary.md"), &shared).unwrap();
    fs::create_dir(ws.lower().join("scratch")).unwrap();
    for i in 0..20 {
        fs::write(ws.lower().join(format!("scratch/t{i}")), "lower\n").unwrap();
    }
    let m = ws.mount_with(&[
        "--policy",
        policy_file(&ws, "protect knowledge/**\n").to_str().unwrap(),
    ]);
    let g = m.p("knowledge/glossary.md");
    let mut recycled = 0;
    for round in 0..20 {
        sh(m.path(), "echo more >> knowledge/glossary.md");
        let copy_ino = upper_ino(&ws, "knowledge/glossary.md").expect("copied up");
        fs::remove_file(&g).unwrap();
        assert_eq!(
            fs::read_to_string(&g).unwrap(),
            shared,
            "round {round}: reverted"
        );
        let new = m.p(&format!("knowledge/new{round}.md"));
        fs::write(&new, format!("new {round}\n")).unwrap();
        // A name created over a whiteout is built in the work dir, where
        // the copy was made: the likeliest place for its inode number.
        let again = format!("scratch/t{round}");
        fs::remove_file(m.p(&again)).unwrap();
        fs::write(m.p(&again), format!("again {round}\n")).unwrap();
        for rel in [format!("knowledge/new{round}.md"), again.clone()] {
            if upper_ino(&ws, &rel) == Some(copy_ino) {
                recycled += 1;
            }
        }
        assert_eq!(
            fs::read_to_string(m.p(&again)).unwrap(),
            format!("again {round}\n")
        );
        assert_ne!(
            fs::metadata(&g).unwrap().ino(),
            fs::metadata(m.p(&again)).unwrap().ino(),
            "round {round}: two objects share st_ino"
        );
        assert_eq!(
            fs::read_to_string(&g).unwrap(),
            shared,
            "round {round}: after create"
        );
        assert_eq!(fs::metadata(&g).unwrap().len(), shared.len() as u64);
        assert_eq!(fs::read_to_string(&new).unwrap(), format!("new {round}\n"));
        assert_ne!(
            fs::metadata(&g).unwrap().ino(),
            fs::metadata(&new).unwrap().ino(),
            "round {round}: two objects share st_ino"
        );
        fs::remove_file(&new).unwrap();
        assert_eq!(
            fs::read_to_string(&g).unwrap(),
            shared,
            "round {round}: after rm"
        );
    }
    // git indexes by size and content: a short read shows up here.
    sh(
        m.path(),
        "git init -q . && git add -A && git -c user.name=t -c user.email=t@t commit -qm x && git status --porcelain",
    );
    assert!(
        recycled > 0,
        "the upper never recycled an inode number: the test proved nothing"
    );
}

/// Many create/unlink cycles with reverts and whiteouts in between, in a
/// lower directory and in a new one, every file checked by content and
/// every pair of live names checked for distinct `st_ino`.
#[test]
fn recycled_inode_numbers_never_mix_objects() {
    let ws = Workspace::new();
    let shared_dir = ws.lower().join("kb");
    fs::create_dir(&shared_dir).unwrap();
    const SHARED: usize = 12;
    for i in 0..SHARED {
        fs::write(shared_dir.join(format!("s{i}")), shared_text(i)).unwrap();
        fs::write(shared_dir.join(format!("u{i}")), "unprotected\n").unwrap();
    }
    let m = ws.mount_with(&[
        "--policy",
        policy_file(&ws, "protect kb/s*\n").to_str().unwrap(),
    ]);
    fs::create_dir(m.p("fresh")).unwrap();
    // What each visible path must contain.
    let mut want: HashMap<String, String> = (0..SHARED)
        .flat_map(|i| {
            [
                (format!("kb/s{i}"), shared_text(i)),
                (format!("kb/u{i}"), "unprotected\n".to_string()),
            ]
        })
        .collect();
    let mut freed: HashSet<u64> = HashSet::new();
    let mut recycled = 0;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for step in 0..400 {
        let r = next();
        let i = (r % SHARED as u64) as usize;
        let dir = if r & 1 == 0 { "kb" } else { "fresh" };
        match (r >> 8) % 5 {
            // Remove an unprotected shared file and create it again: the
            // new file is built in the work dir, over the whiteout.
            4 => {
                let rel = format!("kb/u{i}");
                if let Some(ino) = upper_ino(&ws, &rel) {
                    freed.insert(ino);
                }
                fs::remove_file(m.p(&rel)).unwrap();
                let text = format!("again {step}\n");
                fs::write(m.p(&rel), &text).unwrap();
                if upper_ino(&ws, &rel).is_some_and(|ino| freed.remove(&ino)) {
                    recycled += 1;
                }
                want.insert(rel, text);
            }
            // Edit a shared file (copy-up) or revert it (remove the copy).
            0 => {
                let rel = format!("kb/s{i}");
                if want[&rel] == shared_text(i) {
                    let text = format!("{}edit {step}\n", shared_text(i));
                    fs::write(m.p(&rel), &text).unwrap();
                    want.insert(rel, text);
                } else {
                    if let Some(ino) = upper_ino(&ws, &rel) {
                        freed.insert(ino);
                    }
                    fs::remove_file(m.p(&rel)).unwrap();
                    want.insert(rel, shared_text(i));
                }
            }
            // Create a new file.
            1 | 2 => {
                let rel = format!("{dir}/n{step}");
                let text = format!("new file {step}\n");
                fs::write(m.p(&rel), &text).unwrap();
                if upper_ino(&ws, &rel).is_some_and(|ino| freed.remove(&ino)) {
                    recycled += 1;
                }
                want.insert(rel, text);
            }
            // Remove a new file.
            _ => {
                let victim = want.keys().find(|k| k.contains("/n")).cloned();
                if let Some(rel) = victim {
                    if let Some(ino) = upper_ino(&ws, &rel) {
                        freed.insert(ino);
                    }
                    fs::remove_file(m.p(&rel)).unwrap();
                    want.remove(&rel);
                }
            }
        }
        if step % 20 == 19 {
            check_view(m.path(), &want, step);
        }
    }
    check_view(m.path(), &want, 400);
    assert!(
        recycled > 0,
        "no inode number was recycled: the test proved nothing"
    );
}

fn check_view(root: &Path, want: &HashMap<String, String>, step: usize) {
    let mut inos: HashMap<u64, &str> = HashMap::new();
    for (rel, text) in want {
        let p = root.join(rel);
        let got = fs::read_to_string(&p).unwrap_or_else(|e| panic!("step {step}: read {rel}: {e}"));
        assert_eq!(&got, text, "step {step}: content of {rel}");
        let md = fs::metadata(&p).unwrap();
        assert_eq!(md.len(), text.len() as u64, "step {step}: size of {rel}");
        if let Some(other) = inos.insert(md.ino(), rel) {
            panic!("step {step}: {rel} and {other} share st_ino {}", md.ino());
        }
    }
    for dir in ["kb", "fresh"] {
        let listed: HashSet<String> = fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| format!("{dir}/{}", e.unwrap().file_name().to_string_lossy()))
            .collect();
        let expected: HashSet<String> = want
            .keys()
            .filter(|k| k.starts_with(&format!("{dir}/")))
            .cloned()
            .collect();
        assert_eq!(listed, expected, "step {step}: listing of {dir}");
    }
}

/// The kernel still holds a removed file (an `O_PATH` descriptor keeps its
/// inode) while the daemon's small fd cache lets go of most real files: as
/// on a local filesystem the held file keeps its attributes (nlink 0), its
/// inode number is not recycled meanwhile, and new files are new objects.
#[test]
fn a_held_removed_file_stays_itself() {
    let ws = Workspace::new();
    fs::create_dir(ws.lower().join("d")).unwrap();
    for round in 0..10 {
        fs::write(
            ws.lower().join(format!("d/shared{round}")),
            format!("shared {round}\n"),
        )
        .unwrap();
    }
    // A tiny fd cache: the daemon reopens real files by handle.
    let m = ws.mount_env(&[], &[("LAYERFS_FD_CACHE", "64")]);
    let mut held = Vec::new();
    for round in 0..20 {
        let dir = if round % 2 == 0 { "d" } else { "." };
        // A new upper file, or (odd rounds) a copied-up shared one.
        let name = if round % 4 == 1 {
            format!("d/shared{}", round / 2)
        } else {
            format!("{dir}/old{round}")
        };
        let old = m.p(&name);
        fs::write(&old, format!("old {round}\n")).unwrap();
        let handle = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(&old)
            .unwrap();
        let old_st_ino = handle.metadata().unwrap().ino();
        let old_ino_upper = upper_ino(&ws, &name).unwrap();
        fs::remove_file(&old).unwrap();
        // Touch other files so the removed file's fd would leave the cache.
        for k in 0..80 {
            fs::write(m.p(&format!("{dir}/filler{k}")), "x").unwrap();
        }
        let new = m.p(&format!("{dir}/new{round}"));
        fs::write(&new, format!("new {round}\n")).unwrap();
        assert_ne!(
            upper_ino(&ws, &format!("{dir}/new{round}")),
            Some(old_ino_upper)
        );
        let new_md = fs::metadata(&new).unwrap();
        assert_ne!(
            new_md.ino(),
            old_st_ino,
            "round {round}: the new file took the held file's id"
        );
        assert_eq!(fs::read_to_string(&new).unwrap(), format!("new {round}\n"));
        let held_md = handle
            .metadata()
            .unwrap_or_else(|e| panic!("round {round}: fstat of a held removed file: {e}"));
        assert_eq!(
            held_md.ino(),
            old_st_ino,
            "round {round}: held file changed identity"
        );
        assert_eq!(
            held_md.nlink(),
            0,
            "round {round}: held file shows a live file's links"
        );
        assert_eq!(held_md.len(), format!("old {round}\n").len() as u64);
        held.push(handle);
        for k in 0..80 {
            fs::remove_file(m.p(&format!("{dir}/filler{k}"))).unwrap();
        }
    }
}

/// A lower file is removed from outside while the kernel holds it, and the
/// lower filesystem gives its inode number to a file created next to it:
/// through the mount the new file is a new object, and the held one never
/// shows the new file's attributes.
#[test]
fn a_lower_inode_number_recycled_from_outside_gives_a_new_object() {
    let ws = Workspace::new();
    let d = ws.lower().join("d");
    fs::create_dir(&d).unwrap();
    let m = ws.mount_env(&[], &[("LAYERFS_FD_CACHE", "64")]);
    let mut recycled = 0;
    let mut held = Vec::new();
    for round in 0..20 {
        let old_text = format!("old lower file {round}\n");
        fs::write(d.join(format!("old{round}")), &old_text).unwrap();
        let old = m.p(&format!("d/old{round}"));
        let handle = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(&old)
            .unwrap();
        let old_md = handle.metadata().unwrap();
        let old_lower_ino = fs::metadata(d.join(format!("old{round}"))).unwrap().ino();
        for k in 0..80 {
            fs::write(m.p(&format!("filler{k}")), "x").unwrap();
        }
        fs::remove_file(d.join(format!("old{round}"))).unwrap();
        let new_text = format!("new {round}\n");
        fs::write(d.join(format!("new{round}")), &new_text).unwrap();
        if fs::metadata(d.join(format!("new{round}"))).unwrap().ino() == old_lower_ino {
            recycled += 1;
        }
        let new = m.p(&format!("d/new{round}"));
        assert!(
            eventually(std::time::Duration::from_secs(5), || new.exists()),
            "round {round}: new lower file never showed"
        );
        assert_eq!(fs::read_to_string(&new).unwrap(), new_text);
        assert_ne!(
            fs::metadata(&new).unwrap().ino(),
            old_md.ino(),
            "round {round}: shared id"
        );
        // The removed lower file is gone for good (the daemon cannot open
        // it again: ESTALE), but it never turns into the new file.
        match handle.metadata() {
            Ok(md) => {
                assert_eq!(md.ino(), old_md.ino(), "round {round}");
                assert_eq!(md.len(), old_text.len() as u64, "round {round}");
            }
            Err(e) => assert_eq!(errno(&e), libc::ESTALE, "round {round}: {e}"),
        }
        held.push(handle);
        for k in 0..80 {
            fs::remove_file(m.p(&format!("filler{k}"))).unwrap();
        }
    }
    assert!(
        recycled > 0,
        "no lower inode number was recycled: the test proved nothing"
    );
}
