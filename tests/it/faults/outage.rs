//! An outage of the accounts API, as operators live it (issue #18): with
//! the breaker on nothing fails; with it off R-004's 3 attempts fail every
//! event and a filtered resend brings them all to `sent`; a pause during a
//! burst holds every event pending with no attempt used, across a restart,
//! until the resume sends each once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use entity::Status;
use serde_json::json;
use wiremock::ResponseTemplate;

use super::check::{all_rows, check, Spec};
use super::setup::{insert_many, prepare, scale, settle, T};
use crate::harness::{eventually, metric, Options, Receiver};

const TOKEN: &str = "test-admin-token-0123456789";
/// The outage the issue names.
const OUTAGE: Duration = Duration::from_secs(60);

/// A receiver that answers 503 while `down`, else 200.
async fn switchable() -> (Receiver, Arc<AtomicBool>) {
    let down = Arc::new(AtomicBool::new(true));
    let d = down.clone();
    let receiver = Receiver::start(move |_| {
        if d.load(Ordering::SeqCst) {
            ResponseTemplate::new(503).set_body_string("maintenance window")
        } else {
            ResponseTemplate::new(200)
        }
    })
    .await;
    (receiver, down)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_down_60s_with_the_breaker_nothing_fails() {
    let (receiver, down) = switchable().await;
    let opts = Options {
        retry_delay: "1s",
        extra_toml:
            "[dispatchers.accounts.breaker]\nfailures = 5\nwithin = \"30s\"\ncool_down = \"5s\"\n"
                .into(),
        ..Options::default()
    };
    let mut t = prepare(opts, receiver, 1).await;
    t.start().await;
    let started = Instant::now();
    let mut events = insert_many(&t, 20 * scale(), "outage").await.len();
    let base = t.admin_url("");
    eventually("the breaker to open", Duration::from_secs(30), || {
        let base = base.clone();
        async move {
            let state = metric(
                &base,
                "outbox_dispatcher_breaker_state{dispatcher=\"accounts\"}",
            )
            .await?;
            (state >= 1.0).then_some(())
        }
    })
    .await;
    // More events arrive while the API is down.
    while started.elapsed() < OUTAGE {
        events += insert_many(&t, 5, "outage").await.len();
        tokio::time::sleep(Duration::from_secs(10).min(OUTAGE.saturating_sub(started.elapsed())))
            .await;
    }
    let stats = t.store.stats().await.unwrap();
    assert_eq!(stats.failed, 0, "no event failed during the outage");
    let during = t.receiver.requests().len();
    // Held events use no attempt: the requests of the outage are those in
    // flight when the breaker opened and one probe per cool-down, not 3
    // per event.
    let bound = t.opts.max_in_flight + (OUTAGE.as_secs() / 5) as usize + 3;
    assert!(
        during <= bound,
        "{during} requests during the outage for {events} events (bound {bound})"
    );
    down.store(false, Ordering::SeqCst);
    settle(&t, &t.group, T).await;
    let figures = check(&t, &Spec::new("outage-breaker", &t)).await;
    assert_eq!(figures.events, events);
    let rows = all_rows(&t).await;
    assert!(
        rows.iter().all(|r| r.status == Status::Sent),
        "every event sent after the API came back"
    );
    println!("outage-breaker: {events} events, {during} requests during a {OUTAGE:?} outage");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_down_without_the_breaker_fails_then_a_filtered_resend_sends_all() {
    let (receiver, down) = switchable().await;
    let mut t = prepare(Options::default(), receiver, 1).await;
    t.start().await;
    let k = 20 * scale();
    insert_many(&t, k, "outage").await;
    // every event fails after its 3 attempts (the outage outlasts them).
    settle(&t, &t.group, T).await;
    let figures = check(&t, &Spec::new("outage-no-breaker", &t)).await;
    assert_eq!(figures.events, k);
    assert_eq!(t.store.stats().await.unwrap().failed as usize, k);
    down.store(false, Ordering::SeqCst);

    let client = reqwest::Client::new();
    let url = |q: &str| {
        t.api_url(&format!(
            "/admin/events/retry?dispatcher=accounts&error_contains=503{q}"
        ))
    };
    let dry: serde_json::Value = client
        .post(url("&dry_run=true"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(dry["would_resend"], json!(k), "{dry}");
    let done: serde_json::Value = client
        .post(url("&label=after-the-outage"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let done = crate::operations::operation_end(|p| t.api_url(p), &done).await;
    assert_eq!(
        (done["state"].as_str(), done["progress"].as_u64()),
        (Some("done"), Some(k as u64)),
        "{done}"
    );
    settle(&t, &t.group, T).await;
    for row in all_rows(&t).await {
        assert_eq!(row.status, Status::Sent, "event {}", row.id);
        let oks = t
            .receiver
            .for_id(row.id)
            .iter()
            .filter(|r| r.status == 200)
            .count();
        assert_eq!(oks, 1, "event {}: one 2xx", row.id);
        let history = t.store.history(row.id).await.unwrap();
        let kinds: Vec<&str> = history.iter().map(|h| h.kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["attempt", "attempt", "attempt", "resend", "attempt"],
            "event {}: {history:?}",
            row.id
        );
        assert_eq!(history[3].label.as_deref(), Some("after-the-outage"));
    }
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_during_a_burst_restart_while_paused_then_resume() {
    // 50 ms a request, 4 at a time: the burst takes seconds to send, so the
    // pause lands in the middle of it however loaded the machine is.
    let receiver =
        Receiver::start(|_| ResponseTemplate::new(200).set_delay(Duration::from_millis(50))).await;
    let mut t = prepare(
        Options {
            max_in_flight: 4,
            ..Options::default()
        },
        receiver,
        1,
    )
    .await;
    t.start().await;
    let burst = 200 * scale();
    insert_many(&t, burst, "burst").await;
    eventually("the burst to start", Duration::from_secs(30), || async {
        (!t.receiver.requests().is_empty()).then_some(())
    })
    .await;
    let client = reqwest::Client::new();
    let paused: serde_json::Value = client
        .post(t.api_url("/admin/dispatchers/accounts/pause?label=maintenance"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(paused["changed"], json!(true), "{paused}");
    let base = t.admin_url("");
    eventually(
        "the replica to see the pause",
        Duration::from_secs(10),
        || {
            let base = base.clone();
            async move {
                let v = metric(&base, "outbox_dispatcher_paused{dispatcher=\"accounts\"}").await?;
                (v == 1.0).then_some(())
            }
        },
    )
    .await;
    let seen = t.receiver.requests().len();
    // Every change event is finished (parked) although rows stay pending:
    // nothing blocks the partition's commits.
    t.wait_all_committed(&t.group, T).await;
    let at_commit = t.receiver.requests().len();
    assert!(
        at_commit - seen <= t.opts.max_in_flight,
        "only requests already in flight end after the pause is seen ({seen} -> {at_commit})"
    );
    let pending = t.store.stats().await.unwrap().pending as usize;
    assert_eq!(pending, burst - at_commit, "the rest stay pending");
    assert!(pending > 0, "the pause came before the burst was sent");
    for row in all_rows(&t)
        .await
        .iter()
        .filter(|r| r.status == Status::Pending)
    {
        assert_eq!(
            row.attempts, 0,
            "event {}: no attempt used while paused",
            row.id
        );
    }
    let parked = metric(&base, "outbox_events_parked_total{dispatcher=\"accounts\"}")
        .await
        .unwrap_or(0.0);
    assert!(
        parked >= pending as f64,
        "parked {parked} < pending {pending}"
    );

    // A restart while paused, and more events: still nothing sent.
    t.stop().await;
    t.start().await;
    insert_many(&t, 20, "after-restart").await;
    t.wait_all_committed(&t.group, T).await;
    assert_eq!(
        t.receiver.requests().len(),
        at_commit,
        "nothing sent while paused"
    );

    let list = crate::cli::bin()
        .env("OUTBOX__DATABASE__URL", &t.db.url)
        .env("OUTBOX__DISPATCHERS__ACCOUNTS__URL", t.receiver.url())
        .env(
            "OUTBOX__DISPATCHERS__ACCOUNTS__EVENTS",
            "accounts.purchase_create",
        )
        .args(["dispatchers", "list"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.contains("paused since"), "{text}");
    assert!(text.contains("via admin-api (maintenance)"), "{text}");

    let resumed: serde_json::Value = client
        .post(t.api_url("/admin/dispatchers/accounts/resume"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let resumed = crate::operations::operation_end(|p| t.api_url(p), &resumed).await;
    assert_eq!(
        (resumed["state"].as_str(), resumed["progress"].as_u64()),
        (Some("done"), Some((pending + 20) as u64)),
        "{resumed}"
    );
    settle(&t, &t.group, T).await;
    let figures = check(&t, &Spec::new("pause-restart-resume", &t)).await;
    assert_eq!(figures.events, burst + 20);
    assert_eq!(figures.duplicates, 0);
    for row in all_rows(&t).await {
        assert_eq!(
            (row.status, row.attempts),
            (Status::Sent, 0),
            "event {}",
            row.id
        );
    }
    t.stop().await;
}

/// The CLI as an operator runs it against the test's database, with the
/// test's dispatcher.
fn operator_cli(t: &crate::harness::TestApp, args: &[&str]) -> (Option<i32>, String, String) {
    let out = crate::cli::bin()
        .env("OUTBOX__DATABASE__URL", &t.db.url)
        .env("OUTBOX__DISPATCHERS__ACCOUNTS__URL", t.receiver.url())
        .env(
            "OUTBOX__DISPATCHERS__ACCOUNTS__EVENTS",
            "accounts.purchase_create,accounts.installment_paid,accounts.installment_overdue",
        )
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A resume whose touch fails after the pause row is gone (a statement
/// timeout, a failover, the CLI killed): it says what to do, and doing it
/// (resuming again) announces every parked event, each sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_that_fails_half_way_is_finished_by_resuming_again() {
    use sea_orm::ConnectionTrait;
    let receiver = Receiver::start(|_| ResponseTemplate::new(200)).await;
    let mut t = prepare(Options::default(), receiver, 1).await;
    t.start().await;
    let (code, out, err) = operator_cli(&t, &["dispatchers", "pause", "accounts"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let base = t.admin_url("");
    eventually(
        "the replica to see the pause",
        Duration::from_secs(10),
        || {
            let base = base.clone();
            async move {
                let v = metric(&base, "outbox_dispatcher_paused{dispatcher=\"accounts\"}").await?;
                (v == 1.0).then_some(())
            }
        },
    )
    .await;
    let ids = insert_many(&t, 3, "parked").await;
    eventually("3 events parked", T, || {
        let base = base.clone();
        async move {
            let v = metric(&base, "outbox_events_parked_total{dispatcher=\"accounts\"}").await?;
            (v >= 3.0).then_some(())
        }
    })
    .await;
    t.wait_all_committed(&t.group, T).await;
    assert!(
        t.receiver.requests().is_empty(),
        "nothing sent while paused"
    );

    // The fault: every UPDATE of the outbox table fails, as a statement
    // timeout on the application's role would.
    let db = t.store.connection();
    let table = t.store.table().to_owned();
    db.execute_unprepared(&format!(
        "CREATE FUNCTION fail_touch() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'canceling statement due to statement timeout'; END $$; \
         CREATE TRIGGER fail_touch BEFORE UPDATE ON {table} \
         FOR EACH ROW EXECUTE FUNCTION fail_touch()"
    ))
    .await
    .unwrap();
    let (code, out, err) = operator_cli(&t, &["dispatchers", "resume", "accounts"]);
    assert_ne!(code, Some(0), "the failed resume fails: {out}{err}");
    assert!(
        err.contains("the resume did not finish")
            && err.contains("statement timeout")
            && err.contains("none is lost")
            && err.contains("run the resume again (outbox-sidecar dispatchers resume accounts)"),
        "the error says what happened and what to do: {err}"
    );
    db.execute_unprepared(&format!("DROP TRIGGER fail_touch ON {table}"))
        .await
        .unwrap();

    // The pause row is gone; resuming again still announces the parked rows.
    let (code, out, err) = operator_cli(&t, &["dispatchers", "resume", "accounts"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("3 pending event(s) announced again"), "{out}");
    eventually("the 3 parked events to be sent", T, || async {
        let rows = all_rows(&t).await;
        rows.iter().all(|r| r.status == Status::Sent).then_some(())
    })
    .await;
    settle(&t, &t.group, T).await;
    let mut sent: Vec<i64> = t.receiver.requests().iter().map(|r| r.id).collect();
    sent.sort_unstable();
    assert_eq!(sent, ids, "each parked event sent once");
    t.stop().await;
}

/// Waits until the accounts breaker's gauge reads `state`.
async fn breaker_state_becomes(t: &crate::harness::TestApp, state: f64, limit: Duration) {
    let base = t.admin_url("");
    eventually(
        &format!("the accounts breaker's gauge to read {state}"),
        limit,
        || {
            let base = base.clone();
            async move {
                let v = metric(
                    &base,
                    "outbox_dispatcher_breaker_state{dispatcher=\"accounts\"}",
                )
                .await?;
                (v == state).then_some(())
            }
        },
    )
    .await;
}

/// A second dispatcher, `billing`, at `url`.
fn billing(url: &str) -> String {
    format!("[dispatchers.billing]\nurl = \"{url}\"\nevents = [\"billing.invoice_issued\"]\n")
}

/// CONTRACT §5: one slow call never stops the others. With the accounts
/// breaker open and 120 accounts events behind it, a healthy dispatcher's
/// events go at once and every partition commits: held events are parked,
/// not kept waiting in the job bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_holds_back_no_other_dispatcher() {
    let accounts = Receiver::start(|_| ResponseTemplate::new(500)).await;
    let other = Receiver::start(|_| ResponseTemplate::new(200)).await;
    let opts = Options {
        max_in_flight: 2,
        retry_delay: "1s",
        extra_toml: format!(
            "{}[dispatchers.accounts.breaker]\nfailures = 2\nwithin = \"30s\"\ncool_down = \"60s\"\n",
            billing(&other.url())
        ),
        ..Options::default()
    };
    let mut t = prepare(opts, accounts, 1).await;
    t.start().await;
    insert_many(&t, 120, "behind-the-breaker").await;
    breaker_state_becomes(&t, 1.0, T).await;
    let mut billing_ids = Vec::new();
    for n in 0..5 {
        billing_ids.push(
            t.insert("billing.invoice_issued", json!({"mode": "billing", "n": n}))
                .await,
        );
    }
    eventually(
        "the 5 billing events to be sent",
        Duration::from_secs(10),
        || async {
            let mut got: Vec<i64> = other.requests().iter().map(|r| r.id).collect();
            got.sort_unstable();
            got.dedup();
            (got == billing_ids).then_some(())
        },
    )
    .await;
    // Every accounts event is finished (sent nowhere, parked): the
    // partitions commit, and no row used more than the attempts that
    // opened the breaker.
    t.wait_all_committed(&t.group, T).await;
    let rows = all_rows(&t).await;
    let accounts_rows: Vec<_> = rows
        .iter()
        .filter(|r| r.event_name.starts_with("accounts."))
        .collect();
    assert!(accounts_rows.iter().all(|r| r.status == Status::Pending));
    let attempts: i32 = accounts_rows.iter().map(|r| r.attempts).sum();
    assert!(
        attempts <= 4,
        "only the failures that opened the breaker (and those in flight) used attempts: {attempts}"
    );
    t.stop().await;
}

/// Parked behind the breaker, then the receiver recovers: the cool-down's
/// probe succeeds, the breaker closes and every parked event is announced
/// again and sent; none failed, the gauge back to closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_parked_by_the_breaker_are_sent_when_it_closes() {
    let (receiver, down) = switchable().await;
    let opts = Options {
        max_in_flight: 2,
        retry_delay: "1s",
        extra_toml:
            "[dispatchers.accounts.breaker]\nfailures = 2\nwithin = \"30s\"\ncool_down = \"2s\"\n"
                .into(),
        ..Options::default()
    };
    let mut t = prepare(opts, receiver, 1).await;
    t.start().await;
    let ids = insert_many(&t, 30, "parked-by-the-breaker").await;
    breaker_state_becomes(&t, 1.0, T).await;
    t.wait_all_committed(&t.group, T).await;
    down.store(false, Ordering::SeqCst);
    eventually("every parked event to be sent", T, || async {
        let rows = all_rows(&t).await;
        rows.iter().all(|r| r.status == Status::Sent).then_some(())
    })
    .await;
    breaker_state_becomes(&t, 0.0, T).await;
    let mut sent: Vec<i64> = t.receiver.requests().iter().map(|r| r.id).collect();
    sent.sort_unstable();
    sent.dedup();
    assert_eq!(sent, ids);
    t.stop().await;
}
