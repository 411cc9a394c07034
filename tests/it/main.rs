//! The integration tests: real PostgreSQL / MariaDB / SQLite, a real
//! Kafka-protocol broker (librdkafka's mock cluster, or
//! `OUTBOX_TEST_KAFKA_BROKERS`) and real HTTP receivers.

mod cli;
mod db;
mod demo;
mod deploy;
mod harness;
mod pipeline;
mod process;
mod operations;
mod store;
