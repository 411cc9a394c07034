//! Per-aggregate ordering through real Debezium keyed by the aggregate
//! (`deploy/debezium/postgres-connector-ordered.json`, issue #32): 1,000
//! events over 50 aggregates from 4 concurrent writers, 20 % of first
//! attempts refused, a SIGKILL of one replica mid-stream and a rebalance to
//! a second: every aggregate's events POSTed in id order, none before the
//! one before it ended.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use entity::Status;
use serde_json::Value;
use wiremock::ResponseTemplate;

use super::{prepare, T};
use crate::harness::child::{crash, spawn, write_config};
use crate::harness::{eventually, Options, Receiver};
use crate::ordering::{add_aggregate_column, check_order, coin, insert_in, ORDERING};

/// The ordered connector's keys the shipped one does not have.
fn ordered_overlay() -> Value {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/debezium");
    let read = |f: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(root.join(f)).unwrap()).unwrap()
    };
    let plain = read("postgres-connector.json");
    let ordered = read("postgres-connector-ordered.json");
    let mut overlay = serde_json::Map::new();
    for (k, v) in ordered["config"].as_object().unwrap() {
        if plain["config"].get(k) != Some(v) {
            overlay.insert(k.clone(), v.clone());
        }
    }
    assert!(
        overlay.contains_key("message.key.columns"),
        "the ordered connector keys the topic by the aggregate"
    );
    Value::Object(overlay)
}

async fn answered(receiver: &Receiver, n: usize) {
    eventually(&format!("{n} events answered"), T, || async {
        let ok = receiver
            .requests()
            .iter()
            .filter(|r| r.status == 200)
            .count();
        (ok >= n).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real Debezium: make test-debezium"]
async fn debezium_keyed_by_aggregate_keeps_each_aggregate_in_order_across_a_kill_and_a_rebalance() {
    let extra = format!("{ORDERING}stranded_after = \"3s\"\n");
    let opts = Options {
        max_in_flight: 16,
        extra_toml: extra.clone(),
        ..Options::default()
    };
    let receiver = Receiver::start(|r| {
        ResponseTemplate::new(if r.nth == 0 && coin(r.id, 20) {
            503
        } else {
            200
        })
    })
    .await;
    let mut d = prepare(opts, receiver).await;
    add_aggregate_column(&d.t).await;
    d.start_debezium(Some(ordered_overlay())).await;
    // Replica A: the binary, killed with SIGKILL mid-stream.
    let config = write_config(&d.t, d.dir.path());
    std::fs::OpenOptions::new()
        .append(true)
        .open(&config)
        .unwrap()
        .write_all(extra.as_bytes())
        .unwrap();
    let log = d.dir.path().join("replica-a.log");
    let a = spawn(&config, &log);
    crate::harness::wait_ready("replica A", &a.base, T).await;
    // 1,000 events, 50 aggregates, 4 writers each writing its own aggregates.
    let mut writers = Vec::new();
    for w in 0..4 {
        let db = d.t.store.connection().clone();
        let table = d.t.store.table().to_owned();
        writers.push(tokio::spawn(async move {
            let mut mine: BTreeMap<String, Vec<i64>> = BTreeMap::new();
            let own: Vec<usize> = (0..50).filter(|k| k % 4 == w).collect();
            for n in 0..250 {
                let a = format!("acct-{:02}", own[n % own.len()]);
                let id = insert_in(&db, &table, &a).await;
                mine.entry(a).or_default().push(id);
            }
            mine
        }));
    }
    answered(&d.t.receiver, 300).await;
    // Replica B joins (a rebalance), then A is killed: B takes everything.
    d.t.start().await;
    answered(&d.t.receiver, 600).await;
    crash(a);
    let mut aggregates = BTreeMap::new();
    for w in writers {
        aggregates.extend(w.await.unwrap());
    }
    assert_eq!(aggregates.len(), 50);
    let all: Vec<i64> = aggregates.values().flatten().copied().collect();
    assert_eq!(all.len(), 1000);
    eventually("every event sent", T * 2, || async {
        let rows = d.t.store.get_many(&all).await.ok()?;
        rows.iter().all(|r| r.status == Status::Sent).then_some(())
    })
    .await;
    let requests = d.t.receiver.requests();
    check_order(&requests, &aggregates);
    // Debezium put each aggregate's change events on one partition.
    let mut partition_of: HashMap<String, i32> = HashMap::new();
    for rec in d.records() {
        let key: Value = rec
            .key
            .as_deref()
            .and_then(|k| serde_json::from_slice(k).ok())
            .unwrap_or(Value::Null);
        let Some(a) = key["aggregate_key"]
            .as_str()
            .or_else(|| key["payload"]["aggregate_key"].as_str())
        else {
            continue;
        };
        let p = *partition_of.entry(a.to_owned()).or_insert(rec.partition);
        assert_eq!(p, rec.partition, "aggregate {a} on one partition");
    }
    assert_eq!(
        partition_of.len(),
        50,
        "every record keyed by its aggregate"
    );
    let repeated = requests.len() - requests.iter().filter(|r| r.nth == 0).count();
    println!(
        "ordered through Debezium: 1000 events, 50 aggregates, {} POSTs ({} refused first attempts, \
         {repeated} repeats)",
        requests.len(),
        requests.iter().filter(|r| r.status == 503).count()
    );
    d.finish().await;
}

/// Issue #44: an aggregate released by its head's resend drains at full
/// speed. 1,000 events of one aggregate held behind a failed head are sent
/// in id order within 20 s of the resend (before: one touch and one trip
/// through Debezium, the topic and a fetch per event, 253.7 s on tansu).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real Debezium: make test-debezium"]
async fn debezium_an_aggregate_released_by_its_heads_resend_drains_without_a_round_trip_per_event()
{
    let refuse = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let head_refused = refuse.clone();
    let opts = Options {
        retry_delay: "100ms",
        max_in_flight: 16,
        extra_toml: ORDERING.to_owned(),
        ..Options::default()
    };
    let receiver = Receiver::start(move |r| {
        let refused = r.nth == 0 || head_refused.load(std::sync::atomic::Ordering::Relaxed);
        ResponseTemplate::new(if refused && r.attempt <= 3 && r.id == HEAD.get() {
            503
        } else {
            200
        })
    })
    .await;
    let mut d = prepare(opts, receiver).await;
    add_aggregate_column(&d.t).await;
    d.start_debezium(Some(ordered_overlay())).await;
    d.t.start().await;
    let db = d.t.store.connection().clone();
    let table = d.t.store.table().to_owned();
    let head = insert_in(&db, &table, "acct-hot").await;
    HEAD.set(head);
    d.t.wait_status(head, Status::Failed, T).await;
    let n = 1_000;
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(insert_in(&db, &table, "acct-hot").await);
    }
    // Every held event met its failed head and was parked.
    eventually("the held events parked", T, || async {
        let parked = crate::harness::metric(&d.t.admin_url(""), "outbox_ordering_parked_total")
            .await
            .unwrap_or(0.0);
        (parked >= n as f64).then_some(())
    })
    .await;
    refuse.store(false, std::sync::atomic::Ordering::Relaxed);
    let caller =
        outbox_sidecar::store::history::Caller::new(outbox_sidecar::store::history::Via::Cli, None);
    let resent_at = std::time::Instant::now();
    d.t.store.retry(head, &caller).await.unwrap().unwrap();
    eventually(
        "the released aggregate sent",
        std::time::Duration::from_secs(20),
        || async {
            let rows = d.t.store.get_many(&held).await.ok()?;
            rows.iter().all(|r| r.status == Status::Sent).then_some(())
        },
    )
    .await;
    let took = resent_at.elapsed();
    let mut aggregates = BTreeMap::new();
    let mut all = vec![head];
    all.extend(&held);
    aggregates.insert("acct-hot".to_owned(), all);
    let after: Vec<_> =
        d.t.receiver
            .requests()
            .into_iter()
            .filter(|r| r.status == 200)
            .collect();
    check_order(&after, &aggregates);
    println!(
        "released aggregate: {n} held events sent {:.1} s after the head's resend ({:.0}/s)",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64()
    );
    d.finish().await;
}

/// The guard beside the release: 1,000 events of one aggregate inserted at
/// once, nothing failing, go in id order within 20 s of the insert through
/// the path every event takes (one at a time per aggregate, each decided
/// when the one before it ends). On tansu with default client settings
/// this took 6.6 s before the attempt redesign.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real Debezium: make test-debezium"]
async fn debezium_one_hot_aggregate_inserted_at_once_drains_in_order() {
    let opts = Options {
        max_in_flight: 16,
        extra_toml: ORDERING.to_owned(),
        ..Options::default()
    };
    let mut d = prepare(opts, Receiver::accepting().await).await;
    add_aggregate_column(&d.t).await;
    d.start_debezium(Some(ordered_overlay())).await;
    d.t.start().await;
    let n: i64 = 1_000;
    let table = d.t.store.table().to_owned();
    let inserted_at = std::time::Instant::now();
    let stmt = sea_orm::Statement::from_string(
        sea_orm::DbBackend::Postgres,
        format!(
            "INSERT INTO {table} (event_name, payload, status, attempts, created_at, updated_at, \
             aggregate_key) SELECT 'accounts.installment_paid', jsonb_build_object('n', g), \
             'pending', 0, now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC', 'acct-hot' \
             FROM generate_series(1, {n}) AS g ORDER BY g RETURNING id"
        ),
    );
    let rows = sea_orm::ConnectionTrait::query_all_raw(d.t.store.connection(), stmt)
        .await
        .unwrap();
    let mut ids: Vec<i64> = rows.iter().map(|r| r.try_get("", "id").unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids.len() as i64, n);
    eventually(
        "the aggregate inserted at once sent",
        std::time::Duration::from_secs(20),
        || async {
            let rows = d.t.store.get_many(&ids).await.ok()?;
            rows.iter().all(|r| r.status == Status::Sent).then_some(())
        },
    )
    .await;
    let took = inserted_at.elapsed();
    let mut aggregates = BTreeMap::new();
    aggregates.insert("acct-hot".to_owned(), ids.clone());
    check_order(&d.t.receiver.requests(), &aggregates);
    println!(
        "one hot aggregate: {n} events inserted at once sent {:.1} s after the insert ({:.0}/s)",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64()
    );
    d.finish().await;
}

/// The failed head's id, for the receiver's closure (set once inserted).
struct Head(std::sync::atomic::AtomicI64);

impl Head {
    fn get(&self) -> i64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn set(&self, id: i64) {
        self.0.store(id, std::sync::atomic::Ordering::Relaxed)
    }
}

static HEAD: Head = Head(std::sync::atomic::AtomicI64::new(-1));
