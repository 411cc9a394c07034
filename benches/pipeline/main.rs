//! The whole-pipeline benchmark (issues #8 and #20): the real pipeline, end
//! to end, as users run it (the sidecar's own status writes echoed back
//! onto the topic, a receiver that answers with a body), against the limits
//! of its parts measured in the same run.
//!
//! ```text
//! make bench-pipeline BENCH_ARGS="--quick"
//! cargo bench -p outbox-sidecar --bench pipeline -- [--events N] [--runs R] [--quick]
//!       [--backlog-only [--no-attempt-log]] [--max-in-flight M] [--naive-events N] [--limit-events N] [--paced-seconds S]
//!       [--pg-url postgres://postgres@127.0.0.1:5432/postgres] [--kafka-property KEY=VALUE]...
//!       [--no-echoes] [--large-events N] [--large-payload-bytes B]
//!       [--scale-events N] [--scale-window W] [--scale-only]
//! make bench-pipeline BENCH_ARGS="--scenario history"   # see `history`
//! make bench-pipeline BENCH_ARGS="--trace-pair"          # S1, the column, tracing: side by side
//! make bench-pipeline BENCH_ARGS="--ordering-pair"       # S1 and S1 ordered, back to back
//!       [--side-by-side | --back-to-back]                # see `side`
//! make bench-memory                                      # see `memory`
//! make bench-throttled                                   # see `throttled`
//!       [--events N] [--rate R] [--throttled-seconds S]
//! make bench-replay                                      # see `replay`
//!       [--replay-rows N] [--live-rate R] [--replay-rate R] [--paced-seconds S]
//! cargo test --bench pipeline                            # the verdict rule's checks
//! BENCH_SIDECAR_BIN=path/to/outbox-sidecar make …         # another build of the sidecar
//! make bench-pipeline BENCH_ARGS="--versus path/to/outbox-sidecar"  # S1 beside another build, side by side
//! ```
//!
//! The modules: `options` (the command line), `sys` (/proc), `sidecar` (the
//! child process), `receiver` (the three receivers), `db` (databases, rows,
//! the sidecar's configuration), `kafka` (mock cluster, producer, insert
//! events), `echo` (the update events of the sidecar's own writes),
//! `limits` and `client` (the parts' limits; three of them in a child
//! process), `scenarios`, `report` (the table and the goal lines),
//! `verdict` (how a goal is judged from pairs), `side` (a pair's sides
//! at once, each on its own database and topic), `history` (`--scenario
//! history`: a table of 5,000,000 sent rows, an idle sidecar, an idle
//! replica), `memory` (`--memory`), `throttled` (`--throttled`), `replay`
//! (`--replay`).
//!
//! Each run (default 5; every printed figure is the median over the runs,
//! with the 1-minute load average of /proc/loadavg at the start of each
//! measurement printed beside it) does, each part on a fresh PostgreSQL
//! database `bench_<pid>_<n>` and a fresh librdkafka mock cluster, the
//! items below. A run is one pair of every goal's figures: the runs a goal
//! compares come one after the other, the parts (1), the naive loop, S1,
//! S1 without the attempt log and S2 in that order in odd runs and backwards
//! in even ones, the two sizes of S4 likewise; each goal line gives the
//! median of the per-run ratios, their spread, and PASS, MISS or UNSURE
//! from the spread (see `verdict`).
//!
//! 1. The limits, with the pipeline's pool size (16) and in-flight limit:
//!    - raw consume: a plain `StreamConsumer` (the sidecar's librdkafka
//!      configuration, `consumer::client_config`) counting N messages of a
//!      6-partition topic, no processing; timed from the first message;
//!    - raw HTTP: the 201 + JSON receiver driven by a reqwest client built
//!      like the dispatcher's (the body read to its end), 64 and M in flight;
//!    - single-row UPDATE: `Store::mark_sent` on `--limit-events` rows
//!      (default min(N, 10,000)), M concurrent callers on a 16-connection pool;
//!    - batched UPDATE: `UPDATE … SET status='sent' … WHERE id = ANY($1) AND
//!      status='pending'`, 100 ids per statement, 16 concurrent statements;
//!    - the naive loop (`--naive-events`, default 2,000): one event at a
//!      time — decode, read the row, POST, UPDATE, synchronous offset commit.
//!
//!    Raw consume, raw HTTP and the batched UPDATE run in a child process
//!    of their own (see `client`), which also reports its CPU per message,
//!    request and row: the client side alone, for the cost-per-event goal.
//!    The single-row UPDATE, which no goal compares with, runs after S2.
//! 2. Scenario 1, backlog: N pending rows are inserted and their Debezium
//!    insert events published (key `{"id": N}`, envelope with the row as
//!    Debezium's PostgreSQL connector writes it); then `outbox-sidecar run`
//!    (the binary, in its own process, built by cargo with this bench's
//!    release profile; configuration in a temporary file) drains them
//!    against the 201 + JSON receiver, while every status write it makes is
//!    published back onto the topic as Debezium would (see `echo`; off with
//!    `--no-echoes`). Events/s = N / (last `sent_at` − the moment /readyz
//!    first answered 200). Variants: the attempt log off; no echoes; the
//!    204 receiver; the HTTPS receiver (rustls, a CA made by the bench,
//!    trusted through the dispatcher's `ca_file`); `--large-events` (600)
//!    events with payloads padded to `--large-payload-bytes` (50 KiB).
//! 3. Scenario 2: S1 with the receiver answering 500 to the first attempt
//!    of every id divisible by 10 (retry_delay 200ms, they succeed on the
//!    second attempt).
//! 4. Scenario 3, paced: the sidecar running, events published at half the
//!    rate scenario 1 measured in this run, for `--paced-seconds` (10 s),
//!    echoes included.
//! 5. Scenario 4, streamed (the scale goal): the sidecar running, every
//!    row published as fast as it consumes but never more than
//!    `--scale-window` (20,000) events ahead of the receiver, so a backlog
//!    of any size fits the mock broker's 5 MiB per partition; run with
//!    `--events` and with `--scale-events` (10 × that), echoes on. Peak RSS
//!    and CPU per event of the two are compared. `--scale-only` runs just
//!    this pair.
//!
//! Every scenario reports the messages the sidecar consumed per event
//! (`outbox_cdc_messages_total` once it has consumed every insert and
//! echo, or after 10 s) and the connections its receiver accepted per
//! 1,000 events, and how many of them ended while the sidecar ran: with
//! keep-alive holding, none.
//!
//! Latency is `sent_at` (written by the sidecar from `chrono::Utc::now()`)
//! minus the publish time the bench recorded with `chrono::Utc::now()` when
//! it handed the record to the producer: the same UTC wall clock of the same
//! process, at microsecond precision. In the backlog scenarios every event
//! is published before the sidecar starts, so that latency includes the
//! start-up and the queueing of the whole backlog; the S1/S2 comparison of
//! never-failing events therefore uses `sent_at` − ready.
//!
//! Memory: peak RSS is `VmHWM` of /proc/<sidecar pid>/status, read just
//! before the sidecar is stopped: the peak of the sidecar process over its
//! whole life. The bench's own process (mock broker with the backlog in it,
//! receiver) is not counted.
//! CPU is utime+stime of /proc/<pid>/stat (ticks of `getconf CLK_TCK`) of
//! the sidecar process from its start until the last row is `sent` (paced:
//! from the first publish); the bench process (mock broker, receiver) and
//! PostgreSQL are shown on their own lines (PostgreSQL is the sum over the
//! `postgres` processes, approximate: other users of the server count too).
//!
//! Two artefacts of librdkafka's mock broker are worked around, both on
//! the bench's side: it keeps only 5 MiB per partition, so the producer
//! compresses (lz4) to keep a 50,000-event backlog whole (the echoes of a
//! 1 KiB event are about the same size as its insert, and are appended
//! only as the sidecar moves on; the large-payload scenario is sized to
//! fit); and it answers an
//! empty fetch only after the full `fetch.wait.max.ms`, so every consumer
//! gets `fetch.wait.max.ms=10` (see [`DEFAULT_FETCH_WAIT_MS`]).
//!
//! The bench learns that a scenario is done from its receiver's count of
//! 2xx answers (a row is `sent` only after one), and counts the table only
//! once that count reaches N or stops moving: until 2026-12-01 it counted
//! the table every 50 ms, a full scan of 50,000 rows and their dead
//! versions that took ~10% of the machine's CPU during every scenario,
//! was charged to PostgreSQL, and slowed the sidecar it shared the cores
//! with (S1 5,662 → 7,117 events/s, medians of 3, with the same binary:
//! `benches/RESULTS.md`).
//!
//! Goals are reported, never asserted: PASS/MISS/UNSURE lines at the end.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::NaiveDateTime;
use entity::{OutboxEventRow, Status};
use outbox_sidecar::cdc::{Decision, Decoder, Record};
use outbox_sidecar::config::{KafkaSettings, LogFormat, LogSettings, Settings};
use outbox_sidecar::store::{Outcome, Store};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Message};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement};
use serde_json::json;

mod client;
mod db;
mod echo;
mod history;
mod kafka;
mod limits;
mod memory;
mod options;
mod receiver;
mod replay;
mod report;
mod scenarios;
mod side;
mod sidecar;
mod sys;
mod throttled;
mod verdict;

use client::{run_part, Part};
use db::*;
use echo::Echoes;
use kafka::*;
use limits::*;
use options::*;
use receiver::*;
use report::*;
use scenarios::*;
use sidecar::*;
use sys::*;
use verdict::*;

pub(crate) const TABLE: &str = "outbox_events";
pub(crate) const PARTITIONS: i32 = 6;
pub(crate) const POOL: u32 = 16;
pub(crate) const BATCH_IDS: usize = 100;
pub(crate) const RETRY_DELAY: &str = "200ms";
pub(crate) const DISPATCH_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const EVENT_NAMES: [&str; 3] = [
    "accounts.purchase_create",
    "accounts.installment_paid",
    "accounts.installment_overdue",
];
/// librdkafka's mock broker answers a fetch that finds no data only after
/// the full `fetch.wait.max.ms` (500 ms by default) and never cuts the wait
/// short when data arrives (rdkafka_mock_handlers.c: "This isn't strictly
/// correct since we should cut the wait short…"), unlike a real broker. The
/// bench sets this on every consumer so that artefact does not pose as the
/// sidecar's latency; `--kafka-property fetch.wait.max.ms=500` restores it.
pub(crate) const DEFAULT_FETCH_WAIT_MS: &str = "10";
/// Give up when no row changes state for this long.
pub(crate) const STALL_LIMIT: Duration = Duration::from_secs(60);

/// The raw HTTP limit, against the receiver S1 posts to.
pub(crate) const RAW_HTTP_64: &str = "raw HTTP (reqwest → axum 201 + JSON), 64 in flight";
pub(crate) const S1: &str = "S1 backlog";
pub(crate) const S2: &str = "S2 10% fail once";
/// S1 with the attempt log off (history.enabled = false): its cost.
pub(crate) const S1_NO_LOG: &str = "S1 backlog, attempt log off";
/// S1 without echoes: what the change feed's echoes cost.
pub(crate) const S1_NO_ECHO: &str = "S1 backlog, no echoes";
/// S1 with a traceparent column the sidecar reads, no exporter.
pub(crate) const S1_TRACED: &str = "S1 backlog, traceparent column";
/// S1 with the traceparent column in the table, `[tracing]` off: the
/// sidecar as it was before trace context, on the application's rows.
pub(crate) const S1_TRACE_COLUMN: &str = "S1 backlog, traceparent column, tracing off";
/// S1 with `[ordering]` over 1,000 aggregates.
pub(crate) const S1_ORDERED: &str = "S1 backlog, ordered by aggregate";
/// S1 ordered, every event in one aggregate (run back to back after the
/// ordering pair, on [`HOT_EVENTS`] events at most: they go one at a time).
pub(crate) const S1_HOT: &str = "S1 backlog, one hot aggregate";
/// The one-hot-aggregate case's backlog, at most.
pub(crate) const HOT_EVENTS: usize = 5_000;
/// S1 run by the build `--versus` names (an earlier commit's binary).
pub(crate) const S1_VERSUS: &str = "S1 backlog, the --versus build";
/// S1 against the 204 receiver.
pub(crate) const S1_204: &str = "S1 backlog, 204 receiver";
/// S1 against the 201 receiver over HTTPS.
pub(crate) const S1_HTTPS: &str = "S1 backlog, HTTPS receiver";
/// S1 with large payloads (`--large-events` of `--large-payload-bytes`).
pub(crate) const S1_LARGE: &str = "S1 backlog, large payloads";
pub(crate) const S3: &str = "S3 paced";
/// S4, streamed: the label of its run of `n` events.
pub(crate) fn s4(n: usize) -> String {
    format!("S4 streamed, {} events", report::thousands(n as f64))
}

/// The setup of S1, S2 and S3: the 201 + JSON receiver, with echoes.
pub(crate) fn base_setup(opts: &Options) -> Setup {
    Setup {
        target: Target::Created,
        echoes: opts.echoes,
        payload_bytes: 0,
        traced: false,
        trace_column: false,
        ordered: false,
        hot: false,
        versus: false,
    }
}

/// One backlog scenario of `n` events: run, print, add to the sheet.
/// The ordering pair's one-hot-aggregate case: S1 ordered with every
/// event in one aggregate, back to back after the pair.
async fn hot_aggregate(
    env: &Env,
    sheet: &mut Sheet,
    run: usize,
    base: Setup,
    n: usize,
) -> Result<()> {
    let hot = Setup {
        ordered: true,
        hot: true,
        ..base
    };
    backlog(env, sheet, run, S1_HOT, false, true, hot, n.min(HOT_EVENTS)).await?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn backlog(
    env: &Env,
    sheet: &mut Sheet,
    run: usize,
    label: &str,
    fail_tenth: bool,
    history: bool,
    setup: Setup,
    n: usize,
) -> Result<ScenarioResult> {
    eprintln!(
        "[run {run}] {label}: backlog of {n}, {} receiver, echoes {}, payload {} (load {})",
        setup.target.label(),
        if setup.echoes { "on" } else { "off" },
        if setup.payload_bytes == 0 {
            "~350 B".to_owned()
        } else {
            format!("~{} B", setup.payload_bytes)
        },
        loadavg_line()
    );
    let l = load1();
    let s = scenario(
        env,
        Scenario::Backlog {
            fail_tenth,
            history,
        },
        setup,
        n,
    )
    .await?;
    eprintln!(
        "[run {run}]   {:.0} events/s, p50 {:.0} ms, {:.2} messages/event, {:.2} connections/1,000 events",
        s.rate, s.p50_ms, s.messages_per_event, s.connections_per_1k
    );
    add_scenario(sheet, label, &s, l, true);
    Ok(s)
}

/// The scale pair: S4 with `events` and with `scale_events`, in that
/// order when `forward`.
async fn scale(env: &Env, sheet: &mut Sheet, run: usize, forward: bool) -> Result<()> {
    let o = &env.opts;
    if o.scale_events == 0 {
        return Ok(());
    }
    let mut sizes = [o.events, o.scale_events];
    if !forward {
        sizes.reverse();
    }
    for n in sizes {
        let label = s4(n);
        eprintln!(
            "[run {run}] {label}: published as consumed, window {} (load {})",
            o.scale_window,
            loadavg_line()
        );
        let l = load1();
        let kind = Scenario::Streamed {
            window: o.scale_window,
        };
        let s = scenario(env, kind, base_setup(o), n).await?;
        eprintln!(
            "[run {run}]   {:.0} events/s, peak RSS {:.1} MiB, CPU {:.3} s / 1,000 events",
            s.rate,
            s.peak_rss as f64 / MIB,
            s.cpu_per_1k
        );
        add_scenario(sheet, &label, &s, l, false);
    }
    Ok(())
}

/// The runs that make the goals' pairs, in the order of an odd run; an
/// even run takes them backwards.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Raw consume, raw HTTP and the batched UPDATE (cost per event, and
    /// the raw HTTP limit S1's rate is compared with).
    Parts,
    /// The naive loop (S1 ≥ 12 × it).
    Naive,
    S1,
    /// S1 without the attempt log (its cost).
    S1NoLog,
    /// S2 (refused rows do not slow the rest: S1's p50 beside it).
    S2,
}

async fn one_run(env: &Env, sheet: &mut Sheet, run: usize) -> Result<()> {
    let o = &env.opts;
    let base = base_setup(o);
    let n = o.events;
    let forward = run % 2 == 1;
    if o.scale_only {
        return scale(env, sheet, run, forward).await;
    }
    // A pair: S1 beside a variant of it (ordered per aggregate, or with
    // trace context read and sent, no exporter), in turn forwards and
    // backwards.
    let sides: Option<Vec<(&'static str, Setup)>> = if o.versus.is_some() {
        Some(vec![
            (S1, base),
            (
                S1_VERSUS,
                Setup {
                    versus: true,
                    ..base
                },
            ),
        ])
    } else if o.ordering_pair {
        Some(vec![
            (S1, base),
            (
                S1_ORDERED,
                Setup {
                    ordered: true,
                    ..base
                },
            ),
        ])
    } else if o.trace_pair {
        // Three sides: S1, S1 on rows that carry the column with tracing
        // off (what the sidecar did before trace context, on the
        // application's larger rows), and S1 reading and sending it.
        Some(vec![
            (S1, base),
            (
                S1_TRACE_COLUMN,
                Setup {
                    trace_column: true,
                    ..base
                },
            ),
            (
                S1_TRACED,
                Setup {
                    traced: true,
                    trace_column: true,
                    ..base
                },
            ),
        ])
    } else {
        None
    };
    if let Some(mut sides) = sides {
        if !forward {
            sides.reverse();
        }
        if o.side_by_side {
            side::pair(env, sheet, run, &sides, n).await?;
            if o.ordering_pair {
                hot_aggregate(env, sheet, run, base, n).await?;
            }
            return Ok(());
        }
        for (label, setup) in sides {
            backlog(env, sheet, run, label, false, true, setup, n).await?;
        }
        if o.ordering_pair {
            hot_aggregate(env, sheet, run, base, n).await?;
        }
        return Ok(());
    }
    if o.backlog_only {
        // For comparing changes: scenario 1 alone, no limits, no ratios.
        if o.no_attempt_log {
            backlog(env, sheet, run, S1_NO_LOG, false, false, base, n).await?;
        } else {
            backlog(env, sheet, run, S1, false, true, base, n).await?;
        }
        return Ok(());
    }
    // Each goal compares runs made next to each other, forwards in odd
    // runs and backwards in even ones, so that neither side of a pair
    // always comes first: S1 sits beside its parts and the naive loop on
    // one side and beside S1 without the attempt log and S2 on the other.
    let mut steps = [Step::Parts, Step::Naive, Step::S1, Step::S1NoLog, Step::S2];
    if !forward {
        steps.reverse();
    }
    let mut s1 = None;
    for step in steps {
        match step {
            Step::Parts => parts(env, sheet, run).await?,
            Step::Naive => naive(env, sheet, run).await?,
            Step::S1 => s1 = Some(backlog(env, sheet, run, S1, false, true, base, n).await?),
            Step::S1NoLog => {
                backlog(env, sheet, run, S1_NO_LOG, false, false, base, n).await?;
            }
            Step::S2 => {
                backlog(env, sheet, run, S2, true, true, base, n).await?;
            }
        }
    }
    let s1 = s1.ok_or_else(|| anyhow!("S1 did not run"))?;
    single_row(env, sheet, run).await?;
    if o.echoes {
        let setup = Setup {
            echoes: false,
            ..base
        };
        backlog(env, sheet, run, S1_NO_ECHO, false, true, setup, n).await?;
    }
    let setup = Setup {
        target: Target::NoContent,
        ..base
    };
    backlog(env, sheet, run, S1_204, false, true, setup, n).await?;
    let setup = Setup {
        target: Target::Https,
        ..base
    };
    backlog(env, sheet, run, S1_HTTPS, false, true, setup, n).await?;
    let setup = Setup {
        payload_bytes: o.large_payload_bytes,
        ..base
    };
    backlog(
        env,
        sheet,
        run,
        S1_LARGE,
        false,
        true,
        setup,
        o.large_events,
    )
    .await?;

    let rate = s1.rate / 2.0;
    let n3 = ((rate * o.paced_seconds).round() as usize).max(1);
    eprintln!(
        "[run {run}] scenario 3: {n3} events at {rate:.0}/s (load {})",
        loadavg_line()
    );
    let l = load1();
    let s3 = scenario(env, Scenario::Paced { rate }, base, n3).await?;
    eprintln!("[run {run}]   p99 {:.1} ms", s3.p99_ms);
    sheet.add("S3 paced: publish rate (half of S1)", Unit::Rate, rate, l);
    add_scenario(sheet, S3, &s3, l, false);
    scale(env, sheet, run, forward).await
}

// ---------------------------------------------------------------- main

fn main() {
    // A child running one client part (see `client`) exits in here.
    client::child_main();
    // `cargo bench` passes --bench; `cargo test --bench pipeline` does not,
    // and gets the verdict rule's checks instead of a bench run.
    if !std::env::args().skip(1).any(|a| a == "--bench") {
        std::process::exit(if verdict::run_checks() { 0 } else { 1 });
    }
    let opts = match Options::parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(async move {
        match bench(opts).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e:#}");
                1
            }
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(5));
    std::process::exit(code);
}

async fn bench(opts: Options) -> Result<()> {
    outbox_sidecar::telemetry::init_logging(&LogSettings {
        format: LogFormat::Text,
        level: "error".to_owned(),
    });
    let admin = Database::connect(opts.pg_url.as_str())
        .await
        .with_context(|| format!("connecting to {}", opts.pg_url))?;
    let env = Env {
        receivers: Receivers::start().await?,
        admin,
        ticks_per_s: clock_ticks(),
        next_db: AtomicUsize::new(0),
        opts: opts.clone(),
    };
    eprintln!(
        "pipeline bench: {} events × {} run(s); load {}",
        opts.events,
        opts.runs,
        loadavg_line()
    );
    if let Some(kib) = opts.memory {
        let result = memory::memory(&env, kib).await;
        env.admin.clone().close().await.ok();
        return result;
    }
    if let Some((rate, seconds)) = opts.throttled {
        let result = throttled::throttled(&env, rate, seconds).await;
        env.admin.clone().close().await.ok();
        return result;
    }
    if let Some((rows, live_rate, replay_rate)) = opts.replay {
        let result = replay::replay(&env, rows, live_rate, replay_rate).await;
        env.admin.clone().close().await.ok();
        return result;
    }
    if opts.history {
        let result = history::history(&env).await;
        env.admin.clone().close().await.ok();
        return result;
    }
    let mut sheet = Sheet::default();
    let mut runs_done = 0;
    let mut result = Ok(());
    for run in 1..=opts.runs {
        if let Err(e) = one_run(&env, &mut sheet, run).await {
            result = Err(e.context(format!("run {run}")));
            break;
        }
        runs_done += 1;
    }
    env.admin.clone().close().await.ok();
    if runs_done > 0 {
        println!("{}", report(&opts, &sheet, runs_done));
    }
    result
}
