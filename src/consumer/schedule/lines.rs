//! `[ordering]`: each aggregate's line. One event of an aggregate has work
//! here at a time (read, ready, running, retry waits included); its later
//! change events wait in the line in arrival order (Debezium's commit order
//! on the aggregate's partition), holding no payload and no read. An event
//! whose earlier event is not sent in the database is parked; after an
//! event something may have been parked behind, the aggregate's next
//! pending event is announced again (the driver touches it).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use tracing::debug;

use super::{Expect, Pos, Scheduler};
use crate::cdc::Trigger;

/// Triggers waiting in aggregates' lines (`[ordering]`) before fetching
/// holds. They hold no payload (an id and a position each), so a line may
/// grow long behind an aggregate whose head is retrying without holding
/// back the partitions' other aggregates.
pub const MAX_AGGREGATE_QUEUED: usize = 100_000;

/// The offset of a released event's position: no message of its own
/// (finishing it commits nothing).
pub const RELEASED: i64 = -1;

/// Pending events of a released aggregate read at once, in id order.
pub const RELEASE_BATCH: usize = 64;

/// An aggregate's line: one event decided at a time, in arrival order.
#[derive(Debug)]
pub(super) struct Line {
    pub(super) active: i64,
    pub(super) queue: VecDeque<(i64, Pos, Expect)>,
}

/// Every aggregate with work here, and what must be announced after whom.
#[derive(Debug, Default)]
pub(super) struct Aggregates {
    /// Each aggregate with work here: the one id it has work for, and the
    /// triggers of its later events, in arrival order.
    pub(super) lines: HashMap<Arc<str>, Line>,
    /// The aggregate of each id that is its aggregate's active one.
    pub(super) of: HashMap<i64, Arc<str>>,
    /// Triggers waiting in the lines.
    pub(super) queued: usize,
    /// Ids whose aggregate's next pending event must be announced again
    /// (the driver's to carry out).
    pub(super) announce: Vec<i64>,
    /// The message position of each id in `announce`: its aggregate's
    /// partition, for a release read here ([`Scheduler::release_pos`]).
    pub(super) announce_pos: HashMap<i64, Pos>,
    /// Ids after which, once they are sent (or fail under `on_failed =
    /// "skip"`), the aggregate's next pending event must be announced
    /// again: an event was parked behind them here, or they were decided
    /// on an event other than their insert on their aggregate's partition
    /// (see [`Expect::created`]), so one may have been parked elsewhere.
    pub(super) announce_after: HashSet<i64>,
    /// Released ids whose aggregate's next pending event was released with
    /// them and waits in their line: nothing to announce after them.
    pub(super) chained: HashSet<i64>,
}

impl Aggregates {
    /// Drops the lines of revoked partitions' triggers (`gone`).
    pub(super) fn drop_where(&mut self, gone: impl Fn(&Pos) -> bool) {
        let mut dropped = Vec::new();
        for line in self.lines.values_mut() {
            line.queue.retain(|(id, pos, _)| {
                let keep = !gone(pos);
                if !keep {
                    dropped.push(*id);
                }
                keep
            });
        }
        self.queued -= dropped.len();
        for id in dropped {
            self.chained.remove(&id);
        }
    }

    /// Drops the lines (shutdown); what is owed an announcement stays.
    pub(super) fn clear_waiting(&mut self) {
        self.lines.clear();
        self.of.clear();
        self.queued = 0;
        self.chained.clear();
    }
}

impl Scheduler {
    /// A change event announcing a pending row of `aggregate`
    /// (`[ordering]`): its aggregate decides one event at a time, in the
    /// order they arrive (Debezium's commit order on the aggregate's
    /// partition); the others wait in the aggregate's line, holding no
    /// payload and no read. Other aggregates go on as ever.
    pub fn trigger_in(&mut self, trigger: &Trigger, pos: Pos, aggregate: Option<&str>) {
        let Some(aggregate) = aggregate else {
            return self.trigger(trigger, pos);
        };
        if !self.current(&pos) {
            return;
        }
        self.line_or_admit(aggregate, trigger.id, pos, Expect::from(trigger));
    }

    /// `id` joins its aggregate's line, or is admitted as the line's
    /// active event (a new line when the aggregate has none here).
    fn line_or_admit(&mut self, aggregate: &str, id: i64, pos: Pos, expect: Expect) {
        if let Some(line) = self.ordering.lines.get_mut(aggregate) {
            if line.active != id {
                line.queue.push_back((id, pos, expect));
                self.ordering.queued += 1;
                return;
            }
        } else if !self.work.contains_key(&id) {
            let key: Arc<str> = Arc::from(aggregate);
            self.ordering.lines.insert(
                key.clone(),
                Line {
                    active: id,
                    queue: VecDeque::new(),
                },
            );
            self.ordering.of.insert(id, key);
        }
        self.admit(id, pos, expect);
    }

    /// `id` has no work here any more: if it was its aggregate's active
    /// event, the next one in the line is decided.
    pub(super) fn next_of_aggregate(&mut self, id: i64) {
        if self.work.contains_key(&id) {
            return;
        }
        let Some(key) = self.ordering.of.remove(&id) else {
            return;
        };
        loop {
            let Some(line) = self.ordering.lines.get_mut(&key) else {
                return;
            };
            let Some((next, pos, expect)) = line.queue.pop_front() else {
                self.ordering.lines.remove(&key);
                return;
            };
            self.ordering.queued -= 1;
            if !self.current(&pos) {
                continue;
            }
            if self.ordering.of.contains_key(&next) {
                // Already another line's active event (its aggregate's
                // and a release's at once): that line decides it (this
                // trigger waits as any for a busy id), and this line goes
                // on; its later events are read as any, and one that must
                // wait for it is parked behind it in the database. Making
                // it active here too would leave the other line waiting
                // for it for good.
                self.admit(next, pos, expect);
                continue;
            }
            if let Some(line) = self.ordering.lines.get_mut(&key) {
                line.active = next;
            }
            self.ordering.of.insert(next, key.clone());
            self.admit(next, pos, expect);
            if self.work.contains_key(&next) {
                return;
            }
            self.ordering.of.remove(&next);
        }
    }

    /// Ids whose aggregate's next pending event the driver must announce
    /// again, so an event parked behind them is decided: released here
    /// ([`Self::release_pos`]) or, failing that, touched.
    pub fn take_announcements(&mut self) -> Vec<i64> {
        std::mem::take(&mut self.ordering.announce)
    }

    /// Where the aggregate of `after` (announced by
    /// [`Self::take_announcements`]) may have its next pending event
    /// decided here, with no round trip through the change feed: a
    /// position on its partition while this replica still owns it
    /// (offset [`RELEASED`]: no message of its own to commit). `None`: the
    /// partition left, the driver touches the event for its next owner.
    pub fn release_pos(&mut self, after: i64) -> Option<Pos> {
        let pos = self.ordering.announce_pos.remove(&after)?;
        let generation = self.assignment.generation(pos.partition)?;
        Some(Pos {
            partition: pos.partition,
            generation,
            offset: RELEASED,
        })
    }

    /// An aggregate's next pending events after `after`, in id order,
    /// found by one release read ([`RELEASE_BATCH`] at most): each is
    /// decided as a change event would announce it (its read says whether
    /// anything earlier still holds it, so none is sent out of order), one
    /// after the other in a line of their own, so only the batch's last
    /// is followed by another release read. `false` when the partition
    /// left meanwhile: the driver touches the first for its next owner.
    pub fn released(&mut self, after: i64, ids: &[i64], pos: Pos) -> bool {
        if !self.current(&pos) {
            return false;
        }
        self.metrics
            .ordering_announced_total
            .inc_by(ids.len() as u64);
        let expect = Expect {
            attempts: None,
            updated_at: None,
            created: false,
        };
        // The line's key is the release's own: change events of the
        // aggregate keep theirs (its value as the topic's key); what may
        // not overtake what is the read's to say, as for any event.
        let key = format!("\u{0}released after {after}");
        for (i, &id) in ids.iter().enumerate() {
            if i + 1 < ids.len() {
                self.ordering.chained.insert(id);
            }
            self.line_or_admit(&key, id, pos, expect);
        }
        true
    }

    /// Announces `id`'s aggregate's next pending event once `id` is sent.
    pub(super) fn announce_after_ends(&mut self, id: i64) {
        if self.ordering.announce_after.len() >= MAX_AGGREGATE_QUEUED {
            // Ids that never ran here (a failed event never resent):
            // forgetting them costs the sweep's touch, a minute later.
            self.ordering.announce_after.clear();
        }
        self.ordering.announce_after.insert(id);
    }

    /// Triggers waiting in aggregates' lines.
    pub fn aggregate_queued(&self) -> usize {
        self.ordering.queued
    }

    /// Parks `id` behind `behind`, the earlier event of its aggregate that
    /// is not sent yet: no attempt used, the row stays pending, its message
    /// is finished (by the caller); it is announced again when `behind` is
    /// sent.
    pub(super) fn park_behind(&mut self, id: i64, behind: Option<i64>) {
        self.metrics.ordering_parked_total.inc();
        debug!(
            id,
            behind, "an earlier event of its aggregate is not sent yet: left pending"
        );
        if let Some(b) = behind {
            // Its end must announce this one, even if it was released with
            // its next (that next may be this one, decided in another line).
            self.ordering.chained.remove(&b);
            self.announce_after_ends(b);
        }
    }
}
