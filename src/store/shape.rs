//! The start-up check of the outbox table (`run` and `migrate`): the
//! columns R-004 names exist with types the sidecar can read and write, or
//! one message names the column, what it is and what is expected. A table
//! the sidecar cannot work with is refused before anything is consumed,
//! instead of every row reading as undecodable (and skipped) later.
//!
//! Accepted, as Rails and the sidecar's own migration create them:
//!
//! | column | PostgreSQL | MySQL / MariaDB |
//! |---|---|---|
//! | `id` | `bigint`, `integer` (bigserial, identity) | `bigint`, `int` |
//! | `event_name`, `status`, `last_error` | `varchar[(n)]`, `text`, `char(n)` | `varchar(n)`, `text` kinds, `char(n)` |
//! | `payload` | `jsonb`, `json`, `text`, `varchar` | `json` (MariaDB: `longtext`), `text` kinds |
//! | `attempts` | `integer`, `bigint`, `smallint` | `int`, `bigint` and the other integers |
//! | `sent_at`, `created_at`, `updated_at` | `timestamp[(p)]`, `timestamptz` | `datetime[(p)]`, `timestamp` |
//!
//! The reads cast each column to the entity's type (`Store::select_rows`):
//! the payload to its text, `attempts` to `integer`, a `timestamptz` to its
//! UTC time. Writes store UTC values, which a `timestamptz` column takes
//! as UTC instants (sqlx opens every PostgreSQL session with
//! `TimeZone=UTC`, whatever the database's `timezone` setting).
//!
//! Refused by name: a `uuid` (or any non-integer) id, an integer `status`
//! (a Rails `enum`), a payload that is neither JSON nor text, a
//! non-integer `attempts`, timestamps of another type (a `date`, a
//! `time`). SQLite declares types loosely and is not checked beyond the
//! columns' presence.

use sea_orm::{ConnectionTrait, DbBackend, Statement};

use super::{db_err, Store, StoreError};

/// Why the table cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error(
        "table {table:?} (database.table) does not exist: run `outbox-sidecar migrate`, or point \
         database.table at the application's outbox table"
    )]
    Missing { table: String },
    #[error("column {table}.{column} is missing: the sidecar needs {expected}")]
    MissingColumn {
        table: String,
        column: &'static str,
        expected: &'static str,
    },
    #[error("column {table}.{column} is {found}: {why}")]
    WrongType {
        table: String,
        column: &'static str,
        found: String,
        why: String,
    },
    /// A table of the sidecar's own (the attempt log, the pauses) that
    /// `migrate` has not created yet.
    #[error("table {table:?} ({key}) does not exist: run `outbox-sidecar migrate`{hint}")]
    OwnMissing {
        table: String,
        key: &'static str,
        hint: &'static str,
    },
    /// A column named by the configuration (`[tracing] column`) that the
    /// table does not have, or cannot be read as text.
    #[error("column {table}.{column} ({key}) {why}")]
    Configured {
        table: String,
        column: String,
        key: &'static str,
        why: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One column as the catalogue describes it.
#[derive(Debug, Clone)]
pub struct ColumnInfo {
    pub name: String,
    /// Lower case, e.g. `character varying`, `timestamp without time zone`,
    /// `varchar`, `datetime`.
    pub data_type: String,
    /// A string column's length in characters, when it has one
    /// (`varchar(255)`); none on SQLite.
    pub max_chars: Option<i64>,
}

const STRINGS: &str = "a string column (varchar or text)";

/// What each column must be on `backend`: `Ok` or why not.
pub fn check_column(backend: DbBackend, column: &str, data_type: &str) -> Result<(), String> {
    let t = data_type.to_ascii_lowercase();
    let t = t.as_str();
    let pg = backend == DbBackend::Postgres;
    let is_int = |t: &str| {
        matches!(
            t,
            "bigint" | "integer" | "int" | "int4" | "int8" | "mediumint" | "smallint" | "tinyint"
        )
    };
    let is_string = |t: &str| {
        matches!(
            t,
            "character varying"
                | "varchar"
                | "text"
                | "character"
                | "char"
                | "tinytext"
                | "mediumtext"
                | "longtext"
        )
    };
    match column {
        "id" => match t {
            "bigint" | "integer" | "int" => Ok(()),
            "uuid" => Err(
                "a uuid primary key is not supported: the sidecar needs an integer id \
                 (Debezium's message key, the Idempotency-Key)"
                    .into(),
            ),
            _ => Err("the sidecar needs an integer id (bigint or integer)".into()),
        },
        "event_name" | "status" | "last_error" => {
            if is_string(t) {
                Ok(())
            } else if column == "status" && is_int(t) {
                Err(
                    "an integer status (a Rails enum) is not supported: the sidecar reads and \
                     writes the strings pending, sent and failed"
                        .into(),
                )
            } else {
                Err(format!("the sidecar needs {STRINGS}"))
            }
        }
        "payload" => match t {
            "jsonb" | "json" | "text" => Ok(()),
            "character varying" if pg => Ok(()),
            "longtext" | "mediumtext" if !pg => Ok(()),
            _ => Err(
                "the sidecar needs the JSON as json, jsonb or text (MySQL: json or a text kind)"
                    .into(),
            ),
        },
        "attempts" => {
            if is_int(t) {
                Ok(())
            } else {
                Err("the sidecar needs an integer attempts column".into())
            }
        }
        "sent_at" | "created_at" | "updated_at" => match t {
            "timestamp without time zone" | "timestamp with time zone" if pg => Ok(()),
            "datetime" | "timestamp" if !pg => Ok(()),
            _ => Err(
                "the sidecar needs a timestamp or timestamptz (PostgreSQL), datetime or \
                 timestamp (MySQL)"
                    .into(),
            ),
        },
        _ => Ok(()),
    }
}

/// The columns the sidecar reads or writes, and what each must be.
pub const REQUIRED: [(&str, &str); 9] = [
    ("id", "an integer primary key"),
    ("event_name", STRINGS),
    ("payload", "a json, jsonb or text column"),
    ("status", STRINGS),
    ("attempts", "an integer column"),
    ("last_error", STRINGS),
    ("sent_at", "a timestamp column"),
    ("created_at", "a timestamp column"),
    ("updated_at", "a timestamp column"),
];

impl Store {
    /// The table's columns from the catalogue (empty: no such table).
    pub async fn columns(&self) -> Result<Vec<ColumnInfo>, StoreError> {
        self.columns_of(self.table()).await
    }

    /// `table`'s columns from the catalogue (empty: no such table).
    pub async fn columns_of(&self, table: &str) -> Result<Vec<ColumnInfo>, StoreError> {
        let backend = self.backend();
        let sql = match backend {
            DbBackend::Postgres => {
                "SELECT column_name::text AS name, data_type::text AS data_type, \
                 character_maximum_length::bigint AS max_chars \
                 FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = $1"
            }
            DbBackend::MySql => {
                "SELECT CAST(column_name AS CHAR) AS name, CAST(data_type AS CHAR) AS data_type, \
                 CAST(character_maximum_length AS SIGNED) AS max_chars \
                 FROM information_schema.columns \
                 WHERE table_schema = DATABASE() AND table_name = ?"
            }
            _ => {
                "SELECT name AS name, lower(type) AS data_type, NULL AS max_chars \
                 FROM pragma_table_info(?)"
            }
        };
        let rows = self
            .connection()
            .query_all_raw(Statement::from_sql_and_values(
                backend,
                sql,
                [table.to_owned().into()],
            ))
            .await
            .map_err(db_err("reading the table's columns"))?;
        rows.iter()
            .map(|r| {
                Ok(ColumnInfo {
                    name: r.try_get("", "name")?,
                    data_type: r.try_get::<String>("", "data_type")?.to_ascii_lowercase(),
                    max_chars: r.try_get("", "max_chars")?,
                })
            })
            .collect::<Result<_, sea_orm::DbErr>>()
            .map_err(db_err("reading the table's columns"))
    }

    /// Checks that the table has every column the sidecar needs, with a
    /// type it can read and write (see the module's table).
    pub async fn check_table(&self) -> Result<(), TableError> {
        let columns = self.columns().await?;
        let table = self.table().to_owned();
        if columns.is_empty() {
            return Err(TableError::Missing { table });
        }
        for (column, expected) in REQUIRED {
            let Some(info) = columns.iter().find(|c| c.name.eq_ignore_ascii_case(column)) else {
                return Err(TableError::MissingColumn {
                    table,
                    column,
                    expected,
                });
            };
            if self.backend() == DbBackend::Sqlite {
                continue;
            }
            if let Err(why) = check_column(self.backend(), column, &info.data_type) {
                return Err(TableError::WrongType {
                    table,
                    column,
                    found: info.data_type.clone(),
                    why,
                });
            }
        }
        if let Some(trace) = self.trace_columns() {
            for (key, column) in std::iter::once(("tracing.column", &trace.column)).chain(
                trace
                    .state_column
                    .iter()
                    .map(|c| ("tracing.state_column", c)),
            ) {
                let why = match columns.iter().find(|c| c.name.eq_ignore_ascii_case(column)) {
                    None => "does not exist: add it (a string column the application fills \
                             with the request's W3C trace context), or unset the key"
                        .to_owned(),
                    Some(info)
                        if self.backend() != DbBackend::Sqlite
                            && check_column(self.backend(), "event_name", &info.data_type)
                                .is_err() =>
                    {
                        format!("is {}: the sidecar needs {STRINGS}", info.data_type)
                    }
                    Some(_) => continue,
                };
                return Err(TableError::Configured {
                    table,
                    column: column.clone(),
                    key,
                    why,
                });
            }
        }
        if let Some(o) = self.ordering() {
            if !columns
                .iter()
                .any(|c| c.name.eq_ignore_ascii_case(&o.column))
            {
                return Err(TableError::Configured {
                    table,
                    column: o.column.clone(),
                    key: "ordering.column",
                    why: "does not exist: add it (the aggregate each event belongs to, e.g. a \
                          generated column from the payload), or unset the key"
                        .to_owned(),
                });
            }
        }
        Ok(())
    }
}

impl Store {
    /// Whether some index of the table has `status` as its first column
    /// (what the gauges' counts and the pending/failed reads need to touch
    /// only the rows of one status). `None` where the catalogue is not read
    /// (SQLite: small tables).
    pub async fn has_status_index(&self) -> Result<Option<bool>, StoreError> {
        self.has_index_on("status").await
    }

    /// Whether some index of the table has `column` as its first column;
    /// `None` where the catalogue is not read (SQLite).
    pub async fn has_index_on(&self, column: &str) -> Result<Option<bool>, StoreError> {
        let backend = self.backend();
        let (sql, table) = match backend {
            DbBackend::Postgres => (
                "SELECT count(*) AS n FROM pg_index i \
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
                 WHERE i.indrelid = to_regclass($1) AND a.attname = $2",
                super::history::quoted(self.table()),
            ),
            DbBackend::MySql => (
                "SELECT count(*) AS n FROM information_schema.statistics \
                 WHERE table_schema = DATABASE() AND table_name = ? \
                 AND seq_in_index = 1 AND column_name = ?",
                self.table().to_owned(),
            ),
            _ => return Ok(None),
        };
        let err = || db_err("reading the table's indexes");
        let n: i64 = self
            .connection()
            .query_one_raw(Statement::from_sql_and_values(
                backend,
                sql,
                [table.into(), column.to_owned().into()],
            ))
            .await
            .map_err(err())?
            .map(|r| r.try_get("", "n"))
            .transpose()
            .map_err(err())?
            .unwrap_or(0);
        Ok(Some(n > 0))
    }

    /// The statement that creates the index the gauges need, when the table
    /// has none with `status` first; `None` when it has one (or on SQLite).
    /// On PostgreSQL `CONCURRENTLY`, so a large table keeps taking writes.
    pub async fn status_index_advice(&self) -> Result<Option<String>, StoreError> {
        if self.has_status_index().await? != Some(false) {
            return Ok(None);
        }
        let name = format!("index_{}_on_status", self.table());
        Ok(Some(match self.backend() {
            DbBackend::Postgres => format!(
                "CREATE INDEX CONCURRENTLY {} ON {} (status)",
                super::history::quoted(&name),
                self.quoted_table()
            ),
            _ => format!(
                "CREATE INDEX `{}` ON {} (status)",
                name.replace('`', "``"),
                self.quoted_table()
            ),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rails_shapes_pass_and_the_unworkable_are_named() {
        let pg = DbBackend::Postgres;
        let my = DbBackend::MySql;
        for (col, t) in [
            ("id", "bigint"),
            ("id", "integer"),
            ("status", "character varying"),
            ("last_error", "text"),
            ("payload", "jsonb"),
            ("payload", "json"),
            ("payload", "text"),
            ("attempts", "integer"),
            ("attempts", "bigint"),
            ("updated_at", "timestamp without time zone"),
            ("updated_at", "timestamp with time zone"),
        ] {
            assert_eq!(check_column(pg, col, t), Ok(()), "{col} {t}");
        }
        for (col, t) in [
            ("id", "int"),
            ("status", "varchar"),
            ("payload", "longtext"),
            ("payload", "json"),
            ("attempts", "int"),
            ("attempts", "bigint"),
            ("updated_at", "datetime"),
            ("sent_at", "timestamp"),
        ] {
            assert_eq!(check_column(my, col, t), Ok(()), "{col} {t}");
        }
        assert!(check_column(pg, "id", "uuid")
            .unwrap_err()
            .contains("uuid primary key"));
        assert!(check_column(my, "status", "int")
            .unwrap_err()
            .contains("Rails enum"));
        assert!(check_column(pg, "updated_at", "date")
            .unwrap_err()
            .contains("timestamp or timestamptz"));
        assert!(check_column(pg, "payload", "bytea")
            .unwrap_err()
            .contains("json, jsonb or text"));
        assert!(check_column(pg, "attempts", "numeric")
            .unwrap_err()
            .contains("integer attempts"));
    }
}
