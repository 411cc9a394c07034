//! HTTP faults in one run: 5xx, timeouts, connection refused, a 4 s slow
//! 2xx under a 5 s dispatcher timeout, and responses alternating at random
//! (seeded, so a failure replays).

use std::time::Duration;

use serde_json::json;
use wiremock::ResponseTemplate;

use super::check::{check, Spec};
use super::setup::{insert_many, mix, mode, prepare, scale, seed, settle, start_with, T};
use crate::harness::receiver::Received;
use crate::harness::{Options, Receiver};

const TIMEOUT: Duration = Duration::from_secs(5);
/// Past the dispatcher's timeout: the sidecar gives up before the answer.
const TOO_SLOW: Duration = Duration::from_millis(6000);

/// The receiver's answer to `r`, and whether the sidecar sees it as a 2xx.
fn respond(seed: u64, r: &Received) -> (ResponseTemplate, bool) {
    let ok = |s: u16| (ResponseTemplate::new(s), true);
    let fail = |s: u16| (ResponseTemplate::new(s).set_body_string("injected"), false);
    let timed_out = || (ResponseTemplate::new(200).set_delay(TOO_SLOW), false);
    match mode(r).as_str() {
        "5xx" if r.nth < 2 => fail([500, 502][r.nth]),
        "always5xx" => fail(503),
        "timeout" if r.nth == 0 => timed_out(),
        "slow" => (
            ResponseTemplate::new(200).set_delay(Duration::from_secs(4)),
            true,
        ),
        "random" => match mix(seed ^ (r.id as u64).wrapping_mul(1_000_003) ^ r.nth as u64) % 7 {
            0 => ok(200),
            1 => fail(500),
            2 => fail(429),
            3 => fail(404),
            4 => timed_out(),
            5 => ok(201),
            _ => fail(302),
        },
        _ => ok(200),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_5xx_timeouts_refused_slow_and_random() {
    let seed = seed(0x5EED_0009);
    let receiver = Receiver::start(move |r| respond(seed, r).0).await;
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let refused_port = refused.local_addr().unwrap().port();
    drop(refused);
    let opts = Options {
        max_in_flight: 64,
        extra_toml: format!(
            "[dispatchers.refused]\nurl = \"http://127.0.0.1:{refused_port}/api/v1/events\"\n\
             events = [\"test.refused\"]\ntimeout = \"2s\"\n"
        ),
        ..Options::default()
    };
    let mut t = prepare(opts, receiver, 1).await;
    let mut settings = t.settings(&t.group);
    settings
        .dispatchers
        .get_mut("accounts")
        .expect("accounts dispatcher")
        .timeout = TIMEOUT;
    t.app = Some(start_with(settings).await);

    let k = 4 * scale();
    let mut faults = 0;
    for m in ["5xx", "always5xx", "timeout", "slow"] {
        insert_many(&t, k, m).await;
    }
    for i in 0..k {
        t.insert("test.refused", json!({"mode": "refused", "n": i}))
            .await;
    }
    insert_many(&t, 20 * scale(), "random").await;
    settle(&t, &t.group, T).await;

    for r in t.receiver.requests() {
        if !respond(seed, &r).1 {
            faults += 1;
        }
    }
    let refused_rows = k * 3;
    let mut spec = Spec::new("http faults", &t);
    spec.faults = faults + refused_rows;
    spec.delivered = Box::new(move |r| respond(seed, r).1);
    spec.elsewhere = vec!["test.refused"];
    check(&t, &spec).await;
    // The fixed modes end where R-004 says.
    for row in super::check::all_rows(&t).await {
        let payload: serde_json::Value = serde_json::from_str(row.payload.as_str()).unwrap();
        let m = payload["mode"].as_str().unwrap_or_default().to_owned();
        let expected = match m.as_str() {
            "5xx" => Some((entity::Status::Sent, 2)),
            "always5xx" | "refused" => Some((entity::Status::Failed, 3)),
            "timeout" => Some((entity::Status::Sent, 1)),
            "slow" => Some((entity::Status::Sent, 0)),
            _ => None,
        };
        if let Some(e) = expected {
            assert_eq!((row.status, row.attempts), e, "event {} ({m})", row.id);
        }
        if m == "timeout" && row.attempts == 1 {
            assert_eq!(row.last_error.as_deref(), Some("timeout after 5s"));
        }
    }
    t.stop().await;
}
