//! `[dispatchers.NAME]`: one receiver each, the event names it serves and
//! how its requests are made. What needs no HTTP client is checked here;
//! the URL, the headers, the TLS files and the signing secrets are checked
//! by building the dispatcher ([`crate::dispatch::Registry`]), which every
//! command does right after loading the settings.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{duration, files, secret, ConfigError, Secret, ENV_PREFIX};

/// `[dispatchers.NAME.oauth2]`: the receiver wants an OAuth2 access token
/// (client credentials grant: Doorkeeper, Keycloak, Auth0). The token is
/// fetched once for the dispatcher on this replica, shared by its
/// requests, refreshed at 80 % of its `expires_in`, and fetched again at
/// most once per 401.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OAuth2Settings {
    /// The token endpoint (`https://auth.example/oauth/token`).
    pub token_url: String,
    pub client_id: String,
    /// A file holding the client secret (a mounted Secret), read again
    /// when it changes.
    pub client_secret_file: PathBuf,
    #[serde(default)]
    pub scope: Option<String>,
    /// Auth0's `audience`.
    #[serde(default)]
    pub audience: Option<String>,
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
    /// An egress proxy for this dispatcher's requests (`http://host:port`;
    /// an HTTPS receiver is reached through CONNECT, its TLS end to end
    /// with `ca_file`); hosts in `NO_PROXY` go direct. Unset: the
    /// environment's `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY`, as for
    /// every dispatcher (never for the database or Kafka).
    #[serde(default)]
    pub proxy: Option<String>,
    /// A file holding the proxy's `user:password` (a mounted Secret),
    /// sent as its Basic credentials.
    #[serde(default)]
    pub proxy_credentials_file: Option<PathBuf>,
    /// `"1.2"` or `"1.3"`; unset: 1.2 (rustls speaks nothing older).
    #[serde(default)]
    pub min_tls_version: Option<TlsVersion>,
    /// Off unless set (R-004: any failure counts).
    #[serde(default)]
    pub breaker: Option<BreakerSettings>,
    /// OAuth2 client credentials for the receiver; off unless set.
    #[serde(default)]
    pub oauth2: Option<OAuth2Settings>,
    /// On a 429 or 503 with `Retry-After`, the next attempt waits the
    /// longer of `retry_delay` and what the receiver asked (the attempt
    /// still counts); off: `retry_delay` whatever the receiver said.
    #[serde(default)]
    pub respect_retry_after: bool,
    /// The longest `Retry-After` honoured.
    #[serde(default = "default_max_retry_after", with = "duration")]
    pub max_retry_after: Duration,
    /// The receiver's own verdict, opt-in: an answer with one of these
    /// statuses (4xx or 5xx, e.g. `[400, 404, 409, 422]`) ends the event
    /// `failed` at once, with the attempts made and `last_error`
    /// "permanent: HTTP 422 …". Empty (the default): R-004, every failure
    /// counts the same and the event is tried `max_attempts` times.
    #[serde(default)]
    pub permanent_statuses: Vec<u16>,
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
    /// The receiver's limit for the whole group: `"200/s"`, `"3000/m"` or
    /// `"10000/h"`; each replica sends at its share by the partitions it
    /// owns. Unset: no limit.
    #[serde(default)]
    pub rate: Option<String>,
    /// Requests the limit lets go at once (the group's); unset: a tenth of
    /// a second's worth, at least 1.
    #[serde(default)]
    pub burst: Option<u32>,
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
            .field(
                "proxy",
                &self.proxy.as_deref().map(crate::config::secret_free_url),
            )
            .field("proxy_credentials_file", &self.proxy_credentials_file)
            .field("oauth2", &self.oauth2)
            .field("client_cert_file", &self.client_cert_file)
            .field("client_key_file", &self.client_key_file)
            .field("min_tls_version", &self.min_tls_version)
            .field("breaker", &self.breaker)
            .field("respect_retry_after", &self.respect_retry_after)
            .field("max_retry_after", &self.max_retry_after)
            .field("idempotency_key", &self.idempotency_key)
            .field("signing_secret_file", &self.signing_secret_file)
            .field("rate", &self.rate)
            .field("burst", &self.burst)
            .finish()
    }
}

fn default_dispatch_timeout() -> Duration {
    Duration::from_secs(10)
}

impl DispatcherSettings {
    /// The checks that need no HTTP client; `key` makes this dispatcher's
    /// full key of one of its settings.
    fn validate(&self, key: impl Fn(&str) -> String) -> Result<(), ConfigError> {
        if self.url.is_empty() {
            return Err(ConfigError::missing(&key("url")));
        }
        if self.events.is_empty() {
            return Err(ConfigError::key(
                key("events"),
                "must list at least one event_name",
            ));
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::key(key("timeout"), "must be above zero"));
        }
        if self.respect_retry_after && self.max_retry_after.is_zero() {
            return Err(ConfigError::key(
                key("max_retry_after"),
                "must be above zero when respect_retry_after is on",
            ));
        }
        if let Some(b) = &self.breaker {
            b.validate(|k| key(&format!("breaker.{k}")))?;
        }
        if let Some(bad) = self
            .permanent_statuses
            .iter()
            .find(|s| !(400..=599).contains(*s))
        {
            return Err(ConfigError::key(
                key("permanent_statuses"),
                format!("{bad} is not an HTTP error status; list 4xx or 5xx codes, e.g. [400, 404, 409, 422]"),
            ));
        }
        Ok(())
    }

    /// `header_files`: each file's content becomes its header's value.
    fn read_header_files(&mut self, name: &str) -> Result<(), ConfigError> {
        for (header, path) in &self.header_files {
            let key = format!("dispatchers.{name}.header_files.{header}");
            if let Some(set) = self.headers.keys().find(|h| h.eq_ignore_ascii_case(header)) {
                return Err(files::both_set(
                    &format!("dispatchers.{name}.headers.{set}"),
                    &key,
                ));
            }
            let value = files::read_secret(&key, path)?;
            self.headers.insert(header.clone(), Secret::new(value));
        }
        Ok(())
    }
}

impl BreakerSettings {
    fn validate(&self, key: impl Fn(&str) -> String) -> Result<(), ConfigError> {
        if self.failures == 0 {
            return Err(ConfigError::key(key("failures"), "must be at least 1"));
        }
        if self.within.is_zero() {
            return Err(ConfigError::key(key("within"), "must be above zero"));
        }
        if self.cool_down.is_zero() {
            return Err(ConfigError::key(key("cool_down"), "must be above zero"));
        }
        Ok(())
    }
}

/// Each dispatcher on its own, then together: an event name is served by
/// one dispatcher only.
pub(super) fn validate(
    dispatchers: &BTreeMap<String, DispatcherSettings>,
) -> Result<(), ConfigError> {
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (name, d) in dispatchers {
        let key = |k: &str| format!("dispatchers.{name}.{k}");
        d.validate(key)?;
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

/// Every dispatcher's `header_files` read into its `headers`.
pub(super) fn read_secret_files(
    dispatchers: &mut BTreeMap<String, DispatcherSettings>,
) -> Result<(), ConfigError> {
    for (name, d) in dispatchers {
        d.read_header_files(name)?;
    }
    Ok(())
}

/// Header names are case-insensitive, and the environment gives them in
/// lower case: a name set both in the file and in the environment is
/// the environment's (it overrides the file), a name set twice
/// otherwise is refused. `from_env`: the keys the environment set (see
/// [`header_names_from_env`]).
pub(super) fn merge_headers(
    dispatchers: &mut BTreeMap<String, DispatcherSettings>,
    from_env: &BTreeSet<String>,
) -> Result<(), ConfigError> {
    fn merge<V>(
        prefix: &str,
        map: BTreeMap<String, V>,
        from_env: &BTreeSet<String>,
    ) -> Result<BTreeMap<String, V>, ConfigError> {
        let mut out: BTreeMap<String, V> = BTreeMap::new();
        for (name, value) in map {
            let key = format!("{prefix}.{name}");
            let Some(other) = out.keys().find(|o| o.eq_ignore_ascii_case(&name)).cloned() else {
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
    for (name, d) in dispatchers {
        let headers = std::mem::take(&mut d.headers);
        d.headers = merge(&format!("dispatchers.{name}.headers"), headers, from_env)?;
        let files = std::mem::take(&mut d.header_files);
        d.header_files = merge(&format!("dispatchers.{name}.header_files"), files, from_env)?;
    }
    Ok(())
}

/// Environment variables cannot hold a dash in most shells, so in a
/// dispatcher's header name (`OUTBOX__DISPATCHERS__NAME__HEADERS__X_API_KEY`,
/// also `HEADER_FILES`) an underscore stands for a dash: `x-api-key`. Also
/// returns the keys so set (`dispatchers.name.headers.x-api-key`).
pub(super) fn header_names_from_env(
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
