//! The integration tests: real PostgreSQL / MariaDB / SQLite, a real
//! Kafka-protocol broker (librdkafka's mock cluster, or
//! `OUTBOX_TEST_KAFKA_BROKERS`) and real HTTP receivers.

mod cli;
mod console;
mod broker;
mod consumer;
mod db;
mod debezium;
mod demo;
mod deploy;
mod faults;
mod harness;
mod history;
mod history_cost;
mod operations;
mod pg_tls;
mod pipeline;
mod process;
mod shapes;
mod signing;
mod slow_clients;
mod store;
mod tls;
