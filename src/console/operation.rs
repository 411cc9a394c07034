//! The console's operation page: a resume or bulk resend started from a
//! form redirects here, and the page shows its progress (reloading itself
//! every second while it runs) and its end, as `GET /admin/operations/{id}`
//! does.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use maud::{html, Markup};

use super::pages::layout;
use super::session::Session;
use super::{html, query_params, refused, ConsoleState};
use crate::operations::OperationView;

/// The answer to a form that started an operation: to its page (303).
pub(super) fn started(
    session: &Session,
    op: Result<OperationView, String>,
    status_on_error: StatusCode,
) -> Response {
    match op {
        Ok(op) => Redirect::to(&format!("/admin/console/operations/{}", op.id)).into_response(),
        Err(e) => html(
            status_on_error,
            super::pages::message_page("Not started", Some(session), &e),
        ),
    }
}

/// `GET /admin/console/operations/{id}`.
pub(super) async fn operation(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Err(e) = query_params(raw.as_deref(), &[]) {
        return refused(Some(&s), &e);
    }
    match state.admin.operations.get(&id).await {
        Ok(Some(op)) => html(StatusCode::OK, page(&s, &op)),
        Ok(None) => html(
            StatusCode::NOT_FOUND,
            super::pages::message_page("Not found", Some(&s), &format!("No operation {id}.")),
        ),
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            super::pages::message_page("Database unavailable", Some(&s), &e.to_string()),
        ),
    }
}

/// `POST /admin/console/operations/{id}/cancel`: asks a running replay to
/// stop (the API's `DELETE /admin/operations/{id}`), then shows its page.
pub(super) async fn cancel(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    body: axum::body::Bytes,
) -> Response {
    if let Err(e) = super::form_params(raw.as_deref(), &body, &["csrf"]) {
        return refused(Some(&s), &e);
    }
    match state.admin.operations.cancel(&id).await {
        Ok(_) => Redirect::to(&format!("/admin/console/operations/{id}")).into_response(),
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            super::pages::message_page("Database unavailable", Some(&s), &e.to_string()),
        ),
    }
}

fn page(s: &Session, op: &OperationView) -> Markup {
    let title = format!("Operation {}", op.id);
    let body = html! {
        @if !op.ended() {
            // Reloads itself while the operation runs (no script).
            meta http-equiv="refresh" content="1";
        }
        h1 { (op.kind) ": " (op.target) }
        table #operation {
            tr { th { "state" } td #op-state { (op.state) } }
            tr { th { "rows done" } td #op-progress { (op.progress) } }
            tr { th { "started" } td { (op.started_at.format("%Y-%m-%d %H:%M:%S")) " UTC, via " (op.via) @if let Some(l) = &op.label { " (" (l) ")" } } }
            tr { th { "replica" } td { (op.replica) } }
            @if let Some(at) = op.finished_at {
                tr { th { "ended" } td { (at.format("%Y-%m-%d %H:%M:%S")) " UTC" } }
            }
            tr { th { "id" } td #op-id { (op.id) } }
        }
        @if let Some(m) = &op.message { p.notice #result { (m) } }
        @if let Some(e) = &op.error {
            p.error #op-error { (e) }
            p { "To finish it, run it again (it does only what is left): " code #op-rerun { (op.rerun) } }
        }
        @if !op.ended() {
            p.muted { "Running on " (op.replica) "; this page reloads every second. Leaving it does not stop the operation." }
            @if op.kind == crate::replay::REPLAY {
                form method="post" action={ "/admin/console/operations/" (op.id) "/cancel" } {
                    input type="hidden" name="csrf" value=(s.csrf);
                    button.danger #cancel type="submit" { "Cancel the replay" }
                }
            }
        }
        p { a href="/admin/console/events?status=all" { "See the events" } " · " a href="/admin/console/dispatchers" { "Dispatchers" } }
    };
    layout(&title, Some(s), body)
}
