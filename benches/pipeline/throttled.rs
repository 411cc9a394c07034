//! `--throttled` (`make bench-throttled`, issue 44): a backlog of N
//! (default 200,000) small pending events (~200-byte payloads), all
//! announced at once, drained by `outbox-sidecar run` twice, each on a
//! fresh database and topic: once with no rate limit (the reference), then
//! with the dispatcher limited to `--rate` events/s (default 10) for
//! `--throttled-seconds` (default 120). A rate limit is a wait, and a wait
//! is the scheduler's (an entry with a due time, no payload, no job): the
//! throttled sidecar's jobs (`outbox_jobs_running`) stay within
//! 2 × `max_in_flight`, its peak RSS within 1.1 × the reference's peak,
//! and its events keep going at the rate. Before the attempt redesign a
//! job waiting for its dispatcher's turn raised the job limit by one, so
//! every row of such a backlog became a task.

use super::*;

/// The throttled peak RSS may be this many times the reference's.
const RSS_BOUND: f64 = 1.1;
/// Partitions of the topic: 200,000 change events must fit the mock
/// broker's 100,000 messages and 5 MiB per partition.
const THROTTLED_PARTITIONS: i32 = 24;

/// `n` pending rows with payloads of about 200 bytes.
async fn insert_small_rows(store: &Store, n: usize) -> Result<()> {
    let sql = format!(
        r#"INSERT INTO {t} (event_name, payload, status, attempts, created_at, updated_at)
SELECT '{e}', jsonb_build_object('event_type', 'purchase_create', 'data',
           jsonb_build_object('purchase_id', 900000 + g, 'account_id', g % 977,
               'amount_cents', 129900, 'currency', 'BRL', 'installments', 6,
               'due_date', '2025-07-10')),
       'pending', 0, now() AT TIME ZONE 'utc', now() AT TIME ZONE 'utc'
FROM generate_series(1, {n}) AS g ORDER BY g"#,
        t = store.table(),
        e = EVENT_NAMES[0],
    );
    crate::db::insert(store, &sql, n).await
}

/// What one side saw.
struct Side {
    peak_rss: u64,
    /// The most jobs seen alive (`None`: the sidecar has no such gauge,
    /// a build from before the attempt redesign).
    max_jobs: Option<f64>,
    max_rate_waiting: f64,
    sent: u64,
    elapsed: Duration,
}

/// One sidecar over a fresh backlog of `n`: with `rate` set, run for
/// `seconds`; without, until every event is sent. Samples the job and
/// waiting gauges every 200 ms.
async fn side(env: &Env, n: usize, rate: Option<u32>, seconds: f64) -> Result<Side> {
    env.with_db(|url| async move {
        let store = open_store(&url, TABLE, 2).await?;
        insert_small_rows(&store, n).await?;
        let broker = Broker::with_partitions("outbox.public.outbox_events", THROTTLED_PARTITIONS)?;
        publish_all(&store, &broker, 0).await?;
        let receiver = &env.receivers.no_content;
        let answered0 = receiver.state.answered();
        let answered = || receiver.state.answered() - answered0;
        let vars: Vec<(String, String)> = rate
            .map(|r| {
                vec![(
                    "OUTBOX__DISPATCHERS__ACCOUNTS__RATE".to_owned(),
                    format!("{r}/s"),
                )]
            })
            .unwrap_or_default();
        let mut sidecar = Sidecar::start_with_env(env, &url, &broker, true, receiver, "", &vars)?;
        let run = async {
            sidecar.wait_ready().await?;
            let ready = Instant::now();
            let (mut max_jobs, mut max_rate_waiting) = (None::<f64>, 0f64);
            loop {
                if let Ok(m) = sidecar.metrics().await {
                    if let Some(&jobs) = m.get("outbox_jobs_running") {
                        max_jobs = Some(max_jobs.unwrap_or(0.0).max(jobs));
                    }
                    max_rate_waiting = max_rate_waiting.max(
                        m.get("outbox_scheduler_waiting{wait=\"rate\"}")
                            .copied()
                            .unwrap_or(0.0),
                    );
                }
                let done = answered() as usize >= n;
                let out_of_time = rate.is_some() && ready.elapsed().as_secs_f64() >= seconds;
                if done || out_of_time {
                    break;
                }
                if rate.is_none() && ready.elapsed() > STALL_LIMIT * 5 {
                    bail!(
                        "the reference did not drain {n} events in {:?}",
                        STALL_LIMIT * 5
                    );
                }
                if let Some(status) = sidecar.child.try_wait()? {
                    bail!("the sidecar exited ({status}):\n{}", sidecar.stderr_tail());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok::<_, anyhow::Error>((max_jobs, max_rate_waiting, answered(), ready.elapsed()))
        }
        .await;
        let peak_rss = sidecar.peak_rss();
        sidecar.stop().await?;
        let (max_jobs, max_rate_waiting, sent, elapsed) = run?;
        Ok(Side {
            peak_rss,
            max_jobs,
            max_rate_waiting,
            sent,
            elapsed,
        })
    })
    .await
}

/// `--throttled`: the same backlog with and without a rate limit.
pub(crate) async fn throttled(env: &Env, rate: u32, seconds: f64) -> Result<()> {
    let n = env.opts.events;
    let mif = env.opts.max_in_flight;
    eprintln!(
        "throttled bench: {n} events, rate {rate}/s for {seconds} s (load {})",
        loadavg_line()
    );
    let free = side(env, n, None, seconds)
        .await
        .context("the reference (no rate limit)")?;
    eprintln!("reference drained (load {})", loadavg_line());
    let limited = side(env, n, Some(rate), seconds)
        .await
        .context("the throttled side")?;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    println!(
        "throttled bench: {n} pending events of ~200-byte payloads announced at once, \
         max_in_flight {mif}, {THROTTLED_PARTITIONS} partitions"
    );
    let jobs = |j: Option<f64>| {
        j.map_or("n/a (no outbox_jobs_running gauge)".to_owned(), |j| {
            j.to_string()
        })
    };
    println!(
        "reference (no rate limit): {} sent in {:.1} s after /readyz; peak RSS {:.1} MiB; \
         at most {} jobs",
        free.sent,
        free.elapsed.as_secs_f64(),
        mib(free.peak_rss),
        jobs(free.max_jobs)
    );
    let achieved = limited.sent as f64 / limited.elapsed.as_secs_f64();
    println!(
        "rate {rate}/s: {} sent in {:.1} s after /readyz ({achieved:.2}/s, the limit's burst \
         included); peak RSS {:.1} MiB; at most {} jobs; at most {} events waiting for the rate",
        limited.sent,
        limited.elapsed.as_secs_f64(),
        mib(limited.peak_rss),
        jobs(limited.max_jobs),
        limited.max_rate_waiting
    );
    let jobs_bound = 2 * mif;
    println!(
        "{} live jobs ≤ 2 × max_in_flight ({jobs_bound}) under the rate limit: at most {}",
        match limited.max_jobs {
            Some(j) => verdict(j <= jobs_bound as f64),
            None => "UNSURE",
        },
        jobs(limited.max_jobs)
    );
    let ratio = limited.peak_rss as f64 / free.peak_rss.max(1) as f64;
    println!(
        "{} peak RSS under the rate limit ≤ {RSS_BOUND} × the same backlog with none: × {ratio:.2} \
         ({:.1} MiB against {:.1} MiB)",
        verdict(ratio <= RSS_BOUND),
        mib(limited.peak_rss),
        mib(free.peak_rss)
    );
    // The limit's default burst lets up to `rate` go at once at the start.
    let expected = rate as f64 * limited.elapsed.as_secs_f64();
    let kept =
        achieved >= 0.9 * rate as f64 && (limited.sent as f64) <= expected + 2.0 * rate as f64;
    println!(
        "{} events keep going at the rate: {achieved:.2}/s against {rate}/s (within 0.9 × the \
         rate and at most the rate plus two bursts)",
        verdict(kept)
    );
    Ok(())
}
