//! The Kafka side of the tests: the broker named by
//! `OUTBOX_TEST_KAFKA_BROKERS`, else the broker `OUTBOX_TEST_BROKER` names
//! (`mock`, the default, or `tansu`), where `mock` means a shared
//! testcontainers broker when a Docker engine answers, else librdkafka's
//! mock cluster (real Kafka protocol over TCP) — the order of
//! `crate::db::source` — and a reader of a group's committed offsets.
//!
//! `tansu` is an independent Kafka-compatible broker (docs/brokers.md):
//! each `Kafka::start` runs its own process on its own port with memory
//! storage, killed when the `Kafka` is dropped.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::Client;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::RDKafkaType;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

pub use super::tansu::Tansu;
use crate::db::{self, Source};

/// Names the broker of a test run: `mock` (default) or `tansu`.
pub const BROKER_ENV: &str = "OUTBOX_TEST_BROKER";

/// The broker a test run uses when `OUTBOX_TEST_KAFKA_BROKERS` is unset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    Mock,
    Tansu,
}

/// `OUTBOX_TEST_BROKER`; an unknown name fails the test rather than
/// silently running on the mock.
pub fn broker_kind() -> BrokerKind {
    match std::env::var(BROKER_ENV).as_deref() {
        Err(_) | Ok("") | Ok("mock") => BrokerKind::Mock,
        Ok("tansu") => BrokerKind::Tansu,
        Ok(other) => panic!("{BROKER_ENV}={other:?}: expected mock or tansu"),
    }
}

/// Whether the tests' broker is tansu (and not an external broker).
pub fn on_tansu() -> bool {
    std::env::var_os(db::KAFKA_BROKERS_ENV).is_none() && broker_kind() == BrokerKind::Tansu
}

/// True (and says so on stdout) when the run's broker is not librdkafka's
/// mock cluster: a test that needs the mock's own APIs (error injection,
/// more brokers, its partition log) returns early then.
pub fn mock_only(reason: &str) -> bool {
    let mock = std::env::var_os(db::KAFKA_BROKERS_ENV).is_none()
        && broker_kind() == BrokerKind::Mock
        && db::source(db::KAFKA_BROKERS_ENV) == Source::Local;
    if !mock {
        println!("mock only: {reason}");
    }
    !mock
}

/// How the run's broker is described in the "test services" line.
pub fn describe() -> String {
    if std::env::var_os(db::KAFKA_BROKERS_ENV).is_some() {
        format!("Kafka from {}", db::KAFKA_BROKERS_ENV)
    } else if broker_kind() == BrokerKind::Tansu {
        "tansu broker (one per test)".to_owned()
    } else if db::docker_engine_answers() {
        "Kafka in a testcontainers container".to_owned()
    } else {
        "mock Kafka broker".to_owned()
    }
}

pub struct Kafka {
    /// Declared before `mock_owner`: dropped before the client it borrows.
    pub cluster: Option<MockCluster<'static, DefaultProducerContext>>,
    /// The client that owns the mock cluster of [`Kafka::start`] (the
    /// cluster is borrowed from it; see [`mock_without_join_delay`]).
    pub mock_owner: Option<Box<Client<DefaultProducerContext>>>,
    /// The test's own tansu process when the run is on tansu.
    pub tansu: Option<Tansu>,
    pub brokers: String,
}

/// A one-broker mock cluster whose `group.initial.rebalance.delay.ms` is
/// 0 (the mock, like Apache Kafka, waits 3 s by default before it assigns
/// the first member of an empty group; a broker setting, not a client's,
/// so the sidecar's join is the same, only sooner). The cluster is created
/// by a client configured with `test.mock.num.brokers` (librdkafka's way
/// of reaching the cluster's handle to set it) and borrowed from it.
fn mock_without_join_delay() -> Kafka {
    let mut config = ClientConfig::new();
    config.set("test.mock.num.brokers", "1");
    let native = config
        .create_native_config()
        .expect("mock cluster client config");
    let owner = Box::new(
        Client::new(
            &config,
            native,
            RDKafkaType::RD_KAFKA_PRODUCER,
            DefaultProducerContext,
        )
        .expect("start librdkafka's mock cluster"),
    );
    // SAFETY: the handle belongs to `owner`, alive for this call.
    unsafe {
        let handle = rdkafka::bindings::rd_kafka_handle_mock_cluster(owner.native_ptr());
        assert!(!handle.is_null(), "the client has no mock cluster");
        rdkafka::bindings::rd_kafka_mock_group_initial_rebalance_delay_ms(handle, 0);
    }
    let cluster = owner.mock_cluster().expect("the client's mock cluster");
    // SAFETY: the cluster borrows the boxed client, which does not move
    // and is dropped after it (field order of `Kafka`; `TestApp`'s drop
    // forgets both together).
    let cluster: MockCluster<'static, DefaultProducerContext> =
        unsafe { std::mem::transmute(cluster) };
    let brokers = cluster.bootstrap_servers();
    Kafka {
        cluster: Some(cluster),
        mock_owner: Some(owner),
        tansu: None,
        brokers,
    }
}

pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        chrono::Utc::now().timestamp_micros() % 1_000_000_000
    )
}

impl Kafka {
    pub fn start() -> Kafka {
        let external = |brokers: String| Kafka {
            cluster: None,
            mock_owner: None,
            tansu: None,
            brokers,
        };
        if let Ok(brokers) = std::env::var(db::KAFKA_BROKERS_ENV) {
            db::source(db::KAFKA_BROKERS_ENV);
            return external(brokers);
        }
        if broker_kind() == BrokerKind::Tansu {
            db::source(db::KAFKA_BROKERS_ENV);
            let tansu = Tansu::start();
            return Kafka {
                cluster: None,
                mock_owner: None,
                brokers: tansu.bootstrap(),
                tansu: Some(tansu),
            };
        }
        match db::source(db::KAFKA_BROKERS_ENV) {
            Source::Env => unreachable!("handled above"),
            Source::Container => return external(db::kafka_container().to_owned()),
            Source::Local => {}
        }
        mock_without_join_delay()
    }

    /// A `Kafka` on a mock cluster the caller built.
    pub fn mock(cluster: MockCluster<'static, DefaultProducerContext>) -> Kafka {
        let brokers = cluster.bootstrap_servers();
        Kafka {
            cluster: Some(cluster),
            mock_owner: None,
            tansu: None,
            brokers,
        }
    }

    /// The test's tansu; panics on another broker (check [`on_tansu`]).
    pub fn tansu(&mut self) -> &mut Tansu {
        self.tansu.as_mut().expect("the run's broker is tansu")
    }

    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        match &self.cluster {
            Some(c) => c.create_topic(topic, partitions, 1).expect("create topic"),
            None => {
                let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
                    .set("bootstrap.servers", &self.brokers)
                    .create()
                    .expect("admin client");
                let t = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
                let got = admin
                    .create_topics([&t], &AdminOptions::new())
                    .await
                    .expect("create topic");
                for r in got {
                    if let Err((name, e)) = r {
                        panic!("create topic {name}: {e}");
                    }
                }
            }
        }
    }

    /// Deletes `topic` (DeleteTopics, as an operator or a recreated
    /// connector's cleanup would).
    pub async fn delete_topic(&self, topic: &str) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .create()
            .expect("admin client");
        let got = admin
            .delete_topics(&[topic], &AdminOptions::new())
            .await
            .expect("delete topic");
        for r in got {
            if let Err((name, e)) = r {
                panic!("delete topic {name}: {e}");
            }
        }
    }

    /// Whether the broker's metadata has `topic` (without creating it).
    pub fn topic_exists(&self, topic: &str) -> bool {
        let client: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("allow.auto.create.topics", "false")
            .create()
            .expect("metadata client");
        client
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .map(|m| m.topics().first().is_some_and(|t| t.error().is_none()))
            .unwrap_or(false)
    }

    /// The group's committed offsets (next offset to read) per partition;
    /// -1 where nothing is committed.
    pub fn committed(&self, group: &str, topic: &str, partitions: i32) -> Vec<i64> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", group)
            .create()
            .expect("offsets reader");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(topic, p);
        }
        let got = consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .expect("committed offsets");
        (0..partitions)
            .map(|p| match got.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => -1,
            })
            .collect()
    }

    /// The oldest offset `partition` still holds (ListOffsets earliest).
    pub fn log_start(&self, topic: &str, partition: i32) -> i64 {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .create()
            .expect("watermark reader");
        consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(10))
            .expect("watermarks")
            .0
    }

    /// High watermarks (one past the last message) per partition.
    pub fn end_offsets(&self, topic: &str, partitions: i32) -> Vec<i64> {
        high_watermarks(&self.brokers, topic, partitions)
    }
}

/// High watermarks (one past the last message) of `topic`'s partitions.
///
/// tansu answers ListOffsets(latest) with the base offset of the newest
/// record batch plus one, not the end of the log (docs/brokers.md): there
/// the high watermark is read from a Fetch response instead.
pub fn high_watermarks(brokers: &str, topic: &str, partitions: i32) -> Vec<i64> {
    if on_tansu() {
        return fetched_high_watermarks(brokers, topic, partitions);
    }
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("watermark reader");
    (0..partitions)
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .expect("watermarks")
                .1
        })
        .collect()
}

/// The high watermarks the first Fetch response of each partition carries
/// (librdkafka caches them; rust-rdkafka has no safe call for the cache).
fn fetched_high_watermarks(brokers: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique("watermarks"))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        .create()
        .expect("watermark reader");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("partition");
    }
    consumer.assign(&tpl).expect("assign");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let _ = consumer.poll(Duration::from_millis(20));
        let highs: Vec<i64> = (0..partitions)
            .map(|p| {
                let (mut low, mut high) = (-1i64, -1i64);
                let name = std::ffi::CString::new(topic).expect("topic name");
                // SAFETY: the client outlives the call; librdkafka only
                // reads its cached watermarks into the two locals.
                let err = unsafe {
                    rdkafka::bindings::rd_kafka_get_watermark_offsets(
                        consumer.client().native_ptr(),
                        name.as_ptr(),
                        p,
                        &mut low,
                        &mut high,
                    )
                };
                if err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    high
                } else {
                    -1
                }
            })
            .collect();
        if highs.iter().all(|h| *h >= 0) {
            return highs;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no Fetch response for every partition of {topic} within 10s: {highs:?}"
        );
    }
}
