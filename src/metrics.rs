//! Prometheus metrics: one registry owned by [`Metrics`], passed to every
//! part that reports. Label sets are small and fixed: `event_name` is the
//! configured name or `unregistered`, never a free string from a row.

use prometheus::{
    CounterVec, Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use entity::Status;

use crate::cdc::{Decision, Skip};
use crate::store::TableStats;
use labels::{
    CONSUMER_ERROR_KINDS, HELD_OUTCOMES, REBALANCE_KINDS, REBALANCE_PROTOCOLS,
    SCHEDULE_SKIP_REASONS, WRITES,
};

pub mod labels;

/// The series one event name reports to, resolved once: a job counts its
/// attempts and transitions without hashing label values per event.
#[derive(Clone)]
pub struct EventSeries {
    pub success: IntCounter,
    pub failure: IntCounter,
    pub to_sent: IntCounter,
    pub to_pending: IntCounter,
    pub to_failed: IntCounter,
    /// The dispatcher's `outbox_dispatch_duration_seconds`; `None` for an
    /// unregistered name (nothing is sent).
    pub duration: Option<Histogram>,
}

impl EventSeries {
    /// `outbox_transitions_total{to}` of this event name.
    pub fn to(&self, status: Status) -> &IntCounter {
        match status {
            Status::Sent => &self.to_sent,
            Status::Pending => &self.to_pending,
            Status::Failed => &self.to_failed,
        }
    }
}

/// A metric family: made from its name, help and label names, its known
/// label values created at zero (so dashboards and alerts see them before
/// the first event).
trait Family: prometheus::core::Collector + Clone + Sized + 'static {
    fn make(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<Self>;
    /// `values`: the known values of each label; every combination is
    /// created.
    fn precreate(&self, _values: &[&[&str]]) {}
}

macro_rules! plain_family {
    ($($t:ty),*) => {$(
        impl Family for $t {
            fn make(name: &str, help: &str, _labels: &[&str]) -> prometheus::Result<Self> {
                <$t>::new(name, help)
            }
        }
    )*};
}
plain_family!(IntGauge, Gauge, IntCounter);

macro_rules! vec_family {
    ($($t:ty),*) => {$(
        impl Family for $t {
            fn make(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<Self> {
                <$t>::new(Opts::new(name, help), labels)
            }
            fn precreate(&self, values: &[&[&str]]) {
                for combination in combinations(values) {
                    self.with_label_values(&combination);
                }
            }
        }
    )*};
}
vec_family!(IntCounterVec, IntGaugeVec, CounterVec, GaugeVec);

impl Family for HistogramVec {
    fn make(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<Self> {
        HistogramVec::new(
            HistogramOpts::new(name, help).buckets(DURATION_BUCKETS.to_vec()),
            labels,
        )
    }
}

/// The buckets of `outbox_dispatch_duration_seconds`.
const DURATION_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Every combination of one value per label.
fn combinations<'a>(values: &[&[&'a str]]) -> Vec<Vec<&'a str>> {
    values.iter().fold(vec![vec![]], |acc, label| {
        acc.iter()
            .flat_map(|prefix| {
                label.iter().map(move |v| {
                    let mut c = prefix.clone();
                    c.push(*v);
                    c
                })
            })
            .collect()
    })
}

/// Declares every family once: its field, type, name, help, label names
/// and the emitters' lists of label values created at zero.
macro_rules! families {
    ($(
        $(#[$doc:meta])*
        $field:ident: $ty:ty = $name:literal, $help:literal
            $(, [$($label:literal),*] $(=> [$($values:expr),*])?)?;
    )*) => {
        /// The registered families, one field each.
        #[derive(Clone)]
        pub struct Families {
            $($(#[$doc])* pub $field: $ty,)*
        }

        impl Families {
            fn new(registry: &Registry) -> Self {
                $(
                    let labels: &[&str] = &[$($($label),*)?];
                    let $field = must(<$ty as Family>::make($name, $help, labels));
                    must(registry.register(Box::new($field.clone())));
                    $($( Family::precreate(&$field, &[$(&$values[..]),*]); )?)?
                )*
                Families { $($field),* }
            }
        }

        /// Each family's name and the label values created at zero, as
        /// (label values per label); for the test that checks them against
        /// what is rendered.
        #[cfg(test)]
        fn precreated() -> Vec<(&'static str, Vec<Vec<&'static str>>)> {
            vec![$(
                ($name, vec![$($($(Vec::from(&$values[..])),*)?)?]),
            )*]
        }
    };
}

families! {
    events_failed: IntGauge = "outbox_events_failed",
        "Rows in the outbox table with status failed (read by the replica holding \
         partition 0; 0 on the others: aggregate with max)";
    events_pending: IntGauge = "outbox_events_pending",
        "Rows in the outbox table with status pending (read by the replica holding \
         partition 0; 0 on the others: aggregate with max)";
    table_gauges_reporter: IntGauge = "outbox_table_gauges_reporter",
        "1 on the replica that reads the table gauges for the group (it holds the topic's \
         partition 0), 0 on the others";
    oldest_pending_age: Gauge = "outbox_oldest_pending_age_seconds",
        "Age of the oldest pending row (by created_at), 0 when none";
    /// The table's size as the database estimates it (no exact count of
    /// the sent history: a scan).
    events_estimated_rows: IntGauge = "outbox_events_estimated_rows",
        "Rows in the outbox table, all statuses, as the database's statistics estimate \
         them (PostgreSQL reltuples, MySQL table_rows); not an exact count";
    dispatch_total: IntCounterVec = "outbox_dispatch_total",
        "Dispatch attempts by outcome", ["event_name", "outcome"];
    transitions_total: IntCounterVec = "outbox_transitions_total",
        "Status writes by the sidecar, by target status", ["event_name", "to"];
    dispatch_duration: HistogramVec = "outbox_dispatch_duration_seconds",
        "Duration of one HTTP dispatch", ["dispatcher"];
    cdc_messages_total: IntCounterVec = "outbox_cdc_messages_total",
        "Change events consumed, by result (triggered, skipped, invalid)", ["result"]
        => [Decision::RESULTS];
    cdc_skips_total: IntCounterVec = "outbox_cdc_skips_total",
        "Change events skipped, by reason", ["reason"]
        => [[&Skip::REASONS[..], &SCHEDULE_SKIP_REASONS[..]].concat()];
    jobs_running: IntGauge = "outbox_jobs_running",
        "Dispatch jobs alive on this replica: each is one attempt (at most 2 x \
         dispatch.max_in_flight); nothing that waits for time to pass is a job";
    scheduler_waiting: IntGaugeVec = "outbox_scheduler_waiting",
        "Events waiting in the scheduler for time to pass, holding no payload and no job: \
         retry (their next attempt is due later) and rate (their dispatcher's rate limit)",
        ["wait"] => [["retry", "rate"]];
    inflight_events: IntGauge = "outbox_inflight_events",
        "Events being sent or having their status written (jobs holding an in-flight slot)";
    consumer_lag: IntGaugeVec = "outbox_consumer_lag",
        "Consumer lag per assigned partition, from librdkafka statistics", ["partition"];
    consumer_paused: IntGauge = "outbox_consumer_paused",
        "1 while fetching is paused: events wait for jobs that are not finishing";
    consumer_pauses_total: IntCounter = "outbox_consumer_pauses_total",
        "Times fetching was paused because events waited for jobs that were not finishing";
    revoke_held_requests_total: IntCounterVec = "outbox_revoke_held_requests_total",
        "Requests in flight a partition revoke waited for: status written before the \
         partitions were given up, or given up at the drain timeout (the next owner may \
         send those again)", ["outcome"] => [HELD_OUTCOMES];
    /// Rebalance callbacks by protocol (`eager`, `cooperative`) and what
    /// they did (`assign`, `revoke`, `lost`): shows which protocol the
    /// group runs, e.g. during the two-step switch to cooperative-sticky.
    consumer_rebalances_total: IntCounterVec = "outbox_consumer_rebalances_total",
        "Rebalance callbacks of this member, by rebalance protocol (eager, cooperative) \
         and kind (assign, revoke, lost)", ["protocol", "kind"]
        => [REBALANCE_PROTOCOLS, REBALANCE_KINDS];
    db_statements_total: IntCounter = "outbox_db_statements_total",
        "SQL statements this replica sent to the database (reads, status writes, the attempt \
         log, operator actions; BEGIN and COMMIT not counted)";
    db_write_retries_total: IntCounterVec = "outbox_db_write_retries_total",
        "Status writes retried after a database error", ["to"] => [WRITES];
    cdc_rows_visible_late_total: IntCounter = "outbox_cdc_rows_visible_late_total",
        "Rows found missing or older than their change event at first, read again until \
         they were visible (logical decoding ships a commit before it is visible)";
    rows_never_visible_total: IntCounter = "outbox_rows_never_visible_total",
        "Change events whose row was still missing, or older than the event, at \
         dispatch.row_visibility_timeout: decided on the row as read (it may need \
         events retrigger)";
    row_reads_failed_total: IntCounter = "outbox_row_reads_failed_total",
        "Batched reads of triggered rows that failed or passed their deadline (made again)";
    job_panics_total: IntCounter = "outbox_job_panics_total",
        "Dispatch jobs that panicked (their message is left for the next owner)";
    status_writes_given_up_total: IntCounterVec = "outbox_status_writes_given_up_total",
        "Status writes the database refused try after try (data or constraint errors); \
         the row keeps its last state", ["to"] => [WRITES];
    history_writes_failed_total: IntCounter = "outbox_history_writes_failed_total",
        "Attempt-log rows the database refused (table renamed or dropped, a privilege \
         revoked, no partition); their status was written without them";
    ordering_held_aggregates: IntGauge = "outbox_ordering_held_aggregates",
        "Aggregates with a failed event and later pending ones it holds back ([ordering], \
         on_failed = hold; read by the replica holding partition 0, 0 on the others)";
    pending_unexplained: IntGauge = "outbox_pending_unexplained",
        "Pending events unchanged for longer than metrics.pending_unexplained_after that no \
         pause, breaker or earlier event of their aggregate explains, up to 10,000 (read by the \
         replica holding partition 0, 0 on the others): ask `events why ID`";
    ordering_held_events: IntGauge = "outbox_ordering_held_events",
        "Pending events held behind a failed earlier event of their aggregate ([ordering], \
         on_failed = hold; read by the replica holding partition 0, 0 on the others)";
    ordering_parked_total: IntCounter = "outbox_ordering_parked_total",
        "Events left pending (message committed, no attempt used) because an earlier event \
         of their aggregate was pending or failed; announced again when it is sent";
    ordering_unkeyed_total: IntCounter = "outbox_ordering_unkeyed_total",
        "Change events whose Kafka key does not carry the [ordering] column: the connector's \
         message.key.columns does not key the topic by the aggregate";
    ordering_announced_total: IntCounter = "outbox_ordering_announced_total",
        "Pending events announced again (touched) after the event before them in their \
         aggregate was sent: after a resend, a resume or an earlier announcement, or when one \
         was parked here; never after an event sent on its insert";
    ordering_announce_failures_total: IntCounter = "outbox_ordering_announce_failures_total",
        "Announcements of an aggregate's next pending event (after the one before it was \
         sent) that failed try after try: it waits for events retrigger";
    trace_context_invalid_total: IntCounter = "outbox_trace_context_invalid_total",
        "Events whose [tracing] column held a value that is not a W3C traceparent: \
         sent in a new trace";
    oauth2_token_fetches_total: IntCounterVec =
        "outbox_oauth2_token_fetches_total",
        "OAuth2 access tokens a dispatcher fetched ([dispatchers.NAME.oauth2]), by outcome: \
         ok, or failed (the attempt that needed it failed)", ["dispatcher", "outcome"];
    signing_secret_reload_failures_total: IntCounterVec =
        "outbox_signing_secret_reload_failures_total",
        "Reloads of a dispatcher's signing_secret_file that failed (unreadable, or no \
         valid secret); it signs with the last good secrets", ["dispatcher"];
    /// Seconds jobs waited for their dispatcher's rate limit.
    dispatcher_throttled_seconds_total: CounterVec =
        "outbox_dispatcher_throttled_seconds_total",
        "Seconds events waited for their dispatcher's rate limit (this replica's share of \
         rate), summed over the events waiting; no attempt used, no send slot held",
        ["dispatcher"];
    /// This replica's share of each rate-limited dispatcher's limit.
    dispatcher_rate_share: GaugeVec = "outbox_dispatcher_rate_share",
        "Requests per second this replica may send to a rate-limited dispatcher: its \
         share of rate by the partitions it owns (the group's shares add up to rate)",
        ["dispatcher"];
    consumer_errors_total: IntCounterVec = "outbox_consumer_errors_total",
        "Errors librdkafka returned to the consumer, by kind (decompression, corrupt_record, \
         offset_reset, transport, unknown_topic, authorization, other)", ["kind"]
        => [CONSUMER_ERROR_KINDS];
    /// What `/readyz` answers, for clusters that do not probe it (the
    /// shipped Deployment): set on every scrape.
    ready: IntGauge = "outbox_ready",
        "1 when the consumer holds its group assignment (an empty one counts) and the \
         database answered its last check: what /readyz answers";
    dead_letters_in_flight: IntGauge = "outbox_dead_letters_in_flight",
        "Dead-letter sends under way (each keeps its record in memory until delivered or \
         given up); fetching holds at 1,000";
    database_up: IntGauge = "outbox_database_up",
        "1 when the last read of the table gauges (or, on a replica that does not read \
         them, a ping) reached the database";
    /// 1 while a dispatcher is paused (group-wide, from the pause table).
    dispatcher_paused: IntGaugeVec = "outbox_dispatcher_paused",
        "1 while the dispatcher is paused (outbox-sidecar dispatchers pause): its events stay pending",
        ["dispatcher"];
    /// How long a paused dispatcher has been paused; 0 when it is not.
    dispatcher_paused_seconds: GaugeVec = "outbox_dispatcher_paused_seconds",
        "Seconds since the dispatcher was paused; 0 when it is not", ["dispatcher"];
    /// 0 closed, 1 open, 2 half-open (this replica's breaker).
    dispatcher_breaker_state: IntGaugeVec = "outbox_dispatcher_breaker_state",
        "This replica's breaker of the dispatcher: 0 closed, 1 open (events held), 2 half-open (one probe)",
        ["dispatcher"];
    /// Events left pending because their dispatcher was paused.
    events_parked_total: IntCounterVec = "outbox_events_parked_total",
        "Events left pending, no attempt used, because their dispatcher was paused; resumed through the change feed",
        ["dispatcher"];
}

/// The registry and its families (reached through `Deref`: `metrics.ready`).
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    families: Families,
    /// `outbox_cdc_messages_total` by result, resolved once.
    cdc_results: [(&'static str, IntCounter); 3],
    /// `outbox_cdc_skips_total` by reason, resolved once.
    cdc_skip_reasons: [(&'static str, IntCounter); 7],
}

impl std::ops::Deref for Metrics {
    type Target = Families;
    fn deref(&self) -> &Families {
        &self.families
    }
}

fn must<T>(r: prometheus::Result<T>) -> T {
    // Only fails for an invalid name or a duplicate registration, both
    // fixed at compile time here: a programming error, caught by tests.
    match r {
        Ok(v) => v,
        Err(e) => panic!("metric definition: {e}"),
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let families = Families::new(&registry);
        let cdc_results =
            Decision::RESULTS.map(|r| (r, families.cdc_messages_total.with_label_values(&[r])));
        let cdc_skip_reasons =
            Skip::REASONS.map(|r| (r, families.cdc_skips_total.with_label_values(&[r])));
        Self {
            registry,
            families,
            cdc_results,
            cdc_skip_reasons,
        }
    }

    /// Counts one consumed change event under its `result` label.
    pub fn cdc_message(&self, result: &str) {
        match self.cdc_results.iter().find(|(r, _)| *r == result) {
            Some((_, counter)) => counter.inc(),
            None => self.cdc_messages_total.with_label_values(&[result]).inc(),
        }
    }

    /// Counts one skipped change event under its `reason` label.
    pub fn cdc_skip(&self, reason: &str) {
        match self.cdc_skip_reasons.iter().find(|(r, _)| *r == reason) {
            Some((_, counter)) => counter.inc(),
            None => self.cdc_skips_total.with_label_values(&[reason]).inc(),
        }
    }

    /// The series of one event `label` (a configured name or
    /// `unregistered`) sent through `dispatcher`; creating them makes them
    /// exist at zero, so rates exist before traffic.
    pub fn event_series(&self, label: &str, dispatcher: Option<&str>) -> EventSeries {
        let transition = |to: &str| self.transitions_total.with_label_values(&[label, to]);
        EventSeries {
            success: self.dispatch_total.with_label_values(&[label, "success"]),
            failure: self.dispatch_total.with_label_values(&[label, "failure"]),
            to_sent: transition(Status::Sent.as_str()),
            to_pending: transition(Status::Pending.as_str()),
            to_failed: transition(Status::Failed.as_str()),
            duration: dispatcher.map(|d| self.dispatch_duration.with_label_values(&[d])),
        }
    }

    /// Pre-creates the per-dispatcher series (not paused, breaker closed).
    pub fn register_dispatchers<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        for name in names {
            self.dispatcher_paused.with_label_values(&[name]).set(0);
            self.dispatcher_paused_seconds
                .with_label_values(&[name])
                .set(0.0);
            self.dispatcher_breaker_state
                .with_label_values(&[name])
                .set(0);
            self.events_parked_total.with_label_values(&[name]);
        }
    }

    pub fn set_table_stats(&self, stats: &TableStats, now: chrono::NaiveDateTime) {
        self.events_failed.set(stats.failed);
        self.events_pending.set(stats.pending);
        let age = stats
            .oldest_pending_created_at
            .map(|t| (now - t).num_milliseconds().max(0) as f64 / 1000.0)
            .unwrap_or(0.0);
        self.oldest_pending_age.set(age);
        if let Some(rows) = stats.estimated_rows {
            self.events_estimated_rows.set(rows);
        }
    }

    /// `outbox_consumer_lag` as (partition, lag), by partition number.
    pub fn consumer_lags(&self) -> Vec<(String, i64)> {
        use prometheus::core::Collector;
        let mut out: Vec<(String, i64)> = self
            .consumer_lag
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .filter_map(|m| {
                let partition = m.get_label().first()?.value().to_owned();
                Some((partition, m.get_gauge().get_value() as i64))
            })
            .collect();
        out.sort_by_key(|(p, _)| p.parse::<i64>().unwrap_or(i64::MAX));
        out
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let families = self.registry.gather();
        if let Err(e) = TextEncoder::new().encode(&families, &mut buf) {
            return format!("# encoding metrics failed: {e}\n");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every label value an emitter lists exists at zero from the start,
    /// and every family is rendered.
    #[test]
    fn every_listed_label_value_is_created_at_zero() {
        let text = Metrics::new().render();
        for (name, values) in precreated() {
            // A family with labels and no listed values has no series yet.
            let plain = values.is_empty() && !text.contains(&format!("{name}{{"));
            assert!(
                plain || text.contains(&format!("# TYPE {name} ")),
                "{name} missing"
            );
            for combination in combinations(&values.iter().map(Vec::as_slice).collect::<Vec<_>>()) {
                if combination.is_empty() {
                    continue;
                }
                let found = text.lines().any(|l| {
                    l.starts_with(&format!("{name}{{"))
                        && combination.iter().all(|v| l.contains(&format!("=\"{v}\"")))
                });
                assert!(found, "{name} {combination:?} not created at zero");
            }
        }
    }
}
