//! `[dispatch]`: R-004's limits (`max_attempts`, `retry_delay`) and how
//! much the sidecar does at once.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{byte_size, duration, ConfigError};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DispatchSettings {
    #[serde(default = "default_max_attempts")]
    pub max_attempts: i32,
    #[serde(default = "default_retry_delay", with = "duration")]
    pub retry_delay: Duration,
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Payload bytes the consumer holds at most (rows waiting for a job,
    /// rows being read, rows of running jobs).
    #[serde(default = "default_max_buffered_bytes", with = "byte_size")]
    pub max_buffered_bytes: usize,
    /// The table of paused dispatchers (created by `migrate`), read by
    /// every replica.
    #[serde(default = "default_pause_table")]
    pub pause_table: String,
    /// The table of operator actions' progress (created by `migrate`):
    /// a resume, retrigger or bulk resend, whoever started it.
    #[serde(default = "default_operations_table")]
    pub operations_table: String,
    /// How often each replica reads the paused dispatchers.
    #[serde(default = "default_pause_refresh", with = "duration")]
    pub pause_refresh: Duration,
    /// How long a row that is missing, or older than the change event that
    /// announced it, is read again before the event is decided on the row
    /// as read (logical decoding ships a commit early; a replica lags).
    #[serde(default = "default_row_visibility_timeout", with = "duration")]
    pub row_visibility_timeout: Duration,
}

impl Default for DispatchSettings {
    fn default() -> Self {
        Self {
            max_attempts: default_max_attempts(),
            retry_delay: default_retry_delay(),
            max_in_flight: default_max_in_flight(),
            max_buffered_bytes: default_max_buffered_bytes(),
            pause_table: default_pause_table(),
            operations_table: default_operations_table(),
            pause_refresh: default_pause_refresh(),
            row_visibility_timeout: default_row_visibility_timeout(),
        }
    }
}

fn default_max_attempts() -> i32 {
    3
}
fn default_retry_delay() -> Duration {
    Duration::from_secs(5)
}
fn default_max_in_flight() -> usize {
    64
}
fn default_max_buffered_bytes() -> usize {
    64 << 20
}
fn default_pause_table() -> String {
    "outbox_dispatcher_pauses".to_owned()
}
fn default_operations_table() -> String {
    "outbox_operations".to_owned()
}
fn default_pause_refresh() -> Duration {
    Duration::from_secs(1)
}
fn default_row_visibility_timeout() -> Duration {
    Duration::from_secs(30)
}

impl DispatchSettings {
    /// The limits (`pause_table` is checked with the other tables' names).
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.row_visibility_timeout.is_zero() {
            return Err(ConfigError::key(
                "dispatch.row_visibility_timeout",
                "must be above zero",
            ));
        }
        if self.pause_refresh.is_zero() {
            return Err(ConfigError::key(
                "dispatch.pause_refresh",
                "must be above zero",
            ));
        }
        if self.max_attempts < 1 {
            return Err(ConfigError::key(
                "dispatch.max_attempts",
                format!("must be at least 1, got {}", self.max_attempts),
            ));
        }
        if self.max_buffered_bytes < (1 << 20) {
            return Err(ConfigError::key(
                "dispatch.max_buffered_bytes",
                "must be at least 1MiB (one payload always fits; the bound is for many)",
            ));
        }
        if self.max_in_flight == 0 {
            return Err(ConfigError::key(
                "dispatch.max_in_flight",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}
