//! Broker faults on librdkafka's mock cluster: every broker down for a
//! while, request errors on Fetch / OffsetCommit / JoinGroup / Heartbeat,
//! partition leaders moved, and 500 ms round trips.

use std::time::{Duration, Instant};

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::RDKafkaApiKey;
use rdkafka::types::RDKafkaRespErr as E;
use wiremock::ResponseTemplate;

use super::check::{check, Spec};
use super::setup::{insert_many, mock_cluster_or_skip, prepare, scale, settle, settle_rows, T};
use crate::harness::{eventually, receiver, Options, Receiver, TestApp};

/// Fails the first attempt of every third event, answers the rest slowly
/// enough for faults to land while work is in flight.
async fn some_failures() -> Receiver {
    Receiver::start(|r| {
        if r.id % 3 == 0 && r.nth == 0 {
            ResponseTemplate::new(500)
        } else {
            receiver::slow(204, Duration::from_millis(100))
        }
    })
    .await
}

/// A named phase: the errors pushed for each API key.
type Phase = (&'static str, Vec<(RDKafkaApiKey, Vec<E>)>);

fn cluster(t: &TestApp) -> &MockCluster<'static, DefaultProducerContext> {
    t.kafka.cluster.as_ref().expect("mock cluster")
}

/// Waits until the receiver logged at least `n` requests.
async fn requests_reach(t: &TestApp, n: usize) {
    eventually(&format!("{n} requests"), T, || async {
        (t.receiver.requests().len() >= n).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_brokers_down_then_back() {
    if !mock_cluster_or_skip("brokers down") {
        return;
    }
    let mut t = prepare(Options::default(), some_failures().await, 1).await;
    t.start().await;
    let n = 10 * scale();
    insert_many(&t, n, "before").await;
    requests_reach(&t, n / 2).await;
    cluster(&t).broker_down(1).unwrap();
    let down = Instant::now();
    // Rows keep arriving; their change events wait in the feed's producer.
    insert_many(&t, n, "during").await;
    tokio::time::sleep(Duration::from_secs(4).saturating_sub(down.elapsed())).await;
    cluster(&t).broker_up(1).unwrap();
    settle(&t, &t.group, T).await;
    let mut spec = Spec::new("all brokers down 4s", &t);
    spec.faults = 1;
    check(&t, &spec).await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_errors_on_fetch_and_offset_commit() {
    request_errors(&["fetch", "commit"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_errors_on_join_group_and_heartbeat() {
    request_errors(&["group"]).await;
}

async fn request_errors(phases_run: &[&str]) {
    if !mock_cluster_or_skip("request errors") {
        return;
    }
    let mut t = prepare(Options::default(), some_failures().await, 1).await;
    t.start().await;
    let n = 8 * scale();
    let mut faults = 0;
    let mut done = 0;
    let mut disruptions = Vec::new();
    let phases: [Phase; 3] = [
        (
            "fetch",
            vec![(
                RDKafkaApiKey::Fetch,
                vec![
                    E::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                    E::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
                    E::RD_KAFKA_RESP_ERR__TRANSPORT,
                    E::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
                    E::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
                    E::RD_KAFKA_RESP_ERR__TRANSPORT,
                ],
            )],
        ),
        (
            "commit",
            vec![(
                RDKafkaApiKey::OffsetCommit,
                vec![
                    E::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
                    E::RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
                    E::RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
                    E::RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS,
                    E::RD_KAFKA_RESP_ERR__TRANSPORT,
                ],
            )],
        ),
        (
            "group",
            vec![
                (
                    RDKafkaApiKey::JoinGroup,
                    vec![
                        E::RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
                        E::RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
                    ],
                ),
                (
                    RDKafkaApiKey::Heartbeat,
                    vec![
                        E::RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
                        E::RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID,
                    ],
                ),
            ],
        ),
    ];
    for (phase, errors) in phases.iter().filter(|(p, _)| phases_run.contains(p)) {
        for (api, errs) in errors {
            cluster(&t).request_errors(*api, errs);
            faults += errs.len();
        }
        if *phase == "group" {
            // A rejoin revokes and reassigns every partition.
            disruptions.push(outbox_sidecar::store::now());
        }
        insert_many(&t, n, phase).await;
        done += n;
        requests_reach(&t, done).await;
    }
    settle(&t, &t.group, T).await;
    let name = format!("broker request errors ({})", phases_run.join("+"));
    let mut spec = Spec::new(&name, &t);
    spec.faults = faults;
    spec.disruptions = disruptions;
    check(&t, &spec).await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_leaders_moved_and_500ms_round_trips() {
    if !mock_cluster_or_skip("leaders moved, slow round trips") {
        return;
    }
    let mut t = prepare(Options::default(), some_failures().await, 3).await;
    t.start().await;
    let n = 8 * scale();
    let mut faults = 0;
    let move_leaders = |t: &TestApp, shift: i32| {
        for p in 0..t.opts.partitions {
            cluster(t)
                .partition_leader(&t.topic, p, Some((p + shift) % 3 + 1))
                .unwrap();
        }
        t.opts.partitions as usize
    };
    insert_many(&t, n, "before").await;
    requests_reach(&t, n / 2).await;
    faults += move_leaders(&t, 1);
    insert_many(&t, n, "moved").await;
    requests_reach(&t, n * 3 / 2).await;
    for broker in 1..=3 {
        cluster(&t)
            .broker_round_trip_time(broker, Duration::from_millis(500))
            .unwrap();
    }
    faults += 3;
    insert_many(&t, n, "slow").await;
    requests_reach(&t, n * 5 / 2).await;
    faults += move_leaders(&t, 2);
    insert_many(&t, n, "slow-moved").await;
    settle_rows(&t, T).await;
    // The test's change feed publishes one change event at a time and waits
    // for each delivery: at 500 ms round trips the echoes of the sidecar's
    // writes would keep the topic growing for minutes at larger
    // OUTBOX_FAULT_SCALE. Back to normal round trips for the commit check.
    for broker in 1..=3 {
        cluster(&t)
            .broker_round_trip_time(broker, Duration::ZERO)
            .unwrap();
    }
    t.wait_all_committed(&t.group, T).await;
    let mut spec = Spec::new("leaders moved + 500ms round trips", &t);
    spec.faults = faults;
    check(&t, &spec).await;
    t.stop().await;
}
