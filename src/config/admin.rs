//! `[admin]` and `[metrics]`: the two listeners (metrics and health; the
//! admin API and the console), their limits and the admin token.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{duration, files, ConfigError, Secret};

/// The shortest `admin.token` accepted (`openssl rand -hex 32` gives 64).
pub const MIN_ADMIN_TOKEN_CHARS: usize = 24;
/// The placeholders of `config/example.toml` and
/// `deploy/kubernetes/secret.example.yaml`: refused as tokens, whatever
/// their length, so a copied example never opens the admin API.
pub const ADMIN_TOKEN_PLACEHOLDERS: &[&str] = &["change-me-use-openssl-rand-hex-32", "CHANGE_ME"];

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
    /// `outbox_pending_unexplained` counts pending rows unchanged for
    /// longer than this that no pause, breaker or earlier event of their
    /// aggregate explains.
    #[serde(default = "default_pending_unexplained_after", with = "duration")]
    pub pending_unexplained_after: Duration,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        Self {
            refresh_interval: default_refresh_interval(),
            pending_unexplained_after: default_pending_unexplained_after(),
        }
    }
}

fn default_pending_unexplained_after() -> Duration {
    Duration::from_secs(300)
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

impl AdminSettings {
    /// `token_file`'s content becomes `token`.
    pub(super) fn read_secret_files(&mut self) -> Result<(), ConfigError> {
        if let Some(path) = &self.token_file {
            if self.token.is_some() {
                return Err(files::both_set("admin.token", "admin.token_file"));
            }
            self.token = Some(Secret::new(files::read_secret("admin.token_file", path)?));
        }
        Ok(())
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let listen = self.listen_addr()?;
        let api_listen = self.api_listen_addr()?;
        if listen == api_listen && listen.port() != 0 {
            return Err(ConfigError::key(
                "admin.api_listen",
                format!("{api_listen} is admin.listen's address too; the admin API needs its own"),
            ));
        }
        if self.header_read_timeout.is_zero() {
            return Err(ConfigError::key(
                "admin.header_read_timeout",
                "must be above zero",
            ));
        }
        if self.request_timeout.is_zero() {
            return Err(ConfigError::key(
                "admin.request_timeout",
                "must be above zero",
            ));
        }
        if self.console_session_ttl.is_zero() {
            return Err(ConfigError::key(
                "admin.console_session_ttl",
                "must be above zero",
            ));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::key(
                "admin.max_connections",
                "must be at least 1",
            ));
        }
        if let Some(token) = &self.token {
            check_admin_token(token.expose())?;
        }
        Ok(())
    }

    /// `listen` as an address.
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.listen.parse().map_err(|_| {
            ConfigError::key(
                "admin.listen",
                format!("{:?} is not an address like \"0.0.0.0:9464\"", self.listen),
            )
        })
    }

    /// `api_listen` as an address.
    pub fn api_listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.api_listen.parse().map_err(|_| {
            ConfigError::key(
                "admin.api_listen",
                format!(
                    "{:?} is not an address like \"127.0.0.1:9465\"",
                    self.api_listen
                ),
            )
        })
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
