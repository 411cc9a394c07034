//! Reading rows: each column cast to the entity's type whatever the
//! table's shape, decoded by position; one row, many ids at once (each
//! decoded on its own), the operators' listing, and the application's insert.

use chrono::NaiveDateTime;
use entity::outbox_event::Column;
use entity::{OutboxEventRow, Status};
use sea_orm::sea_query::extension::postgres::PgFunc;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Order, Query, SelectStatement};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, QueryResult};

use super::{db_err, now, FailedFilter, RowRead, Store, StoreError};

/// Filters of `events list` and `GET /admin/events`.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub status: Option<Status>,
    pub event_name: Option<String>,
    pub limit: Option<u64>,
    /// The cursor: only rows with a smaller id (the next page, newest first).
    pub before: Option<i64>,
    /// `last_error` contains this text (the console's filter).
    pub error_contains: Option<String>,
    /// Last changed (`updated_at`) at or after, UTC: for a failed row, when
    /// it failed.
    pub changed_since: Option<NaiveDateTime>,
    /// Last changed before, UTC.
    pub changed_until: Option<NaiveDateTime>,
    /// Only pending rows an earlier failed event of their aggregate holds
    /// back (`[ordering]`, `events list --held`).
    pub held: bool,
}

/// The columns [`Store::select_rows`] selects, in order.
const ROW_COLUMNS: [Column; 9] = [
    Column::Id,
    Column::EventName,
    Column::Payload,
    Column::Status,
    Column::Attempts,
    Column::LastError,
    Column::SentAt,
    Column::CreatedAt,
    Column::UpdatedAt,
];

/// A row of [`Store::select_rows`], read by position: the statement fixes
/// the order, and reading by index skips a search of the columns by name
/// per value. An error names the column.
/// `traced`: the statement selects the trace context's columns after
/// [`ROW_COLUMNS`] (`[tracing]`): 0, 1 (`traceparent`) or 2 (and
/// `tracestate`).
fn decode_row(r: &QueryResult, traced: usize) -> Result<OutboxEventRow, DbErr> {
    fn at<T: sea_orm::TryGetable>(r: &QueryResult, i: usize) -> Result<T, DbErr> {
        r.try_get_by_index(i).map_err(|e| {
            DbErr::Type(format!(
                "column {}: {e}",
                sea_orm::IdenStatic::as_str(&ROW_COLUMNS[i])
            ))
        })
    }
    Ok(OutboxEventRow {
        id: at(r, 0)?,
        event_name: at(r, 1)?,
        payload: at(r, 2)?,
        status: at(r, 3)?,
        attempts: at(r, 4)?,
        last_error: at(r, 5)?,
        sent_at: at(r, 6)?,
        created_at: at(r, 7)?,
        updated_at: at(r, 8)?,
        // A value that cannot be read as text reads as none: the event is
        // sent with a new trace, never held back by its trace context.
        traceparent: (traced > 0)
            .then(|| r.try_get_by_index::<Option<String>>(9).ok().flatten())
            .flatten(),
        tracestate: (traced > 1)
            .then(|| r.try_get_by_index::<Option<String>>(10).ok().flatten())
            .flatten(),
        sequence: None,
    })
}

impl Store {
    /// The row's columns, each read as the entity's type whatever shape
    /// the table has (see [`shape`]): the payload as its text, never parsed
    /// (PostgreSQL `payload::text` of a `json`, `jsonb` or `text` column;
    /// MySQL `CAST(payload AS CHAR)`, a JSON column's text as stored); on
    /// PostgreSQL `attempts` as `integer` and the timestamps as `timestamp`
    /// (a `timestamptz` in UTC: sqlx opens every session with
    /// `TimeZone=UTC`, which also makes the UTC values written into a
    /// `timestamptz` column the right instants); on MySQL `attempts` as
    /// `SIGNED` and the timestamps as `DATETIME(6)` (a `timestamp` column
    /// in the session's UTC).
    /// Its columns are [`ROW_COLUMNS`], in that order ([`decode_row`]).
    pub(super) fn select_rows(&self) -> SelectStatement {
        let backend = self.backend();
        let mut stmt = Query::select();
        for column in ROW_COLUMNS {
            let cast = match (backend, column) {
                (DbBackend::Postgres, Column::Payload) => Some("text"),
                (DbBackend::MySql, Column::Payload) => Some("CHAR"),
                (DbBackend::Postgres, Column::Attempts) => Some("integer"),
                // An unsigned attempts column reads as signed.
                (DbBackend::MySql, Column::Attempts) => Some("SIGNED"),
                (DbBackend::Postgres, Column::SentAt | Column::CreatedAt | Column::UpdatedAt) => {
                    Some("timestamp")
                }
                // sqlx reads a MySQL `timestamp` column only as
                // DateTime<Utc>; its value is UTC (sqlx sets the session's
                // time_zone to UTC).
                (DbBackend::MySql, Column::SentAt | Column::CreatedAt | Column::UpdatedAt) => {
                    Some("DATETIME(6)")
                }
                _ => None,
            };
            match cast {
                Some(to) => {
                    stmt.expr_as(Expr::col(column).cast_as(Alias::new(to)), column);
                }
                None => {
                    stmt.column(column);
                }
            }
        }
        if let Some(trace) = &self.trace {
            let to = match backend {
                DbBackend::Postgres => Some("text"),
                DbBackend::MySql => Some("CHAR"),
                _ => None,
            };
            for (column, alias) in std::iter::once((&trace.column, "traceparent"))
                .chain(trace.state_column.iter().map(|c| (c, "tracestate")))
            {
                let expr = Expr::col(Alias::new(column));
                match to {
                    Some(to) => stmt.expr_as(expr.cast_as(Alias::new(to)), Alias::new(alias)),
                    None => stmt.expr_as(expr, Alias::new(alias)),
                };
            }
        }
        stmt.from(self.tbl()).to_owned()
    }

    /// How many trace context columns [`Store::select_rows`] selects.
    fn traced(&self) -> usize {
        self.trace
            .as_ref()
            .map_or(0, |t| 1 + usize::from(t.state_column.is_some()))
    }

    pub(super) async fn fetch(&self, stmt: &SelectStatement) -> Result<Vec<OutboxEventRow>, DbErr> {
        let rows = self.db.query_all(stmt).await?;
        let traced = self.traced();
        rows.iter().map(|r| decode_row(r, traced)).collect()
    }

    /// As [`Store::get_many`], each row decoded on its own. A row whose
    /// very id cannot be read is left out (it reads as missing).
    pub async fn read_rows(&self, ids: &[i64]) -> Result<Vec<RowRead>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut stmt = self.select_ids(ids);
        // With `[ordering]`: where each row stands in its aggregate.
        self.add_sequence(&mut stmt);
        let rows = self
            .db
            .query_all(&stmt)
            .await
            .map_err(db_err("reading events"))?;
        let traced = self.traced();
        Ok(rows
            .iter()
            .filter_map(|r| match decode_row(r, traced) {
                Ok(mut row) => {
                    row.sequence = self.read_sequence(r, ROW_COLUMNS.len() + traced);
                    Some(RowRead::Row(row))
                }
                Err(e) => r
                    .try_get_by_index::<i64>(0)
                    .ok()
                    .map(|id| RowRead::Undecodable {
                        id,
                        error: e.to_string(),
                    }),
            })
            .collect())
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
        let stmt = self.select_ids(ids);
        self.fetch(&stmt).await.map_err(db_err("reading events"))
    }

    fn select_ids(&self, ids: &[i64]) -> SelectStatement {
        let which = if self.backend() == DbBackend::Postgres {
            Expr::col(Column::Id).eq(PgFunc::any(Expr::val(ids.to_vec())))
        } else {
            Expr::col(Column::Id).is_in(ids.iter().copied())
        };
        self.select_rows().and_where(which).to_owned()
    }

    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<OutboxEventRow>, StoreError> {
        let mut stmt = self.select_rows();
        if let Some(status) = filter.status {
            stmt.and_where(Expr::col(Column::Status).eq(status.as_str()));
        }
        if let Some(name) = &filter.event_name {
            stmt.and_where(Expr::col(Column::EventName).eq(name.as_str()));
        }
        if let Some(before) = filter.before {
            stmt.and_where(Expr::col(Column::Id).lt(before));
        }
        for cond in self.failed_conditions(&FailedFilter {
            event_names: None,
            error_contains: filter.error_contains.clone().filter(|t| !t.is_empty()),
            failed_since: filter.changed_since,
            failed_until: filter.changed_until,
        }) {
            stmt.and_where(cond);
        }
        if filter.held {
            match self.held_condition() {
                Some(cond) => {
                    stmt.and_where(cond);
                }
                None => return Ok(Vec::new()),
            }
        }
        // Newest first: what an operator looks for after an outage.
        stmt.order_by(Column::Id, Order::Desc);
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
}
