//! A dispatcher's breaker across a restart: what it parked is announced
//! again when the replica stops, so the next owner of the partitions sends
//! it with no operator command.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use entity::Status;
use serde_json::json;
use wiremock::ResponseTemplate;

use crate::harness::{eventually, metric, spawn_app_with, Options, Receiver};

const T: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_a_breaker_parked_are_announced_again_when_the_replica_stops() {
    let up = Arc::new(AtomicBool::new(false));
    let receiver = {
        let up = up.clone();
        Receiver::start(move |_| {
            if up.load(Ordering::SeqCst) {
                ResponseTemplate::new(204)
            } else {
                ResponseTemplate::new(500)
            }
        })
        .await
    };
    let opts = Options {
        retry_delay: "200ms",
        // A cool-down far longer than the test: only the stop can announce.
        extra_toml:
            "[dispatchers.accounts.breaker]\nfailures = 2\nwithin = \"30s\"\ncool_down = \"1h\"\n"
                .into(),
        ..Options::default()
    };
    let mut t = spawn_app_with(opts, receiver).await;
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(t.insert("accounts.purchase_create", json!({"n": i})).await);
    }
    let base = t.admin_url("");
    eventually("the breaker to open and park the events", T, || {
        let base = base.clone();
        async move {
            let state = metric(
                &base,
                "outbox_dispatcher_breaker_state{dispatcher=\"accounts\"}",
            )
            .await?;
            let parked =
                metric(&base, "outbox_events_parked_total{dispatcher=\"accounts\"}").await?;
            (state == 1.0 && parked >= 8.0).then_some(())
        }
    })
    .await;
    // Every change event finished (parked events' messages are committed):
    // nothing the next owner reads would announce them again.
    let group = t.group.clone();
    t.wait_all_committed(&group, T).await;
    for id in &ids {
        assert_eq!(t.row(*id).await.status, Status::Pending, "event {id}");
    }
    // The receiver recovers while the replica restarts: its breaker, and
    // what it parked, end with it.
    t.stop().await;
    up.store(true, Ordering::SeqCst);
    t.start().await;
    for id in &ids {
        t.wait_status(*id, Status::Sent, T).await;
    }
    t.stop().await;
}
