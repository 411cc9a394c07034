//! R-004's decision table on the model operations, as the Rails
//! `spec/models/outbox_event_spec.rb` tests `#mark_sent!`,
//! `#register_failure!` and `#retry!` — the same bodies on every backend.

use entity::{OutboxEventRow, Status};
use outbox_sidecar::store::{now, Outcome, RetryRefused, Store, StoreError, MAX_LAST_ERROR_BYTES};
use outbox_sidecar::transition;
use sea_orm::ConnectionTrait;
use serde_json::json;

use crate::db::{Backend, TestDb};

/// What a success makes of `seen` now ([`transition::after_success`]).
pub fn sent(seen: &OutboxEventRow) -> OutboxEventRow {
    transition::after_success(seen, now())
}

/// What a failure with `error` makes of `seen` now, of `max_attempts`
/// ([`transition::after_failure`]; the error cut as the job cuts it, to
/// what `store`'s `last_error` holds).
pub fn failed(
    store: &Store,
    seen: &OutboxEventRow,
    error: &str,
    max_attempts: i32,
) -> OutboxEventRow {
    transition::after_failure(seen, store.truncate_error(error), now(), max_attempts)
}

/// R-004 `mark_sent!` as the job makes it: the row [`sent`] computes,
/// written by the store.
pub async fn mark_sent(store: &Store, seen: &OutboxEventRow) -> Result<Outcome, StoreError> {
    store.mark_sent(seen, &sent(seen)).await
}

/// R-004 `register_failure!` as the job makes it: the row [`failed`]
/// computes, written by the store.
pub async fn register_failure(
    store: &Store,
    seen: &OutboxEventRow,
    error: &str,
    max_attempts: i32,
) -> Result<Outcome, StoreError> {
    store
        .register_failure(seen, &failed(store, seen, error, max_attempts))
        .await
}

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
            register_failure(store, &row, &format!("HTTP 503: try {i}"), max)
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
        let sent = applied(mark_sent(&store, &row).await.unwrap());
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
            register_failure(&store, &row, "HTTP 422: company_not_found", 3)
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
        register_failure(&store, &row, "timeout after 10s", 3)
            .await
            .unwrap(),
    );
    assert_eq!(after.status, Status::Failed);
    assert_eq!(after.attempts, 3);
    let stored = store.get(row.id).await.unwrap().unwrap();
    assert_eq!(stored, after);
    // No step applies to a failed row: attempts never pass max_attempts.
    assert!(
        matches!(register_failure(&store, &stored, "again", 3).await.unwrap(), Outcome::Conflict(r) if r.attempts == 3)
    );
    assert!(
        matches!(mark_sent(&store, &stored).await.unwrap(), Outcome::Conflict(r) if r.status == Status::Failed)
    );
}

async fn max_attempts_from_configuration(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let row = pending(&store).await;
    let after = applied(register_failure(&store, &row, "boom", 1).await.unwrap());
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
        register_failure(&store, &resent, "HTTP 500", 3)
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
    let s = applied(mark_sent(&store, &pending(&store).await).await.unwrap());
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
        register_failure(&store, &row, "writer a", 3),
        register_failure(&store, &row, "writer b", 3)
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
        mark_sent(&store, &row).await.unwrap(),
        Outcome::Conflict(_)
    ));
    assert_eq!(store.get(row.id).await.unwrap().unwrap(), stored);
    let (s1, s2) = tokio::join!(mark_sent(&store, &stored), mark_sent(&store, &stored));
    let sent_n = [s1.unwrap(), s2.unwrap()]
        .iter()
        .filter(|o| matches!(o, Outcome::Applied(_)))
        .count();
    assert_eq!(sent_n, 1);
    // A row that does not exist.
    let mut ghost = stored.clone();
    ghost.id = 424_242;
    assert_eq!(
        mark_sent(&store, &ghost).await.unwrap(),
        Outcome::NotFound(424_242)
    );
}

async fn last_error_is_short(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let row = pending(&store).await;
    let long = "é".repeat(2000); // 4000 bytes, 2-byte chars
    let after = applied(register_failure(&store, &row, &long, 3).await.unwrap());
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
    let c = applied(register_failure(&store, &c, "x", 1).await.unwrap());
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
    let sent = applied(mark_sent(&store, &pending(&store).await).await.unwrap());
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
    mark_sent(&store, &done).await.unwrap();
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
            applied(register_failure(&store, &row, error, 1).await.unwrap())
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
        mark_sent_many, register_failure_many, Sent, StatusWriter, Step,
    };

    async fn applies_and_reports_conflicts(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = db.store().await;
        let fresh = pending(&store).await;
        let retried = with_attempts(&store, 1, 3).await;
        let stale = pending(&store).await;
        let moved_on = applied(
            register_failure(&store, &stale, "HTTP 500", 3)
                .await
                .unwrap(),
        );
        let mut ghost = fresh.clone();
        ghost.id = 777_777;
        let steps: Vec<Step> = [&fresh, &retried, &stale, &ghost]
            .into_iter()
            .map(|row| Step::new(row, sent(row)))
            .collect();
        let outcomes = mark_sent_many(&store, &steps, &[]).await.unwrap();
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
            Sent::Conflict(Box::new(moved_on.clone())),
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
        let writer = StatusWriter::spawn(store.clone());
        let mut rows = Vec::new();
        for _ in 0..40 {
            rows.push(pending(&store).await);
        }
        let nexts: Vec<OutboxEventRow> = rows.iter().map(sent).collect();
        let writes = rows
            .iter()
            .zip(&nexts)
            .map(|(r, n)| writer.mark_sent(r, n, None));
        let results = futures::future::join_all(writes).await;
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
        let again = writer
            .mark_sent(&rows[0], &super::sent(&rows[0]), None)
            .await
            .unwrap();
        assert!(matches!(again, Sent::Conflict(r) if r.status == Status::Sent));
    }

    async fn failures_apply_and_report_conflicts(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = db.store().await;
        let fresh = pending(&store).await;
        let last_try = with_attempts(&store, 2, 3).await;
        let stale = pending(&store).await;
        let moved_on = applied(
            register_failure(&store, &stale, "HTTP 500", 3)
                .await
                .unwrap(),
        );
        let mut ghost = fresh.clone();
        ghost.id = 888_888;
        let long = "é".repeat(2000);
        let failures: Vec<Step> = [
            (&fresh, "HTTP 503"),
            (&last_try, long.as_str()),
            (&stale, "HTTP 502"),
            (&ghost, "HTTP 500"),
        ]
        .into_iter()
        .map(|(row, error)| Step::new(row, failed(&store, row, error, 3)))
        .collect();
        let outcomes = register_failure_many(&store, &failures, &[]).await.unwrap();

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
        let one = [Step::new(
            &fresh_again,
            failed(&store, &fresh_again, "HTTP 504", 3),
        )];
        let outcomes = register_failure_many(&store, &one, &[]).await.unwrap();
        let stored = store.get(fresh.id).await.unwrap().unwrap();
        assert_eq!(outcomes[&fresh.id], Outcome::Applied(stored.clone()));
        assert_eq!((stored.attempts, stored.status), (2, Status::Pending));
    }

    async fn writer_batches_failures_and_successes(backend: Backend) {
        let db = TestDb::new(backend).await;
        let store = db.store().await;
        let writer = StatusWriter::spawn(store.clone());
        let mut rows = Vec::new();
        for _ in 0..30 {
            rows.push(pending(&store).await);
        }
        // Every other row fails, the rest succeed, all at once.
        let writes = rows.iter().enumerate().map(|(i, row)| {
            let writer = writer.clone();
            let failure = failed(&store, row, &format!("HTTP 500 for {}", row.id), 3);
            async move {
                if i % 2 == 0 {
                    writer
                        .register_failure(row, &failure, None)
                        .await
                        .map(|o| (Some(o), None))
                } else {
                    writer
                        .mark_sent(row, &sent(row), None)
                        .await
                        .map(|s| (None, Some(s)))
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
            .register_failure(&rows[0], &failed(&store, &rows[0], "late", 3), None)
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
        let next = applied(register_failure(&store, &row, &error, 3).await.unwrap());
        let stored = store.get(row.id).await.unwrap().unwrap();
        assert_eq!(stored, next);
        let err = stored.last_error.clone().unwrap();
        assert_eq!(err.chars().count(), 255, "{err}");
        assert!(err.starts_with("HTTP 500: éé") && err.ends_with('…'));
        // Batched the same way.
        let writer = StatusWriter::spawn(store.clone());
        let next = applied(
            writer
                .register_failure(&stored, &failed(&store, &stored, &error, 3), None)
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
        let writer = StatusWriter::spawn(store.clone());
        // Polled together: they reach the writer within one batch window.
        let nexts = (
            failed(&store, &poison, "HTTP 500: poison", 3),
            failed(&store, &fine, "HTTP 503", 3),
            super::sent(&sent),
        );
        let (refused, fine_failed, marked) = tokio::join!(
            writer.register_failure(&poison, &nexts.0, None),
            writer.register_failure(&fine, &nexts.1, None),
            writer.mark_sent(&sent, &nexts.2, None),
        );
        let err = refused.expect_err("the check constraint refuses it");
        assert!(!err.is_transient(), "a constraint is permanent: {err}");
        assert_eq!(applied(fine_failed.unwrap()).attempts, 1);
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
        let writer = StatusWriter::spawn(store.clone());
        let err = writer
            .register_failure(&row, &failed(store, &row, error, 3), None)
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

mod same_rows {
    //! R-004 written once: the job computes each next row with
    //! `transition`, the store writes it, and PostgreSQL (arrays joined
    //! with `unnest`), MariaDB and SQLite (conditions and a `CASE` per
    //! row) end with the same rows for the same outcomes — through the
    //! batched writes and the single-row ones, with and without the
    //! attempt log.
    use super::*;
    use chrono::{NaiveDate, NaiveDateTime};
    use outbox_sidecar::store::batch::{mark_sent_many, register_failure_many, Sent, Step};
    use outbox_sidecar::store::history::{Attempt, Caller, Via};

    /// What R-004 governs of a row, by its place among the rows: the
    /// payload and `created_at` are the application's.
    type State = (
        usize,
        Status,
        i32,
        Option<String>,
        Option<NaiveDateTime>,
        NaiveDateTime,
    );

    fn states(rows: &[OutboxEventRow]) -> Vec<State> {
        rows.iter()
            .enumerate()
            .map(|(i, r)| {
                (
                    i,
                    r.status,
                    r.attempts,
                    r.last_error.clone(),
                    r.sent_at,
                    r.updated_at,
                )
            })
            .collect()
    }

    /// A fixed instant, `ms` milliseconds into the scenario (microseconds
    /// in it, which every backend keeps).
    fn at(ms: i64) -> NaiveDateTime {
        let start = NaiveDate::from_ymd_opt(2030, 1, 1)
            .and_then(|d| d.and_hms_micro_opt(10, 0, 0, 123_456))
            .unwrap();
        start + chrono::Duration::milliseconds(ms)
    }

    fn log_of(step: &Step, http_status: u16) -> Attempt {
        Attempt {
            event_id: step.seen.id,
            attempt: step.seen.attempts + 1,
            started_at: at(0),
            duration_ms: 7,
            http_status: Some(http_status),
            detail: Some(format!("HTTP {http_status}")),
            trace_id: None,
        }
    }

    /// Plays one scenario on `backend`: the rows as stored at the end, and
    /// as `transition` computed them.
    async fn outcomes_on(backend: Backend) -> (Vec<OutboxEventRow>, Vec<OutboxEventRow>) {
        let db = TestDb::new(backend).await;
        let store = db.store().await;
        let mut rows = Vec::new();
        for _ in 0..7 {
            rows.push(pending(&store).await);
        }
        let mut expected = rows.clone();
        let success = |row: &OutboxEventRow, ms| transition::after_success(row, at(ms));
        let failure = |row: &OutboxEventRow, error: &str, max, ms| {
            transition::after_failure(row, store.truncate_error(error), at(ms), max)
        };
        let applied_all = |out: &std::collections::HashMap<i64, Outcome>, steps: &[Step]| {
            for s in steps {
                assert_eq!(out[&s.seen.id], Outcome::Applied(s.next.clone()));
            }
        };

        // 1. A batch of each kind, every row at its own instant, each
        //    attempt logged with its status: successes from 0 attempts
        //    (rows 0, 1), failures below the limit (rows 2, 3), a failure at
        //    the limit (row 6, max_attempts = 1).
        let sents = [
            Step::new(&rows[0], success(&rows[0], 1)),
            Step::new(&rows[1], success(&rows[1], 2)),
        ];
        let log: Vec<Attempt> = sents.iter().map(|s| log_of(s, 201)).collect();
        let out = mark_sent_many(&store, &sents, &log).await.unwrap();
        for s in &sents {
            let sent_at = s.next.sent_at.unwrap();
            assert_eq!(out[&s.seen.id], Sent::Applied { sent_at });
        }
        let fails = [
            Step::new(&rows[2], failure(&rows[2], "HTTP 503", 3, 3)),
            Step::new(&rows[3], failure(&rows[3], "HTTP 502: bad gateway", 3, 4)),
            Step::new(&rows[6], failure(&rows[6], "timeout after 10s", 1, 5)),
        ];
        let log: Vec<Attempt> = fails.iter().map(|s| log_of(s, 503)).collect();
        applied_all(
            &register_failure_many(&store, &fails, &log).await.unwrap(),
            &fails,
        );
        for s in sents.iter().chain(&fails) {
            expected[(s.seen.id - rows[0].id) as usize] = s.next.clone();
        }
        // One row at a time: a failure (row 4), and the write that moves
        // row 5 on under a job that read it before.
        for (i, error, ms) in [(4, "HTTP 500", 6), (5, "HTTP 429", 7)] {
            let next = failure(&rows[i], error, 3, ms);
            let out = store.register_failure(&rows[i], &next).await.unwrap();
            assert_eq!(out, Outcome::Applied(next.clone()));
            expected[i] = next;
        }

        // 2. A success after a failure keeps the attempts and the error
        //    (row 2); a second failure (row 3); a single-row success (row
        //    4); the stale job's writes of row 5 are refused and change
        //    nothing: the job gives the row up. One attempt logged of two.
        let sents = [
            Step::new(&expected[2], success(&expected[2], 20)),
            Step::new(&rows[5], success(&rows[5], 21)),
        ];
        let log = [log_of(&sents[0], 200)];
        let out = mark_sent_many(&store, &sents, &log).await.unwrap();
        assert_eq!(out[&expected[2].id], Sent::Applied { sent_at: at(20) });
        assert_eq!(
            out[&rows[5].id],
            Sent::Conflict(Box::new(expected[5].clone()))
        );
        let fails = [
            Step::new(&expected[3], failure(&expected[3], "HTTP 502", 3, 22)),
            Step::new(&rows[5], failure(&rows[5], "HTTP 500", 3, 23)),
        ];
        let out = register_failure_many(&store, &fails, &[]).await.unwrap();
        assert_eq!(
            out[&expected[3].id],
            Outcome::Applied(fails[0].next.clone())
        );
        assert_eq!(
            out[&rows[5].id],
            Outcome::Conflict(expected[5].clone()),
            "a write computed from a stale read"
        );
        expected[2] = sents[0].next.clone();
        expected[3] = fails[0].next.clone();
        let next = success(&expected[4], 24);
        let out = store.mark_sent(&expected[4], &next).await.unwrap();
        assert_eq!(out, Outcome::Applied(next.clone()));
        expected[4] = next;

        // 3. The failure at the limit (row 3: 2 → 3, failed).
        let fails = [Step::new(
            &expected[3],
            failure(&expected[3], "HTTP 504", 3, 40),
        )];
        applied_all(
            &register_failure_many(&store, &fails, &[]).await.unwrap(),
            &fails,
        );
        expected[3] = fails[0].next.clone();
        assert_eq!(
            (expected[3].status, expected[6].status),
            (Status::Failed, Status::Failed)
        );

        // 4. Resends: one (row 3), then every failed row (row 6). The store
        //    stamps their time; the rest is what `transition` says.
        let caller = Caller::new(Via::Cli, None);
        let resent = store.retry(expected[3].id, &caller).await.unwrap().unwrap();
        assert_eq!(
            resent,
            transition::after_resend(&expected[3], resent.updated_at)
        );
        assert_eq!(store.retry_all_failed(None, &caller).await.unwrap(), 1);
        for i in [3, 6] {
            let found = store.get(expected[i].id).await.unwrap().unwrap();
            assert_eq!(
                found,
                transition::after_resend(&expected[i], found.updated_at)
            );
            expected[i] = found;
        }

        // 5. The resent rows fail again, at fixed instants: a first failure
        //    (row 3), and at once at the limit of one (row 6).
        let fails = [
            Step::new(&expected[3], failure(&expected[3], "HTTP 503 again", 3, 60)),
            Step::new(&expected[6], failure(&expected[6], "timeout again", 1, 61)),
        ];
        applied_all(
            &register_failure_many(&store, &fails, &[]).await.unwrap(),
            &fails,
        );
        expected[3] = fails[0].next.clone();
        expected[6] = fails[1].next.clone();

        let mut stored = Vec::new();
        for row in &rows {
            stored.push(store.get(row.id).await.unwrap().unwrap());
        }
        (stored, expected)
    }

    #[tokio::test]
    async fn postgresql_mariadb_and_sqlite_write_the_same_rows() {
        let mut seen = Vec::new();
        for backend in [Backend::Postgres, Backend::MySql, Backend::Sqlite] {
            let (stored, expected) = outcomes_on(backend).await;
            assert_eq!(
                states(&stored),
                states(&expected),
                "{backend:?} writes the rows transition computed"
            );
            seen.push((backend, states(&stored)));
        }
        let (first, rows) = &seen[0];
        for (backend, other) in &seen[1..] {
            assert_eq!(rows, other, "{first:?} and {backend:?}");
        }
        // The outcomes the scenario is made of.
        let summary: Vec<(Status, i32)> = rows.iter().map(|s| (s.1, s.2)).collect();
        assert_eq!(
            summary,
            [
                (Status::Sent, 0),
                (Status::Sent, 0),
                (Status::Sent, 1),
                (Status::Pending, 1),
                (Status::Sent, 1),
                (Status::Pending, 1),
                (Status::Failed, 1),
            ]
        );
    }
}
