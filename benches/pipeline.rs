//! The whole-pipeline benchmark (placeholder: being written).
fn main() {}
