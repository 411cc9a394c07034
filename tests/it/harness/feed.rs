//! A stand-in for Debezium: every write to the table — the test's and the
//! sidecar's own — becomes the change event Debezium's PostgreSQL connector
//! would publish (envelope format, JsonConverter without schemas, key
//! `{"id": N}`, or `{"aggregate_key": …}` when the table has that column,
//! as `message.key.columns` keys it), in commit order. A trigger NOTIFYs each row change; this
//! task LISTENs and produces to the topic.
//!
//! It follows what real Debezium 3.6 emits with the shipped connector
//! configuration (captured by `tests/debezium/bridge.py`, see
//! `tests/fixtures/cdc/*_real_*.json`): `payload` is the jsonb text
//! PostgreSQL normalises (`{"a": 1}`); under `REPLICA IDENTITY DEFAULT` an
//! update has `before: null`, a delete's `before` holds the key plus each
//! NOT NULL column's type default (`"event_name": ""`, `"payload": ""`,
//! `"status": "pending"`, `"attempts": 0`, timestamps `0`), and an update
//! that leaves a payload stored out of line unchanged carries
//! `"__debezium_unavailable_value"`; under `FULL` both sides are complete
//! rows. TRUNCATE is not emitted (`skipped.operations` defaults to `t`) and
//! heartbeats go to their own topic, so neither reaches the table's topic.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::NaiveDateTime;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use sea_orm::sqlx::postgres::PgListener;
use sea_orm::ConnectionTrait;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

const CHANNEL: &str = "outbox_cdc";

/// One published change event, for the checks.
#[derive(Debug, Clone)]
pub struct Published {
    pub id: i64,
    pub op: String,
    pub status: Option<String>,
    pub attempts: Option<i64>,
}

pub struct ChangeFeed {
    pub topic: String,
    producer: FutureProducer,
    pub published: Arc<Mutex<Vec<Published>>>,
    /// The partition each id's change events went to (keyed by id, so one).
    partitions: Arc<Mutex<HashMap<i64, i32>>>,
    task: JoinHandle<()>,
}

fn micros(v: &Value) -> Value {
    if v.is_number() {
        return v.clone();
    }
    match v.as_str() {
        Some(s) => NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f")
            .map(|t| json!(t.and_utc().timestamp_micros()))
            .unwrap_or(Value::Null),
        None => Value::Null,
    }
}

/// A row from the trigger (to_jsonb) as Debezium renders it.
fn debezium_row(row: &Value) -> Value {
    if row.is_null() {
        return Value::Null;
    }
    let mut out = row.clone();
    for col in ["sent_at", "created_at", "updated_at"] {
        out[col] = micros(&row[col]);
    }
    out
}

pub fn envelope(op: &str, before: &Value, after: &Value, table: &str) -> Value {
    let now = chrono::Utc::now().timestamp_millis();
    json!({
        "before": debezium_row(before),
        "after": debezium_row(after),
        "source": {
            "version": "3.6.3.Final", "connector": "postgresql", "name": "app",
            "ts_ms": now, "snapshot": "false", "db": "test",
            "sequence": "[null,\"1\"]", "ts_us": now * 1000, "ts_ns": now * 1_000_000,
            "schema": "public", "table": table, "txId": 1, "lsn": 1,
            "xmin": null, "origin": null, "origin_lsn": null
        },
        "transaction": null,
        "op": op,
        "ts_ms": now,
        "ts_us": now * 1000,
        "ts_ns": now * 1_000_000
    })
}

impl ChangeFeed {
    pub async fn start(db_url: &str, brokers: &str, topic: &str) -> ChangeFeed {
        let db = sea_orm::Database::connect(db_url)
            .await
            .expect("feed: connect");
        db.execute_unprepared(&format!(
            r#"
CREATE TABLE IF NOT EXISTS outbox_cdc_spill (seq bigserial PRIMARY KEY, change text NOT NULL);
CREATE OR REPLACE FUNCTION outbox_cdc_notify() RETURNS trigger AS $$
DECLARE
  b jsonb; a jsonb; change text; spilled bigint;
  full_identity boolean := (SELECT relreplident = 'f' FROM pg_class WHERE oid = TG_RELID);
BEGIN
  -- before: the whole old row under REPLICA IDENTITY FULL; under DEFAULT,
  -- null for an update and, for a delete, the key plus type defaults.
  IF TG_OP <> 'INSERT' AND full_identity THEN
    b := to_jsonb(OLD) - 'payload' || jsonb_build_object('payload', OLD.payload::text);
  ELSIF TG_OP = 'DELETE' THEN
    b := jsonb_build_object('id', OLD.id, 'event_name', '', 'payload', '', 'status', 'pending',
      'attempts', 0, 'last_error', null, 'sent_at', null, 'created_at', 0, 'updated_at', 0);
  END IF;
  -- after: an update under DEFAULT that leaves a payload stored out of line
  -- (past ~2 kB compressed) unchanged does not carry it.
  IF TG_OP <> 'DELETE' THEN
    a := to_jsonb(NEW) - 'payload' || jsonb_build_object('payload',
      CASE WHEN TG_OP = 'UPDATE' AND NOT full_identity AND OLD.payload::text = NEW.payload::text
                AND pg_column_size(NEW.payload) >= 2000
           THEN '__debezium_unavailable_value' ELSE NEW.payload::text END);
  END IF;
  -- Where the stand-in departs from Debezium: a payload past ~900 kB would
  -- make a record larger than Kafka's default 1 MB limit, which Debezium's
  -- producer cannot publish at all; the stand-in publishes the record with
  -- the placeholder instead (the sidecar reads the payload from the row).
  IF octet_length(a->>'payload') > 900000 THEN
    a := a || jsonb_build_object('payload', '__debezium_unavailable_value');
  END IF;
  IF octet_length(b->>'payload') > 900000 THEN
    b := b || jsonb_build_object('payload', '__debezium_unavailable_value');
  END IF;
  change := jsonb_build_object('op', TG_OP, 'before', b, 'after', a)::text;
  -- NOTIFY carries at most 8000 bytes: a larger change waits in a side table.
  IF octet_length(change) > 7000 THEN
    INSERT INTO outbox_cdc_spill (change) VALUES (change) RETURNING seq INTO spilled;
    change := jsonb_build_object('spill', spilled)::text;
  END IF;
  PERFORM pg_notify('{CHANNEL}', change);
  RETURN NULL;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS outbox_cdc ON outbox_events;
CREATE TRIGGER outbox_cdc AFTER INSERT OR UPDATE OR DELETE ON outbox_events
  FOR EACH ROW EXECUTE FUNCTION outbox_cdc_notify();
"#
        ))
        .await
        .expect("feed: install trigger");
        let mut listener = PgListener::connect(db_url).await.expect("feed: listener");
        listener.listen(CHANNEL).await.expect("feed: listen");
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("linger.ms", "0")
            .create()
            .expect("feed: producer");
        let published = Arc::new(Mutex::new(Vec::new()));
        let partitions = Arc::new(Mutex::new(HashMap::new()));
        let task = {
            let producer = producer.clone();
            let topic = topic.to_owned();
            let published = published.clone();
            let partitions = partitions.clone();
            tokio::spawn(async move {
                while let Ok(n) = listener.recv().await {
                    let Ok(mut change) = serde_json::from_str::<Value>(n.payload()) else {
                        continue;
                    };
                    if let Some(seq) = change["spill"].as_i64() {
                        change = unspill(&db, seq).await;
                    }
                    let op = match change["op"].as_str() {
                        Some("INSERT") => "c",
                        Some("UPDATE") => "u",
                        _ => "d",
                    };
                    let row = if op == "d" {
                        &change["before"]
                    } else {
                        &change["after"]
                    };
                    let id = row["id"].as_i64().unwrap_or_default();
                    let value = envelope(op, &change["before"], &change["after"], "outbox_events");
                    let partition = send(&producer, &topic, id, Some(&value)).await;
                    partitions.lock().unwrap().insert(id, partition);
                    published.lock().unwrap().push(Published {
                        id,
                        op: op.to_owned(),
                        status: row["status"].as_str().map(str::to_owned),
                        attempts: row["attempts"].as_i64(),
                    });
                }
            })
        };
        ChangeFeed {
            topic: topic.to_owned(),
            producer,
            published,
            partitions,
            task,
        }
    }

    /// A feed that publishes nothing by itself, for tests whose change
    /// events come from elsewhere (real Debezium): `publish_raw` works, and
    /// `published` is whatever the test records there.
    pub async fn detached(brokers: &str, topic: &str) -> ChangeFeed {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("linger.ms", "0")
            .create()
            .expect("feed: producer");
        ChangeFeed {
            topic: topic.to_owned(),
            producer,
            published: Arc::new(Mutex::new(Vec::new())),
            partitions: Arc::default(),
            task: tokio::spawn(async {}),
        }
    }

    /// Publishes an arbitrary record (poison messages, duplicates).
    pub async fn publish_raw(&self, key: Option<&[u8]>, value: Option<&[u8]>) {
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&self.topic);
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(v) = value {
            record = record.payload(v);
        }
        self.producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .expect("produce");
    }

    /// Publishes the change event for `row` again, as a replay would.
    pub async fn republish(&self, row: &entity::OutboxEventRow) {
        let as_trigger = json!({
            "id": row.id, "event_name": row.event_name, "payload": row.payload.to_string(),
            "status": row.status.as_str(), "attempts": row.attempts, "last_error": row.last_error,
            "sent_at": row.sent_at.map(|t| t.format("%Y-%m-%dT%H:%M:%S%.f").to_string()),
            "created_at": row.created_at.format("%Y-%m-%dT%H:%M:%S%.f").to_string(),
            "updated_at": row.updated_at.format("%Y-%m-%dT%H:%M:%S%.f").to_string(),
        });
        let value = envelope("u", &Value::Null, &as_trigger, "outbox_events");
        let partition = send(&self.producer, &self.topic, row.id, Some(&value)).await;
        self.partitions.lock().unwrap().insert(row.id, partition);
    }

    pub fn published(&self) -> Vec<Published> {
        self.published.lock().unwrap().clone()
    }

    /// The partition the change events of row `id` went to, once published.
    #[allow(dead_code)]
    pub fn partition_of(&self, id: i64) -> Option<i32> {
        self.partitions.lock().unwrap().get(&id).copied()
    }
}

/// A change too large for NOTIFY, from the side table (its transaction
/// committed before the notification was delivered).
async fn unspill(db: &sea_orm::DatabaseConnection, seq: i64) -> Value {
    use sea_orm::{DbBackend, Statement};
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            format!("DELETE FROM outbox_cdc_spill WHERE seq = {seq} RETURNING change"),
        ))
        .await
        .expect("feed: read a spilled change")
        .expect("feed: the spilled change exists");
    let text: String = row.try_get("", "change").expect("feed: change text");
    serde_json::from_str(&text).expect("feed: spilled change is JSON")
}

/// Produces one change event keyed by `id`; returns its partition.
async fn send(producer: &FutureProducer, topic: &str, id: i64, value: Option<&Value>) -> i32 {
    // A table with an `aggregate_key` column is keyed by it, as the
    // ordered connector configuration (`message.key.columns`) keys it.
    let row = value.map(|v| {
        if v["op"] == "d" {
            &v["before"]
        } else {
            &v["after"]
        }
    });
    let key = match row.and_then(|r| r.get("aggregate_key")) {
        Some(aggregate) => json!({ "aggregate_key": aggregate }).to_string(),
        None => json!({ "id": id }).to_string(),
    };
    let value = value.map(|v| v.to_string());
    let mut record = FutureRecord::to(topic).key(&key);
    if let Some(v) = &value {
        record = record.payload(v);
    }
    match producer.send(record, Duration::from_secs(10)).await {
        Ok(delivery) => delivery.partition,
        Err((e, _)) => panic!("feed: produce: {e}"),
    }
}

impl Drop for ChangeFeed {
    fn drop(&mut self) {
        self.task.abort();
    }
}
