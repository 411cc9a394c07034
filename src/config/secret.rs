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

/// Replaces the password of `scheme://user:password@host/…` by `***`.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some(REDACTED));
            u.to_string()
        }
        Ok(_) => url.to_owned(),
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

/// librdkafka properties that carry credentials.
pub fn is_sensitive_kafka_property(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ["password", "secret", "jaas", "token", "key.pem", "private"]
        .iter()
        .any(|s| k.contains(s))
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
