//! `[database]`: where the outbox table is, and the pool to it.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{duration, files, ConfigError, DatabaseUrl};

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
    /// A pooled connection unused this long is closed: a replica with
    /// nothing to send shrinks to the one connection its periodic reads
    /// (gauges, pauses) keep open.
    #[serde(default = "default_idle_timeout", with = "duration")]
    pub idle_timeout: Duration,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: None,
            url_file: None,
            table: default_table(),
            max_connections: default_max_connections(),
            connect_timeout: default_connect_timeout(),
            idle_timeout: default_idle_timeout(),
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
fn default_idle_timeout() -> Duration {
    Duration::from_secs(60)
}

impl DatabaseSettings {
    /// `url_file`'s content becomes `url`.
    pub(super) fn read_secret_files(&mut self) -> Result<(), ConfigError> {
        if let Some(path) = &self.url_file {
            if self.url.is_some() {
                return Err(files::both_set("database.url", "database.url_file"));
            }
            let url = files::read_secret("database.url_file", path)?;
            self.url = Some(DatabaseUrl::new(url));
        }
        Ok(())
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let url = self
            .url
            .as_ref()
            .ok_or_else(|| ConfigError::missing("database.url"))?;
        url.validate()
            .map_err(|m| ConfigError::key("database.url", m))?;
        if !valid_identifier(&self.table) {
            return Err(ConfigError::key(
                "database.table",
                format!(
                    "{:?} is not a plain table name (letters, digits and _)",
                    self.table
                ),
            ));
        }
        if self.table.contains('.') {
            // Quoted as one identifier, "schema.table" would read (and
            // `migrate` would create) a table with a dot in its name while
            // the change events name the real one: every event lost.
            return Err(ConfigError::key(
                "database.table",
                format!(
                    "{:?}: a schema-qualified name is not supported yet; name the table alone and \
                     choose the schema through the connection (PostgreSQL: \
                     ?options=-csearch_path%3D<schema> in database.url; MySQL: the database in the URL)",
                    self.table
                ),
            ));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::key(
                "database.max_connections",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// Letters, digits and `_`, not starting with a digit; at most one `.`
/// between two such parts (a schema-qualified name, refused by the callers
/// with their own message).
pub(super) fn valid_identifier(name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    parts.len() <= 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !p.starts_with(|c: char| c.is_ascii_digit())
        })
}
