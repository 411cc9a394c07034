//! Why an event is not sent yet: `GET /admin/events/{id}/why`, `events why
//! ID` and the console's event page give the one reason, its evidence and
//! what to do, for each reason the database and the replica asked can see.

use std::time::Duration;

use entity::Status;
use sea_orm::ConnectionTrait;
use serde_json::{json, Value};
use wiremock::ResponseTemplate;

use crate::harness::{eventually, spawn_app_with, Options, Receiver, TestApp};

const T: Duration = Duration::from_secs(30);
const TOKEN: &str = "test-admin-token-0123456789";

async fn why(t: &TestApp, id: i64) -> (u16, Value) {
    let r = reqwest::Client::new()
        .get(t.api_url(&format!("/admin/events/{id}/why")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// Inserts a row as the application (or an operator) would, with the
/// change feed's trigger off: no change event for it.
async fn insert_silently(t: &TestApp, name: &str, status: &str, attempts: i32, age_s: i64) -> i64 {
    let db = t.store.connection();
    db.execute_unprepared("ALTER TABLE outbox_events DISABLE TRIGGER outbox_cdc")
        .await
        .unwrap();
    let row = db
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!(
                "INSERT INTO outbox_events (event_name, payload, status, attempts, last_error, created_at, updated_at, sent_at) \
                 VALUES ('{name}', '{{}}', '{status}', {attempts}, CASE WHEN '{status}' = 'failed' THEN 'HTTP 503' END, \
                 (now() AT TIME ZONE 'UTC') - interval '{age_s} seconds', (now() AT TIME ZONE 'UTC') - interval '{age_s} seconds', \
                 CASE WHEN '{status}' = 'sent' THEN now() AT TIME ZONE 'UTC' END) RETURNING id"
            ),
        ))
        .await
        .unwrap()
        .unwrap();
    db.execute_unprepared("ALTER TABLE outbox_events ENABLE TRIGGER outbox_cdc")
        .await
        .unwrap();
    row.try_get("", "id").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_a_pending_event_waits_each_reason_with_its_evidence_and_what_to_do() {
    // A receiver that is down: every attempt fails, the next in 1 h.
    let receiver = Receiver::start(|_| ResponseTemplate::new(503)).await;
    let mut t = spawn_app_with(
        Options {
            retry_delay: "1h",
            ..Options::default()
        },
        receiver,
    )
    .await;

    // Retry due: attempted once, failed, its next attempt in an hour.
    let retrying = t.insert("accounts.purchase_create", json!({})).await;
    let w = eventually("the first attempt", T, || async {
        let (_, w) = why(&t, retrying).await;
        (w["reason"] == "retry_due").then_some(w)
    })
    .await;
    assert!(
        w["summary"].as_str().unwrap().contains("(attempt 2 of 3)"),
        "{w}"
    );
    assert_eq!(w["status"], "pending");

    // Nothing explains it: pending, unchanged for a minute, no change
    // event ever came. The action names the remedy.
    let lost = insert_silently(&t, "accounts.purchase_create", "pending", 0, 60).await;
    let (status, w) = why(&t, lost).await;
    assert_eq!(status, 200);
    assert_eq!(w["reason"], "unexplained", "{w}");
    assert_eq!(
        w["action"],
        format!("announce it again: `events retrigger {lost}` (its change event was likely lost)")
    );
    assert!(
        w["answered_by"].as_str().is_some_and(|s| !s.is_empty()),
        "{w}"
    );
    // The CLI gives the same reason.
    let out = crate::cli::bin()
        .env("OUTBOX__DATABASE__URL", &t.db.url)
        .env("OUTBOX__DISPATCHERS__ACCOUNTS__URL", t.receiver.url())
        .env(
            "OUTBOX__DISPATCHERS__ACCOUNTS__EVENTS",
            "accounts.purchase_create,accounts.installment_paid,accounts.installment_overdue",
        )
        .args(["events", "why", &lost.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("reason: unexplained"), "{text}");
    assert!(
        text.contains(&format!("`events retrigger {lost}`")),
        "{text}"
    );
    assert!(text.contains("answered by: cli"), "{text}");

    // Just changed: on its way, not unexplained.
    let fresh = insert_silently(&t, "accounts.purchase_create", "pending", 0, 0).await;
    assert_eq!(why(&t, fresh).await.1["reason"], "on_its_way");

    // No dispatcher for its name.
    let orphan = insert_silently(&t, "billing.charge", "pending", 0, 60).await;
    let (_, w) = why(&t, orphan).await;
    assert_eq!(w["reason"], "no_dispatcher", "{w}");

    // Failed and sent rows say so, with their remedy.
    let failed = insert_silently(&t, "accounts.purchase_create", "failed", 3, 60).await;
    let (_, w) = why(&t, failed).await;
    assert_eq!(w["reason"], "failed", "{w}");
    assert_eq!(
        w["action"],
        format!("fix the receiver, then resend it: `events retry {failed}`")
    );
    let sent = insert_silently(&t, "accounts.purchase_create", "sent", 1, 60).await;
    assert_eq!(why(&t, sent).await.1["reason"], "sent");

    // Paused: who paused it and why, and the command that resumes it; it
    // comes before every other reason (the lost row is paused too now).
    let r = reqwest::Client::new()
        .post(t.api_url("/admin/dispatchers/accounts/pause?label=receiver+deploy"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, w) = why(&t, lost).await;
    assert_eq!(w["reason"], "paused", "{w}");
    let evidence = w["evidence"].to_string();
    assert!(evidence.contains("via admin-api (receiver deploy)"), "{w}");
    assert_eq!(
        w["action"],
        "resume it when its receiver is ready: `dispatchers resume accounts`"
    );

    // Unknown ids and typos.
    assert_eq!(why(&t, 987_654).await.0, 404);
    let r = reqwest::Client::new()
        .get(t.api_url(&format!("/admin/events/{lost}/why?verbose=1")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        t.row(lost).await.status,
        Status::Pending,
        "asking changes nothing"
    );
    // Every statement the replica sent is counted.
    let base = t.admin_url("");
    let statements = crate::harness::metric(&base, "outbox_db_statements_total")
        .await
        .unwrap();
    assert!(statements > 10.0, "{statements}");
    t.stop().await;
}

/// What lives in one replica's memory is answered by its scheduler: an
/// attempt under way (in flight, for how long), a receiver's Retry-After
/// beyond `retry_delay` (retry due, saying so), a rate limit's line (how
/// many before it); and a replica with no work for an event names the
/// group's members and their partitions (each member's `client.id` is its
/// replica name), so the operator knows whom to ask.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_asks_the_replicas_scheduler_and_names_the_group_members() {
    // `installment_paid` hangs (its attempt stays in flight); `overdue`
    // answers 503 with Retry-After: 1 h; the rest are accepted.
    let receiver = Receiver::start(|r| match r.event_name.as_str() {
        "accounts.installment_paid" => {
            ResponseTemplate::new(204).set_delay(Duration::from_secs(60))
        }
        "accounts.installment_overdue" => {
            ResponseTemplate::new(503).insert_header("Retry-After", "3600")
        }
        _ => ResponseTemplate::new(204),
    })
    .await;
    let mut t = spawn_app_with(
        Options {
            retry_delay: "1s",
            accounts_toml: "respect_retry_after = true\nmax_retry_after = \"2h\"".into(),
            ..Options::default()
        },
        receiver,
    )
    .await;

    let hanging = t.insert("accounts.installment_paid", json!({})).await;
    let w = eventually("the attempt in flight", T, || async {
        let (_, w) = why(&t, hanging).await;
        (w["reason"] == "in_flight").then_some(w)
    })
    .await;
    assert!(
        w["summary"]
            .as_str()
            .unwrap()
            .starts_with("its attempt 1 of 3 is under way on replica "),
        "{w}"
    );

    let told_later = t.insert("accounts.installment_overdue", json!({})).await;
    let w = eventually("the Retry-After's due time", T, || async {
        let (_, w) = why(&t, told_later).await;
        (w["reason"] == "retry_due" && w["summary"].as_str()?.contains("Retry-After")).then_some(w)
    })
    .await;
    let summary = w["summary"].as_str().unwrap();
    assert!(summary.starts_with("its attempt 2 of 3 is due at "), "{w}");
    assert!(summary.contains("(the receiver's Retry-After)"), "{w}");
    // Well past retry_delay (1 s): the database alone would have called it
    // unexplained or on its way by now.
    assert!(
        w["evidence"]
            .to_string()
            .contains("later than retry_delay (1s)"),
        "{w}"
    );

    // A lost event (no change event): no replica has work for it; this
    // one says so and names the group's members.
    let lost = insert_silently(&t, "accounts.purchase_create", "pending", 0, 60).await;
    let (_, w) = why(&t, lost).await;
    assert_eq!(w["reason"], "unexplained", "{w}");
    let replica = w["answered_by"].as_str().unwrap().to_owned();
    let evidence = w["evidence"].to_string();
    assert!(
        evidence.contains(&format!("replica {replica} (partitions ")),
        "{w}"
    );
    // Neither test broker describes a group's members (librdkafka's mock
    // has no DescribeGroups; tansu answers it with empty members): the
    // answer says they could not be read, and why. On Kafka, Redpanda and
    // MSK it names each member by its client.id, the replica's name.
    let named = format!("has no work for event {lost}; the group: {replica} at ");
    let unread =
        format!("has no work for event {lost}; the group: the group's members could not be read: ");
    assert!(
        evidence.contains(&named) || evidence.contains(&unread),
        "{w}"
    );
    assert!(
        evidence.contains(&format!("replica {replica} (partitions 0, 1, 2)")),
        "{w}"
    );
    t.stop().await;
}

/// A rate-limited dispatcher's events wait in its line: `why` says how
/// many are before each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_a_rate_limited_event_waits_for_its_permit() {
    let mut t = spawn_app_with(
        Options {
            accounts_toml: "rate = \"1/s\"\nburst = 1".into(),
            ..Options::default()
        },
        Receiver::accepting().await,
    )
    .await;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(
            t.insert("accounts.purchase_create", json!({ "n": i }))
                .await,
        );
    }
    let last = *ids.last().unwrap();
    let deadline = std::time::Instant::now() + T;
    let w = loop {
        let (_, w) = why(&t, last).await;
        if w["reason"] == "rate_limited" {
            break w;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the last one never said rate_limited within {T:?}; its last answer: {w}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        w["summary"]
            .as_str()
            .unwrap()
            .starts_with("waiting for a permit of dispatcher accounts's rate limit, "),
        "{w}"
    );
    t.stop().await;
}

/// An open breaker: `why` names the replica whose breaker holds the event
/// and when it probes next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_an_event_behind_an_open_breaker_says_when_it_probes() {
    let mut t = spawn_app_with(
        Options {
            retry_delay: "200ms",
            extra_toml:
                "[dispatchers.accounts.breaker]\nfailures = 2\nwithin = \"30s\"\ncool_down = \"1h\"\n"
                    .into(),
            ..Options::default()
        },
        Receiver::start(|_| ResponseTemplate::new(503)).await,
    )
    .await;
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(
            t.insert("accounts.purchase_create", json!({ "n": i }))
                .await,
        );
    }
    let w = eventually("an event behind the open breaker", T, || async {
        for id in &ids {
            let (_, w) = why(&t, *id).await;
            if w["reason"] == "breaker_open" {
                return Some(w);
            }
        }
        None
    })
    .await;
    let evidence = w["evidence"].to_string();
    assert!(evidence.contains("breaker open on replica "), "{w}");
    assert!(
        evidence.contains("; next probe in 35"),
        "a probe within the hour's cool-down: {w}"
    );
    t.stop().await;
}
