//! The dispatch job: **one attempt** of one pending row, like a run of the
//! Rails `Outbox::DispatchEventsJob` (CONTRACT §5).
//!
//! ```text
//!   gate: holds (pause, breaker) → send slot → lease
//!   POST → 2xx  → mark_sent         → Sent
//!        → else → register_failure  → Failed, or Retry { wait }
//! ```
//! A job never waits for time to pass. Everything that waits is the
//! scheduler's ([`crate::consumer::schedule`]), as an entry with a due time
//! and no payload: a retry (`retry_delay`, or the receiver's `Retry-After`
//! when honoured) ends the job with [`JobEnd::Retry`], and the scheduler
//! reads the row again when it is due, deciding it as it decides a fresh
//! event (the row read is the truth); a rate-limited dispatcher's job is
//! started only once its limiter granted a permit. Cancellation is honoured
//! only where nothing is half done: before a POST. A POST that started is
//! always followed by its status write, retried with backoff on database
//! errors and never by a re-send.
//!
//! A job runs under its partition's [`Lease`]: when the partition is
//! revoked the lease is cancelled, and the revoke waits (up to the drain
//! timeout) for the jobs that are sending or writing to write their
//! status, so the partition's next owner finds their rows already decided
//! and does not send them again.
//!
//! The in-flight limit (`dispatch.max_in_flight`) counts jobs that are
//! sending or writing: a job holds one of [`JobContext::slots`] from just
//! before its POST until its status is written.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use entity::{OutboxEventRow, Status};

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

use crate::dispatch::TraceHeaders;
use crate::dispatch::{Delivery, Registry};
use crate::hold::{Holds, Verdict};
use crate::lease::Lease;
use crate::metrics::{EventSeries, Metrics};
use crate::store::batch::{Sent, StatusWriter};
use crate::store::history::Attempt;
use crate::store::{Outcome, Store, StoreError};
use crate::trace_context::{AttemptSpan, EventTrace, SpanId};
use crate::transition;

pub use crate::metrics::labels::WRITES;

/// What a job needs, shared by all jobs.
pub struct JobContext {
    pub store: Store,
    /// `mark_sent` and `register_failure`, batched across jobs.
    pub status_writer: StatusWriter,
    pub registry: Registry,
    pub metrics: Metrics,
    pub retry_delay: Duration,
    pub max_attempts: i32,
    /// Paused dispatchers and breakers.
    pub holds: Arc<Holds>,
    /// Cancelled when the drain deadline passes: give up even status writes.
    pub abort: CancellationToken,
    /// The in-flight limit: one permit per job between its POST and its
    /// status write.
    pub slots: Arc<Semaphore>,
    /// Each configured event name's metric series, resolved once.
    series: HashMap<String, EventSeries>,
    /// The series of names no dispatcher is configured for.
    unregistered: EventSeries,
    /// Trace context per event and spans per attempt (`[tracing]`).
    pub tracer: crate::tracer::Tracer,
}

impl JobContext {
    pub fn new(
        store: Store,
        registry: Registry,
        metrics: Metrics,
        retry_delay: Duration,
        max_attempts: i32,
        max_in_flight: usize,
        holds: Arc<Holds>,
    ) -> Self {
        let registry = registry.with_table(store.table());
        registry.count_signing_failures(&metrics);
        for (name, _) in registry.shares() {
            metrics
                .dispatcher_throttled_seconds_total
                .with_label_values(&[&name]);
            metrics.dispatcher_rate_share.with_label_values(&[&name]);
        }
        let series = registry
            .event_names()
            .map(|name| {
                let dispatcher = registry.get(name).map(|d| d.name());
                (name.to_owned(), metrics.event_series(name, dispatcher))
            })
            .collect();
        let unregistered = metrics.event_series(crate::dispatch::UNREGISTERED, None);
        JobContext {
            series,
            unregistered,
            status_writer: StatusWriter::spawn_counting(
                store.clone(),
                Some(metrics.history_writes_failed_total.clone()),
            ),
            store,
            registry,
            metrics,
            retry_delay,
            max_attempts,
            holds,
            abort: CancellationToken::new(),
            slots: Arc::new(Semaphore::new(max_in_flight)),
            tracer: crate::tracer::Tracer::off(),
        }
    }

    /// Sends trace context with every attempt (`[tracing]`).
    pub fn with_tracer(mut self, tracer: crate::tracer::Tracer) -> Self {
        self.tracer = tracer;
        self
    }

    /// The metric series of a row's event name.
    fn series(&self, event_name: &str) -> &EventSeries {
        self.series.get(event_name).unwrap_or(&self.unregistered)
    }
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
    /// The database refused the status write for what the row holds, try
    /// after try: the row keeps its last state (the pending-age alert sees
    /// it), its message is finished so its neighbours are not held up.
    GaveUp,
    /// The dispatcher is paused: nothing sent, no attempt used, the row
    /// stays pending; the resume announces it again through the change feed.
    Parked,
    /// The row stays pending and is tried again after `wait`: the
    /// scheduler keeps its id (no payload, no task) until then, and reads
    /// it again; it is sent only if the row is still as this job left it.
    Retry(Retry),
}

/// A row to try again: when, and the attempts the job left on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    pub wait: Duration,
    pub attempts: i32,
}

impl JobEnd {
    fn retry(row: &OutboxEventRow, wait: Duration) -> JobEnd {
        JobEnd::Retry(Retry {
            wait,
            attempts: row.attempts,
        })
    }
}

impl JobEnd {
    /// Whether the triggering message's work is finished (its offset may be
    /// committed). A cancelled job's message must be replayed.
    pub fn finishes_message(&self) -> bool {
        matches!(
            self,
            JobEnd::Sent | JobEnd::Failed | JobEnd::Conflict(_) | JobEnd::GaveUp | JobEnd::Parked
        )
    }
}

pub use transition::due_at;

/// How long a job whose dispatcher's pause could not be confirmed (the
/// pause table did not answer) waits before it is read and tried again.
pub const HOLD_RETRY: Duration = Duration::from_secs(1);

/// Runs one attempt of `row` in the event's span (the trace context is the
/// event's: every attempt is a span of its own in it).
pub async fn run(ctx: Arc<JobContext>, row: OutboxEventRow, lease: Arc<Lease>) -> JobEnd {
    let span = tracing::info_span!(
        "event",
        id = row.id,
        event_name = %row.event_name,
        attempt = tracing::field::Empty,
        trace_id = tracing::field::Empty
    );
    let trace = ctx.tracer.event(&row);
    if let Some(t) = &trace {
        span.record("trace_id", tracing::field::display(&t.trace_id));
    }
    attempt(&ctx, &row, &lease, trace.as_ref(), &span)
        .instrument(span.clone())
        .await
}

/// One attempt: gate (holds, send slot, lease) → send → record (metrics,
/// span, attempt log) → write, ending with an outcome. Nothing here waits
/// for time to pass: a retry, a receiver's `Retry-After` and a hold that
/// cannot be confirmed end the job with [`JobEnd::Retry`], and the
/// scheduler reads the row again when it is due; a rate limit's turn is
/// granted by the scheduler before the job starts.
async fn attempt(
    ctx: &JobContext,
    row: &OutboxEventRow,
    lease: &Lease,
    trace: Option<&EventTrace>,
    span: &tracing::Span,
) -> JobEnd {
    if lease.is_cancelled() {
        return JobEnd::Cancelled;
    }
    let dispatcher = ctx.registry.get(&row.event_name).map(|d| d.name());
    let mut probe = match dispatcher {
        None => false,
        Some(name) => match hold(ctx, name, row).await {
            Ok(probe) => probe,
            Err(end) => return end,
        },
    };
    // Held until this attempt's status is written.
    let _slot = tokio::select! {
        biased;
        _ = lease.cancelled() => return JobEnd::Cancelled,
        permit = ctx.slots.acquire() => match permit {
            Ok(p) => Slot::new(p, &ctx.metrics),
            Err(_) => return JobEnd::Cancelled,
        },
    };
    // A pause seen, or a breaker opened, while this job waited for its slot.
    if let Some(name) = dispatcher {
        if matches!(ctx.holds.paused_now(name).await, Ok(true)) {
            info!(dispatcher = %name, "dispatcher paused: left pending, no attempt used");
            return JobEnd::Parked;
        }
        if !probe {
            match ctx
                .holds
                .breaker_verdict(name, ctx.max_attempts - row.attempts)
            {
                Verdict::Probe => probe = true,
                Verdict::WaitUntil(_) => return park_held(ctx, name, row),
                Verdict::Go | Verdict::Park => {}
            }
        }
    }
    let Some(_busy) = lease.enter() else {
        return JobEnd::Cancelled;
    };
    let attempt = row.attempts + 1;
    span.record("attempt", attempt);
    let (delivery, record) = send(ctx, row, attempt, dispatcher, trace).await;
    // Only the receiver's answers count towards the breaker: a payload
    // that is not JSON was never sent.
    if let Some(name) = dispatcher {
        if !matches!(delivery, Delivery::NotSent { .. }) {
            ctx.holds
                .report(name, matches!(delivery, Delivery::Delivered { .. }), probe);
        } else if probe {
            ctx.holds.void_probe(name);
        }
    }
    let series = ctx.series(&row.event_name);
    let (error, asked, permanent) = match delivery {
        Delivery::Delivered { status, .. } => {
            series.success.inc();
            return write_sent(ctx, row, record.as_ref(), attempt, status).await;
        }
        Delivery::Failed {
            error,
            retry_after,
            permanent,
            ..
        } => (error, retry_after, permanent),
        Delivery::NotSent { error } => (error, None, false),
    };
    series.failure.inc();
    // The receiver's own verdict (`permanent_statuses`): this attempt is
    // the last.
    let max_attempts = if permanent {
        attempt.min(ctx.max_attempts)
    } else {
        ctx.max_attempts
    };
    let next = transition::after_failure(
        row,
        ctx.store.truncate_error(&error),
        crate::store::now(),
        max_attempts,
    );
    let written = write(ctx, WRITES[1], || {
        ctx.status_writer
            .register_failure(row, &next, record.as_ref())
    })
    .await;
    let next = match written {
        Err(end) => return given_up(ctx, end, record.as_ref(), "failure").await,
        Ok(Outcome::Applied(next)) => next,
        // Our own write may have committed before its reply was lost.
        Ok(Outcome::Conflict(found)) if transition::is_own_write(&next, &found) => found,
        Ok(Outcome::Conflict(found)) => {
            warn!(found = %found.status, "row changed during dispatch");
            return JobEnd::Conflict(found.status);
        }
        Ok(Outcome::NotFound(_)) => return JobEnd::Conflict(Status::Pending),
    };
    series.to(next.status).inc();
    if next.status == Status::Failed {
        warn!(attempt, last_error = %error, "pending -> failed");
        return JobEnd::Failed;
    }
    // The wait is the receiver's `Retry-After` when longer than
    // `retry_delay` (kept by the scheduler only: a restart waits
    // `retry_delay` from the row's `updated_at`).
    let retry_in = asked.map_or(ctx.retry_delay, |a| a.max(ctx.retry_delay));
    warn!(attempt, last_error = %error, ?retry_in, "attempt failed");
    let wait = due_at(&next, retry_in)
        .map(|due| {
            (due - crate::store::now())
                .to_std()
                .unwrap_or(Duration::ZERO)
        })
        .unwrap_or(Duration::ZERO);
    JobEnd::retry(&next, wait)
}

/// Sends the attempt and records it: the attempt's span (exported when
/// `[tracing]` has an exporter), the duration metric, and the attempt
/// log's row, written with the status.
async fn send(
    ctx: &JobContext,
    row: &OutboxEventRow,
    attempt: i32,
    dispatcher: Option<&str>,
    trace: Option<&EventTrace>,
) -> (Delivery, Option<Attempt>) {
    let started_at = crate::store::now();
    let started = Instant::now();
    let started_wall = ctx.tracer.exports().then(std::time::SystemTime::now);
    let attempt_span = trace.map(|t| (t, SpanId::random()));
    let headers = attempt_span.map(|(t, span)| TraceHeaders {
        traceparent: t.header(span),
        tracestate: t.state.clone(),
    });
    // A pending row that keeps a `sent_at` was put back by a replay: its
    // request names the replay (one read of the attempt log, replays only).
    let replay = if row.status == entity::Status::Pending && row.sent_at.is_some() {
        match ctx.store.replay_of(row.id).await {
            Ok(op) => op,
            Err(e) => {
                warn!(error = %e, "cannot read which replay put the event back; sent without Outbox-Replay");
                None
            }
        }
    } else {
        None
    };
    let (delivery, timing) = ctx
        .registry
        .dispatch(
            row,
            attempt,
            ctx.store.payload_is_json(),
            headers.as_ref(),
            replay.as_deref(),
        )
        .await;
    let (http_status, detail) = match &delivery {
        Delivery::Delivered { status, excerpt } => (Some(*status), excerpt),
        Delivery::Failed { error, status, .. } => (*status, error),
        Delivery::NotSent { error } => (None, error),
    };
    if let (Some((t, span)), Some(started_wall)) = (attempt_span, started_wall) {
        let delivered = matches!(delivery, Delivery::Delivered { .. });
        ctx.tracer.export(AttemptSpan {
            trace: t.clone(),
            span,
            event_id: row.id,
            event_name: row.event_name.clone(),
            dispatcher: dispatcher.map(str::to_owned),
            attempt,
            started: started_wall,
            ended: std::time::SystemTime::now(),
            http_status,
            outcome: if delivered { "success" } else { "failure" },
            error: (!delivered).then(|| detail.clone()),
        });
    }
    if let (Some(elapsed), Some(duration)) = (timing, &ctx.series(&row.event_name).duration) {
        duration.observe(elapsed.as_secs_f64());
    }
    let record = ctx.store.history_table().map(|_| Attempt {
        event_id: row.id,
        attempt,
        started_at,
        duration_ms: i32::try_from(started.elapsed().as_millis()).unwrap_or(i32::MAX),
        http_status,
        detail: Some(detail.clone()).filter(|d| !d.is_empty()),
        trace_id: trace.map(|t| t.trace_id.to_string()),
    });
    (delivery, record)
}

/// A status write that ended without landing: when the database refused
/// it for good, the attempt is logged alone (best effort), so the attempt
/// log has it and the ordering sweep leaves the row alone.
async fn given_up(
    ctx: &JobContext,
    end: JobEnd,
    record: Option<&Attempt>,
    outcome: &'static str,
) -> JobEnd {
    if matches!(end, JobEnd::GaveUp) {
        if let Some(record) = record {
            match tokio::time::timeout(
                crate::store::batch::STATEMENT_DEADLINE,
                ctx.store.log_given_up_attempt(record, outcome),
            )
            .await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(error = %e, "could not log the attempt of a row given up"),
                Err(_) => warn!("the database did not answer the log of a row given up in time"),
            }
        }
    }
    end
}

/// Writes `sent` after a delivered attempt.
async fn write_sent(
    ctx: &JobContext,
    row: &OutboxEventRow,
    record: Option<&Attempt>,
    attempt: i32,
    status: u16,
) -> JobEnd {
    let series = ctx.series(&row.event_name);
    let next = transition::after_success(row, crate::store::now());
    let written = write(ctx, WRITES[0], || {
        ctx.status_writer.mark_sent(row, &next, record)
    })
    .await;
    match written {
        Err(end) => given_up(ctx, end, record, "success").await,
        Ok(Sent::Applied { .. }) => {
            series.to_sent.inc();
            info!(attempt, http_status = status, "pending -> sent");
            JobEnd::Sent
        }
        // Our own write may have committed before its reply was lost.
        Ok(Sent::Conflict(found)) if transition::is_own_write(&next, &found) => {
            series.to_sent.inc();
            info!(attempt, http_status = status, "pending -> sent");
            JobEnd::Sent
        }
        Ok(Sent::Conflict(found)) => {
            warn!(found = %found.status, "row changed during dispatch");
            JobEnd::Conflict(found.status)
        }
        Ok(Sent::NotFound(_)) => JobEnd::Conflict(Status::Pending),
    }
}

/// Asks the dispatcher's holds before an attempt: `Ok(probe)` to send (as
/// the breaker's probe or not), `Err(end)` when the job ends here: parked
/// (paused, or held by an open breaker), or to be tried again after
/// [`HOLD_RETRY`] when the pause could not be confirmed (no attempt used).
async fn hold(ctx: &JobContext, dispatcher: &str, row: &OutboxEventRow) -> Result<bool, JobEnd> {
    match ctx
        .holds
        .verdict(dispatcher, ctx.max_attempts - row.attempts)
        .await
    {
        Ok(Verdict::Go) => Ok(false),
        Ok(Verdict::Probe) => Ok(true),
        Ok(Verdict::Park) => {
            info!(
                dispatcher,
                "dispatcher paused: left pending, no attempt used"
            );
            Err(JobEnd::Parked)
        }
        // Held by an open breaker: parked, so it takes no capacity from
        // other dispatchers; the breaker announces it again.
        Ok(Verdict::WaitUntil(_)) => Err(park_held(ctx, dispatcher, row)),
        Err(e) => {
            warn!(error = %e, "cannot confirm the dispatcher's pause; asking again");
            Err(JobEnd::retry(row, HOLD_RETRY))
        }
    }
}

fn park_held(ctx: &JobContext, dispatcher: &str, row: &OutboxEventRow) -> JobEnd {
    ctx.holds.park_held(dispatcher, row.id);
    info!(
        dispatcher,
        "breaker open: left pending, no attempt used; announced again when it closes"
    );
    JobEnd::Parked
}

/// An in-flight slot, counted by `outbox_inflight_events` while held.
struct Slot<'a> {
    _permit: SemaphorePermit<'a>,
    metrics: &'a Metrics,
}

impl<'a> Slot<'a> {
    fn new(permit: SemaphorePermit<'a>, metrics: &'a Metrics) -> Self {
        metrics.inflight_events.inc();
        Slot {
            _permit: permit,
            metrics,
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.metrics.inflight_events.dec();
    }
}

/// Tries of a status write that the database refuses for what the row
/// holds (a value too long, a constraint) before the job gives the row up.
pub const MAX_REFUSED_WRITES: u32 = 3;

/// Runs a status write until the database answers. Errors that can pass
/// (connection, timeout, lock conflict) are retried with backoff for as
/// long as it takes; a refusal is retried [`MAX_REFUSED_WRITES`] times,
/// then the job gives the row up. `Err(Aborted)` when the drain deadline
/// passed first.
async fn write<T, F, Fut>(ctx: &JobContext, to: &'static str, op: F) -> Result<T, JobEnd>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut backoff = Duration::from_millis(50);
    let mut refused = 0;
    loop {
        match op().await {
            Ok(outcome) => return Ok(outcome),
            Err(e) => {
                if !e.is_transient() {
                    refused += 1;
                    if refused >= MAX_REFUSED_WRITES {
                        ctx.metrics
                            .status_writes_given_up_total
                            .with_label_values(&[to])
                            .inc();
                        tracing::error!(
                            error = %e,
                            tries = refused,
                            "the database refuses this row's status write; giving the row up (it keeps its last state)"
                        );
                        return Err(JobEnd::GaveUp);
                    }
                }
                ctx.metrics
                    .db_write_retries_total
                    .with_label_values(&[to])
                    .inc();
                warn!(error = %e, retry_in = ?backoff, "status write failed; retrying (the request is not re-sent)");
                tokio::select! {
                    _ = ctx.abort.cancelled() => return Err(JobEnd::Aborted),
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
