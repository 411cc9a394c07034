//! R-004 through the job, end to end: change events on a Kafka-protocol
//! broker → the sidecar → a real HTTP receiver → status written back
//! (the Rails `dispatch_events_job_spec.rb`, and CONTRACT §5).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use entity::Status;
use serde_json::json;
use wiremock::ResponseTemplate;

use crate::harness::{eventually, spawn_app, spawn_app_with, Options, Receiver, ACCOUNTS_EVENTS};

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn success_marks_sent_with_one_request() {
    let t = spawn_app(Options::default()).await;
    let payload = json!({"event_type": "purchase_create", "company_id": 7, "amount_cents": 1990});
    let id = t.insert("accounts.purchase_create", payload.clone()).await;
    let row = t.wait_status(id, Status::Sent, T).await;
    assert!(row.sent_at.is_some());
    assert_eq!(row.attempts, 0);
    assert_eq!(row.last_error, None);
    t.wait_all_committed(&t.group, T).await;
    let reqs = t.receiver.for_id(id);
    assert_eq!(
        reqs.len(),
        1,
        "echoes of the sidecar's own writes cause no request"
    );
    let r = &reqs[0];
    assert_eq!(r.path, "/api/v1/events");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&r.body).unwrap(),
        payload
    );
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(r.headers["authorization"], "Bearer accounts-secret-token");
    assert_eq!(r.headers["idempotency-key"], id.to_string());
    assert_eq!(r.headers["outbox-event-name"], "accounts.purchase_create");
    assert_eq!(r.headers["outbox-attempt"], "1");
}

/// Rejects the first `n` requests of every id, then accepts.
fn fail_first(n: usize) -> impl Fn(&crate::harness::receiver::Received) -> ResponseTemplate {
    move |r| {
        if r.nth < n {
            ResponseTemplate::new(503).set_body_string("upstream unavailable")
        } else {
            ResponseTemplate::new(201)
        }
    }
}

/// The row as its first failure left it (attempts = 1).
async fn first_failure(t: &crate::harness::TestApp, id: i64) -> entity::OutboxEventRow {
    crate::harness::eventually("the first failure", T, || async {
        let row = t.store.get(id).await.ok()??;
        (row.attempts == 1).then_some(row)
    })
    .await
}

fn assert_spacing(reqs: &[crate::harness::receiver::Received], delay: Duration) {
    for pair in reqs.windows(2) {
        let gap = (pair[1].at - pair[0].at).to_std().unwrap();
        assert!(
            gap >= delay,
            "attempts {} and {} only {gap:?} apart",
            pair[0].attempt,
            pair[1].attempt
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_failures_then_success_with_the_real_5s_delay() {
    let receiver = Receiver::start(fail_first(2)).await;
    let opts = Options {
        retry_delay: "5s",
        ..Options::default()
    };
    let t = spawn_app_with(opts, receiver).await;
    let id = t
        .insert(
            "accounts.installment_paid",
            json!({"event_type": "installment_paid"}),
        )
        .await;
    // After the first failure: pending, attempts 1, last_error set.
    let after_first = crate::harness::eventually("the first failure", T, || async {
        let row = t.store.get(id).await.ok()??;
        (row.attempts == 1).then_some(row)
    })
    .await;
    assert_eq!(after_first.status, Status::Pending);
    assert_eq!(
        after_first.last_error.as_deref(),
        Some("HTTP 503: upstream unavailable")
    );
    let row = t
        .wait_status(id, Status::Sent, Duration::from_secs(40))
        .await;
    assert_eq!(row.attempts, 2, "two failures counted, the success is not");
    assert_eq!(
        row.last_error.as_deref(),
        Some("HTTP 503: upstream unavailable")
    );
    t.wait_all_committed(&t.group, T).await;
    let reqs = t.receiver.for_id(id);
    assert_eq!(
        reqs.iter().map(|r| r.attempt).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_spacing(&reqs, Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_failure_fails_and_no_fourth_request() {
    let receiver = Receiver::start(|_| {
        ResponseTemplate::new(422).set_body_string(r#"{"error":"company_not_found"}"#)
    })
    .await;
    let t = spawn_app_with(Options::default(), receiver).await;
    let id = t
        .insert(
            "accounts.purchase_create",
            json!({"event_type": "purchase_create"}),
        )
        .await;
    let row = t.wait_status(id, Status::Failed, T).await;
    assert_eq!(row.attempts, 3);
    assert_eq!(
        row.last_error.as_deref(),
        Some(r#"HTTP 422: {"error":"company_not_found"}"#)
    );
    assert!(row.sent_at.is_none());
    t.wait_all_committed(&t.group, T).await;
    let reqs = t.receiver.for_id(id);
    assert_eq!(reqs.len(), 3, "no 4th request ever");
    assert_spacing(&reqs, Duration::from_millis(300));
}

/// `permanent_statuses`, the receiver's own verdict (opt-in): a 422 it
/// lists ends the event `failed` at its first answer, a 503 it does not
/// list still retries to R-004's three attempts, and a resend starts over
/// (one more request, failed again). The same 422 with the option off is
/// the test above: three attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_status_fails_at_once_and_a_503_still_retries() {
    let receiver = Receiver::start(|r| {
        if r.event_name == "accounts.purchase_create" {
            ResponseTemplate::new(422).set_body_string(r#"{"error":"company_not_found"}"#)
        } else {
            ResponseTemplate::new(503)
        }
    })
    .await;
    let t = spawn_app_with(
        Options {
            accounts_toml: "permanent_statuses = [400, 404, 409, 422]".into(),
            ..Options::default()
        },
        receiver,
    )
    .await;
    let permanent = t.insert("accounts.purchase_create", json!({})).await;
    let retried = t.insert("accounts.installment_paid", json!({})).await;
    let row = t.wait_status(permanent, Status::Failed, T).await;
    assert_eq!(row.attempts, 1);
    assert_eq!(
        row.last_error.as_deref(),
        Some(r#"permanent: HTTP 422: {"error":"company_not_found"}"#)
    );
    let row = t.wait_status(retried, Status::Failed, T).await;
    assert_eq!(
        (row.attempts, row.last_error.as_deref()),
        (3, Some("HTTP 503"))
    );
    t.wait_all_committed(&t.group, T).await;
    assert_eq!(t.receiver.for_id(permanent).len(), 1, "one request only");
    assert_eq!(t.receiver.for_id(retried).len(), 3);
    // A resend starts over: pending, 0 attempts, then one request more.
    t.store
        .retry(
            permanent,
            &outbox_sidecar::store::history::Caller::new(
                outbox_sidecar::store::history::Via::Cli,
                None,
            ),
        )
        .await
        .unwrap()
        .unwrap();
    eventually("the resent event failed again", T, || async {
        let row = t.row(permanent).await;
        (row.status == Status::Failed && t.receiver.for_id(permanent).len() == 2).then_some(row)
    })
    .await;
    assert_eq!(t.row(permanent).await.attempts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregistered_event_name_fails_after_three_attempts() {
    let t = spawn_app(Options::default()).await;
    let id = t
        .insert(
            "billing.invoice_issued",
            json!({"event_type": "invoice_issued"}),
        )
        .await;
    let row = t.wait_status(id, Status::Failed, T).await;
    assert_eq!(row.attempts, 3);
    assert_eq!(
        row.last_error.as_deref(),
        Some(r#"no dispatcher registered for event_name "billing.invoice_issued""#)
    );
    t.wait_all_committed(&t.group, T).await;
    assert!(t.receiver.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resend_starts_a_fresh_cycle() {
    let accept = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = accept.clone();
    let receiver = Receiver::start(move |_| {
        if flag.load(std::sync::atomic::Ordering::SeqCst) {
            ResponseTemplate::new(200)
        } else {
            ResponseTemplate::new(500)
        }
    })
    .await;
    let t = spawn_app_with(Options::default(), receiver).await;
    let id = t
        .insert(
            "accounts.installment_overdue",
            json!({"event_type": "installment_overdue"}),
        )
        .await;
    t.wait_status(id, Status::Failed, T).await;
    accept.store(true, std::sync::atomic::Ordering::SeqCst);
    let resent = t
        .store
        .retry(
            id,
            &outbox_sidecar::store::history::Caller::new(
                outbox_sidecar::store::history::Via::Cli,
                None,
            ),
        )
        .await
        .unwrap()
        .expect("resend");
    assert_eq!(
        (resent.status, resent.attempts, resent.last_error.clone()),
        (Status::Pending, 0, None)
    );
    let row = t.wait_status(id, Status::Sent, T).await;
    assert_eq!(row.attempts, 0);
    t.wait_all_committed(&t.group, T).await;
    let attempts: Vec<i32> = t.receiver.for_id(id).iter().map(|r| r.attempt).collect();
    assert_eq!(
        attempts,
        vec![1, 2, 3, 1],
        "the resend starts over at attempt 1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_accounts_events_share_one_endpoint() {
    let t = spawn_app(Options::default()).await;
    let mut ids = Vec::new();
    for name in ACCOUNTS_EVENTS {
        ids.push(
            t.insert(
                name,
                json!({"event_type": name.trim_start_matches("accounts.")}),
            )
            .await,
        );
    }
    for id in &ids {
        t.wait_status(*id, Status::Sent, T).await;
    }
    t.wait_all_committed(&t.group, T).await;
    let reqs = t.receiver.requests();
    assert_eq!(reqs.len(), 3);
    for (id, name) in ids.iter().zip(ACCOUNTS_EVENTS) {
        let r = t.receiver.for_id(*id);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].path, "/api/v1/events");
        assert_eq!(r[0].event_name, name);
        assert_eq!(
            r[0].headers["authorization"],
            "Bearer accounts-secret-token"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_failure_counts_the_same() {
    // The mode is picked by the payload; max_attempts 1 makes each a single try.
    let receiver = Receiver::start(|r| {
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        match body["mode"].as_str() {
            Some("redirect") => {
                ResponseTemplate::new(302).insert_header("location", "http://127.0.0.1:9/elsewhere")
            }
            Some("not_found") => ResponseTemplate::new(404),
            Some("unavailable") => ResponseTemplate::new(503).set_body_string("down"),
            Some("slow") => ResponseTemplate::new(200).set_delay(Duration::from_secs(3)),
            _ => ResponseTemplate::new(200),
        }
    })
    .await;
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let refused_port = refused.local_addr().unwrap().port();
    drop(refused);
    let opts = Options {
        max_attempts: 1,
        extra_toml: format!(
            "[dispatchers.refused]\nurl = \"http://127.0.0.1:{refused_port}/api/v1/events\"\nevents = [\"test.refused\"]\ntimeout = \"2s\"\n"
        ),
        ..Options::default()
    };
    let t = spawn_app_with(opts, receiver).await;
    let cases = [
        ("accounts.purchase_create", "redirect", "HTTP 302"),
        ("accounts.purchase_create", "not_found", "HTTP 404"),
        ("accounts.purchase_create", "unavailable", "HTTP 503: down"),
        ("accounts.purchase_create", "slow", "timeout after 2s"),
        ("test.refused", "refused", "connection error: "),
    ];
    let mut ids = Vec::new();
    for (name, mode, _) in cases {
        ids.push(t.insert(name, json!({"mode": mode})).await);
    }
    for (id, (_, mode, error)) in ids.iter().zip(cases) {
        let row = t.wait_status(*id, Status::Failed, T).await;
        assert_eq!(row.attempts, 1, "{mode}");
        let last = row.last_error.unwrap();
        assert!(last.starts_with(error), "{mode}: {last}");
    }
    assert!(
        t.receiver
            .requests()
            .iter()
            .all(|r| r.path == "/api/v1/events"),
        "the redirect is not followed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_by_a_new_group_sends_nothing_twice() {
    let mut t = spawn_app(Options::default()).await;
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(t.insert("accounts.purchase_create", json!({"n": i})).await);
    }
    for id in &ids {
        t.wait_status(*id, Status::Sent, T).await;
    }
    t.wait_all_committed(&t.group, T).await;
    assert_eq!(t.receiver.requests().len(), 10);
    t.stop().await;
    // A re-snapshot: the whole topic read again from offset 0, plus the
    // same change event delivered twice.
    let row = t.row(ids[0]).await;
    t.feed.republish(&row).await;
    let replay_group = crate::harness::unique("replay");
    let replay = t.start_in_group(&replay_group).await;
    t.wait_all_committed(&replay_group, T).await;
    assert_eq!(
        t.receiver.requests().len(),
        10,
        "nothing already sent is sent again"
    );
    replay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_during_retry_wait_resumes_at_updated_at_plus_delay() {
    let receiver = Receiver::start(fail_first(1)).await;
    let opts = Options {
        retry_delay: "2s",
        ..Options::default()
    };
    let mut t = spawn_app_with(opts, receiver).await;
    let id = t.insert("accounts.purchase_create", json!({})).await;
    let failed_once = first_failure(&t, id).await;
    // Stopped in the middle of the retry wait: the job is cancelled, its
    // message left uncommitted.
    t.stop().await;
    assert_eq!(t.row(id).await.status, Status::Pending);
    t.start().await;
    let row = t.wait_status(id, Status::Sent, T).await;
    assert_eq!(row.attempts, 1);
    let reqs = t.receiver.for_id(id);
    assert_eq!(reqs.len(), 2);
    let earliest = failed_once.updated_at + chrono::Duration::seconds(2);
    assert!(
        reqs[1].at >= earliest,
        "retried at {} before updated_at + retry_delay = {earliest}",
        reqs[1].at
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_job_per_id_even_when_its_event_is_repeated() {
    let receiver =
        Receiver::start(|_| crate::harness::receiver::slow(200, Duration::from_millis(700))).await;
    let t = spawn_app_with(Options::default(), receiver).await;
    let id = t.insert("accounts.purchase_create", json!({})).await;
    // The same change event three more times while the first POST is slow.
    let row = t.row(id).await;
    for _ in 0..3 {
        t.feed.republish(&row).await;
    }
    t.wait_status(id, Status::Sent, T).await;
    t.wait_all_committed(&t.group, T).await;
    assert_eq!(t.receiver.for_id(id).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_never_pass_an_unfinished_message() {
    // The first event is retried slowly; later events finish at once.
    let receiver = Receiver::start(|r| {
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        if body["slow"] == true && r.nth < 2 {
            ResponseTemplate::new(500)
        } else {
            ResponseTemplate::new(204)
        }
    })
    .await;
    let opts = Options {
        retry_delay: "2s",
        partitions: 1,
        ..Options::default()
    };
    let t = spawn_app_with(opts, receiver).await;
    let slow = t
        .insert("accounts.purchase_create", json!({"slow": true}))
        .await;
    let mut fast = Vec::new();
    for i in 0..5 {
        fast.push(t.insert("accounts.purchase_create", json!({"n": i})).await);
    }
    for id in &fast {
        t.wait_status(*id, Status::Sent, T).await;
    }
    // The slow event's insert is offset 0 and still in its retry wait.
    assert_eq!(t.row(slow).await.status, Status::Pending);
    let committed = t.kafka.committed(&t.group, &t.topic, 1)[0];
    assert!(
        committed <= 0,
        "committed {committed} past the unfinished offset 0"
    );
    t.wait_status(slow, Status::Sent, T).await;
    t.wait_all_committed(&t.group, T).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_records_go_to_the_dead_letter_topic_and_the_stream_moves_on() {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::Message;
    let dlq = crate::harness::unique("dlq");
    let opts = Options {
        partitions: 1,
        extra_toml: String::new(),
        ..Options::default()
    };
    let mut t = spawn_app(opts).await;
    t.stop().await;
    t.kafka.create_topic(&dlq, 1).await;
    t.opts.extra_toml = String::new();
    let mut settings = t.settings(&t.group);
    settings.kafka.dead_letter_topic = Some(dlq.clone());
    let app = outbox_sidecar::app::App::start(settings).await.unwrap();
    t.feed
        .publish_raw(Some(br#"{"id":1}"#), Some(b"{not json"))
        .await;
    let id = t.insert("accounts.purchase_create", json!({})).await;
    t.wait_status(id, Status::Sent, T).await;
    let reader: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &t.kafka.brokers)
        .set("group.id", crate::harness::unique("dlq-reader"))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    reader.subscribe(&[&dlq]).unwrap();
    let msg = tokio::time::timeout(T, reader.recv())
        .await
        .expect("a dead letter")
        .unwrap();
    assert_eq!(
        msg.payload(),
        Some(&b"{not json"[..]),
        "the record is kept as it was"
    );
    let headers: std::collections::HashMap<String, String> = {
        use rdkafka::message::Headers;
        msg.headers()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h.key.to_owned(),
                    String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                )
            })
            .collect()
    };
    assert_eq!(headers["outbox.source.topic"], t.topic);
    assert_eq!(headers["outbox.source.offset"], "0");
    assert!(
        headers["outbox.error"]
            .starts_with(&format!("invalid change event at {}/0@0: value", t.topic)),
        "{headers:?}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_limit_bounds_concurrent_requests() {
    let delay = Duration::from_millis(300);
    let receiver = Receiver::start(move |_| crate::harness::receiver::slow(204, delay)).await;
    let opts = Options {
        max_in_flight: 2,
        partitions: 2,
        ..Options::default()
    };
    let t = spawn_app_with(opts, receiver).await;
    let mut ids = Vec::new();
    for i in 0..12 {
        ids.push(t.insert("accounts.purchase_create", json!({"n": i})).await);
    }
    for id in &ids {
        t.wait_status(*id, Status::Sent, T).await;
    }
    t.wait_all_committed(&t.group, T).await;
    let reqs = t.receiver.requests();
    assert_eq!(reqs.len(), 12);
    // Each request is busy for `delay` after it arrives; count overlaps.
    let busy = chrono::Duration::from_std(delay).unwrap();
    let max_overlap = reqs
        .iter()
        .map(|a| {
            reqs.iter()
                .filter(|b| b.at <= a.at && a.at < b.at + busy)
                .count()
        })
        .max()
        .unwrap();
    assert!(
        max_overlap <= 2,
        "{max_overlap} requests in flight with max_in_flight = 2"
    );
    assert!(max_overlap >= 2, "the limit is used: {max_overlap}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_waiting_for_its_retry_does_not_hold_the_in_flight_slot() {
    // max_in_flight = 1 and a long retry delay: the refused row waits 3 s
    // for its second attempt, during which the one slot is free.
    let receiver = Receiver::start(|r| {
        // The body is the jsonb column's text (`{"n": 1}`).
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        let refused_row = body["n"] == 1;
        if refused_row && r.nth == 0 {
            ResponseTemplate::new(503)
        } else {
            ResponseTemplate::new(204)
        }
    })
    .await;
    let opts = Options {
        retry_delay: "3s",
        max_in_flight: 1,
        partitions: 1,
        ..Options::default()
    };
    let t = spawn_app_with(opts, receiver).await;
    let refused = t.insert("accounts.purchase_create", json!({"n": 1})).await;
    let failed_once = first_failure(&t, refused).await;
    let fresh = t.insert("accounts.purchase_create", json!({"n": 2})).await;
    let sent = t.wait_status(fresh, Status::Sent, T).await;
    let retry_due = failed_once.updated_at + chrono::Duration::seconds(3);
    assert!(
        sent.sent_at.unwrap() < retry_due,
        "the fresh row was sent at {:?}, after the refused row's retry time {retry_due}: \
         the waiting job held the only slot",
        sent.sent_at
    );
    let row = t.wait_status(refused, Status::Sent, T).await;
    assert_eq!(row.attempts, 1);
    let reqs = t.receiver.for_id(refused);
    assert_eq!(reqs.len(), 2);
    assert!(
        reqs[1].at >= retry_due,
        "retried before updated_at + retry_delay"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetching_pauses_while_jobs_are_stuck_and_resumes_after() {
    // While `stuck`, every request hangs for 10 s: with max_in_flight = 2
    // the backlog piles up in the ready queue until fetching pauses.
    let stuck = Arc::new(AtomicBool::new(true));
    let receiver = {
        let stuck = stuck.clone();
        Receiver::start(move |_| {
            if stuck.load(Ordering::SeqCst) {
                crate::harness::receiver::slow(204, Duration::from_secs(10))
            } else {
                ResponseTemplate::new(204)
            }
        })
        .await
    };
    let opts = Options {
        max_in_flight: 2,
        partitions: 2,
        ..Options::default()
    };
    let t = crate::harness::prepare_on(crate::harness::Kafka::start(), opts, receiver).await;
    let mut settings = t.settings(&t.group);
    // A hung request is not a failure here (no retry, one request per event).
    settings.dispatchers.get_mut("accounts").unwrap().timeout = Duration::from_secs(30);
    let app = crate::harness::start_with(settings).await;
    let base = format!("http://{}", app.admin_addr());
    let paused = || crate::harness::metric(&base, "outbox_consumer_paused");
    assert_eq!(paused().await, Some(0.0), "not paused at the start");
    // More than the ready queue holds (512) plus the jobs (2 × 2).
    let n = 700;
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(t.insert("accounts.purchase_create", json!({"n": i})).await);
    }
    eventually("fetching to pause", T, || async {
        (paused().await == Some(1.0)).then_some(())
    })
    .await;
    stuck.store(false, Ordering::SeqCst);
    eventually("fetching to resume", T, || async {
        (paused().await == Some(0.0)).then_some(())
    })
    .await;
    for id in &ids {
        t.wait_status(*id, Status::Sent, T).await;
    }
    t.wait_all_committed(&t.group, T).await;
    assert_eq!(
        t.receiver.requests().len(),
        n,
        "every event sent once across the pause"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_backlog_is_not_paused() {
    // A backlog three times the ready queue (512 rows) with a receiver
    // that answers at once: the queue sits at its high mark while jobs keep
    // ending, so fetching must not pause (a pause drops the prefetched
    // messages and leaves the jobs without work for a fetch cycle).
    let opts = Options {
        max_in_flight: 2,
        partitions: 2,
        ..Options::default()
    };
    let t = crate::harness::prepare_on(
        crate::harness::Kafka::start(),
        opts,
        Receiver::accepting().await,
    )
    .await;
    let n = 1500;
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(t.insert("accounts.purchase_create", json!({"n": i})).await);
    }
    eventually("the backlog to be on the topic", T, || async {
        (t.feed.published().len() >= n).then_some(())
    })
    .await;
    let app = t.start_in_group(&t.group).await;
    let base = format!("http://{}", app.admin_addr());
    for id in &ids {
        t.wait_status(*id, Status::Sent, T).await;
    }
    assert_eq!(
        crate::harness::metric(&base, "outbox_consumer_pauses_total").await,
        Some(0.0),
        "fetching paused while every job was ending at once"
    );
    app.stop().await;
}

/// Invalid records whose dead-letter topic does not exist (yet): each
/// send keeps its record until the producer gives up, so they are bounded
/// (`MAX_DEAD_LETTERS`, an eighth of `dispatch.max_buffered_bytes`);
/// beyond that fetching pauses, and it resumes when the topic appears and
/// the sends are delivered. Nothing is committed before its send ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_sends_to_a_missing_topic_are_bounded_and_fetching_resumes() {
    use futures::StreamExt;
    // OUTBOX_DLQ_RECORDS: the long run's 50,000 (`make test` keeps 3,000).
    let n: usize = std::env::var("OUTBOX_DLQ_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3_000);
    let dlq = crate::harness::unique("dlq-missing");
    let opts = Options {
        partitions: 1,
        ..Options::default()
    };
    let mut t = spawn_app(opts).await;
    t.stop().await;
    let mut settings = t.settings(&t.group);
    settings.kafka.dead_letter_topic = Some(dlq.clone());
    settings
        .kafka
        .properties
        .insert("allow.auto.create.topics".into(), "false".into());
    let app = outbox_sidecar::app::App::start(settings).await.unwrap();
    futures::stream::iter(0..n)
        .for_each_concurrent(64, |i| {
            let feed = &t.feed;
            async move {
                let key = format!("{{\"id\":{i}}}");
                feed.publish_raw(Some(key.as_bytes()), Some(b"{not json"))
                    .await
            }
        })
        .await;
    let base = format!("http://{}", app.admin_addr());
    eventually("fetching to pause", T, || {
        let base = base.clone();
        async move {
            let v = crate::harness::metric(&base, "outbox_consumer_paused").await?;
            (v == 1.0).then_some(())
        }
    })
    .await;
    let committed = t.kafka.committed(&t.group, &t.topic, 1)[0];
    assert!(
        committed < 1_100,
        "no more than the bound (plus one batch) taken in: committed {committed}"
    );
    let in_flight = crate::harness::metric(&base, "outbox_dead_letters_in_flight")
        .await
        .unwrap_or(0.0);
    assert!(
        in_flight > 0.0 && in_flight < 1_600.0,
        "the sends held in memory are bounded: {in_flight}"
    );
    println!(
        "dead letters: {n} invalid records, {in_flight} sends held at the pause, committed {committed}, test process VmRSS {} KiB",
        vm_rss_kib()
    );
    t.kafka.create_topic(&dlq, 1).await;
    t.wait_all_committed(&t.group, Duration::from_secs(300))
        .await;
    app.stop().await;
}

/// Runs one event against a receiver that answers the first request with
/// `first` and the rest with 200; `respect_retry_after` on with
/// `max_retry_after`, `retry_delay` 1 s. The gap between the two POSTs,
/// and the row as sent.
async fn gap_after(
    first: impl Fn() -> ResponseTemplate + Send + Sync + 'static,
    max_retry_after: &str,
) -> (Duration, String) {
    let receiver = Receiver::start(move |r| {
        if r.nth == 0 {
            first()
        } else {
            ResponseTemplate::new(200)
        }
    })
    .await;
    let t = spawn_app_with(
        Options {
            retry_delay: "1s",
            accounts_toml: format!(
                "respect_retry_after = true\nmax_retry_after = \"{max_retry_after}\""
            ),
            ..Options::default()
        },
        receiver,
    )
    .await;
    let id = t
        .insert("accounts.purchase_create", json!({"amount": 1}))
        .await;
    t.wait_status(id, Status::Sent, Duration::from_secs(60))
        .await;
    let seen = t.receiver.for_id(id);
    assert_eq!(seen.len(), 2, "{seen:?}");
    let gap = (seen[1].at - seen[0].at).to_std().unwrap();
    let history = t.store.history(id).await.unwrap();
    let detail = history[0].detail.clone().unwrap_or_default();
    (gap, detail)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_in_seconds_is_honoured_and_logged() {
    let (gap, detail) = gap_after(
        || ResponseTemplate::new(429).insert_header("Retry-After", "3"),
        "5m",
    )
    .await;
    assert!(gap >= Duration::from_secs(3), "second POST after {gap:?}");
    assert!(
        detail.contains("(Retry-After: 3; next attempt not before "),
        "the attempt log records it: {detail}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_capped_at_max_retry_after() {
    let (gap, detail) = gap_after(
        || ResponseTemplate::new(503).insert_header("Retry-After", "3600"),
        "2s",
    )
    .await;
    assert!(gap >= Duration::from_secs(2), "second POST after {gap:?}");
    assert!(
        gap < Duration::from_secs(3600),
        "capped, not an hour: {gap:?}"
    );
    assert!(detail.contains("(Retry-After: 3600;"), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_as_an_http_date_is_honoured() {
    // Four seconds after the request, written when it is answered.
    let (gap, detail) = gap_after(
        || {
            let at = std::time::SystemTime::now() + Duration::from_secs(4);
            ResponseTemplate::new(429).insert_header("Retry-After", httpdate::fmt_http_date(at))
        },
        "5m",
    )
    .await;
    // The date has whole seconds: at least 3 s of the 4 remain.
    assert!(gap >= Duration::from_secs(3), "second POST after {gap:?}");
    assert!(detail.contains(" GMT; next attempt"), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_retry_after_is_ignored() {
    let (_, detail) = gap_after(
        || ResponseTemplate::new(429).insert_header("Retry-After", "soon"),
        "5m",
    )
    .await;
    assert!(
        !detail.contains("Retry-After"),
        "nothing honoured: {detail}"
    );
}

/// A long `Retry-After` wait lives in the job's memory only: after a
/// restart the row is decided again as today, its next attempt due
/// `retry_delay` after its `updated_at` (the attempt still counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_forgets_a_retry_after_wait() {
    let receiver = Receiver::start(|r| {
        if r.nth == 0 {
            ResponseTemplate::new(429).insert_header("Retry-After", "3600")
        } else {
            ResponseTemplate::new(200)
        }
    })
    .await;
    let mut t = spawn_app_with(
        Options {
            retry_delay: "1s",
            accounts_toml: "respect_retry_after = true\nmax_retry_after = \"1h\"".into(),
            ..Options::default()
        },
        receiver,
    )
    .await;
    let id = t
        .insert("accounts.purchase_create", json!({"amount": 1}))
        .await;
    eventually("the first attempt to be written", T, || async {
        let row = t.store.get(id).await.ok()??;
        (row.attempts == 1).then_some(())
    })
    .await;
    t.stop().await;
    t.start().await;
    let row = t.wait_status(id, Status::Sent, T).await;
    assert_eq!(row.attempts, 1, "the 429 counted");
    assert_eq!(t.receiver.for_id(id).len(), 2);
    t.stop().await;
}

/// `idempotency_key = "table-prefixed"`: `outbox_events:<id>`, the same on
/// every attempt of the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_prefixed_idempotency_key_is_stable_across_attempts() {
    let receiver = Receiver::start(|r| {
        if r.nth == 0 {
            ResponseTemplate::new(500)
        } else {
            ResponseTemplate::new(200)
        }
    })
    .await;
    let t = spawn_app_with(
        Options {
            accounts_toml: "idempotency_key = \"table-prefixed\"".into(),
            ..Options::default()
        },
        receiver,
    )
    .await;
    let id = t
        .insert("accounts.purchase_create", json!({"amount": 1}))
        .await;
    t.wait_status(id, Status::Sent, T).await;
    // The only event of the test: every request is one of its attempts.
    let requests = t.receiver.requests();
    let keys: Vec<&str> = requests
        .iter()
        .map(|r| r.headers["idempotency-key"].as_str())
        .collect();
    let want = format!("outbox_events:{id}");
    assert_eq!(keys, vec![want.as_str(), want.as_str()], "{requests:?}");
}

/// This process's resident set (Linux), for the long runs' printout.
fn vm_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// A job is one attempt: a receiver's `Retry-After` is a wait in the
/// scheduler, not a job holding a place, so one receiver asking every
/// event to come back in two minutes does not hold back another
/// dispatcher (before: `4 × max_in_flight` waiting jobs filled the job
/// limit, and billing waited for minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_receivers_retry_after_does_not_hold_back_another_dispatcher() {
    let receiver = Receiver::start(|r| {
        if r.event_name.starts_with("accounts.") {
            ResponseTemplate::new(429).insert_header("Retry-After", "120")
        } else {
            ResponseTemplate::new(200)
        }
    })
    .await;
    let billing_url = receiver.url();
    let t = spawn_app_with(
        Options {
            max_in_flight: 2,
            retry_delay: "5s",
            accounts_toml: "respect_retry_after = true\nmax_retry_after = \"5m\"".into(),
            extra_toml: format!(
                "[dispatchers.billing]\nurl = \"{billing_url}\"\nevents = [\"billing.invoice\"]\n"
            ),
            ..Options::default()
        },
        receiver,
    )
    .await;
    let n = 30;
    for i in 0..n {
        t.insert("accounts.purchase_create", json!({"n": i})).await;
    }
    // More accounts events were attempted than the old job limit held
    // (2 × 2 + 4 × 2 = 12): each now waits two minutes.
    eventually("the accounts events to meet the 429s", T, || async {
        let seen = t
            .receiver
            .requests()
            .iter()
            .filter(|r| r.event_name.starts_with("accounts."))
            .count();
        (seen >= 12).then_some(())
    })
    .await;
    let mut bills = Vec::new();
    for i in 0..5 {
        bills.push(t.insert("billing.invoice", json!({"n": i})).await);
    }
    for id in bills {
        t.wait_status(id, Status::Sent, Duration::from_secs(10))
            .await;
    }
    let base = t.admin_url("");
    let waiting = crate::harness::metric(&base, "outbox_scheduler_waiting{wait=\"retry\"}")
        .await
        .unwrap_or(0.0);
    assert!(
        waiting >= 12.0,
        "the retries wait in the scheduler: {waiting}"
    );
    let jobs = crate::harness::metric(&base, "outbox_jobs_running")
        .await
        .unwrap_or(-1.0);
    assert!(
        (0.0..=4.0).contains(&jobs),
        "at most 2 × max_in_flight jobs: {jobs}"
    );
}
