//! R-004 through the job, end to end: change events on a Kafka-protocol
//! broker → the sidecar → a real HTTP receiver → status written back
//! (the Rails `dispatch_events_job_spec.rb`, and CONTRACT §5).

use std::time::Duration;

use entity::Status;
use serde_json::json;
use wiremock::ResponseTemplate;

use crate::harness::{spawn_app, spawn_app_with, Options, Receiver, ACCOUNTS_EVENTS};

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
    assert_eq!(reqs.len(), 1, "echoes of the sidecar's own writes cause no request");
    let r = &reqs[0];
    assert_eq!(r.path, "/api/v1/events");
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&r.body).unwrap(), payload);
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(r.headers["authorization"], "Bearer accounts-secret-token");
    assert_eq!(r.headers["idempotency-key"], id.to_string());
    assert_eq!(r.headers["outbox-event-name"], "accounts.purchase_create");
    assert_eq!(r.headers["outbox-attempt"], "1");
}
