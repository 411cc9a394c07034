//! R-004's decision table as pure functions (CONTRACT §3): what a success,
//! a failure and a resend make of a row, and when its next attempt is due.
//! The rule is said here only: the job computes each next row with these
//! functions and the store writes the row it is given (its SQL carries
//! these values, it computes none), on every backend alike. Nothing here
//! does I/O.
//!
//! | situation      | attempts before | status after            |
//! |----------------|-----------------|-------------------------|
//! | success (2xx)  | any             | `sent`, `sent_at` = now |
//! | failure        | < max − 1       | `pending`, attempts + 1 |
//! | failure        | max − 1         | `failed`, attempts = max|
//! | manual resend  | failed          | `pending`, attempts 0   |
//!
//! Each write is conditional on the row as it was read (pending, with the
//! attempts it had); [`is_own_write`] tells a writer whether the row it
//! finds after a write that did not answer is its own.

use std::time::Duration;

use chrono::NaiveDateTime;
use entity::{OutboxEventRow, Status};

/// The status a failure leaves when it brings the attempts to `attempts`.
pub fn status_after_failure(attempts: i32, max_attempts: i32) -> Status {
    if attempts >= max_attempts {
        Status::Failed
    } else {
        Status::Pending
    }
}

/// The row after a successful attempt of `seen`, written at `now`.
pub fn after_success(seen: &OutboxEventRow, now: NaiveDateTime) -> OutboxEventRow {
    let mut next = seen.clone();
    next.status = Status::Sent;
    next.sent_at = Some(now);
    next.updated_at = now;
    next
}

/// The row after a failed attempt of `seen`, written at `now`; `error` is
/// already cut to what `last_error` holds.
pub fn after_failure(
    seen: &OutboxEventRow,
    error: String,
    now: NaiveDateTime,
    max_attempts: i32,
) -> OutboxEventRow {
    let mut next = seen.clone();
    next.attempts = seen.attempts + 1;
    next.status = status_after_failure(next.attempts, max_attempts);
    next.last_error = Some(error);
    next.updated_at = now;
    next
}

/// The row after a resend of the failed row `seen` (R-004 `retry!`,
/// ActiveAdmin's "Reenviar") at `now`: `pending` again, with no attempts
/// and no error. The same for every row, so a bulk resend is one UPDATE.
pub fn after_resend(seen: &OutboxEventRow, now: NaiveDateTime) -> OutboxEventRow {
    let mut next = seen.clone();
    next.status = Status::Pending;
    next.attempts = 0;
    next.last_error = None;
    next.updated_at = now;
    next
}

/// Whether `found`, the row as read after a write of `next` was refused as
/// a conflict, is that write itself: its answer was lost after it
/// committed and the write was made again. The status, attempts and error
/// are compared; the timestamps are not (a `datetime(0)` or `timestamp`
/// column keeps whole seconds).
pub fn is_own_write(next: &OutboxEventRow, found: &OutboxEventRow) -> bool {
    found.id == next.id
        && found.status == next.status
        && found.attempts == next.attempts
        && found.last_error == next.last_error
}

/// When the next attempt of `row` is due: at once for a fresh (or resent)
/// row, `retry_delay` after the last failure otherwise.
pub fn due_at(row: &OutboxEventRow, retry_delay: Duration) -> Option<NaiveDateTime> {
    if row.attempts == 0 {
        return None;
    }
    let delay = chrono::Duration::from_std(retry_delay).unwrap_or(chrono::Duration::MAX);
    row.updated_at.checked_add_signed(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: Status, attempts: i32) -> OutboxEventRow {
        let t = NaiveDateTime::parse_from_str("2026-12-01 10:00:00", "%Y-%m-%d %H:%M:%S").unwrap();
        OutboxEventRow {
            id: 1,
            event_name: "accounts.purchase_create".into(),
            payload: "{}".to_owned().into(),
            status,
            attempts,
            last_error: None,
            sent_at: None,
            created_at: t,
            updated_at: t,
            traceparent: None,
            tracestate: None,
            sequence: None,
        }
    }

    #[test]
    fn the_decision_table() {
        let now = row(Status::Pending, 0).updated_at + chrono::Duration::seconds(1);
        for before in [0, 1, 2] {
            let sent = after_success(&row(Status::Pending, before), now);
            assert_eq!(
                (sent.status, sent.attempts, sent.sent_at),
                (Status::Sent, before, Some(now))
            );
        }
        for (before, status) in [
            (0, Status::Pending),
            (1, Status::Pending),
            (2, Status::Failed),
        ] {
            let next = after_failure(&row(Status::Pending, before), "HTTP 503".into(), now, 3);
            assert_eq!((next.status, next.attempts), (status, before + 1));
            assert_eq!(next.last_error.as_deref(), Some("HTTP 503"));
            assert_eq!(next.updated_at, now);
        }
        assert_eq!(status_after_failure(1, 1), Status::Failed);
    }

    #[test]
    fn a_resend_starts_over() {
        let mut failed = row(Status::Failed, 3);
        failed.last_error = Some("HTTP 503".into());
        let now = failed.updated_at + chrono::Duration::seconds(1);
        let next = after_resend(&failed, now);
        assert_eq!(
            (next.status, next.attempts, next.last_error, next.updated_at),
            (Status::Pending, 0, None, now)
        );
    }

    #[test]
    fn a_write_is_recognised_by_what_it_wrote() {
        let seen = row(Status::Pending, 1);
        let now = seen.updated_at + chrono::Duration::seconds(1);
        let failed = after_failure(&seen, "HTTP 503".into(), now, 3);
        let sent = after_success(&seen, now);
        assert!(is_own_write(&failed, &failed));
        assert!(is_own_write(&sent, &sent));
        // Whole seconds read back from a `datetime(0)` column.
        let mut truncated = failed.clone();
        truncated.updated_at = seen.updated_at;
        assert!(is_own_write(&failed, &truncated));
        // Another writer's: another error, another attempt, another status.
        let other = after_failure(&seen, "HTTP 500".into(), now, 3);
        assert!(!is_own_write(&failed, &other));
        assert!(!is_own_write(
            &failed,
            &after_failure(&failed, "HTTP 503".into(), now, 3)
        ));
        assert!(!is_own_write(&failed, &sent));
        assert!(!is_own_write(&sent, &after_success(&failed, now)));
    }

    #[test]
    fn the_next_attempt_is_due_retry_delay_after_the_last_failure() {
        let fresh = row(Status::Pending, 0);
        assert_eq!(due_at(&fresh, Duration::from_secs(5)), None);
        let retried = row(Status::Pending, 1);
        assert_eq!(
            due_at(&retried, Duration::from_secs(5)),
            Some(retried.updated_at + chrono::Duration::seconds(5))
        );
    }
}
