//! What the operators rely on: metrics with exact values, health, the admin
//! API and its authentication, shutdown on SIGTERM, configuration errors,
//! and secrets kept out of every output (CONTRACT §6, §8, §9).

use std::time::Duration;

use entity::Status;
use outbox_sidecar::app::App;
use serde_json::{json, Value};
use wiremock::ResponseTemplate;

use crate::harness::{eventually, spawn_app, spawn_app_with, Options, Receiver};

const T: Duration = Duration::from_secs(30);
const TOKEN: &str = "test-admin-token-0123456789";

/// Follows an operation the admin API answered 202 with (`started`, its
/// body) at `api_url(href)` until it ends; its last view.
pub(crate) async fn operation_end(api_url: impl Fn(&str) -> String, started: &Value) -> Value {
    let href = started["href"]
        .as_str()
        .unwrap_or_else(|| panic!("no href in {started}"));
    assert_eq!(started["state"], "running", "{started}");
    let url = api_url(href);
    eventually("the operation to end", T, || async {
        let r = reqwest::Client::new()
            .get(&url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .ok()?;
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.ok()?;
        (v["state"] != "running").then_some(v)
    })
    .await
}

/// The value of one sample in the exposition text, e.g.
/// `outbox_dispatch_total{event_name="x",outcome="success"}`.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

async fn scrape(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_exact_counts_and_follow_a_resend() {
    let receiver = Receiver::start(|r| {
        let body: Value = serde_json::from_slice(&r.body).unwrap_or_default();
        if body["reject"] == true && r.nth < 3 {
            ResponseTemplate::new(500)
        } else {
            ResponseTemplate::new(200)
        }
    })
    .await;
    let t = spawn_app_with(Options::default(), receiver).await;
    let base = t.admin_url("");
    let ok1 = t.insert("accounts.purchase_create", json!({})).await;
    let ok2 = t.insert("accounts.installment_paid", json!({})).await;
    let bad = t
        .insert("accounts.purchase_create", json!({"reject": true}))
        .await;
    t.wait_status(ok1, Status::Sent, T).await;
    t.wait_status(ok2, Status::Sent, T).await;
    t.wait_status(bad, Status::Failed, T).await;
    t.wait_all_committed(&t.group, T).await;
    let m = eventually("the gauges to show the failed row", T, || async {
        let m = scrape(&base).await;
        (sample(&m, "outbox_events_failed") == Some(1.0)
            && sample(&m, "outbox_events_pending") == Some(0.0))
        .then_some(m)
    })
    .await;
    let s = |series: &str| sample(&m, series).unwrap_or_else(|| panic!("no sample {series}\n{m}"));
    assert_eq!(
        s(r#"outbox_dispatch_total{event_name="accounts.purchase_create",outcome="success"}"#),
        1.0
    );
    assert_eq!(
        s(r#"outbox_dispatch_total{event_name="accounts.purchase_create",outcome="failure"}"#),
        3.0
    );
    assert_eq!(
        s(r#"outbox_dispatch_total{event_name="accounts.installment_paid",outcome="success"}"#),
        1.0
    );
    assert_eq!(
        s(r#"outbox_transitions_total{event_name="accounts.purchase_create",to="sent"}"#),
        1.0
    );
    assert_eq!(
        s(r#"outbox_transitions_total{event_name="accounts.purchase_create",to="pending"}"#),
        2.0
    );
    assert_eq!(
        s(r#"outbox_transitions_total{event_name="accounts.purchase_create",to="failed"}"#),
        1.0
    );
    // 3 inserts + 2 echoes of the pending failures trigger; 3 final echoes skip.
    assert_eq!(s(r#"outbox_cdc_messages_total{result="triggered"}"#), 5.0);
    assert_eq!(s(r#"outbox_cdc_messages_total{result="skipped"}"#), 3.0);
    assert_eq!(s(r#"outbox_cdc_messages_total{result="invalid"}"#), 0.0);
    assert_eq!(s("outbox_inflight_events"), 0.0);
    assert_eq!(
        s(r#"outbox_dispatch_duration_seconds_count{dispatcher="accounts"}"#),
        5.0
    );
    assert_eq!(s("outbox_oldest_pending_age_seconds"), 0.0);

    // Resend through the admin API: the gauges follow, the pipeline sends it.
    let r = client()
        .post(t.api_url(&format!("/admin/events/{bad}/retry")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let m = scrape(&base).await;
    assert_eq!(
        sample(&m, "outbox_events_failed"),
        Some(0.0),
        "gauges refreshed by the resend"
    );
    t.wait_status(bad, Status::Sent, T).await;
    eventually("pending back to 0", T, || async {
        let m = scrape(&base).await;
        (sample(&m, "outbox_events_pending") == Some(0.0)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_auth_matrix_on_every_route() {
    let t = spawn_app(Options::default()).await;
    let id = t.insert("accounts.purchase_create", json!({})).await;
    t.wait_status(id, Status::Sent, T).await;
    let no_token = App::start({
        let mut s = t.settings(&crate::harness::unique("notoken"));
        s.admin.token = None;
        s
    })
    .await
    .unwrap();
    let no_token_ready = format!("http://{}/readyz", no_token.admin_addr());
    eventually("the second sidecar to be ready", T, || async {
        (reqwest::get(&no_token_ready).await.ok()?.status() == 200).then_some(())
    })
    .await;
    let routes = [
        ("GET", "/admin/events".to_owned(), 200),
        ("GET", format!("/admin/events/{id}"), 200),
        ("POST", format!("/admin/events/{id}/retry"), 409),
        ("POST", "/admin/events/retry?status=failed".to_owned(), 202),
    ];
    for (method, path, ok_status) in &routes {
        let call = |base: String, auth: Option<&'static str>| {
            let mut req = client().request(method.parse().unwrap(), format!("{base}{path}"));
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            async move { req.send().await.unwrap() }
        };
        let disabled = call(
            format!("http://{}", no_token.api_addr()),
            Some("Bearer test-admin-token-0123456789"),
        )
        .await;
        assert_eq!(
            disabled.status(),
            403,
            "{method} {path} with no token configured"
        );
        let body: Value = disabled.json().await.unwrap();
        assert!(body["error"]
            .as_str()
            .unwrap()
            .contains("set admin.token (OUTBOX__ADMIN__TOKEN)"));
        // Issue 17 item 4: the admin API is not on the scraped listener.
        assert_eq!(
            call(t.admin_url(""), Some("Bearer test-admin-token-0123456789"))
                .await
                .status(),
            404,
            "{method} {path} on admin.listen"
        );
        let base = t.api_url("");
        assert_eq!(
            call(base.clone(), None).await.status(),
            401,
            "{method} {path} missing"
        );
        assert_eq!(
            call(base.clone(), Some("Bearer wrong-token"))
                .await
                .status(),
            401,
            "{method} {path} wrong"
        );
        assert_eq!(
            call(base.clone(), Some("Basic dGVzdC1hZG1pbi10b2tlbg=="))
                .await
                .status(),
            401,
            "{method} {path} not bearer"
        );
        assert_eq!(
            call(base.clone(), Some("Bearer test-admin-token-012345678"))
                .await
                .status(),
            401,
            "{method} {path} a prefix of the token"
        );
        assert_eq!(
            call(base.clone(), Some("Bearer test-admin-token-0123456789"))
                .await
                .status(),
            *ok_status,
            "{method} {path} right"
        );
        // RFC 7235: the scheme is case-insensitive.
        assert_eq!(
            call(base.clone(), Some("bearer test-admin-token-0123456789"))
                .await
                .status(),
            *ok_status,
            "{method} {path} right, lower-case scheme"
        );
    }
    // The open routes stay open on both, and only on admin.listen.
    for path in ["/metrics", "/livez", "/readyz"] {
        let status = reqwest::get(t.api_url(path)).await.unwrap().status();
        assert_eq!(status, 404, "{path} on admin.api_listen");
    }
    for base in [t.admin_url(""), format!("http://{}", no_token.admin_addr())] {
        for path in ["/metrics", "/livez", "/readyz"] {
            assert_eq!(
                reqwest::get(format!("{base}{path}"))
                    .await
                    .unwrap()
                    .status(),
                200,
                "{path}"
            );
        }
    }
    no_token.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_list_filters_and_resends_are_dispatched() {
    let reject = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = reject.clone();
    let receiver = Receiver::start(move |_| {
        if flag.load(std::sync::atomic::Ordering::SeqCst) {
            ResponseTemplate::new(503)
        } else {
            ResponseTemplate::new(200)
        }
    })
    .await;
    let t = spawn_app_with(
        Options {
            max_attempts: 1,
            ..Options::default()
        },
        receiver,
    )
    .await;
    let a = t.insert("accounts.purchase_create", json!({})).await;
    let b = t.insert("accounts.installment_paid", json!({})).await;
    let c = t.insert("accounts.installment_paid", json!({})).await;
    for id in [a, b, c] {
        t.wait_status(id, Status::Failed, T).await;
    }
    let get = |path: String| async move {
        let r = client().get(path).bearer_auth(TOKEN).send().await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    let (status, list) =
        get(t.api_url("/admin/events?status=failed&event_name=accounts.installment_paid")).await;
    assert_eq!(status, 200);
    let ids: Vec<i64> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, vec![c, b], "newest first");
    assert_eq!(list[0]["last_error"], "HTTP 503");
    assert_eq!(list[0]["attempts"], 1);
    assert_eq!(list[0]["status"], "failed");
    let (_, limited) = get(t.api_url("/admin/events?limit=1")).await;
    assert_eq!(limited.as_array().unwrap().len(), 1);
    // A full page links to the next one; the last page does not.
    let r = client()
        .get(t.api_url("/admin/events?status=failed&limit=2"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    let link = r.headers()["link"].to_str().unwrap().to_owned();
    assert_eq!(
        link,
        format!("</admin/events?status=failed&limit=2&before={b}>; rel=\"next\"")
    );
    let page: Value = r.json().await.unwrap();
    assert_eq!(page[0]["id"], c);
    let path = link.trim_start_matches('<').split('>').next().unwrap();
    let r = client()
        .get(t.api_url(path))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("link").is_none(), "the last page");
    let page: Value = r.json().await.unwrap();
    assert_eq!(
        page.as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        vec![a]
    );
    let (status, bad) = get(t.api_url("/admin/events?status=done")).await;
    assert_eq!(status, 400);
    assert!(bad["error"]
        .as_str()
        .unwrap()
        .contains("unknown status \"done\""));
    let (status, one) = get(t.api_url(&format!("/admin/events/{a}"))).await;
    assert_eq!(status, 200);
    assert_eq!(one["payload"], json!({}));
    let (status, missing) = get(t.api_url("/admin/events/987654")).await;
    assert_eq!(
        (status, missing["error"].as_str().unwrap()),
        (404, "event 987654 not found")
    );

    reject.store(false, std::sync::atomic::Ordering::SeqCst);
    let post = |path: String| async move {
        let r = client().post(path).bearer_auth(TOKEN).send().await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    let (status, body) = post(t.api_url(&format!("/admin/events/{a}/retry"))).await;
    assert_eq!(status, 200);
    assert_eq!(
        (body["status"].as_str(), body["attempts"].as_i64()),
        (Some("pending"), Some(0))
    );
    let (status, body) =
        post(t.api_url("/admin/events/retry?status=failed&event_name=accounts.installment_paid"))
            .await;
    assert_eq!(status, 202, "{body}");
    let end = operation_end(|p| t.api_url(p), &body).await;
    assert_eq!(
        (
            end["state"].as_str(),
            end["progress"].as_u64(),
            end["kind"].as_str()
        ),
        (Some("done"), Some(2), Some("resend")),
        "{end}"
    );
    for id in [a, b, c] {
        t.wait_status(id, Status::Sent, T).await;
    }
    let (status, conflict) = post(t.api_url(&format!("/admin/events/{a}/retry"))).await;
    assert_eq!(status, 409);
    assert_eq!(conflict["status"], "sent");
    assert_eq!(
        conflict["error"],
        format!("event {a} is sent: only failed events can be resent")
    );
    let (status, _) = post(t.api_url("/admin/events/987654/retry")).await;
    assert_eq!(status, 404);
    // Bodies over the limit are refused before any handler runs.
    let big = client()
        .post(t.api_url(&format!("/admin/events/{a}/retry")))
        .bearer_auth(TOKEN)
        .body(vec![b'x'; 64 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), 413);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_database() {
    let mut t = spawn_app(Options::default()).await;
    t.stop().await;
    // The sidecar reaches the database through a proxy the test can cut.
    let proxy = crate::harness::proxy::Proxy::start("127.0.0.1:5432".parse().unwrap()).await;
    let mut settings = t.settings(&t.group);
    let url = t.db.url.replace("127.0.0.1:5432", &proxy.addr.to_string());
    settings.database.url = Some(outbox_sidecar::config::DatabaseUrl::new(url));
    settings.database.connect_timeout = Duration::from_secs(1);
    let app = App::start(settings).await.unwrap();
    let ready = format!("http://{}/readyz", app.admin_addr());
    eventually("ready", T, || async {
        (reqwest::get(&ready).await.ok()?.status() == 200).then_some(())
    })
    .await;
    proxy.set_down(true);
    let body: Value = eventually("503 while the database is down", T, || async {
        let r = reqwest::get(&ready).await.ok()?;
        (r.status() == 503).then_some(())?;
        r.json().await.ok()
    })
    .await;
    // The route is open: a fixed reason, never the driver's error text
    // (user names, hosts, TLS details).
    assert_eq!(
        body,
        json!({"ready": false, "reason": "database unavailable"}),
        "{body}"
    );
    // Work arriving during the outage waits, and is done when it returns.
    let id = t.insert("accounts.purchase_create", json!({})).await;
    proxy.set_down(false);
    eventually("ready again", T, || async {
        (reqwest::get(&ready).await.ok()?.status() == 200).then_some(())
    })
    .await;
    t.wait_status(id, Status::Sent, T).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_and_readiness_before_and_after_joining() {
    let t = spawn_app(Options::default()).await;
    let r = reqwest::get(t.admin_url("/livez")).await.unwrap();
    assert_eq!(r.status(), 200);
    let r: Value = reqwest::get(t.admin_url("/readyz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["ready"], true);
}

/// A filtered bulk resend through the admin API, its dry run first, and
/// a retrigger: the same code as the CLI's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_filtered_resend_dry_run_and_retrigger() {
    let receiver = Receiver::start(|_| ResponseTemplate::new(503)).await;
    let mut t = spawn_app_with(
        Options {
            max_attempts: 1,
            ..Options::default()
        },
        receiver,
    )
    .await;
    let mut ids = Vec::new();
    for name in ["accounts.purchase_create", "accounts.installment_paid"] {
        ids.push(t.insert(name, json!({})).await);
    }
    for id in &ids {
        t.wait_status(*id, Status::Failed, Duration::from_secs(20))
            .await;
    }
    let client = reqwest::Client::new();
    let post = |path: String| client.post(t.api_url(&path)).bearer_auth(TOKEN).send();
    let dry: Value = post(
        "/admin/events/retry?error_contains=503&event_name=accounts.installment_paid&dry_run=true"
            .into(),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(dry["would_resend"], 1, "{dry}");
    assert_eq!(dry["sample"][0]["id"], ids[1], "{dry}");
    assert_eq!(
        t.row(ids[1]).await.status,
        Status::Failed,
        "a dry run changes nothing"
    );
    let bad = post("/admin/events/retry?failed_since=noon".into())
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let body: Value = bad.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().starts_with("failed_since:"),
        "{body}"
    );
    let started = post("/admin/events/retry?dispatcher=accounts&error_contains=503".into())
        .await
        .unwrap();
    assert_eq!(started.status(), 202);
    let started: Value = started.json().await.unwrap();
    let done = operation_end(|p| t.api_url(p), &started).await;
    assert_eq!(
        (done["state"].as_str(), done["progress"].as_u64()),
        (Some("done"), Some(2)),
        "{done}"
    );
    assert_eq!(done["message"], "2 events set to pending.", "{done}");
    for id in &ids {
        t.wait_status(*id, Status::Failed, Duration::from_secs(20))
            .await;
    }
    let r: Value = post(format!("/admin/events/retrigger?ids={},{}", ids[0], ids[1]))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let r = operation_end(|p| t.api_url(p), &r).await;
    assert_eq!(
        (r["state"].as_str(), r["progress"].as_u64()),
        (Some("done"), Some(0)),
        "failed rows are not retriggered: {r}"
    );
    assert_eq!(
        r["rerun"],
        format!("outbox-sidecar events retrigger {} {}", ids[0], ids[1])
    );
    let bad = post("/admin/events/retrigger".into()).await.unwrap();
    assert_eq!(bad.status(), 400);
    t.stop().await;
}

/// A consumer loop that stops turning (wedged in a call that never
/// returns) fails liveness, so Kubernetes restarts the sidecar; an idle
/// loop keeps turning and stays live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_fails_when_the_consumer_loop_stops_turning() {
    use outbox_sidecar::admin::{router, AdminState};
    use outbox_sidecar::consumer::ConsumerHealth;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    let db = crate::db::TestDb::postgres().await;
    let health = Arc::new(ConsumerHealth::default());
    let state = AdminState {
        store: db.store().await,
        metrics: outbox_sidecar::metrics::Metrics::new(),
        health: health.clone(),
        token: None,
        alive: Arc::new(AtomicBool::new(true)),
        stall_limit: Duration::from_millis(300),
        dispatchers: Default::default(),
        holds: None,
        rates: Default::default(),
        operations: outbox_sidecar::operations::Operations::new(db.store().await, "test"),
        retry_delay: Duration::from_secs(5),
        max_attempts: 3,
        scheduler: None,
        kafka: None,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/livez", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router(state)).await });
    // Turning (as the idle loop's timer makes it): live, however long.
    let beating = {
        let health = health.clone();
        tokio::spawn(async move {
            loop {
                health.beat();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    for _ in 0..10 {
        assert_eq!(reqwest::get(&url).await.unwrap().status(), 200);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Wedged: no more turns.
    beating.abort();
    let body: Value = eventually("liveness to fail", Duration::from_secs(10), || {
        let url = url.clone();
        async move {
            let r = reqwest::get(&url).await.ok()?;
            (r.status() == 503).then_some(r.json().await.ok()?)
        }
    })
    .await;
    let reason = body["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("the consumer loop has not turned for"),
        "{reason}"
    );
}

#[test]
fn bad_configurations_exit_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "[database]\nurl = \"sqlite::memory:\"\nurll = \"x\"\n",
            "error: invalid configuration: unknown field `urll`, expected one of `url`, `url_file`, `table`, `max_connections`, `connect_timeout`, `idle_timeout` for key `database`\n",
        ),
        (
            "[database]\nurl = \"sqlite::memory:\"\n[dispatchers.accounts]\nevents = [\"accounts.purchase_create\"]\n",
            "error: missing setting dispatchers.accounts.url: set it in the configuration file or as OUTBOX__DISPATCHERS__ACCOUNTS__URL\n",
        ),
        (
            "[database]\nurl = \"sqlite::memory:\"\n[dispatch]\nretry_delay = \"5 parsecs\"\n",
            "error: invalid configuration: \"5 parsecs\" is not a duration (expected e.g. \"5s\" or \"200ms\") for key `dispatch.retry_delay`\n",
        ),
        (
            "[database]\nurl = \"sqlite::memory:\"\n[dispatch]\nmax_attempts = \"three\"\n",
            "error: invalid configuration: invalid type: string \"three\", expected an integer for key `dispatch.max_attempts`\n",
        ),
        (
            "[database]\nurl = \"sqlite::memory:\"\n[dispatch]\nmax_attempts = 0\n",
            "error: invalid configuration: dispatch.max_attempts: must be at least 1, got 0\n",
        ),
        (
            "[database]\nurl = \"redis://127.0.0.1\"\n",
            "error: invalid configuration: database.url: \"redis://127.0.0.1\" is not a postgres://, mysql:// or sqlite: URL\n",
        ),
    ];
    for (i, (toml, expected)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&path, toml).unwrap();
        let out = crate::cli::bin()
            .arg("--config")
            .arg(&path)
            .arg("migrate")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{toml}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), *expected);
    }
    // The environment overrides the file, and is checked the same way.
    let out = crate::cli::bin()
        .env("OUTBOX__DATABASE__URL", "sqlite::memory:")
        .env("OUTBOX__DISPATCH__MAX_ATTEMPTS", "lots")
        .arg("config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: invalid configuration: invalid type: string \"lots\", expected an integer for key `dispatch.max_attempts` in the environment\n"
    );
    let out = crate::cli::bin()
        .env("OUTBOX__DATABASE__URL", "sqlite::memory:")
        .arg("run")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: missing setting kafka.brokers: set it in the configuration file or as OUTBOX__KAFKA__BROKERS\n"
    );
}

#[test]
fn config_command_redacts_every_secret() {
    let out = crate::cli::bin()
        .env(
            "OUTBOX__DATABASE__URL",
            "postgres://app:db-password-123@db:5432/app",
        )
        .env("OUTBOX__ADMIN__TOKEN", "admin-token-456-0123456789ab")
        .env(
            "OUTBOX__DISPATCHERS__ACCOUNTS__URL",
            "http://accounts/api/v1/events",
        )
        .env(
            "OUTBOX__DISPATCHERS__ACCOUNTS__EVENTS",
            "accounts.purchase_create",
        )
        .env(
            "OUTBOX__DISPATCHERS__ACCOUNTS__HEADERS__AUTHORIZATION",
            "Bearer header-secret-789",
        )
        .env(
            "OUTBOX__KAFKA__PROPERTIES__SASL_PASSWORD",
            "sasl-secret-000",
        )
        .arg("config")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for secret in [
        "db-password-123",
        "admin-token-456-0123456789ab",
        "header-secret-789",
        "sasl-secret-000",
    ] {
        assert!(!text.contains(secret), "{secret} printed:\n{text}");
    }
    assert!(
        text.contains("url = \"postgres://app:***@db:5432/app\""),
        "{text}"
    );
    assert!(text.contains("token = \"***\""), "{text}");
    assert!(text.contains("authorization = \"***\""), "{text}");
    assert!(text.contains("sasl_password = \"***\""), "{text}");
}

/// Issue 16 item 11: a dispatcher header's value read from a file (as from
/// a mounted Secret) reaches the receiver byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_value_from_a_file_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api-key");
    std::fs::write(&path, "0042-key-from-file\n").unwrap();
    let t = spawn_app(Options {
        extra_toml: format!(
            "[dispatchers.accounts.header_files]\nX-Api-Key = \"{}\"\n",
            path.display()
        ),
        ..Options::default()
    })
    .await;
    let id = t.insert("accounts.purchase_create", json!({})).await;
    t.wait_status(id, Status::Sent, T).await;
    let sent = t.receiver.for_id(id);
    assert_eq!(
        sent[0].headers.get("x-api-key").map(String::as_str),
        Some("0042-key-from-file")
    );
}

/// Issue 17 item 6: the open /readyz says only "database unavailable"; the
/// database's error (users, hosts, TLS details) goes to the log at WARN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_logs_the_database_error_at_warn() {
    let mut t = spawn_app(Options::default()).await;
    t.stop().await;
    let proxy = crate::harness::proxy::Proxy::start("127.0.0.1:5432".parse().unwrap()).await;
    let db_url = t.db.url.replace("127.0.0.1:5432", &proxy.addr.to_string());
    let port = crate::harness::child::free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sidecar.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = \"{db_url}\"\nconnect_timeout = \"1s\"\n\
             [kafka]\nbrokers = \"{brokers}\"\ntopic = \"{topic}\"\ngroup_id = \"{group}\"\n\
             [admin]\nlisten = \"127.0.0.1:{port}\"\napi_listen = \"127.0.0.1:0\"\n\
             [log]\nformat = \"json\"\n",
            brokers = t.kafka.brokers,
            topic = t.topic,
            group = t.group,
        ),
    )
    .unwrap();
    let log_path = dir.path().join("stderr.log");
    let mut child = crate::cli::bin()
        .args(["run", "--config"])
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    crate::harness::wait_ready("the child to be ready", &base, T).await;
    proxy.set_down(true);
    let body: Value = eventually("503 while the database is down", T, || async {
        let r = reqwest::get(format!("{base}/readyz")).await.ok()?;
        (r.status() == 503).then_some(())?;
        r.json().await.ok()
    })
    .await;
    assert_eq!(
        body,
        json!({"ready": false, "reason": "database unavailable"})
    );
    let warning: Value = eventually("the WARN line with the error", T, || async {
        let log = std::fs::read_to_string(&log_path).ok()?;
        log.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| {
                l["level"] == "WARN"
                    && l["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("not ready: the database"))
            })
    })
    .await;
    // The detail is in the log when the driver gave one.
    if warning["message"] == "not ready: the database does not answer" {
        assert!(
            !warning["error"].as_str().unwrap_or_default().is_empty(),
            "{warning}"
        );
    }
    proxy.set_down(false);
    let _ = child.kill();
    let _ = child.wait();
}

/// A typo in a bulk resend is refused, never read as "no filter" or "not a
/// dry run": with 3 failed rows, a boolean that is not `true`/`false`, an
/// unknown parameter, a repeated one or a body each answer 400 naming what
/// is wrong, and no row changes. The receiver accepts by then, so a resend
/// would show as a sent row and a second request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_typos_are_refused_and_change_nothing() {
    let reject = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = reject.clone();
    let receiver = Receiver::start(move |_| {
        if flag.load(std::sync::atomic::Ordering::SeqCst) {
            ResponseTemplate::new(503)
        } else {
            ResponseTemplate::new(200)
        }
    })
    .await;
    let mut t = spawn_app_with(
        Options {
            max_attempts: 1,
            ..Options::default()
        },
        receiver,
    )
    .await;
    let mut ids = Vec::new();
    for name in [
        "accounts.purchase_create",
        "accounts.installment_paid",
        "accounts.installment_overdue",
    ] {
        ids.push(t.insert(name, json!({})).await);
    }
    for id in &ids {
        t.wait_status(*id, Status::Failed, T).await;
    }
    reject.store(false, std::sync::atomic::Ordering::SeqCst);
    let before: Vec<_> = {
        let mut rows = Vec::new();
        for id in &ids {
            rows.push(t.row(*id).await);
        }
        rows
    };
    let unchanged = |what: String| {
        let t = &t;
        let before = &before;
        async move {
            for row in before {
                let now = t.row(row.id).await;
                assert_eq!(
                    (now.status, now.attempts, now.updated_at),
                    (Status::Failed, 1, row.updated_at),
                    "event {} after {what}",
                    row.id
                );
            }
        }
    };
    let call = |method: &str, path: &str, body: Option<&'static str>| {
        let mut req = client()
            .request(method.parse().unwrap(), t.api_url(path))
            .bearer_auth(TOKEN);
        if let Some(b) = body {
            req = req
                .header("content-type", "application/x-www-form-urlencoded")
                .body(b);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // (method, path, body, what the error must name)
    let refused: &[(&str, &str, Option<&'static str>, &str)] = &[
        ("POST", "/admin/events/retry?dry_run=yes", None, "`dry_run`: expected `true` or `false`, not \"yes\""),
        ("POST", "/admin/events/retry?dry_run=True", None, "`dry_run`: expected `true` or `false`, not \"True\""),
        ("POST", "/admin/events/retry?dry_run=", None, "`dry_run`: expected `true` or `false`, not \"\""),
        ("POST", "/admin/events/retry?dry_run", None, "`dry_run`: expected `true` or `false`"),
        ("POST", "/admin/events/retry?dry_run=1", None, "`dry_run`: expected `true` or `false`, not \"1\""),
        ("POST", "/admin/events/retry?eventname=x", None, "unknown query parameter `eventname`; expected one of: status, event_name, dispatcher,"),
        ("POST", "/admin/events/retry?error=503", None, "unknown query parameter `error`;"),
        ("POST", "/admin/events/retry?event_name=accounts.purchase_create&event_name=x", None, "query parameter `event_name` is given twice"),
        ("POST", "/admin/events/retry?error_contains=", None, "query parameter `error_contains` is empty"),
        ("POST", "/admin/events/retry?confirm=all", None, "query parameter `confirm`: expected the number of events a dry run counted, not \"all\""),
        ("POST", "/admin/events/retry", Some("dry_run=true"), "the admin API takes its parameters in the query string"),
        ("GET", "/admin/events?state=failed", None, "unknown query parameter `state`; expected one of: status, event_name, limit, before"),
        ("GET", "/admin/events?limit=ten", None, "query parameter `limit`: expected a number of events, not \"ten\""),
        ("GET", "/admin/events?held=true", None, "held: ordering is off ([ordering] column is not set)"),
        ("GET", "/admin/events?held=yes", None, "`held`: expected `true` or `false`, not \"yes\""),
        ("GET", "/admin/dispatchers?verbose=true", None, "unknown query parameter `verbose`: this route takes none"),
        ("POST", "/admin/events/retrigger?id=1", None, "unknown query parameter `id`; expected one of: ids, pending_older_than, event_name"),
        ("POST", "/admin/dispatchers/accounts/pause?reason=deploy", None, "unknown query parameter `reason`; expected one of: label"),
        ("POST", "/admin/dispatchers/accounts/resume?lable=x", None, "unknown query parameter `lable`; expected one of: label"),
    ];
    for (method, path, body, names) in refused {
        let (status, answer) = call(method, path, *body).await;
        assert_eq!(status, 400, "{method} {path} {body:?}: {answer}");
        let message = answer["error"].as_str().unwrap_or_default();
        assert!(
            message.contains(names),
            "{method} {path} {body:?}: {message:?} should contain {names:?}"
        );
        unchanged(format!("{method} {path} {body:?}")).await;
    }
    for id in &ids {
        let (status, answer) = call("GET", &format!("/admin/events/{id}?history=true"), None).await;
        assert_eq!(status, 400, "{answer}");
        let (status, answer) = call(
            "POST",
            &format!("/admin/events/{id}/retry?lable=oops"),
            None,
        )
        .await;
        assert_eq!(status, 400, "{answer}");
        assert!(answer["error"]
            .as_str()
            .unwrap()
            .starts_with("unknown query parameter `lable`; expected one of: label"));
    }
    unchanged("the single-event typos".into()).await;
    assert!(
        t.store.pauses().await.unwrap().is_empty(),
        "nothing was paused"
    );
    t.wait_all_committed(&t.group, T).await;
    for id in &ids {
        assert_eq!(t.receiver.for_id(*id).len(), 1, "event {id} sent once only");
    }

    // The right spellings work: a dry run, and (below the threshold) a
    // confirmation is optional but must be the count when given.
    let (status, dry) = call("POST", "/admin/events/retry?dry_run=true", None).await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(
        (
            dry["would_resend"].as_u64(),
            dry["confirm_required"].as_bool()
        ),
        (Some(3), Some(false)),
        "{dry}"
    );
    let (status, dry) = call(
        "POST",
        "/admin/events/retry?dry_run=false&confirm=2&label=typo",
        None,
    )
    .await;
    assert_eq!(status, 409, "{dry}");
    assert_eq!(dry["would_resend"], 3, "{dry}");
    unchanged("a confirmation that is not the count".into()).await;
    let (status, done) = call(
        "POST",
        "/admin/events/retry?dry_run=false&confirm=3&label=ok",
        None,
    )
    .await;
    assert_eq!(status, 202, "{done}");
    let done = operation_end(|p| t.api_url(p), &done).await;
    assert_eq!(
        (
            done["state"].as_str(),
            done["progress"].as_u64(),
            done["label"].as_str()
        ),
        (Some("done"), Some(3), Some("ok")),
        "{done}"
    );
    for id in &ids {
        t.wait_status(*id, Status::Sent, T).await;
    }
    t.stop().await;
}

/// Above 1,000 matching rows a bulk resend needs `confirm=N`, N the count
/// a dry run returned: without it, or with another number, 409 with the
/// count and nothing resent; with it, every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_bulk_resend_above_the_threshold_needs_the_count() {
    use sea_orm::ConnectionTrait;
    let mut t = spawn_app(Options::default()).await;
    let n = outbox_sidecar::operator::CONFIRM_ABOVE + 1;
    let conn = sea_orm::Database::connect(&t.db.url).await.unwrap();
    conn.execute_unprepared(&format!(
        "INSERT INTO outbox_events (event_name, payload, status, attempts, last_error, created_at, updated_at) \
         SELECT 'accounts.purchase_create', '{{}}', 'failed', 3, 'HTTP 503', now(), now() \
         FROM generate_series(1, {n})"
    ))
    .await
    .unwrap();
    let failed = || async { t.store.stats().await.unwrap().failed as u64 };
    assert_eq!(failed().await, n);
    let post = |q: String| {
        let req = client()
            .post(t.api_url(&format!("/admin/events/retry{q}")))
            .bearer_auth(TOKEN);
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, dry) = post("?dry_run=true".into()).await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["would_resend"], n, "{dry}");
    let (status, refused) = post(String::new()).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["would_resend"], n, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains(&format!("repeat with confirm={n}")),
        "{refused}"
    );
    assert_eq!(failed().await, n, "nothing resent without confirm");
    assert_eq!(dry["confirm_required"], true, "{dry}");
    for wrong in [n - 1, n + 1, 1] {
        let (status, refused) = post(format!("?confirm={wrong}")).await;
        assert_eq!(status, 409, "confirm={wrong}: {refused}");
        assert_eq!(refused["would_resend"], n, "{refused}");
        assert_eq!(failed().await, n, "nothing resent with confirm={wrong}");
    }
    let (status, done) = post(format!("?confirm={n}&label=after+the+outage")).await;
    assert_eq!(status, 202, "{done}");
    let done = operation_end(|p| t.api_url(p), &done).await;
    assert_eq!(
        (done["state"].as_str(), done["progress"].as_u64()),
        (Some("done"), Some(n)),
        "{done}"
    );
    assert_eq!(failed().await, 0);
    t.stop().await;
}

/// A resume over many parked rows runs as an operation of the sidecar, not
/// of the request: with `admin.request_timeout = "1s"` and 50,000 pending
/// events of a paused dispatcher (their change events gone: inserted with
/// the feed's trigger off, as after an offset reset), the API answers 202
/// at once, the operation ends `done` with every row counted, and every
/// event is sent once. At e0190ec the request was cut with a 408 after
/// 1 s, the pause row already deleted, and most rows were left unannounced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: make test-long"]
async fn a_resume_of_50000_parked_events_outlives_the_request_timeout() {
    use sea_orm::ConnectionTrait;
    const N: u64 = 50_000;
    let mut t = spawn_app(Options {
        partitions: 12,
        max_in_flight: 256,
        admin_toml: "request_timeout = \"1s\"".into(),
        ..Options::default()
    })
    .await;
    let client = reqwest::Client::new();
    let r = client
        .post(t.api_url("/admin/dispatchers/accounts/pause?label=test"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let conn = sea_orm::Database::connect(&t.db.url).await.unwrap();
    conn.execute_unprepared(&format!(
        "ALTER TABLE outbox_events DISABLE TRIGGER outbox_cdc; \
         INSERT INTO outbox_events (event_name, payload, status, attempts, created_at, updated_at) \
         SELECT 'accounts.purchase_create', '{{}}', 'pending', 0, now(), now() \
         FROM generate_series(1, {N}); \
         ALTER TABLE outbox_events ENABLE TRIGGER outbox_cdc;"
    ))
    .await
    .unwrap();
    let asked = std::time::Instant::now();
    let r = client
        .post(t.api_url("/admin/dispatchers/accounts/resume"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "answered in {:?}", asked.elapsed());
    let location = r.headers()["location"].to_str().unwrap().to_owned();
    let started: Value = r.json().await.unwrap();
    assert_eq!(location, started["href"].as_str().unwrap());
    assert_eq!(
        (started["kind"].as_str(), started["target"].as_str()),
        (Some("resume"), Some("dispatcher accounts")),
        "{started}"
    );
    assert!(t.store.pauses().await.unwrap().len() <= 1);
    // The operation is listed while it runs or after.
    let list: Value = client
        .get(t.api_url("/admin/operations"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list[0]["id"], started["id"], "{list}");
    let end = eventually("the resume to end", Duration::from_secs(300), || async {
        let v: Value = client
            .get(t.api_url(&location))
            .bearer_auth(TOKEN)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (v["state"] != "running").then_some(v)
    })
    .await;
    assert_eq!(
        (end["state"].as_str(), end["progress"].as_u64()),
        (Some("done"), Some(N)),
        "{end}"
    );
    assert!(end["finished_at"].is_string(), "{end}");
    assert!(
        t.store.pauses().await.unwrap().is_empty(),
        "the pause is gone"
    );
    eventually("every event sent", Duration::from_secs(300), || async {
        let stats = t.store.stats().await.ok()?;
        (stats.pending == 0 && stats.failed == 0).then_some(())
    })
    .await;
    assert_eq!(
        t.receiver.requests().len() as u64,
        N,
        "each event sent once"
    );
    // The CLI shows the same operation, from the table.
    let cli = |args: &[&str]| {
        let out = crate::cli::bin()
            .env("OUTBOX__DATABASE__URL", &t.db.url)
            .env("OUTBOX__DISPATCHERS__ACCOUNTS__URL", t.receiver.url())
            .env(
                "OUTBOX__DISPATCHERS__ACCOUNTS__EVENTS",
                "accounts.purchase_create",
            )
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let id = started["id"].as_str().unwrap();
    let (code, out) = cli(&["operations", id, "--wait"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!(
            "operation {id} (resume dispatcher accounts): done, {N} row(s): dispatcher accounts resumed"
        )),
        "{out}"
    );
    let (code, out) = cli(&["operations"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.starts_with(id), "{out}");
    let (code, _) = cli(&["operations", "op-nope"]);
    assert_eq!(code, Some(1));
    // An unknown operation: 404 naming it.
    let r = client
        .get(t.api_url("/admin/operations/op-nope"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    t.stop().await;
}

/// A resume whose touch the database refuses half-way ends `failed`, with
/// the error, the rows done and the command that finishes it; the pause is
/// gone and nothing is lost (the rest stay pending). Run again, twice at
/// once, it finishes: every event sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_that_fails_half_way_says_what_to_run_and_run_twice_finishes() {
    use sea_orm::ConnectionTrait;
    const N: i64 = 3_000;
    let mut t = spawn_app(Options {
        max_in_flight: 64,
        ..Options::default()
    })
    .await;
    let client = reqwest::Client::new();
    let post = |path: &str| client.post(t.api_url(path)).bearer_auth(TOKEN).send();
    assert_eq!(
        post("/admin/dispatchers/accounts/pause")
            .await
            .unwrap()
            .status(),
        200
    );
    let conn = sea_orm::Database::connect(&t.db.url).await.unwrap();
    conn.execute_unprepared(&format!(
        "ALTER TABLE outbox_events DISABLE TRIGGER outbox_cdc; \
         INSERT INTO outbox_events (event_name, payload, status, attempts, created_at, updated_at) \
         SELECT 'accounts.purchase_create', '{{}}', 'pending', 0, now(), now() \
         FROM generate_series(1, {N}); \
         ALTER TABLE outbox_events ENABLE TRIGGER outbox_cdc; \
         CREATE FUNCTION refuse_touch() RETURNS trigger AS $$ BEGIN \
           IF OLD.status = 'pending' AND NEW.status = 'pending' \
              AND NEW.id > (SELECT min(id) + 1500 FROM outbox_events) THEN \
             RAISE EXCEPTION 'maintenance: no writes' USING ERRCODE = '57P01'; \
           END IF; RETURN NEW; END $$ LANGUAGE plpgsql; \
         CREATE TRIGGER refuse_touch BEFORE UPDATE ON outbox_events \
           FOR EACH ROW EXECUTE FUNCTION refuse_touch();"
    ))
    .await
    .unwrap();
    let r = post("/admin/dispatchers/accounts/resume").await.unwrap();
    assert_eq!(r.status(), 202);
    let started: Value = r.json().await.unwrap();
    let end = operation_end(|p| t.api_url(p), &started).await;
    assert_eq!(end["state"], "failed", "{end}");
    assert_eq!(
        end["progress"], 1000,
        "the first batch was committed: {end}"
    );
    let error = end["error"].as_str().unwrap();
    assert!(
        error.contains("the resume did not finish") && error.contains("maintenance: no writes"),
        "{error}"
    );
    assert_eq!(end["rerun"], "outbox-sidecar dispatchers resume accounts");
    assert!(
        t.store.pauses().await.unwrap().is_empty(),
        "the pause is gone"
    );
    assert!(
        t.store.stats().await.unwrap().pending >= N - 1000,
        "nothing lost"
    );
    // The database accepts writes again; the resume run twice at once.
    conn.execute_unprepared("DROP TRIGGER refuse_touch ON outbox_events")
        .await
        .unwrap();
    let (a, b) = tokio::join!(
        post("/admin/dispatchers/accounts/resume"),
        post("/admin/dispatchers/accounts/resume")
    );
    for r in [a.unwrap(), b.unwrap()] {
        assert_eq!(r.status(), 202);
        let started: Value = r.json().await.unwrap();
        let end = operation_end(|p| t.api_url(p), &started).await;
        assert_eq!(end["state"], "done", "{end}");
    }
    eventually("every event sent", T, || async {
        let stats = t.store.stats().await.ok()?;
        (stats.pending == 0 && stats.failed == 0).then_some(())
    })
    .await;
    t.wait_all_committed(&t.group, T).await;
    let requests = t.receiver.requests();
    let mut ids: Vec<i64> = requests.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len() as i64, N);
    assert_eq!(requests.len() as i64, N, "each event sent once");
    t.stop().await;
}
