//! `events replay`, `POST /admin/events/replay` and the console's Replay
//! page, one code path: sent events sent again on purpose, at a pace, in
//! id order, as an operation (`dispatch.operations_table`) that can be
//! followed, cancelled and carried on after its replica ends.
//!
//! A replay puts sent rows back to pending (R-004's manual resend applied
//! to a `sent` row; [`crate::store::replay`]) in id order, a few at a time
//! at `rate` rows a second: each is then an ordinary pending event, its
//! change event announces it, and the sidecar sends it with the usual
//! headers plus `Outbox-Replay: <operation id>`. The live traffic keeps
//! its place: a replay adds at most `rate` events a second to it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::dispatch::rate::Rate;
use crate::operations::{OperationView, Operations, Progress};
use crate::operator::{parse_time, shell_word};
use crate::store::history::Caller;
use crate::store::replay::{ReplayFilter, ReplayPreview};
use crate::store::{Store, StoreError};

/// The operation kind.
pub const REPLAY: &str = "replay";
/// Events a second when none is asked for.
pub const DEFAULT_RATE: f64 = 100.0;
/// Above this many events a replay needs the dry run's count.
pub const CONFIRM_ABOVE: u64 = 1_000;
/// Steps a second at most (each one transaction).
const STEPS_PER_SECOND: f64 = 10.0;
/// The longest wait after a failed step (the database not answering): a
/// replay never gives up on the database; it can be cancelled.
const MAX_STEP_BACKOFF: Duration = Duration::from_secs(10);

/// A replay as an operator types it (the CLI's flags, the API's query
/// parameters, the console's form).
#[derive(Debug, Clone, Default)]
pub struct ReplayRequest {
    pub event_names: Vec<String>,
    pub dispatcher: Option<String>,
    pub sent_since: Option<String>,
    pub sent_until: Option<String>,
    pub aggregate: Option<String>,
    /// Comma-separated ids.
    pub ids: Option<String>,
    /// Events a second.
    pub rate: Option<f64>,
}

/// What a replay runs with, kept in its operation's row (`params`), so the
/// replica that carries it on does the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayPlan {
    pub filter: ReplayFilter,
    /// Events a second.
    pub rate: f64,
    /// The last id that matched when it started: rows sent later are not
    /// its.
    pub upto: i64,
}

impl ReplayRequest {
    /// The store's filter; the error names the parameter that is wrong.
    pub fn to_filter(
        &self,
        dispatchers: &BTreeMap<String, Vec<String>>,
    ) -> Result<ReplayFilter, String> {
        if self.sent_since.is_none() && self.sent_until.is_none() {
            return Err(
                "sent_since or sent_until is required: a replay names the window the receiver lost"
                    .to_owned(),
            );
        }
        let known: Vec<&String> = dispatchers.values().flatten().collect();
        for n in &self.event_names {
            if !known.contains(&n) {
                return Err(format!(
                    "event_name: no dispatcher sends {n:?} (configured: {})",
                    known
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        let mut names: Option<Vec<String>> =
            (!self.event_names.is_empty()).then(|| self.event_names.clone());
        if let Some(d) = &self.dispatcher {
            let events = dispatchers.get(d).ok_or_else(|| {
                format!(
                    "dispatcher: no dispatcher {d:?} (configured: {})",
                    dispatchers.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            })?;
            names = Some(match names {
                Some(n) => n.into_iter().filter(|n| events.contains(n)).collect(),
                None => events.clone(),
            });
        }
        let ids = match &self.ids {
            None => None,
            Some(s) => Some(
                s.split(',')
                    .map(|i| {
                        i.trim().parse::<i64>().map_err(|_| {
                            format!("ids: {i:?} is not an event id (give ids as 1,2,3)")
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let time = |key: &str, v: &Option<String>| {
            v.as_deref()
                .map(|t| parse_time(t).map_err(|e| format!("{key}: {e}")))
                .transpose()
        };
        Ok(ReplayFilter {
            event_names: names,
            sent_since: time("sent_since", &self.sent_since)?,
            sent_until: time("sent_until", &self.sent_until)?,
            aggregate: self.aggregate.clone(),
            ids,
        })
    }

    /// The events a second it runs at: `rate` (100/s by default), never
    /// above the group-wide `rate` of a dispatcher whose events it takes.
    pub fn pace(
        &self,
        filter: &ReplayFilter,
        dispatchers: &BTreeMap<String, Vec<String>>,
        rates: &BTreeMap<String, Rate>,
    ) -> Result<f64, String> {
        let asked = self.rate.unwrap_or(DEFAULT_RATE);
        if !(asked.is_finite() && asked > 0.0) {
            return Err(format!(
                "rate: {asked} is not a number of events a second above 0"
            ));
        }
        let cap = dispatchers
            .iter()
            .filter(|(_, events)| match &filter.event_names {
                Some(names) => events.iter().any(|e| names.contains(e)),
                None => true,
            })
            .filter_map(|(name, _)| rates.get(name).map(|r| r.per_second))
            .fold(f64::INFINITY, f64::min);
        Ok(asked.min(cap))
    }

    /// The replay in words, and the command that runs it again.
    pub fn words(&self) -> (String, String) {
        let mut target = "sent events".to_owned();
        let mut rerun = "outbox-sidecar events replay".to_owned();
        for n in &self.event_names {
            target.push_str(&format!(", event name {n:?}"));
            rerun.push_str(&format!(" --event-name {}", shell_word(n)));
        }
        for (flag, value) in [
            ("dispatcher", &self.dispatcher),
            ("sent-since", &self.sent_since),
            ("sent-until", &self.sent_until),
            ("aggregate", &self.aggregate),
            ("ids", &self.ids),
        ] {
            if let Some(v) = value {
                target.push_str(&format!(", {} {v:?}", flag.replace('-', " ")));
                rerun.push_str(&format!(" --{flag} {}", shell_word(v)));
            }
        }
        if let Some(r) = self.rate {
            rerun.push_str(&format!(" --rate {r}"));
        }
        (target, rerun)
    }
}

/// Why a replay was not started.
#[derive(Debug, thiserror::Error)]
pub enum ReplayRefused {
    /// A filter or the pace is wrong.
    #[error("{0}")]
    Invalid(String),
    /// More than [`CONFIRM_ABOVE`] rows and no (or another) count given.
    #[error("{count} sent events match{}: nothing was replayed; check them with a dry run, then repeat with the count ({count}) as confirmation", if *.count > CONFIRM_ABOVE { format!(", more than {CONFIRM_ABOVE}") } else { String::new() })]
    Confirm { count: u64 },
    /// Nothing matches.
    #[error("no sent event matches: nothing to replay")]
    Nothing,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The rows a replay would take, with the pace it would run at.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct DryRun {
    #[serde(flatten)]
    pub preview: ReplayPreview,
    pub rate: f64,
    pub confirm_required: bool,
}

impl Operations {
    /// A replay's dry run: what it would take, changing nothing.
    pub async fn replay_dry_run(
        &self,
        request: &ReplayRequest,
        dispatchers: &BTreeMap<String, Vec<String>>,
        rates: &BTreeMap<String, Rate>,
    ) -> Result<DryRun, ReplayRefused> {
        let filter = request
            .to_filter(dispatchers)
            .map_err(ReplayRefused::Invalid)?;
        let rate = request
            .pace(&filter, dispatchers, rates)
            .map_err(ReplayRefused::Invalid)?;
        let preview = self
            .store()
            .replay_preview(&filter)
            .await?
            .map_err(ReplayRefused::Invalid)?;
        Ok(DryRun {
            confirm_required: preview.count > CONFIRM_ABOVE,
            preview,
            rate,
        })
    }

    /// Starts a replay: counted first; above [`CONFIRM_ABOVE`] rows only
    /// with `confirm` equal to the count, and a `confirm` given must be the
    /// count at any size.
    pub async fn replay(
        &self,
        request: &ReplayRequest,
        dispatchers: &BTreeMap<String, Vec<String>>,
        rates: &BTreeMap<String, Rate>,
        confirm: Option<u64>,
        caller: &Caller,
    ) -> Result<OperationView, ReplayRefused> {
        let dry = self.replay_dry_run(request, dispatchers, rates).await?;
        let count = dry.preview.count;
        let (Some(first), Some(upto)) = (dry.preview.first, dry.preview.last) else {
            return Err(ReplayRefused::Nothing);
        };
        match confirm {
            Some(c) if c != count => return Err(ReplayRefused::Confirm { count }),
            None if count > CONFIRM_ABOVE => return Err(ReplayRefused::Confirm { count }),
            _ => {}
        }
        let plan = ReplayPlan {
            filter: request
                .to_filter(dispatchers)
                .map_err(ReplayRefused::Invalid)?,
            rate: dry.rate,
            upto,
        };
        let (target, rerun) = request.words();
        let target = format!(
            "{target} ({count} events, ids {first}..{upto}, at {}/s)",
            dry.rate
        );
        Ok(self.start_replay(plan, target, rerun, caller).await?)
    }
}

/// Runs replay `op` from `cursor` (the last id it looked at) to its end,
/// cancelled or done: steps of `rate / 10` rows (at least 1) ten times a
/// second at most, each one transaction that also moves the cursor.
pub async fn run(
    store: Store,
    op: String,
    replica: String,
    plan: ReplayPlan,
    caller: Caller,
    progress: Progress,
    mut cursor: i64,
) -> Result<String, String> {
    let per_step = (plan.rate / STEPS_PER_SECOND).floor().max(1.0);
    let every = Duration::from_secs_f64(per_step / plan.rate);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut total = progress.get();
    let mut backoff = Duration::ZERO;
    loop {
        tick.tick().await;
        if !backoff.is_zero() {
            tokio::time::sleep(backoff).await;
        }
        let step = store
            .replay_step(
                &op,
                &replica,
                &plan.filter,
                crate::store::replay::ReplayWindow {
                    cursor,
                    upto: plan.upto,
                    limit: per_step as u64,
                },
                &caller,
            )
            .await;
        match step {
            Err(e) => {
                backoff = (backoff * 2).clamp(Duration::from_millis(200), MAX_STEP_BACKOFF);
                tracing::warn!(operation = %op, error = %e, ?backoff, cursor, "a replay step failed; trying again");
            }
            Ok(Err(refused)) => {
                let cancelled = store
                    .operation(&op)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|row| row.cancelled_at.is_some());
                if cancelled {
                    progress.cancel();
                    return Ok(format!(
                        "cancelled after {total} events (up to id {cursor}); the rest stay sent"
                    ));
                }
                return Err(refused);
            }
            Ok(Ok(step)) => {
                backoff = Duration::ZERO;
                total += step.replayed;
                progress.set(total);
                cursor = step.cursor;
                if step.done {
                    return Ok(format!("replayed {total} events"));
                }
            }
        }
    }
}
