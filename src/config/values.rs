//! Option values with units: sizes (`64M`), retention ages (`30d`) and
//! durations (`500ms`, a bare number is seconds).

use std::time::Duration;

use crate::policy::AmountError;

/// An option value that is not a size, an age or a duration: the text as
/// given and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum ValueError {
    #[error("invalid size `{value}`: {source}")]
    Size { value: String, source: AmountError },
    #[error("invalid age `{value}`: {source} (e.g. 30d, 12h, 90min)")]
    Age {
        value: String,
        source: humantime::DurationError,
    },
    #[error("invalid duration `{0}`: expected e.g. `1s`, `500ms`, `2m`")]
    DurationNumber(String),
    #[error("invalid duration `{value}`: unknown unit `{unit}` (use ns, us, ms, s or m)")]
    DurationUnit { value: String, unit: String },
    #[error("invalid duration `{0}`: must be between 0 and 24 hours")]
    DurationRange(String),
}

/// Parses a size such as `64M`, `1G` or `4096` (bytes; K, M, G, T are
/// powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, ValueError> {
    crate::policy::parse::parse_amount(s.trim(), 1024).map_err(|source| ValueError::Size {
        value: s.to_string(),
        source,
    })
}

/// Parses a retention age such as `30d`, `12h`, `90min` (humantime units).
pub fn parse_age(s: &str) -> Result<Duration, ValueError> {
    humantime::parse_duration(s.trim()).map_err(|source| ValueError::Age {
        value: s.to_string(),
        source,
    })
}

/// Parses a duration such as `1s`, `500ms`, `1.5s`, `2m` or `250us`; a bare
/// number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, ValueError> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| ValueError::DurationNumber(s.to_string()))?;
    let secs = match unit.trim() {
        "" | "s" | "sec" => value,
        "ms" => value / 1e3,
        "us" | "µs" => value / 1e6,
        "ns" => value / 1e9,
        "m" | "min" => value * 60.0,
        other => {
            return Err(ValueError::DurationUnit {
                value: s.to_string(),
                unit: other.to_string(),
            })
        }
    };
    if !secs.is_finite() || !(0.0..=86_400.0).contains(&secs) {
        return Err(ValueError::DurationRange(s.to_string()));
    }
    Ok(Duration::from_secs_f64(secs))
}
