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
use std::sync::Arc;
use std::time::Duration;

use chrono::NaiveDateTime;
use entity::{OutboxEventRow, Status};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::offsets::PartitionOffsets;
use crate::cdc::Trigger;
use crate::metrics::Metrics;
use crate::store::RowRead;
use lines::Line;
pub use lines::{MAX_AGGREGATE_QUEUED, RELEASED};
use waits::{DueEntries, RateLine};
pub use waits::{LINE_ROWS, MAX_WAITING};

mod lines;
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
    },
    /// Waiting for a due time (a retry), id only.
    Due,
    /// Waiting in a rate line for a permit, id only.
    Throttled,
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
    pub const REASONS: [&'static str; 2] = ["job_running", "row_missing"];

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

struct Partition {
    generation: u64,
    offsets: PartitionOffsets,
}

pub struct Scheduler {
    limits: Limits,
    metrics: Metrics,
    partitions: HashMap<i32, Partition>,
    next_generation: u64,
    next_serial: u64,
    next_ticket: u64,
    work: HashMap<i64, Work>,
    /// Triggers for busy ids, decided again when the id is free.
    deferred: HashMap<i64, Vec<(Pos, Expect)>>,
    to_read: VecDeque<Wanted>,
    reads: HashMap<u64, Vec<Wanted>>,
    /// Re-reads due, by id.
    rechecks: HashMap<i64, (Instant, Wanted)>,
    /// Ids whose delete arrived while their row was being read: a missing
    /// row is then final, not read again.
    deleted_while_reading: HashSet<i64>,
    ready: VecDeque<(OutboxEventRow, Pos, usize)>,
    ready_bytes: usize,
    /// Rows to read again at a due time (retries).
    due: DueEntries,
    /// Rate-limited dispatchers' events waiting for a permit.
    rate_lines: Vec<RateLine>,
    /// Ids being read again for a rate line (its index).
    refill_of: HashMap<i64, usize>,
    /// Ids decided ready on their insert ([`Expect::created`]), until
    /// their job starts (a retry's entry keeps it).
    created: HashSet<i64>,
    /// A pending row with attempts waits `retry_delay` from its
    /// `updated_at` before its next attempt.
    retry_delay: Duration,
    running: usize,
    running_bytes: usize,
    /// Mean payload bytes of the rows read lately (sizes the reads).
    row_bytes: usize,
    /// Whether `row_bytes` comes from rows read (else reads are small).
    sizes_seen: bool,
    paused: bool,
    /// Since when the loop has been holding back.
    holding_since: Option<Instant>,
    /// When work last ended (what waits here can move).
    progress_at: Instant,
    /// Dead-letter sends under way, and their records' bytes.
    dead_letters: usize,
    dead_letter_bytes: usize,
    /// Each aggregate with work here (`[ordering]`): the one id it has
    /// work for, and the triggers of its later events, in arrival order.
    aggregates: HashMap<Arc<str>, Line>,
    /// The aggregate of each id that is its aggregate's active one.
    aggregate_of: HashMap<i64, Arc<str>>,
    /// Triggers waiting in the lines.
    aggregate_queued: usize,
    /// Ids whose aggregate's next pending event must be announced again
    /// (the driver's to carry out).
    announce: Vec<i64>,
    /// The message position of each id in `announce`: its aggregate's
    /// partition, for a release read here ([`Self::release_pos`]).
    announce_pos: HashMap<i64, Pos>,
    /// Ids after which, once they are sent (or fail under `on_failed =
    /// "skip"`), the aggregate's next pending event must be announced
    /// again: an event was parked behind them here, or they were decided
    /// on an event other than their insert on their aggregate's partition
    /// (see [`Expect::created`]), so one may have been parked elsewhere.
    announce_after: HashSet<i64>,
}

impl Scheduler {
    pub fn new(limits: Limits, metrics: Metrics, now: Instant) -> Self {
        Scheduler {
            limits,
            metrics,
            partitions: HashMap::new(),
            next_generation: 1,
            next_serial: 1,
            next_ticket: 1,
            work: HashMap::new(),
            deferred: HashMap::new(),
            to_read: VecDeque::new(),
            reads: HashMap::new(),
            rechecks: HashMap::new(),
            deleted_while_reading: HashSet::new(),
            ready: VecDeque::new(),
            ready_bytes: 0,
            due: DueEntries::default(),
            rate_lines: Vec::new(),
            refill_of: HashMap::new(),
            created: HashSet::new(),
            retry_delay: Duration::ZERO,
            running: 0,
            running_bytes: 0,
            row_bytes: 1024,
            sizes_seen: false,
            paused: false,
            holding_since: None,
            progress_at: now,
            dead_letters: 0,
            dead_letter_bytes: 0,
            aggregates: HashMap::new(),
            aggregate_of: HashMap::new(),
            aggregate_queued: 0,
            announce: Vec::new(),
            announce_pos: HashMap::new(),
            announce_after: HashSet::new(),
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
        for &p in parts {
            if self.partitions.contains_key(&p) {
                continue;
            }
            let generation = self.next_generation;
            self.next_generation += 1;
            self.partitions.insert(
                p,
                Partition {
                    generation,
                    offsets: PartitionOffsets::default(),
                },
            );
        }
        if self.paused {
            self.paused = false;
            self.holding_since = None;
            return Some(Flow::Resume);
        }
        None
    }

    /// Partitions revoked: everything of theirs not yet running is dropped
    /// (the next owner reads those messages again); running jobs are the
    /// driver's to cancel, and end here through [`Self::job_ended`].
    pub fn revoke(&mut self, parts: &[i32]) {
        for &p in parts {
            if let Some(state) = self.partitions.remove(&p) {
                info!(
                    partition = p,
                    unfinished = state.offsets.unfinished(),
                    "partition revoked"
                );
            }
        }
        let gone = |pos: &Pos| parts.contains(&pos.partition);
        let mut freed = Vec::new();
        let mut ready_bytes = self.ready_bytes;
        self.ready.retain(|(row, pos, bytes)| {
            let keep = !gone(pos);
            if !keep {
                freed.push(row.id);
                ready_bytes -= bytes;
            }
            keep
        });
        self.ready_bytes = ready_bytes;
        self.to_read.retain(|w| {
            let keep = !gone(&w.pos);
            if !keep {
                freed.push(w.id);
            }
            keep
        });
        self.rechecks.retain(|id, (_, w)| {
            let keep = !gone(&w.pos);
            if !keep {
                freed.push(*id);
            }
            keep
        });
        freed.extend(self.due.drop_where(gone));
        for line in &mut self.rate_lines {
            line.ids.retain(|w| {
                let keep = !gone(&w.pos);
                if !keep {
                    freed.push(w.id);
                }
                keep
            });
            line.rows.retain(|(row, pos, bytes)| {
                let keep = !gone(pos);
                if !keep {
                    freed.push(row.id);
                    ready_bytes -= bytes;
                }
                keep
            });
        }
        self.ready_bytes = ready_bytes;
        for id in &freed {
            self.work.remove(id);
            self.refilled(*id);
        }
        self.deferred.retain(|_, list| {
            list.retain(|(pos, _)| !gone(pos));
            !list.is_empty()
        });
        let mut dropped = 0;
        for line in self.aggregates.values_mut() {
            let before = line.queue.len();
            line.queue.retain(|(_, pos, _)| !gone(pos));
            dropped += before - line.queue.len();
        }
        self.aggregate_queued -= dropped;
        for id in freed {
            self.next_of_aggregate(id);
        }
    }

    /// Stamps a message collected from `partition` with its assignment's
    /// generation and begins its work; `None` when the partition is not
    /// (or no longer) ours: the next owner reads it again.
    pub fn begin(&mut self, partition: i32, offset: i64) -> Option<Pos> {
        let state = self.partitions.get_mut(&partition)?;
        state.offsets.begin(offset);
        Some(Pos {
            partition,
            generation: state.generation,
            offset,
        })
    }

    /// The message's work is done (skipped, invalid, decided).
    pub fn finish(&mut self, pos: &Pos) {
        if let Some(state) = self.partitions.get_mut(&pos.partition) {
            if state.generation == pos.generation {
                state.offsets.finish(pos.offset);
            }
        }
    }

    fn current(&self, pos: &Pos) -> bool {
        self.partitions
            .get(&pos.partition)
            .is_some_and(|s| s.generation == pos.generation)
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
                self.to_read.push_back(Wanted::new(id, pos, expect));
            }
            Some(Work::Recheck) => {
                // The newer event replaces the one waiting (at its next read).
                if let Some((_, w)) = self.rechecks.get_mut(&id) {
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
            self.deleted_while_reading.insert(id);
        }
        // A retry waiting for a row that is gone: nothing left to send.
        if let Some(w) = self.due.remove(id) {
            self.metrics
                .cdc_skips_total
                .with_label_values(&[ScheduleSkip::RowMissing.reason()])
                .inc();
            info!(id, "row deleted while waiting for its next attempt");
            self.finish(&w.pos);
            self.free(id);
        }
        if let Some((_, w)) = self.rechecks.remove(&id) {
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
        let due: Vec<i64> = self
            .rechecks
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            if let Some((_, w)) = self.rechecks.remove(&id) {
                self.work.insert(id, Work::Reading);
                self.to_read.push_front(w);
            }
        }
        for w in self.due.take_due(now) {
            self.work.insert(w.id, Work::Reading);
            self.to_read.push_back(w);
        }
        for (i, line) in self.rate_lines.iter_mut().enumerate() {
            for _ in 0..line.to_refill() {
                let Some(w) = line.ids.pop_front() else { break };
                line.refilling += 1;
                self.refill_of.insert(w.id, i);
                self.work.insert(w.id, Work::Reading);
                self.to_read.push_back(w);
            }
        }
        let mut out = Vec::new();
        let mut per_read =
            (self.limits.max_buffered_bytes / 8 / self.row_bytes.max(1)).clamp(1, MAX_READ);
        if !self.sizes_seen {
            per_read = per_read.min(FIRST_READ);
        }
        while self.reads.len() < MAX_CONCURRENT_READS && !self.to_read.is_empty() {
            let n = self.to_read.len().min(per_read);
            let batch: Vec<Wanted> = self.to_read.drain(..n).collect();
            let ticket = self.next_ticket;
            self.next_ticket += 1;
            out.push(Read {
                ticket,
                ids: batch.iter().map(|w| w.id).collect(),
            });
            self.reads.insert(ticket, batch);
        }
        out
    }

    /// The answer to read `ticket`: the rows found (or `Err` with why the
    /// read failed: it is made again after a back-off).
    pub fn rows_read(&mut self, ticket: u64, result: Result<Vec<RowRead>, String>, now: Instant) {
        let Some(batch) = self.reads.remove(&ticket) else {
            return;
        };
        self.progress_at = now;
        let mut rows = match result {
            Ok(rows) if !rows.is_empty() => {
                let total: usize = rows.iter().map(read_bytes).sum();
                // A moving mean: one read of large rows shrinks the next reads.
                let mean = total / rows.len();
                self.row_bytes = if self.sizes_seen {
                    (self.row_bytes + mean).div_ceil(2).max(mean / 2).max(64)
                } else {
                    mean.max(64)
                };
                self.sizes_seen = true;
                rows.into_iter()
                    .map(|r| (r.id(), r))
                    .collect::<HashMap<i64, RowRead>>()
            }
            Ok(rows) => rows
                .into_iter()
                .map(|r| (r.id(), r))
                .collect::<HashMap<i64, RowRead>>(),
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
        self.refilled(w.id);
        let gone = self.deleted_while_reading.remove(&w.id);
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
                self.due.insert(now + wait, w);
                return;
            }
            Some(RowRead::Row(row)) if row.status == Status::Pending => {
                if !w.expect.created && row.sequence.as_ref().is_some_and(|s| s.aggregate.is_some())
                {
                    self.announce_after_ends(row.id);
                }
                let bytes = payload_bytes(&row.payload);
                if w.expect.created {
                    self.created.insert(w.id);
                }
                self.work.insert(w.id, Work::Ready);
                self.ready_bytes += bytes;
                self.ready.push_back((row, w.pos, bytes));
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

    /// An id read again for a rate line is back (or gone).
    fn refilled(&mut self, id: i64) {
        if let Some(i) = self.refill_of.remove(&id) {
            let line = &mut self.rate_lines[i];
            line.refilling = line.refilling.saturating_sub(1);
        }
    }

    fn recheck(&mut self, w: Wanted, due: Instant) {
        self.work.insert(w.id, Work::Recheck);
        self.rechecks.insert(w.id, (due, w));
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
        self.refilled(id);
        self.created.remove(&id);
        self.deleted_while_reading.remove(&id);
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
        let limit = max_jobs(self.limits.max_in_flight);
        while let Some((row, _, _)) = self.ready.front() {
            if let Some(dispatcher) = gate.limited(&row.event_name) {
                let event_name = row.event_name.clone();
                let i = self.rate_line(dispatcher, &event_name, now);
                if let Some((row, pos, bytes)) = self.ready.pop_front() {
                    self.line_up(i, row, pos, bytes);
                }
                continue;
            }
            if !self.may_start(limit, self.ready.front().map_or(0, |r| r.2)) {
                break;
            }
            if let Some((row, pos, bytes)) = self.ready.pop_front() {
                self.ready_bytes -= bytes;
                self.start(row, pos, bytes, &mut out);
            }
        }
        for i in 0..self.rate_lines.len() {
            self.count_throttled(i, now);
            while self.may_start(limit, self.rate_lines[i].rows.front().map_or(0, |r| r.2)) {
                let line = &mut self.rate_lines[i];
                if line.rows.is_empty() || line.next_at.is_some_and(|at| at > now) {
                    break;
                }
                match gate.permit(&line.event_name) {
                    Ok(()) => {
                        line.next_at = None;
                        if let Some((row, pos, bytes)) = line.rows.pop_front() {
                            self.ready_bytes -= bytes;
                            self.start(row, pos, bytes, &mut out);
                        }
                    }
                    Err(wait) => line.next_at = Some(now + wait),
                }
            }
        }
        self.metrics.jobs_running.set(self.running as i64);
        self.metrics
            .scheduler_waiting
            .with_label_values(&["retry"])
            .set(self.due.len() as i64);
        self.metrics
            .scheduler_waiting
            .with_label_values(&["rate"])
            .set(self.rate_lines.iter().map(RateLine::waiting).sum::<usize>() as i64);
        out
    }

    /// Whether one more job may start: under the job limit, and within the
    /// jobs' half of the memory bound (one job always runs, however large
    /// its payload).
    fn may_start(&self, limit: usize, next: usize) -> bool {
        self.running < limit
            && (self.running == 0
                || self.running_bytes + next <= self.limits.max_buffered_bytes / 2)
    }

    fn start(&mut self, row: OutboxEventRow, pos: Pos, bytes: usize, out: &mut Vec<Start>) {
        if !self.current(&pos) {
            self.free(row.id);
            return;
        }
        let created = self.created.remove(&row.id);
        let serial = self.next_serial;
        self.next_serial += 1;
        self.running += 1;
        self.running_bytes += bytes;
        self.work.insert(
            row.id,
            Work::Running {
                serial,
                bytes,
                created,
            },
        );
        out.push(Start { row, pos, serial });
    }

    /// The line of a rate-limited dispatcher (made on its first event).
    fn rate_line(&mut self, dispatcher: &str, event_name: &str, now: Instant) -> usize {
        match self
            .rate_lines
            .iter()
            .position(|l| l.dispatcher == dispatcher)
        {
            Some(i) => i,
            None => {
                self.rate_lines
                    .push(RateLine::new(dispatcher, event_name, now));
                self.rate_lines.len() - 1
            }
        }
    }

    /// A ready row of a rate-limited dispatcher joins its line: read ahead
    /// while the line's head has room, else as its id only (read again
    /// when its turn nears).
    fn line_up(&mut self, i: usize, row: OutboxEventRow, pos: Pos, bytes: usize) {
        let line = &mut self.rate_lines[i];
        if line.rows.len() < LINE_ROWS {
            line.rows.push_back((row, pos, bytes));
            return;
        }
        self.ready_bytes -= bytes;
        let created = self.created.remove(&row.id);
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
        let line = &mut self.rate_lines[i];
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
        self.progress_at = now;
        self.running = self.running.saturating_sub(1);
        let Some(&Work::Running {
            serial: s,
            bytes,
            created,
        }) = self.work.get(&id)
        else {
            return;
        };
        if s != serial {
            return;
        }
        self.running_bytes -= bytes;
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
        self.due.insert(now + wait, Wanted::new(id, *pos, expect));
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
        self.progress_at = now;
        self.running = self.running.saturating_sub(1);
        if finished {
            self.finish(pos);
        }
        if let Some(&Work::Running {
            serial: s, bytes, ..
        }) = self.work.get(&id)
        {
            if s == serial {
                self.running_bytes -= bytes;
                if self.announce_after.remove(&id) && unblocks {
                    self.announce.push(id);
                    self.announce_pos.insert(id, *pos);
                }
                self.free(id);
            }
        }
    }

    // ---- offsets ----

    /// Offsets that moved since the last call (to store).
    pub fn take_commits(&mut self) -> Vec<(i32, i64)> {
        self.partitions
            .iter_mut()
            .filter_map(|(p, s)| s.offsets.take_committable().map(|o| (*p, o)))
            .collect()
    }

    /// Every partition's committable offset (the final commit).
    pub fn commits(&self) -> Vec<(i32, i64)> {
        self.partitions
            .iter()
            .filter_map(|(p, s)| s.offsets.committable().map(|o| (*p, o)))
            .collect()
    }

    pub fn partitions(&self) -> Vec<i32> {
        self.partitions.keys().copied().collect()
    }

    // ---- flow control ----

    /// Triggers decided or being decided, not yet running.
    pub fn held(&self) -> usize {
        self.ready.len()
            + self.rate_lines.iter().map(|l| l.rows.len()).sum::<usize>()
            + self.to_read.len()
            + self.rechecks.len()
            + self.reads.values().map(Vec::len).sum::<usize>()
    }

    pub fn running(&self) -> usize {
        self.running
    }

    /// Not taking messages: too much waits here, and the partitions are not
    /// paused yet (once paused, polling is safe again and serves rebalance
    /// callbacks).
    pub fn holding(&self) -> bool {
        !self.paused && self.over()
    }

    /// Too much waits here: by count, or by payload bytes; or too many
    /// dead-letter sends are under way.
    fn over(&self) -> bool {
        self.held() >= high_mark(self.limits.max_in_flight)
            || self.ready_bytes >= self.limits.max_buffered_bytes / 2
            || self.aggregate_queued >= MAX_AGGREGATE_QUEUED
            || self.waiting_entries() >= MAX_WAITING
            || self.dead_letters >= MAX_DEAD_LETTERS
            || self.dead_letter_bytes >= self.limits.max_buffered_bytes / 8
    }

    /// Entries waiting for time to pass, with no payload: retries due
    /// later and rate-limited events waiting for a permit.
    pub fn waiting_entries(&self) -> usize {
        self.due.len() + self.rate_lines.iter().map(|l| l.ids.len()).sum::<usize>()
    }

    /// A dead-letter send of `bytes` began; its message is finished by
    /// [`Self::dead_letter_ended`].
    pub fn dead_letter_began(&mut self, bytes: usize) {
        self.dead_letters += 1;
        self.dead_letter_bytes += bytes;
    }

    /// A dead-letter send was delivered or given up.
    pub fn dead_letter_ended(&mut self, pos: &Pos, bytes: usize, now: Instant) {
        self.dead_letters = self.dead_letters.saturating_sub(1);
        self.dead_letter_bytes = self.dead_letter_bytes.saturating_sub(bytes);
        self.progress_at = now;
        self.finish(pos);
    }

    /// Dead-letter sends under way.
    pub fn dead_letters(&self) -> usize {
        self.dead_letters
    }

    /// Bounds what waits here: holding starts a clock; the partitions are
    /// paused when the hold lasts [`PAUSE_AFTER`] with no work ending, or
    /// [`HOLD_MAX`] in all; once paused, fetching resumes when at most
    /// `max_in_flight` triggers wait. A busy backlog bobs at the high mark
    /// with work ending all the time, so it is not paused.
    pub fn flow(&mut self, now: Instant) -> Option<Flow> {
        let held = self.held();
        if self.over() {
            let since = *self.holding_since.get_or_insert(now);
            if !self.paused && now >= pause_deadline(since, self.progress_at) {
                self.paused = true;
                return Some(Flow::Pause);
            }
        } else {
            self.holding_since = None;
            if self.paused
                && held <= self.limits.max_in_flight
                && self.waiting_entries() <= MAX_WAITING / 4 * 3
                && self.ready_bytes <= self.limits.max_buffered_bytes / 4
            {
                self.paused = false;
                return Some(Flow::Resume);
            }
        }
        None
    }

    /// The pause or resume could not be made: try again later.
    pub fn flow_failed(&mut self, flow: Flow, now: Instant) {
        match flow {
            Flow::Pause => {
                self.paused = false;
                self.holding_since = Some(now);
            }
            Flow::Resume => self.paused = true,
        }
    }

    pub fn paused(&self) -> bool {
        self.paused
    }

    /// When the driver must call back without any other event: a re-read
    /// falls due, or a hold reaches its pause deadline.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let recheck = self
            .rechecks
            .values()
            .map(|(at, _)| *at)
            .chain(self.due.next())
            .chain(
                self.rate_lines
                    .iter()
                    .filter(|l| !l.rows.is_empty())
                    .filter_map(|l| l.next_at),
            )
            .min();
        let pause = self
            .holding_since
            .filter(|_| !self.paused)
            .map(|since| pause_deadline(since, self.progress_at));
        match (recheck, pause) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Drops everything not running (shutdown).
    pub fn clear_waiting(&mut self) {
        self.ready.clear();
        self.ready_bytes = 0;
        self.due.clear();
        self.rate_lines.clear();
        self.refill_of.clear();
        self.created.clear();
        self.to_read.clear();
        self.rechecks.clear();
        self.deleted_while_reading.clear();
        self.deferred.clear();
        self.aggregates.clear();
        self.aggregate_of.clear();
        self.aggregate_queued = 0;
        self.work.retain(|_, w| matches!(w, Work::Running { .. }));
    }

    /// Ids with work here (for tests and logs).
    pub fn busy_ids(&self) -> HashSet<i64> {
        self.work.keys().copied().collect()
    }
}

/// A payload's size as held in memory: its text (kept as read, never
/// parsed) and the string's header.
pub fn payload_bytes(p: &entity::Payload) -> usize {
    p.len() + 24
}

fn read_bytes(r: &RowRead) -> usize {
    match r {
        RowRead::Row(row) => payload_bytes(&row.payload),
        RowRead::Undecodable { .. } => 64,
    }
}

fn pause_deadline(since: Instant, progress_at: Instant) -> Instant {
    (since.max(progress_at) + PAUSE_AFTER).min(since + HOLD_MAX)
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
