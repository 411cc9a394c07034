//! A dispatcher's breaker across a restart and a partition move: what it
//! parked is announced again when the replica stops or loses the
//! partitions, so the next owner sends it with no operator command.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use entity::Status;
use serde_json::json;
use wiremock::ResponseTemplate;

use crate::harness::{eventually, metric, spawn_app_with, Options, Receiver};

const T: Duration = Duration::from_secs(60);

/// Waits for the accounts breaker of the replica at `base` to be open
/// with at least `parked` events parked.
async fn breaker_open_with_parked(base: &str, parked: usize) {
    eventually(
        "the breaker to open and park the events",
        T,
        || async move {
            let state = metric(
                base,
                "outbox_dispatcher_breaker_state{dispatcher=\"accounts\"}",
            )
            .await?;
            let n = metric(base, "outbox_events_parked_total{dispatcher=\"accounts\"}").await?;
            (state == 1.0 && n >= parked as f64).then_some(())
        },
    )
    .await;
}

/// A receiver answering 500 until `up`, then 204.
async fn down_until(up: Arc<AtomicBool>) -> Receiver {
    Receiver::start(move |_| {
        if up.load(Ordering::SeqCst) {
            ResponseTemplate::new(204)
        } else {
            ResponseTemplate::new(500)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_a_breaker_parked_are_announced_again_when_the_replica_stops() {
    let up = Arc::new(AtomicBool::new(false));
    let receiver = down_until(up.clone()).await;
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
    breaker_open_with_parked(&t.admin_url(""), 8).await;
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

/// The cool-down of [`rows_a_breaker_parked_follow_their_partition_to_the_next_replica`].
const COOL_DOWN: Duration = Duration::from_secs(10);

/// A replica run as a process, killed if the test ends before it stops it.
struct Replica(crate::harness::child::Sidecar);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.child.kill();
        let _ = self.0.child.wait();
    }
}

fn signal(s: &Replica, sig: &str) {
    let pid = s.0.child.id().to_string();
    let status = std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig} {pid}");
}

/// Two replicas as processes on a 1-partition topic: the first parks 50
/// rows behind its open breaker, then stops answering (SIGSTOP) past its
/// session timeout, so the partition moves to the second; when it is
/// continued it learns the partition is gone and announces what it parked,
/// so the new owner sends all of it within three cool-downs of the
/// receiver's recovery. (Before, the first replica kept the rows and let
/// one go per cool-down as its probe, whose answer it never heard.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_a_breaker_parked_follow_their_partition_to_the_next_replica() {
    use crate::harness::child::{spawn, write_config};
    use crate::harness::{prepare_on, wait_ready, Kafka};

    let up = Arc::new(AtomicBool::new(false));
    let receiver = down_until(up.clone()).await;
    let opts = Options {
        retry_delay: "200ms",
        partitions: 1,
        ..Options::default()
    };
    let t = prepare_on(Kafka::start(), opts, receiver).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&t, dir.path());
    // Sticky assignment keeps the partition with its new owner when the
    // first replica rejoins (with the range assignor it may come back, and
    // with it the breaker that parked the rows).
    let mut toml = std::fs::read_to_string(&config).unwrap().replace(
        "[kafka.properties]\n",
        "[kafka.properties]\n\"partition.assignment.strategy\" = \"cooperative-sticky\"\n",
    );
    toml.push_str(&format!(
        "[dispatchers.accounts.breaker]\nfailures = 2\nwithin = \"30s\"\ncool_down = \"{}s\"\n",
        COOL_DOWN.as_secs()
    ));
    std::fs::write(&config, toml).unwrap();
    let log = dir.path().join("sidecars.log");
    let first = Replica(spawn(&config, &log));
    wait_ready("the first replica", &first.0.base, T).await;
    let mut ids = Vec::new();
    for i in 0..50 {
        ids.push(t.insert("accounts.purchase_create", json!({"n": i})).await);
    }
    breaker_open_with_parked(&first.0.base, 48).await;
    t.wait_all_committed(&t.group, T).await;
    for id in &ids {
        assert_eq!(t.row(*id).await.status, Status::Pending, "event {id}");
    }
    // The first replica stops answering; the second joins and, once the
    // first's session has expired, owns the partition.
    signal(&first, "-STOP");
    let second = Replica(spawn(&config, &log));
    wait_ready("the second replica", &second.0.base, T).await;
    eventually("the second replica to be assigned the partition", T, || {
        let base = second.0.base.clone();
        async move {
            let assigned = metric(
                &base,
                "outbox_consumer_rebalances_total{kind=\"assign\",protocol=\"cooperative\"}",
            )
            .await
            .unwrap_or(0.0);
            (assigned >= 1.0).then_some(())
        }
    })
    .await;
    // The receiver recovers, and the first replica goes on: it finds its
    // session gone and the partition the second's.
    up.store(true, Ordering::SeqCst);
    signal(&first, "-CONT");
    eventually(
        "the first replica to learn it lost the partition",
        T,
        || {
            let base = first.0.base.clone();
            async move {
                let lost = metric(
                &base,
                "outbox_consumer_rebalances_total{kind=\"lost\",protocol=\"cooperative\"}",
            )
            .await
            .unwrap_or(0.0)
                + metric(
                    &base,
                    "outbox_consumer_rebalances_total{kind=\"revoke\",protocol=\"cooperative\"}",
                )
                .await
                .unwrap_or(0.0);
                (lost >= 1.0).then_some(())
            }
        },
    )
    .await;
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = 3 * COOL_DOWN;
    let started = std::time::Instant::now();
    loop {
        let mut pending = Vec::new();
        for id in &ids {
            if t.row(*id).await.status != Status::Sent {
                pending.push(*id);
            }
        }
        if pending.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < deadline,
            "{} of the {} events the first replica parked were not sent within 3 cool-downs \
             ({deadline:?}) of the recovery: {pending:?}\n{}",
            pending.len(),
            ids.len(),
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if std::env::var_os("OUTBOX_TEST_SHOW_LOG").is_some() {
        println!("{}", log_text());
    }
    for mut s in [first, second] {
        signal(&s, "-TERM");
        s.0.child.wait().unwrap();
    }
}
