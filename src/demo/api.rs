//! The demo's accounts API: `POST /api/v1/events`, answering each event as
//! its scenario says (read from the payload's `demo` field).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

#[derive(Clone, Default)]
pub struct ApiState {
    seen: Arc<Mutex<HashMap<String, u32>>>,
    /// Once set, the "always rejects" event is accepted (before its resend).
    pub accept_all: Arc<AtomicBool>,
}

async fn events(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let n = {
        let mut seen = state.seen.lock().unwrap_or_else(|p| p.into_inner());
        let n = seen.entry(key).or_insert(0);
        *n += 1;
        *n
    };
    let accept = state.accept_all.load(Ordering::SeqCst);
    match body["demo"].as_str() {
        Some("reject_twice") if n <= 2 => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "accounts temporarily unavailable"})),
        ),
        Some("always_reject") if !accept => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error": "company_not_found"})),
        ),
        _ => (StatusCode::CREATED, Json(json!({"status": "accepted"}))),
    }
}

pub async fn start(state: ApiState) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = Router::new()
        .route("/api/v1/events", post(events))
        .with_state(state);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}
