//! What the history the application keeps costs a sidecar that has
//! nothing to do: the table gauges read only pending and failed rows, so
//! an idle sidecar over a million sent rows touches a few buffers per
//! refresh; and the change events of a deleted row (a delete and its
//! tombstone) are skipped without reading the table.

use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::json;

use crate::harness::feed::envelope;
use crate::harness::kafka::Kafka;
use crate::harness::receiver::Receiver;
use crate::harness::{eventually, metric, prepare_on, start_with, Options};

/// Sent rows in the seeded table.
const HISTORY_ROWS: i64 = 1_000_000;

/// `blks_hit + blks_read` of the database `conn` is connected to.
async fn buffers(conn: &sea_orm::DatabaseConnection) -> i64 {
    conn.query_one_raw(Statement::from_string(
        DbBackend::Postgres,
        "SELECT (blks_hit + blks_read)::bigint AS b FROM pg_stat_database \
         WHERE datname = current_database()",
    ))
    .await
    .expect("read pg_stat_database")
    .expect("a row")
    .try_get("", "b")
    .expect("buffers")
}

/// Seeds `rows` sent rows in one statement, without the change feed's
/// trigger (they are history: no change event), then vacuums the table
/// as autovacuum would have long since.
async fn seed_sent_history(conn: &sea_orm::DatabaseConnection, rows: i64) {
    conn.execute_unprepared(&format!(
        "ALTER TABLE outbox_events DISABLE TRIGGER outbox_cdc; \
         INSERT INTO outbox_events (event_name, payload, status, attempts, sent_at, created_at, updated_at) \
         SELECT 'accounts.purchase_create', jsonb_build_object('n', g, 'note', 'an event of the past'), \
         'sent', 1, now() - interval '40 days' + g * interval '1 second', \
         now() - interval '40 days' + g * interval '1 second', \
         now() - interval '40 days' + g * interval '1 second' \
         FROM generate_series(1, {rows}) AS g; \
         ALTER TABLE outbox_events ENABLE TRIGGER outbox_cdc;"
    ))
    .await
    .expect("seed the history");
    conn.execute_unprepared("VACUUM ANALYZE outbox_events")
        .await
        .expect("vacuum");
}

/// An idle sidecar refreshing its gauges every second over a table of a
/// million sent rows: the database buffers it touches per second stay
/// under 2,000 (a scan of the table is ~20,000 per refresh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sidecar_over_a_million_sent_rows_touches_few_buffers() {
    let t = prepare_on(
        Kafka::start(),
        Options::default(),
        Receiver::accepting().await,
    )
    .await;
    let seeder = sea_orm::Database::connect(&t.db.url)
        .await
        .expect("connect");
    seed_sent_history(&seeder, HISTORY_ROWS).await;
    // A backend reports its buffer counts when it ends at the latest: the
    // seeding's must not land in the measured window.
    seeder.close().await.expect("close");
    t.insert("accounts.purchase_create", json!({"n": "one pending"}))
        .await;

    let mut settings = t.settings(&t.group);
    settings.metrics.refresh_interval = Duration::from_secs(1);
    let app = start_with(settings).await;
    let base = format!("http://{}", app.admin_addr());
    eventually(
        "the pending event sent and the gauges refreshed",
        Duration::from_secs(30),
        || {
            let base = base.clone();
            async move {
                let pending = metric(&base, "outbox_events_pending").await?;
                let rows = metric(&base, "outbox_events_estimated_rows").await?;
                (pending == 0.0 && rows >= HISTORY_ROWS as f64).then_some(())
            }
        },
    )
    .await;
    // Let the start-up's work and its statistics settle.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let conn = sea_orm::Database::connect(&t.db.url)
        .await
        .expect("connect");
    let before = buffers(&conn).await;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = buffers(&conn).await;
    let per_second = (after - before) as f64 / started.elapsed().as_secs_f64();
    eprintln!(
        "idle sidecar over {HISTORY_ROWS} sent rows, gauges refreshed every 1s: \
         {per_second:.0} buffers/s"
    );
    app.stop().await;
    assert!(
        per_second < 2000.0,
        "an idle sidecar touched {per_second:.0} buffers/s over {HISTORY_ROWS} sent rows"
    );
}

/// A deleted row's change events (the delete, then Debezium's tombstone)
/// are skipped from the message alone: with the table locked against any
/// read, both are counted as skipped and their offsets committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_and_its_tombstone_are_skipped_without_reading_the_table() {
    let t = prepare_on(
        Kafka::start(),
        Options::default(),
        Receiver::accepting().await,
    )
    .await;
    let mut settings = t.settings(&t.group);
    // One refresh at start-up, none while the table is locked.
    settings.metrics.refresh_interval = Duration::from_secs(3600);
    let app = start_with(settings).await;
    let base = format!("http://{}", app.admin_addr());

    let conn = sea_orm::Database::connect(&t.db.url)
        .await
        .expect("connect");
    let txn = sea_orm::TransactionTrait::begin(&conn)
        .await
        .expect("begin");
    txn.execute_unprepared("LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock the table");

    let before = json!({"id": 42, "event_name": "", "payload": "", "status": "pending",
        "attempts": 0, "last_error": null, "sent_at": null, "created_at": 0, "updated_at": 0});
    let key = br#"{"id":42}"#;
    let delete = envelope("d", &before, &serde_json::Value::Null, "outbox_events").to_string();
    t.feed.publish_raw(Some(key), Some(delete.as_bytes())).await;
    t.feed.publish_raw(Some(key), None).await;

    let skipped = |reason: &'static str| {
        let base = base.clone();
        async move {
            metric(
                &base,
                &format!("outbox_cdc_skips_total{{reason=\"{reason}\"}}"),
            )
            .await
            .unwrap_or(0.0)
        }
    };
    eventually(
        "the delete and the tombstone to be skipped",
        Duration::from_secs(30),
        || async {
            (skipped("delete").await == 1.0 && skipped("tombstone").await == 1.0).then_some(())
        },
    )
    .await;
    // Both offsets committed while no statement could read the table.
    t.wait_all_committed(&t.group, Duration::from_secs(30))
        .await;
    txn.rollback().await.expect("unlock");
    app.stop().await;
}

/// Connections the sidecar holds to its database, by the application name
/// its URL gives them.
async fn connections(conn: &sea_orm::DatabaseConnection, app: &str) -> i64 {
    let row = conn
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = $1",
            [app.into()],
        ))
        .await
        .expect("pg_stat_activity")
        .expect("a row");
    row.try_get("", "n").expect("n")
}

/// After work, a sidecar with nothing to do shrinks to the one connection
/// of its periodic reads (gauges, pauses): its work pool closes what it
/// does not use, and the periodic reads do not keep it alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sidecar_holds_one_database_connection() {
    let t = prepare_on(
        Kafka::start(),
        Options {
            max_in_flight: 8,
            ..Options::default()
        },
        Receiver::accepting().await,
    )
    .await;
    let name = crate::harness::unique("idle-pool");
    let mut settings = t.settings(&t.group);
    settings.database.url = Some(outbox_sidecar::config::DatabaseUrl::new(format!(
        "{}?application_name={name}",
        t.db.url
    )));
    settings.database.idle_timeout = Duration::from_secs(2);
    settings.metrics.refresh_interval = Duration::from_millis(200);
    let app = start_with(settings).await;
    let mut ids = Vec::new();
    for i in 0..100 {
        ids.push(t.insert("accounts.purchase_create", json!({"n": i})).await);
    }
    for id in &ids {
        t.wait_status(*id, entity::Status::Sent, Duration::from_secs(60))
            .await;
    }
    let conn = sea_orm::Database::connect(&t.db.url)
        .await
        .expect("connect");
    let busy = connections(&conn, &name).await;
    eprintln!("connections after the work: {busy}");
    eventually(
        "the idle sidecar to hold one connection",
        Duration::from_secs(30),
        || {
            let (conn, name) = (&conn, &name);
            async move { (connections(conn, name).await <= 1).then_some(()) }
        },
    )
    .await;
    app.stop().await;
}

/// The table gauges are read by one replica of the group, the one holding
/// partition 0: counting a backlog of pending rows costs the database as
/// much as the rows, and every replica counting it every interval made an
/// idle replica beside a busy one add 8.6 % to the database's work (the
/// history bench). The others report zeros (the shipped rules aggregate
/// with `max`) and still ping the database for `outbox_database_up`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_reads_the_table_gauges_for_the_group() {
    let receiver = Receiver::start(|_| wiremock::ResponseTemplate::new(500)).await;
    let mut t = prepare_on(
        Kafka::start(),
        Options {
            partitions: 2,
            max_attempts: 1,
            ..Options::default()
        },
        receiver,
    )
    .await;
    t.start().await;
    let group = t.group.clone();
    let second = t.start_in_group(&group).await;
    let bases = [t.admin_url(""), format!("http://{}", second.admin_addr())];
    for i in 0..4 {
        t.insert("accounts.purchase_create", json!({"n": i})).await;
    }
    let (reporter, other) = eventually(
        "one replica reporting the 4 failed rows, the other zeros",
        Duration::from_secs(60),
        || {
            let bases = bases.clone();
            async move {
                let mut seen = Vec::new();
                for base in &bases {
                    seen.push((
                        metric(base, "outbox_table_gauges_reporter").await?,
                        metric(base, "outbox_events_failed").await?,
                        metric(base, "outbox_database_up").await?,
                    ));
                }
                let reporters: Vec<_> = seen.iter().filter(|s| s.0 == 1.0).collect();
                let others: Vec<_> = seen.iter().filter(|s| s.0 == 0.0).collect();
                (reporters.len() == 1
                    && others.len() == 1
                    && reporters[0].1 == 4.0
                    && others[0].1 == 0.0)
                    .then(|| (*reporters[0], *others[0]))
            }
        },
    )
    .await;
    assert_eq!(reporter.2, 1.0);
    assert_eq!(other.2, 1.0, "the other replica still checks the database");
    second.stop().await;
}
