//! The web console: server-rendered pages for operators, on the admin API's
//! listener (`admin.api_listen`) under `/admin/console/` (`/admin/`
//! redirects there). It shows what the ActiveAdmin page cannot (counts,
//! the consumer's lag and pause, the dispatchers, a filtered resend with
//! its dry run) and acts through the same code as the admin API and the
//! CLI ([`crate::operator`]).
//!
//! Its own paths rather than content negotiation on `/admin/events…`: the
//! JSON API answers bearer tokens, the console a session cookie; one URL
//! answering both would let a cookie (which the browser sends by itself)
//! reach the API's routes, and an API client's behaviour would depend on
//! its `Accept` header.
//!
//! Sign-in takes `admin.token` (compared as the API compares it) and
//! starts a server-side session ([`session`]); every page and action needs
//! one, and every POST carries the session's CSRF token, checked here
//! before any handler runs. No JavaScript: forms and links only.

mod pages;
pub mod session;

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, RawQuery, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use entity::Status;

use crate::admin::{AdminState, ConfirmRefused, Params, FORM, MAX_BODY_BYTES, QUERY};
use crate::operator::{self, ResendFilters};
use crate::store::history::{Caller, Via};
use crate::store::{ListFilter, RetryRefused};
pub use pages::{AttemptView, DispatcherView};
use session::{Session, Sessions};

/// Rows on one page of the events list.
const PAGE: u64 = 50;

/// The resend filters' field names, as the forms send them.
const FILTER_FIELDS: [&str; 5] = [
    "event_name",
    "dispatcher",
    "error_contains",
    "failed_since",
    "failed_until",
];

/// A page's query string, checked against the names the page takes (its
/// forms' fields); an empty value is no value, as forms send every field.
fn query_params(raw: Option<&str>, allowed: &[&str]) -> Result<Params, String> {
    Params::parse(raw.unwrap_or("").as_bytes(), QUERY, allowed, true)
}

/// A POST's form, checked against the fields the form has (every POST of
/// a signed-in page carries `csrf`); a query string is refused.
fn form_params(raw_query: Option<&str>, body: &[u8], allowed: &[&str]) -> Result<Params, String> {
    query_params(raw_query, &[])?;
    Params::parse(body, FORM, allowed, true)
}

/// A request whose parameters are wrong: 400, nothing done.
fn refused(session: Option<&Session>, e: &str) -> Response {
    html(
        StatusCode::BAD_REQUEST,
        pages::message_page("Refused", session, &format!("{e}. Nothing was changed.")),
    )
}

#[derive(Clone)]
pub struct ConsoleState {
    admin: AdminState,
    sessions: Arc<Sessions>,
    secure_cookie: bool,
}

impl ConsoleState {
    /// `session_ttl`: `admin.console_session_ttl`; `secure_cookie`:
    /// `admin.console_secure_cookie`.
    pub fn new(admin: AdminState, session_ttl: std::time::Duration, secure_cookie: bool) -> Self {
        Self {
            admin,
            sessions: Arc::new(Sessions::new(session_ttl)),
            secure_cookie,
        }
    }
}

/// A row of the attempt log as the timeline shows it (a resend: outcome
/// `resend`, via the surface and the caller's label).
fn attempt_view(r: crate::store::history::Record) -> AttemptView {
    let resend = r.kind == "resend";
    AttemptView {
        attempt: r.attempt,
        at: r.started_at,
        duration_ms: r.duration_ms.and_then(|d| u64::try_from(d).ok()),
        outcome: if resend {
            "resend".to_owned()
        } else {
            r.outcome.unwrap_or_default()
        },
        http_status: r.http_status.and_then(|c| u16::try_from(c).ok()),
        detail: if resend { r.label } else { r.detail },
        replica: r.replica,
        via: r.via,
        trace_id: r.trace_id,
    }
}

/// Every configured dispatcher with its state (paused, breaker) and the
/// recent outcomes of its attempts.
/// `charts`: with each dispatcher's chart of the last hour (the
/// dispatchers page), or without (the overview draws one for all).
async fn dispatcher_rows(admin: &AdminState, charts: bool) -> Vec<pages::DispatcherRow> {
    let breakers = admin
        .holds
        .as_ref()
        .map(|h| h.breaker_states())
        .unwrap_or_default();
    let views = operator::dispatchers(&admin.store, &admin.dispatchers, &breakers).await;
    let since = crate::store::now() - chrono::Duration::minutes(15);
    let mut rows = Vec::new();
    for (name, events) in &admin.dispatchers {
        let found = views
            .as_ref()
            .ok()
            .and_then(|v| v.iter().find(|d| &d.name == name));
        let state = found.map(|d| {
            let mut text = match (&d.paused_at, &d.paused_via) {
                (Some(at), Some(via)) => format!(
                    "paused since {} UTC via {via}{}",
                    at.format("%Y-%m-%d %H:%M:%S"),
                    d.paused_label
                        .as_deref()
                        .map(|l| format!(" ({l})"))
                        .unwrap_or_default()
                ),
                _ => "sending".to_owned(),
            };
            if let Some(b) = &d.breaker {
                text.push_str(&format!("; breaker {b}"));
            }
            text
        });
        let recent = admin
            .store
            .recent_outcomes(events, since)
            .await
            .ok()
            .flatten();
        let chart = if charts {
            admin
                .store
                .attempts_per_minute(Some(events), chart_since(), CHART_MINUTES)
                .await
                .map_err(|e| e.to_string())
        } else {
            Ok(None)
        };
        let rate = admin.rates.get(name).map(|limit| {
            let share = admin
                .metrics
                .dispatcher_rate_share
                .with_label_values(&[name.as_str()])
                .get();
            (*limit, share)
        });
        rows.push(pages::DispatcherRow {
            rate,
            chart,
            paused: found.is_some_and(|d| d.paused),
            view: DispatcherView {
                name: name.clone(),
                events: events.clone(),
                state,
            },
            recent,
        });
    }
    rows
}

/// The chart's window: the last hour, by whole minutes (the last bar is
/// the minute under way).
const CHART_MINUTES: usize = 60;

fn chart_since() -> chrono::NaiveDateTime {
    use chrono::{DurationRound, TimeDelta};
    let now = crate::store::now();
    now.duration_trunc(TimeDelta::minutes(1)).unwrap_or(now)
        - TimeDelta::minutes(CHART_MINUTES as i64 - 1)
}

async fn dispatchers_page(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Err(e) = query_params(raw.as_deref(), &[]) {
        return refused(Some(&s), &e);
    }
    let rows = dispatcher_rows(&state.admin, true).await;
    html(StatusCode::OK, pages::dispatchers(&s, &rows, None))
}

/// The dispatchers page's buttons: the API's
/// `POST /admin/dispatchers/{name}/pause|resume`.
async fn dispatcher_action(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    Path((name, action)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Response {
    let admin = &state.admin;
    // The pause form has a label; resume takes none.
    let fields: &[&str] = if action == "pause" {
        &["csrf", "label"]
    } else {
        &["csrf"]
    };
    let label = match form_params(raw.as_deref(), &body, fields).and_then(|p| p.text("label")) {
        Ok(l) => l,
        Err(e) => return refused(Some(&s), &e),
    };
    let result = match action.as_str() {
        "pause" => {
            let caller = Caller::new(Via::Console, label);
            operator::pause(&admin.store, &admin.dispatchers, &name, &caller).await
        }
        "resume" => operator::resume(&admin.store, &admin.dispatchers, &name).await,
        _ => {
            return html(
                StatusCode::NOT_FOUND,
                pages::message_page("Not found", Some(&s), "No such action."),
            )
        }
    };
    let (status, notice) = match result {
        Ok(done) => {
            tracing::info!(dispatcher = %done.dispatcher, message = %done.message, "dispatcher changed in the console");
            (StatusCode::OK, done.message)
        }
        Err(e @ operator::DispatcherError::Unknown { .. }) => {
            (StatusCode::NOT_FOUND, e.to_string())
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let rows = dispatcher_rows(admin, true).await;
    html(status, pages::dispatchers(&s, &rows, Some(&notice)))
}

/// The console's routes, to be merged into the admin API's router.
pub fn router(state: ConsoleState) -> Router {
    let signed_in = Router::new()
        .route("/admin/console/", get(overview))
        .route("/admin/console/events", get(events))
        .route("/admin/console/events/{id}", get(event))
        .route("/admin/console/events/{id}/resend", post(resend_event))
        .route("/admin/console/resend", get(bulk_form).post(bulk_resend))
        .route("/admin/console/dispatchers", get(dispatchers_page))
        .route(
            "/admin/console/dispatchers/{name}/{action}",
            post(dispatcher_action),
        )
        .route("/admin/console/signout", post(sign_out))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_session,
        ));
    Router::new()
        .route("/admin/", get(|| async { Redirect::to("/admin/console/") }))
        .route(
            "/admin/console",
            get(|| async { Redirect::to("/admin/console/") }),
        )
        .route("/admin/console/signin", get(sign_in_page).post(sign_in))
        .merge(signed_in)
        .layer(middleware::from_fn(page_headers))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(
            MAX_BODY_BYTES,
        ))
        .with_state(state)
}

fn html(status: StatusCode, markup: maud::Markup) -> Response {
    (status, Html(markup.into_string())).into_response()
}

/// No caching, no framing, no scripts, no referrer: the pages show event
/// payloads and carry CSRF tokens.
async fn page_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

fn disabled() -> Response {
    html(
        StatusCode::FORBIDDEN,
        pages::message_page(
            "Console disabled",
            None,
            "The console is disabled: set admin.token (OUTBOX__ADMIN__TOKEN) to enable it.",
        ),
    )
}

fn session_id(req_headers: &axum::http::HeaderMap) -> Option<&str> {
    req_headers
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(session::cookie_value)
}

/// Every signed-in route: a live session, and on a POST its CSRF token in
/// the form (read here, before the handler, so no action can forget it).
/// Without a session: to the sign-in page (303), nothing done.
async fn require_session(State(state): State<ConsoleState>, req: Request, next: Next) -> Response {
    if state.admin.token.is_none() {
        return disabled();
    }
    let Some(session) = session_id(req.headers()).and_then(|id| state.sessions.get(id)) else {
        return Redirect::to("/admin/console/signin").into_response();
    };
    let mut req = req;
    if req.method() == Method::POST {
        let (parts, body) = req.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
            return html(
                StatusCode::PAYLOAD_TOO_LARGE,
                pages::message_page("Refused", Some(&session), "The form is too large."),
            );
        };
        let csrf = url::form_urlencoded::parse(&bytes)
            .find(|(k, _)| k == "csrf")
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
        if !session.csrf_matches(&csrf) {
            tracing::warn!(path = %parts.uri.path(), "console: a POST without the session's CSRF token was refused");
            return html(
                StatusCode::FORBIDDEN,
                pages::message_page(
                    "Refused",
                    Some(&session),
                    "The form's CSRF token is missing or wrong: nothing was changed. \
                     Reload the page and try again.",
                ),
            );
        }
        req = Request::from_parts(parts, Body::from(bytes));
    }
    req.extensions_mut().insert(session);
    next.run(req).await
}

async fn sign_in_page(State(state): State<ConsoleState>, RawQuery(raw): RawQuery) -> Response {
    if state.admin.token.is_none() {
        return disabled();
    }
    if let Err(e) = query_params(raw.as_deref(), &[]) {
        return html(StatusCode::BAD_REQUEST, pages::sign_in(Some(&e)));
    }
    html(StatusCode::OK, pages::sign_in(None))
}

async fn sign_in(
    State(state): State<ConsoleState>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Response {
    let Some(token) = &state.admin.token else {
        return disabled();
    };
    let presented =
        match form_params(raw.as_deref(), &body, &["token"]).and_then(|p| p.text("token")) {
            Ok(t) => t.unwrap_or_default(),
            Err(e) => return html(StatusCode::BAD_REQUEST, pages::sign_in(Some(&e))),
        };
    if !crate::admin::token_matches(presented.trim(), token) {
        tracing::warn!("console: a sign-in with a wrong token was refused");
        return html(
            StatusCode::UNAUTHORIZED,
            pages::sign_in(Some("Sign-in failed.")),
        );
    }
    let (id, _) = match state.sessions.create() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "console: no random bytes for a session id");
            return html(
                StatusCode::INTERNAL_SERVER_ERROR,
                pages::sign_in(Some("The sidecar could not start a session.")),
            );
        }
    };
    tracing::info!("console: an operator signed in");
    let cookie = session::set_cookie(&id, state.sessions.ttl(), state.secure_cookie);
    (
        [(header::SET_COOKIE, cookie)],
        Redirect::to("/admin/console/"),
    )
        .into_response()
}

async fn sign_out(State(state): State<ConsoleState>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    // The body was read (and bounded) by `require_session`.
    let body = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .unwrap_or_default();
    if let Err(e) = form_params(parts.uri.query(), &body, &["csrf"]) {
        let session = parts.extensions.get::<Session>();
        return refused(session, &e);
    }
    if let Some(id) = session_id(&parts.headers) {
        state.sessions.remove(id);
    }
    (
        [(
            header::SET_COOKIE,
            session::clear_cookie(state.secure_cookie),
        )],
        html(StatusCode::OK, pages::sign_in(Some("Signed out."))),
    )
        .into_response()
}

async fn overview(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Err(e) = query_params(raw.as_deref(), &[]) {
        return refused(Some(&s), &e);
    }
    let admin = &state.admin;
    let stats = admin.store.stats().await.map_err(|e| e.to_string());
    // Counted up to a cap: an exact count of the sent history is a scan.
    let sent_up_to = match &stats {
        Ok(_) => admin
            .store
            .count_sent_up_to(pages::SENT_COUNT_CAP)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.clone()),
    };
    let now = crate::store::now();
    let view = pages::OverviewView {
        sent_up_to,
        oldest_pending_age: stats
            .as_ref()
            .ok()
            .and_then(|s| s.oldest_pending_created_at)
            .map(|t| (now - t).to_std().unwrap_or_default()),
        stats,
        joined: admin
            .health
            .joined
            .load(std::sync::atomic::Ordering::Relaxed),
        draining: admin
            .health
            .draining
            .load(std::sync::atomic::Ordering::Relaxed),
        fetching_paused: admin.metrics.consumer_paused.get() == 1,
        lags: admin.metrics.consumer_lags(),
        inflight: admin.metrics.inflight_events.get(),
        dispatchers: dispatcher_rows(admin, false)
            .await
            .into_iter()
            .map(|r| r.view)
            .collect(),
        chart: admin
            .store
            .attempts_per_minute(None, chart_since(), CHART_MINUTES)
            .await
            .map_err(|e| e.to_string()),
    };
    html(StatusCode::OK, pages::overview(&s, &view))
}

fn non_empty(v: &Option<String>) -> Option<String> {
    v.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// The filters of the events list, as the form sends them (empty fields
/// are no filter).
#[derive(Debug, Default)]
pub(crate) struct EventsQuery {
    status: Option<String>,
    event_name: Option<String>,
    error_contains: Option<String>,
    failed_since: Option<String>,
    failed_until: Option<String>,
    before: Option<String>,
}

impl EventsQuery {
    /// Every name the events list takes.
    const FIELDS: [&str; 6] = [
        "status",
        "event_name",
        "error_contains",
        "failed_since",
        "failed_until",
        "before",
    ];

    fn from_params(p: &Params) -> Result<Self, String> {
        Ok(Self {
            status: p.text("status")?,
            event_name: p.text("event_name")?,
            error_contains: p.text("error_contains")?,
            failed_since: p.text("failed_since")?,
            failed_until: p.text("failed_until")?,
            before: p.text("before")?,
        })
    }

    /// The store's filter; failed events when no status is given, every
    /// status for `all`, the pending events an earlier failed event of
    /// their aggregate holds for `held` (`ordering`: `[ordering]` is on).
    /// The error names the field that is wrong.
    fn to_filter(&self, ordering: bool) -> Result<ListFilter, String> {
        let mut held = false;
        let status = match non_empty(&self.status).as_deref() {
            None => Some(Status::Failed),
            Some("all") => None,
            Some("held") if ordering => {
                held = true;
                Some(Status::Pending)
            }
            Some("held") => {
                return Err(format!(
                    "status: held: {}",
                    crate::store::ordering::HELD_NEEDS_ORDERING
                ))
            }
            Some(s) => Some(s.parse::<Status>().map_err(|e| format!("status: {e}"))?),
        };
        let time = |v: &Option<String>, name: &str| {
            non_empty(v)
                .map(|t| operator::parse_time(&t).map_err(|e| format!("{name}: {e}")))
                .transpose()
        };
        Ok(ListFilter {
            status,
            event_name: non_empty(&self.event_name),
            limit: Some(PAGE),
            before: non_empty(&self.before)
                .map(|b| {
                    b.parse::<i64>()
                        .map_err(|_| format!("before: {b:?} is not an event id"))
                })
                .transpose()?,
            error_contains: non_empty(&self.error_contains),
            changed_since: time(&self.failed_since, "failed_since")?,
            changed_until: time(&self.failed_until, "failed_until")?,
            held,
        })
    }

    /// The query string of these filters with another cursor.
    fn with_before(&self, before: Option<i64>) -> String {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("status", &self.status),
            ("event_name", &self.event_name),
            ("error_contains", &self.error_contains),
            ("failed_since", &self.failed_since),
            ("failed_until", &self.failed_until),
        ] {
            if let Some(v) = non_empty(v) {
                q.append_pair(k, &v);
            }
        }
        if let Some(b) = before {
            q.append_pair("before", &b.to_string());
        }
        q.finish()
    }
}

async fn events(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    RawQuery(raw): RawQuery,
) -> Response {
    let ordering = state.admin.store.ordering().is_some();
    let q = match query_params(raw.as_deref(), &EventsQuery::FIELDS)
        .and_then(|p| EventsQuery::from_params(&p))
    {
        Ok(q) => q,
        Err(e) => {
            return html(
                StatusCode::BAD_REQUEST,
                pages::events(&s, &EventsQuery::default(), ordering, &[], None, Some(&e)),
            )
        }
    };
    let filter = match q.to_filter(ordering) {
        Ok(f) => f,
        Err(e) => {
            return html(
                StatusCode::BAD_REQUEST,
                pages::events(&s, &q, ordering, &[], None, Some(&e)),
            )
        }
    };
    match state.admin.store.list(&filter).await {
        Ok(rows) => {
            let next = rows
                .last()
                .filter(|_| rows.len() as u64 == PAGE)
                .map(|last| q.with_before(Some(last.id)));
            html(
                StatusCode::OK,
                pages::events(&s, &q, ordering, &rows, next.as_deref(), None),
            )
        }
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::events(&s, &q, ordering, &[], None, Some(&e.to_string())),
        ),
    }
}

async fn event(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    Path(id): Path<i64>,
    RawQuery(raw): RawQuery,
) -> Response {
    // `resent=true`: set by the redirect after a resend from this page.
    let resent = match query_params(raw.as_deref(), &["resent"]).and_then(|p| p.flag("resent")) {
        Ok(r) => r.unwrap_or(false),
        Err(e) => return refused(Some(&s), &e),
    };
    match state.admin.store.get(id).await {
        Ok(Some(row)) => {
            let notice =
                resent.then(|| format!("Event {id} set to pending: the sidecar sends it again."));
            // The attempt timeline, from the attempt log.
            let attempts: Vec<AttemptView> = match state.admin.store.history(id).await {
                Ok(records) => records.into_iter().map(attempt_view).collect(),
                Err(e) => {
                    return html(
                        StatusCode::SERVICE_UNAVAILABLE,
                        pages::message_page("Database error", Some(&s), &e.to_string()),
                    )
                }
            };
            // `[ordering]`: what the event waits behind, if anything.
            let behind = state
                .admin
                .store
                .waits_behind(id)
                .await
                .unwrap_or_else(|e| {
                    tracing::warn!(id, error = %e, "cannot read what the event waits behind");
                    None
                });
            html(
                StatusCode::OK,
                pages::event(&s, &row, &attempts, notice.as_deref(), behind),
            )
        }
        Ok(None) => html(
            StatusCode::NOT_FOUND,
            pages::message_page("Not found", Some(&s), &format!("Event {id} not found.")),
        ),
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::message_page("Database error", Some(&s), &e.to_string()),
        ),
    }
}

/// The event page's resend button: the API's `POST /admin/events/{id}/retry`.
async fn resend_event(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    Path(id): Path<i64>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Response {
    if let Err(e) = form_params(raw.as_deref(), &body, &["csrf"]) {
        return refused(Some(&s), &e);
    }
    let admin = &state.admin;
    match operator::resend_one(
        &admin.store,
        Some(&admin.metrics),
        id,
        &Caller::new(Via::Console, None),
    )
    .await
    {
        Ok(Ok(_)) => {
            Redirect::to(&format!("/admin/console/events/{id}?resent=true")).into_response()
        }
        Ok(Err(r @ RetryRefused::NotFound(_))) => html(
            StatusCode::NOT_FOUND,
            pages::message_page("Not resent", Some(&s), &r.to_string()),
        ),
        Ok(Err(r @ RetryRefused::NotFailed { .. })) => html(
            StatusCode::CONFLICT,
            pages::message_page("Not resent", Some(&s), &r.to_string()),
        ),
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::message_page("Database error", Some(&s), &e.to_string()),
        ),
    }
}

/// Empty form fields are no filter.
fn cleaned(f: &ResendFilters) -> ResendFilters {
    ResendFilters {
        event_name: non_empty(&f.event_name),
        dispatcher: non_empty(&f.dispatcher),
        error_contains: non_empty(&f.error_contains),
        failed_since: non_empty(&f.failed_since),
        failed_until: non_empty(&f.failed_until),
    }
}

/// The bulk resend form; with `preview=true`, the dry run (count and
/// sample) and the form that confirms it, carrying the count.
async fn bulk_form(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    RawQuery(raw): RawQuery,
) -> Response {
    let admin = &state.admin;
    let names: Vec<&str> = admin.dispatchers.keys().map(String::as_str).collect();
    let mut fields = FILTER_FIELDS.to_vec();
    fields.push("preview");
    let parsed = query_params(raw.as_deref(), &fields).and_then(|p| {
        Ok((
            crate::admin::resend_filters(&p)?,
            p.flag("preview")?.unwrap_or(false),
        ))
    });
    let (filters, preview) = match parsed {
        Ok((f, preview)) => (cleaned(&f), preview),
        Err(e) => {
            return html(
                StatusCode::BAD_REQUEST,
                pages::bulk(
                    &s,
                    &ResendFilters::default(),
                    &names,
                    pages::BulkStage::Error(&e),
                ),
            )
        }
    };
    if !preview {
        return html(
            StatusCode::OK,
            pages::bulk(&s, &filters, &names, pages::BulkStage::Form),
        );
    }
    let filter = match filters.to_filter(&admin.dispatchers) {
        Ok(f) => f,
        Err(e) => {
            return html(
                StatusCode::BAD_REQUEST,
                pages::bulk(&s, &filters, &names, pages::BulkStage::Error(&e)),
            )
        }
    };
    match operator::preview_resend(&admin.store, &filter).await {
        Ok((count, sample)) => html(
            StatusCode::OK,
            pages::bulk(
                &s,
                &filters,
                &names,
                pages::BulkStage::Preview {
                    count,
                    sample: &sample,
                    refused: None,
                },
            ),
        ),
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::bulk(
                &s,
                &filters,
                &names,
                pages::BulkStage::Error(&e.to_string()),
            ),
        ),
    }
}

/// The confirmed bulk resend: the API's `POST /admin/events/retry`. The
/// form carries the count its dry run showed (`confirm`); when as many
/// rows no longer match, nothing is resent and the dry run is shown again
/// with the new count.
async fn bulk_resend(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Response {
    let admin = &state.admin;
    let names: Vec<&str> = admin.dispatchers.keys().map(String::as_str).collect();
    let mut fields = FILTER_FIELDS.to_vec();
    fields.extend(["csrf", "confirm"]);
    let parsed = form_params(raw.as_deref(), &body, &fields).and_then(|p| {
        Ok((
            crate::admin::resend_filters(&p)?,
            p.number::<u64>("confirm", "the number of events the dry run counted")?,
        ))
    });
    let (filters, confirm) = match parsed {
        Ok((f, confirm)) => (cleaned(&f), confirm),
        Err(e) => {
            return html(
                StatusCode::BAD_REQUEST,
                pages::bulk(
                    &s,
                    &ResendFilters::default(),
                    &names,
                    pages::BulkStage::Error(&e),
                ),
            )
        }
    };
    let filter = match filters.to_filter(&admin.dispatchers) {
        Ok(f) => f,
        Err(e) => {
            return html(
                StatusCode::BAD_REQUEST,
                pages::bulk(&s, &filters, &names, pages::BulkStage::Error(&e)),
            )
        }
    };
    let (count, sample) = match operator::preview_resend(&admin.store, &filter).await {
        Ok(preview) => preview,
        Err(e) => {
            return html(
                StatusCode::SERVICE_UNAVAILABLE,
                pages::bulk(
                    &s,
                    &filters,
                    &names,
                    pages::BulkStage::Error(&e.to_string()),
                ),
            )
        }
    };
    if let Err(r) = crate::admin::check_confirm(count, confirm) {
        let why = match r {
            ConfirmRefused::Mismatch { count, confirm } => format!(
                "The dry run counted {confirm}; {count} failed event(s) match now. \
                 Nothing was resent: check the sample and confirm again."
            ),
            ConfirmRefused::Needed { count } => format!(
                "{count} failed events match, more than {}: confirm the count below. \
                 Nothing was resent.",
                operator::CONFIRM_ABOVE
            ),
        };
        return html(
            StatusCode::CONFLICT,
            pages::bulk(
                &s,
                &filters,
                &names,
                pages::BulkStage::Preview {
                    count,
                    sample: &sample,
                    refused: Some(&why),
                },
            ),
        );
    }
    match operator::resend_failed(
        &admin.store,
        Some(&admin.metrics),
        &filter,
        &Caller::new(Via::Console, None),
    )
    .await
    {
        Ok(n) => html(
            StatusCode::OK,
            pages::bulk(&s, &filters, &names, pages::BulkStage::Done(n)),
        ),
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::bulk(
                &s,
                &filters,
                &names,
                pages::BulkStage::Error(&e.to_string()),
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_events_list_shows_failed_events_unless_told() {
        let q = EventsQuery::default();
        assert_eq!(q.to_filter(false).unwrap().status, Some(Status::Failed));
        let all = EventsQuery {
            status: Some("all".into()),
            ..Default::default()
        };
        assert_eq!(all.to_filter(false).unwrap().status, None);
        let sent = EventsQuery {
            status: Some("sent".into()),
            event_name: Some("  ".into()),
            ..Default::default()
        };
        let f = sent.to_filter(false).unwrap();
        assert_eq!(f.status, Some(Status::Sent));
        assert_eq!(f.event_name, None, "an empty field is no filter");
    }

    #[test]
    fn a_wrong_filter_is_named() {
        let bad = |q: EventsQuery| q.to_filter(false).unwrap_err();
        assert!(bad(EventsQuery {
            status: Some("lost".into()),
            ..Default::default()
        })
        .starts_with("status: "));
        assert!(bad(EventsQuery {
            failed_since: Some("noon".into()),
            ..Default::default()
        })
        .starts_with("failed_since: \"noon\" is not a time"));
        assert_eq!(
            bad(EventsQuery {
                before: Some("x".into()),
                ..Default::default()
            }),
            "before: \"x\" is not an event id"
        );
    }

    #[test]
    fn held_lists_the_pending_events_a_failed_one_holds_when_ordering_is_on() {
        let held = || EventsQuery {
            status: Some("held".into()),
            ..Default::default()
        };
        let f = held().to_filter(true).unwrap();
        assert_eq!(f.status, Some(Status::Pending));
        assert!(f.held);
        assert!(!EventsQuery::default().to_filter(true).unwrap().held);
        assert_eq!(
            held().to_filter(false).unwrap_err(),
            "status: held: ordering is off ([ordering] column is not set)"
        );
    }

    #[test]
    fn the_next_page_keeps_the_filters() {
        let q = EventsQuery {
            event_name: Some("a.b".into()),
            error_contains: Some("HTTP 503".into()),
            before: Some("99".into()),
            ..Default::default()
        };
        assert_eq!(
            q.with_before(Some(42)),
            "event_name=a.b&error_contains=HTTP+503&before=42"
        );
    }
}
