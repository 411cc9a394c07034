//! The Kafka side: a consumer group on the CDC topic that turns change
//! events into jobs and commits only what is finished (CONTRACT §4, §5).
//!
//! One task owns all the bookkeeping, so none of it needs a lock:
//! - each message is *begun* in its partition's [`PartitionOffsets`] when it
//!   arrives and *finished* when decided (skip, invalid) or when its job ends;
//! - triggers for an id whose job runs here are deferred until that job
//!   ends, then re-decided from the database (echoes of our own writes);
//! - a job sends and writes only while it holds one of `max_in_flight`
//!   slots (see [`crate::job`]); up to `2 × max_in_flight` jobs exist, so
//!   a freed slot is taken at once by a job already started, plus one for
//!   each job waiting out `retry_delay` without a slot (up to
//!   [`WAITING_PER_SLOT`] per slot); beyond that triggers wait in a ready
//!   queue; past a high mark the loop stops taking
//!   messages and, if that lasts, pauses the assigned partitions;
//! - offsets are stored as they advance (auto-commit sends them) and
//!   committed synchronously at shutdown;
//! - a revoke (in librdkafka's callback, before the partitions are given
//!   up) cancels the partitions' jobs and waits, up to the drain timeout,
//!   for the POSTs already under way to write their status, so the next
//!   owner does not send them again.

pub mod offsets;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientConfig, ClientContext, Message, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::cdc::{Decision, Decoder, Record};
use crate::config::KafkaSettings;
use crate::job::{self, JobContext, JobEnd, Lease};
use crate::metrics::Metrics;
use offsets::PartitionOffsets;

/// How many already-fetched messages one loop turn decides together (one
/// database read for all their ids).
const MAX_BATCH: usize = 512;

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
}

enum GroupEvent {
    Assign(Vec<i32>),
    Revoke(Vec<i32>),
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
        let held = &self.metrics.revoke_held_requests_total;
        held.with_label_values(&["written"])
            .inc_by(busy.saturating_sub(left) as u64);
        held.with_label_values(&["given_up"]).inc_by(left as u64);
        if left > 0 {
            warn!(
                requests = left,
                waited = ?started.elapsed(),
                "revoke: requests still in flight after the drain timeout; the next owner may send them again"
            );
        } else {
            info!(waited = ?started.elapsed(), "revoke: requests in flight finished; partitions given up");
        }
    }
}

impl ClientContext for SidecarContext {
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
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let parts = self.partitions(tpl);
            for p in &parts {
                let _ = self
                    .metrics
                    .consumer_lag
                    .remove_label_values(&[&p.to_string()]);
            }
            self.finish_running_posts(&parts, consumer.assignment_lost());
            let _ = self.events.send(GroupEvent::Revoke(parts));
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let _ = self.events.send(GroupEvent::Assign(self.partitions(tpl)));
            }
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
            Rebalance::Revoke(_) => {}
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
    cfg
}

/// `OUTBOX__KAFKA__PROPERTIES__SASL_PASSWORD` arrives as `sasl_password`:
/// librdkafka names use dots, never underscores, so map them back.
pub fn property_name(key: &str) -> String {
    key.replace('_', ".")
}

/// A message whose work is outstanding, as the loop tracks it.
#[derive(Debug, Clone, Copy)]
struct Pos {
    partition: i32,
    generation: u64,
    offset: i64,
}

struct PartitionState {
    generation: u64,
    offsets: PartitionOffsets,
    lease: Arc<Lease>,
}

struct Running {
    serial: u64,
}

struct JobDone {
    id: i64,
    serial: u64,
    pos: Pos,
    end: JobEnd,
}

pub struct Pipeline {
    consumer: StreamConsumer<SidecarContext>,
    events: mpsc::UnboundedReceiver<GroupEvent>,
    topic: String,
    decoder: Decoder,
    ctx: Arc<JobContext>,
    max_in_flight: usize,
    dead_letter: Option<(FutureProducer, String)>,
    health: Arc<ConsumerHealth>,
    drain_timeout: Duration,
    leases: Leases,
    closing: Arc<AtomicBool>,
}

impl Drop for Pipeline {
    /// Runs before the consumer is closed (also when the pipeline's task
    /// is dropped without draining): the close's revoke must not wait.
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Relaxed);
    }
}

impl Pipeline {
    pub fn new(
        settings: &KafkaSettings,
        table: &str,
        ctx: Arc<JobContext>,
        max_in_flight: usize,
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
            ctx,
            max_in_flight,
            dead_letter,
            health,
            drain_timeout,
            leases,
            closing,
        })
    }

    /// Runs until `shutdown` is cancelled, then drains: running POSTs finish
    /// and write their status within the drain timeout, finished offsets are
    /// committed synchronously.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<JobDone>();
        let mut st = LoopState {
            partitions: HashMap::new(),
            running: HashMap::new(),
            deferred: HashMap::new(),
            ready: ReadyQueue::default(),
            next_generation: 1,
            next_serial: 1,
            paused: false,
            holding_since: None,
            progress_at: tokio::time::Instant::now(),
            done_tx,
        };
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
        let consumer = &self.consumer;
        let mut stream = consumer.stream();
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(ev) = self.events.recv() => {
                    st.group_event(&self, ev);
                }
                // A job began its retry wait: its slot may take a ready row.
                _ = self.ctx.wait_started.notified() => {
                    st.start_ready(&self);
                }
                Some(done) = done_rx.recv() => {
                    let mut dones = vec![done];
                    while let Ok(more) = done_rx.try_recv() {
                        dones.push(more);
                    }
                    st.jobs_done(&self, dones, &shutdown).await;
                }
                // Holding: too much decided work waits; stop taking more
                // and, if that lasts, pause the partitions.
                _ = tokio::time::sleep_until(st.pause_deadline()), if st.holding(&self) => {
                    st.set_paused(&self, true);
                }
                msg = stream.next(), if !st.holding(&self) => {
                    let Some(first) = msg else { break };
                    // Rebalance callbacks ran inside that poll: apply them
                    // before deciding messages of the new assignment.
                    while let Ok(ev) = self.events.try_recv() {
                        st.group_event(&self, ev);
                    }
                    let mut batch = Vec::new();
                    self.collect(first, &mut batch);
                    while batch.len() < MAX_BATCH {
                        match stream.next().now_or_never() {
                            Some(Some(m)) => self.collect(m, &mut batch),
                            _ => break,
                        }
                    }
                    while let Ok(ev) = self.events.try_recv() {
                        st.group_event(&self, ev);
                    }
                    let started = std::time::Instant::now();
                    let n = batch.len();
                    st.decide_batch(&self, batch, &shutdown).await;
                    debug!(messages = n, running = st.running.len(), ready = st.ready.len(), took = ?started.elapsed(), "batch decided");
                }
            }
            st.store_offsets(&self);
            st.flow_control(&self);
        }
        drop(stream);
        self.drain(st, done_rx).await;
    }

    /// Decodes one polled message; consumer errors are logged and skipped.
    fn collect(
        &self,
        msg: Result<rdkafka::message::BorrowedMessage<'_>, KafkaError>,
        batch: &mut Vec<Polled>,
    ) {
        match msg {
            Ok(m) => {
                let record = Record {
                    topic: m.topic(),
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key(),
                    value: m.payload(),
                };
                let decision = self.decoder.decode(&record);
                let raw = match decision {
                    Decision::Invalid(_) if self.dead_letter.is_some() => {
                        Some((m.key().map(<[u8]>::to_vec), m.payload().map(<[u8]>::to_vec)))
                    }
                    _ => None,
                };
                batch.push(Polled {
                    partition: m.partition(),
                    offset: m.offset(),
                    decision,
                    raw,
                });
            }
            Err(e) => warn!(error = %e, "Kafka consumer error"),
        }
    }

    async fn dead_letter(&self, p: &Polled, reason: &str) {
        let Some((producer, topic)) = &self.dead_letter else {
            return;
        };
        let (key, value) = p.raw.clone().unwrap_or((None, None));
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "outbox.error",
                value: Some(reason),
            })
            .insert(Header {
                key: "outbox.source.topic",
                value: Some(self.topic.as_str()),
            })
            .insert(Header {
                key: "outbox.source.partition",
                value: Some(&p.partition.to_string()),
            })
            .insert(Header {
                key: "outbox.source.offset",
                value: Some(&p.offset.to_string()),
            });
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
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

    async fn drain(self, mut st: LoopState, mut done_rx: mpsc::UnboundedReceiver<JobDone>) {
        self.health.draining.store(true, Ordering::Relaxed);
        self.closing.store(true, Ordering::Relaxed);
        info!(running = st.running.len(), "draining");
        for p in st.partitions.values() {
            p.lease.cancel();
        }
        st.ready.clear();
        st.deferred.clear();
        let deadline = tokio::time::Instant::now() + self.drain_timeout;
        while !st.running.is_empty() {
            match tokio::time::timeout_at(deadline, done_rx.recv()).await {
                Ok(Some(done)) => st.release(&done),
                Ok(None) => break,
                Err(_) => {
                    warn!(
                        running = st.running.len(),
                        "drain timeout: leaving the remaining messages uncommitted"
                    );
                    self.ctx.abort.cancel();
                    break;
                }
            }
        }
        let mut tpl = TopicPartitionList::new();
        for (p, state) in &st.partitions {
            if let Some(next) = state.offsets.committable() {
                let _ = tpl.add_partition_offset(&self.topic, *p, Offset::Offset(next));
            }
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

struct Polled {
    partition: i32,
    offset: i64,
    decision: Decision,
    raw: Option<RawRecord>,
}

/// Key and value bytes kept for the dead-letter topic.
type RawRecord = (Option<Vec<u8>>, Option<Vec<u8>>);

/// Pending rows read for triggers, in arrival order, waiting to become
/// jobs; an id is in it at most once.
#[derive(Default)]
struct ReadyQueue {
    rows: VecDeque<(entity::OutboxEventRow, Pos)>,
    ids: HashSet<i64>,
}

impl ReadyQueue {
    fn len(&self) -> usize {
        self.rows.len()
    }

    fn contains(&self, id: i64) -> bool {
        self.ids.contains(&id)
    }

    fn push(&mut self, row: entity::OutboxEventRow, pos: Pos) {
        self.ids.insert(row.id);
        self.rows.push_back((row, pos));
    }

    fn pop(&mut self) -> Option<(entity::OutboxEventRow, Pos)> {
        let (row, pos) = self.rows.pop_front()?;
        self.ids.remove(&row.id);
        Some((row, pos))
    }

    fn drop_partition(&mut self, partition: i32) {
        let ids = &mut self.ids;
        self.rows.retain(|(row, pos)| {
            let keep = pos.partition != partition;
            if !keep {
                ids.remove(&row.id);
            }
            keep
        });
    }

    fn clear(&mut self) {
        self.rows.clear();
        self.ids.clear();
    }
}

struct LoopState {
    partitions: HashMap<i32, PartitionState>,
    running: HashMap<i64, Running>,
    /// Triggers for ids whose job is running, re-decided when it ends.
    deferred: HashMap<i64, Vec<Pos>>,
    /// Pending rows read for triggers, waiting for a free slot.
    ready: ReadyQueue,
    next_generation: u64,
    next_serial: u64,
    paused: bool,
    /// Since when the ready queue has been above its high mark.
    holding_since: Option<tokio::time::Instant>,
    /// When a job last ended (the ready queue can move).
    progress_at: tokio::time::Instant,
    done_tx: mpsc::UnboundedSender<JobDone>,
}

impl LoopState {
    fn group_event(&mut self, pl: &Pipeline, ev: GroupEvent) {
        match ev {
            GroupEvent::Assign(parts) => {
                for p in parts {
                    let generation = self.next_generation;
                    self.next_generation += 1;
                    let lease = Arc::new(Lease::new());
                    pl.leases
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(p, lease.clone());
                    self.partitions.insert(
                        p,
                        PartitionState {
                            generation,
                            offsets: PartitionOffsets::default(),
                            lease,
                        },
                    );
                    info!(partition = p, "partition assigned");
                }
                pl.health.joined.store(true, Ordering::Relaxed);
                // Start the whole assignment unpaused (an incremental assign
                // keeps partitions paused earlier); flow control re-pauses
                // them right after if the limit is still reached.
                if self.paused {
                    self.set_paused(pl, false);
                }
            }
            GroupEvent::Revoke(parts) => {
                for p in parts {
                    pl.leases
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&p);
                    if let Some(state) = self.partitions.remove(&p) {
                        state.lease.cancel();
                        info!(
                            partition = p,
                            unfinished = state.offsets.unfinished(),
                            "partition revoked"
                        );
                    }
                    self.ready.drop_partition(p);
                    for list in self.deferred.values_mut() {
                        list.retain(|pos| pos.partition != p);
                    }
                }
            }
        }
    }

    fn current(&self, pos: &Pos) -> bool {
        self.partitions
            .get(&pos.partition)
            .is_some_and(|s| s.generation == pos.generation)
    }

    fn begin(&mut self, partition: i32, offset: i64) -> Option<Pos> {
        let state = self.partitions.get_mut(&partition)?;
        state.offsets.begin(offset);
        Some(Pos {
            partition,
            generation: state.generation,
            offset,
        })
    }

    fn finish(&mut self, pos: &Pos) {
        if let Some(state) = self.partitions.get_mut(&pos.partition) {
            if state.generation == pos.generation {
                state.offsets.finish(pos.offset);
            }
        }
    }

    async fn decide_batch(
        &mut self,
        pl: &Pipeline,
        batch: Vec<Polled>,
        shutdown: &CancellationToken,
    ) {
        let m = &pl.ctx.metrics;
        let mut candidates = Vec::new();
        for polled in batch {
            let Some(pos) = self.begin(polled.partition, polled.offset) else {
                // Not (or no longer) ours: the next owner reads it again.
                continue;
            };
            m.cdc_messages_total
                .with_label_values(&[polled.decision.result_label()])
                .inc();
            match &polled.decision {
                Decision::Trigger(t) => candidates.push((t.id, pos)),
                Decision::Skip(skip) => {
                    m.cdc_skips_total.with_label_values(&[skip.reason()]).inc();
                    debug!(
                        partition = pos.partition,
                        offset = pos.offset,
                        reason = skip.reason(),
                        "skipped"
                    );
                    self.finish(&pos);
                }
                Decision::Invalid(err) => {
                    warn!(error = %err, "invalid change event skipped");
                    pl.dead_letter(&polled, &err.to_string()).await;
                    self.finish(&pos);
                }
            }
        }
        self.admit(pl, candidates, shutdown).await;
    }

    /// Decides triggers: deferred when the id's job runs here, else read
    /// from the database (one query for all of them) and queued as ready
    /// when the row is pending there; then starts what the limit allows.
    async fn admit(
        &mut self,
        pl: &Pipeline,
        candidates: Vec<(i64, Pos)>,
        shutdown: &CancellationToken,
    ) {
        let mut to_read: Vec<(i64, Pos)> = Vec::new();
        // A second trigger for an id read in this same batch: decided after
        // the read, by whether that read started (or queued) a job.
        let mut repeats: Vec<(i64, Pos)> = Vec::new();
        let mut reading: HashSet<i64> = HashSet::with_capacity(candidates.len());
        for (id, pos) in candidates {
            let queued = self.ready.contains(id);
            if self.running.contains_key(&id) || queued {
                self.defer(pl, id, pos);
            } else if !reading.insert(id) {
                repeats.push((id, pos));
            } else {
                to_read.push((id, pos));
            }
        }
        if !to_read.is_empty() {
            let ids: Vec<i64> = to_read.iter().map(|(id, _)| *id).collect();
            let Some(rows) = read_rows(pl, &ids, shutdown).await else {
                return; // shutting down: these stay unfinished, hence uncommitted
            };
            let mut rows: HashMap<i64, entity::OutboxEventRow> =
                rows.into_iter().map(|r| (r.id, r)).collect();
            for (id, pos) in to_read {
                if !self.current(&pos) {
                    continue;
                }
                let reason = match rows.remove(&id) {
                    Some(row) if row.status == entity::Status::Pending => {
                        self.ready.push(row, pos);
                        continue;
                    }
                    Some(row) => {
                        debug!(id, status = %row.status, "stale trigger skipped");
                        "stale"
                    }
                    None => "row_missing",
                };
                pl.ctx
                    .metrics
                    .cdc_skips_total
                    .with_label_values(&[reason])
                    .inc();
                self.finish(&pos);
            }
        }
        for (id, pos) in repeats {
            if self.ready.contains(id) {
                self.defer(pl, id, pos);
            } else {
                // The read found nothing to do for the id: neither does this.
                pl.ctx
                    .metrics
                    .cdc_skips_total
                    .with_label_values(&["stale"])
                    .inc();
                self.finish(&pos);
            }
        }
        self.start_ready(pl);
    }

    /// Parks a trigger until the id's job (running or queued) ends; it is
    /// then decided again from the database.
    fn defer(&mut self, pl: &Pipeline, id: i64, pos: Pos) {
        pl.ctx
            .metrics
            .cdc_skips_total
            .with_label_values(&["job_running"])
            .inc();
        self.deferred.entry(id).or_default().push(pos);
    }

    /// Starts jobs from the ready queue up to [`max_jobs`]. Rows queued
    /// here were read when their batch was decided, so starting them costs
    /// no database round trip.
    fn start_ready(&mut self, pl: &Pipeline) {
        while self.running.len() < max_jobs(pl.max_in_flight, pl.ctx.waiting()) {
            let Some((row, pos)) = self.ready.pop() else {
                break;
            };
            if self.current(&pos) {
                self.spawn(pl, row, pos);
            }
        }
    }

    fn spawn(&mut self, pl: &Pipeline, row: entity::OutboxEventRow, pos: Pos) {
        let Some(state) = self.partitions.get(&pos.partition) else {
            return;
        };
        let lease = state.lease.clone();
        let serial = self.next_serial;
        self.next_serial += 1;
        let id = row.id;
        self.running.insert(id, Running { serial });
        let ctx = pl.ctx.clone();
        let tx = self.done_tx.clone();
        tokio::spawn(async move {
            let end = job::run(ctx, row, lease).await;
            let _ = tx.send(JobDone {
                id,
                serial,
                pos,
                end,
            });
        });
    }

    fn release(&mut self, done: &JobDone) {
        if self
            .running
            .get(&done.id)
            .is_some_and(|r| r.serial == done.serial)
        {
            self.running.remove(&done.id);
        }
        if done.end.finishes_message() {
            self.finish(&done.pos);
        }
    }

    /// Ends the given jobs, then re-decides in one read the triggers that
    /// waited for them, and refills the free slots.
    async fn jobs_done(
        &mut self,
        pl: &Pipeline,
        dones: Vec<JobDone>,
        shutdown: &CancellationToken,
    ) {
        self.progress_at = tokio::time::Instant::now();
        let mut again = Vec::new();
        for done in dones {
            self.release(&done);
            if let Some(list) = self.deferred.remove(&done.id) {
                let current: Vec<Pos> = list.into_iter().filter(|p| self.current(p)).collect();
                let mut list = current.into_iter();
                if let Some(first) = list.next() {
                    again.push((done.id, first));
                }
                // One re-decision covers the id; the other triggers are done.
                for pos in list {
                    self.finish(&pos);
                }
            }
        }
        self.start_ready(pl);
        if !again.is_empty() {
            self.admit(pl, again, shutdown).await;
        }
    }

    fn store_offsets(&mut self, pl: &Pipeline) {
        let mut tpl = TopicPartitionList::new();
        for (p, state) in self.partitions.iter_mut() {
            if let Some(next) = state.offsets.take_committable() {
                let _ = tpl.add_partition_offset(&pl.topic, *p, Offset::Offset(next));
            }
        }
        if tpl.count() > 0 {
            if let Err(e) = pl.consumer.store_offsets(&tpl) {
                debug!(error = %e, "storing offsets failed (partition revoked?)");
            }
        }
    }

    /// Bounds what waits here: at the high mark the loop stops taking
    /// messages (holds); it pauses the partitions when the hold lasts with
    /// no job ending for [`PAUSE_AFTER`] (the jobs are stuck), or lasts
    /// [`HOLD_MAX`] in all (slow jobs: rebalance callbacks are served only
    /// by polling); once paused, at or below `max_in_flight` waiting rows it
    /// resumes them.
    ///
    /// A busy backlog keeps the queue at or just under the high mark while
    /// jobs keep ending, so a busy pipeline is not paused (a pause drops
    /// librdkafka's prefetched messages, and the fetch after the resume
    /// starves the jobs for a fetch cycle).
    fn flow_control(&mut self, pl: &Pipeline) {
        let waiting = self.ready.len();
        if waiting >= ready_high(pl.max_in_flight) {
            self.holding_since
                .get_or_insert_with(tokio::time::Instant::now);
        } else {
            self.holding_since = None;
            if self.paused && waiting <= pl.max_in_flight {
                self.set_paused(pl, false);
            }
        }
    }

    /// Not taking messages: the ready queue is over its high mark and the
    /// partitions are not paused yet (once paused, polling is safe again and
    /// serves rebalance callbacks).
    fn holding(&self, pl: &Pipeline) -> bool {
        !self.paused && self.ready.len() >= ready_high(pl.max_in_flight)
    }

    fn pause_deadline(&self) -> tokio::time::Instant {
        let since = self.holding_since.unwrap_or_else(tokio::time::Instant::now);
        let quiet = since.max(self.progress_at) + PAUSE_AFTER;
        quiet.min(since + HOLD_MAX)
    }

    fn set_paused(&mut self, pl: &Pipeline, pause: bool) {
        let mut tpl = TopicPartitionList::new();
        for p in self.partitions.keys() {
            tpl.add_partition(&pl.topic, *p);
        }
        let result = if pause {
            pl.consumer.pause(&tpl)
        } else {
            pl.consumer.resume(&tpl)
        };
        match result {
            Ok(()) => {
                self.paused = pause;
                pl.ctx.metrics.consumer_paused.set(i64::from(pause));
                if pause {
                    pl.ctx.metrics.consumer_pauses_total.inc();
                }
                debug!(paused = pause, running = self.running.len(), "flow control");
            }
            Err(e) => {
                warn!(error = %e, "pause/resume failed");
                if pause {
                    // Try again after another PAUSE_AFTER, not at once.
                    self.holding_since = Some(tokio::time::Instant::now());
                }
            }
        }
    }
}

/// How long the loop may hold back (not take messages) with no job ending
/// before it pauses the partitions. A pause drops librdkafka's prefetched
/// messages and a resume takes a fetch cycle (up to a second on some
/// brokers) before messages flow again, so waits on working jobs are
/// bridged by simply not polling; librdkafka's own queue stays bounded by
/// `queued.max.messages.kbytes`.
const PAUSE_AFTER: Duration = Duration::from_millis(500);

/// How long the loop may hold back in all, jobs ending or not, before it
/// pauses: rebalance callbacks run only while it polls.
const HOLD_MAX: Duration = Duration::from_secs(5);

/// Jobs waiting out `retry_delay` that may exist per in-flight slot: they
/// hold no slot, so a row that failed does not hold back fresh ones.
pub const WAITING_PER_SLOT: usize = 4;

/// How many jobs may exist now: `max_in_flight` holding a slot and as many
/// waiting for one (a slot freed is taken without waiting for a turn of
/// the consumer loop), plus one for each job waiting for its retry time,
/// up to [`WAITING_PER_SLOT`] per slot.
fn max_jobs(max_in_flight: usize, waiting: usize) -> usize {
    (2 * max_in_flight).saturating_add(waiting.min(max_in_flight.saturating_mul(WAITING_PER_SLOT)))
}

/// How many decided rows may wait for a slot before fetching pauses.
fn ready_high(max_in_flight: usize) -> usize {
    (max_in_flight * 2).max(MAX_BATCH)
}

/// Reads rows, retrying while the database is down; `None` on shutdown.
async fn read_rows(
    pl: &Pipeline,
    ids: &[i64],
    shutdown: &CancellationToken,
) -> Option<Vec<entity::OutboxEventRow>> {
    let mut backoff = Duration::from_millis(100);
    loop {
        match pl.ctx.store.get_many(ids).await {
            Ok(rows) => return Some(rows),
            Err(e) => {
                warn!(error = %e, retry_in = ?backoff, "cannot read triggered rows; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
