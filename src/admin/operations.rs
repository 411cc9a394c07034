//! The admin API's operations: `GET /admin/operations[/{id}]`, `DELETE
//! /admin/operations/{id}` (cancel) and `POST /admin/events/replay` (an
//! operation that replays sent events).

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::{error, started, AdminState};
use crate::http::params::Params;
use crate::operations::OperationView;
use crate::store::history::{Caller, Via};

/// `GET /admin/operations`: the 50 most recently started operations.
#[utoipa::path(get, path = "/admin/operations", tag = "operations",
    responses((status = 200, description = "the 50 most recent operations", body = [crate::operations::OperationView]),
        (status = 400, description = "a parameter the route does not take, given twice, empty or malformed: nothing done", body = crate::admin::openapi::ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = crate::admin::openapi::ErrorBody),
        (status = 503, description = "the database does not answer", body = crate::admin::openapi::ErrorBody),))]
pub(super) async fn list_operations(
    State(state): State<AdminState>,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Err(e) = Params::query(raw.as_deref(), &[]) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    match state.operations.recent(50).await {
        Ok(list) => Json(list).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// `GET /admin/operations/{id}`: one operation's progress or end.
#[utoipa::path(get, path = "/admin/operations/{id}", tag = "operations",
    params(("id" = String, Path, description = "the operation's id")),
    responses((status = 200, description = "its progress or end", body = crate::operations::OperationView),
        (status = 404, description = "no such operation", body = crate::admin::openapi::ErrorBody),
        (status = 400, description = "a parameter the route does not take, given twice, empty or malformed: nothing done", body = crate::admin::openapi::ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = crate::admin::openapi::ErrorBody),
        (status = 503, description = "the database does not answer", body = crate::admin::openapi::ErrorBody),))]
pub(super) async fn get_operation(
    State(state): State<AdminState>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Err(e) = Params::query(raw.as_deref(), &[]) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    match operation(&state, &id).await {
        Ok(op) => Json(op).into_response(),
        Err((status, e)) => error(status, e),
    }
}

/// One operation, or why not: 404 (unknown), 503 (the database).
async fn operation(state: &AdminState, id: &str) -> Result<OperationView, (StatusCode, String)> {
    match state.operations.get(id).await {
        Ok(Some(op)) => Ok(op),
        Ok(None) => Err((
            StatusCode::NOT_FOUND,
            format!("no operation {id:?} (GET /admin/operations lists the recent ones)"),
        )),
        Err(e) => Err((StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
    }
}

/// `DELETE /admin/operations/{id}`: asks a running operation to stop (a
/// replay stops at its next step; the rows it has not reached stay as
/// they are). 200 with the operation; 404 unknown; 409 already ended.
#[utoipa::path(delete, path = "/admin/operations/{id}", tag = "operations",
    params(("id" = String, Path, description = "the operation's id")),
    responses((status = 200, description = "cancel asked: it stops at its next step", body = crate::operations::OperationView),
        (status = 404, description = "no such operation", body = crate::admin::openapi::ErrorBody),
        (status = 409, description = "it has ended", body = crate::admin::openapi::ErrorBody),
        (status = 400, description = "a parameter the route does not take, given twice, empty or malformed: nothing done", body = crate::admin::openapi::ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = crate::admin::openapi::ErrorBody),
        (status = 503, description = "the database does not answer", body = crate::admin::openapi::ErrorBody),))]
pub(super) async fn cancel_operation(
    State(state): State<AdminState>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Err(e) = Params::query(raw.as_deref(), &[]) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    let cancelled = match state.operations.cancel(&id).await {
        Ok(c) => c,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    match operation(&state, &id).await {
        Ok(op) if cancelled => Json(op).into_response(),
        Ok(op) => error(
            StatusCode::CONFLICT,
            format!("operation {id} is {}: nothing to cancel", op.state),
        ),
        Err((status, e)) => error(status, e),
    }
}

/// `POST /admin/events/replay?sent_since=…`: sent events sent again, as an
/// operation (202 + Location); `dry_run=true` counts them and changes
/// nothing; above 1,000 rows `confirm=N` with the dry run's count.
#[utoipa::path(post, path = "/admin/events/replay", tag = "events",
    params(("event_name" = Option<String>, Query, description = "comma-separated"), ("dispatcher" = Option<String>, Query, description = ""), ("sent_since" = Option<String>, Query, description = "RFC 3339 or YYYY-MM-DD HH:MM, UTC"), ("sent_until" = Option<String>, Query, description = ""), ("aggregate" = Option<String>, Query, description = ""), ("ids" = Option<String>, Query, description = "comma-separated ids"), ("rate" = Option<f64>, Query, description = "events a second, default 100"), ("dry_run" = Option<bool>, Query, description = "true: count and sample, change nothing"), ("confirm" = Option<u64>, Query, description = "the dry run's count (needed above 1,000)"), ("label" = Option<String>, Query, description = "")),
    responses((status = 200, description = "dry_run=true: what would be replayed", body = crate::replay::DryRun),
        (status = 202, description = "the replay's operation", body = crate::operations::OperationView),
        (status = 409, description = "above 1,000 rows without the count, or another count", body = crate::admin::openapi::ReplayConflict),
        (status = 422, description = "no sent event matches", body = crate::admin::openapi::ErrorBody),
        (status = 400, description = "a parameter the route does not take, given twice, empty or malformed: nothing done", body = crate::admin::openapi::ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = crate::admin::openapi::ErrorBody),
        (status = 503, description = "the database does not answer", body = crate::admin::openapi::ErrorBody),))]
pub(super) async fn replay(State(state): State<AdminState>, RawQuery(raw): RawQuery) -> Response {
    use crate::replay::ReplayRefused;
    let parsed = Params::query(raw.as_deref(), crate::http::replay::REPLAY_PARAMS)
        .and_then(|p| crate::http::replay::replay_request(&p));
    let (request, dry_run, confirm, label) = match parsed {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let ops = &state.operations;
    let result = if dry_run {
        match ops
            .replay_dry_run(&request, &state.dispatchers, &state.rates)
            .await
        {
            Ok(dry) => return Json(dry).into_response(),
            Err(e) => Err(e),
        }
    } else {
        let caller = Caller::new(Via::AdminApi, label);
        ops.replay(&request, &state.dispatchers, &state.rates, confirm, &caller)
            .await
    };
    match result {
        Ok(op) => started(Ok(op)),
        Err(ReplayRefused::Invalid(e)) => error(StatusCode::BAD_REQUEST, e),
        Err(e @ ReplayRefused::Confirm { count }) => (
            StatusCode::CONFLICT,
            Json(json!({ "error": e.to_string(), "would_replay": count })),
        )
            .into_response(),
        Err(e @ ReplayRefused::Nothing) => error(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
        Err(ReplayRefused::Store(e)) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}
