//! The binary as Kubernetes runs it: a child process that gets SIGTERM in
//! the middle of its work, logs as JSON, and never prints a secret.

use crate::harness::child::{free_port, inserts_below};
use std::process::Stdio;
use std::time::{Duration, Instant};

use entity::Status;
use serde_json::{json, Value};

use crate::harness::{eventually, receiver, spawn_app_with, Options, Receiver};

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_run_drains_commits_and_a_restart_finishes() {
    let receiver = Receiver::start(|_| receiver::slow(204, Duration::from_millis(400))).await;
    let opts = Options {
        max_in_flight: 4,
        ..Options::default()
    };
    let mut t = spawn_app_with(opts, receiver).await;
    t.stop().await;

    let port = free_port();
    let api_port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sidecar.toml");
    let db_url = t.db.url.replace("postgres@", "postgres:db-password-123@");
    let toml = format!(
        r#"
[database]
url = "{db_url}"
[kafka]
brokers = "{brokers}"
topic = "{topic}"
group_id = "{group}"
[kafka.properties]
"session.timeout.ms" = "6000"
[dispatch]
retry_delay = "300ms"
max_in_flight = 4
[dispatchers.accounts]
url = "{url}"
events = ["accounts.purchase_create"]
timeout = "5s"
[dispatchers.accounts.headers]
Authorization = "Bearer header-secret-789"
[admin]
listen = "127.0.0.1:{port}"
api_listen = "127.0.0.1:{api_port}"
token = "admin-token-456-0123456789ab"
[shutdown]
drain_timeout = "5s"
[log]
format = "json"
level = "debug"
"#,
        brokers = t.kafka.brokers,
        topic = t.topic,
        group = t.group,
        url = t.receiver.url(),
    );
    std::fs::write(&config, toml).unwrap();
    let log_path = dir.path().join("stderr.log");
    let mut child = crate::cli::bin()
        .args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    crate::harness::wait_ready("the child to be ready", &base, T).await;
    // Admin calls with a wrong and a right token: neither may be logged.
    let c = reqwest::Client::new();
    let wrong = c
        .get(format!("http://127.0.0.1:{api_port}/admin/events"))
        .bearer_auth("wrong-token-111")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let right = c
        .get(format!("http://127.0.0.1:{api_port}/admin/events"))
        .bearer_auth("admin-token-456-0123456789ab")
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), 200);

    let mut ids = Vec::new();
    for i in 0..24 {
        ids.push(t.insert("accounts.purchase_create", json!({"n": i})).await);
    }
    eventually("some requests", T, || async {
        (t.receiver.requests().len() >= 3).then_some(())
    })
    .await;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let stopped_at = Instant::now();
    let exit = eventually("the child to exit", Duration::from_secs(15), || {
        let r = child.try_wait().unwrap();
        async move { r }
    })
    .await;
    assert_eq!(exit.code(), Some(0), "exit code after SIGTERM");
    assert!(
        stopped_at.elapsed() < Duration::from_secs(5 + 3),
        "took {:?}",
        stopped_at.elapsed()
    );

    // No committed offset passes unfinished work: every insert below the
    // committed offset is sent.
    let committed = t.kafka.committed(&t.group, &t.topic, t.opts.partitions);
    let mut finished_before_restart = 0;
    for (p, c) in committed.iter().enumerate() {
        for id in inserts_below(&t.kafka.brokers, &t.topic, p as i32, *c) {
            assert_eq!(
                t.row(id).await.status,
                Status::Sent,
                "event {id} committed in partition {p} but not sent"
            );
            finished_before_restart += 1;
        }
    }
    let sent_before = t.receiver.requests().len();
    assert!(
        sent_before < ids.len(),
        "the SIGTERM came before the end of the work"
    );

    // A restart finishes every row, each sent exactly once.
    t.start().await;
    for id in &ids {
        t.wait_status(*id, Status::Sent, T).await;
    }
    t.wait_all_committed(&t.group, T).await;
    for id in &ids {
        assert_eq!(
            t.receiver.for_id(*id).len(),
            1,
            "event {id}: a graceful stop sends nothing twice"
        );
    }
    println!("sigterm: {} events, {sent_before} sent before the signal, {finished_before_restart} committed", ids.len());

    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("shutdown requested"), "{log}");
    for secret in [
        "db-password-123",
        "admin-token-456-0123456789ab",
        "header-secret-789",
        "wrong-token-111",
    ] {
        assert!(!log.contains(secret), "{secret} appears in the logs");
    }
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v.get("level").is_some() && v.get("timestamp").is_some(),
            "{line}"
        );
    }
    assert!(
        log.lines()
            .any(|l| l.contains("\"id\":")
                && l.contains("\"event_name\":\"accounts.purchase_create\"")),
        "a span per event carries id and event_name"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once() {
    let receiver = Receiver::start(|_| receiver::slow(204, Duration::from_secs(8))).await;
    let mut t = spawn_app_with(Options::default(), receiver).await;
    t.stop().await;
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sidecar.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = \"{db}\"\n[kafka]\nbrokers = \"{brokers}\"\ntopic = \"{topic}\"\ngroup_id = \"{group}\"\n\
             [dispatchers.accounts]\nurl = \"{url}\"\nevents = [\"accounts.purchase_create\"]\ntimeout = \"20s\"\n\
             [admin]\nlisten = \"127.0.0.1:{port}\"\napi_listen = \"127.0.0.1:0\"\n[shutdown]\ndrain_timeout = \"15s\"\n",
            db = t.db.url,
            brokers = t.kafka.brokers,
            topic = t.topic,
            group = t.group,
            url = t.receiver.url(),
        ),
    )
    .unwrap();
    let mut child = crate::cli::bin()
        .args(["run", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    crate::harness::wait_ready("the child to be ready", &base, T).await;
    t.insert("accounts.purchase_create", json!({})).await;
    eventually("the slow request to start", T, || async {
        (!t.receiver.requests().is_empty()).then_some(())
    })
    .await;
    let pid = child.id().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    // The first signal drains (the request has 8 s to go); the second ends it.
    eventually("the drain to start", T, || async {
        let r = reqwest::get(format!("{base}/readyz")).await.ok()?;
        let body: Value = r.json().await.ok()?;
        (body["reason"] == "shutting down").then_some(())
    })
    .await;
    let signalled = Instant::now();
    std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    let exit = eventually("the child to exit", Duration::from_secs(5), || {
        let r = child.try_wait().unwrap();
        async move { r }
    })
    .await;
    assert_eq!(exit.code(), Some(130));
    assert!(
        signalled.elapsed() < Duration::from_secs(3),
        "took {:?}",
        signalled.elapsed()
    );
}
