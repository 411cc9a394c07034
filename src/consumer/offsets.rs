//! The one place that decides which Kafka offset may be committed.
//!
//! Convention: everything here speaks of the *next offset to consume*, the
//! value Kafka stores for a group — so the tracker's answer goes to
//! `store_offsets` as it is (which, unlike `store_offset`, adds no 1).
//! A partition may be committed up to, not including, its oldest message
//! whose work is unfinished.

use std::collections::BTreeSet;

#[derive(Debug, Default, Clone)]
pub struct PartitionOffsets {
    unfinished: BTreeSet<i64>,
    /// One past the highest offset seen.
    end: Option<i64>,
    /// The last value handed out by [`PartitionOffsets::take_committable`].
    stored: Option<i64>,
}

impl PartitionOffsets {
    /// A message arrived; its work is now outstanding.
    pub fn begin(&mut self, offset: i64) {
        self.unfinished.insert(offset);
        self.end = Some(self.end.map_or(offset + 1, |e| e.max(offset + 1)));
    }

    /// Its work is done (sent, failed or skipped).
    pub fn finish(&mut self, offset: i64) {
        self.unfinished.remove(&offset);
    }

    pub fn unfinished(&self) -> usize {
        self.unfinished.len()
    }

    /// The next offset to consume that is safe to commit, if any.
    pub fn committable(&self) -> Option<i64> {
        match self.unfinished.first() {
            Some(&oldest) => Some(oldest),
            None => self.end,
        }
        // Nothing seen yet means nothing of ours to commit.
        .filter(|_| self.end.is_some())
    }

    /// As [`committable`](Self::committable), but only when it moved since
    /// the last call, so each advance is stored once.
    pub fn take_committable(&mut self) -> Option<i64> {
        let c = self.committable()?;
        if self.stored.is_some_and(|s| s >= c) {
            return None;
        }
        self.stored = Some(c);
        Some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_seen_nothing_committable() {
        assert_eq!(PartitionOffsets::default().committable(), None);
    }

    #[test]
    fn finished_in_order_commits_past_the_last() {
        let mut p = PartitionOffsets::default();
        p.begin(10);
        p.begin(11);
        assert_eq!(p.committable(), Some(10));
        p.finish(10);
        assert_eq!(p.committable(), Some(11));
        p.finish(11);
        assert_eq!(
            p.committable(),
            Some(12),
            "next offset to consume, not the last done"
        );
    }

    #[test]
    fn an_unfinished_message_holds_back_later_finished_ones() {
        let mut p = PartitionOffsets::default();
        for o in 0..5 {
            p.begin(o);
        }
        for o in [1, 2, 3, 4] {
            p.finish(o);
        }
        assert_eq!(p.committable(), Some(0), "offset 0 is still running");
        p.finish(0);
        assert_eq!(p.committable(), Some(5));
    }

    #[test]
    fn take_committable_reports_each_advance_once() {
        let mut p = PartitionOffsets::default();
        p.begin(3);
        p.finish(3);
        assert_eq!(p.take_committable(), Some(4));
        assert_eq!(p.take_committable(), None);
        p.begin(4);
        assert_eq!(p.take_committable(), None, "4 is unfinished: still 4");
        p.finish(4);
        assert_eq!(p.take_committable(), Some(5));
    }
}
