//! Rebalances: two, then three members of one group while events flow,
//! one of them stopped and started again and again; and a partition revoked
//! while its POST is in flight.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use entity::Status;
use outbox_sidecar::store::now;
use serde_json::json;
use wiremock::ResponseTemplate;

use super::check::{all_rows, check, Spec};
use super::setup::{prepare, scale, settle, start_with, T};
use crate::harness::{eventually, receiver, start_within, Options, Receiver};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_then_three_members_with_one_bouncing() {
    let receiver = Receiver::start(|r| {
        if r.id % 4 == 0 && r.nth == 0 {
            ResponseTemplate::new(500)
        } else {
            receiver::slow(200, Duration::from_millis(150))
        }
    })
    .await;
    let opts = Options {
        partitions: 6,
        max_in_flight: 8,
        ..Options::default()
    };
    let mut t = prepare(opts, receiver, 1).await;
    t.start().await;
    // Events flow for the whole scenario.
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let store = t.store.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let name = crate::harness::ACCOUNTS_EVENTS[n % 3];
                store
                    .insert(name, &json!({"mode": "rebalance", "n": n}))
                    .await
                    .expect("insert");
                n += 1;
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            n
        })
    };
    let mut disruptions = Vec::new();
    let second = t.start_in_group(&t.group).await;
    disruptions.push(now());
    let mut third = t.start_in_group(&t.group).await;
    disruptions.push(now());
    let bounces = 3 * scale();
    for _ in 0..bounces {
        third.stop().await;
        disruptions.push(now());
        let before = t.receiver.requests().len();
        eventually("work to go on with two members", T, || async {
            (t.receiver.requests().len() > before + 5).then_some(())
        })
        .await;
        third = t.start_in_group(&t.group).await;
        disruptions.push(now());
    }
    stop.store(true, Ordering::SeqCst);
    let inserted = producer.await.unwrap();
    settle(&t, &t.group, T).await;
    third.stop().await;
    second.stop().await;
    t.stop().await;
    println!(
        "faults rebalance: {inserted} events while 2 joins and {bounces} stop/start cycles ran"
    );
    let mut spec = Spec::new("rebalance 2→3 members, one bouncing", &t);
    spec.faults = disruptions.len();
    spec.per_disruption = t.opts.max_in_flight * 3;
    spec.disruptions = disruptions;
    check(&t, &spec).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_revoked_during_a_post_is_given_up_after_its_status_write() {
    // Long enough that the second member's join begins (a start takes a
    // few seconds on a loaded 2-core machine) before the first POST ends.
    const POST: Duration = Duration::from_secs(12);
    let receiver = Receiver::start(|_| receiver::slow(200, POST)).await;
    let opts = Options {
        partitions: 2,
        ..Options::default()
    };
    let t = prepare(opts, receiver, 1).await;
    let settings = || {
        let mut s = t.settings(&t.group);
        s.dispatchers.get_mut("accounts").unwrap().timeout = Duration::from_secs(40);
        // The revoke waits for POSTs under way up to the drain timeout.
        s.shutdown.drain_timeout = Duration::from_secs(40);
        // Kafka lets a member finish its revoke for the rebalance timeout
        // (max.poll.interval.ms, 300 s by default); the mock cluster only
        // for session.timeout.ms − 1 s (the tests' 6 s), after which it
        // completes the rebalance without the member. Give the mock the
        // room Kafka gives. (The mock then ends this join phase at 29 s
        // even when both members are back: the second member is ready
        // ~30 s after it starts.)
        s.kafka
            .properties
            .insert("session.timeout.ms".into(), "30000".into());
        s
    };
    let first = start_with(settings()).await;
    let n = 4;
    for i in 0..n {
        t.insert("accounts.purchase_create", json!({"n": i})).await;
    }
    eventually("every POST in flight", T, || async {
        (t.receiver.requests().len() >= n).then_some(())
    })
    .await;
    // A second member joins: the eager rebalance revokes every partition
    // of the first while its POSTs are still waiting for their answers.
    let joining = now();
    let started = std::time::Instant::now();
    // The mock ends this join phase only at session.timeout.ms − 1 s
    // (29 s here, even when both members are back); CI once saw the
    // second member not ready after 60 s on a loaded machine (a second
    // join phase). What this test checks is who sends what, not how fast
    // the mock rebalances: wait for two more phases.
    let second = start_within(settings(), Duration::from_secs(150)).await;
    println!(
        "faults revoke during POST: the second member was ready after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // The second member is assigned only once the first gave its
    // partitions up, which it does only after its POSTs wrote their status.
    let at_assignment = all_rows(&t).await;
    let undecided: Vec<_> = at_assignment
        .iter()
        .filter(|r| r.status != Status::Sent)
        .map(|r| (r.id, r.status))
        .collect();
    assert!(
        undecided.is_empty(),
        "the partitions changed hands while POSTs were in flight: rows not yet sent {undecided:?}"
    );
    // The revoke did wait for the 4 POSTs (not a rebalance after them).
    let first_base = format!("http://{}", first.admin_addr());
    let held = |outcome: &'static str| {
        let base = first_base.clone();
        async move {
            let series = format!("outbox_revoke_held_requests_total{{outcome=\"{outcome}\"}}");
            crate::harness::metric(&base, &series).await
        }
    };
    assert_eq!(
        (held("written").await, held("given_up").await),
        (Some(n as f64), Some(0.0)),
        "the first member's revoke waited for its {n} POSTs"
    );
    settle(&t, &t.group, T).await;
    second.stop().await;
    first.stop().await;
    let mut spec = Spec::new("partition revoked during a POST", &t);
    spec.faults = 1;
    spec.disruptions = vec![joining];
    spec.per_disruption = t.opts.max_in_flight;
    let figures = check(&t, &spec).await;
    println!(
        "faults revoke during POST: {} of {n} in-flight events sent twice by the new owner",
        figures.duplicates
    );
    assert_eq!(
        (figures.duplicates, t.receiver.requests().len()),
        (0, n),
        "the new owner sent events the old owner had in flight"
    );
}
