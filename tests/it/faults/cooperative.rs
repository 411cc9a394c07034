//! Cooperative rebalancing (`partition.assignment.strategy =
//! "cooperative-sticky"`, issue #17 item 2) on librdkafka's mock cluster:
//! members join, leave and bounce while events flow, and a partition
//! revoked during a POST is given up only after its status write while the
//! partitions the member keeps go on delivering.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_sidecar::app::App;
use outbox_sidecar::config::Settings;
use outbox_sidecar::store::now;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use wiremock::ResponseTemplate;

use super::check::{check, Spec};
use super::setup::{prepare, scale, settle, start_with, T};
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

/// An HTTP receiver whose answers wait until the test releases them (a POST
/// held open for exactly as long as a scenario needs); it logs the
/// `Idempotency-Key` of every request.
struct HeldReceiver {
    url: String,
    ids: Arc<Mutex<Vec<i64>>>,
    release: watch::Sender<bool>,
}

impl HeldReceiver {
    async fn start() -> HeldReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/held", listener.local_addr().unwrap());
        let ids = Arc::new(Mutex::new(Vec::new()));
        let (release, _) = watch::channel(false);
        let (log, gate) = (ids.clone(), release.clone());
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (log, mut released) = (log.clone(), gate.subscribe());
                tokio::spawn(async move {
                    let Some(mut conn) = read_request(conn, &log).await else {
                        return;
                    };
                    let _ = released.wait_for(|r| *r).await;
                    let _ = conn
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                });
            }
        });
        HeldReceiver { url, ids, release }
    }

    fn ids(&self) -> Vec<i64> {
        self.ids.lock().unwrap().clone()
    }
}

/// Reads one request (head and `content-length` body) and logs its id.
async fn read_request(mut conn: TcpStream, log: &Mutex<Vec<i64>>) -> Option<TcpStream> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let header = |name: &str| {
        head.lines().find_map(|l| {
            l.strip_prefix(&format!("{name}:"))
                .map(|v| v.trim().to_owned())
        })
    };
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let id = header("idempotency-key")
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1);
    log.lock().unwrap().push(id);
    Some(conn)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_partitions_keep_delivering_while_a_revoked_one_waits_for_its_post() {
    // A backlog of events goes through the one slot the held POSTs leave
    // (max_in_flight 3), one every FRESH.
    const FRESH: Duration = Duration::from_millis(300);
    const BACKLOG: usize = 80;
    // How long after the revoke deliveries are counted before the held
    // POSTs are let go. Short: librdkafka's mock cluster ends a join phase
    // without a member that has not rejoined within session.timeout.ms − 1 s
    // (the tests' 6 s; Kafka waits max.poll.interval.ms), and a member
    // holding a revoke open cannot rejoin; a later join phase would then
    // hand its partitions to the other member mid-wait.
    const WINDOW: Duration = Duration::from_secs(6);
    let receiver = Receiver::start(|_| receiver::slow(200, FRESH)).await;
    let held_receiver = HeldReceiver::start().await;
    let opts = Options {
        partitions: 2,
        max_in_flight: 3,
        ..Options::default()
    };
    let t = prepare(opts, receiver, 1).await;
    let settings = || {
        let mut s = cooperative(t.settings(&t.group));
        // purchase_create events go to the receiver that holds them.
        let mut held = s.dispatchers["accounts"].clone();
        held.url = held_receiver.url.clone();
        held.events = vec!["accounts.purchase_create".into()];
        held.timeout = Duration::from_secs(120);
        let accounts = s.dispatchers.get_mut("accounts").unwrap();
        accounts.events.retain(|e| e != "accounts.purchase_create");
        s.dispatchers.insert("held".into(), held);
        // A revoke waits for POSTs under way up to the drain timeout.
        s.shutdown.drain_timeout = Duration::from_secs(120);
        s
    };
    let first = start_with(settings()).await;
    // A POST held in each partition: whichever partition the second
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
        let ids = held_receiver.ids();
        held.iter().all(|id| ids.contains(id)).then_some(())
    })
    .await;
    // A backlog the first member reads at once and delivers one at a time
    // (installment events, to the logging receiver).
    for n in 0..BACKLOG {
        t.insert(
            "accounts.installment_paid",
            json!({"mode": "fresh", "n": n}),
        )
        .await;
    }
    let joining = now();
    // Not waited for: its first assignment is empty (the partition it is to
    // get is being revoked from the first member), and the window below
    // starts at that revoke.
    let second = App::start(settings())
        .await
        .expect("start the second member");
    eventually("the first member's cooperative revoke", T, || async {
        (rebalances(&first, "cooperative", "revoke") == 1).then_some(())
    })
    .await;
    // The jobs started before the revoke are done within a few FRESH; what
    // is delivered after that was started by a consumer loop that goes on
    // while the revoke waits for the held POST (librdkafka fetches nothing
    // new meanwhile: it pauses every partition until the revoked ones are
    // given up, so the backlog already read is what the loop can serve).
    let revoked_at = now();
    let measured_from = revoked_at + chrono::Duration::from_std(FRESH * 6).unwrap();
    let window_ends = revoked_at + chrono::Duration::from_std(WINDOW).unwrap();
    let during_wait = |requests: &[crate::harness::receiver::Received]| {
        requests
            .iter()
            .filter(|r| r.at > measured_from && r.at < window_ends)
            .count()
    };
    let delivered = eventually("deliveries during the wait, or its end", T, || async {
        let n = during_wait(&t.receiver.requests());
        (n >= 3 || now() > window_ends).then_some(n)
    })
    .await;
    let still_held = held_receiver.ids().len();
    let released_at = now();
    held_receiver.release.send_replace(true);
    assert!(
        delivered >= 3,
        "{delivered} events delivered between {measured_from} and {window_ends}, while the \
         revoke waited for a held POST: the wait held the whole consumer loop"
    );
    assert_eq!(
        still_held,
        held.len(),
        "a held POST was sent again during the wait"
    );
    // The revoked partition changes hands after its held POST's status
    // write: the second member then takes it and delivers its backlog.
    eventually(
        "the revoke's wait to see the held POST written",
        T,
        || async {
            let written = first
                .metrics()
                .revoke_held_requests_total
                .with_label_values(&["written"])
                .get();
            (written >= 1).then_some(())
        },
    )
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
    let mut sent = held_receiver.ids();
    sent.sort_unstable();
    assert_eq!(
        sent, held,
        "a held event was sent again by its partition's next owner"
    );
    println!(
        "faults cooperative revoke during POST: {delivered} backlog events delivered in the {:?} \
         from {:?} after the revoke until the held POSTs were let go",
        (released_at - measured_from).to_std().unwrap_or_default(),
        (measured_from - revoked_at).to_std().unwrap_or_default(),
    );
    let mut spec = Spec::new("cooperative revoke during a POST", &t);
    spec.faults = 1;
    spec.disruptions = vec![joining];
    spec.elsewhere = vec!["accounts.purchase_create"];
    let figures = check(&t, &spec).await;
    assert_eq!(figures.duplicates, 0, "a revoke caused a duplicate");
}
