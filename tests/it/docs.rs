//! The documents stay true to the tree: every relative link in README.md,
//! the other top-level documents and docs/*.md points at a file that exists
//! and, for `FILE.md#anchor`, at a heading that exists; every `scripts/…`
//! they name exists; every command of README's command table is one the
//! binary knows. No mount: these read files and run `--help`.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::harness::layerfs;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, DESIGN.md, SECURITY.md, BENCHMARKS.md (the top-level
/// documents) and every docs/*.md, each with its text.
fn documents() -> Vec<(PathBuf, String)> {
    let mut docs: Vec<PathBuf> = Vec::new();
    for dir in [repo(), repo().join("docs")] {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                docs.push(path);
            }
        }
    }
    docs.sort();
    assert!(
        docs.iter().any(|p| p.ends_with("README.md")),
        "README.md not found in {}",
        repo().display()
    );
    docs.into_iter()
        .map(|p| {
            let text =
                fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
            (p, text)
        })
        .collect()
}

/// The lines of a markdown text outside fenced code blocks, with their
/// line numbers (1-based).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(f), Some(m)) if f == m => fence = None,
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// `line` without its inline code spans (a link inside backticks is text).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        match after.find(&"`".repeat(ticks)) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of the inline links `[text](target)` of a markdown text,
/// with their line numbers.
fn link_targets(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push((n, target.to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// The anchors a markdown renderer gives the headings of a text, the way
/// GitHub makes them: lower case, spaces to `-`, other punctuation than
/// `-` and `_` dropped, a repeated anchor suffixed `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let title = line[hashes..].trim().trim_end_matches('#').trim();
        let base: String = title
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let mut slug = base.clone();
        let mut k = 0;
        while seen.contains(&slug) {
            k += 1;
            slug = format!("{base}-{k}");
        }
        seen.insert(slug);
    }
    seen
}

/// What is wrong with the relative links of the document `doc` (its text
/// `text`): one line per link whose file or heading does not exist.
fn broken_links(doc: &Path, text: &str) -> Vec<String> {
    let dir = doc.parent().unwrap();
    let mut broken = Vec::new();
    for (line, target) in link_targets(text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((f, a)) => (f, Some(a)),
            None => (target.as_str(), None),
        };
        let path = if file.is_empty() {
            doc.to_path_buf()
        } else {
            dir.join(file)
        };
        let here = format!("{}:{line}: ({target})", doc.display());
        if !path.exists() {
            broken.push(format!("{here}: no file {}", path.display()));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if path.extension().is_none_or(|e| e != "md") {
            broken.push(format!(
                "{here}: an anchor into a file that is not markdown"
            ));
            continue;
        }
        let target_text = fs::read_to_string(&path).unwrap();
        if !anchors(&target_text).contains(anchor) {
            broken.push(format!(
                "{here}: {} has no heading with anchor #{anchor}",
                path.display()
            ));
        }
    }
    broken
}

#[test]
fn relative_links_in_the_documents_resolve() {
    let mut broken = Vec::new();
    let mut links = 0;
    for (doc, text) in documents() {
        links += link_targets(&text).len();
        broken.extend(broken_links(&doc, &text));
    }
    assert!(
        links > 50,
        "only {links} links found: is the parser reading the documents?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The checker itself: a missing file, a missing heading and a link inside
/// code are told apart from good links.
#[test]
fn link_checker_reports_missing_files_and_headings() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("docs")).unwrap();
    let other = dir.path().join("docs/other.md");
    fs::write(
        &other,
        "# Other\n\n## mount(8) and fstab\n\n## Notes\n\n## Notes\n\n```\n## not a heading\n```\n",
    )
    .unwrap();
    let doc = dir.path().join("README.md");
    let text = "\
# Title
## Quick start
[ok](docs/other.md) [ok](docs/other.md#mount8-and-fstab) [ok](#quick-start)
[ok](docs/other.md#notes-1) [ok](https://example.com/x#y) `[code](nowhere.md)`
[gone](docs/missing.md) [bad anchor](docs/other.md#not-a-heading)
[bad local](#nowhere) [dup](docs/other.md#notes-2)
```
[fenced](fenced-nowhere.md)
```
";
    fs::write(&doc, text).unwrap();
    let broken = broken_links(&doc, text);
    let named: Vec<&str> = broken
        .iter()
        .map(|b| {
            let open = b.find('(').unwrap();
            let close = b[open..].find(')').unwrap();
            &b[open + 1..open + close]
        })
        .collect();
    assert_eq!(
        named,
        [
            "docs/missing.md",
            "docs/other.md#not-a-heading",
            "#nowhere",
            "docs/other.md#notes-2"
        ],
        "{broken:#?}"
    );
}

/// Every `scripts/NAME` the README and docs/ name is a file of the tree.
#[test]
fn scripts_named_in_the_documents_exist() {
    let mut missing = Vec::new();
    let mut named = 0;
    for (doc, text) in documents() {
        for (n, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find("scripts/") {
                let name: String = rest[at + 8..]
                    .chars()
                    .take_while(|c| {
                        c.is_ascii_alphanumeric() || *c == '-' || *c == '_' || *c == '.'
                    })
                    .collect();
                let name = name.trim_end_matches('.');
                rest = &rest[at + 8..];
                // `scripts/pjdfstest-<target>-expected.txt` names a family.
                if name.is_empty() || rest[name.len()..].starts_with('<') {
                    continue;
                }
                named += 1;
                if !repo().join("scripts").join(name).is_file() {
                    missing.push(format!("{}:{}: scripts/{name}", doc.display(), n + 1));
                }
            }
        }
    }
    assert!(
        named > 10,
        "only {named} scripts named: is the scan reading the documents?"
    );
    assert!(
        missing.is_empty(),
        "named but missing:\n{}",
        missing.join("\n")
    );
}

/// Every `layerfs COMMAND` of README's command table is a command the
/// binary takes (`layerfs COMMAND --help` succeeds).
#[test]
fn readme_command_table_names_commands_the_binary_takes() {
    let readme = fs::read_to_string(repo().join("README.md")).unwrap();
    let mut commands: Vec<Vec<String>> = Vec::new();
    for line in readme.lines() {
        let Some(cell) = line.strip_prefix("| `layerfs ") else {
            continue;
        };
        let cell = &cell[..cell.find('`').unwrap()];
        let mut words: Vec<&str> = Vec::new();
        for word in cell.split(' ') {
            if !word.starts_with(|c: char| c.is_ascii_lowercase()) {
                break;
            }
            words.push(word);
        }
        // `snapshot save\|restore\|list\|rm`: one command each.
        let (last, first) = words.split_last().expect("a command name");
        for alt in last.split("\\|") {
            let mut cmd: Vec<String> = first.iter().map(|w| w.to_string()).collect();
            cmd.push(alt.to_string());
            commands.push(cmd);
        }
    }
    assert!(
        commands.len() >= 12,
        "command table not found: {commands:?}"
    );
    for cmd in &commands {
        let mut args = cmd.clone();
        args.push("--help".into());
        let out = layerfs(&args);
        assert!(
            out.status.success(),
            "layerfs {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// README's first command, `scripts/demo`, as written (with the suite's
/// binary instead of a build): its `--help` is a usage text, not script
/// lines; a full run shows the policy at work, then `status`, `diff`,
/// `log` and a snapshot save / reset / restore round trip, and with
/// `--cleanup` leaves no mount.
#[test]
fn scripts_demo_runs_as_the_readme_says() {
    let demo = repo().join("scripts/demo");
    let help = std::process::Command::new(&demo)
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success(), "{help:?}");
    assert!(text.starts_with("Usage: scripts/demo"), "{text}");
    assert!(
        !text.contains("set -e") && !text.contains("#!"),
        "--help shows script lines:\n{text}"
    );

    let dir = tempfile::Builder::new()
        .prefix("layerfs-demo-test.")
        .tempdir_in(crate::harness::test_root())
        .unwrap();
    let out = std::process::Command::new(&demo)
        .arg("--cleanup")
        .arg(dir.path())
        .env("LAYERFS_BIN", crate::harness::bin())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let mnt = dir.path().join("mnt");
    if crate::harness::is_mounted(&mnt) {
        let _ = std::process::Command::new(crate::harness::bin())
            .arg("umount")
            .arg(&mnt)
            .status();
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    for needle in [
        "status mnt",
        "pid ",
        "diff mnt",
        "A scratch.txt",
        "M knowledge/glossary.md",
        "snapshot save mnt before-reset",
        "reset mnt scratch.txt",
        "snapshot restore mnt before-reset",
        "notes for today",
        "log mnt",
        "Unmounted.",
    ] {
        assert!(
            text.contains(needle),
            "demo output lacks {needle:?}:\n{text}"
        );
    }
    let log = text.split("log mnt").nth(1).unwrap_or("");
    for op in ["reset", "snapshot"] {
        assert!(log.contains(op), "log shows no {op} row:\n{log}");
    }
    assert!(!text.contains("UNEXPECTED"), "{text}");
}

/// The fenced block after the heading `heading` in README.md.
fn readme_block_after(heading: &str) -> String {
    let text = fs::read_to_string(repo().join("README.md")).unwrap();
    let after = text
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("README.md has no heading {heading:?}"))
        .1;
    let body = after.split_once("```sh\n").expect("no ```sh block").1;
    body.split_once("\n```")
        .expect("an open block")
        .0
        .to_string()
}

/// Unmounts, when dropped, whatever is still mounted under a directory.
struct Mounts(PathBuf);

impl Drop for Mounts {
    fn drop(&mut self) {
        let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
        let root = self.0.to_string_lossy().into_owned();
        for m in mounts.lines().filter_map(|l| l.split(' ').nth(1)) {
            if m.starts_with(&root) {
                let _ = std::process::Command::new(crate::harness::bin())
                    .arg("umount")
                    .arg(m)
                    .status();
            }
        }
    }
}

/// README's best-of-N example, run as written (its directory moved into
/// the test's): four forks of one checkpoint, each with its own answer,
/// each diff against the checkpoint, the winner applied back into the
/// workspace, and no mount left.
#[test]
fn readme_best_of_n_runs_as_written() {
    let script = readme_block_after("### Best of N: branch, compare, keep the winner");
    assert!(script.contains("B=/tmp/bon;"), "{script}");
    let dir = tempfile::Builder::new()
        .prefix("layerfs-bon-test.")
        .tempdir_in(crate::harness::test_root())
        .unwrap();
    let bon = dir.path().join("bon");
    let _mounts = Mounts(bon.clone());
    let bin_dir = dir.path().join("bin");
    fs::create_dir(&bin_dir).unwrap();
    std::os::unix::fs::symlink(crate::harness::bin(), bin_dir.join("layerfs")).unwrap();
    let script = script.replace("B=/tmp/bon;", &format!("B={};", bon.display()));
    let out = std::process::Command::new("bash")
        .arg("-e")
        .arg("-c")
        .arg(&script)
        .current_dir(repo())
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin_dir.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script}\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.contains(&"start"), "{stdout}");
    assert_eq!(
        lines.iter().filter(|l| **l == "A answer.txt").count(),
        4,
        "{stdout}"
    );
    assert!(lines.contains(&"attempt 3"), "{stdout}");
    assert_eq!(
        fs::read_to_string(bon.join("ws/upper/answer.txt")).unwrap(),
        "attempt 3\n",
        "the winner's change is not in the workspace's upper"
    );
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    assert!(
        !mounts.contains(&bon.to_string_lossy().into_owned()),
        "the example left a mount"
    );
}
