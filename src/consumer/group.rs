//! The partition-lease protocol: which partitions this member holds, the
//! [`Lease`] each one's jobs run under, and what giving partitions up waits
//! for. No Kafka in it: the rebalance callback ([`super::client`]) turns
//! each of librdkafka's callbacks into one call here, as arroyo's
//! `AsyncAssignmentCallbacks` does, the driver carries out the answers, and
//! the unit tests (`group_tests.rs`) drive it by hand.
//!
//! - [`Group::assigned`] gives each newly assigned partition a fresh lease;
//!   a job starts under [`Group::lease`].
//! - [`Group::revoke`] cancels the revoked partitions' leases (none of
//!   their jobs starts a POST from then on) and returns a [`Revocation`]:
//!   the POSTs already under way, which must write their status before the
//!   partitions are given up, so that the next owner reads those rows
//!   decided and does not send them again.
//! - [`Group::close`] does the same for every partition when the sidecar
//!   stops.
//!
//! One wait, [`Revocation::wait`], serves all three, as the one draining
//! state of Vector's Kafka source serves revoke and shutdown: an eager
//! revoke waits in the rebalance callback (librdkafka gives the partitions
//! up when it returns); a cooperative one is handed off and waited for off
//! the loop while the kept partitions go on, and the driver gives the
//! partitions up afterwards; the drain waits for every POST. The revoked
//! partitions not yet given up are the draining state: the close's wait
//! covers them too.
//!
//! The [`Phase`] decides who waits. Once the sidecar is closing, a revoke
//! no longer waits and a waiting one ends: the drain waits for the same
//! POSTs, so nothing is waited for twice. Once closed (the driver is gone),
//! nothing waits.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::lease::Lease;
use crate::metrics::Metrics;

pub use crate::metrics::labels::HELD_OUTCOMES;

/// Where the consumer is in its life, as far as waiting for POSTs goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A revoke waits for the POSTs under way before the partitions go.
    Running,
    /// Shutdown began: revokes do not wait and waiting ones end; the
    /// drain's wait ([`Group::close`]) covers their POSTs.
    Closing,
    /// The driver is gone (drained, or dropped without draining): nothing
    /// waits, not even the drain's wait.
    Closed,
}

/// How librdkafka revoked partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoke {
    /// Every partition, given up when the rebalance callback returns.
    Eager,
    /// Some partitions, given up by the driver once their POSTs wrote
    /// their status (a hand-off): the kept ones go on meanwhile.
    Cooperative,
    /// The session timed out: the partitions are someone else's already.
    Lost,
}

/// The partitions of one consumer and the leases of their jobs.
#[derive(Debug)]
pub struct Group {
    /// How long a revocation waits for the POSTs under way (the drain
    /// timeout).
    hold_limit: Duration,
    /// Read by every wait, several times a second: a lock of its own, never
    /// held while another is taken.
    phase: Mutex<Phase>,
    /// The leases, assigned and draining.
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The assigned partitions' leases.
    leases: HashMap<i32, Arc<Lease>>,
    /// Revoked partitions not yet given up.
    draining: BTreeMap<i32, Draining>,
}

/// A revoked partition not yet given up.
#[derive(Debug)]
struct Draining {
    /// Its lease, if it had one (cancelled).
    lease: Option<Arc<Lease>>,
    /// The driver gives it up (a cooperative hand-off), not librdkafka when
    /// the callback returns.
    hand_off: bool,
}

/// What a [`Revocation`] is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Waited for, if at all, in the rebalance callback: librdkafka gives
    /// the partitions up when it returns.
    Revoke,
    /// Waited for off the loop; the driver gives the partitions up after.
    HandOff,
    /// The drain's.
    Close,
}

/// Partitions whose leases were cancelled, and the POSTs under way that
/// must write their status before the partitions are given up.
#[derive(Debug)]
pub struct Revocation {
    /// Its phase, its limit, its draining state.
    group: Arc<Group>,
    /// Who waits for it, and who gives its partitions up.
    kind: Kind,
    /// The partitions revoked (at close: those handed off and not given up
    /// yet, which the drain gives up).
    parts: Vec<i32>,
    /// The cancelled leases whose POSTs are waited for.
    leases: Vec<Arc<Lease>>,
    /// POSTs under way when the leases were cancelled.
    busy: usize,
    /// Whether [`Revocation::wait`] blocks.
    waits: bool,
}

/// What a [`Revocation::wait`] achieved.
#[derive(Debug, Default)]
pub struct Held {
    /// The partitions the driver gives up now: a hand-off's, or at close
    /// those handed off and not given up yet (none after an eager revoke:
    /// librdkafka gives those up when the callback returns).
    pub parts: Vec<i32>,
    /// POSTs under way when the wait began.
    pub busy: usize,
    /// POSTs still under way when it ended.
    pub left: usize,
    /// How long it waited.
    pub waited: Duration,
    /// A revoke's wait that ran to its end (not the drain's, and not one
    /// the shutdown ended): the revoke-held counters count it.
    counted: bool,
}

impl Group {
    /// A group whose revocations wait up to `hold_limit`.
    pub fn new(hold_limit: Duration) -> Arc<Self> {
        Arc::new(Group {
            hold_limit,
            phase: Mutex::new(Phase::Running),
            state: Mutex::default(),
        })
    }

    /// Where the consumer is in its life.
    pub fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Partitions assigned (incrementally under the cooperative protocol:
    /// those already held keep their lease and jobs). A partition not held
    /// gets a fresh lease (a revoke took the old one away); while closing,
    /// none.
    pub fn assigned(&self, parts: &[i32]) {
        if self.phase() != Phase::Running {
            return;
        }
        let mut state = self.state();
        for &p in parts {
            state.leases.entry(p).or_default();
        }
    }

    /// The lease a job of `partition` starts under (`None`: not assigned).
    pub fn lease(&self, partition: i32) -> Option<Arc<Lease>> {
        self.state().leases.get(&partition).cloned()
    }

    /// Cancels the leases of `parts` and returns what giving them up waits
    /// for. A lost assignment does not wait: the rows are the next owner's
    /// already. While closing nothing waits: the drain does.
    pub fn revoke(self: &Arc<Self>, parts: &[i32], how: Revoke) -> Revocation {
        let running = self.phase() == Phase::Running;
        let mut state = self.state();
        let revoked: Vec<(i32, Option<Arc<Lease>>)> =
            parts.iter().map(|p| (*p, state.leases.remove(p))).collect();
        let leases: Vec<Arc<Lease>> = revoked.iter().filter_map(|(_, l)| l.clone()).collect();
        // All cancelled first: none starts a POST while another is waited for.
        for lease in &leases {
            lease.cancel();
        }
        let busy = leases.iter().map(|l| l.busy()).sum();
        let kind = if how == Revoke::Cooperative && running {
            Kind::HandOff
        } else {
            Kind::Revoke
        };
        let waits = busy > 0 && how != Revoke::Lost && running;
        if kind == Kind::HandOff || waits {
            let hand_off = kind == Kind::HandOff;
            for (p, lease) in revoked {
                state.draining.insert(p, Draining { lease, hand_off });
            }
        }
        Revocation {
            group: self.clone(),
            kind,
            parts: parts.to_vec(),
            leases,
            busy,
            waits,
        }
    }

    /// The driver gave handed-off partitions up: they leave the draining
    /// state.
    pub fn handed_off(&self, parts: &[i32]) {
        let mut state = self.state();
        for p in parts {
            if state.draining.get(p).is_some_and(|d| d.hand_off) {
                state.draining.remove(p);
            }
        }
    }

    /// The sidecar stops: every lease is cancelled (no POST starts from
    /// here on), revokes stop waiting, and the returned revocation waits
    /// for every POST under way, the draining partitions' too. Calling it
    /// again changes nothing and returns the same wait.
    pub fn close(self: &Arc<Self>) -> Revocation {
        let closed = {
            let mut phase = self.phase.lock().unwrap_or_else(|e| e.into_inner());
            if *phase == Phase::Running {
                *phase = Phase::Closing;
            }
            *phase == Phase::Closed
        };
        let state = self.state();
        let leases: Vec<Arc<Lease>> = state
            .leases
            .values()
            .cloned()
            .chain(state.draining.values().filter_map(|d| d.lease.clone()))
            .collect();
        for lease in &leases {
            lease.cancel();
        }
        let busy = leases.iter().map(|l| l.busy()).sum();
        let parts = state
            .draining
            .iter()
            .filter(|(_, d)| d.hand_off)
            .map(|(p, _)| *p)
            .collect();
        Revocation {
            group: self.clone(),
            kind: Kind::Close,
            parts,
            leases,
            busy,
            waits: busy > 0 && !closed,
        }
    }

    /// The driver is gone: nothing waits any more.
    pub fn closed(&self) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = Phase::Closed;
    }
}

impl Revocation {
    /// The driver gives the partitions up after the wait (a cooperative
    /// hand-off), not librdkafka when the callback returns.
    pub fn hands_off(&self) -> bool {
        self.kind == Kind::HandOff
    }

    /// Whether [`Revocation::wait`] blocks: POSTs are under way and they
    /// are this wait's to wait for.
    pub fn waits(&self) -> bool {
        self.waits
    }

    /// POSTs under way when the leases were cancelled.
    pub fn busy(&self) -> usize {
        self.busy
    }

    /// Whether the phase ended this wait: the shutdown ends a revoke's
    /// (the drain waits instead), only the end of the driver the drain's.
    fn ended(&self) -> bool {
        match self.group.phase() {
            Phase::Running => false,
            Phase::Closing => self.kind != Kind::Close,
            Phase::Closed => true,
        }
    }

    /// Blocks the calling thread until the POSTs under way wrote their
    /// status, the hold limit passed, or the phase ended the wait. The one
    /// wait of the protocol: the rebalance callback runs it in place, the
    /// hand-off and the drain on a blocking thread.
    pub fn wait(self) -> Held {
        let parts = match self.kind {
            Kind::Revoke => Vec::new(),
            Kind::HandOff | Kind::Close => self.parts.clone(),
        };
        if !self.waits {
            return Held {
                parts,
                busy: self.busy,
                left: self.busy,
                ..Held::default()
            };
        }
        if self.kind != Kind::Close {
            info!(
                partitions = ?self.parts,
                requests = self.busy,
                "partitions revoked: waiting for their requests in flight to write their status"
            );
        }
        let started = Instant::now();
        let deadline = started + self.group.hold_limit;
        let stop = || self.ended();
        let left: usize = self
            .leases
            .iter()
            .map(|l| l.revoke_and_wait(deadline.saturating_duration_since(Instant::now()), stop))
            .sum();
        let stopped = left > 0 && self.ended();
        Held {
            parts,
            busy: self.busy,
            left,
            waited: started.elapsed(),
            counted: self.kind != Kind::Close && !stopped,
        }
    }
}

impl Drop for Revocation {
    /// An eager revoke's partitions are given up when its wait ends: they
    /// leave the draining state, unless the shutdown ended the wait (the
    /// drain's wait covers their POSTs then).
    fn drop(&mut self) {
        if self.kind != Kind::Revoke || !self.waits || self.group.phase() != Phase::Running {
            return;
        }
        let mut state = self.group.state();
        for p in &self.parts {
            if state.draining.get(p).is_some_and(|d| !d.hand_off) {
                state.draining.remove(p);
            }
        }
    }
}

impl Held {
    /// Counts and logs what a revoke's wait achieved
    /// (`outbox_revoke_held_requests_total`): nothing for a revoke that
    /// did not wait, a wait the shutdown ended, or the drain's.
    pub fn count(&self, metrics: &Metrics) {
        if !self.counted || self.busy == 0 {
            return;
        }
        let held = &metrics.revoke_held_requests_total;
        let [written, given_up] = HELD_OUTCOMES;
        held.with_label_values(&[written])
            .inc_by(self.busy.saturating_sub(self.left) as u64);
        held.with_label_values(&[given_up]).inc_by(self.left as u64);
        if self.left > 0 {
            warn!(
                requests = self.left,
                waited = ?self.waited,
                "revoke: requests still in flight after the drain timeout; the next owner may send them again"
            );
        } else {
            info!(
                waited = ?self.waited,
                "revoke: requests in flight finished; partitions given up"
            );
        }
    }
}

#[cfg(test)]
#[path = "group_tests.rs"]
mod tests;
