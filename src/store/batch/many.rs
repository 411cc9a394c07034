//! The statements of a batch: one conditional UPDATE for many rows (on
//! PostgreSQL joined with `unnest` of arrays, `RETURNING` the rows it
//! applied to; elsewhere conditions per row), the attempt-log rows of the
//! rows it applied to in the same statement or transaction, and the rows
//! it did not apply to read back and reported as found.

use std::collections::{HashMap, HashSet};

use entity::outbox_event::Column;
use entity::{OutboxEventRow, Status};
use sea_orm::sea_query::{Alias, Cond, Expr, ExprTrait, Query};
use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};

use super::{Failure, Key, Sent, FAILURE_ACTION, SENT_ACTION};
use crate::store::history::{self, Attempt};
use crate::store::write::failure_values;
use crate::store::{db_err, now, Outcome, Store, StoreError};

/// The table name for raw SQL: a validated identifier (config), quoted anyway.
fn quoted_table(store: &Store) -> String {
    format!("\"{}\"", store.table().replace('"', "\"\""))
}

/// Which rows a batch write applied to, as far as the write itself tells.
enum Applied {
    /// All of them.
    All,
    /// These (PostgreSQL's `RETURNING`, or counted statement by statement).
    Ids(HashSet<i64>),
    /// Not all; which ones only a read can tell.
    Unknown,
}

/// Runs an `UPDATE … RETURNING t.id` and collects the ids.
async fn returned_ids(
    store: &Store,
    stmt: Statement,
    action: &'static str,
) -> Result<HashSet<i64>, StoreError> {
    let rows = store
        .connection()
        .query_all_raw(stmt)
        .await
        .map_err(db_err(action))?;
    rows.iter()
        // Every such statement returns the id first.
        .map(|r| r.try_get_by_index::<i64>(0).map_err(db_err(action)))
        .collect()
}

/// One conditional UPDATE for all `keys` (ids distinct); the rows it did
/// not apply to are read back and reported as found (conflicts, missing).
///
/// On PostgreSQL the keys are two array parameters joined with `unnest`,
/// so one statement shape serves every batch size (prepared once per
/// connection), and `RETURNING` names the rows it applied to. Elsewhere an
/// `OR` of per-row conditions; when it did not apply to every row, all are
/// read back and those `sent` at this batch's timestamp are taken as ours.
pub async fn mark_sent_many(
    store: &Store,
    keys: &[Key],
    log: &[Attempt],
) -> Result<HashMap<i64, Sent>, StoreError> {
    let now = now();
    let backend = store.backend();
    let ids: Vec<i64> = keys.iter().map(|k| k.id).collect();
    let history = store.history_table().filter(|_| !log.is_empty());
    let applied = if backend == DbBackend::Postgres {
        let table = quoted_table(store);
        let attempts: Vec<i32> = keys.iter().map(|k| k.attempts).collect();
        let update = format!(
            "UPDATE {table} AS t SET status = $1, sent_at = $2, updated_at = $2 \
             FROM unnest($3::bigint[], $4::integer[]) AS k(id, attempts) \
             WHERE t.id = k.id AND t.attempts = k.attempts AND t.status = $5 \
             RETURNING t.id"
        );
        let mut values: Vec<sea_orm::Value> = vec![
            Status::Sent.as_str().into(),
            now.into(),
            ids.clone().into(),
            attempts.into(),
            Status::Pending.as_str().into(),
        ];
        // Each key's attempt, when every key has one (with the log on, a
        // job always hands one in).
        let by_id: HashMap<i64, &Attempt> = log.iter().map(|a| (a.event_id, a)).collect();
        let aligned: Option<Vec<&Attempt>> =
            history.and_then(|_| keys.iter().map(|k| by_id.get(&k.id).copied()).collect());
        let sql = match (history, aligned) {
            // The attempts ride in the UPDATE's own `unnest` and come back
            // through `RETURNING` into the INSERT: only the rows the UPDATE
            // applied to are logged, in the same statement (on record
            // exactly when their status is), without a second `unnest`
            // and a join to find them (the log's cost per row in
            // PostgreSQL: benches/RESULTS.md).
            (Some(h), Some(aligned)) => {
                values.extend(history::columns(aligned.iter().copied()));
                values.push("success".into());
                values.push(h.replica.clone().into());
                format!(
                    "WITH u AS (UPDATE {table} AS t SET status = $1, sent_at = $2, updated_at = $2 \
                     FROM unnest($3::bigint[], $4::integer[], $6::integer[], $7::timestamp[], \
                     $8::integer[], $9::integer[], $10::text[]) \
                     AS k(id, attempts, attempt, started_at, duration_ms, http_status, detail) \
                     WHERE t.id = k.id AND t.attempts = k.attempts AND t.status = $5 \
                     RETURNING t.id, k.attempt, k.started_at, k.duration_ms, k.http_status, k.detail), \
                     h AS (INSERT INTO {log_table} (event_id, kind, attempt, started_at, duration_ms, \
                     outcome, http_status, detail, replica) \
                     SELECT id, 'attempt', attempt, started_at, duration_ms, $11, \
                     NULLIF(http_status, 0), NULLIF(detail, ''), $12 FROM u) \
                     SELECT id FROM u",
                    log_table = history::quoted(&h.table),
                )
            }
            // The attempts of the rows the UPDATE applied to, in the same
            // statement, matched by id.
            (Some(h), None) => {
                let (cte, more) = h.pg_cte(log, "success", values.len() + 1);
                values.extend(more);
                format!("WITH u AS ({update}){cte} SELECT id FROM u")
            }
            (None, _) => update,
        };
        let stmt = Statement::from_sql_and_values(backend, sql, values);
        Applied::Ids(returned_ids(store, stmt, SENT_ACTION).await?)
    } else {
        let mut which = Cond::any();
        for k in keys {
            which = which.add(
                Cond::all()
                    .add(Expr::col(Column::Id).eq(k.id))
                    .add(Expr::col(Column::Attempts).eq(k.attempts)),
            );
        }
        let update = Query::update()
            .table(Alias::new(store.table()))
            .value(Column::Status, Status::Sent.as_str())
            .value(Column::SentAt, now)
            .value(Column::UpdatedAt, now)
            .and_where(Expr::col(Column::Status).eq(Status::Pending.as_str()))
            // Redundant with `which`, but lets the planner use the primary
            // key instead of evaluating the OR over the table.
            .and_where(Expr::col(Column::Id).is_in(keys.iter().map(|k| k.id)))
            .cond_where(which)
            .to_owned();
        match history {
            None => {
                let res = store
                    .connection()
                    .execute_raw(backend.build(&update))
                    .await
                    .map_err(db_err(SENT_ACTION))?;
                if res.rows_affected() as usize == keys.len() {
                    Applied::All
                } else {
                    Applied::Unknown
                }
            }
            Some(h) => {
                // The UPDATE and the attempts of the rows it applied to, in
                // one transaction.
                let txn = store
                    .connection()
                    .begin()
                    .await
                    .map_err(db_err(SENT_ACTION))?;
                let res = txn
                    .execute_raw(backend.build(&update))
                    .await
                    .map_err(db_err(SENT_ACTION))?;
                let (txn, ours): (_, HashSet<i64>) = if res.rows_affected() as usize == keys.len() {
                    (txn, ids.iter().copied().collect())
                } else {
                    // Which ones: without RETURNING, only one UPDATE per
                    // row tells exactly (reading `sent_at` back would
                    // compare a `datetime(0)` or `timestamp` column's
                    // whole seconds with this batch's microseconds).
                    txn.rollback().await.map_err(db_err(SENT_ACTION))?;
                    let txn = store
                        .connection()
                        .begin()
                        .await
                        .map_err(db_err(SENT_ACTION))?;
                    let mut ours = HashSet::with_capacity(keys.len());
                    for k in keys {
                        let one = Query::update()
                            .table(Alias::new(store.table()))
                            .value(Column::Status, Status::Sent.as_str())
                            .value(Column::SentAt, now)
                            .value(Column::UpdatedAt, now)
                            .and_where(Expr::col(Column::Status).eq(Status::Pending.as_str()))
                            .and_where(Expr::col(Column::Id).eq(k.id))
                            .and_where(Expr::col(Column::Attempts).eq(k.attempts))
                            .to_owned();
                        let res = txn
                            .execute_raw(backend.build(&one))
                            .await
                            .map_err(db_err(SENT_ACTION))?;
                        if res.rows_affected() == 1 {
                            ours.insert(k.id);
                        }
                    }
                    (txn, ours)
                };
                let mine: Vec<&Attempt> =
                    log.iter().filter(|a| ours.contains(&a.event_id)).collect();
                if let Some(insert) = h.insert_attempts(backend, &mine, "success") {
                    txn.execute_raw(insert).await.map_err(db_err(SENT_ACTION))?;
                }
                txn.commit().await.map_err(db_err(SENT_ACTION))?;
                Applied::Ids(ours)
            }
        }
    };
    read_back(
        store,
        &ids,
        applied,
        |_| Sent::Applied { sent_at: now },
        |found| {
            if found.status == Status::Sent && found.sent_at == Some(now) {
                Sent::Applied { sent_at: now }
            } else {
                Sent::Conflict(found)
            }
        },
        Sent::NotFound,
    )
    .await
}

/// `register_failure` for many rows (ids distinct): each row gets one more
/// attempt, its error and its next status, only while it is still as its
/// job read it; the rows it did not apply to are read back and reported as
/// found.
///
/// On PostgreSQL one UPDATE joined with `unnest` of four arrays (id,
/// attempts, next status, error), `RETURNING` the rows it applied to.
/// Elsewhere one conditional UPDATE per row, all in one transaction (one
/// commit for the batch).
pub async fn register_failure_many(
    store: &Store,
    failures: &[Failure],
    max_attempts: i32,
    log: &[Attempt],
) -> Result<HashMap<i64, Outcome>, StoreError> {
    let history = store.history_table().filter(|_| !log.is_empty());
    let now = now();
    let nexts: HashMap<i64, OutboxEventRow> = failures
        .iter()
        .map(|f| {
            (
                f.seen.id,
                store.after_failure(&f.seen, &f.error, now, max_attempts),
            )
        })
        .collect();
    let ids: Vec<i64> = failures.iter().map(|f| f.seen.id).collect();
    let applied = if store.backend() == DbBackend::Postgres {
        let table = quoted_table(store);
        let attempts: Vec<i32> = failures.iter().map(|f| f.seen.attempts).collect();
        let statuses: Vec<String> = ids
            .iter()
            .map(|id| nexts[id].status.as_str().to_owned())
            .collect();
        let errors: Vec<String> = ids
            .iter()
            .map(|id| nexts[id].last_error.clone().unwrap_or_default())
            .collect();
        let update = format!(
            "UPDATE {table} AS t SET status = k.status, attempts = k.attempts + 1, \
             last_error = k.error, updated_at = $1 \
             FROM unnest($2::bigint[], $3::integer[], $4::text[], $5::text[]) \
             AS k(id, attempts, status, error) \
             WHERE t.id = k.id AND t.attempts = k.attempts AND t.status = $6 \
             RETURNING t.id"
        );
        let mut values: Vec<sea_orm::Value> = vec![
            now.into(),
            ids.clone().into(),
            attempts.into(),
            statuses.into(),
            errors.into(),
            Status::Pending.as_str().into(),
        ];
        let sql = match history {
            Some(h) => {
                let (cte, more) = h.pg_cte(log, "failure", values.len() + 1);
                values.extend(more);
                format!("WITH u AS ({update}){cte} SELECT id FROM u")
            }
            None => update,
        };
        let stmt = Statement::from_sql_and_values(DbBackend::Postgres, sql, values);
        returned_ids(store, stmt, FAILURE_ACTION).await?
    } else {
        let txn = store
            .connection()
            .begin()
            .await
            .map_err(db_err(FAILURE_ACTION))?;
        let mut applied = HashSet::with_capacity(failures.len());
        for f in failures {
            let stmt = store.step_statement(&f.seen, failure_values(&nexts[&f.seen.id]));
            let res = txn.execute(&stmt).await.map_err(db_err(FAILURE_ACTION))?;
            if res.rows_affected() == 1 {
                applied.insert(f.seen.id);
            }
        }
        if let Some(h) = history {
            let mine: Vec<&Attempt> = log
                .iter()
                .filter(|a| applied.contains(&a.event_id))
                .collect();
            if let Some(insert) = h.insert_attempts(store.backend(), &mine, "failure") {
                txn.execute_raw(insert)
                    .await
                    .map_err(db_err(FAILURE_ACTION))?;
            }
        }
        txn.commit().await.map_err(db_err(FAILURE_ACTION))?;
        applied
    };
    read_back(
        store,
        &ids,
        Applied::Ids(applied),
        |id| Outcome::Applied(nexts[&id].clone()),
        // Not applied by this batch: whatever is there is someone else's.
        Outcome::Conflict,
        Outcome::NotFound,
    )
    .await
}

/// Each id's outcome: `ours(id)` for the rows the write applied to; the
/// others are read back and judged as found, `missing(id)` where there is
/// no row. With [`Applied::Unknown`] every row is read back and judged.
async fn read_back<T>(
    store: &Store,
    ids: &[i64],
    applied: Applied,
    ours: impl Fn(i64) -> T,
    judge: impl Fn(OutboxEventRow) -> T,
    missing: impl Fn(i64) -> T,
) -> Result<HashMap<i64, T>, StoreError> {
    let (applied_ids, to_read): (Vec<i64>, Vec<i64>) = match &applied {
        Applied::All => (ids.to_vec(), Vec::new()),
        Applied::Ids(set) => ids.iter().partition(|id| set.contains(id)),
        Applied::Unknown => (Vec::new(), ids.to_vec()),
    };
    let mut outcomes: HashMap<i64, T> = applied_ids.into_iter().map(|id| (id, ours(id))).collect();
    if to_read.is_empty() {
        return Ok(outcomes);
    }
    for found in store.get_many(&to_read).await? {
        outcomes.insert(found.id, judge(found));
    }
    for id in to_read {
        outcomes.entry(id).or_insert_with(|| missing(id));
    }
    Ok(outcomes)
}
