//! The group's backlog, as the background loops need it: the moment the
//! whole consumer group was last seen with nothing left to read. A pending
//! row changed after that moment may have its change event still in the
//! backlog (or in flight: the group commits an offset only once its
//! message is decided), so neither `outbox_pending_unexplained` counts it
//! nor the ordering sweep announces it again; a row changed before it had
//! its change event read, and waits for some other reason.
//!
//! Under steady traffic the group is never caught up at the moment it is
//! asked, so each read keeps the topic's end offsets with their time: the
//! answer is the latest such time whose end offsets the group has
//! committed past on every partition.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::NaiveDateTime;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tracing::debug;

use crate::config::KafkaSettings;
use crate::store::now;

/// How long each of the broker's answers may take.
const ANSWER: Duration = Duration::from_secs(5);
/// End offsets kept, one set per read.
const SAMPLES: usize = 256;

/// The topic's end offset of each partition, read at `at`.
type Sample = (NaiveDateTime, Vec<(i32, i64)>);

/// The group's lag read through a client of its own (it never joins).
#[derive(Clone)]
pub struct Backlog {
    inner: Arc<Inner>,
}

struct Inner {
    consumer: Option<BaseConsumer>,
    topic: String,
    /// What the reads saw: the end offsets not yet passed, oldest first,
    /// and the latest time the group had read everything before.
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    samples: VecDeque<Sample>,
    read_before: Option<NaiveDateTime>,
}

impl Seen {
    /// Adds what one read saw (end offsets at `at`, the group's committed
    /// offsets now) and answers [`Backlog::read_before`].
    fn add(
        &mut self,
        at: NaiveDateTime,
        ends: Vec<(i32, i64)>,
        committed: &[(i32, i64)],
    ) -> Option<NaiveDateTime> {
        if self.samples.len() == SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back((at, ends));
        let passed = |ends: &[(i32, i64)]| {
            ends.iter()
                .all(|(p, end)| committed.iter().any(|(q, c)| q == p && c >= end) || *end == 0)
        };
        if let Some(i) = self.samples.iter().rposition(|(_, ends)| passed(ends)) {
            self.read_before = Some(self.samples[i].0);
            self.samples.drain(..=i);
        }
        self.read_before
    }
}

impl Backlog {
    pub fn new(settings: &KafkaSettings) -> Backlog {
        let consumer = crate::consumer::client::client_config(settings)
            .create::<BaseConsumer>()
            .map_err(|e| debug!(error = %e, "no client to read the group's lag"))
            .ok();
        Backlog {
            inner: Arc::new(Inner {
                consumer,
                topic: settings.topic.clone(),
                seen: Mutex::new(Seen::default()),
            }),
        }
    }

    /// The time before which every change event has been read by the
    /// group: now when it has no lag (or its lag cannot be read: then
    /// nothing is assumed), else the latest read whose end offsets it has
    /// passed (`None`: none since this replica started, so any row may be
    /// in the backlog).
    pub async fn read_before(&self) -> Option<NaiveDateTime> {
        let started = now();
        let inner = self.inner.clone();
        let offsets = tokio::task::spawn_blocking(move || inner.offsets())
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
        match offsets {
            Ok((ends, committed)) => self
                .inner
                .seen
                .lock()
                .unwrap()
                .add(started, ends, &committed),
            Err(e) => {
                debug!(error = %e, "cannot read the group's lag");
                Some(started)
            }
        }
    }
}

impl Inner {
    /// Each partition's end offset, and the group's committed offset.
    #[allow(clippy::type_complexity)]
    fn offsets(&self) -> Result<(Vec<(i32, i64)>, Vec<(i32, i64)>), String> {
        let consumer = self.consumer.as_ref().ok_or("no client")?;
        let md = consumer
            .fetch_metadata(Some(&self.topic), ANSWER)
            .map_err(|e| e.to_string())?;
        let mut tpl = TopicPartitionList::new();
        for t in md.topics().iter().filter(|t| t.name() == self.topic) {
            for p in t.partitions() {
                tpl.add_partition(&self.topic, p.id());
            }
        }
        let committed = consumer
            .committed_offsets(tpl, ANSWER)
            .map_err(|e| e.to_string())?;
        let mut ends = Vec::new();
        let mut at = Vec::new();
        for e in committed.elements() {
            let (low, high) = consumer
                .fetch_watermarks(&self.topic, e.partition(), ANSWER)
                .map_err(|e| e.to_string())?;
            let c = match e.offset() {
                Offset::Offset(o) => o,
                _ => low,
            };
            ends.push((e.partition(), high));
            at.push((e.partition(), c.max(low)));
        }
        Ok((ends, at))
    }
}

#[cfg(test)]
mod tests {
    use super::Seen;
    use chrono::NaiveDateTime;

    fn t(s: i64) -> NaiveDateTime {
        chrono::DateTime::from_timestamp(1_800_000_000 + s, 0)
            .unwrap()
            .naive_utc()
    }

    #[test]
    fn the_latest_read_whose_ends_the_group_passed_is_the_answer() {
        let mut seen = Seen::default();
        // Caught up at once.
        assert_eq!(
            seen.add(t(0), vec![(0, 10), (1, 5)], &[(0, 10), (1, 5)]),
            Some(t(0))
        );
        // Behind on partition 1 at every read: the answer stays.
        assert_eq!(
            seen.add(t(10), vec![(0, 20), (1, 9)], &[(0, 20), (1, 7)]),
            Some(t(0))
        );
        assert_eq!(
            seen.add(t(20), vec![(0, 30), (1, 12)], &[(0, 25), (1, 9)]),
            Some(t(10))
        );
        // Past the ends of t(20) though not of now (steady traffic).
        assert_eq!(
            seen.add(t(30), vec![(0, 40), (1, 15)], &[(0, 30), (1, 12)]),
            Some(t(20))
        );
        // An empty partition never holds an answer back.
        let mut empty = Seen::default();
        assert_eq!(empty.add(t(0), vec![(0, 0)], &[]), Some(t(0)));
        // Never caught up since the start: every row may be in the backlog.
        let mut behind = Seen::default();
        assert_eq!(behind.add(t(0), vec![(0, 10)], &[(0, 3)]), None);
    }
}
