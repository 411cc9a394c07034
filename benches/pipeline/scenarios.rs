//! The scenarios: the real sidecar draining a backlog or a paced feed.

use super::*;

#[derive(Debug, Clone, Copy)]
pub(crate) enum Scenario {
    /// Publish everything, then start the sidecar; `fail_tenth`: the first
    /// attempt of every tenth id is refused; `history`: the attempt log on.
    Backlog { fail_tenth: bool, history: bool },
    /// Start the sidecar, then publish at `rate` events/s.
    Paced { rate: f64 },
    /// Start the sidecar, then publish as it consumes: never more than
    /// `window` events published and not yet posted. A backlog of any size
    /// this way, within the mock broker's 5 MiB per partition (the scale
    /// goal: 50,000 against 500,000 events).
    Streamed { window: usize },
}

/// What every scenario varies besides its kind.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setup {
    /// The receiver the sidecar posts to.
    pub(crate) target: Target,
    /// Publish the sidecar's status writes back onto the topic (see `echo`).
    pub(crate) echoes: bool,
    /// Pad each payload to this many bytes (0: the ~350-byte payload).
    pub(crate) payload_bytes: usize,
    /// Each row carries a W3C `traceparent` in a column the sidecar reads
    /// (`[tracing] column`, no exporter): what trace context costs.
    pub(crate) traced: bool,
    /// The rows carry the `traceparent` column whether or not the sidecar
    /// reads it (`traced` implies it): what the application's larger rows
    /// cost apart from what the sidecar does with them.
    pub(crate) trace_column: bool,
    /// `[ordering]` on: each row's aggregate (`aggregate_key`, id modulo
    /// [`crate::kafka::AGGREGATES`]) keys its change events, as
    /// `message.key.columns` would.
    pub(crate) ordered: bool,
    /// With `ordered`: every row in one aggregate (the one-hot-aggregate
    /// case: its events go one at a time).
    pub(crate) hot: bool,
    /// Run by the build `--versus` names, not this one.
    pub(crate) versus: bool,
}

impl Setup {
    /// How many aggregates the rows are spread over (ordered scenarios).
    pub(crate) fn aggregates(&self) -> i64 {
        if self.hot {
            1
        } else {
            crate::kafka::AGGREGATES
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct ScenarioResult {
    pub(crate) events: usize,
    pub(crate) rate: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
    /// `sent_at` − max(publish, ready): p50 of ids never refused.
    pub(crate) ready_p50_clean_ms: f64,
    /// p50 publish→sent of the ids refused once.
    pub(crate) p50_refused_ms: f64,
    pub(crate) startup_s: f64,
    /// `VmHWM` of the sidecar process.
    pub(crate) peak_rss: u64,
    /// The sidecar process, from its start (backlog) or from the first
    /// publish (paced) until the last row is `sent`.
    pub(crate) cpu_per_1k: f64,
    /// The bench process over the same span: mock broker, receiver, the
    /// bench's own polling (and, paced, the producer).
    pub(crate) bench_cpu_per_1k: f64,
    pub(crate) pg_cpu_per_1k: f64,
    pub(crate) requests: u64,
    pub(crate) failed_rows: i64,
    /// Mean of `outbox_inflight_events` sampled every 10 ms while draining.
    pub(crate) mean_in_flight: f64,
    /// Mean POST duration (`outbox_dispatch_duration_seconds` sum / count).
    pub(crate) mean_post_ms: f64,
    /// Echoes published (status writes the change feed carried back).
    pub(crate) echoes: u64,
    /// `outbox_cdc_messages_total` of the sidecar at the end / events.
    pub(crate) messages_per_event: f64,
    /// TCP connections the receiver accepted, per 1,000 events.
    pub(crate) connections_per_1k: f64,
    /// WAL the server wrote over the same span as the CPU figures, per
    /// event (the echo queue's writes included).
    pub(crate) wal_per_event: f64,
    /// Database transactions over the same span, per 1,000 events (how
    /// well statements batch).
    pub(crate) xacts_per_1k: f64,
    /// SQL statements the sidecar sent over the run, per 1,000 events
    /// (its own `outbox_db_statements_total`; n/a for a build without it).
    pub(crate) statements_per_1k: f64,
    /// Connections that ended while the sidecar ran (0 while keep-alive
    /// holds: the sidecar's own stop closes the rest).
    pub(crate) closed_while_running: u64,
}

/// After the last row is done: publishes the echoes still queued, then
/// waits (up to 10 s) until the sidecar has consumed every message the
/// topic got, `n` inserts and the echoes. Returns (echoes, consumed).
pub(crate) async fn settle(
    sidecar: &Sidecar,
    echoes: Option<Echoes>,
    n: usize,
) -> Result<(u64, f64)> {
    let published = match echoes {
        Some(e) => e.finish().await?,
        None => 0,
    };
    let want = (n as u64 + published) as f64;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let consumed: f64 = sidecar
            .metrics()
            .await?
            .iter()
            .filter(|(k, _)| k.starts_with("outbox_cdc_messages_total{"))
            .map(|(_, v)| v)
            .sum();
        if consumed >= want || Instant::now() > deadline {
            return Ok((published, consumed));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Nearest-rank percentile of sorted values.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub(crate) fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// One scenario on a fresh database.
pub(crate) async fn scenario(
    env: &Env,
    kind: Scenario,
    setup: Setup,
    n: usize,
) -> Result<ScenarioResult> {
    env.with_db(|url| async move { scenario_on(env, &url, kind, setup, n).await })
        .await
}

/// Adds what `setup` needs to the table: a `traceparent` column filled by
/// its default (traced), the aggregate column and its index (ordered).
pub(crate) async fn prepare_table(store: &Store, setup: Setup) -> Result<()> {
    if setup.traced || setup.trace_column {
        // A traceparent per row, filled by the column's (volatile) default
        // as the rows go in: the same INSERT as untraced rows.
        store
            .connection()
            .execute_unprepared(&format!(
                "ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS traceparent varchar(55) \
                 DEFAULT ('00-' || md5(random()::text) || '-' || \
                 substr(md5(random()::text), 1, 16) || '-01')"
            ))
            .await
            .context("adding the traceparent column")?;
    }
    if setup.ordered {
        // The aggregate as a generated column (what a Rails app without
        // one adds), with the index the ordering's reads use.
        store
            .connection()
            .execute_unprepared(&format!(
                "ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS aggregate_key text \
                 GENERATED ALWAYS AS ('agg-' || (id % {a})) STORED; \
                 CREATE INDEX IF NOT EXISTS {TABLE}_aggregate ON {TABLE} (aggregate_key, id)",
                a = setup.aggregates()
            ))
            .await
            .context("adding the aggregate column")?;
    }
    Ok(())
}

/// One scenario on the database at `url`, whose table may already hold
/// rows (a history): its `n` rows go after them, and only they are
/// published, counted and read back.
pub(crate) async fn scenario_on(
    env: &Env,
    url: &str,
    kind: Scenario,
    setup: Setup,
    n: usize,
) -> Result<ScenarioResult> {
    let store = open_store(url, TABLE, 4).await?;
    let base = max_id(&store).await?;
    prepare_table(&store, setup).await?;
    crate::kafka::ORDERED_KEYS.store(setup.ordered, std::sync::atomic::Ordering::Relaxed);
    crate::kafka::AGGREGATE_COUNT.store(setup.aggregates(), std::sync::atomic::Ordering::Relaxed);
    insert_rows(&store, n, setup.payload_bytes).await?;
    if setup.echoes {
        echo::install(&store).await?;
    }
    let receiver = env.receivers.get(setup.target);
    let echoes = |broker: &Broker| -> Result<Option<Echoes>> {
        Ok(if setup.echoes {
            Some(Echoes::start(
                store.clone(),
                &broker.brokers,
                &broker.topic,
            )?)
        } else {
            None
        })
    };
    let broker = Broker::start("outbox.public.outbox_events")?;
    let fail_tenth = matches!(
        kind,
        Scenario::Backlog {
            fail_tenth: true,
            ..
        }
    );
    let history = !matches!(kind, Scenario::Backlog { history: false, .. });
    receiver
        .state
        .fail_tenth
        .store(fail_tenth, Ordering::Relaxed);
    let requests_before = receiver.state.requests.load(Ordering::Relaxed);
    let answered_before = receiver.state.answered();
    let answered = || receiver.state.answered() - answered_before;
    let connections_before = receiver.state.connections.load(Ordering::Relaxed);
    let closed_before = receiver.state.closed.load(Ordering::Relaxed);
    let closed_so_far = || receiver.state.closed.load(Ordering::Relaxed) - closed_before;

    let mut out = ScenarioResult {
        events: n,
        ..ScenarioResult::default()
    };
    let (times, ready_at, cpu_ticks, pg_ticks) = match kind {
        Scenario::Backlog { .. } => {
            let times = publish_all(&store, &broker, base).await?;
            let wal0 = wal_bytes(&store).await?;
            let xacts0 = transactions(&store).await?;
            let pg0 = postgres_cpu_ticks();
            let bench0 = self_cpu_ticks();
            let started = Instant::now();
            let echoes = echoes(&broker)?;
            let mut sidecar =
                Sidecar::start(env, url, &broker, history, receiver, tracing_toml(setup))?;
            let run = async {
                sidecar.wait_ready().await?;
                let ready_at = chrono::Utc::now().timestamp_micros();
                out.startup_s = started.elapsed().as_secs_f64();
                let stop = Arc::new(AtomicBool::new(false));
                let sampler = {
                    let stop = stop.clone();
                    let (http, admin) = (sidecar.http.clone(), sidecar.admin);
                    tokio::spawn(async move {
                        let url = format!("http://{admin}/metrics");
                        let (mut sum, mut count) = (0f64, 0u64);
                        while !stop.load(Ordering::Relaxed) {
                            if let Ok(r) = http.get(&url).send().await {
                                if let Ok(text) = r.text().await {
                                    if let Some(v) = text
                                        .lines()
                                        .find_map(|l| l.strip_prefix("outbox_inflight_events "))
                                        .and_then(|v| v.trim().parse::<f64>().ok())
                                    {
                                        sum += v;
                                        count += 1;
                                    }
                                }
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        sum / count.max(1) as f64
                    })
                };
                let done = wait_all_done(&store, base, n, answered).await;
                (out.echoes, out.messages_per_event) = settle(&sidecar, echoes, n).await?;
                stop.store(true, Ordering::Relaxed);
                out.mean_in_flight = sampler.await.unwrap_or(f64::NAN);
                let m = sidecar.metrics().await?;
                let series = |what: &str| {
                    m.get(&format!(
                        "outbox_dispatch_duration_seconds_{what}{{dispatcher=\"accounts\"}}"
                    ))
                    .copied()
                    .unwrap_or(f64::NAN)
                };
                out.mean_post_ms = series("sum") * 1_000.0 / series("count").max(1.0);
                out.statements_per_1k = m
                    .get("outbox_db_statements_total")
                    .map_or(f64::NAN, |s| s / n as f64 * 1_000.0);
                let (_, failed) = done?;
                Ok::<_, anyhow::Error>((ready_at, failed))
            }
            .await;
            let cpu = sidecar.cpu_ticks();
            out.wal_per_event = (wal_bytes(&store).await? - wal0) as f64 / n as f64;
            out.xacts_per_1k = (transactions(&store).await? - xacts0) as f64 / n as f64 * 1_000.0;
            out.bench_cpu_per_1k =
                (self_cpu_ticks() - bench0) as f64 / env.ticks_per_s / n as f64 * 1_000.0;
            let pg = postgres_cpu_delta(&pg0);
            out.peak_rss = sidecar.peak_rss();
            out.closed_while_running = closed_so_far();
            sidecar.stop().await?;
            let (ready_at, failed) = run?;
            out.failed_rows = failed;
            (times, ready_at, cpu, pg)
        }
        Scenario::Paced { rate } => {
            let rows = load_rows(&store, base, n).await?;
            let echoes = echoes(&broker)?;
            let mut sidecar =
                Sidecar::start(env, url, &broker, history, receiver, tracing_toml(setup))?;
            let run = async {
                sidecar.wait_ready().await?;
                let ready_at = chrono::Utc::now().timestamp_micros();
                let pg0 = postgres_cpu_ticks();
                let cpu0 = sidecar.cpu_ticks();
                let bench0 = self_cpu_ticks();
                let times =
                    tokio::task::block_in_place(|| publish_paced(&rows, TABLE, &broker, rate))?;
                let (_, failed) = wait_all_done(&store, base, n, answered).await?;
                (out.echoes, out.messages_per_event) = settle(&sidecar, echoes, n).await?;
                let cpu = sidecar.cpu_ticks() - cpu0;
                out.bench_cpu_per_1k =
                    (self_cpu_ticks() - bench0) as f64 / env.ticks_per_s / n as f64 * 1_000.0;
                let pg = postgres_cpu_delta(&pg0);
                Ok::<_, anyhow::Error>((times, ready_at, cpu, pg, failed))
            }
            .await;
            out.peak_rss = sidecar.peak_rss();
            out.closed_while_running = closed_so_far();
            sidecar.stop().await?;
            let (times, ready_at, cpu, pg, failed) = run?;
            out.failed_rows = failed;
            (times, ready_at, cpu, pg)
        }
        Scenario::Streamed { window } => {
            let echoes = echoes(&broker)?;
            let mut sidecar =
                Sidecar::start(env, url, &broker, history, receiver, tracing_toml(setup))?;
            let run = async {
                sidecar.wait_ready().await?;
                let ready_at = chrono::Utc::now().timestamp_micros();
                let pg0 = postgres_cpu_ticks();
                let cpu0 = sidecar.cpu_ticks();
                let bench0 = self_cpu_ticks();
                let wal0 = wal_bytes(&store).await?;
                let posted = || receiver.state.requests.load(Ordering::Relaxed) - requests_before;
                let times = publish_streamed(&store, &broker, base, posted, window).await?;
                let (_, failed) = wait_all_done(&store, base, n, answered).await?;
                (out.echoes, out.messages_per_event) = settle(&sidecar, echoes, n).await?;
                let cpu = sidecar.cpu_ticks() - cpu0;
                out.wal_per_event = (wal_bytes(&store).await? - wal0) as f64 / n as f64;
                out.bench_cpu_per_1k =
                    (self_cpu_ticks() - bench0) as f64 / env.ticks_per_s / n as f64 * 1_000.0;
                let pg = postgres_cpu_delta(&pg0);
                Ok::<_, anyhow::Error>((times, ready_at, cpu, pg, failed))
            }
            .await;
            out.peak_rss = sidecar.peak_rss();
            out.closed_while_running = closed_so_far();
            sidecar.stop().await?;
            let (times, ready_at, cpu, pg, failed) = run?;
            out.failed_rows = failed;
            (times, ready_at, cpu, pg)
        }
    };

    out.requests = receiver.state.requests.load(Ordering::Relaxed) - requests_before;
    receiver.state.fail_tenth.store(false, Ordering::Relaxed);
    out.messages_per_event /= n as f64;
    out.connections_per_1k =
        (receiver.state.connections.load(Ordering::Relaxed) - connections_before) as f64 / n as f64
            * 1_000.0;
    out.cpu_per_1k = cpu_ticks as f64 / env.ticks_per_s / n as f64 * 1_000.0;
    out.pg_cpu_per_1k = pg_ticks as f64 / env.ticks_per_s / n as f64 * 1_000.0;

    let sent = sent_times(&store, base).await?;
    if sent.len() != n {
        bail!(
            "{} of {n} rows sent ({} failed)",
            sent.len(),
            out.failed_rows
        );
    }
    let mut lat = Vec::with_capacity(n);
    let mut clean_from_ready = Vec::new();
    let mut refused = Vec::new();
    let mut first_publish = i64::MAX;
    let mut last_sent = i64::MIN;
    for (id, sent_at) in &sent {
        let published = *times
            .get(id)
            .ok_or_else(|| anyhow!("no publish time for id {id}"))?;
        let sent_us = sent_at.and_utc().timestamp_micros();
        first_publish = first_publish.min(published);
        last_sent = last_sent.max(sent_us);
        let ms = (sent_us - published) as f64 / 1_000.0;
        lat.push(ms);
        if fail_tenth && id % 10 == 0 {
            refused.push(ms);
        } else if id % 10 != 0 {
            clean_from_ready.push((sent_us - published.max(ready_at)) as f64 / 1_000.0);
        }
    }
    let lat = sorted(lat);
    out.p50_ms = percentile(&lat, 50.0);
    out.p99_ms = percentile(&lat, 99.0);
    out.max_ms = lat.last().copied().unwrap_or(f64::NAN);
    out.ready_p50_clean_ms = percentile(&sorted(clean_from_ready), 50.0);
    out.p50_refused_ms = percentile(&sorted(refused), 50.0);
    let from = match kind {
        Scenario::Backlog { .. } | Scenario::Streamed { .. } => ready_at,
        Scenario::Paced { .. } => first_publish,
    };
    out.rate = n as f64 / ((last_sent - from) as f64 / 1e6).max(1e-6);
    store.connection().clone().close().await.ok();
    Ok(out)
}

pub(crate) fn add_scenario(
    sheet: &mut Sheet,
    label: &str,
    o: &ScenarioResult,
    load: f64,
    backlog: bool,
) {
    let name = |what: &str| format!("{label}: {what}");
    sheet.add(&name("events/s end to end"), Unit::Rate, o.rate, load);
    sheet.add(&name("publish→sent p50"), Unit::Ms, o.p50_ms, load);
    sheet.add(&name("publish→sent p99"), Unit::Ms, o.p99_ms, load);
    sheet.add(&name("publish→sent max"), Unit::Ms, o.max_ms, load);
    if backlog {
        sheet.add(
            &name("ready→sent p50, ids never refused"),
            Unit::Ms,
            o.ready_p50_clean_ms,
            load,
        );
        sheet.add(
            &name("start-up until /readyz"),
            Unit::Secs,
            o.startup_s,
            load,
        );
        sheet.add(
            &name("mean jobs in flight (sampled)"),
            Unit::Count,
            o.mean_in_flight,
            load,
        );
        sheet.add(&name("mean POST duration"), Unit::Ms, o.mean_post_ms, load);
    }
    sheet.add(
        &name("peak RSS of the sidecar process (VmHWM)"),
        Unit::MiB,
        o.peak_rss as f64 / MIB,
        load,
    );
    if o.p50_refused_ms.is_finite() {
        sheet.add(
            &name("publish→sent p50, ids refused once"),
            Unit::Ms,
            o.p50_refused_ms,
            load,
        );
    }
    sheet.add(
        &name("CPU s / 1,000 events (sidecar process)"),
        Unit::Secs,
        o.cpu_per_1k,
        load,
    );
    sheet.add(
        &name("CPU s / 1,000 events (bench process: broker, receiver)"),
        Unit::Secs,
        o.bench_cpu_per_1k,
        load,
    );
    sheet.add(
        &name("CPU s / 1,000 events (postgres, approx.)"),
        Unit::Secs,
        o.pg_cpu_per_1k,
        load,
    );
    if o.wal_per_event > 0.0 {
        sheet.add(
            &name("WAL bytes / event (the whole server, echo queue included)"),
            Unit::Count,
            o.wal_per_event,
            load,
        );
    }
    if o.xacts_per_1k > 0.0 {
        sheet.add(
            &name("database transactions / 1,000 events (sidecar and echo queue)"),
            Unit::Ratio,
            o.xacts_per_1k,
            load,
        );
    }
    if o.statements_per_1k > 0.0 {
        sheet.add(
            &name("SQL statements / 1,000 events (the sidecar's, outbox_db_statements_total)"),
            Unit::Ratio,
            o.statements_per_1k,
            load,
        );
    }
    sheet.add(&name("HTTP requests"), Unit::Count, o.requests as f64, load);
    sheet.add(
        &name("connections opened / 1,000 events (receiver accepts)"),
        Unit::Ratio,
        o.connections_per_1k,
        load,
    );
    sheet.add(
        &name("connections closed while the sidecar ran"),
        Unit::Count,
        o.closed_while_running as f64,
        load,
    );
    sheet.add(
        &name("echoes published"),
        Unit::Count,
        o.echoes as f64,
        load,
    );
    sheet.add(
        &name("messages consumed / event"),
        Unit::Ratio,
        o.messages_per_event,
        load,
    );
    sheet.add(&name("events"), Unit::Count, o.events as f64, load);
}

/// The sidecar's `[tracing]` for `setup`: the column, no exporter.
pub(crate) fn tracing_toml(setup: Setup) -> &'static str {
    match (setup.traced, setup.ordered) {
        (true, false) => "[tracing]\ncolumn = \"traceparent\"\n",
        (false, true) => "[ordering]\ncolumn = \"aggregate_key\"\n",
        (true, true) => {
            "[tracing]\ncolumn = \"traceparent\"\n[ordering]\ncolumn = \"aggregate_key\"\n"
        }
        (false, false) => "",
    }
}
