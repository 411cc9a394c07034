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
//!   again. Under the eager protocol (every partition is revoked) the wait
//!   happens in librdkafka's rebalance callback; under the cooperative one
//!   (`partition.assignment.strategy = "cooperative-sticky"`, only some
//!   partitions move) the callback returns at once, the loop keeps serving
//!   the work it holds for the partitions it keeps, and it gives the revoked
//!   ones up (`incremental_unassign`) once their POSTs wrote their status:
//!   see [`SidecarContext::rebalance`].

pub mod offsets;
pub mod schedule;

use std::collections::{BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol, StreamConsumer,
};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::statistics::Statistics;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::{ClientConfig, ClientContext, Message, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio::time::Instant as TokioInstant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::cdc::{Decision, Decoder, Record, Skip};
use crate::config::{property_name, DispatchSettings, KafkaSettings};
use crate::job::{self, JobContext, JobEnd, Lease};
use crate::metrics::Metrics;
use crate::store::{RowRead, Store};
use schedule::{Flow, Limits, Pos, Read, Scheduler, Start};

/// How often an idle consumer loop turns (liveness).
const BEAT: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error("cannot create the Kafka consumer: {0}")]
    Create(KafkaError),
    #[error("cannot subscribe to topic {topic:?}: {source}")]
    Subscribe { topic: String, source: KafkaError },
    #[error("cannot create the dead-letter producer: {0}")]
    Producer(KafkaError),
}

/// What readiness needs from the consumer.
#[derive(Debug, Default)]
pub struct ConsumerHealth {
    /// The group was joined at least once and the member holds its
    /// assignment (possibly empty: a member with no partition is healthy).
    pub joined: AtomicBool,
    /// Set when shutdown begins: no longer ready, still alive.
    pub draining: AtomicBool,
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

enum GroupEvent {
    Assign(Vec<i32>),
    /// `hand_off`: the partitions are still librdkafka's to fetch; the loop
    /// gives them up once their POSTs under way wrote their status
    /// (cooperative protocol). Otherwise they are already given up.
    Revoke {
        parts: Vec<i32>,
        hand_off: bool,
    },
}

/// The revoked partitions of a cooperative rebalance, ready to be given up:
/// their POSTs under way wrote their status, or the wait ended.
struct HandOff {
    parts: Vec<i32>,
    /// POSTs under way when the wait began, and still when it ended.
    busy: usize,
    left: usize,
    waited: Duration,
    /// The wait ended because the sidecar is stopping (its drain waits).
    stopped: bool,
}

/// The leases of the assigned partitions, shared with the rebalance callback.
type Leases = Arc<Mutex<HashMap<i32, Arc<Lease>>>>;

struct SidecarContext {
    topic: String,
    events: mpsc::UnboundedSender<GroupEvent>,
    metrics: Metrics,
    leases: Leases,
    /// How long a revoke waits for POSTs under way (the drain timeout).
    hold_limit: Duration,
    /// Set once the pipeline stops: its drain has waited for the jobs, so
    /// the revokes of the consumer's close do not wait again.
    closing: Arc<AtomicBool>,
}

impl SidecarContext {
    fn partitions(&self, tpl: &TopicPartitionList) -> Vec<i32> {
        tpl.elements()
            .iter()
            .filter(|e| e.topic() == self.topic)
            .map(|e| e.partition())
            .collect()
    }

    /// Cancels the jobs of the revoked partitions and blocks the poll that
    /// delivers the revoke until the POSTs they have under way wrote their
    /// status, or `hold_limit` passed. Until then librdkafka does not give
    /// the partitions up, so the next owner reads those rows decided.
    fn finish_running_posts(&self, parts: &[i32], lost: bool) {
        let leases: Vec<Arc<Lease>> = {
            let map = self.leases.lock().unwrap_or_else(|e| e.into_inner());
            parts.iter().filter_map(|p| map.get(p).cloned()).collect()
        };
        // All cancelled first: none starts a POST while another is waited for.
        for lease in &leases {
            lease.cancel();
        }
        let busy: usize = leases.iter().map(|l| l.busy()).sum();
        // A lost assignment (session timed out) is someone else's already:
        // waiting would not keep the next owner from the rows.
        if busy == 0 || lost || self.closing.load(Ordering::Relaxed) {
            return;
        }
        // Waiting blocks this thread; the jobs must run on others.
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if !multi_thread {
            warn!(
                requests = busy,
                "partitions revoked with requests in flight; not waiting for them (single-threaded runtime)"
            );
            return;
        }
        info!(
            partitions = ?parts,
            requests = busy,
            "partitions revoked: waiting for the requests in flight to write their status"
        );
        let started = Instant::now();
        let deadline = started + self.hold_limit;
        // Shutdown ends the wait: the drain then waits for the same POSTs.
        let stop = || self.closing.load(Ordering::Relaxed);
        let left: usize = tokio::task::block_in_place(|| {
            leases
                .iter()
                .map(|l| {
                    l.revoke_and_wait(deadline.saturating_duration_since(Instant::now()), stop)
                })
                .sum()
        });
        count_held(&self.metrics, busy, left, started.elapsed());
    }

    /// Cancels the leases of `parts`: from here on none of their jobs
    /// starts a POST.
    fn cancel(&self, parts: &[i32]) {
        let map = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        for lease in parts.iter().filter_map(|p| map.get(p)) {
            lease.cancel();
        }
    }
}

/// Counts and logs what a revoke's wait for the POSTs under way achieved.
fn count_held(metrics: &Metrics, busy: usize, left: usize, waited: Duration) {
    let held = &metrics.revoke_held_requests_total;
    held.with_label_values(&["written"])
        .inc_by(busy.saturating_sub(left) as u64);
    held.with_label_values(&["given_up"]).inc_by(left as u64);
    if left > 0 {
        warn!(
            requests = left,
            ?waited,
            "revoke: requests still in flight after the drain timeout; the next owner may send them again"
        );
    } else {
        info!(
            ?waited,
            "revoke: requests in flight finished; partitions given up"
        );
    }
}

impl ClientContext for SidecarContext {
    /// librdkafka's log lines, as tracing events. An offset reset after an
    /// error (the committed offset is past the topic's retention, or the
    /// topic was recreated) skips change events for good: it is counted
    /// and logged at ERROR with the range librdkafka names.
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if fac == "OFFSET" && log_message.contains("offset reset") {
            self.metrics
                .consumer_errors_total
                .with_label_values(&["offset_reset"])
                .inc();
            error!(
                detail = log_message,
                "consumer offset reset: the change events skipped are not read; rows they announced \
                 may stay pending (remedy: outbox-sidecar events retrigger --pending-older-than …)"
            );
            return;
        }
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => error!(fac, "librdkafka: {log_message}"),
            RDKafkaLogLevel::Warning => warn!(fac, "librdkafka: {log_message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                info!(fac, "librdkafka: {log_message}")
            }
            RDKafkaLogLevel::Debug => debug!(fac, "librdkafka: {log_message}"),
        }
    }

    fn stats(&self, stats: Statistics) {
        if let Some(topic) = stats.topics.get(&self.topic) {
            for (id, p) in &topic.partitions {
                if *id >= 0 && p.consumer_lag >= 0 {
                    self.metrics
                        .consumer_lag
                        .with_label_values(&[&id.to_string()])
                        .set(p.consumer_lag);
                }
            }
        }
    }
}

impl ConsumerContext for SidecarContext {
    /// Replaces rust-rdkafka's default (which assigns and unassigns inside
    /// the callback, incrementally under the cooperative protocol) for one
    /// case: a cooperative revoke that is not a loss and not the close.
    /// Then the callback only cancels the revoked partitions' leases and
    /// returns; the loop keeps serving what it holds for the partitions
    /// this member keeps (jobs end and commit, rows read start, retry waits
    /// go on, liveness beats), waits (off the loop, up to the drain
    /// timeout) for the revoked partitions' POSTs under way to write their
    /// status, and only then calls `incremental_unassign` (librdkafka allows
    /// it outside the callback; the member rejoins, and the partitions
    /// reach their next owner, only after it). Offsets stored for them are
    /// committed by librdkafka as it removes them (auto-commit).
    ///
    /// librdkafka pauses fetching of every assigned partition from the
    /// moment it hands a cooperative revoke to the application until the
    /// unassign (`rdkafka_cgrp.c`, "incremental rebalance"), and drops what
    /// it had prefetched: new messages of the kept partitions wait for the
    /// hand-off, wherever the wait runs.
    ///
    /// Under the eager protocol every partition is revoked, so there is
    /// nothing to keep serving: the wait stays in the callback, which
    /// blocks the loop (and its liveness beat) for up to the drain timeout.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let protocol = if cooperative { "cooperative" } else { "eager" };
        let count = |kind: &str| {
            self.metrics
                .consumer_rebalances_total
                .with_label_values(&[protocol, kind])
                .inc();
        };
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                count("assign");
                let taken = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                if let Err(e) = taken {
                    error!(error = %e, protocol, "cannot take the assigned partitions");
                }
                let _ = self.events.send(GroupEvent::Assign(self.partitions(tpl)));
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let parts = self.partitions(tpl);
                let lost = consumer.assignment_lost();
                count(if lost { "lost" } else { "revoke" });
                for p in &parts {
                    let _ = self
                        .metrics
                        .consumer_lag
                        .remove_label_values(&[&p.to_string()]);
                }
                if cooperative && !lost && !self.closing.load(Ordering::Relaxed) {
                    self.cancel(&parts);
                    info!(
                        partitions = ?parts,
                        "partitions revoked (cooperative): the kept ones go on; these are given up \
                         once their requests in flight wrote their status"
                    );
                    let _ = self.events.send(GroupEvent::Revoke {
                        parts,
                        hand_off: true,
                    });
                    return;
                }
                self.finish_running_posts(&parts, lost);
                let given_up = if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                };
                if let Err(e) = given_up {
                    error!(error = %e, protocol, "cannot give the revoked partitions up");
                }
                let _ = self.events.send(GroupEvent::Revoke {
                    parts,
                    hand_off: false,
                });
            }
            other => {
                warn!(error = %RDKafkaErrorCode::from(other), protocol, "rebalance error");
                // librdkafka: after an error the assignment must be synchronised.
                let synced = if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                };
                if let Err(e) = synced {
                    error!(error = %e, protocol, "cannot synchronise the assignment after a rebalance error");
                }
            }
        }
    }
}

/// The librdkafka configuration: the sidecar's defaults, then the user's
/// `[kafka.properties]`, then the two settings at-least-once depends on.
pub fn client_config(settings: &KafkaSettings) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &settings.brokers)
        .set("group.id", &settings.group_id)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set("statistics.interval.ms", "5000")
        // The loop pauses partitions when full; a smaller prefetch than
        // librdkafka's 64 MiB keeps memory flat with a large backlog.
        .set("queued.max.messages.kbytes", "16384")
        .set("enable.partition.eof", "false");
    for (k, v) in &settings.properties {
        cfg.set(property_name(k), v);
    }
    // Offsets are stored only by the tracker below; never on delivery.
    cfg.set("enable.auto.offset.store", "false");
    // rust-rdkafka takes its log level from the `log` crate, which this
    // binary does not use (tracing): without this, librdkafka's warnings
    // (an offset reset among them) would never be logged.
    let debugging = cfg.get("debug").is_some_and(|d| !d.is_empty());
    cfg.set_log_level(if debugging {
        RDKafkaLogLevel::Debug
    } else {
        RDKafkaLogLevel::Warning
    });
    cfg
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
    consumer: StreamConsumer<SidecarContext>,
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
    leases: Leases,
    closing: Arc<AtomicBool>,
    /// Cooperative revokes whose POSTs under way are being waited for.
    hand_offs: mpsc::UnboundedSender<HandOff>,
    hand_offs_rx: mpsc::UnboundedReceiver<HandOff>,
    /// Their partitions: revoked, not yet given up.
    handing_off: Mutex<BTreeSet<i32>>,
}

impl Drop for Pipeline {
    /// Runs before the consumer is closed (also when the pipeline's task
    /// is dropped without draining): the close's revoke must not wait.
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Relaxed);
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
}

impl Replies {
    fn new() -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let (read_tx, read_rx) = mpsc::unbounded_channel();
        let (dlq_tx, dlq_rx) = mpsc::unbounded_channel();
        Replies {
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
        let leases = Leases::default();
        let closing = Arc::new(AtomicBool::new(false));
        let context = SidecarContext {
            topic: settings.topic.clone(),
            events: tx,
            metrics: ctx.metrics.clone(),
            leases: leases.clone(),
            hold_limit: drain_timeout,
            closing: closing.clone(),
        };
        let consumer: StreamConsumer<SidecarContext> = client_config(settings)
            .create_with_context(context)
            .map_err(ConsumerError::Create)?;
        let (hand_offs, hand_offs_rx) = mpsc::unbounded_channel();
        consumer
            .subscribe(&[&settings.topic])
            .map_err(|source| ConsumerError::Subscribe {
                topic: settings.topic.clone(),
                source,
            })?;
        let dead_letter = match &settings.dead_letter_topic {
            Some(topic) if !topic.is_empty() => {
                let mut cfg = ClientConfig::new();
                cfg.set("bootstrap.servers", &settings.brokers);
                for (k, v) in &settings.properties {
                    cfg.set(property_name(k), v);
                }
                let producer: FutureProducer = cfg.create().map_err(ConsumerError::Producer)?;
                Some((producer, topic.clone()))
            }
            _ => None,
        };
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
            leases,
            closing,
            hand_offs,
            hand_offs_rx,
            handing_off: Mutex::default(),
        })
    }

    /// Runs until `shutdown` is cancelled, then drains: running POSTs finish
    /// and write their status within the drain timeout, finished offsets are
    /// committed synchronously.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut replies = Replies::new();
        let mut sched = Scheduler::new(self.limits, self.metrics.clone(), TokioInstant::now());
        info!(topic = %self.topic, "consuming");
        // A revoke waiting in librdkafka's callback blocks this loop; it
        // learns of the shutdown through `closing`.
        {
            let closing = self.closing.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                shutdown.cancelled().await;
                closing.store(true, Ordering::Relaxed);
            });
        }
        // An idle loop still turns, so liveness tells idle from wedged.
        let mut beat = tokio::time::interval(BEAT);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The group events are read while the stream borrows the consumer.
        let mut events = std::mem::replace(&mut self.events, mpsc::unbounded_channel().1);
        let mut hand_offs = std::mem::replace(&mut self.hand_offs_rx, mpsc::unbounded_channel().1);
        let consumer = &self.consumer;
        let mut stream = consumer.stream();
        loop {
            self.health.beat();
            let now = TokioInstant::now();
            for read in sched.take_reads(now) {
                self.spawn_read(read, replies.read_tx.clone());
            }
            for start in sched.take_starts(self.ctx.waiting()) {
                self.spawn_job(start, replies.done_tx.clone());
            }
            self.store_offsets(&mut sched);
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
                Some(done) = replies.done_rx.recv() => {
                    let now = TokioInstant::now();
                    sched.job_ended(done.id, done.serial, &done.pos, done.end.finishes_message(), now);
                    while let Ok(done) = replies.done_rx.try_recv() {
                        sched.job_ended(done.id, done.serial, &done.pos, done.end.finishes_message(), now);
                    }
                }
                Some((ticket, result)) = replies.read_rx.recv() => {
                    sched.rows_read(ticket, result, TokioInstant::now());
                }
                Some((pos, bytes)) = replies.dlq_rx.recv() => {
                    sched.dead_letter_ended(&pos, bytes, TokioInstant::now());
                    self.metrics.dead_letters_in_flight.set(sched.dead_letters() as i64);
                }
                // A job began its retry wait: its slot may take a ready row.
                _ = self.ctx.wait_started.notified() => {}
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

    fn group_event(&self, sched: &mut Scheduler, ev: GroupEvent) {
        match ev {
            GroupEvent::Assign(parts) => {
                {
                    // Incremental under the cooperative protocol: the
                    // partitions already held keep their lease (and jobs).
                    let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
                    for &p in &parts {
                        let lease = leases.entry(p).or_default();
                        if lease.is_cancelled() {
                            *lease = Arc::new(Lease::new());
                        }
                        info!(partition = p, "partition assigned");
                    }
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
                let revoked: Vec<Arc<Lease>> = {
                    let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
                    parts.iter().filter_map(|p| leases.remove(p)).collect()
                };
                for lease in &revoked {
                    lease.cancel();
                }
                sched.revoke(&parts);
                if hand_off {
                    self.hand_off(parts, revoked);
                }
            }
        }
    }

    /// Waits, off the loop and up to the drain timeout, for the POSTs under
    /// way of cooperatively revoked partitions to write their status, then
    /// reports back to the loop, which gives the partitions up.
    fn hand_off(&self, parts: Vec<i32>, leases: Vec<Arc<Lease>>) {
        self.handing_off
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(&parts);
        let busy: usize = leases.iter().map(|l| l.busy()).sum();
        let tx = self.hand_offs.clone();
        if busy == 0 {
            let _ = tx.send(HandOff {
                parts,
                busy,
                left: 0,
                waited: Duration::ZERO,
                stopped: false,
            });
            return;
        }
        info!(
            partitions = ?parts,
            requests = busy,
            "partitions revoked: waiting for their requests in flight to write their status"
        );
        let closing = self.closing.clone();
        let limit = self.drain_timeout;
        // The leases' wait blocks a thread: one of the blocking pool's.
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let deadline = started + limit;
            // Shutdown ends the wait: the drain then waits for the same POSTs.
            let stop = || closing.load(Ordering::Relaxed);
            let left = leases
                .iter()
                .map(|l| {
                    l.revoke_and_wait(deadline.saturating_duration_since(Instant::now()), stop)
                })
                .sum();
            let _ = tx.send(HandOff {
                parts,
                busy,
                left,
                waited: started.elapsed(),
                stopped: stop(),
            });
        });
    }

    /// Gives cooperatively revoked partitions up: librdkafka commits their
    /// stored offsets, and the member rejoins so they reach their next owner.
    fn give_up(&self, h: HandOff) {
        if h.busy > 0 && !h.stopped {
            count_held(&self.metrics, h.busy, h.left, h.waited);
        }
        {
            let mut handing_off = self.handing_off.lock().unwrap_or_else(|e| e.into_inner());
            for p in &h.parts {
                handing_off.remove(p);
            }
        }
        self.unassign(&h.parts);
    }

    fn unassign(&self, parts: &[i32]) {
        let mut tpl = TopicPartitionList::new();
        for &p in parts {
            tpl.add_partition(&self.topic, p);
            let _ = self
                .metrics
                .consumer_lag
                .remove_label_values(&[&p.to_string()]);
        }
        match self.consumer.incremental_unassign(&tpl) {
            Ok(()) => info!(partitions = ?parts, "revoked partitions given up"),
            Err(e) => {
                warn!(error = %e, partitions = ?parts, "cannot give the revoked partitions up")
            }
        }
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
            Decision::Trigger(t) => sched.trigger(&t, pos),
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
        let lease = self
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&pos.partition)
            .cloned();
        let Some(lease) = lease else {
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

    fn store_offsets(&self, sched: &mut Scheduler) {
        let mut tpl = TopicPartitionList::new();
        for (p, next) in sched.take_commits() {
            let _ = tpl.add_partition_offset(&self.topic, p, Offset::Offset(next));
        }
        if tpl.count() > 0 {
            if let Err(e) = self.consumer.store_offsets(&tpl) {
                debug!(error = %e, "storing offsets failed (partition revoked?)");
            }
        }
    }

    fn apply_flow(&self, sched: &mut Scheduler, flow: Flow) {
        let mut tpl = TopicPartitionList::new();
        for p in sched.partitions() {
            tpl.add_partition(&self.topic, p);
        }
        let result = match flow {
            Flow::Pause => self.consumer.pause(&tpl),
            Flow::Resume => self.consumer.resume(&tpl),
        };
        match result {
            Ok(()) => {
                let paused = flow == Flow::Pause;
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
        self.closing.store(true, Ordering::Relaxed);
        info!(running = sched.running(), "draining");
        for lease in self
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            lease.cancel();
        }
        sched.clear_waiting();
        let deadline = TokioInstant::now() + self.drain_timeout;
        while sched.running() > 0 {
            match tokio::time::timeout_at(deadline, done_rx.recv()).await {
                Ok(Some(done)) => sched.job_ended(
                    done.id,
                    done.serial,
                    &done.pos,
                    done.end.finishes_message(),
                    TokioInstant::now(),
                ),
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
        // Cooperative revokes still waiting end with the drain's wait.
        let handing_off: Vec<i32> =
            std::mem::take(&mut *self.handing_off.lock().unwrap_or_else(|e| e.into_inner()))
                .into_iter()
                .collect();
        if !handing_off.is_empty() {
            self.unassign(&handing_off);
        }
        let mut tpl = TopicPartitionList::new();
        for (p, next) in sched.commits() {
            let _ = tpl.add_partition_offset(&self.topic, p, Offset::Offset(next));
        }
        if tpl.count() > 0 {
            match self.consumer.commit(&tpl, CommitMode::Sync) {
                Ok(()) => info!(partitions = tpl.count(), "offsets committed"),
                Err(e) => warn!(error = %e, "final offset commit failed"),
            }
        }
        self.consumer.unsubscribe();
        self.health.joined.store(false, Ordering::Relaxed);
    }
}

/// A bounded label for `outbox_consumer_errors_total{kind}`.
fn error_kind(e: &KafkaError) -> &'static str {
    use rdkafka::types::RDKafkaErrorCode as C;
    match e.rdkafka_error_code() {
        Some(C::BadCompression) => "decompression",
        Some(C::BadMessage | C::InvalidMessage | C::InvalidRecord) => "corrupt_record",
        Some(C::AutoOffsetReset | C::OffsetOutOfRange) => "offset_reset",
        Some(C::AllBrokersDown | C::BrokerTransportFailure) => "transport",
        Some(C::UnknownTopicOrPartition | C::UnknownTopic | C::UnknownPartition) => "unknown_topic",
        Some(C::TopicAuthorizationFailed | C::GroupAuthorizationFailed) => "authorization",
        _ => "other",
    }
}

/// Writes an invalid record to the dead-letter topic, off the loop; its
/// message is finished when the send is delivered or given up.
async fn dead_letter(
    producer: FutureProducer,
    topic: String,
    source_topic: String,
    pos: Pos,
    (key, value): (Option<Vec<u8>>, Option<Vec<u8>>),
    reason: String,
) {
    let partition = pos.partition.to_string();
    let offset = pos.offset.to_string();
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "outbox.error",
            value: Some(&reason),
        })
        .insert(Header {
            key: "outbox.source.topic",
            value: Some(source_topic.as_str()),
        })
        .insert(Header {
            key: "outbox.source.partition",
            value: Some(&partition),
        })
        .insert(Header {
            key: "outbox.source.offset",
            value: Some(&offset),
        });
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&topic).headers(headers);
    if let Some(k) = key.as_deref() {
        record = record.key(k);
    }
    if let Some(v) = value.as_deref() {
        record = record.payload(v);
    }
    if let Err((e, _)) = producer.send(record, Duration::from_secs(10)).await {
        error!(error = %e, topic = %topic, "cannot write the invalid record to the dead-letter topic");
    }
}
