//! The attempt log (`[history]`, issue #18): one row per attempt, written
//! with the attempt's status in the same statement (PostgreSQL) or the same
//! transaction (elsewhere), so an attempt is on record exactly when its
//! status is; and one row per resend, written with the resend.
//!
//! The log lives in its own table beside the application's: nothing of
//! R-004's columns changes, `events prune` deletes only log rows.

use chrono::NaiveDateTime;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Order, Query};
use sea_orm::{ConnectionTrait, DbBackend, FromQueryResult, Statement};
use serde::Serialize;

use super::{db_err, now, Store, StoreError};

/// What an attempt's row holds about the attempt itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub event_id: i64,
    /// 1-based: the attempt this was.
    pub attempt: i32,
    pub started_at: NaiveDateTime,
    pub duration_ms: i32,
    /// The receiver's status code, when it answered.
    pub http_status: Option<u16>,
    /// A redacted excerpt of the response, or the error text.
    pub detail: Option<String>,
    /// The attempt's W3C trace id (32 hex digits), with `[tracing]` on.
    pub trace_id: Option<String>,
}

/// How a resend was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Via {
    #[serde(rename = "cli")]
    Cli,
    #[serde(rename = "admin-api")]
    AdminApi,
    #[serde(rename = "console")]
    Console,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Cli => "cli",
            Via::AdminApi => "admin-api",
            Via::Console => "console",
        }
    }
}

/// Who asked for an operator action: through what, and the caller's label
/// (`--label`, `?label=`) when given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub via: Via,
    pub label: Option<String>,
}

impl Caller {
    pub fn new(via: Via, label: Option<String>) -> Self {
        let label = label
            .map(|l| {
                l.chars()
                    .filter(|c| !c.is_control())
                    .take(255)
                    .collect::<String>()
            })
            .filter(|l| !l.trim().is_empty());
        Caller { via, label }
    }
}

/// Where the log is written and who writes it.
#[derive(Debug, Clone)]
pub struct HistoryTable {
    pub table: String,
    /// This replica's name, written with each attempt.
    pub replica: String,
    /// Each attempt's trace id goes into the `trace_id` column
    /// (`[tracing]` on; `migrate` adds the column).
    pub trace_ids: bool,
}

/// One row of the log, as `events show` and `GET /admin/events/{id}` show it.
#[derive(
    Debug, Clone, PartialEq, Serialize, serde::Deserialize, FromQueryResult, utoipa::ToSchema,
)]
pub struct Record {
    pub id: i64,
    pub event_id: i64,
    /// `attempt` or `resend`.
    pub kind: String,
    pub attempt: Option<i32>,
    /// When the attempt started, or when the resend was made (UTC).
    pub started_at: NaiveDateTime,
    pub duration_ms: Option<i32>,
    /// `success` or `failure` (attempts only).
    pub outcome: Option<String>,
    pub http_status: Option<i32>,
    pub detail: Option<String>,
    pub replica: Option<String>,
    /// `cli`, `admin-api` or `console` (resends only).
    pub via: Option<String>,
    pub label: Option<String>,
    /// The attempt's W3C trace id (with `[tracing]` on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// `detail` is cut as `last_error` is (an excerpt is ≤ 200 bytes anyway).
fn cut(detail: &Option<String>) -> Option<String> {
    detail.as_deref().map(super::truncate_error)
}

/// One column of `attempts` as a PostgreSQL array parameter.
fn array<'a, T>(
    attempts: impl Iterator<Item = &'a Attempt>,
    column: impl Fn(&Attempt) -> T,
) -> sea_orm::Value
where
    Vec<T>: Into<sea_orm::Value>,
{
    attempts.map(column).collect::<Vec<T>>().into()
}

/// The attempts' own columns as five PostgreSQL array parameters, in this
/// order: attempt, started_at, duration_ms, http_status (0: none), detail
/// ('': none).
pub(crate) fn columns<'a>(
    attempts: impl Iterator<Item = &'a Attempt> + Clone,
) -> [sea_orm::Value; 5] {
    [
        array(attempts.clone(), |a| a.attempt),
        array(attempts.clone(), |a| a.started_at),
        array(attempts.clone(), |a| a.duration_ms),
        array(attempts.clone(), |a| a.http_status.map_or(0, i32::from)),
        array(attempts, |a| cut(&a.detail).unwrap_or_default()),
    ]
}

/// The attempts' trace ids as a PostgreSQL array parameter ('': none).
pub(crate) fn trace_ids<'a>(attempts: impl Iterator<Item = &'a Attempt>) -> sea_orm::Value {
    array(attempts, |a| a.trace_id.clone().unwrap_or_default())
}

impl HistoryTable {
    /// The SQL pieces that add the trace id to an attempt INSERT fed by an
    /// `unnest`, when the log keeps it: the column list's `, trace_id`,
    /// the `unnest` argument (`, $n::text[]`), its alias and the value
    /// selected. Empty strings with the trace ids off.
    pub(crate) fn trace_sql(&self, param: Option<&str>) -> [String; 4] {
        match (self.trace_ids, param) {
            (true, Some(p)) => [
                ", trace_id".to_owned(),
                format!(", {p}::text[]"),
                ", trace_id".to_owned(),
                ", NULLIF(trace_id, '')".to_owned(),
            ],
            _ => Default::default(),
        }
    }
}

pub(crate) fn quoted(table: &str) -> String {
    format!("\"{}\"", table.replace('"', "\"\""))
}

impl HistoryTable {
    /// PostgreSQL: the INSERT of `attempts` (their outcome `outcome`) as a
    /// data-modifying CTE named `h`, taking only the events the `u` CTE
    /// returned (the status writes that applied). Parameters from `$first`.
    pub(crate) fn pg_cte(
        &self,
        attempts: &[Attempt],
        outcome: &'static str,
        first: usize,
    ) -> (String, Vec<sea_orm::Value>) {
        let p = |i: usize| format!("${}", first + i);
        let [trace_col, trace_arg, trace_alias, _] = self.trace_sql(Some(&p(8)));
        let trace_val = if self.trace_ids {
            ", NULLIF(a.trace_id, '')"
        } else {
            ""
        };
        let sql = format!(
            ", h AS (INSERT INTO {table} (event_id, kind, attempt, started_at, duration_ms, \
             outcome, http_status, detail, replica{trace_col}) \
             SELECT a.id, 'attempt', a.attempt, a.started_at, a.duration_ms, {outcome_p}, \
             NULLIF(a.http_status, 0), NULLIF(a.detail, ''), {replica_p}{trace_val} \
             FROM unnest({ids}::bigint[], {atts}::integer[], {starts}::timestamp[], \
             {durs}::integer[], {codes}::integer[], {details}::text[]{trace_arg}) \
             AS a(id, attempt, started_at, duration_ms, http_status, detail{trace_alias}) \
             JOIN u ON u.id = a.id)",
            table = quoted(&self.table),
            outcome_p = p(0),
            replica_p = p(1),
            ids = p(2),
            atts = p(3),
            starts = p(4),
            durs = p(5),
            codes = p(6),
            details = p(7),
        );
        let mut values = vec![
            outcome.into(),
            self.replica.clone().into(),
            array(attempts.iter(), |a| a.event_id),
        ];
        values.extend(columns(attempts.iter()));
        if self.trace_ids {
            values.push(trace_ids(attempts.iter()));
        }
        (sql, values)
    }

    /// One multi-row INSERT of `attempts` (MySQL, SQLite: run in the
    /// status write's transaction).
    pub(crate) fn insert_attempts(
        &self,
        backend: DbBackend,
        attempts: &[&Attempt],
        outcome: &'static str,
    ) -> Option<Statement> {
        if attempts.is_empty() {
            return None;
        }
        let mut names = vec![
            "event_id",
            "kind",
            "attempt",
            "started_at",
            "duration_ms",
            "outcome",
            "http_status",
            "detail",
            "replica",
        ];
        if self.trace_ids {
            names.push("trace_id");
        }
        let mut insert = Query::insert()
            .into_table(Alias::new(&self.table))
            .columns(names.into_iter().map(Alias::new))
            .to_owned();
        for a in attempts {
            let mut values: Vec<sea_orm::sea_query::SimpleExpr> = vec![
                a.event_id.into(),
                "attempt".into(),
                a.attempt.into(),
                a.started_at.into(),
                a.duration_ms.into(),
                outcome.into(),
                a.http_status.map(i32::from).into(),
                cut(&a.detail).into(),
                self.replica.clone().into(),
            ];
            if self.trace_ids {
                values.push(a.trace_id.clone().into());
            }
            insert.values_panic(values);
        }
        Some(backend.build(&insert))
    }

    /// One multi-row INSERT of replay rows for `ids` (the operation's id
    /// in `detail`).
    pub(crate) fn insert_replays(
        &self,
        backend: DbBackend,
        ids: &[i64],
        at: NaiveDateTime,
        caller: &Caller,
        operation: &str,
    ) -> Option<Statement> {
        if ids.is_empty() {
            return None;
        }
        let mut insert = Query::insert()
            .into_table(Alias::new(&self.table))
            .columns(["event_id", "kind", "started_at", "via", "label", "detail"].map(Alias::new))
            .to_owned();
        for id in ids {
            insert.values_panic([
                (*id).into(),
                "replay".into(),
                at.into(),
                caller.via.as_str().into(),
                caller.label.clone().into(),
                operation.into(),
            ]);
        }
        Some(backend.build(&insert))
    }

    /// One multi-row INSERT of resend rows for `ids`.
    pub(crate) fn insert_resends(
        &self,
        backend: DbBackend,
        ids: &[i64],
        at: NaiveDateTime,
        caller: &Caller,
    ) -> Option<Statement> {
        if ids.is_empty() {
            return None;
        }
        let mut insert = Query::insert()
            .into_table(Alias::new(&self.table))
            .columns(["event_id", "kind", "started_at", "via", "label"].map(Alias::new))
            .to_owned();
        for id in ids {
            insert.values_panic([
                (*id).into(),
                "resend".into(),
                at.into(),
                caller.via.as_str().into(),
                caller.label.clone().into(),
            ]);
        }
        Some(backend.build(&insert))
    }
}

impl Store {
    /// Logs `attempt` alone, its row's status write refused for good (the
    /// job gave the row up): the attempt is on record, and the ordering
    /// sweep, seeing an attempt newer than the row's last change, does not
    /// announce the row again. Nothing with the log off.
    pub async fn log_given_up_attempt(
        &self,
        attempt: &Attempt,
        outcome: &'static str,
    ) -> Result<(), StoreError> {
        let Some(h) = self.history_table() else {
            return Ok(());
        };
        let Some(insert) = h.insert_attempts(self.backend(), &[attempt], outcome) else {
            return Ok(());
        };
        self.connection()
            .execute_raw(insert)
            .await
            .map_err(super::db_err(
                "logging an attempt whose status write was refused",
            ))?;
        Ok(())
    }

    /// The attempt log of event `id`, oldest first (empty with the log off).
    pub async fn history(&self, id: i64) -> Result<Vec<Record>, StoreError> {
        let Some(h) = self.history_table() else {
            return Ok(Vec::new());
        };
        let mut stmt = Query::select()
            .columns(
                [
                    "id",
                    "event_id",
                    "kind",
                    "attempt",
                    "started_at",
                    "duration_ms",
                    "outcome",
                    "http_status",
                    "detail",
                    "replica",
                    "via",
                    "label",
                ]
                .map(Alias::new),
            )
            .to_owned();
        // A log without the column (tracing off, no `migrate` since) reads
        // as no trace ids.
        if h.trace_ids {
            stmt.column(Alias::new("trace_id"));
        } else {
            stmt.expr_as(Expr::val(Option::<String>::None), Alias::new("trace_id"));
        }
        let stmt = stmt
            .from(Alias::new(&h.table))
            .and_where(Expr::col(Alias::new("event_id")).eq(id))
            .order_by(Alias::new("id"), Order::Asc)
            .to_owned();
        let rows = self
            .connection()
            .query_all(&stmt)
            .await
            .map_err(db_err("reading the attempt log"))?;
        rows.iter()
            .map(|r| Record::from_query_result(r, ""))
            .collect::<Result<_, _>>()
            .map_err(db_err("reading the attempt log"))
    }

    /// How many attempts of `event_names` succeeded and failed since
    /// `since` (the console's recent failure rate); `None` with the log off.
    pub async fn recent_outcomes(
        &self,
        event_names: &[String],
        since: NaiveDateTime,
    ) -> Result<Option<(i64, i64)>, StoreError> {
        let Some(h) = self.history_table() else {
            return Ok(None);
        };
        let (a, e) = (Alias::new("a"), Alias::new("e"));
        let stmt = Query::select()
            .expr_as(
                Expr::col((a.clone(), Alias::new("outcome"))),
                Alias::new("outcome"),
            )
            .expr_as(
                sea_orm::sea_query::Func::count(Expr::col((a.clone(), Alias::new("id")))),
                Alias::new("n"),
            )
            .from_as(Alias::new(&h.table), a.clone())
            .join_as(
                sea_orm::sea_query::JoinType::InnerJoin,
                Alias::new(self.table()),
                e.clone(),
                Expr::col((e.clone(), Alias::new("id")))
                    .equals((a.clone(), Alias::new("event_id"))),
            )
            .and_where(Expr::col((a.clone(), Alias::new("kind"))).eq("attempt"))
            .and_where(Expr::col((a.clone(), Alias::new("started_at"))).gte(since))
            .and_where(
                Expr::col((e, Alias::new("event_name")))
                    .is_in(event_names.iter().map(String::as_str)),
            )
            .group_by_col((a, Alias::new("outcome")))
            .to_owned();
        let rows = self
            .connection()
            .query_all(&stmt)
            .await
            .map_err(db_err("counting recent attempts"))?;
        let (mut ok, mut failed) = (0, 0);
        for r in rows {
            let outcome: Option<String> = r
                .try_get("", "outcome")
                .map_err(db_err("counting recent attempts"))?;
            let n: i64 = r
                .try_get("", "n")
                .map_err(db_err("counting recent attempts"))?;
            match outcome.as_deref() {
                Some("success") => ok += n,
                Some("failure") => failed += n,
                _ => {}
            }
        }
        Ok(Some((ok, failed)))
    }

    /// Deletes log rows older than `older_than`, at most `batch` per
    /// statement (short locks, short transactions), until none is left;
    /// never a row of the outbox table. Returns how many it deleted.
    pub async fn prune_history(
        &self,
        older_than: std::time::Duration,
        batch: u64,
    ) -> Result<u64, StoreError> {
        let Some(h) = self.history_table() else {
            return Ok(0);
        };
        let age = chrono::Duration::from_std(older_than).unwrap_or(chrono::Duration::MAX);
        let before = now().checked_sub_signed(age).unwrap_or(NaiveDateTime::MIN);
        let table = quoted(&h.table);
        let backend = self.backend();
        if backend == DbBackend::Postgres {
            return self.prune_pg(&table, before, batch).await;
        }
        let sql = match backend {
            DbBackend::MySql => format!(
                "DELETE FROM `{}` WHERE started_at < ? LIMIT {batch}",
                h.table.replace('`', "``")
            ),
            _ => format!(
                "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE started_at < ? LIMIT {batch})"
            ),
        };
        let mut total = 0;
        loop {
            let stmt = Statement::from_sql_and_values(backend, sql.clone(), [before.into()]);
            let res = self
                .connection()
                .execute_raw(stmt)
                .await
                .map_err(db_err("pruning the attempt log"))?;
            total += res.rows_affected();
            if res.rows_affected() < batch {
                return Ok(total);
            }
        }
    }

    /// PostgreSQL: started_at has a BRIN index (cheap to write, see the
    /// migration), so the newest old row is found through it once, and the
    /// batches walk the primary key up to it: each batch starts where the
    /// last ended instead of scanning the pages the earlier ones emptied.
    async fn prune_pg(
        &self,
        table: &str,
        before: NaiveDateTime,
        batch: u64,
    ) -> Result<u64, StoreError> {
        let err = db_err("pruning the attempt log");
        let bound = Statement::from_sql_and_values(
            DbBackend::Postgres,
            format!("SELECT max(id) AS m FROM {table} WHERE started_at < $1"),
            [before.into()],
        );
        let bound: Option<i64> = match self.connection().query_one_raw(bound).await.map_err(err)? {
            Some(row) => row
                .try_get("", "m")
                .map_err(db_err("pruning the attempt log"))?,
            None => None,
        };
        let Some(bound) = bound else {
            return Ok(0);
        };
        let sql = format!(
            "WITH d AS (DELETE FROM {table} WHERE id IN (SELECT id FROM {table} \
             WHERE id > $2 AND id <= $3 AND started_at < $1 ORDER BY id LIMIT {batch}) \
             RETURNING id) SELECT count(*) AS n, max(id) AS m FROM d"
        );
        let (mut total, mut after) = (0u64, i64::MIN);
        loop {
            let stmt = Statement::from_sql_and_values(
                DbBackend::Postgres,
                sql.clone(),
                [before.into(), after.into(), bound.into()],
            );
            let row = self
                .connection()
                .query_one_raw(stmt)
                .await
                .map_err(db_err("pruning the attempt log"))?;
            let (n, last): (i64, Option<i64>) = match row {
                Some(r) => (
                    r.try_get("", "n")
                        .map_err(db_err("pruning the attempt log"))?,
                    r.try_get("", "m")
                        .map_err(db_err("pruning the attempt log"))?,
                ),
                None => (0, None),
            };
            total += n as u64;
            match last {
                Some(last) if (n as u64) >= batch => after = last,
                _ => return Ok(total),
            }
        }
    }
}
