//! The job's transitions one row at a time (R-004 `mark_sent!`,
//! `register_failure!`): the row [`crate::transition`] computed, written by
//! a conditional UPDATE that applies only while the row is as the job read
//! it. [`super::batch`] makes the same writes for many rows at once.

use entity::outbox_event::Column;
use entity::{OutboxEventRow, Status};
use sea_orm::sea_query::{Expr, ExprTrait, Query, UpdateStatement};
use sea_orm::ConnectionTrait;

use super::{db_err, Outcome, Store, StoreError};

/// `last_error` is for people: keep it to this many bytes.
pub const MAX_LAST_ERROR_BYTES: usize = 1024;

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

/// The condition of one row's write: its id and the attempts it had when
/// read (a row is written only while it is still `pending` with them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub id: i64,
    pub attempts: i32,
}

impl From<&OutboxEventRow> for Key {
    fn from(row: &OutboxEventRow) -> Self {
        Key {
            id: row.id,
            attempts: row.attempts,
        }
    }
}

/// The columns a success writes, as they are in `next`.
pub(crate) fn sent_values(next: &OutboxEventRow) -> [(Column, sea_orm::Value); 3] {
    [
        (Column::Status, next.status.as_str().into()),
        (Column::SentAt, next.sent_at.into()),
        (Column::UpdatedAt, next.updated_at.into()),
    ]
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

impl Store {
    /// R-004 `mark_sent!`: writes `next` (what
    /// [`crate::transition::after_success`] made of `seen`) while the row
    /// is still as `seen` was read.
    pub async fn mark_sent(
        &self,
        seen: &OutboxEventRow,
        next: &OutboxEventRow,
    ) -> Result<Outcome, StoreError> {
        let values = sent_values(next);
        self.step(seen, next, values, "marking an event sent").await
    }

    /// R-004 `register_failure!`: writes `next` (what
    /// [`crate::transition::after_failure`] made of `seen`, its error cut
    /// by [`Store::truncate_error`]) while the row is still as `seen` was
    /// read.
    pub async fn register_failure(
        &self,
        seen: &OutboxEventRow,
        next: &OutboxEventRow,
    ) -> Result<Outcome, StoreError> {
        let values = failure_values(next);
        self.step(seen, next, values, "registering a failure").await
    }

    /// One transition of a pending row: `values` (of `next`) are written
    /// only while the row is still `seen` (pending, same attempts).
    async fn step(
        &self,
        seen: &OutboxEventRow,
        next: &OutboxEventRow,
        values: impl IntoIterator<Item = (Column, sea_orm::Value)>,
        action: &'static str,
    ) -> Result<Outcome, StoreError> {
        let stmt = self.step_statement(Key::from(seen), values);
        let res = self.db.execute(&stmt).await.map_err(db_err(action))?;
        if res.rows_affected() == 1 {
            return Ok(Outcome::Applied(next.clone()));
        }
        self.conflict(seen.id).await
    }

    /// The conditional UPDATE of [`Store::step`]: `values`, where the row
    /// is `seen` (its id, still pending, with the same attempts).
    pub(crate) fn step_statement(
        &self,
        seen: Key,
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

    async fn conflict(&self, id: i64) -> Result<Outcome, StoreError> {
        Ok(match self.get(id).await? {
            Some(row) => Outcome::Conflict(row),
            None => Outcome::NotFound(id),
        })
    }
}
