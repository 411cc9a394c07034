//! `--replay` (`make bench-replay`, issue #46): what a replay of
//! 1,000,000 sent events costs the live traffic.
//!
//! One database holds `--replay-rows` (default 1,000,000) rows sent over
//! the last two years (the history scenario's seed); the echo trigger
//! carries every write back onto the topic, as Debezium would, so a row a
//! replay puts back to pending reaches the sidecar as an update event. One
//! `outbox-sidecar run` serves the whole run. Each pair publishes
//! `--live-rate` (default 100/s) fresh events for `--paced-seconds`
//! (default 20 s) twice: once with no replay running, once while a replay
//! of every seeded row (`sent_since` two years back, `confirm` = the dry
//! run's count, `--replay-rate`, default 100/s, the feature's default)
//! runs through the admin API; the replay is cancelled after its side, and
//! the rows it had put back are sent before the next side starts. The
//! sides alternate their order pair by pair. A fresh event's latency is
//! its `sent_at` − its publish time; the goal: its p99 during the replay ≤
//! 2 × its p99 without.

use super::*;
use serde_json::Value;

/// The goal's bound: a fresh event's p99 during a replay, as a multiple
/// of its p99 without one.
const P99_BOUND: f64 = 2.0;
/// Partitions of the topic: the mock broker keeps about 5 MiB of each,
/// and every pair adds its live events' and the replayed rows' echoes.
const REPLAY_PARTITIONS: i32 = 24;
const TOKEN: &str = "bench-replay-admin-token";
const REPLAY_GOAL: &str =
    "a fresh event's p99 during a replay of every seeded row ≤ 2 × its p99 without a replay";

/// One side of a pair.
struct Live {
    p50_ms: f64,
    p99_ms: f64,
    /// Rows the replay put back to pending over the side (0 without), and
    /// the seconds from its start to that count.
    replayed: i64,
    replay_seconds: f64,
}

/// The admin API of the bench's sidecar.
struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn call(&self, method: reqwest::Method, path: &str) -> Result<(u16, Value)> {
        let r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .with_context(|| format!("the admin API ({path})"))?;
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        Ok((status, body))
    }

    /// Starts a replay of every seeded row (dry run first, for `confirm`);
    /// returns the operation's id and the row count.
    async fn start_replay(&self, since: &str, rate: u32) -> Result<(String, u64)> {
        let query = format!("sent_since={since}&rate={rate}");
        let (status, dry) = self
            .call(
                reqwest::Method::POST,
                &format!("/admin/events/replay?{query}&dry_run=true"),
            )
            .await?;
        if status != 200 {
            bail!("the replay's dry run answered {status}: {dry}");
        }
        let count = dry["count"]
            .as_u64()
            .ok_or_else(|| anyhow!("the dry run has no count: {dry}"))?;
        let (status, started) = self
            .call(
                reqwest::Method::POST,
                &format!("/admin/events/replay?{query}&confirm={count}&label=bench"),
            )
            .await?;
        if status != 202 {
            bail!("the replay answered {status}: {started}");
        }
        let id = started["id"]
            .as_str()
            .ok_or_else(|| anyhow!("the replay's answer has no id: {started}"))?
            .to_owned();
        Ok((id, count))
    }

    async fn progress(&self, op: &str) -> Result<i64> {
        let (status, body) = self
            .call(reqwest::Method::GET, &format!("/admin/operations/{op}"))
            .await?;
        if status != 200 {
            bail!("GET /admin/operations/{op} answered {status}: {body}");
        }
        Ok(body["progress"].as_i64().unwrap_or(0))
    }

    async fn cancel(&self, op: &str) -> Result<()> {
        let (status, body) = self
            .call(reqwest::Method::DELETE, &format!("/admin/operations/{op}"))
            .await?;
        if !(200..300).contains(&status) {
            bail!("cancelling the replay {op} answered {status}: {body}");
        }
        Ok(())
    }
}

/// Pending rows among the first `upto` ids.
async fn pending_upto(store: &Store, upto: i64) -> Result<i64> {
    let stmt = Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!(
            "SELECT count(*) AS pending FROM {} WHERE status = 'pending' AND id <= $1",
            store.table()
        ),
        [upto.into()],
    );
    let row = store
        .connection()
        .query_one_raw(stmt)
        .await?
        .ok_or_else(|| anyhow!("no count row"))?;
    Ok(row.try_get("", "pending")?)
}

/// Publishes `n` fresh events at `rate` and returns their latencies once
/// all are sent.
async fn live_side(
    store: &Store,
    broker: &Broker,
    sidecar: &Sidecar,
    n: usize,
    rate: f64,
) -> Result<Vec<f64>> {
    let base = max_id(store).await?;
    insert_rows(store, n, 0).await?;
    let rows = load_rows(store, base, n).await?;
    let times = tokio::task::block_in_place(|| publish_paced(&rows, TABLE, broker, rate))?;
    let deadline = Instant::now() + STALL_LIMIT;
    loop {
        let (sent, _) = progress(store, base).await?;
        if sent as usize >= n {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "{sent} of {n} live events sent {:?} after the last was published:\n{}",
                STALL_LIMIT,
                sidecar.stderr_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut lat = Vec::with_capacity(n);
    for (id, sent_at) in sent_times(store, base).await? {
        let published = *times
            .get(&id)
            .ok_or_else(|| anyhow!("no publish time for id {id}"))?;
        lat.push((sent_at.and_utc().timestamp_micros() - published) as f64 / 1_000.0);
    }
    Ok(sorted(lat))
}

/// What a run holds for its sides.
struct Bed<'a> {
    store: &'a Store,
    broker: &'a Broker,
    sidecar: &'a Sidecar,
    api: &'a Api,
    /// The seeded rows (ids 1..=rows).
    rows: i64,
    live_rate: f64,
    replay_rate: u32,
}

/// One side: live traffic alone, or beside a replay started just before it
/// and cancelled after it (then waits until the rows it put back are sent).
async fn side(bed: &Bed<'_>, with_replay: bool, n: usize) -> Result<Live> {
    let Bed {
        store,
        broker,
        sidecar,
        api,
        rows,
        ..
    } = *bed;
    let since = (chrono::Utc::now() - chrono::Duration::days(3 * 366))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let replay = if with_replay {
        let (op, count) = api.start_replay(&since, bed.replay_rate).await?;
        if count < rows as u64 {
            bail!("the replay's dry run counts {count} rows, {rows} were seeded");
        }
        Some((op, Instant::now()))
    } else {
        None
    };
    let result = live_side(store, broker, sidecar, n, bed.live_rate).await;
    let (replayed, replay_seconds) = match &replay {
        Some((op, started)) => {
            let done = api.progress(op).await?;
            let seconds = started.elapsed().as_secs_f64();
            api.cancel(op).await?;
            (done, seconds)
        }
        None => (0, 0.0),
    };
    // What the replay put back to pending is sent before the next side.
    let deadline = Instant::now() + STALL_LIMIT;
    while pending_upto(store, rows).await? > 0 {
        if Instant::now() > deadline {
            bail!("replayed rows still pending {STALL_LIMIT:?} after the replay was cancelled");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lat = result?;
    Ok(Live {
        p50_ms: percentile(&lat, 50.0),
        p99_ms: percentile(&lat, 99.0),
        replayed,
        replay_seconds,
    })
}

/// `--replay`: the pairs, then their goal line.
pub(crate) async fn replay(env: &Env, rows: usize, live_rate: u32, replay_rate: u32) -> Result<()> {
    let db = env.create_db().await?;
    let result = replay_on(env, &db, rows, live_rate, replay_rate).await;
    env.drop_db(&db).await;
    result
}

async fn replay_on(
    env: &Env,
    db: &BenchDb,
    rows: usize,
    live_rate: u32,
    replay_rate: u32,
) -> Result<()> {
    let o = &env.opts;
    let n = ((live_rate as f64 * o.paced_seconds).round() as usize).max(1);
    eprintln!(
        "replay bench: seeding {} sent rows into {} (load {})",
        thousands(rows as f64),
        db.name,
        loadavg_line()
    );
    let store = open_store(&db.url, TABLE, 4).await?;
    let started = Instant::now();
    seed_history(&store, rows).await?;
    echo::install(&store).await?;
    eprintln!(
        "replay bench: seeded in {:.0} s (load {})",
        started.elapsed().as_secs_f64(),
        loadavg_line()
    );
    let broker = Broker::with_partitions("outbox.public.outbox_events", REPLAY_PARTITIONS)?;
    let echoes = Echoes::start(store.clone(), &broker.brokers, &broker.topic)?;
    let api_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let vars = [
        (
            "OUTBOX__ADMIN__API_LISTEN".to_owned(),
            format!("127.0.0.1:{api_port}"),
        ),
        ("OUTBOX__ADMIN__TOKEN".to_owned(), TOKEN.to_owned()),
    ];
    let receiver = env.receivers.get(Target::Created);
    let mut sidecar = Sidecar::start_with_env(env, &db.url, &broker, true, receiver, "", &vars)?;
    sidecar.wait_ready().await?;
    let api = Api {
        http: reqwest::Client::new(),
        base: format!("http://127.0.0.1:{api_port}"),
    };
    let bed = Bed {
        store: &store,
        broker: &broker,
        sidecar: &sidecar,
        api: &api,
        rows: rows as i64,
        live_rate: live_rate as f64,
        replay_rate,
    };
    let mut pairs: Vec<(Live, Live)> = Vec::new();
    let run = async {
        // A side of live traffic alone first, not counted: the sidecar's
        // connections and the receiver's are warm for the first pair.
        side(&bed, false, n.min(500)).await?;
        for run in 1..=o.runs {
            let forward = run % 2 == 1;
            eprintln!(
                "[run {run}] {n} live events at {live_rate}/s, without then with a replay at {replay_rate}/s{} (load {})",
                if forward { "" } else { " (the other way round)" },
                loadavg_line()
            );
            let (without, with) = if forward {
                let a = side(&bed, false, n).await?;
                (a, side(&bed, true, n).await?)
            } else {
                let b = side(&bed, true, n).await?;
                (side(&bed, false, n).await?, b)
            };
            eprintln!(
                "[run {run}]   p99 {:.1} ms without, {:.1} ms with ({} rows replayed in {:.1} s)",
                without.p99_ms, with.p99_ms, with.replayed, with.replay_seconds
            );
            pairs.push((without, with));
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    let peak_rss = sidecar.peak_rss();
    sidecar.stop().await.ok();
    echoes.finish().await.ok();
    store.connection().clone().close().await.ok();
    if !pairs.is_empty() {
        println!(
            "{}",
            report(&pairs, rows, n, live_rate, replay_rate, peak_rss)
        );
    }
    run
}

fn report(
    pairs: &[(Live, Live)],
    rows: usize,
    n: usize,
    live_rate: u32,
    replay_rate: u32,
    peak_rss: u64,
) -> String {
    let col = |f: &dyn Fn(&(Live, Live)) -> f64| pairs.iter().map(f).collect::<Vec<f64>>();
    let ratios = col(&|(a, b)| b.p99_ms / a.p99_ms);
    let rates = col(&|(_, b)| b.replayed as f64 / b.replay_seconds);
    let mut out = format!(
        "replay bench: {} sent rows seeded; {n} fresh events at {live_rate}/s per side; \
         a replay of every seeded row at {replay_rate}/s{} beside one side of each pair; \
         sidecar peak RSS {:.1} MiB\n",
        thousands(rows as f64),
        if replay_rate == 100 {
            " (the default)"
        } else {
            ""
        },
        peak_rss as f64 / (1 << 20) as f64
    );
    out += &format!(
        "fresh event p50 without / with a replay: {:.1} / {:.1} ms; p99 {:.1} / {:.1} ms (medians); \
         the replay went at {:.1} rows/s (median)\n",
        median(&col(&|(a, _)| a.p50_ms)),
        median(&col(&|(_, b)| b.p50_ms)),
        median(&col(&|(a, _)| a.p99_ms)),
        median(&col(&|(_, b)| b.p99_ms)),
        median(&rates),
    );
    out += &goal_line(
        REPLAY_GOAL,
        &ratios,
        Bound::AtMost(P99_BOUND),
        Shown::Times(2),
        "",
    );
    out
}
