//! What an operator asks of the table during and after an outage, in one
//! place for the CLI, the admin API and the web console: which failed rows
//! a bulk resend takes (by event name, dispatcher, error text, failure
//! time), the resends themselves, which pending rows to announce again
//! (`retrigger`), and pausing or resuming a dispatcher.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::NaiveDateTime;
use entity::{OutboxEventRow, Status};

use crate::metrics::Metrics;
use crate::store::history::Caller;
use crate::store::{FailedFilter, RetriggerFilter, RetryRefused, Store, StoreError};

/// A bulk resend above this many rows must be confirmed (`--yes`).
pub const CONFIRM_ABOVE: u64 = 1_000;

/// How many rows a dry run shows.
pub const SAMPLE: u64 = 10;

/// The filters of a bulk resend as an operator types them.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct ResendFilters {
    pub event_name: Option<String>,
    pub dispatcher: Option<String>,
    pub error_contains: Option<String>,
    pub failed_since: Option<String>,
    pub failed_until: Option<String>,
}

impl ResendFilters {
    /// The filters in words (`every failed event, dispatcher accounts`),
    /// and the CLI command that runs the same resend again.
    pub fn words(&self) -> (String, String) {
        let mut target = "every failed event".to_owned();
        let mut rerun = "outbox-sidecar events retry --all-failed".to_owned();
        for (flag, value) in [
            ("event-name", &self.event_name),
            ("dispatcher", &self.dispatcher),
            ("error-contains", &self.error_contains),
            ("failed-since", &self.failed_since),
            ("failed-until", &self.failed_until),
        ] {
            if let Some(v) = value {
                target.push_str(&format!(", {} {v:?}", flag.replace('-', " ")));
                rerun.push_str(&format!(" --{flag} {}", shell_word(v)));
            }
        }
        (target, rerun)
    }

    /// The store's filter; `dispatchers` maps each dispatcher to its event
    /// names. The error names the filter that is wrong.
    pub fn to_filter(
        &self,
        dispatchers: &BTreeMap<String, Vec<String>>,
    ) -> Result<FailedFilter, String> {
        let mut names: Option<Vec<String>> = self.event_name.clone().map(|n| vec![n]);
        if let Some(d) = &self.dispatcher {
            let events = dispatchers.get(d).ok_or_else(|| {
                let known: Vec<&str> = dispatchers.keys().map(String::as_str).collect();
                format!(
                    "dispatcher: no dispatcher {d:?} (configured: {})",
                    known.join(", ")
                )
            })?;
            names = Some(match names {
                // Both given: the event name must be one of the dispatcher's.
                Some(n) => n.into_iter().filter(|n| events.contains(n)).collect(),
                None => events.clone(),
            });
        }
        Ok(FailedFilter {
            event_names: names,
            error_contains: self.error_contains.clone().filter(|t| !t.is_empty()),
            failed_since: self
                .failed_since
                .as_deref()
                .map(|t| parse_time(t).map_err(|e| format!("failed_since: {e}")))
                .transpose()?,
            failed_until: self
                .failed_until
                .as_deref()
                .map(|t| parse_time(t).map_err(|e| format!("failed_until: {e}")))
                .transpose()?,
        })
    }
}

/// A dispatcher as operators see it: its event names, whether it is
/// paused (group-wide) and, where known (the sidecar's own admin API),
/// this replica's breaker.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct DispatcherView {
    pub name: String,
    pub events: Vec<String>,
    pub paused: bool,
    pub paused_at: Option<NaiveDateTime>,
    pub paused_via: Option<String>,
    pub paused_label: Option<String>,
    /// `closed`, `open`, `half-open`; absent without a breaker (or from
    /// the CLI, which has no breaker).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker: Option<String>,
}

/// Why a dispatcher action was not done.
#[derive(Debug, thiserror::Error)]
pub enum DispatcherError {
    #[error("no dispatcher {name:?} (configured: {known})")]
    Unknown { name: String, known: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The pause may be gone but not every parked event was announced
    /// again: nothing is lost (the rows are pending), and resuming again
    /// announces them.
    #[error(
        "dispatcher {name}: the resume did not finish: {source}. Its events are still pending \
         in the table, none is lost; once the database accepts writes, run the resume again \
         (outbox-sidecar dispatchers resume {name}): it announces every pending event of the \
         dispatcher again"
    )]
    ResumeUnfinished { name: String, source: StoreError },
}

fn known(dispatchers: &BTreeMap<String, Vec<String>>, name: &str) -> Result<(), DispatcherError> {
    if dispatchers.contains_key(name) {
        return Ok(());
    }
    Err(DispatcherError::Unknown {
        name: name.to_owned(),
        known: dispatchers.keys().cloned().collect::<Vec<_>>().join(", "),
    })
}

/// Every configured dispatcher with its pause; `breakers` from this
/// replica when known.
pub async fn dispatchers(
    store: &Store,
    dispatchers: &BTreeMap<String, Vec<String>>,
    breakers: &std::collections::HashMap<String, &'static str>,
) -> Result<Vec<DispatcherView>, StoreError> {
    let pauses = store.pauses().await?;
    Ok(dispatchers
        .iter()
        .map(|(name, events)| {
            let pause = pauses.iter().find(|p| &p.dispatcher == name);
            DispatcherView {
                name: name.clone(),
                events: events.clone(),
                paused: pause.is_some(),
                paused_at: pause.map(|p| p.paused_at),
                paused_via: pause.map(|p| p.via.clone()),
                paused_label: pause.and_then(|p| p.label.clone()),
                breaker: breakers.get(name).map(|s| (*s).to_owned()),
            }
        })
        .collect())
}

/// What a pause or resume did, in the words every surface shows.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct DispatcherAction {
    pub dispatcher: String,
    pub paused: bool,
    /// Whether this call changed anything.
    pub changed: bool,
    /// On resume: pending events announced again.
    pub retriggered: u64,
    pub message: String,
}

/// Pauses `name` group-wide (every replica within `dispatch.pause_refresh`).
pub async fn pause(
    store: &Store,
    dispatchers: &BTreeMap<String, Vec<String>>,
    name: &str,
    caller: &Caller,
) -> Result<DispatcherAction, DispatcherError> {
    known(dispatchers, name)?;
    let changed = store.pause(name, caller).await?;
    Ok(DispatcherAction {
        dispatcher: name.to_owned(),
        paused: true,
        changed,
        retriggered: 0,
        message: if changed {
            format!("dispatcher {name} paused: its events stay pending, no attempt is used")
        } else {
            format!("dispatcher {name} was already paused")
        },
    })
}

/// Resumes `name` and announces its pending events again, whether or not
/// it was paused: run again, it repairs a resume that failed half-way.
/// Progress goes to the log, a line per 10,000 rows.
pub async fn resume(
    store: &Store,
    dispatchers: &BTreeMap<String, Vec<String>>,
    name: &str,
) -> Result<DispatcherAction, DispatcherError> {
    let mut logged = 0u64;
    resume_with_progress(store, dispatchers, name, &mut |n| {
        if n / 10_000 > logged / 10_000 {
            tracing::info!(
                dispatcher = name,
                announced = n,
                "resuming: pending events announced again so far"
            );
        }
        logged = n;
    })
    .await
}

/// [`resume`], `progress` getting the running count of rows announced
/// after each committed batch.
pub async fn resume_with_progress(
    store: &Store,
    dispatchers: &BTreeMap<String, Vec<String>>,
    name: &str,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<DispatcherAction, DispatcherError> {
    known(dispatchers, name)?;
    let events = &dispatchers[name];
    let (was_paused, n) = match store.resume(name, events, progress).await {
        Ok(done) => done,
        Err(e) => {
            return Err(DispatcherError::ResumeUnfinished {
                name: name.to_owned(),
                source: e,
            })
        }
    };
    Ok(DispatcherAction {
        dispatcher: name.to_owned(),
        paused: false,
        changed: was_paused,
        retriggered: n,
        message: if was_paused {
            format!("dispatcher {name} resumed: {n} pending event(s) announced again")
        } else {
            format!("dispatcher {name} was not paused: {n} pending event(s) announced again")
        },
    })
}

/// `v` as one shell word.
pub fn shell_word(v: &str) -> String {
    if !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:,/@+=".contains(c))
    {
        v.to_owned()
    } else {
        format!("'{}'", v.replace('\'', "'\\''"))
    }
}

/// A time as operators write it: RFC 3339 (`2026-12-01T02:00:00Z`,
/// `…+01:00`), or without a zone (`2026-12-01 02:00[:00]`, taken as UTC).
pub fn parse_time(s: &str) -> Result<NaiveDateTime, String> {
    let s = s.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.naive_utc());
    }
    for format in [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, format) {
            return Ok(t);
        }
    }
    Err(format!(
        "{s:?} is not a time (expected e.g. 2026-12-01T02:00:00Z or \"2026-12-01 02:00\" in UTC)"
    ))
}

/// The `status` a bulk resend may name: none, or `failed`.
pub fn check_resend_status(status: Option<&str>) -> Result<(), String> {
    match status.map(str::parse::<Status>).transpose() {
        Ok(None) | Ok(Some(Status::Failed)) => Ok(()),
        Ok(Some(other)) => Err(format!(
            "status: only failed events can be resent, not {other}"
        )),
        Err(e) => Err(format!("status: {e}")),
    }
}

/// Resends one failed event (failed -> pending, attempts 0), R-004's
/// "Reenviar": the API's `POST /admin/events/{id}/retry`, the console's
/// resend button and `events retry ID`. With `metrics`, the table gauges
/// are read again so the resend shows at once.
pub async fn resend_one(
    store: &Store,
    metrics: Option<&Metrics>,
    id: i64,
    caller: &Caller,
) -> Result<Result<OutboxEventRow, RetryRefused>, StoreError> {
    let result = store.retry(id, caller).await?;
    if result.is_ok() {
        tracing::info!(id, via = caller.via.as_str(), label = ?caller.label, "resent by an operator: failed -> pending");
        if let Some(metrics) = metrics {
            refresh_gauges(store, metrics).await;
        }
    }
    Ok(result)
}

/// What a bulk resend would take: how many rows, and the newest [`SAMPLE`].
pub async fn preview_resend(
    store: &Store,
    filter: &FailedFilter,
) -> Result<(u64, Vec<OutboxEventRow>), StoreError> {
    store.preview_failed(filter, SAMPLE).await
}

/// Resends every failed event `filter` selects; how many went back to
/// pending.
pub async fn resend_failed(
    store: &Store,
    metrics: Option<&Metrics>,
    filter: &FailedFilter,
    caller: &Caller,
) -> Result<u64, StoreError> {
    let n = store.retry_failed(filter, caller).await?;
    tracing::info!(count = n, filter = ?filter, via = caller.via.as_str(), label = ?caller.label, "failed events resent by an operator");
    if let Some(metrics) = metrics {
        refresh_gauges(store, metrics).await;
    }
    Ok(n)
}

/// [`resend_failed`], `progress` getting the running count after each
/// committed chunk.
pub async fn resend_failed_with_progress(
    store: &Store,
    metrics: Option<&Metrics>,
    filter: &FailedFilter,
    caller: &Caller,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<u64, StoreError> {
    let n = store
        .retry_failed_with_progress(filter, caller, progress)
        .await?;
    tracing::info!(count = n, filter = ?filter, via = caller.via.as_str(), label = ?caller.label, "failed events resent by an operator");
    if let Some(metrics) = metrics {
        refresh_gauges(store, metrics).await;
    }
    Ok(n)
}

async fn refresh_gauges(store: &Store, metrics: &Metrics) {
    if let Ok(stats) = store.stats().await {
        metrics.set_table_stats(&stats, crate::store::now());
    }
}

/// The rows `events retrigger` touches: ids, or pending rows unchanged for
/// longer than a duration (`10m`, `2h`), optionally of one event name.
pub fn retrigger_filter(
    ids: Vec<i64>,
    pending_older_than: Option<&str>,
    event_name: Option<String>,
) -> Result<RetriggerFilter, String> {
    let older_than: Option<Duration> = pending_older_than
        .map(|d| crate::config::duration::parse(d).map_err(|e| format!("pending_older_than: {e}")))
        .transpose()?;
    if ids.is_empty() && older_than.is_none() {
        return Err("give event ids or pending_older_than".into());
    }
    if !ids.is_empty() && older_than.is_some() {
        return Err("give event ids or pending_older_than, not both".into());
    }
    Ok(RetriggerFilter {
        ids,
        older_than,
        event_name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_in_the_forms_operators_type() {
        let utc = parse_time("2026-12-01T02:00:00Z").unwrap();
        assert_eq!(parse_time("2026-12-01T03:00:00+01:00").unwrap(), utc);
        assert_eq!(parse_time("2026-12-01 02:00").unwrap(), utc);
        assert_eq!(parse_time("2026-12-01T02:00:00.000").unwrap(), utc);
        assert!(parse_time("yesterday").unwrap_err().contains("not a time"));
    }

    #[test]
    fn a_dispatcher_stands_for_its_event_names() {
        let d = BTreeMap::from([(
            "accounts".to_owned(),
            vec!["a.one".to_owned(), "a.two".to_owned()],
        )]);
        let f = ResendFilters {
            dispatcher: Some("accounts".into()),
            ..Default::default()
        };
        assert_eq!(
            f.to_filter(&d).unwrap().event_names.unwrap(),
            ["a.one", "a.two"]
        );
        let both = ResendFilters {
            dispatcher: Some("accounts".into()),
            event_name: Some("b.other".into()),
            ..Default::default()
        };
        assert_eq!(
            both.to_filter(&d).unwrap().event_names.unwrap(),
            Vec::<String>::new()
        );
        let unknown = ResendFilters {
            dispatcher: Some("billing".into()),
            ..Default::default()
        };
        assert!(unknown
            .to_filter(&d)
            .unwrap_err()
            .starts_with("dispatcher: no dispatcher"));
        let bad = ResendFilters {
            failed_since: Some("noon".into()),
            ..Default::default()
        };
        assert!(bad.to_filter(&d).unwrap_err().starts_with("failed_since:"));
    }

    #[test]
    fn only_failed_events_are_resent() {
        assert!(check_resend_status(None).is_ok());
        assert!(check_resend_status(Some("failed")).is_ok());
        assert_eq!(
            check_resend_status(Some("sent")).unwrap_err(),
            "status: only failed events can be resent, not sent"
        );
        assert!(check_resend_status(Some("lost"))
            .unwrap_err()
            .starts_with("status: "));
    }

    #[test]
    fn retrigger_needs_ids_or_an_age() {
        assert!(retrigger_filter(vec![], None, None).is_err());
        assert!(retrigger_filter(vec![1], Some("10m"), None).is_err());
        let f = retrigger_filter(vec![], Some("10m"), Some("a".into())).unwrap();
        assert_eq!(f.older_than, Some(Duration::from_secs(600)));
        assert!(retrigger_filter(vec![], Some("ten"), None)
            .unwrap_err()
            .starts_with("pending_older_than:"));
    }
}
