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
//!
//! A job runs under its partition's [`Lease`]: when the partition is
//! revoked the lease is cancelled, and the revoke waits (up to the drain
//! timeout) for the jobs that are sending or writing to write their
//! status, so the partition's next owner finds their rows already decided
//! and does not send them again.
//!
//! The in-flight limit (`dispatch.max_in_flight`) counts jobs that are
//! sending or writing: a job holds one of [`JobContext::slots`] from just
//! before its POST until its status is written, and gives it back while it
//! waits for its next attempt, so rows waiting out `retry_delay` do not
//! hold back fresh events (the consumer bounds how many jobs may wait).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use entity::{OutboxEventRow, Status};
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Notify, Semaphore, SemaphorePermit};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

use crate::dispatch::TraceHeaders;
use crate::dispatch::{Delivery, Registry};
use crate::hold::{Holds, Verdict};
use crate::lease::Lease;
use crate::metrics::{EventSeries, Metrics};
use crate::store::batch::{RowReader, Sent, StatusWriter};
use crate::store::history::Attempt;
use crate::store::{Outcome, RowRead, Store, StoreError};
use crate::trace_context::{AttemptSpan, SpanId};
use crate::transition;

/// The status writes a job makes, as `outbox_db_write_retries_total{to}`
/// and `outbox_status_writes_given_up_total{to}` name them.
pub const WRITES: [&str; 2] = ["sent", "failure"];

/// What a job needs, shared by all jobs.
pub struct JobContext {
    pub store: Store,
    /// `mark_sent` and `register_failure`, batched across jobs.
    pub status_writer: StatusWriter,
    /// The re-reads before later attempts, batched across jobs.
    pub row_reader: RowReader,
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
    /// Jobs waiting out `retry_delay` (they hold no slot); the consumer
    /// starts that many more jobs, within its bound.
    pub waiting: AtomicUsize,
    /// Jobs waiting for their dispatcher's rate limit (no slot held): not
    /// counted against the job limit, so a limited dispatcher's backlog
    /// does not keep other dispatchers' events from starting; their
    /// payload bytes still count against the consumer's memory bound.
    pub throttled: AtomicUsize,
    /// Signalled when a job starts waiting: a slot may be free for a row
    /// the consumer holds ready.
    pub wait_started: Notify,
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
            row_reader: RowReader::spawn(store.clone()),
            store,
            registry,
            metrics,
            retry_delay,
            max_attempts,
            holds,
            abort: CancellationToken::new(),
            slots: Arc::new(Semaphore::new(max_in_flight)),
            waiting: AtomicUsize::new(0),
            throttled: AtomicUsize::new(0),
            wait_started: Notify::new(),
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

    /// Jobs currently waiting for their next attempt.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    pub fn throttled(&self) -> usize {
        self.throttled.load(Ordering::Relaxed)
    }
}

/// Counts a job as waiting for its dispatcher's rate limit while it lives.
struct Throttled<'a>(&'a JobContext);

impl<'a> Throttled<'a> {
    fn new(ctx: &'a JobContext) -> Self {
        ctx.throttled.fetch_add(1, Ordering::Relaxed);
        ctx.wait_started.notify_one();
        Throttled(ctx)
    }
}

impl Drop for Throttled<'_> {
    fn drop(&mut self) {
        self.0.throttled.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a job as waiting while it lives.
struct Waiting<'a>(&'a JobContext);

impl<'a> Waiting<'a> {
    fn new(ctx: &'a JobContext) -> Self {
        ctx.waiting.fetch_add(1, Ordering::Relaxed);
        ctx.wait_started.notify_one();
        Waiting(ctx)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
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

pub async fn run(ctx: Arc<JobContext>, mut row: OutboxEventRow, lease: Arc<Lease>) -> JobEnd {
    let span = tracing::info_span!(
        "event",
        id = row.id,
        event_name = %row.event_name,
        attempt = tracing::field::Empty,
        trace_id = tracing::field::Empty
    );
    let event_span = span.clone();
    // The event's trace context, decided once: every attempt is a span of
    // its own in it.
    let trace = ctx.tracer.event(&row);
    if let Some(t) = &trace {
        span.record("trace_id", tracing::field::display(&t.trace_id));
    }
    async move {
        // What the receiver's last `Retry-After` asked for, when longer
        // than `retry_delay` (kept in memory only: a restart waits
        // `retry_delay` from the row's `updated_at`).
        let mut asked: Option<Duration> = None;
        loop {
            let delay = asked.map_or(ctx.retry_delay, |a| a.max(ctx.retry_delay));
            if let Some(due) = due_at(&row, delay) {
                let wait = (due - crate::store::now()).to_std().unwrap_or(Duration::ZERO);
                {
                    let _waiting = Waiting::new(&ctx);
                    tokio::select! {
                        _ = lease.cancelled() => return JobEnd::Cancelled,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                // The row may have moved on while this job waited (another
                // member took the partition while this one was cut off, an
                // operator edited it): send only what the database still
                // says is this attempt (CONTRACT §5).
                match reread(&ctx, &lease, &row).await {
                    Reread::Same => {}
                    Reread::Changed(status) => return JobEnd::Conflict(status),
                    Reread::Cancelled => return JobEnd::Cancelled,
                }
            }
            if lease.is_cancelled() {
                return JobEnd::Cancelled;
            }
            // A paused dispatcher or an open breaker: no attempt used.
            let dispatcher = ctx.registry.get(&row.event_name).map(|d| d.name());
            let probe = match dispatcher {
                None => false,
                Some(name) => match hold(&ctx, &lease, name, &row).await {
                    Ok(probe) => probe,
                    Err(end) => return end,
                },
            };
            // The dispatcher's rate limit: waited for in line, with no
            // slot held, counted as waiting so other dispatchers' events
            // still start. The turn is kept until the slot is taken.
            let mut turn = None;
            if let Some((d, throttle)) = dispatcher
                .and_then(|_| ctx.registry.get(&row.event_name))
                .and_then(|d| d.throttle().map(|t| (d, t)))
            {
                let _throttled = Throttled::new(&ctx);
                let (t, waited) = tokio::select! {
                    _ = lease.cancelled() => return JobEnd::Cancelled,
                    waited = throttle.wait() => waited,
                };
                turn = Some(t);
                ctx.metrics
                    .dispatcher_throttled_seconds_total
                    .with_label_values(&[d.name()])
                    .inc_by(waited.as_secs_f64());
            }
            // Both held until this attempt's status is written.
            let _slot = tokio::select! {
                biased;
                _ = lease.cancelled() => return JobEnd::Cancelled,
                permit = ctx.slots.acquire() => match permit {
                    Ok(p) => Slot::new(p, &ctx.metrics),
                    Err(_) => return JobEnd::Cancelled,
                },
            };
            drop(turn);
            // A pause seen, or a breaker opened, while this job waited for
            // its slot.
            let mut probe = probe;
            if let Some(name) = dispatcher {
                if matches!(ctx.holds.paused_now(name).await, Ok(true)) {
                    info!(dispatcher = %name, "dispatcher paused: left pending, no attempt used");
                    return JobEnd::Parked;
                }
                if !probe {
                    match ctx.holds.breaker_verdict(name, ctx.max_attempts - row.attempts) {
                        Verdict::Probe => probe = true,
                        Verdict::WaitUntil(_) => {
                            ctx.holds.park_held(name, row.id);
                            info!(dispatcher = %name, "breaker open: left pending, no attempt used; announced again when it closes");
                            return JobEnd::Parked;
                        }
                        Verdict::Go | Verdict::Park => {}
                    }
                }
            }
            let Some(_busy) = lease.enter() else {
                return JobEnd::Cancelled;
            };
            let attempt = row.attempts + 1;
            event_span.record("attempt", attempt);
            let series = ctx.series(&row.event_name);
            let started_at = crate::store::now();
            let started = Instant::now();
            let started_wall = ctx.tracer.exports().then(std::time::SystemTime::now);
            let attempt_span = trace.as_ref().map(|t| (t, SpanId::random()));
            let headers = attempt_span.map(|(t, span)| TraceHeaders {
                traceparent: t.header(span),
                tracestate: t.state.clone(),
            });
            let (delivery, timing) = ctx
                .registry
                .dispatch(&row, attempt, ctx.store.payload_is_json(), headers.as_ref())
                .await;
            if let (Some((t, span)), Some(started_wall)) = (attempt_span, started_wall) {
                let (http_status, outcome, error) = match &delivery {
                    Delivery::Delivered { status, .. } => (Some(*status), "success", None),
                    Delivery::Failed { error, status, .. } => {
                        (*status, "failure", Some(error.clone()))
                    }
                    Delivery::NotSent { error } => (None, "failure", Some(error.clone())),
                };
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
                    outcome,
                    error,
                });
            }
            if let (Some(elapsed), Some(duration)) = (timing, &series.duration) {
                duration.observe(elapsed.as_secs_f64());
            }
            // Only the receiver's answers count towards the breaker: a
            // payload that is not JSON was never sent.
            if let Some(name) = dispatcher {
                if !matches!(delivery, Delivery::NotSent { .. }) {
                    let success = matches!(delivery, Delivery::Delivered { .. });
                    ctx.holds.report(name, success, probe);
                } else if probe {
                    ctx.holds.void_probe(name);
                }
            }
            // The attempt log's row, written with the status.
            let record = ctx.store.history_table().map(|_| {
                let (http_status, detail) = match &delivery {
                    Delivery::Delivered { status, excerpt } => (Some(*status), excerpt.clone()),
                    Delivery::Failed { error, status, .. } => (*status, error.clone()),
                    Delivery::NotSent { error } => (None, error.clone()),
                };
                Attempt {
                    event_id: row.id,
                    attempt,
                    started_at,
                    duration_ms: i32::try_from(started.elapsed().as_millis()).unwrap_or(i32::MAX),
                    http_status,
                    detail: Some(detail).filter(|d| !d.is_empty()),
                    trace_id: trace.as_ref().map(|t| t.trace_id.to_string()),
                }
            });
            let failed: Option<String>;
            match delivery {
                Delivery::Delivered { status, .. } => {
                    series.success.inc();
                    let next = transition::after_success(&row, crate::store::now());
                    let written = write(&ctx, WRITES[0], || {
                        ctx.status_writer.mark_sent(&row, &next, record.as_ref())
                    })
                    .await;
                    return match written {
                        Err(end) => end,
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
                    };
                }
                Delivery::Failed { error, retry_after, .. } => {
                    asked = retry_after;
                    failed = Some(error);
                }
                Delivery::NotSent { error } => {
                    asked = None;
                    failed = Some(error);
                }
            }
            if let Some(error) = failed {
                series.failure.inc();
                let next = transition::after_failure(
                    &row,
                    ctx.store.truncate_error(&error),
                    crate::store::now(),
                    ctx.max_attempts,
                );
                let written = write(&ctx, WRITES[1], || {
                    ctx.status_writer
                        .register_failure(&row, &next, record.as_ref())
                })
                .await;
                let next = match written {
                    Err(end) => return end,
                    Ok(Outcome::Applied(next)) => next,
                    // Our own write may have committed before its reply was lost.
                    Ok(Outcome::Conflict(found)) if transition::is_own_write(&next, &found) => {
                        found
                    }
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
                let retry_in = asked.map_or(ctx.retry_delay, |a| a.max(ctx.retry_delay));
                warn!(attempt, last_error = %error, ?retry_in, "attempt failed");
                row = next;
            }
        }
    }
    .instrument(span)
    .await
}

/// Asks the dispatcher's holds before an attempt: `Ok(probe)` to send
/// (as the breaker's probe or not), `Err(end)` when the job ends here
/// (parked, cancelled, or the row changed while the breaker held it).
/// Holding waits like a retry wait (no slot, no attempt used).
async fn hold(
    ctx: &JobContext,
    lease: &Lease,
    dispatcher: &str,
    row: &OutboxEventRow,
) -> Result<bool, JobEnd> {
    let attempts_left = ctx.max_attempts - row.attempts;
    let mut held = false;
    loop {
        let until = match ctx.holds.verdict(dispatcher, attempts_left).await {
            Ok(v @ (Verdict::Go | Verdict::Probe)) if held => {
                // The row may have moved on while it was held. (A probe
                // whose row changed never reports: the breaker lets another
                // probe go after a cool-down.)
                let probe = matches!(v, Verdict::Probe);
                return match reread(ctx, lease, row).await {
                    Reread::Same => Ok(probe),
                    Reread::Changed(status) => Err(JobEnd::Conflict(status)),
                    Reread::Cancelled => Err(JobEnd::Cancelled),
                };
            }
            Ok(Verdict::Go) => return Ok(false),
            Ok(Verdict::Probe) => return Ok(true),
            Ok(Verdict::Park) => {
                info!(
                    dispatcher,
                    "dispatcher paused: left pending, no attempt used"
                );
                return Err(JobEnd::Parked);
            }
            Ok(Verdict::WaitUntil(_)) => {
                // Held by an open breaker: parked, so it takes no capacity
                // from other dispatchers; the breaker announces it again.
                ctx.holds.park_held(dispatcher, row.id);
                info!(
                    dispatcher,
                    "breaker open: left pending, no attempt used; announced again when it closes"
                );
                return Err(JobEnd::Parked);
            }
            Err(e) => {
                warn!(error = %e, "cannot confirm the dispatcher's pause; asking again");
                Instant::now() + Duration::from_secs(1)
            }
        };
        held = true;
        let _waiting = Waiting::new(ctx);
        tokio::select! {
            _ = lease.cancelled() => return Err(JobEnd::Cancelled),
            _ = ctx.holds.hold_until(until) => {}
        }
    }
}

enum Reread {
    /// Still pending with the attempts the job expects.
    Same,
    /// Changed by another writer (or gone: reported as pending).
    Changed(Status),
    Cancelled,
}

/// Reads `row` again before a later attempt, retrying database errors
/// until the lease is cancelled.
async fn reread(ctx: &JobContext, lease: &Lease, row: &OutboxEventRow) -> Reread {
    let mut backoff = Duration::from_millis(50);
    loop {
        match ctx.row_reader.get(row.id).await {
            Ok(Some(RowRead::Undecodable { error, .. })) => {
                warn!(%error, "row cannot be decoded any more; not sent");
                return Reread::Changed(Status::Pending);
            }
            Ok(Some(RowRead::Row(found)))
                if found.status == Status::Pending && found.attempts == row.attempts =>
            {
                return Reread::Same
            }
            Ok(Some(RowRead::Row(found))) => {
                warn!(found = %found.status, attempts = found.attempts, "row changed while waiting for the next attempt; not sent");
                return Reread::Changed(found.status);
            }
            Ok(None) => {
                warn!("row deleted while waiting for the next attempt");
                return Reread::Changed(Status::Pending);
            }
            Err(e) => {
                warn!(error = %e, retry_in = ?backoff, "cannot read the row before its next attempt; retrying");
                tokio::select! {
                    _ = lease.cancelled() => return Reread::Cancelled,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
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
