//! Replay: sent events sent again on purpose (the receiver lost them).
//! R-004's manual resend applied to a `sent` row: `pending`, 0 attempts,
//! no error, `sent_at` kept until the new delivery overwrites it (so a
//! pending row with a `sent_at` is a replay's, and its request says so);
//! in id order, a chunk per transaction with the operation's cursor, so a
//! replay that is cut goes on from where it was and never puts a row back
//! twice.

use chrono::NaiveDateTime;
use entity::outbox_event::Column;
use entity::Status;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Func, Order, Query, SimpleExpr};
use sea_orm::{ConnectionTrait, DbBackend, TransactionTrait};
use serde::{Deserialize, Serialize};

use super::{db_err, history, now, Store, StoreError};

/// Which sent rows a replay takes (every filter given must hold).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplayFilter {
    /// Of these event names (`--event-name`s, or a dispatcher's).
    pub event_names: Option<Vec<String>>,
    /// Sent at or after, UTC.
    pub sent_since: Option<NaiveDateTime>,
    /// Sent before, UTC.
    pub sent_until: Option<NaiveDateTime>,
    /// Of this aggregate (`[ordering]`'s column).
    pub aggregate: Option<String>,
    /// These ids only.
    pub ids: Option<Vec<i64>>,
}

/// What a replay would take: its count, first and last ids, a sample.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ReplayPreview {
    pub count: u64,
    pub first: Option<i64>,
    pub last: Option<i64>,
    pub sample: Vec<i64>,
}

/// Where one step of a replay looks: past `cursor`, up to `upto`, at most
/// `limit` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayWindow {
    pub cursor: i64,
    pub upto: i64,
    pub limit: u64,
}

/// What one step of a replay did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayStep {
    /// Rows put back to pending.
    pub replayed: u64,
    /// The cursor after it (the last id looked at).
    pub cursor: i64,
    /// Nothing matched past the cursor: the replay is over.
    pub done: bool,
}

impl Store {
    fn replay_conditions(&self, f: &ReplayFilter) -> Result<Vec<SimpleExpr>, String> {
        let mut c = vec![Expr::col(Column::Status).eq(Status::Sent.as_str())];
        if let Some(names) = &f.event_names {
            c.push(Expr::col(Column::EventName).is_in(names.iter().cloned()));
        }
        if let Some(t) = f.sent_since {
            c.push(Expr::col(Column::SentAt).gte(t));
        }
        if let Some(t) = f.sent_until {
            c.push(Expr::col(Column::SentAt).lt(t));
        }
        if let Some(key) = &f.aggregate {
            let Some(o) = &self.ordering else {
                return Err("aggregate: [ordering] is off, so events have no aggregate".to_owned());
            };
            c.push(Expr::col(Alias::new(&o.column)).eq(key.clone()));
        }
        if let Some(ids) = &f.ids {
            c.push(Expr::col(Column::Id).is_in(ids.iter().copied()));
        }
        Ok(c)
    }

    /// The rows `filter` takes now: how many, the first and last ids, the
    /// first ten.
    pub async fn replay_preview(
        &self,
        f: &ReplayFilter,
    ) -> Result<Result<ReplayPreview, String>, StoreError> {
        let conds = match self.replay_conditions(f) {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let action = "counting the events a replay takes";
        let mut count = Query::select()
            .expr_as(Func::count(Expr::col(Column::Id)), Alias::new("n"))
            .expr_as(Func::min(Expr::col(Column::Id)), Alias::new("first"))
            .expr_as(Func::max(Expr::col(Column::Id)), Alias::new("last"))
            .from(self.tbl())
            .to_owned();
        let mut sample = Query::select()
            .column(Column::Id)
            .from(self.tbl())
            .order_by(Column::Id, Order::Asc)
            .limit(10)
            .to_owned();
        for c in conds {
            count.and_where(c.clone());
            sample.and_where(c);
        }
        let row = self.db.query_one(&count).await.map_err(db_err(action))?;
        let (n, first, last) = match row {
            Some(r) => (
                r.try_get::<i64>("", "n").map_err(db_err(action))?,
                r.try_get::<Option<i64>>("", "first")
                    .map_err(db_err(action))?,
                r.try_get::<Option<i64>>("", "last")
                    .map_err(db_err(action))?,
            ),
            None => (0, None, None),
        };
        let sample = self
            .db
            .query_all(&sample)
            .await
            .map_err(db_err(action))?
            .iter()
            .map(|r| r.try_get::<i64>("", "id"))
            .collect::<Result<_, _>>()
            .map_err(db_err(action))?;
        Ok(Ok(ReplayPreview {
            count: Ord::max(n, 0) as u64,
            first,
            last,
            sample,
        }))
    }

    /// One step of replay `op`: up to `limit` sent rows of `filter` past
    /// `cursor` and up to `upto` (the last id the replay started with: rows
    /// sent after it began are not its), in id order, put back to pending;
    /// each recorded in the attempt log (`replay`, the operation's id), and
    /// the operation's cursor and progress moved, in one transaction. A
    /// step whose operation is no longer running (cancelled, or taken over
    /// by another replica) changes nothing.
    pub async fn replay_step(
        &self,
        op: &str,
        replica: &str,
        f: &ReplayFilter,
        window: ReplayWindow,
        caller: &history::Caller,
    ) -> Result<Result<ReplayStep, String>, StoreError> {
        let ReplayWindow {
            cursor,
            upto,
            limit,
        } = window;
        let conds = match self.replay_conditions(f) {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let action = "replaying sent events";
        let backend = self.backend();
        let txn = self.db.begin().await.map_err(db_err(action))?;
        // The operation's row first: held for the step, and still ours.
        let mut mine = Query::select()
            .column(Alias::new("id"))
            .from(self.ops())
            .and_where(Expr::col(Alias::new("id")).eq(op))
            .and_where(Expr::col(Alias::new("state")).eq("running"))
            .and_where(Expr::col(Alias::new("replica")).eq(replica))
            .and_where(Expr::col(Alias::new("cancelled_at")).is_null())
            .and_where(Expr::col(Alias::new("cursor")).eq(cursor))
            .to_owned();
        if backend != DbBackend::Sqlite {
            mine.lock(sea_orm::sea_query::LockType::Update);
        }
        if txn
            .query_one(&mine)
            .await
            .map_err(db_err(action))?
            .is_none()
        {
            txn.rollback().await.map_err(db_err(action))?;
            return Ok(Err(format!(
                "operation {op} is no longer this replica's to run from id {cursor} \
                 (cancelled, ended, or taken over)"
            )));
        }
        let mut pick = Query::select()
            .column(Column::Id)
            .from(self.tbl())
            .and_where(Expr::col(Column::Id).gt(cursor))
            .and_where(Expr::col(Column::Id).lte(upto))
            .order_by(Column::Id, Order::Asc)
            .limit(limit)
            .to_owned();
        for c in conds {
            pick.and_where(c);
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
        let at = now();
        let (replayed, next) = match ids.last() {
            None => (0, upto),
            Some(&last) => {
                let stmt = Query::update()
                    .table(self.tbl())
                    .value(Column::Status, Status::Pending.as_str())
                    .value(Column::Attempts, 0)
                    .value(Column::LastError, Option::<String>::None)
                    .value(Column::UpdatedAt, at)
                    .and_where(Expr::col(Column::Status).eq(Status::Sent.as_str()))
                    .and_where(Expr::col(Column::Id).is_in(ids.iter().copied()))
                    .to_owned();
                let res = txn.execute(&stmt).await.map_err(db_err(action))?;
                if let Some(insert) = self
                    .history
                    .as_ref()
                    .and_then(|h| h.insert_replays(backend, &ids, at, caller, op))
                {
                    txn.execute_raw(insert).await.map_err(db_err(action))?;
                }
                (res.rows_affected(), last)
            }
        };
        let done = (ids.len() as u64) < limit;
        let next = if done { upto } else { next };
        let moved = Query::update()
            .table(self.ops())
            .value(Alias::new("cursor"), next)
            .value(
                Alias::new("progress"),
                Expr::col(Alias::new("progress")).add(replayed as i64),
            )
            .value(Alias::new("updated_at"), at)
            .and_where(Expr::col(Alias::new("id")).eq(op))
            .to_owned();
        txn.execute(&moved).await.map_err(db_err(action))?;
        txn.commit().await.map_err(db_err(action))?;
        Ok(Ok(ReplayStep {
            replayed,
            cursor: next,
            done,
        }))
    }

    /// The replay that last put event `id` back to pending (the attempt
    /// log's latest `replay` entry), for the request's `Outbox-Replay`.
    pub async fn replay_of(&self, id: i64) -> Result<Option<String>, StoreError> {
        let Some(h) = &self.history else {
            return Ok(None);
        };
        let action = "reading an event's replay";
        let stmt = Query::select()
            .column(Alias::new("detail"))
            .from(Alias::new(&h.table))
            .and_where(Expr::col(Alias::new("event_id")).eq(id))
            .and_where(Expr::col(Alias::new("kind")).eq("replay"))
            .order_by(Alias::new("started_at"), Order::Desc)
            .limit(1)
            .to_owned();
        let row = self.db.query_one(&stmt).await.map_err(db_err(action))?;
        row.map(|r| r.try_get::<Option<String>>("", "detail"))
            .transpose()
            .map(Option::flatten)
            .map_err(db_err(action))
    }
}
