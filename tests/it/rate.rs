//! A dispatcher's rate limit (`rate`, `burst`) shared by the whole group:
//! each replica sends at its share by the partitions it owns, a revoke
//! hands its share to the others, and a dispatcher without a limit is not
//! held back by a limited one's backlog.

use std::time::Duration;

use entity::Status;
use serde_json::json;

use crate::harness::{eventually, metric, prepare_on, Kafka, Options, Receiver};

const T: Duration = Duration::from_secs(90);
const RATE: usize = 200;
const BURST: usize = 10;

/// The most requests the receiver took in any one second.
fn busiest_second(mut at: Vec<chrono::NaiveDateTime>) -> usize {
    at.sort();
    let second = chrono::Duration::seconds(1);
    let mut best = 0;
    let mut j = 0;
    for i in 0..at.len() {
        while at[i] - at[j] >= second {
            j += 1;
        }
        best = best.max(i + 1 - j);
    }
    best
}

async fn share(app: &outbox_sidecar::app::App) -> f64 {
    let base = format!("http://{}", app.admin_addr());
    metric(
        &base,
        "outbox_dispatcher_rate_share{dispatcher=\"accounts\"}",
    )
    .await
    .unwrap_or(-1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_rate_limit_and_a_revoke_hands_its_share_over() {
    let receiver = Receiver::accepting().await;
    let opts = Options {
        partitions: 6,
        max_in_flight: 16,
        accounts_toml: format!("rate = \"{RATE}/s\"\nburst = {BURST}"),
        extra_toml: format!(
            "[dispatchers.billing]\nurl = \"{}\"\nevents = [\"billing.invoice\"]\n",
            receiver.url()
        ),
        ..Options::default()
    };
    let t = prepare_on(Kafka::start(), opts, receiver).await;
    let n = 2_000;
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(t.insert("accounts.purchase_create", json!({"n": i})).await);
    }
    eventually("the backlog to be on the topic", T, || async {
        (t.feed.published().len() >= n).then_some(())
    })
    .await;
    let a = t.start_in_group(&t.group).await;
    let b = t.start_in_group(&t.group).await;
    // Both members own partitions: their shares add up to the limit.
    eventually("both replicas to hold a share", T, || async {
        let (sa, sb) = (share(&a).await, share(&b).await);
        (sa > 0.0 && sb > 0.0 && (sa + sb - RATE as f64).abs() < 1e-6).then_some(())
    })
    .await;
    // A dispatcher with no limit is not held back by the backlog.
    let mut bills = Vec::new();
    for i in 0..20 {
        bills.push(t.insert("billing.invoice", json!({"n": i})).await);
    }
    for id in &bills {
        t.wait_status(*id, Status::Sent, T).await;
    }
    let accounts_sent = |t: &crate::harness::TestApp| {
        t.receiver
            .requests()
            .iter()
            .filter(|r| ids.binary_search(&r.id).is_ok())
            .count()
    };
    let sent_when_billed = accounts_sent(&t);
    assert!(
        sent_when_billed < n / 2,
        "billing's events waited for the limited backlog: {sent_when_billed} of {n} accounts events were sent first"
    );
    // One replica leaves: the other takes every partition and the whole
    // limit within the rebalance.
    b.stop().await;
    eventually(
        "the remaining replica to take the whole limit",
        T,
        || async { ((share(&a).await - RATE as f64).abs() < 1e-6).then_some(()) },
    )
    .await;
    for id in &ids {
        t.wait_status(*id, Status::Sent, T).await;
    }
    let at: Vec<_> = t
        .receiver
        .requests()
        .into_iter()
        .filter(|r| ids.binary_search(&r.id).is_ok())
        .map(|r| r.at)
        .collect();
    let first = *at.iter().min().unwrap();
    let last = *at.iter().max().unwrap();
    let busiest = busiest_second(at.clone());
    let mut per = std::collections::BTreeMap::new();
    for a in &at {
        *per.entry((*a - first).num_milliseconds() / 500)
            .or_insert(0) += 1;
    }
    println!("accounts requests per 500 ms: {per:?}");
    println!(
        "{} accounts requests in {:.1} s, at most {busiest} in one second (limit {RATE} + burst {BURST})",
        at.len(),
        (last - first).as_seconds_f64()
    );
    // The receiver runs in this test process and stamps a request when it
    // gets the CPU: on a loaded machine a few stamped late bunch with the
    // next ones (seen: 214 in one second while the whole suite ran, 209
    // alone). The sidecar releases at most rate + burst in any second; the
    // stamps are allowed 5 % of the rate for the receiver's own delays.
    let jitter = RATE / 20;
    assert!(
        busiest <= RATE + BURST + jitter,
        "{busiest} requests in one second: over the group's limit of {RATE}/s + {BURST} \
         (+ {jitter} for the receiver's stamping)"
    );
    let base = format!("http://{}", a.admin_addr());
    let throttled = metric(
        &base,
        "outbox_dispatcher_throttled_seconds_total{dispatcher=\"accounts\"}",
    )
    .await
    .unwrap_or(0.0);
    assert!(throttled > 0.0, "the limit was never waited for");
    a.stop().await;
}
