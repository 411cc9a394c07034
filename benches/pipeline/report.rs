//! The figures of every run, their medians and the goal lines.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Unit {
    Rate,
    Ms,
    MiB,
    Secs,
    Count,
    /// A plain number with two decimals.
    Ratio,
    /// Microseconds (CPU per unit).
    Micros,
}

pub(crate) struct Figure {
    pub(crate) name: String,
    pub(crate) unit: Unit,
    pub(crate) values: Vec<f64>,
    pub(crate) loads: Vec<f64>,
}

/// Every figure of every run, in the order first seen.
#[derive(Default)]
pub(crate) struct Sheet {
    pub(crate) figures: Vec<Figure>,
}

impl Sheet {
    pub(crate) fn add(&mut self, name: &str, unit: Unit, value: f64, load: f64) {
        match self.figures.iter_mut().find(|f| f.name == name) {
            Some(f) => {
                f.values.push(value);
                f.loads.push(load);
            }
            None => self.figures.push(Figure {
                name: name.to_owned(),
                unit,
                values: vec![value],
                loads: vec![load],
            }),
        }
    }

    /// The figure's value in each run, in run order.
    pub(crate) fn values(&self, name: &str) -> Vec<f64> {
        self.figures
            .iter()
            .find(|f| f.name == name)
            .map_or_else(Vec::new, |f| f.values.clone())
    }

    pub(crate) fn median(&self, name: &str) -> f64 {
        self.figures
            .iter()
            .find(|f| f.name == name)
            .map_or(f64::NAN, |f| median(&f.values))
    }
}

/// One line of ratios, run by run, and their median (nothing when no run
/// has the figures).
fn run_by_run(out: &mut String, what: &str, ratios: &[f64], digits: usize) {
    if ratios.is_empty() {
        return;
    }
    let each: Vec<String> = ratios.iter().map(|r| format!("{r:.digits$}")).collect();
    out.push_str(&format!(
        "{what}: × {} (median × {:.digits$})\n",
        each.join(", "),
        median(ratios)
    ));
}

pub(crate) fn median(values: &[f64]) -> f64 {
    let v = sorted(values.to_vec());
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub(crate) fn thousands(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".to_owned();
    }
    let s = format!("{:.0}", v.round());
    let (sign, digits) = s.strip_prefix('-').map_or(("", s.as_str()), |d| ("-", d));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{sign}{out}")
}

pub(crate) fn show(v: f64, unit: Unit) -> String {
    if !v.is_finite() {
        return "n/a".to_owned();
    }
    match unit {
        Unit::Rate => format!("{}/s", thousands(v)),
        Unit::Ms => format!("{v:.1} ms"),
        Unit::MiB => format!("{v:.1} MiB"),
        Unit::Secs => format!("{v:.3} s"),
        Unit::Count => thousands(v),
        Unit::Ratio => format!("{v:.2}"),
        Unit::Micros => format!("{v:.1} µs"),
    }
}

pub(crate) fn report(opts: &Options, sheet: &Sheet, runs_done: usize) -> String {
    let mut out = String::new();
    let line = |out: &mut String, s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(
        &mut out,
        format!(
            "pipeline bench: {} events, {runs_done} run(s), max_in_flight {}, pool {POOL}, \
             retry_delay {RETRY_DELAY}, {PARTITIONS} partitions, naive {} events, single-row {} rows",
            opts.events, opts.max_in_flight, opts.naive_events, opts.limit_events
        ),
    );
    if !opts.kafka_properties.is_empty() {
        let props: Vec<String> = opts
            .kafka_properties
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        line(
            &mut out,
            format!(
                "extra librdkafka properties (every consumer): {}",
                props.join(", ")
            ),
        );
    }
    line(&mut out, String::new());
    line(&mut out, "| figure | median | runs | load 1m |".to_owned());
    line(&mut out, "|---|---:|---|---|".to_owned());
    for f in &sheet.figures {
        let runs: Vec<String> = f.values.iter().map(|v| show(*v, f.unit)).collect();
        let loads: Vec<String> = f.loads.iter().map(|l| format!("{l:.2}")).collect();
        line(
            &mut out,
            format!(
                "| {} | {} | {} | {} |",
                f.name,
                show(median(&f.values), f.unit),
                runs.join(", "),
                loads.join(", ")
            ),
        );
    }
    line(&mut out, String::new());
    if opts.scale_only {
        for l in scale_lines(opts, sheet) {
            line(&mut out, l);
        }
        return out;
    }
    if opts.backlog_only {
        // No limits were measured: no ratios, no verdicts.
        line(
            &mut out,
            "--backlog-only: S1 alone; no limits, ratios or goals".to_owned(),
        );
        return out;
    }

    let m = |name: &str| sheet.median(name);
    let consume = m(RAW_CONSUME);
    let http64 = m(RAW_HTTP_64);
    let http_mif = if opts.max_in_flight != 64 {
        m(&format!("raw HTTP, {} in flight", opts.max_in_flight))
    } else {
        http64
    };
    let http = http64.max(http_mif);
    let batched = m(&format!(
        "batched UPDATE ({BATCH_IDS} ids/stmt, {POOL} in parallel)"
    ));
    let single = m(&format!(
        "single-row UPDATE (mark_sent, {} callers, pool {POOL})",
        opts.max_in_flight
    ));
    let naive = m(&format!(
        "naive loop, one event at a time ({} events)",
        opts.naive_events
    ));
    let floor = consume.min(http).min(batched);
    let which = if floor == consume {
        "raw consume"
    } else if floor == http {
        "raw HTTP"
    } else {
        "batched UPDATE"
    };
    line(
        &mut out,
        format!(
            "min(raw consume, raw HTTP (best of 64/{}), batched UPDATE) = {} ({which})",
            opts.max_in_flight,
            show(floor, Unit::Rate)
        ),
    );
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    let rate_of = |label: &str| m(&format!("{label}: events/s end to end"));
    for label in [S1, S2] {
        let rate = rate_of(label);
        line(
            &mut out,
            format!(
                "{label}: pipeline / min(limits) = {:.2}; pipeline / naive = {:.1}; pipeline / single-row UPDATE = {:.2}",
                rate / floor,
                rate / naive,
                rate / single
            ),
        );
    }
    line(&mut out, String::new());
    // Throughput, as users run it: echoes on the topic, the 201 + JSON
    // receiver (S1's setup).
    let rate1 = rate_of(S1);
    line(
        &mut out,
        format!(
            "{} S1 (echoes, 201 + JSON receiver) ≥ 10,000 events/s: {} (× {:.2})",
            verdict(rate1 >= 10_000.0),
            show(rate1, Unit::Rate),
            rate1 / 10_000.0
        ),
    );
    line(
        &mut out,
        format!(
            "{} S1 ≥ 12 × naive loop: {} vs {} (× {:.1})",
            verdict(rate1 >= 12.0 * naive),
            show(rate1, Unit::Rate),
            show(12.0 * naive, Unit::Rate),
            rate1 / naive
        ),
    );
    // What the machine allows: every process of the rig shares its cores,
    // so the CPU all of them spend per event bounds the rate.
    let cpu_of = |what: &str| m(&format!("{S1}: CPU s / 1,000 events ({what})")) * 1_000.0;
    let (side, bench, pg) = (
        cpu_of("sidecar process"),
        cpu_of("bench process: broker, receiver"),
        cpu_of("postgres, approx."),
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let bound = cores * 1e6 / (side + bench + pg);
    line(
        &mut out,
        format!(
            "S1 CPU per event, every process of the rig: sidecar {side:.1} µs + bench (broker, \
             receiver, echoes) {bench:.1} µs + PostgreSQL {pg:.1} µs = {:.1} µs; {cores:.0} cores \
             allow at most {} here; S1 reached × {:.2} of that",
            side + bench + pg,
            show(bound, Unit::Rate),
            rate1 / bound
        ),
    );
    // Cost per event: the sidecar's CPU against the client-side CPU of
    // its parts, each measured in a child process of its own.
    let per_msg = m(CPU_CONSUME);
    let per_req = m(CPU_HTTP);
    let per_row = m(CPU_BATCHED);
    let msgs = m(&format!("{S1}: messages consumed / event"));
    let sidecar_us = m(&format!("{S1}: CPU s / 1,000 events (sidecar process)")) * 1_000.0;
    let parts_us = per_msg * msgs + per_req + per_row;
    line(
        &mut out,
        format!(
            "{} S1 sidecar CPU / event ≤ 1.5 × its parts' client CPU: {sidecar_us:.1} µs vs \
             {parts_us:.1} µs = {per_msg:.1} µs × {msgs:.2} messages + {per_req:.1} µs request \
             + {per_row:.1} µs row (× {:.2})",
            verdict(sidecar_us <= 1.5 * parts_us),
            sidecar_us / parts_us
        ),
    );
    // The same ratio run by run: the parts' CPU per request moves more
    // between runs (20.8 to 46.6 µs seen) than the goal's margin.
    let (msg_r, req_r, row_r, msgs_r, side_r) = (
        sheet.values(CPU_CONSUME),
        sheet.values(CPU_HTTP),
        sheet.values(CPU_BATCHED),
        sheet.values(&format!("{S1}: messages consumed / event")),
        sheet.values(&format!("{S1}: CPU s / 1,000 events (sidecar process)")),
    );
    let ratios: Vec<f64> = (0..side_r.len())
        .filter_map(|i| {
            let parts = msg_r.get(i)? * msgs_r.get(i)? + req_r.get(i)? + row_r.get(i)?;
            Some(side_r[i] * 1_000.0 / parts)
        })
        .collect();
    run_by_run(
        &mut out,
        "S1 sidecar CPU / its parts' run by run",
        &ratios,
        2,
    );
    let wal = |label: &str| {
        m(&format!(
            "{label}: WAL bytes / event (the whole server, echo queue included)"
        ))
    };
    let cpu_pg = |label: &str| {
        m(&format!(
            "{label}: CPU s / 1,000 events (postgres, approx.)"
        ))
    };
    line(
        &mut out,
        format!(
            "the attempt log's cost in PostgreSQL: WAL {} vs {} bytes / event, CPU {:.1} vs {:.1} µs / event (S1 with it vs without)",
            thousands(wal(S1)),
            thousands(wal(S1_NO_LOG)),
            cpu_pg(S1) * 1_000.0,
            cpu_pg(S1_NO_LOG) * 1_000.0
        ),
    );
    let (logged, unlogged) = (rate_of(S1), rate_of(S1_NO_LOG));
    line(
        &mut out,
        format!(
            "{} the attempt log costs ≤ 10% (S1 with it ≥ 0.9 × S1 without): {} vs {} (× {:.2})",
            verdict(logged >= 0.9 * unlogged),
            show(logged, Unit::Rate),
            show(unlogged, Unit::Rate),
            logged / unlogged
        ),
    );
    // The two S1 scenarios run back to back in each run: their ratio run
    // by run leaves out how the machine's speed moves between runs (seen:
    // S1 12,936 to 16,489/s within one full run). Printed beside the goal's
    // figure, which stays the ratio of the medians.
    let pairs: Vec<f64> = sheet
        .values(&format!("{S1}: events/s end to end"))
        .iter()
        .zip(sheet.values(&format!("{S1_NO_LOG}: events/s end to end")))
        .map(|(on, off)| on / off)
        .collect();
    run_by_run(
        &mut out,
        "the attempt log's cost run by run (S1 with it / S1 without, back to back)",
        &pairs,
        3,
    );
    let p99 = m(&format!("{S3}: publish→sent p99"));
    let rate3 = m("S3 paced: publish rate (half of S1)");
    line(
        &mut out,
        format!(
            "{} S3 p99 publish→sent ≤ 250 ms at half the saturation rate ({}), echoes {}: {}",
            verdict(p99 <= 250.0),
            show(rate3, Unit::Rate),
            if opts.echoes { "on" } else { "off" },
            show(p99, Unit::Ms)
        ),
    );
    let rss = m(&format!("{S1}: peak RSS of the sidecar process (VmHWM)"));
    line(
        &mut out,
        format!(
            "{} peak RSS ≤ 100 MiB with {} events in the backlog: {} (the sidecar process)",
            verdict(rss <= 100.0),
            thousands(opts.events as f64),
            show(rss, Unit::MiB),
        ),
    );
    let large = m(&format!(
        "{S1_LARGE}: peak RSS of the sidecar process (VmHWM)"
    ));
    line(
        &mut out,
        format!(
            "{} peak RSS with {} events of ~{} KiB ≤ S1's + the 64 MiB payload bound: {} vs {}",
            verdict(large <= rss + 64.0),
            thousands(opts.large_events as f64),
            opts.large_payload_bytes / 1024,
            show(large, Unit::MiB),
            show(rss + 64.0, Unit::MiB),
        ),
    );
    // Keep-alive: a connection the receiver saw end while the sidecar ran
    // was dropped (a body left unread, an error, an idle cap), and the next
    // request paid a new handshake. More connections than slots alone is
    // not that: hyper's pool starts a connection for a request that finds
    // none idle and keeps it even when another frees first, so a ramp-up
    // can open a few more than max_in_flight, all of them kept.
    for label in [S1, S1_204, S1_HTTPS] {
        let per_1k = m(&format!(
            "{label}: connections opened / 1,000 events (receiver accepts)"
        ));
        let closed = m(&format!(
            "{label}: connections closed while the sidecar ran"
        ));
        let total = per_1k * opts.events as f64 / 1_000.0;
        line(
            &mut out,
            format!(
                "{} {label}: keep-alive holds (no connection closed while the sidecar ran): {} \
                 closed; {} opened for max_in_flight {} ({per_1k:.2} / 1,000 events)",
                verdict(closed == 0.0),
                thousands(closed),
                thousands(total),
                opts.max_in_flight,
            ),
        );
    }
    let p50_never_refused = |label: &str| m(&format!("{label}: ready→sent p50, ids never refused"));
    let (c1, c2) = (p50_never_refused(S1), p50_never_refused(S2));
    line(
        &mut out,
        format!(
            "{} refused rows do not slow the rest (S2 p50 of never-refused ids ≤ 1.2 × S1's): \
             {} vs {} (× {:.2})",
            verdict(c2 <= 1.2 * c1),
            show(c2, Unit::Ms),
            show(c1, Unit::Ms),
            c2 / c1
        ),
    );
    for l in scale_lines(opts, sheet) {
        line(&mut out, l);
    }
    if opts.quick {
        line(
            &mut out,
            "(quick run: 1 run, small backlog; not the reference figures)".to_owned(),
        );
    }
    out
}

/// The scale goal: S4's peak RSS and CPU per event with `scale_events`
/// within ±10% of its figures with `events`.
fn scale_lines(opts: &Options, sheet: &Sheet) -> Vec<String> {
    if opts.scale_events == 0 {
        return vec!["scale goal: not measured (--scale-events 0)".to_owned()];
    }
    let (small, large) = (s4(opts.events), s4(opts.scale_events));
    let m = |label: &str, what: &str| sheet.median(&format!("{label}: {what}"));
    let verdict = |r: f64| {
        if (0.9..=1.1).contains(&r) {
            "PASS"
        } else {
            "MISS"
        }
    };
    let rss = "peak RSS of the sidecar process (VmHWM)";
    let cpu = "CPU s / 1,000 events (sidecar process)";
    let (r0, r1) = (m(&small, rss), m(&large, rss));
    let (c0, c1) = (m(&small, cpu), m(&large, cpu));
    let (e0, e1) = (
        thousands(opts.events as f64),
        thousands(opts.scale_events as f64),
    );
    vec![
        format!(
            "{} peak RSS flat with scale (S4 {e1} within ±10% of S4 {e0}): {} vs {} (× {:.2})",
            verdict(r1 / r0),
            show(r1, Unit::MiB),
            show(r0, Unit::MiB),
            r1 / r0
        ),
        format!(
            "{} CPU / event flat with scale (S4 {e1} within ±10% of S4 {e0}): {:.1} µs vs {:.1} µs (× {:.2})",
            verdict(c1 / c0),
            c1 * 1_000.0,
            c0 * 1_000.0,
            c1 / c0
        ),
    ]
}
