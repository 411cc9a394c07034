//! Operator actions that outlive the request that started them
//! (`dispatch.operations_table`): a row per resume, retrigger or bulk
//! resend, written by the replica that runs it, read by any replica.

use chrono::NaiveDateTime;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Order, Query};
use sea_orm::{ConnectionTrait, FromQueryResult};

use super::{db_err, now, Store, StoreError};

/// One operation as its table holds it.
#[derive(Debug, Clone, PartialEq, FromQueryResult)]
pub struct OperationRow {
    pub id: String,
    pub kind: String,
    pub target: String,
    pub state: String,
    pub progress: i64,
    pub message: Option<String>,
    pub error: Option<String>,
    pub rerun: String,
    pub replica: String,
    pub via: String,
    pub label: Option<String>,
    pub started_at: NaiveDateTime,
    pub updated_at: NaiveDateTime,
    pub finished_at: Option<NaiveDateTime>,
    /// A replay's filters and pace (JSON).
    pub params: Option<String>,
    /// A replay's cursor: the last id it looked at.
    pub cursor: Option<i64>,
    /// When an operator asked it to stop.
    pub cancelled_at: Option<NaiveDateTime>,
}

const COLUMNS: [&str; 17] = [
    "id",
    "kind",
    "target",
    "state",
    "progress",
    "message",
    "error",
    "rerun",
    "replica",
    "via",
    "label",
    "started_at",
    "updated_at",
    "finished_at",
    "params",
    "cursor",
    "cancelled_at",
];

impl Store {
    pub(super) fn ops(&self) -> Alias {
        Alias::new(self.operations_table())
    }

    /// Records a new running operation.
    pub async fn insert_operation(&self, op: &OperationRow) -> Result<(), StoreError> {
        let stmt = Query::insert()
            .into_table(self.ops())
            .columns(COLUMNS.map(Alias::new))
            .values_panic([
                op.id.clone().into(),
                op.kind.clone().into(),
                op.target.clone().into(),
                op.state.clone().into(),
                op.progress.into(),
                op.message.clone().into(),
                op.error.clone().into(),
                op.rerun.clone().into(),
                op.replica.clone().into(),
                op.via.clone().into(),
                op.label.clone().into(),
                op.started_at.into(),
                op.updated_at.into(),
                op.finished_at.into(),
                op.params.clone().into(),
                op.cursor.into(),
                op.cancelled_at.into(),
            ])
            .to_owned();
        self.connection()
            .execute(&stmt)
            .await
            .map_err(db_err("recording an operation"))?;
        Ok(())
    }

    /// Writes a running operation's progress (and so its heartbeat). Never
    /// backwards: a replay's step writes its progress with its cursor, and
    /// a count read before that step must not overwrite it.
    pub async fn operation_progress(&self, id: &str, progress: u64) -> Result<(), StoreError> {
        let stmt = Query::update()
            .table(self.ops())
            .value(Alias::new("progress"), progress as i64)
            .value(Alias::new("updated_at"), now())
            .and_where(Expr::col(Alias::new("id")).eq(id))
            .and_where(Expr::col(Alias::new("state")).eq("running"))
            .and_where(Expr::col(Alias::new("progress")).lte(progress as i64))
            .to_owned();
        self.connection()
            .execute(&stmt)
            .await
            .map_err(db_err("recording an operation's progress"))?;
        Ok(())
    }

    /// Writes an operation's end: `state` `done` or `failed`.
    pub async fn finish_operation(
        &self,
        id: &str,
        state: &str,
        progress: u64,
        message: Option<String>,
        error: Option<String>,
    ) -> Result<(), StoreError> {
        let at = now();
        let stmt = Query::update()
            .table(self.ops())
            .value(Alias::new("state"), state)
            .value(Alias::new("progress"), progress as i64)
            .value(Alias::new("message"), message)
            .value(Alias::new("error"), error)
            .value(Alias::new("updated_at"), at)
            .value(Alias::new("finished_at"), at)
            .and_where(Expr::col(Alias::new("id")).eq(id))
            .to_owned();
        self.connection()
            .execute(&stmt)
            .await
            .map_err(db_err("recording an operation's end"))?;
        Ok(())
    }

    /// Asks running operation `id` to stop (`DELETE /admin/operations/{id}`,
    /// `events replay --cancel`): its runner sees it at its next step.
    /// `false` when there is no such running operation.
    pub async fn cancel_operation(&self, id: &str) -> Result<bool, StoreError> {
        let stmt = Query::update()
            .table(self.ops())
            .value(Alias::new("cancelled_at"), now())
            .and_where(Expr::col(Alias::new("id")).eq(id))
            .and_where(Expr::col(Alias::new("state")).eq("running"))
            .and_where(Expr::col(Alias::new("cancelled_at")).is_null())
            .to_owned();
        let res = self
            .connection()
            .execute(&stmt)
            .await
            .map_err(db_err("cancelling an operation"))?;
        Ok(res.rows_affected() == 1)
    }

    /// Running operations of `kind` whose heartbeat is older than
    /// `before` (their replica ended): the ones to carry on.
    pub async fn stale_operations(
        &self,
        kind: &str,
        before: NaiveDateTime,
    ) -> Result<Vec<OperationRow>, StoreError> {
        let stmt = Query::select()
            .columns(COLUMNS.map(Alias::new))
            .from(self.ops())
            .and_where(Expr::col(Alias::new("kind")).eq(kind))
            .and_where(Expr::col(Alias::new("state")).eq("running"))
            .and_where(Expr::col(Alias::new("updated_at")).lt(before))
            .order_by(Alias::new("started_at"), Order::Asc)
            .limit(10)
            .to_owned();
        let rows = self
            .connection()
            .query_all(&stmt)
            .await
            .map_err(db_err("reading operations to carry on"))?;
        rows.iter()
            .map(|r| OperationRow::from_query_result(r, ""))
            .collect::<Result<_, _>>()
            .map_err(db_err("reading operations to carry on"))
    }

    /// Takes a stale operation over for `replica`: only if its heartbeat is
    /// still older than `before` (one replica wins).
    pub async fn claim_operation(
        &self,
        id: &str,
        replica: &str,
        before: NaiveDateTime,
    ) -> Result<bool, StoreError> {
        let stmt = Query::update()
            .table(self.ops())
            .value(Alias::new("replica"), replica)
            .value(Alias::new("updated_at"), now())
            .and_where(Expr::col(Alias::new("id")).eq(id))
            .and_where(Expr::col(Alias::new("state")).eq("running"))
            .and_where(Expr::col(Alias::new("updated_at")).lt(before))
            .to_owned();
        let res = self
            .connection()
            .execute(&stmt)
            .await
            .map_err(db_err("taking an operation over"))?;
        Ok(res.rows_affected() == 1)
    }

    /// One operation, if the table has it.
    pub async fn operation(&self, id: &str) -> Result<Option<OperationRow>, StoreError> {
        let stmt = Query::select()
            .columns(COLUMNS.map(Alias::new))
            .from(self.ops())
            .and_where(Expr::col(Alias::new("id")).eq(id))
            .to_owned();
        let row = self
            .connection()
            .query_one(&stmt)
            .await
            .map_err(db_err("reading an operation"))?;
        row.map(|r| OperationRow::from_query_result(&r, ""))
            .transpose()
            .map_err(db_err("reading an operation"))
    }

    /// The `limit` most recently started operations, newest first.
    pub async fn operations(&self, limit: u64) -> Result<Vec<OperationRow>, StoreError> {
        let stmt = Query::select()
            .columns(COLUMNS.map(Alias::new))
            .from(self.ops())
            .order_by(Alias::new("started_at"), Order::Desc)
            .order_by(Alias::new("id"), Order::Desc)
            .limit(limit)
            .to_owned();
        let rows = self
            .connection()
            .query_all(&stmt)
            .await
            .map_err(db_err("reading operations"))?;
        rows.iter()
            .map(|r| OperationRow::from_query_result(r, ""))
            .collect::<Result<_, _>>()
            .map_err(db_err("reading operations"))
    }
}
