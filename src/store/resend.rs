//! R-004 `retry!` (ActiveAdmin's "Reenviar"), one row or many: `failed` →
//! `pending` with 0 attempts and no error, recorded in the attempt log
//! with who asked; and the filters of a bulk resend.

use chrono::NaiveDateTime;
use entity::outbox_event::Column;
use entity::{OutboxEventRow, Status};
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Func, Order, Query, UpdateStatement};
use sea_orm::{ConnectionTrait, DbBackend, TransactionTrait};

use super::{db_err, history, now, Store, StoreError};
use crate::transition;

/// Rows a bulk resend takes per transaction (with the attempt log on).
pub const RESEND_CHUNK: u64 = 1000;

/// Why a resend was not applied.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RetryRefused {
    #[error("event {0} not found")]
    NotFound(i64),
    #[error("event {id} is {status}: only failed events can be resent")]
    NotFailed { id: i64, status: Status },
}

/// Which failed rows a bulk resend takes (every filter given must hold):
/// the morning after an outage, "the ones of this API, failed since 02:00,
/// whose error says 503".
#[derive(Debug, Clone, Default)]
pub struct FailedFilter {
    /// Of these event names (one `--event-name`, or a dispatcher's).
    pub event_names: Option<Vec<String>>,
    /// `last_error` contains this text (case-sensitive, no wildcards).
    pub error_contains: Option<String>,
    /// Failed at or after (`updated_at` of the failed row), UTC.
    pub failed_since: Option<NaiveDateTime>,
    /// Failed before, UTC.
    pub failed_until: Option<NaiveDateTime>,
}

impl Store {
    /// The resend's write: `failed` → `pending`, 0 attempts, no error.
    fn resend_statement(&self) -> UpdateStatement {
        self.resend_statement_at(now())
    }

    /// The columns [`transition::after_resend`] sets, at `now`: the same
    /// for every failed row, so one UPDATE resends many.
    fn resend_statement_at(&self, now: NaiveDateTime) -> UpdateStatement {
        Query::update()
            .table(self.tbl())
            .value(Column::Status, Status::Pending.as_str())
            .value(Column::Attempts, 0)
            .value(Column::LastError, Option::<String>::None)
            .value(Column::UpdatedAt, now)
            .and_where(Expr::col(Column::Status).eq(Status::Failed.as_str()))
            .to_owned()
    }

    /// R-004 `retry!` (ActiveAdmin's "Reenviar"): `failed` → `pending` with
    /// 0 attempts and no error. Any other status is refused. With the
    /// attempt log on, the resend is recorded (who asked: `caller`) in the
    /// same transaction.
    ///
    /// The row returned is the one the resend wrote: read back afterwards,
    /// the sidecar may already have sent it.
    pub async fn retry(
        &self,
        id: i64,
        caller: &history::Caller,
    ) -> Result<Result<OutboxEventRow, RetryRefused>, StoreError> {
        let Some(before) = self.get(id).await? else {
            return Ok(Err(RetryRefused::NotFound(id)));
        };
        let now = now();
        let stmt = self
            .resend_statement_at(now)
            .and_where(Expr::col(Column::Id).eq(id))
            .to_owned();
        let action = "resending an event";
        let txn = self.db.begin().await.map_err(db_err(action))?;
        let res = txn.execute(&stmt).await.map_err(db_err(action))?;
        if res.rows_affected() == 1 {
            if let Some(insert) = self
                .history
                .as_ref()
                .and_then(|h| h.insert_resends(self.backend(), &[id], now, caller))
            {
                txn.execute_raw(insert).await.map_err(db_err(action))?;
            }
            txn.commit().await.map_err(db_err(action))?;
            return Ok(Ok(transition::after_resend(&before, now)));
        }
        txn.rollback().await.map_err(db_err(action))?;
        Ok(match self.get(id).await? {
            None => Err(RetryRefused::NotFound(id)),
            Some(row) => Err(RetryRefused::NotFailed {
                id,
                status: row.status,
            }),
        })
    }

    /// Resends every failed event (optionally of one `event_name`); returns
    /// how many rows went back to pending.
    pub async fn retry_all_failed(
        &self,
        event_name: Option<&str>,
        caller: &history::Caller,
    ) -> Result<u64, StoreError> {
        let filter = FailedFilter {
            event_names: event_name.map(|n| vec![n.to_owned()]),
            ..FailedFilter::default()
        };
        self.retry_failed(&filter, caller).await
    }

    /// Resends the failed events `filter` selects; returns how many rows
    /// went back to pending. Without the attempt log, one UPDATE; with it,
    /// [`RESEND_CHUNK`] rows per transaction (newest first), each resend
    /// recorded with its row.
    pub async fn retry_failed(
        &self,
        filter: &FailedFilter,
        caller: &history::Caller,
    ) -> Result<u64, StoreError> {
        self.retry_failed_with_progress(filter, caller, &mut |_| {})
            .await
    }

    /// [`Store::retry_failed`], calling `progress` with the running total
    /// after each committed chunk.
    pub async fn retry_failed_with_progress(
        &self,
        filter: &FailedFilter,
        caller: &history::Caller,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<u64, StoreError> {
        let action = "resending failed events";
        let Some(h) = self.history.clone() else {
            let mut stmt = self.resend_statement();
            for cond in self.failed_conditions(filter) {
                stmt.and_where(cond);
            }
            let res = self.db.execute(&stmt).await.map_err(db_err(action))?;
            progress(res.rows_affected());
            return Ok(res.rows_affected());
        };
        let backend = self.backend();
        let mut total = 0;
        let mut below: Option<i64> = None;
        loop {
            let txn = self.db.begin().await.map_err(db_err(action))?;
            let mut pick = Query::select()
                .column(Column::Id)
                .from(self.tbl())
                .and_where(Expr::col(Column::Status).eq(Status::Failed.as_str()))
                .order_by(Column::Id, Order::Desc)
                .limit(RESEND_CHUNK)
                .to_owned();
            for cond in self.failed_conditions(filter) {
                pick.and_where(cond);
            }
            if let Some(below) = below {
                pick.and_where(Expr::col(Column::Id).lt(below));
            }
            if backend != DbBackend::Sqlite {
                pick.lock(sea_orm::sea_query::LockType::Update);
            }
            let ids: Vec<i64> = txn
                .query_all(&pick)
                .await
                .map_err(db_err(action))?
                .iter()
                .map(|r| r.try_get::<i64>("", "id"))
                .collect::<Result<_, _>>()
                .map_err(db_err(action))?;
            let Some(&lowest) = ids.iter().min() else {
                txn.rollback().await.map_err(db_err(action))?;
                return Ok(total);
            };
            let now = now();
            let stmt = self
                .resend_statement_at(now)
                .and_where(Expr::col(Column::Id).is_in(ids.iter().copied()))
                .to_owned();
            let res = txn.execute(&stmt).await.map_err(db_err(action))?;
            if let Some(insert) = h.insert_resends(backend, &ids, now, caller) {
                txn.execute_raw(insert).await.map_err(db_err(action))?;
            }
            txn.commit().await.map_err(db_err(action))?;
            total += res.rows_affected();
            progress(total);
            if (ids.len() as u64) < RESEND_CHUNK {
                return Ok(total);
            }
            below = Some(lowest);
        }
    }

    /// What [`Store::retry_failed`] would take, without changing anything:
    /// how many rows, and the newest `sample` of them.
    pub async fn preview_failed(
        &self,
        filter: &FailedFilter,
        sample: u64,
    ) -> Result<(u64, Vec<OutboxEventRow>), StoreError> {
        let mut count = Query::select()
            .expr_as(Func::count(Expr::col(Column::Id)), Alias::new("n"))
            .from(self.tbl())
            .and_where(Expr::col(Column::Status).eq(Status::Failed.as_str()))
            .to_owned();
        let mut rows = self
            .select_rows()
            .and_where(Expr::col(Column::Status).eq(Status::Failed.as_str()))
            .order_by(Column::Id, Order::Desc)
            .limit(sample)
            .to_owned();
        for cond in self.failed_conditions(filter) {
            count.and_where(cond.clone());
            rows.and_where(cond);
        }
        let n: i64 = self
            .db
            .query_one(&count)
            .await
            .map_err(db_err("counting failed events"))?
            .map(|r| r.try_get("", "n"))
            .transpose()
            .map_err(db_err("counting failed events"))?
            .unwrap_or(0);
        let sample = self
            .fetch(&rows)
            .await
            .map_err(db_err("listing failed events"))?;
        Ok((u64::try_from(n).unwrap_or(0), sample))
    }

    pub(super) fn failed_conditions(
        &self,
        f: &FailedFilter,
    ) -> Vec<sea_orm::sea_query::SimpleExpr> {
        let mut out = Vec::new();
        if let Some(names) = &f.event_names {
            out.push(Expr::col(Column::EventName).is_in(names.iter().map(String::as_str)));
        }
        if let Some(text) = &f.error_contains {
            let sql = match self.backend() {
                DbBackend::Postgres => "strpos(last_error, $1) > 0",
                DbBackend::MySql => "LOCATE(?, last_error) > 0",
                _ => "instr(last_error, ?) > 0",
            };
            out.push(Expr::cust_with_values(sql, [text.clone()]));
        }
        if let Some(since) = f.failed_since {
            out.push(Expr::col(Column::UpdatedAt).gte(since));
        }
        if let Some(until) = f.failed_until {
            out.push(Expr::col(Column::UpdatedAt).lt(until));
        }
        out
    }
}
