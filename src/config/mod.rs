//! Configuration: defaults → TOML file → `OUTBOX__SECTION__KEY` environment
//! variables, validated once at start-up (CONTRACT §8).
//!
//! Unknown keys are rejected, every error names the key and the form it
//! expects, and secrets ([`Secret`], the database password, sensitive
//! librdkafka properties) are replaced by `***` wherever settings are printed.
//!
//! Each section is a file of its own that validates itself: [`database`],
//! [`kafka`], [`dispatch`], [`dispatchers`], [`admin`] (with `[metrics]`),
//! [`history`], [`trace`] (`[tracing]`); this file holds what spans sections (the loading, the
//! sidecar's own table names, `[shutdown]` against Kafka's poll interval)
//! and the small `[shutdown]` and `[log]` sections. Dispatchers are checked
//! further by building them (`crate::dispatch::Registry`), which the
//! binary does right after loading.

pub mod admin;
pub mod database;
pub mod dispatch;
pub mod dispatchers;
mod files;
pub mod history;
pub mod kafka;
pub mod ordering;
mod secret;
#[cfg(test)]
mod tests;
pub mod trace;
mod units;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use admin::{AdminSettings, MetricsSettings, ADMIN_TOKEN_PLACEHOLDERS, MIN_ADMIN_TOKEN_CHARS};
pub use database::DatabaseSettings;
pub use dispatch::DispatchSettings;
pub use dispatchers::{
    BreakerSettings, DispatcherSettings, IdempotencyKey, OAuth2Settings, TlsVersion,
};
pub use history::HistorySettings;
pub use kafka::{property_name, KafkaSettings};
pub use ordering::{OnFailed, OrderingSettings};
pub use secret::{DatabaseUrl, Secret, REDACTED};
pub use trace::TracingSettings;
pub use units::{byte_size, duration};

/// The environment variable that names the configuration file.
pub const CONFIG_ENV: &str = "OUTBOX_CONFIG";
/// The prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "OUTBOX";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
    #[error("invalid configuration: {key}: {message}")]
    Key { key: String, message: String },
    #[error("missing setting {key}: set it in the configuration file or as {env}")]
    Missing { key: String, env: String },
}

impl ConfigError {
    fn key(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Key {
            key: key.into(),
            message: message.into(),
        }
    }

    fn missing(key: &str) -> Self {
        ConfigError::Missing {
            key: key.to_owned(),
            env: env_name(key),
        }
    }
}

/// `dispatch.retry_delay` → `OUTBOX__DISPATCH__RETRY_DELAY`.
pub fn env_name(key: &str) -> String {
    format!("{ENV_PREFIX}__{}", key.replace('.', "__").to_uppercase())
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    #[serde(default)]
    pub database: DatabaseSettings,
    #[serde(default)]
    pub kafka: KafkaSettings,
    #[serde(default)]
    pub dispatch: DispatchSettings,
    #[serde(default)]
    pub dispatchers: BTreeMap<String, DispatcherSettings>,
    #[serde(default)]
    pub admin: AdminSettings,
    #[serde(default)]
    pub metrics: MetricsSettings,
    #[serde(default)]
    pub shutdown: ShutdownSettings,
    #[serde(default)]
    pub log: LogSettings,
    #[serde(default)]
    pub history: HistorySettings,
    #[serde(default)]
    pub tracing: TracingSettings,
    #[serde(default)]
    pub ordering: OrderingSettings,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownSettings {
    #[serde(default = "default_drain_timeout", with = "duration")]
    pub drain_timeout: Duration,
}

impl Default for ShutdownSettings {
    fn default() -> Self {
        Self {
            drain_timeout: default_drain_timeout(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    #[serde(default = "default_log_format")]
    pub format: LogFormat,
    /// A `tracing` filter directive; `RUST_LOG` overrides it.
    #[serde(default = "default_log_level")]
    pub level: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: default_log_format(),
            level: default_log_level(),
        }
    }
}

fn default_drain_timeout() -> Duration {
    Duration::from_secs(20)
}
fn default_log_format() -> LogFormat {
    LogFormat::Text
}
fn default_log_level() -> String {
    "info".to_owned()
}

impl Settings {
    /// Loads from `path` (or `$OUTBOX_CONFIG`, or nothing) and the process
    /// environment, then checks what every command needs.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let from_env = std::env::var_os(CONFIG_ENV).map(PathBuf::from);
        let path = path.map(Path::to_path_buf).or(from_env);
        let env: BTreeMap<String, String> = std::env::vars()
            .filter(|(k, _)| k.starts_with(&format!("{ENV_PREFIX}__")))
            .collect();
        Self::load_from(path.as_deref(), env)
    }

    /// As [`Settings::load`], with the environment given explicitly (tests).
    pub fn load_from(
        path: Option<&Path>,
        env: BTreeMap<String, String>,
    ) -> Result<Self, ConfigError> {
        let text = match path {
            Some(path) => Some(
                std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                    path: path.to_owned(),
                    message: e.to_string(),
                })?,
            ),
            None => None,
        };
        Self::from_toml(text.as_deref(), env)
    }

    /// As [`Settings::load_from`], with the file's text given directly.
    pub fn from_toml(
        toml: Option<&str>,
        env: BTreeMap<String, String>,
    ) -> Result<Self, ConfigError> {
        let (env, env_headers) = dispatchers::header_names_from_env(env);
        let mut builder = config::Config::builder();
        if let Some(text) = toml {
            builder = builder.add_source(config::File::from_str(text, config::FileFormat::Toml));
        }
        // No `try_parsing`: it turned `00123456` into `123456` and `TRUE`
        // into `true` before any field saw them. Every value stays a string;
        // number and duration fields parse it themselves.
        let env = config::Environment::with_prefix(ENV_PREFIX)
            .separator("__")
            .source(Some(env.into_iter().collect()));
        let merged = builder
            .add_source(env)
            .build()
            .map_err(|e| ConfigError::Invalid(describe(e)))?;
        let mut settings: Settings = merged
            .try_deserialize()
            .map_err(|e| ConfigError::Invalid(describe(e)))?;
        dispatchers::merge_headers(&mut settings.dispatchers, &env_headers)?;
        settings.read_secret_files()?;
        settings.validate()?;
        Ok(settings)
    }

    /// `*_file` settings: each file's content becomes its setting's value.
    fn read_secret_files(&mut self) -> Result<(), ConfigError> {
        self.database.read_secret_files()?;
        self.admin.read_secret_files()?;
        dispatchers::read_secret_files(&mut self.dispatchers)
    }

    /// Checks that hold for every command: each section's own, and the
    /// sidecar's own tables named apart from the outbox table and each other.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.database.validate()?;
        self.check_own_table_names()?;
        self.history.validate()?;
        self.tracing.validate()?;
        self.ordering.validate()?;
        self.dispatch.validate()?;
        self.admin.validate()?;
        dispatchers::validate(&self.dispatchers)
    }

    /// `history.table` and `dispatch.pause_table`: plain names, neither
    /// the outbox table nor each other.
    fn check_own_table_names(&self) -> Result<(), ConfigError> {
        for (key, table) in [
            ("history.table", &self.history.table),
            ("dispatch.pause_table", &self.dispatch.pause_table),
            ("dispatch.operations_table", &self.dispatch.operations_table),
        ] {
            if !database::valid_identifier(table) || table.contains('.') {
                return Err(ConfigError::key(
                    key,
                    format!("{table:?} is not a plain table name (letters, digits and _)"),
                ));
            }
            if table.eq_ignore_ascii_case(&self.database.table) {
                return Err(ConfigError::key(
                    key,
                    format!("{table:?} is database.table; the sidecar's own tables need their own names"),
                ));
            }
        }
        let own = [
            ("history.table", &self.history.table),
            ("dispatch.pause_table", &self.dispatch.pause_table),
            ("dispatch.operations_table", &self.dispatch.operations_table),
        ];
        for (i, (_, a)) in own.iter().enumerate() {
            for (key, b) in &own[i + 1..] {
                if a.eq_ignore_ascii_case(b) {
                    return Err(ConfigError::key(
                        *key,
                        format!("is {} too; each needs its own name", own[i].0),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The extra checks of `outbox-sidecar run`: Kafka, and the drain
    /// timeout against Kafka's poll interval.
    pub fn validate_for_run(&self) -> Result<(), ConfigError> {
        self.kafka.validate_for_run()?;
        // A revoke waits up to the drain timeout inside the consumer's poll;
        // librdkafka drops a member that does not poll for this long.
        let max_poll = self.max_poll_interval()?.as_millis();
        if self.shutdown.drain_timeout.as_millis() >= max_poll {
            return Err(ConfigError::key(
                "shutdown.drain_timeout",
                format!(
                    "{} must be below the consumer's max.poll.interval.ms ({max_poll} ms): \
                     a rebalance waits up to the drain timeout for requests in flight",
                    humantime::format_duration(self.shutdown.drain_timeout)
                ),
            ));
        }
        Ok(())
    }

    /// Each dispatcher's event names (bulk resend by dispatcher).
    pub fn dispatcher_events(&self) -> BTreeMap<String, Vec<String>> {
        self.dispatchers
            .iter()
            .map(|(name, d)| (name.clone(), d.events.clone()))
            .collect()
    }

    /// Each rate-limited dispatcher's limit for the group, as configured.
    pub fn dispatcher_rates(&self) -> BTreeMap<String, crate::dispatch::rate::Rate> {
        self.dispatchers
            .iter()
            .filter_map(|(name, d)| {
                let rate = crate::dispatch::rate::Rate::parse(d.rate.as_deref()?, d.burst);
                Some((name.clone(), rate.ok()?))
            })
            .collect()
    }

    /// See [`KafkaSettings::max_poll_interval`].
    pub fn max_poll_interval(&self) -> Result<Duration, ConfigError> {
        self.kafka.max_poll_interval()
    }

    /// See [`AdminSettings::listen_addr`].
    pub fn admin_listen(&self) -> Result<SocketAddr, ConfigError> {
        self.admin.listen_addr()
    }

    /// See [`AdminSettings::api_listen_addr`].
    pub fn admin_api_listen(&self) -> Result<SocketAddr, ConfigError> {
        self.admin.api_listen_addr()
    }

    pub fn database_url(&self) -> &str {
        self.database.url.as_ref().map(|u| u.expose()).unwrap_or("")
    }

    /// The effective settings as TOML, secrets replaced by `***`.
    pub fn redacted_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot print settings: {e}\n"))
    }
}

/// The `config` crate's messages already name the key; make them one line
/// and never echo a value that could be a secret (they only quote types).
fn describe(e: config::ConfigError) -> String {
    e.to_string().replace('\n', " ")
}

/// A URL safe to show in an error message (password and secret-looking
/// query values masked).
pub fn secret_free_url(url: &str) -> String {
    secret::redact_url(url)
}

/// The credentials a URL carries, for masking wherever a receiver echoes them.
pub fn url_secrets(url: &url::Url) -> Vec<String> {
    secret::url_secrets(url)
}
