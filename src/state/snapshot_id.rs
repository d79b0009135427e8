//! Snapshot IDs: the file name of a snapshot in the state dir's
//! `snapshots/`, so an ID must be one safe path segment.
//!
//! Invariant (relied on by `snapshot`): an ID that passed `validate` is
//! 1..=128 bytes of `[A-Za-z0-9._-]`, does not start with `.` (so it is
//! never `.`/`..`, never a hidden file, never the `.ID.tar.tmp` name of a
//! save in progress), and joined to a directory names a file directly in
//! that directory.

use std::ffi::OsStr;

/// Longest ID accepted, in bytes.
pub const MAX_LEN: usize = 128;

/// What an ID may be, for the message refusing one.
const RULE: &str = "an ID is 1-128 characters of A-Z a-z 0-9 . _ -, not starting with `.`";

/// Why an ID (`what`: "snapshot ID", "checkpoint name") was refused,
/// naming it and the rule.
#[derive(Debug, thiserror::Error)]
pub enum IdError {
    #[error("invalid {what} {shown:?}: not UTF-8 ({RULE})")]
    NotUtf8 { what: &'static str, shown: String },
    #[error("invalid {what}: empty ({RULE})")]
    Empty { what: &'static str },
    /// `head`: its first 16 characters.
    #[error("invalid {what} {head:?}…: {len} bytes, at most {MAX_LEN} ({RULE})")]
    TooLong {
        what: &'static str,
        head: String,
        len: usize,
    },
    #[error("invalid {what} {id:?}: character {c:?} not allowed ({RULE})")]
    Character {
        what: &'static str,
        id: String,
        c: char,
    },
    #[error("invalid {what} {id:?}: starts with `.` ({RULE})")]
    Hidden { what: &'static str, id: String },
}

/// Checks that `id` is a safe snapshot ID and returns it as a `&str`; the
/// error says what is wrong and what an ID may be.
pub fn validate(id: &OsStr) -> Result<&str, IdError> {
    validate_as(id, "snapshot ID")
}

/// `validate`, the error calling the ID `what` (a checkpoint's name
/// follows the same rule).
pub fn validate_as<'a>(id: &'a OsStr, what: &'static str) -> Result<&'a str, IdError> {
    let Some(s) = id.to_str() else {
        return Err(IdError::NotUtf8 {
            what,
            shown: id.to_string_lossy().into_owned(),
        });
    };
    if s.is_empty() {
        return Err(IdError::Empty { what });
    }
    if s.len() > MAX_LEN {
        return Err(IdError::TooLong {
            what,
            head: s[..s.char_indices().nth(16).map_or(s.len(), |(i, _)| i)].to_string(),
            len: s.len(),
        });
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(IdError::Character {
            what,
            id: s.into(),
            c,
        });
    }
    if s.starts_with('.') {
        return Err(IdError::Hidden { what, id: s.into() });
    }
    Ok(s)
}

/// A fresh ID from the current UTC time, `YYYYMMDDTHHMMSS.mmmZ`, with a
/// `-N` suffix when `taken` says that one exists already.
pub fn generate(taken: impl Fn(&str) -> bool) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let base = utc_stamp(now.as_secs() as i64, now.subsec_millis());
    if !taken(&base) {
        return base;
    }
    (2u32..)
        .map(|n| format!("{base}-{n}"))
        .find(|id| !taken(id))
        .unwrap_or(base)
}

/// `YYYYMMDDTHHMMSS.mmmZ` for a Unix time (proleptic Gregorian, UTC).
fn utc_stamp(secs: i64, millis: u32) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}.{millis:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// RFC 3339 form of a Unix time, for listings.
pub fn rfc3339(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::os::unix::ffi::OsStrExt;

    fn ok(s: &str) -> bool {
        validate(OsStr::new(s)).is_ok()
    }

    #[test]
    fn examples() {
        for good in [
            "a",
            "v1.2",
            "before-refactor",
            "x_y",
            "A.B-C_9",
            "a..b",
            "a.",
        ] {
            assert!(ok(good), "{good} refused");
        }
        for bad in [
            "", ".", "..", "../x", "a/b", "/abs", ".hidden", "a\nb", "a b", "a\0b", "é", "a:b",
        ] {
            assert!(!ok(bad), "{bad:?} accepted");
        }
        assert!(ok(&"x".repeat(128)));
        assert!(!ok(&"x".repeat(129)));
        assert!(!ok(&"x".repeat(300)));
        assert!(validate(OsStr::from_bytes(b"a\xffb")).is_err());
        let e = validate(OsStr::new("../x")).unwrap_err().to_string();
        assert!(e.contains("'/'") && e.contains("A-Z"), "{e}");
    }

    #[test]
    fn stamps() {
        assert_eq!(utc_stamp(0, 0), "19700101T000000.000Z");
        assert_eq!(utc_stamp(951_782_400 + 3661, 7), "20000229T010101.007Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        let id = generate(|_| false);
        assert!(ok(&id), "{id}");
        let first = id.clone();
        let second = generate(|s| s == first);
        assert!(second.ends_with("-2") && ok(&second), "{second}");
    }

    proptest! {
        /// Any byte string: accepted exactly when it is a safe segment, and
        /// an accepted ID joined to a directory names a direct child of it.
        #[test]
        fn fuzz_snapshot_id_matches_rule(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let id = OsStr::from_bytes(&bytes);
            let safe = !bytes.is_empty()
                && bytes.len() <= MAX_LEN
                && bytes[0] != b'.'
                && bytes.iter().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(b));
            prop_assert_eq!(validate(id).is_ok(), safe);
            if safe {
                let p = std::path::Path::new("/snapshots").join(id);
                prop_assert_eq!(p.parent(), Some(std::path::Path::new("/snapshots")));
                prop_assert_eq!(p.file_name(), Some(id));
            }
        }

        /// Strings drawn from the allowed alphabet and from path-like pieces.
        #[test]
        fn path_like(s in "[A-Za-z0-9._/-]{0,140}") {
            let r = validate(OsStr::new(&s));
            prop_assert_eq!(r.is_ok(),
                !s.is_empty() && s.len() <= MAX_LEN && !s.starts_with('.') && !s.contains('/'));
        }
    }
}
