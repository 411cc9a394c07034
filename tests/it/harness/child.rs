//! Helpers for tests that run the binary as a child process and then read
//! back what it committed.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use chrono::NaiveDateTime;
use outbox_sidecar::store::now;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde_json::Value;

use super::TestApp;

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

/// The configuration file of a sidecar run as a child process on `t`'s
/// database, topic, group and receiver.
pub fn write_config(t: &TestApp, dir: &Path) -> std::path::PathBuf {
    let path = dir.join("sidecar.toml");
    let toml = format!(
        r#"
[database]
url = "{db}"
[kafka]
brokers = "{brokers}"
topic = "{topic}"
group_id = "{group}"
[kafka.properties]
"session.timeout.ms" = "3000"
"heartbeat.interval.ms" = "300"
[dispatch]
retry_delay = "{delay}"
max_in_flight = {in_flight}
[dispatchers.accounts]
url = "{url}"
events = ["accounts.purchase_create", "accounts.installment_paid", "accounts.installment_overdue"]
timeout = "5s"
[admin]
listen = "127.0.0.1:0"
api_listen = "127.0.0.1:0"
token = "crash-admin-token-0123456789"
[shutdown]
drain_timeout = "5s"
[log]
format = "json"
level = "info"
"#,
        db = t.db.url,
        brokers = t.kafka.brokers,
        topic = t.topic,
        group = t.group,
        delay = t.opts.retry_delay,
        in_flight = t.opts.max_in_flight,
        url = t.receiver.url(),
    );
    std::fs::write(&path, toml).unwrap();
    path
}

/// A sidecar binary running as a child process; `base` is its admin URL.
pub struct Sidecar {
    pub child: Child,
    pub base: String,
}

/// Starts `outbox-sidecar run --config CONFIG`, its log appended to `log`.
pub fn spawn(config: &Path, log: &Path) -> Sidecar {
    spawn_with(config, log, &[])
}

/// [`spawn`] with more environment (e.g. `OUTBOX__ADMIN__API_LISTEN`).
pub fn spawn_with(config: &Path, log: &Path, env: &[(&str, String)]) -> Sidecar {
    let port = free_port();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let child = crate::cli::bin()
        .args(["run", "--config"])
        .arg(config)
        .env("OUTBOX__ADMIN__LISTEN", format!("127.0.0.1:{port}"))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn the sidecar");
    Sidecar {
        child,
        base: format!("http://127.0.0.1:{port}"),
    }
}

/// SIGKILL now; returns the moment the process is known dead, for the
/// checker (a request it sent just before the signal may arrive after the
/// `kill` call).
pub fn crash(mut s: Sidecar) -> NaiveDateTime {
    s.child.kill().expect("SIGKILL the sidecar");
    s.child.wait().expect("reap the killed sidecar");
    now()
}
