//! Batched `mark_sent`: the one write every successful event needs, made
//! for many rows in one statement so the sidecar is not capped by one
//! transaction (one fsync) per event.
//!
//! Jobs hand their row to [`SentWriter::mark_sent`] and wait for the answer;
//! the writer task collects what arrives within a short window (or up to
//! [`MAX_BATCH`] rows) and issues one conditional UPDATE for all of them.
//! Each row keeps its own condition (`id`, `status = 'pending'`,
//! `attempts`), so the result per row is exactly [`Store::mark_sent`]'s.

use std::collections::HashMap;
use std::time::Duration;

use entity::outbox_event::Column;
use entity::{OutboxEventRow, Status};
use sea_orm::sea_query::{Alias, Cond, Expr, ExprTrait, Query};
use sea_orm::ConnectionTrait;
use tokio::sync::{mpsc, oneshot};

use super::{now, Outcome, Store, StoreError};

/// Rows per statement.
pub const MAX_BATCH: usize = 256;
/// How long the first row of a batch waits for company.
pub const WINDOW: Duration = Duration::from_millis(2);

type Reply = oneshot::Sender<Result<Outcome, StoreError>>;

#[derive(Clone)]
pub struct SentWriter {
    tx: mpsc::Sender<(OutboxEventRow, Reply)>,
}

impl SentWriter {
    /// Starts the writer task; it ends when every handle is dropped.
    pub fn spawn(store: Store) -> SentWriter {
        let (tx, rx) = mpsc::channel(MAX_BATCH * 4);
        tokio::spawn(run(store, rx));
        SentWriter { tx }
    }

    /// As [`Store::mark_sent`], batched with other jobs' writes.
    pub async fn mark_sent(&self, row: &OutboxEventRow) -> Result<Outcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        let closed = || StoreError::Database {
            action: "marking an event sent",
            source: sea_orm::DbErr::Custom("the status writer has stopped".into()),
        };
        self.tx
            .send((row.clone(), reply))
            .await
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

async fn run(store: Store, mut rx: mpsc::Receiver<(OutboxEventRow, Reply)>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + WINDOW;
        while batch.len() < MAX_BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(item)) => batch.push(item),
                _ => break,
            }
        }
        let rows: Vec<OutboxEventRow> = batch.iter().map(|(r, _)| r.clone()).collect();
        match mark_sent_many(&store, &rows).await {
            Ok(mut outcomes) => {
                for (row, reply) in batch {
                    let outcome = outcomes
                        .remove(&row.id)
                        .unwrap_or(Outcome::NotFound(row.id));
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
}

/// One conditional UPDATE for all `rows`, then one read to tell the rows
/// it applied to (their `sent_at` is this batch's timestamp) from conflicts.
pub async fn mark_sent_many(
    store: &Store,
    rows: &[OutboxEventRow],
) -> Result<HashMap<i64, Outcome>, StoreError> {
    let now = now();
    let mut which = Cond::any();
    for r in rows {
        which = which.add(
            Cond::all()
                .add(Expr::col(Column::Id).eq(r.id))
                .add(Expr::col(Column::Attempts).eq(r.attempts)),
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
        .and_where(Expr::col(Column::Id).is_in(rows.iter().map(|r| r.id)))
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
    let mut outcomes = HashMap::with_capacity(rows.len());
    if res.rows_affected() as usize == rows.len() {
        for r in rows {
            let mut sent = r.clone();
            sent.status = Status::Sent;
            sent.sent_at = Some(now);
            sent.updated_at = now;
            outcomes.insert(r.id, Outcome::Applied(sent));
        }
        return Ok(outcomes);
    }
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    for found in store.get_many(&ids).await? {
        let ours = found.status == Status::Sent && found.sent_at == Some(now);
        let outcome = if ours {
            Outcome::Applied(found.clone())
        } else {
            Outcome::Conflict(found.clone())
        };
        outcomes.insert(found.id, outcome);
    }
    for id in ids {
        outcomes.entry(id).or_insert(Outcome::NotFound(id));
    }
    Ok(outcomes)
}
