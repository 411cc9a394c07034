//! A dispatcher's rate limit (`rate = "200/s"`, `burst`): the receiver's
//! limit, shared by the whole consumer group with no coordination service.
//!
//! Each replica takes the share of the partitions it owns
//! (`rate × owned / all partitions`, the burst likewise, at least 1), set
//! again at every assign and revoke; together the group never goes past
//! the limit. The token bucket is governor's GCRA. Jobs wait their turn in
//! a fair line (one polls the bucket at a time, in arrival order), before
//! they take a send slot: the wait uses no attempt and no slot, and other
//! dispatchers do not wait with it.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use governor::clock::{Clock, MonotonicClock};
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

type Bucket = RateLimiter<NotKeyed, InMemoryState, MonotonicClock>;

/// How often a job waiting for the limit looks again at its share (a
/// rebalance gives it another).
const RECHECK: Duration = Duration::from_millis(100);

/// A configured limit: `per_second` requests a second for the whole group,
/// with bursts of up to `burst`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub per_second: f64,
    pub burst: u32,
}

impl Rate {
    /// Parses `"200/s"`, `"3000/m"` or `"10000/h"` (a positive number, a
    /// slash, a unit); `burst` defaults to a tenth of a second's worth, at
    /// least 1.
    pub fn parse(rate: &str, burst: Option<u32>) -> Result<Rate, String> {
        let bad = || format!("{rate:?} is not a rate: write it as 200/s, 3000/m or 10000/h");
        let (n, unit) = rate.trim().split_once('/').ok_or_else(bad)?;
        let n: f64 = n.trim().parse().map_err(|_| bad())?;
        let per = match unit.trim() {
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        if !n.is_finite() || n <= 0.0 {
            return Err(bad());
        }
        let per_second = n / per;
        let burst = match burst {
            Some(0) => return Err("burst must be at least 1".to_owned()),
            Some(b) => b,
            None => ((per_second / 10.0).round() as u32).max(1),
        };
        Ok(Rate { per_second, burst })
    }

    /// This replica's part of the limit when it owns `owned` of `total`
    /// partitions; `None` when it owns none (it sends nothing then).
    pub fn share(&self, owned: usize, total: usize) -> Option<Rate> {
        if owned == 0 || total == 0 {
            return None;
        }
        let part = owned.min(total) as f64 / total as f64;
        Some(Rate {
            per_second: self.per_second * part,
            burst: ((self.burst as f64 * part).floor() as u32).max(1),
        })
    }

    /// The bucket of this rate. Its burst is one less than `burst` (but at
    /// least 1): the request that holds its turn while it waits for a send
    /// slot took its token before, and may leave together with the next
    /// ones, so the line itself adds one to what the bucket lets go.
    fn bucket(&self) -> Bucket {
        let period = Duration::from_secs_f64(1.0 / self.per_second);
        let burst = self.burst.saturating_sub(1).max(1);
        let quota = Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MAX))
            .allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN));
        RateLimiter::direct_with_clock(quota, MonotonicClock)
    }
}

/// What the console shows of a limit on this replica.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShareView {
    pub limit: Rate,
    /// `None`: this replica owns no partition.
    pub share: Option<Rate>,
    pub owned: usize,
    pub total: usize,
}

struct Current {
    share: Option<Rate>,
    owned: usize,
    total: usize,
    bucket: Option<Arc<Bucket>>,
}

/// One dispatcher's limit on this replica.
pub struct Throttle {
    limit: Rate,
    current: Mutex<Current>,
    /// Waiters in arrival order: only the head polls the bucket.
    line: tokio::sync::Mutex<()>,
}

impl Throttle {
    /// A limit with no share yet: nothing goes until the first assignment.
    pub fn new(limit: Rate) -> Throttle {
        Throttle {
            limit,
            current: Mutex::new(Current {
                share: None,
                owned: 0,
                total: 0,
                bucket: None,
            }),
            line: tokio::sync::Mutex::new(()),
        }
    }

    /// Takes the share of `owned` of `total` partitions. An unchanged share
    /// keeps its bucket (and what it has used of it).
    pub fn set_share(&self, owned: usize, total: usize) {
        let share = self.limit.share(owned, total);
        let mut c = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if c.share == share && c.bucket.is_some() == share.is_some() {
            c.owned = owned;
            c.total = total;
            return;
        }
        // A new share starts with its burst spent, but for the first: the
        // replicas that had the partitions before may have just used
        // theirs, and a rebalance must not let the group burst twice.
        let first = c.total == 0;
        let bucket = share.map(|s| {
            let b = s.bucket();
            if !first {
                for _ in 0..s.burst {
                    let _ = b.check();
                }
            }
            Arc::new(b)
        });
        *c = Current {
            share,
            owned,
            total,
            bucket,
        };
    }

    pub fn view(&self) -> ShareView {
        let c = self.current.lock().unwrap_or_else(|e| e.into_inner());
        ShareView {
            limit: self.limit,
            share: c.share,
            owned: c.owned,
            total: c.total,
        }
    }

    fn bucket(&self) -> Option<Arc<Bucket>> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .bucket
            .clone()
    }

    /// Takes a permit for one request now, or says how long until one may
    /// be asked for again (no share: `RECHECK`). Nothing waits here: the
    /// scheduler keeps the event's turn as an entry with that due time.
    pub fn try_take(&self) -> Result<(), Duration> {
        match self.bucket() {
            None => Err(RECHECK),
            Some(bucket) => bucket.check().map_err(|not_until| {
                not_until
                    .wait_time_from(bucket.clock().now())
                    .clamp(Duration::from_millis(1), RECHECK)
            }),
        }
    }

    /// Waits until this replica's share lets one more request go; returns
    /// its turn and how long it waited. The turn is held until the request
    /// has its send slot: the next in line takes no token before, so a
    /// wait for a slot cannot bunch requests past the limit (in any second
    /// at most `rate + burst + 1` leave). Dropping the future, or the turn,
    /// leaves the line.
    pub async fn wait(&self) -> (Turn<'_>, Duration) {
        let started = Instant::now();
        let turn = self.line.lock().await;
        loop {
            let pause = match self.bucket() {
                // No partition owned: no share to send with (a revoke under
                // way cancels this job, an assign gives a share).
                None => RECHECK,
                Some(bucket) => match bucket.check() {
                    Ok(()) => return (Turn(turn), started.elapsed()),
                    Err(not_until) => not_until.wait_time_from(bucket.clock().now()).min(RECHECK),
                },
            };
            tokio::time::sleep(pause).await;
        }
    }
}

/// A request's place at the head of its dispatcher's line.
pub struct Turn<'a>(#[allow(dead_code)] tokio::sync::MutexGuard<'a, ()>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rates_and_refuses_what_is_not_one() {
        let r = Rate::parse("200/s", None).unwrap();
        assert_eq!((r.per_second, r.burst), (200.0, 20));
        let r = Rate::parse("3000/m", Some(5)).unwrap();
        assert_eq!((r.per_second, r.burst), (50.0, 5));
        assert_eq!(Rate::parse("36/h", None).unwrap().burst, 1);
        for bad in ["200", "200/d", "-1/s", "0/s", "x/s", "NaN/s", ""] {
            let e = Rate::parse(bad, None).unwrap_err();
            assert!(e.contains("is not a rate"), "{bad}: {e}");
        }
        assert!(Rate::parse("1/s", Some(0)).is_err());
    }

    #[test]
    fn shares_never_add_up_to_more_than_the_limit() {
        let limit = Rate::parse("200/s", Some(10)).unwrap();
        assert_eq!(limit.share(0, 6), None);
        assert_eq!(limit.share(3, 0), None);
        let (a, b) = (limit.share(2, 6).unwrap(), limit.share(4, 6).unwrap());
        assert!((a.per_second + b.per_second - 200.0).abs() < 1e-9);
        assert!(a.burst + b.burst <= 10, "{a:?} {b:?}");
        assert_eq!(limit.share(6, 6), Some(limit));
        // Six replicas of one partition each: rate split, bursts of 1.
        let one = limit.share(1, 6).unwrap();
        assert!((one.per_second * 6.0 - 200.0).abs() < 1e-9);
        assert_eq!(one.burst, 1);
    }

    #[tokio::test]
    async fn a_share_lets_its_burst_go_at_once_then_paces() {
        let t = Throttle::new(Rate::parse("20/s", Some(4)).unwrap());
        t.set_share(3, 6); // 10/s, burst 2: a bucket of 1, and the line's 1
        let v = t.view();
        assert_eq!(v.share.unwrap().burst, 2);
        t.wait().await;
        // The burst used, the second waits about a tenth of a second.
        let (_, waited) = t.wait().await;
        assert!(waited >= Duration::from_millis(60), "{waited:?}");
        // An unchanged share keeps its bucket: still paced.
        t.set_share(3, 6);
        assert!(t.wait().await.1 >= Duration::from_millis(60));
    }

    #[test]
    fn a_permit_is_taken_at_once_or_its_wait_is_told() {
        let t = Throttle::new(Rate::parse("10/s", Some(2)).unwrap());
        assert_eq!(t.try_take(), Err(RECHECK), "no share, no permit");
        t.set_share(1, 1); // 10/s: a bucket of 1
        assert_eq!(t.try_take(), Ok(()));
        let wait = t.try_take().unwrap_err();
        assert!(
            wait > Duration::from_millis(50) && wait <= RECHECK,
            "{wait:?}"
        );
    }

    #[tokio::test]
    async fn a_waiter_with_no_share_goes_once_a_share_is_given() {
        let t = Arc::new(Throttle::new(Rate::parse("100/s", None).unwrap()));
        let waiter = tokio::spawn({
            let t = t.clone();
            async move { t.wait().await.1 }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        // While one holds its turn, the next in line waits.
        t.set_share(1, 2);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("goes once it has a share")
            .unwrap();
    }
}
