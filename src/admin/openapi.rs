//! The admin API's contract: an OpenAPI 3.1 document generated from the
//! handlers' own annotations and answer types (`utoipa`), served at
//! `GET /admin/openapi.json` behind the token like every other route.
//! `tests/it/openapi.rs` walks the live router against it and checks real
//! answers against its schemas.

use axum::extract::RawQuery;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use super::error;
use crate::http::params::Params;

/// Every error answer: what is wrong, in words.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: String,
}

/// A resend refused because the event is not failed.
#[derive(Serialize, ToSchema)]
pub struct StatusConflict {
    pub error: String,
    /// The event's status now.
    pub status: String,
}

/// A bulk resend's dry run.
#[derive(Serialize, ToSchema)]
pub struct ResendDryRun {
    pub would_resend: u64,
    pub confirm_required: bool,
    /// The newest ten.
    pub sample: Vec<super::EventView>,
}

/// A bulk resend refused for its confirmation.
#[derive(Serialize, ToSchema)]
pub struct ResendConflict {
    pub error: String,
    pub would_resend: u64,
}

/// A replay refused for its confirmation.
#[derive(Serialize, ToSchema)]
pub struct ReplayConflict {
    pub error: String,
    pub would_replay: u64,
}

/// `Authorization: Bearer <admin.token>` on every route.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "outbox-sidecar admin API",
        description = "The admin API of admin.api_listen: every route needs `Authorization: Bearer <admin.token>`; parameters go in the query string only, and one a route does not take is refused (400) with nothing done. See docs/operations.md."
    ),
    paths(
        super::list_events,
        super::get_event,
        super::why_event,
        super::retry_one,
        super::retry_all,
        super::retrigger,
        super::operations::replay,
        super::dispatchers::list_dispatchers,
        super::dispatchers::pause_dispatcher,
        super::dispatchers::resume_dispatcher,
        super::operations::list_operations,
        super::operations::get_operation,
        super::operations::cancel_operation,
        openapi_json,
    ),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
struct ApiDoc;

/// The admin API's OpenAPI document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// `GET /admin/openapi.json`.
#[utoipa::path(get, path = "/admin/openapi.json", tag = "contract",
    responses((status = 200, description = "this document (OpenAPI 3.1)", body = Object),
        (status = 400, description = "a parameter (this route takes none)", body = ErrorBody),
        (status = 401, description = "no or wrong bearer token", body = ErrorBody)))]
pub(super) async fn openapi_json(RawQuery(raw): RawQuery) -> Response {
    if let Err(e) = Params::query(raw.as_deref(), &[]) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    (StatusCode::OK, Json(document())).into_response()
}
