//! The command line.

use super::*;

#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) events: usize,
    pub(crate) runs: usize,
    pub(crate) max_in_flight: usize,
    pub(crate) naive_events: usize,
    pub(crate) limit_events: usize,
    pub(crate) paced_seconds: f64,
    pub(crate) pg_url: String,
    pub(crate) quick: bool,
    /// Only scenario 1 (no limits, so no ratios): to compare changes.
    pub(crate) backlog_only: bool,
    /// With `--backlog-only`: S1 with the attempt log off.
    pub(crate) no_attempt_log: bool,
    /// `--trace-pair`: S1 and S1 with a traceparent column read and sent
    /// (no exporter), paired; the goal: within 5 %.
    pub(crate) trace_pair: bool,
    /// `--ordering-pair`: S1 and S1 with `[ordering]` over
    /// [`crate::kafka::AGGREGATES`] aggregates, in turn (issue #32), then
    /// S1 with every event in one aggregate (at most
    /// [`crate::HOT_EVENTS`] events, back to back; its ratio to S1 is
    /// printed, with no goal).
    pub(crate) ordering_pair: bool,
    /// With a pair: its sides drain at the same time, each on its own
    /// database and topic (`side`), rates over the window all ran. The
    /// default for the trace pair and the history scenario's S1 pairs
    /// (`--back-to-back` runs them one after the other); the ordering
    /// pair runs back to back unless `--side-by-side` is given (see
    /// `side` for why).
    pub(crate) side_by_side: bool,
    /// Extra librdkafka properties for every consumer (the sidecar's too).
    pub(crate) kafka_properties: Vec<(String, String)>,
    /// Publish the sidecar's status writes back onto the topic (default).
    pub(crate) echoes: bool,
    /// The large-payload scenario: this many events of this many bytes.
    pub(crate) large_events: usize,
    pub(crate) large_payload_bytes: usize,
    /// The scale pair (S4, streamed): `events` against this many events;
    /// 0 skips it.
    pub(crate) scale_events: usize,
    /// S4's bound on events published and not yet posted.
    pub(crate) scale_window: usize,
    /// Only the scale pair (no limits, so only its own goal lines).
    pub(crate) scale_only: bool,
    /// Only the memory scenario (`--memory`), with payloads of this many KiB.
    pub(crate) memory: Option<usize>,
    /// `--versus PATH`: S1 beside S1 run by another build of the sidecar
    /// (an earlier commit's), side by side.
    pub(crate) versus: Option<String>,
    /// Only the throttled scenario (`--throttled`): its rate (events/s)
    /// and how long the throttled side runs, in seconds.
    pub(crate) throttled: Option<(u32, f64)>,
    /// Only the replay scenario (`--replay`): its seeded sent rows, the
    /// live events' rate and the replay's (events/s).
    pub(crate) replay: Option<(usize, u32, u32)>,
    /// Only the history scenario (`--scenario history`).
    pub(crate) history: bool,
    /// The history scenario's table holds this many sent rows.
    pub(crate) history_rows: usize,
    /// The history scenario's idle window, in seconds.
    pub(crate) idle_seconds: f64,
}

pub(crate) const USAGE: &str = "usage: cargo bench -p outbox-sidecar --bench pipeline -- \
[--events N] [--runs R] [--quick] [--backlog-only] [--max-in-flight M] [--naive-events N] \
[--limit-events N] [--paced-seconds S] [--no-attempt-log] [--pg-url URL] [--kafka-property KEY=VALUE]... \
[--no-echoes] [--trace-pair] [--ordering-pair] [--versus PATH] [--side-by-side | --back-to-back] [--large-events N] [--large-payload-bytes B] \
[--scale-events N] [--scale-window W] [--scale-only] \
| --scenario history [--events N] [--runs R] [--history-rows N] [--idle-seconds S] [--back-to-back] \
| --memory [--events N] [--payload-kib K] \
| --throttled [--events N] [--rate R] [--throttled-seconds S] [--max-in-flight M] \
| --replay [--replay-rows N] [--live-rate R] [--replay-rate R] [--paced-seconds S] [--runs R]
(without --bench, as `cargo test --bench pipeline` runs it: the verdict rule's checks)";

impl Options {
    pub(crate) fn parse() -> Result<Options> {
        let mut events: Option<usize> = None;
        let mut runs: Option<usize> = None;
        let mut max_in_flight: Option<usize> = None;
        let mut memory = false;
        let mut throttled = false;
        let mut replay = false;
        let mut replay_rows: Option<usize> = None;
        let mut live_rate: u32 = 100;
        let mut replay_rate: u32 = 100;
        let mut versus: Option<String> = None;
        let mut rate: u32 = 10;
        let mut throttled_seconds: f64 = 120.0;
        let mut payload_kib = 200;
        let mut naive_events: Option<usize> = None;
        let mut limit_events: Option<usize> = None;
        let mut paced_seconds: Option<f64> = None;
        let mut pg_url = std::env::var("BENCH_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
        let mut quick = false;
        let mut backlog_only = false;
        let mut no_attempt_log = false;
        let mut trace_pair = false;
        let mut ordering_pair = false;
        let mut side_by_side: Option<bool> = None;
        let mut echoes = true;
        let mut large_events: Option<usize> = None;
        let mut large_payload_bytes = 50 * 1024;
        let mut scale_events: Option<usize> = None;
        let mut scale_window = 20_000;
        let mut scale_only = false;
        let mut history = false;
        let mut history_rows: Option<usize> = None;
        let mut idle_seconds: f64 = 10.0;
        let mut kafka_properties = vec![(
            "fetch.wait.max.ms".to_owned(),
            DEFAULT_FETCH_WAIT_MS.to_owned(),
        )];
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next()
                    .ok_or_else(|| anyhow!("{name} needs a value\n{USAGE}"))
            };
            match arg.as_str() {
                // cargo bench passes --bench to every harness = false target.
                "--bench" => {}
                "--quick" => quick = true,
                "--backlog-only" => backlog_only = true,
                "--no-attempt-log" => no_attempt_log = true,
                "--trace-pair" => trace_pair = true,
                "--ordering-pair" => ordering_pair = true,
                "--side-by-side" => side_by_side = Some(true),
                "--back-to-back" => side_by_side = Some(false),
                "--memory" => memory = true,
                "--throttled" => throttled = true,
                "--versus" => versus = Some(value("--versus")?),
                "--rate" => rate = value("--rate")?.parse()?,
                "--throttled-seconds" => {
                    throttled_seconds = value("--throttled-seconds")?.parse()?
                }
                "--payload-kib" => payload_kib = value("--payload-kib")?.parse()?,
                "--no-echoes" => echoes = false,
                "--large-events" => large_events = Some(value("--large-events")?.parse()?),
                "--large-payload-bytes" => {
                    large_payload_bytes = value("--large-payload-bytes")?.parse()?
                }
                "--scale-events" => scale_events = Some(value("--scale-events")?.parse()?),
                "--scale-window" => scale_window = value("--scale-window")?.parse()?,
                "--scale-only" => scale_only = true,
                "--scenario" => match value("--scenario")?.as_str() {
                    "default" => history = false,
                    "history" => history = true,
                    other => bail!("--scenario wants default or history, got {other:?}\n{USAGE}"),
                },
                "--history-rows" => history_rows = Some(value("--history-rows")?.parse()?),
                "--idle-seconds" => idle_seconds = value("--idle-seconds")?.parse()?,
                "--events" => events = Some(value("--events")?.parse()?),
                "--runs" => runs = Some(value("--runs")?.parse()?),
                "--max-in-flight" => max_in_flight = Some(value("--max-in-flight")?.parse()?),
                "--naive-events" => naive_events = Some(value("--naive-events")?.parse()?),
                "--limit-events" => limit_events = Some(value("--limit-events")?.parse()?),
                "--paced-seconds" => paced_seconds = Some(value("--paced-seconds")?.parse()?),
                "--replay" => replay = true,
                "--replay-rows" => replay_rows = Some(value("--replay-rows")?.parse()?),
                "--live-rate" => live_rate = value("--live-rate")?.parse()?,
                "--replay-rate" => replay_rate = value("--replay-rate")?.parse()?,
                "--pg-url" => pg_url = value("--pg-url")?,
                "--kafka-property" => {
                    let kv = value("--kafka-property")?;
                    let (k, v) = kv
                        .split_once('=')
                        .ok_or_else(|| anyhow!("--kafka-property wants KEY=VALUE, got {kv:?}"))?;
                    kafka_properties.retain(|(key, _)| key != k);
                    kafka_properties.push((k.to_owned(), v.to_owned()));
                }
                "-h" | "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                other => bail!("unknown argument {other:?}\n{USAGE}"),
            }
        }
        let events: usize = events.unwrap_or(if throttled {
            200_000
        } else if quick || memory {
            5_000
        } else {
            50_000
        });
        // The memory and throttled scenarios run with the shipped
        // configmap's value.
        let max_in_flight = max_in_flight.unwrap_or(if memory || throttled { 64 } else { 256 });
        if replay && (live_rate == 0 || replay_rate == 0) {
            bail!("--live-rate and --replay-rate must be above 0");
        }
        // The replay's sides are 20 s of live traffic; S3's 10 s.
        let paced_seconds = paced_seconds.unwrap_or(if replay { 20.0 } else { 10.0 });
        if throttled && (rate == 0 || throttled_seconds <= 0.0) {
            bail!("--rate and --throttled-seconds must be above 0");
        }
        // Each run is one pair of every goal's figures: five give a verdict.
        let runs: usize = runs.unwrap_or(if quick { 1 } else { MIN_PAIRS });
        if events == 0 || runs == 0 || max_in_flight == 0 {
            bail!("--events, --runs and --max-in-flight must be at least 1");
        }
        Ok(Options {
            events,
            runs,
            max_in_flight,
            naive_events: naive_events.unwrap_or(2_000).clamp(1, events),
            limit_events: limit_events.unwrap_or(10_000).clamp(1, events),
            paced_seconds,
            pg_url,
            quick,
            backlog_only,
            no_attempt_log,
            trace_pair,
            ordering_pair,
            side_by_side: side_by_side.unwrap_or(trace_pair || history || versus.is_some()),
            kafka_properties,
            echoes,
            // The mock broker keeps 5 MiB per partition: 600 events of
            // 50 KiB (about half that once lz4 has the md5 padding) fit in
            // 6 partitions with room for their echoes.
            large_events: large_events.unwrap_or(if quick { 300 } else { 600 }).max(1),
            large_payload_bytes,
            memory: memory.then_some(payload_kib.max(1)),
            throttled: throttled.then_some((rate, throttled_seconds)),
            replay: replay.then_some((
                replay_rows.unwrap_or(if quick { 100_000 } else { 1_000_000 }),
                live_rate,
                replay_rate,
            )),
            versus,
            // Ten times the backlog; a quick run skips it unless asked.
            scale_events: scale_events.unwrap_or(if quick { 0 } else { events * 10 }),
            scale_window: scale_window.max(1),
            scale_only,
            history,
            history_rows: history_rows.unwrap_or(if quick { 500_000 } else { 5_000_000 }),
            idle_seconds: idle_seconds.max(1.0),
        })
    }
}
