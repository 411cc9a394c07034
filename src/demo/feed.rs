//! The demo's stand-in for Debezium: it polls the table and publishes, for
//! every row that appeared or changed, the change event Debezium's connector
//! would (envelope, JsonConverter without schemas, key `{"id": N}`) — the
//! sidecar's own writes included, so echoes happen as in production.

use std::collections::HashMap;
use std::time::Duration;

use entity::OutboxEventRow;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::store::{ListFilter, Store};

/// A row change the feed saw, for the demo's narration.
#[derive(Debug, Clone)]
pub struct Change {
    pub before: Option<OutboxEventRow>,
    pub after: OutboxEventRow,
}

fn debezium_row(r: &OutboxEventRow) -> Value {
    let micros = |t: chrono::NaiveDateTime| t.and_utc().timestamp_micros();
    json!({
        "id": r.id,
        "event_name": r.event_name,
        "payload": r.payload.to_string(),
        "status": r.status.as_str(),
        "attempts": r.attempts,
        "last_error": r.last_error,
        "sent_at": r.sent_at.map(micros),
        "created_at": micros(r.created_at),
        "updated_at": micros(r.updated_at),
    })
}

pub fn envelope(before: Option<&OutboxEventRow>, after: &OutboxEventRow, table: &str) -> Value {
    let now = chrono::Utc::now().timestamp_millis();
    json!({
        "before": before.map(debezium_row),
        "after": debezium_row(after),
        "source": {"version": "2.7.3.Final", "connector": "postgresql", "name": "demo",
                   "ts_ms": now, "snapshot": "false", "db": "demo", "schema": "public", "table": table},
        "op": if before.is_some() { "u" } else { "c" },
        "ts_ms": now,
    })
}

/// Polls every `interval` until `stop`; each change is published, then
/// reported on `changes`.
pub async fn run(
    store: Store,
    producer: FutureProducer,
    topic: String,
    interval: Duration,
    changes: mpsc::UnboundedSender<Change>,
    stop: CancellationToken,
) {
    let mut seen: HashMap<i64, OutboxEventRow> = HashMap::new();
    let mut tick = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Ok(rows) = store.list(&ListFilter::default()).await else {
            continue;
        };
        for row in rows {
            let before = seen.get(&row.id);
            if before == Some(&row) {
                continue;
            }
            let value = envelope(before, &row, store.table()).to_string();
            let key = json!({"id": row.id}).to_string();
            let record = FutureRecord::to(&topic).key(&key).payload(&value);
            if let Err((e, _)) = producer.send(record, Duration::from_secs(5)).await {
                tracing::warn!(error = %e, "demo feed: cannot publish");
                continue;
            }
            let _ = changes.send(Change {
                before: before.cloned(),
                after: row.clone(),
            });
            seen.insert(row.id, row);
        }
    }
}
