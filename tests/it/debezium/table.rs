//! R-004's decision table end to end through real Debezium, with the real
//! 5 s retry delay, resends through the CLI and the admin API; and the
//! connector's initial snapshot of rows that existed before it started.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use entity::Status;
use serde_json::json;
use wiremock::ResponseTemplate;

use super::{prepare, T};
use crate::harness::{eventually, Options, Receiver};

fn mode(r: &crate::harness::receiver::Received) -> String {
    serde_json::from_slice::<serde_json::Value>(&r.body).unwrap_or_default()["mode"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real Debezium: make test-debezium"]
async fn debezium_decision_table_with_the_real_5s_delay_and_both_resends() {
    let accept_all = Arc::new(AtomicBool::new(false));
    let receiver = {
        let accept_all = accept_all.clone();
        Receiver::start(move |r| match mode(r).as_str() {
            "fail_twice" if r.nth < 2 => {
                ResponseTemplate::new(503).set_body_string("upstream unavailable")
            }
            "always_4xx" if !accept_all.load(Ordering::SeqCst) => {
                ResponseTemplate::new(422).set_body_string(r#"{"error":"company_not_found"}"#)
            }
            _ => ResponseTemplate::new(201),
        })
        .await
    };
    let opts = Options {
        retry_delay: "5s",
        ..Options::default()
    };
    let mut d = prepare(opts, receiver).await;
    let started = d.start_debezium(None).await;
    println!("debezium decision table: connector streaming {started:?} after start");
    d.t.start().await;
    let t0 = Instant::now();
    let accepted =
        d.t.insert("accounts.purchase_create", json!({"mode": "accept"}))
            .await;
    let twice =
        d.t.insert("accounts.installment_paid", json!({"mode": "fail_twice"}))
            .await;
    let cli =
        d.t.insert(
            "accounts.installment_overdue",
            json!({"mode": "always_4xx"}),
        )
        .await;
    let admin =
        d.t.insert("accounts.purchase_create", json!({"mode": "always_4xx"}))
            .await;
    let nobody =
        d.t.insert("billing.invoice_issued", json!({"mode": "accept"}))
            .await;

    let row = d.t.wait_status(accepted, Status::Sent, T).await;
    assert_eq!((row.attempts, row.last_error), (0, None));
    println!(
        "debezium decision table: insert → sent in {:?}",
        t0.elapsed()
    );
    for id in [cli, admin] {
        let row = d.t.wait_status(id, Status::Failed, T).await;
        assert_eq!(row.attempts, 3);
        assert_eq!(
            row.last_error.as_deref(),
            Some(r#"HTTP 422: {"error":"company_not_found"}"#)
        );
    }
    let row = d.t.wait_status(nobody, Status::Failed, T).await;
    assert_eq!(row.attempts, 3);
    assert_eq!(
        row.last_error.as_deref(),
        Some(r#"no dispatcher registered for event_name "billing.invoice_issued""#)
    );
    let row = d.t.wait_status(twice, Status::Sent, T).await;
    assert_eq!(row.attempts, 2);
    assert_eq!(
        row.last_error.as_deref(),
        Some("HTTP 503: upstream unavailable")
    );
    for id in [twice, cli, admin] {
        let reqs = d.t.receiver.for_id(id);
        assert_eq!(
            reqs.iter().map(|r| r.attempt).collect::<Vec<_>>(),
            vec![1, 2, 3],
            "event {id}"
        );
        for pair in reqs.windows(2) {
            let gap = (pair[1].at - pair[0].at).to_std().unwrap();
            assert!(gap >= Duration::from_secs(5), "event {id}: {gap:?} apart");
        }
    }

    // The receiver accepts now; an operator resends one row through the
    // CLI and one through the admin API. The resend's UPDATE reaches the
    // sidecar through Debezium.
    accept_all.store(true, Ordering::SeqCst);
    let out = crate::cli::bin()
        .env("OUTBOX__DATABASE__URL", &d.t.db.url)
        .args(["events", "retry", &cli.to_string()])
        .output()
        .expect("run the CLI");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resp = reqwest::Client::new()
        .post(d.t.api_url(&format!("/admin/events/{admin}/retry")))
        .bearer_auth("test-admin-token-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    for id in [cli, admin] {
        let row = d.t.wait_status(id, Status::Sent, T).await;
        assert_eq!((row.attempts, row.last_error), (0, None), "event {id}");
        assert_eq!(
            d.t.receiver
                .for_id(id)
                .iter()
                .map(|r| r.attempt)
                .collect::<Vec<_>>(),
            vec![1, 2, 3, 1],
            "event {id}: the resend starts over at attempt 1"
        );
    }
    d.t.wait_all_committed(&d.t.group, T).await;
    assert_eq!(d.t.receiver.for_id(accepted).len(), 1);
    assert!(d.t.receiver.for_id(nobody).is_empty());
    let recs = d.records();
    println!(
        "debezium decision table: all rows as R-004 says in {:?}; {} change events on the topic",
        t0.elapsed(),
        recs.len()
    );
    d.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real Debezium: make test-debezium"]
async fn debezium_initial_snapshot_dispatches_the_rows_already_pending() {
    let opts = Options {
        retry_delay: "2s",
        ..Options::default()
    };
    let mut d = prepare(opts, Receiver::accepting().await).await;
    // Rows written before the connector ever ran.
    let mut pending = Vec::new();
    for i in 0..5 {
        pending.push(
            d.t.insert("accounts.purchase_create", json!({"n": i}))
                .await,
        );
    }
    let waiting =
        d.t.insert("accounts.installment_paid", json!({"n": "waiting"}))
            .await;
    let sent =
        d.t.insert("accounts.installment_paid", json!({"n": "sent"}))
            .await;
    let failed =
        d.t.insert("accounts.installment_overdue", json!({"n": "failed"}))
            .await;
    d.sql(&format!(
        "UPDATE outbox_events SET attempts = 1, last_error = 'HTTP 503', updated_at = now() AT TIME ZONE 'UTC' WHERE id = {waiting};
         UPDATE outbox_events SET status = 'sent', sent_at = now() AT TIME ZONE 'UTC' WHERE id = {sent};
         UPDATE outbox_events SET status = 'failed', attempts = 3, last_error = 'HTTP 500' WHERE id = {failed};"
    ))
    .await;
    let waiting_row = d.t.row(waiting).await;
    d.t.start().await;
    d.start_debezium(None).await;
    for id in &pending {
        let row = d.t.wait_status(*id, Status::Sent, T).await;
        assert_eq!(row.attempts, 0);
    }
    let row = d.t.wait_status(waiting, Status::Sent, T).await;
    assert_eq!(row.attempts, 1);
    let reqs = d.t.receiver.for_id(waiting);
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].attempt, 2);
    let due = waiting_row.updated_at + chrono::Duration::seconds(2);
    assert!(
        reqs[0].at >= due,
        "the row that had failed once was retried at {}, before updated_at + retry_delay = {due}",
        reqs[0].at
    );
    d.t.wait_all_committed(&d.t.group, T).await;
    assert!(d.t.receiver.for_id(sent).is_empty());
    assert!(d.t.receiver.for_id(failed).is_empty());
    assert_eq!(d.t.row(failed).await.status, Status::Failed);
    let recs = d.records();
    let reads = recs.iter().filter(|r| r.value_json()["op"] == "r").count();
    assert_eq!(reads, 8, "one snapshot read per existing row");
    eventually("nothing more to send", T, || async {
        (d.t.receiver.requests().len() == 6).then_some(())
    })
    .await;
    println!(
        "debezium snapshot: {reads} rows read by the snapshot, 6 pending dispatched, sent/failed untouched"
    );
    d.finish().await;
}
