//! The Kafka side of the tests: the broker named by
//! `OUTBOX_TEST_KAFKA_BROKERS`, else a shared testcontainers broker when a
//! Docker engine answers, else librdkafka's mock cluster (real Kafka protocol
//! over TCP) — the order of `crate::db::source` — and a reader of a group's
//! committed offsets.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::db::{self, Source};

pub struct Kafka {
    pub cluster: Option<MockCluster<'static, DefaultProducerContext>>,
    pub brokers: String,
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
            brokers,
        };
        match db::source(db::KAFKA_BROKERS_ENV) {
            Source::Env => {
                return external(std::env::var(db::KAFKA_BROKERS_ENV).unwrap_or_default())
            }
            Source::Container => return external(db::kafka_container().to_owned()),
            Source::Local => {}
        }
        let cluster = MockCluster::new(1).expect("start librdkafka's mock cluster");
        let brokers = cluster.bootstrap_servers();
        Kafka {
            cluster: Some(cluster),
            brokers,
        }
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
                admin
                    .create_topics([&t], &AdminOptions::new())
                    .await
                    .expect("create topic");
            }
        }
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

    /// High watermarks (one past the last message) per partition.
    pub fn end_offsets(&self, topic: &str, partitions: i32) -> Vec<i64> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
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
}
