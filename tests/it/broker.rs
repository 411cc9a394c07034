//! The broker's own behaviour, survived with nothing lost: a broker
//! restarted empty, a topic deleted and recreated, records gone before the
//! group read them, a record larger than the fetch limits. Each test runs
//! on the broker that can play it and says so on the other
//! (docs/brokers.md has what each broker did).

use std::time::Duration;

use entity::Status;
use serde_json::json;

use crate::harness::kafka::on_tansu;
use crate::harness::{child, eventually, prepare_on, spawn_app, Kafka, Options, Receiver, TestApp};

const T: Duration = Duration::from_secs(60);

/// The sidecar's consumer series (errors by kind, rebalances, lag), for
/// the test output: what the sidecar reported about the broker.
async fn consumer_series(t: &TestApp) -> String {
    metrics_of(&t.admin_url("")).await
}

/// [`consumer_series`] of the sidecar whose admin server is at `base`.
async fn metrics_of(base: &str) -> String {
    let text = match reqwest::get(format!("{base}/metrics")).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(e) => return format!("(no metrics: {e})"),
    };
    text.lines()
        .filter(|l| {
            l.starts_with("outbox_consumer_errors_total")
                || l.starts_with("outbox_consumer_rebalances_total")
                || l.starts_with("outbox_consumer_lag")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

async fn insert_n(t: &TestApp, what: &str, n: usize) -> Vec<i64> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(
            t.insert("accounts.purchase_create", json!({"what": what, "n": i}))
                .await,
        );
    }
    ids
}

async fn all_sent(t: &TestApp, ids: &[i64]) {
    for id in ids {
        t.wait_status(*id, Status::Sent, T).await;
    }
}

/// Waits until the feed published a change event for each of `ids`.
async fn published(t: &TestApp, ids: &[i64]) {
    eventually("the change events to be published", T, || async {
        let got = t.feed.published();
        ids.iter()
            .all(|id| got.iter().any(|p| p.id == *id))
            .then_some(())
    })
    .await;
}

/// `outbox-sidecar events retrigger --pending-older-than 0s` on the test's
/// database: the README's remedy for change events that are gone.
fn retrigger_pending(t: &TestApp) -> String {
    let out = crate::cli::bin()
        .env("OUTBOX__DATABASE__URL", &t.db.url)
        .env("OUTBOX__DISPATCHERS__ACCOUNTS__URL", t.receiver.url())
        .env(
            "OUTBOX__DISPATCHERS__ACCOUNTS__EVENTS",
            "accounts.purchase_create",
        )
        .args(["events", "retrigger", "--pending-older-than", "0s"])
        .output()
        .expect("run events retrigger");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Rows whose change events are gone (`why`) stay pending; `events
/// retrigger --pending-older-than` announces exactly them again, and they
/// are sent.
async fn recover_stranded(t: &TestApp, stranded: &[i64], why: &str) {
    for id in stranded {
        assert_eq!(
            t.row(*id).await.status,
            Status::Pending,
            "row {id}: its change event {why}"
        );
    }
    let said = retrigger_pending(t);
    assert_eq!(
        said,
        format!("retriggered {} pending event(s)", stranded.len())
    );
    all_sent(t, stranded).await;
}

/// tansu killed and started again on the same port with memory storage:
/// an empty broker, without the topic, the group or its offsets. First
/// under a running sidecar, then while it is stopped with change events
/// it has not read: those are gone with the broker, their rows stay
/// pending, and `events retrigger --pending-older-than` announces them
/// again. The sidecar runs as its own process, restarted when it exits,
/// as Kubernetes would: a fetch that meets the empty broker before the
/// topic is created again can crash librdkafka on tansu (docs/brokers.md,
/// finding 3), and in the test binary that crash would take every test
/// with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restarted_empty_loses_nothing_pending() {
    if !on_tansu() {
        println!("tansu only: the mock cluster cannot be restarted empty on the same port");
        return;
    }
    let mut t = prepare_on(
        Kafka::start(),
        Options {
            partitions: 1,
            ..Options::default()
        },
        Receiver::accepting().await,
    )
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = child::write_config(&t, dir.path());
    let log = dir.path().join("sidecar.log");
    let mut sidecar = Running::start(&config, &log).await;
    let first = insert_n(&t, "before the restart", 5).await;
    sent_restarting(
        &t,
        &mut sidecar,
        &config,
        &log,
        &first,
        "before the restart",
    )
    .await;
    t.wait_all_committed(&t.group, T).await;

    // Under a running sidecar.
    t.kafka.tansu().restart();
    // The connector creates its topic again on its next record.
    t.kafka.create_topic(&t.topic, 1).await;
    let second = insert_n(&t, "after a restart under the sidecar", 3).await;
    sent_restarting(
        &t,
        &mut sidecar,
        &config,
        &log,
        &second,
        "broker restarted under the sidecar",
    )
    .await;
    println!(
        "broker restarted under the sidecar: {}",
        metrics_of(&sidecar.base).await
    );

    // Change events the sidecar has not read go with the broker.
    sidecar.stop();
    let stranded = insert_n(&t, "published while the sidecar was stopped", 4).await;
    published(&t, &stranded).await;
    t.kafka.tansu().restart();
    t.kafka.create_topic(&t.topic, 1).await;
    let mut sidecar = Running::start(&config, &log).await;
    let third = insert_n(&t, "after a restart while stopped", 3).await;
    sent_restarting(
        &t,
        &mut sidecar,
        &config,
        &log,
        &third,
        "broker restarted while stopped",
    )
    .await;
    recover_stranded(&t, &stranded, "went with the broker").await;
    for id in first.iter().chain(&second).chain(&third).chain(&stranded) {
        assert_eq!(t.receiver.for_id(*id).len(), 1, "event {id} sent once");
    }
    println!(
        "broker restarted while the sidecar was stopped: {}",
        metrics_of(&sidecar.base).await
    );
    sidecar.stop();
}

/// Waits until every row of `ids` is sent; when the sidecar process exits
/// meanwhile, prints why (its exit status and last log lines) and starts
/// it again, as Kubernetes restarts a container.
async fn sent_restarting(
    t: &TestApp,
    sidecar: &mut Running,
    config: &std::path::Path,
    log: &std::path::Path,
    ids: &[i64],
    what: &str,
) {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        if let Some(status) = sidecar.exited() {
            println!(
                "{what}: the sidecar exited ({status}); its last log lines:\n{}",
                tail(log, 5)
            );
            *sidecar = Running::start(config, log).await;
        }
        let mut all = true;
        for id in ids {
            all &= t.row(*id).await.status == Status::Sent;
        }
        if all {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: the rows {ids:?} were not sent within {T:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The topic deleted and created again under a running sidecar (a
/// connector recreated with its topic; the mock cluster has no
/// DeleteTopics, so tansu plays it). The sidecar runs as its own process,
/// restarted when it exits, as Kubernetes would: on tansu, librdkafka
/// crashes on the Fetch answer for the deleted topic (docs/brokers.md).
/// The group's offsets go with the topic, so after the recreation the
/// sidecar reads the new topic from its start, commits no offset past its
/// end, sends every row once, and `events retrigger` finds nothing left
/// pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_deleted_and_recreated_under_the_sidecar() {
    if !on_tansu() {
        println!("tansu only: librdkafka's mock cluster cannot delete a topic (no DeleteTopics)");
        return;
    }
    let t = prepare_on(
        Kafka::start(),
        Options {
            partitions: 1,
            ..Options::default()
        },
        Receiver::accepting().await,
    )
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = child::write_config(&t, dir.path());
    let log = dir.path().join("sidecar.log");
    let mut sidecar = Running::start(&config, &log).await;
    let first = insert_n(&t, "on the old topic", 5).await;
    sent_restarting(&t, &mut sidecar, &config, &log, &first, "on the old topic").await;
    t.wait_all_committed(&t.group, T).await;

    t.kafka.delete_topic(&t.topic).await;
    eventually("the topic to be gone", T, || async {
        (!t.kafka.topic_exists(&t.topic)).then_some(())
    })
    .await;
    t.kafka.create_topic(&t.topic, 1).await;
    let second = insert_n(&t, "on the recreated topic", 3).await;
    published(&t, &second).await;
    sent_restarting(&t, &mut sidecar, &config, &log, &second, "topic recreated").await;
    t.wait_all_committed(&t.group, T).await;
    let said = retrigger_pending(&t);
    assert_eq!(said, "retriggered 0 pending event(s)");
    for id in first.iter().chain(&second) {
        assert_eq!(t.receiver.for_id(*id).len(), 1, "event {id} sent once");
    }
    println!(
        "topic recreated: committed {:?} of {:?}; {}",
        t.kafka.committed(&t.group, &t.topic, 1),
        t.kafka.end_offsets(&t.topic, 1),
        metrics_of(&sidecar.base).await
    );
    sidecar.stop();
}

/// A change event of `bytes` (a row whose payload is that large, the
/// event carrying it whole) followed by an ordinary one, on a one-partition
/// topic; returns the two ids.
async fn large_then_small(t: &TestApp, bytes: usize) -> (i64, i64) {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};
    let blob: String = "0123456789abcdef".repeat(bytes / 16);
    let payload = json!({ "event_type": "purchase_create", "blob": blob });
    let conn = sea_orm::Database::connect(&t.db.url)
        .await
        .expect("connect");
    let txn = conn.begin().await.expect("begin");
    // Written without the stand-in's trigger: the test publishes the
    // event itself, larger than the stand-in's producer may.
    txn.execute_unprepared("SET LOCAL session_replication_role = replica")
        .await
        .expect("silence the stand-in's trigger");
    let now = outbox_sidecar::store::now();
    let row = txn
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "INSERT INTO outbox_events (event_name, payload, status, attempts, created_at, updated_at) \
             VALUES ('accounts.purchase_create', $1::jsonb, 'pending', 0, $2, $2) RETURNING id",
            [payload.to_string().into(), now.into()],
        ))
        .await
        .expect("insert")
        .expect("returning id");
    txn.commit().await.expect("commit");
    let big: i64 = row.try_get("", "id").expect("id");
    let stamp = now.format("%Y-%m-%dT%H:%M:%S%.f").to_string();
    let value = crate::harness::feed::envelope(
        "c",
        &serde_json::Value::Null,
        &json!({
            "id": big, "event_name": "accounts.purchase_create", "payload": payload.to_string(),
            "status": "pending", "attempts": 0, "last_error": null, "sent_at": null,
            "created_at": stamp, "updated_at": stamp,
        }),
        "outbox_events",
    )
    .to_string();
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &t.kafka.brokers)
        .set("message.max.bytes", "20000000")
        .create()
        .expect("a producer of large records");
    let key = json!({ "id": big }).to_string();
    producer
        .send(
            FutureRecord::to(&t.topic).key(&key).payload(&value),
            Duration::from_secs(30),
        )
        .await
        .unwrap_or_else(|(e, _)| panic!("produce a {bytes}-byte record: {e}"));
    let small = t
        .insert(
            "accounts.purchase_create",
            json!({"after": "the large one"}),
        )
        .await;
    (big, small)
}

/// A change event of 2 MiB: twice librdkafka's `max.partition.fetch.bytes`
/// (1 MiB), under both brokers' 5 MiB limits (tansu's largest fetch
/// answer, the mock's partition log). The broker answers a fetch with the
/// whole record anyway (KIP-74), and both it and the next event are sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_larger_than_the_partition_fetch_size_is_read() {
    let bytes: usize = std::env::var("OUTBOX_TEST_LARGE_RECORD_BYTES")
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(2 << 20);
    let mut t = spawn_app(Options {
        partitions: 1,
        ..Options::default()
    })
    .await;
    let (big, small) = large_then_small(&t, bytes).await;
    let deadline = tokio::time::Instant::now() + T;
    let (big_row, small_row) = loop {
        let (b, s) = (t.row(big).await, t.row(small).await);
        if (b.status == Status::Sent && s.status == Status::Sent)
            || tokio::time::Instant::now() > deadline
        {
            break (b, s);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "a {bytes}-byte record: its row {}, the next row {}; committed {:?} of {:?}; {}",
        big_row.status,
        small_row.status,
        t.kafka.committed(&t.group, &t.topic, 1),
        t.kafka.end_offsets(&t.topic, 1),
        consumer_series(&t).await
    );
    assert_eq!(big_row.status, Status::Sent, "the large record's row");
    assert_eq!(small_row.status, Status::Sent, "the row after it");
    let reqs = t.receiver.for_id(big);
    assert_eq!(reqs.len(), 1);
    assert!(reqs[0].body.len() > bytes, "the whole payload was sent");
    t.stop().await;
}

/// Retention deleted change events the group had not read (the sidecar
/// was down longer than the topic keeps records): its committed offset is
/// before the log's start, librdkafka resets to the oldest record, and the
/// sidecar counts it (`outbox_consumer_errors_total{kind="offset_reset"}`,
/// which the shipped alert `OutboxConsumerOffsetReset` watches). The rows
/// those events announced stay pending until `events retrigger
/// --pending-older-than` announces them again; then they are sent. The
/// mock cluster plays retention: it keeps 5 MiB per partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_deleted_before_the_group_read_them_are_recovered_by_retrigger() {
    if crate::harness::kafka::mock_only(
        "retention: tansu's memory storage deletes no record and never answers OFFSET_OUT_OF_RANGE",
    ) {
        return;
    }
    let mut t = spawn_app(Options {
        partitions: 1,
        ..Options::default()
    })
    .await;
    let first = insert_n(&t, "read before the outage", 1).await;
    all_sent(&t, &first).await;
    t.wait_all_committed(&t.group, T).await;
    let committed = t.kafka.committed(&t.group, &t.topic, 1)[0];
    t.stop().await;
    let stranded = insert_n(&t, "deleted by retention before it was read", 3).await;
    published(&t, &stranded).await;
    // More than the partition keeps: updates of the sent row (which the
    // sidecar has nothing to do for) with 512 KiB of payload each.
    let sent_row = t.row(first[0]).await;
    let filler = crate::harness::feed::envelope(
        "u",
        &serde_json::Value::Null,
        &json!({
            "id": sent_row.id, "event_name": sent_row.event_name,
            "payload": json!({"pad": "x".repeat(512 << 10)}).to_string(),
            "status": "sent", "attempts": 1, "last_error": null,
            "sent_at": sent_row.sent_at.map(|s| s.format("%Y-%m-%dT%H:%M:%S%.f").to_string()),
            "created_at": sent_row.created_at.format("%Y-%m-%dT%H:%M:%S%.f").to_string(),
            "updated_at": sent_row.updated_at.format("%Y-%m-%dT%H:%M:%S%.f").to_string(),
        }),
        "outbox_events",
    )
    .to_string();
    let key = json!({ "id": sent_row.id }).to_string();
    for _ in 0..12 {
        t.feed
            .publish_raw(Some(key.as_bytes()), Some(filler.as_bytes()))
            .await;
    }
    let low = t.kafka.log_start(&t.topic, 0);
    let high = t.kafka.end_offsets(&t.topic, 1)[0];
    assert!(
        low > committed + stranded.len() as i64,
        "the partition still holds the stranded events: log {low}..{high}, committed {committed}"
    );
    t.start().await;
    eventually("the offset reset to be counted", T, || async {
        let n = crate::harness::metric(
            &t.admin_url(""),
            r#"outbox_consumer_errors_total{kind="offset_reset"}"#,
        )
        .await?;
        (n >= 1.0).then_some(())
    })
    .await;
    t.wait_all_committed(&t.group, T).await;
    recover_stranded(&t, &stranded, "was deleted before it was read").await;
    for id in first.iter().chain(&stranded) {
        assert_eq!(t.receiver.for_id(*id).len(), 1, "event {id} sent once");
    }
    // The shipped alert watches that very series.
    let rules = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy/kubernetes/prometheusrule.yaml"),
    )
    .expect("read the shipped PrometheusRule");
    assert!(rules.contains(r#"increase(outbox_consumer_errors_total{kind="offset_reset"}"#));
    println!(
        "retention: committed {committed}, log {low}..{high} when the sidecar came back; {}",
        consumer_series(&t).await
    );
    t.stop().await;
}

/// The sidecar binary as a child process, killed on drop.
struct Running {
    child: std::process::Child,
    base: String,
}

impl Running {
    async fn start(config: &std::path::Path, log: &std::path::Path) -> Running {
        let s = child::spawn(config, log);
        let r = Running {
            child: s.child,
            base: s.base,
        };
        crate::harness::wait_ready("the sidecar process to be ready", &r.base, T).await;
        r
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("wait for the sidecar")
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `n` lines of a file.
fn tail(path: &std::path::Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
