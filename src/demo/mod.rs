//! `outbox-sidecar demo`: R-004's decision table played live with nothing
//! to install. Everything is embedded — librdkafka's mock Kafka cluster, an
//! SQLite file (or `--database-url`), an accounts API on a local port and a
//! change feed standing in for Debezium — and the sidecar itself is the
//! same [`App`](crate::app::App) that `outbox-sidecar run` starts.

mod api;
mod feed;

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use entity::{OutboxEventRow, Status};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::FutureProducer;
use rdkafka::ClientConfig;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::cli::DemoArgs;
use crate::config::Settings;
use crate::store::Store;

const TOPIC: &str = "demo.public.outbox_events";
const TOKEN: &str = "demo-admin-token-0123456789";

/// The four events of the scenario and the rows of R-004 each exercises.
struct Case {
    key: &'static str,
    event_name: &'static str,
    story: &'static str,
    decision_rows: &'static str,
    expect_status: Status,
    expect_attempts: i32,
}

const CASES: [Case; 4] = [
    Case {
        key: "accept",
        event_name: "accounts.purchase_create",
        story: "accepted at once",
        decision_rows: "Success (2xx) → sent",
        expect_status: Status::Sent,
        expect_attempts: 0,
    },
    Case {
        key: "reject_twice",
        event_name: "accounts.installment_paid",
        story: "rejected twice (503), then accepted",
        decision_rows: "Failure at 0 → pending+1; Failure at 1 → pending+1; Success → sent",
        expect_status: Status::Sent,
        expect_attempts: 2,
    },
    Case {
        key: "always_reject",
        event_name: "accounts.installment_overdue",
        story: "always rejected (422), resent once the API accepts it",
        decision_rows: "Failure ×2 → pending; Failure at 2 → failed (3); Manual resend → pending (0); Success → sent",
        expect_status: Status::Sent,
        expect_attempts: 0,
    },
    Case {
        key: "no_dispatcher",
        event_name: "billing.invoice_issued",
        story: "no dispatcher registered for its event_name",
        decision_rows: "Failure (no dispatcher) ×2 → pending; Failure at 2 → failed (3)",
        expect_status: Status::Failed,
        expect_attempts: 3,
    },
];

struct Paint {
    on: bool,
}

impl Paint {
    fn new() -> Self {
        Self {
            on: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }
    fn code(&self, code: &str, s: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_owned()
        }
    }
    fn status(&self, s: Status) -> String {
        let padded = format!("{:<7}", s.as_str());
        match s {
            Status::Pending => self.code("33", &padded),
            Status::Sent => self.code("32", &padded),
            Status::Failed => self.code("31", &padded),
        }
    }
    fn bold(&self, s: &str) -> String {
        self.code("1", s)
    }
    fn dim(&self, s: &str) -> String {
        self.code("2", s)
    }
}

#[derive(Debug, thiserror::Error)]
enum DemoError {
    #[error("mock Kafka cluster: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("{0}")]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    App(#[from] crate::app::AppError),
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("embedded accounts API: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Other(String),
}

pub async fn main(args: DemoArgs) -> i32 {
    // The demo's own narration is the output; the sidecar logs only errors.
    crate::telemetry::init_logging(&crate::config::LogSettings {
        format: crate::config::LogFormat::Text,
        level: "error".to_owned(),
    });
    let sqlite_path = std::env::temp_dir().join(format!("outbox-demo-{}.db", std::process::id()));
    let result = run(&args, &sqlite_path).await;
    let _ = std::fs::remove_file(&sqlite_path);
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("demo: {e}");
            crate::cli::EXIT_FAILED
        }
    }
}

async fn run(args: &DemoArgs, sqlite_path: &std::path::Path) -> Result<i32, DemoError> {
    let paint = Paint::new();
    let started = Instant::now();
    let cluster = MockCluster::new(1)?;
    cluster.create_topic(TOPIC, 3, 1)?;
    let brokers = cluster.bootstrap_servers();

    let db_url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite:{}?mode=rwc", sqlite_path.display()));
    let store = Store::connect(&db_url, entity::DEFAULT_TABLE, 4, Duration::from_secs(5)).await?;
    store.migrate().await?;
    if args.database_url.is_some() && !store.list(&Default::default()).await?.is_empty() {
        return Err(DemoError::Other(
            "the demo needs an empty outbox_events table in --database-url".into(),
        ));
    }

    let api_state = api::ApiState::default();
    let api_addr = api::start(api_state.clone()).await?;
    let settings = Settings::from_toml(
        Some(&format!(
            r#"
[database]
url = "{db_url}"
max_connections = 4
[kafka]
brokers = "{brokers}"
topic = "{TOPIC}"
group_id = "outbox-sidecar-demo"
[kafka.properties]
"statistics.interval.ms" = "500"
[dispatch]
retry_delay = "{delay}"
[dispatchers.accounts]
url = "http://{api_addr}/api/v1/events"
events = ["accounts.purchase_create", "accounts.installment_paid", "accounts.installment_overdue"]
timeout = "5s"
[dispatchers.accounts.headers]
Authorization = "Bearer demo-accounts-token"
[admin]
listen = "127.0.0.1:{port}"
api_listen = "127.0.0.1:0"
token = "{TOKEN}"
[metrics]
refresh_interval = "500ms"
[shutdown]
drain_timeout = "5s"
"#,
            delay = humantime::format_duration(args.retry_delay),
            port = args.admin_port,
        )),
        BTreeMap::new(),
    )?;
    println!("{}", paint.bold("outbox-sidecar demo — R-004, row by row"));
    println!(
        "  Kafka: mock cluster at {brokers} (topic {TOPIC})\n  database: {}\n  accounts API: http://{api_addr}/api/v1/events\n  retry delay: {}",
        crate::config::secret_free_url(&db_url),
        humantime::format_duration(args.retry_delay)
    );
    let app = App::start(settings).await?;
    let metrics = format!("http://{}", app.admin_addr());
    let admin = format!("http://{}", app.api_addr());
    println!("  sidecar: metrics at {metrics}/metrics, admin API at {admin}/admin/events (Bearer {TOKEN})\n");

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("linger.ms", "0")
        .create()?;
    let (changes_tx, mut changes) = mpsc::unbounded_channel();
    let stop_feed = CancellationToken::new();
    let feed_task = tokio::spawn(feed::run(
        store.clone(),
        producer,
        TOPIC.to_owned(),
        Duration::from_millis(50),
        changes_tx,
        stop_feed.clone(),
    ));

    let http = reqwest::Client::new();
    wait_ready(&http, &metrics).await?;
    let metrics_before = scrape(&http, &metrics).await;

    let mut ids: Vec<(i64, &Case)> = Vec::new();
    for case in &CASES {
        let payload = json!({
            "event_type": case.event_name.rsplit('.').next().unwrap_or(case.event_name),
            "company_id": 42,
            "demo": case.key,
        });
        let id = store.insert(case.event_name, &payload).await?;
        ids.push((id, case));
    }
    let case_of: HashMap<i64, &Case> = ids.iter().map(|(id, c)| (*id, *c)).collect();

    println!(
        "{}",
        paint.bold(
            "  time     id  event_name                    transition          attempts  last_error"
        )
    );
    let t0 = Instant::now();
    let deadline = args.retry_delay * 10 + Duration::from_secs(30);
    let mut last: HashMap<i64, OutboxEventRow> = HashMap::new();
    let mut reached_failed: HashMap<i64, bool> = HashMap::new();
    let mut resent = false;
    let always_reject = ids
        .iter()
        .find(|(_, c)| c.key == "always_reject")
        .map(|(id, _)| *id);
    loop {
        let done = ids.iter().all(|(id, c)| {
            last.get(id).is_some_and(|r| {
                r.status == c.expect_status
                    && r.attempts == c.expect_attempts
                    && (c.key != "always_reject" || resent)
            })
        });
        if done {
            break;
        }
        let remaining = deadline.saturating_sub(t0.elapsed());
        let Ok(Some(change)) = tokio::time::timeout(remaining, changes.recv()).await else {
            println!(
                "  (stopped waiting after {})",
                humantime::format_duration(deadline)
            );
            break;
        };
        let row = &change.after;
        let from = change
            .before
            .as_ref()
            .map(|b| paint.status(b.status))
            .unwrap_or_else(|| format!("{:<7}", "(new)"));
        println!(
            "  {:>6}  {:>3}  {:<28}  {} → {}  {:>8}  {}",
            format!("+{:.2}s", t0.elapsed().as_secs_f64()),
            row.id,
            row.event_name,
            from,
            paint.status(row.status),
            row.attempts,
            paint.dim(row.last_error.as_deref().unwrap_or("")),
        );
        if row.status == Status::Failed {
            reached_failed.insert(row.id, true);
        }
        last.insert(row.id, row.clone());
        if Some(row.id) == always_reject && row.status == Status::Failed && !resent {
            api_state.accept_all.store(true, Ordering::SeqCst);
            let r = http
                .post(format!("{admin}/admin/events/{}/retry", row.id))
                .bearer_auth(TOKEN)
                .send()
                .await;
            match r {
                Ok(r) if r.status().is_success() => {
                    resent = true;
                    println!(
                        "  {}",
                        paint.bold(&format!(
                            "… the accounts API now accepts event {}; an operator resends it: POST /admin/events/{}/retry",
                            row.id, row.id
                        ))
                    );
                }
                Ok(r) => println!("  resend refused: HTTP {}", r.status()),
                Err(e) => println!("  resend failed: {e}"),
            }
        }
    }

    // The final table, read back from the database.
    println!("\n{}", paint.bold("  final rows"));
    println!("{}", paint.bold("   id  event_name                    status   attempts  scenario → decision-table rows exercised"));
    let mut wrong = Vec::new();
    for (id, case) in &ids {
        let row = store.get(*id).await?;
        let (status, attempts) = row
            .as_ref()
            .map(|r| (r.status, r.attempts))
            .unwrap_or((Status::Pending, -1));
        let history_ok =
            case.key != "always_reject" || reached_failed.get(id).copied().unwrap_or(false);
        let ok = status == case.expect_status && attempts == case.expect_attempts && history_ok;
        println!(
            "  {:>3}  {:<28}  {}  {:>8}  {} → {}  {}",
            id,
            case.event_name,
            paint.status(status),
            attempts,
            case.story,
            case.decision_rows,
            if ok {
                paint.code("32", "✓")
            } else {
                paint.code("31", "✗")
            }
        );
        if !ok {
            wrong.push(format!(
                "event {id} ({}) ended {status} with {attempts} attempts; expected {} with {}{}",
                case.event_name,
                case.expect_status,
                case.expect_attempts,
                if history_ok {
                    ""
                } else {
                    " after having failed once"
                }
            ));
        }
    }
    let _ = case_of;

    tokio::time::sleep(Duration::from_millis(600)).await; // one gauge refresh
    let metrics_after = scrape(&http, &metrics).await;
    println!("\n{}", paint.bold("  metrics that changed"));
    for (series, after) in &metrics_after {
        let before = metrics_before.get(series).copied().unwrap_or(0.0);
        if (after - before).abs() > f64::EPSILON
            && !series.contains("_bucket")
            && !series.contains("_sum")
        {
            println!("  {series} {before} → {after}");
        }
    }

    stop_feed.cancel();
    let _ = feed_task.await;
    app.stop().await;
    drop(cluster);
    println!("\n  finished in {:.1}s", started.elapsed().as_secs_f64());
    if wrong.is_empty() {
        println!(
            "  {}",
            paint.code("32", "every row ended as R-004's decision table says")
        );
        Ok(crate::cli::EXIT_OK)
    } else {
        for w in &wrong {
            println!("  {}", paint.code("31", w));
        }
        Ok(crate::cli::EXIT_FAILED)
    }
}

async fn wait_ready(http: &reqwest::Client, admin: &str) -> Result<(), DemoError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = http.get(format!("{admin}/readyz")).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(DemoError::Other(
                "the sidecar did not become ready within 30s".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn scrape(http: &reqwest::Client, admin: &str) -> BTreeMap<String, f64> {
    let Ok(r) = http.get(format!("{admin}/metrics")).send().await else {
        return BTreeMap::new();
    };
    let text = r.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("outbox_"))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}
