//! Helpers for tests that run the binary as a child process and then read
//! back what it committed.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde_json::Value;

/// A port free right now, for a child's `admin.listen`.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The ids of the insert events below offset `committed` in `partition`.
pub fn inserts_below(brokers: &str, topic: &str, partition: i32, committed: i64) -> Vec<i64> {
    if committed <= 0 {
        return Vec::new();
    }
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", super::unique("reader"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut ids = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut next = 0;
    while next < committed && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            next = m.offset() + 1;
            let v: Value =
                serde_json::from_slice(m.payload().unwrap_or(b"null")).unwrap_or_default();
            if v["op"] == "c" && m.offset() < committed {
                ids.push(v["after"]["id"].as_i64().unwrap());
            }
        }
    }
    assert!(next >= committed, "could not read up to offset {committed}");
    ids
}
