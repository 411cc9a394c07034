//! The in-process HTTP receiver the sidecar POSTs to.

use super::*;

#[derive(Default)]
pub(crate) struct ReceiverState {
    /// Answer 500 to the first attempt of every id divisible by 10.
    pub(crate) fail_tenth: AtomicBool,
    pub(crate) requests: AtomicU64,
    pub(crate) refused: AtomicU64,
}

pub(crate) async fn receive(
    State(state): State<Arc<ReceiverState>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    state.requests.fetch_add(1, Ordering::Relaxed);
    std::hint::black_box(body.len());
    if state.fail_tenth.load(Ordering::Relaxed) {
        let number = |name: &str| -> Option<i64> { headers.get(name)?.to_str().ok()?.parse().ok() };
        if let (Some(id), Some(1)) = (number("idempotency-key"), number("outbox-attempt")) {
            if id % 10 == 0 {
                state.refused.fetch_add(1, Ordering::Relaxed);
                return StatusCode::INTERNAL_SERVER_ERROR;
            }
        }
    }
    StatusCode::NO_CONTENT
}

pub(crate) async fn start_receiver(state: Arc<ReceiverState>) -> Result<SocketAddr> {
    let app = axum::Router::new()
        .route("/api/v1/events", axum::routing::post(receive))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("receiver stopped: {e}");
        }
    });
    Ok(addr)
}
