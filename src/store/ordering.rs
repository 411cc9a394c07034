//! `[ordering]`: where a row stands among its aggregate's events, read
//! with the row in the same statement (correlated subqueries through an
//! index on the aggregate column), and the operators' views of held rows.
//!
//! A row *waits behind* the newest earlier event (smaller id) of its
//! aggregate that is `pending` (not yet decided: its own turn comes first)
//! or, under `on_failed = "hold"`, `failed` (until it is resent and sent).
//! A row whose aggregate column is NULL is not ordered.

use entity::{Sequence, Status};
use sea_orm::sea_query::{Alias, Expr, SelectStatement, SimpleExpr};
use sea_orm::{ConnectionTrait, DbBackend, QueryResult, Statement};

use super::{db_err, history::quoted, Store, StoreError};

/// The aggregate column (`[ordering] column`) and what a failed event does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderingColumns {
    pub column: String,
    /// `on_failed = "hold"`: a failed event holds its aggregate's later ones.
    pub hold: bool,
}

/// Why a held filter cannot be honoured (the CLI, the admin API and the
/// console each prefix the name of their own flag).
pub const HELD_NEEDS_ORDERING: &str = "ordering is off ([ordering] column is not set)";

/// How many columns [`Store::add_sequence`] adds.
pub const SEQUENCE_COLUMNS: usize = 2;

impl Store {
    /// Orders each aggregate's events by `columns` (`[ordering]`).
    pub fn with_ordering(mut self, columns: Option<OrderingColumns>) -> Self {
        self.ordering = columns;
        self
    }

    pub fn ordering(&self) -> Option<&OrderingColumns> {
        self.ordering.as_ref()
    }

    fn quote_ident(&self, name: &str) -> String {
        match self.backend() {
            DbBackend::MySql => format!("`{}`", name.replace('`', "``")),
            _ => quoted(name),
        }
    }

    /// The statuses that hold a later event of the aggregate back.
    fn holding_statuses(&self, o: &OrderingColumns) -> &'static str {
        if o.hold {
            "('pending', 'failed')"
        } else {
            "('pending')"
        }
    }

    /// Adds the row's aggregate (as text) and the event it waits behind
    /// to `stmt` (a select of the
    /// table, not aliased), after its other columns.
    pub(super) fn add_sequence(&self, stmt: &mut SelectStatement) {
        let Some(o) = &self.ordering else { return };
        let t = self.quoted_table();
        let c = self.quote_ident(&o.column);
        let text = match self.backend() {
            DbBackend::MySql => "CHAR",
            _ => "text",
        };
        let held_by = self.holding_statuses(o);
        stmt.expr_as(
            Expr::cust(format!("CAST({t}.{c} AS {text})")),
            Alias::new("sequence_aggregate"),
        );
        // One probe of the index on (column, id): the aggregate's event
        // just before this one. That one is enough: an event is sent only
        // once the one before it is, so behind a sent event every earlier
        // one is sent too (a resend applies to failed events only).
        stmt.expr_as(
            Expr::cust(format!(
                "(SELECT CASE WHEN b.status IN {held_by} THEN b.id END FROM {t} b \
                 WHERE b.{c} = {t}.{c} AND b.id < {t}.id ORDER BY b.id DESC LIMIT 1)"
            )),
            Alias::new("sequence_behind"),
        );
    }

    /// Reads what [`Store::add_sequence`] added, from column `at` on.
    pub(super) fn read_sequence(&self, r: &QueryResult, at: usize) -> Option<Sequence> {
        self.ordering.as_ref()?;
        Some(Sequence {
            aggregate: r.try_get_by_index::<Option<String>>(at).ok().flatten(),
            behind: r.try_get_by_index::<Option<i64>>(at + 1).ok().flatten(),
        })
    }

    /// The condition of `events list --held`: pending rows an earlier
    /// failed event of their aggregate holds back (`None`: ordering off).
    pub fn held_condition(&self) -> Option<SimpleExpr> {
        let o = self.ordering.as_ref()?;
        let t = self.quoted_table();
        let c = self.quote_ident(&o.column);
        Some(Expr::cust(format!(
            "({t}.status = 'pending' AND EXISTS (SELECT 1 FROM {t} f WHERE f.{c} = {t}.{c} \
             AND f.id < {t}.id AND f.status = 'failed'))"
        )))
    }

    /// The event `id` waits behind, with its status (`events show`, the
    /// console): the newest earlier failed event of its aggregate (what an
    /// operator resends), else the newest earlier pending one; `None` when
    /// ordering is off, the row is not pending, or nothing earlier holds it.
    pub async fn waits_behind(&self, id: i64) -> Result<Option<(i64, Status)>, StoreError> {
        let Some(o) = &self.ordering else {
            return Ok(None);
        };
        let t = self.quoted_table();
        let c = self.quote_ident(&o.column);
        let held_by = self.holding_statuses(o);
        let sql = format!(
            "SELECT b.id AS id, CAST(b.status AS {text}) AS status FROM {t} r JOIN {t} b \
             ON b.{c} = r.{c} AND b.id < r.id AND b.status IN {held_by} \
             WHERE r.id = {id} AND r.status = 'pending' \
             ORDER BY CASE WHEN b.status = 'failed' THEN 0 ELSE 1 END, b.id DESC LIMIT 1",
            text = if self.backend() == DbBackend::MySql {
                "CHAR"
            } else {
                "text"
            }
        );
        let err = || db_err("reading what an event waits behind");
        let Some(row) = self
            .connection()
            .query_one_raw(Statement::from_string(self.backend(), sql))
            .await
            .map_err(err())?
        else {
            return Ok(None);
        };
        let behind: i64 = row.try_get("", "id").map_err(err())?;
        let status: String = row.try_get("", "status").map_err(err())?;
        Ok(Some((behind, status.parse().unwrap_or(Status::Pending))))
    }

    /// The held figures (`outbox_ordering_held_aggregates`,
    /// `outbox_ordering_held_events`): aggregates with a failed event and
    /// later pending ones, and those pending events. Read from the pending
    /// rows (an index on `status`), each with one backward probe of its
    /// aggregate (an index on the aggregate column and id) to the nearest
    /// earlier event that is not pending: behind a sent event every earlier
    /// one is sent, so the event is held when that one is failed. The cost
    /// is set by the pending rows, never by old failed rows or the history.
    /// `None`: ordering off, or `on_failed = "skip"`.
    pub async fn held_counts(&self) -> Result<Option<(i64, i64)>, StoreError> {
        let Some(sql) = self.held_counts_sql() else {
            return Ok(None);
        };
        let err = || db_err("counting held events");
        let row = self
            .connection()
            .query_one_raw(Statement::from_string(self.backend(), sql))
            .await
            .map_err(err())?;
        let Some(row) = row else {
            return Ok(Some((0, 0)));
        };
        let aggregates: i64 = row.try_get("", "aggregates").map_err(err())?;
        let events: i64 = row.try_get("", "events").map_err(err())?;
        Ok(Some((aggregates, events)))
    }

    /// The statement of [`Store::held_counts`] (its cost is tested).
    pub fn held_counts_sql(&self) -> Option<String> {
        let o = self.ordering.as_ref().filter(|o| o.hold)?;
        let t = self.quoted_table();
        let c = self.quote_ident(&o.column);
        Some(format!(
            "SELECT count(DISTINCT p.{c}) AS aggregates, count(p.id) AS events \
             FROM {t} p WHERE p.status = 'pending' AND p.{c} IS NOT NULL \
             AND (SELECT b.status FROM {t} b WHERE b.{c} = p.{c} AND b.id < p.id \
             AND b.status <> 'pending' ORDER BY b.id DESC LIMIT 1) = 'failed'"
        ))
    }

    /// Announces again (touches) the oldest pending event of `after`'s
    /// aggregate later than it, which may have been parked behind it;
    /// which one, if any.
    pub async fn announce_next(&self, after: i64) -> Result<Option<i64>, StoreError> {
        match self.next_pending_after(after, 1).await?.first() {
            Some(&n) => self.touch_one_pending(&[n], &[]).await,
            None => Ok(None),
        }
    }

    /// The oldest `limit` pending events of `after`'s aggregate later than
    /// it, in id order (read only: a release decides them here, with no
    /// touch).
    pub async fn next_pending_after(&self, after: i64, limit: u64) -> Result<Vec<i64>, StoreError> {
        let Some(o) = &self.ordering else {
            return Ok(Vec::new());
        };
        let t = self.quoted_table();
        let c = self.quote_ident(&o.column);
        let sql = format!(
            "SELECT n.id AS id FROM {t} b JOIN {t} n ON n.{c} = b.{c} AND n.id > b.id \
             AND n.status = 'pending' WHERE b.id = {after} ORDER BY n.id LIMIT {limit}"
        );
        let err = || db_err("finding an aggregate's next pending events");
        let rows = self
            .connection()
            .query_all_raw(Statement::from_string(self.backend(), sql))
            .await
            .map_err(err())?;
        rows.iter()
            .map(|r| r.try_get::<i64>("", "id"))
            .collect::<Result<Vec<i64>, _>>()
            .map_err(err())
    }

    /// Announces again (touches) up to `limit` pending events that nothing
    /// earlier of their aggregate holds and that have not changed for
    /// `quiet`: events parked behind one that was sent while the
    /// announcement after it was lost (a crash between the two). An event
    /// announced twice is decided once, so a touch too many costs only a
    /// read.
    ///
    /// It walks from `after` (a cursor: the sweep goes on past the rows it
    /// looked at last time instead of starting at the lowest id again, so
    /// rows something else explains cannot fill its window every time),
    /// skips the events named in `skip_event_names` (a paused dispatcher's,
    /// one whose breaker is open: they wait for a reason), and, with the
    /// attempt log on, every row attempted since it last changed: a row
    /// whose status write the database refused for good (the job gave it
    /// up, logging the attempt alone) is never announced again, so it gets
    /// no POSTs beyond its attempts.
    pub async fn announce_stranded(
        &self,
        quiet: std::time::Duration,
        limit: u64,
        after: i64,
        skip_event_names: &[String],
    ) -> Result<Swept, StoreError> {
        let cutoff = super::now()
            - chrono::Duration::from_std(quiet).unwrap_or_else(|_| chrono::Duration::zero());
        self.announce_unchanged_since(cutoff, limit, after, skip_event_names)
            .await
    }

    /// [`Store::announce_stranded`] of the rows unchanged since `cutoff`
    /// (the sweep's: `stranded_after` ago, or earlier while the group's
    /// backlog may still hold later rows' change events).
    pub async fn announce_unchanged_since(
        &self,
        cutoff: chrono::NaiveDateTime,
        limit: u64,
        after: i64,
        skip_event_names: &[String],
    ) -> Result<Swept, StoreError> {
        let Some(o) = &self.ordering else {
            return Ok(Swept::default());
        };
        let t = self.quoted_table();
        let c = self.quote_ident(&o.column);
        let held_by = self.holding_statuses(o);
        let pg = self.backend() == DbBackend::Postgres;
        let mut values: Vec<sea_orm::Value> = vec![cutoff.into()];
        let first = if pg { "$1" } else { "?" };
        let mut sql = format!(
            "SELECT p.id AS id FROM {t} p WHERE p.status = 'pending' AND p.{c} IS NOT NULL \
             AND p.updated_at < {first} AND p.id > {after}"
        );
        sql.push_str(&self.event_names_not_in(skip_event_names, &mut values));
        if let Some(h) = self.history_table() {
            let log = match self.backend() {
                DbBackend::MySql => format!("`{}`", h.table.replace('`', "``")),
                _ => super::history::quoted(&h.table),
            };
            sql.push_str(&format!(
                " AND NOT EXISTS (SELECT 1 FROM {log} h WHERE h.event_id = p.id \
                 AND h.kind = 'attempt' AND h.started_at >= p.updated_at)"
            ));
        }
        sql.push_str(&format!(
            " AND NOT EXISTS (SELECT 1 FROM {t} b \
             WHERE b.{c} = p.{c} AND b.id < p.id AND b.status IN {held_by}) \
             ORDER BY p.id LIMIT {limit}"
        ));
        let err = || db_err("finding parked events to announce again");
        let rows = self
            .connection()
            .query_all_raw(Statement::from_sql_and_values(self.backend(), sql, values))
            .await
            .map_err(err())?;
        let ids = rows
            .iter()
            .map(|r| r.try_get::<i64>("", "id"))
            .collect::<Result<Vec<_>, _>>()
            .map_err(err())?;
        let next = if (ids.len() as u64) < limit {
            0
        } else {
            ids.iter().copied().max().unwrap_or(0)
        };
        let touched = if ids.is_empty() {
            0
        } else {
            self.touch_ids(&ids).await?
        };
        Ok(Swept { touched, next })
    }

    /// ` AND p.event_name NOT IN (…)` with `names` bound after `values`
    /// (empty when there are none).
    fn event_names_not_in(&self, names: &[String], values: &mut Vec<sea_orm::Value>) -> String {
        if names.is_empty() {
            return String::new();
        }
        let pg = self.backend() == DbBackend::Postgres;
        let list = names
            .iter()
            .map(|n| {
                values.push(n.clone().into());
                if pg {
                    format!("${}", values.len())
                } else {
                    "?".to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        format!(" AND p.event_name NOT IN ({list})")
    }

    /// Pending rows unchanged since before `cutoff` that nothing visible
    /// explains: not of `skip_event_names` (a paused dispatcher's, an open
    /// breaker's), and with `[ordering]` nothing earlier of their
    /// aggregate pending or failed before them. Counted up to `cap` rows,
    /// through the status index: the cost is the pending rows', not the
    /// table's history.
    pub async fn count_unexplained(
        &self,
        cutoff: chrono::NaiveDateTime,
        skip_event_names: &[String],
        cap: u64,
    ) -> Result<i64, StoreError> {
        let t = self.quoted_table();
        let pg = self.backend() == DbBackend::Postgres;
        let mut values: Vec<sea_orm::Value> = vec![cutoff.into()];
        let first = if pg { "$1" } else { "?" };
        let mut sql = format!(
            "SELECT count(*) AS n FROM (SELECT p.id FROM {t} p WHERE p.status = 'pending' \
             AND p.updated_at < {first}"
        );
        sql.push_str(&self.event_names_not_in(skip_event_names, &mut values));
        if let Some(o) = &self.ordering {
            let c = self.quote_ident(&o.column);
            sql.push_str(&format!(
                " AND NOT EXISTS (SELECT 1 FROM {t} b WHERE b.{c} = p.{c} AND b.id < p.id \
                 AND b.status IN ('pending', 'failed'))"
            ));
        }
        sql.push_str(&format!(" LIMIT {cap}) s"));
        let err = || db_err("counting pending events nothing explains");
        let row = self
            .connection()
            .query_one_raw(Statement::from_sql_and_values(self.backend(), sql, values))
            .await
            .map_err(err())?;
        Ok(row
            .map(|r| r.try_get::<i64>("", "n"))
            .transpose()
            .map_err(err())?
            .unwrap_or(0))
    }

    /// The statement that creates the index the ordering's reads need,
    /// when the table has none with the aggregate column first.
    pub async fn ordering_index_advice(&self) -> Result<Option<String>, StoreError> {
        let Some(o) = &self.ordering else {
            return Ok(None);
        };
        if self.has_index_on(&o.column).await? != Some(false) {
            return Ok(None);
        }
        let name = format!("index_{}_on_{}_id", self.table(), o.column);
        let c = self.quote_ident(&o.column);
        Ok(Some(match self.backend() {
            DbBackend::Postgres => format!(
                "CREATE INDEX CONCURRENTLY {} ON {} ({c}, id)",
                quoted(&name),
                self.quoted_table()
            ),
            _ => format!(
                "CREATE INDEX `{}` ON {} ({c}, id)",
                name.replace('`', "``"),
                self.quoted_table()
            ),
        }))
    }
}

/// What one turn of the stranded-event sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Rows announced again.
    pub touched: u64,
    /// Where the next turn starts: past the last row looked at when the
    /// window was full, else 0 (the walk starts over).
    pub next: i64,
}
