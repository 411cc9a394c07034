//! A stand-in for Debezium: every write to the table — the test's and the
//! sidecar's own — becomes the change event Debezium's PostgreSQL connector
//! would publish (envelope format, JsonConverter without schemas, key
//! `{"id": N}`), in commit order. A trigger NOTIFYs each row change; this
//! task LISTENs and produces to the topic.

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
    task: JoinHandle<()>,
}

fn micros(v: &Value) -> Value {
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
            "version": "2.7.3.Final", "connector": "postgresql", "name": "app",
            "ts_ms": now, "snapshot": "false", "db": "test", "schema": "public",
            "table": table, "txId": 1, "lsn": 1
        },
        "op": op,
        "ts_ms": now,
        "transaction": null
    })
}

impl ChangeFeed {
    pub async fn start(db_url: &str, brokers: &str, topic: &str) -> ChangeFeed {
        let db = sea_orm::Database::connect(db_url)
            .await
            .expect("feed: connect");
        db.execute_unprepared(&format!(
            r#"
CREATE OR REPLACE FUNCTION outbox_cdc_notify() RETURNS trigger AS $$
DECLARE
  b jsonb; a jsonb;
BEGIN
  IF TG_OP <> 'INSERT' THEN
    b := to_jsonb(OLD) - 'payload' || jsonb_build_object('payload',
      CASE WHEN octet_length(OLD.payload::text) < 4000 THEN OLD.payload::text ELSE '__debezium_unavailable_value' END);
  END IF;
  IF TG_OP <> 'DELETE' THEN
    a := to_jsonb(NEW) - 'payload' || jsonb_build_object('payload',
      CASE WHEN octet_length(NEW.payload::text) < 4000 THEN NEW.payload::text ELSE '__debezium_unavailable_value' END);
  END IF;
  PERFORM pg_notify('{CHANNEL}', jsonb_build_object('op', TG_OP, 'before', b, 'after', a)::text);
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
        let task = {
            let producer = producer.clone();
            let topic = topic.to_owned();
            let published = published.clone();
            tokio::spawn(async move {
                while let Ok(n) = listener.recv().await {
                    let Ok(change) = serde_json::from_str::<Value>(n.payload()) else {
                        continue;
                    };
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
                    send(&producer, &topic, id, Some(&value)).await;
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
            task,
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
        send(&self.producer, &self.topic, row.id, Some(&value)).await;
    }

    pub fn published(&self) -> Vec<Published> {
        self.published.lock().unwrap().clone()
    }
}

async fn send(producer: &FutureProducer, topic: &str, id: i64, value: Option<&Value>) {
    let key = json!({ "id": id }).to_string();
    let value = value.map(|v| v.to_string());
    let mut record = FutureRecord::to(topic).key(&key);
    if let Some(v) = &value {
        record = record.payload(v);
    }
    if let Err((e, _)) = producer.send(record, Duration::from_secs(10)).await {
        panic!("feed: produce: {e}");
    }
}

impl Drop for ChangeFeed {
    fn drop(&mut self) {
        self.task.abort();
    }
}
