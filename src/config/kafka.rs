//! `[kafka]`: the brokers, the change topic, the consumer group and the
//! librdkafka properties passed through.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{secret, ConfigError};

#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    #[serde(default)]
    pub brokers: String,
    #[serde(default)]
    pub topic: String,
    #[serde(default = "default_group_id")]
    pub group_id: String,
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// Passed to librdkafka as they are (TLS, SASL, tuning); they override
    /// the sidecar's own settings except the offset-handling ones.
    #[serde(default, serialize_with = "secret::serialize_kafka_properties")]
    pub properties: BTreeMap<String, String>,
}

impl std::fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let properties: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(k, v)| {
                let shown = if secret::is_sensitive_kafka_property(k) {
                    secret::REDACTED
                } else {
                    v.as_str()
                };
                (k.as_str(), shown)
            })
            .collect();
        f.debug_struct("KafkaSettings")
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("group_id", &self.group_id)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .field("properties", &properties)
            .finish()
    }
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            brokers: String::new(),
            topic: String::new(),
            group_id: default_group_id(),
            dead_letter_topic: None,
            properties: BTreeMap::new(),
        }
    }
}

fn default_group_id() -> String {
    "outbox-sidecar".to_owned()
}

/// `OUTBOX__KAFKA__PROPERTIES__SASL_PASSWORD` arrives as `sasl_password`:
/// librdkafka names use dots, never underscores, so map them back.
pub fn property_name(key: &str) -> String {
    key.replace('_', ".")
}

/// librdkafka's default `max.poll.interval.ms`.
const DEFAULT_MAX_POLL_INTERVAL_MS: u64 = 300_000;

impl KafkaSettings {
    /// What `outbox-sidecar run` needs of Kafka (other commands need none).
    pub(super) fn validate_for_run(&self) -> Result<(), ConfigError> {
        if self.brokers.trim().is_empty() {
            return Err(ConfigError::missing("kafka.brokers"));
        }
        if self.topic.trim().is_empty() {
            return Err(ConfigError::missing("kafka.topic"));
        }
        if self.group_id.trim().is_empty() {
            return Err(ConfigError::missing("kafka.group_id"));
        }
        self.check_assignment_strategy()
    }

    /// `partition.assignment.strategy`: librdkafka's assignors, all eager
    /// (`range`, `roundrobin`) or all cooperative (`cooperative-sticky`);
    /// librdkafka refuses a mix, so switching a group from one protocol to
    /// the other takes a rollout in which the two never meet in the group.
    fn check_assignment_strategy(&self) -> Result<(), ConfigError> {
        let Some((k, v)) = self
            .properties
            .iter()
            .find(|(k, _)| property_name(k) == "partition.assignment.strategy")
        else {
            return Ok(());
        };
        let key = format!("kafka.properties.{k}");
        let names: Vec<&str> = v.split(',').map(str::trim).collect();
        for name in &names {
            if !["range", "roundrobin", "cooperative-sticky"].contains(name) {
                return Err(ConfigError::key(
                    key,
                    format!(
                        "{name:?} is not an assignment strategy (range, roundrobin or \
                         cooperative-sticky)"
                    ),
                ));
            }
        }
        let cooperative = names.iter().filter(|n| **n == "cooperative-sticky").count();
        if cooperative > 0 && cooperative < names.len() {
            return Err(ConfigError::key(
                key,
                format!(
                    "{v:?} mixes cooperative-sticky with eager strategies; librdkafka takes one \
                     protocol only (see the README on switching a group to cooperative-sticky)"
                ),
            ));
        }
        Ok(())
    }

    /// The consumer's `max.poll.interval.ms` (librdkafka drops a member
    /// that does not poll for this long; liveness fails after it too).
    pub fn max_poll_interval(&self) -> Result<Duration, ConfigError> {
        let ms = match self
            .properties
            .iter()
            .find(|(k, _)| property_name(k) == "max.poll.interval.ms")
        {
            Some((k, v)) => v.trim().parse::<u64>().map_err(|_| {
                ConfigError::key(
                    format!("kafka.properties.{k}"),
                    format!("{v:?} is not a number of milliseconds"),
                )
            })?,
            None => DEFAULT_MAX_POLL_INTERVAL_MS,
        };
        Ok(Duration::from_millis(ms))
    }
}
