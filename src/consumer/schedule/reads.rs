//! The rows the scheduler wants read: triggers waiting for a read, the
//! reads under way (at most [`MAX_CONCURRENT_READS`]), the re-reads due
//! later (a row not yet visible, a failed read), and the payload size seen
//! lately, which sizes each read to an eighth of the memory bound.

use std::collections::{HashMap, HashSet, VecDeque};

use tokio::time::Instant;

use super::{payload_bytes, Read, Wanted, FIRST_READ, MAX_CONCURRENT_READS, MAX_READ};
use crate::store::RowRead;

pub(super) struct Reads {
    pub(super) to_read: VecDeque<Wanted>,
    /// Reads under way, by ticket.
    pub(super) under_way: HashMap<u64, Vec<Wanted>>,
    /// Re-reads due, by id.
    pub(super) rechecks: HashMap<i64, (Instant, Wanted)>,
    /// Ids whose delete arrived while their row was being read: a missing
    /// row is then final, not read again.
    pub(super) deleted_while_reading: HashSet<i64>,
    next_ticket: u64,
    /// Mean payload bytes of the rows read lately (sizes the reads).
    row_bytes: usize,
    /// Whether `row_bytes` comes from rows read (else reads are small).
    sizes_seen: bool,
}

impl Default for Reads {
    fn default() -> Self {
        Reads {
            to_read: VecDeque::new(),
            under_way: HashMap::new(),
            rechecks: HashMap::new(),
            deleted_while_reading: HashSet::new(),
            next_ticket: 1,
            row_bytes: 1024,
            sizes_seen: false,
        }
    }
}

impl Reads {
    /// The re-reads due at `now`, taken out of `rechecks`.
    pub(super) fn take_rechecks(&mut self, now: Instant) -> Vec<Wanted> {
        let due: Vec<i64> = self
            .rechecks
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(id, _)| *id)
            .collect();
        due.into_iter()
            .filter_map(|id| self.rechecks.remove(&id).map(|(_, w)| w))
            .collect()
    }

    /// Reads of the triggers waiting, up to [`MAX_CONCURRENT_READS`] under
    /// way, each sized to an eighth of `max_buffered_bytes` by the payloads
    /// seen (small until one has been seen).
    pub(super) fn start(&mut self, max_buffered_bytes: usize) -> Vec<Read> {
        let mut out = Vec::new();
        let mut per_read = (max_buffered_bytes / 8 / self.row_bytes.max(1)).clamp(1, MAX_READ);
        if !self.sizes_seen {
            per_read = per_read.min(FIRST_READ);
        }
        while self.under_way.len() < MAX_CONCURRENT_READS && !self.to_read.is_empty() {
            let n = self.to_read.len().min(per_read);
            let batch: Vec<Wanted> = self.to_read.drain(..n).collect();
            let ticket = self.next_ticket;
            self.next_ticket += 1;
            out.push(Read {
                ticket,
                ids: batch.iter().map(|w| w.id).collect(),
            });
            self.under_way.insert(ticket, batch);
        }
        out
    }

    /// Rows read: their payload sizes move the mean (one read of large
    /// rows shrinks the next reads).
    pub(super) fn saw(&mut self, rows: &[RowRead]) {
        if rows.is_empty() {
            return;
        }
        let total: usize = rows.iter().map(read_bytes).sum();
        let mean = total / rows.len();
        self.row_bytes = if self.sizes_seen {
            (self.row_bytes + mean).div_ceil(2).max(mean / 2).max(64)
        } else {
            mean.max(64)
        };
        self.sizes_seen = true;
    }

    /// Triggers waiting for a read, in one, or for a re-read.
    pub(super) fn held(&self) -> usize {
        self.to_read.len()
            + self.rechecks.len()
            + self.under_way.values().map(Vec::len).sum::<usize>()
    }

    /// When the first re-read falls due.
    pub(super) fn next_recheck(&self) -> Option<Instant> {
        self.rechecks.values().map(|(at, _)| *at).min()
    }

    pub(super) fn clear_waiting(&mut self) {
        self.to_read.clear();
        self.rechecks.clear();
        self.deleted_while_reading.clear();
    }
}

fn read_bytes(r: &RowRead) -> usize {
    match r {
        RowRead::Row(row) => payload_bytes(&row.payload),
        RowRead::Undecodable { .. } => 64,
    }
}
