//! The dispatchers page: each dispatcher's state, chart and its pause
//! and resume buttons.

use super::*;

/// Every configured dispatcher with its state (paused, breaker) and the
/// recent outcomes of its attempts.
/// `charts`: with each dispatcher's chart of the last hour (the
/// dispatchers page), or without (the overview draws one for all).
pub(super) async fn dispatcher_rows(admin: &AdminState, charts: bool) -> Vec<pages::DispatcherRow> {
    let breakers = admin
        .holds
        .as_ref()
        .map(|h| h.breaker_states())
        .unwrap_or_default();
    let views = operator::dispatchers(&admin.store, &admin.dispatchers, &breakers).await;
    let since = crate::store::now() - chrono::Duration::minutes(15);
    let mut rows = Vec::new();
    for (name, events) in &admin.dispatchers {
        let found = views
            .as_ref()
            .ok()
            .and_then(|v| v.iter().find(|d| &d.name == name));
        let state = found.map(|d| {
            let mut text = match (&d.paused_at, &d.paused_via) {
                (Some(at), Some(via)) => format!(
                    "paused since {} UTC via {via}{}",
                    at.format("%Y-%m-%d %H:%M:%S"),
                    d.paused_label
                        .as_deref()
                        .map(|l| format!(" ({l})"))
                        .unwrap_or_default()
                ),
                _ => "sending".to_owned(),
            };
            if let Some(b) = &d.breaker {
                text.push_str(&format!("; breaker {b}"));
            }
            text
        });
        let recent = admin
            .store
            .recent_outcomes(events, since)
            .await
            .ok()
            .flatten();
        let chart = if charts {
            admin
                .store
                .attempts_per_minute(Some(events), chart_since(), CHART_MINUTES)
                .await
                .map_err(|e| e.to_string())
        } else {
            Ok(None)
        };
        let rate = admin.rates.get(name).map(|limit| {
            let share = admin
                .metrics
                .dispatcher_rate_share
                .with_label_values(&[name.as_str()])
                .get();
            (*limit, share)
        });
        rows.push(pages::DispatcherRow {
            rate,
            chart,
            paused: found.is_some_and(|d| d.paused),
            view: DispatcherView {
                name: name.clone(),
                events: events.clone(),
                state,
            },
            recent,
        });
    }
    rows
}

/// The chart's window: the last hour, by whole minutes (the last bar is
/// the minute under way).
pub(super) const CHART_MINUTES: usize = 60;

pub(super) fn chart_since() -> chrono::NaiveDateTime {
    use chrono::{DurationRound, TimeDelta};
    let now = crate::store::now();
    now.duration_trunc(TimeDelta::minutes(1)).unwrap_or(now)
        - TimeDelta::minutes(CHART_MINUTES as i64 - 1)
}

pub(super) async fn dispatchers_page(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Err(e) = query_params(raw.as_deref(), &[]) {
        return refused(Some(&s), &e);
    }
    let rows = dispatcher_rows(&state.admin, true).await;
    html(StatusCode::OK, pages::dispatchers(&s, &rows, None))
}

/// The dispatchers page's buttons: the API's
/// `POST /admin/dispatchers/{name}/pause|resume`.
pub(super) async fn dispatcher_action(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    Path((name, action)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Response {
    let admin = &state.admin;
    // The pause form has a label; resume takes none.
    let fields: &[&str] = if action == "pause" {
        &["csrf", "label"]
    } else {
        &["csrf"]
    };
    let label = match form_params(raw.as_deref(), &body, fields).and_then(|p| p.text("label")) {
        Ok(l) => l,
        Err(e) => return refused(Some(&s), &e),
    };
    let result = match action.as_str() {
        "pause" => {
            let caller = Caller::new(Via::Console, label);
            operator::pause(&admin.store, &admin.dispatchers, &name, &caller).await
        }
        "resume" => {
            // An operation of the sidecar: the page follows it.
            let caller = Caller::new(Via::Console, label);
            return match admin
                .operations
                .resume(&admin.dispatchers, &name, &caller)
                .await
            {
                Ok(op) => operation::started(&s, Ok(op), StatusCode::OK),
                Err(e @ operator::DispatcherError::Unknown { .. }) => {
                    operation::started(&s, Err(e.to_string()), StatusCode::NOT_FOUND)
                }
                Err(e) => {
                    operation::started(&s, Err(e.to_string()), StatusCode::SERVICE_UNAVAILABLE)
                }
            };
        }
        _ => {
            return html(
                StatusCode::NOT_FOUND,
                pages::message_page("Not found", Some(&s), "No such action."),
            )
        }
    };
    let (status, notice) = match result {
        Ok(done) => {
            tracing::info!(dispatcher = %done.dispatcher, message = %done.message, "dispatcher changed in the console");
            (StatusCode::OK, done.message)
        }
        Err(e @ operator::DispatcherError::Unknown { .. }) => {
            (StatusCode::NOT_FOUND, e.to_string())
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let rows = dispatcher_rows(admin, true).await;
    html(status, pages::dispatchers(&s, &rows, Some(&notice)))
}
