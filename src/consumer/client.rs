//! The librdkafka side of the consumer: the client configuration (the
//! consumer's and the dead-letter producer's), the client context — log
//! lines, statistics, and a thin rebalance callback that turns each of
//! librdkafka's callbacks into one [`Group`] call and tells the loop — the
//! calls the loop makes on the consumer (offset stores, pause and resume,
//! giving partitions up, the final commit), the error kinds counted, and
//! the dead-letter sends.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol, StreamConsumer,
};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::statistics::Statistics;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::group::{Group, Held, Revocation, Revoke};
use super::schedule::Pos;
use crate::config::{property_name, KafkaSettings};
use crate::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error("cannot create the Kafka consumer: {0}")]
    Create(KafkaError),
    #[error("cannot subscribe to topic {topic:?}: {source}")]
    Subscribe { topic: String, source: KafkaError },
    #[error("cannot create the dead-letter producer: {0}")]
    Producer(KafkaError),
}

/// The consumer of the CDC topic.
pub(super) type Kafka = StreamConsumer<SidecarContext>;

/// What the rebalance callback tells the loop, in the order it happened.
pub(super) enum GroupEvent {
    /// Partitions assigned (all of them under the eager protocol, the
    /// added ones under the cooperative one); their leases exist. `total`:
    /// the topic's partitions, from the broker's metadata at the assign
    /// (`None` when it did not answer in time).
    Assign {
        parts: Vec<i32>,
        total: Option<usize>,
    },
    /// `hand_off`: a cooperative revoke; the partitions are still
    /// librdkafka's to fetch, and the loop gives them up once the
    /// revocation's wait ended. Otherwise they are already given up.
    Revoke {
        parts: Vec<i32>,
        hand_off: Option<Revocation>,
    },
}

/// How long an assign waits for the topic's metadata (its partition count).
const METADATA_TIMEOUT: Duration = Duration::from_secs(2);

/// The consumer's client context.
pub(super) struct SidecarContext {
    /// The CDC topic: the only one whose partitions are ours.
    pub(super) topic: String,
    /// To the loop.
    pub(super) events: mpsc::UnboundedSender<GroupEvent>,
    /// Rebalances, consumer lag, offset resets.
    pub(super) metrics: Metrics,
    /// The partitions and their leases.
    pub(super) group: Arc<Group>,
}

impl SidecarContext {
    fn partitions(&self, tpl: &TopicPartitionList) -> Vec<i32> {
        tpl.elements()
            .iter()
            .filter(|e| e.topic() == self.topic)
            .map(|e| e.partition())
            .collect()
    }
}

/// Runs an eager revoke's wait in the callback: the poll that delivered
/// the revoke, and so the loop, blocks until it ends, and librdkafka gives
/// the partitions up only after, so the next owner reads those rows
/// decided. The wait blocks this thread: the jobs must run on others,
/// which a single-threaded runtime does not have.
fn wait_in_callback(revocation: Revocation) -> Option<Held> {
    if !revocation.waits() {
        return None;
    }
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if !multi_thread {
        warn!(
            requests = revocation.busy(),
            "partitions revoked with requests in flight; not waiting for them (single-threaded runtime)"
        );
        return None;
    }
    Some(tokio::task::block_in_place(|| revocation.wait()))
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
    /// Each callback is one [`Group`] call and one event to the loop.
    ///
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
                let parts = self.partitions(tpl);
                self.group.assigned(&parts);
                // The topic's size sets each rate limit's share; a short
                // metadata request, made once per rebalance.
                let total = consumer
                    .fetch_metadata(Some(&self.topic), METADATA_TIMEOUT)
                    .ok()
                    .and_then(|m| {
                        m.topics()
                            .iter()
                            .find(|t| t.name() == self.topic)
                            .map(|t| t.partitions().len())
                    })
                    .filter(|n| *n > 0);
                let _ = self.events.send(GroupEvent::Assign { parts, total });
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
                let how = match (lost, cooperative) {
                    (true, _) => Revoke::Lost,
                    (false, true) => Revoke::Cooperative,
                    (false, false) => Revoke::Eager,
                };
                let revocation = self.group.revoke(&parts, how);
                if revocation.hands_off() {
                    info!(
                        partitions = ?parts,
                        "partitions revoked (cooperative): the kept ones go on; these are given up \
                         once their requests in flight wrote their status"
                    );
                    let _ = self.events.send(GroupEvent::Revoke {
                        parts,
                        hand_off: Some(revocation),
                    });
                    return;
                }
                if let Some(held) = wait_in_callback(revocation) {
                    held.count(&self.metrics);
                }
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
                    hand_off: None,
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

/// Creates the consumer and subscribes it to the CDC topic; its rebalance
/// callback reports to `group` and, through `events`, to the loop.
pub(super) fn subscribe(
    settings: &KafkaSettings,
    events: mpsc::UnboundedSender<GroupEvent>,
    metrics: Metrics,
    group: Arc<Group>,
) -> Result<Kafka, ConsumerError> {
    let context = SidecarContext {
        topic: settings.topic.clone(),
        events,
        metrics,
        group,
    };
    let consumer: Kafka = client_config(settings)
        .create_with_context(context)
        .map_err(ConsumerError::Create)?;
    consumer
        .subscribe(&[&settings.topic])
        .map_err(|source| ConsumerError::Subscribe {
            topic: settings.topic.clone(),
            source,
        })?;
    Ok(consumer)
}

/// The CDC topic's `parts`.
fn topic_list(consumer: &Kafka, parts: &[i32]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for &p in parts {
        tpl.add_partition(&consumer.context().topic, p);
    }
    tpl
}

/// The CDC topic's partitions with the offsets to commit (the next to read).
fn offset_list(consumer: &Kafka, commits: Vec<(i32, i64)>) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (p, next) in commits {
        let _ = tpl.add_partition_offset(&consumer.context().topic, p, Offset::Offset(next));
    }
    tpl
}

/// Stores the offsets that advanced; auto-commit sends them.
pub(super) fn store_offsets(consumer: &Kafka, commits: Vec<(i32, i64)>) {
    let tpl = offset_list(consumer, commits);
    if tpl.count() > 0 {
        if let Err(e) = consumer.store_offsets(&tpl) {
            debug!(error = %e, "storing offsets failed (partition revoked?)");
        }
    }
}

/// Commits the finished offsets synchronously (at shutdown).
pub(super) fn commit(consumer: &Kafka, commits: Vec<(i32, i64)>) {
    let tpl = offset_list(consumer, commits);
    if tpl.count() > 0 {
        match consumer.commit(&tpl, CommitMode::Sync) {
            Ok(()) => info!(partitions = tpl.count(), "offsets committed"),
            Err(e) => warn!(error = %e, "final offset commit failed"),
        }
    }
}

/// Pauses or resumes fetching of `parts`.
pub(super) fn set_paused(consumer: &Kafka, parts: &[i32], paused: bool) -> KafkaResult<()> {
    let tpl = topic_list(consumer, parts);
    if paused {
        consumer.pause(&tpl)
    } else {
        consumer.resume(&tpl)
    }
}

/// Gives cooperatively revoked partitions up: librdkafka commits their
/// stored offsets, and the member rejoins so they reach their next owner.
pub(super) fn give_up(consumer: &Kafka, parts: &[i32]) {
    for p in parts {
        let _ = consumer
            .context()
            .metrics
            .consumer_lag
            .remove_label_values(&[&p.to_string()]);
    }
    match consumer.incremental_unassign(&topic_list(consumer, parts)) {
        Ok(()) => info!(partitions = ?parts, "revoked partitions given up"),
        Err(e) => {
            warn!(error = %e, partitions = ?parts, "cannot give the revoked partitions up")
        }
    }
}

/// The dead-letter producer and its topic, when one is configured: the
/// consumer's brokers and `[kafka.properties]`.
pub(super) fn dead_letter_producer(
    settings: &KafkaSettings,
) -> Result<Option<(FutureProducer, String)>, ConsumerError> {
    let Some(topic) = settings
        .dead_letter_topic
        .as_ref()
        .filter(|t| !t.is_empty())
    else {
        return Ok(None);
    };
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &settings.brokers);
    for (k, v) in &settings.properties {
        cfg.set(property_name(k), v);
    }
    let producer: FutureProducer = cfg.create().map_err(ConsumerError::Producer)?;
    Ok(Some((producer, topic.clone())))
}

/// A bounded label for `outbox_consumer_errors_total{kind}`.
pub(super) fn error_kind(e: &KafkaError) -> &'static str {
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
pub(super) async fn dead_letter(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::labels::CONSUMER_ERROR_KINDS;
    use rdkafka::types::RDKafkaErrorCode as C;

    /// Every kind the consumer reports is one the metrics create at zero.
    #[test]
    fn every_error_kind_is_listed() {
        for code in [
            C::BadCompression,
            C::BadMessage,
            C::InvalidRecord,
            C::OffsetOutOfRange,
            C::AllBrokersDown,
            C::BrokerTransportFailure,
            C::UnknownTopicOrPartition,
            C::TopicAuthorizationFailed,
            C::GroupAuthorizationFailed,
            C::RequestTimedOut,
        ] {
            let kind = error_kind(&KafkaError::MessageConsumption(code));
            assert!(CONSUMER_ERROR_KINDS.contains(&kind), "{code:?}: {kind}");
        }
        assert!(CONSUMER_ERROR_KINDS.contains(&"offset_reset"));
    }
}

/// A member of the consumer group, as the group's coordinator knows it:
/// its `client.id` (the replica's name unless `[kafka.properties]` sets
/// one), its host, and the partitions of the CDC topic assigned to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub client_id: String,
    pub host: String,
    pub partitions: Vec<i32>,
}

/// The group's members and their partitions of `settings.topic` (blocking:
/// one DescribeGroups through a client of its own, no join).
pub fn group_members(settings: &KafkaSettings, timeout: Duration) -> Result<Vec<Member>, String> {
    let consumer: rdkafka::consumer::BaseConsumer = client_config(settings)
        .create()
        .map_err(|e| format!("kafka client: {e}"))?;
    let list = consumer
        .fetch_group_list(Some(&settings.group_id), timeout)
        .map_err(|e| format!("describe group {}: {e}", settings.group_id))?;
    let mut out = Vec::new();
    for g in list.groups() {
        for m in g.members() {
            let partitions = m
                .assignment()
                .map(|a| assigned_partitions(a, &settings.topic))
                .unwrap_or_default();
            out.push(Member {
                client_id: m.client_id().to_owned(),
                host: m.client_host().trim_start_matches('/').to_owned(),
                partitions,
            });
        }
    }
    if !out.is_empty()
        && out
            .iter()
            .all(|m| m.client_id.is_empty() && m.partitions.is_empty())
    {
        return Err(format!(
            "the broker described group {} without its members' names or assignments",
            settings.group_id
        ));
    }
    out.sort_by(|a, b| a.partitions.cmp(&b.partitions));
    Ok(out)
}

/// The partitions of `topic` in a consumer protocol assignment (version
/// i16; topics: i32 count, each a string (i16 length) and an i32 array of
/// partitions; user data follows). Anything unreadable reads as none.
pub fn assigned_partitions(bytes: &[u8], topic: &str) -> Vec<i32> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (head, tail) = b.split_at(n);
        *b = tail;
        Some(head)
    }
    fn i16_(b: &mut &[u8]) -> Option<i16> {
        take(b, 2).map(|h| i16::from_be_bytes([h[0], h[1]]))
    }
    fn i32_(b: &mut &[u8]) -> Option<i32> {
        take(b, 4).map(|h| i32::from_be_bytes([h[0], h[1], h[2], h[3]]))
    }
    let mut b = bytes;
    let mut out = Vec::new();
    let parse = (|| {
        i16_(&mut b)?;
        let topics = i32_(&mut b)?;
        for _ in 0..topics.max(0) {
            let len = i16_(&mut b)?.max(0) as usize;
            let name = take(&mut b, len)?;
            let n = i32_(&mut b)?;
            for _ in 0..n.max(0) {
                let p = i32_(&mut b)?;
                if name == topic.as_bytes() {
                    out.push(p);
                }
            }
        }
        Some(())
    })();
    if parse.is_none() {
        return Vec::new();
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod assignment_tests {
    use super::assigned_partitions;

    fn encode(topics: &[(&str, &[i32])]) -> Vec<u8> {
        let mut b = vec![0, 1];
        b.extend((topics.len() as i32).to_be_bytes());
        for (t, ps) in topics {
            b.extend((t.len() as i16).to_be_bytes());
            b.extend(t.as_bytes());
            b.extend((ps.len() as i32).to_be_bytes());
            for p in *ps {
                b.extend(p.to_be_bytes());
            }
        }
        b.extend((-1i32).to_be_bytes());
        b
    }

    #[test]
    fn the_topics_partitions_are_read_and_the_others_ignored() {
        let b = encode(&[("other", &[0, 1]), ("cdc", &[3, 1])]);
        assert_eq!(assigned_partitions(&b, "cdc"), vec![1, 3]);
        assert_eq!(assigned_partitions(&b, "none"), Vec::<i32>::new());
        assert_eq!(assigned_partitions(&b[..9], "cdc"), Vec::<i32>::new());
        assert_eq!(assigned_partitions(&[], "cdc"), Vec::<i32>::new());
    }
}
