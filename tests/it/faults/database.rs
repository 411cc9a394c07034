//! Database faults: every sidecar connection killed mid-run, and the
//! database unreachable for 20 s (readiness 503, no offset committed past a
//! status not yet written, work resumes).

use crate::harness::child::inserts_below;
use std::time::{Duration, Instant};

use entity::Status;
use sea_orm::{ConnectionTrait, Statement};
use wiremock::ResponseTemplate;

use super::check::{all_rows, check, Spec};
use super::setup::{insert_many, prepare, scale, settle, start_with, T};
use crate::harness::proxy::Proxy;
use crate::harness::{eventually, receiver, Options, Receiver, TestApp};

/// Terminates every backend of the test database but the feed's LISTEN
/// connection (a lost notification would be a harness fault, not the
/// sidecar's) and this one; returns how many were terminated.
async fn kill_connections(t: &TestApp) -> usize {
    let db = sea_orm::Database::connect(&t.db.url)
        .await
        .expect("connect");
    let rows = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT pg_terminate_backend(pid) AS killed FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
             AND query NOT ILIKE 'listen%'",
        ))
        .await
        .expect("pg_terminate_backend");
    let _ = db.close().await;
    rows.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sidecar_connection_killed_mid_run() {
    let receiver = Receiver::start(|r| {
        if r.id % 4 == 0 && r.nth == 0 {
            ResponseTemplate::new(503)
        } else {
            receiver::slow(200, Duration::from_millis(250))
        }
    })
    .await;
    let opts = Options {
        max_in_flight: 4,
        ..Options::default()
    };
    let mut t = prepare(opts, receiver, 1).await;
    t.start().await;
    let n = 30 * scale();
    insert_many(&t, n, "kill").await;
    let mut killed = 0;
    for quarter in 1..=3 {
        let want = n * quarter / 4;
        eventually("requests to progress", T, || async {
            (t.receiver.requests().len() >= want).then_some(())
        })
        .await;
        killed += kill_connections(&t).await;
    }
    settle(&t, &t.group, T).await;
    let mut spec = Spec::new("database connections killed", &t);
    spec.faults = killed;
    check(&t, &spec).await;
    t.stop().await;
}

/// Fails when a committed offset passes an insert whose row is not final.
async fn assert_commits_follow_statuses(t: &TestApp, when: &str) -> i64 {
    let committed = t.kafka.committed(&t.group, &t.topic, t.opts.partitions);
    let rows = all_rows(t).await;
    for (p, c) in committed.iter().enumerate() {
        for id in inserts_below(&t.kafka.brokers, &t.topic, p as i32, *c) {
            let row = rows.iter().find(|r| r.id == id).expect("row");
            assert_ne!(
                row.status,
                Status::Pending,
                "{when}: event {id} committed in partition {p} (offset {c}) but its status is not written"
            );
        }
    }
    committed.iter().filter(|c| **c > 0).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_unreachable_for_20s() {
    let receiver = Receiver::start(|r| {
        if r.id % 5 == 0 && r.nth == 0 {
            ResponseTemplate::new(500)
        } else {
            receiver::slow(200, Duration::from_millis(200))
        }
    })
    .await;
    let opts = Options {
        max_in_flight: 8,
        ..Options::default()
    };
    let t = prepare(opts, receiver, 1).await;
    let url = url::Url::parse(&t.db.url).expect("database url");
    let target = tokio::net::lookup_host((
        url.host_str().expect("host").to_owned(),
        url.port().unwrap_or(5432),
    ))
    .await
    .expect("resolve the database host")
    .next()
    .expect("an address");
    let proxy = Proxy::start(target).await;
    let mut settings = t.settings(&t.group);
    let mut via_proxy = url.clone();
    via_proxy.set_ip_host(proxy.addr.ip()).unwrap();
    via_proxy.set_port(Some(proxy.addr.port())).unwrap();
    settings.database.url = Some(outbox_sidecar::config::DatabaseUrl::new(
        via_proxy.to_string(),
    ));
    settings.database.connect_timeout = Duration::from_secs(1);
    let app = start_with(settings).await;
    let ready = format!("http://{}/readyz", app.admin_addr());

    let n = 20 * scale();
    insert_many(&t, n, "before").await;
    eventually("some requests before the outage", T, || async {
        (t.receiver.requests().len() >= 5).then_some(())
    })
    .await;
    proxy.set_down(true);
    let down_at = Instant::now();
    eventually("readiness 503 while the database is down", T, || async {
        let r = reqwest::get(&ready).await.ok()?;
        (r.status() == 503).then_some(())
    })
    .await;
    // Work keeps arriving during the outage (the feed reaches the database
    // directly; only the sidecar is cut off).
    insert_many(&t, n / 2, "during").await;
    let outage = Duration::from_secs(20);
    let mut checks = 0;
    while down_at.elapsed() < outage {
        assert_commits_follow_statuses(&t, "during the outage").await;
        checks += 1;
        let left = outage.saturating_sub(down_at.elapsed());
        tokio::time::sleep(left.min(Duration::from_secs(4))).await;
    }
    // Requests that got a 2xx whose status could not be written yet.
    let rows = all_rows(&t).await;
    let unwritten = t
        .receiver
        .requests()
        .iter()
        .filter(|r| r.status < 300)
        .filter(|r| {
            rows.iter()
                .any(|row| row.id == r.id && row.status == Status::Pending)
        })
        .count();
    assert_commits_follow_statuses(&t, "at the end of the outage").await;
    let r = reqwest::get(&ready).await.unwrap();
    assert_eq!(
        r.status(),
        503,
        "still not ready after {:?}",
        down_at.elapsed()
    );
    proxy.set_down(false);
    eventually("ready again", T, || async {
        (reqwest::get(&ready).await.ok()?.status() == 200).then_some(())
    })
    .await;
    settle(&t, &t.group, T).await;
    assert_commits_follow_statuses(&t, "after the outage").await;
    println!(
        "faults database outage: down {:?}, {checks} offset checks, {unwritten} 2xx waiting for their status write",
        down_at.elapsed()
    );
    let mut spec = Spec::new("database unreachable 20s", &t);
    spec.faults = 1;
    check(&t, &spec).await;
    app.stop().await;
}
