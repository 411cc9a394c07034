//! Wiring placeholder.
use crate::config::Settings;
pub async fn run_until_stopped(_settings: Settings) -> i32 { 1 }
