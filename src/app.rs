//! Wiring: builds every part from the settings and runs them until the
//! shutdown token is cancelled (SIGTERM or SIGINT in the binary).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::admin::{self, AdminState};
use crate::config::Settings;
use crate::consumer::{ConsumerHealth, Pipeline};
use crate::dispatch::Registry;
use crate::job::JobContext;
use crate::metrics::Metrics;
use crate::store::Store;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Dispatch(#[from] crate::dispatch::DispatchBuildError),
    #[error(transparent)]
    Consumer(#[from] crate::consumer::ConsumerError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Table(#[from] crate::store::TableError),
    #[error("cannot listen on {addr} ({key}): {source}")]
    Listen {
        key: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running sidecar.
pub struct App {
    admin_addr: SocketAddr,
    api_addr: SocketAddr,
    shutdown: CancellationToken,
    metrics: Metrics,
    store: Store,
    tasks: JoinHandle<()>,
}

impl App {
    /// Connects, binds and starts everything; errors are start-up errors.
    pub async fn start(settings: Settings) -> Result<App, AppError> {
        settings.validate_for_run()?;
        let metrics = Metrics::new();
        let store = Store::open(&settings).await?;
        store.check_table().await?;
        let registry = Registry::from_settings(&settings.dispatchers)?;
        metrics.register_event_names(registry.event_names());
        let (listener, admin_addr) = bind("admin.listen", settings.admin_listen()?).await?;
        let (api_listener, api_addr) =
            bind("admin.api_listen", settings.admin_api_listen()?).await?;

        let shutdown = CancellationToken::new();
        let health = Arc::new(ConsumerHealth::default());
        let alive = Arc::new(AtomicBool::new(true));
        let ctx = Arc::new(JobContext::new(
            store.clone(),
            registry,
            metrics.clone(),
            settings.dispatch.retry_delay,
            settings.dispatch.max_attempts,
            settings.dispatch.max_in_flight,
        ));
        let pipeline = Pipeline::new(
            &settings.kafka,
            &settings.database.table,
            ctx,
            &settings.dispatch,
            settings.shutdown.drain_timeout,
            health.clone(),
        )?;

        let admin_state = AdminState {
            store: store.clone(),
            metrics: metrics.clone(),
            health,
            token: settings
                .admin
                .token
                .clone()
                .filter(|t| !t.expose().is_empty()),
            alive: alive.clone(),
            // A loop that has not turned for this long is wedged: librdkafka
            // has dropped the member by then too.
            stall_limit: settings.max_poll_interval()?,
            dispatchers: settings.dispatcher_events(),
        };
        let server_shutdown = CancellationToken::new();
        let server = serve(
            listener,
            admin::router(admin_state.clone()),
            "admin.listen",
            server_shutdown.clone(),
        );
        let api_server = serve(
            api_listener,
            admin::api_router(admin_state),
            "admin.api_listen",
            server_shutdown.clone(),
        );
        let gauges = tokio::spawn(refresh_gauges(
            store.clone(),
            metrics.clone(),
            settings.metrics.refresh_interval,
            shutdown.clone(),
        ));
        let pipeline_shutdown = shutdown.clone();
        let tasks = tokio::spawn(async move {
            let run = tokio::spawn(pipeline.run(pipeline_shutdown.clone()));
            if let Err(e) = run.await {
                error!(error = %e, "the pipeline task failed");
            }
            if !pipeline_shutdown.is_cancelled() {
                alive.store(false, Ordering::Relaxed);
            }
            let _ = gauges.await;
            server_shutdown.cancel();
            let _ = server.await;
            let _ = api_server.await;
        });
        info!(admin = %admin_addr, admin_api = %api_addr, "outbox-sidecar started");
        Ok(App {
            admin_addr,
            api_addr,
            shutdown,
            metrics,
            store,
            tasks,
        })
    }

    /// Where `/metrics`, `/livez` and `/readyz` answer (`admin.listen`).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// Where the admin API `/admin/*` answers (`admin.api_listen`).
    pub fn api_addr(&self) -> SocketAddr {
        self.api_addr
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The token that stops the sidecar (stop fetching, drain, commit).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stops and waits for the drain to finish.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.tasks.await;
    }

    /// Waits until stopped by the token.
    pub async fn stopped(self) {
        let _ = self.tasks.await;
    }
}

async fn bind(
    key: &'static str,
    addr: SocketAddr,
) -> Result<(tokio::net::TcpListener, SocketAddr), AppError> {
    let error = |source| AppError::Listen { key, addr, source };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(error)?;
    let local = listener.local_addr().map_err(error)?;
    Ok((listener, local))
}

fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    key: &'static str,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
        {
            error!(error = %e, listener = key, "HTTP server stopped");
        }
    })
}

/// Reads the table's counts for the gauges: now, then every `interval`.
async fn refresh_gauges(
    store: Store,
    metrics: Metrics,
    interval: std::time::Duration,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match store.stats().await {
            Ok(stats) => {
                metrics.set_table_stats(&stats, crate::store::now());
                metrics.database_up.set(1);
            }
            Err(e) => {
                metrics.database_up.set(0);
                warn!(error = %e, "cannot refresh the table gauges");
            }
        }
    }
}
