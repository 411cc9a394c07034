pub mod app;
pub mod cdc;
pub mod cli;
pub mod config;
pub mod demo;
pub mod store;
pub mod telemetry;
