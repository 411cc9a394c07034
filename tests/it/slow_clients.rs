//! Slow clients on the HTTP listeners (issue 17, item 7): a slowloris
//! attack on `/metrics` is cut off by `admin.header_read_timeout`, holds at
//! most `admin.max_connections` connections, and neither starves a normal
//! scrape nor slows the pipeline.

use std::net::SocketAddr;
use std::time::Duration;

use entity::Status;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::harness::{prepare_on, start_with, Kafka, Options, Receiver};

const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(1);
const MAX_CONNECTIONS: usize = 8;
const SLOW_CLIENTS: usize = 24;
/// How long a slow client keeps trickling before the test gives up on the
/// server closing it.
const GIVE_UP: Duration = Duration::from_secs(15);

/// Connects and sends a request head one byte a second, never finishing
/// it. Returns how long the connection lived until the server closed it
/// (or answered), or `None` if it was still open after [`GIVE_UP`].
async fn slow_client(addr: SocketAddr) -> Option<Duration> {
    let started = Instant::now();
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return Some(started.elapsed());
    };
    let head = b"GET /metrics HTTP/1.1\r\nHost: sidecar\r\nX-Slow: ";
    let mut buf = [0u8; 512];
    for i in 0.. {
        let byte = head.get(i).copied().unwrap_or(b'a');
        if stream.write_all(&[byte]).await.is_err() {
            return Some(started.elapsed());
        }
        tokio::select! {
            // EOF, a reset or a 408: the server ended it.
            _ = stream.read(&mut buf) => return Some(started.elapsed()),
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        if started.elapsed() > GIVE_UP {
            return None;
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slowloris_on_metrics_is_cut_off_while_scrapes_and_deliveries_go_on() {
    let mut t = prepare_on(
        Kafka::start(),
        Options::default(),
        Receiver::accepting().await,
    )
    .await;
    let group = t.group.clone();
    let mut settings = t.settings(&group);
    settings.admin.header_read_timeout = HEADER_READ_TIMEOUT;
    settings.admin.max_connections = MAX_CONNECTIONS;
    t.app = Some(start_with(settings).await);
    let addr = t.app.as_ref().unwrap().admin_addr();

    let attack_started = Instant::now();
    let slow: Vec<_> = (0..SLOW_CLIENTS)
        .map(|_| tokio::spawn(slow_client(addr)))
        .collect();

    // While the attack runs: events are delivered, and a normal client
    // (a fresh connection each time, as Prometheus after a failed scrape)
    // gets /metrics.
    let scraper = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut scrapes = Vec::new();
    for n in 0..3 {
        let id = t.insert("accounts.purchase_create", json!({"n": n})).await;
        let inserted = Instant::now();
        t.wait_status(id, Status::Sent, Duration::from_secs(10))
            .await;
        let delivered_in = inserted.elapsed();
        let asked = Instant::now();
        let resp = scraper
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .expect("a normal scrape during the attack");
        assert_eq!(resp.status(), 200);
        let body = resp.text().await.unwrap();
        assert!(body.contains("outbox_dispatch_total"), "{body}");
        scrapes.push((delivered_in, asked.elapsed()));
    }

    let mut lifetimes = Vec::new();
    for handle in slow {
        lifetimes.push(handle.await.unwrap());
    }
    let still_open = lifetimes.iter().filter(|l| l.is_none()).count();
    assert_eq!(
        still_open, 0,
        "slow connections still open after {GIVE_UP:?}: {lifetimes:?}"
    );
    let lifetimes: Vec<Duration> = lifetimes.into_iter().flatten().collect();
    // Each lives at least the header read timeout (the server does not cut
    // a connection early)…
    assert!(
        lifetimes.iter().all(|l| *l >= HEADER_READ_TIMEOUT),
        "{lifetimes:?}"
    );
    // …and only MAX_CONNECTIONS are served at once: the others wait to be
    // accepted, so they live past a second timeout.
    let waited = lifetimes
        .iter()
        .filter(|l| **l >= HEADER_READ_TIMEOUT * 2)
        .count();
    assert!(
        waited >= SLOW_CLIENTS - 2 * MAX_CONNECTIONS,
        "{waited} of {SLOW_CLIENTS} slow connections waited for a free slot: {lifetimes:?}"
    );
    // A normal scrape still answers once the attack is over.
    let resp = scraper
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    println!(
        "slowloris: {SLOW_CLIENTS} slow clients (limit {MAX_CONNECTIONS}, header read timeout \
         {HEADER_READ_TIMEOUT:?}) all cut off within {:?}; longest lived {:?}; during the attack \
         (delivered in, scrape took): {scrapes:?}",
        attack_started.elapsed(),
        lifetimes.iter().max().unwrap(),
    );
    t.stop().await;
}
