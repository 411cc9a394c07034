//! Replay (`events replay`, `POST /admin/events/replay`): sent events sent
//! again on purpose, at a pace, in order, as an operation that can be
//! cancelled and that outlives its replica.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use entity::Status;
use sea_orm::ConnectionTrait;
use serde_json::{json, Value};

use crate::harness::{child, eventually, prepare_on, spawn_app, Kafka, Options, Receiver, TestApp};

const T: Duration = Duration::from_secs(60);
const TOKEN: &str = "test-admin-token-0123456789";

/// `n` events inserted in one statement (the change feed announces each).
async fn insert_many(t: &TestApp, name: &str, n: usize) -> Vec<i64> {
    let table = t.store.table().to_owned();
    let rows = t
        .store
        .connection()
        .query_all_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!(
                "INSERT INTO {table} (event_name, payload, status, attempts, created_at, updated_at) \
                 SELECT '{name}', json_build_object('n', g), 'pending', 0, now() AT TIME ZONE 'UTC', \
                 now() AT TIME ZONE 'UTC' FROM generate_series(1, {n}) g RETURNING id"
            ),
        ))
        .await
        .unwrap();
    let mut ids: Vec<i64> = rows.iter().map(|r| r.try_get("", "id").unwrap()).collect();
    ids.sort_unstable();
    ids
}

async fn all_sent(t: &TestApp, ids: &[i64]) {
    eventually("every event sent", T, || async {
        let stats = t.store.stats().await.ok()?;
        (stats.pending == 0 && stats.failed == 0).then_some(())
    })
    .await;
    for id in [ids[0], ids[ids.len() - 1]] {
        assert_eq!(t.row(id).await.status, Status::Sent);
    }
}

async fn post(url: String) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn get(url: String) -> Value {
    reqwest::Client::new()
        .get(url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The replay's requests for each id (those carrying `Outbox-Replay: op`).
fn replayed(t: &TestApp, op: &str) -> HashMap<i64, usize> {
    let mut out = HashMap::new();
    for r in t.receiver.requests() {
        if r.headers.get("outbox-replay").map(String::as_str) == Some(op) {
            *out.entry(r.id).or_insert(0) += 1;
        }
    }
    out
}

/// A dry run counts and changes nothing; mistyped or missing filters
/// answer 400 naming what is wrong; above 1,000 rows the replay needs the
/// count; and the CLI's dry run says the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_changes_nothing_and_a_mistyped_filter_replays_nothing() {
    let mut t = spawn_app(Options::default()).await;
    let ids = insert_many(&t, "accounts.purchase_create", 1_200).await;
    all_sent(&t, &ids).await;
    let posts = t.receiver.requests().len();
    let since = "2000-01-01T00:00:00Z";

    let (status, dry) = post(t.api_url(&format!(
        "/admin/events/replay?sent_since={since}&dry_run=true"
    )))
    .await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["count"], 1_200, "{dry}");
    assert_eq!(dry["first"], ids[0], "{dry}");
    assert_eq!(dry["last"], ids[ids.len() - 1], "{dry}");
    assert_eq!(dry["confirm_required"], true, "{dry}");
    assert_eq!(dry["rate"], 100.0, "{dry}");
    assert_eq!(dry["sample"].as_array().unwrap().len(), 10, "{dry}");

    for (query, says) in [
        (
            format!("sent_sinse={since}"),
            "unknown query parameter `sent_sinse`",
        ),
        (
            "event_name=accounts.purchase_create".to_owned(),
            "sent_since or sent_until is required",
        ),
        (
            format!("sent_since={since}&event_name=accounts.nope"),
            "event_name: no dispatcher sends \"accounts.nope\"",
        ),
        (
            format!("sent_since={since}&dispatcher=acounts"),
            "dispatcher: no dispatcher \"acounts\"",
        ),
        (
            "sent_since=yesterday".to_owned(),
            "sent_since: \"yesterday\" is not a time",
        ),
        (
            format!("sent_since={since}&rate=0"),
            "rate: 0 is not a number of events a second above 0",
        ),
        (
            format!("sent_since={since}&aggregate=a1"),
            "aggregate: [ordering] is off",
        ),
    ] {
        let (status, body) = post(t.api_url(&format!("/admin/events/replay?{query}"))).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains(says),
            "{query}: {body}"
        );
    }
    // Above 1,000 rows: the count is needed, and must be the count.
    let (status, body) = post(t.api_url(&format!("/admin/events/replay?sent_since={since}"))).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["would_replay"], 1_200);
    let (status, body) = post(t.api_url(&format!(
        "/admin/events/replay?sent_since={since}&confirm=1000"
    )))
    .await;
    assert_eq!(status, 409, "{body}");
    // Nothing matches in the future.
    let (status, body) =
        post(t.api_url("/admin/events/replay?sent_since=2999-01-01T00:00:00Z")).await;
    assert_eq!(status, 422, "{body}");

    // The CLI's dry run.
    let out = crate::cli::bin()
        .env("OUTBOX__DATABASE__URL", &t.db.url)
        .env("OUTBOX__DISPATCHERS__ACCOUNTS__URL", t.receiver.url())
        .env(
            "OUTBOX__DISPATCHERS__ACCOUNTS__EVENTS",
            "accounts.purchase_create,accounts.installment_paid,accounts.installment_overdue",
        )
        .args(["events", "replay", "--sent-since", since, "--dry-run"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.starts_with(&format!(
            "1200 sent event(s) would be replayed at 100/s, ids {}..{}",
            ids[0],
            ids[ids.len() - 1]
        )),
        "{text}"
    );

    // Nothing changed: every row sent, no request since.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stats = t.store.stats().await.unwrap();
    assert_eq!((stats.pending, stats.failed), (0, 0));
    assert_eq!(t.receiver.requests().len(), posts, "no request since");
    t.stop().await;
}

/// 3,000 sent events replayed at 500/s: their requests span 5–7 s, carry
/// `Outbox-Replay` (the live events' do not) and the event's own
/// `Idempotency-Key`; 200 live events inserted meanwhile are sent with the
/// latency they have without a replay. The operation ends `done` with
/// 3,000, and `events show` tells the replay from a resend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: make test-long"]
async fn a_replay_goes_at_its_pace_and_live_events_keep_their_latency() {
    let mut t = spawn_app(Options::default()).await;
    let ids = insert_many(&t, "accounts.purchase_create", 3_000).await;
    all_sent(&t, &ids).await;

    // Live latency without a replay: 100 events, one every 25 ms.
    let live = |n: usize| {
        let t = &t;
        async move {
            let mut out = Vec::new();
            for i in 0..n {
                let at = Instant::now();
                let id = t
                    .insert("accounts.installment_paid", json!({ "live": i }))
                    .await;
                out.push((id, at));
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            out
        }
    };
    let latencies =
        |t: &TestApp, events: &[(i64, Instant)], base: chrono::NaiveDateTime, base_i: Instant| {
            let mut l: Vec<f64> = events
                .iter()
                .map(|(id, at)| {
                    let r = &t.receiver.for_id(*id)[0];
                    let sent = (r.at - base).num_milliseconds() as f64 / 1000.0;
                    sent - at.duration_since(base_i).as_secs_f64()
                })
                .collect();
            l.sort_by(|a, b| a.partial_cmp(b).unwrap());
            l
        };
    let base = outbox_sidecar::store::now();
    let base_i = Instant::now();
    let quiet = live(100).await;
    for (id, _) in &quiet {
        t.wait_status(*id, Status::Sent, T).await;
    }
    let quiet_l = latencies(&t, &quiet, base, base_i);

    let (status, started) = post(t.api_url(
        "/admin/events/replay?sent_since=2000-01-01T00:00:00Z&event_name=accounts.purchase_create&rate=500&confirm=3000&label=INC-42",
    ))
    .await;
    assert_eq!(status, 202, "{started}");
    let op = started["id"].as_str().unwrap().to_owned();
    let during = live(200).await;
    let end = crate::operations::operation_end(|p| t.api_url(p), &started).await;
    assert_eq!(end["state"], "done", "{end}");
    assert_eq!(end["progress"], 3_000, "{end}");
    all_sent(&t, &ids).await;
    for (id, _) in &during {
        t.wait_status(*id, Status::Sent, T).await;
    }
    let during_l = latencies(&t, &during, base, base_i);

    // The pace: first to last replayed request.
    let times: Vec<chrono::NaiveDateTime> = t
        .receiver
        .requests()
        .iter()
        .filter(|r| r.headers.get("outbox-replay") == Some(&op))
        .map(|r| r.at)
        .collect();
    assert_eq!(times.len(), 3_000);
    let span = *times.iter().max().unwrap() - *times.iter().min().unwrap();
    let span_s = span.num_milliseconds() as f64 / 1000.0;
    let p99 = |l: &[f64]| l[(l.len() * 99 / 100).min(l.len() - 1)];
    println!(
        "replay of 3,000 at 500/s: {span_s:.2} s first to last; live p50/p99 {:.3}/{:.3} s without, {:.3}/{:.3} s during",
        quiet_l[quiet_l.len() / 2],
        p99(&quiet_l),
        during_l[during_l.len() / 2],
        p99(&during_l)
    );
    assert!(
        (5.0..=7.0).contains(&span_s),
        "3,000 at 500/s took {span_s} s"
    );

    // Every replayed event POSTed once more, with its own key and the header.
    let by_id = replayed(&t, &op);
    for id in &ids {
        assert_eq!(by_id.get(id), Some(&1), "event {id} replayed once");
        let reqs = t.receiver.for_id(*id);
        assert_eq!(reqs.len(), 2, "event {id}: its delivery and its replay");
        assert_eq!(
            reqs[0].headers.get("idempotency-key"),
            reqs[1].headers.get("idempotency-key")
        );
        assert!(!reqs[0].headers.contains_key("outbox-replay"));
    }
    for (id, _) in quiet.iter().chain(&during) {
        let reqs = t.receiver.for_id(*id);
        assert_eq!(reqs.len(), 1, "live event {id} sent once");
        assert!(
            !reqs[0].headers.contains_key("outbox-replay"),
            "live event {id}"
        );
    }
    // The attempt log and `events show` tell a replay from a resend.
    let out = crate::cli::bin()
        .env("OUTBOX__DATABASE__URL", &t.db.url)
        .env("OUTBOX__DISPATCHERS__ACCOUNTS__URL", t.receiver.url())
        .env(
            "OUTBOX__DISPATCHERS__ACCOUNTS__EVENTS",
            "accounts.purchase_create",
        )
        .args(["events", "show", &ids[7].to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "replay   via admin-api (INC-42), operation {op} (a sent event sent again)"
        )),
        "{text}"
    );
    t.stop().await;
}

/// A replay cancelled half-way (`DELETE /admin/operations/{id}`) stops at
/// its next step: it ends `cancelled`, the rows it reached are sent again,
/// the rest stay `sent`, untouched (one request each). A second cancel
/// answers 409, an unknown id 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_cancelled_half_way_leaves_the_rest_sent_and_untouched() {
    let mut t = spawn_app(Options::default()).await;
    let ids = insert_many(&t, "accounts.purchase_create", 1_000).await;
    all_sent(&t, &ids).await;
    let (status, started) =
        post(t.api_url("/admin/events/replay?sent_since=2000-01-01T00:00:00Z&rate=100")).await;
    assert_eq!(status, 202, "{started}");
    let op = started["id"].as_str().unwrap().to_owned();
    let href = started["href"].as_str().unwrap().to_owned();
    eventually("the replay under way", T, || async {
        (get(t.api_url(&href)).await["progress"].as_u64()? >= 200).then_some(())
    })
    .await;
    let r = reqwest::Client::new()
        .delete(t.api_url(&href))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let end = eventually("the replay to stop", T, || async {
        let v = get(t.api_url(&href)).await;
        (v["state"] != "running").then_some(v)
    })
    .await;
    assert_eq!(end["state"], "cancelled", "{end}");
    assert!(
        end["message"]
            .as_str()
            .unwrap()
            .contains("the rest stay sent"),
        "{end}"
    );
    let reached = end["progress"].as_u64().unwrap() as usize;
    assert!((200..1_000).contains(&reached), "{end}");
    all_sent(&t, &ids).await;
    let by_id = replayed(&t, &op);
    assert_eq!(by_id.len(), reached, "the rows it reached are replayed");
    // In id order: exactly the first `reached` ids.
    for (i, id) in ids.iter().enumerate() {
        let n = t.receiver.for_id(*id).len();
        if i < reached {
            assert_eq!(n, 2, "event {id}: reached");
        } else {
            assert_eq!(n, 1, "event {id}: not reached, untouched");
            assert_eq!(
                t.store.history(*id).await.unwrap().len(),
                1,
                "event {id}: only its attempt"
            );
        }
    }
    let r = reqwest::Client::new()
        .delete(t.api_url(&href))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let r = reqwest::Client::new()
        .delete(t.api_url("/admin/operations/op-nope"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    t.stop().await;
}

/// The sidecar killed (SIGKILL) mid-replay and started again under the
/// same name (a pod's container restarted): it carries the replay on from
/// its cursor; every row is replayed once, save those whose request was
/// under way at the kill (at most `max_in_flight`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: make test-long"]
async fn a_replay_cut_by_a_kill_is_carried_on_after_the_restart() {
    let t = prepare_on(
        Kafka::start(),
        Options::default(),
        Receiver::accepting().await,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = child::write_config(&t, dir.path());
    let log = dir.path().join("sidecar.log");
    let api_port = child::free_port();
    let env = [
        ("OUTBOX__ADMIN__API_LISTEN", format!("127.0.0.1:{api_port}")),
        ("OUTBOX__HISTORY__REPLICA", "pod-a".to_owned()),
    ];
    let api = format!("http://127.0.0.1:{api_port}");
    let token = "crash-admin-token-0123456789";
    let s = child::spawn_with(&config, &log, &env);
    crate::harness::wait_ready("the sidecar", &s.base, T).await;
    let ids = insert_many(&t, "accounts.purchase_create", 2_000).await;
    all_sent(&t, &ids).await;
    let r = reqwest::Client::new()
        .post(format!(
            "{api}/admin/events/replay?sent_since=2000-01-01T00:00:00Z&rate=200&confirm=2000"
        ))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let started: Value = r.json().await.unwrap();
    let op = started["id"].as_str().unwrap().to_owned();
    eventually("the replay under way", T, || async {
        let row = t.store.operation(&op).await.ok()??;
        (row.progress >= 500).then_some(())
    })
    .await;
    child::crash(s);
    let at_kill = t.store.operation(&op).await.unwrap().unwrap();
    assert_eq!(at_kill.state, "running");
    let s = child::spawn_with(&config, &log, &env);
    crate::harness::wait_ready("the sidecar again", &s.base, T).await;
    let end = eventually(
        "the replay carried on to its end",
        Duration::from_secs(90),
        || async {
            let row = t.store.operation(&op).await.ok()??;
            (row.state != "running").then_some(row)
        },
    )
    .await;
    assert_eq!(end.state, "done", "{end:?}");
    assert_eq!(end.progress, 2_000, "{end:?}");
    all_sent(&t, &ids).await;
    let by_id = replayed(&t, &op);
    let twice: Vec<_> = by_id.iter().filter(|(_, n)| **n > 1).collect();
    for id in &ids {
        assert!(by_id.contains_key(id), "event {id} replayed");
    }
    assert!(
        twice.len() <= t.opts.max_in_flight,
        "replayed more than once beyond those in flight at the kill: {twice:?}"
    );
    println!(
        "replay killed at {} of 2000 (cursor {:?}); carried on to the end; {} replayed twice (in flight at the kill)",
        at_kill.progress,
        at_kill.cursor,
        twice.len()
    );
    let mut s = s;
    let _ = s.child.kill();
    let _ = s.child.wait();
}

/// Waits until every row of `ids` is sent; else fails with why the first
/// one that is not waits (`GET /admin/events/{id}/why`).
async fn sent_or_why(t: &TestApp, ids: &[i64], when: &str) {
    let deadline = Instant::now() + T;
    loop {
        let mut waiting = None;
        for id in ids {
            if t.row(*id).await.status != Status::Sent {
                waiting = Some(*id);
                break;
            }
        }
        let Some(id) = waiting else { return };
        if Instant::now() > deadline {
            let mut chain = Vec::new();
            let mut next = Some(id);
            while let Some(n) = next.take().filter(|_| chain.len() < 4) {
                let why = get(t.api_url(&format!("/admin/events/{n}/why"))).await;
                next = why["action"]
                    .as_str()
                    .and_then(|a| a.strip_prefix("ask why event "))
                    .and_then(|a| a.split(' ').next())
                    .and_then(|n| n.parse().ok());
                chain.push(why);
            }
            panic!("{when}: event {id} not sent within {T:?}: {chain:#?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `[ordering]`: an aggregate's replayed events go in id order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_aggregates_are_replayed_in_order() {
    let mut t = prepare_on(
        Kafka::start(),
        Options {
            extra_toml: crate::ordering::ORDERING.to_owned(),
            ..Options::default()
        },
        Receiver::accepting().await,
    )
    .await;
    crate::ordering::add_aggregate_column(&t).await;
    t.start().await;
    let db = t.store.connection().clone();
    let table = t.store.table().to_owned();
    let mut ids = Vec::new();
    for i in 0..60 {
        ids.push(crate::ordering::insert_in(&db, &table, &format!("agg-{}", i % 3)).await);
    }
    sent_or_why(&t, &ids, "before the replay").await;
    let (status, started) =
        post(t.api_url("/admin/events/replay?sent_since=2000-01-01T00:00:00Z&rate=1000")).await;
    assert_eq!(status, 202, "{started}");
    let op = started["id"].as_str().unwrap().to_owned();
    let end = crate::operations::operation_end(|p| t.api_url(p), &started).await;
    assert_eq!(end["state"], "done", "{end}");
    sent_or_why(&t, &ids, "after the replay").await;
    // Each aggregate's replayed requests in id order.
    let mut by_aggregate: HashMap<usize, Vec<i64>> = HashMap::new();
    for r in t.receiver.requests() {
        if r.headers.get("outbox-replay") == Some(&op) {
            let i = ids.iter().position(|id| *id == r.id).unwrap();
            by_aggregate.entry(i % 3).or_default().push(r.id);
        }
    }
    for (a, got) in &by_aggregate {
        let mut sorted = got.clone();
        sorted.sort_unstable();
        assert_eq!(got, &sorted, "aggregate agg-{a} replayed in id order");
        assert_eq!(got.len(), 20);
    }
    t.stop().await;
}
