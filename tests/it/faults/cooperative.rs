//! Cooperative rebalancing (`partition.assignment.strategy =
//! "cooperative-sticky"`, issue #17 item 2) on librdkafka's mock cluster:
//! members join, leave and bounce while events flow, and a partition
//! revoked during a POST is given up only after its status write while the
//! partitions the member keeps go on delivering.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox_sidecar::app::App;
use outbox_sidecar::config::Settings;
use outbox_sidecar::store::now;
use serde_json::json;
use wiremock::ResponseTemplate;

use super::check::{check, Spec};
use super::setup::{mode, prepare, scale, settle, start_with, T};
use crate::harness::{eventually, receiver, Options, Receiver, TestApp};

/// A member's settings with the cooperative protocol.
fn cooperative(mut s: Settings) -> Settings {
    s.kafka.properties.insert(
        "partition.assignment.strategy".into(),
        "cooperative-sticky".into(),
    );
    s
}

/// `outbox_consumer_rebalances_total{protocol, kind}` of one member.
fn rebalances(app: &App, protocol: &str, kind: &str) -> u64 {
    app.metrics()
        .consumer_rebalances_total
        .with_label_values(&[protocol, kind])
        .get()
}

/// Every rebalance callback of `app` ran under the cooperative protocol.
fn assert_cooperative(app: &App, who: &str) {
    let eager: u64 = ["assign", "revoke", "lost"]
        .iter()
        .map(|k| rebalances(app, "eager", k))
        .sum();
    assert_eq!(eager, 0, "{who}: a rebalance ran under the eager protocol");
    assert!(
        rebalances(app, "cooperative", "assign") > 0,
        "{who}: no cooperative assignment (librdkafka reported another protocol)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_members_join_leave_and_bounce_without_duplicates() {
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
    let t = prepare(opts, receiver, 1).await;
    let member = |t: &TestApp| start_with(cooperative(t.settings(&t.group)));
    let first = member(&t).await;
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let store = t.store.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let name = crate::harness::ACCOUNTS_EVENTS[n % 3];
                store
                    .insert(name, &json!({"mode": "cooperative", "n": n}))
                    .await
                    .expect("insert");
                n += 1;
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            n
        })
    };
    let mut disruptions = Vec::new();
    // Joins: 1 → 2 → 3 members.
    let second = member(&t).await;
    disruptions.push(now());
    let mut third = member(&t).await;
    disruptions.push(now());
    // A member bouncing: it leaves (its partitions move to the two others)
    // and comes back (some move back), while work goes on.
    let bounces = 3 * scale();
    for _ in 0..bounces {
        third.stop().await;
        disruptions.push(now());
        let before = t.receiver.requests().len();
        eventually("work to go on with two members", T, || async {
            (t.receiver.requests().len() > before + 5).then_some(())
        })
        .await;
        third = member(&t).await;
        disruptions.push(now());
    }
    stop.store(true, Ordering::SeqCst);
    let inserted = producer.await.unwrap();
    settle(&t, &t.group, T).await;
    assert_cooperative(&first, "first member");
    assert_cooperative(&second, "second member");
    assert_cooperative(&third, "third member");
    assert!(
        rebalances(&first, "cooperative", "revoke") > 0,
        "the first member never gave a partition up: the joins moved nothing"
    );
    // A member leaving: the third, then the second; the first ends alone.
    third.stop().await;
    second.stop().await;
    first.stop().await;
    println!(
        "faults cooperative: {inserted} events while 2 joins and {bounces} leave/join cycles ran"
    );
    let mut spec = Spec::new("cooperative rebalance 1→2→3 members, one bouncing", &t);
    spec.faults = disruptions.len();
    spec.disruptions = disruptions;
    let figures = check(&t, &spec).await;
    assert_eq!(
        figures.duplicates, 0,
        "a revoke (or a leave) let the next owner send again what was in flight"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_partitions_keep_delivering_while_a_revoked_one_waits_for_its_post() {
    // How long a `held` POST takes: long enough for the second member's
    // join (a few seconds on a loaded machine) and the deliveries measured
    // during the revoke's wait for it.
    const HOLD: Duration = Duration::from_secs(20);
    // A backlog of `fresh` events goes through the one slot the held POSTs
    // leave (max_in_flight 3), one every FRESH.
    const FRESH: Duration = Duration::from_millis(300);
    const BACKLOG: usize = 80;
    let receiver = Receiver::start(|r| {
        if mode(r) == "held" {
            receiver::slow(200, HOLD)
        } else {
            receiver::slow(200, FRESH)
        }
    })
    .await;
    let opts = Options {
        partitions: 2,
        max_in_flight: 3,
        ..Options::default()
    };
    let t = prepare(opts, receiver, 1).await;
    let settings = || {
        let mut s = cooperative(t.settings(&t.group));
        s.dispatchers.get_mut("accounts").unwrap().timeout = Duration::from_secs(60);
        // A revoke waits for POSTs under way up to the drain timeout.
        s.shutdown.drain_timeout = Duration::from_secs(60);
        s
    };
    let first = start_with(settings()).await;
    // A POST in flight in each partition: whichever partition the second
    // member's join moves, the first member has to wait for one.
    let mut held = Vec::new();
    let mut covered = BTreeSet::new();
    while covered.len() < 2 {
        let id = t
            .insert(
                "accounts.purchase_create",
                json!({"mode": "held", "n": held.len()}),
            )
            .await;
        let partition = eventually("the change event to be published", T, || async {
            t.feed.partition_of(id)
        })
        .await;
        covered.insert(partition);
        held.push(id);
    }
    eventually("every held POST in flight", T, || async {
        let requests = t.receiver.requests();
        held.iter()
            .all(|id| requests.iter().any(|r| r.id == *id))
            .then_some(())
    })
    .await;
    let held_since = t
        .receiver
        .requests()
        .iter()
        .map(|r| r.at)
        .min()
        .expect("a held request");
    let hold_ends = held_since + chrono::Duration::from_std(HOLD).unwrap();
    super::setup::insert_many(&t, BACKLOG, "fresh").await;
    let joining = now();
    // Ready once it joined the group, with an empty first assignment: the
    // partition it is to get is being revoked from the first member.
    let second = start_with(settings()).await;
    eventually("the first member's cooperative revoke", T, || async {
        (rebalances(&first, "cooperative", "revoke") == 1).then_some(())
    })
    .await;
    // The jobs started before the revoke are done within a few FRESH; what
    // is delivered after that was started by a consumer loop that goes on
    // while the revoke waits for the held POST (librdkafka fetches nothing
    // new meanwhile: it pauses every partition until the revoked ones are
    // given up, so the backlog already read is what the loop can serve).
    let measured_from = now() + chrono::Duration::from_std(FRESH * 6).unwrap();
    let during_wait = |requests: &[crate::harness::receiver::Received]| {
        requests
            .iter()
            .filter(|r| mode(r) == "fresh" && r.at > measured_from && r.at < hold_ends)
            .count()
    };
    let delivered = eventually(
        "fresh deliveries during the wait, or its end",
        T,
        || async {
            let n = during_wait(&t.receiver.requests());
            (n >= 3 || now() > hold_ends).then_some(n)
        },
    )
    .await;
    assert!(
        delivered >= 3,
        "{delivered} fresh events delivered between {measured_from} and the held POSTs' end \
         ({hold_ends}): the revoke's wait held the whole consumer loop"
    );
    // The revoked partition changes hands after its held POST's status
    // write: the second member then takes it.
    eventually("the held POSTs to end and the hand-off", T, || async {
        let written = first
            .metrics()
            .revoke_held_requests_total
            .with_label_values(&["written"])
            .get();
        (written >= 1 && rebalances(&second, "cooperative", "assign") >= 2).then_some(())
    })
    .await;
    settle(&t, &t.group, T).await;
    assert_cooperative(&first, "first member");
    assert_cooperative(&second, "second member");
    let given_up = first
        .metrics()
        .revoke_held_requests_total
        .with_label_values(&["given_up"])
        .get();
    assert_eq!(given_up, 0, "the revoke gave a POST in flight up");
    second.stop().await;
    first.stop().await;
    for id in &held {
        assert_eq!(
            t.receiver.for_id(*id).len(),
            1,
            "held event {id} was sent again by the partition's next owner: {:?}",
            t.receiver
                .for_id(*id)
                .iter()
                .map(|r| (r.at, r.attempt, r.status))
                .collect::<Vec<_>>()
        );
    }
    println!(
        "faults cooperative revoke during POST: {} backlog events delivered by the kept \
         partition while the revoked one waited {:?} for its POST",
        during_wait(&t.receiver.requests()),
        (hold_ends - measured_from).to_std().unwrap_or_default()
    );
    let mut spec = Spec::new("cooperative revoke during a POST", &t);
    spec.faults = 1;
    spec.disruptions = vec![joining];
    let figures = check(&t, &spec).await;
    assert_eq!(figures.duplicates, 0, "a revoke caused a duplicate");
}
