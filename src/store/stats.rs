//! The figures of the gauges and the console, each read through an index
//! on `status`: never a scan of the sent rows the application keeps.

use chrono::NaiveDateTime;
use entity::Status;
use sea_orm::{ConnectionTrait, DbBackend, DbErr, QueryResult};

use super::{db_err, Store, StoreError};

/// What the gauges show: the pending and failed rows, the oldest pending
/// row, and the table's size as the database estimates it. No exact count
/// of sent rows: that is a scan of the whole history (see
/// [`Store::count_sent_up_to`], and `outbox_transitions_total{to="sent"}`
/// for the rate).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableStats {
    pub pending: i64,
    pub failed: i64,
    pub oldest_pending_created_at: Option<NaiveDateTime>,
    /// Rows in the table by the planner's statistics (PostgreSQL
    /// `pg_class.reltuples`, MySQL `information_schema.tables.table_rows`):
    /// an estimate, refreshed by (auto)vacuum/analyze; `None` where the
    /// database has none yet (a table never analyzed, SQLite).
    pub estimated_rows: Option<i64>,
}

fn oldest(row: &QueryResult) -> Option<NaiveDateTime> {
    row.try_get::<Option<NaiveDateTime>>("", "oldest")
        .ok()
        .flatten()
}

impl Store {
    /// The gauges' figures in one round trip of index-sized reads: the
    /// pending and failed rows counted, the oldest pending row's
    /// `created_at`, and the catalogue's estimate of the table's rows. Each
    /// reads only rows of its status through an index on `status` (see
    /// [`Store::status_index_advice`]), never the sent rows the
    /// application keeps: the cost is set by the backlog, not the history.
    pub async fn stats(&self) -> Result<TableStats, StoreError> {
        let backend = self.backend();
        let t = self.quoted_table();
        let (oldest_col, estimate) = match backend {
            // A timestamptz or MySQL timestamp column: its UTC time (see
            // `select_rows`), cast after the MIN so an index on
            // (status, created_at) can answer it.
            DbBackend::Postgres => (
                "CAST(min(created_at) AS timestamp)",
                "(SELECT CASE WHEN c.reltuples < 0 THEN NULL ELSE CAST(c.reltuples AS bigint) END \
                 FROM pg_class c WHERE c.oid = to_regclass($1))",
            ),
            DbBackend::MySql => (
                "CAST(min(created_at) AS DATETIME(6))",
                "(SELECT CAST(table_rows AS SIGNED) FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name = ?)",
            ),
            _ => ("min(created_at)", "CAST(NULL AS INTEGER)"),
        };
        let sql = format!(
            "SELECT (SELECT count(*) FROM {t} WHERE status = 'pending') AS pending, \
             (SELECT count(*) FROM {t} WHERE status = 'failed') AS failed, \
             (SELECT {oldest_col} FROM {t} WHERE status = 'pending') AS oldest, \
             {estimate} AS estimated_rows"
        );
        let values: Vec<sea_orm::Value> = match backend {
            DbBackend::Postgres => vec![t.clone().into()],
            DbBackend::MySql => vec![self.table.clone().into()],
            _ => Vec::new(),
        };
        let err = || db_err("counting pending and failed events");
        let row = self
            .db
            .query_one_raw(sea_orm::Statement::from_sql_and_values(
                backend, sql, values,
            ))
            .await
            .map_err(err())?
            .ok_or_else(|| StoreError::Database {
                action: "counting pending and failed events",
                source: DbErr::RecordNotFound("no row".into()),
            })?;
        Ok(TableStats {
            pending: row.try_get("", "pending").map_err(err())?,
            failed: row.try_get("", "failed").map_err(err())?,
            oldest_pending_created_at: oldest(&row),
            estimated_rows: row
                .try_get::<Option<i64>>("", "estimated_rows")
                .map_err(err())?,
        })
    }

    /// How many rows are `sent`, counted up to `cap` and no further (the
    /// console's figure): `Some(n)` when there are `n <= cap`, `None` when
    /// there are more. Reads at most `cap + 1` index entries or rows.
    pub async fn count_sent_up_to(&self, cap: u64) -> Result<Option<u64>, StoreError> {
        let t = self.quoted_table();
        let limit = cap.saturating_add(1);
        let sql = format!(
            "SELECT count(*) AS n FROM (SELECT 1 AS one FROM {t} WHERE status = 'sent' \
             LIMIT {limit}) AS s"
        );
        let err = || db_err("counting sent events");
        let n: i64 = self
            .db
            .query_one_raw(sea_orm::Statement::from_string(self.backend(), sql))
            .await
            .map_err(err())?
            .map(|r| r.try_get("", "n"))
            .transpose()
            .map_err(err())?
            .unwrap_or(0);
        let n = u64::try_from(n).unwrap_or(0);
        Ok((n <= cap).then_some(n))
    }

    /// The rows of `status`, counted exactly: a scan of every row of that
    /// status, for tests and one-off checks, never for a gauge.
    pub async fn count_status(&self, status: Status) -> Result<i64, StoreError> {
        let t = self.quoted_table();
        let sql = format!(
            "SELECT count(*) AS n FROM {t} WHERE status = '{}'",
            status.as_str()
        );
        let err = || db_err("counting events");
        self.db
            .query_one_raw(sea_orm::Statement::from_string(self.backend(), sql))
            .await
            .map_err(err())?
            .map(|r| r.try_get("", "n"))
            .transpose()
            .map_err(err())
            .map(Option::unwrap_or_default)
    }
}
