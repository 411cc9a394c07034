//! The checker every fault scenario ends with. It reads three records of
//! one run — the rows in the table, every request the receiver logged, the
//! change events the feed produced — and holds them against CONTRACT §5/§7:
//!
//! - no row is left `pending` (after settling every row is sent or failed);
//! - no request for a row arrives after its `sent_at`, nor after the write
//!   that made it `failed`;
//! - `attempts` (in the table, in every change event, in the
//!   `Outbox-Attempt` header) never exceeds `max_attempts`;
//! - `failed` only after exactly `max_attempts` failed requests, numbered
//!   1..=max_attempts; `sent` after a 2xx numbered `attempts + 1`;
//! - attempt N+1 of a row comes at least `retry_delay` after attempt N
//!   (both times are microsecond wall clocks of this machine, so zero
//!   tolerance is fair);
//! - a row never goes back from `sent` in the change events;
//! - a request that repeats an attempt number (a duplicate 2xx, or a failure
//!   whose write-back was lost) must straddle a crash or a revoke, and no
//!   crash or revoke explains more than the in-flight limit of them.
//!
//! Why the in-flight limit bounds the repeats of one SIGKILL: a job holds
//! one of `max_in_flight` slots from just before its POST until its status
//! write has committed (`src/job.rs`; the batched writer answers a job only
//! after its statement returned, `src/store/batch.rs`), and within one
//! process an id has one job at a time (`src/consumer/schedule.rs`). A
//! request is sent again only when its outcome is not in the table, i.e.
//! only when its job still held a slot at the kill: at most
//! `max_in_flight` rows, one request each. Everything else a restart
//! replays finds its row decided: the change events after the committed
//! offset are re-read, but a row is read before it is sent (sent or failed:
//! finished; pending with more attempts: the next attempt, not a repeat).
//! The HTTP client re-sends nothing on its own (reqwest retries only
//! requests an HTTP/2 peer refused unprocessed). A repeat is charged to the
//! kill that ended the process which sent its first copy (see
//! [`RECORD_SLACK`] for how that process is told from the stamps).

use std::collections::HashMap;
use std::time::Duration;

use chrono::NaiveDateTime;
use entity::{OutboxEventRow, Status};
use outbox_sidecar::store::ListFilter;

use crate::harness::receiver::Received;
use crate::harness::TestApp;

/// How late after a kill the receiver may stamp a request the killed
/// process wrote (see the replay attribution in [`judge`]).
const RECORD_SLACK: Duration = Duration::from_secs(1);

/// What a scenario tells the checker about itself.
pub struct Spec<'a> {
    pub scenario: &'a str,
    pub max_attempts: i32,
    pub retry_delay: Duration,
    /// Faults injected, for the figure line.
    pub faults: usize,
    /// When a crash or a revoke happened, in any order.
    pub disruptions: Vec<NaiveDateTime>,
    /// What each disruption was (same order as `disruptions`, or empty):
    /// named in the replay log.
    pub disruption_notes: Vec<String>,
    /// When each process under test was started, for scenarios that kill
    /// and restart it: the replay log names the process alive when each
    /// copy of a repeated request was stamped.
    pub starts: Vec<NaiveDateTime>,
    /// How many repeated requests one disruption may explain (the
    /// in-flight limit, times the members that lost work).
    pub per_disruption: usize,
    /// Whether the sidecar saw a 2xx for this request: a 2xx that comes
    /// after the dispatcher's timeout is a failure to it.
    pub delivered: Box<dyn Fn(&Received) -> bool + Send + Sync + 'a>,
    /// Event names dispatched elsewhere than to the logged receiver.
    pub elsewhere: Vec<&'a str>,
}

impl<'a> Spec<'a> {
    pub fn new(scenario: &'a str, t: &TestApp) -> Spec<'a> {
        Spec {
            scenario,
            max_attempts: t.opts.max_attempts,
            retry_delay: humantime::parse_duration(t.opts.retry_delay).expect("retry_delay"),
            faults: 0,
            disruptions: Vec::new(),
            disruption_notes: Vec::new(),
            starts: Vec::new(),
            per_disruption: t.opts.max_in_flight,
            delivered: Box::new(|r| (200..300).contains(&r.status)),
            elsewhere: Vec::new(),
        }
    }
}

/// The figures of one run.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    pub events: usize,
    pub requests: usize,
    pub lost: usize,
    pub stuck: usize,
    pub duplicates: usize,
    pub replays: usize,
    pub max_attempts_seen: i64,
    /// The most repeated requests charged to one disruption.
    pub most_per_disruption: usize,
    /// How many disruptions were charged 0, 1, 2, … repeated requests.
    pub per_disruption_counts: Vec<usize>,
    /// Repeated requests whose first copy was stamped after the kill it is
    /// charged to (sent before it, read by the receiver after it), and the
    /// latest such stamp, in ms after its kill.
    pub stamped_after_kill: usize,
    pub latest_stamp_after_kill_ms: i64,
    /// The attribution without [`RECORD_SLACK`] (first copy stamped at or
    /// before the kill): its most per disruption, and how many repeats it
    /// finds no disruption for.
    pub unslacked_most: usize,
    pub unslacked_unexplained: usize,
    /// One line per repeated request: the event, both copies, the kill.
    pub replay_log: Vec<String>,
}

pub async fn all_rows(t: &TestApp) -> Vec<OutboxEventRow> {
    t.store
        .list(&ListFilter {
            limit: Some(10_000_000),
            ..ListFilter::default()
        })
        .await
        .expect("read the table")
}

/// Checks the settled run, prints its figure line and panics on breaches.
pub async fn check(t: &TestApp, spec: &Spec<'_>) -> Figures {
    let rows = all_rows(t).await;
    let requests = t.receiver.requests();
    let published = t.feed.published();
    let (figures, violations) = judge(&rows, &requests, &published, spec);
    println!(
        "faults {}: events={} faults={} lost={} stuck={} duplicates={} max_attempts_seen={} \
         (requests={} replays={} crashes_or_revokes={})",
        spec.scenario,
        figures.events,
        spec.faults,
        figures.lost,
        figures.stuck,
        figures.duplicates,
        figures.max_attempts_seen,
        figures.requests,
        figures.replays,
        spec.disruptions.len(),
    );
    if !spec.disruptions.is_empty() {
        for line in &figures.replay_log {
            println!("faults {} replay: {line}", spec.scenario);
        }
        println!(
            "faults {}: repeated requests per disruption: at most {} (limit {}); disruptions with 0, 1, 2, … repeats: {:?}; \
             {} first copies stamped after their kill (latest {} ms after); without the {:?} stamp slack: at most {} per disruption, {} unexplained",
            spec.scenario,
            figures.most_per_disruption,
            spec.per_disruption,
            figures.per_disruption_counts,
            figures.stamped_after_kill,
            figures.latest_stamp_after_kill_ms,
            RECORD_SLACK,
            figures.unslacked_most,
            figures.unslacked_unexplained,
        );
    }
    if !violations.is_empty() {
        let shown: Vec<&String> = violations.iter().take(25).collect();
        panic!(
            "{}: {} violation(s) of CONTRACT §5/§7:\n  {}",
            spec.scenario,
            violations.len(),
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n  ")
        );
    }
    figures
}

/// The pure part of [`check`]: figures and every violation found.
pub fn judge(
    rows: &[OutboxEventRow],
    requests: &[Received],
    published: &[crate::harness::feed::Published],
    spec: &Spec<'_>,
) -> (Figures, Vec<String>) {
    let mut v: Vec<String> = Vec::new();
    let mut f = Figures {
        events: rows.len(),
        requests: requests.len(),
        ..Figures::default()
    };
    let max = spec.max_attempts;
    let delay = chrono::Duration::from_std(spec.retry_delay).unwrap();
    let mut by_id: HashMap<i64, Vec<&Received>> = HashMap::new();
    for r in requests {
        by_id.entry(r.id).or_default().push(r);
        if r.attempt < 1 || r.attempt > max {
            v.push(format!(
                "event {}: request with Outbox-Attempt {} (max_attempts {max})",
                r.id, r.attempt
            ));
        }
        f.max_attempts_seen = f.max_attempts_seen.max(i64::from(r.attempt - 1));
    }
    let known: std::collections::HashSet<i64> = rows.iter().map(|r| r.id).collect();
    for id in by_id.keys().filter(|id| !known.contains(id)) {
        v.push(format!("request for event {id}, which is not in the table"));
    }
    let mut per_disruption: HashMap<usize, Vec<String>> = HashMap::new();
    let mut unslacked: HashMap<usize, usize> = HashMap::new();
    let mut disruptions: Vec<(NaiveDateTime, &str)> = spec
        .disruptions
        .iter()
        .enumerate()
        .map(|(i, d)| (*d, spec.disruption_notes.get(i).map_or("", String::as_str)))
        .collect();
    disruptions.sort_by_key(|(d, _)| *d);
    let mut starts = spec.starts.clone();
    starts.sort();
    // The process alive when the receiver stamped `at` (1-based; 0 before
    // the first start).
    let process = |at: NaiveDateTime| match starts.partition_point(|s| *s <= at) {
        _ if starts.is_empty() => String::new(),
        n => format!(" by process {n}"),
    };
    let noted = |note: &str| {
        if note.is_empty() {
            String::new()
        } else {
            format!(" ({note})")
        }
    };
    let ms = |d: chrono::Duration| d.num_milliseconds();

    for row in rows {
        let id = row.id;
        f.max_attempts_seen = f.max_attempts_seen.max(i64::from(row.attempts));
        if row.attempts > max {
            v.push(format!(
                "event {id}: attempts {} > max_attempts {max}",
                row.attempts
            ));
        }
        if row.status == Status::Pending {
            f.stuck += 1;
            v.push(format!(
                "event {id}: still pending (attempts {}) after settling",
                row.attempts
            ));
            continue;
        }
        if spec.elsewhere.contains(&row.event_name.as_str()) {
            if row.status == Status::Failed && row.attempts != max {
                v.push(format!(
                    "event {id}: failed with attempts {} != {max}",
                    row.attempts
                ));
            }
            continue;
        }
        let rs: &[&Received] = by_id.get(&id).map(Vec::as_slice).unwrap_or(&[]);
        let delivered: Vec<&&Received> = rs.iter().filter(|r| (spec.delivered)(r)).collect();
        let failures = rs.len() - delivered.len();
        f.duplicates += delivered.len().saturating_sub(1);
        match row.status {
            Status::Sent => {
                let Some(sent_at) = row.sent_at else {
                    v.push(format!("event {id}: sent without sent_at"));
                    continue;
                };
                match delivered.last() {
                    None => {
                        f.lost += 1;
                        v.push(format!("event {id}: sent, but the receiver never answered it with a 2xx the sidecar saw"));
                    }
                    Some(last) if last.attempt != row.attempts + 1 => v.push(format!(
                        "event {id}: sent with attempts {} but its last 2xx was attempt {}",
                        row.attempts, last.attempt
                    )),
                    Some(_) => {}
                }
                if failures < row.attempts as usize {
                    v.push(format!(
                        "event {id}: attempts {} but only {failures} failed requests",
                        row.attempts
                    ));
                }
                for r in rs.iter().filter(|r| r.at > sent_at) {
                    v.push(format!(
                        "event {id}: request (attempt {}) at {} after sent_at {sent_at}",
                        r.attempt, r.at
                    ));
                }
            }
            Status::Failed => {
                if row.attempts != max {
                    v.push(format!(
                        "event {id}: failed with attempts {} != {max}",
                        row.attempts
                    ));
                }
                if !delivered.is_empty() {
                    f.lost += 1;
                    v.push(format!(
                        "event {id}: failed although {} request(s) got a 2xx",
                        delivered.len()
                    ));
                }
                let mut numbers: Vec<i32> = rs.iter().map(|r| r.attempt).collect();
                numbers.sort_unstable();
                numbers.dedup();
                if numbers != (1..=max).collect::<Vec<_>>() {
                    v.push(format!(
                        "event {id}: failed after attempts {numbers:?}, not 1..={max}"
                    ));
                }
                for r in rs.iter().filter(|r| r.at > row.updated_at) {
                    v.push(format!(
                        "event {id}: request (attempt {}) at {} after it failed at {}",
                        r.attempt, r.at, row.updated_at
                    ));
                }
            }
            Status::Pending => unreachable!(),
        }
        // Attempt N+1 waits retry_delay after the failure of attempt N.
        for pair in rs.windows(2) {
            if pair[1].attempt == pair[0].attempt + 1 && pair[1].at - pair[0].at < delay {
                v.push(format!(
                    "event {id}: attempt {} only {} µs after attempt {} (retry_delay {:?})",
                    pair[1].attempt,
                    (pair[1].at - pair[0].at).num_microseconds().unwrap_or(0),
                    pair[0].attempt,
                    spec.retry_delay
                ));
            }
        }
        // A repeated attempt number: the earlier request's outcome was never
        // recorded. Only a crash or a revoke in between explains that.
        for (i, r) in rs.iter().enumerate() {
            let Some(twin) = rs[..i].iter().rev().find(|e| e.attempt == r.attempt) else {
                continue;
            };
            f.replays += 1;
            // The receiver stamps a request when it has read it, which can
            // be a few milliseconds after a killed process wrote it, so
            // after the moment the kill is recorded (taken once the process
            // is reaped). A twin stamped just after a kill was still sent
            // before it: a restarted process needs seconds (connect, join)
            // before its first request (it joins the group first). Without
            // this slack such a replay would be charged to a later
            // disruption, on top of that one's own.
            let sent_by = twin.at - chrono::Duration::from_std(RECORD_SLACK).unwrap();
            match disruptions
                .iter()
                .position(|(d, _)| twin.at <= *d && *d <= r.at)
            {
                Some(k) => *unslacked.entry(k).or_default() += 1,
                None => f.unslacked_unexplained += 1,
            }
            match disruptions
                .iter()
                .position(|(d, _)| sent_by <= *d && *d <= r.at)
            {
                Some(k) => {
                    let (kill, note) = disruptions[k];
                    let late = ms(twin.at - kill);
                    if twin.at > kill {
                        f.stamped_after_kill += 1;
                        f.latest_stamp_after_kill_ms = f.latest_stamp_after_kill_ms.max(late);
                    }
                    f.replay_log.push(format!(
                        "event {id} attempt {}: answered {} at {}{} ({late:+} ms from the kill), \
                         answered {} again at {}{} ({:+} ms); charged to disruption {} at {kill}{}",
                        r.attempt,
                        twin.status,
                        twin.at,
                        process(twin.at),
                        r.status,
                        r.at,
                        process(r.at),
                        ms(r.at - kill),
                        k + 1,
                        noted(note),
                    ));
                    per_disruption
                        .entry(k)
                        .or_default()
                        .push(format!("{id}/{}", r.attempt));
                }
                None => v.push(format!(
                    "event {id}: attempt {} sent again at {} (first at {}) with no crash or revoke in between",
                    r.attempt, r.at, twin.at
                )),
            }
        }
    }
    f.most_per_disruption = per_disruption.values().map(Vec::len).max().unwrap_or(0);
    f.unslacked_most = unslacked.values().copied().max().unwrap_or(0);
    f.per_disruption_counts = vec![0; f.most_per_disruption + 1];
    for k in 0..disruptions.len() {
        f.per_disruption_counts[per_disruption.get(&k).map_or(0, Vec::len)] += 1;
    }
    let mut over: Vec<(&usize, &Vec<String>)> = per_disruption
        .iter()
        .filter(|(_, ids)| ids.len() > spec.per_disruption)
        .collect();
    over.sort();
    for (k, ids) in over {
        let (at, note) = disruptions[*k];
        v.push(format!(
            "{} repeated requests across the crash/revoke at {at}{} (limit {}): event/attempt {}",
            ids.len(),
            noted(note),
            spec.per_disruption,
            ids.join(", ")
        ));
    }

    // The change events: attempts bounded, and never back from sent.
    let mut was_sent: HashMap<i64, bool> = HashMap::new();
    let mut inserted: std::collections::HashSet<i64> = std::collections::HashSet::new();
    for p in published {
        if p.op == "c" {
            inserted.insert(p.id);
        }
        if let Some(a) = p.attempts {
            f.max_attempts_seen = f.max_attempts_seen.max(a);
            if a > i64::from(max) {
                v.push(format!(
                    "event {}: change event with attempts {a} > {max}",
                    p.id
                ));
            }
        }
        let sent = was_sent.entry(p.id).or_default();
        match p.status.as_deref() {
            Some("sent") => *sent = true,
            Some(other) if *sent && p.op != "d" => {
                v.push(format!("event {}: went back from sent to {other}", p.id));
            }
            _ => {}
        }
    }
    for row in rows.iter().filter(|r| !inserted.contains(&r.id)) {
        v.push(format!(
            "event {}: its insert never reached the topic (feed fault)",
            row.id
        ));
    }
    (f, v)
}
