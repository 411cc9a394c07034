//! The dispatch job: one per event, like the Rails `Outbox::DispatchEventsJob`
//! (CONTRACT §5). It owns one pending row until the row is `sent` or
//! `failed`, or until it is cancelled (shutdown, partition revoked).
//!
//! ```text
//!   wait until updated_at + retry_delay (only when attempts > 0)
//!   POST → 2xx  → mark_sent         → done (sent)
//!        → else → register_failure  → failed? done : wait and POST again
//! ```
//! Cancellation is honoured only where nothing is half done: while waiting,
//! and before a POST. A POST that started is always followed by its status
//! write, retried with backoff on database errors and never by a re-send.

use std::sync::Arc;
use std::time::Duration;

use entity::{OutboxEventRow, Status};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

use crate::dispatch::{Delivery, Registry};
use crate::metrics::Metrics;
use crate::store::batch::SentWriter;
use crate::store::{Outcome, Store, StoreError};

/// What a job needs, shared by all jobs.
pub struct JobContext {
    pub store: Store,
    /// `mark_sent`, batched across jobs.
    pub sent_writer: SentWriter,
    pub registry: Registry,
    pub metrics: Metrics,
    pub retry_delay: Duration,
    /// Cancelled when the drain deadline passes: give up even status writes.
    pub abort: CancellationToken,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd {
    Sent,
    Failed,
    /// The row changed under the job (another writer); nothing more to do here.
    Conflict(Status),
    /// Stopped at a safe point; the row stays as it was for the next owner.
    Cancelled,
    /// The status write could not be made before the drain deadline.
    Aborted,
}

impl JobEnd {
    /// Whether the triggering message's work is finished (its offset may be
    /// committed). A cancelled job's message must be replayed.
    pub fn finishes_message(&self) -> bool {
        matches!(self, JobEnd::Sent | JobEnd::Failed | JobEnd::Conflict(_))
    }
}

/// When the next attempt of `row` is due: at once for a fresh (or resent)
/// row, `retry_delay` after the last failure otherwise.
pub fn due_at(row: &OutboxEventRow, retry_delay: Duration) -> Option<chrono::NaiveDateTime> {
    if row.attempts == 0 {
        return None;
    }
    let delay = chrono::Duration::from_std(retry_delay).unwrap_or(chrono::Duration::MAX);
    row.updated_at.checked_add_signed(delay)
}

pub async fn run(
    ctx: Arc<JobContext>,
    mut row: OutboxEventRow,
    cancel: CancellationToken,
) -> JobEnd {
    let span = tracing::info_span!(
        "event",
        id = row.id,
        event_name = %row.event_name,
        attempt = tracing::field::Empty
    );
    let event_span = span.clone();
    async move {
        loop {
            if let Some(due) = due_at(&row, ctx.retry_delay) {
                let wait = (due - crate::store::now()).to_std().unwrap_or(Duration::ZERO);
                tokio::select! {
                    _ = cancel.cancelled() => return JobEnd::Cancelled,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            if cancel.is_cancelled() {
                return JobEnd::Cancelled;
            }
            let attempt = row.attempts + 1;
            event_span.record("attempt", attempt);
            let label = ctx.registry.label(&row.event_name).to_owned();
            let (delivery, timing) = ctx.registry.dispatch(&row, attempt).await;
            if let Some((dispatcher, elapsed)) = timing {
                ctx.metrics
                    .dispatch_duration
                    .with_label_values(&[dispatcher])
                    .observe(elapsed.as_secs_f64());
            }
            match delivery {
                Delivery::Delivered { status } => {
                    ctx.metrics.dispatch_total.with_label_values(&[&label, "success"]).inc();
                    let written = write(&ctx, "sent", || ctx.sent_writer.mark_sent(&row)).await;
                    return match written {
                        Some(Outcome::Applied(_)) => {
                            ctx.metrics.transitions_total.with_label_values(&[&label, "sent"]).inc();
                            info!(attempt, http_status = status, "pending -> sent");
                            JobEnd::Sent
                        }
                        // Our own write may have committed before its reply was lost.
                        Some(Outcome::Conflict(found)) if found.status == Status::Sent => JobEnd::Sent,
                        Some(Outcome::Conflict(found)) => {
                            warn!(found = %found.status, "row changed during dispatch");
                            JobEnd::Conflict(found.status)
                        }
                        Some(Outcome::NotFound(_)) => JobEnd::Conflict(Status::Pending),
                        None => JobEnd::Aborted,
                    };
                }
                Delivery::Failed { error } => {
                    ctx.metrics.dispatch_total.with_label_values(&[&label, "failure"]).inc();
                    let expected_error = crate::store::truncate_error(&error);
                    let written =
                        write(&ctx, "failure", || ctx.store.register_failure(&row, &error)).await;
                    let next = match written {
                        Some(Outcome::Applied(next)) => next,
                        Some(Outcome::Conflict(found))
                            if found.attempts == row.attempts + 1
                                && found.last_error.as_deref() == Some(expected_error.as_str()) =>
                        {
                            found
                        }
                        Some(Outcome::Conflict(found)) => {
                            warn!(found = %found.status, "row changed during dispatch");
                            return JobEnd::Conflict(found.status);
                        }
                        Some(Outcome::NotFound(_)) => return JobEnd::Conflict(Status::Pending),
                        None => return JobEnd::Aborted,
                    };
                    let to = next.status.as_str();
                    ctx.metrics.transitions_total.with_label_values(&[&label, to]).inc();
                    if next.status == Status::Failed {
                        warn!(attempt, last_error = %error, "pending -> failed");
                        return JobEnd::Failed;
                    }
                    warn!(attempt, last_error = %error, retry_in = ?ctx.retry_delay, "attempt failed");
                    row = next;
                }
            }
        }
    }
    .instrument(span)
    .await
}

/// Runs a status write until the database answers; `None` only when the
/// drain deadline passed first.
async fn write<F, Fut>(ctx: &JobContext, to: &'static str, op: F) -> Option<Outcome>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Outcome, StoreError>>,
{
    let mut backoff = Duration::from_millis(50);
    loop {
        match op().await {
            Ok(outcome) => return Some(outcome),
            Err(e) => {
                ctx.metrics
                    .db_write_retries_total
                    .with_label_values(&[to])
                    .inc();
                warn!(error = %e, retry_in = ?backoff, "status write failed; retrying (the request is not re-sent)");
                tokio::select! {
                    _ = ctx.abort.cancelled() => return None,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
