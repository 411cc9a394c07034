//! The shapes real Debezium gives the sidecar: a TOASTed payload under
//! `REPLICA IDENTITY DEFAULT` (updates carry `__debezium_unavailable_value`,
//! deletes the key plus type defaults) and `FULL` (the shipped
//! `replica-identity.sql`); and the `ExtractNewRecordState` variant
//! documented in `deploy/README.md`, next to the bare transform.

use entity::Status;
use serde_json::{json, Value};
use wiremock::ResponseTemplate;

use super::{big_payload, metric, prepare, Dbz, T};
use crate::harness::{Options, Receiver};

/// Fails the first request of every id with 503, then accepts.
async fn fail_once() -> Receiver {
    Receiver::start(|r| {
        if r.nth == 0 {
            ResponseTemplate::new(503)
        } else {
            ResponseTemplate::new(204)
        }
    })
    .await
}

fn payload_of(row: &Value) -> Value {
    row["payload"].clone()
}

/// Inserts the big payload, waits until it is sent after one failure, then
/// deletes it; returns the id.
async fn toast_round(d: &Dbz, payload: &Value) -> i64 {
    let id =
        d.t.insert("accounts.purchase_create", payload.clone())
            .await;
    let row = d.t.wait_status(id, Status::Sent, T).await;
    assert_eq!(row.attempts, 1);
    let reqs = d.t.receiver.for_id(id);
    assert_eq!(reqs.len(), 2, "one failure, one success");
    for r in &reqs {
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(&body, payload, "the POST carries the whole TOASTed payload");
    }
    d.sql(&format!("DELETE FROM outbox_events WHERE id = {id}"))
        .await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real Debezium: make test-debezium"]
async fn debezium_toasted_payload_with_replica_identity_default_and_full() {
    let opts = Options::default();
    let mut default = prepare(opts.clone(), fail_once().await).await;
    let mut full = prepare(opts, fail_once().await).await;
    full.replica_identity_full().await;
    // Both connectors start at once (two JVMs).
    let (a, b) = tokio::join!(default.start_debezium(None), full.start_debezium(None));
    println!("debezium toast: two connectors streaming after {a:?} / {b:?}");
    default.t.start().await;
    full.t.start().await;
    let payload = big_payload(8);
    assert!(payload.to_string().len() > 8 * 1024);
    let (id_d, id_f) = tokio::join!(
        toast_round(&default, &payload),
        toast_round(&full, &payload)
    );

    for (d, id, full_identity) in [(&default, id_d, false), (&full, id_f, true)] {
        let recs = d
            .wait_records("the delete on the topic", 1, |r| {
                r.value_json()["op"] == "d"
            })
            .await;
        let values: Vec<Value> = recs
            .iter()
            .filter(|r| r.key_id() == Some(id))
            .map(|r| r.value_json())
            .collect();
        let ops: Vec<&str> = values.iter().map(|v| v["op"].as_str().unwrap()).collect();
        // the insert, the sidecar's write-backs (the failure, the success), the delete
        assert!(
            ops.len() >= 4
                && ops[0] == "c"
                && ops[ops.len() - 1] == "d"
                && ops[1..ops.len() - 1].iter().all(|o| *o == "u"),
            "identity full={full_identity}: {ops:?}"
        );
        let inserted: Value =
            serde_json::from_str(payload_of(&values[0]["after"]).as_str().unwrap()).unwrap();
        assert_eq!(
            inserted, payload,
            "the insert carries the payload (jsonb text)"
        );
        let last = values.len() - 1;
        for u in &values[1..last] {
            let after = payload_of(&u["after"]);
            if full_identity {
                assert_ne!(after, json!("__debezium_unavailable_value"));
                assert_eq!(
                    payload_of(&u["before"]),
                    after,
                    "FULL: before is the whole row"
                );
            } else {
                assert_eq!(
                    after,
                    json!("__debezium_unavailable_value"),
                    "DEFAULT: an update that leaves the TOASTed payload alone does not carry it"
                );
                assert!(u["before"].is_null(), "DEFAULT: an update has no before");
            }
        }
        let before = &values[last]["before"];
        if full_identity {
            assert_eq!(before["status"], "sent");
            assert_ne!(payload_of(before), json!(""));
        } else {
            // The key plus each NOT NULL column's type default.
            assert_eq!(before["id"], id);
            assert_eq!(before["status"], "pending");
            assert_eq!(before["payload"], "");
            assert_eq!(before["event_name"], "");
            assert_eq!(before["attempts"], 0);
        }
        d.t.wait_all_committed(&d.t.group, T).await;
        let app = d.t.app.as_ref().unwrap();
        assert_eq!(
            metric(app, "outbox_cdc_messages_total{result=\"invalid\"}").await,
            0.0
        );
        assert_eq!(
            metric(app, "outbox_cdc_skips_total{reason=\"delete\"}").await,
            1.0,
            "the delete (its before says pending under DEFAULT) is skipped as a delete"
        );
        assert_eq!(d.t.receiver.requests().len(), 2);
    }
    println!("debezium toast: 12 KB payload sent after one retry under DEFAULT and FULL; updates under DEFAULT carried __debezium_unavailable_value");
    default.finish().await;
    full.finish().await;
}

/// The `ExtractNewRecordState` keys documented in `deploy/README.md`: the
/// JSON block that follows the line containing `ExtractNewRecordState
/// variant`.
fn documented_unwrap() -> Value {
    let readme = std::fs::read_to_string(
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/README.md"),
    )
    .unwrap();
    let after = readme
        .split_once("ExtractNewRecordState variant")
        .expect("deploy/README.md documents the ExtractNewRecordState variant")
        .1;
    let block = after
        .split_once("```json\n")
        .expect("a ```json block after it")
        .1
        .split_once("```")
        .unwrap()
        .0;
    let v: Value = serde_json::from_str(block).expect("the documented variant is JSON");
    assert_eq!(
        v["transforms.unwrap.type"], "io.debezium.transforms.ExtractNewRecordState",
        "{v}"
    );
    v
}

/// One accepted row, one refused once, one with no dispatcher, then the
/// sent rows deleted.
async fn unwrap_round(d: &Dbz) -> [i64; 3] {
    let ok =
        d.t.insert("accounts.purchase_create", json!({"n": 1}))
            .await;
    let retried =
        d.t.insert("accounts.installment_paid", json!({"n": 2}))
            .await;
    let nobody = d.t.insert("billing.invoice_issued", json!({"n": 3})).await;
    // fail_once refuses each id's first request
    let row = d.t.wait_status(ok, Status::Sent, T).await;
    assert_eq!(row.attempts, 1);
    let row = d.t.wait_status(retried, Status::Sent, T).await;
    assert_eq!(row.attempts, 1);
    let row = d.t.wait_status(nobody, Status::Failed, T).await;
    assert_eq!(row.attempts, 3);
    d.sql(&format!(
        "DELETE FROM outbox_events WHERE id IN ({ok}, {retried})"
    ))
    .await;
    [ok, retried, nobody]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real Debezium: make test-debezium"]
async fn debezium_extract_new_record_state_documented_and_bare() {
    let documented = documented_unwrap();
    let bare = json!({
        "transforms": "unwrap",
        "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState"
    });
    let mut doc = prepare(Options::default(), fail_once().await).await;
    let mut plain = prepare(Options::default(), fail_once().await).await;
    let (a, b) = tokio::join!(
        doc.start_debezium(Some(documented.clone())),
        plain.start_debezium(Some(bare))
    );
    println!("debezium unwrap: two connectors streaming after {a:?} / {b:?}");
    doc.t.start().await;
    plain.t.start().await;
    let (ids_doc, ids_plain) = tokio::join!(unwrap_round(&doc), unwrap_round(&plain));

    for (d, ids, documented) in [(&doc, ids_doc, true), (&plain, ids_plain, false)] {
        // Two deletes per database.
        let recs = if documented {
            d.wait_records("the deletes", 2, |r| r.value_json()["__deleted"] == "true")
                .await
        } else {
            d.wait_records("the deletes", 2, |r| r.value.as_deref() == Some(b"null"))
                .await
        };
        for r in &recs {
            let v = r.value_json();
            if r.value.as_deref() == Some(b"null") {
                assert!(!documented, "a bare-transform delete is the value `null`");
                continue;
            }
            assert!(
                v.get("before").is_none() && v.get("op").is_none(),
                "flattened: {v}"
            );
            assert!(v["id"].is_i64());
            if documented {
                assert!(v["__op"].is_string(), "{v}");
                if v["__deleted"] == "true" {
                    assert_eq!(v["__op"], "d");
                    // The delete's row is the key plus type defaults.
                    assert_eq!(v["status"], "pending");
                    assert_eq!(v["payload"], "");
                }
            } else {
                assert!(v.get("__op").is_none(), "{v}");
            }
        }
        d.t.wait_all_committed(&d.t.group, T).await;
        let app = d.t.app.as_ref().unwrap();
        assert_eq!(
            metric(app, "outbox_cdc_messages_total{result=\"invalid\"}").await,
            0.0,
            "documented={documented}"
        );
        let reqs = d.t.receiver.requests();
        assert_eq!(
            reqs.len(),
            4,
            "2 + 2 requests, none for the unregistered event"
        );
        assert!(d.t.receiver.for_id(ids[2]).is_empty());
        let deletes = metric(app, "outbox_cdc_skips_total{reason=\"delete\"}").await
            + metric(app, "outbox_cdc_skips_total{reason=\"tombstone\"}").await;
        assert_eq!(deletes, 2.0, "documented={documented}");
    }
    println!("debezium unwrap: documented variant ({} keys) and bare transform delivered the table; deletes skipped (__deleted / `null`)", documented.as_object().unwrap().len());
    doc.finish().await;
    plain.finish().await;
}

/// `before`, `after` and `op` of every record of `recs`, per id in topic
/// order (one id's records share a partition).
fn rows_by_id(recs: &[super::bridge::Rec]) -> std::collections::BTreeMap<i64, Vec<Value>> {
    let mut out: std::collections::BTreeMap<i64, Vec<Value>> = Default::default();
    for r in recs {
        let v = r.value_json();
        let id = r.key_id().expect("a key with the id");
        out.entry(id)
            .or_default()
            .push(json!({"op": v["op"], "before": v["before"], "after": v["after"]}));
    }
    out
}

/// The same writes through real Debezium and through the stand-in
/// (`harness::feed`): the records must say the same thing, column by
/// column (`source` and the `ts_*` fields aside).
async fn same_writes(d: &Dbz, standin_topic: &str) {
    let big = big_payload(1);
    let big2 = big_payload(2);
    // ~3 KB that compresses well: stored inline, so carried by every update.
    let compressible = json!({"event_type": "purchase_create", "text": "abc".repeat(1000)});
    let a =
        d.t.insert(
            "accounts.purchase_create",
            json!({"z": 1, "a": [1, 2], "m": {"k": null}}),
        )
        .await;
    let b = d.t.insert("accounts.installment_paid", big.clone()).await;
    let c =
        d.t.insert("accounts.installment_overdue", compressible)
            .await;
    d.sql(&format!(
        "UPDATE outbox_events SET status = 'sent', sent_at = updated_at WHERE id = {a};
         UPDATE outbox_events SET attempts = 1, last_error = 'HTTP 503' WHERE id IN ({b}, {c});
         UPDATE outbox_events SET payload = '{big2}'::jsonb WHERE id = {b};
         DELETE FROM outbox_events;"
    ))
    .await;
    let ops = 10; // a: c u d; b: c u u d; c: c u d
    let real = d.wait_records("Debezium's records", ops, |_| true).await;
    let standin = crate::harness::eventually("the stand-in's records", T, || async {
        let recs = super::bridge::read_topic(&d.t.kafka.brokers, standin_topic, 1);
        (recs.len() >= ops).then_some(recs)
    })
    .await;
    let (real, standin) = (rows_by_id(&real), rows_by_id(&standin));
    assert_eq!(real.keys().collect::<Vec<_>>(), vec![&a, &b, &c]);
    for (id, want) in &real {
        let got = &standin[id];
        assert_eq!(
            got.len(),
            want.len(),
            "event {id}: Debezium {want:#?}\nstand-in {got:#?}"
        );
        for (n, (w, g)) in want.iter().zip(got).enumerate() {
            assert_eq!(g, w, "event {id}, record {n}: stand-in vs Debezium");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real Debezium: make test-debezium"]
async fn debezium_and_the_stand_in_publish_the_same_rows() {
    let mut default = prepare(Options::default(), Receiver::accepting().await).await;
    let mut full = prepare(Options::default(), Receiver::accepting().await).await;
    full.replica_identity_full().await;
    let (a, b) = tokio::join!(default.start_debezium(None), full.start_debezium(None));
    println!("debezium vs stand-in: two connectors streaming after {a:?} / {b:?}");
    let mut feeds = Vec::new();
    for d in [&default, &full] {
        let topic = crate::harness::unique("standin");
        d.t.kafka.create_topic(&topic, 1).await;
        let feed = crate::harness::ChangeFeed::start(&d.t.db.url, &d.t.kafka.brokers, &topic).await;
        feeds.push((topic, feed));
    }
    tokio::join!(
        same_writes(&default, &feeds[0].0),
        same_writes(&full, &feeds[1].0)
    );
    println!("debezium vs stand-in: same before/after/op for inserts, updates (TOASTed or not) and deletes under DEFAULT and FULL");
    drop(feeds);
    default.finish().await;
    full.finish().await;
}
