//! What the consumer core must survive end to end (CONTRACT §5): a change
//! event that arrives before its row is visible, rows that cannot be
//! decoded. The rows here are written without the stand-in's trigger
//! (`session_replication_role = replica`), and the test publishes their
//! change events itself, when it chooses.

use std::time::Duration;

use entity::{OutboxEventRow, Status};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, Statement, TransactionTrait};
use serde_json::json;

use crate::harness::{eventually, metric, spawn_app, Options, TestApp};

/// Inserts a row the stand-in does not announce, in `txn`; returns the row
/// as its change event describes it (pending, 0 attempts).
async fn insert_silently(txn: &DatabaseTransaction, status: &str, n: i64) -> OutboxEventRow {
    txn.execute_unprepared("SET LOCAL session_replication_role = replica")
        .await
        .expect("silence the stand-in's trigger");
    let now = outbox_sidecar::store::now();
    let payload = json!({ "event_type": "purchase_create", "n": n });
    let row = txn
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "INSERT INTO outbox_events (event_name, payload, status, attempts, created_at, updated_at) \
             VALUES ('accounts.purchase_create', $1::jsonb, $2, 0, $3, $3) RETURNING id",
            [payload.to_string().into(), status.into(), now.into()],
        ))
        .await
        .expect("insert")
        .expect("returning id");
    OutboxEventRow {
        id: row.try_get("", "id").expect("id"),
        event_name: "accounts.purchase_create".into(),
        payload: (&payload).into(),
        status: Status::Pending,
        attempts: 0,
        last_error: None,
        sent_at: None,
        created_at: now,
        updated_at: now,
        traceparent: None,
        tracestate: None,
        sequence: None,
    }
}

/// A running sidecar on a one-partition topic, and a connection of the test's own.
async fn one_partition() -> (TestApp, sea_orm::DatabaseConnection) {
    let t = spawn_app(Options {
        partitions: 1,
        ..Options::default()
    })
    .await;
    let conn = sea_orm::Database::connect(&t.db.url)
        .await
        .expect("connect");
    (t, conn)
}

fn base(t: &TestApp) -> String {
    format!("http://{}", t.app.as_ref().expect("running").admin_addr())
}

async fn wait_metric(t: &TestApp, series: &str, at_least: f64) {
    let base = base(t);
    eventually(
        &format!("{series} >= {at_least}"),
        Duration::from_secs(20),
        || {
            let base = base.clone();
            async move { (metric(&base, series).await? >= at_least).then_some(()) }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_event_published_before_its_row_is_visible_is_sent() {
    let (mut t, conn) = one_partition().await;
    let txn = conn.begin().await.expect("begin");
    let row = insert_silently(&txn, "pending", 1).await;
    // Logical decoding ships the commit; the row is not visible yet.
    t.feed.republish(&row).await;
    wait_metric(&t, r#"outbox_cdc_messages_total{result="triggered"}"#, 1.0).await;
    // The scenario's visibility lag: the sidecar reads (and finds nothing)
    // while the transaction is still open.
    tokio::time::sleep(Duration::from_millis(500)).await;
    txn.commit().await.expect("commit");
    t.wait_status(row.id, Status::Sent, Duration::from_secs(20))
        .await;
    assert_eq!(t.receiver.for_id(row.id).len(), 1, "sent exactly once");
    wait_metric(&t, "outbox_cdc_rows_visible_late_total", 1.0).await;
    t.wait_all_committed(&t.group, Duration::from_secs(20))
        .await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_rows_are_skipped_and_their_neighbours_are_sent() {
    let (mut t, conn) = one_partition().await;
    // A Rails table may allow NULL where the sidecar needs a value.
    conn.execute_unprepared("ALTER TABLE outbox_events ALTER COLUMN attempts DROP NOT NULL")
        .await
        .expect("alter");
    let txn = conn.begin().await.expect("begin");
    let good1 = insert_silently(&txn, "pending", 1).await;
    let archived = insert_silently(&txn, "archived", 2).await;
    let null_attempts = insert_silently(&txn, "pending", 3).await;
    txn.execute_unprepared(&format!(
        "UPDATE outbox_events SET attempts = NULL WHERE id = {}",
        null_attempts.id
    ))
    .await
    .expect("null attempts");
    let good2 = insert_silently(&txn, "pending", 4).await;
    txn.commit().await.expect("commit");
    // An operator's hand edit announced as pending, in one batch with the rest.
    for row in [&good1, &archived, &null_attempts, &good2] {
        t.feed.republish(row).await;
    }
    for row in [&good1, &good2] {
        t.wait_status(row.id, Status::Sent, Duration::from_secs(20))
            .await;
    }
    wait_metric(
        &t,
        r#"outbox_cdc_skips_total{reason="undecodable_row"}"#,
        2.0,
    )
    .await;
    t.wait_all_committed(&t.group, Duration::from_secs(20))
        .await;
    // Left as they were, for the pending-age alert and the operator.
    let status: Vec<String> = conn
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            format!(
                "SELECT status FROM outbox_events WHERE id IN ({}, {}) ORDER BY id",
                archived.id, null_attempts.id
            ),
        ))
        .await
        .expect("read")
        .iter()
        .map(|r| r.try_get("", "status").expect("status"))
        .collect();
    assert_eq!(status, ["archived", "pending"]);
    t.stop().await;
}

/// A failure whose status write the database refuses every time (a check
/// constraint here; a too-long value on a strict MySQL in the wild) is
/// given up after a few tries: it does not hold its in-flight slot for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_write_the_database_refuses_is_given_up_and_the_rest_flows() {
    use crate::harness::{prepare_on, Kafka, Receiver};
    use wiremock::ResponseTemplate;
    let receiver = Receiver::start(|r: &crate::harness::receiver::Received| {
        if r.body.windows(6).any(|w| w == b"poison") {
            ResponseTemplate::new(500).set_body_string("poison")
        } else {
            ResponseTemplate::new(204)
        }
    })
    .await;
    let mut t = prepare_on(
        Kafka::start(),
        Options {
            partitions: 1,
            max_in_flight: 1,
            ..Options::default()
        },
        receiver,
    )
    .await;
    t.store
        .connection()
        .execute_unprepared(
            "ALTER TABLE outbox_events ADD CONSTRAINT no_poison \
             CHECK (last_error IS NULL OR last_error NOT LIKE '%poison%')",
        )
        .await
        .expect("constraint");
    t.start().await;
    let poison = t
        .insert("accounts.purchase_create", json!({"poison": true}))
        .await;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(
            t.insert("accounts.purchase_create", json!({ "n": n }))
                .await,
        );
    }
    for id in &ids {
        t.wait_status(*id, Status::Sent, Duration::from_secs(30))
            .await;
    }
    wait_metric(
        &t,
        r#"outbox_status_writes_given_up_total{to="failure"}"#,
        1.0,
    )
    .await;
    let row = t.row(poison).await;
    assert_eq!((row.status, row.attempts), (Status::Pending, 0));
    t.wait_all_committed(&t.group, Duration::from_secs(20))
        .await;
    t.stop().await;
}

/// The database path goes silent (no reset, no answer) mid-run: reads and
/// writes are given up at their deadlines and made again, the loop keeps
/// polling (`/livez` stays 200), and once the path is back every row is
/// sent and committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_stops_answering_stalls_nothing_for_good() {
    use crate::harness::proxy::Proxy;
    use crate::harness::{prepare_on, start_with, Kafka, Receiver};
    let t = prepare_on(
        Kafka::start(),
        Options {
            partitions: 1,
            max_in_flight: 4,
            ..Options::default()
        },
        Receiver::accepting().await,
    )
    .await;
    let url = url::Url::parse(&t.db.url).expect("database url");
    let target =
        tokio::net::lookup_host((url.host_str().expect("host"), url.port().unwrap_or(5432)))
            .await
            .expect("resolve")
            .next()
            .expect("an address");
    let proxy = Proxy::start(target).await;
    let mut via_proxy = url.clone();
    via_proxy.set_ip_host(proxy.addr.ip()).unwrap();
    via_proxy.set_port(Some(proxy.addr.port())).unwrap();
    let mut settings = t.settings(&t.group);
    settings.database.url = Some(outbox_sidecar::config::DatabaseUrl::new(
        via_proxy.to_string(),
    ));
    settings.database.connect_timeout = Duration::from_secs(1);
    let app = start_with(settings).await;
    let base = format!("http://{}", app.admin_addr());

    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(
            t.insert("accounts.purchase_create", json!({ "n": n }))
                .await,
        );
    }
    for id in &ids {
        t.wait_status(*id, Status::Sent, Duration::from_secs(20))
            .await;
    }
    proxy.set_blackhole(true);
    for n in 3..8 {
        ids.push(
            t.insert("accounts.purchase_create", json!({ "n": n }))
                .await,
        );
    }
    // The reads of the new triggers hang, then pass their deadline.
    eventually("a read given up at its deadline", Duration::from_secs(40), || {
        let base = base.clone();
        async move { (metric(&base, "outbox_row_reads_failed_total").await? >= 1.0).then_some(()) }
    })
    .await;
    let livez = reqwest::get(format!("{base}/livez")).await.expect("livez");
    assert!(livez.status().is_success(), "the loop still turns");
    proxy.set_blackhole(false);
    for id in &ids {
        t.wait_status(*id, Status::Sent, Duration::from_secs(60))
            .await;
    }
    t.wait_all_committed(&t.group, Duration::from_secs(30))
        .await;
    for id in &ids {
        assert_eq!(t.receiver.for_id(*id).len(), 1, "event {id} sent once");
    }
    app.stop().await;
}

/// Strimzi's and Confluent's producers often compress (zstd by default in
/// some): a change event in any codec Kafka has is read, none skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_events_in_every_compression_codec_are_read() {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let (mut t, conn) = one_partition().await;
    let txn = conn.begin().await.expect("begin");
    let mut rows = Vec::new();
    for n in 0..4 {
        rows.push(insert_silently(&txn, "pending", n).await);
    }
    txn.commit().await.expect("commit");
    for (row, codec) in rows.iter().zip(["gzip", "snappy", "lz4", "zstd"]) {
        let producer: FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &t.kafka.brokers)
            .set("compression.type", codec)
            .create()
            .unwrap_or_else(|e| panic!("a {codec} producer: {e}"));
        let value = crate::harness::feed::envelope(
            "c",
            &serde_json::Value::Null,
            &json!({
                "id": row.id, "event_name": row.event_name, "payload": row.payload.to_string(),
                "status": "pending", "attempts": 0, "last_error": null, "sent_at": null,
                "created_at": row.created_at.format("%Y-%m-%dT%H:%M:%S%.f").to_string(),
                "updated_at": row.updated_at.format("%Y-%m-%dT%H:%M:%S%.f").to_string(),
            }),
            "outbox_events",
        )
        .to_string();
        let key = json!({ "id": row.id }).to_string();
        producer
            .send(
                FutureRecord::to(&t.topic).key(&key).payload(&value),
                Duration::from_secs(10),
            )
            .await
            .unwrap_or_else(|(e, _)| panic!("produce {codec}: {e}"));
    }
    for row in &rows {
        t.wait_status(row.id, Status::Sent, Duration::from_secs(20))
            .await;
    }
    t.wait_all_committed(&t.group, Duration::from_secs(20))
        .await;
    t.stop().await;
}

/// The sidecar was down longer than the topic's retention (or the connector
/// was recreated): the committed offset is out of range. librdkafka resets
/// to the oldest offset; the sidecar counts and logs it (the remedy for the
/// rows whose events are gone is `events retrigger`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offset_out_of_range_is_counted() {
    use crate::harness::{prepare_on, Kafka, Receiver};
    if crate::harness::kafka::on_tansu() {
        println!(
            "mock only: tansu answers a fetch past the end of the log with no records and no \
             OFFSET_OUT_OF_RANGE, so nothing is reset (docs/brokers.md)"
        );
        return;
    }
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    let mut t = prepare_on(
        Kafka::start(),
        Options {
            partitions: 1,
            ..Options::default()
        },
        Receiver::accepting().await,
    )
    .await;
    let id = t.insert("accounts.purchase_create", json!({"n": 1})).await;
    // A committed offset far past the end of the partition.
    let committer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &t.kafka.brokers)
        .set("group.id", &t.group)
        .create()
        .expect("consumer");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(&t.topic, 0, rdkafka::Offset::Offset(1_000))
        .unwrap();
    committer.commit(&tpl, CommitMode::Sync).expect("commit");
    drop(committer);
    t.start().await;
    wait_metric(
        &t,
        r#"outbox_consumer_errors_total{kind="offset_reset"}"#,
        1.0,
    )
    .await;
    t.wait_status(id, Status::Sent, Duration::from_secs(20))
        .await;
    t.stop().await;
}

/// A job waiting out `retry_delay` whose row another writer moved on (the
/// partition's next owner sent it while this member was cut off) does not
/// send it again: it re-reads the row before every later attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_rereads_its_row_after_the_retry_wait_and_sends_nothing_stale() {
    use crate::harness::{prepare_on, Kafka, Receiver};
    use wiremock::ResponseTemplate;
    let receiver = Receiver::start(|r: &crate::harness::receiver::Received| {
        if r.nth == 0 {
            ResponseTemplate::new(503)
        } else {
            ResponseTemplate::new(204)
        }
    })
    .await;
    let mut t = prepare_on(
        Kafka::start(),
        Options {
            partitions: 1,
            retry_delay: "2s",
            ..Options::default()
        },
        receiver,
    )
    .await;
    t.start().await;
    let id = t.insert("accounts.purchase_create", json!({"n": 1})).await;
    // The first attempt failed: the job waits 2 s for the next one.
    eventually("the first attempt", Duration::from_secs(20), || async {
        (t.row(id).await.attempts == 1).then_some(())
    })
    .await;
    // Meanwhile the next owner sent it, and no change event reaches us.
    let conn = sea_orm::Database::connect(&t.db.url)
        .await
        .expect("connect");
    let txn = conn.begin().await.expect("begin");
    txn.execute_unprepared("SET LOCAL session_replication_role = replica")
        .await
        .unwrap();
    txn.execute_unprepared(&format!(
        "UPDATE outbox_events SET status = 'sent', sent_at = now(), updated_at = now() WHERE id = {id}"
    ))
    .await
    .unwrap();
    txn.commit().await.unwrap();
    // The job's wait ends; it ends without a request, its message finished.
    t.wait_all_committed(&t.group, Duration::from_secs(20))
        .await;
    assert_eq!(
        t.receiver.for_id(id).len(),
        1,
        "no request after the row was sent elsewhere"
    );
    t.stop().await;
}

/// A row that stays invisible past `dispatch.row_visibility_timeout` (here
/// shortened to 2 s): the event is decided on the row as read, counted in
/// `outbox_rows_never_visible_total`, which the shipped alert
/// `OutboxRowNeverVisible` watches; once the row is there, a retrigger
/// announces it and it is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_invisible_past_the_bound_is_counted_and_alerted() {
    let mut t = spawn_app(Options {
        partitions: 1,
        dispatch_toml: "row_visibility_timeout = \"2s\"".into(),
        ..Options::default()
    })
    .await;
    let conn = sea_orm::Database::connect(&t.db.url)
        .await
        .expect("connect");
    let txn = conn.begin().await.expect("begin");
    let row = insert_silently(&txn, "pending", 1).await;
    t.feed.republish(&row).await;
    wait_metric(&t, "outbox_rows_never_visible_total", 1.0).await;
    t.wait_all_committed(&t.group, Duration::from_secs(20))
        .await;
    // The alert watches that very counter.
    let rule: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("deploy/kubernetes/prometheusrule.yaml"),
        )
        .unwrap(),
    )
    .unwrap();
    let alert = rule["spec"]["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap())
        .find(|a| a["alert"].as_str() == Some("OutboxRowNeverVisible"))
        .expect("alert OutboxRowNeverVisible");
    let expr = alert["expr"].as_str().unwrap();
    assert!(
        expr.contains("increase(outbox_rows_never_visible_total["),
        "{expr}"
    );
    // The remedy: once the row is there, announce it again.
    txn.commit().await.expect("commit");
    let out = crate::cli::bin()
        .env("OUTBOX__DATABASE__URL", &t.db.url)
        .env("OUTBOX__DISPATCHERS__ACCOUNTS__URL", t.receiver.url())
        .env(
            "OUTBOX__DISPATCHERS__ACCOUNTS__EVENTS",
            "accounts.purchase_create",
        )
        .args(["events", "retrigger", &row.id.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    t.wait_status(row.id, Status::Sent, Duration::from_secs(20))
        .await;
    t.stop().await;
}
