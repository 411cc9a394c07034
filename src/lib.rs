//! outbox-sidecar: delivers the rows of a transactional outbox that
//! Debezium announces on Kafka, as R-004 says.
//!
//! The data flow, and where each step lives:
//! 1. [`consumer`] reads the CDC topic in a consumer group and hands each
//!    record to [`cdc`], which decodes it — a pure function — into a
//!    trigger for a pending row, a skip, or an invalid record.
//! 2. [`consumer`] reads the triggered rows from the database in one query
//!    per poll ([`store`]) and starts one [`job`] per pending row, at most
//!    `dispatch.max_in_flight` at once, at most one per id.
//! 3. The [`job`] POSTs the row through the [`dispatch`] registry and turns
//!    the outcome into a transition: `mark_sent` (batched by
//!    [`store::batch`]) or `register_failure`, both conditional writes in
//!    [`store`]; a failure below `max_attempts` waits `retry_delay` and
//!    tries again.
//! 4. When a job ends, [`consumer::offsets`] lets its message be committed.
//!
//! Around it: [`admin`] (metrics, health, resend API), [`metrics`],
//! [`config`], [`cli`], [`app`] (wiring and shutdown), [`demo`].

#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod cdc;
pub mod cli;
pub mod config;
pub mod consumer;
pub mod demo;
pub mod dispatch;
pub mod job;
pub mod metrics;
pub mod store;
pub mod telemetry;
pub mod transition;
