//! The consumer's decisions, with no Kafka and no database in them: which
//! rows to read, which jobs to start, which offsets may be committed, when
//! to stop fetching. The driver ([`super::Pipeline`]) tells the
//! [`Scheduler`] what happened (messages decoded, rows read, jobs ended,
//! partitions assigned or revoked, time passing) and carries out what it
//! answers; nothing here awaits, so nothing here can stall the loop.
//!
//! The life of a trigger (a change event announcing a pending row):
//!
//! ```text
//!  trigger ──► (id busy here?) ──yes──► deferred until the id is free, then decided again
//!     │no
//!     ▼
//!  to read ──► read (the driver, off the loop) ──► row pending, not older than the event ──► ready ──► job
//!                 │                                    row sent/failed, as new as the event ──► finished (stale)
//!                 │                                    row undecodable ──► finished (logged, counted)
//!                 ├─ row missing, or older than the event ──► re-read with backoff, up to
//!                 │    `visibility_timeout`; then decided on the row as read (missing → finished)
//!                 └─ read failed (database down, deadline) ──► re-read with backoff, no bound
//! ```
//!
//! An id has at most one piece of work here at a time (reading, waiting for
//! a re-read, ready or running); a second trigger for it waits in `deferred`
//! and is decided again from the database when the id is free. A later
//! trigger for an id waiting for a re-read replaces it (the newer event
//! says at least as much).
//!
//! Every message is *begun* in its partition's [`PartitionOffsets`] when it
//! is collected, stamped with the generation of the assignment it came from,
//! and *finished* when decided; a message of an earlier generation is
//! ignored, so a revoke never lets an offset of the next assignment be
//! committed early.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use chrono::NaiveDateTime;
use entity::{OutboxEventRow, Status};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::cdc::Trigger;
use crate::metrics::Metrics;
use crate::store::RowRead;
use assignment::Assignment;
use flow::FlowControl;
use lines::Aggregates;
pub use lines::{MAX_AGGREGATE_QUEUED, RELEASED, RELEASE_BATCH};
use reads::Reads;
use waits::{RateLine, Waits};
pub use waits::{LINE_ROWS, MAX_WAITING};

mod assignment;
mod flow;
mod lines;
mod reads;
mod waits;

/// What the scheduler asks of the dispatchers' rate limits before it
/// starts a job (the driver's [`crate::dispatch::Registry`]; a fake in the
/// unit tests). Nothing here waits.
pub trait Gate {
    /// The rate-limited dispatcher of `event_name`, if it has a limit.
    fn limited(&self, event_name: &str) -> Option<&str>;
    /// A permit for one request of `event_name`'s dispatcher now, or how
    /// long until one may be asked for again.
    fn permit(&self, event_name: &str) -> Result<(), Duration>;
}

/// No rate limits.
pub struct NoLimits;

impl Gate for NoLimits {
    fn limited(&self, _: &str) -> Option<&str> {
        None
    }
    fn permit(&self, _: &str) -> Result<(), Duration> {
        Ok(())
    }
}

/// How many triggers one row read covers.
pub const MAX_READ: usize = 512;
/// Row reads under way at once.
pub const MAX_CONCURRENT_READS: usize = 2;
/// Rows per read until a payload size has been seen: guessing small
/// payloads would read 512 rows of perhaps 200 KiB each, twice at once
/// (measured: 391 MiB peak RSS, `make bench-memory`).
pub const FIRST_READ: usize = 16;
/// The first re-read of a row not yet visible; doubled up to [`RECHECK_MAX`].
const RECHECK_FIRST: Duration = Duration::from_millis(50);
const RECHECK_MAX: Duration = Duration::from_secs(2);
/// Back-off after a failed read (database down), doubled up to [`READ_RETRY_MAX`].
const READ_RETRY_FIRST: Duration = Duration::from_millis(100);
const READ_RETRY_MAX: Duration = Duration::from_secs(5);
/// How long the loop may hold back (not take messages) with no work ending
/// before it pauses the partitions. A pause drops librdkafka's prefetched
/// messages and a resume takes a fetch cycle before messages flow again, so
/// short waits are bridged by simply not polling.
pub const PAUSE_AFTER: Duration = Duration::from_millis(500);
/// How long the loop may hold back in all before it pauses: rebalance
/// callbacks run only while it polls.
pub const HOLD_MAX: Duration = Duration::from_secs(5);
/// Dead-letter sends under way at most before fetching holds (each keeps
/// its record in memory until the producer delivers or gives up, which a
/// missing or slow topic makes minutes); their bytes are bounded to an
/// eighth of `dispatch.max_buffered_bytes`.
pub const MAX_DEAD_LETTERS: usize = 1_000;

/// A message whose work is outstanding: where it is and which assignment
/// of its partition it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    pub partition: i32,
    pub generation: u64,
    pub offset: i64,
}

/// What the change event said of the row, to tell a row read too early
/// (before the event's write is visible to this connection) from one that
/// moved on since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    pub attempts: Option<i32>,
    pub updated_at: Option<NaiveDateTime>,
    /// The event is the row's insert, on its aggregate's partition
    /// (`[ordering]`): every later event of the aggregate comes after it
    /// on that partition, so none can have been parked behind the row
    /// before it is decided here. Any other event (an update: a resend, a
    /// resume, an announcement; or an insert not keyed by the aggregate)
    /// may have later events parked behind it.
    pub created: bool,
}

impl From<&Trigger> for Expect {
    fn from(t: &Trigger) -> Self {
        Expect {
            attempts: t.attempts,
            updated_at: t.updated_at,
            created: t.op == crate::cdc::Op::Create,
        }
    }
}

impl Expect {
    /// Whether `row` is an earlier version of the row than the event's.
    /// `updated_at` is set on every write, so it orders versions; without
    /// it, a pending row with fewer attempts than the event is earlier. (A
    /// resend lowers the attempts, so they cannot order a terminal row.)
    pub fn is_newer_than(&self, row: &OutboxEventRow) -> bool {
        match self.updated_at {
            Some(at) => row.updated_at < at,
            None => self
                .attempts
                .is_some_and(|a| row.status == Status::Pending && row.attempts < a),
        }
    }
}

/// A trigger waiting for (or in) a read.
#[derive(Debug, Clone, Copy)]
struct Wanted {
    id: i64,
    pos: Pos,
    expect: Expect,
    /// When the row was first found missing or older than the event.
    early_since: Option<Instant>,
    /// Re-reads so far (missing/older rows and failed reads alike).
    tries: u32,
}

impl Wanted {
    fn new(id: i64, pos: Pos, expect: Expect) -> Self {
        Wanted {
            id,
            pos,
            expect,
            early_since: None,
            tries: 0,
        }
    }
}

/// The one piece of work an id has here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    /// In `to_read` or in a read under way.
    Reading,
    /// Waiting for a re-read (in `rechecks`).
    Recheck,
    /// Read pending; in the ready queue (or read ahead in a rate line).
    Ready,
    /// A job runs: which one, the payload bytes it holds, and whether the
    /// event it was decided on was the row's insert ([`Expect::created`]).
    Running {
        serial: u64,
        bytes: usize,
        created: bool,
        since: Instant,
    },
    /// Waiting for a due time (a retry), id only.
    Due,
    /// Waiting in a rate line for a permit, id only.
    Throttled,
}

/// What an event waits for in this replica's scheduler
/// ([`Scheduler::explain`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Here {
    /// Its row is being read.
    Reading,
    /// Its row was read before its change was visible: read again in `in_`.
    Recheck { in_: Option<Duration> },
    /// Read and pending: waits for one of the `max_jobs` job slots.
    Ready { running: usize, max_jobs: usize },
    /// Its attempt runs, for `for_` so far.
    Running { for_: Duration },
    /// Its next attempt is due in `in_` (a retry, or a receiver's
    /// Retry-After).
    Due { in_: Option<Duration> },
    /// Waits for a permit of its dispatcher's rate, `ahead` events before it.
    Throttled {
        dispatcher: String,
        ahead: usize,
        next_permit_in: Option<Duration>,
    },
    /// A later change event for an id whose work is under way.
    Deferred,
    /// Waits in its aggregate's line behind event `active`, `ahead` more
    /// before it.
    InLine { active: i64, ahead: usize },
}

/// A job the driver must start.
#[derive(Debug)]
pub struct Start {
    pub row: OutboxEventRow,
    pub pos: Pos,
    /// Names this job in [`Scheduler::job_ended`].
    pub serial: u64,
}

/// A read the driver must make; its result goes to [`Scheduler::rows_read`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub ticket: u64,
    pub ids: Vec<i64>,
}

/// Fetching to pause or resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Pause,
    Resume,
}

/// Change events the scheduler finishes without a job of their own
/// (`outbox_cdc_skips_total{reason}`, beside [`crate::cdc::Skip`]'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleSkip {
    /// A newer event for an id whose job is running: decided when it ends.
    JobRunning,
    /// The row was deleted while its event waited for it to be visible.
    RowMissing,
}

impl ScheduleSkip {
    /// Every [`ScheduleSkip::reason`].
    pub const REASONS: [&'static str; 2] = crate::metrics::labels::SCHEDULE_SKIP_REASONS;

    pub fn reason(self) -> &'static str {
        match self {
            ScheduleSkip::JobRunning => "job_running",
            ScheduleSkip::RowMissing => "row_missing",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_in_flight: usize,
    /// How long a row that is missing or older than its event is re-read
    /// before the event is decided on the row as read.
    pub visibility_timeout: Duration,
    /// Payload bytes the consumer may hold at once (rows ready, rows being
    /// read, rows of running jobs), so large payloads cannot run the pod
    /// out of memory: half for ready rows, half for jobs, reads sized to
    /// an eighth each from the payload sizes seen.
    pub max_buffered_bytes: usize,
}

/// The scheduler's state, each part in a struct of its own: the
/// partitions held ([`Assignment`]), the reads ([`Reads`]), the rows ready
/// to start ([`Ready`]), the jobs running ([`Jobs`]), what waits for time
/// to pass ([`Waits`]: retries, rate lines), fetching's flow control
/// ([`FlowControl`]) and the aggregates' lines ([`Aggregates`]); the
/// scheduler itself keeps the one piece of work each id has and moves ids
/// between the parts.
pub struct Scheduler {
    limits: Limits,
    metrics: Metrics,
    /// `outbox_scheduler_waiting{wait="retry"}` and `{wait="rate"}`,
    /// resolved once (they are set at every turn of the loop).
    waiting_gauges: [prometheus::IntGauge; 2],
    /// A pending row with attempts waits `retry_delay` from its
    /// `updated_at` before its next attempt.
    retry_delay: Duration,
    assignment: Assignment,
    /// The one piece of work each id has here.
    work: HashMap<i64, Work>,
    /// Triggers for busy ids, decided again when the id is free.
    deferred: HashMap<i64, Vec<(Pos, Expect)>>,
    reads: Reads,
    ready: Ready,
    jobs: Jobs,
    waits: Waits,
    flow: FlowControl,
    ordering: Aggregates,
}

/// Rows read pending and decided: they wait for a job.
#[derive(Default)]
struct Ready {
    queue: VecDeque<(OutboxEventRow, Pos, usize)>,
    /// Payload bytes of the rows ready (and read ahead in rate lines).
    bytes: usize,
    /// Ids decided ready on their insert ([`Expect::created`]), until
    /// their job starts (a retry's entry keeps it).
    created: HashSet<i64>,
}

/// The jobs running: each is one attempt.
#[derive(Default)]
struct Jobs {
    running: usize,
    /// Payload bytes the running jobs hold.
    bytes: usize,
    next_serial: u64,
}

impl Jobs {
    /// Whether one more job may start: under the job limit, and within the
    /// jobs' half of the memory bound (one job always runs, however large
    /// its payload).
    fn may_start(&self, limits: &Limits, next: usize) -> bool {
        self.running < max_jobs(limits.max_in_flight)
            && (self.running == 0 || self.bytes + next <= limits.max_buffered_bytes / 2)
    }
}

impl Scheduler {
    pub fn new(limits: Limits, metrics: Metrics, now: Instant) -> Self {
        let waiting_gauges =
            ["retry", "rate"].map(|w| metrics.scheduler_waiting.with_label_values(&[w]));
        Scheduler {
            limits,
            waiting_gauges,
            metrics,
            retry_delay: Duration::ZERO,
            assignment: Assignment::default(),
            work: HashMap::new(),
            deferred: HashMap::new(),
            reads: Reads::default(),
            ready: Ready::default(),
            jobs: Jobs {
                next_serial: 1,
                ..Jobs::default()
            },
            waits: Waits::default(),
            flow: FlowControl::new(now),
            ordering: Aggregates::default(),
        }
    }

    /// Rows with attempts wait `retry_delay` from their `updated_at`.
    pub fn with_retry_delay(mut self, retry_delay: Duration) -> Self {
        self.retry_delay = retry_delay;
        self
    }

    // ---- the group ----

    /// Partitions assigned: each starts a new generation. Returns whether
    /// fetching must be resumed (an assignment starts unpaused). Under the
    /// cooperative protocol an assignment is incremental: a partition
    /// already held keeps its generation, offsets and jobs.
    pub fn assign(&mut self, parts: &[i32]) -> Option<Flow> {
        self.assignment.assign(parts);
        if self.flow.paused {
            self.flow.paused = false;
            self.flow.holding_since = None;
            return Some(Flow::Resume);
        }
        None
    }

    /// Partitions revoked: everything of theirs not yet running is dropped
    /// (the next owner reads those messages again); running jobs are the
    /// driver's to cancel, and end here through [`Self::job_ended`].
    pub fn revoke(&mut self, parts: &[i32]) {
        self.assignment.revoke(parts);
        let gone = |pos: &Pos| parts.contains(&pos.partition);
        let mut freed = Vec::new();
        for (row, _, bytes) in take_where(&mut self.ready.queue, |r| gone(&r.1)) {
            freed.push(row.id);
            self.ready.bytes -= bytes;
        }
        freed.extend(take_where(&mut self.reads.to_read, |w| gone(&w.pos)).map(|w| w.id));
        self.reads.rechecks.retain(|id, (_, w)| {
            let keep = !gone(&w.pos);
            if !keep {
                freed.push(*id);
            }
            keep
        });
        freed.extend(self.waits.due.drop_where(gone));
        for line in &mut self.waits.lines {
            freed.extend(take_where(&mut line.ids, |w| gone(&w.pos)).map(|w| w.id));
            for (row, _, bytes) in take_where(&mut line.rows, |r| gone(&r.1)) {
                freed.push(row.id);
                self.ready.bytes -= bytes;
            }
        }
        for id in &freed {
            self.work.remove(id);
            self.waits.refilled(*id);
        }
        self.deferred.retain(|_, list| {
            list.retain(|(pos, _)| !gone(pos));
            !list.is_empty()
        });
        self.ordering.drop_where(gone);
        for id in freed {
            self.next_of_aggregate(id);
        }
    }

    /// Stamps a message collected from `partition` with its assignment's
    /// generation and begins its work; `None` when the partition is not
    /// (or no longer) ours: the next owner reads it again.
    pub fn begin(&mut self, partition: i32, offset: i64) -> Option<Pos> {
        self.assignment.begin(partition, offset)
    }

    /// The message's work is done (skipped, invalid, decided).
    pub fn finish(&mut self, pos: &Pos) {
        self.assignment.finish(pos);
    }

    fn current(&self, pos: &Pos) -> bool {
        self.assignment.current(pos)
    }

    // ---- messages ----

    /// A change event announcing a pending row.
    pub fn trigger(&mut self, trigger: &Trigger, pos: Pos) {
        let expect = Expect {
            // Not on its aggregate's partition, or not ordered.
            created: false,
            ..Expect::from(trigger)
        };
        self.admit(trigger.id, pos, expect);
    }

    fn admit(&mut self, id: i64, pos: Pos, expect: Expect) {
        if !self.current(&pos) {
            return;
        }
        match self.work.get(&id) {
            None => {
                self.work.insert(id, Work::Reading);
                self.reads.to_read.push_back(Wanted::new(id, pos, expect));
            }
            Some(Work::Recheck) => {
                // The newer event replaces the one waiting (at its next read).
                if let Some((_, w)) = self.reads.rechecks.get_mut(&id) {
                    let old = std::mem::replace(&mut w.pos, pos);
                    w.expect = expect;
                    self.finish(&old);
                }
            }
            Some(_) => {
                self.metrics
                    .cdc_skips_total
                    .with_label_values(&[ScheduleSkip::JobRunning.reason()])
                    .inc();
                self.deferred.entry(id).or_default().push((pos, expect));
            }
        }
    }

    /// A delete of row `id`: a re-read waiting for it ends (the row is
    /// gone for good); the delete's own message is finished by the caller.
    pub fn deleted(&mut self, id: i64) {
        if self.work.get(&id) == Some(&Work::Reading) {
            self.reads.deleted_while_reading.insert(id);
        }
        // A retry waiting for a row that is gone: nothing left to send.
        if let Some(w) = self.waits.due.remove(id) {
            self.metrics
                .cdc_skips_total
                .with_label_values(&[ScheduleSkip::RowMissing.reason()])
                .inc();
            info!(id, "row deleted while waiting for its next attempt");
            self.finish(&w.pos);
            self.free(id);
        }
        if let Some((_, w)) = self.reads.rechecks.remove(&id) {
            self.metrics
                .cdc_skips_total
                .with_label_values(&[ScheduleSkip::RowMissing.reason()])
                .inc();
            info!(
                id,
                partition = w.pos.partition,
                offset = w.pos.offset,
                "row deleted while waiting for it to become visible"
            );
            self.finish(&w.pos);
            self.free(id);
        }
    }

    // ---- reads ----

    /// The reads to make now: re-reads that are due, then new triggers, at
    /// most [`MAX_CONCURRENT_READS`] under way.
    pub fn take_reads(&mut self, now: Instant) -> Vec<Read> {
        for w in self.reads.take_rechecks(now) {
            self.work.insert(w.id, Work::Reading);
            self.reads.to_read.push_front(w);
        }
        for w in self.waits.due.take_due(now) {
            self.work.insert(w.id, Work::Reading);
            self.reads.to_read.push_back(w);
        }
        for (i, line) in self.waits.lines.iter_mut().enumerate() {
            for _ in 0..line.to_refill() {
                let Some(w) = line.ids.pop_front() else { break };
                line.refilling += 1;
                self.waits.refill_of.insert(w.id, i);
                self.work.insert(w.id, Work::Reading);
                self.reads.to_read.push_back(w);
            }
        }
        self.reads.start(self.limits.max_buffered_bytes)
    }

    /// The answer to read `ticket`: the rows found (or `Err` with why the
    /// read failed: it is made again after a back-off).
    pub fn rows_read(&mut self, ticket: u64, result: Result<Vec<RowRead>, String>, now: Instant) {
        let Some(batch) = self.reads.under_way.remove(&ticket) else {
            return;
        };
        self.flow.progress_at = now;
        let mut rows = match result {
            Ok(rows) => {
                self.reads.saw(&rows);
                rows.into_iter()
                    .map(|r| (r.id(), r))
                    .collect::<HashMap<i64, RowRead>>()
            }
            Err(error) => {
                self.metrics.row_reads_failed_total.inc();
                warn!(%error, rows = batch.len(), "cannot read triggered rows; reading them again later");
                for mut w in batch {
                    if !self.current(&w.pos) {
                        self.free(w.id);
                        continue;
                    }
                    w.tries += 1;
                    let wait = backoff(READ_RETRY_FIRST, READ_RETRY_MAX, w.tries);
                    self.recheck(w, now + wait);
                }
                return;
            }
        };
        for w in batch {
            if !self.current(&w.pos) {
                self.free(w.id);
                continue;
            }
            let read = rows.remove(&w.id);
            self.decide(w, read, now);
        }
    }

    fn decide(&mut self, mut w: Wanted, read: Option<RowRead>, now: Instant) {
        self.waits.refilled(w.id);
        let gone = self.reads.deleted_while_reading.remove(&w.id);
        let early = match &read {
            None => !gone,
            Some(RowRead::Row(row)) => w.expect.is_newer_than(row),
            Some(RowRead::Undecodable { .. }) => false,
        };
        if early {
            let since = *w.early_since.get_or_insert(now);
            if now.saturating_duration_since(since) < self.limits.visibility_timeout {
                w.tries += 1;
                let wait = backoff(RECHECK_FIRST, RECHECK_MAX, w.tries);
                debug!(
                    id = w.id,
                    tries = w.tries,
                    missing = read.is_none(),
                    "row not yet as the event says; reading it again"
                );
                self.recheck(w, now + wait);
                return;
            }
            let saw = match &read {
                None => "no row".to_owned(),
                Some(RowRead::Row(row)) => format!(
                    "row {} with {} attempts, updated_at {}",
                    row.status, row.attempts, row.updated_at
                ),
                Some(RowRead::Undecodable { .. }) => "an undecodable row".to_owned(),
            };
            self.metrics.rows_never_visible_total.inc();
            warn!(
                id = w.id,
                partition = w.pos.partition,
                offset = w.pos.offset,
                saw = %saw,
                expected_attempts = w.expect.attempts,
                expected_updated_at = ?w.expect.updated_at,
                waited = ?self.limits.visibility_timeout,
                "the row never became visible as the change event announced it; deciding on the row as read \
                 (once it is there: outbox-sidecar events retrigger ID)"
            );
        } else if w.early_since.is_some() {
            self.metrics.cdc_rows_visible_late_total.inc();
            info!(
                id = w.id,
                partition = w.pos.partition,
                offset = w.pos.offset,
                tries = w.tries,
                "row became visible after its change event"
            );
        }
        let reason = match read {
            Some(RowRead::Row(row))
                if row.status == Status::Pending
                    && row.sequence.as_ref().is_some_and(|s| s.behind.is_some()) =>
            {
                // `[ordering]`: an earlier event of its aggregate is not
                // sent yet.
                self.park_behind(w.id, row.sequence.as_ref().and_then(|s| s.behind));
                self.finish(&w.pos);
                self.free(w.id);
                return;
            }
            Some(RowRead::Row(row))
                if row.status == Status::Pending && self.retry_wait(&row).is_some() =>
            {
                // Its next attempt is not due yet (a restart, another
                // replica's attempt, an operator's edit): waits here.
                let wait = self.retry_wait(&row).unwrap_or_default();
                self.work.insert(w.id, Work::Due);
                self.waits.due.insert(now + wait, w);
                return;
            }
            Some(RowRead::Row(row)) if row.status == Status::Pending => {
                if !w.expect.created
                    && row.sequence.as_ref().is_some_and(|s| s.aggregate.is_some())
                    && !self.ordering.chained.contains(&w.id)
                {
                    self.announce_after_ends(row.id);
                }
                let bytes = payload_bytes(&row.payload);
                if w.expect.created {
                    self.ready.created.insert(w.id);
                }
                self.work.insert(w.id, Work::Ready);
                self.ready.bytes += bytes;
                self.ready.queue.push_back((row, w.pos, bytes));
                return;
            }
            Some(RowRead::Row(row)) => {
                debug!(id = w.id, status = %row.status, "stale trigger skipped");
                if early {
                    "row_older"
                } else {
                    "stale"
                }
            }
            Some(RowRead::Undecodable { id, error }) => {
                warn!(
                    id,
                    partition = w.pos.partition,
                    offset = w.pos.offset,
                    %error,
                    "row cannot be decoded; its change event is skipped (the row stays as it is)"
                );
                "undecodable_row"
            }
            None => "row_missing",
        };
        self.metrics
            .cdc_skips_total
            .with_label_values(&[reason])
            .inc();
        self.finish(&w.pos);
        self.free(w.id);
    }

    /// How long until a pending row with attempts may be tried again
    /// (`None`: now).
    fn retry_wait(&self, row: &OutboxEventRow) -> Option<Duration> {
        let due = crate::transition::due_at(row, self.retry_delay)?;
        (due - crate::store::now())
            .to_std()
            .ok()
            .filter(|d| !d.is_zero())
    }

    fn recheck(&mut self, w: Wanted, due: Instant) {
        self.work.insert(w.id, Work::Recheck);
        self.reads.rechecks.insert(w.id, (due, w));
    }

    /// The id has no work here any more: the triggers that waited for it
    /// are decided again from the database, on the newest one's
    /// expectation (an id's change events come in commit order on one
    /// partition, so the newest says at least as much as the others: a row
    /// as new as it satisfies them all). The older ones are finished now;
    /// the newest waits, if it must, for its version to be visible.
    fn free(&mut self, id: i64) {
        self.free_id(id);
        self.next_of_aggregate(id);
    }

    fn free_id(&mut self, id: i64) {
        self.work.remove(&id);
        self.ordering.chained.remove(&id);
        self.waits.refilled(id);
        self.ready.created.remove(&id);
        self.reads.deleted_while_reading.remove(&id);
        let Some(list) = self.deferred.remove(&id) else {
            return;
        };
        let mut current: Vec<(Pos, Expect)> = list
            .into_iter()
            .filter(|(pos, _)| self.current(pos))
            .collect();
        let Some(newest) = (0..current.len()).max_by_key(|&i| current[i].0.offset) else {
            return;
        };
        let (pos, expect) = current.swap_remove(newest);
        for (older, _) in &current {
            self.finish(older);
        }
        self.admit(id, pos, expect);
    }

    // ---- jobs ----

    /// Jobs to start now, up to the job limit ([`max_jobs`]) and the jobs'
    /// half of the memory bound. A rate-limited dispatcher's row starts
    /// only with a permit of its limiter (`gate`); until then it waits in
    /// its dispatcher's line, taking no job and (but for the line's head)
    /// no payload, and the other dispatchers' rows go on past it.
    pub fn take_starts(&mut self, now: Instant, gate: &dyn Gate) -> Vec<Start> {
        let mut out = Vec::new();
        while let Some((row, _, _)) = self.ready.queue.front() {
            if let Some(dispatcher) = gate.limited(&row.event_name) {
                let event_name = row.event_name.clone();
                let i = self.rate_line(dispatcher, &event_name, now);
                if let Some((row, pos, bytes)) = self.ready.queue.pop_front() {
                    self.line_up(i, row, pos, bytes);
                }
                continue;
            }
            let next = self.ready.queue.front().map_or(0, |r| r.2);
            if !self.jobs.may_start(&self.limits, next) {
                break;
            }
            if let Some((row, pos, bytes)) = self.ready.queue.pop_front() {
                self.ready.bytes -= bytes;
                self.start(row, pos, bytes, now, &mut out);
            }
        }
        for i in 0..self.waits.lines.len() {
            self.count_throttled(i, now);
            while self.jobs.may_start(
                &self.limits,
                self.waits.lines[i].rows.front().map_or(0, |r| r.2),
            ) {
                let line = &mut self.waits.lines[i];
                if line.rows.is_empty() || line.next_at.is_some_and(|at| at > now) {
                    break;
                }
                match gate.permit(&line.event_name) {
                    Ok(()) => {
                        line.next_at = None;
                        if let Some((row, pos, bytes)) = line.rows.pop_front() {
                            self.ready.bytes -= bytes;
                            self.start(row, pos, bytes, now, &mut out);
                        }
                    }
                    Err(wait) => line.next_at = Some(now + wait),
                }
            }
        }
        self.metrics.jobs_running.set(self.jobs.running as i64);
        let [retry, rate] = &self.waiting_gauges;
        retry.set(self.waits.due.len() as i64);
        rate.set(self.waits.rate_waiting() as i64);
        out
    }

    fn start(
        &mut self,
        row: OutboxEventRow,
        pos: Pos,
        bytes: usize,
        now: Instant,
        out: &mut Vec<Start>,
    ) {
        if !self.current(&pos) {
            self.free(row.id);
            return;
        }
        let created = self.ready.created.remove(&row.id);
        let serial = self.jobs.next_serial;
        self.jobs.next_serial += 1;
        self.jobs.running += 1;
        self.jobs.bytes += bytes;
        self.work.insert(
            row.id,
            Work::Running {
                serial,
                bytes,
                created,
                since: now,
            },
        );
        out.push(Start { row, pos, serial });
    }

    /// The line of a rate-limited dispatcher (made on its first event).
    fn rate_line(&mut self, dispatcher: &str, event_name: &str, now: Instant) -> usize {
        match self
            .waits
            .lines
            .iter()
            .position(|l| l.dispatcher == dispatcher)
        {
            Some(i) => i,
            None => {
                self.waits
                    .lines
                    .push(RateLine::new(dispatcher, event_name, now));
                self.waits.lines.len() - 1
            }
        }
    }

    /// A ready row of a rate-limited dispatcher joins its line: read ahead
    /// while the line's head has room, else as its id only (read again
    /// when its turn nears).
    fn line_up(&mut self, i: usize, row: OutboxEventRow, pos: Pos, bytes: usize) {
        let line = &mut self.waits.lines[i];
        if line.rows.len() < LINE_ROWS {
            line.rows.push_back((row, pos, bytes));
            return;
        }
        self.ready.bytes -= bytes;
        let created = self.ready.created.remove(&row.id);
        self.work.insert(row.id, Work::Throttled);
        let expect = Expect {
            attempts: Some(row.attempts),
            updated_at: None,
            created,
        };
        line.ids.push_back(Wanted::new(row.id, pos, expect));
    }

    /// Adds the time the line's events waited since it was last counted.
    fn count_throttled(&mut self, i: usize, now: Instant) {
        let line = &mut self.waits.lines[i];
        let waited = now.saturating_duration_since(line.counted_at);
        line.counted_at = now;
        let n = line.waiting();
        if n > 0 && !waited.is_zero() {
            self.metrics
                .dispatcher_throttled_seconds_total
                .with_label_values(&[&line.dispatcher])
                .inc_by(waited.as_secs_f64() * n as f64);
        }
    }

    /// Job `serial` for `id` ended with a retry (the row pending with
    /// `attempts`): its id waits here, with
    /// no payload, until `wait` has passed, then is read again and decided
    /// as a fresh event (sent only if the row is still pending with the
    /// attempts the job left). Its message stays unfinished until then.
    pub fn job_retry(
        &mut self,
        id: i64,
        serial: u64,
        pos: &Pos,
        wait: Duration,
        attempts: i32,
        now: Instant,
    ) {
        let Some(created) = self.job_out(id, serial, now) else {
            return;
        };
        if !self.current(pos) {
            self.free(id);
            return;
        }
        let expect = Expect {
            attempts: Some(attempts),
            updated_at: None,
            created,
        };
        self.work.insert(id, Work::Due);
        self.waits
            .due
            .insert(now + wait, Wanted::new(id, *pos, expect));
    }

    /// Job `serial` for `id` ended; `finished`: its message's work is done
    /// (sent, failed, conflict), else it must be replayed by the next owner.
    pub fn job_ended(&mut self, id: i64, serial: u64, pos: &Pos, finished: bool, now: Instant) {
        self.job_ended_in(id, serial, pos, finished, false, now);
    }

    /// As [`Self::job_ended`]; `unblocks`: the event ended as lets its
    /// aggregate's later events go (`sent`; `failed` under `on_failed =
    /// "skip"`). Its aggregate's next pending event is then announced
    /// again when one may have been parked behind it (see
    /// [`Expect::created`]).
    pub fn job_ended_in(
        &mut self,
        id: i64,
        serial: u64,
        pos: &Pos,
        finished: bool,
        unblocks: bool,
        now: Instant,
    ) {
        let current = self.job_out(id, serial, now);
        if finished {
            self.finish(pos);
        }
        if current.is_some() {
            // A released id whose next was released with it: that one
            // waits in its line here, nothing to read after this one.
            let chained = self.ordering.chained.contains(&id);
            if self.ordering.announce_after.remove(&id) && unblocks && !chained {
                self.ordering.announce.push(id);
                self.ordering.announce_pos.insert(id, *pos);
            }
            self.free(id);
        }
    }

    /// A job ended: it no longer counts as running. `Some(created)` when
    /// `serial` is still the id's running job (its payload bytes freed);
    /// `None` for a job the id no longer has (a revoke freed it).
    fn job_out(&mut self, id: i64, serial: u64, now: Instant) -> Option<bool> {
        self.flow.progress_at = now;
        self.jobs.running = self.jobs.running.saturating_sub(1);
        match self.work.get(&id) {
            Some(&Work::Running {
                serial: s,
                bytes,
                created,
                ..
            }) if s == serial => {
                self.jobs.bytes -= bytes;
                Some(created)
            }
            _ => None,
        }
    }

    // ---- offsets ----

    /// Offsets that moved since the last call (to store).
    pub fn take_commits(&mut self) -> Vec<(i32, i64)> {
        self.assignment.take_commits()
    }

    /// Every partition's committable offset (the final commit).
    pub fn commits(&self) -> Vec<(i32, i64)> {
        self.assignment.commits()
    }

    pub fn partitions(&self) -> Vec<i32> {
        self.assignment.partitions()
    }

    // ---- flow control ----

    /// Triggers decided or being decided, not yet running.
    pub fn held(&self) -> usize {
        self.ready.queue.len() + self.waits.rows_read_ahead() + self.reads.held()
    }

    pub fn running(&self) -> usize {
        self.jobs.running
    }

    /// Not taking messages: too much waits here, and the partitions are not
    /// paused yet (once paused, polling is safe again and serves rebalance
    /// callbacks).
    pub fn holding(&self) -> bool {
        !self.flow.paused && self.over()
    }

    /// Too much waits here: by count, or by payload bytes; or too many
    /// dead-letter sends are under way.
    fn over(&self) -> bool {
        self.held() >= high_mark(self.limits.max_in_flight)
            || self.ready.bytes >= self.limits.max_buffered_bytes / 2
            || self.ordering.queued >= MAX_AGGREGATE_QUEUED
            || self.waiting_entries() >= MAX_WAITING
            || self.flow.dead_letters >= MAX_DEAD_LETTERS
            || self.flow.dead_letter_bytes >= self.limits.max_buffered_bytes / 8
    }

    /// Entries waiting for time to pass, with no payload: retries due
    /// later and rate-limited events waiting for a permit.
    pub fn waiting_entries(&self) -> usize {
        self.waits.entries()
    }

    /// A dead-letter send of `bytes` began; its message is finished by
    /// [`Self::dead_letter_ended`].
    pub fn dead_letter_began(&mut self, bytes: usize) {
        self.flow.dead_letters += 1;
        self.flow.dead_letter_bytes += bytes;
    }

    /// A dead-letter send was delivered or given up.
    pub fn dead_letter_ended(&mut self, pos: &Pos, bytes: usize, now: Instant) {
        self.flow.dead_letters = self.flow.dead_letters.saturating_sub(1);
        self.flow.dead_letter_bytes = self.flow.dead_letter_bytes.saturating_sub(bytes);
        self.flow.progress_at = now;
        self.finish(pos);
    }

    /// Dead-letter sends under way.
    pub fn dead_letters(&self) -> usize {
        self.flow.dead_letters
    }

    /// Bounds what waits here: holding starts a clock; the partitions are
    /// paused when the hold lasts [`PAUSE_AFTER`] with no work ending, or
    /// [`HOLD_MAX`] in all; once paused, fetching resumes when at most
    /// `max_in_flight` triggers wait. A busy backlog bobs at the high mark
    /// with work ending all the time, so it is not paused.
    pub fn flow(&mut self, now: Instant) -> Option<Flow> {
        let may_resume = self.held() <= self.limits.max_in_flight
            && self.waiting_entries() <= MAX_WAITING / 4 * 3
            && self.ready.bytes <= self.limits.max_buffered_bytes / 4;
        self.flow.decide(self.over(), may_resume, now)
    }

    /// The pause or resume could not be made: try again later.
    pub fn flow_failed(&mut self, flow: Flow, now: Instant) {
        self.flow.failed(flow, now);
    }

    pub fn paused(&self) -> bool {
        self.flow.paused
    }

    /// When the driver must call back without any other event: a re-read
    /// falls due, or a hold reaches its pause deadline.
    pub fn next_wakeup(&self) -> Option<Instant> {
        [
            self.reads.next_recheck(),
            self.waits.next_at(),
            self.flow.pause_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Drops everything not running (shutdown).
    pub fn clear_waiting(&mut self) {
        self.ready = Ready::default();
        self.waits = Waits::default();
        self.reads.clear_waiting();
        self.deferred.clear();
        self.ordering.clear_waiting();
        self.work.retain(|_, w| matches!(w, Work::Running { .. }));
    }

    /// What event `id` waits for here, if this scheduler has it (`events
    /// why`): the one piece of work it has, or its place in a line.
    pub fn explain(&self, id: i64, now: Instant) -> Option<Here> {
        let after = |at: Instant| at.saturating_duration_since(now);
        if let Some(work) = self.work.get(&id) {
            return Some(match *work {
                Work::Reading => Here::Reading,
                Work::Recheck => Here::Recheck {
                    in_: self.reads.rechecks.get(&id).map(|(at, _)| after(*at)),
                },
                Work::Ready | Work::Throttled => {
                    // Read ahead at a rate line's head (Ready) or waiting
                    // in it (Throttled).
                    let line = self.waits.lines.iter().find_map(|l| {
                        l.rows
                            .iter()
                            .map(|r| r.0.id)
                            .chain(l.ids.iter().map(|w| w.id))
                            .position(|i| i == id)
                            .map(|ahead| (l, ahead))
                    });
                    match line {
                        Some((l, ahead)) => Here::Throttled {
                            dispatcher: l.dispatcher.clone(),
                            ahead,
                            next_permit_in: l.next_at.map(after),
                        },
                        None => Here::Ready {
                            running: self.jobs.running,
                            max_jobs: max_jobs(self.limits.max_in_flight),
                        },
                    }
                }
                Work::Running { since, .. } => Here::Running {
                    for_: now.saturating_duration_since(since),
                },
                Work::Due => Here::Due {
                    in_: self.waits.due.at(id).map(after),
                },
            });
        }
        if self.deferred.contains_key(&id) {
            return Some(Here::Deferred);
        }
        self.ordering.lines.values().find_map(|line| {
            line.queue
                .iter()
                .position(|(i, _, _)| *i == id)
                .map(|ahead| Here::InLine {
                    active: line.active,
                    ahead,
                })
        })
    }

    /// Ids with work here (for tests and logs).
    pub fn busy_ids(&self) -> HashSet<i64> {
        self.work.keys().copied().collect()
    }
}

/// Takes the items `gone` says of out of `q`, keeping the others in order.
fn take_where<T>(q: &mut VecDeque<T>, gone: impl Fn(&T) -> bool) -> impl Iterator<Item = T> {
    let mut out = Vec::new();
    let mut keep = VecDeque::with_capacity(q.len());
    for t in q.drain(..) {
        if gone(&t) {
            out.push(t);
        } else {
            keep.push_back(t);
        }
    }
    *q = keep;
    out.into_iter()
}

/// A payload's size as held in memory: its text (kept as read, never
/// parsed) and the string's header.
pub fn payload_bytes(p: &entity::Payload) -> usize {
    p.len() + 24
}

fn backoff(first: Duration, max: Duration, tries: u32) -> Duration {
    first
        .saturating_mul(1u32 << tries.saturating_sub(1).min(16))
        .min(max)
}

/// How many jobs may exist at once: `max_in_flight` holding a slot and
/// as many waiting for one (a slot freed is taken without waiting for a
/// turn of the consumer loop). A job is one attempt: nothing that waits
/// for time to pass is a job.
pub fn max_jobs(max_in_flight: usize) -> usize {
    2 * max_in_flight
}

/// How many triggers may wait here before fetching holds.
pub fn high_mark(max_in_flight: usize) -> usize {
    (max_in_flight * 2).max(MAX_READ)
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
