//! OAuth2 client credentials to the receiver (`[dispatchers.NAME.oauth2]`),
//! against a real token endpoint in the test whose tokens live 2 s and a
//! receiver that answers 401 to any other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use entity::Status;
use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::harness::{child, prepare_on, Kafka, Options, Receiver};

const SECRET: &str = "client-s3cret-0a9f8e7d";
const LIFE: Duration = Duration::from_secs(2);

/// A client-credentials token endpoint: checks the form, issues
/// `tok-N` valid for [`LIFE`].
struct Issuer {
    issued: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Respond for Issuer {
    fn respond(&self, r: &Request) -> ResponseTemplate {
        let form: HashMap<String, String> =
            url::form_urlencoded::parse(&r.body).into_owned().collect();
        if form.get("grant_type").map(String::as_str) != Some("client_credentials")
            || form.get("client_id").map(String::as_str) != Some("outbox")
            || form.get("client_secret").map(String::as_str) != Some(SECRET)
            || form.get("scope").map(String::as_str) != Some("events:write")
        {
            return ResponseTemplate::new(401).set_body_json(json!({"error": "invalid_client"}));
        }
        let mut issued = self.issued.lock().unwrap();
        let token = format!("tok-{}", issued.len() + 1);
        issued.insert(token.clone(), Instant::now());
        ResponseTemplate::new(200).set_body_json(json!({
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": LIFE.as_secs(),
        }))
    }
}

/// 300 events over 10 s through a sidecar process whose dispatcher fetches
/// 2-second tokens: every event is sent on its first attempt (a request
/// that meets an expired token is answered 401, the sidecar fetches a new
/// token and sends again within the attempt; one token is revoked early
/// to make sure of it), tokens are shared (a few
/// fetches, not one per request), and the client secret is in no log
/// line, no metric and no `last_error`. A second dispatcher whose token
/// endpoint answers 503 fails its attempts with the endpoint's status
/// named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth2_tokens_are_shared_refreshed_and_never_shown() {
    let issued = Arc::new(Mutex::new(HashMap::new()));
    let auth = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/oauth/token"))
        .respond_with(Issuer {
            issued: issued.clone(),
        })
        .mount(&auth)
        .await;
    Mock::given(method("POST"))
        .and(path("/down/token"))
        .respond_with(ResponseTemplate::new(503).set_body_string("auth down"))
        .mount(&auth)
        .await;
    let valid = issued.clone();
    let receiver = Receiver::start(move |r| {
        let token = r
            .headers
            .get("authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_owned);
        // tok-2 is revoked half a second after it was issued: requests
        // that carry it afterwards meet a 401 before its expiry.
        let ok = token
            .and_then(|t| {
                let life = if t == "tok-2" {
                    Duration::from_millis(500)
                } else {
                    LIFE
                };
                valid.lock().unwrap().get(&t).map(|at| at.elapsed() < life)
            })
            .unwrap_or(false);
        if ok {
            ResponseTemplate::new(204)
        } else {
            ResponseTemplate::new(401)
        }
    })
    .await;
    let t = prepare_on(Kafka::start(), Options::default(), receiver).await;
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("client-secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let config = child::write_config(&t, dir.path());
    let mut toml = std::fs::read_to_string(&config).unwrap();
    toml.push_str(&format!(
        "\n[dispatchers.accounts.oauth2]\ntoken_url = \"{auth}/oauth/token\"\nclient_id = \"outbox\"\n\
         client_secret_file = {secret_file:?}\nscope = \"events:write\"\n\
         [dispatchers.billing]\nurl = \"{url}\"\nevents = [\"billing.charge\"]\ntimeout = \"2s\"\n\
         [dispatchers.billing.oauth2]\ntoken_url = \"{auth}/down/token\"\nclient_id = \"outbox\"\n\
         client_secret_file = {secret_file:?}\n",
        auth = auth.uri(),
        url = t.receiver.url(),
    ));
    // [dispatch] retry_delay short, so the failing dispatcher ends soon.
    let toml = toml.replace("[dispatch]\n", "[dispatch]\nmax_attempts = 3\n");
    std::fs::write(&config, toml).unwrap();
    let log = dir.path().join("sidecar.log");
    let mut s = child::spawn(&config, &log);
    crate::harness::wait_ready("the sidecar", &s.base, Duration::from_secs(60)).await;

    let started = Instant::now();
    let mut ids = Vec::new();
    for i in 0..300 {
        ids.push(
            t.insert("accounts.purchase_create", json!({ "n": i }))
                .await,
        );
        // 300 over 10 s.
        let due = started + Duration::from_millis(33 * (i + 1) as u64);
        tokio::time::sleep_until(due.into()).await;
    }
    let down = t.insert("billing.charge", json!({})).await;
    for id in &ids {
        t.wait_status(*id, Status::Sent, Duration::from_secs(60))
            .await;
    }
    let failed = t
        .wait_status(down, Status::Failed, Duration::from_secs(60))
        .await;
    for id in &ids {
        assert_eq!(
            t.row(*id).await.attempts,
            0,
            "event {id}: no attempt lost to an expiry"
        );
    }
    let error = failed.last_error.unwrap_or_default();
    assert!(
        error.starts_with(&format!(
            "oauth2 token endpoint {}/down/token: HTTP 503",
            auth.uri()
        )),
        "{error}"
    );
    let fetched = issued.lock().unwrap().len();
    let unauthorized = t
        .receiver
        .requests()
        .iter()
        .filter(|r| r.status == 401)
        .count();
    println!(
        "oauth2: 300 events over {:?}; {fetched} tokens fetched; {unauthorized} requests met an expired token and were sent again",
        started.elapsed()
    );
    assert!(
        (5..=40).contains(&fetched),
        "tokens shared and refreshed: {fetched} fetched"
    );
    assert!(
        unauthorized >= 1,
        "the revoked token met a 401 and was replaced"
    );
    let metrics = reqwest::get(format!("{}/metrics", s.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(&format!(
            "outbox_oauth2_token_fetches_total{{dispatcher=\"accounts\",outcome=\"ok\"}} {fetched}"
        )),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("oauth2"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(metrics.contains(
        "outbox_oauth2_token_fetches_total{dispatcher=\"billing\",outcome=\"failed\"} 3"
    ));
    let logged = std::fs::read_to_string(&log).unwrap();
    for (what, text) in [
        ("log", &logged),
        ("metrics", &metrics),
        ("last_error", &error),
    ] {
        assert!(!text.contains(SECRET), "the secret in the {what}");
    }
    let _ = s.child.kill();
    let _ = s.child.wait();
}
