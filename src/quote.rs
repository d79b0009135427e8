//! How names and free text taken from a workspace reach a terminal: a file
//! name, a process name or a rule is chosen by whoever wrote it (an agent,
//! another user), so text output must never let it forge a line, move the
//! cursor or reorder what a reader sees.
//!
//! Two forms, both unambiguous (every distinct input prints differently):
//! - `quote` for names in lists (`diff`, `log`, `reset`, patch headers): a
//!   name that needs it is printed C-quoted in double quotes, the way git
//!   quotes paths (`"a\nb"`, octal `\ooo` for other bytes), so `git apply`
//!   reads a `diff --patch` back to the exact bytes;
//! - `visible` for free text on a line of its own (`status` values, rules,
//!   error messages): the same escapes without the quotes, and a backslash
//!   left as it is (messages quote systemd's `\x2d` escapes and the like,
//!   which must read as the user types them); such text is read, not
//!   parsed back.
//!
//! What is escaped: C0 controls, DEL, C1 controls, Unicode format and
//! bidirectional controls (which reorder what a terminal shows), bytes
//! that are not UTF-8, and in `quote` also the backslash and double quote
//! that the escapes themselves use. Other UTF-8 (accented names, CJK)
//! prints as it is.
//! `--json` output is not escaped here: JSON strings carry their own.

use std::borrow::Cow;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;

/// Whether a character would act on the terminal or the reader rather
/// than print as itself.
fn is_unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{200b}'..='\u{200f}'   // zero-width spaces and marks, LRM/RLM
            | '\u{2028}'..='\u{202e}' // line/paragraph separators, bidi embeddings
            | '\u{2060}'..='\u{206f}' // word joiner, bidi isolates, invisible operators
            | '\u{feff}'              // zero-width no-break space (BOM)
            | '\u{fff9}'..='\u{fffb}' // interlinear annotations
        )
}

/// Appends the escape of one unsafe byte sequence (a char's UTF-8 bytes or
/// one stray byte).
fn escape_bytes(out: &mut String, bytes: &[u8]) {
    for &b in bytes {
        match b {
            0x07 => out.push_str("\\a"),
            0x08 => out.push_str("\\b"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            0x0b => out.push_str("\\v"),
            0x0c => out.push_str("\\f"),
            b'\r' => out.push_str("\\r"),
            _ => {
                let _ = write!(out, "\\{b:03o}");
            }
        }
    }
}

/// Escapes `bytes`; returns `None` when nothing needed escaping (and the
/// bytes are UTF-8), so callers can borrow the input.
/// `quoting`: the backslash and double quote are escaped too, so the
/// result parses back (`quote`); without it only what a terminal would act
/// on is escaped (`visible`).
fn escaped(bytes: &[u8], quoting: bool) -> Option<String> {
    let clean = match std::str::from_utf8(bytes) {
        Ok(s) => !s
            .chars()
            .any(|c| is_unsafe_char(c) || (quoting && (c == '\\' || c == '"'))),
        Err(_) => false,
    };
    if clean {
        return None;
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' if quoting => out.push_str("\\\\"),
                '"' if quoting => out.push_str("\\\""),
                c if is_unsafe_char(c) => {
                    let mut buf = [0u8; 4];
                    escape_bytes(&mut out, c.encode_utf8(&mut buf).as_bytes());
                }
                c => out.push(c),
            }
        }
        escape_bytes(&mut out, chunk.invalid());
    }
    Some(out)
}

/// A name as one unambiguous token: unchanged when it is plain, else in
/// double quotes with C escapes (git's path quoting). A name that holds
/// ` -> ` (the rename arrow of `diff` and `log`) or starts or ends with a
/// space is quoted too, so a line splits one way only.
pub fn quote(bytes: &[u8]) -> Cow<'_, str> {
    let risky =
        |s: &str| s.contains(" -> ") || s.starts_with(' ') || s.ends_with(' ') || s.is_empty();
    match escaped(bytes, true) {
        None => {
            let s = std::str::from_utf8(bytes).unwrap_or_default();
            if risky(s) {
                Cow::Owned(format!("\"{s}\""))
            } else {
                Cow::Borrowed(s)
            }
        }
        Some(e) => Cow::Owned(format!("\"{e}\"")),
    }
}

/// `quote` for a name among the labelled fields of one line (`log`'s
/// path, target, process and user names): quoted also when it holds a
/// space or a parenthesis, so an unquoted name is one word and no name
/// can pose as the fields after it (a process named `x) uid 0 (root`).
pub fn quote_field(bytes: &[u8]) -> Cow<'_, str> {
    match quote(bytes) {
        Cow::Borrowed(s) if s.contains([' ', '(', ')']) => Cow::Owned(format!("\"{s}\"")),
        q => q,
    }
}

/// `quote` for an `OsStr` (a path relative to the workspace root).
pub fn quote_os(name: &OsStr) -> Cow<'_, str> {
    quote(name.as_bytes())
}

/// Free text with every unsafe character escaped, no quotes added: for a
/// value printed alone (a status field, a process name, a rule, an error).
pub fn visible(text: &str) -> Cow<'_, str> {
    match escaped(text.as_bytes(), false) {
        None => Cow::Borrowed(text),
        Some(e) => Cow::Owned(e),
    }
}

/// A number of bytes for people: `512 B`, `12.3 KiB`, `4.0 MiB` (binary
/// units, one decimal). The one formatter of sizes in text output.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Undoes `quote` the way git does (C unquoting), for the round trip.
    fn unquote(s: &str) -> Vec<u8> {
        let Some(inner) = s.strip_prefix('"').and_then(|s| s.strip_suffix('"')) else {
            return s.as_bytes().to_vec();
        };
        let b = inner.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] != b'\\' {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let e = b[i + 1];
            i += 2;
            out.push(match e {
                b'a' => 7,
                b'b' => 8,
                b't' => b'\t',
                b'n' => b'\n',
                b'v' => 11,
                b'f' => 12,
                b'r' => b'\r',
                b'0'..=b'7' => {
                    let v = u8::from_str_radix(std::str::from_utf8(&b[i - 1..i + 2]).unwrap(), 8);
                    i += 2;
                    v.unwrap()
                }
                other => other,
            });
        }
        out
    }

    #[test]
    fn plain_names_are_borrowed() {
        for n in [
            "README.md",
            "src/main.rs",
            "dir with space/f",
            "naïve/日本語.txt",
        ] {
            assert!(
                matches!(quote(n.as_bytes()), Cow::Borrowed(x) if x == n),
                "{n}"
            );
            assert!(matches!(visible(n), Cow::Borrowed(_)), "{n}");
        }
    }

    #[test]
    fn forged_lines_and_terminal_controls_are_escaped() {
        let forged = "x\n2026-12-04T00:00:00Z  unlink      y  ok  pid 1 (init)";
        let q = quote(forged.as_bytes());
        assert!(!q.contains('\n'), "{q}");
        assert!(q.starts_with('"') && q.contains("\\n2026"), "{q}");
        let esc = "\x1b[2K\x1b[1Areal";
        assert_eq!(quote(esc.as_bytes()), "\"\\033[2K\\033[1Areal\"");
        assert_eq!(visible(esc), "\\033[2K\\033[1Areal");
        // Bidi override: shows `exe.txt` reversed on a terminal.
        assert_eq!(visible("a\u{202e}txt.exe"), "a\\342\\200\\256txt.exe");
        assert_eq!(visible("c1\u{9b}x"), "c1\\302\\233x");
    }

    #[test]
    fn invalid_utf8_and_escape_characters() {
        assert_eq!(quote(b"a\xffb"), "\"a\\377b\"");
        assert_eq!(quote(b"back\\slash"), "\"back\\\\slash\"");
        assert_eq!(quote(b"say \"hi\""), "\"say \\\"hi\\\"\"");
        assert_eq!(quote(b"a -> b"), "\"a -> b\"");
        assert_eq!(quote(b" lead"), "\" lead\"");
        assert_eq!(quote(b"\"x"), "\"\\\"x\"");
        assert_eq!(visible("alice\\x2ds1"), "alice\\x2ds1");
    }

    #[test]
    fn a_field_is_one_word_or_quoted() {
        assert_eq!(quote_field(b"git"), "git");
        assert_eq!(quote_field(b"x) uid 0 (root"), "\"x) uid 0 (root\"");
        assert_eq!(quote_field(b"dir with space/f"), "\"dir with space/f\"");
        assert_eq!(quote_field(b"(paren"), "\"(paren\"");
        assert_eq!(quote_field(b"a\nb"), quote(b"a\nb"));
        assert_eq!(unquote(&quote_field(b"x) uid 0 (root")), b"x) uid 0 (root");
    }

    #[test]
    fn quoting_round_trips_every_byte() {
        let mut names: Vec<Vec<u8>> = (0u8..=255).map(|b| vec![b'n', b, b'e']).collect();
        names.push("é\u{202e}\u{feff}".as_bytes().to_vec());
        names.push(b"\xe2\x80".to_vec()); // a truncated sequence
        for n in names {
            let q = quote(&n);
            assert!(
                !q.bytes().any(|b| b < 0x20 || b == 0x7f),
                "{n:?} printed raw as {q:?}"
            );
            assert_eq!(unquote(&q), n, "{q}");
        }
    }
}
