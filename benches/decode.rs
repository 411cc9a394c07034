//! Measures records/s of `cdc::Decoder::decode` on a typical insert, with and without the schema wrapper.
//!
//! The target (issue: cdc decoder) is 100,000 records/s per core with the
//! wrapper and a ~1 KiB `payload` column; criterion's `thrpt` line is that
//! figure because each iteration is one record.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use outbox_sidecar::cdc::{Decision, Decoder, Record};
use serde_json::{json, Value};

/// A ~1 KiB body of the kind the accounts dispatcher sends.
fn payload_column() -> String {
    let items: Vec<Value> = (0..10)
        .map(|i| json!({"sku": format!("SKU-{i:04}"), "qty": 1 + i % 3, "price_cents": 4330 + i}))
        .collect();
    let body = json!({
        "event_type": "accounts.purchase_create",
        "data": {"purchase_id": 981_223, "account_id": 17, "amount_cents": 129_900,
                 "currency": "BRL", "installments": 6, "items": items}
    });
    serde_json::to_string(&body).unwrap_or_default()
}

fn column(kind: &str, name: &str, optional: bool, logical: Option<&str>) -> Value {
    let mut field = json!({"type": kind, "optional": optional, "field": name});
    if let (Some(logical), Some(map)) = (logical, field.as_object_mut()) {
        map.insert("name".into(), json!(logical));
        map.insert("version".into(), json!(1));
    }
    field
}

/// The schema block Debezium's PostgreSQL connector writes for `outbox_events`.
fn schema() -> Value {
    let micros = Some("io.debezium.time.MicroTimestamp");
    let row = |field: &str| {
        json!({"type": "struct", "optional": true, "field": field,
               "name": "outbox.public.outbox_events.Value", "fields": [
            column("int64", "id", false, None),
            column("string", "event_name", false, None),
            column("string", "payload", false, Some("io.debezium.data.Json")),
            column("string", "status", false, None),
            column("int32", "attempts", false, None),
            column("string", "last_error", true, None),
            column("int64", "sent_at", true, micros),
            column("int64", "created_at", false, micros),
            column("int64", "updated_at", false, micros),
        ]})
    };
    let source: Vec<Value> = [
        ("string", "version"),
        ("string", "connector"),
        ("string", "name"),
        ("int64", "ts_ms"),
        ("string", "snapshot"),
        ("string", "db"),
        ("string", "sequence"),
        ("int64", "ts_us"),
        ("int64", "ts_ns"),
        ("string", "schema"),
        ("string", "table"),
        ("int64", "txId"),
        ("int64", "lsn"),
        ("int64", "xmin"),
    ]
    .iter()
    .map(|(kind, name)| column(kind, name, true, None))
    .collect();
    json!({"type": "struct", "optional": false, "version": 2,
           "name": "outbox.public.outbox_events.Envelope", "fields": [
        row("before"),
        row("after"),
        {"type": "struct", "optional": false, "field": "source",
         "name": "io.debezium.connector.postgresql.Source", "fields": source},
        {"type": "struct", "optional": true, "field": "transaction", "name": "event.block",
         "fields": [column("string", "id", false, None),
                    column("int64", "total_order", false, None),
                    column("int64", "data_collection_order", false, None)]},
        column("string", "op", false, None),
        column("int64", "ts_ms", true, None),
        column("int64", "ts_us", true, None),
        column("int64", "ts_ns", true, None),
    ]})
}

fn insert() -> Value {
    json!({
        "before": null,
        "after": {"id": 1_000_042, "event_name": "accounts.purchase_create",
                  "payload": payload_column(), "status": "pending", "attempts": 0,
                  "last_error": null, "sent_at": null,
                  "created_at": 1_796_009_787_123_456_i64, "updated_at": 1_796_009_787_123_456_i64},
        "source": {"version": "2.7.3.Final", "connector": "postgresql", "name": "outbox",
                   "ts_ms": 1_796_009_787_200_i64, "snapshot": "false", "db": "app",
                   "sequence": "[\"24023119\",\"24023128\"]", "ts_us": 1_796_009_787_200_000_i64,
                   "ts_ns": 1_796_009_787_200_000_000_i64, "schema": "public",
                   "table": "outbox_events", "txId": 555, "lsn": 24_023_128, "xmin": null},
        "transaction": null,
        "op": "c",
        "ts_ms": 1_796_009_787_250_i64, "ts_us": 1_796_009_787_250_000_i64,
        "ts_ns": 1_796_009_787_250_000_000_i64
    })
}

fn bench_case(c: &mut Criterion, name: &str, key: &Value, value: &Value) {
    let key = serde_json::to_vec(key).unwrap_or_default();
    let value = serde_json::to_vec(value).unwrap_or_default();
    let decoder = Decoder::new("outbox_events");
    let record = Record {
        topic: "outbox.public.outbox_events",
        partition: 0,
        offset: 0,
        key: Some(&key),
        value: Some(&value),
    };
    assert!(
        matches!(decoder.decode(&record), Decision::Trigger(_)),
        "{name}: the bench record must decode to a trigger"
    );
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(1));
    group.bench_function(format!("{name} ({} B value)", value.len()), |b| {
        b.iter(|| decoder.decode(std::hint::black_box(&record)))
    });
    group.finish();
}

fn decode(c: &mut Criterion) {
    let key_schema = json!({"type": "struct", "optional": false, "name": "outbox.public.outbox_events.Key",
                            "fields": [column("int64", "id", false, None)]});
    let wrapped_key = json!({"schema": key_schema, "payload": {"id": 1_000_042}});
    let wrapped = json!({"schema": schema(), "payload": insert()});
    bench_case(c, "insert_with_schema", &wrapped_key, &wrapped);
    bench_case(
        c,
        "insert_without_schema",
        &json!({"id": 1_000_042}),
        &insert(),
    );
}

criterion_group!(benches, decode);
criterion_main!(benches);
