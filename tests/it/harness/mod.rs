//! `spawn_app` and what it stands on: each test gets its own PostgreSQL
//! database (migrated), its own topic and group on a Kafka-protocol broker,
//! a Debezium stand-in publishing every write, a real HTTP receiver, and the
//! sidecar running in-process.

pub mod browser;
pub mod child;
pub mod feed;
pub mod kafka;
pub mod proxy;
pub mod receiver;
pub mod tansu;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use entity::{OutboxEventRow, Status};
use outbox_sidecar::app::App;
use outbox_sidecar::config::Settings;
use outbox_sidecar::store::Store;
use serde_json::Value;

use crate::db::TestDb;
pub use feed::ChangeFeed;
pub use kafka::{unique, Kafka};
pub use receiver::Receiver;

pub const ACCOUNTS_EVENTS: [&str; 3] = [
    "accounts.purchase_create",
    "accounts.installment_paid",
    "accounts.installment_overdue",
];

/// Polls `check` until it returns `Some`, failing the test after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits until the sidecar whose admin server is at `base`
/// (`http://host:port`) answers `/readyz` with 200.
pub async fn wait_ready(what: &str, base: &str, limit: Duration) {
    let url = format!("{base}/readyz");
    eventually(what, limit, || {
        let url = url.clone();
        async move {
            reqwest::get(&url)
                .await
                .ok()?
                .status()
                .is_success()
                .then_some(())
        }
    })
    .await
}

/// One series' value from the sidecar's `/metrics` at `base`.
pub async fn metric(base: &str, series: &str) -> Option<f64> {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    crate::operations::sample(&text, series)
}

/// Starts a sidecar with `settings` and waits until it is ready.
pub async fn start_with(settings: Settings) -> App {
    // Generous: a member joining a group where another is finishing a
    // revoke is assigned only once that revoke is done.
    start_within(settings, Duration::from_secs(60)).await
}

/// Starts a sidecar with `settings` and waits up to `limit` until it is
/// ready.
pub async fn start_within(settings: Settings, limit: Duration) -> App {
    let app = App::start(settings).await.expect("start the sidecar");
    let base = format!("http://{}", app.admin_addr());
    wait_ready("the sidecar to be ready", &base, limit).await;
    app
}

#[derive(Clone)]
pub struct Options {
    pub retry_delay: &'static str,
    pub max_attempts: i32,
    pub max_in_flight: usize,
    pub partitions: i32,
    pub admin_token: Option<&'static str>,
    /// Extra TOML appended to the generated configuration.
    pub extra_toml: String,
    /// Extra keys of the generated `[dispatch]` table.
    pub dispatch_toml: String,
    /// Extra keys of the generated `[dispatchers.accounts]` table.
    pub accounts_toml: String,
    /// Extra keys of the generated `[admin]` table.
    pub admin_toml: String,
    /// Extra keys of the generated `[metrics]` table.
    pub metrics_toml: String,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            retry_delay: "300ms",
            max_attempts: 3,
            max_in_flight: 16,
            partitions: 3,
            admin_token: Some("test-admin-token-0123456789"),
            extra_toml: String::new(),
            dispatch_toml: String::new(),
            accounts_toml: String::new(),
            admin_toml: String::new(),
            metrics_toml: String::new(),
        }
    }
}

pub struct TestApp {
    pub kafka: Kafka,
    pub db: TestDb,
    pub store: Store,
    #[allow(dead_code)]
    pub feed: ChangeFeed,
    pub receiver: Receiver,
    pub topic: String,
    pub group: String,
    pub opts: Options,
    pub app: Option<App>,
}

impl TestApp {
    pub fn settings(&self, group: &str) -> Settings {
        let o = &self.opts;
        let token = o
            .admin_token
            .map(|t| format!("token = \"{t}\""))
            .unwrap_or_default();
        let toml = format!(
            r#"
[database]
url = "{db}"
max_connections = 8
[kafka]
brokers = "{brokers}"
topic = "{topic}"
group_id = "{group}"
[kafka.properties]
"session.timeout.ms" = "6000"
"heartbeat.interval.ms" = "500"
"topic.metadata.refresh.interval.ms" = "1000"
[dispatch]
max_attempts = {max_attempts}
retry_delay = "{retry_delay}"
max_in_flight = {max_in_flight}
{dispatch_extra}
[dispatchers.accounts]
url = "{url}"
events = ["accounts.purchase_create", "accounts.installment_paid", "accounts.installment_overdue"]
timeout = "2s"
{accounts_extra}
[dispatchers.accounts.headers]
Authorization = "Bearer accounts-secret-token"
[admin]
listen = "127.0.0.1:0"
api_listen = "127.0.0.1:0"
{token}
{admin_extra}
[metrics]
refresh_interval = "200ms"
{metrics_extra}
[shutdown]
drain_timeout = "5s"
{extra}
"#,
            db = self.db.url,
            brokers = self.kafka.brokers,
            topic = self.topic,
            max_attempts = o.max_attempts,
            retry_delay = o.retry_delay,
            max_in_flight = o.max_in_flight,
            url = self.receiver.url(),
            extra = o.extra_toml,
            dispatch_extra = o.dispatch_toml,
            accounts_extra = o.accounts_toml,
            admin_extra = o.admin_toml,
            metrics_extra = o.metrics_toml,
        );
        Settings::from_toml(Some(&toml), BTreeMap::new()).expect("test settings")
    }

    /// Starts (or restarts) the sidecar and waits until it is ready.
    pub async fn start(&mut self) {
        let group = self.group.clone();
        self.app = Some(self.start_in_group(&group).await);
    }

    pub async fn start_in_group(&self, group: &str) -> App {
        start_with(self.settings(group)).await
    }

    pub async fn stop(&mut self) {
        if let Some(app) = self.app.take() {
            app.stop().await;
        }
    }

    /// `/metrics`, `/livez`, `/readyz` (`admin.listen`).
    pub fn admin_url(&self, path: &str) -> String {
        let app = self.app.as_ref().expect("running");
        format!("http://{}{path}", app.admin_addr())
    }

    /// The admin API `/admin/*` (`admin.api_listen`).
    pub fn api_url(&self, path: &str) -> String {
        let app = self.app.as_ref().expect("running");
        format!("http://{}{path}", app.api_addr())
    }

    pub async fn insert(&self, event_name: &str, payload: Value) -> i64 {
        self.store
            .insert(event_name, &payload)
            .await
            .expect("insert")
    }

    pub async fn row(&self, id: i64) -> OutboxEventRow {
        self.store.get(id).await.expect("read").expect("row exists")
    }

    /// Waits until the row reaches `status`.
    pub async fn wait_status(&self, id: i64, status: Status, limit: Duration) -> OutboxEventRow {
        eventually(
            &format!("event {id} to be {status}"),
            limit,
            || async move {
                let row = self.store.get(id).await.ok()??;
                (row.status == status).then_some(row)
            },
        )
        .await
    }

    /// Waits until the group committed everything published so far: then
    /// every job has ended and nothing more will be sent.
    pub async fn wait_all_committed(&self, group: &str, limit: Duration) {
        eventually("all offsets to be committed", limit, || async move {
            let end = self.kafka.end_offsets(&self.topic, self.opts.partitions);
            let committed = self
                .kafka
                .committed(group, &self.topic, self.opts.partitions);
            let done = end.iter().zip(&committed).all(|(e, c)| *e == 0 || c == e);
            done.then_some(())
        })
        .await
    }
}

/// A `TestApp` on `kafka` with its own database, topic, feed and
/// receiver; the sidecar not started yet.
pub async fn prepare_on(kafka: Kafka, opts: Options, receiver: Receiver) -> TestApp {
    // `RUST_LOG=outbox_sidecar=debug cargo test … -- --nocapture` shows the
    // sidecars' logs.
    if std::env::var_os("RUST_LOG").is_some() {
        outbox_sidecar::telemetry::init_logging(&Default::default());
    }
    let db = TestDb::postgres().await;
    let store = db.store().await;
    let topic = unique("outbox");
    let group = unique("sidecar");
    kafka.create_topic(&topic, opts.partitions).await;
    let feed = ChangeFeed::start(&db.url, &kafka.brokers, &topic).await;
    TestApp {
        kafka,
        db,
        store,
        feed,
        receiver,
        topic,
        group,
        opts,
        app: None,
    }
}

pub async fn spawn_app_with(opts: Options, receiver: Receiver) -> TestApp {
    let mut t = prepare_on(Kafka::start(), opts, receiver).await;
    t.start().await;
    t
}

pub async fn spawn_app(opts: Options) -> TestApp {
    spawn_app_with(opts, Receiver::accepting().await).await
}

impl Drop for TestApp {
    /// A test that failed (or did not stop its sidecar) leaves the sidecar
    /// running until the runtime drops it; the consumer's close then waits
    /// for the broker, and destroying the mock cluster first can block it
    /// forever, hanging the whole test binary. Leak the cluster instead (the
    /// process ends soon after). A tansu broker is leaked the same way: its
    /// parent-death signal ends it with the test's thread.
    fn drop(&mut self) {
        if std::thread::panicking() || self.app.is_some() {
            if let Some(cluster) = self.kafka.cluster.take() {
                std::mem::forget(cluster);
            }
            if let Some(owner) = self.kafka.mock_owner.take() {
                std::mem::forget(owner);
            }
            if let Some(tansu) = self.kafka.tansu.take() {
                std::mem::forget(tansu);
            }
        }
    }
}
