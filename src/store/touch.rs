//! Announcing pending rows again through the change feed (`events
//! retrigger`, a resumed dispatcher, a breaker's probe): a touch of
//! `updated_at` that changes no status and no attempts, in committed
//! batches.

use std::time::Duration;

use chrono::NaiveDateTime;
use entity::outbox_event::Column;
use entity::Status;
use sea_orm::sea_query::{Expr, ExprTrait, Order, Query, SelectStatement};
use sea_orm::{ConnectionTrait, DbBackend};

use super::{db_err, now, Store, StoreError};

/// Rows one touch (retrigger, resume) changes per statement.
pub const TOUCH_BATCH: u64 = 1000;

/// Which pending rows `events retrigger` touches: these ids, or those
/// unchanged for longer than `older_than`; optionally of one event name.
#[derive(Debug, Clone, Default)]
pub struct RetriggerFilter {
    pub ids: Vec<i64>,
    pub older_than: Option<Duration>,
    pub event_name: Option<String>,
}

impl Store {
    /// Touches pending rows so the change feed announces them again: the
    /// remedy for change events that are gone (an offset reset, a
    /// recreated connector). Changes no status and no attempts; returns
    /// how many rows it touched. With neither ids nor `older_than` it
    /// touches nothing. Done in batches (see [`Store::touch_pending`]).
    pub async fn retrigger(&self, filter: &RetriggerFilter) -> Result<u64, StoreError> {
        self.retrigger_with_progress(filter, &mut |_| {}).await
    }

    /// [`Store::retrigger`], calling `progress` with the running total
    /// after each committed batch.
    pub async fn retrigger_with_progress(
        &self,
        filter: &RetriggerFilter,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<u64, StoreError> {
        let mut conds = Vec::new();
        match (&filter.ids[..], filter.older_than) {
            ([], None) => return Ok(0),
            ([], Some(age)) => {
                let age = chrono::Duration::from_std(age).unwrap_or(chrono::Duration::MAX);
                let before = now().checked_sub_signed(age).unwrap_or(NaiveDateTime::MIN);
                conds.push(Expr::col(Column::UpdatedAt).lt(before));
            }
            (ids, _) => {
                conds.push(Expr::col(Column::Id).is_in(ids.iter().copied()));
            }
        }
        if let Some(name) = &filter.event_name {
            conds.push(Expr::col(Column::EventName).eq(name.as_str()));
        }
        self.touch_pending(conds, progress).await
    }

    /// Touches every pending row of `event_names` (a resumed dispatcher's)
    /// so the change feed announces them again; returns how many.
    pub async fn retrigger_pending_of(
        &self,
        event_names: &[String],
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<u64, StoreError> {
        if event_names.is_empty() {
            return Ok(0);
        }
        let cond = Expr::col(Column::EventName).is_in(event_names.iter().map(String::as_str));
        self.touch_pending(vec![cond], progress).await
    }

    /// Touches one pending row so the change feed announces it again: of
    /// `ids`, the pending one with the fewest attempts, else the oldest
    /// pending row of `event_names`. Which one it touched; `None` when none is pending.
    pub async fn touch_one_pending(
        &self,
        ids: &[i64],
        event_names: &[String],
    ) -> Result<Option<i64>, StoreError> {
        let mut select = Query::select()
            .column(Column::Id)
            .from(self.tbl())
            .and_where(Expr::col(Column::Status).eq(Status::Pending.as_str()))
            .order_by(Column::Id, Order::Asc)
            .limit(1)
            .to_owned();
        if !ids.is_empty() {
            // The one with the most attempts left: a probe's failure
            // counts, and no row should spend its last on a probe.
            let by_id = Query::select()
                .column(Column::Id)
                .from(self.tbl())
                .and_where(Expr::col(Column::Status).eq(Status::Pending.as_str()))
                .and_where(Expr::col(Column::Id).is_in(ids.iter().copied()))
                .order_by(Column::Attempts, Order::Asc)
                .order_by(Column::Id, Order::Asc)
                .limit(1)
                .to_owned();
            if let Some(id) = self.first_id(&by_id).await? {
                return self.touch_ids(&[id]).await.map(|n| (n > 0).then_some(id));
            }
        }
        if event_names.is_empty() {
            return Ok(None);
        }
        select
            .and_where(Expr::col(Column::EventName).is_in(event_names.iter().map(String::as_str)));
        match self.first_id(&select).await? {
            Some(id) => self.touch_ids(&[id]).await.map(|n| (n > 0).then_some(id)),
            None => Ok(None),
        }
    }

    async fn first_id(&self, select: &SelectStatement) -> Result<Option<i64>, StoreError> {
        self.db
            .query_one(select)
            .await
            .map_err(db_err("finding a pending event to announce again"))?
            .map(|r| r.try_get_by_index::<i64>(0))
            .transpose()
            .map_err(db_err("finding a pending event to announce again"))
    }

    /// Touches these ids where still pending; how many it touched.
    pub(crate) async fn touch_ids(&self, ids: &[i64]) -> Result<u64, StoreError> {
        let stmt = Query::update()
            .table(self.tbl())
            .value(Column::UpdatedAt, self.touched_updated_at(now()))
            .and_where(Expr::col(Column::Status).eq(Status::Pending.as_str()))
            .and_where(Expr::col(Column::Id).is_in(ids.iter().copied()))
            .to_owned();
        self.db
            .execute(&stmt)
            .await
            .map(|r| r.rows_affected())
            .map_err(db_err("announcing pending events again"))
    }

    /// Touches the pending rows matching `conds`, [`TOUCH_BATCH`] at a
    /// time in id order, each batch its own statement and commit: a
    /// statement timeout or a failover costs one batch, not the whole
    /// touch, and what was touched stays touched. On an error the rows
    /// touched so far are counted in [`StoreError::Interrupted`]; running
    /// the same touch again is always safe (a row announced twice is
    /// decided once).
    pub async fn touch_pending(
        &self,
        conds: Vec<sea_orm::sea_query::SimpleExpr>,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<u64, StoreError> {
        let mut done = 0u64;
        let mut after: Option<i64> = None;
        let interrupted = |done: u64, source: StoreError| StoreError::Interrupted {
            done,
            source: Box::new(source),
        };
        loop {
            let mut select = Query::select()
                .column(Column::Id)
                .from(self.tbl())
                .and_where(Expr::col(Column::Status).eq(Status::Pending.as_str()))
                .order_by(Column::Id, Order::Asc)
                .limit(TOUCH_BATCH)
                .to_owned();
            for c in &conds {
                select.and_where(c.clone());
            }
            if let Some(after) = after {
                select.and_where(Expr::col(Column::Id).gt(after));
            }
            let ids: Vec<i64> = self
                .db
                .query_all(&select)
                .await
                .map_err(db_err("finding pending events to announce again"))
                .and_then(|rows| {
                    rows.iter()
                        .map(|r| r.try_get_by_index::<i64>(0))
                        .collect::<Result<_, _>>()
                        .map_err(db_err("finding pending events to announce again"))
                })
                .map_err(|e| interrupted(done, e))?;
            let Some(&last) = ids.last() else {
                return Ok(done);
            };
            done += self
                .touch_ids(&ids)
                .await
                .map_err(|e| interrupted(done, e))?;
            progress(done);
            if (ids.len() as u64) < TOUCH_BATCH {
                return Ok(done);
            }
            after = Some(last);
        }
    }

    /// The `updated_at` a touch writes: `now`, except where the column
    /// could keep its value. A MySQL/MariaDB `datetime(0)` or `timestamp`
    /// column holds whole seconds, and MySQL writes no binlog event for an
    /// UPDATE that changes nothing: a touch within the second of the row's
    /// last write would announce nothing. There the value is at least one
    /// second past the old one, whatever the column's precision.
    fn touched_updated_at(&self, now: NaiveDateTime) -> sea_orm::sea_query::SimpleExpr {
        match self.backend() {
            DbBackend::MySql => Expr::cust_with_values(
                "GREATEST(?, COALESCE(updated_at + INTERVAL 1 SECOND, ?))",
                [now, now],
            ),
            _ => Expr::value(now),
        }
    }
}
