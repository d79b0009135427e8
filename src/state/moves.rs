//! Moves of shared files as the change journal saw them, for `diff`'s
//! renames of files that carry no origin record: a shared file replaced
//! by an editor's atomic save (`sed -i`, most editors: a new file renamed
//! over it) and then moved is a new upper file at its new name, so the
//! upper alone shows it as added there and deleted at its old name.
//!
//! The journal is an index, not the truth: `diff` uses these moves only
//! to label a pair it found in the upper itself (an added file and a
//! deleted shared file) as one rename. With the journal off, lost or
//! behind, the pair stays `A` + `D`.
//!
//! Lineage rules, replaying the journal's successful rows in order:
//! - a name never seen continues itself (a shared file, or a file the
//!   journal did not see being made);
//! - `create`, `mkdir`, `symlink`, `link`, `mknod` give the name a new
//!   identity (none), `unlink`/`rmdir` forget it;
//! - `rename A -> B` gives B the identity of A, except when A is new and B
//!   had one: that is an atomic save, and B keeps being what it was;
//!   names below a renamed directory move with it.

use std::collections::HashMap;
use std::path::Path;

use rusqlite::Connection;

/// For each name whose lineage the journal changed: the original name it
/// continues (`None`: made new through the mount).
#[derive(Debug, Clone, Default)]
pub struct Moves {
    ids: HashMap<String, Option<String>>,
}

impl Moves {
    /// The moves recorded in the journal at `db`; empty when there is no
    /// journal or it cannot be read (diff then reports no such renames).
    pub fn from_journal(db: &Path) -> Moves {
        let rows = super::journal::open_ro(db)
            .ok()
            .and_then(|c| read_rows(&c).ok())
            .unwrap_or_default();
        Moves::replay(
            rows.iter()
                .map(|(o, p, t)| (o.as_str(), p.as_str(), t.as_deref())),
        )
    }

    /// Replays `(op, path, to)` rows, oldest first.
    pub fn replay<'a>(rows: impl Iterator<Item = (&'a str, &'a str, Option<&'a str>)>) -> Moves {
        let mut ids: HashMap<String, Option<String>> = HashMap::new();
        let id_of = |ids: &HashMap<String, Option<String>>, p: &str| -> Option<String> {
            match ids.get(p) {
                Some(id) => id.clone(),
                None => Some(p.to_string()),
            }
        };
        for (op, path, to) in rows {
            match (op, to) {
                ("create" | "mkdir" | "symlink" | "mknod", _) => {
                    ids.insert(path.to_string(), None);
                }
                // `link PATH -> TO`: TO is a new name of the object at PATH;
                // it gets the same identity (one of them may go later).
                ("link", Some(to)) => {
                    let id = id_of(&ids, path);
                    ids.insert(to.to_string(), id);
                }
                ("unlink" | "rmdir", _) => {
                    ids.insert(path.to_string(), None);
                    let prefix = format!("{path}/");
                    ids.retain(|k, _| !k.starts_with(&prefix));
                }
                ("rename", Some(to)) => {
                    let from_id = id_of(&ids, path);
                    let to_id = id_of(&ids, to);
                    let id =
                        if from_id.is_none() && to_id.is_some() && !ids_has_children(&ids, path) {
                            // An atomic save: a new file took the name's place.
                            to_id
                        } else {
                            from_id
                        };
                    // Names below a renamed directory move with it.
                    let prefix = format!("{path}/");
                    let moved: Vec<(String, Option<String>)> = ids
                        .iter()
                        .filter(|(k, _)| k.starts_with(&prefix))
                        .map(|(k, v)| (format!("{to}/{}", &k[prefix.len()..]), v.clone()))
                        .collect();
                    ids.retain(|k, _| !k.starts_with(&prefix));
                    ids.extend(moved);
                    ids.insert(path.to_string(), None);
                    ids.insert(to.to_string(), id);
                }
                _ => {}
            }
        }
        Moves { ids }
    }

    /// The shared name `path` continues, if the journal saw it move there.
    pub fn origin_of(&self, path: &str) -> Option<&str> {
        match self.ids.get(path) {
            Some(Some(id)) if id != path => Some(id),
            _ => None,
        }
    }
}

/// Whether any tracked name lies below `dir` (then `dir` was a directory).
fn ids_has_children(ids: &HashMap<String, Option<String>>, dir: &str) -> bool {
    let prefix = format!("{dir}/");
    ids.keys().any(|k| k.starts_with(&prefix))
}

type Row = (String, String, Option<String>);

fn read_rows(c: &Connection) -> rusqlite::Result<Vec<Row>> {
    let mut st = c.prepare(
        "SELECT op, path, \"to\" FROM events
         WHERE result = 'ok'
           AND op IN ('create', 'mkdir', 'symlink', 'mknod', 'link', 'unlink', 'rmdir', 'rename')
         ORDER BY id",
    )?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay(rows: &[(&'static str, &'static str, Option<&'static str>)]) -> Moves {
        Moves::replay(rows.iter().copied())
    }

    #[test]
    fn a_saved_then_moved_file_continues_its_shared_name() {
        let m = replay(&[
            ("create", "src/sedX", None),
            ("rename", "src/sedX", Some("src/main.rs")),
            ("rename", "src/main.rs", Some("src/app.rs")),
        ]);
        assert_eq!(m.origin_of("src/app.rs"), Some("src/main.rs"));
        assert_eq!(m.origin_of("src/main.rs"), None);
        assert_eq!(m.origin_of("src/sedX"), None);
    }

    #[test]
    fn a_new_file_moved_is_new_and_a_chain_keeps_the_first_name() {
        let m = replay(&[
            ("create", "n.txt", None),
            ("rename", "n.txt", Some("m.txt")),
            ("rename", "a.txt", Some("b.txt")),
            ("rename", "b.txt", Some("c.txt")),
            ("link", "k.txt", Some("k2.txt")),
            ("unlink", "k.txt", None),
        ]);
        assert_eq!(m.origin_of("m.txt"), None);
        assert_eq!(m.origin_of("c.txt"), Some("a.txt"));
        assert_eq!(m.origin_of("b.txt"), None);
        assert_eq!(m.origin_of("k2.txt"), Some("k.txt"));
    }

    #[test]
    fn names_move_with_their_directory_and_a_recreated_name_is_new() {
        let m = replay(&[
            ("mkdir", "new", None),
            ("rename", "x.txt", Some("new/x.txt")),
            ("rename", "new", Some("newer")),
            ("unlink", "y.txt", None),
            ("create", "y.txt", None),
            ("rename", "y.txt", Some("z.txt")),
        ]);
        assert_eq!(m.origin_of("newer/x.txt"), Some("x.txt"));
        assert_eq!(m.origin_of("new/x.txt"), None);
        assert_eq!(m.origin_of("z.txt"), None);
    }
}
