//! `[tracing]`: W3C trace context from the application's request to the
//! receiver, and spans exported over OTLP. Off by default: nothing is
//! read, sent or exported.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[tracing]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TracingSettings {
    /// The outbox table's column holding the W3C `traceparent` of the
    /// request that wrote the event (a string column). Set: every POST
    /// carries a `traceparent` that is a child of it, and the attempt log
    /// keeps the trace id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<String>,
    /// The column holding the request's `tracestate`, passed on as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_column: Option<String>,
    /// OTLP/HTTP (protobuf) traces endpoint, e.g.
    /// `http://otel-collector:4318/v1/traces`: one span per attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// The exported spans' `service.name`.
    #[serde(default = "default_service_name")]
    pub service_name: String,
}

impl Default for TracingSettings {
    fn default() -> Self {
        Self {
            column: None,
            state_column: None,
            otlp_endpoint: None,
            service_name: default_service_name(),
        }
    }
}

fn default_service_name() -> String {
    "outbox-sidecar".to_owned()
}

impl TracingSettings {
    /// Whether attempts carry trace context at all (a column to read, or
    /// spans to export).
    pub fn enabled(&self) -> bool {
        self.column.is_some() || self.otlp_endpoint.is_some()
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (key, column) in [
            ("tracing.column", &self.column),
            ("tracing.state_column", &self.state_column),
        ] {
            if let Some(c) = column {
                if !super::database::valid_identifier(c) || c.contains('.') {
                    return Err(ConfigError::key(
                        key,
                        format!("{c:?} is not a plain column name (letters, digits and _)"),
                    ));
                }
            }
        }
        if self.state_column.is_some() && self.column.is_none() {
            return Err(ConfigError::key(
                "tracing.state_column",
                "needs tracing.column (the traceparent the tracestate goes with)",
            ));
        }
        if let Some(endpoint) = &self.otlp_endpoint {
            match url::Url::parse(endpoint) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                _ => {
                    return Err(ConfigError::key(
                        "tracing.otlp_endpoint",
                        format!(
                        "{:?} is not an http(s) URL (e.g. http://otel-collector:4318/v1/traces)",
                        super::secret_free_url(endpoint)
                    ),
                    ))
                }
            }
        }
        if self.service_name.trim().is_empty() {
            return Err(ConfigError::key(
                "tracing.service_name",
                "must not be empty",
            ));
        }
        Ok(())
    }
}
