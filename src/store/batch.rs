//! Batched status writes: `mark_sent` (every successful event) and
//! `register_failure` (every failed attempt), made for many rows in one
//! statement so the sidecar is not capped by one transaction (one fsync)
//! per event, and failing rows do not slow the rest down.
//!
//! Jobs hand their write to [`StatusWriter`] and wait for the answer; the
//! writer task collects what arrives within a short window (or up to
//! [`MAX_BATCH`] writes) and issues one conditional UPDATE per kind of
//! write. Each row keeps its own condition (`id`, `status = 'pending'`,
//! `attempts`), so the result per row is that of [`Store::mark_sent`]
//! (as [`Sent`]: an applied write hands back no copy of the row) or of
//! [`Store::register_failure`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use entity::outbox_event::Column;
use entity::{OutboxEventRow, Status};
use sea_orm::sea_query::{Alias, Cond, Expr, ExprTrait, Query};
use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::history::{self, Attempt};
use super::{db_err, failure_values, now, Outcome, RowRead, Store, StoreError};

/// Writes per batch (of both kinds together).
pub const MAX_BATCH: usize = 256;
/// How long the first write of a batch waits for company.
pub const WINDOW: Duration = Duration::from_millis(2);
/// Batches written at once: one statement's commit (an fsync) overlaps
/// the next batch's gathering and execution.
pub const CONCURRENT_STATEMENTS: usize = 4;

/// How long one batch's statements may take before the batch is dropped.
pub const STATEMENT_DEADLINE: Duration = Duration::from_secs(15);

const SENT_ACTION: &str = "marking events sent";
const FAILURE_ACTION: &str = "registering failures";

/// What a batched `mark_sent` found for one row: as [`Outcome`], without
/// copying rows that the write applied to (the job has them already).
#[derive(Debug, Clone, PartialEq)]
pub enum Sent {
    /// The row is now `sent`, at this time.
    Applied {
        sent_at: chrono::NaiveDateTime,
    },
    /// The row was not `pending` with the expected attempts; as found.
    Conflict(OutboxEventRow),
    NotFound(i64),
}

/// The condition of one row's write: its id and the attempts it had when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub id: i64,
    pub attempts: i32,
}

impl From<&OutboxEventRow> for Key {
    fn from(row: &OutboxEventRow) -> Self {
        Key {
            id: row.id,
            attempts: row.attempts,
        }
    }
}

/// One failed attempt to register: the row as the job read it and the error.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub seen: OutboxEventRow,
    pub error: String,
}

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

enum Request {
    Sent(Key, Option<Attempt>, Reply<Sent>),
    Failure(Failure, Option<Attempt>, Reply<Outcome>),
}

/// The batching writer shared by all jobs; cheap to clone.
#[derive(Clone)]
pub struct StatusWriter {
    tx: mpsc::Sender<Request>,
}

impl StatusWriter {
    /// Starts the writer task; it ends when every handle is dropped.
    /// `max_attempts`: the failure that reaches it makes a row `failed`.
    pub fn spawn(store: Store, max_attempts: i32) -> StatusWriter {
        Self::spawn_counting(store, max_attempts, None)
    }

    /// [`StatusWriter::spawn`], counting attempt-log rows the database
    /// refused in `log_failures`.
    pub fn spawn_counting(
        store: Store,
        max_attempts: i32,
        log_failures: Option<prometheus::IntCounter>,
    ) -> StatusWriter {
        let (tx, rx) = mpsc::channel(MAX_BATCH * 4);
        let log = Arc::new(LogHealth {
            failures: log_failures,
            off_until: std::sync::Mutex::new(None),
        });
        tokio::spawn(run(store, max_attempts, log, rx));
        StatusWriter { tx }
    }

    /// As [`Store::mark_sent`], batched with other jobs' writes; with the
    /// attempt log on, `attempt` is recorded in the same write.
    pub async fn mark_sent(
        &self,
        row: &OutboxEventRow,
        attempt: Option<&Attempt>,
    ) -> Result<Sent, StoreError> {
        let (reply, answer) = oneshot::channel();
        let request = Request::Sent(Key::from(row), attempt.cloned(), reply);
        self.ask(request, answer, SENT_ACTION).await
    }

    /// As [`Store::register_failure`], batched with other jobs' writes;
    /// with the attempt log on, `attempt` is recorded in the same write.
    pub async fn register_failure(
        &self,
        row: &OutboxEventRow,
        error: &str,
        attempt: Option<&Attempt>,
    ) -> Result<Outcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        let failure = Failure {
            seen: row.clone(),
            error: error.to_owned(),
        };
        let request = Request::Failure(failure, attempt.cloned(), reply);
        self.ask(request, answer, FAILURE_ACTION).await
    }

    async fn ask<T>(
        &self,
        request: Request,
        answer: oneshot::Receiver<Result<T, StoreError>>,
        action: &'static str,
    ) -> Result<T, StoreError> {
        let closed = || {
            db_err(action)(sea_orm::DbErr::Custom(
                "the status writer has stopped".into(),
            ))
        };
        self.tx.send(request).await.map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

/// Single-row reads batched across jobs: the re-read each job makes before
/// a later attempt. Jobs that wake from their retry wait together (a burst
/// of failures) share one query instead of one round trip each.
#[derive(Clone)]
pub struct RowReader {
    tx: mpsc::Sender<(i64, Reply<Option<RowRead>>)>,
}

impl RowReader {
    /// Starts the reader task; it ends when every handle is dropped.
    pub fn spawn(store: Store) -> RowReader {
        let (tx, mut rx) = mpsc::channel::<(i64, Reply<Option<RowRead>>)>(MAX_BATCH * 4);
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let batch = gather(&mut rx, first).await;
                let ids: Vec<i64> = batch.iter().map(|(id, _)| *id).collect();
                let read = tokio::time::timeout(STATEMENT_DEADLINE, store.read_rows(&ids)).await;
                match read {
                    Ok(Ok(rows)) => {
                        let mut rows: HashMap<i64, RowRead> =
                            rows.into_iter().map(|r| (r.id(), r)).collect();
                        for (id, reply) in batch {
                            let _ = reply.send(Ok(rows.remove(&id)));
                        }
                    }
                    Ok(Err(e)) => {
                        let message = e.to_string();
                        for (_, reply) in batch {
                            let source = sea_orm::DbErr::Custom(message.clone());
                            let _ = reply.send(Err(db_err("reading events")(source)));
                        }
                    }
                    // Dropping the replies tells each job the read failed.
                    Err(_) => {
                        tracing::warn!(deadline = ?STATEMENT_DEADLINE, "a row read did not answer in time")
                    }
                }
            }
        });
        RowReader { tx }
    }

    /// Row `id` as it is now (`None`: no such row), read with other jobs'.
    pub async fn get(&self, id: i64) -> Result<Option<RowRead>, StoreError> {
        let (reply, answer) = oneshot::channel();
        let closed = || {
            db_err("reading events")(sea_orm::DbErr::Custom("the row reader has stopped".into()))
        };
        self.tx.send((id, reply)).await.map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

/// `first` and what else arrives within [`WINDOW`], up to [`MAX_BATCH`].
async fn gather<T>(rx: &mut mpsc::Receiver<T>, first: T) -> Vec<T> {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    batch.push(first);
    // One timer per batch; what is already queued is taken without one.
    let window = tokio::time::sleep(WINDOW);
    tokio::pin!(window);
    while batch.len() < MAX_BATCH {
        if let Ok(item) = rx.try_recv() {
            batch.push(item);
            continue;
        }
        tokio::select! {
            biased;
            item = rx.recv() => match item {
                Some(item) => batch.push(item),
                None => break,
            },
            _ = &mut window => break,
        }
    }
    batch
}

/// How long the attempt log is left alone after the database refused its
/// rows before a write tries it again.
pub const LOG_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The attempt log's health as the writer sees it. The status is the
/// truth and the log its shadow: when the database refuses the log's rows
/// for good (its table renamed or dropped, a privilege revoked, no
/// partition for the day), statuses are written without them, counted,
/// and the log is tried again after [`LOG_RETRY_AFTER`].
struct LogHealth {
    failures: Option<prometheus::IntCounter>,
    off_until: std::sync::Mutex<Option<std::time::Instant>>,
}

impl LogHealth {
    /// Whether to write the log with this batch.
    fn on(&self) -> bool {
        let mut off = self.off_until.lock().unwrap_or_else(|e| e.into_inner());
        match *off {
            Some(until) if std::time::Instant::now() < until => false,
            Some(_) => {
                *off = None;
                true
            }
            None => true,
        }
    }

    /// `rows` attempt-log rows not written.
    fn dropped(&self, rows: usize) {
        if let Some(c) = &self.failures {
            c.inc_by(rows as u64);
        }
    }

    /// The database refused the log's rows: off for a while.
    fn refused(&self, store: &Store, rows: usize, error: &StoreError) {
        self.dropped(rows);
        let table = store
            .history_table()
            .map(|h| h.table.as_str())
            .unwrap_or("");
        tracing::warn!(
            table,
            rows,
            error = %error,
            retry_in = ?LOG_RETRY_AFTER,
            "the attempt log refused its rows; statuses are written without them"
        );
        *self.off_until.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(std::time::Instant::now() + LOG_RETRY_AFTER);
    }
}

/// Whether `result` is a refusal that the attempt log may have caused.
fn log_suspect<T>(result: &Result<T, StoreError>, log: &[Attempt]) -> bool {
    !log.is_empty() && result.as_ref().is_err_and(|e| !e.is_transient())
}

async fn run(
    store: Store,
    max_attempts: i32,
    log: Arc<LogHealth>,
    mut rx: mpsc::Receiver<Request>,
) {
    let statements = Arc::new(Semaphore::new(CONCURRENT_STATEMENTS));
    while let Some(first) = rx.recv().await {
        let batch = gather(&mut rx, first).await;
        // While this batch's statements run, the next batch gathers; at
        // most CONCURRENT_STATEMENTS batches run at once (rows of different
        // batches are distinct: a job waits for its own answer).
        let Ok(permit) = statements.clone().acquire_owned().await else {
            return;
        };
        let store = store.clone();
        let log = log.clone();
        tokio::spawn(async move {
            // A connection that stops answering mid-statement (no reset,
            // no keepalive) would hold these jobs for ever: past the
            // deadline the batch is dropped, each job gets an error and
            // writes again (finding its own write if it did commit).
            if tokio::time::timeout(
                STATEMENT_DEADLINE,
                write_batch(&store, max_attempts, &log, batch),
            )
            .await
            .is_err()
            {
                tracing::warn!(deadline = ?STATEMENT_DEADLINE, "a status write did not answer in time; its jobs write again");
            }
            drop(permit);
        });
    }
}

async fn write_batch(store: &Store, max_attempts: i32, log: &LogHealth, batch: Vec<Request>) {
    let (mut keys, mut sent_replies, mut sent_log) = (Vec::new(), Vec::new(), Vec::new());
    let (mut failures, mut failure_replies, mut failure_log) = (Vec::new(), Vec::new(), Vec::new());
    for request in batch {
        match request {
            Request::Sent(key, attempt, reply) => {
                keys.push(key);
                sent_replies.push(reply);
                sent_log.extend(attempt);
            }
            Request::Failure(failure, attempt, reply) => {
                failures.push(failure);
                failure_replies.push(reply);
                failure_log.extend(attempt);
            }
        }
    }
    let own = |log: &[Attempt], id: i64| -> Vec<Attempt> {
        log.iter().filter(|a| a.event_id == id).cloned().collect()
    };
    if !log.on() {
        log.dropped(sent_log.len() + failure_log.len());
        sent_log.clear();
        failure_log.clear();
    }
    // One after the other: a batch holds one pool connection at a time.
    if !keys.is_empty() {
        let result = sent_then_alone(store, &keys, &mut sent_log, log).await;
        if refused_batch(&result, keys.len()) {
            // One row the database refuses must not fail its neighbours:
            // each row alone, each job its own answer.
            for (key, reply) in keys.into_iter().zip(sent_replies) {
                let result = sent_then_alone(store, &[key], &mut own(&sent_log, key.id), log).await;
                answer(std::iter::once(key.id), vec![reply], result, Sent::NotFound);
            }
        } else {
            let ids = keys.iter().map(|k| k.id);
            answer(ids, sent_replies, result, Sent::NotFound);
        }
    }
    if !failures.is_empty() {
        let result =
            failures_then_alone(store, &failures, max_attempts, &mut failure_log, log).await;
        if refused_batch(&result, failures.len()) {
            for (failure, reply) in failures.into_iter().zip(failure_replies) {
                let id = failure.seen.id;
                let result = failures_then_alone(
                    store,
                    std::slice::from_ref(&failure),
                    max_attempts,
                    &mut own(&failure_log, id),
                    log,
                )
                .await;
                answer(std::iter::once(id), vec![reply], result, Outcome::NotFound);
            }
        } else {
            let ids = failures.iter().map(|f| f.seen.id);
            answer(ids, failure_replies, result, Outcome::NotFound);
        }
    }
}

/// [`mark_sent_many`] with the attempt log; when the database refuses
/// that for good, again without it (`attempts` emptied): a delivery never
/// fails for its log row.
async fn sent_then_alone(
    store: &Store,
    keys: &[Key],
    attempts: &mut Vec<Attempt>,
    log: &LogHealth,
) -> Result<HashMap<i64, Sent>, StoreError> {
    let result = mark_sent_many(store, keys, attempts).await;
    if !log_suspect(&result, attempts) {
        return result;
    }
    let alone = mark_sent_many(store, keys, &[]).await;
    if let (Ok(_), Err(e)) = (&alone, &result) {
        log.refused(store, attempts.len(), e);
        attempts.clear();
    }
    alone
}

/// [`register_failure_many`], likewise.
async fn failures_then_alone(
    store: &Store,
    failures: &[Failure],
    max_attempts: i32,
    attempts: &mut Vec<Attempt>,
    log: &LogHealth,
) -> Result<HashMap<i64, Outcome>, StoreError> {
    let result = register_failure_many(store, failures, max_attempts, attempts).await;
    if !log_suspect(&result, attempts) {
        return result;
    }
    let alone = register_failure_many(store, failures, max_attempts, &[]).await;
    if let (Ok(_), Err(e)) = (&alone, &result) {
        log.refused(store, attempts.len(), e);
        attempts.clear();
    }
    alone
}

/// A batch of several rows that the database refused for what it holds:
/// which row it was, only writing them one by one tells.
fn refused_batch<T>(result: &Result<T, StoreError>, rows: usize) -> bool {
    rows > 1 && result.as_ref().is_err_and(|e| !e.is_transient())
}

/// Hands each job (`ids` and `replies` in the same order) its row's
/// outcome, or the batch's error.
fn answer<T: Clone>(
    ids: impl Iterator<Item = i64>,
    replies: Vec<Reply<T>>,
    result: Result<HashMap<i64, T>, StoreError>,
    missing: impl Fn(i64) -> T,
) {
    match result {
        Ok(outcomes) => {
            for (id, reply) in ids.zip(replies) {
                // (ids are distinct in a batch: a job waits for its answer
                // before it writes again; were one there twice, both writes
                // would get the row's outcome)
                let outcome = outcomes.get(&id).cloned().unwrap_or_else(|| missing(id));
                let _ = reply.send(Ok(outcome));
            }
        }
        Err(e) => {
            let message = e.to_string();
            let action = match &e {
                StoreError::Database { action, .. } | StoreError::Refused { action, .. } => action,
                StoreError::Connect { .. } => "connecting to the database",
                StoreError::Interrupted { .. } => "writing statuses",
            };
            let transient = e.is_transient();
            for reply in replies {
                let error = if transient {
                    db_err(action)(sea_orm::DbErr::Custom(message.clone()))
                } else {
                    StoreError::Refused {
                        action,
                        message: message.clone(),
                    }
                };
                let _ = reply.send(Err(error));
            }
        }
    }
}

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
