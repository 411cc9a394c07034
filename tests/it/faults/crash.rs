//! Crashes: the binary killed with SIGKILL at chosen and at random moments,
//! restarted each time — while a 2xx is on its way back (a slow receiver
//! widens the window between a 2xx and its status write), during a retry
//! wait, and at random — 20 cycles per `OUTBOX_FAULT_SCALE`.

use crate::harness::child::{crash, spawn, write_config};
use std::process::Child;
use std::time::{Duration, Instant};

use outbox_sidecar::store::now;
use wiremock::ResponseTemplate;

use super::check::{all_rows, check, Spec};
use super::setup::{insert_many, prepare, scale, seed, settle_rows, Rng, T};
use crate::harness::{eventually, Options, Receiver};

/// How long a 2xx takes to come back: a kill within this window after the
/// request arrived lands between the 2xx and its status write.
const SLOW_2XX: Duration = Duration::from_millis(400);

fn signal(child: &Child, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {}", child.id());
}

/// Polls `cond` until true or `limit`; whether it came true.
async fn until<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_and_restart() {
    // Every third event fails its first attempt (a retry wait follows);
    // every 2xx comes back slowly.
    let receiver = Receiver::start(|r| {
        if r.id % 3 == 0 && r.nth == 0 {
            ResponseTemplate::new(503).set_delay(Duration::from_millis(100))
        } else {
            ResponseTemplate::new(200).set_delay(SLOW_2XX)
        }
    })
    .await;
    let opts = Options {
        retry_delay: "1s",
        max_in_flight: 4,
        ..Options::default()
    };
    let t = prepare(opts, receiver, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&t, dir.path());
    let log = dir.path().join("sidecar.log");
    let started = Instant::now();
    let cycles = 20 * scale();
    let mut rng = Rng::new(seed(0xC2A5_0009));
    let mut kills = Vec::with_capacity(cycles);
    // For the checker's replay log: when each process started, and where
    // each kill landed.
    let mut starts = Vec::with_capacity(cycles + 1);
    let mut notes = Vec::with_capacity(cycles);
    let (mut in_flight, mut in_retry_wait, mut at_random, mut missed) = (0, 0, 0, 0);
    for cycle in 0..cycles {
        insert_many(&t, 3, "crash").await;
        let cycle_start = now();
        starts.push(cycle_start);
        let s = spawn(&config, &log);
        let note = match cycle % 3 {
            0 => {
                // A request arrived, its 2xx is not back yet.
                let hit = until(Duration::from_secs(10), || async {
                    let horizon = now() - chrono::Duration::from_std(SLOW_2XX / 2).unwrap();
                    t.receiver
                        .requests()
                        .iter()
                        .rev()
                        .take(8)
                        .any(|r| r.at > cycle_start && r.at > horizon && r.status < 300)
                })
                .await;
                if hit {
                    in_flight += 1;
                    "a 2xx in flight".to_owned()
                } else {
                    missed += 1;
                    "no 2xx in flight within 10 s".to_owned()
                }
            }
            1 => {
                // A failure written by this process: its row waits to retry.
                let hit = until(Duration::from_secs(10), || async {
                    all_rows(&t).await.iter().any(|r| {
                        r.status == entity::Status::Pending
                            && r.attempts > 0
                            && r.updated_at > cycle_start
                    })
                })
                .await;
                if hit {
                    in_retry_wait += 1;
                    "a retry wait".to_owned()
                } else {
                    missed += 1;
                    "no retry wait within 10 s".to_owned()
                }
            }
            _ => {
                at_random += 1;
                let after = rng.below(4000);
                tokio::time::sleep(Duration::from_millis(after)).await;
                "at random".to_owned()
            }
        };
        let killed = crash(s);
        notes.push(format!(
            "kill {} of process {}: {note}, {} ms after its start",
            cycle + 1,
            cycle + 1,
            (killed - cycle_start).num_milliseconds()
        ));
        kills.push(killed);
    }
    let crash_phase = started.elapsed();
    // A last start finishes everything; then a clean stop.
    starts.push(now());
    let mut last = spawn(&config, &log);
    crate::harness::wait_ready("the last sidecar to be ready", &last.base, T).await;
    settle_rows(&t, T).await;
    t.wait_all_committed(&t.group, T).await;
    signal(&last.child, "-TERM");
    let exit = eventually("the last sidecar to exit", T, || {
        let r = last.child.try_wait().unwrap();
        async move { r }
    })
    .await;
    assert_eq!(exit.code(), Some(0));
    println!(
        "faults crashes: {cycles} SIGKILLs in {crash_phase:?} ({in_flight} with a 2xx in flight, \
         {in_retry_wait} in a retry wait, {at_random} at random, {missed} conditions not met in 10s)"
    );
    let mut spec = Spec::new("SIGKILL + restart", &t);
    spec.faults = cycles;
    spec.disruptions = kills;
    spec.disruption_notes = notes;
    spec.starts = starts;
    check(&t, &spec).await;
    assert!(
        in_flight + in_retry_wait >= cycles / 3,
        "too few kills landed where intended: {in_flight} in flight, {in_retry_wait} in retry waits"
    );
}
