//! The console's Replay page: the form (the API's parameters), its dry
//! run, and the confirmed replay, which goes to its operation's page
//! (where it can be followed and cancelled).

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use maud::{html, Markup};

use super::pages::layout;
use super::session::Session;
use super::{form_params, html, operation, query_params, ConsoleState};
use crate::http::replay::{replay_request, REPLAY_PARAMS};
use crate::replay::{DryRun, ReplayRefused, ReplayRequest};
use crate::store::history::{Caller, Via};

/// Where the page is.
enum Stage<'a> {
    Form,
    Error(&'a str),
    Preview {
        dry: &'a DryRun,
        refused: Option<&'a str>,
    },
}

/// `GET /admin/console/replay`: the form; with `dry_run=true`, its count,
/// first and last ids, pace and sample, and the form that confirms it.
pub(super) async fn replay_form(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    RawQuery(raw): RawQuery,
) -> Response {
    let admin = &state.admin;
    let (request, dry_run) =
        match query_params(raw.as_deref(), REPLAY_PARAMS).and_then(|p| replay_request(&p)) {
            Ok((r, dry_run, _, _)) => (r, dry_run),
            Err(e) => {
                return html(
                    StatusCode::BAD_REQUEST,
                    page(&s, &state, &ReplayRequest::default(), Stage::Error(&e)),
                )
            }
        };
    if !dry_run {
        return html(StatusCode::OK, page(&s, &state, &request, Stage::Form));
    }
    match admin
        .operations
        .replay_dry_run(&request, &admin.dispatchers, &admin.rates)
        .await
    {
        Ok(dry) => html(
            StatusCode::OK,
            page(
                &s,
                &state,
                &request,
                Stage::Preview {
                    dry: &dry,
                    refused: None,
                },
            ),
        ),
        Err(ReplayRefused::Invalid(e)) => html(
            StatusCode::BAD_REQUEST,
            page(&s, &state, &request, Stage::Error(&e)),
        ),
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            page(&s, &state, &request, Stage::Error(&e.to_string())),
        ),
    }
}

/// `POST /admin/console/replay`: the confirmed replay (the form carries
/// the dry run's count); when the count changed, the dry run again.
pub(super) async fn replay_start(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Response {
    let admin = &state.admin;
    let mut fields = REPLAY_PARAMS.to_vec();
    fields.push("csrf");
    let (request, confirm, label) =
        match form_params(raw.as_deref(), &body, &fields).and_then(|p| replay_request(&p)) {
            Ok((r, _, confirm, label)) => (r, confirm, label),
            Err(e) => {
                return html(
                    StatusCode::BAD_REQUEST,
                    page(&s, &state, &ReplayRequest::default(), Stage::Error(&e)),
                )
            }
        };
    let caller = Caller::new(Via::Console, label);
    match admin
        .operations
        .replay(&request, &admin.dispatchers, &admin.rates, confirm, &caller)
        .await
    {
        Ok(op) => operation::started(&s, Ok(op), StatusCode::OK),
        Err(ReplayRefused::Invalid(e)) => html(
            StatusCode::BAD_REQUEST,
            page(&s, &state, &request, Stage::Error(&e)),
        ),
        Err(ReplayRefused::Confirm { count }) => {
            let why = format!(
                "The dry run counted {}; {count} sent event(s) match now. Nothing was replayed: check the sample and confirm again.",
                confirm.unwrap_or(0)
            );
            match admin
                .operations
                .replay_dry_run(&request, &admin.dispatchers, &admin.rates)
                .await
            {
                Ok(dry) => html(
                    StatusCode::CONFLICT,
                    page(
                        &s,
                        &state,
                        &request,
                        Stage::Preview {
                            dry: &dry,
                            refused: Some(&why),
                        },
                    ),
                ),
                Err(e) => html(
                    StatusCode::SERVICE_UNAVAILABLE,
                    page(&s, &state, &request, Stage::Error(&e.to_string())),
                ),
            }
        }
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            page(&s, &state, &request, Stage::Error(&e.to_string())),
        ),
    }
}

/// The form's fields, filled with `r`; `hidden` for the confirming form.
fn fields(r: &ReplayRequest, dispatchers: &[&str], hidden: bool) -> Markup {
    let v = |o: &Option<String>| o.clone().unwrap_or_default();
    let names = r.event_names.join(",");
    let rate = r.rate.map(|x| x.to_string()).unwrap_or_default();
    let text = [
        ("event_name", "event names (comma-separated)", names),
        ("sent_since", "sent since (UTC)", v(&r.sent_since)),
        ("sent_until", "sent until (UTC)", v(&r.sent_until)),
        ("aggregate", "aggregate", v(&r.aggregate)),
        ("ids", "ids (comma-separated)", v(&r.ids)),
        ("rate", "events a second (default 100)", rate),
    ];
    html! {
        @if hidden {
            @for (name, _, value) in &text { input type="hidden" name=(name) value=(value); }
            input type="hidden" name="dispatcher" value=(v(&r.dispatcher));
        } @else {
            label { "dispatcher "
                select name="dispatcher" {
                    option value="" { "any" }
                    @for d in dispatchers {
                        option value=(d) selected[r.dispatcher.as_deref() == Some(*d)] { (d) }
                    }
                }
            }
            @for (name, label, value) in &text {
                label { (label) " " input type="text" name=(name) value=(value); }
            }
        }
    }
}

fn page(s: &Session, state: &ConsoleState, r: &ReplayRequest, stage: Stage<'_>) -> Markup {
    let names: Vec<&str> = state.admin.dispatchers.keys().map(String::as_str).collect();
    layout(
        "Replay",
        Some(s),
        html! {
            h1 { "Replay sent events" }
            p.muted {
                "For a receiver that accepted events and lost them: sets the sent events the filters select back to pending, "
                "in id order at the pace given, as an operation you can follow and cancel. Each request carries "
                code { "Outbox-Replay" } " with the operation's id; its " code { "Idempotency-Key" } " is the event's own. "
                "Sent since or sent until is required. A dry run comes first."
            }
            form.filters method="get" action="/admin/console/replay" {
                (fields(r, &names, false))
                input type="hidden" name="dry_run" value="true";
                button #dry-run type="submit" { "Dry run" }
            }
            @match stage {
                Stage::Form => {}
                Stage::Error(e) => { p.error #error { (e) } }
                Stage::Preview { dry, refused } => {
                    @if let Some(why) = refused { p.error #refused { (why) } }
                    p #would-replay {
                        strong { (dry.preview.count) } " sent event" @if dry.preview.count != 1 { "s" }
                        " would be replayed at " (dry.rate) "/s"
                        @if let (Some(a), Some(b)) = (dry.preview.first, dry.preview.last) { ", ids " (a) ".." (b) }
                        "."
                    }
                    @if !dry.preview.sample.is_empty() {
                        p.muted #sample { "The first: "
                            @for (i, id) in dry.preview.sample.iter().enumerate() {
                                @if i > 0 { ", " }
                                a href={ "/admin/console/events/" (id) } { (id) }
                            }
                        }
                    }
                    @if dry.preview.count > 0 {
                        form method="post" action="/admin/console/replay" {
                            input type="hidden" name="csrf" value=(s.csrf);
                            (fields(r, &names, true))
                            input type="hidden" name="confirm" value=(dry.preview.count);
                            label { "label (recorded with each event) " input type="text" name="label"; }
                            button.danger #confirm type="submit" { "Replay " (dry.preview.count) " event" @if dry.preview.count != 1 { "s" } }
                        }
                    }
                }
            }
        },
    )
}
