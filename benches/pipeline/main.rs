//! The whole-pipeline benchmark (issue #8): the real pipeline, end to end,
//! against the limits of its parts measured in the same process run.
//!
//! ```text
//! make bench-pipeline BENCH_ARGS="--quick"
//! cargo bench -p outbox-sidecar --bench pipeline -- [--events N] [--runs R] [--quick]
//!       [--backlog-only] [--max-in-flight M] [--naive-events N] [--limit-events N] [--paced-seconds S]
//!       [--pg-url postgres://postgres@127.0.0.1:5432/postgres]
//! ```
//!
//! Each run (default 3; every printed figure is the median over the runs,
//! with the 1-minute load average of /proc/loadavg at the start of each
//! measurement printed beside it) does, each part on a fresh PostgreSQL
//! database `bench_<pid>_<n>` and a fresh librdkafka mock cluster:
//!
//! 1. The limits, with the pipeline's pool size (16) and in-flight limit:
//!    - raw consume: a plain `StreamConsumer` (the sidecar's librdkafka
//!      configuration, `consumer::client_config`) counting N messages of a
//!      6-partition topic, no processing; timed from the first message;
//!    - raw HTTP: the in-process receiver (axum, answers 204) driven by a
//!      reqwest client built like the dispatcher's, 64 and M in flight;
//!    - single-row UPDATE: `Store::mark_sent` on `--limit-events` rows
//!      (default min(N, 10,000)), M concurrent callers on a 16-connection pool;
//!    - batched UPDATE: `UPDATE … SET status='sent' … WHERE id = ANY($1) AND
//!      status='pending'`, 100 ids per statement, 16 concurrent statements;
//!    - the naive loop (`--naive-events`, default 2,000): one event at a
//!      time — decode, read the row, POST, UPDATE, synchronous offset commit.
//! 2. Scenario 1, backlog: N pending rows are inserted and their Debezium
//!    insert events published (key `{"id": N}`, envelope with the row as
//!    Debezium's PostgreSQL connector writes it); then `outbox-sidecar run`
//!    (the binary, in its own process, built by cargo with this bench's
//!    release profile; configuration in a temporary file) drains them. Events/s = N / (last `sent_at` −
//!    the moment /readyz first answered 200).
//! 3. Scenario 2: the same with the receiver answering 500 to the first
//!    attempt of every id divisible by 10 (retry_delay 200ms, they succeed on
//!    the second attempt).
//! 4. Scenario 3, paced: the sidecar running, events published at half the
//!    rate scenario 1 measured in this run, for `--paced-seconds` (10 s).
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
//! compresses (lz4) to keep a 50,000-event backlog whole; and it answers an
//! empty fetch only after the full `fetch.wait.max.ms`, so every consumer
//! gets `fetch.wait.max.ms=10` (see [`DEFAULT_FETCH_WAIT_MS`]).
//!
//! Goals are reported, never asserted: PASS/MISS lines at the end.

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

mod db;
mod kafka;
mod limits;
mod options;
mod receiver;
mod report;
mod scenarios;
mod sidecar;
mod sys;

use db::*;
use kafka::*;
use limits::*;
use options::*;
use receiver::*;
use report::*;
use scenarios::*;
use sidecar::*;
use sys::*;

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

pub(crate) const S1: &str = "S1 backlog";
pub(crate) const S2: &str = "S2 10% fail once";
/// S1 with the attempt log off (history.enabled = false): its cost.
pub(crate) const S1_NO_LOG: &str = "S1 backlog, attempt log off";

/// One backlog scenario: run, print, add to the sheet.
async fn backlog(
    env: &Env,
    sheet: &mut Sheet,
    run: usize,
    label: &str,
    fail_tenth: bool,
    history: bool,
) -> Result<ScenarioResult> {
    eprintln!(
        "[run {run}] {label}: backlog of {} (load {})",
        env.opts.events,
        loadavg_line()
    );
    let l = load1();
    let s = scenario(
        env,
        Scenario::Backlog {
            fail_tenth,
            history,
        },
        env.opts.events,
    )
    .await?;
    eprintln!(
        "[run {run}]   {:.0} events/s, p50 {:.0} ms",
        s.rate, s.p50_ms
    );
    add_scenario(sheet, label, &s, l, true);
    Ok(s)
}

async fn one_run(env: &Env, sheet: &mut Sheet, run: usize) -> Result<()> {
    let o = &env.opts;
    if o.backlog_only {
        // For comparing changes: scenario 1 alone, no limits, no ratios.
        backlog(env, sheet, run, S1, false, true).await?;
        return Ok(());
    }
    limits(env, sheet, run).await?;
    let s1 = backlog(env, sheet, run, S1, false, true).await?;
    backlog(env, sheet, run, S1_NO_LOG, false, false).await?;
    backlog(env, sheet, run, S2, true, true).await?;

    let rate = s1.rate / 2.0;
    let n3 = ((rate * o.paced_seconds).round() as usize).max(1);
    eprintln!(
        "[run {run}] scenario 3: {n3} events at {rate:.0}/s (load {})",
        loadavg_line()
    );
    let l = load1();
    let s3 = scenario(env, Scenario::Paced { rate }, n3).await?;
    eprintln!("[run {run}]   p99 {:.1} ms", s3.p99_ms);
    sheet.add("S3 paced: publish rate (half of S1)", Unit::Rate, rate, l);
    add_scenario(sheet, "S3 paced", &s3, l, false);
    Ok(())
}

// ---------------------------------------------------------------- main

fn main() {
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
    let receiver = Arc::new(ReceiverState::default());
    let addr = start_receiver(receiver.clone()).await?;
    let env = Env {
        receiver_url: format!("http://{addr}/api/v1/events"),
        receiver,
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
