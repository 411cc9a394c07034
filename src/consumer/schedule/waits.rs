//! What waits in the scheduler for time to pass, each kind in one place,
//! as entries with no payload and no task:
//!
//! - [`DueEntries`]: rows to read again at a due time: a retry (the
//!   attempt failed: `retry_delay`, or the receiver's `Retry-After` when
//!   honoured), a row read before its retry is due (a restart, another
//!   replica's attempt), a hold that could not be confirmed. At the due
//!   time the id takes the same read → decide path as a fresh event.
//! - [`RateLine`]: a rate-limited dispatcher's events waiting for a permit
//!   of its limiter (this replica's share of `rate`). Most are ids only;
//!   a few rows at the head are read ahead, so a permit starts a job at
//!   once. A job starts only with a permit: a throttled backlog holds no
//!   job, no task and no payload beyond the head.
//!
//! Both count against [`MAX_WAITING`]: beyond it fetching holds, so what
//! waits here is bounded in memory (tens of bytes an entry).

use std::collections::{BTreeMap, HashMap, VecDeque};

use entity::OutboxEventRow;
use tokio::time::Instant;

use super::{Pos, Wanted};

/// Entries (due rows and rate-limited ids) the scheduler keeps before
/// fetching holds: ~100 bytes each with their offsets, so at most a few MiB.
pub const MAX_WAITING: usize = 20_000;

/// Rows a rate line reads ahead of its permits (their payloads are held).
pub const LINE_ROWS: usize = 16;

/// Everything that waits here for time to pass.
#[derive(Debug, Default)]
pub(super) struct Waits {
    /// Rows to read again at a due time (retries).
    pub(super) due: DueEntries,
    /// Rate-limited dispatchers' events waiting for a permit.
    pub(super) lines: Vec<RateLine>,
    /// Ids being read again for a rate line (its index).
    pub(super) refill_of: HashMap<i64, usize>,
}

impl Waits {
    /// Entries with no payload: retries due later and rate-limited ids.
    pub(super) fn entries(&self) -> usize {
        self.due.len() + self.lines.iter().map(|l| l.ids.len()).sum::<usize>()
    }

    /// Rows read ahead at the rate lines' heads (their payloads held).
    pub(super) fn rows_read_ahead(&self) -> usize {
        self.lines.iter().map(|l| l.rows.len()).sum()
    }

    /// Events waiting for their dispatcher's rate, read ahead or not.
    pub(super) fn rate_waiting(&self) -> usize {
        self.lines.iter().map(RateLine::waiting).sum()
    }

    /// When the first retry falls due, or a line may ask for a permit.
    pub(super) fn next_at(&self) -> Option<Instant> {
        self.due
            .next()
            .into_iter()
            .chain(
                self.lines
                    .iter()
                    .filter(|l| !l.rows.is_empty())
                    .filter_map(|l| l.next_at),
            )
            .min()
    }

    /// An id read again for a rate line is back (or gone).
    pub(super) fn refilled(&mut self, id: i64) {
        if let Some(i) = self.refill_of.remove(&id) {
            let line = &mut self.lines[i];
            line.refilling = line.refilling.saturating_sub(1);
        }
    }
}

/// Rows to read again at a due time.
#[derive(Debug, Default)]
pub(super) struct DueEntries {
    by_time: BTreeMap<(Instant, i64), Wanted>,
    at: HashMap<i64, Instant>,
}

impl DueEntries {
    pub(super) fn insert(&mut self, due: Instant, w: Wanted) {
        if let Some(old) = self.at.insert(w.id, due) {
            self.by_time.remove(&(old, w.id));
        }
        self.by_time.insert((due, w.id), w);
    }

    pub(super) fn remove(&mut self, id: i64) -> Option<Wanted> {
        let at = self.at.remove(&id)?;
        self.by_time.remove(&(at, id))
    }

    /// The entries due at `now`, earliest first.
    pub(super) fn take_due(&mut self, now: Instant) -> Vec<Wanted> {
        let mut out = Vec::new();
        while let Some(entry) = self.by_time.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let w = entry.remove();
            self.at.remove(&w.id);
            out.push(w);
        }
        out
    }

    /// When `id`'s entry falls due.
    pub(super) fn at(&self, id: i64) -> Option<Instant> {
        self.at.get(&id).copied()
    }

    pub(super) fn next(&self) -> Option<Instant> {
        self.by_time.keys().next().map(|(at, _)| *at)
    }

    pub(super) fn len(&self) -> usize {
        self.by_time.len()
    }

    /// Drops the entries `gone` says of; returns their ids.
    pub(super) fn drop_where(&mut self, gone: impl Fn(&Pos) -> bool) -> Vec<i64> {
        let ids: Vec<i64> = self
            .by_time
            .values()
            .filter(|w| gone(&w.pos))
            .map(|w| w.id)
            .collect();
        for id in &ids {
            self.remove(*id);
        }
        ids
    }
}

/// One rate-limited dispatcher's events waiting for a permit.
#[derive(Debug)]
pub(super) struct RateLine {
    /// The dispatcher (the metric's label).
    pub(super) dispatcher: String,
    /// An event name of the dispatcher, to ask for its permits.
    pub(super) event_name: String,
    /// Waiting, not read: ids and their messages only.
    pub(super) ids: VecDeque<Wanted>,
    /// Read ahead: started as permits are granted.
    pub(super) rows: VecDeque<(OutboxEventRow, Pos, usize)>,
    /// Ids of this line being read again (coming back to `rows`).
    pub(super) refilling: usize,
    /// When to ask for a permit again (`None`: at once).
    pub(super) next_at: Option<Instant>,
    /// Up to when the line's waiting was counted in
    /// `outbox_dispatcher_throttled_seconds_total`.
    pub(super) counted_at: Instant,
}

impl RateLine {
    pub(super) fn new(dispatcher: &str, event_name: &str, now: Instant) -> Self {
        RateLine {
            dispatcher: dispatcher.to_owned(),
            event_name: event_name.to_owned(),
            ids: VecDeque::new(),
            rows: VecDeque::new(),
            refilling: 0,
            next_at: None,
            counted_at: now,
        }
    }

    /// Events of this line waiting here.
    pub(super) fn waiting(&self) -> usize {
        self.ids.len() + self.rows.len() + self.refilling
    }

    /// Ids to read ahead now.
    pub(super) fn to_refill(&self) -> usize {
        LINE_ROWS
            .saturating_sub(self.rows.len() + self.refilling)
            .min(self.ids.len())
    }
}
