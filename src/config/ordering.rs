//! `[ordering]`: one aggregate's events in order, opt-in. Off by default
//! no order promised, every event concurrent).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// What an aggregate's later events do when one of its events ends `failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnFailed {
    /// They stay pending, unsent, using no attempt, until the failed one
    /// is resent and sent.
    #[default]
    Hold,
    /// They go on.
    Skip,
}

impl OnFailed {
    pub fn as_str(self) -> &'static str {
        match self {
            OnFailed::Hold => "hold",
            OnFailed::Skip => "skip",
        }
    }
}

/// `[ordering]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OrderingSettings {
    /// The outbox table's column naming each event's aggregate (an
    /// account, an order). Set: an aggregate's events are sent one at a
    /// time in id order; Debezium must key the topic by this column
    /// (`message.key.columns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<String>,
    #[serde(default)]
    pub on_failed: OnFailed,
    /// How long an event nothing earlier holds may stay pending and
    /// unchanged before the replica holding partition 0 announces it again
    /// (an announcement lost to a crash right after the event before it
    /// was sent).
    #[serde(default = "default_stranded_after", with = "super::duration")]
    pub stranded_after: Duration,
}

impl Default for OrderingSettings {
    fn default() -> Self {
        Self {
            column: None,
            on_failed: OnFailed::default(),
            stranded_after: default_stranded_after(),
        }
    }
}

fn default_stranded_after() -> Duration {
    Duration::from_secs(60)
}

impl OrderingSettings {
    pub fn enabled(&self) -> bool {
        self.column.is_some()
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(c) = &self.column {
            if !super::database::valid_identifier(c) || c.contains('.') {
                return Err(ConfigError::key(
                    "ordering.column",
                    format!("{c:?} is not a plain column name (letters, digits and _)"),
                ));
            }
        }
        if self.stranded_after < Duration::from_secs(1) {
            return Err(ConfigError::key(
                "ordering.stranded_after",
                "must be at least 1s",
            ));
        }
        Ok(())
    }
}
