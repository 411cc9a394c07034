//! The outbox table through SeaORM: the transitions of R-004 as conditional
//! writes (CONTRACT §3), the batched reads the pipeline needs, and the
//! queries behind `events list`, the admin API and the gauges.
//!
//! Every write names the state it was computed from in its `WHERE` clause,
//! so of two writers racing on one row exactly one applies; the other gets
//! [`Outcome::Conflict`] with the state it found instead of a silent no-op.
//!
//! By audience: [`connect`] opens the pool and learns the table,
//! [`rows`] reads rows, [`write`] makes the job's transitions one row at a
//! time and [`batch`] many at once; the operators' queries are [`resend`],
//! [`touch`] (announce pending rows again), [`prune`] and [`stats`]
//! ([`chart`]: the console's attempts per minute); [`pauses`] keeps the paused dispatchers, [`history`] the attempt log,
//! [`shape`] checks the table at start-up.

pub mod batch;
pub mod chart;
pub mod connect;
pub mod history;
pub mod operations;
pub mod ordering;
pub mod pauses;
pub mod prune;
pub mod replay;
pub mod resend;
pub mod rows;
pub mod shape;
pub mod stats;
#[cfg(test)]
mod tests;
pub mod touch;
pub mod write;

use chrono::{NaiveDateTime, Timelike};
use entity::OutboxEventRow;
use sea_orm::{DatabaseConnection, DbErr};

pub use connect::{install_crypto_provider, payload_type_is_json};
pub use operations::OperationRow;
pub use ordering::OrderingColumns;
pub use pauses::Pause;
pub use prune::{Pruned, PRUNE_BATCH};
pub use resend::{FailedFilter, RetryRefused, RESEND_CHUNK};
pub use rows::ListFilter;
pub use shape::TableError;
pub use stats::TableStats;
pub use touch::{RetriggerFilter, TOUCH_BATCH};
pub use write::{truncate_error, truncate_error_to, MAX_LAST_ERROR_BYTES};

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
    /// The database refused the statement for what it holds (a value too
    /// long, a constraint): trying the same write again cannot succeed.
    #[error("the database refused the write while {action}: {message}")]
    Refused {
        action: &'static str,
        message: String,
    },
    /// A batched change stopped part-way: `done` rows were changed (and
    /// committed) before `source`.
    #[error("{source} ({done} row(s) done before it)")]
    Interrupted {
        done: u64,
        #[source]
        source: Box<StoreError>,
    },
}

impl StoreError {
    /// Whether the same statement may succeed later: a lost connection, a
    /// timeout, a lock conflict, a server restarting. A data or constraint
    /// error (SQLSTATE classes 22, 23, 42, 44) or a value that cannot be
    /// decoded is permanent for the rows it names.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Connect { .. } => true,
            StoreError::Refused { .. } => false,
            StoreError::Database { source, .. } => is_transient(source),
            StoreError::Interrupted { source, .. } => source.is_transient(),
        }
    }
}

/// See [`StoreError::is_transient`].
pub fn is_transient(err: &DbErr) -> bool {
    use sea_orm::sqlx::Error as Sqlx;
    let runtime = match err {
        DbErr::Conn(r) | DbErr::Exec(r) | DbErr::Query(r) => r,
        DbErr::ConnectionAcquire(_) | DbErr::Custom(_) => return true,
        _ => return false,
    };
    let sea_orm::RuntimeErr::SqlxError(sqlx) = runtime else {
        return true;
    };
    match sqlx.as_ref() {
        Sqlx::Database(db) => {
            if !matches!(db.kind(), sea_orm::sqlx::error::ErrorKind::Other) {
                // unique, foreign key, not null, check: the row's values
                return false;
            }
            if let Some(my) = db.try_downcast_ref::<sea_orm::sqlx::mysql::MySqlDatabaseError>() {
                return !mysql_refuses_data(my.number());
            }
            let code = db.code().unwrap_or_default();
            if db
                .try_downcast_ref::<sea_orm::sqlx::sqlite::SqliteError>()
                .is_some()
            {
                // The primary result code is the extended code's low byte.
                let primary = code.parse::<i32>().unwrap_or(0) & 0xff;
                return !sqlite_refuses_data(primary);
            }
            !matches!(code.get(..2), Some("22" | "23" | "42" | "44"))
        }
        Sqlx::ColumnDecode { .. } | Sqlx::Decode(_) | Sqlx::TypeNotFound { .. } => false,
        Sqlx::ColumnNotFound(_) | Sqlx::ColumnIndexOutOfBounds { .. } => false,
        _ => true,
    }
}

/// MySQL/MariaDB error numbers that refuse a statement for what it says
/// or for the table it names: the same statement fails again. MySQL
/// reports several with SQLSTATE `HY000` (1366 incorrect string value,
/// 3819 check constraint), so the class alone does not tell.
fn mysql_refuses_data(number: u16) -> bool {
    matches!(
        number,
        1048 // column cannot be null
            | 1054 // unknown column
            | 1062 // duplicate entry
            | 1136 // column count does not match (a table changed under us)
            | 1142 | 1143 // command or column denied
            | 1146 // table does not exist
            | 1264 // out of range
            | 1265 // data truncated
            | 1292 // incorrect date/time value
            | 1366 // incorrect string/integer value
            | 1406 // data too long
            | 1451 | 1452 // foreign key
            | 1526 // no partition for the value (a log partitioned by day, today's missing)
            | 3819 // check constraint violated (MySQL)
            | 4025 // check constraint failed (MariaDB)
    )
}

/// SQLite primary result codes that refuse a statement for what it says:
/// SQLITE_ERROR (no such table, a syntax error), SQLITE_TOOBIG,
/// SQLITE_CONSTRAINT, SQLITE_MISMATCH, SQLITE_RANGE.
fn sqlite_refuses_data(primary: i32) -> bool {
    matches!(primary, 1 | 18 | 19 | 20 | 25)
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

/// One row of a batched read, decoded on its own: a row that cannot be
/// decoded (a status outside the three, a NULL where the entity needs a
/// value, a column of another type) does not fail its neighbours' read.
#[derive(Debug, Clone, PartialEq)]
pub enum RowRead {
    Row(OutboxEventRow),
    Undecodable { id: i64, error: String },
}

impl RowRead {
    pub fn id(&self) -> i64 {
        match self {
            RowRead::Row(row) => row.id,
            RowRead::Undecodable { id, .. } => *id,
        }
    }
}

/// The outbox table (and the sidecar's own tables) through one pool;
/// cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    db: DatabaseConnection,
    table: String,
    /// The `last_error` column's length in characters, when it has one
    /// (a Rails `string` column is `varchar(255)`): errors are cut to it,
    /// or a strict-mode MySQL refuses the whole write.
    last_error_chars: Option<usize>,
    /// The payload column is one whose text the database guarantees to be
    /// JSON (PostgreSQL `json`/`jsonb`, MySQL `json`): a row read from it
    /// needs no second check before it is sent.
    payload_is_json: bool,
    /// The attempt log, when `history.enabled`.
    history: Option<std::sync::Arc<history::HistoryTable>>,
    /// The paused dispatchers (`dispatch.pause_table`).
    pause_table: String,
    operations_table: String,
    /// The trace context's columns (`[tracing]`), read with each row.
    trace: Option<TraceColumns>,
    /// The aggregate column (`[ordering]`), read with each row for dispatch.
    ordering: Option<OrderingColumns>,
}

/// The outbox table's trace context columns (`[tracing] column`,
/// `state_column`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceColumns {
    pub column: String,
    pub state_column: Option<String>,
}

/// Now, in UTC, at the microsecond precision every backend stores, so the
/// state computed here equals the state read back.
pub fn now() -> NaiveDateTime {
    let t = chrono::Utc::now().naive_utc();
    t.with_nanosecond(t.nanosecond() / 1000 * 1000).unwrap_or(t)
}
