//! Property tests (proptest) of the `-o` option parser: arbitrary option
//! text never panics and is refused with a usage message, unknown options
//! are refused by name, and rendered overlay-style options parse back to
//! exactly the layers and flags they were rendered from.

use std::path::PathBuf;

use proptest::prelude::*;

use super::{apply_mount_options, ConfigError, MountArgs};

use super::{IGNORED_OPTIONS as IGNORED, LAYERFS_OPTIONS};

/// Every key layerfs reads itself.
fn known() -> Vec<&'static str> {
    LAYERFS_OPTIONS.iter().map(|(k, _, _)| *k).collect()
}

fn parse(options: Vec<String>) -> Result<MountArgs, ConfigError> {
    let mut a = MountArgs {
        options,
        ..MountArgs::default()
    };
    apply_mount_options(&mut a).map(|_| a)
}

/// Option-like text: known and unknown keys, values with separators and
/// backslashes, stray commas and `=`.
fn option_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        prop::sample::select(known()).prop_map(str::to_string),
        prop::sample::select(IGNORED.to_vec()).prop_map(str::to_string),
        "x-[a-z.]{0,6}",
        "[a-z_]{1,8}",
        "(lowerdir|upperdir|workdir)=[/a-z:,\\\\=]{0,12}",
        "[=,:\\\\ ]{1,3}",
        any::<String>(),
    ];
    prop::collection::vec(piece, 0..6).prop_map(|p| p.join(","))
}

fn is_usage(r: &Result<MountArgs, ConfigError>) -> bool {
    matches!(r, Err(ConfigError::Usage(m)) if !m.is_empty())
}

/// A path component that needs no escaping; paths are rendered with `\,`
/// and `\:` for the separators they contain.
fn path() -> impl Strategy<Value = String> {
    prop::collection::vec("[a-zA-Z0-9 ._,:=-]{1,6}", 1..4).prop_map(|c| format!("/{}", c.join("/")))
}

fn escape(p: &str, lower: bool) -> String {
    let mut out = String::new();
    for ch in p.chars() {
        if ch == ',' || (lower && ch == ':') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

proptest! {
    #[test]
    fn fuzz_mount_options_never_panic(opts in prop::collection::vec(option_text(), 0..3)) {
        let r = parse(opts.clone());
        // Accepted, or refused as a usage error (exit 2) saying something.
        prop_assert!(r.is_ok() || is_usage(&r), "{:?} -> {:?}", opts, r.err());
    }

    /// A key layerfs does not know is refused, and the message names it.
    #[test]
    fn fuzz_unknown_mount_option_is_refused(
        key in "[a-z_][a-z0-9_]{0,10}".prop_filter("an unknown key", |k| !known().contains(&k.as_str()) && !IGNORED.contains(&k.as_str())),
        value in prop::option::of("[a-z/]{0,5}"),
    ) {
        let opt = match &value {
            Some(v) => format!("{key}={v}"),
            None => key.clone(),
        };
        let r = parse(vec![format!("rw,{opt},nodev")]);
        match r {
            Err(ConfigError::Usage(m)) => {
                prop_assert!(m.contains(&format!("unknown mount option `{opt}`")), "{}", m);
            }
            other => prop_assert!(false, "-o {} accepted: {:?}", opt, other),
        }
    }

    /// An ignored flag given a value (`nodev=1`) is refused, not ignored.
    #[test]
    fn fuzz_ignored_flag_with_value_is_refused(key in prop::sample::select(IGNORED.to_vec()), value in "[a-z0-9]{0,4}") {
        let r = parse(vec![format!("{key}={value}")]);
        prop_assert!(is_usage(&r), "{}={} -> {:?}", key, value, r);
    }

    /// Rendered options, in any order and split over several `-o`, parse
    /// back to the same lowers (topmost first), upper, work and flags.
    #[test]
    fn fuzz_rendered_mount_options_round_trip(
        lowers in prop::collection::vec(path(), 1..4),
        upper in prop::option::of(path()),
        work in prop::option::of(path()),
        ro in any::<bool>(),
        allow_other in any::<bool>(),
        ignored in prop::collection::vec(prop::sample::select(IGNORED.to_vec()), 0..3),
        order in any::<prop::sample::Index>(),
        split in any::<prop::sample::Index>(),
    ) {
        let lowerdir = lowers.iter().map(|l| escape(l, true)).collect::<Vec<_>>().join(":");
        let mut opts = vec![format!("lowerdir={lowerdir}")];
        if let Some(u) = &upper {
            opts.push(format!("upperdir={}", escape(u, false)));
        }
        if let Some(w) = &work {
            opts.push(format!("workdir={}", escape(w, false)));
        }
        if ro {
            opts.push("ro".into());
        }
        if allow_other {
            opts.push("allow_other".into());
        }
        opts.extend(ignored.iter().map(|s| s.to_string()));
        let n = opts.len();
        opts.rotate_left(order.index(n));
        let cut = split.index(n + 1);
        let given: Vec<String> = [opts[..cut].join(","), opts[cut..].join(",")]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
        let a = match parse(given.clone()) {
            Ok(a) => a,
            Err(e) => return Err(TestCaseError::fail(format!("{given:?} refused: {e}"))),
        };
        prop_assert_eq!(a.lowers, lowers.iter().map(PathBuf::from).collect::<Vec<_>>());
        prop_assert_eq!(a.upper, upper.map(PathBuf::from));
        prop_assert_eq!(a.work, work.map(PathBuf::from));
        prop_assert_eq!(a.read_only, ro);
        prop_assert_eq!(a.allow_other, allow_other);
    }
}

proptest! {
    /// Any `--lower-timeout` text: a duration within 0..=24 h, or an error
    /// quoting it; never a panic (Duration::from_secs_f64 panics on
    /// negative or huge values, so the range check must come first).
    #[test]
    fn fuzz_parse_duration(s in prop_oneof!["[0-9.]{0,25}(ns|us|µs|ms|s|sec|m|min|h| s)?", any::<String>()]) {
        match super::parse_duration(&s) {
            Ok(d) => prop_assert!(d <= std::time::Duration::from_secs(86_400)),
            Err(m) => prop_assert!(m.to_string().contains(&format!("`{s}`")), "{}", m),
        }
    }
}
