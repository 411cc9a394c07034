//! The HTTP surface: `/metrics`, `/livez`, `/readyz` on `admin.listen`, and
//! on its own listener, `admin.api_listen`, the admin API that stands in for
//! ActiveAdmin's `outbox_events` resource and its "Reenviar" (CONTRACT §6, §9).
//!
//! `/metrics` and the health routes are open and say nothing about the
//! database beyond fixed text; they are scraped cluster-wide. `/admin/*`
//! listens on loopback by default (reached with `kubectl port-forward`) and
//! needs `Authorization: Bearer <admin.token>`, compared in constant time;
//! with no token configured those routes answer 403 — disabled, never open.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Secret;
use crate::consumer::ConsumerHealth;
use crate::http::params::Params;
use crate::http::resend::{check_confirm, resend_filters, ConfirmRefused};
use crate::http::token::bearer_matches;
use crate::metrics::Metrics;
use crate::operator::CONFIRM_ABOVE;
use crate::store::history::{Caller, Record, Via};
use crate::store::{ListFilter, RetryRefused, Store};
use axum::extract::{DefaultBodyLimit, Path, RawQuery, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use entity::{OutboxEventRow, Status};
use serde::{Deserialize, Serialize};

mod dispatchers;
pub mod openapi;
mod operations;
use serde_json::json;

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
    /// Resume, retrigger and bulk resend run as operations of the sidecar.
    pub operations: crate::operations::Operations,
    /// `dispatch.retry_delay` and `dispatch.max_attempts` (`…/why`).
    pub retry_delay: Duration,
    pub max_attempts: i32,
    /// This replica's scheduler and the group's metadata (`…/why`); `None`
    /// outside a running sidecar.
    pub scheduler: Option<crate::consumer::Asker>,
    pub kafka: Option<crate::config::KafkaSettings>,
}

impl AdminState {
    /// Why event `id` is not sent yet, answered by this replica.
    pub async fn why(&self, id: i64) -> Result<Option<crate::why::Why>, crate::store::StoreError> {
        let breakers = self
            .holds
            .as_ref()
            .map(|h| h.breaker_states().into_iter().collect())
            .unwrap_or_default();
        let scheduler = match &self.scheduler {
            Some(a) => a.ask(id).await,
            None => None,
        };
        // The group's members only when this replica has no work for it.
        let members = match (
            &self.kafka,
            scheduler.as_ref().and_then(|a| a.here.as_ref()),
        ) {
            (_, Some(_)) => Ok(Vec::new()),
            (None, None) => Err("not a running sidecar".to_owned()),
            (Some(k), None) => {
                let k = k.clone();
                tokio::task::spawn_blocking(move || {
                    crate::consumer::client::group_members(&k, Duration::from_secs(5))
                })
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
            }
        };
        let asked = crate::why::Asked {
            store: &self.store,
            dispatchers: &self.dispatchers,
            retry_delay: self.retry_delay,
            max_attempts: self.max_attempts,
            replica: Some(crate::why::Replica {
                name: self.operations.replica(),
                breakers,
                lags: self.metrics.consumer_lags(),
                scheduler,
                members,
                next_probes: self
                    .holds
                    .as_ref()
                    .map(|h| h.breaker_next_probes().into_iter().collect())
                    .unwrap_or_default(),
            }),
        };
        crate::why::why(&asked, id).await
    }
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
    api_routes()
        .into_iter()
        .fold(Router::new(), |r, (path, route)| r.route(path, route))
        .route_layer(middleware::from_fn(refuse_body))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(
            MAX_BODY_BYTES,
        ))
        .with_state(state)
}

/// The admin API's routes: [`api_router`] is made of them, and the
/// contract's test walks them against [`openapi::document`].
fn api_routes() -> Vec<(&'static str, axum::routing::MethodRouter<AdminState>)> {
    vec![
        ("/admin/events", get(list_events)),
        ("/admin/events/retry", post(retry_all)),
        ("/admin/events/retrigger", post(retrigger)),
        ("/admin/events/replay", post(operations::replay)),
        ("/admin/events/{id}", get(get_event)),
        ("/admin/events/{id}/retry", post(retry_one)),
        ("/admin/events/{id}/why", get(why_event)),
        ("/admin/dispatchers", get(dispatchers::list_dispatchers)),
        (
            "/admin/dispatchers/{name}/pause",
            post(dispatchers::pause_dispatcher),
        ),
        (
            "/admin/dispatchers/{name}/resume",
            post(dispatchers::resume_dispatcher),
        ),
        ("/admin/operations", get(operations::list_operations)),
        (
            "/admin/operations/{id}",
            get(operations::get_operation).delete(operations::cancel_operation),
        ),
        ("/admin/openapi.json", get(openapi::openapi_json)),
    ]
}

/// The paths of the admin API's routes, as the router has them.
pub fn api_paths() -> Vec<&'static str> {
    api_routes().into_iter().map(|(p, _)| p).collect()
}

pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
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
#[derive(Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct EventView {
    pub id: i64,
    pub event_name: String,
    /// `pending`, `sent` or `failed`.
    #[schema(value_type = String)]
    pub status: Status,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub sent_at: Option<chrono::NaiveDateTime>,
    pub created_at: chrono::NaiveDateTime,
    pub updated_at: chrono::NaiveDateTime,
    /// The payload's JSON as stored, unchanged (not re-serialised).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    #[schema(value_type = Option<Object>)]
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

#[utoipa::path(get, path = "/admin/events", tag = "events",
    params(("status" = Option<String>, Query, description = "pending, sent or failed"), ("event_name" = Option<String>, Query, description = ""), ("limit" = Option<u64>, Query, description = "rows, default 50"), ("before" = Option<i64>, Query, description = "the next page: ids below this one"), ("held" = Option<bool>, Query, description = "only events held behind a failed earlier event of their aggregate ([ordering])")),
    responses((status = 200, description = "events, newest first; a full page links the next (Link: rel=next)", body = [EventView]),
        (status = 400, description = "a parameter the route does not take, given twice, empty or malformed: nothing done", body = crate::admin::openapi::ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = crate::admin::openapi::ErrorBody),
        (status = 503, description = "the database does not answer", body = crate::admin::openapi::ErrorBody),))]
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

#[utoipa::path(get, path = "/admin/events/{id}", tag = "events",
    params(("id" = i64, Path, description = "the event's id")),
    responses((status = 200, description = "the event with its payload and its attempt log (history)", body = EventView),
        (status = 404, description = "no such event", body = crate::admin::openapi::ErrorBody),
        (status = 400, description = "a parameter the route does not take, given twice, empty or malformed: nothing done", body = crate::admin::openapi::ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = crate::admin::openapi::ErrorBody),
        (status = 503, description = "the database does not answer", body = crate::admin::openapi::ErrorBody),))]
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

/// The caller of an action on one event or dispatcher: the admin API,
/// with its `?label=` (who, why; the only parameter such an action
/// takes), or what is wrong with the query (a 400).
fn api_caller(raw: Option<&str>) -> Result<Caller, String> {
    let label = Params::query(raw, &["label"])?.text("label")?;
    Ok(Caller::new(Via::AdminApi, label))
}

/// `GET /admin/events/{id}/why`: why the event is not sent yet.
#[utoipa::path(get, path = "/admin/events/{id}/why", tag = "events",
    params(("id" = i64, Path, description = "the event's id")),
    responses((status = 200, description = "why the event is not sent yet", body = crate::why::Why),
        (status = 404, description = "no such event", body = crate::admin::openapi::ErrorBody),
        (status = 400, description = "a parameter the route does not take, given twice, empty or malformed: nothing done", body = crate::admin::openapi::ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = crate::admin::openapi::ErrorBody),
        (status = 503, description = "the database does not answer", body = crate::admin::openapi::ErrorBody),))]
async fn why_event(
    State(state): State<AdminState>,
    Path(id): Path<i64>,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Err(e) = Params::query(raw.as_deref(), &[]) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    match state.why(id).await {
        Ok(Some(why)) => Json(why).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, format!("event {id} not found")),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

#[utoipa::path(post, path = "/admin/events/{id}/retry", tag = "events",
    params(("id" = i64, Path, description = "the event's id"), ("label" = Option<String>, Query, description = "recorded with the resend")),
    responses((status = 200, description = "resent: the row as the resend wrote it", body = EventView),
        (status = 409, description = "the event is not failed", body = crate::admin::openapi::StatusConflict),
        (status = 404, description = "no such event", body = crate::admin::openapi::ErrorBody),
        (status = 400, description = "a parameter the route does not take, given twice, empty or malformed: nothing done", body = crate::admin::openapi::ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = crate::admin::openapi::ErrorBody),
        (status = 503, description = "the database does not answer", body = crate::admin::openapi::ErrorBody),))]
async fn retry_one(
    State(state): State<AdminState>,
    Path(id): Path<i64>,
    RawQuery(raw): RawQuery,
) -> Response {
    let caller = match api_caller(raw.as_deref()) {
        Ok(c) => c,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
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

#[utoipa::path(post, path = "/admin/events/retry", tag = "events",
    params(("status" = Option<String>, Query, description = "only failed"), ("event_name" = Option<String>, Query, description = ""), ("dispatcher" = Option<String>, Query, description = ""), ("error_contains" = Option<String>, Query, description = ""), ("failed_since" = Option<String>, Query, description = "RFC 3339 or YYYY-MM-DD HH:MM, UTC"), ("failed_until" = Option<String>, Query, description = ""), ("dry_run" = Option<bool>, Query, description = "true: count and sample, change nothing"), ("confirm" = Option<u64>, Query, description = "the dry run's count (needed above 1,000)"), ("label" = Option<String>, Query, description = "")),
    responses((status = 200, description = "dry_run=true: what would be resent", body = crate::admin::openapi::ResendDryRun),
        (status = 202, description = "the operation that resends them", body = crate::operations::OperationView),
        (status = 409, description = "above 1,000 rows without the count, or another count", body = crate::admin::openapi::ResendConflict),
        (status = 400, description = "a parameter the route does not take, given twice, empty or malformed: nothing done", body = crate::admin::openapi::ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = crate::admin::openapi::ErrorBody),
        (status = 503, description = "the database does not answer", body = crate::admin::openapi::ErrorBody),))]
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
    let (target, rerun) = filters.words();
    started(
        state
            .operations
            .resend(Some(state.metrics.clone()), filter, target, rerun, &caller)
            .await,
    )
}

/// 202 with the operation (and where to follow it), or 503.
pub(crate) fn started(
    op: Result<crate::operations::OperationView, crate::store::StoreError>,
) -> Response {
    match op {
        Ok(op) => (
            StatusCode::ACCEPTED,
            [(header::LOCATION, op.href.clone())],
            Json(op),
        )
            .into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// `POST /admin/events/retrigger?ids=1,2` or `?pending_older_than=10m`:
/// pending rows touched so Debezium announces them again.
#[utoipa::path(post, path = "/admin/events/retrigger", tag = "events",
    params(("ids" = Option<String>, Query, description = "comma-separated ids"), ("pending_older_than" = Option<String>, Query, description = "a duration, e.g. 10m"), ("event_name" = Option<String>, Query, description = "")),
    responses((status = 202, description = "the operation that announces them again", body = crate::operations::OperationView),
        (status = 400, description = "a parameter the route does not take, given twice, empty or malformed: nothing done", body = crate::admin::openapi::ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = crate::admin::openapi::ErrorBody),
        (status = 503, description = "the database does not answer", body = crate::admin::openapi::ErrorBody),))]
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
    let caller = Caller::new(Via::AdminApi, None);
    started(state.operations.retrigger(filter, &caller).await)
}
