//! outbox-sidecar: delivers the rows of a transactional outbox that
//! Debezium announces on Kafka, as R-004 says.
//!
//! The data flow, and where each step lives:
//! 1. [`consumer`] reads the CDC topic in a consumer group and hands each
//!    record to [`cdc`], which decodes it — a pure function — into a
//!    trigger for a pending row, a skip, or an invalid record.
//! 2. [`consumer::schedule`] decides what to do with each trigger — with
//!    no Kafka and no database in it: the rows to read (off the loop, many
//!    ids per query, again later when a row is not visible yet), one
//!    [`job`] per attempt, at most `dispatch.max_in_flight` sending at once
//!    and at most one per id, the offsets that may be committed, when to
//!    pause fetching. Each part of its state is a struct of its own: the
//!    partitions and their generations (`schedule::assignment`), the reads
//!    (`schedule::reads`), what waits for time to pass, as entries with no
//!    payload (`schedule::waits`: a retry, a rate-limited dispatcher's
//!    turn, its limiter's permit), fetching's holds and pauses
//!    (`schedule::flow`) and, with `[ordering]`, each aggregate's line
//!    (`schedule::lines`; an aggregate released by a resend is read here
//!    event after event). [`consumer`] is the thin driver around
//!    librdkafka that carries those decisions out.
//! 3. The [`job`] makes one attempt: holds ([`hold`]: pause, breaker),
//!    POST through the [`dispatch`] registry (trace context from
//!    [`tracer`] and [`trace_context`]), then the outcome as a transition
//!    ([`transition`], R-004's decision table as pure functions):
//!    `mark_sent` or `register_failure`, conditional writes batched by
//!    [`store::batch`]; a failure below `max_attempts` ends the job with a
//!    retry, due `retry_delay` later in the scheduler.
//! 4. When an event's last job ends, [`consumer::offsets`] lets its message
//!    be committed.
//!
//! A job runs under its partition's [`lease`]: a revoke or the shutdown
//! cancels it and waits for the POSTs under way to write their status
//! ([`consumer::group`], no Kafka in it) before the partitions go.
//!
//! Around it: [`admin`] (metrics, health, resend API), [`console`] (the
//! operators' web pages on the admin API's listener), [`metrics`] (the
//! families and, in `metrics::labels`, their fixed label values: the
//! parts import them, the metrics import nothing of the parts),
//! [`config`], [`cli`], [`app`] (wiring and shutdown), [`demo`].

#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod backlog;
pub mod cdc;
pub mod cli;
pub mod config;
pub mod console;
pub mod consumer;
pub mod demo;
pub mod dispatch;
pub mod hold;
pub mod http;
pub mod job;
pub mod lease;
pub mod metrics;
pub mod operations;
pub mod operator;
pub mod replay;
pub mod replay_cli;
pub mod store;
pub mod telemetry;
pub mod trace_context;
pub mod tracer;
pub mod transition;
pub mod why;
