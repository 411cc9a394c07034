//! A partition's lease on the jobs it started: the one thing a job and a
//! revoke share.
//!
//! A job runs under its partition's [`Lease`]. When the partition is
//! revoked (or the sidecar stops) the lease is cancelled: a job stops at
//! its next safe point and starts no POST. A POST that already started
//! counts as [`Busy`] until its status is written, and the revoke waits for
//! those ([`crate::consumer::group`]), so the partition's next owner finds
//! their rows decided and does not send them again.
//!
//! The check that lets a POST start and the count a revoke waits on share
//! one lock: a POST either starts before the revoke, and is waited for, or
//! not at all.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// How often a blocked wait looks at its `stop` condition.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// A partition's hold on the jobs it started: cancelled when the partition
/// is revoked or the sidecar stops; counts the jobs between the start of a
/// POST and its status write, which a revoke waits for.
#[derive(Debug, Default)]
pub struct Lease {
    /// Cancelled on revoke or shutdown: jobs stop at their next safe point.
    cancel: CancellationToken,
    /// POSTs (or their status writes) under way.
    busy: Mutex<usize>,
    /// Signalled when `busy` drops to zero.
    idle: Condvar,
}

impl Lease {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// Marks a POST and its status write as under way, unless the lease is
    /// cancelled: checked under the same lock a revoke waits on, so a
    /// POST either starts before the revoke (and is waited for) or not at
    /// all.
    pub fn enter(&self) -> Option<Busy<'_>> {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        if self.cancel.is_cancelled() {
            return None;
        }
        *busy += 1;
        Some(Busy(self))
    }

    /// How many POSTs (or their status writes) are under way.
    pub fn busy(&self) -> usize {
        *self.busy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Cancels the lease, then blocks the calling thread until no POST is
    /// under way, `limit` has passed, or `stop()` says so (checked at least
    /// every 100 ms); returns how many POSTs still are under way.
    pub fn revoke_and_wait(&self, limit: Duration, stop: impl Fn() -> bool) -> usize {
        self.cancel();
        let deadline = Instant::now() + limit;
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        while *busy > 0 && !stop() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            busy = self
                .idle
                .wait_timeout(busy, left.min(STOP_CHECK))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *busy
    }
}

/// A POST and its status write under way, counted by its [`Lease`].
pub struct Busy<'a>(&'a Lease);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut busy = self.0.busy.lock().unwrap_or_else(|e| e.into_inner());
        *busy -= 1;
        if *busy == 0 {
            self.0.idle.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_cancelled_lease_starts_no_post() {
        let lease = Lease::new();
        let busy = lease.enter().expect("not cancelled yet");
        assert_eq!(lease.busy(), 1);
        lease.cancel();
        assert!(lease.enter().is_none(), "no POST starts after the revoke");
        drop(busy);
        assert_eq!(lease.busy(), 0);
    }

    #[test]
    fn a_revoke_waits_for_the_posts_under_way() {
        let lease = Arc::new(Lease::new());
        let (entered, wait_entered) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let worker = {
            let lease = lease.clone();
            std::thread::spawn(move || {
                let busy = lease.enter().expect("entered");
                entered.send(()).unwrap();
                released.recv().unwrap();
                drop(busy);
            })
        };
        wait_entered.recv().unwrap();
        // Not released: the wait ends at its limit with the POST counted,
        // or at once when told to stop (shutdown).
        assert_eq!(
            lease.revoke_and_wait(Duration::from_millis(50), || false),
            1
        );
        assert_eq!(lease.revoke_and_wait(Duration::from_secs(30), || true), 1);
        release.send(()).unwrap();
        // Released: the wait ends when the POST's status is written.
        assert_eq!(lease.revoke_and_wait(Duration::from_secs(30), || false), 0);
        worker.join().unwrap();
    }
}
