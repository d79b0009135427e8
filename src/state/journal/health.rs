//! The journal's health as `status` reports it, live or read offline.

use serde::{Deserialize, Serialize};

/// The journal's health as `status` reports it: a live mount's counters
/// since the mount (`dropped`, `trimmed`, the last error), or what an
/// unmounted workspace's database records (`dropped_recorded`,
/// `trimmed_recorded`; `rows` absent and `last_error` set when it cannot
/// be read), or `enabled: false`. Absent fields are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HealthReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub rows: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub written: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trimmed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped_recorded: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trimmed_recorded: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    pub last_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_age_seconds: Option<u64>,
}

impl HealthReport {
    /// A mount without a journal.
    pub fn disabled() -> HealthReport {
        HealthReport {
            enabled: Some(false),
            ..HealthReport::default()
        }
    }
}
