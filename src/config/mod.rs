//! Configuration: defaults → TOML file → `OUTBOX__SECTION__KEY` environment
//! variables, validated once at start-up (CONTRACT §8).
//!
//! Unknown keys are rejected, every error names the key and the form it
//! expects, and secrets ([`Secret`], the database password, sensitive
//! librdkafka properties) are replaced by `***` wherever settings are printed.

mod files;
mod secret;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use secret::{DatabaseUrl, Secret, REDACTED};

/// The environment variable that names the configuration file.
pub const CONFIG_ENV: &str = "OUTBOX_CONFIG";
/// The prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "OUTBOX";
/// The shortest `admin.token` accepted (`openssl rand -hex 32` gives 64).
pub const MIN_ADMIN_TOKEN_CHARS: usize = 24;
/// The placeholders of `config/example.toml` and
/// `deploy/kubernetes/secret.example.yaml`: refused as tokens, whatever
/// their length, so a copied example never opens the admin API.
pub const ADMIN_TOKEN_PLACEHOLDERS: &[&str] = &["change-me-use-openssl-rand-hex-32", "CHANGE_ME"];

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
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// `postgres://…`, `mysql://…` or `sqlite:…`; required (or `url_file`).
    #[serde(default)]
    pub url: Option<DatabaseUrl>,
    /// A file holding `url` (a mounted Secret), read at start-up.
    #[serde(default)]
    pub url_file: Option<PathBuf>,
    #[serde(default = "default_table")]
    pub table: String,
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    #[serde(default = "default_connect_timeout", with = "duration")]
    pub connect_timeout: Duration,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: None,
            url_file: None,
            table: default_table(),
            max_connections: default_max_connections(),
            connect_timeout: default_connect_timeout(),
        }
    }
}

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
            pause_refresh: default_pause_refresh(),
            row_visibility_timeout: default_row_visibility_timeout(),
        }
    }
}

fn default_row_visibility_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_pause_table() -> String {
    "outbox_dispatcher_pauses".to_owned()
}

fn default_pause_refresh() -> Duration {
    Duration::from_secs(1)
}

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

/// `[dispatchers.NAME.breaker]`: after `failures` failures in a row
/// (within `within` of each other) the dispatcher holds its events for
/// `cool_down`, then lets one through as a probe.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerSettings {
    #[serde(default = "default_breaker_failures")]
    pub failures: u32,
    #[serde(default = "default_breaker_window", with = "duration")]
    pub within: Duration,
    #[serde(default = "default_breaker_window", with = "duration")]
    pub cool_down: Duration,
}

fn default_breaker_failures() -> u32 {
    5
}

fn default_breaker_window() -> Duration {
    Duration::from_secs(30)
}

fn default_max_buffered_bytes() -> usize {
    64 << 20
}

#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DispatcherSettings {
    /// The full endpoint URL, e.g. `https://accounts/api/v1/events`; its
    /// password and secret-looking query values are masked when shown.
    #[serde(default, serialize_with = "secret::serialize_url")]
    pub url: String,
    /// A list, or (from the environment) a comma-separated string.
    #[serde(default, deserialize_with = "string_list")]
    pub events: Vec<String>,
    #[serde(default = "default_dispatch_timeout", with = "duration")]
    pub timeout: Duration,
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    /// Header name → a file holding its value (a mounted Secret), read at
    /// start-up into `headers`.
    #[serde(default)]
    pub header_files: BTreeMap<String, PathBuf>,
    /// PEM CA certificate(s): the only roots this dispatcher trusts (a
    /// private CA); unset: the system's roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) for mTLS, with `client_key_file`.
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `client_cert_file`.
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
    /// `"1.2"` or `"1.3"`; unset: 1.2 (rustls speaks nothing older).
    #[serde(default)]
    pub min_tls_version: Option<TlsVersion>,
    /// Off unless set (R-004: any failure counts).
    #[serde(default)]
    pub breaker: Option<BreakerSettings>,
    /// On a 429 or 503 with `Retry-After`, the next attempt waits the
    /// longer of `retry_delay` and what the receiver asked (the attempt
    /// still counts); off: `retry_delay` whatever the receiver said.
    #[serde(default)]
    pub respect_retry_after: bool,
    /// The longest `Retry-After` honoured.
    #[serde(default = "default_max_retry_after", with = "duration")]
    pub max_retry_after: Duration,
    /// The `Idempotency-Key` header's value: the row's id (`id`, the
    /// default), or `table-prefixed` (`outbox_events:42`) for a receiver
    /// that takes events from several tables. Stable across attempts and
    /// resends of one row.
    #[serde(default)]
    pub idempotency_key: IdempotencyKey,
    /// Standard Webhooks signatures: a file of `whsec_…` secrets, one a
    /// line, each signing every request; read again when it changes.
    #[serde(default)]
    pub signing_secret_file: Option<PathBuf>,
}

/// The form of the `Idempotency-Key` header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum IdempotencyKey {
    /// `42`
    #[default]
    #[serde(rename = "id")]
    Id,
    /// `outbox_events:42` (`database.table`, a colon, the id)
    #[serde(rename = "table-prefixed")]
    TablePrefixed,
}

fn default_max_retry_after() -> Duration {
    Duration::from_secs(300)
}

/// The lowest TLS version a dispatcher's client negotiates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum TlsVersion {
    #[serde(rename = "1.2")]
    V1_2,
    #[serde(rename = "1.3")]
    V1_3,
}

impl std::fmt::Debug for DispatcherSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatcherSettings")
            .field("url", &secret::redact_url(&self.url))
            .field("events", &self.events)
            .field("timeout", &self.timeout)
            .field("headers", &self.headers)
            .field("header_files", &self.header_files)
            .field("ca_file", &self.ca_file)
            .field("client_cert_file", &self.client_cert_file)
            .field("client_key_file", &self.client_key_file)
            .field("min_tls_version", &self.min_tls_version)
            .field("breaker", &self.breaker)
            .field("respect_retry_after", &self.respect_retry_after)
            .field("max_retry_after", &self.max_retry_after)
            .field("idempotency_key", &self.idempotency_key)
            .field("signing_secret_file", &self.signing_secret_file)
            .finish()
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSettings {
    /// `/metrics`, `/livez`, `/readyz`.
    #[serde(default = "default_admin_listen")]
    pub listen: String,
    /// `/admin/*`: loopback unless an operator exposes it.
    #[serde(default = "default_admin_api_listen")]
    pub api_listen: String,
    /// With no token the admin routes answer 403: never open.
    #[serde(default)]
    pub token: Option<Secret>,
    /// A file holding `token` (a mounted Secret), read at start-up.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Both listeners: a connection that has not sent a whole request head
    /// within this long is closed (slowloris; idle keep-alive too).
    #[serde(default = "default_header_read_timeout", with = "duration")]
    pub header_read_timeout: Duration,
    /// Both listeners: a request not answered within this long gets 408.
    #[serde(default = "default_request_timeout", with = "duration")]
    pub request_timeout: Duration,
    /// Both listeners, each: connections served at once; more wait to be
    /// accepted.
    #[serde(default = "default_admin_max_connections")]
    pub max_connections: usize,
    /// The web console (`/admin/console/`): how long a sign-in lasts.
    #[serde(default = "default_console_session_ttl", with = "duration")]
    pub console_session_ttl: Duration,
    /// The console's session cookie carries `Secure`: set it when the
    /// console is reached over HTTPS (an ingress that terminates TLS); the
    /// listener itself speaks plain HTTP (reached with a port-forward).
    #[serde(default)]
    pub console_secure_cookie: bool,
}

impl Default for AdminSettings {
    fn default() -> Self {
        Self {
            listen: default_admin_listen(),
            api_listen: default_admin_api_listen(),
            token: None,
            token_file: None,
            header_read_timeout: default_header_read_timeout(),
            request_timeout: default_request_timeout(),
            max_connections: default_admin_max_connections(),
            console_session_ttl: default_console_session_ttl(),
            console_secure_cookie: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    #[serde(default = "default_refresh_interval", with = "duration")]
    pub refresh_interval: Duration,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        Self {
            refresh_interval: default_refresh_interval(),
        }
    }
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

fn default_table() -> String {
    entity::DEFAULT_TABLE.to_owned()
}
fn default_max_connections() -> u32 {
    10
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_group_id() -> String {
    "outbox-sidecar".to_owned()
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
fn default_dispatch_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_admin_listen() -> String {
    "0.0.0.0:9464".to_owned()
}
fn default_admin_api_listen() -> String {
    "127.0.0.1:9465".to_owned()
}
fn default_header_read_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_admin_max_connections() -> usize {
    256
}
fn default_console_session_ttl() -> Duration {
    Duration::from_secs(8 * 3600)
}
fn default_refresh_interval() -> Duration {
    Duration::from_secs(15)
}
/// `OUTBOX__KAFKA__PROPERTIES__SASL_PASSWORD` arrives as `sasl_password`:
/// librdkafka names use dots, never underscores, so map them back.
pub fn property_name(key: &str) -> String {
    key.replace('_', ".")
}

/// librdkafka's default `max.poll.interval.ms`.
const DEFAULT_MAX_POLL_INTERVAL_MS: u64 = 300_000;

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
        let (env, env_headers) = header_names_from_env(env);
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
        settings.merge_headers(&env_headers)?;
        settings.read_secret_files()?;
        settings.validate()?;
        Ok(settings)
    }

    /// Header names are case-insensitive, and the environment gives them in
    /// lower case: a name set both in the file and in the environment is
    /// the environment's (it overrides the file), a name set twice
    /// otherwise is refused.
    fn merge_headers(&mut self, from_env: &BTreeSet<String>) -> Result<(), ConfigError> {
        fn merge<V>(
            prefix: &str,
            map: BTreeMap<String, V>,
            from_env: &BTreeSet<String>,
        ) -> Result<BTreeMap<String, V>, ConfigError> {
            let mut out: BTreeMap<String, V> = BTreeMap::new();
            for (name, value) in map {
                let key = format!("{prefix}.{name}");
                let Some(other) = out.keys().find(|o| o.eq_ignore_ascii_case(&name)).cloned()
                else {
                    out.insert(name, value);
                    continue;
                };
                if from_env.contains(&key) {
                    out.remove(&other);
                    out.insert(name, value);
                } else if !from_env.contains(&format!("{prefix}.{other}")) {
                    return Err(ConfigError::key(
                        key,
                        format!("{other:?} is set too; header names are case-insensitive"),
                    ));
                }
            }
            Ok(out)
        }
        for (name, d) in &mut self.dispatchers {
            let headers = std::mem::take(&mut d.headers);
            d.headers = merge(&format!("dispatchers.{name}.headers"), headers, from_env)?;
            let files = std::mem::take(&mut d.header_files);
            d.header_files = merge(&format!("dispatchers.{name}.header_files"), files, from_env)?;
        }
        Ok(())
    }

    /// `*_file` settings: each file's content becomes its setting's value.
    fn read_secret_files(&mut self) -> Result<(), ConfigError> {
        if let Some(path) = &self.database.url_file {
            if self.database.url.is_some() {
                return Err(files::both_set("database.url", "database.url_file"));
            }
            let url = files::read_secret("database.url_file", path)?;
            self.database.url = Some(DatabaseUrl::new(url));
        }
        if let Some(path) = &self.admin.token_file {
            if self.admin.token.is_some() {
                return Err(files::both_set("admin.token", "admin.token_file"));
            }
            self.admin.token = Some(Secret::new(files::read_secret("admin.token_file", path)?));
        }
        for (name, d) in &mut self.dispatchers {
            for (header, path) in &d.header_files {
                let key = format!("dispatchers.{name}.header_files.{header}");
                if let Some(set) = d.headers.keys().find(|h| h.eq_ignore_ascii_case(header)) {
                    return Err(files::both_set(
                        &format!("dispatchers.{name}.headers.{set}"),
                        &key,
                    ));
                }
                let value = files::read_secret(&key, path)?;
                d.headers.insert(header.clone(), Secret::new(value));
            }
        }
        Ok(())
    }

    /// Checks that hold for every command (the database part).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = self
            .database
            .url
            .as_ref()
            .ok_or_else(|| ConfigError::missing("database.url"))?;
        url.validate()
            .map_err(|m| ConfigError::key("database.url", m))?;
        if !valid_identifier(&self.database.table) {
            return Err(ConfigError::key(
                "database.table",
                format!(
                    "{:?} is not a plain table name (letters, digits and _)",
                    self.database.table
                ),
            ));
        }
        if self.database.table.contains('.') {
            // Quoted as one identifier, "schema.table" would read (and
            // `migrate` would create) a table with a dot in its name while
            // the change events name the real one: every event lost.
            return Err(ConfigError::key(
                "database.table",
                format!(
                    "{:?}: a schema-qualified name is not supported yet; name the table alone and \
                     choose the schema through the connection (PostgreSQL: \
                     ?options=-csearch_path%3D<schema> in database.url; MySQL: the database in the URL)",
                    self.database.table
                ),
            ));
        }
        for (key, table) in [
            ("history.table", &self.history.table),
            ("dispatch.pause_table", &self.dispatch.pause_table),
        ] {
            if !valid_identifier(table) || table.contains('.') {
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
        if self
            .history
            .table
            .eq_ignore_ascii_case(&self.dispatch.pause_table)
        {
            return Err(ConfigError::key(
                "dispatch.pause_table",
                "is history.table too; each needs its own name",
            ));
        }
        if self.history.retention.is_zero() {
            return Err(ConfigError::key("history.retention", "must be above zero"));
        }
        for (name, d) in &self.dispatchers {
            if d.respect_retry_after && d.max_retry_after.is_zero() {
                return Err(ConfigError::key(
                    format!("dispatchers.{name}.max_retry_after"),
                    "must be above zero when respect_retry_after is on",
                ));
            }
        }
        if self.dispatch.row_visibility_timeout.is_zero() {
            return Err(ConfigError::key(
                "dispatch.row_visibility_timeout",
                "must be above zero",
            ));
        }
        if self.dispatch.pause_refresh.is_zero() {
            return Err(ConfigError::key(
                "dispatch.pause_refresh",
                "must be above zero",
            ));
        }
        if self.database.max_connections == 0 {
            return Err(ConfigError::key(
                "database.max_connections",
                "must be at least 1",
            ));
        }
        if self.dispatch.max_attempts < 1 {
            return Err(ConfigError::key(
                "dispatch.max_attempts",
                format!("must be at least 1, got {}", self.dispatch.max_attempts),
            ));
        }
        if self.dispatch.max_buffered_bytes < (1 << 20) {
            return Err(ConfigError::key(
                "dispatch.max_buffered_bytes",
                "must be at least 1MiB (one payload always fits; the bound is for many)",
            ));
        }
        if self.dispatch.max_in_flight == 0 {
            return Err(ConfigError::key(
                "dispatch.max_in_flight",
                "must be at least 1",
            ));
        }
        let listen = self.admin_listen()?;
        let api_listen = self.admin_api_listen()?;
        if listen == api_listen && listen.port() != 0 {
            return Err(ConfigError::key(
                "admin.api_listen",
                format!("{api_listen} is admin.listen's address too; the admin API needs its own"),
            ));
        }
        if self.admin.header_read_timeout.is_zero() {
            return Err(ConfigError::key(
                "admin.header_read_timeout",
                "must be above zero",
            ));
        }
        if self.admin.request_timeout.is_zero() {
            return Err(ConfigError::key(
                "admin.request_timeout",
                "must be above zero",
            ));
        }
        if self.admin.console_session_ttl.is_zero() {
            return Err(ConfigError::key(
                "admin.console_session_ttl",
                "must be above zero",
            ));
        }
        if self.admin.max_connections == 0 {
            return Err(ConfigError::key(
                "admin.max_connections",
                "must be at least 1",
            ));
        }
        if let Some(token) = &self.admin.token {
            check_admin_token(token.expose())?;
        }
        let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, d) in &self.dispatchers {
            let key = |k: &str| format!("dispatchers.{name}.{k}");
            if d.url.is_empty() {
                return Err(ConfigError::missing(&key("url")));
            }
            match url::Url::parse(&d.url) {
                Ok(u) if u.scheme() == "http" || u.scheme() == "https" => {}
                Ok(u) => {
                    return Err(ConfigError::key(
                        key("url"),
                        format!("scheme {:?} is not http or https", u.scheme()),
                    ))
                }
                Err(e) => {
                    return Err(ConfigError::key(
                        key("url"),
                        format!("{:?} is not a URL: {e}", secret::redact_url(&d.url)),
                    ))
                }
            }
            if d.events.is_empty() {
                return Err(ConfigError::key(
                    key("events"),
                    "must list at least one event_name",
                ));
            }
            if d.timeout.is_zero() {
                return Err(ConfigError::key(key("timeout"), "must be above zero"));
            }
            if let Some(b) = &d.breaker {
                if b.failures == 0 {
                    return Err(ConfigError::key(
                        key("breaker.failures"),
                        "must be at least 1",
                    ));
                }
                if b.within.is_zero() {
                    return Err(ConfigError::key(
                        key("breaker.within"),
                        "must be above zero",
                    ));
                }
                if b.cool_down.is_zero() {
                    return Err(ConfigError::key(
                        key("breaker.cool_down"),
                        "must be above zero",
                    ));
                }
            }
            for (header, value) in &d.headers {
                if reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_err() {
                    return Err(ConfigError::key(
                        format!("dispatchers.{name}.headers.{header}"),
                        "is not a valid HTTP header name",
                    ));
                }
                if reqwest::header::HeaderValue::from_str(value.expose()).is_err() {
                    return Err(ConfigError::key(
                        format!("dispatchers.{name}.headers.{header}"),
                        "is not a valid HTTP header value",
                    ));
                }
            }
            crate::dispatch::tls::check(d).map_err(|e| ConfigError::key(key(e.key), e.message))?;
            for event in &d.events {
                if let Some(other) = seen.insert(event, name) {
                    return Err(ConfigError::key(
                        key("events"),
                        format!("{event:?} is already served by dispatcher {other:?}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The extra checks of `outbox-sidecar run`: Kafka and the dispatchers.
    pub fn validate_for_run(&self) -> Result<(), ConfigError> {
        if self.kafka.brokers.trim().is_empty() {
            return Err(ConfigError::missing("kafka.brokers"));
        }
        if self.kafka.topic.trim().is_empty() {
            return Err(ConfigError::missing("kafka.topic"));
        }
        if self.kafka.group_id.trim().is_empty() {
            return Err(ConfigError::missing("kafka.group_id"));
        }
        self.check_assignment_strategy()?;
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

    /// `partition.assignment.strategy`: librdkafka's assignors, all eager
    /// (`range`, `roundrobin`) or all cooperative (`cooperative-sticky`);
    /// librdkafka refuses a mix, so switching a group from one protocol to
    /// the other takes a rollout in which the two never meet in the group.
    fn check_assignment_strategy(&self) -> Result<(), ConfigError> {
        let Some((k, v)) = self
            .kafka
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
            .kafka
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

    pub fn admin_listen(&self) -> Result<SocketAddr, ConfigError> {
        self.admin.listen.parse().map_err(|_| {
            ConfigError::key(
                "admin.listen",
                format!(
                    "{:?} is not an address like \"0.0.0.0:9464\"",
                    self.admin.listen
                ),
            )
        })
    }

    pub fn admin_api_listen(&self) -> Result<SocketAddr, ConfigError> {
        self.admin.api_listen.parse().map_err(|_| {
            ConfigError::key(
                "admin.api_listen",
                format!(
                    "{:?} is not an address like \"127.0.0.1:9465\"",
                    self.admin.api_listen
                ),
            )
        })
    }

    pub fn database_url(&self) -> &str {
        self.database.url.as_ref().map(|u| u.expose()).unwrap_or("")
    }

    /// The effective settings as TOML, secrets replaced by `***`.
    pub fn redacted_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot print settings: {e}\n"))
    }
}

/// An empty token disables the admin API (as no token does); any other
/// must be long enough not to be guessed and must not be an example's
/// placeholder. The message never quotes the token.
fn check_admin_token(token: &str) -> Result<(), ConfigError> {
    if token.is_empty() {
        return Ok(());
    }
    if ADMIN_TOKEN_PLACEHOLDERS
        .iter()
        .any(|p| p.eq_ignore_ascii_case(token.trim()))
    {
        return Err(ConfigError::key(
            "admin.token",
            "is the example's placeholder; set a random token, e.g. `openssl rand -hex 32`",
        ));
    }
    let chars = token.chars().count();
    if chars < MIN_ADMIN_TOKEN_CHARS {
        return Err(ConfigError::key(
            "admin.token",
            format!(
                "is {chars} characters long, fewer than {MIN_ADMIN_TOKEN_CHARS}; set a random \
                 token, e.g. `openssl rand -hex 32`"
            ),
        ));
    }
    Ok(())
}

/// Environment variables cannot hold a dash in most shells, so in a
/// dispatcher's header name (`OUTBOX__DISPATCHERS__NAME__HEADERS__X_API_KEY`,
/// also `HEADER_FILES`) an underscore stands for a dash: `x-api-key`. Also
/// returns the keys so set (`dispatchers.name.headers.x-api-key`).
fn header_names_from_env(
    env: BTreeMap<String, String>,
) -> (BTreeMap<String, String>, BTreeSet<String>) {
    let mut keys = BTreeSet::new();
    let env = env
        .into_iter()
        .map(|(var, value)| {
            let parts: Vec<&str> = var.split("__").collect();
            match parts.as_slice() {
                [prefix, dispatchers, name, table, header]
                    if prefix.eq_ignore_ascii_case(ENV_PREFIX)
                        && dispatchers.eq_ignore_ascii_case("dispatchers")
                        && (table.eq_ignore_ascii_case("headers")
                            || table.eq_ignore_ascii_case("header_files")) =>
                {
                    let header = header.replace('_', "-");
                    keys.insert(
                        format!("dispatchers.{name}.{table}.{header}").to_ascii_lowercase(),
                    );
                    (
                        format!("{prefix}__{dispatchers}__{name}__{table}__{header}"),
                        value,
                    )
                }
                _ => (var, value),
            }
        })
        .collect();
    (env, keys)
}

fn string_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        List(Vec<String>),
        Csv(String),
    }
    Ok(match Raw::deserialize(d)? {
        Raw::List(v) => v,
        Raw::Csv(s) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
    })
}

fn valid_identifier(name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    parts.len() <= 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !p.starts_with(|c: char| c.is_ascii_digit())
        })
}

/// The `config` crate's messages already name the key; make them one line
/// and never echo a value that could be a secret (they only quote types).
fn describe(e: config::ConfigError) -> String {
    e.to_string().replace('\n', " ")
}

/// `"5s"`, `"200ms"`, `"1m 30s"` (humantime), or a bare integer of seconds.
/// Sizes as `65536`, `"512KiB"`, `"64MiB"` or `"1GiB"` (also `KB`/`MB`/`GB`
/// as powers of 1,000).
pub mod byte_size {
    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Bytes(u64),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
        match Raw::deserialize(d)? {
            Raw::Bytes(b) => usize::try_from(b).map_err(serde::de::Error::custom),
            Raw::Text(s) => parse(&s).map_err(serde::de::Error::custom),
        }
    }

    pub fn parse(s: &str) -> Result<usize, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (digits, unit) = t.split_at(split);
        let unit_factor: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "KB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            _ => 0,
        };
        digits
            .parse::<u64>()
            .ok()
            .filter(|_| unit_factor > 0)
            .and_then(|n| n.checked_mul(unit_factor))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| {
                format!("{s:?} is not a size (expected e.g. \"64MiB\" or a number of bytes)")
            })
    }

    pub fn serialize<S: Serializer>(b: &usize, s: S) -> Result<S::Ok, S::Error> {
        if b.is_multiple_of(1 << 20) {
            s.serialize_str(&format!("{}MiB", b >> 20))
        } else {
            s.serialize_str(&format!("{b}B"))
        }
    }
}

pub mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Seconds(u64),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        match Raw::deserialize(d)? {
            Raw::Seconds(s) => Ok(Duration::from_secs(s)),
            Raw::Text(s) => parse(&s).map_err(serde::de::Error::custom),
        }
    }

    /// A bare integer (as an environment variable gives it) is seconds,
    /// like an integer in the TOML file.
    pub fn parse(s: &str) -> Result<Duration, String> {
        let t = s.trim();
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(seconds) = t.parse::<u64>() {
                return Ok(Duration::from_secs(seconds));
            }
        }
        humantime::parse_duration(t)
            .map_err(|_| format!("{s:?} is not a duration (expected e.g. \"5s\" or \"200ms\")"))
    }

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }
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
