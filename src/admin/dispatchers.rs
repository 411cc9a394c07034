//! The admin API's dispatchers: `GET /admin/dispatchers` and the pause
//! and resume of one, group-wide.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{api_caller, error, started, AdminState};
use crate::http::params::Params;

#[utoipa::path(get, path = "/admin/dispatchers", tag = "dispatchers",
    responses((status = 200, description = "each dispatcher, its events, pause and this replica's breaker", body = [crate::operator::DispatcherView]),
        (status = 400, description = "a parameter the route does not take, given twice, empty or malformed: nothing done", body = crate::admin::openapi::ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = crate::admin::openapi::ErrorBody),
        (status = 503, description = "the database does not answer", body = crate::admin::openapi::ErrorBody),))]
pub(super) async fn list_dispatchers(
    State(state): State<AdminState>,
    RawQuery(raw): RawQuery,
) -> Response {
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

#[utoipa::path(post, path = "/admin/dispatchers/{name}/pause", tag = "dispatchers",
    params(("name" = String, Path, description = "the dispatcher"), ("label" = Option<String>, Query, description = "recorded with the pause")),
    responses((status = 200, description = "paused group-wide", body = crate::operator::DispatcherAction),
        (status = 404, description = "no such dispatcher", body = crate::admin::openapi::ErrorBody),
        (status = 400, description = "a parameter the route does not take, given twice, empty or malformed: nothing done", body = crate::admin::openapi::ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = crate::admin::openapi::ErrorBody),
        (status = 503, description = "the database does not answer", body = crate::admin::openapi::ErrorBody),))]
pub(super) async fn pause_dispatcher(
    State(state): State<AdminState>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let caller = match api_caller(raw.as_deref()) {
        Ok(c) => c,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    dispatcher_answer(
        crate::operator::pause(&state.store, &state.dispatchers, &name, &caller).await,
    )
}

#[utoipa::path(post, path = "/admin/dispatchers/{name}/resume", tag = "dispatchers",
    params(("name" = String, Path, description = "the dispatcher"), ("label" = Option<String>, Query, description = "recorded with the resume")),
    responses((status = 202, description = "the operation that resumes it", body = crate::operations::OperationView),
        (status = 404, description = "no such dispatcher", body = crate::admin::openapi::ErrorBody),
        (status = 400, description = "a parameter the route does not take, given twice, empty or malformed: nothing done", body = crate::admin::openapi::ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = crate::admin::openapi::ErrorBody),
        (status = 503, description = "the database does not answer", body = crate::admin::openapi::ErrorBody),))]
pub(super) async fn resume_dispatcher(
    State(state): State<AdminState>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let caller = match api_caller(raw.as_deref()) {
        Ok(c) => c,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match state
        .operations
        .resume(&state.dispatchers, &name, &caller)
        .await
    {
        Ok(op) => started(Ok(op)),
        Err(e @ crate::operator::DispatcherError::Unknown { .. }) => {
            error(StatusCode::NOT_FOUND, e.to_string())
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}
