//! The HTTP receiver: a real server (wiremock) that logs every request and
//! answers from a script given per test.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wiremock::matchers::method;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

#[derive(Debug, Clone)]
pub struct Received {
    pub at: chrono::NaiveDateTime,
    pub path: String,
    pub id: i64,
    pub attempt: i32,
    pub event_name: String,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    /// How many earlier requests this id had.
    pub nth: usize,
    pub status: u16,
}

type Script = dyn Fn(&Received) -> ResponseTemplate + Send + Sync;

#[derive(Clone)]
struct Recorder {
    log: Arc<Mutex<Vec<Received>>>,
    script: Arc<Script>,
}

impl Respond for Recorder {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let headers: HashMap<String, String> = req
            .headers
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        let id = headers
            .get("idempotency-key")
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1);
        let mut log = self.log.lock().unwrap();
        let nth = log.iter().filter(|r| r.id == id).count();
        let mut r = Received {
            at: outbox_sidecar::store::now(),
            path: req.url.path().to_owned(),
            id,
            attempt: headers
                .get("outbox-attempt")
                .and_then(|v| v.parse().ok())
                .unwrap_or(-1),
            event_name: headers
                .get("outbox-event-name")
                .cloned()
                .unwrap_or_default(),
            headers,
            body: req.body.clone(),
            nth,
            status: 0,
        };
        let resp = (self.script)(&r);
        r.status = resp_status(&resp);
        log.push(r);
        resp
    }
}

fn resp_status(t: &ResponseTemplate) -> u16 {
    // ResponseTemplate hides its status; Debug shows it.
    let dbg = format!("{t:?}");
    dbg.split("status_code: ")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

pub struct Receiver {
    pub server: MockServer,
    log: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    pub async fn start(
        script: impl Fn(&Received) -> ResponseTemplate + Send + Sync + 'static,
    ) -> Receiver {
        let server = MockServer::start().await;
        let log = Arc::new(Mutex::new(Vec::new()));
        let recorder = Recorder {
            log: log.clone(),
            script: Arc::new(script),
        };
        Mock::given(method("POST"))
            .respond_with(recorder)
            .mount(&server)
            .await;
        Receiver { server, log }
    }

    pub async fn accepting() -> Receiver {
        Self::start(|_| ResponseTemplate::new(204)).await
    }

    pub fn url(&self) -> String {
        format!("{}/api/v1/events", self.server.uri())
    }

    pub fn requests(&self) -> Vec<Received> {
        self.log.lock().unwrap().clone()
    }

    pub fn for_id(&self, id: i64) -> Vec<Received> {
        self.requests().into_iter().filter(|r| r.id == id).collect()
    }
}

/// A 2xx after a delay, for overlapping requests.
pub fn slow(status: u16, delay: Duration) -> ResponseTemplate {
    ResponseTemplate::new(status).set_delay(delay)
}
