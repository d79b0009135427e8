//! Option values with units: sizes (`64M`), retention ages (`30d`) and
//! durations (`500ms`, a bare number is seconds).

use std::time::Duration;

/// Parses a size such as `64M`, `1G` or `4096` (bytes; K, M, G, T are
/// powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    crate::policy::parse::parse_amount(s.trim(), 1024)
        .map_err(|e| format!("invalid size `{s}`: {e}"))
}

/// Parses a retention age such as `30d`, `12h`, `90min` (humantime units).
pub fn parse_age(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("invalid age `{s}`: {e} (e.g. 30d, 12h, 90min)"))
}

/// Parses a duration such as `1s`, `500ms`, `1.5s`, `2m` or `250us`; a bare
/// number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration `{s}`: expected e.g. `1s`, `500ms`, `2m`"))?;
    let secs = match unit.trim() {
        "" | "s" | "sec" => value,
        "ms" => value / 1e3,
        "us" | "µs" => value / 1e6,
        "ns" => value / 1e9,
        "m" | "min" => value * 60.0,
        other => {
            return Err(format!(
                "invalid duration `{s}`: unknown unit `{other}` (use ns, us, ms, s or m)"
            ))
        }
    };
    if !secs.is_finite() || !(0.0..=86_400.0).contains(&secs) {
        return Err(format!(
            "invalid duration `{s}`: must be between 0 and 24 hours"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}
