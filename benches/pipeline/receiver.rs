//! The in-process HTTP receivers the sidecar POSTs to.
//!
//! Three, each on its own port with its own counters: one answering `204`
//! with no body; one answering `201` with a small JSON body, as most real
//! receivers do (the sidecar must read that body to its end for the
//! connection to be reused); and the same `201` receiver over HTTPS
//! (rustls, with a CA the bench makes with rcgen and hands the sidecar as
//! `ca_file`). Each counts the TCP connections it accepted, so keep-alive
//! shows as connections opened per 1,000 events.

use std::path::PathBuf;

use axum::response::{IntoResponse, Response};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use super::*;

/// What a receiver answers a request it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// `204 No Content`.
    NoContent,
    /// `201 Created` with a JSON body of ~100 bytes.
    Created,
}

pub(crate) struct ReceiverState {
    pub(crate) answer: Answer,
    /// Answer 500 to the first attempt of every id divisible by 10.
    pub(crate) fail_tenth: AtomicBool,
    pub(crate) requests: AtomicU64,
    pub(crate) refused: AtomicU64,
    /// TCP connections accepted.
    pub(crate) connections: AtomicU64,
    /// Connections that ended (closed by either side, or a failed TLS
    /// handshake).
    pub(crate) closed: AtomicU64,
    /// Request body bytes received.
    pub(crate) body_bytes: AtomicU64,
}

pub(crate) async fn receive(
    State(state): State<Arc<ReceiverState>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    state.requests.fetch_add(1, Ordering::Relaxed);
    state
        .body_bytes
        .fetch_add(body.len() as u64, Ordering::Relaxed);
    let number = |name: &str| -> Option<i64> { headers.get(name)?.to_str().ok()?.parse().ok() };
    let id = number("idempotency-key");
    if state.fail_tenth.load(Ordering::Relaxed) {
        if let (Some(id), Some(1)) = (id, number("outbox-attempt")) {
            if id % 10 == 0 {
                state.refused.fetch_add(1, Ordering::Relaxed);
                return StatusCode::INTERNAL_SERVER_ERROR.into_response();
            }
        }
    }
    match state.answer {
        Answer::NoContent => StatusCode::NO_CONTENT.into_response(),
        Answer::Created => (
            StatusCode::CREATED,
            [("content-type", "application/json")],
            json!({
                "id": format!("evt_{:012}", id.unwrap_or(0)),
                "status": "accepted",
                "received_at": chrono::Utc::now().to_rfc3339(),
            })
            .to_string(),
        )
            .into_response(),
    }
}

impl ReceiverState {
    /// Requests answered 2xx (or about to be): every request but the
    /// refused ones.
    pub(crate) fn answered(&self) -> u64 {
        self.requests.load(Ordering::Relaxed) - self.refused.load(Ordering::Relaxed)
    }
}

/// One receiver: its counters, its URL and, over HTTPS, the CA to trust.
pub(crate) struct Receiver {
    pub(crate) state: Arc<ReceiverState>,
    pub(crate) url: String,
    pub(crate) ca_file: Option<PathBuf>,
}

/// The bench's three receivers (see the module comment).
pub(crate) struct Receivers {
    pub(crate) no_content: Receiver,
    pub(crate) created: Receiver,
    pub(crate) https: Receiver,
    _dir: tempfile::TempDir,
}

/// Which receiver a scenario posts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    NoContent,
    Created,
    Https,
}

impl Target {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Target::NoContent => "204",
            Target::Created => "201 + JSON",
            Target::Https => "HTTPS 201 + JSON",
        }
    }
}

impl Receivers {
    pub(crate) async fn start() -> Result<Receivers> {
        let dir = tempfile::tempdir()?;
        let (ca_pem, acceptor) = tls_acceptor()?;
        let ca_file = dir.path().join("bench-ca.pem");
        std::fs::write(&ca_file, ca_pem)?;
        Ok(Receivers {
            no_content: start_receiver(Answer::NoContent, None).await?,
            created: start_receiver(Answer::Created, None).await?,
            https: Receiver {
                ca_file: Some(ca_file),
                ..start_receiver(Answer::Created, Some(acceptor)).await?
            },
            _dir: dir,
        })
    }

    pub(crate) fn get(&self, target: Target) -> &Receiver {
        match target {
            Target::NoContent => &self.no_content,
            Target::Created => &self.created,
            Target::Https => &self.https,
        }
    }
}

/// A CA made for this run, and a server certificate for 127.0.0.1 it
/// issued: the CA's PEM and the acceptor.
fn tls_acceptor() -> Result<(String, tokio_rustls::TlsAcceptor)> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "outbox bench CA");
    let ca_key = KeyPair::generate()?;
    let ca = params.self_signed(&ca_key)?;
    let issuer = Issuer::new(params, ca_key);
    let key = KeyPair::generate()?;
    let leaf = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?
        .signed_by(&key, &issuer)?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )?;
    Ok((ca.pem(), tokio_rustls::TlsAcceptor::from(Arc::new(config))))
}

/// Counts a connection's end when its task ends, however it ends.
struct Closed(Arc<ReceiverState>);

impl Drop for Closed {
    fn drop(&mut self) {
        self.0.closed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Serves the receiver on a port of 127.0.0.1, counting each accepted
/// connection; over TLS when `tls` is given. HTTP/1.1 with keep-alive.
async fn start_receiver(
    answer: Answer,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> Result<Receiver> {
    let state = Arc::new(ReceiverState {
        answer,
        fail_tenth: AtomicBool::new(false),
        requests: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        connections: AtomicU64::new(0),
        closed: AtomicU64::new(0),
        body_bytes: AtomicU64::new(0),
    });
    let app = axum::Router::new()
        .route("/api/v1/events", axum::routing::post(receive))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let counter = state.clone();
    tokio::spawn(async move {
        loop {
            let tcp = match listener.accept().await {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    eprintln!("receiver: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            counter.connections.fetch_add(1, Ordering::Relaxed);
            let _ = tcp.set_nodelay(true);
            let (app, tls, counter) = (app.clone(), tls.clone(), counter.clone());
            tokio::spawn(async move {
                let _closed = Closed(counter);
                let service = hyper_util::service::TowerToHyperService::new(app);
                let http = hyper::server::conn::http1::Builder::new();
                match tls {
                    None => {
                        let _ = http
                            .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                            .await;
                    }
                    Some(acceptor) => {
                        let Ok(stream) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let _ = http
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    }
                }
            });
        }
    });
    Ok(Receiver {
        state,
        url: format!("{scheme}://127.0.0.1:{}/api/v1/events", addr.port()),
        ca_file: None,
    })
}
