//! Opening the store: the pool (with the TLS provider and the connect
//! errors made readable), the settings' tables, what the catalogue says of
//! the columns, and `migrate`.

use std::time::Duration;

use sea_orm::sea_query::{Alias, Expr, Query};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, DbErr};

use super::{db_err, history, truncate_error_to, Store, StoreError, TableError};

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

/// How long an unused pooled connection stays open, unless configured.
const DEFAULT_IDLE: Duration = Duration::from_secs(60);

impl Store {
    /// Opens a pool; `sqlite:` URLs get `mode=rwc` so a new file is created.
    pub async fn connect(
        url: &str,
        table: &str,
        max_connections: u32,
        connect_timeout: Duration,
    ) -> Result<Self, StoreError> {
        Self::connect_pool(url, table, max_connections, connect_timeout, DEFAULT_IDLE).await
    }

    /// [`Store::connect`] with the pool's idle timeout: connections unused
    /// that long are closed (none is kept open at rest).
    pub async fn connect_pool(
        url: &str,
        table: &str,
        max_connections: u32,
        connect_timeout: Duration,
        idle_timeout: Duration,
    ) -> Result<Self, StoreError> {
        install_crypto_provider();
        let mut opts = ConnectOptions::new(url.to_owned());
        opts.max_connections(max_connections)
            .min_connections(0)
            .idle_timeout(idle_timeout)
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
        Self::open_with(settings, settings.database.max_connections).await
    }

    /// A store of its own one-connection pool, for the periodic reads every
    /// replica makes (table gauges, pauses): they never open a second
    /// connection, and the main pool, which only the work uses, shrinks to
    /// none when there is no work (sqlx hands its idle connections out in
    /// turn, so periodic reads on it would keep every one of them alive).
    pub async fn open_background(settings: &crate::config::Settings) -> Result<Self, StoreError> {
        Self::open_with(settings, 1).await
    }

    async fn open_with(
        settings: &crate::config::Settings,
        max_connections: u32,
    ) -> Result<Self, StoreError> {
        let store = Self::connect_pool(
            settings.database_url(),
            &settings.database.table,
            max_connections,
            settings.database.connect_timeout,
            settings.database.idle_timeout,
        )
        .await?
        .with_pause_table(&settings.dispatch.pause_table)
        .with_operations_table(&settings.dispatch.operations_table);
        let store = if settings.history.enabled {
            store.with_history(&settings.history.table, &settings.history.replica_name())
        } else {
            store.without_history()
        };
        let tracing = &settings.tracing;
        let columns = tracing.column.as_ref().map(|column| super::TraceColumns {
            column: column.clone(),
            state_column: tracing.state_column.clone(),
        });
        let ordering = settings
            .ordering
            .column
            .as_ref()
            .map(|column| super::OrderingColumns {
                column: column.clone(),
                hold: settings.ordering.on_failed == crate::config::OnFailed::Hold,
            });
        Ok(store
            .with_tracing(columns, tracing.enabled())
            .with_ordering(ordering))
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
                trace_ids: false,
            })),
            pause_table: crate::config::DispatchSettings::default().pause_table,
            operations_table: crate::config::DispatchSettings::default().operations_table,
            trace: None,
            ordering: None,
        }
    }

    /// Reads the trace context's columns with each row, and writes the
    /// trace id into the attempt log (`[tracing] column`).
    /// `log_trace_ids`: `[tracing]` is on (a column or an exporter), so
    /// each attempt has a trace id to log; call after `with_history`.
    pub fn with_tracing(
        mut self,
        columns: Option<super::TraceColumns>,
        log_trace_ids: bool,
    ) -> Self {
        self.trace = columns;
        if let Some(h) = &self.history {
            let mut h = (**h).clone();
            h.trace_ids = log_trace_ids;
            self.history = Some(std::sync::Arc::new(h));
        }
        self
    }

    pub fn trace_columns(&self) -> Option<&super::TraceColumns> {
        self.trace.as_ref()
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
            trace_ids: false,
        }));
        self
    }

    /// Counts every statement sent through this store (and its clones made
    /// after) in `counter` (`outbox_db_statements_total`).
    pub fn count_statements(mut self, counter: prometheus::IntCounter) -> Self {
        self.db
            .set_metric_callback(move |_info: &sea_orm::metric::Info<'_>| counter.inc());
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

    /// Keeps operator actions' progress in `table`.
    pub fn with_operations_table(mut self, table: &str) -> Self {
        self.operations_table = table.to_owned();
        self
    }

    pub fn operations_table(&self) -> &str {
        &self.operations_table
    }

    /// Learns from the catalogue the length of `last_error` (no table
    /// yet, or no length: errors are cut to [`super::MAX_LAST_ERROR_BYTES`] only)
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

    pub(super) fn tbl(&self) -> Alias {
        Alias::new(&self.table)
    }

    /// The table's name quoted for this backend's SQL.
    pub(crate) fn quoted_table(&self) -> String {
        match self.backend() {
            DbBackend::MySql => format!("`{}`", self.table.replace('`', "``")),
            _ => history::quoted(&self.table),
        }
    }

    /// Creates the table and index when missing (`outbox-sidecar migrate`).
    /// Also the sidecar's own tables: the attempt log (when on) and the
    /// paused dispatchers.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let created = self.columns().await?.is_empty();
        migration::apply(&self.db, &self.table)
            .await
            .map_err(db_err("migrating the outbox table"))?;
        if created {
            self.add_named_columns().await?;
        }
        if let Some(h) = &self.history {
            migration::apply_attempt_log(&self.db, &h.table)
                .await
                .map_err(db_err("creating the attempt log table"))?;
        }
        migration::apply_pauses(&self.db, &self.pause_table)
            .await
            .map_err(db_err("creating the dispatcher pause table"))?;
        migration::apply_operations(&self.db, &self.operations_table)
            .await
            .map_err(db_err("creating the operations table"))
    }

    /// On a table `migrate` has just created: the columns the settings
    /// name (`[ordering] column`, `[tracing] column` and `state_column`),
    /// nullable text, and the ordering column's `(column, id)` index, so a
    /// migration Job run with the sidecar's own configuration is enough on
    /// a first deploy. An application's existing table is never changed:
    /// `check_table` names what it lacks.
    async fn add_named_columns(&self) -> Result<(), StoreError> {
        let t = self.quoted_table();
        let quote = |c: &str| match self.backend() {
            DbBackend::MySql => format!("`{}`", c.replace('`', "``")),
            _ => history::quoted(c),
        };
        let mut statements = Vec::new();
        if let Some(o) = &self.ordering {
            // MySQL indexes a VARCHAR, not a TEXT, whole.
            let kind = match self.backend() {
                DbBackend::MySql => "VARCHAR(255) NULL",
                _ => "TEXT NULL",
            };
            let c = quote(&o.column);
            statements.push(format!("ALTER TABLE {t} ADD COLUMN {c} {kind}"));
            let index = quote(&format!("{}_{}_id_idx", self.table, o.column));
            statements.push(format!("CREATE INDEX {index} ON {t} ({c}, id)"));
        }
        if let Some(tc) = &self.trace {
            for column in std::iter::once(&tc.column).chain(tc.state_column.as_ref()) {
                let c = quote(column);
                statements.push(format!("ALTER TABLE {t} ADD COLUMN {c} TEXT NULL"));
            }
        }
        for sql in statements {
            self.db
                .execute_unprepared(&sql)
                .await
                .map_err(db_err("adding the columns the settings name"))?;
        }
        Ok(())
    }

    /// Start-up check of the sidecar's own tables: they exist (`migrate`
    /// made them). Run after [`Store::check_table`].
    pub async fn check_own_tables(&self) -> Result<(), TableError> {
        let mut own = vec![
            (self.pause_table.clone(), "dispatch.pause_table", ""),
            (
                self.operations_table.clone(),
                "dispatch.operations_table",
                "",
            ),
        ];
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
        // The log made before trace context has no trace_id: `migrate` adds it.
        if let Some(h) = self.history.as_ref().filter(|h| h.trace_ids) {
            let columns = self.columns_of(&h.table).await?;
            if !columns
                .iter()
                .any(|c| c.name.eq_ignore_ascii_case("trace_id"))
            {
                return Err(TableError::Configured {
                    table: h.table.clone(),
                    column: "trace_id".to_owned(),
                    key: "history.table",
                    why: "is missing ([tracing] is on and logs each attempt's trace id): run \
                          `outbox-sidecar migrate`"
                        .to_owned(),
                });
            }
        }
        Ok(())
    }

    /// A cheap round trip for readiness.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.db.ping().await.map_err(db_err("pinging the database"))
    }
}
