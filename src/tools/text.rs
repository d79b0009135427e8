//! What the tools decide about text, on bytes already read: whether a
//! file is text, the numbered-line format of `read`, and `edit`'s
//! replacement with its count rule. Pure functions, no I/O.

use super::error::What;

/// Bytes looked at to tell a binary file (a NUL among them) from text.
const SNIFF: usize = 8192;

/// The text of a file, or `None` when it is binary: a NUL byte in its
/// first 8 KiB, or not valid UTF-8.
pub fn as_text(data: &[u8]) -> Option<&str> {
    if data[..data.len().min(SNIFF)].contains(&0) {
        return None;
    }
    std::str::from_utf8(data).ok()
}

/// Lines `offset..offset+limit` of `text` (0-based: `offset` lines are
/// skipped), each as its 1-based number right-aligned in six columns, a
/// tab and the line (`     1\tfirst line`), joined by newlines. Returns
/// the numbered text, the lines shown and the file's total lines.
pub fn numbered(text: &str, offset: usize, limit: usize) -> (String, usize, usize) {
    let mut out = String::new();
    let mut shown = 0;
    let mut total = 0;
    for (i, line) in text.lines().enumerate() {
        total = i + 1;
        if i < offset || shown >= limit {
            continue;
        }
        if shown > 0 {
            out.push('\n');
        }
        out.push_str(&format!("{:>6}\t{line}", i + 1));
        shown += 1;
    }
    (out, shown, total)
}

/// `text` with `old` replaced by `new`: exactly one occurrence unless
/// `all` (then at least one). Errors say how many occurrences there were.
pub fn replace(text: &str, old: &str, new: &str, all: bool) -> Result<(String, usize), What> {
    if old.is_empty() {
        return Err(What::BadEdit("old_string is empty"));
    }
    if old == new {
        return Err(What::BadEdit("old_string and new_string are the same"));
    }
    let n = text.matches(old).count();
    match (n, all) {
        (0, _) => Err(What::Matches(0)),
        (1, _) | (_, true) => Ok((text.replace(old, new), n)),
        (n, false) => Err(What::Matches(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbering_is_right_aligned_and_windowed() {
        let (t, shown, total) = numbered("a\nb\nc\n", 1, 1);
        assert_eq!(t, "     2\tb");
        assert_eq!((shown, total), (1, 3));
        let (t, _, _) = numbered("x", 0, 10);
        assert_eq!(t, "     1\tx");
    }

    #[test]
    fn edit_needs_exactly_one_match_unless_all() {
        assert_eq!(replace("a b a", "a", "c", false), Err(What::Matches(2)));
        assert_eq!(replace("a b a", "z", "c", false), Err(What::Matches(0)));
        assert_eq!(replace("a b a", "b", "c", false).unwrap().0, "a c a");
        assert_eq!(
            replace("a b a", "a", "c", true).unwrap(),
            ("c b c".into(), 2)
        );
        assert!(matches!(
            replace("a", "", "c", false),
            Err(What::BadEdit(_))
        ));
    }

    #[test]
    fn nul_or_invalid_utf8_is_binary() {
        assert!(as_text(b"a\0b").is_none());
        assert!(as_text(&[0xff, 0xfe]).is_none());
        assert_eq!(as_text(b"ok"), Some("ok"));
    }
}
