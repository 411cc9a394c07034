//! Prometheus metrics: one registry owned by [`Metrics`], passed to every
//! part that reports. Label sets are small and fixed: `event_name` is the
//! configured name or `unregistered`, never a free string from a row.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use entity::Status;

use crate::cdc::{Decision, Skip};
use crate::store::TableStats;

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

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub events_failed: IntGauge,
    pub events_pending: IntGauge,
    pub oldest_pending_age: Gauge,
    /// `outbox_events_estimated_rows`: the table's size as the database
    /// estimates it (no exact count of the sent history: a scan).
    pub events_estimated_rows: IntGauge,
    pub dispatch_total: IntCounterVec,
    pub transitions_total: IntCounterVec,
    pub dispatch_duration: HistogramVec,
    pub cdc_messages_total: IntCounterVec,
    pub cdc_skips_total: IntCounterVec,
    pub inflight_events: IntGauge,
    pub consumer_lag: IntGaugeVec,
    pub consumer_paused: IntGauge,
    pub consumer_pauses_total: prometheus::IntCounter,
    pub revoke_held_requests_total: IntCounterVec,
    /// Rebalance callbacks by protocol (`eager`, `cooperative`) and what
    /// they did (`assign`, `revoke`, `lost`): shows which protocol the
    /// group runs, e.g. during the two-step switch to cooperative-sticky.
    pub consumer_rebalances_total: IntCounterVec,
    pub db_write_retries_total: IntCounterVec,
    pub cdc_rows_visible_late_total: prometheus::IntCounter,
    pub rows_never_visible_total: prometheus::IntCounter,
    pub row_reads_failed_total: prometheus::IntCounter,
    pub job_panics_total: prometheus::IntCounter,
    pub status_writes_given_up_total: IntCounterVec,
    pub history_writes_failed_total: prometheus::IntCounter,
    pub signing_secret_reload_failures_total: IntCounterVec,
    /// Seconds jobs waited for their dispatcher's rate limit.
    pub dispatcher_throttled_seconds_total: prometheus::CounterVec,
    /// This replica's share of each rate-limited dispatcher's limit.
    pub dispatcher_rate_share: prometheus::GaugeVec,
    pub consumer_errors_total: IntCounterVec,
    /// What `/readyz` answers, for clusters that do not probe it (the
    /// shipped Deployment): set on every scrape.
    pub ready: IntGauge,
    pub dead_letters_in_flight: IntGauge,
    pub database_up: IntGauge,
    /// 1 while a dispatcher is paused (group-wide, from the pause table).
    pub dispatcher_paused: IntGaugeVec,
    /// How long a paused dispatcher has been paused; 0 when it is not.
    pub dispatcher_paused_seconds: prometheus::GaugeVec,
    /// 0 closed, 1 open, 2 half-open (this replica's breaker).
    pub dispatcher_breaker_state: IntGaugeVec,
    /// Events left pending because their dispatcher was paused.
    pub events_parked_total: IntCounterVec,
    /// `outbox_cdc_messages_total` by result, resolved once.
    cdc_results: [(&'static str, IntCounter); 3],
    /// `outbox_cdc_skips_total` by reason, resolved once.
    cdc_skip_reasons: [(&'static str, IntCounter); 7],
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
        let reg = |c: Box<dyn prometheus::core::Collector>| must(registry.register(c));
        let events_failed = must(IntGauge::new(
            "outbox_events_failed",
            "Rows in the outbox table with status failed",
        ));
        let events_pending = must(IntGauge::new(
            "outbox_events_pending",
            "Rows in the outbox table with status pending",
        ));
        let oldest_pending_age = must(Gauge::new(
            "outbox_oldest_pending_age_seconds",
            "Age of the oldest pending row (by created_at), 0 when none",
        ));
        let events_estimated_rows = must(IntGauge::new(
            "outbox_events_estimated_rows",
            "Rows in the outbox table, all statuses, as the database's statistics estimate \
             them (PostgreSQL reltuples, MySQL table_rows); not an exact count",
        ));
        let dispatch_total = must(IntCounterVec::new(
            Opts::new("outbox_dispatch_total", "Dispatch attempts by outcome"),
            &["event_name", "outcome"],
        ));
        let transitions_total = must(IntCounterVec::new(
            Opts::new(
                "outbox_transitions_total",
                "Status writes by the sidecar, by target status",
            ),
            &["event_name", "to"],
        ));
        let dispatch_duration = must(HistogramVec::new(
            HistogramOpts::new(
                "outbox_dispatch_duration_seconds",
                "Duration of one HTTP dispatch",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            &["dispatcher"],
        ));
        let cdc_messages_total = must(IntCounterVec::new(
            Opts::new(
                "outbox_cdc_messages_total",
                "Change events consumed, by result (triggered, skipped, invalid)",
            ),
            &["result"],
        ));
        let cdc_skips_total = must(IntCounterVec::new(
            Opts::new("outbox_cdc_skips_total", "Change events skipped, by reason"),
            &["reason"],
        ));
        let inflight_events = must(IntGauge::new(
            "outbox_inflight_events",
            "Events being sent or having their status written (jobs holding an in-flight slot)",
        ));
        let consumer_lag = must(IntGaugeVec::new(
            Opts::new(
                "outbox_consumer_lag",
                "Consumer lag per assigned partition, from librdkafka statistics",
            ),
            &["partition"],
        ));
        let consumer_paused = must(IntGauge::new(
            "outbox_consumer_paused",
            "1 while fetching is paused: events wait for jobs that are not finishing",
        ));
        let consumer_pauses_total = must(prometheus::IntCounter::new(
            "outbox_consumer_pauses_total",
            "Times fetching was paused because events waited for jobs that were not finishing",
        ));
        let revoke_held_requests_total = must(IntCounterVec::new(
            Opts::new(
                "outbox_revoke_held_requests_total",
                "Requests in flight a partition revoke waited for: status written before the \
                 partitions were given up, or given up at the drain timeout (the next owner may \
                 send those again)",
            ),
            &["outcome"],
        ));
        let consumer_rebalances_total = must(IntCounterVec::new(
            Opts::new(
                "outbox_consumer_rebalances_total",
                "Rebalance callbacks of this member, by rebalance protocol (eager, cooperative) \
                 and kind (assign, revoke, lost)",
            ),
            &["protocol", "kind"],
        ));
        let db_write_retries_total = must(IntCounterVec::new(
            Opts::new(
                "outbox_db_write_retries_total",
                "Status writes retried after a database error",
            ),
            &["to"],
        ));
        let cdc_rows_visible_late_total = must(prometheus::IntCounter::new(
            "outbox_cdc_rows_visible_late_total",
            "Rows found missing or older than their change event at first, read again until \
             they were visible (logical decoding ships a commit before it is visible)",
        ));
        let rows_never_visible_total = must(prometheus::IntCounter::new(
            "outbox_rows_never_visible_total",
            "Change events whose row was still missing, or older than the event, at \
             dispatch.row_visibility_timeout: decided on the row as read (it may need \
             events retrigger)",
        ));
        let row_reads_failed_total = must(prometheus::IntCounter::new(
            "outbox_row_reads_failed_total",
            "Batched reads of triggered rows that failed or passed their deadline (made again)",
        ));
        let job_panics_total = must(prometheus::IntCounter::new(
            "outbox_job_panics_total",
            "Dispatch jobs that panicked (their message is left for the next owner)",
        ));
        let status_writes_given_up_total = must(IntCounterVec::new(
            Opts::new(
                "outbox_status_writes_given_up_total",
                "Status writes the database refused try after try (data or constraint errors); \
                 the row keeps its last state",
            ),
            &["to"],
        ));
        reg(Box::new(status_writes_given_up_total.clone()));
        for to in ["sent", "failure"] {
            status_writes_given_up_total.with_label_values(&[to]);
        }
        let history_writes_failed_total = must(prometheus::IntCounter::new(
            "outbox_history_writes_failed_total",
            "Attempt-log rows the database refused (table renamed or dropped, a privilege \
             revoked, no partition); their status was written without them",
        ));
        reg(Box::new(history_writes_failed_total.clone()));
        let signing_secret_reload_failures_total = must(IntCounterVec::new(
            Opts::new(
                "outbox_signing_secret_reload_failures_total",
                "Reloads of a dispatcher's signing_secret_file that failed (unreadable, or no \
                 valid secret); it signs with the last good secrets",
            ),
            &["dispatcher"],
        ));
        reg(Box::new(signing_secret_reload_failures_total.clone()));
        let dispatcher_throttled_seconds_total = must(prometheus::CounterVec::new(
            Opts::new(
                "outbox_dispatcher_throttled_seconds_total",
                "Seconds events waited for their dispatcher's rate limit (this replica's share of \
                 rate), summed over the events waiting; no attempt used, no send slot held",
            ),
            &["dispatcher"],
        ));
        reg(Box::new(dispatcher_throttled_seconds_total.clone()));
        let dispatcher_rate_share = must(prometheus::GaugeVec::new(
            Opts::new(
                "outbox_dispatcher_rate_share",
                "Requests per second this replica may send to a rate-limited dispatcher: its \
                 share of rate by the partitions it owns (the group's shares add up to rate)",
            ),
            &["dispatcher"],
        ));
        reg(Box::new(dispatcher_rate_share.clone()));
        let consumer_errors_total = must(IntCounterVec::new(
            Opts::new(
                "outbox_consumer_errors_total",
                "Errors librdkafka returned to the consumer, by kind (decompression, corrupt_record, \
                 offset_reset, transport, unknown_topic, authorization, other)",
            ),
            &["kind"],
        ));
        reg(Box::new(consumer_errors_total.clone()));
        for k in [
            "decompression",
            "corrupt_record",
            "offset_reset",
            "transport",
            "other",
        ] {
            consumer_errors_total.with_label_values(&[k]);
        }
        reg(Box::new(cdc_rows_visible_late_total.clone()));
        reg(Box::new(rows_never_visible_total.clone()));
        reg(Box::new(row_reads_failed_total.clone()));
        reg(Box::new(job_panics_total.clone()));
        let dead_letters_in_flight = must(IntGauge::new(
            "outbox_dead_letters_in_flight",
            "Dead-letter sends under way (each keeps its record in memory until delivered or \
             given up); fetching holds at 1,000",
        ));
        reg(Box::new(dead_letters_in_flight.clone()));
        let ready = must(IntGauge::new(
            "outbox_ready",
            "1 when the consumer holds its group assignment (an empty one counts) and the \
             database answered its last check: what /readyz answers",
        ));
        let database_up = must(IntGauge::new(
            "outbox_database_up",
            "1 when the last read of the table gauges reached the database",
        ));
        let dispatcher_paused = must(IntGaugeVec::new(
            Opts::new(
                "outbox_dispatcher_paused",
                "1 while the dispatcher is paused (outbox-sidecar dispatchers pause): its events stay pending",
            ),
            &["dispatcher"],
        ));
        let dispatcher_paused_seconds = must(prometheus::GaugeVec::new(
            Opts::new(
                "outbox_dispatcher_paused_seconds",
                "Seconds since the dispatcher was paused; 0 when it is not",
            ),
            &["dispatcher"],
        ));
        let dispatcher_breaker_state = must(IntGaugeVec::new(
            Opts::new(
                "outbox_dispatcher_breaker_state",
                "This replica's breaker of the dispatcher: 0 closed, 1 open (events held), 2 half-open (one probe)",
            ),
            &["dispatcher"],
        ));
        let events_parked_total = must(IntCounterVec::new(
            Opts::new(
                "outbox_events_parked_total",
                "Events left pending, no attempt used, because their dispatcher was paused; resumed through the change feed",
            ),
            &["dispatcher"],
        ));
        reg(Box::new(dispatcher_paused.clone()));
        reg(Box::new(dispatcher_paused_seconds.clone()));
        reg(Box::new(dispatcher_breaker_state.clone()));
        reg(Box::new(events_parked_total.clone()));
        reg(Box::new(ready.clone()));
        reg(Box::new(database_up.clone()));
        reg(Box::new(events_failed.clone()));
        reg(Box::new(events_pending.clone()));
        reg(Box::new(oldest_pending_age.clone()));
        reg(Box::new(events_estimated_rows.clone()));
        reg(Box::new(dispatch_total.clone()));
        reg(Box::new(transitions_total.clone()));
        reg(Box::new(dispatch_duration.clone()));
        reg(Box::new(cdc_messages_total.clone()));
        reg(Box::new(cdc_skips_total.clone()));
        reg(Box::new(inflight_events.clone()));
        reg(Box::new(consumer_lag.clone()));
        reg(Box::new(consumer_paused.clone()));
        reg(Box::new(consumer_pauses_total.clone()));
        reg(Box::new(revoke_held_requests_total.clone()));
        reg(Box::new(consumer_rebalances_total.clone()));
        reg(Box::new(db_write_retries_total.clone()));
        // Known series start at zero so dashboards and alerts see them.
        let cdc_results =
            Decision::RESULTS.map(|r| (r, cdc_messages_total.with_label_values(&[r])));
        let cdc_skip_reasons = Skip::REASONS.map(|r| (r, cdc_skips_total.with_label_values(&[r])));
        for o in ["written", "given_up"] {
            revoke_held_requests_total.with_label_values(&[o]);
        }
        Self {
            registry,
            events_failed,
            events_pending,
            oldest_pending_age,
            events_estimated_rows,
            dispatch_total,
            transitions_total,
            dispatch_duration,
            cdc_messages_total,
            cdc_skips_total,
            inflight_events,
            consumer_lag,
            consumer_paused,
            consumer_pauses_total,
            revoke_held_requests_total,
            consumer_rebalances_total,
            db_write_retries_total,
            cdc_rows_visible_late_total,
            rows_never_visible_total,
            row_reads_failed_total,
            job_panics_total,
            status_writes_given_up_total,
            history_writes_failed_total,
            signing_secret_reload_failures_total,
            dispatcher_throttled_seconds_total,
            dispatcher_rate_share,
            consumer_errors_total,
            dead_letters_in_flight,
            ready,
            database_up,
            dispatcher_paused,
            dispatcher_paused_seconds,
            dispatcher_breaker_state,
            events_parked_total,
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
