//! The client side of three limits, each in a process of its own.
//!
//! The cost-per-event goal compares the sidecar's CPU per event with the
//! client-side CPU of its parts. In the bench's process the clients share
//! threads with the mock broker and the receiver, so their CPU cannot be
//! told apart; the bench therefore runs raw consume, raw HTTP and the
//! batched UPDATE in a child (this same binary, told what to do through
//! [`PART_ENV`]), which reads its own utime+stime over the timed span and
//! prints one JSON line: the rate and the CPU seconds.

use serde::{Deserialize, Serialize};

use super::*;

/// The environment variable that makes this binary run one part.
pub(crate) const PART_ENV: &str = "OUTBOX_BENCH_CLIENT_PART";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Part {
    /// A `StreamConsumer` with the sidecar's configuration reading `n`
    /// messages of `topic`.
    Consume {
        brokers: String,
        topic: String,
        n: usize,
        properties: Vec<(String, String)>,
    },
    /// `n` POSTs with a client built like the dispatcher's.
    Http {
        url: String,
        n: usize,
        in_flight: usize,
    },
    /// Batched status writes of every row of `table`.
    Batched { db_url: String, table: String },
}

/// What the child prints.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct PartResult {
    /// Per second: messages, requests or rows.
    pub(crate) rate: f64,
    /// CPU seconds of the child over the timed span.
    pub(crate) cpu_s: f64,
    /// Messages, requests or rows done in that span.
    pub(crate) count: usize,
}

impl PartResult {
    /// Client CPU per unit, in µs.
    pub(crate) fn cpu_us_each(&self) -> f64 {
        self.cpu_s * 1e6 / self.count.max(1) as f64
    }
}

/// Runs `part` in a child process and reads its result.
pub(crate) async fn run_part(part: &Part) -> Result<PartResult> {
    let exe = std::env::current_exe().context("the bench's own path")?;
    let out = tokio::process::Command::new(exe)
        .env(PART_ENV, serde_json::to_string(part)?)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("running a client part")?;
    if !out.status.success() {
        bail!(
            "the client part {part:?} exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("the client part printed {text:?}"))
}

/// The child's side: runs the part named by [`PART_ENV`] and prints its
/// result. Returns false when the variable is not set.
pub(crate) fn child_main() -> bool {
    let Some(spec) = std::env::var_os(PART_ENV) else {
        return false;
    };
    let result = (|| -> Result<PartResult> {
        let part: Part = serde_json::from_str(&spec.to_string_lossy())
            .with_context(|| format!("{PART_ENV} holds no part"))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        runtime.block_on(run_here(part))
    })();
    match result {
        Ok(r) => {
            println!("{}", serde_json::to_string(&r).unwrap_or_default());
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}

fn cpu_s_since(ticks: u64, ticks_per_s: f64) -> f64 {
    (self_cpu_ticks().saturating_sub(ticks)) as f64 / ticks_per_s
}

async fn run_here(part: Part) -> Result<PartResult> {
    let ticks_per_s = clock_ticks();
    match part {
        Part::Consume {
            brokers,
            topic,
            n,
            properties,
        } => {
            let consumer = consumer(&brokers, &topic, "bench-raw", &properties, &[])?;
            let mut first = None;
            let mut bytes = 0usize;
            for count in 0..n {
                let msg = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
                    .await
                    .with_context(|| format!("raw consume: no message after {count} of {n}"))??;
                first.get_or_insert_with(|| (Instant::now(), self_cpu_ticks()));
                bytes += msg.payload().map_or(0, <[u8]>::len);
            }
            std::hint::black_box(bytes);
            let (t0, c0) = first.unwrap_or((Instant::now(), self_cpu_ticks()));
            let elapsed = t0.elapsed().as_secs_f64();
            Ok(PartResult {
                rate: n as f64 / elapsed.max(1e-9),
                cpu_s: cpu_s_since(c0, ticks_per_s),
                count: n,
            })
        }
        Part::Http { url, n, in_flight } => {
            let (rate, cpu_s) = raw_http(&url, n, in_flight, ticks_per_s).await?;
            Ok(PartResult {
                rate,
                cpu_s,
                count: n,
            })
        }
        Part::Batched { db_url, table } => {
            let store = Store::connect(&db_url, &table, POOL, Duration::from_secs(10)).await?;
            let (rate, cpu_s, rows) = batched_updates(&store, ticks_per_s).await?;
            Ok(PartResult {
                rate,
                cpu_s,
                count: rows,
            })
        }
    }
}
