//! Why an event is not sent yet: the one reason, its evidence and what to
//! do, the same answer for `events why ID`, `GET /admin/events/{id}/why`
//! and the console's event page.
//!
//! The reasons are looked at in the order an event meets them: its status,
//! a dispatcher for its name, a group-wide pause, a breaker open on the
//! replica asked, the event before it in its aggregate (`[ordering]`), a
//! retry whose delay has not passed, a change made so recently that its
//! change event may still be on its way (and the asked replica's consumer
//! lag), and else **nothing explains it**: then `events retrigger ID`.
//! What lives only in one replica's memory (a job in flight, a retry's due
//! time and a receiver's Retry-After, a rate-limit turn, a place in an
//! aggregate's line) is asked of the replica's scheduler when a replica
//! answers ([`Replica::scheduler`]); a replica that has no work for the
//! event names the group's members and their partitions (from the group's
//! metadata: each member's `client.id` is its replica name), so the
//! operator asks the one that owns it. An answer from the CLI, which runs
//! outside every replica, says so.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::NaiveDateTime;
use entity::{OutboxEventRow, Status};
use serde::Serialize;

use crate::store::{now, Store, StoreError};

/// A pending event changed this recently may be on its way: its change
/// event still to be read, or its job running.
pub const ON_ITS_WAY: Duration = Duration::from_secs(10);

/// The answer.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Why {
    pub id: i64,
    pub status: String,
    /// One word: `sent`, `failed`, `no_dispatcher`, `paused`,
    /// `breaker_open`, `in_flight`, `rate_limited`, `queued`, `held`,
    /// `waiting_behind`, `retry_due`, `on_its_way`, `unexplained`.
    #[schema(value_type = String)]
    pub reason: &'static str,
    /// The reason in one sentence.
    pub summary: String,
    /// The facts it rests on, one per line.
    pub evidence: Vec<String>,
    /// What to do about it.
    pub action: String,
    /// Who answered: a replica's name, or `cli`.
    pub answered_by: String,
}

/// What an answer is read from besides the table.
pub struct Asked<'a> {
    pub store: &'a Store,
    /// Each dispatcher's event names.
    pub dispatchers: &'a BTreeMap<String, Vec<String>>,
    pub retry_delay: Duration,
    pub max_attempts: i32,
    /// The replica asked: its breakers and consumer lag; `None` from the CLI.
    pub replica: Option<Replica<'a>>,
}

/// What a running replica knows of itself.
pub struct Replica<'a> {
    pub name: &'a str,
    /// Each dispatcher's breaker state here (`closed`, `open`, `half-open`).
    pub breakers: BTreeMap<String, &'static str>,
    /// When each breaker that is not closed probes next.
    pub next_probes: BTreeMap<String, Duration>,
    /// This replica's consumer lag per assigned partition.
    pub lags: Vec<(String, i64)>,
    /// What this replica's scheduler says of the event (`None`: its loop
    /// did not answer).
    pub scheduler: Option<crate::consumer::Answer>,
    /// The group's members and their partitions, or why they could not be
    /// read.
    pub members: Result<Vec<crate::consumer::client::Member>, String>,
}

impl Replica<'_> {
    /// The group's members, one phrase each.
    fn members_text(&self) -> String {
        match &self.members {
            Ok(m) if m.is_empty() => "the group has no members now".to_owned(),
            Ok(m) => m
                .iter()
                .map(|m| {
                    format!(
                        "{} at {} (partitions {})",
                        m.client_id,
                        m.host,
                        m.partitions
                            .iter()
                            .map(|p| p.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
            Err(e) => format!("the group's members could not be read: {e}"),
        }
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

fn at(t: NaiveDateTime) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// Why event `id` is not sent yet; `None` when there is no such event.
pub async fn why(asked: &Asked<'_>, id: i64) -> Result<Option<Why>, StoreError> {
    let Some(row) = asked.store.get(id).await? else {
        return Ok(None);
    };
    let answered_by = asked
        .replica
        .as_ref()
        .map(|r| r.name.to_owned())
        .unwrap_or_else(|| "cli".to_owned());
    let mut w = Why {
        id,
        status: row.status.to_string(),
        reason: "",
        summary: String::new(),
        evidence: vec![format!(
            "status {}, attempts {} of {}, updated_at {}",
            row.status,
            row.attempts,
            asked.max_attempts,
            at(row.updated_at)
        )],
        action: String::new(),
        answered_by,
    };
    let (reason, summary, action) = decide(asked, &row, &mut w.evidence).await?;
    w.reason = reason;
    w.summary = summary;
    w.action = action;
    Ok(Some(w))
}

async fn decide(
    asked: &Asked<'_>,
    row: &OutboxEventRow,
    evidence: &mut Vec<String>,
) -> Result<(&'static str, String, String), StoreError> {
    let id = row.id;
    match row.status {
        Status::Sent => {
            return Ok((
                "sent",
                format!(
                    "event {id} is sent{}",
                    row.sent_at
                        .map(|t| format!(" (at {})", at(t)))
                        .unwrap_or_default()
                ),
                format!("nothing to do; `events show {id}` has its attempts"),
            ))
        }
        Status::Failed => {
            evidence.push(format!(
                "last_error: {}",
                row.last_error.as_deref().unwrap_or("(none)")
            ));
            return Ok((
                "failed",
                format!(
                    "event {id} failed after {} attempt(s); it is not sent again by itself",
                    row.attempts
                ),
                format!("fix the receiver, then resend it: `events retry {id}`"),
            ));
        }
        Status::Pending => {}
    }
    let Some(dispatcher) = asked
        .dispatchers
        .iter()
        .find(|(_, events)| events.iter().any(|e| e == &row.event_name))
        .map(|(name, _)| name.clone())
    else {
        return Ok((
            "no_dispatcher",
            format!(
                "no dispatcher sends events named {:?}, so nothing sends event {id}",
                row.event_name
            ),
            format!(
                "add {:?} to a dispatcher's `events` (configured: {})",
                row.event_name,
                asked
                    .dispatchers
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    };
    evidence.push(format!("dispatcher {dispatcher}"));
    if let Some(p) = asked
        .store
        .pauses()
        .await?
        .into_iter()
        .find(|p| p.dispatcher == dispatcher)
    {
        evidence.push(format!(
            "paused since {} via {}{}",
            at(p.paused_at),
            p.via,
            p.label
                .as_deref()
                .map(|l| format!(" ({l})"))
                .unwrap_or_default()
        ));
        return Ok((
            "paused",
            format!(
                "dispatcher {dispatcher} is paused: its events stay pending, no attempt is used"
            ),
            format!("resume it when its receiver is ready: `dispatchers resume {dispatcher}`"),
        ));
    }
    if let Some(r) = &asked.replica {
        if let Some(state) = r.breakers.get(&dispatcher).filter(|s| **s != "closed") {
            evidence.push(format!(
                "breaker {state} on replica {}{}",
                r.name,
                r.next_probes
                    .get(&dispatcher)
                    .map(|d| if *state == "half-open" {
                        format!("; its probe is out, given up in {}", secs(*d))
                    } else {
                        format!("; next probe in {}", secs(*d))
                    })
                    .unwrap_or_default()
            ));
            return Ok((
                "breaker_open",
                format!(
                    "dispatcher {dispatcher}'s breaker is {state} on replica {}: its events are parked until a probe succeeds",
                    r.name
                ),
                "wait for the probe (after the breaker's cool_down), or pause the dispatcher while its receiver is down".to_owned(),
            ));
        }
    }
    if let Some(r) = &asked.replica {
        if let Some(found) = from_scheduler(asked, r, row, evidence) {
            return Ok(found);
        }
    }
    if let Some((before, status)) = asked.store.waits_behind(id).await? {
        evidence.push(format!(
            "event {before} of its aggregate, before it, is {status}"
        ));
        return Ok(if status == Status::Failed {
            (
                "held",
                format!("held behind failed event {before} of its aggregate ([ordering] on_failed = \"hold\")"),
                format!("resend the failed one (`events retry {before}`); this one follows it in order"),
            )
        } else {
            (
                "waiting_behind",
                format!("waiting behind pending event {before} of its aggregate: events of an aggregate go in id order"),
                format!("ask why event {before} waits: `events why {before}`"),
            )
        });
    }
    let now = now();
    let since = now.signed_duration_since(row.updated_at);
    let retry_delay = chrono::Duration::from_std(asked.retry_delay).unwrap_or_default();
    if row.attempts > 0 && since < retry_delay {
        let due = row.updated_at + retry_delay;
        evidence.push(format!(
            "last attempt failed: {}",
            row.last_error.as_deref().unwrap_or("(no error text)")
        ));
        return Ok((
            "retry_due",
            format!(
                "retry due at {} (attempt {} of {})",
                at(due),
                row.attempts + 1,
                asked.max_attempts
            ),
            "nothing: it is retried by itself (a receiver's Retry-After can push it later)"
                .to_owned(),
        ));
    }
    let lag: i64 = asked
        .replica
        .as_ref()
        .map(|r| r.lags.iter().map(|(_, l)| *l).sum())
        .unwrap_or(0);
    if let Some(r) = &asked.replica {
        if lag > 0 {
            evidence.push(format!(
                "consumer lag on replica {}: {}",
                r.name,
                r.lags
                    .iter()
                    .filter(|(_, l)| *l > 0)
                    .map(|(p, l)| format!("partition {p}: {l}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if since < chrono::Duration::from_std(ON_ITS_WAY).unwrap_or_default() || lag > 0 {
        return Ok((
            "on_its_way",
            format!(
                "changed {} s ago{}: its change event is still to be read or its attempt is under way",
                since.num_seconds().max(0),
                if lag > 0 { ", with change events still to be read" } else { "" }
            ),
            match &asked.replica {
                Some(r) => format!(
                    "ask again in a few seconds; if it stays, ask the replica that owns its partition (GET /admin/events/{id}/why there): {}",
                    r.members_text()
                ),
                None => format!("ask again in a few seconds; if it stays, `events why {id}` on the replica that owns its partition (GET /admin/events/{id}/why)"),
            },
        ));
    }
    if row.attempts > 0 {
        evidence.push(
            "a receiver's Retry-After longer than retry_delay lives in the replica that got it and is not read here"
                .to_owned(),
        );
    }
    if asked.replica.is_none() {
        evidence.push(
            "asked from the CLI: a job in flight, a rate-limit turn, a Retry-After and a breaker live in a replica's memory; \
             GET /admin/events/{id}/why on a replica sees them"
                .to_owned(),
        );
    }
    Ok((
        "unexplained",
        format!(
            "nothing explains it: pending and unchanged for {} s, no pause, no breaker, nothing before it",
            since.num_seconds()
        ),
        format!("announce it again: `events retrigger {id}` (its change event was likely lost)"),
    ))
}

/// The answer of the asked replica's scheduler, when it has work for the
/// event; else a line of evidence saying it has none and who else may.
fn from_scheduler(
    asked: &Asked<'_>,
    r: &Replica<'_>,
    row: &OutboxEventRow,
    evidence: &mut Vec<String>,
) -> Option<(&'static str, String, String)> {
    use crate::consumer::Here;
    let id = row.id;
    let Some(answer) = &r.scheduler else {
        evidence.push(format!(
            "replica {}'s scheduler did not answer within 2 s (see its /readyz)",
            r.name
        ));
        return None;
    };
    let mut partitions = answer.partitions.clone();
    partitions.sort_unstable();
    let partitions = partitions
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let Some(here) = &answer.here else {
        evidence.push(format!(
            "replica {} (partitions {}) has no work for event {id}; the group: {}",
            r.name,
            if partitions.is_empty() {
                "none".to_owned()
            } else {
                partitions
            },
            r.members_text()
        ));
        return None;
    };
    let attempt = format!("attempt {} of {}", row.attempts + 1, asked.max_attempts);
    Some(match here {
        Here::Running { for_ } => {
            evidence.push(format!("a job runs on replica {} for {}", r.name, secs(*for_)));
            (
                "in_flight",
                format!("its {attempt} is under way on replica {}, for {} so far", r.name, secs(*for_)),
                "nothing: the attempt ends within the dispatcher's timeout and writes its status".to_owned(),
            )
        }
        Here::Due { in_ } => {
            let in_ = in_.unwrap_or_default();
            let due = now() + chrono::Duration::from_std(in_).unwrap_or_default();
            let by_delay = row.updated_at
                + chrono::Duration::from_std(asked.retry_delay).unwrap_or_default();
            evidence.push(format!(
                "last attempt failed: {}",
                row.last_error.as_deref().unwrap_or("(no error text)")
            ));
            let after = if due > by_delay + chrono::Duration::seconds(1) {
                evidence.push(format!(
                    "due later than retry_delay ({}) from updated_at: the receiver's Retry-After or a breaker's probe set it",
                    humantime::format_duration(asked.retry_delay)
                ));
                " (the receiver's Retry-After)"
            } else {
                ""
            };
            (
                "retry_due",
                format!("its {attempt} is due at {}{after}, in {} (replica {})", at(due), secs(in_), r.name),
                "nothing: it is retried by itself".to_owned(),
            )
        }
        Here::Throttled { dispatcher, ahead, next_permit_in } => {
            evidence.push(format!(
                "{ahead} event(s) before it in dispatcher {dispatcher}'s rate line on replica {}{}",
                r.name,
                next_permit_in
                    .map(|d| format!("; next permit in {}", secs(d)))
                    .unwrap_or_default()
            ));
            (
                "rate_limited",
                format!("waiting for a permit of dispatcher {dispatcher}'s rate limit, {ahead} event(s) before it"),
                "nothing, or raise the dispatcher's `rate` (/admin/dispatchers shows this replica's share)".to_owned(),
            )
        }
        Here::Ready { running, max_jobs } => (
            "queued",
            format!("read and waiting for a job slot on replica {} ({running} of {max_jobs} running)", r.name),
            "nothing: it starts when a slot frees (dispatch.max_in_flight bounds the slots)".to_owned(),
        ),
        Here::Reading | Here::Recheck { .. } | Here::Deferred => (
            "on_its_way",
            format!("its change event is being decided on replica {} (its row is being read)", r.name),
            "ask again in a few seconds".to_owned(),
        ),
        Here::InLine { active, ahead } => (
            "waiting_behind",
            format!("waiting in its aggregate's line behind event {active} ({ahead} more before it) on replica {}: events of an aggregate go in id order", r.name),
            format!("ask why event {active} waits: `events why {active}`"),
        ),
    })
}

impl Why {
    /// The answer as the CLI prints it.
    pub fn text(&self) -> String {
        let mut s = format!(
            "event {}: {}\n  reason: {}\n",
            self.id, self.summary, self.reason
        );
        for e in &self.evidence {
            s.push_str(&format!("  - {e}\n"));
        }
        s.push_str(&format!(
            "  do: {}\n  answered by: {}\n",
            self.action, self.answered_by
        ));
        s
    }
}
