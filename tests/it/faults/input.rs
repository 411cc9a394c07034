//! Replays and bad input: the same change event twice, the topic re-read
//! from offset 0 by a new group, poison records among good ones, and a
//! 5 MiB payload that the change event carries only as Debezium's
//! placeholder (the TOAST case).

use std::time::Duration;

use entity::Status;
use serde_json::{json, Value};
use wiremock::ResponseTemplate;

use super::check::{check, Spec};
use super::setup::{insert_many, prepare, scale, settle, T};
use crate::harness::{eventually, Options, Receiver};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_events_and_a_reread_topic_send_nothing_twice() {
    let receiver = Receiver::start(|r| {
        if r.id % 3 == 0 && r.nth == 0 {
            ResponseTemplate::new(503)
        } else {
            ResponseTemplate::new(204)
        }
    })
    .await;
    let mut t = prepare(Options::default(), receiver, 1).await;
    t.start().await;
    let ids = insert_many(&t, 10 * scale(), "replay").await;
    settle(&t, &t.group, T).await;
    let before = t.receiver.requests().len();
    // Every change event delivered again: the current (sent) row twice, and
    // the stale insert (pending, attempts 0) once more.
    let mut replayed = 0;
    for id in &ids {
        let row = t.row(*id).await;
        t.feed.republish(&row).await;
        t.feed.republish(&row).await;
        let mut stale = row.clone();
        stale.status = Status::Pending;
        stale.attempts = 0;
        stale.sent_at = None;
        t.feed.republish(&stale).await;
        replayed += 3;
    }
    settle(&t, &t.group, T).await;
    assert_eq!(
        t.receiver.requests().len(),
        before,
        "a replayed event was sent again"
    );
    // A new group reads the whole topic from offset 0.
    t.stop().await;
    let reread = crate::harness::unique("reread");
    let app = t.start_in_group(&reread).await;
    // Every message committed by the new group: every job it started ended.
    t.wait_all_committed(&reread, T).await;
    app.stop().await;
    assert_eq!(
        t.receiver.requests().len(),
        before,
        "the re-read topic sent something again"
    );
    let mut spec = Spec::new("replays", &t);
    spec.faults = replayed + 1;
    check(&t, &spec).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_are_counted_skipped_and_the_partition_moves_on() {
    let opts = Options {
        partitions: 1,
        ..Options::default()
    };
    let mut t = prepare(opts, Receiver::accepting().await, 1).await;
    t.start().await;
    let base = t.admin_url("");
    let poison: [&[u8]; 3] = [b"{not json", b"\xff\xfe\x00 not utf-8", b"[1, 2, 3]"];
    let mut ids = Vec::new();
    let mut next_poison = poison.iter();
    for i in 0..17 {
        ids.push(t.insert("accounts.purchase_create", json!({"n": i})).await);
        if [3, 8, 13].contains(&i) {
            // Wait for the insert's event so the poison lands between good ones.
            eventually("the insert to be published", T, || async {
                t.feed
                    .published()
                    .iter()
                    .any(|p| p.id == ids[i] && p.op == "c")
                    .then_some(())
            })
            .await;
            let value = next_poison.next().expect("three poison records");
            t.feed.publish_raw(Some(br#"{"id": 1}"#), Some(value)).await;
        }
    }
    assert!(next_poison.next().is_none());
    settle(&t, &t.group, T).await;
    let invalid = r#"outbox_cdc_messages_total{result="invalid"}"#;
    eventually("3 invalid records counted", T, || async {
        (crate::harness::metric(&base, invalid).await == Some(3.0)).then_some(())
    })
    .await;
    let requests = t.receiver.requests();
    assert_eq!(requests.len(), 17, "exactly the 17 good events dispatched");
    for id in &ids {
        assert_eq!(t.receiver.for_id(*id).len(), 1, "event {id}");
    }
    // The partition moved past every poison record, without a restart.
    let end = t.kafka.end_offsets(&t.topic, 1)[0];
    assert_eq!(t.kafka.committed(&t.group, &t.topic, 1)[0], end);
    let live = reqwest::get(format!("{base}/livez")).await.unwrap();
    assert_eq!(live.status(), 200, "the pipeline task is still running");
    let mut spec = Spec::new("poison records", &t);
    spec.faults = 3;
    check(&t, &spec).await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_mib_payload_is_dispatched_intact() {
    let mut t = prepare(Options::default(), Receiver::accepting().await, 1).await;
    t.start().await;
    let blob: String = (0..5 * 1024 * 1024 / 16)
        .map(|i| format!("{:015x}-", i))
        .collect();
    let payload = json!({"event_type": "purchase_create", "blob": blob, "nested": {"é": "ü", "n": [1, 2.5, null]}});
    assert!(payload.to_string().len() >= 5 * 1024 * 1024);
    let id = t.insert("accounts.purchase_create", payload.clone()).await;
    t.wait_status(id, Status::Sent, Duration::from_secs(60))
        .await;
    settle(&t, &t.group, T).await;
    let reqs = t.receiver.for_id(id);
    assert_eq!(reqs.len(), 1);
    let body: Value = serde_json::from_slice(&reqs[0].body).expect("a JSON body");
    assert!(body == payload, "the body differs from the stored payload");
    let mut spec = Spec::new("5 MiB payload", &t);
    spec.faults = 1;
    check(&t, &spec).await;
    t.stop().await;
}

/// A row already sent, and two replayed triggers for it that arrive in the
/// same poll (a restart or a rebalance re-reads from the committed offset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_repeated_in_one_batch_for_a_final_row_is_committed() {
    let opts = Options {
        partitions: 1,
        ..Options::default()
    };
    let mut t = prepare(opts, Receiver::accepting().await, 1).await;
    t.start().await;
    let id = t.insert("accounts.purchase_create", json!({})).await;
    settle(&t, &t.group, T).await;
    t.stop().await;
    let mut stale = t.row(id).await;
    stale.status = Status::Pending;
    stale.sent_at = None;
    t.feed.republish(&stale).await;
    t.feed.republish(&stale).await;
    t.start().await;
    t.wait_all_committed(&t.group, Duration::from_secs(20))
        .await;
    let mut spec = Spec::new("repeated trigger in one batch", &t);
    spec.faults = 2;
    check(&t, &spec).await;
    t.stop().await;
}

/// A re-read of more already-sent rows than `max_in_flight`: the triggers
/// beyond the limit go to the backlog, the first ones turn out stale, no
/// job runs — and nothing ever drains the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_longer_than_the_in_flight_limit_does_not_stall() {
    let opts = Options {
        partitions: 1,
        max_in_flight: 2,
        ..Options::default()
    };
    let mut t = prepare(opts, Receiver::accepting().await, 1).await;
    t.start().await;
    insert_many(&t, 6, "first").await;
    settle(&t, &t.group, T).await;
    t.stop().await;
    // A new group re-reads the topic: 6 stale triggers, limit 2.
    let reread = crate::harness::unique("reread");
    let app = t.start_in_group(&reread).await;
    let fresh = t
        .insert("accounts.purchase_create", json!({"fresh": true}))
        .await;
    t.wait_status(fresh, Status::Sent, Duration::from_secs(20))
        .await;
    t.wait_all_committed(&reread, Duration::from_secs(20)).await;
    app.stop().await;
    let mut spec = Spec::new("replay longer than the in-flight limit", &t);
    spec.faults = 6;
    check(&t, &spec).await;
}
