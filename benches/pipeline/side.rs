//! `--side-by-side`: a pair's sidecars (two, or three) drain their backlogs at the
//! same time, each on its own database and topic, all posting to one
//! receiver. Each side's events/s is counted over the window all were
//! draining at full speed: from the moment every side was ready and had
//! sent its first twentieth of the backlog, to the moment the first side
//! had sent all but its last twentieth (by the rows' `sent_at`).
//!
//! Why: run one after the other, the two sides of a pair see different
//! machines. On the shared 2-core machine the same S1 measured 0.043 to
//! 0.063 CPU s per 1,000 events within one run (2026-12-06, `--trace-pair`),
//! a swing of 45 % in a few seconds that no pairing of 3-second runs can
//! cancel, and a "within 5 %" goal cannot be judged through it. Side by
//! side, whatever slows the machine slows both sides at once: a side that
//! costs more per event (in the sidecar or in its PostgreSQL backends)
//! gets fewer events through the same CPU.
//!
//! What it cannot see: a limit that is not CPU. Side by side every side is
//! short of CPU, so a variant whose own run is bound by waiting (ordering
//! sends an aggregate's events one at a time: 52 database transactions
//! per 1,000 events against S1's 27) looks cheaper than it runs alone
//! (the ordering pair: × 0.94 side by side, × 0.81 back to back). The
//! trace pair and the history's S1 pairs change what each event costs,
//! not how it waits: they run side by side by default; the ordering pair
//! back to back.

use super::*;

/// One side of a pair, ready to start: its table filled and its backlog
/// published.
struct Side {
    label: String,
    setup: Setup,
    url: String,
    store: Store,
    base: i64,
    broker: Broker,
}

/// Runs the sides of one pair (two, or three) at once, each on a fresh
/// database, and adds each one's figures to the sheet under its label.
pub(crate) async fn pair(
    env: &Env,
    sheet: &mut Sheet,
    run: usize,
    sides: &[(&'static str, Setup)],
    n: usize,
) -> Result<()> {
    let mut dbs = Vec::new();
    let mut at = Vec::new();
    let mut result = Ok(());
    for (label, setup) in sides {
        match env.create_db().await {
            Ok(db) => {
                at.push(((*label).to_owned(), *setup, db.url.clone()));
                dbs.push(db);
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if result.is_ok() {
        result = pair_at(env, sheet, run, at, n).await;
    }
    for db in &dbs {
        env.drop_db(db).await;
    }
    result
}

async fn prepare(label: String, setup: Setup, url: &str, n: usize) -> Result<Side> {
    let store = open_store(url, TABLE, 4).await?;
    let base = max_id(&store).await?;
    prepare_table(&store, setup).await?;
    crate::kafka::ORDERED_KEYS.store(setup.ordered, Ordering::Relaxed);
    crate::kafka::AGGREGATE_COUNT.store(setup.aggregates(), Ordering::Relaxed);
    insert_rows(&store, n, setup.payload_bytes).await?;
    if setup.echoes {
        echo::install(&store).await?;
    }
    let broker = Broker::start("outbox.public.outbox_events")?;
    publish_all(&store, &broker, base).await?;
    Ok(Side {
        label,
        setup,
        url: url.to_owned(),
        store,
        base,
        broker,
    })
}

/// What one side did while both ran.
struct Drained {
    ready_at: i64,
    sent: Vec<i64>,
    cpu_ticks: u64,
    peak_rss: u64,
}

/// Runs the sides of one pair at once, each on the database at its url
/// (whose table may already hold rows: a side's `n` rows go after them),
/// and adds each one's figures to the sheet under its label.
pub(crate) async fn pair_at(
    env: &Env,
    sheet: &mut Sheet,
    run: usize,
    sides: Vec<(String, Setup, String)>,
    n: usize,
) -> Result<()> {
    if n < 2 {
        bail!("side by side needs backlogs of at least 2 events (--events)");
    }
    let any_ordered = sides.iter().any(|(_, s, _)| s.ordered);
    let mut prepared = Vec::with_capacity(2);
    for (label, setup, url) in sides {
        prepared.push(prepare(label, setup, &url, n).await?);
    }
    let labels: Vec<&str> = prepared.iter().map(|s| s.label.as_str()).collect();
    eprintln!(
        "[run {run}] side by side: {}, backlogs of {n} each (load {})",
        labels.join(" | "),
        loadavg_line()
    );
    // The echoes publish while both run: keyed by the aggregate when
    // either side is ordered (the unordered side does not read keys).
    crate::kafka::ORDERED_KEYS.store(any_ordered, Ordering::Relaxed);
    let l = load1();
    let pg0 = postgres_cpu_ticks();
    let drained =
        futures::future::try_join_all(prepared.iter().map(|side| drain(env, side, n))).await?;
    let pg = postgres_cpu_delta(&pg0);
    // The window all were draining in, at full speed: from when every
    // side was ready and had sent its first twentieth (a side that became
    // ready first is past its ramp-up sooner), to when the first side had
    // sent all but its last twentieth (a side's last events drain with
    // fewer in flight).
    let trim = (n / 20).max(1).min(n - 1);
    let from = drained
        .iter()
        .map(|d| d.ready_at.max(d.sent[trim - 1]))
        .max()
        .unwrap_or(0);
    let to = drained
        .iter()
        .map(|d| d.sent[n - trim])
        .min()
        .unwrap_or(i64::MIN);
    if to <= from {
        bail!("side by side: no common window (all at full speed from {from} µs, one slowing from {to} µs)");
    }
    let window_s = (to - from) as f64 / 1e6;
    let mut rates = Vec::new();
    for (side, d) in prepared.iter().zip(&drained) {
        let within = d.sent.iter().filter(|&&t| t > from && t <= to).count();
        let rate = within as f64 / window_s;
        rates.push(rate);
        let name = |what: &str| format!("{}: {what}", side.label);
        sheet.add(&name("events/s end to end"), Unit::Rate, rate, l);
        sheet.add(
            &name("CPU s / 1,000 events (sidecar process)"),
            Unit::Secs,
            d.cpu_ticks as f64 / env.ticks_per_s / n as f64 * 1_000.0,
            l,
        );
        sheet.add(
            &name("peak RSS of the sidecar process (VmHWM)"),
            Unit::MiB,
            d.peak_rss as f64 / MIB,
            l,
        );
        sheet.add(&name("events"), Unit::Count, n as f64, l);
    }
    sheet.add("side by side: common window (s)", Unit::Secs, window_s, l);
    sheet.add(
        "side by side: CPU s / 1,000 events of all sides (postgres, approx.)",
        Unit::Secs,
        pg as f64 / env.ticks_per_s / (prepared.len() * n) as f64 * 1_000.0,
        l,
    );
    let rates: Vec<String> = rates.iter().map(|r| format!("{r:.0} events/s")).collect();
    eprintln!(
        "[run {run}]   {} over the common {window_s:.2} s",
        rates.join(" | ")
    );
    for side in &prepared {
        side.store.connection().clone().close().await.ok();
    }
    Ok(())
}

/// Starts one side's sidecar and waits until its backlog is done.
async fn drain(env: &Env, side: &Side, n: usize) -> Result<Drained> {
    let receiver = env.receivers.get(side.setup.target);
    let echoes = if side.setup.echoes {
        Some(Echoes::start(
            side.store.clone(),
            &side.broker.brokers,
            &side.broker.topic,
        )?)
    } else {
        None
    };
    let mut sidecar = if side.setup.versus {
        Sidecar::start_versus(
            env,
            &side.url,
            &side.broker,
            receiver,
            tracing_toml(side.setup),
        )?
    } else {
        Sidecar::start(
            env,
            &side.url,
            &side.broker,
            true,
            receiver,
            tracing_toml(side.setup),
        )?
    };
    let run = async {
        sidecar.wait_ready().await?;
        let ready_at = chrono::Utc::now().timestamp_micros();
        // The receiver is shared: progress is read from this side's table.
        let (_, failed) = wait_all_done(&side.store, side.base, n, || 0).await?;
        settle(&sidecar, echoes, n).await?;
        Ok::<_, anyhow::Error>((ready_at, failed))
    }
    .await;
    let cpu_ticks = sidecar.cpu_ticks();
    let peak_rss = sidecar.peak_rss();
    sidecar.stop().await?;
    let (ready_at, failed) = run?;
    let mut sent: Vec<i64> = sent_times(&side.store, side.base)
        .await?
        .iter()
        .map(|(_, at)| at.and_utc().timestamp_micros())
        .collect();
    if sent.len() != n {
        bail!(
            "{}: {} of {n} rows sent ({failed} failed)",
            side.label,
            sent.len()
        );
    }
    sent.sort_unstable();
    Ok(Drained {
        ready_at,
        sent,
        cpu_ticks,
        peak_rss,
    })
}
