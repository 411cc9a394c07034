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

mod bulk;
mod chart;
mod dispatchers;
mod events;
mod operation;
mod pages;
mod replay;
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

use crate::admin::{AdminState, MAX_BODY_BYTES};
use crate::http::params::{Params, FORM, QUERY};
use crate::http::resend::{check_confirm, resend_filters, ConfirmRefused};
use crate::operator::{self, ResendFilters};
use crate::store::history::{Caller, Via};
use crate::store::{ListFilter, RetryRefused};
pub use pages::{AttemptView, DispatcherView};

use bulk::*;
use dispatchers::*;
pub(crate) use events::*;
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

/// The console's routes, to be merged into the admin API's router.
pub fn router(state: ConsoleState) -> Router {
    let signed_in = Router::new()
        .route("/admin/console/", get(overview))
        .route("/admin/console/events", get(events))
        .route("/admin/console/events/{id}", get(event))
        .route("/admin/console/events/{id}/resend", post(resend_event))
        .route("/admin/console/resend", get(bulk_form).post(bulk_resend))
        .route("/admin/console/operations/{id}", get(operation::operation))
        .route(
            "/admin/console/operations/{id}/cancel",
            post(operation::cancel),
        )
        .route(
            "/admin/console/replay",
            get(replay::replay_form).post(replay::replay_start),
        )
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
    if !crate::http::token::token_matches(presented.trim(), token) {
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
