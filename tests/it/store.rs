//! R-004's decision table on the model operations, as the Rails
//! `spec/models/outbox_event_spec.rb` tests `#mark_sent!`,
//! `#register_failure!` and `#retry!` — the same bodies on every backend.

use entity::{OutboxEventRow, Status};
use outbox_sidecar::store::{Outcome, RetryRefused, Store, MAX_LAST_ERROR_BYTES};
use sea_orm::ConnectionTrait;
use serde_json::json;

use crate::db::{Backend, TestDb};

async fn pending(store: &Store) -> OutboxEventRow {
    let id = store
        .insert(
            "accounts.purchase_create",
            &json!({"event_type": "purchase_create", "amount": 10}),
        )
        .await
        .expect("insert");
    store.get(id).await.expect("get").expect("row")
}

fn applied(o: Outcome) -> OutboxEventRow {
    match o {
        Outcome::Applied(row) => row,
        other => panic!("expected applied, got {other:?}"),
    }
}

/// Drives a fresh row to `attempts` failures (of `max`).
async fn with_attempts(store: &Store, attempts: i32, max: i32) -> OutboxEventRow {
    let mut row = pending(store).await;
    for i in 0..attempts {
        row = applied(
            store
                .register_failure(&row, &format!("HTTP 503: try {i}"), max)
                .await
                .unwrap(),
        );
    }
    row
}

async fn success_from_any_attempts(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    for attempts in 0..=2 {
        let row = with_attempts(&store, attempts, 3).await;
        let sent = applied(store.mark_sent(&row).await.unwrap());
        let stored = store.get(row.id).await.unwrap().unwrap();
        assert_eq!(stored, sent, "the returned state is the stored state");
        assert_eq!(stored.status, Status::Sent);
        assert!(stored.sent_at.is_some(), "sent_at filled in");
        assert_eq!(
            stored.attempts, attempts,
            "a success does not count an attempt"
        );
        assert!(stored.updated_at >= row.updated_at);
    }
}

async fn failure_below_max_stays_pending(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    for before in 0..=1 {
        let row = with_attempts(&store, before, 3).await;
        let after = applied(
            store
                .register_failure(&row, "HTTP 422: company_not_found", 3)
                .await
                .unwrap(),
        );
        let stored = store.get(row.id).await.unwrap().unwrap();
        assert_eq!(stored, after);
        assert_eq!(stored.status, Status::Pending);
        assert_eq!(stored.attempts, before + 1);
        assert_eq!(
            stored.last_error.as_deref(),
            Some("HTTP 422: company_not_found")
        );
        assert!(stored.sent_at.is_none());
    }
}

async fn third_failure_fails(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let row = with_attempts(&store, 2, 3).await;
    let after = applied(
        store
            .register_failure(&row, "timeout after 10s", 3)
            .await
            .unwrap(),
    );
    assert_eq!(after.status, Status::Failed);
    assert_eq!(after.attempts, 3);
    let stored = store.get(row.id).await.unwrap().unwrap();
    assert_eq!(stored, after);
    // No step applies to a failed row: attempts never pass max_attempts.
    assert!(
        matches!(store.register_failure(&stored, "again", 3).await.unwrap(), Outcome::Conflict(r) if r.attempts == 3)
    );
    assert!(
        matches!(store.mark_sent(&stored).await.unwrap(), Outcome::Conflict(r) if r.status == Status::Failed)
    );
}

async fn max_attempts_from_configuration(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let row = pending(&store).await;
    let after = applied(store.register_failure(&row, "boom", 1).await.unwrap());
    assert_eq!((after.status, after.attempts), (Status::Failed, 1));
}

async fn resend_of_failed(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let failed = with_attempts(&store, 3, 3).await;
    assert_eq!(failed.status, Status::Failed);
    let resent = store
        .retry(
            failed.id,
            &outbox_sidecar::store::history::Caller::new(
                outbox_sidecar::store::history::Via::Cli,
                None,
            ),
        )
        .await
        .unwrap()
        .expect("resend applies");
    assert_eq!(resent.status, Status::Pending);
    assert_eq!(resent.attempts, 0);
    assert_eq!(resent.last_error, None);
    // The three attempts start over from zero.
    let again = applied(
        store
            .register_failure(&resent, "HTTP 500", 3)
            .await
            .unwrap(),
    );
    assert_eq!((again.status, again.attempts), (Status::Pending, 1));
}

async fn resend_of_pending_or_sent_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let p = with_attempts(&store, 1, 3).await;
    assert_eq!(
        store
            .retry(
                p.id,
                &outbox_sidecar::store::history::Caller::new(
                    outbox_sidecar::store::history::Via::Cli,
                    None
                )
            )
            .await
            .unwrap(),
        Err(RetryRefused::NotFailed {
            id: p.id,
            status: Status::Pending
        })
    );
    let s = applied(store.mark_sent(&pending(&store).await).await.unwrap());
    let refused = store
        .retry(
            s.id,
            &outbox_sidecar::store::history::Caller::new(
                outbox_sidecar::store::history::Via::Cli,
                None,
            ),
        )
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        format!("event {} is sent: only failed events can be resent", s.id)
    );
    assert_eq!(
        store.get(s.id).await.unwrap().unwrap(),
        s,
        "refusal changes nothing"
    );
    assert_eq!(store.get(p.id).await.unwrap().unwrap(), p);
    assert_eq!(
        store
            .retry(
                999_999,
                &outbox_sidecar::store::history::Caller::new(
                    outbox_sidecar::store::history::Via::Cli,
                    None
                )
            )
            .await
            .unwrap(),
        Err(RetryRefused::NotFound(999_999))
    );
}

async fn stale_step_is_a_conflict(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let row = pending(&store).await;
    // Two writers computed their step from the same state; exactly one applies.
    let (a, b) = tokio::join!(
        store.register_failure(&row, "writer a", 3),
        store.register_failure(&row, "writer b", 3)
    );
    let outcomes = [a.unwrap(), b.unwrap()];
    let applied_n = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Applied(_)))
        .count();
    assert_eq!(applied_n, 1, "{outcomes:?}");
    let stored = store.get(row.id).await.unwrap().unwrap();
    assert_eq!(stored.attempts, 1);
    for o in &outcomes {
        if let Outcome::Conflict(found) = o {
            assert_eq!(found, &stored, "a conflict reports the state found");
        }
    }
    // A success computed from the stale state conflicts too and changes nothing.
    assert!(matches!(
        store.mark_sent(&row).await.unwrap(),
        Outcome::Conflict(_)
    ));
    assert_eq!(store.get(row.id).await.unwrap().unwrap(), stored);
    let (s1, s2) = tokio::join!(store.mark_sent(&stored), store.mark_sent(&stored));
    let sent_n = [s1.unwrap(), s2.unwrap()]
        .iter()
        .filter(|o| matches!(o, Outcome::Applied(_)))
        .count();
    assert_eq!(sent_n, 1);
    // A row that does not exist.
    let mut ghost = stored.clone();
    ghost.id = 424_242;
    assert_eq!(
        store.mark_sent(&ghost).await.unwrap(),
        Outcome::NotFound(424_242)
    );
}

async fn last_error_is_short(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let row = pending(&store).await;
    let long = "é".repeat(2000); // 4000 bytes, 2-byte chars
    let after = applied(store.register_failure(&row, &long, 3).await.unwrap());
    let stored = store.get(row.id).await.unwrap().unwrap();
    let err = stored.last_error.unwrap();
    assert!(err.len() <= MAX_LAST_ERROR_BYTES, "{} bytes", err.len());
    assert!(err.starts_with("éé"));
    assert_eq!(Some(err), after.last_error);
}

async fn list_and_bulk_resend(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let a = with_attempts(&store, 1, 1).await;
    let b = with_attempts(&store, 1, 1).await;
    let id = store
        .insert("accounts.installment_paid", &json!({}))
        .await
        .unwrap();
    let c = store.get(id).await.unwrap().unwrap();
    let c = applied(store.register_failure(&c, "x", 1).await.unwrap());
    let _p = pending(&store).await;
    let filter = |status, name: Option<&str>| outbox_sidecar::store::ListFilter {
        status,
        event_name: name.map(str::to_owned),
        limit: None,
        before: None,
        ..Default::default()
    };
    let failed = store
        .list(&filter(Some(Status::Failed), None))
        .await
        .unwrap();
    assert_eq!(
        failed.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![c.id, b.id, a.id],
        "newest first"
    );
    let next_page = store
        .list(&outbox_sidecar::store::ListFilter {
            status: Some(Status::Failed),
            limit: Some(2),
            before: Some(b.id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        next_page.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![a.id]
    );
    let paid = store
        .list(&filter(
            Some(Status::Failed),
            Some("accounts.installment_paid"),
        ))
        .await
        .unwrap();
    assert_eq!(paid.len(), 1);
    // The console's filters: error text, last change since / until.
    let ids = |rows: Vec<entity::OutboxEventRow>| rows.iter().map(|r| r.id).collect::<Vec<_>>();
    let failed_where = |f: outbox_sidecar::store::ListFilter| outbox_sidecar::store::ListFilter {
        status: Some(Status::Failed),
        ..f
    };
    let by_error = store
        .list(&failed_where(outbox_sidecar::store::ListFilter {
            error_contains: c.last_error.clone(),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert!(ids(by_error).contains(&c.id));
    let no_such_error = store
        .list(&failed_where(outbox_sidecar::store::ListFilter {
            error_contains: Some("no such error text".into()),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert!(no_such_error.is_empty());
    let since = store
        .list(&failed_where(outbox_sidecar::store::ListFilter {
            changed_since: Some(c.updated_at),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert!(ids(since).contains(&c.id));
    let until = store
        .list(&failed_where(outbox_sidecar::store::ListFilter {
            changed_until: Some(c.updated_at),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert!(!ids(until).contains(&c.id));
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.pending, stats.failed), (1, 3));
    assert_eq!(store.count_status(Status::Sent).await.unwrap(), 0);
    assert!(stats.oldest_pending_created_at.is_some());
    assert_eq!(
        store
            .retry_all_failed(
                Some("accounts.installment_paid"),
                &outbox_sidecar::store::history::Caller::new(
                    outbox_sidecar::store::history::Via::Cli,
                    None
                )
            )
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .retry_all_failed(
                None,
                &outbox_sidecar::store::history::Caller::new(
                    outbox_sidecar::store::history::Via::Cli,
                    None
                )
            )
            .await
            .unwrap(),
        2
    );
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.pending, stats.failed), (4, 0));
}

/// `events retrigger`: pending rows are touched so Debezium announces them
/// again; nothing else changes, and no other status is touched.
async fn retrigger_touches_only_pending_rows(backend: Backend) {
    use outbox_sidecar::store::RetriggerFilter;
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let old_pending = pending(&store).await;
    let retried = with_attempts(&store, 1, 3).await;
    let sent = applied(store.mark_sent(&pending(&store).await).await.unwrap());
    let failed = with_attempts(&store, 3, 3).await;
    let mut other = pending(&store).await;
    store
        .connection()
        .execute_unprepared(&format!(
            "UPDATE outbox_events SET event_name = 'billing.invoice_issued' WHERE id = {}",
            other.id
        ))
        .await
        .unwrap();
    other = store.get(other.id).await.unwrap().unwrap();
    let by_id = RetriggerFilter {
        ids: vec![old_pending.id, sent.id, failed.id],
        ..Default::default()
    };
    assert_eq!(
        store.retrigger(&by_id).await.unwrap(),
        1,
        "only the pending one"
    );
    let touched = store.get(old_pending.id).await.unwrap().unwrap();
    assert!(touched.updated_at > old_pending.updated_at);
    assert_eq!(
        (touched.status, touched.attempts, touched.last_error),
        (
            old_pending.status,
            old_pending.attempts,
            old_pending.last_error
        )
    );
    assert_eq!(store.get(sent.id).await.unwrap().unwrap(), sent);
    assert_eq!(store.get(failed.id).await.unwrap().unwrap(), failed);
    // Older than an hour: none. Older than zero, of one event name: one.
    let older = |secs, name: Option<&str>| RetriggerFilter {
        older_than: Some(std::time::Duration::from_secs(secs)),
        event_name: name.map(str::to_owned),
        ..Default::default()
    };
    assert_eq!(store.retrigger(&older(3600, None)).await.unwrap(), 0);
    let n = store
        .retrigger(&older(0, Some("billing.invoice_issued")))
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert!(store.get(other.id).await.unwrap().unwrap().updated_at > other.updated_at);
    let r = store.get(retried.id).await.unwrap().unwrap();
    assert_eq!(
        (r.attempts, r.updated_at),
        (retried.attempts, retried.updated_at)
    );
    assert_eq!(
        store.retrigger(&RetriggerFilter::default()).await.unwrap(),
        0
    );
}

/// A touch of many rows goes in committed batches, reporting its count
/// after each: 2,500 pending rows are touched 1,000 at a time.
async fn retrigger_touches_in_batches(backend: Backend) {
    use outbox_sidecar::store::RetriggerFilter;
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let values = (0..2_500)
        .map(|_| {
            "('accounts.purchase_create', '{}', 'pending', 0, \
             '2026-01-01 00:00:00', '2026-01-01 00:00:00')"
        })
        .collect::<Vec<_>>()
        .join(",");
    store
        .connection()
        .execute_unprepared(&format!(
            "INSERT INTO outbox_events \
             (event_name, payload, status, attempts, created_at, updated_at) VALUES {values}"
        ))
        .await
        .unwrap();
    let done = pending(&store).await;
    store.mark_sent(&done).await.unwrap();
    let mut seen = Vec::new();
    let filter = RetriggerFilter {
        older_than: Some(std::time::Duration::from_secs(60)),
        ..Default::default()
    };
    let n = store
        .retrigger_with_progress(&filter, &mut |n| seen.push(n))
        .await
        .unwrap();
    assert_eq!(n, 2_500);
    assert_eq!(seen, vec![1_000, 2_000, 2_500]);
    assert_eq!(store.retrigger(&filter).await.unwrap(), 0, "all touched");
}

/// The morning after an outage: resend only the failed rows of one event
/// name, whose error says 503, failed within a window; a dry run first.
async fn filtered_resend_of_failed(backend: Backend) {
    use outbox_sidecar::store::FailedFilter;
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let fail = |error: &'static str| {
        let store = store.clone();
        async move {
            let row = pending(&store).await;
            applied(store.register_failure(&row, error, 1).await.unwrap())
        }
    };
    let a = fail("HTTP 503: accounts temporarily unavailable").await;
    let b = fail("HTTP 422: company_not_found").await;
    let c = fail("HTTP 503: again").await;
    let other = pending(&store).await;
    store
        .connection()
        .execute_unprepared(&format!(
            "UPDATE outbox_events SET event_name = 'billing.invoice_issued', status = 'failed', \
             attempts = 1, last_error = 'HTTP 503' WHERE id = {}",
            other.id
        ))
        .await
        .unwrap();
    let filter = FailedFilter {
        event_names: Some(vec!["accounts.purchase_create".into()]),
        error_contains: Some("503".into()),
        failed_since: Some(a.updated_at),
        failed_until: Some(c.updated_at + chrono::Duration::seconds(1)),
    };
    let (n, sample) = store.preview_failed(&filter, 1).await.unwrap();
    assert_eq!(n, 2);
    assert_eq!(
        sample.iter().map(|r| r.id).collect::<Vec<_>>(),
        [c.id],
        "newest first"
    );
    assert_eq!(
        store.stats().await.unwrap().failed,
        4,
        "a dry run changes nothing"
    );
    // A window that ends before `c` failed leaves it out.
    let early = FailedFilter {
        failed_until: Some(c.updated_at),
        ..filter.clone()
    };
    assert_eq!(store.preview_failed(&early, 10).await.unwrap().0, 1);
    assert_eq!(
        store
            .retry_failed(
                &filter,
                &outbox_sidecar::store::history::Caller::new(
                    outbox_sidecar::store::history::Via::Cli,
                    None
                )
            )
            .await
            .unwrap(),
        2
    );
    for (row, status) in [
        (&a, Status::Pending),
        (&b, Status::Failed),
        (&c, Status::Pending),
        (&other, Status::Failed),
    ] {
        assert_eq!(
            store.get(row.id).await.unwrap().unwrap().status,
            status,
            "row {}",
            row.id
        );
    }
    // No filter: every failed row.
    assert_eq!(
        store
            .retry_failed(
                &FailedFilter::default(),
                &outbox_sidecar::store::history::Caller::new(
                    outbox_sidecar::store::history::Via::Cli,
                    None
                )
            )
            .await
            .unwrap(),
        2
    );
}

async fn migration_is_idempotent_and_keeps_rows(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let row = with_attempts(&store, 2, 3).await;
    store.migrate().await.expect("second migrate");
    store.migrate().await.expect("third migrate");
    assert_eq!(store.get(row.id).await.unwrap().unwrap(), row);
}

/// Without an index whose first column is status the gauges read the
/// whole table: the store names the index to create.
async fn a_missing_status_index_is_named(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    if backend == Backend::Sqlite {
        assert_eq!(store.status_index_advice().await.unwrap(), None);
        return;
    }
    assert_eq!(store.has_status_index().await.unwrap(), Some(true));
    assert_eq!(store.status_index_advice().await.unwrap(), None);
    let drop = match backend {
        Backend::Postgres => "DROP INDEX index_outbox_events_on_status",
        _ => "DROP INDEX index_outbox_events_on_status ON outbox_events",
    };
    store.connection().execute_unprepared(drop).await.unwrap();
    let advice = store.status_index_advice().await.unwrap().expect("advice");
    let want = match backend {
        Backend::Postgres => "CREATE INDEX CONCURRENTLY \"index_outbox_events_on_status\" ON \"outbox_events\" (status)",
        _ => "CREATE INDEX `index_outbox_events_on_status` ON `outbox_events` (status)",
    };
    assert_eq!(advice, want);
    // The advice runs as given; then nothing is missing.
    store
        .connection()
        .execute_unprepared(&advice)
        .await
        .unwrap();
    assert_eq!(store.status_index_advice().await.unwrap(), None);
    // An index that only ends with status does not count.
    store.connection().execute_unprepared(drop).await.unwrap();
    store
        .connection()
        .execute_unprepared("CREATE INDEX by_name_status ON outbox_events (event_name, status)")
        .await
        .unwrap();
    assert_eq!(store.has_status_index().await.unwrap(), Some(false));
}

macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod postgres { $( #[tokio::test] async fn $name() { super::$name(super::Backend::Postgres).await } )* }
        mod mariadb { $( #[tokio::test] async fn $name() { super::$name(super::Backend::MySql).await } )* }
        mod sqlite { $( #[tokio::test] async fn $name() { super::$name(super::Backend::Sqlite).await } )* }
    };
}

on_every_backend!(
    success_from_any_attempts,
    failure_below_max_stays_pending,
    third_failure_fails,
    max_attempts_from_configuration,
    resend_of_failed,
    resend_of_pending_or_sent_refused,
    stale_step_is_a_conflict,
    last_error_is_short,
    list_and_bulk_resend,
    retrigger_touches_only_pending_rows,
    retrigger_touches_in_batches,
    filtered_resend_of_failed,
    migration_is_idempotent_and_keeps_rows,
    a_missing_status_index_is_named,
);

mod batched {
    //! `mark_sent` and `register_failure` batched across jobs give each row
    //! what the single-row write would.
    use super::*;
    use outbox_sidecar::store::batch::{
        mark_sent_many, register_failure_many, Failure, Key, Sent, StatusWriter,
    };

    async fn applies_and_reports_conflicts(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = db.store().await;
        let fresh = pending(&store).await;
        let retried = with_attempts(&store, 1, 3).await;
        let stale = pending(&store).await;
        let moved_on = applied(store.register_failure(&stale, "HTTP 500", 3).await.unwrap());
        let mut ghost = fresh.clone();
        ghost.id = 777_777;
        let keys: Vec<Key> = [&fresh, &retried, &stale, &ghost]
            .into_iter()
            .map(Key::from)
            .collect();
        let outcomes = mark_sent_many(&store, &keys, &[]).await.unwrap();
        for row in [&fresh, &retried] {
            let stored = store.get(row.id).await.unwrap().unwrap();
            assert_eq!(stored.status, Status::Sent);
            assert_eq!(stored.attempts, row.attempts);
            assert_eq!(
                outcomes[&row.id],
                Sent::Applied {
                    sent_at: stored.sent_at.unwrap()
                }
            );
        }
        assert_eq!(
            outcomes[&stale.id],
            Sent::Conflict(moved_on.clone()),
            "computed from a stale state"
        );
        assert_eq!(
            store.get(stale.id).await.unwrap().unwrap(),
            moved_on,
            "and changed nothing"
        );
        assert_eq!(outcomes[&777_777], Sent::NotFound(777_777));
    }

    async fn writer_batches_concurrent_jobs(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = db.store().await;
        let writer = StatusWriter::spawn(store.clone(), 3);
        let mut rows = Vec::new();
        for _ in 0..40 {
            rows.push(pending(&store).await);
        }
        let results =
            futures::future::join_all(rows.iter().map(|r| writer.mark_sent(r, None))).await;
        for (row, result) in rows.iter().zip(results) {
            let Sent::Applied { sent_at } = result.unwrap() else {
                panic!("row {} not applied", row.id);
            };
            let stored = store.get(row.id).await.unwrap().unwrap();
            assert_eq!(
                (stored.status, stored.sent_at),
                (Status::Sent, Some(sent_at))
            );
        }
        let stats = store.stats().await.unwrap();
        let sent = store.count_status(Status::Sent).await.unwrap();
        assert_eq!((sent, stats.pending), (40, 0));
        // The same rows again: every one is now a conflict.
        let again = writer.mark_sent(&rows[0], None).await.unwrap();
        assert!(matches!(again, Sent::Conflict(r) if r.status == Status::Sent));
    }

    async fn failures_apply_and_report_conflicts(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = db.store().await;
        let fresh = pending(&store).await;
        let last_try = with_attempts(&store, 2, 3).await;
        let stale = pending(&store).await;
        let moved_on = applied(store.register_failure(&stale, "HTTP 500", 3).await.unwrap());
        let mut ghost = fresh.clone();
        ghost.id = 888_888;
        let long = "é".repeat(2000);
        let failures: Vec<Failure> = [
            (&fresh, "HTTP 503"),
            (&last_try, long.as_str()),
            (&stale, "HTTP 502"),
            (&ghost, "HTTP 500"),
        ]
        .into_iter()
        .map(|(row, error)| Failure {
            seen: row.clone(),
            error: error.to_owned(),
        })
        .collect();
        let outcomes = register_failure_many(&store, &failures, 3, &[])
            .await
            .unwrap();

        let stored = store.get(fresh.id).await.unwrap().unwrap();
        assert_eq!(outcomes[&fresh.id], Outcome::Applied(stored.clone()));
        assert_eq!(
            (stored.status, stored.attempts, stored.last_error.as_deref()),
            (Status::Pending, 1, Some("HTTP 503")),
            "below max_attempts the row stays pending"
        );
        assert!(stored.updated_at > fresh.updated_at, "updated_at moves on");

        let stored = store.get(last_try.id).await.unwrap().unwrap();
        assert_eq!(outcomes[&last_try.id], Outcome::Applied(stored.clone()));
        assert_eq!((stored.status, stored.attempts), (Status::Failed, 3));
        let err = stored.last_error.unwrap();
        assert!(err.len() <= MAX_LAST_ERROR_BYTES && err.starts_with("éé"));

        assert_eq!(
            outcomes[&stale.id],
            Outcome::Conflict(moved_on.clone()),
            "computed from a stale state"
        );
        assert_eq!(store.get(stale.id).await.unwrap().unwrap(), moved_on);
        assert_eq!(outcomes[&888_888], Outcome::NotFound(888_888));

        // All applied (the path without a read back): same answers.
        let fresh_again = store.get(fresh.id).await.unwrap().unwrap();
        let one = [Failure {
            seen: fresh_again.clone(),
            error: "HTTP 504".into(),
        }];
        let outcomes = register_failure_many(&store, &one, 3, &[]).await.unwrap();
        let stored = store.get(fresh.id).await.unwrap().unwrap();
        assert_eq!(outcomes[&fresh.id], Outcome::Applied(stored.clone()));
        assert_eq!((stored.attempts, stored.status), (2, Status::Pending));
    }

    async fn writer_batches_failures_and_successes(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = db.store().await;
        let writer = StatusWriter::spawn(store.clone(), 3);
        let mut rows = Vec::new();
        for _ in 0..30 {
            rows.push(pending(&store).await);
        }
        // Every other row fails, the rest succeed, all at once.
        let writes = rows.iter().enumerate().map(|(i, row)| {
            let writer = writer.clone();
            async move {
                if i % 2 == 0 {
                    writer
                        .register_failure(row, &format!("HTTP 500 for {}", row.id), None)
                        .await
                        .map(|o| (Some(o), None))
                } else {
                    writer.mark_sent(row, None).await.map(|s| (None, Some(s)))
                }
            }
        });
        let results = futures::future::join_all(writes).await;
        for (row, result) in rows.iter().zip(results) {
            let stored = store.get(row.id).await.unwrap().unwrap();
            match result.unwrap() {
                (Some(outcome), None) => {
                    assert_eq!(outcome, Outcome::Applied(stored.clone()));
                    assert_eq!(stored.attempts, 1);
                    let expected = format!("HTTP 500 for {}", row.id);
                    assert_eq!(stored.last_error.as_deref(), Some(expected.as_str()));
                }
                (None, Some(sent)) => {
                    assert_eq!(
                        sent,
                        Sent::Applied {
                            sent_at: stored.sent_at.unwrap()
                        }
                    );
                    assert_eq!(stored.status, Status::Sent);
                }
                other => panic!("row {}: {other:?}", row.id),
            }
        }
        let stats = store.stats().await.unwrap();
        let sent = store.count_status(Status::Sent).await.unwrap();
        assert_eq!((sent, stats.pending), (15, 15));
        // A failure computed from a row that has moved on is a conflict.
        let again = writer
            .register_failure(&rows[0], "late", None)
            .await
            .unwrap();
        assert!(matches!(again, Outcome::Conflict(r) if r.attempts == 1));
    }

    mod postgres {
        #[tokio::test]
        async fn failures_apply_and_report_conflicts() {
            super::failures_apply_and_report_conflicts(super::Backend::Postgres).await
        }
        #[tokio::test]
        async fn writer_batches_failures_and_successes() {
            super::writer_batches_failures_and_successes(super::Backend::Postgres).await
        }
        #[tokio::test]
        async fn applies_and_reports_conflicts() {
            super::applies_and_reports_conflicts(super::Backend::Postgres).await
        }
        #[tokio::test]
        async fn writer_batches_concurrent_jobs() {
            super::writer_batches_concurrent_jobs(super::Backend::Postgres).await
        }
    }
    mod mariadb {
        #[tokio::test]
        async fn failures_apply_and_report_conflicts() {
            super::failures_apply_and_report_conflicts(super::Backend::MySql).await
        }
        #[tokio::test]
        async fn writer_batches_failures_and_successes() {
            super::writer_batches_failures_and_successes(super::Backend::MySql).await
        }
        #[tokio::test]
        async fn applies_and_reports_conflicts() {
            super::applies_and_reports_conflicts(super::Backend::MySql).await
        }
        #[tokio::test]
        async fn writer_batches_concurrent_jobs() {
            super::writer_batches_concurrent_jobs(super::Backend::MySql).await
        }
    }
    mod sqlite {
        #[tokio::test]
        async fn failures_apply_and_report_conflicts() {
            super::failures_apply_and_report_conflicts(super::Backend::Sqlite).await
        }
        #[tokio::test]
        async fn writer_batches_failures_and_successes() {
            super::writer_batches_failures_and_successes(super::Backend::Sqlite).await
        }
        #[tokio::test]
        async fn applies_and_reports_conflicts() {
            super::applies_and_reports_conflicts(super::Backend::Sqlite).await
        }
        #[tokio::test]
        async fn writer_batches_concurrent_jobs() {
            super::writer_batches_concurrent_jobs(super::Backend::Sqlite).await
        }
    }
}

mod refused {
    //! Writes the database refuses for what one row holds: cut to the
    //! column's length where that is the cause, and never failing the
    //! neighbours batched with that row.
    use super::*;
    use outbox_sidecar::store::batch::StatusWriter;

    /// A Rails `string` column is `varchar(255)`; strict MySQL and
    /// PostgreSQL refuse a longer value (1406 / 22001).
    async fn last_error_fits_a_varchar_255(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = db.store().await;
        let sql = match backend {
            Backend::MySql => "ALTER TABLE outbox_events MODIFY last_error varchar(255) NULL",
            _ => "ALTER TABLE outbox_events ALTER COLUMN last_error TYPE varchar(255)",
        };
        store.connection().execute_unprepared(sql).await.unwrap();
        // Connecting learns the column's length.
        let store = db.store().await;
        let row = pending(&store).await;
        let error = format!("HTTP 500: {}", "é".repeat(300));
        let next = applied(store.register_failure(&row, &error, 3).await.unwrap());
        let stored = store.get(row.id).await.unwrap().unwrap();
        assert_eq!(stored, next);
        let err = stored.last_error.clone().unwrap();
        assert_eq!(err.chars().count(), 255, "{err}");
        assert!(err.starts_with("HTTP 500: éé") && err.ends_with('…'));
        // Batched the same way.
        let writer = StatusWriter::spawn(store.clone(), 3);
        let next = applied(
            writer
                .register_failure(&stored, &error, None)
                .await
                .unwrap(),
        );
        assert_eq!(next.last_error.unwrap().chars().count(), 255);
    }

    #[tokio::test]
    async fn last_error_fits_a_varchar_255_postgres() {
        last_error_fits_a_varchar_255(Backend::Postgres).await
    }

    #[tokio::test]
    async fn last_error_fits_a_varchar_255_mariadb() {
        last_error_fits_a_varchar_255(Backend::MySql).await
    }

    #[tokio::test]
    async fn a_refused_row_does_not_fail_the_rows_batched_with_it() {
        let db = TestDb::postgres().await;
        let store = db.store().await;
        store
            .connection()
            .execute_unprepared(
                "ALTER TABLE outbox_events ADD CONSTRAINT no_poison \
                 CHECK (last_error IS NULL OR last_error NOT LIKE '%poison%')",
            )
            .await
            .unwrap();
        let poison = pending(&store).await;
        let fine = pending(&store).await;
        let sent = pending(&store).await;
        let writer = StatusWriter::spawn(store.clone(), 3);
        // Polled together: they reach the writer within one batch window.
        let (refused, failed, marked) = tokio::join!(
            writer.register_failure(&poison, "HTTP 500: poison", None),
            writer.register_failure(&fine, "HTTP 503", None),
            writer.mark_sent(&sent, None),
        );
        let err = refused.expect_err("the check constraint refuses it");
        assert!(!err.is_transient(), "a constraint is permanent: {err}");
        assert_eq!(applied(failed.unwrap()).attempts, 1);
        assert!(matches!(
            marked.unwrap(),
            outbox_sidecar::store::batch::Sent::Applied { .. }
        ));
        let stored = store.get(poison.id).await.unwrap().unwrap();
        assert_eq!(stored, poison, "the refused row keeps its state");
    }
}

/// MySQL and SQLite refusals recognised by their own codes, not only
/// by SQLSTATE class: MySQL's 1366 (incorrect string value) comes with
/// `HY000`, SQLite's constraint codes are numbers. A refused status write
/// is given up, not retried for ever.
mod refused_by_code {
    use super::*;
    use outbox_sidecar::store::batch::StatusWriter;

    async fn refused(store: &Store, row: OutboxEventRow, error: &str) {
        let writer = StatusWriter::spawn(store.clone(), 3);
        let err = writer
            .register_failure(&row, error, None)
            .await
            .expect_err("the database refuses this write");
        assert!(!err.is_transient(), "a refusal is permanent: {err}");
        assert_eq!(store.get(row.id).await.unwrap().unwrap(), row);
    }

    /// A Rails enum column that lacks `failed`: strict MariaDB refuses
    /// the write with 1265 "Data truncated", SQLSTATE `01000`.
    #[tokio::test]
    async fn mariadb_1265_data_truncated_is_permanent() {
        let db = TestDb::new(Backend::MySql).await;
        let store = db.store().await;
        let row = with_attempts(&store, 2, 3).await;
        store
            .connection()
            .execute_unprepared(
                "ALTER TABLE outbox_events MODIFY status ENUM('pending', 'sent') NOT NULL",
            )
            .await
            .unwrap();
        let row = store.get(row.id).await.unwrap().unwrap();
        refused(&store, row, "HTTP 500: the third").await;
    }

    /// MariaDB reports 1366 with SQLSTATE `22007` (MySQL with `HY000`).
    #[tokio::test]
    async fn mariadb_1366_incorrect_string_value_is_permanent() {
        let db = TestDb::new(Backend::MySql).await;
        let store = db.store().await;
        store
            .connection()
            .execute_unprepared(
                "ALTER TABLE outbox_events MODIFY last_error text CHARACTER SET utf8mb3 NULL",
            )
            .await
            .unwrap();
        let store = db.store().await;
        let row = pending(&store).await;
        refused(&store, row, "HTTP 500: \u{1F600}").await;
    }

    #[tokio::test]
    async fn sqlite_constraint_codes_are_permanent() {
        let db = TestDb::new(Backend::Sqlite).await;
        let store = db.store().await;
        store
            .connection()
            .execute_unprepared(
                "CREATE TRIGGER no_poison BEFORE UPDATE ON outbox_events \
                 WHEN NEW.last_error LIKE '%poison%' BEGIN SELECT RAISE(ABORT, 'poison'); END",
            )
            .await
            .unwrap();
        let row = pending(&store).await;
        refused(&store, row, "HTTP 500: poison").await;
    }

    /// A MariaDB `datetime(0)` column holds whole seconds: a touch within
    /// the second of the row's last write must still change the row, or
    /// the binlog carries no event and nothing is announced.
    #[tokio::test]
    async fn mariadb_a_touch_within_the_same_second_changes_the_row() {
        use outbox_sidecar::store::RetriggerFilter;
        let db = TestDb::new(Backend::MySql).await;
        let store = db.store().await;
        store
            .connection()
            .execute_unprepared("ALTER TABLE outbox_events MODIFY updated_at datetime(0) NOT NULL")
            .await
            .unwrap();
        let row = pending(&store).await;
        // Early in a second, so the write and the touch share it.
        crate::harness::eventually(
            "the start of a second",
            std::time::Duration::from_secs(5),
            || async { (chrono::Utc::now().timestamp_subsec_millis() < 200).then_some(()) },
        )
        .await;
        store
            .connection()
            .execute_unprepared(&format!(
                "UPDATE outbox_events SET updated_at = UTC_TIMESTAMP() WHERE id = {}",
                row.id
            ))
            .await
            .unwrap();
        let before = store.get(row.id).await.unwrap().unwrap();
        let by_id = RetriggerFilter {
            ids: vec![row.id],
            ..Default::default()
        };
        store.retrigger(&by_id).await.unwrap();
        let after = store.get(row.id).await.unwrap().unwrap();
        assert!(
            after.updated_at > before.updated_at,
            "the touch changed updated_at: {} -> {}",
            before.updated_at,
            after.updated_at
        );
    }
}

/// The ports of every TCP socket this process has open to `port`, each
/// with whether Nagle's algorithm is off on it (`TCP_NODELAY`). Linux:
/// read from /proc/self/fd.
fn sockets_to(port: u16) -> Vec<bool> {
    use std::os::fd::BorrowedFd;
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd") {
        let Ok(fd) = entry.unwrap().file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // SAFETY: only getpeername/getsockopt are called on the number,
        // and only while this loop runs; one another thread closed in the
        // meantime at worst answers for a socket it no longer is, or fails.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let sock = socket2::SockRef::from(&fd);
        let Some(peer) = sock.peer_addr().ok().and_then(|a| a.as_socket()) else {
            continue;
        };
        if peer.port() == port {
            if let Ok(nodelay) = sock.tcp_nodelay() {
                found.push(nodelay);
            }
        }
    }
    found
}

/// sqlx 0.9.0 opens its connections without `TCP_NODELAY`; a status write
/// that leaves in two writes (over TLS, past one 16 KiB record: a batch of
/// a few hundred attempts) then waits 40 ms for the server's delayed ACK.
/// The vendored sqlx-core (vendor/README.md) sets it: every connection of
/// the store's pool, and every other PostgreSQL connection of this process.
#[tokio::test]
async fn store_connections_disable_nagle() {
    let db = TestDb::postgres().await;
    let Some(port) = url::Url::parse(&db.url).ok().and_then(|u| u.port()) else {
        eprintln!("SKIP: {} names no TCP port", db.url);
        return;
    };
    let store = db.store().await;
    store
        .connection()
        .execute_unprepared("SELECT 1")
        .await
        .expect("a query");
    let sockets = sockets_to(port);
    assert!(
        !sockets.is_empty(),
        "no socket of this process is connected to port {port}"
    );
    assert!(
        sockets.iter().all(|nodelay| *nodelay),
        "{} of {} PostgreSQL connections have Nagle's algorithm on (TCP_NODELAY unset)",
        sockets.iter().filter(|n| !**n).count(),
        sockets.len()
    );
}
