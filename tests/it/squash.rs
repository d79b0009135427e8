//! `layerfs squash` over a workspace whose upper holds changes (DESIGN.md
//! §5, "Origin records name their layer"), through real mounts: the tree,
//! `diff` (renames found by origin records, drift of a shared original)
//! and kernel overlayfs over the new stack show what they showed before,
//! on an unmounted workspace and on a live mount; `reset` of a moved file
//! puts it back; `undo --to` a merged checkpoint is refused; records of an older layerfs (an index into the
//! stack) make a squash refuse until a checkpoint takes them.

use std::fs;
use std::path::Path;

use crate::checkpoint::{
    assert_kernel_shows, assert_old_or_squashed, assert_same, assert_squash_finishes, checkpoints,
    crash_at, ok, refused, stack_of, view_of,
};
use crate::crash::tree_view;
use crate::harness::*;

/// The changes the upper holds over checkpoints c1, c2, c3: a created
/// file, an edited shared file (`a`), files copied up from checkpoint c1
/// and renamed (`f1`, c1's own; `d/x`, a shared file c1 edited), a deleted
/// shared file, an edited shared file (`s`) whose original is changed
/// after the copy-up by the caller.
const CHANGES: &str = "echo created > new && echo edited >> a && mv f1 f1moved \
                       && mv d/x d/y && rm gone && echo mine >> s";

/// A workspace on checkpoints c1, c2, c3 (each a few files) over a shared
/// tree, and its view at c3.
fn on_checkpoints() -> (Workspace, std::collections::BTreeMap<String, String>) {
    let ws = Workspace::new();
    populate(
        ws.lower(),
        &[
            ("a", "a\n"),
            ("gone", "gone\n"),
            ("s", "s\n"),
            ("d/x", "x\n"),
            ("keep", "k\n"),
        ],
    );
    let at_c3 = checkpoints(
        &ws,
        &[
            ("c1", "echo f1 > f1 && echo c1 >> d/x"),
            ("c2", "echo f2 > f2"),
            ("c3", "echo f3 > f3"),
        ],
    );
    (ws, at_c3)
}

/// Makes `CHANGES` in the unmounted workspace `ws` (no journal: moves are
/// found by origin records only), then updates the shared original of
/// `s`; returns the view and the diff (checked: `assert_changes`).
fn changed(ws: &Workspace) -> (std::collections::BTreeMap<String, String>, (String, String)) {
    let m = ws.mount_with(&["--no-journal"]);
    sh(m.path(), CHANGES);
    assert!(m.unmount());
    // An administrator updates a shared original after its copy-up.
    fs::write(ws.lower().join("s"), "s, updated upstream\n").unwrap();
    let diff = diffs(&ws.upper);
    assert_changes(&diff.0);
    (view_of(ws), diff)
}

/// The diff of the workspace at `at` (its upper or its mountpoint), as
/// text and as JSON.
fn diffs(at: &Path) -> (String, String) {
    (ok(&[&"diff", &at]), ok(&[&"diff", &"--json", &at]))
}

/// The name `layerfs squash` printed.
fn squashed_name(out: &str) -> String {
    out.split_whitespace().next().unwrap().to_string()
}

/// The changes of `CHANGES`, as `diff` shows them with `s` drifted: moves
/// found by their origin records (the mounts that made them kept no
/// journal), the drift of `s` marked, nothing else.
fn assert_changes(text: &str) {
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "A new",
            "D gone",
            "M a",
            "M s (conflict)",
            "R d/x -> d/y",
            "R f1 -> f1moved",
        ],
        "{text}"
    );
}

#[test]
fn a_squash_over_changes_keeps_the_tree_and_diff_and_kernel_overlay_agrees() {
    let (ws, at_c3) = on_checkpoints();
    let (view, (text, json)) = changed(&ws);

    let out = ok(&[&"squash", &ws.upper]);
    assert!(out.contains("merged 3 checkpoints"), "{out}");
    let name = squashed_name(&out);
    assert_eq!(stack_of(&ws), std::slice::from_ref(&name));
    assert!(
        ws.upper.join("new").is_file() && ws.upper.join("f1moved").is_file(),
        "the squash moved the upper's changes"
    );
    assert_same(&view, &view_of(&ws), "layerfs after the squash");
    assert_eq!(
        diffs(&ws.upper),
        (text.clone(), json),
        "diff after the squash"
    );
    assert_kernel_shows(
        &ws,
        &[&name],
        &view,
        "kernel overlayfs over the squashed layer and the upper",
    );

    // A merged checkpoint is gone: undo --to it changes nothing.
    let e = refused(&[&"undo", &ws.upper, &"--to", &"c1"]);
    assert!(
        e.contains("stands on no checkpoint c1") && e.contains(&name),
        "{e}"
    );
    assert_eq!(diffs(&ws.upper).0, text, "a refused undo changed the upper");
    // A reset of the file moved out of a merged checkpoint puts it back
    // where its record says it was.
    ok(&[&"reset", &ws.upper, &"f1moved"]);
    let back = view_of(&ws);
    assert!(
        back.contains_key("f1") && !back.contains_key("f1moved"),
        "{back:?}"
    );
    assert!(!ok(&[&"diff", &ws.upper]).contains("f1"));
    // The squashed layer is the state at c3, the newest it merged (but
    // for `s`, whose shared original was updated since).
    assert_eq!(
        ok(&[&"undo", &ws.upper, &"--to", &name]).trim(),
        format!("at {name}")
    );
    let (mut want, mut back) = (at_c3, view_of(&ws));
    assert!(want.remove("s").is_some() && back.remove("s").is_some());
    assert_same(&want, &back, "undo --to the squashed layer");
    assert_eq!(ok(&[&"diff", &ws.upper]), "", "changes left after the undo");
}

#[test]
fn a_live_squash_over_changes_keeps_the_view_and_diff_and_squashes_again() {
    let (ws, _) = on_checkpoints();
    let m = ws.mount_with(&["--no-journal"]);
    sh(m.path(), CHANGES);
    fs::write(ws.lower().join("s"), "s, updated upstream\n").unwrap();
    let view = tree_view(m.path());
    let (text, json) = diffs(m.path());
    assert_changes(&text);

    // The two oldest merged, c3 kept: every layer below c3 moves up.
    let out = ok(&[&"squash", &m.path(), &"--keep", &"1"]);
    assert!(out.contains("merged 2 checkpoints"), "{out}");
    let first = squashed_name(&out);
    assert_eq!(stack_of(&ws), ["c3".to_string(), first.clone()]);
    assert_same(
        &view,
        &tree_view(m.path()),
        "the live mount after the squash",
    );
    assert_eq!(diffs(m.path()), (text, json), "diff after squash --keep 1");

    // The mount goes on: copy-ups from the squashed layer and from the
    // kept one, then a squash of both (c1 lives on in the second one).
    sh(
        m.path(),
        "echo more >> f2 && echo more >> f3 && mv f2 f2moved",
    );
    let view = tree_view(m.path());
    let (text, json) = diffs(m.path());
    for line in [
        "M f3",
        "R f2 -> f2moved",
        "R f1 -> f1moved",
        "M s (conflict)",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in {text}");
    }
    let out = ok(&[&"squash", &m.path()]);
    let second = squashed_name(&out);
    assert!(out.contains(&format!("c3, {first}")), "{out}");
    assert_eq!(stack_of(&ws), std::slice::from_ref(&second));
    assert_same(
        &view,
        &tree_view(m.path()),
        "the live mount after a second squash",
    );
    assert_eq!(
        diffs(m.path()),
        (text.clone(), json.clone()),
        "diff after the second squash"
    );
    assert!(m.unmount());

    assert_same(&view, &view_of(&ws), "a remount after the live squashes");
    assert_eq!(
        diffs(&ws.upper),
        (text, json),
        "diff of the unmounted workspace"
    );
    assert_kernel_shows(
        &ws,
        &[&second],
        &view,
        "kernel overlayfs over the squashed layer and the upper",
    );
}

#[test]
fn a_crash_at_any_step_of_a_squash_over_changes_leaves_the_view_and_diff_as_they_were() {
    for step in ["built", "layer", "records", "stack", "remove"] {
        let (ws, _) = on_checkpoints();
        let (view, diff) = changed(&ws);
        crash_at("squash", step, &[&"squash", &ws.upper]);
        assert_old_or_squashed(&ws, &["c3", "c2", "c1"], &format!("crash at {step}"));
        assert_same(&view, &view_of(&ws), &format!("squash crashed at {step}"));
        assert_eq!(diffs(&ws.upper), diff, "diff after a crash at {step}");
        // The next squash finishes or redoes it.
        assert_squash_finishes(&ws, &view, &format!("crash at {step}"));
        assert_eq!(
            diffs(&ws.upper),
            diff,
            "diff after a squash after a crash at {step}"
        );
    }
}

/// The origin record of `file` with its layer named by index, as a
/// layerfs from before names wrote it.
fn make_indexed(file: &Path) {
    let name = "trusted.overlay.layerfs.origin";
    let got = std::process::Command::new("getfattr")
        .args(["--only-values", "-n", name])
        .arg(file)
        .output()
        .unwrap();
    let rec = String::from_utf8(got.stdout).unwrap();
    assert!(rec.starts_with("v2 s:0 "), "{file:?}: {rec:?}");
    let v1 = rec.replacen("v2 s:0 ", "v1 3 ", 1);
    let hex: String = v1.bytes().map(|b| format!("{b:02x}")).collect();
    let set = std::process::Command::new("setfattr")
        .args(["-n", name, "-v", &format!("0x{hex}")])
        .arg(file)
        .status()
        .unwrap();
    assert!(set.success());
}

#[test]
fn a_squash_is_refused_over_records_of_an_older_layerfs_until_a_checkpoint() {
    let (ws, _) = on_checkpoints();
    let m = ws.mount();
    sh(
        m.path(),
        "echo edited >> a && mkdir -p deep/er && echo new > deep/er/n",
    );
    assert!(m.unmount());
    make_indexed(&ws.upper.join("a"));
    let view = view_of(&ws);
    let e = refused(&[&"squash", &ws.upper]);
    assert!(
        e.contains("copied up by an older layerfs (a and maybe more)")
            && e.contains("take a checkpoint first"),
        "{e}"
    );
    // Live, the same.
    let m = ws.mount();
    let e = refused(&[&"squash", &m.path()]);
    assert!(e.contains("older layerfs"), "{e}");
    assert!(m.unmount());
    assert_eq!(stack_of(&ws), ["c3", "c2", "c1"]);
    assert_same(&view, &view_of(&ws), "after the refused squashes");
    // A checkpoint takes the record into a layer: the squash goes ahead.
    ok(&[&"checkpoint", &ws.upper, &"c4"]);
    let out = ok(&[&"squash", &ws.upper]);
    assert!(out.contains("merged 4 checkpoints"), "{out}");
    assert_same(&view, &view_of(&ws), "after the squash");
}

#[test]
fn a_squash_searches_again_an_upper_put_in_the_place_of_the_one_it_searched() {
    let (ws, _) = on_checkpoints();
    let out = ok(&[&"squash", &ws.upper, &"--keep", &"1"]);
    assert!(out.contains("merged 2 checkpoints"), "{out}");
    let m = ws.mount();
    sh(m.path(), "echo edited >> a");
    assert!(m.unmount());
    // Other directories take the upper's place, as restores do, until
    // the filesystem gives one the first upper's inode number (ext4 hands
    // out the lowest free one; the ones below it are held meanwhile).
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
    let first = ino(&ws.upper);
    let aside = ws.dir.path().join("aside");
    fs::create_dir(&aside).unwrap();
    let swap = |k: usize| {
        let old = aside.join(k.to_string());
        fs::rename(&ws.upper, &old).unwrap();
        fs::create_dir(&ws.upper).unwrap();
        fs::rename(old.join("a"), ws.upper.join("a")).unwrap();
        old
    };
    fs::remove_dir(swap(0)).unwrap();
    let mut k = 1;
    while ino(&ws.upper) != first && k < 5000 {
        swap(k);
        k += 1;
    }
    eprintln!(
        "upper inode first {first}, now {} after {k} swaps",
        ino(&ws.upper)
    );
    make_indexed(&ws.upper.join("a"));
    let e = refused(&[&"squash", &ws.upper]);
    assert!(e.contains("older layerfs (a and maybe more)"), "{e}");
}
