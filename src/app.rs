//! Wiring: builds every part from the settings and runs them until the
//! shutdown token is cancelled (SIGTERM or SIGINT in the binary).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::admin::{self, AdminState};
use crate::config::Settings;
use crate::consumer::{ConsumerHealth, Pipeline};
use crate::dispatch::Registry;
use crate::hold::Holds;
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
    #[error(transparent)]
    Tracing(#[from] crate::tracer::ExporterError),
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
        let store = Store::open(&settings)
            .await?
            .count_statements(metrics.db_statements_total.clone());
        store.check_table().await?;
        store.check_own_tables().await?;
        let background = Store::open_background(&settings)
            .await?
            .count_statements(metrics.db_statements_total.clone());
        let registry = Registry::from_settings(&settings.dispatchers)?;
        metrics.register_dispatchers(settings.dispatchers.keys().map(String::as_str));
        let holds = Arc::new(Holds::new(
            background.clone(),
            metrics.clone(),
            settings.dispatch.pause_refresh,
            settings
                .dispatchers
                .iter()
                .filter_map(|(name, d)| d.breaker.clone().map(|b| (name.clone(), b))),
        ));
        let (listener, admin_addr) = bind("admin.listen", settings.admin_listen()?).await?;
        let (api_listener, api_addr) =
            bind("admin.api_listen", settings.admin_api_listen()?).await?;

        let shutdown = CancellationToken::new();
        let health = Arc::new(ConsumerHealth::default());
        let alive = Arc::new(AtomicBool::new(true));
        let tracer = crate::tracer::Tracer::new(
            &settings.tracing,
            metrics.trace_context_invalid_total.clone(),
        )?;
        let ctx = Arc::new(
            JobContext::new(
                store.clone(),
                registry,
                metrics.clone(),
                settings.dispatch.retry_delay,
                settings.dispatch.max_attempts,
                settings.dispatch.max_in_flight,
                holds.clone(),
            )
            .with_tracer(tracer.clone()),
        );
        // The group's metadata names each member by its client.id: the
        // replica's name unless `[kafka.properties]` sets one (`events why`).
        let mut kafka = settings.kafka.clone();
        if !kafka
            .properties
            .keys()
            .any(|k| k.replace('_', ".") == "client.id")
        {
            kafka
                .properties
                .insert("client.id".to_owned(), settings.history.replica_name());
        }
        let pipeline = Pipeline::new(
            &kafka,
            &settings.database.table,
            ctx,
            &settings.dispatch,
            settings.shutdown.drain_timeout,
            health.clone(),
        )?;

        let operations =
            crate::operations::Operations::new(store.clone(), &settings.history.replica_name());
        let admin_state = AdminState {
            store: store.clone(),
            metrics: metrics.clone(),
            health: health.clone(),
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
            holds: Some(holds.clone()),
            rates: settings.dispatcher_rates(),
            operations: operations.clone(),
            retry_delay: settings.dispatch.retry_delay,
            max_attempts: settings.dispatch.max_attempts,
            scheduler: Some(pipeline.asker()),
            kafka: Some(kafka.clone()),
        };
        let server_shutdown = CancellationToken::new();
        let limits = ListenerLimits::from_settings(&settings);
        let server = serve(
            listener,
            admin::router(admin_state.clone()),
            "admin.listen",
            limits,
            server_shutdown.clone(),
        );
        let console = crate::console::ConsoleState::new(
            admin_state.clone(),
            settings.admin.console_session_ttl,
            settings.admin.console_secure_cookie,
        );
        let api_server = serve(
            api_listener,
            admin::api_router(admin_state).merge(crate::console::router(console)),
            "admin.api_listen",
            limits,
            server_shutdown.clone(),
        );
        let backlog = crate::backlog::Backlog::new(&kafka);
        if settings.ordering.enabled() {
            tokio::spawn(sweep_stranded(
                background.clone(),
                health.clone(),
                Sweep {
                    stranded_after: settings.ordering.stranded_after,
                    dispatchers: settings.dispatcher_events(),
                    holds: holds.clone(),
                    backlog: backlog.clone(),
                },
                shutdown.clone(),
            ));
        }
        tokio::spawn(carry_on_replays(
            operations.clone(),
            health.clone(),
            shutdown.clone(),
        ));
        let gauges = tokio::spawn(refresh_gauges(
            background,
            health.clone(),
            metrics.clone(),
            settings.metrics.refresh_interval,
            Unexplained {
                after: settings.metrics.pending_unexplained_after,
                dispatchers: settings.dispatcher_events(),
                holds: holds.clone(),
                backlog: backlog.clone(),
            },
            shutdown.clone(),
        ));
        let pauses = {
            let holds = holds.clone();
            let stop = shutdown.clone();
            let dispatchers = settings.dispatcher_events();
            tokio::spawn(async move {
                tokio::join!(
                    holds.run(stop.clone()),
                    holds.supervise_breakers(dispatchers, stop)
                );
            })
        };
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
            let _ = pauses.await;
            server_shutdown.cancel();
            let _ = server.await;
            let _ = api_server.await;
            // The spans of the last attempts go out before the exit.
            let _ = tokio::task::spawn_blocking(move || tracer.shutdown()).await;
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

/// What a slow or greedy client may hold on one listener
/// (`admin.header_read_timeout`, `admin.request_timeout`,
/// `admin.max_connections`).
#[derive(Debug, Clone, Copy)]
pub struct ListenerLimits {
    pub header_read_timeout: Duration,
    pub request_timeout: Duration,
    pub max_connections: usize,
}

impl ListenerLimits {
    pub fn from_settings(settings: &Settings) -> Self {
        Self {
            header_read_timeout: settings.admin.header_read_timeout,
            request_timeout: settings.admin.request_timeout,
            max_connections: settings.admin.max_connections,
        }
    }
}

/// Serves `app` on `listener` over HTTP/1.1 until `stop`, then lets the
/// open connections finish their request.
///
/// `axum::serve` has no header-read timeout and accepts without bound, so a
/// slowloris client (request heads trickled a byte at a time, or connections
/// left idle) could hold sockets and tasks forever. Here a connection is
/// accepted only with one of `max_connections` permits (the rest wait in the
/// kernel's backlog), a connection that has not sent a whole request head
/// within `header_read_timeout` is closed (idle keep-alive connections too),
/// and a request not answered within `request_timeout` gets 408.
fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    key: &'static str,
    limits: ListenerLimits,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let app = app.layer(tower_http::timeout::TimeoutLayer::with_status_code(
        axum::http::StatusCode::REQUEST_TIMEOUT,
        limits.request_timeout,
    ));
    tokio::spawn(async move {
        let permits = Arc::new(Semaphore::new(limits.max_connections));
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout);
        loop {
            let permit = tokio::select! {
                _ = stop.cancelled() => break,
                permit = permits.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let stream = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // E.g. out of file descriptors: back off, keep serving.
                        warn!(error = %e, listener = key, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let service = hyper_util::service::TowerToHyperService::new(app.clone());
            let conn = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    debug!(error = %e, listener = key, "HTTP connection ended");
                }
                drop(permit);
            });
        }
        drop(listener);
        graceful.shutdown().await;
    })
}

/// How often the gauges' loop looks whether this replica became (or
/// stopped being) the one that reads them.
const REPORTER_CHECK: Duration = Duration::from_millis(250);

/// What the stranded-event sweep needs besides the store.
struct Sweep {
    stranded_after: std::time::Duration,
    /// Each dispatcher's event names.
    dispatchers: std::collections::BTreeMap<String, Vec<String>>,
    /// This replica's breakers.
    holds: Arc<crate::hold::Holds>,
    /// What the group has read: a row whose change event may still be in
    /// the backlog is not stranded.
    backlog: crate::backlog::Backlog,
}

impl Sweep {
    async fn explained(&self, store: &Store) -> Result<Vec<String>, crate::store::StoreError> {
        explained_event_names(store, &self.dispatchers, &self.holds).await
    }
}

/// The event names whose rows wait for a known reason: a paused
/// dispatcher's (group-wide), or one whose breaker is not closed on this
/// replica.
async fn explained_event_names(
    store: &Store,
    dispatchers: &std::collections::BTreeMap<String, Vec<String>>,
    holds: &crate::hold::Holds,
) -> Result<Vec<String>, crate::store::StoreError> {
    let paused: Vec<String> = store
        .pauses()
        .await?
        .into_iter()
        .map(|p| p.dispatcher)
        .collect();
    let breakers = holds.breaker_states();
    Ok(dispatchers
        .iter()
        .filter(|(name, _)| {
            paused.contains(name) || breakers.get(*name).is_some_and(|s| *s != "closed")
        })
        .flat_map(|(_, events)| events.iter().cloned())
        .collect())
}

/// What the gauges' loop needs to count the pending events nothing
/// explains (`outbox_pending_unexplained`).
struct Unexplained {
    after: std::time::Duration,
    dispatchers: std::collections::BTreeMap<String, Vec<String>>,
    holds: Arc<crate::hold::Holds>,
    backlog: crate::backlog::Backlog,
}

impl Unexplained {
    async fn count(&self, store: &Store) -> Result<i64, crate::store::StoreError> {
        let skip = explained_event_names(store, &self.dispatchers, &self.holds).await?;
        // A row changed after the group last read everything before may
        // have its change event in the backlog: the backlog explains it.
        let Some(cutoff) = quiet_and_read(self.after, self.backlog.read_before().await) else {
            return Ok(0);
        };
        store.count_unexplained(cutoff, &skip, 10_000).await
    }
}

/// The rows unchanged for `quiet` whose change events the group has read:
/// changed `quiet` before the earlier of now and `read_before` (the group
/// has read every change event on the topic before it; `quiet` also gives
/// the change feed time to put a row's event on the topic). `None` when
/// the group has not been caught up since the replica started.
fn quiet_and_read(
    quiet: std::time::Duration,
    read_before: Option<chrono::NaiveDateTime>,
) -> Option<chrono::NaiveDateTime> {
    let quiet = chrono::Duration::from_std(quiet).unwrap_or_else(|_| chrono::Duration::zero());
    read_before.map(|r| r.min(crate::store::now()) - quiet)
}

/// `[ordering]`: the replica holding partition 0 announces again, every
/// half `stranded_after`, the pending events nothing earlier of their
/// aggregate holds that have not changed for `stranded_after`: an event
/// parked behind one whose announcement was lost (the replica killed
/// between the two) is not stranded. It walks the table with a cursor, a
/// window of 1,000 rows a turn, skipping what a pause or an open breaker
/// explains and what was attempted since it last changed
/// ([`Store::announce_stranded`]).
async fn sweep_stranded(
    store: Store,
    health: Arc<ConsumerHealth>,
    sweep: Sweep,
    shutdown: CancellationToken,
) {
    let every = (sweep.stranded_after / 2).max(std::time::Duration::from_millis(500));
    let mut after = 0;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        if !health.table_reporter.load(Ordering::Relaxed) {
            continue;
        }
        let turn = async {
            let read_before = sweep.backlog.read_before().await;
            let Some(cutoff) = quiet_and_read(sweep.stranded_after, read_before) else {
                return Ok(crate::store::ordering::Swept {
                    touched: 0,
                    next: after,
                });
            };
            let explained = sweep.explained(&store).await?;
            store
                .announce_unchanged_since(cutoff, 1_000, after, &explained)
                .await
        };
        // Bounded, and dropped at the stop: a database that stops
        // answering mid-statement holds neither this loop nor the shutdown.
        let result = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = tokio::time::timeout(crate::store::batch::STATEMENT_DEADLINE, turn) => r,
        };
        let Ok(result) = result else {
            warn!("the database did not answer the stranded-event sweep in time; trying again next turn");
            continue;
        };
        match result {
            Ok(swept) => {
                after = swept.next;
                if swept.touched > 0 {
                    info!(
                        events = swept.touched,
                        "announced again pending events nothing earlier of their aggregate holds \
                         (unchanged for ordering.stranded_after)"
                    );
                }
            }
            Err(e) => warn!(error = %e, "cannot look for stranded ordered events"),
        }
    }
}

/// Replays whose replica ended are carried on from their cursor: this
/// replica's own at once (it started again under the same name), others'
/// by the replica holding partition 0 once their heartbeat has stopped
/// for [`crate::operations::CUT_AFTER`].
async fn carry_on_replays(
    operations: crate::operations::Operations,
    health: Arc<ConsumerHealth>,
    shutdown: CancellationToken,
) {
    loop {
        let others = health.table_reporter.load(Ordering::Relaxed);
        let turn = operations.carry_on_replays(others);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = tokio::time::timeout(crate::store::batch::STATEMENT_DEADLINE, turn) => match r {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => warn!(error = %e, "cannot look for replays to carry on"),
                Err(_) => warn!("the database did not answer the look for replays to carry on in time"),
            },
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
        }
    }
}

/// Whether a replica that handed partition 0 over keeps the table gauges
/// it last read (`reported_at`) instead of zeros: for two refresh
/// intervals, by when the next reporter has read them, so the group's
/// `max` never drops to 0 during a hand-off (which would restart the
/// `for:` window of `OutboxEventsFailed` and `OutboxOrderingHeld`).
fn keeps_last_values(
    reported_at: Option<tokio::time::Instant>,
    now: tokio::time::Instant,
    interval: std::time::Duration,
) -> bool {
    reported_at.is_some_and(|at| now.saturating_duration_since(at) < interval * 2)
}

/// Reads the table's counts for the gauges: now, then every `interval`;
/// first says when the table lacks the index that keeps this cheap. Only
/// the replica holding partition 0 reads them (counting a backlog of
/// pending rows costs the database as much as the rows, once per replica
/// otherwise); the others report zeros and ping the database.
async fn refresh_gauges(
    store: Store,
    health: Arc<ConsumerHealth>,
    metrics: Metrics,
    interval: std::time::Duration,
    unexplained: Unexplained,
    shutdown: CancellationToken,
) {
    // Without an index on status each refresh reads the whole table:
    // every replica, every interval, for as long as the history grows.
    match store.status_index_advice().await {
        Ok(Some(create)) => warn!(
            table = store.table(),
            "the outbox table has no index whose first column is status: every gauge refresh \
             (metrics.refresh_interval, by the replica holding partition 0) scans the whole table; create one: {create}"
        ),
        Ok(None) => {}
        Err(e) => debug!(error = %e, "cannot read the outbox table's indexes"),
    }
    match store.ordering_index_advice().await {
        Ok(Some(create)) => warn!(
            table = store.table(),
            "the outbox table has no index whose first column is the [ordering] column: every \
             event read looks up its aggregate's earlier and later events with a scan; create one: {create}"
        ),
        Ok(None) => {}
        Err(e) => debug!(error = %e, "cannot read the outbox table's indexes"),
    }
    let mut tick = tokio::time::interval(interval);
    let mut reporting = false;
    // When this replica last read the table's gauges (as the reporter).
    let mut reported_at: Option<tokio::time::Instant> = None;
    loop {
        // A replica that starts or stops reading the gauges does so at
        // once, not an interval later.
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            _ = tokio::time::sleep(REPORTER_CHECK) => {
                if health.table_reporter.load(Ordering::Relaxed) == reporting {
                    continue;
                }
            }
        }
        reporting = health.table_reporter.load(Ordering::Relaxed);
        if !reporting {
            metrics.table_gauges_reporter.set(0);
            if !keeps_last_values(reported_at, tokio::time::Instant::now(), interval) {
                reported_at = None;
                let none = crate::store::TableStats {
                    estimated_rows: Some(0),
                    ..Default::default()
                };
                metrics.set_table_stats(&none, crate::store::now());
                metrics.ordering_held_aggregates.set(0);
                metrics.ordering_held_events.set(0);
                metrics.pending_unexplained.set(0);
            }
            // A database that stops answering mid-statement (a silent
            // network path) holds neither this loop nor the shutdown that
            // waits for it: each turn has a deadline and yields to the stop.
            let ping = async {
                match store.ping().await {
                    Ok(()) => metrics.database_up.set(1),
                    Err(e) => {
                        metrics.database_up.set(0);
                        warn!(error = %e, "cannot reach the database");
                    }
                }
            };
            if !bounded(&shutdown, &metrics, ping).await {
                return;
            }
            continue;
        }
        metrics.table_gauges_reporter.set(1);
        let read = async {
            match store.stats().await {
                Ok(stats) => {
                    reported_at = Some(tokio::time::Instant::now());
                    metrics.set_table_stats(&stats, crate::store::now());
                    metrics.database_up.set(1);
                    match store.held_counts().await {
                        Ok(Some((aggregates, events))) => {
                            metrics.ordering_held_aggregates.set(aggregates);
                            metrics.ordering_held_events.set(events);
                        }
                        Ok(None) => {}
                        Err(e) => warn!(error = %e, "cannot count the events ordering holds"),
                    }
                    match unexplained.count(&store).await {
                        Ok(n) => metrics.pending_unexplained.set(n),
                        Err(e) => {
                            warn!(error = %e, "cannot count the pending events nothing explains")
                        }
                    }
                }
                Err(e) => {
                    metrics.database_up.set(0);
                    warn!(error = %e, "cannot refresh the table gauges");
                }
            }
        };
        if !bounded(&shutdown, &metrics, read).await {
            return;
        }
    }
}

/// Runs one turn of a background loop's database work within
/// [`crate::store::batch::STATEMENT_DEADLINE`]; `false` when the sidecar
/// is stopping (the turn is dropped). A turn past its deadline counts as
/// the database being down and is dropped: the next turn reads again.
async fn bounded(
    shutdown: &CancellationToken,
    metrics: &Metrics,
    turn: impl std::future::Future<Output = ()>,
) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => false,
        r = tokio::time::timeout(crate::store::batch::STATEMENT_DEADLINE, turn) => {
            if r.is_err() {
                metrics.database_up.set(0);
                warn!(
                    deadline = ?crate::store::batch::STATEMENT_DEADLINE,
                    "the database did not answer the table gauges' read in time; reading again at the next refresh"
                );
            }
            true
        }
    }
}

#[cfg(test)]
mod gauge_tests {
    use super::keeps_last_values;
    use std::time::Duration;
    use tokio::time::Instant;

    #[test]
    fn a_replica_that_hands_partition_0_over_keeps_its_gauges_for_two_intervals() {
        let t0 = Instant::now();
        let interval = Duration::from_secs(30);
        // Never the reporter: zeros.
        assert!(!keeps_last_values(None, t0, interval));
        // Read just before the hand-off: kept while the next reporter
        // reads, then zeros.
        assert!(keeps_last_values(
            Some(t0),
            t0 + Duration::from_secs(1),
            interval
        ));
        assert!(keeps_last_values(
            Some(t0),
            t0 + Duration::from_secs(59),
            interval
        ));
        assert!(!keeps_last_values(
            Some(t0),
            t0 + Duration::from_secs(60),
            interval
        ));
    }
}
