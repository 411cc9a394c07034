//! What the fault scenarios share: a `TestApp` built but not started (so a
//! scenario can pick its broker count or change its settings first), the
//! scale factor, a seeded random source and the settle step.

use std::time::Duration;

use rdkafka::mocking::MockCluster;

use crate::harness::{Kafka, Options, Receiver, TestApp};

/// The bound on any single wait of a scenario.
pub const T: Duration = Duration::from_secs(60);

/// `OUTBOX_FAULT_SCALE`: how many times the default counts (at least 1).
pub fn scale() -> usize {
    std::env::var("OUTBOX_FAULT_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1usize)
        .max(1)
}

/// The seed of a scenario's random choices: `OUTBOX_FAULT_SEED` or `fixed`.
pub fn seed(fixed: u64) -> u64 {
    std::env::var("OUTBOX_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(fixed)
}

/// Whether librdkafka's mock cluster is in use; prints why a mock-only
/// scenario is skipped when it is not.
pub fn mock_cluster_or_skip(scenario: &str) -> bool {
    !crate::harness::kafka::mock_only(&format!(
        "faults {scenario}: broker fault injection needs librdkafka's mock cluster"
    ))
}

/// splitmix64: small, seeded and good enough to pick faults.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A stateless hash of a few numbers, for choices a receiver script and the
/// checker must both recompute.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A `TestApp` with its database, topic, feed and receiver, not started.
/// `brokers` > 1 builds a mock cluster of that size (the caller checked
/// [`mock_cluster_or_skip`]).
pub async fn prepare(opts: Options, receiver: Receiver, brokers: i32) -> TestApp {
    let kafka = if brokers > 1 {
        Kafka::mock(MockCluster::new(brokers).expect("start a mock cluster"))
    } else {
        Kafka::start()
    };
    crate::harness::prepare_on(kafka, opts, receiver).await
}

pub use crate::harness::start_with;

/// Waits until no row is pending and `group` committed everything: after
/// that, nothing more is sent.
pub async fn settle(t: &TestApp, group: &str, limit: Duration) {
    settle_rows(t, limit).await;
    t.wait_all_committed(group, limit).await;
}

/// Waits until no row is pending (sent and failed rows get no request).
/// Fails when the pending count has not gone down for `limit`: a backlog
/// built by a larger `OUTBOX_FAULT_SCALE` may take longer than `limit` to
/// drain, a stuck row never drains. On failure, says which rows are
/// pending and what happened to them.
pub async fn settle_rows(t: &TestApp, limit: Duration) {
    let mut deadline = tokio::time::Instant::now() + limit;
    let mut fewest = u64::MAX;
    loop {
        if let Ok(stats) = t.store.stats().await {
            let pending = u64::try_from(stats.pending).unwrap_or(u64::MAX);
            if pending == 0 {
                return;
            }
            if pending < fewest {
                fewest = pending;
                deadline = tokio::time::Instant::now() + limit;
            }
        }
        if tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let filter = outbox_sidecar::store::ListFilter {
        status: Some(entity::Status::Pending),
        event_name: None,
        limit: Some(10),
        before: None,
        ..Default::default()
    };
    let pending = t.store.list(&filter).await.unwrap_or_default();
    let published = t.feed.published.lock().unwrap().clone();
    let mut report = String::new();
    for row in &pending {
        let events: Vec<String> = published
            .iter()
            .filter(|p| p.id == row.id)
            .map(|p| format!("{}:{:?}/{:?}", p.op, p.status, p.attempts))
            .collect();
        let requests: Vec<u16> = t.receiver.for_id(row.id).iter().map(|r| r.status).collect();
        report.push_str(&format!(
            "\n  id {} attempts {} created {} updated {}: change events {events:?}, requests {requests:?}",
            row.id, row.attempts, row.created_at, row.updated_at
        ));
    }
    panic!("no pending row was sent or failed for {limit:?} ({fewest} pending); first 10:{report}");
}

/// Inserts `n` accounts events whose payload carries `mode` and a number.
pub async fn insert_many(t: &TestApp, n: usize, mode: &str) -> Vec<i64> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let name = crate::harness::ACCOUNTS_EVENTS[i % 3];
        ids.push(
            t.insert(name, serde_json::json!({"mode": mode, "n": i}))
                .await,
        );
    }
    ids
}

/// The `mode` a request's payload carries.
pub fn mode(r: &crate::harness::receiver::Received) -> String {
    serde_json::from_slice::<serde_json::Value>(&r.body)
        .ok()
        .and_then(|v| v["mode"].as_str().map(str::to_owned))
        .unwrap_or_default()
}
