//! The partitions this replica holds: each assignment of a partition is a
//! generation, and each message is begun and finished in its partition's
//! [`PartitionOffsets`], stamped with the generation it came from, so a
//! message of an earlier assignment never moves the next one's offsets.

use std::collections::HashMap;

use tracing::info;

use super::super::offsets::PartitionOffsets;
use super::Pos;

struct Partition {
    generation: u64,
    offsets: PartitionOffsets,
}

pub(super) struct Assignment {
    partitions: HashMap<i32, Partition>,
    next_generation: u64,
}

impl Default for Assignment {
    fn default() -> Self {
        Assignment {
            partitions: HashMap::new(),
            next_generation: 1,
        }
    }
}

impl Assignment {
    /// Partitions assigned: each one not held yet starts a new generation
    /// (one already held keeps its generation and offsets).
    pub(super) fn assign(&mut self, parts: &[i32]) {
        for &p in parts {
            if self.partitions.contains_key(&p) {
                continue;
            }
            let generation = self.next_generation;
            self.next_generation += 1;
            self.partitions.insert(
                p,
                Partition {
                    generation,
                    offsets: PartitionOffsets::default(),
                },
            );
        }
    }

    pub(super) fn revoke(&mut self, parts: &[i32]) {
        for &p in parts {
            if let Some(state) = self.partitions.remove(&p) {
                info!(
                    partition = p,
                    unfinished = state.offsets.unfinished(),
                    "partition revoked"
                );
            }
        }
    }

    /// Begins a message of `partition`; `None` when it is not held.
    pub(super) fn begin(&mut self, partition: i32, offset: i64) -> Option<Pos> {
        let state = self.partitions.get_mut(&partition)?;
        state.offsets.begin(offset);
        Some(Pos {
            partition,
            generation: state.generation,
            offset,
        })
    }

    /// The message's work is done (nothing when its assignment is over).
    pub(super) fn finish(&mut self, pos: &Pos) {
        if let Some(state) = self.partitions.get_mut(&pos.partition) {
            if state.generation == pos.generation {
                state.offsets.finish(pos.offset);
            }
        }
    }

    /// Whether `pos` is of the partition's current assignment.
    pub(super) fn current(&self, pos: &Pos) -> bool {
        self.partitions
            .get(&pos.partition)
            .is_some_and(|s| s.generation == pos.generation)
    }

    /// The current generation of `partition`, if held.
    pub(super) fn generation(&self, partition: i32) -> Option<u64> {
        self.partitions.get(&partition).map(|s| s.generation)
    }

    pub(super) fn take_commits(&mut self) -> Vec<(i32, i64)> {
        self.partitions
            .iter_mut()
            .filter_map(|(p, s)| s.offsets.take_committable().map(|o| (*p, o)))
            .collect()
    }

    pub(super) fn commits(&self) -> Vec<(i32, i64)> {
        self.partitions
            .iter()
            .filter_map(|(p, s)| s.offsets.committable().map(|o| (*p, o)))
            .collect()
    }

    pub(super) fn partitions(&self) -> Vec<i32> {
        self.partitions.keys().copied().collect()
    }
}
