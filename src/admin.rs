//! The HTTP surface: `/metrics`, `/livez`, `/readyz` on `admin.listen`, and
//! on its own listener, `admin.api_listen`, the admin API that stands in for
//! ActiveAdmin's `outbox_events` resource and its "Reenviar" (CONTRACT §6, §9).
//!
//! `/metrics` and the health routes are open and say nothing about the
//! database beyond fixed text; they are scraped cluster-wide. `/admin/*`
//! listens on loopback by default (reached with `kubectl port-forward`) and
//! needs `Authorization: Bearer <admin.token>`, compared in constant time;
//! with no token configured those routes answer 403 — disabled, never open.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Path, RawQuery, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use entity::{OutboxEventRow, Status};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::Secret;
use crate::consumer::ConsumerHealth;
use crate::metrics::Metrics;
use crate::operator::CONFIRM_ABOVE;
use crate::store::history::{Caller, Record, Via};
use crate::store::{ListFilter, RetryRefused, Store};

/// Admin requests are small; anything larger is refused before parsing.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
const DEFAULT_LIST_LIMIT: u64 = 100;
/// What `/readyz` says when the database does not answer, whatever the error.
pub const DATABASE_UNAVAILABLE: &str = "database unavailable";

#[derive(Clone)]
pub struct AdminState {
    pub store: Store,
    pub metrics: Metrics,
    pub health: Arc<ConsumerHealth>,
    pub token: Option<Secret>,
    /// False once the pipeline task has stopped unexpectedly.
    pub alive: Arc<std::sync::atomic::AtomicBool>,
    /// `/livez` fails when the consumer loop has not turned for this long
    /// (an idle loop turns every second).
    pub stall_limit: std::time::Duration,
    /// Each dispatcher's event names (bulk resend by dispatcher).
    pub dispatchers: std::collections::BTreeMap<String, Vec<String>>,
    /// This replica's pauses and breakers (breaker states in
    /// `/admin/dispatchers`); `None` outside a running sidecar.
    pub holds: Option<Arc<crate::hold::Holds>>,
    /// Each rate-limited dispatcher's limit for the group, as configured
    /// (this replica's share is `outbox_dispatcher_rate_share`).
    pub rates: std::collections::BTreeMap<String, crate::dispatch::rate::Rate>,
}

/// The open routes of `admin.listen`: `/metrics`, `/livez`, `/readyz`.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(
            MAX_BODY_BYTES,
        ))
        .with_state(state)
}

/// The admin API of `admin.api_listen` (loopback by default): `/admin/*`,
/// behind the bearer token.
pub fn api_router(state: AdminState) -> Router {
    Router::new()
        .route("/admin/events", get(list_events))
        .route("/admin/events/retry", post(retry_all))
        .route("/admin/events/retrigger", post(retrigger))
        .route("/admin/events/{id}", get(get_event))
        .route("/admin/events/{id}/retry", post(retry_one))
        .route("/admin/dispatchers", get(list_dispatchers))
        .route("/admin/dispatchers/{name}/pause", post(pause_dispatcher))
        .route("/admin/dispatchers/{name}/resume", post(resume_dispatcher))
        .route_layer(middleware::from_fn(refuse_body))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(
            MAX_BODY_BYTES,
        ))
        .with_state(state)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// The admin API takes its parameters in the query string only: a body
/// (say `-d dry_run=true`) would otherwise be ignored without a word and
/// the request run without what it carries.
async fn refuse_body(req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is too large",
            )
        }
    };
    if !bytes.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "the admin API takes its parameters in the query string; this request has a \
                 body ({} bytes): nothing was done",
                bytes.len()
            ),
        );
    }
    next.run(Request::from_parts(parts, axum::body::Body::empty()))
        .await
}

async fn require_token(State(state): State<AdminState>, req: Request, next: Next) -> Response {
    let Some(token) = &state.token else {
        return error(
            StatusCode::FORBIDDEN,
            "the admin API is disabled: set admin.token (OUTBOX__ADMIN__TOKEN) to enable it",
        );
    };
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if !bearer_matches(presented, token) {
        let mut resp = error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token in the Authorization header",
        );
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        return resp;
    }
    next.run(req).await
}

/// Whether an `Authorization` header value carries `token` with the
/// `Bearer` scheme, the scheme's case ignored (RFC 7235). The two tokens are
/// compared as SHA-256 digests, which always have the same length, in
/// constant time: neither the token's length nor a matching prefix shows in
/// the time an answer takes.
fn bearer_matches(authorization: Option<&str>, token: &Secret) -> bool {
    let presented = authorization
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, credentials)| credentials.trim_start_matches(' '))
        .unwrap_or("");
    token_matches(presented, token)
}

/// Whether `presented` is `token`: compared as SHA-256 digests in constant
/// time (the bearer header here, the console's sign-in form too). An empty
/// token never matches.
pub(crate) fn token_matches(presented: &str, token: &Secret) -> bool {
    let presented_digest = Sha256::digest(presented.as_bytes());
    let token_digest = Sha256::digest(token.expose().as_bytes());
    let same: bool = presented_digest[..].ct_eq(&token_digest[..]).into();
    same && !presented.is_empty()
}

async fn metrics(State(state): State<AdminState>) -> Response {
    let ready = !state.health.draining.load(Ordering::Relaxed)
        && state.health.joined.load(Ordering::Relaxed)
        && state.metrics.database_up.get() == 1;
    state.metrics.ready.set(i64::from(ready));
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

async fn livez(State(state): State<AdminState>) -> Response {
    let dead = |reason: String| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"live": false, "reason": reason})),
        )
            .into_response()
    };
    if !state.alive.load(Ordering::Relaxed) {
        return dead("the pipeline task has stopped".into());
    }
    let stalled = state.health.stalled_for();
    if stalled > state.stall_limit {
        tracing::error!(stalled = ?stalled, limit = ?state.stall_limit, "the consumer loop is wedged; liveness fails");
        return dead(format!(
            "the consumer loop has not turned for {}s",
            stalled.as_secs()
        ));
    }
    (StatusCode::OK, Json(json!({"live": true}))).into_response()
}

async fn readyz(State(state): State<AdminState>) -> Response {
    let mut reasons = Vec::new();
    if state.health.draining.load(Ordering::Relaxed) {
        reasons.push("shutting down".to_owned());
    } else if !state.health.joined.load(Ordering::Relaxed) {
        reasons.push("the Kafka consumer has not joined its group yet".to_owned());
    }
    // The route is open: the reason is fixed text, the error (which can name
    // users, hosts and TLS details) goes to the log only.
    match tokio::time::timeout(Duration::from_secs(2), state.store.ping()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "not ready: the database does not answer");
            reasons.push(DATABASE_UNAVAILABLE.to_owned());
        }
        Err(_) => {
            tracing::warn!("not ready: the database gave no answer within 2s");
            reasons.push(DATABASE_UNAVAILABLE.to_owned());
        }
    }
    if reasons.is_empty() {
        (StatusCode::OK, Json(json!({"ready": true}))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"ready": false, "reason": reasons.join("; ")})),
        )
            .into_response()
    }
}

/// An event as the admin API shows it.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct EventView {
    pub id: i64,
    pub event_name: String,
    pub status: Status,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub sent_at: Option<chrono::NaiveDateTime>,
    pub created_at: chrono::NaiveDateTime,
    pub updated_at: chrono::NaiveDateTime,
    /// The payload's JSON as stored, unchanged (not re-serialised).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub payload: Option<entity::Payload>,
    /// `GET /admin/events/{id}`: the attempt log, oldest first (each
    /// attempt and each resend). Named so as not to clash with R-004's
    /// `attempts` count.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub history: Option<Vec<Record>>,
}

impl EventView {
    fn new(row: OutboxEventRow, with_payload: bool) -> Self {
        Self {
            id: row.id,
            event_name: row.event_name,
            status: row.status,
            attempts: row.attempts,
            last_error: row.last_error,
            sent_at: row.sent_at,
            created_at: row.created_at,
            updated_at: row.updated_at,
            payload: with_payload.then_some(row.payload),
            history: None,
        }
    }
}

/// The query parameters of `GET /admin/events`.
const LIST_PARAMS: &[&str] = &["status", "event_name", "limit", "before", "held"];

fn parse_status(s: Option<&str>) -> Result<Option<Status>, Box<Response>> {
    s.map(|s| s.parse::<Status>())
        .transpose()
        .map_err(|e| Box::new(error(StatusCode::BAD_REQUEST, format!("status: {e}"))))
}

async fn list_events(State(state): State<AdminState>, RawQuery(raw): RawQuery) -> Response {
    let parsed = Params::query(raw.as_deref(), LIST_PARAMS).and_then(|p| {
        Ok((
            p.text("status")?,
            p.text("event_name")?,
            p.number::<u64>("limit", "a number of events")?,
            p.number::<i64>("before", "an event id")?,
            p.flag("held")?.unwrap_or(false),
        ))
    });
    let (status_text, event_name, limit, before, held) = match parsed {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let status = match parse_status(status_text.as_deref()) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    if held && state.store.ordering().is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            format!("held: {}", crate::store::ordering::HELD_NEEDS_ORDERING),
        );
    }
    let limit = limit.unwrap_or(DEFAULT_LIST_LIMIT).min(10_000);
    let filter = ListFilter {
        status,
        event_name: event_name.clone(),
        limit: Some(limit),
        before,
        held,
        ..ListFilter::default()
    };
    match state.store.list(&filter).await {
        Ok(rows) => {
            // A full page has a next one (RFC 8288 `Link`, rel="next"); the
            // body stays the plain list.
            let next = rows
                .last()
                .filter(|_| rows.len() as u64 == limit)
                .map(|last| {
                    let mut query = url::form_urlencoded::Serializer::new(String::new());
                    if let Some(s) = &status_text {
                        query.append_pair("status", s);
                    }
                    if let Some(n) = &event_name {
                        query.append_pair("event_name", n);
                    }
                    if held {
                        query.append_pair("held", "true");
                    }
                    query.append_pair("limit", &limit.to_string());
                    query.append_pair("before", &last.id.to_string());
                    format!("</admin/events?{}>; rel=\"next\"", query.finish())
                });
            let body = Json(
                rows.into_iter()
                    .map(|r| EventView::new(r, false))
                    .collect::<Vec<_>>(),
            );
            match next {
                Some(link) => ([(axum::http::header::LINK, link)], body).into_response(),
                None => body.into_response(),
            }
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn get_event(
    State(state): State<AdminState>,
    Path(id): Path<i64>,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Err(e) = Params::query(raw.as_deref(), &[]) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    match state.store.get(id).await {
        Ok(Some(row)) => {
            let history = match state.store.history(id).await {
                Ok(h) => h,
                Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            };
            let mut view = EventView::new(row, true);
            view.history = state.store.history_table().map(|_| history);
            Json(view).into_response()
        }
        Ok(None) => error(StatusCode::NOT_FOUND, format!("event {id} not found")),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// `?label=` on an action: recorded with it (who, why); the only
/// parameter an action on one event or dispatcher takes.
fn label(raw: Option<&str>) -> Result<Option<String>, String> {
    Params::query(raw, &["label"])?.text("label")
}

async fn retry_one(
    State(state): State<AdminState>,
    Path(id): Path<i64>,
    RawQuery(raw): RawQuery,
) -> Response {
    let label = match label(raw.as_deref()) {
        Ok(l) => l,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let caller = Caller::new(Via::AdminApi, label);
    match crate::operator::resend_one(&state.store, Some(&state.metrics), id, &caller).await {
        Ok(Ok(row)) => Json(EventView::new(row, false)).into_response(),
        Ok(Err(r @ RetryRefused::NotFound(_))) => error(StatusCode::NOT_FOUND, r.to_string()),
        Ok(Err(r @ RetryRefused::NotFailed { status, .. })) => (
            StatusCode::CONFLICT,
            Json(json!({"error": r.to_string(), "status": status})),
        )
            .into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// The query parameters of `POST /admin/events/retry`: `status` (only
/// `failed`), the filters, `dry_run` (`true`: the count and a sample,
/// nothing changed), `confirm` (the count a dry run returned, needed above
/// [`CONFIRM_ABOVE`] rows) and `label` (recorded with each resend).
const RETRY_ALL_PARAMS: &[&str] = &[
    "status",
    "event_name",
    "dispatcher",
    "error_contains",
    "failed_since",
    "failed_until",
    "dry_run",
    "confirm",
    "label",
];

/// The filters of a bulk resend from request parameters (the API's query
/// string, the console's form).
pub(crate) fn resend_filters(p: &Params) -> Result<crate::operator::ResendFilters, String> {
    Ok(crate::operator::ResendFilters {
        event_name: p.text("event_name")?,
        dispatcher: p.text("dispatcher")?,
        error_contains: p.text("error_contains")?,
        failed_since: p.text("failed_since")?,
        failed_until: p.text("failed_until")?,
    })
}

/// Why a bulk resend whose filters are right was not done.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ConfirmRefused {
    /// More than [`CONFIRM_ABOVE`] rows match and no confirmation was given.
    Needed { count: u64 },
    /// The confirmation is not the number of rows that match now.
    Mismatch { count: u64, confirm: u64 },
}

impl ConfirmRefused {
    /// How many rows match now.
    pub(crate) fn count(&self) -> u64 {
        match self {
            Self::Needed { count } | Self::Mismatch { count, .. } => *count,
        }
    }
}

/// Whether a bulk resend of `count` rows (counted just before it) may go
/// ahead with `confirm`: above [`CONFIRM_ABOVE`] rows only with the count
/// itself, and a confirmation given must be the count at any size, so a
/// resend takes what its dry run showed and not a widened filter. (A row
/// that fails between this count and the resend is resent too.)
pub(crate) fn check_confirm(count: u64, confirm: Option<u64>) -> Result<(), ConfirmRefused> {
    match confirm {
        Some(confirm) if confirm != count => Err(ConfirmRefused::Mismatch { count, confirm }),
        None if count > CONFIRM_ABOVE => Err(ConfirmRefused::Needed { count }),
        _ => Ok(()),
    }
}

async fn retry_all(State(state): State<AdminState>, RawQuery(raw): RawQuery) -> Response {
    let parsed = Params::query(raw.as_deref(), RETRY_ALL_PARAMS).and_then(|p| {
        crate::operator::check_resend_status(p.text("status")?.as_deref())?;
        Ok((
            resend_filters(&p)?,
            p.flag("dry_run")?.unwrap_or(false),
            p.number::<u64>("confirm", "the number of events a dry run counted")?,
            p.text("label")?,
        ))
    });
    let (filters, dry_run, confirm, label) = match parsed {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let filter = match filters.to_filter(&state.dispatchers) {
        Ok(f) => f,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let (count, sample) = match crate::operator::preview_resend(&state.store, &filter).await {
        Ok(preview) => preview,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    if dry_run {
        return Json(json!({
            "would_resend": count,
            "confirm_required": count > CONFIRM_ABOVE,
            "sample": sample.into_iter().map(|r| EventView::new(r, false)).collect::<Vec<_>>(),
        }))
        .into_response();
    }
    if let Err(refused) = check_confirm(count, confirm) {
        let message = match refused {
            ConfirmRefused::Needed { count } => format!(
                "{count} failed events match, more than {CONFIRM_ABOVE}: nothing was resent; \
                 check them with dry_run=true, then repeat with confirm={count}"
            ),
            ConfirmRefused::Mismatch { count, confirm } => format!(
                "confirm={confirm}, but {count} failed events match now: nothing was resent; \
                 check them with dry_run=true, then repeat with confirm={count}"
            ),
        };
        return (
            StatusCode::CONFLICT,
            Json(json!({ "error": message, "would_resend": refused.count() })),
        )
            .into_response();
    }
    let caller = Caller::new(Via::AdminApi, label);
    match crate::operator::resend_failed(&state.store, Some(&state.metrics), &filter, &caller).await
    {
        Ok(n) => Json(json!({ "resent": n })).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// `POST /admin/events/retrigger?ids=1,2` or `?pending_older_than=10m`:
/// pending rows touched so Debezium announces them again.
async fn retrigger(State(state): State<AdminState>, RawQuery(raw): RawQuery) -> Response {
    let q =
        Params::query(raw.as_deref(), &["ids", "pending_older_than", "event_name"]).and_then(|p| {
            Ok((
                p.text("ids")?,
                p.text("pending_older_than")?,
                p.text("event_name")?,
            ))
        });
    let (ids, pending_older_than, event_name) = match q {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let ids: Result<Vec<i64>, _> = ids
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::parse::<i64>)
        .collect();
    let Ok(ids) = ids else {
        return error(
            StatusCode::BAD_REQUEST,
            "ids: expected comma-separated event ids",
        );
    };
    let filter =
        match crate::operator::retrigger_filter(ids, pending_older_than.as_deref(), event_name) {
            Ok(f) => f,
            Err(e) => return error(StatusCode::BAD_REQUEST, e),
        };
    match state.store.retrigger(&filter).await {
        Ok(n) => {
            tracing::info!(count = n, "pending events retriggered by an operator");
            Json(json!({ "retriggered": n })).into_response()
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn list_dispatchers(State(state): State<AdminState>, RawQuery(raw): RawQuery) -> Response {
    if let Err(e) = Params::query(raw.as_deref(), &[]) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    let breakers = state
        .holds
        .as_ref()
        .map(|h| h.breaker_states())
        .unwrap_or_default();
    match crate::operator::dispatchers(&state.store, &state.dispatchers, &breakers).await {
        Ok(list) => Json(list).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

fn dispatcher_answer(
    result: Result<crate::operator::DispatcherAction, crate::operator::DispatcherError>,
) -> Response {
    match result {
        Ok(action) => {
            tracing::info!(dispatcher = %action.dispatcher, message = %action.message, "dispatcher changed by an operator");
            Json(action).into_response()
        }
        Err(e @ crate::operator::DispatcherError::Unknown { .. }) => {
            error(StatusCode::NOT_FOUND, e.to_string())
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn pause_dispatcher(
    State(state): State<AdminState>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let label = match label(raw.as_deref()) {
        Ok(l) => l,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let caller = Caller::new(Via::AdminApi, label);
    dispatcher_answer(
        crate::operator::pause(&state.store, &state.dispatchers, &name, &caller).await,
    )
}

async fn resume_dispatcher(
    State(state): State<AdminState>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Err(e) = Params::query(raw.as_deref(), &[]) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    dispatcher_answer(crate::operator::resume(&state.store, &state.dispatchers, &name).await)
}

/// How the request parameters are named in errors.
pub(crate) const QUERY: &str = "query parameter";
pub(crate) const FORM: &str = "form field";

/// Request parameters (a query string or a urlencoded form) checked against
/// the names a route takes. A name the route does not take, or a name given
/// twice, is refused rather than ignored: an ignored filter widens a bulk
/// action to every row.
#[derive(Debug)]
pub(crate) struct Params {
    noun: &'static str,
    values: BTreeMap<String, String>,
    /// Forms send every field, filled in or not: there an empty value is no
    /// value. In the API's query string an empty value is refused.
    empty_is_absent: bool,
}

impl Params {
    /// `raw` urlencoded; `noun` names the parameters in errors ([`QUERY`],
    /// [`FORM`]); `allowed` is every name the route takes.
    pub(crate) fn parse(
        raw: &[u8],
        noun: &'static str,
        allowed: &[&str],
        empty_is_absent: bool,
    ) -> Result<Self, String> {
        let mut values = BTreeMap::new();
        for (key, value) in url::form_urlencoded::parse(raw) {
            if !allowed.contains(&key.as_ref()) {
                return Err(if allowed.is_empty() {
                    format!("unknown {noun} `{key}`: this route takes none")
                } else {
                    format!(
                        "unknown {noun} `{key}`; expected one of: {}",
                        allowed.join(", ")
                    )
                });
            }
            if values
                .insert(key.clone().into_owned(), value.into_owned())
                .is_some()
            {
                return Err(format!("{noun} `{key}` is given twice; give it once"));
            }
        }
        Ok(Self {
            noun,
            values,
            empty_is_absent,
        })
    }

    /// The admin API's query string: an empty value is refused.
    pub(crate) fn query(raw: Option<&str>, allowed: &[&str]) -> Result<Self, String> {
        Self::parse(raw.unwrap_or("").as_bytes(), QUERY, allowed, false)
    }

    /// The value of `key`, if given.
    pub(crate) fn text(&self, key: &str) -> Result<Option<String>, String> {
        match self.values.get(key) {
            None => Ok(None),
            Some(v) if v.is_empty() && self.empty_is_absent => Ok(None),
            Some(v) if v.is_empty() => Err(format!(
                "{} `{key}` is empty: give a value or leave it out",
                self.noun
            )),
            Some(v) => Ok(Some(v.clone())),
        }
    }

    /// A boolean: exactly `true` or `false`, anything else refused.
    pub(crate) fn flag(&self, key: &str) -> Result<Option<bool>, String> {
        match self.values.get(key).map(String::as_str) {
            None => Ok(None),
            Some("") if self.empty_is_absent => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(other) => Err(format!(
                "{} `{key}`: expected `true` or `false`, not {other:?}",
                self.noun
            )),
        }
    }

    /// A number; `what` says what it counts, for the error.
    pub(crate) fn number<T: std::str::FromStr>(
        &self,
        key: &str,
        what: &str,
    ) -> Result<Option<T>, String> {
        self.text(key)?
            .map(|v| {
                v.parse::<T>()
                    .map_err(|_| format!("{} `{key}`: expected {what}, not {v:?}", self.noun))
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let token = Secret::new(TOKEN);
        for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
            let header = format!("{scheme} {TOKEN}");
            assert!(bearer_matches(Some(&header), &token), "{header}");
        }
        assert!(bearer_matches(Some(&format!("Bearer   {TOKEN}")), &token));
    }

    #[test]
    fn anything_but_the_exact_token_is_refused() {
        let token = Secret::new(TOKEN);
        let refused = [
            None,
            Some(String::new()),
            Some("Bearer".to_owned()),
            Some("Bearer ".to_owned()),
            Some(TOKEN.to_owned()),
            Some(format!("Basic {TOKEN}")),
            Some(format!("Bearerx {TOKEN}")),
            Some(format!("Bearer {}", &TOKEN[..31])),
            Some(format!("Bearer {TOKEN}0")),
            Some(format!("Bearer {}", TOKEN.to_uppercase())),
        ];
        for header in refused {
            assert!(!bearer_matches(header.as_deref(), &token), "{header:?}");
        }
        // An empty configured token never opens the API.
        assert!(!bearer_matches(Some("Bearer "), &Secret::new("")));
    }

    #[test]
    fn an_unknown_or_repeated_parameter_is_refused_by_name() {
        let allowed = ["event_name", "dry_run"];
        let parse = |raw: &str| Params::query(Some(raw), &allowed);
        assert_eq!(
            parse("eventname=x").unwrap_err(),
            "unknown query parameter `eventname`; expected one of: event_name, dry_run"
        );
        assert_eq!(
            parse("dry_run=true&dry_run=false").unwrap_err(),
            "query parameter `dry_run` is given twice; give it once"
        );
        assert_eq!(
            Params::query(Some("label=x"), &[]).unwrap_err(),
            "unknown query parameter `label`: this route takes none"
        );
        assert!(Params::query(None, &[]).is_ok());
        assert!(Params::query(Some(""), &[]).is_ok());
        let p = parse("event_name=a%2Eb").unwrap();
        assert_eq!(p.text("event_name").unwrap().as_deref(), Some("a.b"));
        assert_eq!(
            parse("event_name=")
                .unwrap()
                .text("event_name")
                .unwrap_err(),
            "query parameter `event_name` is empty: give a value or leave it out"
        );
        let form = Params::parse(b"event_name=&csrf=x", FORM, &["event_name", "csrf"], true);
        assert_eq!(form.unwrap().text("event_name").unwrap(), None);
    }

    #[test]
    fn booleans_are_true_or_false_and_nothing_else() {
        let flag = |raw: &str| Params::query(Some(raw), &["dry_run"])?.flag("dry_run");
        assert_eq!(flag("dry_run=true"), Ok(Some(true)));
        assert_eq!(flag("dry_run=false"), Ok(Some(false)));
        assert_eq!(flag(""), Ok(None));
        for bad in ["yes", "True", "TRUE", "1", "0", "", "on", "true%20"] {
            assert_eq!(
                flag(&format!("dry_run={bad}")).unwrap_err(),
                format!(
                    "query parameter `dry_run`: expected `true` or `false`, not {:?}",
                    bad.replace("%20", " ")
                ),
                "{bad}"
            );
        }
        assert!(flag("dry_run").is_err(), "a bare key is an empty value");
    }

    #[test]
    fn above_the_threshold_a_resend_needs_the_count() {
        assert_eq!(check_confirm(0, None), Ok(()));
        assert_eq!(check_confirm(CONFIRM_ABOVE, None), Ok(()));
        assert_eq!(check_confirm(CONFIRM_ABOVE, Some(CONFIRM_ABOVE)), Ok(()));
        assert_eq!(
            check_confirm(3, Some(4)),
            Err(ConfirmRefused::Mismatch {
                count: 3,
                confirm: 4
            })
        );
        let above = CONFIRM_ABOVE + 1;
        assert_eq!(
            check_confirm(above, None),
            Err(ConfirmRefused::Needed { count: above })
        );
        assert_eq!(
            check_confirm(above, Some(above - 1)).unwrap_err().count(),
            above
        );
        assert_eq!(check_confirm(above, Some(above)), Ok(()));
    }
}
