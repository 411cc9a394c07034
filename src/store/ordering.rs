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
    /// later pending ones, and those pending events. Read from the failed
    /// rows (an index on `status`) and each one's aggregate (an index on the
    /// aggregate column): the cost is set by the failed rows, never the
    /// history. `None`: ordering off, or `on_failed = "skip"`.
    pub async fn held_counts(&self) -> Result<Option<(i64, i64)>, StoreError> {
        let Some(o) = self.ordering.as_ref().filter(|o| o.hold) else {
            return Ok(None);
        };
        let t = self.quoted_table();
        let c = self.quote_ident(&o.column);
        let sql = format!(
            "SELECT count(DISTINCT p.{c}) AS aggregates, count(DISTINCT p.id) AS events \
             FROM {t} f JOIN {t} p ON p.{c} = f.{c} AND p.id > f.id AND p.status = 'pending' \
             WHERE f.status = 'failed'"
        );
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
    /// read. How many it touched.
    pub async fn announce_stranded(
        &self,
        quiet: std::time::Duration,
        limit: u64,
    ) -> Result<u64, StoreError> {
        let Some(o) = &self.ordering else {
            return Ok(0);
        };
        let t = self.quoted_table();
        let c = self.quote_ident(&o.column);
        let held_by = self.holding_statuses(o);
        let cutoff = super::now()
            - chrono::Duration::from_std(quiet).unwrap_or_else(|_| chrono::Duration::zero());
        let placeholder = if self.backend() == DbBackend::Postgres {
            "$1"
        } else {
            "?"
        };
        let sql = format!(
            "SELECT p.id AS id FROM {t} p WHERE p.status = 'pending' AND p.{c} IS NOT NULL \
             AND p.updated_at < {placeholder} AND NOT EXISTS (SELECT 1 FROM {t} b \
             WHERE b.{c} = p.{c} AND b.id < p.id AND b.status IN {held_by}) \
             ORDER BY p.id LIMIT {limit}"
        );
        let err = || db_err("finding parked events to announce again");
        let rows = self
            .connection()
            .query_all_raw(Statement::from_sql_and_values(
                self.backend(),
                sql,
                [cutoff.into()],
            ))
            .await
            .map_err(err())?;
        let ids = rows
            .iter()
            .map(|r| r.try_get::<i64>("", "id"))
            .collect::<Result<Vec<_>, _>>()
            .map_err(err())?;
        if ids.is_empty() {
            return Ok(0);
        }
        self.touch_ids(&ids).await
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
