//! The integration tests: real PostgreSQL / MariaDB / SQLite, a real
//! Kafka-protocol broker (librdkafka's mock cluster, tansu with
//! `OUTBOX_TEST_BROKER=tansu`, or `OUTBOX_TEST_KAFKA_BROKERS`; see
//! docs/brokers.md) and real HTTP receivers.

mod breaker;
mod broker;
mod cli;
mod console;
mod consumer;
mod db;
mod debezium;
mod demo;
mod deploy;
mod faults;
mod harness;
mod history;
mod history_cost;
mod oauth2;
mod openapi;
mod operations;
mod ordering;
mod pg_tls;
mod pipeline;
mod process;
mod rate;
mod readme;
mod replay;
mod shapes;
mod signing;
mod slow_clients;
mod store;
mod tls;
mod tracing;
mod why;
