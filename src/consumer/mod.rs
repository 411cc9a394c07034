//! The Kafka side: a consumer group on the CDC topic that turns change
//! events into jobs and commits only what is finished (CONTRACT §4, §5).
//!
//! This module is the driver: a thin loop around librdkafka that decodes
//! messages ([`crate::cdc`]), hands them to the [`schedule::Scheduler`] —
//! which decides, with no I/O, what to read, which jobs to start, what may
//! be committed and when to pause — and carries out its answers: row reads
//! (off the loop, each within a deadline), jobs ([`crate::job`], under
//! their partition's lease), dead-letter sends (off the loop), offset
//! stores, pause and resume. Nothing the loop does waits on the database,
//! a receiver or the broker, so one row, one write or one slow call cannot
//! stall it; an idle loop still beats, so liveness tells idle from wedged.
//!
//! - a job sends and writes only while it holds one of `max_in_flight`
//!   slots (see [`crate::job`]); the scheduler bounds how many jobs exist
//!   and how many triggers wait;
//! - offsets are stored as they advance (auto-commit sends them) and
//!   committed synchronously at shutdown;
//! - a revoke cancels the partitions' jobs and waits, up to the drain
//!   timeout, for the POSTs already under way to write their status before
//!   the partitions are given up, so the next owner does not send them
//!   again ([`group`]): in librdkafka's rebalance callback under the eager
//!   protocol, off the loop under the cooperative one
//!   (`partition.assignment.strategy = "cooperative-sticky"`), whose
//!   callback returns at once so the loop keeps serving the partitions it
//!   keeps ([`client`]).

pub mod client;
pub mod group;
pub mod offsets;
pub mod schedule;

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;
use rdkafka::Message;
use tokio::sync::mpsc;
use tokio::time::Instant as TokioInstant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::cdc::{Decision, Decoder, KeyAggregate, Record, Skip};
use crate::config::{DispatchSettings, KafkaSettings};
use crate::job::{self, JobContext, JobEnd};
use crate::metrics::Metrics;
use crate::store::{RowRead, Store};
pub use client::{client_config, ConsumerError};
use client::{dead_letter, error_kind, GroupEvent, Kafka};
use group::{Group, Held, Revocation};
pub use schedule::Here;
use schedule::{Flow, Limits, Pos, Read, Scheduler, Start, RELEASE_BATCH};

/// How often an idle consumer loop turns (liveness).
const BEAT: Duration = Duration::from_secs(1);

/// What readiness needs from the consumer.
#[derive(Debug, Default)]
pub struct ConsumerHealth {
    /// The group was joined at least once and the member holds its
    /// assignment (possibly empty: a member with no partition is healthy).
    pub joined: AtomicBool,
    /// Set when shutdown begins: no longer ready, still alive.
    pub draining: AtomicBool,
    /// The member holds the topic's partition 0: it reads the table
    /// gauges for the group (one replica, not every one, counts the
    /// pending and failed rows).
    pub table_reporter: AtomicBool,
    /// When the consumer loop last turned (`None`: not started yet).
    last_beat: Mutex<Option<Instant>>,
}

impl ConsumerHealth {
    /// The loop turned: it polled, decided, or its idle timer fired.
    pub fn beat(&self) {
        *self.last_beat.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// How long since the loop last turned; zero before it started.
    pub fn stalled_for(&self) -> Duration {
        self.last_beat
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map_or(Duration::ZERO, |t| t.elapsed())
    }
}

/// How many already-fetched messages one loop turn collects.
const MAX_BATCH: usize = schedule::MAX_READ;

/// How long one batched row read may take before it is given up and made
/// again (a database that stops answering mid-query).
const READ_DEADLINE: Duration = Duration::from_secs(10);

struct JobDone {
    id: i64,
    serial: u64,
    pos: Pos,
    end: JobEnd,
}

type ReadDone = (u64, Result<Vec<RowRead>, String>);

pub struct Pipeline {
    consumer: Kafka,
    events: mpsc::UnboundedReceiver<GroupEvent>,
    topic: String,
    decoder: Decoder,
    ctx: Arc<JobContext>,
    store: Store,
    metrics: Metrics,
    limits: Limits,
    dead_letter: Option<(FutureProducer, String)>,
    health: Arc<ConsumerHealth>,
    drain_timeout: Duration,
    /// The partitions, their leases, and what giving them up waits for;
    /// shared with the rebalance callback.
    group: Arc<Group>,
    /// Cooperative hand-offs whose wait ended: the partitions to give up.
    hand_offs: mpsc::UnboundedSender<Held>,
    hand_offs_rx: mpsc::UnboundedReceiver<Held>,
    /// The topic's partitions, from the last assign's metadata (0: unknown).
    topic_partitions: AtomicUsize,
    /// When an unkeyed change event was last logged (`[ordering]`).
    unkeyed_logged: Mutex<Option<Instant>>,
    /// `[ordering] on_failed = "hold"`: a failed event does not let its
    /// aggregate's later events go.
    hold_on_failed: bool,
    /// Questions to the scheduler (`events why`), answered by the loop.
    asks: mpsc::Sender<Ask>,
    asks_rx: mpsc::Receiver<Ask>,
}

/// What this replica's scheduler says of an event.
#[derive(Debug, Clone)]
pub struct Answer {
    /// What the event waits for here; `None`: nothing here has it.
    pub here: Option<Here>,
    /// The partitions this replica holds.
    pub partitions: Vec<i32>,
}

type Ask = (i64, tokio::sync::oneshot::Sender<Answer>);

/// Asks the running pipeline's scheduler about an event (`events why`).
#[derive(Clone)]
pub struct Asker(mpsc::Sender<Ask>);

impl Asker {
    /// The scheduler's answer, or `None` when the loop does not answer
    /// within 2 s (stopped, or wedged: the health checks say which).
    pub async fn ask(&self, id: i64) -> Option<Answer> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.0.try_send((id, tx)).ok()?;
        tokio::time::timeout(Duration::from_secs(2), rx)
            .await
            .ok()?
            .ok()
    }
}

impl Drop for Pipeline {
    /// Runs before the consumer is closed (also when the pipeline's task
    /// is dropped without draining): nothing waits any more, neither the
    /// revoke of the consumer's close nor a wait the drop cut short.
    fn drop(&mut self) {
        self.group.closed();
    }
}

/// The channels through which work done off the loop reports back.
struct Replies {
    done_tx: mpsc::UnboundedSender<JobDone>,
    done_rx: mpsc::UnboundedReceiver<JobDone>,
    read_tx: mpsc::UnboundedSender<ReadDone>,
    read_rx: mpsc::UnboundedReceiver<ReadDone>,
    /// Dead-letter sends delivered (or given up), with their bytes: their
    /// message is finished.
    dlq_tx: mpsc::UnboundedSender<(Pos, usize)>,
    dlq_rx: mpsc::UnboundedReceiver<(Pos, usize)>,
    /// Aggregates' next pending events found by release reads.
    release_tx: mpsc::UnboundedSender<Released>,
    release_rx: mpsc::UnboundedReceiver<Released>,
}

/// A release read's answer: (after, next, position).
type Released = (i64, Vec<i64>, Pos);

impl Replies {
    fn new() -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let (read_tx, read_rx) = mpsc::unbounded_channel();
        let (dlq_tx, dlq_rx) = mpsc::unbounded_channel();
        let (release_tx, release_rx) = mpsc::unbounded_channel();
        Replies {
            release_tx,
            release_rx,
            done_tx,
            done_rx,
            read_tx,
            read_rx,
            dlq_tx,
            dlq_rx,
        }
    }
}

impl Pipeline {
    pub fn new(
        settings: &KafkaSettings,
        table: &str,
        ctx: Arc<JobContext>,
        dispatch: &DispatchSettings,
        drain_timeout: Duration,
        health: Arc<ConsumerHealth>,
    ) -> Result<Self, ConsumerError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let group = Group::new(drain_timeout);
        let consumer = client::subscribe(settings, tx, ctx.metrics.clone(), group.clone())?;
        let (hand_offs, hand_offs_rx) = mpsc::unbounded_channel();
        let dead_letter = client::dead_letter_producer(settings)?;
        let hold_on_failed = ctx.store.ordering().is_some_and(|o| o.hold);
        let (asks, asks_rx) = mpsc::channel(16);
        Ok(Self {
            consumer,
            events: rx,
            topic: settings.topic.clone(),
            decoder: Decoder::new(table),
            store: ctx.store.clone(),
            metrics: ctx.metrics.clone(),
            ctx,
            limits: Limits {
                max_in_flight: dispatch.max_in_flight,
                visibility_timeout: dispatch.row_visibility_timeout,
                max_buffered_bytes: dispatch.max_buffered_bytes,
            },
            dead_letter,
            health,
            drain_timeout,
            group,
            hand_offs,
            hand_offs_rx,
            topic_partitions: AtomicUsize::new(0),
            unkeyed_logged: Mutex::new(None),
            hold_on_failed,
            asks,
            asks_rx,
        })
    }

    /// Asks this pipeline's scheduler, once it runs.
    pub fn asker(&self) -> Asker {
        Asker(self.asks.clone())
    }

    /// Runs until `shutdown` is cancelled, then drains: running POSTs finish
    /// and write their status within the drain timeout, finished offsets are
    /// committed synchronously.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut replies = Replies::new();
        let mut sched = Scheduler::new(self.limits, self.metrics.clone(), TokioInstant::now())
            .with_retry_delay(self.ctx.retry_delay);
        info!(topic = %self.topic, "consuming");
        // A revoke waiting in librdkafka's callback blocks this loop: the
        // shutdown ends its wait through the group (the drain waits instead).
        {
            let group = self.group.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                shutdown.cancelled().await;
                drop(group.close());
            });
        }
        // An idle loop still turns, so liveness tells idle from wedged.
        let mut beat = tokio::time::interval(BEAT);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The group events are read while the stream borrows the consumer.
        let mut events = std::mem::replace(&mut self.events, mpsc::unbounded_channel().1);
        let mut hand_offs = std::mem::replace(&mut self.hand_offs_rx, mpsc::unbounded_channel().1);
        let mut asks = std::mem::replace(&mut self.asks_rx, mpsc::channel(1).1);
        let consumer = &self.consumer;
        let mut stream = consumer.stream();
        loop {
            self.health.beat();
            let now = TokioInstant::now();
            for read in sched.take_reads(now) {
                self.spawn_read(read, replies.read_tx.clone());
            }
            for start in sched.take_starts(now, &self.ctx.registry) {
                self.spawn_job(start, replies.done_tx.clone());
            }
            for after in sched.take_announcements() {
                match sched.release_pos(after) {
                    Some(pos) => self.spawn_release(after, pos, replies.release_tx.clone()),
                    None => self.spawn_announce(after),
                }
            }
            client::store_offsets(&self.consumer, sched.take_commits());
            if let Some(flow) = sched.flow(now) {
                self.apply_flow(&mut sched, flow);
            }
            let wake = sched.next_wakeup();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(ev) = events.recv() => {
                    self.group_event(&mut sched, ev);
                }
                Some(h) = hand_offs.recv() => self.give_up(h),
                Some((id, reply)) = asks.recv() => {
                    let _ = reply.send(Answer {
                        here: sched.explain(id, TokioInstant::now()),
                        partitions: sched.partitions(),
                    });
                }
                Some(done) = replies.done_rx.recv() => {
                    let now = TokioInstant::now();
                    self.job_ended(&mut sched, done, now);
                    while let Ok(done) = replies.done_rx.try_recv() {
                        self.job_ended(&mut sched, done, now);
                    }
                }
                Some((ticket, result)) = replies.read_rx.recv() => {
                    sched.rows_read(ticket, result, TokioInstant::now());
                }
                Some((after, next, pos)) = replies.release_rx.recv() => {
                    if !sched.released(after, &next, pos) {
                        self.spawn_announce(after);
                    }
                }
                Some((pos, bytes)) = replies.dlq_rx.recv() => {
                    sched.dead_letter_ended(&pos, bytes, TokioInstant::now());
                    self.metrics.dead_letters_in_flight.set(sched.dead_letters() as i64);
                }
                _ = tokio::time::sleep_until(wake.unwrap_or_else(TokioInstant::now)), if wake.is_some() => {}
                _ = beat.tick() => {}
                msg = stream.next(), if !sched.holding() => {
                    let Some(first) = msg else { break };
                    self.collect(first, &mut sched, &mut events, &replies.dlq_tx);
                    for _ in 1..MAX_BATCH {
                        match stream.next().now_or_never() {
                            Some(Some(m)) => self.collect(m, &mut sched, &mut events, &replies.dlq_tx),
                            _ => break,
                        }
                    }
                    debug!(running = sched.running(), held = sched.held(), "batch collected");
                }
            }
        }
        drop(stream);
        self.drain(sched, replies.done_rx).await;
    }

    fn job_ended(&self, sched: &mut Scheduler, done: JobDone, now: TokioInstant) {
        if let JobEnd::Retry(retry) = done.end {
            return sched.job_retry(
                done.id,
                done.serial,
                &done.pos,
                retry.wait,
                retry.attempts,
                now,
            );
        }
        let unblocks = match done.end {
            JobEnd::Sent => true,
            JobEnd::Failed => !self.hold_on_failed,
            _ => false,
        };
        let finished = done.end.finishes_message();
        sched.job_ended_in(done.id, done.serial, &done.pos, finished, unblocks, now);
    }

    fn group_event(&self, sched: &mut Scheduler, ev: GroupEvent) {
        match ev {
            GroupEvent::Assign { parts, total } => {
                for p in &parts {
                    info!(partition = p, "partition assigned");
                }
                if let Some(total) = total {
                    self.topic_partitions.store(total, Ordering::Relaxed);
                }
                self.health.joined.store(true, Ordering::Relaxed);
                // The whole assignment starts unpaused (an incremental assign
                // keeps partitions paused earlier); flow control re-pauses
                // them right after if the limit is still reached.
                if let Some(flow) = sched.assign(&parts) {
                    self.apply_flow(sched, flow);
                }
            }
            GroupEvent::Revoke { parts, hand_off } => {
                sched.revoke(&parts);
                self.ctx.holds.partitions_left();
                if let Some(revocation) = hand_off {
                    let tx = self.hand_offs.clone();
                    tokio::spawn(async move {
                        let _ = tx.send(wait_off_loop(revocation).await);
                    });
                }
            }
        }
        self.set_shares(sched);
        self.health
            .table_reporter
            .store(sched.partitions().contains(&0), Ordering::Relaxed);
    }

    /// Each rate-limited dispatcher takes this replica's share of the
    /// partitions it owns ([`crate::dispatch::Registry::take_shares`]).
    fn set_shares(&self, sched: &Scheduler) {
        let known = self.topic_partitions.load(Ordering::Relaxed);
        (self.ctx.registry).take_shares(&sched.partitions(), known, &self.topic, &self.metrics);
    }

    /// Gives cooperatively revoked partitions up once their wait ended.
    fn give_up(&self, held: Held) {
        held.count(&self.metrics);
        self.group.handed_off(&held.parts);
        client::give_up(&self.consumer, &held.parts);
    }

    /// Decodes one polled message and hands it to the scheduler, stamped
    /// with the generation of the assignment it was fetched under: the
    /// group events of the poll that returned it are applied first.
    fn collect(
        &self,
        msg: Result<rdkafka::message::BorrowedMessage<'_>, KafkaError>,
        sched: &mut Scheduler,
        events: &mut mpsc::UnboundedReceiver<GroupEvent>,
        dlq_tx: &mpsc::UnboundedSender<(Pos, usize)>,
    ) {
        while let Ok(ev) = events.try_recv() {
            self.group_event(sched, ev);
        }
        let m = match msg {
            Ok(m) => m,
            Err(e) => {
                let kind = error_kind(&e);
                self.metrics
                    .consumer_errors_total
                    .with_label_values(&[kind])
                    .inc();
                // librdkafka's message error carries its partition and
                // offset, but rust-rdkafka hands over the code alone.
                error!(error = %e, kind, topic = %self.topic, "Kafka consumer error");
                return;
            }
        };
        let Some(pos) = sched.begin(m.partition(), m.offset()) else {
            // Not (or no longer) ours: the next owner reads it again.
            return;
        };
        let record = Record {
            topic: m.topic(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key(),
            value: m.payload(),
        };
        let decision = self.decoder.decode(&record);
        self.metrics.cdc_message(decision.result_label());
        match decision {
            Decision::Trigger(t) => match self.store.ordering() {
                None => sched.trigger(&t, pos),
                Some(o) => match crate::cdc::key_aggregate(m.key(), &o.column) {
                    KeyAggregate::Value(a) => sched.trigger_in(&t, pos, Some(&a)),
                    // The row has no aggregate: not ordered.
                    KeyAggregate::Null => sched.trigger(&t, pos),
                    KeyAggregate::Missing => {
                        self.unkeyed(&o.column, &pos, t.id);
                        sched.trigger(&t, pos);
                    }
                },
            },
            Decision::Skip(skip) => {
                self.metrics.cdc_skip(skip.reason());
                debug!(
                    partition = pos.partition,
                    offset = pos.offset,
                    reason = skip.reason(),
                    "skipped"
                );
                if let Skip::Delete { id: Some(id) } = skip {
                    sched.deleted(id);
                }
                sched.finish(&pos);
            }
            Decision::Invalid(err) => {
                warn!(error = %err, "invalid change event skipped");
                match &self.dead_letter {
                    Some((producer, topic)) => {
                        let raw = (m.key().map(<[u8]>::to_vec), m.payload().map(<[u8]>::to_vec));
                        let bytes = raw.0.as_ref().map_or(0, Vec::len)
                            + raw.1.as_ref().map_or(0, Vec::len)
                            + 256;
                        sched.dead_letter_began(bytes);
                        self.metrics
                            .dead_letters_in_flight
                            .set(sched.dead_letters() as i64);
                        let send = dead_letter(
                            producer.clone(),
                            topic.clone(),
                            self.topic.clone(),
                            pos,
                            raw,
                            err.to_string(),
                        );
                        let tx = dlq_tx.clone();
                        tokio::spawn(async move {
                            send.await;
                            let _ = tx.send((pos, bytes));
                        });
                    }
                    None => sched.finish(&pos),
                }
            }
        }
    }

    /// A change event whose key does not carry the `[ordering]` column:
    /// the connector does not key the topic by the aggregate, so its
    /// events may sit on different partitions and cannot be lined up
    /// here. The event is still decided (each row still waits for the
    /// earlier events of its aggregate in the database, so nothing is sent
    /// out of order), but loudly: counted, and an ERROR at most every 10 s.
    fn unkeyed(&self, column: &str, pos: &Pos, id: i64) {
        self.metrics.ordering_unkeyed_total.inc();
        let mut last = self
            .unkeyed_logged
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(10)) {
            return;
        }
        *last = Some(Instant::now());
        error!(
            id,
            partition = pos.partition,
            offset = pos.offset,
            column,
            "change event key does not carry the [ordering] column: set the connector's \
             message.key.columns to <schema>.<table>:{column} (deploy/debezium/postgres-connector-ordered.json); \
             until then each aggregate's events can land on different partitions \
             (outbox_ordering_unkeyed_total)"
        );
    }

    /// Announces an aggregate's next pending event again (touches it), off
    /// the loop: for the next owner of its partition.
    fn spawn_announce(&self, after: i64) {
        tokio::spawn(announce(self.store.clone(), self.metrics.clone(), after));
    }

    /// Releases an aggregate's next pending event here, with no round trip
    /// through the change feed (a touch, Debezium, the topic, a fetch: tens
    /// of milliseconds an event, more on a broker that does not wake a
    /// waiting fetch): it is read off the loop and decided on `pos`, its
    /// aggregate's partition, still this replica's. A read that fails falls
    /// back to the announcement.
    fn spawn_release(&self, after: i64, pos: Pos, tx: mpsc::UnboundedSender<Released>) {
        let store = self.store.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let read = store.next_pending_after(after, RELEASE_BATCH as u64);
            match tokio::time::timeout(READ_DEADLINE, read).await {
                Ok(Ok(next)) if next.is_empty() => {}
                Ok(Ok(next)) => {
                    let _ = tx.send((after, next, pos));
                }
                Ok(Err(e)) => {
                    warn!(after, error = %e, "cannot read the aggregate's next pending event; announcing it instead");
                    announce(store, metrics, after).await;
                }
                Err(_) => announce(store, metrics, after).await,
            }
        });
    }

    /// Reads rows off the loop, within [`READ_DEADLINE`].
    fn spawn_read(&self, read: Read, tx: mpsc::UnboundedSender<ReadDone>) {
        let store = self.store.clone();
        tokio::spawn(async move {
            let result = match tokio::time::timeout(READ_DEADLINE, store.read_rows(&read.ids)).await
            {
                Ok(Ok(rows)) => Ok(rows),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!(
                    "the database did not answer within {READ_DEADLINE:?}"
                )),
            };
            let _ = tx.send((read.ticket, result));
        });
    }

    /// Starts a job under its partition's lease. A job that panics reports
    /// its end like any other: its id is freed, its message left unfinished.
    fn spawn_job(&self, start: Start, tx: mpsc::UnboundedSender<JobDone>) {
        let Start { row, pos, serial } = start;
        let id = row.id;
        let Some(lease) = self.group.lease(pos.partition) else {
            let _ = tx.send(JobDone {
                id,
                serial,
                pos,
                end: JobEnd::Cancelled,
            });
            return;
        };
        let ctx = self.ctx.clone();
        // One counter, not the whole set (a clone per job).
        let panics = self.metrics.job_panics_total.clone();
        tokio::spawn(async move {
            let end = match AssertUnwindSafe(job::run(ctx, row, lease))
                .catch_unwind()
                .await
            {
                Ok(end) => end,
                Err(_) => {
                    panics.inc();
                    error!(
                        id,
                        partition = pos.partition,
                        offset = pos.offset,
                        "dispatch job panicked; its message is left uncommitted for a replay"
                    );
                    JobEnd::Cancelled
                }
            };
            let _ = tx.send(JobDone {
                id,
                serial,
                pos,
                end,
            });
        });
    }

    fn apply_flow(&self, sched: &mut Scheduler, flow: Flow) {
        let paused = flow == Flow::Pause;
        match client::set_paused(&self.consumer, &sched.partitions(), paused) {
            Ok(()) => {
                self.metrics.consumer_paused.set(i64::from(paused));
                if paused {
                    self.metrics.consumer_pauses_total.inc();
                }
                debug!(paused, running = sched.running(), "flow control");
            }
            Err(e) => {
                warn!(error = %e, ?flow, "pause/resume failed");
                sched.flow_failed(flow, TokioInstant::now());
            }
        }
    }

    async fn drain(self, mut sched: Scheduler, mut done_rx: mpsc::UnboundedReceiver<JobDone>) {
        self.health.draining.store(true, Ordering::Relaxed);
        info!(running = sched.running(), "draining");
        // Every lease cancelled: no job starts a POST from here on.
        let closing = self.group.close();
        sched.clear_waiting();
        let deadline = TokioInstant::now() + self.drain_timeout;
        // The POSTs under way write their status (those of revokes the
        // shutdown ended too), then the jobs' ends say what may be committed.
        let held = wait_off_loop(closing).await;
        while sched.running() > 0 {
            match tokio::time::timeout_at(deadline, done_rx.recv()).await {
                Ok(Some(done)) => self.job_ended(&mut sched, done, TokioInstant::now()),
                Ok(None) => break,
                Err(_) => {
                    warn!(
                        running = sched.running(),
                        "drain timeout: leaving the remaining messages uncommitted"
                    );
                    self.ctx.abort.cancel();
                    break;
                }
            }
        }
        // Events parked behind the ones sent while draining: announced now,
        // not left for the stranded-event sweep.
        for after in sched.take_announcements() {
            let left = deadline.saturating_duration_since(TokioInstant::now());
            match tokio::time::timeout(left, self.store.announce_next(after)).await {
                Ok(Ok(touched)) => {
                    if touched.is_some() {
                        self.metrics.ordering_announced_total.inc();
                    }
                }
                Ok(Err(e)) => {
                    warn!(after, error = %e, "cannot announce the aggregate's next pending event")
                }
                Err(_) => break,
            }
        }
        // Cooperative revokes still waiting end with the drain's wait.
        if !held.parts.is_empty() {
            client::give_up(&self.consumer, &held.parts);
        }
        client::commit(&self.consumer, sched.commits());
        self.consumer.unsubscribe();
        self.health.joined.store(false, Ordering::Relaxed);
        self.health.table_reporter.store(false, Ordering::Relaxed);
    }
}

/// Announces an aggregate's next pending event again (touches it), trying
/// again with a back-off: an event parked behind `after` waits for this (or
/// an operator's `events retrigger`).
async fn announce(store: Store, metrics: Metrics, after: i64) {
    let mut wait = Duration::from_millis(200);
    for attempt in 1..=6 {
        match tokio::time::timeout(READ_DEADLINE, store.announce_next(after)).await {
            Ok(Ok(touched)) => {
                if touched.is_some() {
                    metrics.ordering_announced_total.inc();
                }
                debug!(
                    after,
                    ?touched,
                    "announced the aggregate's next pending event"
                );
                return;
            }
            Ok(Err(e)) => {
                warn!(after, attempt, error = %e, "cannot announce the aggregate's next pending event")
            }
            Err(_) => warn!(
                after,
                attempt, "announcing the aggregate's next pending event took too long"
            ),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(10));
    }
    metrics.ordering_announce_failures_total.inc();
    error!(
        after,
        "gave up announcing the next pending event of event {after}'s aggregate: \
         run outbox-sidecar events retrigger for its pending events"
    );
}

/// The dispatchers' rate limits, as the scheduler asks them.
impl schedule::Gate for crate::dispatch::Registry {
    fn limited(&self, event_name: &str) -> Option<&str> {
        let d = self.get(event_name)?;
        d.throttle().map(|_| d.name())
    }

    fn permit(&self, event_name: &str) -> Result<(), Duration> {
        match self.get(event_name).and_then(|d| d.throttle()) {
            Some(t) => t.try_take(),
            None => Ok(()),
        }
    }
}

/// Runs a revocation's wait on a blocking thread: the loop (a cooperative
/// hand-off) or the drain goes on meanwhile.
async fn wait_off_loop(revocation: Revocation) -> Held {
    if !revocation.waits() {
        return revocation.wait();
    }
    // Only if the runtime is shutting down: nothing is left to give up.
    tokio::task::spawn_blocking(move || revocation.wait())
        .await
        .unwrap_or_default()
}
