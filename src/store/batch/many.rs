//! The statements of a batch: one conditional UPDATE for many rows (on
//! PostgreSQL joined with `unnest` of arrays, `RETURNING` the rows it
//! applied to; elsewhere conditions per row), the attempt-log rows of the
//! rows it applied to in the same statement or transaction, and the rows
//! it did not apply to read back and reported as found.

use std::collections::{HashMap, HashSet};

use entity::outbox_event::Column;
use entity::{OutboxEventRow, Status};
use sea_orm::sea_query::{Alias, CaseStatement, Cond, Expr, ExprTrait, Query};
use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait, Value};

use super::{Sent, Step, FAILURE_ACTION, SENT_ACTION};
use crate::store::history::{self, Attempt};
use crate::store::write::{failure_values, sent_values};
use crate::store::{db_err, Outcome, Store, StoreError};

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

/// The parameters of one raw PostgreSQL statement, numbered as they are
/// added.
#[derive(Default)]
struct Params(Vec<Value>);

impl Params {
    /// Adds `value`; its placeholder (`$n`).
    fn add(&mut self, value: impl Into<Value>) -> String {
        self.0.push(value.into());
        format!("${}", self.0.len())
    }

    /// Adds one column of `steps` as an array parameter; its placeholder.
    fn column<T>(&mut self, steps: &[Step], column: impl Fn(&Step) -> T) -> String
    where
        Vec<T>: Into<Value>,
    {
        self.add(steps.iter().map(column).collect::<Vec<T>>())
    }
}

/// `column`'s new value for each of `steps`, in one UPDATE of them all:
/// the value itself when every step has the same (a success's status),
/// else a `CASE` on the id.
fn per_row(steps: &[Step], column: impl Fn(&Step) -> Value) -> Expr {
    let values: Vec<Value> = steps.iter().map(&column).collect();
    if let Some(first) = values.first() {
        if values.iter().all(|v| v == first) {
            return Expr::val(first.clone());
        }
    }
    let mut case = CaseStatement::new();
    for (step, value) in steps.iter().zip(values) {
        case = case.case(Expr::col(Column::Id).eq(step.seen.id), Expr::val(value));
    }
    case.into()
}

/// The next row's `sent_at` (a success always has one).
fn sent_at(step: &Step) -> chrono::NaiveDateTime {
    step.next.sent_at.unwrap_or(step.next.updated_at)
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

/// One conditional UPDATE for all `steps` (ids distinct), each row given
/// its `next` status, `sent_at` and `updated_at`; the rows it did not
/// apply to are read back and reported as found (conflicts, missing).
///
/// On PostgreSQL the steps are array parameters joined with `unnest`, so
/// one statement shape serves every batch size (prepared once per
/// connection), and `RETURNING` names the rows it applied to. Elsewhere an
/// `OR` of per-row conditions, the timestamps by a `CASE` on the id; when
/// it did not apply to every row, all are read back and those that are
/// `sent` at their step's `sent_at` are taken as ours.
pub async fn mark_sent_many(
    store: &Store,
    steps: &[Step],
    log: &[Attempt],
) -> Result<HashMap<i64, Sent>, StoreError> {
    let backend = store.backend();
    let ids: Vec<i64> = steps.iter().map(|s| s.seen.id).collect();
    let history = store.history_table().filter(|_| !log.is_empty());
    let applied = if backend == DbBackend::Postgres {
        let table = quoted_table(store);
        let mut p = Params::default();
        let k_id = p.column(steps, |s| s.seen.id);
        let k_attempts = p.column(steps, |s| s.seen.attempts);
        let k_status = p.column(steps, |s| s.next.status.as_str().to_owned());
        let k_sent_at = p.column(steps, sent_at);
        let k_updated_at = p.column(steps, |s| s.next.updated_at);
        let pending = p.add(Status::Pending.as_str());
        let set = "SET status = k.status, sent_at = k.sent_at, updated_at = k.updated_at";
        let keys = format!(
            "{k_id}::bigint[], {k_attempts}::integer[], {k_status}::text[], \
             {k_sent_at}::timestamp[], {k_updated_at}::timestamp[]"
        );
        let names = "id, attempts, status, sent_at, updated_at";
        let which = format!("t.id = k.id AND t.attempts = k.attempts AND t.status = {pending}");
        // Each step's attempt, when every step has one (with the log on, a
        // job always hands one in).
        let by_id: HashMap<i64, &Attempt> = log.iter().map(|a| (a.event_id, a)).collect();
        let aligned: Option<Vec<&Attempt>> = history.and_then(|_| {
            steps
                .iter()
                .map(|s| by_id.get(&s.seen.id).copied())
                .collect()
        });
        let sql = match (history, aligned) {
            // The attempts ride in the UPDATE's own `unnest` and come back
            // through `RETURNING` into the INSERT: only the rows the UPDATE
            // applied to are logged, in the same statement (on record
            // exactly when their status is), without a second `unnest`
            // and a join to find them (the log's cost per row in
            // PostgreSQL: benches/RESULTS.md).
            (Some(h), Some(aligned)) => {
                let [attempt, started_at, duration_ms, http_status, detail] =
                    history::columns(aligned.iter().copied()).map(|v| p.add(v));
                let outcome = p.add("success");
                let replica = p.add(h.replica.clone());
                let traces = h
                    .trace_ids
                    .then(|| p.add(history::trace_ids(aligned.iter().copied())));
                let [trace_col, trace_arg, trace_alias, trace_val] = h.trace_sql(traces.as_deref());
                let trace_ret = if traces.is_some() { ", k.trace_id" } else { "" };
                format!(
                    "WITH u AS (UPDATE {table} AS t {set} \
                     FROM unnest({keys}, {attempt}::integer[], {started_at}::timestamp[], \
                     {duration_ms}::integer[], {http_status}::integer[], {detail}::text[]{trace_arg}) \
                     AS k({names}, attempt, started_at, duration_ms, http_status, detail{trace_alias}) \
                     WHERE {which} \
                     RETURNING t.id, k.attempt, k.started_at, k.duration_ms, k.http_status, k.detail{trace_ret}), \
                     h AS (INSERT INTO {log_table} (event_id, kind, attempt, started_at, duration_ms, \
                     outcome, http_status, detail, replica{trace_col}) \
                     SELECT id, 'attempt', attempt, started_at, duration_ms, {outcome}, \
                     NULLIF(http_status, 0), NULLIF(detail, ''), {replica}{trace_val} FROM u) \
                     SELECT id FROM u",
                    log_table = history::quoted(&h.table),
                )
            }
            // The attempts of the rows the UPDATE applied to, in the same
            // statement, matched by id.
            (Some(h), None) => {
                let (cte, more) = h.pg_cte(log, "success", p.0.len() + 1);
                p.0.extend(more);
                format!(
                    "WITH u AS (UPDATE {table} AS t {set} FROM unnest({keys}) AS k({names}) \
                     WHERE {which} RETURNING t.id){cte} SELECT id FROM u"
                )
            }
            (None, _) => format!(
                "UPDATE {table} AS t {set} FROM unnest({keys}) AS k({names}) \
                 WHERE {which} RETURNING t.id"
            ),
        };
        let stmt = Statement::from_sql_and_values(backend, sql, p.0);
        Applied::Ids(returned_ids(store, stmt, SENT_ACTION).await?)
    } else {
        let mut which = Cond::any();
        for s in steps {
            which = which.add(
                Cond::all()
                    .add(Expr::col(Column::Id).eq(s.seen.id))
                    .add(Expr::col(Column::Attempts).eq(s.seen.attempts)),
            );
        }
        let update = Query::update()
            .table(Alias::new(store.table()))
            .value(
                Column::Status,
                per_row(steps, |s| s.next.status.as_str().into()),
            )
            .value(Column::SentAt, per_row(steps, |s| sent_at(s).into()))
            .value(
                Column::UpdatedAt,
                per_row(steps, |s| s.next.updated_at.into()),
            )
            .and_where(Expr::col(Column::Status).eq(Status::Pending.as_str()))
            // Redundant with `which`, but lets the planner use the primary
            // key instead of evaluating the OR over the table.
            .and_where(Expr::col(Column::Id).is_in(ids.iter().copied()))
            .cond_where(which)
            .to_owned();
        match history {
            None => {
                let res = store
                    .connection()
                    .execute_raw(backend.build(&update))
                    .await
                    .map_err(db_err(SENT_ACTION))?;
                if res.rows_affected() as usize == steps.len() {
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
                let (txn, ours): (_, HashSet<i64>) = if res.rows_affected() as usize == steps.len()
                {
                    (txn, ids.iter().copied().collect())
                } else {
                    // Which ones: without RETURNING, only one UPDATE per
                    // row tells exactly (reading `sent_at` back would
                    // compare a `datetime(0)` or `timestamp` column's
                    // whole seconds with the step's microseconds).
                    txn.rollback().await.map_err(db_err(SENT_ACTION))?;
                    let txn = store
                        .connection()
                        .begin()
                        .await
                        .map_err(db_err(SENT_ACTION))?;
                    let mut ours = HashSet::with_capacity(steps.len());
                    for s in steps {
                        let one = store.step_statement(s.seen, sent_values(&s.next));
                        let res = txn.execute(&one).await.map_err(db_err(SENT_ACTION))?;
                        if res.rows_affected() == 1 {
                            ours.insert(s.seen.id);
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
    let sent: HashMap<i64, chrono::NaiveDateTime> =
        steps.iter().map(|s| (s.seen.id, sent_at(s))).collect();
    read_back(
        store,
        &ids,
        applied,
        |id| Sent::Applied { sent_at: sent[&id] },
        |found| match sent.get(&found.id) {
            Some(&at) if found.status == Status::Sent && found.sent_at == Some(at) => {
                Sent::Applied { sent_at: at }
            }
            _ => Sent::Conflict(Box::new(found)),
        },
        Sent::NotFound,
    )
    .await
}

/// `register_failure` for many rows (ids distinct): each row gets its
/// `next` status, attempts, error and `updated_at`, only while it is still
/// as its job read it; the rows it did not apply to are read back and
/// reported as found.
///
/// On PostgreSQL one UPDATE joined with `unnest` of arrays (the condition's
/// id and attempts, the next row's columns), `RETURNING` the rows it
/// applied to. Elsewhere one conditional UPDATE per row, all in one
/// transaction (one commit for the batch).
pub async fn register_failure_many(
    store: &Store,
    steps: &[Step],
    log: &[Attempt],
) -> Result<HashMap<i64, Outcome>, StoreError> {
    let history = store.history_table().filter(|_| !log.is_empty());
    let ids: Vec<i64> = steps.iter().map(|s| s.seen.id).collect();
    let applied = if store.backend() == DbBackend::Postgres {
        let table = quoted_table(store);
        let mut p = Params::default();
        let k_id = p.column(steps, |s| s.seen.id);
        let k_attempts = p.column(steps, |s| s.seen.attempts);
        let k_status = p.column(steps, |s| s.next.status.as_str().to_owned());
        let k_next_attempts = p.column(steps, |s| s.next.attempts);
        let k_error = p.column(steps, |s| s.next.last_error.clone().unwrap_or_default());
        let k_updated_at = p.column(steps, |s| s.next.updated_at);
        let pending = p.add(Status::Pending.as_str());
        let update = format!(
            "UPDATE {table} AS t SET status = k.status, attempts = k.next_attempts, \
             last_error = k.error, updated_at = k.updated_at \
             FROM unnest({k_id}::bigint[], {k_attempts}::integer[], {k_status}::text[], \
             {k_next_attempts}::integer[], {k_error}::text[], {k_updated_at}::timestamp[]) \
             AS k(id, attempts, status, next_attempts, error, updated_at) \
             WHERE t.id = k.id AND t.attempts = k.attempts AND t.status = {pending} \
             RETURNING t.id"
        );
        let sql = match history {
            Some(h) => {
                let (cte, more) = h.pg_cte(log, "failure", p.0.len() + 1);
                p.0.extend(more);
                format!("WITH u AS ({update}){cte} SELECT id FROM u")
            }
            None => update,
        };
        let stmt = Statement::from_sql_and_values(DbBackend::Postgres, sql, p.0);
        returned_ids(store, stmt, FAILURE_ACTION).await?
    } else {
        let txn = store
            .connection()
            .begin()
            .await
            .map_err(db_err(FAILURE_ACTION))?;
        let mut applied = HashSet::with_capacity(steps.len());
        for s in steps {
            let stmt = store.step_statement(s.seen, failure_values(&s.next));
            let res = txn.execute(&stmt).await.map_err(db_err(FAILURE_ACTION))?;
            if res.rows_affected() == 1 {
                applied.insert(s.seen.id);
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
    let nexts: HashMap<i64, &OutboxEventRow> = steps.iter().map(|s| (s.seen.id, &s.next)).collect();
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
