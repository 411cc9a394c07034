//! The attempt log (issue #18): one row per attempt, on record exactly when
//! its status write is; one row per resend; pruning; read through the admin
//! API and `events show`.

use std::time::Duration;

use entity::Status;
use outbox_sidecar::store::batch::{mark_sent_many, register_failure_many, Key, Sent, Step};
use outbox_sidecar::store::history::{Attempt, Caller, Via};
use outbox_sidecar::store::{FailedFilter, Outcome, Store};
use sea_orm::ConnectionTrait;
use serde_json::json;
use wiremock::ResponseTemplate;

use crate::db::{Backend, TestDb};
use crate::harness::{spawn_app_with, Options, Receiver};
use crate::store::{mark_sent, register_failure, sent};

async fn pending(store: &Store) -> entity::OutboxEventRow {
    let id = store
        .insert("accounts.purchase_create", &json!({"amount": 10}))
        .await
        .expect("insert");
    store.get(id).await.unwrap().unwrap()
}

fn attempt(id: i64, n: i32, http: Option<u16>, detail: &str) -> Attempt {
    Attempt {
        event_id: id,
        attempt: n,
        started_at: outbox_sidecar::store::now(),
        duration_ms: 12 * n,
        http_status: http,
        detail: Some(detail.to_owned()),
        trace_id: None,
    }
}

async fn log_rows(store: &Store) -> i64 {
    let row = store
        .connection()
        .query_one_raw(sea_orm::Statement::from_string(
            store.connection().get_database_backend(),
            "SELECT COUNT(*) AS n FROM outbox_event_attempts",
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get::<i64>("", "n").unwrap()
}

async fn attempts_are_on_record_exactly_when_their_status_is(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let row = pending(&store).await;
    let first = attempt(row.id, 1, Some(503), "HTTP 503: down");
    let failure = Step::new(
        &row,
        crate::store::failed(&store, &row, "HTTP 503: down", 3),
    );
    let out = register_failure_many(
        &store,
        std::slice::from_ref(&failure),
        std::slice::from_ref(&first),
    )
    .await
    .unwrap();
    assert!(matches!(out[&row.id], Outcome::Applied(_)));
    // The same write again (stale: the row has one attempt now) applies to
    // nothing, and so records nothing.
    let out = register_failure_many(&store, &[failure], std::slice::from_ref(&first))
        .await
        .unwrap();
    assert!(matches!(out[&row.id], Outcome::Conflict(_)));
    assert_eq!(
        log_rows(&store).await,
        1,
        "a write that did not apply logs nothing"
    );

    // A batch of two where one key is stale: only the applied one logs.
    let other = pending(&store).await;
    let row = store.get(row.id).await.unwrap().unwrap();
    let stale = Key {
        id: other.id,
        attempts: 5,
    };
    let steps = [
        Step::new(&row, sent(&row)),
        Step {
            seen: stale,
            next: sent(&other),
        },
    ];
    let log = [
        attempt(row.id, 2, Some(201), "{\"ok\":true}"),
        attempt(other.id, 6, Some(201), "stale"),
    ];
    let out = mark_sent_many(&store, &steps, &log).await.unwrap();
    assert!(matches!(out[&row.id], Sent::Applied { .. }));
    assert!(matches!(out[&other.id], Sent::Conflict(_)));
    assert_eq!(log_rows(&store).await, 2);

    let history = store.history(row.id).await.unwrap();
    assert_eq!(history.len(), 2, "{history:?}");
    let (a, b) = (&history[0], &history[1]);
    assert_eq!(
        (
            a.kind.as_str(),
            a.attempt,
            a.outcome.as_deref(),
            a.http_status
        ),
        ("attempt", Some(1), Some("failure"), Some(503))
    );
    assert_eq!(a.detail.as_deref(), Some("HTTP 503: down"));
    assert_eq!(a.duration_ms, Some(12));
    assert_eq!(
        (
            b.kind.as_str(),
            b.attempt,
            b.outcome.as_deref(),
            b.http_status
        ),
        ("attempt", Some(2), Some("success"), Some(201))
    );
    assert_eq!(b.detail.as_deref(), Some("{\"ok\":true}"));
    let replica = outbox_sidecar::config::HistorySettings::default().replica_name();
    assert_eq!(a.replica.as_deref(), Some(replica.as_str()));
    assert!(store.history(other.id).await.unwrap().is_empty());
    assert_eq!(
        store.get(other.id).await.unwrap().unwrap().status,
        Status::Pending
    );

    // A batch where one key comes without an attempt to record (PostgreSQL
    // then matches attempts to rows by id instead of carrying them in the
    // UPDATE): both apply, only the one attempt is on record.
    let (third, fourth) = (pending(&store).await, pending(&store).await);
    let steps = [
        Step::new(&third, sent(&third)),
        Step::new(&fourth, sent(&fourth)),
    ];
    let log = [attempt(third.id, 1, Some(201), "ok")];
    let out = mark_sent_many(&store, &steps, &log).await.unwrap();
    assert!(matches!(out[&third.id], Sent::Applied { .. }));
    assert!(matches!(out[&fourth.id], Sent::Applied { .. }));
    assert_eq!(store.history(third.id).await.unwrap().len(), 1);
    assert!(store.history(fourth.id).await.unwrap().is_empty());
}

async fn resends_are_recorded_with_who_asked(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let mut failed = Vec::new();
    for _ in 0..3 {
        let mut row = pending(&store).await;
        for i in 0..3 {
            row = match register_failure(&store, &row, &format!("HTTP 503 #{i}"), 3)
                .await
                .unwrap()
            {
                Outcome::Applied(r) => r,
                other => panic!("{other:?}"),
            };
        }
        failed.push(row);
    }
    let one = Caller::new(Via::AdminApi, Some("after the 02:00 outage".into()));
    store.retry(failed[0].id, &one).await.unwrap().unwrap();
    // A refused resend (the row is pending now) records nothing.
    assert!(store.retry(failed[0].id, &one).await.unwrap().is_err());
    let bulk = Caller::new(Via::Cli, None);
    assert_eq!(
        store
            .retry_failed(&FailedFilter::default(), &bulk)
            .await
            .unwrap(),
        2
    );
    let h = store.history(failed[0].id).await.unwrap();
    assert_eq!(h.len(), 1, "{h:?}");
    assert_eq!(h[0].kind, "resend");
    assert_eq!(h[0].via.as_deref(), Some("admin-api"));
    assert_eq!(h[0].label.as_deref(), Some("after the 02:00 outage"));
    for row in &failed[1..] {
        let h = store.history(row.id).await.unwrap();
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(
            (h[0].kind.as_str(), h[0].via.as_deref()),
            ("resend", Some("cli"))
        );
        assert_eq!(h[0].label, None);
        assert_eq!(
            store.get(row.id).await.unwrap().unwrap().status,
            Status::Pending
        );
    }
}

async fn prune_deletes_old_log_rows_only(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let mut log = Vec::new();
    let mut failures = Vec::new();
    for age_days in [40, 31, 1, 0] {
        let row = pending(&store).await;
        let mut a = attempt(row.id, 1, Some(500), "HTTP 500");
        a.started_at -= chrono::Duration::days(age_days);
        log.push(a);
        failures.push(Step::new(
            &row,
            crate::store::failed(&store, &row, "HTTP 500", 3),
        ));
    }
    register_failure_many(&store, &failures, &log)
        .await
        .unwrap();
    assert_eq!(log_rows(&store).await, 4);
    // Batches of one: the loop runs until nothing old is left.
    let pruned = store
        .prune_history(Duration::from_secs(30 * 24 * 3600), 1)
        .await
        .unwrap();
    assert_eq!(pruned, 2);
    assert_eq!(log_rows(&store).await, 2);
    assert_eq!(
        store.stats().await.unwrap().pending,
        4,
        "no outbox row touched"
    );
}

async fn with_the_log_off_nothing_is_written(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await.without_history();
    let row = pending(&store).await;
    let out = register_failure_many(
        &store,
        &[Step::new(
            &row,
            crate::store::failed(&store, &row, "HTTP 500", 1),
        )],
        &[attempt(row.id, 1, Some(500), "HTTP 500")],
    )
    .await
    .unwrap();
    assert!(matches!(&out[&row.id], Outcome::Applied(r) if r.status == Status::Failed));
    store
        .retry(row.id, &Caller::new(Via::Cli, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(log_rows(&store).await, 0);
    assert!(store.history(row.id).await.unwrap().is_empty());
}

/// A row `sent` `days` ago, with one attempt-log row.
async fn sent_days_ago(store: &Store, days: i64) -> i64 {
    let row = pending(store).await;
    assert!(matches!(
        mark_sent(store, &row).await.unwrap(),
        Outcome::Applied(_)
    ));
    set_sent_at(store, row.id, days).await;
    add_log_row(store, row.id).await;
    row.id
}

async fn set_sent_at(store: &Store, id: i64, days_ago: i64) {
    use entity::outbox_event::Column;
    use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query};
    let at = outbox_sidecar::store::now() - chrono::Duration::days(days_ago);
    let stmt = Query::update()
        .table(Alias::new("outbox_events"))
        .value(Column::SentAt, at)
        .and_where(Expr::col(Column::Id).eq(id))
        .to_owned();
    store.connection().execute(&stmt).await.unwrap();
}

async fn add_log_row(store: &Store, id: i64) {
    store
        .connection()
        .execute_unprepared(&format!(
            "INSERT INTO outbox_event_attempts (event_id, kind, attempt, started_at, outcome) \
             VALUES ({id}, 'attempt', 1, '2026-01-01 00:00:00', 'success')"
        ))
        .await
        .unwrap();
}

/// The outbox rows left, by id.
async fn event_ids(store: &Store) -> Vec<i64> {
    let rows = store
        .list(&outbox_sidecar::store::ListFilter::default())
        .await
        .unwrap();
    let mut ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    ids
}

const THIRTY_DAYS: Duration = Duration::from_secs(30 * 24 * 3600);

/// `events prune --sent-older-than 30d`: the rows sent more than 30 days
/// ago go with their log rows, in batches; a young sent row, a pending and
/// a failed one (however old) stay, with theirs. The dry run counts the
/// same rows and changes nothing.
async fn prune_sent_takes_old_sent_rows_and_their_log_only(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let old = [
        sent_days_ago(&store, 400).await,
        sent_days_ago(&store, 40).await,
        sent_days_ago(&store, 31).await,
    ];
    let young = sent_days_ago(&store, 29).await;
    let waiting = pending(&store).await.id;
    add_log_row(&store, waiting).await;
    let failed = pending(&store).await;
    assert!(matches!(
        register_failure(&store, &failed, "HTTP 500", 1).await.unwrap(),
        Outcome::Applied(r) if r.status == Status::Failed
    ));
    add_log_row(&store, failed.id).await;
    // Pending and failed rows whose sent_at is old (a resent row keeps it).
    for id in [waiting, failed.id] {
        set_sent_at(&store, id, 400).await;
    }
    let all = event_ids(&store).await;
    assert_eq!((all.len(), log_rows(&store).await), (6, 6));

    let cutoff = Store::sent_cutoff(THIRTY_DAYS);
    let mut seen = Vec::new();
    let counted = store
        .prune_sent(cutoff, 2, true, &mut |n| seen.push(n))
        .await
        .unwrap();
    assert_eq!((counted.events, counted.log_rows), (3, 0));
    assert_eq!(seen, [2, 3]);
    assert_eq!(event_ids(&store).await, all, "the dry run deletes nothing");
    assert_eq!(log_rows(&store).await, 6);

    let mut seen = Vec::new();
    let pruned = store
        .prune_sent(cutoff, 2, false, &mut |n| seen.push(n))
        .await
        .unwrap();
    assert_eq!((pruned.events, pruned.log_rows), (3, 3));
    assert_eq!(seen, [2, 3], "one progress call per committed batch");
    let mut left = vec![young, waiting, failed.id];
    left.sort_unstable();
    assert_eq!(event_ids(&store).await, left);
    assert_eq!(log_rows(&store).await, 3);
    for id in old {
        assert!(store.history(id).await.unwrap().is_empty());
    }
    for id in left {
        assert_eq!(store.history(id).await.unwrap().len(), 1, "event {id}");
    }
    // Nothing old is left: a second run deletes nothing.
    let again = store.prune_sent(cutoff, 2, false, &mut |_| {}).await;
    assert_eq!(again.unwrap().events, 0);
}

/// A row selected for a batch and changed before the batch's delete (put
/// back to pending by the application, or sent again since) stays, with
/// its log rows: the delete re-checks status and sent_at.
async fn a_row_changed_between_select_and_delete_stays(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let ids = [
        sent_days_ago(&store, 40).await,
        sent_days_ago(&store, 40).await,
        sent_days_ago(&store, 40).await,
    ];
    let cutoff = Store::sent_cutoff(THIRTY_DAYS);
    let selected = store.select_sent_before(cutoff, None, 100).await.unwrap();
    assert_eq!(selected, ids);
    store
        .connection()
        .execute_unprepared(&format!(
            "UPDATE outbox_events SET status = 'pending' WHERE id = {}",
            ids[1]
        ))
        .await
        .unwrap();
    set_sent_at(&store, ids[2], 0).await;
    let pruned = store.prune_sent_batch(&selected, cutoff).await.unwrap();
    assert_eq!((pruned.events, pruned.log_rows), (1, 1));
    assert_eq!(event_ids(&store).await, ids[1..]);
    assert_eq!(log_rows(&store).await, 2);
    assert_eq!(
        store.get(ids[1]).await.unwrap().unwrap().status,
        Status::Pending
    );
}

/// The console's chart: attempts per minute from the log, by the minute
/// they started in, counted on each backend's own time arithmetic; resends
/// and attempts before the window are not counted; a dispatcher's chart
/// counts its own events only.
async fn the_chart_counts_attempts_per_minute(backend: Backend) {
    use outbox_sidecar::store::chart::Minute;
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let a = store
        .insert("accounts.purchase_create", &json!({}))
        .await
        .unwrap();
    let b = store.insert("billing.invoice", &json!({})).await.unwrap();
    let since = chrono::NaiveDate::from_ymd_opt(2026, 12, 3)
        .unwrap()
        .and_hms_opt(10, 0, 0)
        .unwrap();
    let at = |secs: i64| (since + chrono::Duration::seconds(secs)).format("%Y-%m-%d %H:%M:%S");
    let rows = [
        (a, "attempt", Some("success"), at(10)),
        (a, "attempt", Some("failure"), at(59)),
        (a, "attempt", Some("failure"), at(5 * 60)),
        (b, "attempt", Some("success"), at(5 * 60 + 30)),
        (b, "attempt", Some("failure"), at(59 * 60 + 59)),
        // Outside the window, or not an attempt: not counted.
        (a, "attempt", Some("failure"), at(-1)),
        (a, "resend", None, at(20)),
    ];
    for (id, kind, outcome, started) in rows {
        let outcome = outcome.map_or("NULL".to_owned(), |o| format!("'{o}'"));
        store
            .connection()
            .execute_unprepared(&format!(
                "INSERT INTO outbox_event_attempts (event_id, kind, started_at, outcome) \
                 VALUES ({id}, '{kind}', '{started}', {outcome})"
            ))
            .await
            .unwrap();
    }
    let m = |ok, failed| Minute { ok, failed };
    let all = store
        .attempts_per_minute(None, since, 60)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(all.minutes.len(), 60);
    assert_eq!(all.minutes[0], m(1, 1), "{all:?}");
    assert_eq!(all.minutes[5], m(1, 1), "{all:?}");
    assert_eq!(all.minutes[59], m(0, 1), "{all:?}");
    assert_eq!(all.total(), m(2, 3), "{all:?}");
    let accounts = ["accounts.purchase_create".to_owned()];
    let one = store
        .attempts_per_minute(Some(&accounts), since, 60)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(one.minutes[0], m(1, 1), "{one:?}");
    assert_eq!(one.minutes[5], m(0, 1), "{one:?}");
    assert_eq!(one.total(), m(1, 2), "{one:?}");
    let none = store
        .attempts_per_minute(Some(&[]), since, 60)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(none.total(), m(0, 0));
    assert!(store
        .without_history()
        .attempts_per_minute(None, since, 60)
        .await
        .unwrap()
        .is_none());
}

/// `[tracing]`: the trace ids go into the log on every write path (a
/// failure, a batch whose attempts ride in the UPDATE, one matched by id),
/// the outbox table's trace columns are read with the row, and a store
/// with tracing off reads a log with the column as no trace ids.
async fn trace_ids_are_logged_and_the_trace_columns_read(backend: Backend) {
    let db = TestDb::new(backend).await;
    let plain = db.store().await;
    let store = plain.clone().with_tracing(
        Some(outbox_sidecar::store::TraceColumns {
            column: "traceparent".into(),
            state_column: Some("tracestate".into()),
        }),
        true,
    );
    let traced = |mut a: Attempt, t: &str| {
        a.trace_id = Some(t.repeat(32));
        a
    };
    let row = pending(&plain).await;
    let failure = Step::new(&row, crate::store::failed(&plain, &row, "down", 3));
    register_failure_many(
        &store,
        &[failure],
        &[traced(attempt(row.id, 1, Some(503), "down"), "a")],
    )
    .await
    .unwrap();
    let row = plain.get(row.id).await.unwrap().unwrap();
    let other = pending(&plain).await;
    let steps = [Step::new(&row, sent(&row)), Step::new(&other, sent(&other))];
    let log = [
        traced(attempt(row.id, 2, Some(200), "ok"), "b"),
        traced(attempt(other.id, 1, Some(200), "ok"), "c"),
    ];
    mark_sent_many(&store, &steps, &log).await.unwrap();
    let (third, fourth) = (pending(&plain).await, pending(&plain).await);
    let steps = [
        Step::new(&third, sent(&third)),
        Step::new(&fourth, sent(&fourth)),
    ];
    let log = [traced(attempt(third.id, 1, Some(200), "ok"), "d")];
    mark_sent_many(&store, &steps, &log).await.unwrap();
    let ids = |id: i64| {
        let store = store.clone();
        async move {
            store
                .history(id)
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.trace_id.unwrap_or_default())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(ids(row.id).await, ["a".repeat(32), "b".repeat(32)]);
    assert_eq!(ids(other.id).await, ["c".repeat(32)]);
    assert_eq!(ids(third.id).await, ["d".repeat(32)]);
    assert!(plain
        .history(row.id)
        .await
        .unwrap()
        .iter()
        .all(|r| r.trace_id.is_none()));

    // The outbox table's trace columns, read with the row (before they
    // exist, the start-up check names them).
    let e = store.check_table().await.unwrap_err().to_string();
    assert!(
        e.contains("traceparent") && e.contains("tracing.column"),
        "{e}"
    );
    let table = plain.table();
    for sql in [
        format!("ALTER TABLE {table} ADD COLUMN traceparent varchar(55)"),
        format!("ALTER TABLE {table} ADD COLUMN tracestate text"),
        format!(
            "UPDATE {table} SET traceparent = '00-{}-{}-01', tracestate = 'k=v' WHERE id = {}",
            "e".repeat(32),
            "f".repeat(16),
            fourth.id
        ),
    ] {
        plain.connection().execute_unprepared(&sql).await.unwrap();
    }
    store
        .check_table()
        .await
        .expect("the trace columns are strings");
    let read = store.get(fourth.id).await.unwrap().unwrap();
    assert_eq!(
        read.traceparent,
        Some(format!("00-{}-{}-01", "e".repeat(32), "f".repeat(16)))
    );
    assert_eq!(read.tracestate.as_deref(), Some("k=v"));
    let read = store.get(third.id).await.unwrap().unwrap();
    assert_eq!((read.traceparent, read.tracestate), (None, None));
    assert_eq!(
        plain.get(fourth.id).await.unwrap().unwrap().traceparent,
        None
    );
}

macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod postgres { $( #[tokio::test] async fn $name() { super::$name(super::Backend::Postgres).await } )* }
        mod mariadb { $( #[tokio::test] async fn $name() { super::$name(super::Backend::MySql).await } )* }
        mod sqlite { $( #[tokio::test] async fn $name() { super::$name(super::Backend::Sqlite).await } )* }
    };
}

on_every_backend!(
    trace_ids_are_logged_and_the_trace_columns_read,
    the_chart_counts_attempts_per_minute,
    attempts_are_on_record_exactly_when_their_status_is,
    resends_are_recorded_with_who_asked,
    prune_deletes_old_log_rows_only,
    with_the_log_off_nothing_is_written,
    prune_sent_takes_old_sent_rows_and_their_log_only,
    a_row_changed_between_select_and_delete_stays,
);

const TOKEN: &str = "test-admin-token-0123456789";

/// Through the running sidecar: two 500s (the body echoing the dispatcher's
/// secret header), then a 201 with a body; the admin API and `events show`
/// give the three attempts in order, and a resend.
#[tokio::test]
async fn the_timeline_of_a_real_event() {
    let receiver = Receiver::start(|r| match r.nth {
        0 | 1 => ResponseTemplate::new(500)
            .set_body_string("{\"error\":\"down\",\"echo\":\"Bearer accounts-secret-token\"}"),
        _ => ResponseTemplate::new(201).set_body_string("{\"id\":\"acc-77\"}"),
    })
    .await;
    let t = spawn_app_with(Options::default(), receiver).await;
    let id = t
        .insert("accounts.purchase_create", json!({"amount": 1}))
        .await;
    t.wait_status(id, Status::Sent, Duration::from_secs(30))
        .await;
    let client = reqwest::Client::new();
    let view: serde_json::Value = client
        .get(t.api_url(&format!("/admin/events/{id}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let history = view["history"]
        .as_array()
        .expect("history in the event view");
    assert_eq!(history.len(), 3, "{view:#}");
    let field = |i: usize, k: &str| history[i][k].clone();
    for (i, (outcome, code)) in [("failure", 500), ("failure", 500), ("success", 201)]
        .into_iter()
        .enumerate()
    {
        assert_eq!(field(i, "attempt"), json!(i + 1), "{view:#}");
        assert_eq!(field(i, "outcome"), json!(outcome), "{view:#}");
        assert_eq!(field(i, "http_status"), json!(code), "{view:#}");
        assert!(field(i, "duration_ms").as_i64().unwrap() >= 0);
        assert!(!field(i, "replica").as_str().unwrap().is_empty());
    }
    let detail = field(0, "detail").as_str().unwrap().to_owned();
    assert!(
        detail.starts_with("HTTP 500: {\"error\":\"down\""),
        "{detail}"
    );
    assert!(
        !detail.contains("accounts-secret-token"),
        "redacted: {detail}"
    );
    assert_eq!(field(2, "detail"), json!("{\"id\":\"acc-77\"}"));
    assert_eq!(view["attempts"], json!(2), "R-004's count is unchanged");

    let out = crate::cli::bin()
        .env("OUTBOX__DATABASE__URL", &t.db.url)
        .args(["events", "show", &id.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!("event {id}  accounts.purchase_create")),
        "{text}"
    );
    assert!(text.contains("status      sent"), "{text}");
    assert!(text.contains("attempt 1 failure"), "{text}");
    assert!(text.contains("attempt 3 success"), "{text}");
    assert!(text.contains("HTTP 201"), "{text}");
    let missing = crate::cli::bin()
        .env("OUTBOX__DATABASE__URL", &t.db.url)
        .args(["events", "show", "999999"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&missing.stderr),
        "error: event 999999 not found\n"
    );
}

/// A sidecar whose attempt log table is missing refuses to start, naming
/// the key and the remedy; `migrate` creates it.
#[tokio::test]
async fn a_missing_log_table_is_refused_at_start_up() {
    let db = TestDb::postgres().await;
    let conn = sea_orm::Database::connect(&db.url).await.unwrap();
    let store = db.store().await;
    drop(store);
    conn.execute_unprepared("DROP TABLE outbox_event_attempts")
        .await
        .unwrap();
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        "[kafka]\nbrokers = \"127.0.0.1:1\"\ntopic = \"t\"\n\
         [dispatchers.accounts]\nurl = \"http://127.0.0.1:1/api/v1/events\"\nevents = [\"a\"]\n\
         [admin]\nlisten = \"127.0.0.1:0\"\napi_listen = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        crate::cli::bin()
            .env("OUTBOX__DATABASE__URL", &db.url)
            .arg("--config")
            .arg(config.path())
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["run"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "table \"outbox_event_attempts\" (history.table) does not exist: run `outbox-sidecar migrate`, or set history.enabled = false"
        ),
        "{stderr}"
    );
    let out = run(&["migrate"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    conn.execute_unprepared("SELECT 1 FROM outbox_event_attempts")
        .await
        .expect("migrate created the log table");
}

#[tokio::test]
async fn dispatchers_and_prune_from_the_command_line() {
    let db = TestDb::postgres().await;
    let store = db.store().await;
    let id = pending(&store).await.id;
    let run = |args: &[&str]| {
        let out = crate::cli::bin()
            .env("OUTBOX__DATABASE__URL", &db.url)
            .env(
                "OUTBOX__DISPATCHERS__ACCOUNTS__URL",
                "http://127.0.0.1:1/api/v1/events",
            )
            .env(
                "OUTBOX__DISPATCHERS__ACCOUNTS__EVENTS",
                "accounts.purchase_create",
            )
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(
        run(&["dispatchers", "pause", "nope"]),
        (
            Some(2),
            String::new(),
            "error: no dispatcher \"nope\" (configured: accounts)\n".into()
        )
    );
    let (code, out, _) = run(&[
        "dispatchers",
        "pause",
        "accounts",
        "--label",
        "db maintenance",
    ]);
    assert_eq!(code, Some(0));
    assert_eq!(
        out,
        "dispatcher accounts paused: its events stay pending, no attempt is used\n"
    );
    let (_, out, _) = run(&["dispatchers", "pause", "accounts"]);
    assert_eq!(out, "dispatcher accounts was already paused\n");
    let (_, out, _) = run(&["dispatchers", "list"]);
    assert!(out.starts_with("accounts "), "{out}");
    assert!(out.contains("paused since "), "{out}");
    assert!(out.ends_with("via cli (db maintenance)\n"), "{out}");
    let before = store.get(id).await.unwrap().unwrap();
    let (_, out, _) = run(&["dispatchers", "resume", "accounts"]);
    assert_eq!(
        out,
        "dispatcher accounts resumed: 1 pending event(s) announced again\n"
    );
    let after = store.get(id).await.unwrap().unwrap();
    assert!(
        after.updated_at > before.updated_at,
        "the pending row was touched"
    );
    assert_eq!(
        (after.status, after.attempts),
        (before.status, before.attempts)
    );
    // A second resume touches the pending rows again: it is how a resume
    // that failed half-way is finished.
    let (_, out, _) = run(&["dispatchers", "resume", "accounts"]);
    assert_eq!(
        out,
        "dispatcher accounts was not paused: 1 pending event(s) announced again\n"
    );
    let (_, out, _) = run(&["dispatchers", "list"]);
    assert!(out.trim_end().ends_with("sending"), "{out}");

    let (code, out, _) = run(&["events", "prune"]);
    assert_eq!(code, Some(0));
    assert_eq!(out, "pruned 0 attempt-log row(s) older than 30days\n");
    let (code, _, err) = run(&["events", "prune", "--older-than", "soon"]);
    assert_eq!(code, Some(2));
    assert!(err.starts_with("error: --older-than: "), "{err}");
    let (code, out, _) = run(&["events", "prune", "--sent-older-than", "30d", "--dry-run"]);
    assert_eq!(code, Some(0));
    assert!(
        out.starts_with("dry run: 0 sent event(s) sent more than 30days ago would be deleted"),
        "{out}"
    );
    let (code, out, _) = run(&["events", "prune", "--sent-older-than", "30d"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        out,
        "pruned 0 sent event(s) sent more than 30days ago, and 0 of their attempt-log row(s)\n"
    );
    let (code, _, err) = run(&["events", "prune", "--dry-run"]);
    assert_eq!(code, Some(2), "--dry-run needs --sent-older-than: {err}");
}

/// The status is the truth, the log its shadow: the log table renamed
/// under a running sidecar (a migration gone wrong, a revoked privilege)
/// and then a 2xx: the row becomes `sent`, the refused log rows counted.
#[tokio::test]
async fn a_log_table_gone_under_a_running_sidecar_costs_no_delivery() {
    let receiver = Receiver::start(|_| ResponseTemplate::new(201)).await;
    let t = spawn_app_with(Options::default(), receiver).await;
    let first = t
        .insert("accounts.purchase_create", json!({"amount": 1}))
        .await;
    t.wait_status(first, Status::Sent, Duration::from_secs(30))
        .await;
    t.store
        .connection()
        .execute_unprepared("ALTER TABLE outbox_event_attempts RENAME TO attempts_moved_away")
        .await
        .unwrap();
    let id = t
        .insert("accounts.purchase_create", json!({"amount": 2}))
        .await;
    t.wait_status(id, Status::Sent, Duration::from_secs(30))
        .await;
    let base = t.admin_url("");
    crate::harness::eventually(
        "the refused log row counted",
        Duration::from_secs(10),
        || {
            let base = base.clone();
            async move {
                let v = crate::harness::metric(&base, "outbox_history_writes_failed_total").await?;
                (v >= 1.0).then_some(())
            }
        },
    )
    .await;
}

/// MySQL/MariaDB `timestamp` and `datetime(0)` columns hold whole seconds:
/// a batch where one key is stale must still log exactly the applied row
/// and report it applied (no false give-up, no unlogged attempt).
async fn whole_second_columns_log_their_own_rows(column: &str) {
    let db = TestDb::new(Backend::MySql).await;
    let store = db.store().await;
    store
        .connection()
        .execute_unprepared(&format!(
            "ALTER TABLE outbox_events MODIFY sent_at {column} NULL DEFAULT NULL, \
             MODIFY updated_at {column} NOT NULL DEFAULT CURRENT_TIMESTAMP"
        ))
        .await
        .unwrap();
    let store = db.store().await;
    let (row, other) = (pending(&store).await, pending(&store).await);
    let stale = Key {
        id: other.id,
        attempts: 5,
    };
    let steps = [
        Step::new(&row, sent(&row)),
        Step {
            seen: stale,
            next: sent(&other),
        },
    ];
    let log = [
        attempt(row.id, 1, Some(201), "ok"),
        attempt(other.id, 6, Some(201), "stale"),
    ];
    let out = mark_sent_many(&store, &steps, &log).await.unwrap();
    assert!(
        matches!(out[&row.id], Sent::Applied { .. }),
        "{:?}",
        out[&row.id]
    );
    assert!(matches!(out[&other.id], Sent::Conflict(_)));
    assert_eq!(store.history(row.id).await.unwrap().len(), 1, "logged");
    assert!(store.history(other.id).await.unwrap().is_empty());
    assert_eq!(
        store.get(row.id).await.unwrap().unwrap().status,
        Status::Sent
    );
}

#[tokio::test]
async fn mariadb_timestamp_columns_log_their_own_rows() {
    whole_second_columns_log_their_own_rows("timestamp").await
}

#[tokio::test]
async fn mariadb_datetime_0_columns_log_their_own_rows() {
    whole_second_columns_log_their_own_rows("datetime(0)").await
}

/// MariaDB/MySQL: the attempt log partitioned by range with no partition
/// for today's rows (error 1526, the case docs/operations.md names): the
/// status write is refused with its log rows, so the writer writes it
/// again without them and the event is `sent`, the refused rows counted.
/// (Before, 1526 was classed transient: the write was retried for ever.)
#[tokio::test]
async fn mariadb_a_log_with_no_partition_for_today_costs_no_delivery() {
    let db = TestDb::new(Backend::MySql).await;
    let store = db.store().await;
    // Every unique key must hold the partitioning column: the log's
    // primary key is its id.
    store
        .connection()
        .execute_unprepared(
            "ALTER TABLE outbox_event_attempts PARTITION BY RANGE (id) \
             (PARTITION before_today VALUES LESS THAN (1))",
        )
        .await
        .unwrap();
    let refused = prometheus::IntCounter::new("refused", "refused log rows").unwrap();
    let writer = outbox_sidecar::store::batch::StatusWriter::spawn_counting(
        store.clone(),
        Some(refused.clone()),
    );
    let row = pending(&store).await;
    let sent_row = sent(&row);
    let log = attempt(row.id, 1, Some(201), "ok");
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        writer.mark_sent(&row, &sent_row, Some(&log)),
    )
    .await
    .expect("the status write answers (not retried for ever)")
    .expect("written without the log");
    assert!(matches!(out, Sent::Applied { .. }), "{out:?}");
    assert_eq!(
        store.get(row.id).await.unwrap().unwrap().status,
        Status::Sent
    );
    assert_eq!(log_rows(&store).await, 0, "the log could not take it");
    assert_eq!(refused.get(), 1, "the refused log row is counted");
}
