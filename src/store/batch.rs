//! Batched `mark_sent`: the one write every successful event needs, made
//! for many rows in one statement so the sidecar is not capped by one
//! transaction (one fsync) per event.
//!
//! Jobs hand their row to [`SentWriter::mark_sent`] and wait for the answer;
//! the writer task collects what arrives within a short window (or up to
//! [`MAX_BATCH`] rows) and issues one conditional UPDATE for all of them.
//! Each row keeps its own condition (`id`, `status = 'pending'`,
//! `attempts`), so the result per row is that of [`Store::mark_sent`]
//! (as [`Sent`]: an applied write hands back no copy of the row).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use entity::outbox_event::Column;
use entity::{OutboxEventRow, Status};
use sea_orm::sea_query::{Alias, Cond, Expr, ExprTrait, Query};
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::{now, Store, StoreError};

/// Rows per statement.
pub const MAX_BATCH: usize = 256;
/// How long the first row of a batch waits for company.
pub const WINDOW: Duration = Duration::from_millis(2);
/// Batches written at once: one statement's commit (an fsync) overlaps
/// the next batch's gathering and execution.
pub const CONCURRENT_STATEMENTS: usize = 4;

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

type Reply = oneshot::Sender<Result<Sent, StoreError>>;

#[derive(Clone)]
pub struct SentWriter {
    tx: mpsc::Sender<(Key, Reply)>,
}

impl SentWriter {
    /// Starts the writer task; it ends when every handle is dropped.
    pub fn spawn(store: Store) -> SentWriter {
        let (tx, rx) = mpsc::channel(MAX_BATCH * 4);
        tokio::spawn(run(store, rx));
        SentWriter { tx }
    }

    /// As [`Store::mark_sent`], batched with other jobs' writes.
    pub async fn mark_sent(&self, row: &OutboxEventRow) -> Result<Sent, StoreError> {
        let (reply, answer) = oneshot::channel();
        let closed = || StoreError::Database {
            action: "marking an event sent",
            source: sea_orm::DbErr::Custom("the status writer has stopped".into()),
        };
        self.tx
            .send((Key::from(row), reply))
            .await
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

async fn run(store: Store, mut rx: mpsc::Receiver<(Key, Reply)>) {
    let statements = Arc::new(Semaphore::new(CONCURRENT_STATEMENTS));
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + WINDOW;
        while batch.len() < MAX_BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(item)) => batch.push(item),
                _ => break,
            }
        }
        // While this batch's statement runs, the next batch gathers; at
        // most CONCURRENT_STATEMENTS run at once (rows of different
        // batches are distinct: a job waits for its own answer).
        let Ok(permit) = statements.clone().acquire_owned().await else {
            return;
        };
        let store = store.clone();
        tokio::spawn(async move {
            write_batch(&store, batch).await;
            drop(permit);
        });
    }
}

async fn write_batch(store: &Store, batch: Vec<(Key, Reply)>) {
    let keys: Vec<Key> = batch.iter().map(|(k, _)| *k).collect();
    match mark_sent_many(store, &keys).await {
        Ok(mut outcomes) => {
            for (key, reply) in batch {
                let outcome = outcomes.remove(&key.id).unwrap_or(Sent::NotFound(key.id));
                let _ = reply.send(Ok(outcome));
            }
        }
        Err(e) => {
            let message = e.to_string();
            for (_, reply) in batch {
                let _ = reply.send(Err(StoreError::Database {
                    action: "marking events sent",
                    source: sea_orm::DbErr::Custom(message.clone()),
                }));
            }
        }
    }
}

/// One conditional UPDATE for all `keys` (ids distinct), then, only when
/// it did not apply to all of them, one read to tell the rows it applied to
/// (their `sent_at` is this batch's timestamp) from conflicts.
pub async fn mark_sent_many(store: &Store, keys: &[Key]) -> Result<HashMap<i64, Sent>, StoreError> {
    let now = now();
    if store.backend() == DbBackend::Postgres {
        return mark_sent_many_pg(store, keys, now).await;
    }
    let mut which = Cond::any();
    for k in keys {
        which = which.add(
            Cond::all()
                .add(Expr::col(Column::Id).eq(k.id))
                .add(Expr::col(Column::Attempts).eq(k.attempts)),
        );
    }
    let stmt = Query::update()
        .table(Alias::new(store.table()))
        .value(Column::Status, Status::Sent.as_str())
        .value(Column::SentAt, now)
        .value(Column::UpdatedAt, now)
        .and_where(Expr::col(Column::Status).eq(Status::Pending.as_str()))
        // Redundant with `which`, but lets the planner use the primary key
        // instead of evaluating the OR over the table.
        .and_where(Expr::col(Column::Id).is_in(keys.iter().map(|k| k.id)))
        .cond_where(which)
        .to_owned();
    let res = store
        .connection()
        .execute(&stmt)
        .await
        .map_err(|source| StoreError::Database {
            action: "marking events sent",
            source,
        })?;
    outcomes(store, keys, now, res.rows_affected()).await
}

/// PostgreSQL: the keys as two array parameters joined with `unnest`, so
/// one statement shape serves every batch size (prepared once per
/// connection) instead of a new `OR` of conditions per size.
async fn mark_sent_many_pg(
    store: &Store,
    keys: &[Key],
    now: chrono::NaiveDateTime,
) -> Result<HashMap<i64, Sent>, StoreError> {
    // The table name is a validated identifier (config), quoted anyway.
    let table = format!("\"{}\"", store.table().replace('"', "\"\""));
    let sql = format!(
        "UPDATE {table} AS t SET status = $1, sent_at = $2, updated_at = $2 \
         FROM unnest($3::bigint[], $4::integer[]) AS k(id, attempts) \
         WHERE t.id = k.id AND t.attempts = k.attempts AND t.status = $5"
    );
    let ids: Vec<i64> = keys.iter().map(|k| k.id).collect();
    let attempts: Vec<i32> = keys.iter().map(|k| k.attempts).collect();
    let stmt = Statement::from_sql_and_values(
        DbBackend::Postgres,
        sql,
        [
            Status::Sent.as_str().into(),
            now.into(),
            ids.into(),
            attempts.into(),
            Status::Pending.as_str().into(),
        ],
    );
    let res = store
        .connection()
        .execute_raw(stmt)
        .await
        .map_err(|source| StoreError::Database {
            action: "marking events sent",
            source,
        })?;
    outcomes(store, keys, now, res.rows_affected()).await
}

/// Each key's outcome: all applied when the statement changed as many rows
/// as it had keys; otherwise read back to tell ours (sent at `now`) from
/// conflicts.
async fn outcomes(
    store: &Store,
    keys: &[Key],
    now: chrono::NaiveDateTime,
    rows_affected: u64,
) -> Result<HashMap<i64, Sent>, StoreError> {
    let mut outcomes = HashMap::with_capacity(keys.len());
    if rows_affected as usize == keys.len() {
        for k in keys {
            outcomes.insert(k.id, Sent::Applied { sent_at: now });
        }
        return Ok(outcomes);
    }
    let ids: Vec<i64> = keys.iter().map(|k| k.id).collect();
    for found in store.get_many(&ids).await? {
        let id = found.id;
        let outcome = if found.status == Status::Sent && found.sent_at == Some(now) {
            Sent::Applied { sent_at: now }
        } else {
            Sent::Conflict(found)
        };
        outcomes.insert(id, outcome);
    }
    for id in ids {
        outcomes.entry(id).or_insert(Sent::NotFound(id));
    }
    Ok(outcomes)
}
