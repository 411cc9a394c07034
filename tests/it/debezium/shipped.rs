//! The shipped configurations end to end: the sidecar configured by the
//! shipped ConfigMap (`deploy/kubernetes/configmap.yaml`, with the static
//! member id the Deployment gives it) fed by the shipped connector. Only
//! hosts, credentials and the per-test topic and group are replaced. On
//! `make test-broker` this runs against tansu (docs/brokers.md).

use std::collections::BTreeMap;
use std::path::PathBuf;

use entity::Status;
use outbox_sidecar::config::Settings;
use serde::Deserialize;
use serde_json::json;

use super::{prepare, T};
use crate::harness::{start_with, Options, Receiver, TestApp, ACCOUNTS_EVENTS};

/// The ConfigMap's `config.toml`.
fn configmap_toml() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/configmap.yaml");
    let text = std::fs::read_to_string(&path).expect("read the shipped ConfigMap");
    let found = serde_yaml::Deserializer::from_str(&text)
        .filter_map(|doc| serde_yaml::Value::deserialize(doc).ok())
        .find(|doc| doc["kind"].as_str() == Some("ConfigMap"))
        .and_then(|cm| cm["data"]["config.toml"].as_str().map(str::to_owned));
    found.expect("a ConfigMap with data.config.toml")
}

/// The ConfigMap's settings with this test's hosts, credentials, topic
/// and group, given as the environment overrides a pod would get.
fn shipped_settings(t: &TestApp) -> Settings {
    let env: BTreeMap<String, String> = [
        ("OUTBOX__DATABASE__URL", t.db.url.clone()),
        ("OUTBOX__KAFKA__BROKERS", t.kafka.brokers.clone()),
        ("OUTBOX__KAFKA__TOPIC", t.topic.clone()),
        ("OUTBOX__KAFKA__GROUP_ID", t.group.clone()),
        // The Deployment sets it from the pod's name.
        (
            "OUTBOX__KAFKA__PROPERTIES__GROUP_INSTANCE_ID",
            "outbox-sidecar-7d9f8-x2k4q".to_owned(),
        ),
        ("OUTBOX__DISPATCHERS__ACCOUNTS__URL", t.receiver.url()),
        (
            "OUTBOX__DISPATCHERS__ACCOUNTS__HEADERS__AUTHORIZATION",
            "Bearer shipped-configmap-token".to_owned(),
        ),
        ("OUTBOX__ADMIN__LISTEN", "127.0.0.1:0".to_owned()),
        ("OUTBOX__ADMIN__API_LISTEN", "127.0.0.1:0".to_owned()),
        (
            "OUTBOX__ADMIN__TOKEN",
            "shipped-configmap-admin-token-0123".to_owned(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    Settings::from_toml(Some(&configmap_toml()), env)
        .unwrap_or_else(|e| panic!("the shipped ConfigMap with the test's hosts: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real Debezium: make test-debezium"]
async fn debezium_and_the_shipped_configmap_send_every_event_once() {
    let mut d = prepare(Options::default(), Receiver::accepting().await).await;
    d.start_debezium(None).await;
    let settings = shipped_settings(&d.t);
    assert_eq!(
        settings
            .kafka
            .properties
            .get("partition.assignment.strategy")
            .map(String::as_str),
        Some("cooperative-sticky"),
        "the ConfigMap's assignment strategy reaches the consumer"
    );
    d.t.app = Some(start_with(settings).await);
    let mut ids = Vec::new();
    for i in 0..30 {
        let name = ACCOUNTS_EVENTS[i % ACCOUNTS_EVENTS.len()];
        ids.push(d.t.insert(name, json!({"n": i})).await);
    }
    for id in &ids {
        d.t.wait_status(*id, Status::Sent, T).await;
    }
    d.t.wait_all_committed(&d.t.group, T).await;
    let reqs = d.t.receiver.requests();
    for id in &ids {
        let mine: Vec<_> = reqs.iter().filter(|r| r.id == *id).collect();
        assert_eq!(mine.len(), 1, "event {id} sent {} times", mine.len());
        assert_eq!(mine[0].path, "/api/v1/events");
        assert_eq!(
            mine[0].headers.get("authorization").map(String::as_str),
            Some("Bearer shipped-configmap-token")
        );
    }
    println!(
        "debezium with the shipped ConfigMap: {} events sent once each on {}",
        ids.len(),
        crate::harness::kafka::describe()
    );
    d.finish().await;
}
