//! The console's HTML (maud): one function per page, plain forms and
//! tables, a little inline CSS, no scripts.

use std::time::Duration;

use chrono::NaiveDateTime;
use entity::{OutboxEventRow, Status};
use maud::{html, Markup, PreEscaped, DOCTYPE};

pub use super::chart::chart;
use super::session::Session;
use super::EventsQuery;
use crate::operator::ResendFilters;
use crate::store::chart::Chart;
use crate::store::TableStats;

const CSS: &str = "
body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#24292f;color:#fff;padding:.5rem 1.5rem;display:flex;gap:1.5rem;align-items:center}
header a{color:#fff;text-decoration:none}header .brand{font-weight:600}
header form{margin-left:auto}
main{padding:1rem 1.5rem;max-width:80rem}
h1{font-size:1.4rem;margin:.5rem 0 1rem}h2{font-size:1.1rem;margin:1.5rem 0 .5rem}
table{border-collapse:collapse;background:#fff;margin-bottom:1rem}
th,td{border:1px solid #d0d7de;padding:.3rem .6rem;text-align:left;vertical-align:top}
th{background:#f0f2f4}
pre{background:#fff;border:1px solid #d0d7de;padding:.6rem;overflow:auto;max-height:30rem;white-space:pre-wrap}
.notice{background:#dafbe1;border:1px solid #4ac26b;padding:.5rem .8rem;margin-bottom:1rem}
.error{background:#ffebe9;border:1px solid #ff8182;padding:.5rem .8rem;margin-bottom:1rem}
.muted{color:#6e7781}
.status-failed{color:#cf222e;font-weight:600}.status-pending{color:#9a6700}.status-sent{color:#1a7f37}
form.filters{display:flex;flex-wrap:wrap;gap:.6rem;align-items:end;margin-bottom:1rem}
form.filters label{display:flex;flex-direction:column;font-size:.85rem}
input,select,button{font:inherit;padding:.25rem .4rem}
button{cursor:pointer}button.danger{background:#cf222e;color:#fff;border:1px solid #a40e26}
.counts td{font-size:1.2rem;text-align:right;min-width:6rem}
";

/// One attempt (or resend) of an event, for the event page's timeline,
/// from the attempt log.
#[derive(Debug, Clone)]
pub struct AttemptView {
    /// 1-based, as the `Outbox-Attempt` header says.
    pub attempt: Option<i32>,
    pub at: NaiveDateTime,
    pub duration_ms: Option<u64>,
    /// `success`, `failure`, …
    pub outcome: String,
    pub http_status: Option<u16>,
    pub detail: Option<String>,
    /// The replica (pod) that sent it.
    pub replica: Option<String>,
    /// The dispatcher it went through.
    pub via: Option<String>,
    /// The attempt's W3C trace id (`[tracing]`): where to look in the
    /// tracing system.
    pub trace_id: Option<String>,
}

/// A configured dispatcher on the overview and the dispatchers page:
/// `state` says whether it sends, is paused (since, by whom) and, with a
/// breaker, this replica's breaker state.
#[derive(Debug, Clone)]
pub struct DispatcherView {
    pub name: String,
    pub events: Vec<String>,
    pub state: Option<String>,
}

/// The overview counts sent rows up to this many, and above it says so
/// with the database's estimate of the table's rows.
pub const SENT_COUNT_CAP: u64 = 10_000;

pub struct OverviewView {
    pub stats: Result<TableStats, String>,
    /// The sent rows up to [`SENT_COUNT_CAP`]; `Ok(None)` above it.
    pub sent_up_to: Result<Option<u64>, String>,
    pub oldest_pending_age: Option<Duration>,
    pub joined: bool,
    pub draining: bool,
    pub fetching_paused: bool,
    /// (partition, lag), from the consumer's statistics.
    pub lags: Vec<(String, i64)>,
    pub inflight: i64,
    pub dispatchers: Vec<DispatcherView>,
    /// Attempts per minute over the last hour; `None` with the log off.
    pub chart: Result<Option<Chart>, String>,
}

/// What the bulk resend page shows.
pub enum BulkStage<'a> {
    Form,
    /// The dry run; `refused`: why a confirmation was not taken (the
    /// count changed since the dry run).
    Preview {
        count: u64,
        sample: &'a [OutboxEventRow],
        refused: Option<&'a str>,
    },
    Error(&'a str),
}

pub(super) fn layout(title: &str, session: Option<&Session>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · outbox-sidecar" }
                style { (PreEscaped(CSS)) }
            }
            body {
                header {
                    span.brand { "outbox-sidecar" }
                    @if let Some(s) = session {
                        a href="/admin/console/" { "Overview" }
                        a href="/admin/console/events" { "Events" }
                        a href="/admin/console/resend" { "Bulk resend" }
                        a href="/admin/console/replay" { "Replay" }
                        a href="/admin/console/dispatchers" { "Dispatchers" }
                        form method="post" action="/admin/console/signout" {
                            input type="hidden" name="csrf" value=(s.csrf);
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

fn fmt_time(t: &NaiveDateTime) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn fmt_age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, s % 3600 / 60),
    }
}

fn status_cell(status: Status) -> Markup {
    html! { span class={ "status-" (status.as_str()) } { (status.as_str()) } }
}

fn shorten(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

pub fn message_page(title: &str, session: Option<&Session>, message: &str) -> Markup {
    layout(
        title,
        session,
        html! {
            h1 { (title) }
            p.error { (message) }
            @if session.is_some() {
                p { a href="/admin/console/" { "Back to the overview" } }
            }
        },
    )
}

pub fn sign_in(message: Option<&str>) -> Markup {
    layout(
        "Sign in",
        None,
        html! {
            h1 { "Sign in" }
            @if let Some(m) = message {
                p.error #message { (m) }
            }
            form method="post" action="/admin/console/signin" {
                p {
                    label { "Admin token (admin.token) " br;
                        input type="password" name="token" autocomplete="current-password" size="50" autofocus;
                    }
                }
                button type="submit" { "Sign in" }
            }
        },
    )
}

/// `12345678` as `12,345,678`.
fn fmt_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn overview(session: &Session, v: &OverviewView) -> Markup {
    layout(
        "Overview",
        Some(session),
        html! {
            h1 { "Overview" }
            h2 { "Events" }
            @match &v.stats {
                Ok(stats) => {
                    table.counts #counts {
                        tr { th { "pending" } th { "failed" } th { "sent" } th { "oldest pending" } }
                        tr {
                            td #count-pending { a href="/admin/console/events?status=pending" { (stats.pending) } }
                            td #count-failed { a href="/admin/console/events?status=failed" { (stats.failed) } }
                            td #count-sent {
                                a href="/admin/console/events?status=sent" {
                                    @match &v.sent_up_to {
                                        Ok(Some(n)) => (n),
                                        Ok(None) => {
                                            "over " (fmt_thousands(SENT_COUNT_CAP))
                                            @if let Some(rows) = stats.estimated_rows {
                                                " (≈ " (fmt_thousands(rows.max(0) as u64)) " rows in the table)"
                                            }
                                        }
                                        Err(_) => "—",
                                    }
                                }
                            }
                            td #oldest-pending {
                                @match v.oldest_pending_age { Some(age) => (fmt_age(age)), None => "—" }
                            }
                        }
                    }
                }
                Err(e) => { p.error { "The database did not answer: " (e) } }
            }
            (chart("chart-all", &v.chart))
            h2 { "Consumer" }
            table #consumer {
                tr { th { "group" } td { @if v.draining { "shutting down" } @else if v.joined { "joined" } @else { "not joined yet" } } }
                tr { th { "fetching" } td #fetching { @if v.fetching_paused { strong { "paused" } " (events wait for jobs that are not finishing)" } @else { "running" } } }
                tr { th { "events in flight" } td { (v.inflight) } }
            }
            @if v.lags.is_empty() {
                p.muted { "No partition lag reported yet (librdkafka reports it with its statistics)." }
            } @else {
                table #lag {
                    tr { th { "partition" } th { "lag (messages)" } }
                    @for (p, lag) in &v.lags { tr { td { (p) } td { (lag) } } }
                }
            }
            h2 { a href="/admin/console/dispatchers" { "Dispatchers" } }
            table #dispatchers {
                tr { th { "dispatcher" } th { "events" } th { "state" } }
                @for d in &v.dispatchers {
                    tr {
                        td { (d.name) }
                        td { @for (i, e) in d.events.iter().enumerate() { @if i > 0 { ", " } code { (e) } } }
                        td { @match &d.state { Some(s) => (s), None => span.muted { "unknown (the database did not answer)" } } }
                    }
                }
            }
        },
    )
}

/// The events list; `ordering`: `[ordering]` is on, so the status
/// filter offers `held`.
pub(crate) fn events(
    session: &Session,
    q: &EventsQuery,
    ordering: bool,
    rows: &[OutboxEventRow],
    next: Option<&str>,
    error: Option<&str>,
) -> Markup {
    let status = q
        .status
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or("failed");
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    let bulk_query = {
        let mut s = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("event_name", &q.event_name),
            ("error_contains", &q.error_contains),
            ("failed_since", &q.failed_since),
            ("failed_until", &q.failed_until),
        ] {
            if let Some(v) = v.as_deref().filter(|v| !v.trim().is_empty()) {
                s.append_pair(k, v);
            }
        }
        s.finish()
    };
    layout(
        "Events",
        Some(session),
        html! {
            h1 { "Events" }
            form.filters method="get" action="/admin/console/events" {
                label { "status" select name="status" {
                    @for s in ["failed", "pending", "sent", "all"] {
                        option value=(s) selected[s == status] { (s) }
                    }
                    @if ordering {
                        option value="held" selected[status == "held"] { "held (pending behind a failed event)" }
                    }
                } }
                label { "event name" input type="text" name="event_name" value=(text(&q.event_name)); }
                label { "error contains" input type="text" name="error_contains" value=(text(&q.error_contains)); }
                label { "failed (changed) since, UTC" input type="text" name="failed_since" placeholder="2026-12-01 02:00" value=(text(&q.failed_since)); }
                label { "until" input type="text" name="failed_until" value=(text(&q.failed_until)); }
                button type="submit" { "Filter" }
            }
            @if let Some(e) = error { p.error #error { (e) } }
            @if status == "failed" && error.is_none() {
                p { a href={ "/admin/console/resend?" (bulk_query) } { "Resend the failed events these filters select…" } }
            }
            @if rows.is_empty() && error.is_none() {
                p.muted #empty { "No events." }
            } @else if !rows.is_empty() {
                table #events {
                    tr { th { "id" } th { "event name" } th { "status" } th { "attempts" } th { "last error" } th { "updated" } }
                    @for r in rows {
                        tr {
                            td { a href={ "/admin/console/events/" (r.id) } { (r.id) } }
                            td { code { (r.event_name) } }
                            td { (status_cell(r.status)) }
                            td { (r.attempts) }
                            td { @if let Some(e) = &r.last_error { (shorten(e, 120)) } }
                            td { (fmt_time(&r.updated_at)) }
                        }
                    }
                }
            }
            @if let Some(n) = next {
                p { a #next href={ "/admin/console/events?" (n) } { "Older events →" } }
            }
        },
    )
}

pub fn event(
    session: &Session,
    row: &OutboxEventRow,
    attempts: &[AttemptView],
    notice: Option<&str>,
    behind: Option<(i64, Status)>,
    why: Option<&crate::why::Why>,
) -> Markup {
    let payload = row.payload.pretty();
    layout(
        &format!("Event {}", row.id),
        Some(session),
        html! {
            h1 { "Event " (row.id) }
            @if let Some(n) = notice { p.notice #notice { (n) } }
            table #event {
                tr { th { "event name" } td { code { (row.event_name) } } }
                tr { th { "status" } td #status { (status_cell(row.status)) } }
                @if let Some((b, status)) = behind {
                    tr {
                        th { "ordering" }
                        td #held-behind {
                            @if status == Status::Failed { "held behind event " } @else { "waiting behind event " }
                            a href={ "/admin/console/events/" (b) } { (b) }
                            " (" (status) ")"
                            @if status == Status::Failed { ": sent once that event is resent and sent" }
                        }
                    }
                }
                tr { th { "attempts" } td #attempts { (row.attempts) } }
                tr { th { "created" } td { (fmt_time(&row.created_at)) } }
                tr { th { "updated" } td { (fmt_time(&row.updated_at)) } }
                tr { th { "sent" } td { @match &row.sent_at { Some(t) => (fmt_time(t)), None => "—" } } }
            }
            @if let Some(w) = why.filter(|_| row.status == Status::Pending) {
                section #why {
                    h2 { "Why it is not sent yet" }
                    p #why-summary { strong { (w.reason) } ": " (w.summary) }
                    ul { @for e in &w.evidence { li { (e) } } }
                    p #why-action { "Do: " (w.action) }
                    p.muted { "Answered by " (w.answered_by) }
                }
            }
            @if row.status == Status::Failed {
                form method="post" action={ "/admin/console/events/" (row.id) "/resend" } {
                    input type="hidden" name="csrf" value=(session.csrf);
                    button #resend type="submit" { "Resend (set to pending)" }
                }
            }
            h2 { "Last error" }
            @match &row.last_error {
                Some(e) => pre #last-error { (e) },
                None => p.muted { "none" },
            }
            h2 { "Attempts" }
            @if attempts.is_empty() {
                p.muted #timeline { "no attempt recorded (the attempt log is off, or nothing was sent yet)" }
            } @else {
                table #timeline {
                    tr { th { "#" } th { "at" } th { "outcome" } th { "HTTP" } th { "duration" } th { "detail" } th { "replica" } th { "via" } th { "trace" } }
                    @for a in attempts {
                        tr {
                            td { @if let Some(n) = a.attempt { (n) } }
                            td { (fmt_time(&a.at)) }
                            td { (a.outcome) }
                            td { @if let Some(s) = a.http_status { (s) } }
                            td { @if let Some(d) = a.duration_ms { (d) " ms" } }
                            td { @if let Some(d) = &a.detail { (shorten(d, 200)) } }
                            td { @if let Some(r) = &a.replica { (r) } }
                            td { @if let Some(v) = &a.via { (v) } }
                            td.trace { @if let Some(t) = &a.trace_id { code { (t) } } }
                        }
                    }
                }
            }
            h2 { "Payload" }
            pre #payload { (payload) }
        },
    )
}

/// One dispatcher on the dispatchers page.
#[derive(Debug, Clone)]
pub struct DispatcherRow {
    pub view: DispatcherView,
    pub paused: bool,
    /// (successes, failures) in the attempt log over the last 15 minutes;
    /// `None` with the log off.
    pub recent: Option<(i64, i64)>,
    /// Its attempts per minute over the last hour; `None` with the log off.
    pub chart: Result<Option<Chart>, String>,
    /// Its rate limit for the group and this replica's share (requests a
    /// second), when it has one.
    pub rate: Option<(crate::dispatch::rate::Rate, f64)>,
}

/// The dispatchers page: state, recent failure rate, pause and resume.
pub fn dispatchers(session: &Session, rows: &[DispatcherRow], notice: Option<&str>) -> Markup {
    layout(
        "Dispatchers",
        Some(session),
        html! {
            h1 { "Dispatchers" }
            @if let Some(n) = notice { p.notice #notice { (n) } }
            p.muted { "A paused dispatcher's events stay pending and use no attempt; every replica sees a pause within dispatch.pause_refresh. Resume announces its pending events again through the change feed." }
            table #dispatcher-list {
                tr { th { "dispatcher" } th { "events" } th { "state" } th { "last 15 min (attempt log)" } th { "rate limit" } th { "" } }
                @for r in rows {
                    tr id={ "dispatcher-" (r.view.name) } {
                        td { (r.view.name) }
                        td { @for (i, e) in r.view.events.iter().enumerate() { @if i > 0 { ", " } code { (e) } } }
                        td.state { @match &r.view.state { Some(s) => (s), None => span.muted { "unknown" } } }
                        td.rate {
                            @match r.recent {
                                None => span.muted { "attempt log off" },
                                Some((ok, failed)) if ok + failed == 0 => span.muted { "no attempts" },
                                Some((ok, failed)) => {
                                    (failed) " failed of " (ok + failed)
                                    " (" (format!("{:.0}", 100.0 * failed as f64 / (ok + failed) as f64)) "%)"
                                }
                            }
                        }
                        td.rate-limit {
                            @match r.rate {
                                None => span.muted { "none" },
                                Some((limit, share)) => {
                                    (format!("{:.1}", limit.per_second)) "/s, burst " (limit.burst)
                                    " for the group; this replica " (format!("{share:.1}")) "/s"
                                }
                            }
                        }
                        td {
                            @if r.paused {
                                form method="post" action={ "/admin/console/dispatchers/" (r.view.name) "/resume" } {
                                    input type="hidden" name="csrf" value=(session.csrf);
                                    button.resume type="submit" { "Resume" }
                                }
                            } @else {
                                form method="post" action={ "/admin/console/dispatchers/" (r.view.name) "/pause" } {
                                    input type="hidden" name="csrf" value=(session.csrf);
                                    input type="text" name="label" placeholder="why (optional)";
                                    button.pause.danger type="submit" { "Pause" }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Attempts per minute, last hour" }
            @for r in rows {
                h3 { (r.view.name) }
                (chart(&format!("chart-{}", r.view.name), &r.chart))
            }
        },
    )
}

fn filter_fields(f: &ResendFilters, dispatchers: &[&str], hidden: bool) -> Markup {
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    let d = f.dispatcher.as_deref().unwrap_or("");
    if hidden {
        return html! {
            @for (k, v) in [("event_name", &f.event_name), ("dispatcher", &f.dispatcher), ("error_contains", &f.error_contains), ("failed_since", &f.failed_since), ("failed_until", &f.failed_until)] {
                @if let Some(v) = v { input type="hidden" name=(k) value=(v); }
            }
        };
    }
    html! {
        label { "event name" input type="text" name="event_name" value=(text(&f.event_name)); }
        label { "dispatcher" select name="dispatcher" {
            option value="" selected[d.is_empty()] { "any" }
            @for name in dispatchers { option value=(name) selected[*name == d] { (name) } }
        } }
        label { "error contains" input type="text" name="error_contains" value=(text(&f.error_contains)); }
        label { "failed since, UTC" input type="text" name="failed_since" placeholder="2026-12-01 02:00" value=(text(&f.failed_since)); }
        label { "failed until" input type="text" name="failed_until" value=(text(&f.failed_until)); }
    }
}

pub fn bulk(
    session: &Session,
    f: &ResendFilters,
    dispatchers: &[&str],
    stage: BulkStage<'_>,
) -> Markup {
    layout(
        "Bulk resend",
        Some(session),
        html! {
            h1 { "Resend failed events" }
            p.muted { "Sets the failed events the filters select back to pending (attempts 0); the sidecar sends them again. A dry run comes first." }
            form.filters method="get" action="/admin/console/resend" {
                (filter_fields(f, dispatchers, false))
                input type="hidden" name="preview" value="true";
                button #dry-run type="submit" { "Dry run" }
            }
            @match stage {
                BulkStage::Form => {}
                BulkStage::Error(e) => { p.error #error { (e) } }
                BulkStage::Preview { count, sample, refused } => {
                    @if let Some(why) = refused { p.error #refused { (why) } }
                    p #would-resend { strong { (count) } " failed event" @if count != 1 { "s" } " would be resent." }
                    @if count > 0 {
                        @if !sample.is_empty() {
                            p.muted { "The newest " (sample.len()) ":" }
                            table #sample {
                                tr { th { "id" } th { "event name" } th { "last error" } th { "failed" } }
                                @for r in sample {
                                    tr {
                                        td { a href={ "/admin/console/events/" (r.id) } { (r.id) } }
                                        td { code { (r.event_name) } }
                                        td { @if let Some(e) = &r.last_error { (shorten(e, 120)) } }
                                        td { (fmt_time(&r.updated_at)) }
                                    }
                                }
                            }
                        }
                        form method="post" action="/admin/console/resend" {
                            input type="hidden" name="csrf" value=(session.csrf);
                            (filter_fields(f, dispatchers, true))
                            input type="hidden" name="confirm" value=(count);
                            button.danger #confirm type="submit" { "Resend " (count) " event" @if count != 1 { "s" } }
                        }
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: Status, last_error: Option<&str>) -> OutboxEventRow {
        let t = chrono::DateTime::from_timestamp(1_764_554_400, 0)
            .unwrap()
            .naive_utc();
        OutboxEventRow {
            id: 7,
            event_name: "accounts.purchase_create".into(),
            payload: entity::Payload::from(&serde_json::json!({"note": "<b>x</b>"})),
            status,
            attempts: 3,
            last_error: last_error.map(str::to_owned),
            sent_at: None,
            created_at: t,
            updated_at: t,
            traceparent: None,
            tracestate: None,
            sequence: None,
        }
    }

    fn session() -> Session {
        Session {
            csrf: "c5rf".into(),
        }
    }

    #[test]
    fn row_text_is_escaped() {
        let html = event(
            &session(),
            &row(Status::Failed, Some("<script>alert(1)</script>")),
            &[],
            None,
            None,
            None,
        )
        .into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("&lt;b&gt;x&lt;/b&gt;"));
    }

    #[test]
    fn only_a_failed_event_has_a_resend_form_and_it_carries_the_csrf_token() {
        let failed = event(
            &session(),
            &row(Status::Failed, Some("HTTP 503")),
            &[],
            None,
            None,
            None,
        )
        .into_string();
        assert!(failed.contains(r#"action="/admin/console/events/7/resend""#));
        assert!(failed.contains(r#"name="csrf" value="c5rf""#));
        let sent = event(&session(), &row(Status::Sent, None), &[], None, None, None).into_string();
        assert!(!sent.contains("/events/7/resend"));
    }

    #[test]
    fn the_timeline_shows_attempts_or_says_none_were_recorded() {
        let r = row(Status::Failed, Some("HTTP 503"));
        let none = event(&session(), &r, &[], None, None, None).into_string();
        assert!(none.contains("no attempt recorded"));
        let one = AttemptView {
            attempt: Some(2),
            at: r.updated_at,
            duration_ms: Some(41),
            outcome: "failure".into(),
            http_status: Some(503),
            detail: Some("HTTP 503: down".into()),
            replica: Some("app-7d9f-x2".into()),
            via: Some("accounts".into()),
            trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
        };
        let html = event(&session(), &r, &[one], None, None, None).into_string();
        assert!(!html.contains("no attempt recorded"));
        for text in [
            "503",
            "41 ms",
            "app-7d9f-x2",
            "accounts",
            "failure",
            "4bf92f3577b34da6a3ce929d0e0e4736",
        ] {
            assert!(html.contains(text), "{text}");
        }
    }

    #[test]
    fn a_held_event_says_what_it_waits_behind_with_a_link() {
        let r = row(Status::Pending, None);
        let held = event(&session(), &r, &[], None, Some((5, Status::Failed)), None).into_string();
        assert!(held.contains("held behind event"), "{held}");
        assert!(held.contains(r#"href="/admin/console/events/5""#), "{held}");
        let waiting =
            event(&session(), &r, &[], None, Some((6, Status::Pending)), None).into_string();
        assert!(waiting.contains("waiting behind event"), "{waiting}");
        let free = event(&session(), &r, &[], None, None, None).into_string();
        assert!(!free.contains("held-behind"));
    }
}
