//! The outbox table through SeaORM: the transitions of R-004 as conditional
//! writes (CONTRACT §3), the batched reads the pipeline needs, and the
//! queries behind `events list`, the admin API and the gauges.
//!
//! Every write names the state it was computed from in its `WHERE` clause,
//! so of two writers racing on one row exactly one applies; the other gets
//! [`Outcome::Conflict`] with the state it found instead of a silent no-op.

pub mod batch;
#[cfg(test)]
mod tests;

use std::time::Duration;

use chrono::{NaiveDateTime, Timelike};
use entity::outbox_event::Column;
use entity::{OutboxEventRow, Status};
use sea_orm::sea_query::extension::postgres::PgFunc;
use sea_orm::sea_query::{
    Alias, Expr, ExprTrait, Func, Order, Query, SelectStatement, UpdateStatement,
};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, DbErr,
    FromQueryResult, QueryResult,
};

/// `last_error` is for people: keep it to this many bytes.
pub const MAX_LAST_ERROR_BYTES: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error while {action}: {source}")]
    Database {
        action: &'static str,
        #[source]
        source: DbErr,
    },
    #[error("cannot connect to the database at {url}: {message}")]
    Connect { url: String, message: String },
}

pub(crate) fn db_err(action: &'static str) -> impl FnOnce(DbErr) -> StoreError {
    move |source| StoreError::Database { action, source }
}

/// The result of a conditional write.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The write applied; the row as it now is.
    Applied(OutboxEventRow),
    /// The row was not in the expected state; the row as it was found.
    Conflict(OutboxEventRow),
    NotFound(i64),
}

/// Why a resend was not applied.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RetryRefused {
    #[error("event {0} not found")]
    NotFound(i64),
    #[error("event {id} is {status}: only failed events can be resent")]
    NotFailed { id: i64, status: Status },
}

/// Filters of `events list` and `GET /admin/events`.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub status: Option<Status>,
    pub event_name: Option<String>,
    pub limit: Option<u64>,
}

/// What the gauges show: row counts by status and the oldest pending row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableStats {
    pub pending: i64,
    pub sent: i64,
    pub failed: i64,
    pub oldest_pending_created_at: Option<NaiveDateTime>,
}

#[derive(Clone, Debug)]
pub struct Store {
    db: DatabaseConnection,
    table: String,
    max_attempts: i32,
}

/// Now, in UTC, at the microsecond precision every backend stores, so the
/// state computed here equals the state read back.
pub fn now() -> NaiveDateTime {
    let t = chrono::Utc::now().naive_utc();
    t.with_nanosecond(t.nanosecond() / 1000 * 1000).unwrap_or(t)
}

/// Cuts `error` to [`MAX_LAST_ERROR_BYTES`] on a character boundary.
pub fn truncate_error(error: &str) -> String {
    if error.len() <= MAX_LAST_ERROR_BYTES {
        return error.to_owned();
    }
    let marker = "…";
    let mut end = MAX_LAST_ERROR_BYTES - marker.len();
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{marker}", &error[..end])
}

impl Store {
    /// Opens a pool; `sqlite:` URLs get `mode=rwc` so a new file is created.
    pub async fn connect(
        url: &str,
        table: &str,
        max_attempts: i32,
        max_connections: u32,
        connect_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let mut opts = ConnectOptions::new(url.to_owned());
        opts.max_connections(max_connections)
            .min_connections(0)
            .connect_timeout(connect_timeout)
            .acquire_timeout(connect_timeout)
            .sqlx_logging(false);
        let db = Database::connect(opts)
            .await
            .map_err(|e| StoreError::Connect {
                url: crate::config::secret_free_url(url),
                message: e.to_string(),
            })?;
        Ok(Self::new(db, table, max_attempts))
    }

    pub fn new(db: DatabaseConnection, table: &str, max_attempts: i32) -> Self {
        Self {
            db,
            table: table.to_owned(),
            max_attempts,
        }
    }

    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn max_attempts(&self) -> i32 {
        self.max_attempts
    }

    pub(crate) fn backend(&self) -> DbBackend {
        self.db.get_database_backend()
    }

    fn tbl(&self) -> Alias {
        Alias::new(&self.table)
    }

    /// Creates the table and index when missing (`outbox-sidecar migrate`).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migration::apply(&self.db, &self.table)
            .await
            .map_err(db_err("migrating the outbox table"))
    }

    /// A cheap round trip for readiness.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.db.ping().await.map_err(db_err("pinging the database"))
    }

    fn select_rows(&self) -> SelectStatement {
        Query::select()
            .columns([
                Column::Id,
                Column::EventName,
                Column::Payload,
                Column::Status,
                Column::Attempts,
                Column::LastError,
                Column::SentAt,
                Column::CreatedAt,
                Column::UpdatedAt,
            ])
            .from(self.tbl())
            .to_owned()
    }

    async fn fetch(&self, stmt: &SelectStatement) -> Result<Vec<OutboxEventRow>, DbErr> {
        let rows = self.db.query_all(stmt).await?;
        rows.iter()
            .map(|r| OutboxEventRow::from_query_result(r, ""))
            .collect()
    }

    pub async fn get(&self, id: i64) -> Result<Option<OutboxEventRow>, StoreError> {
        let stmt = self
            .select_rows()
            .and_where(Expr::col(Column::Id).eq(id))
            .to_owned();
        Ok(self
            .fetch(&stmt)
            .await
            .map_err(db_err("reading an event"))?
            .pop())
    }

    /// One query for a poll's worth of ids. On PostgreSQL the ids are one
    /// array parameter (`id = ANY($1)`), so the statement is the same for
    /// any number of ids (prepared once per connection, planned cheaply);
    /// elsewhere an `IN (…)` list.
    pub async fn get_many(&self, ids: &[i64]) -> Result<Vec<OutboxEventRow>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let which = if self.backend() == DbBackend::Postgres {
            Expr::col(Column::Id).eq(PgFunc::any(Expr::val(ids.to_vec())))
        } else {
            Expr::col(Column::Id).is_in(ids.iter().copied())
        };
        let stmt = self.select_rows().and_where(which).to_owned();
        self.fetch(&stmt).await.map_err(db_err("reading events"))
    }

    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<OutboxEventRow>, StoreError> {
        let mut stmt = self.select_rows();
        if let Some(status) = filter.status {
            stmt.and_where(Expr::col(Column::Status).eq(status.as_str()));
        }
        if let Some(name) = &filter.event_name {
            stmt.and_where(Expr::col(Column::EventName).eq(name.as_str()));
        }
        stmt.order_by(Column::Id, Order::Asc);
        if let Some(limit) = filter.limit {
            stmt.limit(limit);
        }
        self.fetch(&stmt).await.map_err(db_err("listing events"))
    }

    /// Inserts a pending event, as the application would; returns its id.
    pub async fn insert(
        &self,
        event_name: &str,
        payload: &serde_json::Value,
    ) -> Result<i64, StoreError> {
        let now = now();
        let payload = match self.backend() {
            DbBackend::Postgres => Expr::val(payload.clone()).cast_as(Alias::new("jsonb")),
            _ => Expr::val(payload.to_string()),
        };
        let mut stmt = Query::insert()
            .into_table(self.tbl())
            .columns([
                Column::EventName,
                Column::Payload,
                Column::Status,
                Column::Attempts,
                Column::CreatedAt,
                Column::UpdatedAt,
            ])
            .values_panic([
                event_name.into(),
                payload,
                Status::Pending.as_str().into(),
                0.into(),
                now.into(),
                now.into(),
            ])
            .to_owned();
        if self.backend() == DbBackend::Postgres {
            stmt.returning_col(Column::Id);
            let row = self
                .db
                .query_one(&stmt)
                .await
                .map_err(db_err("inserting an event"))?
                .ok_or_else(|| StoreError::Database {
                    action: "inserting an event",
                    source: DbErr::RecordNotInserted,
                })?;
            return row
                .try_get::<i64>("", "id")
                .map_err(db_err("inserting an event"));
        }
        let res = self
            .db
            .execute(&stmt)
            .await
            .map_err(db_err("inserting an event"))?;
        i64::try_from(res.last_insert_id()).map_err(|_| StoreError::Database {
            action: "inserting an event",
            source: DbErr::RecordNotInserted,
        })
    }

    /// R-004 `mark_sent!`: `pending` → `sent`, from exactly the state `seen`.
    pub async fn mark_sent(&self, seen: &OutboxEventRow) -> Result<Outcome, StoreError> {
        let now = now();
        let mut next = seen.clone();
        next.status = Status::Sent;
        next.sent_at = Some(now);
        next.updated_at = now;
        let values = [
            (Column::Status, Status::Sent.as_str().into()),
            (Column::SentAt, now.into()),
            (Column::UpdatedAt, now.into()),
        ];
        self.step(seen, next, values, "marking an event sent").await
    }

    /// R-004 `register_failure!`: one more attempt; `failed` once the
    /// attempts reach `max_attempts`, else still `pending`.
    pub async fn register_failure(
        &self,
        seen: &OutboxEventRow,
        error: &str,
    ) -> Result<Outcome, StoreError> {
        let next = self.after_failure(seen, error, now());
        let values = failure_values(&next);
        self.step(seen, next, values, "registering a failure").await
    }

    /// The row after a failed attempt of `seen`, written at `now`.
    pub(crate) fn after_failure(
        &self,
        seen: &OutboxEventRow,
        error: &str,
        now: NaiveDateTime,
    ) -> OutboxEventRow {
        let mut next = seen.clone();
        next.attempts = seen.attempts + 1;
        next.status = next_status_after_failure(next.attempts, self.max_attempts);
        next.last_error = Some(truncate_error(error));
        next.updated_at = now;
        next
    }

    /// One transition of a pending row: `values` are written only while the
    /// row is still `seen` (pending, same attempts); `next` is the row after.
    async fn step(
        &self,
        seen: &OutboxEventRow,
        next: OutboxEventRow,
        values: impl IntoIterator<Item = (Column, sea_orm::Value)>,
        action: &'static str,
    ) -> Result<Outcome, StoreError> {
        let stmt = self.step_statement(seen, values);
        let res = self.db.execute(&stmt).await.map_err(db_err(action))?;
        if res.rows_affected() == 1 {
            return Ok(Outcome::Applied(next));
        }
        self.conflict(seen.id).await
    }

    /// The conditional UPDATE of [`Store::step`].
    pub(crate) fn step_statement(
        &self,
        seen: &OutboxEventRow,
        values: impl IntoIterator<Item = (Column, sea_orm::Value)>,
    ) -> UpdateStatement {
        Query::update()
            .table(self.tbl())
            .values(values.into_iter().map(|(c, v)| (c, Expr::val(v))))
            .and_where(Expr::col(Column::Id).eq(seen.id))
            .and_where(Expr::col(Column::Status).eq(Status::Pending.as_str()))
            .and_where(Expr::col(Column::Attempts).eq(seen.attempts))
            .to_owned()
    }

    /// The resend's write: `failed` → `pending`, 0 attempts, no error.
    fn resend_statement(&self) -> UpdateStatement {
        Query::update()
            .table(self.tbl())
            .value(Column::Status, Status::Pending.as_str())
            .value(Column::Attempts, 0)
            .value(Column::LastError, Option::<String>::None)
            .value(Column::UpdatedAt, now())
            .and_where(Expr::col(Column::Status).eq(Status::Failed.as_str()))
            .to_owned()
    }

    /// R-004 `retry!` (ActiveAdmin's "Reenviar"): `failed` → `pending` with
    /// 0 attempts and no error. Any other status is refused.
    pub async fn retry(&self, id: i64) -> Result<Result<OutboxEventRow, RetryRefused>, StoreError> {
        let stmt = self
            .resend_statement()
            .and_where(Expr::col(Column::Id).eq(id))
            .to_owned();
        let res = self
            .db
            .execute(&stmt)
            .await
            .map_err(db_err("resending an event"))?;
        let row = self.get(id).await?;
        Ok(match row {
            None => Err(RetryRefused::NotFound(id)),
            Some(row) if res.rows_affected() == 1 => Ok(row),
            Some(row) => Err(RetryRefused::NotFailed {
                id,
                status: row.status,
            }),
        })
    }

    /// Resends every failed event (optionally of one `event_name`); returns
    /// how many rows went back to pending.
    pub async fn retry_all_failed(&self, event_name: Option<&str>) -> Result<u64, StoreError> {
        let mut stmt = self.resend_statement();
        if let Some(name) = event_name {
            stmt.and_where(Expr::col(Column::EventName).eq(name));
        }
        let res = self
            .db
            .execute(&stmt)
            .await
            .map_err(db_err("resending failed events"))?;
        Ok(res.rows_affected())
    }

    /// One grouped count and one `MIN` for the gauges; dispatches nothing.
    pub async fn stats(&self) -> Result<TableStats, StoreError> {
        let stmt = Query::select()
            .column(Column::Status)
            .expr_as(Func::count(Expr::col(Column::Id)), Alias::new("n"))
            .expr_as(
                Func::min(Expr::col(Column::CreatedAt)),
                Alias::new("oldest"),
            )
            .from(self.tbl())
            .group_by_col(Column::Status)
            .to_owned();
        let rows = self
            .db
            .query_all(&stmt)
            .await
            .map_err(db_err("counting events"))?;
        let mut stats = TableStats::default();
        for row in rows {
            let status: String = row
                .try_get("", "status")
                .map_err(db_err("counting events"))?;
            let n: i64 = row.try_get("", "n").map_err(db_err("counting events"))?;
            match status.parse::<Status>() {
                Ok(Status::Pending) => {
                    stats.pending = n;
                    stats.oldest_pending_created_at = oldest(&row);
                }
                Ok(Status::Sent) => stats.sent = n,
                Ok(Status::Failed) => stats.failed = n,
                Err(_) => {}
            }
        }
        Ok(stats)
    }

    async fn conflict(&self, id: i64) -> Result<Outcome, StoreError> {
        Ok(match self.get(id).await? {
            Some(row) => Outcome::Conflict(row),
            None => Outcome::NotFound(id),
        })
    }
}

fn oldest(row: &QueryResult) -> Option<NaiveDateTime> {
    row.try_get::<Option<NaiveDateTime>>("", "oldest")
        .ok()
        .flatten()
}

/// The columns a failure writes, as they are in `next`.
pub(crate) fn failure_values(next: &OutboxEventRow) -> [(Column, sea_orm::Value); 4] {
    [
        (Column::Status, next.status.as_str().into()),
        (Column::Attempts, next.attempts.into()),
        (Column::LastError, next.last_error.clone().into()),
        (Column::UpdatedAt, next.updated_at.into()),
    ]
}

/// The decision table's status column for a failure that brings the
/// attempts to `attempts`.
pub fn next_status_after_failure(attempts: i32, max_attempts: i32) -> Status {
    if attempts >= max_attempts {
        Status::Failed
    } else {
        Status::Pending
    }
}
