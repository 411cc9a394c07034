//! R-004's decision table as pure functions (CONTRACT §3): what a success,
//! a failure and a resend make of a row, and when its next attempt is due.
//! The store's conditional writes, the batched status writer and the job
//! all take their next state from here; nothing here does I/O.
//!
//! | situation      | attempts before | status after            |
//! |----------------|-----------------|-------------------------|
//! | success (2xx)  | any             | `sent`, `sent_at` = now |
//! | failure        | < max − 1       | `pending`, attempts + 1 |
//! | failure        | max − 1         | `failed`, attempts = max|
//! | manual resend  | failed          | `pending`, attempts 0   |
//!
//! The resend is one conditional UPDATE (`WHERE status = 'failed'`) in
//! [`crate::store::Store::retry`]; it needs no computed state.

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
