//! The layering written at the top of `src/lib.rs` holds in the sources:
//! no file uses a room on its own floor or above. The list in lib.rs is the
//! rule; this test reads it and every file under `src/` (it mounts nothing).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The floors from lib.rs's numbered list (`//! 3. \`policy\`: ...`): each
/// room named in backquotes before the first colon, mapped to its floor.
fn floors(lib: &str) -> BTreeMap<String, usize> {
    let mut floors = BTreeMap::new();
    for line in lib.lines() {
        let Some(rest) = line.strip_prefix("//! ") else {
            continue;
        };
        let Some((num, rest)) = rest.split_once(". ") else {
            continue;
        };
        let Ok(floor) = num.parse::<usize>() else {
            continue;
        };
        let names = rest.split(':').next().unwrap_or("");
        for (i, part) in names.split('`').enumerate() {
            if i % 2 == 1 {
                floors.insert(part.to_string(), floor);
            }
        }
    }
    floors
}

/// Every `pub mod` (or `mod`) declared at the top of lib.rs.
fn declared_rooms(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            l.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(str::to_string)
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file below `src/` (`state/diff.rs` → `[state,
/// diff]`, `state/mod.rs` → `[state]`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first names of a `{a::b, c, d::{e, f}}` group (the text after `{`):
/// `[a, c, d]`.
fn group_heads(s: &str) -> Vec<&str> {
    let mut heads = vec![];
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                heads.push(ident_at(s[start..i].trim_start()));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                heads.push(ident_at(s[start..i].trim_start()));
                start = i + 1;
            }
            _ => {}
        }
    }
    heads.retain(|h| !h.is_empty());
    heads
}

/// The crate rooms a file's code names: `crate::x`, `crate::{x, y}` and
/// `super::` chains that climb to the crate root. Line comments are left out
/// (doc text may name any room).
fn rooms_used(text: &str, module: &[String]) -> Vec<(String, String)> {
    let mut used = vec![];
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        for (at, _) in code.match_indices("crate::") {
            let before = &code[..at];
            if before.ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let after = &code[at + "crate::".len()..];
            if let Some(group) = after.strip_prefix('{') {
                for head in group_heads(group) {
                    used.push((head.to_string(), line.trim().to_string()));
                }
            } else {
                used.push((ident_at(after).to_string(), line.trim().to_string()));
            }
        }
        for (at, _) in code.match_indices("super::") {
            let before = &code[..at];
            if before.ends_with("super::")
                || before.ends_with(|c: char| c.is_alphanumeric() || c == '_')
            {
                continue;
            }
            let mut rest = &code[at..];
            let mut depth = module.len();
            while let Some(r) = rest.strip_prefix("super::") {
                rest = r;
                depth = depth.saturating_sub(1);
            }
            if depth == 0 {
                used.push((ident_at(rest).to_string(), line.trim().to_string()));
            }
        }
    }
    used
}

#[test]
fn imports_point_down_the_floors_written_in_lib_rs() {
    let lib = fs::read_to_string(src().join("lib.rs")).unwrap();
    let floors = floors(&lib);
    assert!(
        floors.len() >= 10,
        "lib.rs's numbered list of rooms was not found: {floors:?}"
    );

    let mut errors = vec![];
    for room in declared_rooms(&lib) {
        if !floors.contains_key(&room) {
            errors.push(format!(
                "src/lib.rs declares `mod {room}` but its layering list places it on no floor"
            ));
        }
    }

    let mut files = vec![];
    rust_files(&src(), &mut files);
    files.sort();
    let mut checked = 0;
    for file in &files {
        let rel = file.strip_prefix(src()).unwrap();
        if rel == Path::new("lib.rs") || rel == Path::new("main.rs") {
            continue;
        }
        let module = module_path(rel);
        let room = &module[0];
        let Some(&floor) = floors.get(room) else {
            errors.push(format!(
                "src/{}: room `{room}` is on no floor of lib.rs's list",
                rel.display()
            ));
            continue;
        };
        checked += 1;
        let text = fs::read_to_string(file).unwrap();
        for (used, line) in rooms_used(&text, &module) {
            if &used == room || used == "self" {
                continue;
            }
            let Some(&used_floor) = floors.get(&used) else {
                continue; // an item of lib.rs itself, not a room
            };
            if used_floor >= floor {
                errors.push(format!(
                    "src/{}: `{line}` uses `{used}` (floor {used_floor}) from `{room}` \
                     (floor {floor}); a room may use only the floors below its own",
                    rel.display()
                ));
            }
        }
    }
    assert!(checked > 100, "only {checked} source files were read");
    assert!(errors.is_empty(), "layering broken:\n{}", errors.join("\n"));
}

#[test]
fn the_reader_sees_each_form_of_import() {
    let module = vec!["overlay".to_string(), "dir".to_string()];
    let text = "use crate::layer::ops;\n\
                use crate::{policy::Rules, fuse, state::{diff, reset}};\n\
                fn f() { super::super::daemon::run(); super::inode::x(); }\n\
                // crate::cli in a comment\n\
                let s = \"x\"; // crate::run\n";
    let used: Vec<String> = rooms_used(text, &module)
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    assert_eq!(used, ["layer", "policy", "fuse", "state", "daemon"]);
}
