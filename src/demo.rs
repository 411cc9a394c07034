//! Demo placeholder.
pub async fn main(_args: crate::cli::DemoArgs) -> i32 {
    1
}
