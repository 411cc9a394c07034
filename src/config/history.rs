//! `[history]`: the attempt log, one row per attempt and per resend.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{duration, ConfigError};

/// The attempt log (`[history]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HistorySettings {
    /// One row per attempt and per resend in `table`; off: nothing is
    /// written there (R-004's own columns only).
    #[serde(default = "default_true")]
    pub enabled: bool,
    #[serde(default = "default_history_table")]
    pub table: String,
    /// What `events prune` keeps.
    #[serde(default = "default_history_retention", with = "duration")]
    pub retention: Duration,
    /// This replica's name in the log; unset: `$HOSTNAME` (the pod name),
    /// else the machine's host name.
    #[serde(default)]
    pub replica: Option<String>,
}

impl Default for HistorySettings {
    fn default() -> Self {
        Self {
            enabled: true,
            table: default_history_table(),
            retention: default_history_retention(),
            replica: None,
        }
    }
}

impl HistorySettings {
    /// The replica name written with each attempt.
    pub fn replica_name(&self) -> String {
        self.replica
            .clone()
            .filter(|r| !r.trim().is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
                    .filter(|h| !h.is_empty())
            })
            .unwrap_or_else(|| "unknown".to_owned())
    }

    /// The retention (`table` is checked with the other tables' names).
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.retention.is_zero() {
            return Err(ConfigError::key("history.retention", "must be above zero"));
        }
        Ok(())
    }
}

fn default_true() -> bool {
    true
}

fn default_history_table() -> String {
    "outbox_event_attempts".to_owned()
}

fn default_history_retention() -> Duration {
    Duration::from_secs(30 * 24 * 3600)
}
