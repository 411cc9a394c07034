//! Values that must never be printed: shown as `***` by `Debug`, `Display`
//! and `Serialize`, readable only through `expose()`.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub const REDACTED: &str = "***";

#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(REDACTED)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// A database URL whose password is masked when shown.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    pub fn new(url: impl Into<String>) -> Self {
        DatabaseUrl(url.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn redacted(&self) -> String {
        redact_url(&self.0)
    }

    pub fn validate(&self) -> Result<(), String> {
        let url = &self.0;
        let known = [
            "postgres://",
            "postgresql://",
            "mysql://",
            "mariadb://",
            "sqlite:",
        ];
        if known.iter().any(|p| url.starts_with(p)) {
            Ok(())
        } else {
            Err(format!(
                "{:?} is not a postgres://, mysql:// or sqlite: URL",
                redact_url(url)
            ))
        }
    }
}

/// Whether a URL query parameter of this name can carry a credential
/// (`?password=…` for sqlx, `?token=…`, `?api_key=…`, `?sig=…`).
pub fn is_secret_query_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "pass",
        "pwd",
        "secret",
        "token",
        "key",
        "auth",
        "sig",
        "credential",
    ]
    .iter()
    .any(|s| n.contains(s))
}

/// The values of `url` that are credentials: its password and the values
/// of its secret-looking query parameters.
pub fn url_secrets(url: &url::Url) -> Vec<String> {
    let mut out: Vec<String> = url.password().map(str::to_owned).into_iter().collect();
    out.extend(
        url.query_pairs()
            .filter(|(k, v)| is_secret_query_name(k) && !v.is_empty())
            .map(|(_, v)| v.into_owned()),
    );
    out
}

/// Replaces the password of `scheme://user:password@host/…` and the values
/// of secret-looking query parameters (`?password=…`, `?token=…`) by `***`.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            let secret_query = u.query_pairs().any(|(k, _)| is_secret_query_name(&k));
            if u.password().is_none() && !secret_query {
                return url.to_owned();
            }
            if u.password().is_some() {
                let _ = u.set_password(Some(REDACTED));
            }
            if secret_query {
                let pairs: Vec<(String, String)> = u
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if is_secret_query_name(&k) {
                            REDACTED.to_owned()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        // Unparseable: show the scheme only, the rest may hold a secret.
        Err(_) => match url.split_once(':') {
            Some((scheme, _)) => format!("{scheme}:{REDACTED}"),
            None => REDACTED.to_owned(),
        },
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl std::fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for DatabaseUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

impl<'de> Deserialize<'de> for DatabaseUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(DatabaseUrl)
    }
}

/// librdkafka properties that carry credentials, under their librdkafka
/// name or as the environment gives it (`ssl_key_pem` for `ssl.key.pem`).
pub fn is_sensitive_kafka_property(key: &str) -> bool {
    let k = key.to_ascii_lowercase().replace('_', ".");
    [
        "password",
        "secret",
        "jaas",
        "token",
        "key.pem",
        "private",
        // The unsecured-JWT settings: `principal=… extension_…=…`.
        "oauthbearer.config",
        "credentials",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// A dispatcher URL with its credentials masked, for `Serialize`.
pub fn serialize_url<S: Serializer>(url: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&redact_url(url))
}

pub fn serialize_kafka_properties<S: Serializer>(
    props: &BTreeMap<String, String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    let shown: BTreeMap<&str, &str> = props
        .iter()
        .map(|(k, v)| {
            let v = if is_sensitive_kafka_property(k) {
                REDACTED
            } else {
                v.as_str()
            };
            (k.as_str(), v)
        })
        .collect();
    shown.serialize(s)
}
