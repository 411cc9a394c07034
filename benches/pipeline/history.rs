//! `--scenario history`: the sidecar's cost must not grow with the
//! history its table keeps, nor with how many replicas it has.
//!
//! One database holds `--history-rows` (5,000,000) rows sent long ago,
//! seeded in one `INSERT … SELECT … generate_series` and vacuumed. Three
//! phases, each a series of pairs (`--runs`, 5: see `verdict`):
//!
//! 1. **S1 over the history.** S1's workload (`--events` pending rows, their
//!    insert events, echoes, the 201 + JSON receiver) on a fresh empty table
//!    and, back to back, on the history table (its rows go after the
//!    history's, which is never published or read back by the bench); the
//!    order alternates by pair. Per pair: events/s and the sidecar's CPU
//!    per event on the history over the same on the empty table.
//! 2. **Idle.** A sidecar with `metrics.refresh_interval = 1s` and nothing to
//!    do on an empty table and one on the history table, side by side:
//!    after [`IDLE_SETTLE`], the database buffers each database's backends
//!    touched over `--idle-seconds` (`pg_stat_database.blks_hit +
//!    blks_read`), per second, and the connections each sidecar held.
//! 3. **An idle replica.** On the history table, a 1-partition topic: S1's
//!    backlog drained by one sidecar alone and, back to back, by the same
//!    with a second one in its group (it owns no partition). The database
//!    buffers of each run, from before the first sidecar starts until both
//!    have stopped (every backend gone, so every figure reported); the
//!    idle replica's share is what the second run adds over the first. The
//!    echo trigger is off in this phase and the bench reads the backlog
//!    before the window: every buffer counted is a sidecar's. Both run with
//!    the 1 s refresh of the idle phase. The run with the replica also
//!    counts its start-up, its join and the first sidecar's idle seconds
//!    while the group settles: an upper bound of what it adds. A first run,
//!    not counted, comes before the pairs.
//!
//! The history table grows by `--events` sent rows in each run of phases
//! 1 and 3 (the report prints its size at the end). The whole scenario took
//! about 9 minutes on the 2-core development machine, so the default run
//! (`make bench-pipeline`, ~15 minutes with its five pairs) leaves it out.

use super::*;

/// After an idle sidecar is ready, how long before its window opens. A
/// backend that goes idle with figures not yet reported reports them
/// 10 s later (PostgreSQL's `PGSTAT_IDLE_INTERVAL`): past that, what the
/// start-up's statements touched is counted and out of the window.
pub(crate) const IDLE_SETTLE: Duration = Duration::from_secs(11);

/// The idle phase's and the replica phase's refresh of the table gauges.
const REFRESH_1S: &str = "[metrics]\nrefresh_interval = \"1s\"\n";

/// The goal on the buffers an idle sidecar touches per second with the
/// history.
const IDLE_BUFFERS_PER_S: f64 = 2_000.0;

fn s1_label(rows: Option<usize>) -> String {
    match rows {
        None => "S1 on an empty table".to_owned(),
        Some(n) => format!("S1 on {} sent rows", thousands(n as f64)),
    }
}

fn idle_label(rows: Option<usize>, what: &str) -> String {
    match rows {
        None => format!("idle sidecar, empty table: {what}"),
        Some(n) => format!("idle sidecar, {} sent rows: {what}", thousands(n as f64)),
    }
}

const IDLE_BUFFERS: &str = "database buffers / s (refresh 1 s)";
const IDLE_CONNECTIONS: &str = "connections held (most seen in the window)";
const REPLICA_ALONE: &str = "1-partition topic, the busy sidecar alone: database buffers";
const REPLICA_WITH: &str =
    "1-partition topic, the busy sidecar and an idle replica: database buffers";
const REPLICA_SPAN: &str = "1-partition topic: seconds from the first start to the last stop";
const REPLICA_SPAN_WITH: &str =
    "1-partition topic, with the idle replica: seconds from the first start to the last stop";

pub(crate) async fn history(env: &Env) -> Result<()> {
    let db = env.create_db().await?;
    let result = history_on(env, &db).await;
    env.drop_db(&db).await;
    result
}

async fn history_on(env: &Env, db: &BenchDb) -> Result<()> {
    let o = &env.opts;
    let rows = o.history_rows;
    eprintln!(
        "history: seeding {} sent rows into {} (load {})",
        thousands(rows as f64),
        db.name,
        loadavg_line()
    );
    let store = open_store(&db.url, TABLE, 2).await?;
    let started = Instant::now();
    seed_history(&store, rows).await?;
    let seed_s = started.elapsed().as_secs_f64();
    echo::install(&store).await?;
    let size_before = table_size(&store).await?;
    store.connection().clone().close().await.ok();
    eprintln!(
        "history: seeded in {seed_s:.0} s, {} (load {})",
        size_before,
        loadavg_line()
    );

    let mut sheet = Sheet::default();
    overview_reads(&db.url, rows, &mut sheet).await?;
    let mut runs_done = [0usize; 3];
    let result = async {
        for run in 1..=o.runs {
            s1_pair(env, db, &mut sheet, run).await?;
            runs_done[0] += 1;
        }
        idle_phase(env, db, &mut sheet, &mut runs_done[1]).await?;
        // The first run after the idle phase's VACUUM inserts its rows into
        // the space it freed, all over the table, and its sidecar touched
        // 14% more buffers than the runs after it: one run, not counted,
        // takes that.
        eprintln!(
            "[warm-up] 1-partition topic, a busy sidecar alone, not counted (load {})",
            loadavg_line()
        );
        replica_run(env, db, false).await?;
        for run in 1..=o.runs {
            replica_pair(env, db, &mut sheet, run).await?;
            runs_done[2] += 1;
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    let store = open_store(&db.url, TABLE, 1).await?;
    let (size_after, rows_after) = (table_size(&store).await?, max_id(&store).await?);
    store.connection().clone().close().await.ok();
    if runs_done.iter().any(|n| *n > 0) {
        println!(
            "{}",
            report(
                o,
                &sheet,
                runs_done,
                seed_s,
                &size_before,
                &size_after,
                rows_after
            )
        );
    }
    result
}

/// The console overview's database reads (the table gauges' query, the
/// sent count up to its cap, the last hour's chart, each dispatcher's
/// recent outcomes) over the seeded history, timed one after the other as
/// the page makes them: one warm-up, then [`OVERVIEW_SAMPLES`] samples.
async fn overview_reads(url: &str, rows: usize, sheet: &mut Sheet) -> Result<()> {
    let store = open_store(url, TABLE, 1).await?;
    let names: Vec<String> = EVENT_NAMES.iter().map(|n| n.to_string()).collect();
    let label = overview_label(rows);
    for i in 0..=OVERVIEW_SAMPLES {
        let l = load1();
        let started = Instant::now();
        store.stats().await?;
        store.count_sent_up_to(10_000).await?;
        let now = outbox_sidecar::store::now();
        store
            .attempts_per_minute(None, now - chrono::Duration::minutes(60), 60)
            .await?;
        store
            .recent_outcomes(&names, now - chrono::Duration::minutes(5))
            .await?;
        let ms = started.elapsed().as_secs_f64() * 1_000.0;
        if i > 0 {
            sheet.add(&label, Unit::Ms, ms, l);
        }
    }
    eprintln!(
        "history: the console overview's reads over {} sent rows: {:.1} ms (median of {OVERVIEW_SAMPLES})",
        thousands(rows as f64),
        sheet.median(&label)
    );
    store.connection().clone().close().await.ok();
    Ok(())
}

const OVERVIEW_SAMPLES: usize = 10;

fn overview_label(rows: usize) -> String {
    format!(
        "console overview's database reads, {} sent rows",
        thousands(rows as f64)
    )
}

/// The table's size with its indexes, as PostgreSQL prints it.
async fn table_size(store: &Store) -> Result<String> {
    let stmt = Statement::from_string(
        DbBackend::Postgres,
        format!(
            "SELECT pg_size_pretty(pg_total_relation_size('{}')) AS s",
            store.table()
        ),
    );
    let row = store
        .connection()
        .query_one_raw(stmt)
        .await?
        .ok_or_else(|| anyhow!("no size row"))?;
    Ok(row.try_get("", "s")?)
}

/// Phase 1: S1 on an empty table and on the history, back to back.
async fn s1_pair(env: &Env, db: &BenchDb, sheet: &mut Sheet, run: usize) -> Result<()> {
    let o = &env.opts;
    let kind = Scenario::Backlog {
        fail_tenth: false,
        history: true,
    };
    let mut sides = [None, Some(o.history_rows)];
    if run.is_multiple_of(2) {
        sides.reverse();
    }
    if o.side_by_side {
        // Both at once: the empty table on a fresh database, the history
        // on its own (see `side`).
        let fresh = env.create_db().await?;
        let at = sides
            .into_iter()
            .map(|side| {
                let url = match side {
                    None => fresh.url.clone(),
                    Some(_) => db.url.clone(),
                };
                (s1_label(side), base_setup(o), url)
            })
            .collect();
        let result = crate::side::pair_at(env, sheet, run, at, o.events).await;
        env.drop_db(&fresh).await;
        return result;
    }
    for side in sides {
        let label = s1_label(side);
        eprintln!(
            "[pair {run}] {label}: backlog of {} (load {})",
            o.events,
            loadavg_line()
        );
        let l = load1();
        let s = match side {
            None => scenario(env, kind, base_setup(o), o.events).await?,
            Some(_) => scenario_on(env, &db.url, kind, base_setup(o), o.events).await?,
        };
        eprintln!(
            "[pair {run}]   {:.0} events/s, CPU {:.3} s / 1,000 events",
            s.rate, s.cpu_per_1k
        );
        let name = |what: &str| format!("{label}: {what}");
        sheet.add(&name("events/s end to end"), Unit::Rate, s.rate, l);
        sheet.add(
            &name("CPU s / 1,000 events (sidecar process)"),
            Unit::Secs,
            s.cpu_per_1k,
            l,
        );
        sheet.add(
            &name("CPU s / 1,000 events (postgres, approx.)"),
            Unit::Secs,
            s.pg_cpu_per_1k,
            l,
        );
        sheet.add(&name("ready→sent p50"), Unit::Ms, s.ready_p50_clean_ms, l);
        sheet.add(&name("start-up until /readyz"), Unit::Secs, s.startup_s, l);
        sheet.add(
            &name("peak RSS of the sidecar process (VmHWM)"),
            Unit::MiB,
            s.peak_rss as f64 / MIB,
            l,
        );
    }
    Ok(())
}

/// What one idle sidecar did in its window.
struct Idle {
    buffers_per_s: f64,
    connections: i64,
}

/// Phase 2: an idle sidecar on an empty table and one on the history, side
/// by side, one pair per run.
async fn idle_phase(env: &Env, db: &BenchDb, sheet: &mut Sheet, done: &mut usize) -> Result<()> {
    let o = &env.opts;
    // The history's dead row versions and new rows from phase 1, vacuumed
    // as autovacuum would (this server may run without it): the window
    // counts no vacuum.
    let store = open_store(&db.url, TABLE, 1).await?;
    store
        .connection()
        .execute_unprepared("VACUUM (ANALYZE)")
        .await
        .context("vacuuming the history database")?;
    store.connection().clone().close().await.ok();
    let empty = env.create_db().await?;
    let result = async {
        let store = open_store(&empty.url, TABLE, 1).await?;
        store.connection().clone().close().await.ok();
        for run in 1..=o.runs {
            eprintln!(
                "[pair {run}] idle sidecars, empty table and {} sent rows: {:.0} s settle, {:.0} s window (load {})",
                thousands(o.history_rows as f64),
                IDLE_SETTLE.as_secs_f64(),
                o.idle_seconds,
                loadavg_line()
            );
            let l = load1();
            let (e, h) = tokio::try_join!(idle(env, &empty), idle(env, db))?;
            eprintln!(
                "[pair {run}]   {:.0} vs {:.0} buffers/s, {} vs {} connections",
                e.buffers_per_s, h.buffers_per_s, e.connections, h.connections
            );
            for (side, i) in [(None, &e), (Some(o.history_rows), &h)] {
                sheet.add(
                    &idle_label(side, IDLE_BUFFERS),
                    Unit::Count,
                    i.buffers_per_s,
                    l,
                );
                sheet.add(
                    &idle_label(side, IDLE_CONNECTIONS),
                    Unit::Count,
                    i.connections as f64,
                    l,
                );
            }
            *done += 1;
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    env.drop_db(&empty).await;
    result
}

/// One idle sidecar on `db` (no event on its topic), the 1 s refresh.
async fn idle(env: &Env, db: &BenchDb) -> Result<Idle> {
    let broker = Broker::start("outbox.public.outbox_events")?;
    let mut sidecar = Sidecar::start(
        env,
        &db.url,
        &broker,
        true,
        &env.receivers.created,
        REFRESH_1S,
    )?;
    sidecar.wait_ready().await?;
    tokio::time::sleep(IDLE_SETTLE).await;
    let window = Duration::from_secs_f64(env.opts.idle_seconds);
    let b0 = db_buffers(&env.admin, &db.name).await?;
    let t0 = Instant::now();
    let mut connections = 0;
    while t0.elapsed() < window {
        connections = connections.max(db_backends(&env.admin, &db.name).await?);
        let left = window.saturating_sub(t0.elapsed());
        tokio::time::sleep(left.min(Duration::from_millis(500))).await;
    }
    let b1 = db_buffers(&env.admin, &db.name).await?;
    let secs = t0.elapsed().as_secs_f64();
    sidecar.stop().await?;
    Ok(Idle {
        buffers_per_s: (b1 - b0) as f64 / secs,
        connections,
    })
}

/// Phase 3: S1's backlog on the history over a 1-partition topic, drained
/// by one sidecar alone and by one with an idle replica beside it.
async fn replica_pair(env: &Env, db: &BenchDb, sheet: &mut Sheet, run: usize) -> Result<()> {
    let mut sides = [false, true];
    if run.is_multiple_of(2) {
        sides.reverse();
    }
    for with_idle in sides {
        eprintln!(
            "[pair {run}] 1-partition topic, {} (load {})",
            if with_idle {
                "a busy sidecar and an idle replica"
            } else {
                "a busy sidecar alone"
            },
            loadavg_line()
        );
        let l = load1();
        let (buffers, secs) = replica_run(env, db, with_idle).await?;
        eprintln!("[pair {run}]   {buffers} database buffers in {secs:.1} s");
        let (name, span) = if with_idle {
            (REPLICA_WITH, REPLICA_SPAN_WITH)
        } else {
            (REPLICA_ALONE, REPLICA_SPAN)
        };
        sheet.add(name, Unit::Count, buffers as f64, l);
        sheet.add(span, Unit::Secs, secs, l);
    }
    Ok(())
}

/// Times a sidecar's rebalance callback took partitions (an empty share
/// counts: the callback runs).
async fn assigns(sidecar: &Sidecar) -> Result<f64> {
    Ok(sidecar
        .metrics()
        .await?
        .iter()
        .filter(|(k, _)| {
            k.starts_with("outbox_consumer_rebalances_total{") && k.contains("kind=\"assign\"")
        })
        .map(|(_, v)| v)
        .sum())
}

/// Waits until `ready()` holds, polling; fails after 60 s saying `what`.
async fn until<F, Fut>(what: &str, mut ready: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready().await? {
        if Instant::now() > deadline {
            bail!("{what}: not within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// One run of phase 3: the database buffers from before the first sidecar
/// starts until every connection to the database is gone, and the seconds
/// in between.
async fn replica_run(env: &Env, db: &BenchDb, with_idle: bool) -> Result<(i64, f64)> {
    let n = env.opts.events;
    let store = open_store(&db.url, TABLE, 2).await?;
    let base = max_id(&store).await?;
    echo::set_enabled(&store, false).await?;
    insert_rows(&store, n, 0).await?;
    let rows = load_rows(&store, base, n).await?;
    store.connection().clone().close().await.ok();
    let broker = Broker::with_partitions("outbox.public.outbox_events", 1)?;
    let receiver = &env.receivers.created;
    let answered_before = receiver.state.answered();

    wait_no_backends(&env.admin, &db.name).await?;
    let b0 = db_buffers(&env.admin, &db.name).await?;
    let t0 = Instant::now();
    // On an error a sidecar is killed when dropped; the database goes.
    let start = || Sidecar::start(env, &db.url, &broker, true, receiver, REFRESH_1S);
    let mut busy = start()?;
    busy.wait_ready().await?;
    let first = &busy;
    until(
        "the first sidecar takes the partition",
        move || async move { Ok(assigns(first).await? >= 1.0) },
    )
    .await?;
    let idle = if with_idle {
        let mut second = start()?;
        second.wait_ready().await?;
        Some(second)
    } else {
        None
    };
    if let Some(second) = &idle {
        // Under the eager protocol the first gives its partition up and
        // takes it (or nothing) again; the second takes its share.
        let first = &busy;
        until("the group settles with two members", move || async move {
            Ok(assigns(first).await? >= 2.0 && assigns(second).await? >= 1.0)
        })
        .await?;
    }
    tokio::task::block_in_place(|| publish_rows(&rows, TABLE, &broker))?;
    until("every event answered", move || async move {
        Ok(receiver.state.answered() - answered_before >= n as u64)
    })
    .await?;
    // The status writes follow the answers: done when no job holds a slot
    // in either sidecar.
    let (first, second) = (&busy, idle.as_ref());
    until("every status written", move || async move {
        let mut in_flight = 0.0;
        for s in std::iter::once(first).chain(second) {
            in_flight += s
                .metrics()
                .await?
                .get("outbox_inflight_events")
                .copied()
                .unwrap_or(f64::NAN);
        }
        Ok(in_flight == 0.0)
    })
    .await?;
    if let Some(second) = idle {
        second.stop().await?;
    }
    busy.stop().await?;
    wait_no_backends(&env.admin, &db.name).await?;
    let b1 = db_buffers(&env.admin, &db.name).await?;
    let secs = t0.elapsed().as_secs_f64();

    let store = open_store(&db.url, TABLE, 2).await?;
    let (sent, failed) = progress(&store, base).await?;
    echo::set_enabled(&store, true).await?;
    store.connection().clone().close().await.ok();
    if sent as usize != n {
        bail!("{sent} of {n} rows sent ({failed} failed)");
    }
    Ok((b1 - b0, secs))
}

/// The history scenario's table and goal lines.
#[allow(clippy::too_many_arguments)]
fn report(
    o: &Options,
    sheet: &Sheet,
    runs_done: [usize; 3],
    seed_s: f64,
    size_before: &str,
    size_after: &str,
    rows_after: i64,
) -> String {
    let rows = thousands(o.history_rows as f64);
    let mut out = format!(
        "history bench: S1 ({} events, echoes, 201 + JSON receiver) on an empty table and on \
         {rows} sent rows (seeded in one statement in {seed_s:.0} s: {size_before} with its \
         indexes; {} rows, {size_after} at the end: each run adds its events); pairs: {} S1, \
         {} idle, {} replica; idle: metrics.refresh_interval 1s, {:.0} s window after {:.0} s; \
         replicas: a 1-partition topic, refresh 1 s, no echoes\n\n",
        thousands(o.events as f64),
        thousands(rows_after as f64),
        runs_done[0],
        runs_done[1],
        runs_done[2],
        o.idle_seconds,
        IDLE_SETTLE.as_secs_f64(),
    );
    out.push_str(&table(sheet));
    out.push('\n');
    out.push_str(&format!(
        "Goals: the median of the pairs and their spread; PASS when every pair meets the goal, \
         MISS when none does, UNSURE when the spread crosses it or fewer than {MIN_PAIRS} pairs \
         were run.\n"
    ));
    let (empty, full) = (s1_label(None), s1_label(Some(o.history_rows)));
    let pair = |what: &str, f: fn(f64, f64) -> f64| {
        per_run(
            sheet,
            &[&format!("{full}: {what}"), &format!("{empty}: {what}")],
            |v| f(v[0], v[1]),
        )
    };
    let m = |name: &str| sheet.median(name);
    let rate = "events/s end to end";
    let cpu = "CPU s / 1,000 events (sidecar process)";
    let how = if o.side_by_side {
        "side by side"
    } else {
        "back to back"
    };
    let lines = [
        goal_line(
            &format!("the console overview's database reads with {rows} sent rows < 100 ms"),
            &sheet.values(&overview_label(o.history_rows)),
            Bound::Below(100.0),
            Shown::Unit(1, " ms"),
            "each sample is one page's reads; the pairs are the samples",
        ),
        goal_line(
            &format!("S1 events/s on {rows} sent rows ≥ 0.9 × on an empty table ({how})"),
            &pair(rate, |a, b| a / b),
            Bound::AtLeast(0.9),
            Shown::Times(2),
            &format!(
                "{} vs {} (medians)",
                show(m(&format!("{full}: {rate}")), Unit::Rate),
                show(m(&format!("{empty}: {rate}")), Unit::Rate)
            ),
        ),
        goal_line(
            &format!(
                "S1 sidecar CPU / event on {rows} sent rows ≤ 1.1 × on an empty table ({how})"
            ),
            &pair(cpu, |a, b| a / b),
            Bound::AtMost(1.1),
            Shown::Times(2),
            &format!(
                "{:.1} µs vs {:.1} µs (medians)",
                m(&format!("{full}: {cpu}")) * 1_000.0,
                m(&format!("{empty}: {cpu}")) * 1_000.0
            ),
        ),
        goal_line(
            &format!(
                "an idle sidecar (refresh 1 s) touches < {} database buffers / s with {rows} \
                 sent rows",
                thousands(IDLE_BUFFERS_PER_S)
            ),
            &sheet.values(&idle_label(Some(o.history_rows), IDLE_BUFFERS)),
            Bound::Below(IDLE_BUFFERS_PER_S),
            Shown::Unit(0, "/s"),
            "",
        ),
        goal_line(
            &format!(
                "an idle sidecar's database buffers / s with {rows} sent rows ≤ 2 × on an \
                 empty table (side by side)"
            ),
            &per_run(
                sheet,
                &[
                    &idle_label(Some(o.history_rows), IDLE_BUFFERS),
                    &idle_label(None, IDLE_BUFFERS),
                ],
                |v| idle_ratio(v[0], v[1]),
            ),
            Bound::AtMost(2.0),
            Shown::Times(2),
            &format!(
                "{:.0} vs {:.0} /s (medians)",
                m(&idle_label(Some(o.history_rows), IDLE_BUFFERS)),
                m(&idle_label(None, IDLE_BUFFERS))
            ),
        ),
        goal_line(
            "one idle replica next to a busy one adds < 5% of the busy one's database buffers \
             (the run with it over the run without, back to back, − 1)",
            &per_run(sheet, &[REPLICA_WITH, REPLICA_ALONE], |v| {
                (v[0] / v[1] - 1.0) * 100.0
            }),
            Bound::Below(5.0),
            Shown::Unit(1, " %"),
            &format!(
                "{} vs {} buffers (medians)",
                thousands(m(REPLICA_WITH)),
                thousands(m(REPLICA_ALONE))
            ),
        ),
    ];
    for l in lines {
        out.push_str(&l);
        out.push('\n');
    }
    if o.quick {
        out.push_str("(quick run: small counts; not the reference figures)\n");
    }
    out
}

/// History over empty; an idle sidecar that touches nothing on either is
/// as cheap on both.
fn idle_ratio(history: f64, empty: f64) -> f64 {
    if history == 0.0 && empty == 0.0 {
        1.0
    } else {
        history / empty
    }
}
