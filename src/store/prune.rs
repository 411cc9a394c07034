//! `events prune --sent-older-than`: deleting old `sent` rows and their
//! attempt-log rows in committed batches, never a pending or failed row.

use std::time::Duration;

use chrono::NaiveDateTime;
use entity::outbox_event::Column;
use entity::Status;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Order, Query, SelectStatement};
use sea_orm::{ConnectionTrait, DbBackend, TransactionTrait};

use super::{db_err, history, now, Store, StoreError};

/// Sent rows `events prune --sent-older-than` deletes per transaction.
pub const PRUNE_BATCH: u64 = 1000;

/// What one batch of [`Store::prune_sent_batch`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Rows of the outbox table.
    pub events: u64,
    /// Their rows in the attempt log.
    pub log_rows: u64,
}

impl Store {
    /// The cut-off of `--sent-older-than`: rows sent before it go.
    pub fn sent_cutoff(older_than: Duration) -> NaiveDateTime {
        let age = chrono::Duration::from_std(older_than).unwrap_or(chrono::Duration::MAX);
        now().checked_sub_signed(age).unwrap_or(NaiveDateTime::MIN)
    }

    /// Up to `limit` ids of rows `sent` before `cutoff`, above `after`, in
    /// id order: the selection of one prune batch. Walking the primary key
    /// from where the last batch ended keeps every batch a short range read.
    pub async fn select_sent_before(
        &self,
        cutoff: NaiveDateTime,
        after: Option<i64>,
        limit: u64,
    ) -> Result<Vec<i64>, StoreError> {
        let mut select = Query::select()
            .column(Column::Id)
            .from(self.tbl())
            .and_where(Expr::col(Column::Status).eq(Status::Sent.as_str()))
            .and_where(Expr::col(Column::SentAt).lt(cutoff))
            .order_by(Column::Id, Order::Asc)
            .limit(limit)
            .to_owned();
        if let Some(after) = after {
            select.and_where(Expr::col(Column::Id).gt(after));
        }
        let err = || db_err("finding old sent events");
        self.db
            .query_all(&select)
            .await
            .map_err(err())?
            .iter()
            .map(|r| r.try_get_by_index::<i64>(0))
            .collect::<Result<_, _>>()
            .map_err(err())
    }

    /// Deletes, of `ids`, the rows that are still `sent` before `cutoff`
    /// (a row sent again since it was selected, or put back to pending,
    /// stays), with their attempt-log rows, in one transaction.
    pub async fn prune_sent_batch(
        &self,
        ids: &[i64],
        cutoff: NaiveDateTime,
    ) -> Result<Pruned, StoreError> {
        if ids.is_empty() {
            return Ok(Pruned::default());
        }
        let action = "deleting old sent events";
        if self.backend() == DbBackend::Postgres {
            let t = self.quoted_table();
            // One statement: the log rows go for exactly the rows deleted.
            let log = match &self.history {
                Some(h) => format!(
                    ", h AS (DELETE FROM {} WHERE event_id IN (SELECT id FROM d) RETURNING 1) \
                     SELECT (SELECT count(*) FROM d) AS n, (SELECT count(*) FROM h) AS logs",
                    history::quoted(&h.table)
                ),
                None => " SELECT count(*) AS n, CAST(0 AS bigint) AS logs FROM d".to_owned(),
            };
            let sql = format!(
                "WITH d AS (DELETE FROM {t} WHERE id = ANY($1) AND status = 'sent' \
                 AND sent_at < $2 RETURNING id){log}"
            );
            let stmt = sea_orm::Statement::from_sql_and_values(
                DbBackend::Postgres,
                sql,
                [ids.to_vec().into(), cutoff.into()],
            );
            let row = self.db.query_one_raw(stmt).await.map_err(db_err(action))?;
            let get = |col: &str| -> Result<u64, StoreError> {
                let n: i64 = match &row {
                    Some(r) => r.try_get("", col).map_err(db_err(action))?,
                    None => 0,
                };
                Ok(u64::try_from(n).unwrap_or(0))
            };
            return Ok(Pruned {
                events: get("n")?,
                log_rows: get("logs")?,
            });
        }
        let still_old = |stmt: &mut SelectStatement| {
            stmt.and_where(Expr::col(Column::Id).is_in(ids.iter().copied()))
                .and_where(Expr::col(Column::Status).eq(Status::Sent.as_str()))
                .and_where(Expr::col(Column::SentAt).lt(cutoff));
        };
        let txn = self.db.begin().await.map_err(db_err(action))?;
        let mut pick = Query::select()
            .column(Column::Id)
            .from(self.tbl())
            .to_owned();
        still_old(&mut pick);
        if self.backend() != DbBackend::Sqlite {
            pick.lock(sea_orm::sea_query::LockType::Update);
        }
        let gone: Vec<i64> = txn
            .query_all(&pick)
            .await
            .map_err(db_err(action))?
            .iter()
            .map(|r| r.try_get_by_index::<i64>(0))
            .collect::<Result<_, _>>()
            .map_err(db_err(action))?;
        if gone.is_empty() {
            txn.rollback().await.map_err(db_err(action))?;
            return Ok(Pruned::default());
        }
        let mut pruned = Pruned::default();
        if let Some(h) = &self.history {
            let delete = Query::delete()
                .from_table(Alias::new(&h.table))
                .and_where(Expr::col(Alias::new("event_id")).is_in(gone.iter().copied()))
                .to_owned();
            pruned.log_rows = txn
                .execute(&delete)
                .await
                .map_err(db_err(action))?
                .rows_affected();
        }
        let delete = Query::delete()
            .from_table(self.tbl())
            .and_where(Expr::col(Column::Id).is_in(gone.iter().copied()))
            .and_where(Expr::col(Column::Status).eq(Status::Sent.as_str()))
            .and_where(Expr::col(Column::SentAt).lt(cutoff))
            .to_owned();
        pruned.events = txn
            .execute(&delete)
            .await
            .map_err(db_err(action))?
            .rows_affected();
        txn.commit().await.map_err(db_err(action))?;
        Ok(pruned)
    }

    /// `events prune --sent-older-than`: deletes the rows `sent` before
    /// `cutoff` and their attempt-log rows, `batch` rows per transaction,
    /// each committed before the next is selected; never a pending or
    /// failed row. With `dry_run`, counts them and deletes nothing.
    /// `progress` gets the running total after each batch. On an error the
    /// rows deleted so far are in [`StoreError::Interrupted`]; running it
    /// again carries on.
    pub async fn prune_sent(
        &self,
        cutoff: NaiveDateTime,
        batch: u64,
        dry_run: bool,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<Pruned, StoreError> {
        let batch = std::cmp::max(batch, 1);
        let mut total = Pruned::default();
        let mut after = None;
        let interrupted = |done: u64, source: StoreError| StoreError::Interrupted {
            done,
            source: Box::new(source),
        };
        loop {
            let ids = self
                .select_sent_before(cutoff, after, batch)
                .await
                .map_err(|e| interrupted(total.events, e))?;
            let Some(&last) = ids.last() else {
                return Ok(total);
            };
            if dry_run {
                total.events += ids.len() as u64;
            } else {
                let pruned = self
                    .prune_sent_batch(&ids, cutoff)
                    .await
                    .map_err(|e| interrupted(total.events, e))?;
                total.events += pruned.events;
                total.log_rows += pruned.log_rows;
            }
            progress(total.events);
            if (ids.len() as u64) < batch {
                return Ok(total);
            }
            after = Some(last);
        }
    }
}
