//! Fault injection (issue #9): the sidecar under broker, database, HTTP,
//! crash, rebalance, replay, bad-input and security faults.
//!
//! Every scenario settles (every row `sent` or `failed`, every offset
//! committed) and then hands the table, the receiver's request log and the
//! change events to one checker, [`check::check`], which prints one line of
//! figures and fails on any breach of CONTRACT §5/§7: a row left pending, a
//! request after `sent_at`, `attempts` above `max_attempts`, `failed` without
//! exactly `max_attempts` requests, attempts closer than `retry_delay`, or a
//! duplicate that no crash or revoke explains.
//!
//! Counts grow with `OUTBOX_FAULT_SCALE` (default 1; `make test-faults`
//! uses 10). Mock-only faults skip, saying why, when
//! `OUTBOX_TEST_KAFKA_BROKERS` names a real broker.

mod broker;
pub mod check;
mod cooperative;
mod crash;
mod database;
mod http;
mod input;
mod outage;
mod rebalance;
mod security;
pub mod setup;
