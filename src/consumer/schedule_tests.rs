//! The scheduler's decisions, driven by hand: no broker, no database, a
//! clock that moves only when a test says so.

use super::*;
use crate::cdc::Op;

const T0: &str = "2026-12-01T10:00:00";

fn ts(offset_ms: i64) -> NaiveDateTime {
    NaiveDateTime::parse_from_str(T0, "%Y-%m-%dT%H:%M:%S").unwrap()
        + chrono::Duration::milliseconds(offset_ms)
}

fn row(id: i64, status: Status, attempts: i32, updated_ms: i64) -> OutboxEventRow {
    OutboxEventRow {
        id,
        event_name: "accounts.purchase_create".into(),
        payload: serde_json::json!({"n": id}).to_string().into(),
        status,
        attempts,
        last_error: None,
        sent_at: None,
        created_at: ts(0),
        updated_at: ts(updated_ms),
        traceparent: None,
        tracestate: None,
        sequence: None,
    }
}

fn trig(id: i64, attempts: i32, updated_ms: i64) -> Trigger {
    Trigger {
        id,
        op: Op::Create,
        attempts: Some(attempts),
        updated_at: Some(ts(updated_ms)),
    }
}

fn pending(id: i64) -> RowRead {
    RowRead::Row(row(id, Status::Pending, 0, 0))
}

struct Harness {
    s: Scheduler,
    now: Instant,
    metrics: Metrics,
}

impl Harness {
    fn new(max_in_flight: usize) -> Self {
        Self::with_bytes(max_in_flight, 64 << 20)
    }

    fn with_bytes(max_in_flight: usize, max_buffered_bytes: usize) -> Self {
        let metrics = Metrics::new();
        let now = Instant::now();
        let limits = Limits {
            max_in_flight,
            visibility_timeout: Duration::from_secs(30),
            max_buffered_bytes,
        };
        let mut s = Scheduler::new(limits, metrics.clone(), now);
        s.assign(&[0, 1]);
        Harness { s, now, metrics }
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// Collects a trigger for `id` at `offset` of partition 0.
    fn message(&mut self, offset: i64, t: &Trigger) -> Pos {
        let pos = self.s.begin(0, offset).expect("assigned");
        self.s.trigger(t, pos);
        pos
    }

    fn skip(&mut self, offset: i64) -> Pos {
        let pos = self.s.begin(0, offset).expect("assigned");
        self.s.finish(&pos);
        pos
    }

    /// Makes the one read due now and answers it with `rows`.
    fn answer(&mut self, rows: Vec<RowRead>) -> Read {
        let mut reads = self.s.take_reads(self.now);
        assert_eq!(reads.len(), 1, "one read due: {reads:?}");
        let read = reads.remove(0);
        self.s.rows_read(read.ticket, Ok(rows), self.now);
        read
    }

    /// Answers every read due, until none is, each row as `read` says.
    fn read_all(&mut self, read: impl Fn(i64) -> RowRead) {
        loop {
            let reads = self.s.take_reads(self.now);
            if reads.is_empty() {
                return;
            }
            for r in reads {
                let rows = r.ids.iter().map(|&id| read(id)).collect();
                self.s.rows_read(r.ticket, Ok(rows), self.now);
            }
        }
    }

    /// The jobs to start now, with no rate limits.
    fn starts(&mut self) -> Vec<Start> {
        self.s.take_starts(self.now, &NoLimits)
    }

    fn commit(&self, partition: i32) -> Option<i64> {
        self.s
            .commits()
            .into_iter()
            .find(|(p, _)| *p == partition)
            .map(|(_, o)| o)
    }

    fn skips(&self, reason: &str) -> u64 {
        self.metrics
            .cdc_skips_total
            .with_label_values(&[reason])
            .get()
    }
}

#[test]
fn a_pending_row_becomes_a_job_and_its_end_commits_the_message() {
    let mut h = Harness::new(4);
    let pos = h.message(0, &trig(1, 0, 0));
    assert_eq!(h.answer(vec![pending(1)]).ids, vec![1]);
    let starts = h.starts();
    assert_eq!(starts.len(), 1);
    assert_eq!(starts[0].row.id, 1);
    assert_eq!(h.commit(0), Some(0), "not committed while the job runs");
    h.s.job_ended(1, starts[0].serial, &pos, true, h.now);
    assert_eq!(h.commit(0), Some(1));
    assert!(h.s.busy_ids().is_empty());
}

#[test]
fn triggers_for_a_running_id_wait_and_are_decided_once_from_the_database() {
    let mut h = Harness::new(4);
    let first = h.message(0, &trig(1, 0, 0));
    h.answer(vec![pending(1)]);
    let job = h.starts().remove(0);
    // Two echoes of the job's own writes arrive while it runs.
    h.message(1, &trig(1, 1, 10));
    h.message(2, &trig(1, 2, 20));
    assert!(
        h.s.take_reads(h.now).is_empty(),
        "nothing read while the job runs"
    );
    assert_eq!(h.skips("job_running"), 2);
    h.s.job_ended(1, job.serial, &first, true, h.now);
    assert_eq!(
        h.commit(0),
        Some(2),
        "the newest echo waits for its re-decision; the older one, which it covers, is finished"
    );
    // One read decides the id again: the job wrote `sent`.
    let mut sent = row(1, Status::Sent, 0, 30);
    sent.sent_at = Some(ts(30));
    let read = h.answer(vec![RowRead::Row(sent)]);
    assert_eq!(read.ids, vec![1]);
    assert_eq!(h.skips("stale"), 1);
    assert_eq!(h.commit(0), Some(3), "every echo is finished");
    assert!(h.starts().is_empty());
}

/// A resend committed while a job of the same id runs, not yet visible
/// when the id frees up: its change event keeps its own expectation and
/// waits for it, instead of being finished as stale with the echo before it.
#[test]
fn a_deferred_resend_not_yet_visible_is_waited_for_not_dropped() {
    let mut h = Harness::new(4);
    let first = h.message(0, &trig(1, 0, 0));
    h.answer(vec![pending(1)]);
    let job = h.starts().remove(0);
    // The job's own failure (attempt 3, failed at 30 ms), then an operator's
    // resend (pending, 0 attempts, at 40 ms), both while the job runs.
    h.message(1, &trig(1, 3, 30));
    h.message(2, &trig(1, 0, 40));
    h.s.job_ended(1, job.serial, &first, true, h.now);
    // The read sees the row before the resend is visible: failed at 30 ms.
    let mut failed = row(1, Status::Failed, 3, 30);
    failed.last_error = Some("HTTP 500".into());
    h.answer(vec![RowRead::Row(failed)]);
    assert_eq!(h.skips("stale"), 0, "the resend's event is not dropped");
    assert_eq!(h.commit(0), Some(2), "the resend's message waits");
    assert!(h.starts().is_empty());
    // The resend becomes visible: it is sent.
    h.now = h.s.next_wakeup().expect("a re-read is scheduled");
    h.answer(vec![RowRead::Row(row(1, Status::Pending, 0, 40))]);
    let job = h.starts();
    assert_eq!(job.len(), 1, "the resend is sent");
    h.s.job_ended(1, job[0].serial, &job[0].pos, true, h.now);
    assert_eq!(h.commit(0), Some(3));
}

#[test]
fn a_row_not_yet_visible_is_read_again_and_sent_when_it_appears() {
    let mut h = Harness::new(4);
    h.message(0, &trig(7, 0, 0));
    h.skip(1);
    h.answer(vec![]);
    assert_eq!(h.skips("row_missing"), 0, "not given up");
    assert_eq!(h.commit(0), Some(0), "the offset waits for the row");
    assert!(h.starts().is_empty());
    let due = h.s.next_wakeup().expect("a re-read is scheduled");
    assert!(due > h.now && due <= h.now + Duration::from_secs(2));
    assert!(h.s.take_reads(h.now).is_empty(), "not before it is due");
    h.now = due;
    h.answer(vec![pending(7)]);
    assert_eq!(h.metrics.cdc_rows_visible_late_total.get(), 1);
    let job = h.starts();
    assert_eq!(job.len(), 1, "the late row is sent");
    h.s.job_ended(7, job[0].serial, &job[0].pos, true, h.now);
    assert_eq!(h.commit(0), Some(2));
}

#[test]
fn a_row_that_never_appears_is_given_up_at_the_visibility_timeout() {
    let mut h = Harness::new(4);
    h.message(0, &trig(7, 0, 0));
    h.answer(vec![]);
    let mut reads = 1;
    while h.commit(0) == Some(0) {
        h.now = h.s.next_wakeup().expect("re-read scheduled");
        h.answer(vec![]);
        reads += 1;
        assert!(reads < 40, "bounded number of re-reads");
    }
    assert_eq!(h.skips("row_missing"), 1);
    assert_eq!(h.metrics.rows_never_visible_total.get(), 1, "counted");
    assert_eq!(h.commit(0), Some(1));
    assert!(h.s.busy_ids().is_empty());
}

#[test]
fn a_row_older_than_its_event_is_read_again() {
    let mut h = Harness::new(4);
    // The event says pending, updated at +100 ms (a resend); the row read is
    // still the failed one from before.
    h.message(0, &trig(3, 0, 100));
    h.answer(vec![RowRead::Row(row(3, Status::Failed, 3, 0))]);
    assert_eq!(
        h.skips("stale"),
        0,
        "an older row does not make the event stale"
    );
    h.now = h.s.next_wakeup().unwrap();
    h.answer(vec![RowRead::Row(row(3, Status::Pending, 0, 100))]);
    assert_eq!(h.starts().len(), 1);
    // Without updated_at, fewer attempts than the event's is older.
    let older = Expect {
        attempts: Some(2),
        updated_at: None,
        created: false,
    };
    assert!(older.is_newer_than(&row(3, Status::Pending, 1, 0)));
    assert!(!older.is_newer_than(&row(3, Status::Failed, 3, 0)));
}

#[test]
fn an_older_pending_row_is_sent_at_the_bound_not_dropped() {
    // Clock skew between writers can make a row look older for ever.
    let mut h = Harness::new(4);
    h.message(0, &trig(3, 1, 5_000));
    h.answer(vec![RowRead::Row(row(3, Status::Pending, 1, 0))]);
    while h.starts().is_empty() {
        h.now = h.s.next_wakeup().expect("re-read scheduled");
        h.answer(vec![RowRead::Row(row(3, Status::Pending, 1, 0))]);
    }
    assert_eq!(h.skips("row_missing"), 0);
}

#[test]
fn a_delete_ends_the_wait_for_a_missing_row() {
    let mut h = Harness::new(4);
    h.message(0, &trig(9, 0, 0));
    h.answer(vec![]);
    let del = h.s.begin(0, 1).unwrap();
    h.s.deleted(9);
    h.s.finish(&del);
    assert_eq!(h.commit(0), Some(2));
    assert_eq!(h.s.next_wakeup(), None);
}

#[test]
fn a_delete_during_the_read_makes_a_missing_row_final() {
    let mut h = Harness::new(4);
    h.message(0, &trig(9, 0, 0));
    let read = h.s.take_reads(h.now).remove(0);
    let del = h.s.begin(0, 1).unwrap();
    h.s.deleted(9);
    h.s.finish(&del);
    h.s.rows_read(read.ticket, Ok(vec![]), h.now);
    assert_eq!(h.commit(0), Some(2), "no re-read of a deleted row");
    assert_eq!(h.s.next_wakeup(), None);
    assert_eq!(h.skips("row_missing"), 1);
}

#[test]
fn an_undecodable_row_is_skipped_and_its_neighbours_go_on() {
    let mut h = Harness::new(4);
    h.message(0, &trig(1, 0, 0));
    h.message(1, &trig(2, 0, 0));
    h.message(2, &trig(3, 0, 0));
    h.answer(vec![
        pending(1),
        RowRead::Undecodable {
            id: 2,
            error: "status: unknown status \"archived\"".into(),
        },
        pending(3),
    ]);
    assert_eq!(h.skips("undecodable_row"), 1);
    let ids: Vec<i64> = h.starts().iter().map(|s| s.row.id).collect();
    assert_eq!(ids, vec![1, 3]);
}

#[test]
fn a_failed_read_is_made_again_and_leaves_the_loop_free() {
    let mut h = Harness::new(4);
    h.message(0, &trig(1, 0, 0));
    let read = h.s.take_reads(h.now).remove(0);
    // Meanwhile more messages are taken: the loop does not wait for reads.
    h.skip(1);
    h.s.rows_read(read.ticket, Err("connection refused".into()), h.now);
    assert_eq!(h.metrics.row_reads_failed_total.get(), 1);
    assert_eq!(h.commit(0), Some(0));
    // A database down for minutes: read again and again, never given up.
    for _ in 0..100 {
        h.now = h.s.next_wakeup().unwrap();
        let read = h.s.take_reads(h.now).remove(0);
        h.s.rows_read(read.ticket, Err("connection refused".into()), h.now);
    }
    assert_eq!(h.skips("row_missing"), 0);
    h.now = h.s.next_wakeup().unwrap();
    h.answer(vec![pending(1)]);
    assert_eq!(h.starts().len(), 1);
}

#[test]
fn reads_are_bounded_in_number_and_size() {
    let mut h = Harness::new(4);
    for i in 0..(MAX_READ as i64 * 3) {
        h.message(i, &trig(i + 1, 0, 0));
    }
    let reads = h.s.take_reads(h.now);
    assert_eq!(reads.len(), MAX_CONCURRENT_READS);
    // Until a payload size is known, reads are small.
    assert!(reads.iter().all(|r| r.ids.len() == FIRST_READ));
    assert!(h.s.take_reads(h.now).is_empty());
    let small = reads[0]
        .ids
        .iter()
        .map(|&id| RowRead::Row(row(id, Status::Pending, 0, 0)))
        .collect();
    h.s.rows_read(reads[0].ticket, Ok(small), h.now);
    let next = h.s.take_reads(h.now);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].ids.len(), MAX_READ, "small payloads: full reads");
}

#[test]
fn a_message_of_an_earlier_assignment_moves_no_offset_of_the_next() {
    let mut h = Harness::new(4);
    // Collected before a revoke and re-assign that happened in the same poll.
    let old = h.s.begin(0, 100).unwrap();
    h.s.revoke(&[0]);
    h.s.assign(&[0]);
    // The new assignment starts from the committed offset 90.
    let new = h.s.begin(0, 90).unwrap();
    assert_ne!(old.generation, new.generation);
    h.s.trigger(&trig(1, 0, 0), old);
    h.s.finish(&old);
    assert!(
        h.s.take_reads(h.now).is_empty(),
        "the old message is not decided"
    );
    assert_eq!(
        h.commit(0),
        Some(90),
        "offset 100 does not count for the new assignment"
    );
}

#[test]
fn an_incremental_assign_keeps_the_partitions_already_held() {
    let mut h = Harness::new(4);
    let pos = h.message(0, &trig(1, 0, 0));
    h.answer(vec![pending(1)]);
    let job = h.starts().remove(0);
    // Cooperative: partition 2 is added; 0 and 1 stay as they are (an
    // assign of a partition already held changes nothing either).
    h.s.assign(&[2]);
    h.s.assign(&[0]);
    assert_eq!(h.s.partitions().len(), 3);
    assert_eq!(
        h.s.begin(0, 1).map(|p| p.generation),
        Some(pos.generation),
        "partition 0 keeps its generation"
    );
    h.s.job_ended(1, job.serial, &pos, true, h.now);
    assert_eq!(
        h.commit(0),
        Some(1),
        "the running job's end still finishes its message"
    );
}

#[test]
fn an_incremental_revoke_leaves_the_kept_partitions_alone() {
    let mut h = Harness::new(4);
    let pos = h.message(0, &trig(1, 0, 0));
    let other = h.s.begin(1, 0).unwrap();
    h.s.trigger(&trig(2, 0, 0), other);
    for read in h.s.take_reads(h.now) {
        let rows = read.ids.iter().map(|&id| pending(id)).collect();
        h.s.rows_read(read.ticket, Ok(rows), h.now);
    }
    let starts = h.starts();
    assert_eq!(starts.len(), 2);
    h.s.revoke(&[1]);
    assert_eq!(h.s.partitions(), vec![0]);
    assert!(h.s.begin(1, 1).is_none(), "partition 1 is no longer read");
    let kept = starts.iter().find(|s| s.row.id == 1).unwrap();
    h.s.job_ended(1, kept.serial, &pos, true, h.now);
    assert_eq!(h.commit(0), Some(1), "partition 0 commits as before");
    assert_eq!(h.commit(1), None);
}

#[test]
fn a_revoke_drops_what_waits_and_a_late_job_end_is_harmless() {
    let mut h = Harness::new(1);
    let p1 = h.message(0, &trig(1, 0, 0));
    h.message(1, &trig(2, 0, 0));
    h.message(2, &trig(3, 0, 0));
    h.answer(vec![pending(1), pending(2)]);
    let job = h.starts();
    assert_eq!(job.len(), 2, "max_in_flight 1 → 2 jobs");
    h.s.revoke(&[0]);
    assert_eq!(h.s.held(), 0, "the missing row's re-read is dropped");
    h.s.assign(&[0]);
    let p = h.s.begin(0, 0).unwrap();
    h.s.job_ended(1, job[0].serial, &p1, true, h.now);
    assert_eq!(
        h.commit(0),
        Some(0),
        "the old job's end does not finish the new message"
    );
    // The id is free again: a trigger for it is read, not deferred for ever.
    h.s.trigger(&trig(1, 0, 0), p);
    assert_eq!(h.answer(vec![pending(1)]).ids, vec![1]);
}

#[test]
fn a_job_that_ends_unfinished_frees_its_id_and_keeps_its_message() {
    // A panicked or cancelled job: the message must be replayed.
    let mut h = Harness::new(4);
    let pos = h.message(0, &trig(1, 0, 0));
    h.answer(vec![pending(1)]);
    let job = h.starts().remove(0);
    h.s.job_ended(1, job.serial, &pos, false, h.now);
    assert_eq!(h.commit(0), Some(0));
    assert!(h.s.busy_ids().is_empty());
    h.message(1, &trig(1, 1, 10));
    assert_eq!(h.answer(vec![pending(1)]).ids, vec![1]);
}

#[test]
fn jobs_are_started_up_to_the_limit() {
    let mut h = Harness::new(2);
    for i in 0..10 {
        h.message(i, &trig(i + 1, 0, 0));
    }
    h.answer((1..=10).map(pending).collect());
    assert_eq!(h.starts().len(), max_jobs(2));
    assert_eq!(max_jobs(2), 4, "max_in_flight sending and as many ready to");
    assert!(h.starts().is_empty());
}

/// A fake of the dispatchers' limits: `limited.*` events are limited, and
/// `permits` says how many permits are left (then a wait of 100 ms).
struct Permits {
    left: std::cell::Cell<usize>,
}

impl Gate for Permits {
    fn limited(&self, event_name: &str) -> Option<&str> {
        event_name.starts_with("limited.").then_some("limited")
    }
    fn permit(&self, _: &str) -> Result<(), Duration> {
        match self.left.get() {
            0 => Err(Duration::from_millis(100)),
            n => {
                self.left.set(n - 1);
                Ok(())
            }
        }
    }
}

fn limited(id: i64) -> RowRead {
    let mut r = row(id, Status::Pending, 0, 0);
    r.event_name = "limited.tick".into();
    RowRead::Row(r)
}

#[test]
fn a_failed_attempt_waits_as_an_entry_and_is_read_again_when_due() {
    let mut h = Harness::new(1);
    let pos = h.message(0, &trig(1, 0, 0));
    h.answer(vec![pending(1)]);
    let job = h.starts().remove(0);
    h.s.job_retry(1, job.serial, &pos, Duration::from_secs(5), 1, h.now);
    // No job, no payload: an entry due in 5 s; its message unfinished.
    assert_eq!(h.s.running(), 0);
    assert_eq!(h.s.waiting_entries(), 1);
    assert_eq!(h.commit(0), Some(0), "its message is unfinished");
    assert_eq!(h.s.next_wakeup(), Some(h.now + Duration::from_secs(5)));
    assert!(h.s.take_reads(h.now).is_empty());
    // Another event goes meanwhile: the retry takes no place.
    h.message(1, &trig(2, 0, 0));
    h.answer(vec![pending(2)]);
    assert_eq!(h.starts().len(), 1);
    h.advance(Duration::from_secs(5));
    // Due: read again, and started if it is still as the job left it.
    let mut again = row(1, Status::Pending, 1, 10);
    again.updated_at = ts(10);
    let read = h.answer(vec![RowRead::Row(again)]);
    assert_eq!(read.ids, vec![1]);
    assert_eq!(h.starts().len(), 1);
}

#[test]
fn a_retry_whose_row_was_decided_meanwhile_is_not_started() {
    let mut h = Harness::new(1);
    let pos = h.message(0, &trig(1, 0, 0));
    h.answer(vec![pending(1)]);
    let job = h.starts().remove(0);
    h.s.job_retry(1, job.serial, &pos, Duration::from_secs(5), 1, h.now);
    h.advance(Duration::from_secs(5));
    // An operator failed it by hand meanwhile.
    h.answer(vec![RowRead::Row(row(1, Status::Failed, 1, 20))]);
    assert!(h.starts().is_empty());
    assert_eq!(h.commit(0), Some(1), "its message is finished");
    assert!(h.s.busy_ids().is_empty());
}

#[test]
fn a_rate_limited_backlog_takes_no_job_and_no_payload_and_others_go_past_it() {
    let mut h = Harness::new(1);
    let n = 200;
    for i in 0..n {
        h.message(i, &trig(i + 1, 0, 0));
    }
    // Read in batches; every row the limited dispatcher's.
    h.read_all(limited);
    let gate = Permits {
        left: std::cell::Cell::new(1),
    };
    // One permit: one job; the rest wait as entries, no job started.
    assert_eq!(h.s.take_starts(h.now, &gate).len(), 1);
    assert_eq!(h.s.running(), 1);
    assert_eq!(h.s.held(), LINE_ROWS - 1, "only the line's head holds rows");
    assert_eq!(h.s.waiting_entries(), n as usize - LINE_ROWS);
    // Another dispatcher's event goes past the line (within the job limit).
    h.message(n, &trig(n + 1, 0, 0));
    h.read_all(|id| {
        if id == n + 1 {
            pending(id)
        } else {
            limited(id)
        }
    });
    let past = h.s.take_starts(h.now, &gate);
    assert_eq!(past.len(), 1);
    assert_eq!(past[0].row.id, n + 1);
    // The line asks again when its limiter said.
    assert_eq!(h.s.next_wakeup(), Some(h.now + Duration::from_millis(100)));
    // Permits granted: as many jobs, never past the job limit.
    gate.left.set(100);
    h.advance(Duration::from_millis(100));
    let more = h.s.take_starts(h.now, &gate);
    assert_eq!(more.len(), max_jobs(1) - 2);
    assert!(h.s.running() <= max_jobs(1));
}

#[test]
fn a_rate_line_reads_its_ids_again_as_its_head_empties() {
    let mut h = Harness::new(4);
    let n = 40;
    for i in 0..n {
        h.message(i, &trig(i + 1, 0, 0));
    }
    h.read_all(limited);
    let gate = Permits {
        left: std::cell::Cell::new(usize::MAX),
    };
    let mut started = Vec::new();
    let mut turns = 0;
    while started.len() < n as usize {
        turns += 1;
        assert!(turns < 100, "the line drains: {} started", started.len());
        for s in h.s.take_starts(h.now, &gate) {
            started.push(s.row.id);
            h.s.job_ended(s.row.id, s.serial, &s.pos, true, h.now);
        }
        h.read_all(limited);
    }
    started.sort();
    assert_eq!(started, (1..=n).collect::<Vec<_>>());
    assert_eq!(h.commit(0), Some(n));
}

#[test]
fn holding_pauses_only_when_nothing_moves_and_resumes_when_drained() {
    let mut h = Harness::new(1);
    let n = high_mark(1) as i64;
    for i in 0..n {
        h.message(i, &trig(i + 1, 0, 0));
    }
    assert!(h.s.holding());
    assert_eq!(h.s.flow(h.now), None, "holding starts the clock");
    // Work keeps ending: no pause before HOLD_MAX.
    for _ in 0..4 {
        h.advance(PAUSE_AFTER / 2);
        h.s.rows_read(999, Ok(vec![]), h.now); // unknown ticket: ignored
        let reads = h.s.take_reads(h.now);
        for r in &reads {
            // Answered as missing then re-queued: work is moving.
            h.s.rows_read(r.ticket, Err("slow".into()), h.now);
        }
        assert_eq!(h.s.flow(h.now), None);
    }
    h.advance(PAUSE_AFTER);
    assert_eq!(h.s.flow(h.now), Some(Flow::Pause));
    assert!(!h.s.holding(), "paused: polling serves rebalances again");
    // Drain all but max_in_flight: resume.
    h.s.revoke(&[0]);
    assert_eq!(h.s.flow(h.now), Some(Flow::Resume));
    assert_eq!(
        h.metrics.consumer_pauses_total.get(),
        0,
        "counted by the driver"
    );
}

#[test]
fn a_quiet_hold_pauses_after_pause_after() {
    let mut h = Harness::new(1);
    for i in 0..high_mark(1) as i64 {
        h.message(i, &trig(i + 1, 0, 0));
    }
    assert_eq!(h.s.flow(h.now), None);
    assert_eq!(h.s.next_wakeup(), Some(h.now + PAUSE_AFTER));
    h.advance(PAUSE_AFTER);
    assert_eq!(h.s.flow(h.now), Some(Flow::Pause));
}

fn big(id: i64, kib: usize) -> RowRead {
    let mut r = row(id, Status::Pending, 0, 0);
    r.payload = serde_json::json!({ "blob": "x".repeat(kib << 10) })
        .to_string()
        .into();
    RowRead::Row(r)
}

#[test]
fn large_payloads_are_bounded_by_bytes_not_rows() {
    // 8 MiB for payloads; rows of 200 KiB.
    let budget = 8 << 20;
    let mut h = Harness::with_bytes(256, budget);
    for i in 0..2_000 {
        h.message(i, &trig(i + 1, 0, 0));
    }
    // The first reads know no sizes yet: small ones.
    let first = h.s.take_reads(h.now);
    assert!(first.iter().all(|r| r.ids.len() <= FIRST_READ), "{first:?}");
    let mut reads = first;
    let mut per_read = Vec::new();
    for _ in 0..50 {
        for r in std::mem::take(&mut reads) {
            per_read.push(r.ids.len());
            h.s.rows_read(
                r.ticket,
                Ok(r.ids.iter().map(|&id| big(id, 200)).collect()),
                h.now,
            );
        }
        // Jobs take at most half the budget (one always runs).
        let jobs = h.starts();
        let job_bytes: usize = jobs.iter().map(|s| payload_bytes(&s.row.payload)).sum();
        assert!(job_bytes <= budget / 2 + (210 << 10), "{job_bytes}");
        if h.s.holding() {
            break;
        }
        reads = h.s.take_reads(h.now);
    }
    // Ready rows past half the budget hold the loop.
    assert!(h.s.holding(), "reads of {per_read:?} rows of 200 KiB");
    // Once sizes are known, reads are sized to an eighth of the budget.
    let next = h.s.take_reads(h.now);
    assert!(!next.is_empty());
    let n = next[0].ids.len();
    assert!(n * (200 << 10) <= budget / 8 * 2, "{n} rows per read");
}

#[test]
fn payload_size_is_its_text() {
    let small = entity::Payload::from(&serde_json::json!({"event_type": "purchase_create"}));
    assert!(payload_bytes(&small) < 256);
    let large = entity::Payload::from(&serde_json::json!({ "items": vec!["y".repeat(1000); 100] }));
    let est = payload_bytes(&large);
    assert!(est >= large.len() && est < large.len() + 64, "{est}");
}

/// Dead-letter sends stuck on a missing topic keep their records in
/// memory: past the bound fetching holds, the partitions pause when nothing
/// moves, and they resume once the sends end.
#[test]
fn dead_letter_sends_are_bounded_and_fetching_resumes_when_they_end() {
    let mut h = Harness::with_bytes(4, 64 << 20);
    let mut sends = Vec::new();
    for offset in 0..MAX_DEAD_LETTERS as i64 {
        assert!(!h.s.holding(), "not holding below the bound ({offset})");
        let pos = h.s.begin(0, offset).expect("assigned");
        h.s.dead_letter_began(300);
        sends.push(pos);
    }
    assert!(h.s.holding(), "at the bound, fetching holds");
    assert_eq!(h.s.flow(h.now), None);
    h.advance(PAUSE_AFTER);
    assert_eq!(h.s.flow(h.now), Some(Flow::Pause), "nothing moves: paused");
    assert_eq!(
        h.commit(0),
        Some(0),
        "unsent dead letters are not committed"
    );
    for pos in &sends {
        h.s.dead_letter_ended(pos, 300, h.now);
    }
    assert_eq!(h.s.flow(h.now), Some(Flow::Resume));
    assert_eq!(h.commit(0), Some(MAX_DEAD_LETTERS as i64));
    assert_eq!(h.s.dead_letters(), 0);
}

#[test]
fn dead_letter_bytes_are_bounded_within_max_buffered_bytes() {
    let mut h = Harness::with_bytes(4, 8 << 20);
    let pos = h.s.begin(0, 0).expect("assigned");
    h.s.dead_letter_began(1 << 20);
    assert!(h.s.holding(), "one MiB is an eighth of 8 MiB");
    h.s.dead_letter_ended(&pos, 1 << 20, h.now);
    assert!(!h.s.holding());
}

// ---- `[ordering]`: one aggregate's events one at a time ----

fn in_line(id: i64, behind: Option<i64>) -> RowRead {
    let mut r = row(id, Status::Pending, 0, 0);
    r.sequence = Some(entity::Sequence {
        aggregate: Some("a".into()),
        behind,
    });
    RowRead::Row(r)
}

/// An update event of `id` (a resend, a resume, an announcement).
fn touched(id: i64, updated_ms: i64) -> Trigger {
    Trigger {
        op: Op::Update,
        ..trig(id, 0, updated_ms)
    }
}

impl Harness {
    /// Collects a trigger for `id` of `aggregate` at `offset` of partition `p`.
    fn ordered(&mut self, p: i32, offset: i64, t: &Trigger, aggregate: &str) -> Pos {
        let pos = self.s.begin(p, offset).expect("assigned");
        self.s.trigger_in(t, pos, Some(aggregate));
        pos
    }

    fn reads_due(&mut self) -> Vec<Read> {
        self.s.take_reads(self.now)
    }
}

#[test]
fn an_aggregate_decides_one_event_at_a_time_and_a_retry_does_not_let_the_next_start() {
    let mut h = Harness::new(8);
    let p1 = h.ordered(0, 0, &trig(1, 0, 0), "a");
    let p2 = h.ordered(0, 1, &trig(2, 0, 0), "a");
    let p9 = h.ordered(0, 2, &trig(9, 0, 0), "b");
    let reads = h.reads_due();
    let ids: Vec<i64> = reads.iter().flat_map(|r| r.ids.clone()).collect();
    assert_eq!(ids, vec![1, 9], "event 2 waits in a's line; b goes on");
    assert_eq!(h.s.aggregate_queued(), 1);
    for r in reads {
        let rows = r.ids.iter().map(|&id| in_line(id, None)).collect();
        h.s.rows_read(r.ticket, Ok(rows), h.now);
    }
    let starts = h.starts();
    assert_eq!(
        starts.iter().map(|s| s.row.id).collect::<Vec<_>>(),
        vec![1, 9]
    );
    // Event 1's attempt fails and it waits out retry_delay inside its job:
    // its change event (attempts 1) is deferred, and 2 still waits.
    let echo = h.ordered(0, 3, &trig(1, 1, 100), "a");
    h.advance(Duration::from_secs(5));
    assert!(
        h.reads_due().is_empty(),
        "nothing of a is read while 1 runs"
    );
    h.s.job_ended_in(9, starts[1].serial, &p9, true, true, h.now);
    assert!(h.reads_due().is_empty());
    // 1 is sent: its echo is decided first (same id), then 2.
    h.s.job_ended_in(1, starts[0].serial, &p1, true, true, h.now);
    let r = h.reads_due();
    assert_eq!(r[0].ids, vec![1], "the echo of 1, decided again");
    let mut sent = row(1, Status::Sent, 2, 200);
    sent.sequence = Some(entity::Sequence::default());
    h.s.rows_read(r[0].ticket, Ok(vec![RowRead::Row(sent)]), h.now);
    h.s.finish(&echo);
    let r = h.reads_due();
    assert_eq!(r[0].ids, vec![2], "now event 2");
    h.s.rows_read(r[0].ticket, Ok(vec![in_line(2, None)]), h.now);
    let starts = h.starts();
    assert_eq!(starts[0].row.id, 2);
    h.s.job_ended_in(2, starts[0].serial, &p2, true, true, h.now);
    assert_eq!(h.s.aggregate_queued(), 0);
    assert!(h.s.busy_ids().is_empty());
    assert_eq!(h.commit(0), Some(4));
    assert!(h.s.take_announcements().is_empty(), "nothing was parked");
}

#[test]
fn an_event_behind_a_failed_one_is_parked_and_its_message_finished() {
    let mut h = Harness::new(8);
    let p1 = h.ordered(0, 0, &trig(1, 0, 0), "a");
    h.ordered(0, 1, &trig(2, 0, 0), "a");
    h.ordered(0, 2, &trig(3, 0, 0), "a");
    let r = h.reads_due();
    h.s.rows_read(r[0].ticket, Ok(vec![in_line(1, None)]), h.now);
    let start = h.starts().remove(0);
    // 1 ends failed under "hold": it does not let 2 and 3 go.
    h.s.job_ended_in(1, start.serial, &p1, true, false, h.now);
    assert!(h.s.take_announcements().is_empty());
    for id in [2, 3] {
        let r = h.reads_due();
        assert_eq!(r[0].ids, vec![id]);
        h.s.rows_read(r[0].ticket, Ok(vec![in_line(id, Some(1))]), h.now);
        assert!(h.starts().is_empty(), "{id} is held, not started");
    }
    assert_eq!(h.metrics.ordering_parked_total.get(), 2);
    assert_eq!(
        h.commit(0),
        Some(3),
        "held events do not hold the partition's commits"
    );
    assert!(h.s.busy_ids().is_empty(), "nor memory");
}

#[test]
fn a_resent_head_that_is_sent_announces_the_events_parked_behind_it() {
    let mut h = Harness::new(8);
    // 2 and 3 were parked behind 1 (failed), maybe by another replica; 1 is
    // resent: its change event (an update) arrives, it is read and sent,
    // and its aggregate's next pending event must be announced again.
    let p1 = h.ordered(0, 0, &touched(1, 0), "a");
    let r = h.reads_due();
    h.s.rows_read(r[0].ticket, Ok(vec![in_line(1, None)]), h.now);
    let start = h.starts().remove(0);
    h.s.job_ended_in(1, start.serial, &p1, true, true, h.now);
    assert_eq!(h.s.take_announcements(), vec![1]);
    // Decided on its insert on the aggregate's partition, nothing can have
    // been parked behind 4: its later events come after it there.
    let p4 = h.ordered(0, 1, &trig(4, 0, 0), "c");
    let r = h.reads_due();
    h.s.rows_read(r[0].ticket, Ok(vec![in_line(4, None)]), h.now);
    let start = h.starts().remove(0);
    h.s.job_ended_in(4, start.serial, &p4, true, true, h.now);
    assert!(h.s.take_announcements().is_empty());
    // A resent head that fails again (under "hold") announces nothing;
    // sent at its next resend, it does.
    let p5 = h.ordered(0, 2, &touched(5, 0), "d");
    let r = h.reads_due();
    h.s.rows_read(r[0].ticket, Ok(vec![in_line(5, None)]), h.now);
    let start = h.starts().remove(0);
    h.s.job_ended_in(5, start.serial, &p5, true, false, h.now);
    assert!(h.s.take_announcements().is_empty());
    let p5 = h.ordered(0, 3, &touched(5, 0), "d");
    let r = h.reads_due();
    h.s.rows_read(r[0].ticket, Ok(vec![in_line(5, None)]), h.now);
    let start = h.starts().remove(0);
    h.s.job_ended_in(5, start.serial, &p5, true, true, h.now);
    assert_eq!(h.s.take_announcements(), vec![5]);
}

#[test]
fn an_event_parked_behind_a_running_one_is_announced_when_that_one_is_sent() {
    let mut h = Harness::new(8);
    // Unkeyed (no line here): 7 runs, 8 is read meanwhile and waits
    // behind 7 in the database; 7 was read before 8 existed.
    let p7 = h.message(0, &trig(7, 0, 0));
    h.answer(vec![in_line(7, None)]);
    let start = h.starts().remove(0);
    h.message(1, &trig(8, 0, 0));
    h.answer(vec![in_line(8, Some(7))]);
    h.s.job_ended_in(7, start.serial, &p7, true, true, h.now);
    assert_eq!(h.s.take_announcements(), vec![7]);
}

#[test]
fn a_revoke_mid_aggregate_drops_its_line_and_the_next_owner_replays_it() {
    let mut h = Harness::new(8);
    let p1 = h.ordered(1, 0, &trig(1, 0, 0), "a");
    h.ordered(1, 1, &trig(2, 0, 0), "a");
    h.ordered(0, 0, &trig(9, 0, 0), "b");
    h.ordered(0, 1, &trig(10, 0, 0), "b");
    let r = h.reads_due();
    for r in r {
        let rows = r.ids.iter().map(|&id| in_line(id, None)).collect();
        h.s.rows_read(r.ticket, Ok(rows), h.now);
    }
    let starts = h.starts();
    let s1 = starts.iter().find(|s| s.row.id == 1).unwrap().serial;
    h.s.revoke(&[1]);
    assert_eq!(h.s.aggregate_queued(), 1, "a's line is gone, b's stays");
    // The revoked partition's job ends cancelled: nothing of a starts.
    h.s.job_ended_in(1, s1, &p1, false, false, h.now);
    assert!(h.reads_due().is_empty());
    assert!(!h.s.busy_ids().contains(&2));
    assert_eq!(h.commit(1), None, "nothing of partition 1 committed here");
    // Reassigned: the replay lines a up again from event 1.
    h.s.assign(&[1]);
    h.ordered(1, 0, &trig(1, 0, 0), "a");
    h.ordered(1, 1, &trig(2, 0, 0), "a");
    let ids: Vec<i64> = h.reads_due().iter().flat_map(|r| r.ids.clone()).collect();
    assert_eq!(ids, vec![1]);
}

#[test]
fn an_echo_of_a_later_event_waits_in_line_behind_the_head() {
    let mut h = Harness::new(8);
    let p1 = h.ordered(0, 0, &trig(1, 0, 0), "a");
    let r = h.reads_due();
    h.s.rows_read(r[0].ticket, Ok(vec![in_line(1, None)]), h.now);
    let start = h.starts().remove(0);
    // 2's change event (and a second one for it) arrive while 1 is undecided.
    h.ordered(0, 1, &trig(2, 0, 0), "a");
    h.ordered(0, 2, &trig(2, 0, 10), "a");
    assert!(h.reads_due().is_empty());
    h.s.job_ended_in(1, start.serial, &p1, true, true, h.now);
    assert!(h.s.take_announcements().is_empty(), "2 is next in line");
    let r = h.reads_due();
    assert_eq!(r[0].ids, vec![2]);
}

#[test]
fn a_released_aggregate_is_decided_here_event_after_event_with_no_message_of_its_own() {
    let mut h = Harness::new(8);
    // 1 was failed, 2 and 3 parked behind it; 1 is resent and sent.
    let p1 = h.ordered(0, 0, &touched(1, 0), "a");
    let r = h.reads_due();
    h.s.rows_read(r[0].ticket, Ok(vec![in_line(1, None)]), h.now);
    let start = h.starts().remove(0);
    h.s.job_ended_in(1, start.serial, &p1, true, true, h.now);
    assert_eq!(h.s.take_announcements(), vec![1]);
    // Its partition is still this replica's: 2 is released here, on it.
    let pos = h.s.release_pos(1).expect("partition 0 is ours");
    assert_eq!((pos.partition, pos.offset), (0, RELEASED));
    assert!(h.s.released(1, &[2], pos));
    let r = h.reads_due();
    assert_eq!(r[0].ids, vec![2]);
    h.s.rows_read(r[0].ticket, Ok(vec![in_line(2, None)]), h.now);
    let start = h.starts().remove(0);
    h.s.job_ended_in(2, start.serial, &start.pos, true, true, h.now);
    // Sent: the next one is released after it, and nothing of it holds
    // the partition's commits.
    assert_eq!(h.s.take_announcements(), vec![2]);
    assert_eq!(h.commit(0), Some(1));
    // A partition gone meanwhile: no release here (the driver touches 3
    // for the partition's next owner).
    let pos = h.s.release_pos(2).expect("still ours");
    h.s.revoke(&[0]);
    assert!(!h.s.released(2, &[3], pos));
    assert!(h.s.busy_ids().is_empty());
    assert_eq!(h.s.release_pos(99), None, "nothing announced after 99");
}

/// The failed head 1 of aggregate "a" is resent (an update event at
/// `offset` of partition 0) and sent: it is announced, and its release may
/// go on partition 0 at the position returned.
fn resent_head_sent(h: &mut Harness, offset: i64) -> Pos {
    let p1 = h.ordered(0, offset, &touched(1, 0), "a");
    let r = h.reads_due();
    h.s.rows_read(r[0].ticket, Ok(vec![in_line(1, None)]), h.now);
    let start = h.starts().remove(0);
    h.s.job_ended_in(1, start.serial, &p1, true, true, h.now);
    assert_eq!(h.s.take_announcements(), vec![1]);
    h.s.release_pos(1).expect("partition 0 is ours")
}

#[test]
fn a_released_batch_goes_one_after_the_other_and_only_its_last_is_followed_by_a_read() {
    let mut h = Harness::new(8);
    // 1 was failed, 2, 3 and 4 parked behind it; 1 is resent and sent.
    let pos = resent_head_sent(&mut h, 0);
    // One release read found 2, 3 and 4: 2 is decided, 3 and 4 wait.
    assert!(h.s.released(1, &[2, 3, 4], pos));
    for id in [2, 3] {
        let r = h.reads_due();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].ids, vec![id], "one at a time, in id order");
        h.s.rows_read(r[0].ticket, Ok(vec![in_line(id, None)]), h.now);
        let start = h.starts().remove(0);
        h.s.job_ended_in(id, start.serial, &start.pos, true, true, h.now);
        assert!(
            h.s.take_announcements().is_empty(),
            "{id}'s next was released with it: no read after {id}"
        );
    }
    let r = h.reads_due();
    assert_eq!(r[0].ids, vec![4]);
    h.s.rows_read(r[0].ticket, Ok(vec![in_line(4, None)]), h.now);
    let start = h.starts().remove(0);
    h.s.job_ended_in(4, start.serial, &start.pos, true, true, h.now);
    assert_eq!(
        h.s.take_announcements(),
        vec![4],
        "the batch's last reads on"
    );
    assert!(h.s.busy_ids().is_empty());
    assert_eq!(h.commit(0), Some(1), "released events commit nothing");
}

#[test]
fn a_released_batch_of_a_revoked_partition_leaves_nothing_behind() {
    let mut h = Harness::new(8);
    let pos = resent_head_sent(&mut h, 0);
    assert!(h.s.released(1, &[2, 3, 4], pos));
    h.s.revoke(&[0]);
    assert!(h.s.busy_ids().is_empty());
    assert_eq!(h.s.aggregate_queued(), 0);
    h.s.assign(&[0]);
    assert!(
        h.reads_due().is_empty(),
        "nothing of the batch is read again"
    );
}

#[test]
fn a_released_batch_whose_events_were_parked_behind_each_other_is_read_once() {
    let mut h = Harness::new(8);
    // 1 failed; 2 was parked behind 1 and 3 behind 2 (their change events).
    let p2 = h.ordered(0, 0, &trig(2, 0, 0), "a");
    let p3 = h.ordered(0, 1, &trig(3, 0, 0), "a");
    let _ = (p2, p3);
    let r = h.reads_due();
    h.s.rows_read(r[0].ticket, Ok(vec![in_line(2, Some(1))]), h.now);
    let r = h.reads_due();
    h.s.rows_read(r[0].ticket, Ok(vec![in_line(3, Some(2))]), h.now);
    assert!(h.s.busy_ids().is_empty(), "both parked");
    // 1 resent and sent: one release read finds 2 and 3.
    let pos = resent_head_sent(&mut h, 2);
    assert!(h.s.released(1, &[2, 3], pos));
    let r = h.reads_due();
    h.s.rows_read(r[0].ticket, Ok(vec![in_line(2, None)]), h.now);
    let start = h.starts().remove(0);
    h.s.job_ended_in(2, start.serial, &start.pos, true, true, h.now);
    assert!(
        h.s.take_announcements().is_empty(),
        "3 was parked behind 2, but it waits in the release's line: no second read"
    );
    let r = h.reads_due();
    assert_eq!(r[0].ids, vec![3]);
}

#[test]
fn explain_says_what_each_event_waits_for_here() {
    let mut h = Harness::new(1);
    // Read: being read until its rows come.
    let pos = h.message(0, &trig(1, 0, 0));
    assert_eq!(h.s.explain(1, h.now), Some(Here::Reading));
    h.answer(vec![pending(1)]);
    let job = h.starts().remove(0);
    h.advance(Duration::from_secs(2));
    assert_eq!(
        h.s.explain(1, h.now),
        Some(Here::Running {
            for_: Duration::from_secs(2)
        })
    );
    // A retry: due in the wait it was given, less the time passed.
    h.s.job_retry(1, job.serial, &pos, Duration::from_secs(30), 1, h.now);
    h.advance(Duration::from_secs(10));
    assert_eq!(
        h.s.explain(1, h.now),
        Some(Here::Due {
            in_: Some(Duration::from_secs(20))
        })
    );
    // Nothing here for an id it never saw.
    assert_eq!(h.s.explain(99, h.now), None);
    // A rate line: the place in it, read ahead or not.
    let mut h = Harness::new(1);
    for i in 0..40 {
        h.message(i, &trig(i + 1, 0, 0));
    }
    h.read_all(limited);
    let gate = Permits {
        left: std::cell::Cell::new(1),
    };
    assert_eq!(h.s.take_starts(h.now, &gate).len(), 1);
    for (id, ahead) in [(2, 0), (40, 38)] {
        match h.s.explain(id, h.now) {
            Some(Here::Throttled {
                dispatcher,
                ahead: a,
                ..
            }) => {
                assert_eq!((dispatcher.is_empty(), a), (false, ahead), "{id}")
            }
            other => panic!("{id}: {other:?}"),
        }
    }
}

#[test]
fn an_event_in_its_aggregates_line_and_a_released_line_at_once_holds_neither() {
    // 1 was failed and resent; 2 and 3 were parked behind it. 3's own
    // change event (a replay, a touch) makes it its aggregate's active
    // event; then 1 is sent and a release read finds 2 and 3.
    let mut h = Harness::new(8);
    let pos = resent_head_sent(&mut h, 0);
    h.ordered(0, 10, &touched(3, 0), "a");
    assert!(h.s.released(1, &[2, 3], pos));
    // 3's read (as its aggregate's active event) and 2's (released): 2 is
    // sent; the released line moves on to 3, which is busy already.
    for _ in 0..3 {
        for r in h.reads_due() {
            let rows = r.ids.iter().map(|id| in_line(*id, None)).collect();
            h.s.rows_read(r.ticket, Ok(rows), h.now);
        }
        // 2 ends while 3's attempt still runs.
        let mut starts = h.starts();
        starts.sort_by_key(|s| s.row.id);
        for start in starts {
            h.s.job_ended_in(start.row.id, start.serial, &start.pos, true, true, h.now);
        }
        h.s.take_announcements();
    }
    assert!(
        h.s.busy_ids().is_empty(),
        "{:?} {:?}",
        h.s.busy_ids(),
        h.s.explain(3, h.now)
    );
    // The aggregate's next event is decided, not queued behind 3 for good.
    h.ordered(0, 11, &touched(4, 0), "a");
    assert_eq!(
        h.s.explain(4, h.now),
        Some(Here::Reading),
        "4 is read, not left in a line"
    );
}

#[test]
fn an_event_parked_behind_a_released_one_is_announced_when_that_one_ends() {
    // 2 and 3 are released together (2's next, 3, waits in the released
    // line); 3's own change event makes it its aggregate's active event
    // and its read finds 2 still pending: 3 is parked behind 2. 2's end
    // must announce 3, though 2 was released with its next.
    let mut h = Harness::new(8);
    let pos = resent_head_sent(&mut h, 0);
    h.ordered(0, 10, &touched(3, 0), "a");
    assert!(h.s.released(1, &[2, 3], pos));
    let mut two = None;
    for r in h.reads_due() {
        let rows = r
            .ids
            .iter()
            .map(|id| {
                if *id == 3 {
                    in_line(3, Some(2))
                } else {
                    in_line(*id, None)
                }
            })
            .collect();
        h.s.rows_read(r.ticket, Ok(rows), h.now);
    }
    for start in h.starts() {
        if start.row.id == 2 {
            two = Some(start);
        }
    }
    let two = two.expect("2 runs");
    h.s.take_announcements();
    h.s.job_ended_in(2, two.serial, &two.pos, true, true, h.now);
    assert_eq!(h.s.take_announcements(), vec![2], "3 is announced after 2");
}
