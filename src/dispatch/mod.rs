//! Dispatchers: the registry that maps `event_name` to an HTTP endpoint,
//! built from `[dispatchers.NAME]` (CONTRACT §6), and the request itself.
//!
//! Any non-2xx (redirects are not followed), timeout or connection error is
//! a failure with a short readable message for `last_error`; R-004 does not
//! tell them apart, so neither does this module.

pub mod oauth2;
pub mod rate;
pub mod sign;
pub mod tls;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use entity::OutboxEventRow;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};

use crate::config::DispatcherSettings;

/// The metric label of an event name no dispatcher is configured for.
pub const UNREGISTERED: &str = "unregistered";

/// How much of an error response body goes into `last_error`.
const BODY_EXCERPT_BYTES: usize = 200;

/// A dispatcher that cannot be built from its settings: the key (e.g.
/// `dispatchers.accounts.ca_file`) and why. A configuration error like
/// [`crate::config::ConfigError`]'s, worded the same way.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {key}: {message}")]
pub struct DispatchBuildError {
    pub key: String,
    pub message: String,
}

/// How much of a 2xx body is read (to its end, so the connection is
/// reused) before the rest is dropped with the connection.
const SUCCESS_BODY_LIMIT: usize = 64 * 1024;

/// The outcome of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// A 2xx; `excerpt`: the start of the body, redacted, for the attempt log.
    Delivered { status: u16, excerpt: String },
    /// Anything else; `status` when the receiver answered. `retry_after`:
    /// the wait a 429 or 503 asked for (`respect_retry_after`), capped.
    Failed {
        error: String,
        status: Option<u16>,
        retry_after: Option<Duration>,
        /// The status is one of the dispatcher's `permanent_statuses`:
        /// the event ends `failed` at once.
        permanent: bool,
    },
    /// Not sent: the sidecar refused it before any request (a payload that
    /// is not JSON, no dispatcher registered). A failed attempt, but not
    /// the receiver's.
    NotSent { error: String },
}

pub struct Dispatcher {
    name: String,
    url: reqwest::Url,
    timeout: Duration,
    client: reqwest::Client,
    headers: HeaderMap,
    /// The configured header values, masked wherever a response echoes them.
    secrets: Vec<String>,
    /// `Some(cap)` when `respect_retry_after` is on.
    retry_after_cap: Option<Duration>,
    /// `permanent_statuses`.
    permanent: Vec<u16>,
    idempotency_key: crate::config::IdempotencyKey,
    /// Standard Webhooks signatures, when `signing_secret_file` is set.
    signer: Option<sign::Signer>,
    /// This replica's share of the group's `rate`, when set.
    throttle: Option<rate::Throttle>,
    /// OAuth2 access tokens, when `[dispatchers.NAME.oauth2]` is set.
    oauth2: Option<oauth2::TokenSource>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("name", &self.name)
            .field("url", &crate::config::secret_free_url(self.url.as_str()))
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// Builds the dispatcher `name`: the check of its URL, headers, TLS
    /// files and signing secrets (the settings checked the rest when they
    /// loaded). Each error names the key.
    pub fn new(name: &str, settings: &DispatcherSettings) -> Result<Self, DispatchBuildError> {
        let invalid = |key: &str, message: String| DispatchBuildError {
            key: format!("dispatchers.{name}.{key}"),
            message,
        };
        let url = match reqwest::Url::parse(&settings.url) {
            Ok(u) if u.scheme() == "http" || u.scheme() == "https" => u,
            Ok(u) => {
                return Err(invalid(
                    "url",
                    format!("scheme {:?} is not http or https", u.scheme()),
                ))
            }
            Err(e) => {
                let shown = crate::config::secret_free_url(&settings.url);
                return Err(invalid("url", format!("{shown:?} is not a URL: {e}")));
            }
        };
        let mut headers = HeaderMap::new();
        for (k, v) in &settings.headers {
            let key = format!("headers.{k}");
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| invalid(&key, "is not a valid HTTP header name".to_owned()))?;
            let mut value = HeaderValue::from_str(v.expose())
                .map_err(|_| invalid(&key, "is not a valid HTTP header value".to_owned()))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let secrets = settings
            .headers
            .values()
            .map(|v| v.expose().to_owned())
            .chain(crate::config::url_secrets(&url))
            .filter(|v| !v.is_empty())
            .collect();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        // No cap on idle connections (reqwest's default): the in-flight
        // limit bounds how many are ever open, and a cap below it closes a
        // connection whenever more than that many are idle at once, so a
        // replica with `max_in_flight` above the cap would reconnect
        // instead of reusing.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(settings.timeout);
        let client = match proxy(settings).map_err(|(key, message)| invalid(key, message))? {
            Some(p) => client.proxy(p),
            None => client,
        };
        let signer = settings
            .signing_secret_file
            .as_deref()
            .map(|path| {
                let key = format!("dispatchers.{name}.signing_secret_file");
                sign::Signer::load(&key, path).map_err(|e| DispatchBuildError {
                    message: e.strip_prefix(&format!("{key}: ")).unwrap_or(&e).to_owned(),
                    key,
                })
            })
            .transpose()?;
        let throttle = match &settings.rate {
            None if settings.burst.is_some() => {
                return Err(invalid("burst", "needs rate to be set".to_owned()))
            }
            None => None,
            Some(r) => Some(rate::Throttle::new(
                rate::Rate::parse(r, settings.burst).map_err(|e| {
                    let key = if e.starts_with("burst") {
                        "burst"
                    } else {
                        "rate"
                    };
                    invalid(key, e)
                })?,
            )),
        };
        let client = tls::configure(client, settings)
            .map_err(|e| invalid(e.key, e.message))?
            .build()
            .map_err(|e| match tls::build_error(settings, &e) {
                Some(tls) => invalid(tls.key, tls.message),
                None => DispatchBuildError {
                    key: format!("dispatchers.{name}"),
                    message: format!("cannot build the HTTP client: {e}"),
                },
            })?;
        let oauth2 = settings
            .oauth2
            .as_ref()
            .map(|o| oauth2::TokenSource::new(o, client.clone(), settings.timeout))
            .transpose()
            .map_err(|e| invalid("oauth2", e))?;
        Ok(Self {
            name: name.to_owned(),
            url,
            timeout: settings.timeout,
            oauth2,
            client,
            headers,
            secrets,
            retry_after_cap: settings
                .respect_retry_after
                .then_some(settings.max_retry_after),
            permanent: settings.permanent_statuses.clone(),
            idempotency_key: settings.idempotency_key,
            signer,
            throttle,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The dispatcher's rate limit on this replica, when it has one.
    pub fn throttle(&self) -> Option<&rate::Throttle> {
        self.throttle.as_ref()
    }

    /// POSTs the row's payload, its text byte for byte; `attempt` is
    /// 1-based. A payload that is not JSON (a `text` column can hold
    /// anything) is not sent: the attempt fails with the parser's reason.
    /// `payload_is_json`: the column it was read from holds only JSON (the
    /// database checked it on insert), so it is not parsed here.
    pub async fn send(
        &self,
        row: &OutboxEventRow,
        attempt: i32,
        payload_is_json: bool,
        table: Option<&str>,
        trace: Option<&TraceHeaders>,
        replay: Option<&str>,
    ) -> Delivery {
        if !payload_is_json {
            if let Err(e) = row.payload.raw_json() {
                return Delivery::NotSent {
                    error: format!("payload is not valid JSON, not sent: {e}"),
                };
            }
        }
        let body = row.payload.as_str().to_owned();
        let mut headers = self.headers.clone();
        let key = match (self.idempotency_key, table) {
            (crate::config::IdempotencyKey::TablePrefixed, Some(table)) => {
                format!("{table}:{}", row.id)
            }
            _ => row.id.to_string(),
        };
        insert(&mut headers, "idempotency-key", &key);
        if let Some(signer) = &self.signer {
            let timestamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let signature = sign::signature(&signer.keys(), &key, timestamp, body.as_bytes());
            insert(&mut headers, "webhook-id", &key);
            insert(&mut headers, "webhook-timestamp", &timestamp.to_string());
            insert(&mut headers, "webhook-signature", &signature);
        }
        insert(&mut headers, "outbox-event-name", &row.event_name);
        insert(&mut headers, "outbox-attempt", &attempt.to_string());
        // A replay's request (`events replay`): the operation's id. The
        // event's Idempotency-Key and webhook-id stay its own.
        if let Some(op) = replay {
            insert(&mut headers, "outbox-replay", op);
        }
        if let Some(trace) = trace {
            insert(&mut headers, "traceparent", &trace.traceparent);
            if let Some(state) = &trace.tracestate {
                insert(&mut headers, "tracestate", state);
            }
        }
        // OAuth2: the shared token; a 401 answered to it fetches a new one
        // (once) and the request is made again within this attempt.
        let token = match &self.oauth2 {
            None => None,
            Some(source) => match source.token(None).await {
                Ok(t) => Some(t),
                Err(error) => {
                    return Delivery::Failed {
                        error,
                        status: None,
                        retry_after: None,
                        permanent: false,
                    }
                }
            },
        };
        // The body as Bytes: a second request (after a 401) shares it.
        let body = axum::body::Bytes::from(body);
        let send = |mut headers: HeaderMap, token: Option<&str>| {
            if let Some(t) = token {
                if let Ok(mut v) = HeaderValue::from_str(&format!("Bearer {t}")) {
                    v.set_sensitive(true);
                    headers.insert(reqwest::header::AUTHORIZATION, v);
                }
            }
            self.client
                .post(self.url.clone())
                .headers(headers)
                .body(body.clone())
                .send()
        };
        let again = token.as_ref().map(|_| headers.clone());
        let mut result = send(headers, token.as_deref()).await;
        if let (Some(source), Some(used), Some(headers), Ok(resp)) =
            (&self.oauth2, &token, again, &result)
        {
            if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
                match source.token(Some(used)).await {
                    Ok(fresh) => result = send(headers, Some(&fresh)).await,
                    Err(error) => {
                        return Delivery::Failed {
                            error: format!("HTTP 401, then {error}"),
                            status: Some(401),
                            retry_after: None,
                            permanent: false,
                        }
                    }
                }
            }
        }
        match result {
            Ok(mut resp) => {
                let status = resp.status();
                if status.is_success() {
                    // Read to the end (bounded): a body left unread closes
                    // the connection instead of returning it to the pool.
                    let body = read_body(&mut resp, SUCCESS_BODY_LIMIT).await;
                    return Delivery::Delivered {
                        status: status.as_u16(),
                        excerpt: shorten(self.redact(one_line(&body))),
                    };
                }
                let asked = self.retry_after(status, resp.headers());
                let body = read_body(&mut resp, BODY_EXCERPT_BYTES * 4).await;
                let excerpt = shorten(self.redact(one_line(&body)));
                let permanent = self.permanent.contains(&status.as_u16());
                let mut error = if excerpt.is_empty() {
                    format!("HTTP {}", status.as_u16())
                } else {
                    format!("HTTP {}: {excerpt}", status.as_u16())
                };
                if permanent {
                    error = format!("permanent: {error}");
                }
                let retry_after = asked.map(|(sent, wait)| {
                    let due = chrono::Utc::now()
                        + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::zero());
                    error = format!(
                        "{error} (Retry-After: {sent}; next attempt not before {})",
                        due.format("%Y-%m-%dT%H:%M:%SZ")
                    );
                    wait
                });
                Delivery::Failed {
                    error,
                    status: Some(status.as_u16()),
                    retry_after: retry_after.filter(|_| !permanent),
                    permanent,
                }
            }
            Err(e) => Delivery::Failed {
                error: describe_error(&e, self.timeout),
                status: None,
                retry_after: None,
                permanent: false,
            },
        }
    }
}

impl Dispatcher {
    /// The `Retry-After` of a 429 or 503, when this dispatcher honours it:
    /// the value as sent and the wait it asks for, capped at
    /// `max_retry_after`. A value that is neither seconds nor an HTTP date
    /// is ignored with a WARN.
    fn retry_after(
        &self,
        status: reqwest::StatusCode,
        headers: &HeaderMap,
    ) -> Option<(String, Duration)> {
        let cap = self.retry_after_cap?;
        if status.as_u16() != 429 && status.as_u16() != 503 {
            return None;
        }
        let raw = headers.get(reqwest::header::RETRY_AFTER)?;
        let sent = String::from_utf8_lossy(raw.as_bytes()).trim().to_owned();
        match parse_retry_after(&sent, std::time::SystemTime::now()) {
            Some(wait) => Some((sent, wait.min(cap))),
            None => {
                tracing::warn!(dispatcher = %self.name, retry_after = %sent, "Retry-After is neither seconds nor an HTTP date; ignored");
                None
            }
        }
    }
}

/// A `Retry-After` value (RFC 9110 §10.2.3): delay seconds, or an HTTP
/// date (a date in the past asks for no wait).
pub fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(
            value.parse::<u64>().unwrap_or(u64::MAX),
        ));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

impl Dispatcher {
    /// A receiver may echo the request (headers included) in its error
    /// body; `last_error`, the admin API and the logs must not show them.
    fn redact(&self, mut text: String) -> String {
        for secret in &self.secrets {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), crate::config::REDACTED);
            }
            // A value like "Bearer xyz" may be echoed as just "xyz".
            if let Some((_, token)) = secret.split_once(' ') {
                if token.len() >= 8 && text.contains(token) {
                    text = text.replace(token, crate::config::REDACTED);
                }
            }
        }
        text
    }
}

/// The dispatcher's own `proxy` (with `proxy_credentials_file`), or
/// `None`: the client keeps reqwest's default, the environment's
/// `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY`. Errors name the key.
fn proxy(settings: &DispatcherSettings) -> Result<Option<reqwest::Proxy>, (&'static str, String)> {
    let Some(url) = settings.proxy.as_deref() else {
        if settings.proxy_credentials_file.is_some() {
            return Err(("proxy_credentials_file", "needs proxy to be set".to_owned()));
        }
        return Ok(None);
    };
    let shown = crate::config::secret_free_url(url);
    let parsed =
        reqwest::Url::parse(url).map_err(|e| ("proxy", format!("{shown:?} is not a URL: {e}")))?;
    if parsed.scheme() != "http" && parsed.scheme() != "https" {
        return Err((
            "proxy",
            format!("scheme {:?} is not http or https", parsed.scheme()),
        ));
    }
    let mut p = reqwest::Proxy::all(parsed)
        .map_err(|e| ("proxy", format!("{shown:?}: {e}")))?
        .no_proxy(reqwest::NoProxy::from_env());
    if let Some(path) = &settings.proxy_credentials_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            (
                "proxy_credentials_file",
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
        let (user, password) = text.trim_end_matches(['\r', '\n']).split_once(':').ok_or((
            "proxy_credentials_file",
            format!("{} does not hold user:password", path.display()),
        ))?;
        p = p.basic_auth(user, password);
    }
    Ok(Some(p))
}

/// The W3C trace context headers of one attempt (`[tracing]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceHeaders {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

fn insert(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

/// The start of a body, up to about `limit` bytes (an error body: a little
/// past the excerpt, so a secret straddling its end is still whole when
/// [`Dispatcher::redact`] looks for it); never more.
async fn read_body(resp: &mut reqwest::Response, limit: usize) -> Vec<u8> {
    let mut buf: Vec<u8> = Vec::new();
    while buf.len() < limit {
        match resp.chunk().await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk),
            _ => break,
        }
    }
    buf
}

/// A body's start as text on one line; only the first bytes are looked
/// at (an excerpt is all that is kept).
fn one_line(body: &[u8]) -> String {
    let head = &body[..body.len().min(BODY_EXCERPT_BYTES * 4)];
    let text = String::from_utf8_lossy(head);
    if !text.chars().any(char::is_control) {
        return text.into_owned();
    }
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Cuts an excerpt to [`BODY_EXCERPT_BYTES`] on a character boundary.
fn shorten(mut text: String) -> String {
    if text.len() > BODY_EXCERPT_BYTES {
        let mut end = BODY_EXCERPT_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    // Trimmed in place: most excerpts have nothing to trim.
    let trailing = text.trim_end().len();
    text.truncate(trailing);
    let leading = text.len() - text.trim_start().len();
    text.drain(..leading);
    text
}

/// A short cause without the URL (it could carry credentials).
pub(crate) fn describe_error(e: &reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        return format!("timeout after {}", humantime::format_duration(timeout));
    }
    let mut cause: Option<&dyn std::error::Error> = std::error::Error::source(e);
    let mut deepest = None;
    while let Some(c) = cause {
        deepest = Some(c.to_string());
        cause = c.source();
    }
    let kind = if e.is_connect() {
        "connection error"
    } else if e.is_request() || e.is_body() {
        "request error"
    } else {
        "HTTP error"
    };
    match deepest {
        Some(d) => format!("{kind}: {d}"),
        None => kind.to_owned(),
    }
}

/// `event_name` → dispatcher; several names may share one dispatcher.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    by_event: HashMap<String, Arc<Dispatcher>>,
    /// The outbox table, for `idempotency_key = "table-prefixed"`.
    table: Option<String>,
}

impl Registry {
    pub fn from_settings<'a>(
        dispatchers: impl IntoIterator<Item = (&'a String, &'a DispatcherSettings)>,
    ) -> Result<Self, DispatchBuildError> {
        let mut by_event = HashMap::new();
        for (name, settings) in dispatchers {
            let d = Arc::new(Dispatcher::new(name, settings)?);
            for event in &settings.events {
                by_event.insert(event.clone(), d.clone());
            }
        }
        Ok(Self {
            by_event,
            table: None,
        })
    }

    /// Counts each dispatcher's failed reloads of its signing secrets, and
    /// its OAuth2 token fetches, in `metrics`.
    pub fn count_signing_failures(&self, metrics: &crate::metrics::Metrics) {
        for d in self.by_event.values() {
            if let Some(source) = &d.oauth2 {
                source.count_in(
                    metrics
                        .oauth2_token_fetches_total
                        .with_label_values(&[&d.name, "ok"]),
                    metrics
                        .oauth2_token_fetches_total
                        .with_label_values(&[&d.name, "failed"]),
                );
            }
            if let Some(signer) = &d.signer {
                signer.count_failures_in(
                    metrics
                        .signing_secret_reload_failures_total
                        .with_label_values(&[&d.name]),
                );
            }
        }
    }

    /// The outbox table the rows come from (the prefix of a
    /// `table-prefixed` `Idempotency-Key`).
    pub fn with_table(mut self, table: &str) -> Self {
        self.table = Some(table.to_owned());
        self
    }

    /// Each rate-limited dispatcher takes its share of its limit for a
    /// replica owning `owned` of the topic's `total` partitions.
    pub fn set_shares(&self, owned: usize, total: usize) {
        for d in self.by_event.values() {
            if let Some(t) = &d.throttle {
                t.set_share(owned, total);
            }
        }
    }

    /// Each rate-limited dispatcher takes the share of a replica owning
    /// `owned` of the topic's `known` partitions (0: unknown; the highest
    /// partition owned then stands in, and the share may be too large:
    /// said at WARN), and `outbox_dispatcher_rate_share` says it.
    pub fn take_shares(
        &self,
        owned: &[i32],
        known: usize,
        topic: &str,
        metrics: &crate::metrics::Metrics,
    ) {
        let highest = owned.iter().max().map_or(0, |p| *p as usize + 1);
        if known == 0 && !owned.is_empty() {
            tracing::warn!(
                topic,
                "the topic's partition count is unknown (no metadata at the assign): rate limits \
                 take the share of the highest partition owned, which may exceed this replica's"
            );
        }
        self.set_shares(owned.len(), known.max(highest));
        for (name, view) in self.shares() {
            metrics
                .dispatcher_rate_share
                .with_label_values(&[&name])
                .set(view.share.map_or(0.0, |s| s.per_second));
        }
    }

    /// Each dispatcher's limit and this replica's share of it.
    pub fn shares(&self) -> Vec<(String, rate::ShareView)> {
        let mut out: Vec<_> = self
            .by_event
            .values()
            .filter_map(|d| d.throttle.as_ref().map(|t| (d.name.clone(), t.view())))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.dedup_by(|a, b| a.0 == b.0);
        out
    }

    pub fn get(&self, event_name: &str) -> Option<&Arc<Dispatcher>> {
        self.by_event.get(event_name)
    }

    pub fn event_names(&self) -> impl Iterator<Item = &str> {
        self.by_event.keys().map(String::as_str)
    }

    /// Sends through the registered dispatcher; an unregistered name is a
    /// failure like any other (R-004: it uses up the attempts too).
    pub async fn dispatch(
        &self,
        row: &OutboxEventRow,
        attempt: i32,
        payload_is_json: bool,
        trace: Option<&TraceHeaders>,
        replay: Option<&str>,
    ) -> (Delivery, Option<Duration>) {
        match self.get(&row.event_name) {
            Some(d) => {
                let started = Instant::now();
                let delivery = d
                    .send(
                        row,
                        attempt,
                        payload_is_json,
                        self.table.as_deref(),
                        trace,
                        replay,
                    )
                    .await;
                (delivery, Some(started.elapsed()))
            }
            None => (
                Delivery::NotSent {
                    error: format!(
                        "no dispatcher registered for event_name {:?}",
                        row.event_name
                    ),
                },
                None,
            ),
        }
    }

    /// The metric label for a row's event name: bounded to configured names.
    pub fn label<'a>(&self, event_name: &'a str) -> &'a str {
        if self.by_event.contains_key(event_name) {
            event_name
        } else {
            UNREGISTERED
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::config::Settings;

    /// The error of building the registry of `[dispatchers.accounts]` with
    /// `url` and `extra` settings (the settings themselves load).
    fn build_error_with(url: &str, extra: &str) -> String {
        let s = Settings::from_toml(
            Some(&format!(
                "[database]\nurl = \"sqlite::memory:\"\n[dispatchers.accounts]\n\
                 url = {url:?}\nevents = [\"a\"]\n{extra}\n"
            )),
            BTreeMap::new(),
        )
        .expect("the settings load");
        Registry::from_settings(&s.dispatchers)
            .expect_err(extra)
            .to_string()
    }

    fn build_error(extra: &str) -> String {
        build_error_with("https://accounts", extra)
    }

    #[test]
    fn a_proxy_or_oauth2_that_cannot_be_used_is_refused_naming_the_key() {
        assert_eq!(
            build_error("proxy = \"socks9://p:1\""),
            "invalid configuration: dispatchers.accounts.proxy: scheme \"socks9\" is not http or https"
        );
        assert_eq!(
            build_error("proxy_credentials_file = \"/x\""),
            "invalid configuration: dispatchers.accounts.proxy_credentials_file: needs proxy to be set"
        );
        let e = build_error(
            "[dispatchers.accounts.oauth2]\ntoken_url = \"https://auth/token\"\nclient_id = \"c\"\n\
             client_secret_file = \"/nonexistent/secret\"",
        );
        assert!(
            e.starts_with(
                "invalid configuration: dispatchers.accounts.oauth2: cannot read oauth2.client_secret_file /nonexistent/secret"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_dispatcher_that_cannot_be_built_is_refused_naming_the_key() {
        assert_eq!(
            build_error_with("ftp://a", ""),
            "invalid configuration: dispatchers.accounts.url: scheme \"ftp\" is not http or https"
        );
        // An unparseable URL is refused without quoting its secret.
        let e = build_error_with("https://user:upw-6@[bad/hook", "");
        assert!(
            e.starts_with("invalid configuration: dispatchers.accounts.url: ")
                && e.contains("is not a URL")
                && !e.contains("upw-6"),
            "{e}"
        );
        assert_eq!(
            build_error("[dispatchers.accounts.headers]\n\"x y\" = \"v\""),
            "invalid configuration: dispatchers.accounts.headers.x y: is not a valid HTTP header name"
        );
        assert_eq!(
            build_error("[dispatchers.accounts.headers]\nx-key = \"a\\nb\""),
            "invalid configuration: dispatchers.accounts.headers.x-key: is not a valid HTTP header value"
        );
        let e = build_error("ca_file = \"/nonexistent/ca.pem\"");
        assert!(
            e.starts_with(
                "invalid configuration: dispatchers.accounts.ca_file: cannot read /nonexistent/ca.pem:"
            ),
            "{e}"
        );
        assert_eq!(
            build_error("client_cert_file = \"/nonexistent/c.pem\""),
            "invalid configuration: dispatchers.accounts.client_key_file: must be set together with \
             client_cert_file"
        );
        let e = build_error("signing_secret_file = \"/nonexistent/secrets\"");
        assert!(
            e.starts_with(
                "invalid configuration: dispatchers.accounts.signing_secret_file: cannot read \
                 /nonexistent/secrets:"
            ),
            "{e}"
        );
    }

    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(parse_retry_after("3", now), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        // 2015-10-21 07:28:00 GMT is 1,445,412,480 s: 60 s later.
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:29:00 GMT", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO),
            "a date in the past asks for no wait"
        );
        for bad in ["", "soon", "-1", "1.5", "Wed, 21 Oct 2015"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn an_excerpt_is_one_trimmed_line_cut_on_a_character_boundary() {
        assert_eq!(shorten(one_line(b"  {\"ok\":true}\r\n")), "{\"ok\":true}");
        assert_eq!(shorten(one_line(b"a\tb\nc")), "a b c");
        assert_eq!(shorten(one_line(b"plain")), "plain");
        // Invalid UTF-8 is replaced, not dropped.
        assert_eq!(shorten(one_line(b"x\xffy")), "x\u{fffd}y");
        // 3-byte characters across the cut: never split, marked as cut.
        let long = "€".repeat(100);
        let cut = shorten(one_line(long.as_bytes()));
        assert!(cut.ends_with('…'));
        assert!(cut.len() <= BODY_EXCERPT_BYTES + '…'.len_utf8());
        assert!(cut.trim_end_matches('…').chars().all(|c| c == '€'));
        assert_eq!(cut.trim_end_matches('…').len(), 198);
    }
}
