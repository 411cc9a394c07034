//! The outbox table through SeaORM: the transitions of R-004 as conditional
//! writes (CONTRACT §3), the batched reads the pipeline needs, and the
//! queries behind `events list`, the admin API and the gauges.
//!
//! Every write names the state it was computed from in its `WHERE` clause,
//! so of two writers racing on one row exactly one applies; the other gets
//! [`Outcome::Conflict`] with the state it found instead of a silent no-op.

pub mod batch;
pub mod chart;
pub mod history;
pub mod shape;
#[cfg(test)]
mod tests;

use std::time::Duration;

use crate::transition;
use chrono::{NaiveDateTime, Timelike};
use entity::outbox_event::Column;
use entity::{OutboxEventRow, Status};
use sea_orm::sea_query::extension::postgres::PgFunc;
use sea_orm::sea_query::{
    Alias, Expr, ExprTrait, Func, Order, Query, SelectStatement, UpdateStatement,
};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, DbErr, QueryResult,
    TransactionTrait,
};

/// Rows a bulk resend takes per transaction (with the attempt log on).
pub const RESEND_CHUNK: u64 = 1000;

/// Rows one touch (retrigger, resume) changes per statement.
pub const TOUCH_BATCH: u64 = 1000;

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
            | 1142 | 1143 // command or column denied
            | 1146 // table does not exist
            | 1264 // out of range
            | 1265 // data truncated
            | 1292 // incorrect date/time value
            | 1366 // incorrect string/integer value
            | 1406 // data too long
            | 1451 | 1452 // foreign key
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

/// Why a resend was not applied.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RetryRefused {
    #[error("event {0} not found")]
    NotFound(i64),
    #[error("event {id} is {status}: only failed events can be resent")]
    NotFailed { id: i64, status: Status },
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

/// Which pending rows `events retrigger` touches: these ids, or those
/// unchanged for longer than `older_than`; optionally of one event name.
#[derive(Debug, Clone, Default)]
pub struct RetriggerFilter {
    pub ids: Vec<i64>,
    pub older_than: Option<Duration>,
    pub event_name: Option<String>,
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
}

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
}

pub use shape::TableError;

/// Now, in UTC, at the microsecond precision every backend stores, so the
/// state computed here equals the state read back.
pub fn now() -> NaiveDateTime {
    let t = chrono::Utc::now().naive_utc();
    t.with_nanosecond(t.nanosecond() / 1000 * 1000).unwrap_or(t)
}

/// Whether a payload column of catalogue type `data_type` holds only
/// JSON: PostgreSQL checks `json` and `jsonb` input, MySQL its `json`
/// type. (MariaDB's `json` is `longtext` with a `CHECK` that can be
/// dropped; its catalogue says `longtext`, and such rows are checked.)
pub fn payload_type_is_json(backend: DbBackend, data_type: &str) -> bool {
    let t = data_type.to_ascii_lowercase();
    match backend {
        DbBackend::Postgres => t == "json" || t == "jsonb",
        DbBackend::MySql => t == "json",
        _ => false,
    }
}

/// Cuts `error` to [`MAX_LAST_ERROR_BYTES`] on a character boundary.
pub fn truncate_error(error: &str) -> String {
    truncate_error_to(error, None)
}

/// Cuts `error` to [`MAX_LAST_ERROR_BYTES`] and, when given, to
/// `max_chars` characters (a `varchar(N)` column), marking the cut.
pub fn truncate_error_to(error: &str, max_chars: Option<usize>) -> String {
    let marker = "…";
    let chars = max_chars.unwrap_or(usize::MAX);
    let fits_chars = || error.chars().nth(chars).is_none();
    if error.len() <= MAX_LAST_ERROR_BYTES && (max_chars.is_none() || fits_chars()) {
        return error.to_owned();
    }
    let mut end = MAX_LAST_ERROR_BYTES - marker.len();
    if let Some((at, _)) = error.char_indices().nth(chars.saturating_sub(1)) {
        end = end.min(at);
    }
    end = end.min(error.len());
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{marker}", &error[..end])
}

/// rustls is built here with two crypto providers (ring and aws-lc-rs,
/// wanted by different dependencies), so neither is the process default,
/// and sqlx's `sslmode=verify-ca` asks rustls for the default: without one
/// it panics. Installs aws-lc-rs (what reqwest uses) unless a provider is
/// installed already; every connection to the database comes through here.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Lost a race with another thread: one is installed, which is enough.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
}

/// The driver's reason, and for a certificate the server presented that
/// failed verification (`sslmode=verify-ca` / `verify-full`), what to
/// change in `database.url`.
fn connect_message(url: &str, err: &DbErr) -> String {
    let message = err.to_string();
    let query = |key: &str| {
        url::Url::parse(url).ok().and_then(|u| {
            u.query_pairs()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.into_owned())
        })
    };
    let root = query("sslrootcert");
    let hint = if message.contains("UnknownIssuer") || message.contains("unknown issuer") {
        Some(match &root {
            Some(path) => format!(
                "the server's certificate is not signed by the CA in sslrootcert={path} \
                 (database.url): point sslrootcert at the CA that signed it"
            ),
            None => "the server's certificate is not signed by a CA the sidecar trusts: \
                     set sslrootcert=/path/to/ca.pem in database.url to the CA that signed it"
                .to_owned(),
        })
    } else if message.contains("NotValidForName") || message.contains("not valid for name") {
        let host = url::Url::parse(url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default();
        Some(format!(
            "the server's certificate does not name the host {host:?} (sslmode=verify-full): \
             connect to a host name the certificate names, or use sslmode=verify-ca"
        ))
    } else {
        None
    };
    match hint {
        Some(hint) => format!("{message}; {hint}"),
        None => message,
    }
}

impl Store {
    /// Opens a pool; `sqlite:` URLs get `mode=rwc` so a new file is created.
    pub async fn connect(
        url: &str,
        table: &str,
        max_connections: u32,
        connect_timeout: Duration,
    ) -> Result<Self, StoreError> {
        install_crypto_provider();
        let mut opts = ConnectOptions::new(url.to_owned());
        opts.max_connections(max_connections)
            .min_connections(0)
            .connect_timeout(connect_timeout)
            .acquire_timeout(connect_timeout)
            // sqlx pings every connection it hands out (its default):
            // one more round trip per statement, but a connection whose
            // statement was given up at its deadline mid-answer (a silent
            // network path) is found broken there and replaced; pinging
            // only idle ones left such a connection in the pool, and every
            // later statement on it hung (consumer::a_database_that_stops_
            // answering_stalls_nothing_for_good).
            .sqlx_logging(false);
        let db = Database::connect(opts)
            .await
            .map_err(|e| StoreError::Connect {
                url: crate::config::secret_free_url(url),
                message: connect_message(url, &e),
            })?;
        let mut store = Self::new(db, table);
        store.learn_columns().await;
        Ok(store)
    }

    /// [`Store::connect`] with the settings' database, history and
    /// dispatch keys.
    pub async fn open(settings: &crate::config::Settings) -> Result<Self, StoreError> {
        let store = Self::connect(
            settings.database_url(),
            &settings.database.table,
            settings.database.max_connections,
            settings.database.connect_timeout,
        )
        .await?
        .with_pause_table(&settings.dispatch.pause_table);
        Ok(if settings.history.enabled {
            store.with_history(&settings.history.table, &settings.history.replica_name())
        } else {
            store.without_history()
        })
    }

    /// A store on `table` with the defaults of the settings: the attempt
    /// log on, in its default table, and the default pause table.
    pub fn new(db: DatabaseConnection, table: &str) -> Self {
        let history = crate::config::HistorySettings::default();
        Self {
            db,
            table: table.to_owned(),
            last_error_chars: None,
            payload_is_json: false,
            history: Some(std::sync::Arc::new(history::HistoryTable {
                table: history.table.clone(),
                replica: history.replica_name(),
            })),
            pause_table: crate::config::DispatchSettings::default().pause_table,
        }
    }

    /// Writes no attempt log (`history.enabled = false`).
    pub fn without_history(mut self) -> Self {
        self.history = None;
        self
    }

    /// Writes the attempt log to `table`, as replica `replica`.
    pub fn with_history(mut self, table: &str, replica: &str) -> Self {
        self.history = Some(std::sync::Arc::new(history::HistoryTable {
            table: table.to_owned(),
            replica: replica.to_owned(),
        }));
        self
    }

    /// Keeps the paused dispatchers in `table`.
    pub fn with_pause_table(mut self, table: &str) -> Self {
        self.pause_table = table.to_owned();
        self
    }

    /// The attempt log, when it is on.
    pub fn history_table(&self) -> Option<&history::HistoryTable> {
        self.history.as_deref()
    }

    pub fn pause_table(&self) -> &str {
        &self.pause_table
    }

    /// Learns from the catalogue the length of `last_error` (no table
    /// yet, or no length: errors are cut to [`MAX_LAST_ERROR_BYTES`] only)
    /// and whether the payload column holds only JSON.
    pub async fn learn_columns(&mut self) {
        match self.columns().await {
            Ok(columns) => {
                for c in columns {
                    if c.name.eq_ignore_ascii_case("last_error") {
                        self.last_error_chars = c
                            .max_chars
                            .and_then(|n| usize::try_from(n).ok())
                            .filter(|n| *n > 0);
                    } else if c.name.eq_ignore_ascii_case("payload") {
                        self.payload_is_json = payload_type_is_json(self.backend(), &c.data_type);
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot read the table's column types"),
        }
    }

    /// Whether every payload this table can hold is JSON, so that a row
    /// read from it is sent without parsing its payload first (a `text`
    /// column can hold anything: its rows are checked).
    pub fn payload_is_json(&self) -> bool {
        self.payload_is_json
    }

    /// Cuts an error to what `last_error` holds (see [`truncate_error_to`]).
    pub fn truncate_error(&self, error: &str) -> String {
        truncate_error_to(error, self.last_error_chars)
    }

    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub(crate) fn backend(&self) -> DbBackend {
        self.db.get_database_backend()
    }

    fn tbl(&self) -> Alias {
        Alias::new(&self.table)
    }

    /// Creates the table and index when missing (`outbox-sidecar migrate`).
    /// Also the sidecar's own tables: the attempt log (when on) and the
    /// paused dispatchers.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migration::apply(&self.db, &self.table)
            .await
            .map_err(db_err("migrating the outbox table"))?;
        if let Some(h) = &self.history {
            migration::apply_attempt_log(&self.db, &h.table)
                .await
                .map_err(db_err("creating the attempt log table"))?;
        }
        migration::apply_pauses(&self.db, &self.pause_table)
            .await
            .map_err(db_err("creating the dispatcher pause table"))
    }

    /// Start-up check of the sidecar's own tables: they exist (`migrate`
    /// made them). Run after [`Store::check_table`].
    pub async fn check_own_tables(&self) -> Result<(), TableError> {
        let mut own = vec![(self.pause_table.clone(), "dispatch.pause_table", "")];
        if let Some(h) = &self.history {
            own.push((
                h.table.clone(),
                "history.table",
                ", or set history.enabled = false",
            ));
        }
        for (table, key, hint) in own {
            let probe = Query::select()
                .expr(Expr::val(1))
                .from(Alias::new(&table))
                .limit(1)
                .to_owned();
            if let Err(e) = self.db.query_all(&probe).await {
                let error = StoreError::Database {
                    action: "checking the sidecar's tables",
                    source: e,
                };
                if error.is_transient() {
                    return Err(TableError::Store(error));
                }
                return Err(TableError::OwnMissing { table, key, hint });
            }
        }
        Ok(())
    }

    /// A cheap round trip for readiness.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.db.ping().await.map_err(db_err("pinging the database"))
    }

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
    fn select_rows(&self) -> SelectStatement {
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
        stmt.from(self.tbl()).to_owned()
    }

    async fn fetch(&self, stmt: &SelectStatement) -> Result<Vec<OutboxEventRow>, DbErr> {
        let rows = self.db.query_all(stmt).await?;
        rows.iter().map(decode_row).collect()
    }

    /// As [`Store::get_many`], each row decoded on its own. A row whose
    /// very id cannot be read is left out (it reads as missing).
    pub async fn read_rows(&self, ids: &[i64]) -> Result<Vec<RowRead>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let stmt = self.select_ids(ids);
        let rows = self
            .db
            .query_all(&stmt)
            .await
            .map_err(db_err("reading events"))?;
        Ok(rows
            .iter()
            .filter_map(|r| match decode_row(r) {
                Ok(row) => Some(RowRead::Row(row)),
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

    /// R-004 `mark_sent!`: `pending` → `sent`, from exactly the state `seen`.
    pub async fn mark_sent(&self, seen: &OutboxEventRow) -> Result<Outcome, StoreError> {
        let now = now();
        let next = transition::after_success(seen, now);
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
        max_attempts: i32,
    ) -> Result<Outcome, StoreError> {
        let next = self.after_failure(seen, error, now(), max_attempts);
        let values = failure_values(&next);
        self.step(seen, next, values, "registering a failure").await
    }

    /// The row after a failed attempt of `seen`, written at `now`.
    pub(crate) fn after_failure(
        &self,
        seen: &OutboxEventRow,
        error: &str,
        now: NaiveDateTime,
        max_attempts: i32,
    ) -> OutboxEventRow {
        transition::after_failure(seen, self.truncate_error(error), now, max_attempts)
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
        self.resend_statement_at(now())
    }

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
            let mut row = before;
            row.status = Status::Pending;
            row.attempts = 0;
            row.last_error = None;
            row.updated_at = now;
            return Ok(Ok(row));
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
        let action = "resending failed events";
        let Some(h) = self.history.clone() else {
            let mut stmt = self.resend_statement();
            for cond in self.failed_conditions(filter) {
                stmt.and_where(cond);
            }
            let res = self.db.execute(&stmt).await.map_err(db_err(action))?;
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

    fn failed_conditions(&self, f: &FailedFilter) -> Vec<sea_orm::sea_query::SimpleExpr> {
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
    async fn touch_ids(&self, ids: &[i64]) -> Result<u64, StoreError> {
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

    /// The table's name quoted for this backend's SQL.
    pub(crate) fn quoted_table(&self) -> String {
        match self.backend() {
            DbBackend::MySql => format!("`{}`", self.table.replace('`', "``")),
            _ => history::quoted(&self.table),
        }
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
/// attempts to `attempts` (see [`crate::transition`]).
pub use crate::transition::status_after_failure as next_status_after_failure;

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
fn decode_row(r: &QueryResult) -> Result<OutboxEventRow, DbErr> {
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
    })
}
