//! The fixed label values of the metric families that the parts report
//! with names of their own: they live here, with the families, so the
//! parts import them from the metrics (downwards) and the metrics import
//! nothing from the parts that report to them.

/// Every `outbox_consumer_errors_total{kind}`: what the consumer's
/// `error_kind` returns, and `offset_reset` from librdkafka's log.
pub const CONSUMER_ERROR_KINDS: [&str; 7] = [
    "decompression",
    "corrupt_record",
    "offset_reset",
    "transport",
    "unknown_topic",
    "authorization",
    "other",
];

/// `outbox_consumer_rebalances_total{protocol}`.
pub const REBALANCE_PROTOCOLS: [&str; 2] = ["eager", "cooperative"];

/// `outbox_consumer_rebalances_total{kind}`.
pub const REBALANCE_KINDS: [&str; 3] = ["assign", "revoke", "lost"];

/// `outbox_revoke_held_requests_total{outcome}`: POSTs a revoke waited for
/// that wrote their status, and those given up at the hold limit.
pub const HELD_OUTCOMES: [&str; 2] = ["written", "given_up"];

/// The status writes a job makes, as `outbox_db_write_retries_total{to}`
/// and `outbox_status_writes_given_up_total{to}` name them.
pub const WRITES: [&str; 2] = ["sent", "failure"];

/// `outbox_cdc_skips_total{reason}` of the change events the scheduler
/// finishes without a job of their own (the consumer's `ScheduleSkip`),
/// beside the decoder's (`cdc::Skip::REASONS`).
pub const SCHEDULE_SKIP_REASONS: [&str; 2] = ["job_running", "row_missing"];
