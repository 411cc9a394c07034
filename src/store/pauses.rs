//! The paused dispatchers (`dispatch.pause_table`), shared by every
//! replica: an operator's pause and resume. [`crate::hold`] reads them
//! before each attempt.

use chrono::NaiveDateTime;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, OnConflict, Order, Query};
use sea_orm::{ConnectionTrait, FromQueryResult};
use serde::Serialize;

use super::history::Caller;
use super::{db_err, now, Store, StoreError};

/// One paused dispatcher, as the pause table holds it.
#[derive(Debug, Clone, PartialEq, Serialize, FromQueryResult)]
pub struct Pause {
    pub dispatcher: String,
    pub paused_at: NaiveDateTime,
    pub via: String,
    pub label: Option<String>,
}

impl Store {
    /// Every paused dispatcher.
    pub async fn pauses(&self) -> Result<Vec<Pause>, StoreError> {
        let stmt = Query::select()
            .columns(["dispatcher", "paused_at", "via", "label"].map(Alias::new))
            .from(Alias::new(self.pause_table()))
            .order_by(Alias::new("dispatcher"), Order::Asc)
            .to_owned();
        let rows = self
            .connection()
            .query_all(&stmt)
            .await
            .map_err(db_err("reading paused dispatchers"))?;
        rows.iter()
            .map(|r| Pause::from_query_result(r, ""))
            .collect::<Result<_, _>>()
            .map_err(db_err("reading paused dispatchers"))
    }

    /// Pauses `dispatcher` group-wide; `false` when it already was (the
    /// first pause is kept).
    pub async fn pause(&self, dispatcher: &str, caller: &Caller) -> Result<bool, StoreError> {
        let stmt = Query::insert()
            .into_table(Alias::new(self.pause_table()))
            .columns(["dispatcher", "paused_at", "via", "label"].map(Alias::new))
            .values_panic([
                dispatcher.into(),
                now().into(),
                caller.via.as_str().into(),
                caller.label.clone().into(),
            ])
            .on_conflict(
                OnConflict::column(Alias::new("dispatcher"))
                    .do_nothing()
                    .to_owned(),
            )
            .to_owned();
        let res = self
            .connection()
            .execute(&stmt)
            .await
            .map_err(db_err("pausing a dispatcher"))?;
        Ok(res.rows_affected() == 1)
    }

    /// Resumes `dispatcher`: deletes its pause (`true` when there was
    /// one), then touches every pending row of `event_names`, in committed
    /// batches, so the change feed announces them again, whether or not a
    /// pause was there: a resume whose touch failed part-way is repaired
    /// by running it again. `progress` gets the running count.
    pub async fn resume(
        &self,
        dispatcher: &str,
        event_names: &[String],
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<(bool, u64), StoreError> {
        let stmt = Query::delete()
            .from_table(Alias::new(self.pause_table()))
            .and_where(Expr::col(Alias::new("dispatcher")).eq(dispatcher))
            .to_owned();
        let res = self
            .connection()
            .execute(&stmt)
            .await
            .map_err(db_err("resuming a dispatcher"))?;
        let was_paused = res.rows_affected() > 0;
        // After the delete has committed: a replica that parks one of these
        // rows again confirms the pause with a read made after it received
        // the row's new change event, so it sees the pause gone.
        let touched = self.retrigger_pending_of(event_names, progress).await?;
        Ok((was_paused, touched))
    }
}
