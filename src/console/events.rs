//! The overview, the events list and an event's page (its timeline, why
//! it waits, its resend button).

use super::*;

/// A row of the attempt log as the timeline shows it (a resend: outcome
/// `resend`, via the surface and the caller's label; a replay: outcome
/// `replay`, its operation and label).
pub(super) fn attempt_view(r: crate::store::history::Record) -> AttemptView {
    let resend = r.kind == "resend";
    let replay = r.kind == "replay";
    AttemptView {
        attempt: r.attempt,
        at: r.started_at,
        duration_ms: r.duration_ms.and_then(|d| u64::try_from(d).ok()),
        outcome: if resend || replay {
            r.kind.clone()
        } else {
            r.outcome.unwrap_or_default()
        },
        http_status: r.http_status.and_then(|c| u16::try_from(c).ok()),
        detail: if resend {
            r.label
        } else if replay {
            Some(format!(
                "operation {}{}",
                r.detail.as_deref().unwrap_or("?"),
                r.label.map(|l| format!(" ({l})")).unwrap_or_default()
            ))
        } else {
            r.detail
        },
        replica: r.replica,
        via: r.via,
        trace_id: r.trace_id,
    }
}

pub(super) async fn overview(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Err(e) = query_params(raw.as_deref(), &[]) {
        return refused(Some(&s), &e);
    }
    let admin = &state.admin;
    let stats = admin.store.stats().await.map_err(|e| e.to_string());
    // Counted up to a cap: an exact count of the sent history is a scan.
    let sent_up_to = match &stats {
        Ok(_) => admin
            .store
            .count_sent_up_to(pages::SENT_COUNT_CAP)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.clone()),
    };
    let now = crate::store::now();
    let view = pages::OverviewView {
        sent_up_to,
        oldest_pending_age: stats
            .as_ref()
            .ok()
            .and_then(|s| s.oldest_pending_created_at)
            .map(|t| (now - t).to_std().unwrap_or_default()),
        stats,
        joined: admin
            .health
            .joined
            .load(std::sync::atomic::Ordering::Relaxed),
        draining: admin
            .health
            .draining
            .load(std::sync::atomic::Ordering::Relaxed),
        fetching_paused: admin.metrics.consumer_paused.get() == 1,
        lags: admin.metrics.consumer_lags(),
        inflight: admin.metrics.inflight_events.get(),
        dispatchers: dispatcher_rows(admin, false)
            .await
            .into_iter()
            .map(|r| r.view)
            .collect(),
        chart: admin
            .store
            .attempts_per_minute(None, chart_since(), CHART_MINUTES)
            .await
            .map_err(|e| e.to_string()),
    };
    html(StatusCode::OK, pages::overview(&s, &view))
}

pub(super) fn non_empty(v: &Option<String>) -> Option<String> {
    v.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// The filters of the events list, as the form sends them (empty fields
/// are no filter).
#[derive(Debug, Default)]
pub(crate) struct EventsQuery {
    pub(super) status: Option<String>,
    pub(super) event_name: Option<String>,
    pub(super) error_contains: Option<String>,
    pub(super) failed_since: Option<String>,
    pub(super) failed_until: Option<String>,
    pub(super) before: Option<String>,
}

impl EventsQuery {
    /// Every name the events list takes.
    const FIELDS: [&str; 6] = [
        "status",
        "event_name",
        "error_contains",
        "failed_since",
        "failed_until",
        "before",
    ];

    fn from_params(p: &Params) -> Result<Self, String> {
        Ok(Self {
            status: p.text("status")?,
            event_name: p.text("event_name")?,
            error_contains: p.text("error_contains")?,
            failed_since: p.text("failed_since")?,
            failed_until: p.text("failed_until")?,
            before: p.text("before")?,
        })
    }

    /// The store's filter; failed events when no status is given, every
    /// status for `all`, the pending events an earlier failed event of
    /// their aggregate holds for `held` (`ordering`: `[ordering]` is on).
    /// The error names the field that is wrong.
    fn to_filter(&self, ordering: bool) -> Result<ListFilter, String> {
        let mut held = false;
        let status = match non_empty(&self.status).as_deref() {
            None => Some(Status::Failed),
            Some("all") => None,
            Some("held") if ordering => {
                held = true;
                Some(Status::Pending)
            }
            Some("held") => {
                return Err(format!(
                    "status: held: {}",
                    crate::store::ordering::HELD_NEEDS_ORDERING
                ))
            }
            Some(s) => Some(s.parse::<Status>().map_err(|e| format!("status: {e}"))?),
        };
        let time = |v: &Option<String>, name: &str| {
            non_empty(v)
                .map(|t| operator::parse_time(&t).map_err(|e| format!("{name}: {e}")))
                .transpose()
        };
        Ok(ListFilter {
            status,
            event_name: non_empty(&self.event_name),
            limit: Some(PAGE),
            before: non_empty(&self.before)
                .map(|b| {
                    b.parse::<i64>()
                        .map_err(|_| format!("before: {b:?} is not an event id"))
                })
                .transpose()?,
            error_contains: non_empty(&self.error_contains),
            changed_since: time(&self.failed_since, "failed_since")?,
            changed_until: time(&self.failed_until, "failed_until")?,
            held,
        })
    }

    /// The query string of these filters with another cursor.
    fn with_before(&self, before: Option<i64>) -> String {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("status", &self.status),
            ("event_name", &self.event_name),
            ("error_contains", &self.error_contains),
            ("failed_since", &self.failed_since),
            ("failed_until", &self.failed_until),
        ] {
            if let Some(v) = non_empty(v) {
                q.append_pair(k, &v);
            }
        }
        if let Some(b) = before {
            q.append_pair("before", &b.to_string());
        }
        q.finish()
    }
}

pub(super) async fn events(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    RawQuery(raw): RawQuery,
) -> Response {
    let ordering = state.admin.store.ordering().is_some();
    let q = match query_params(raw.as_deref(), &EventsQuery::FIELDS)
        .and_then(|p| EventsQuery::from_params(&p))
    {
        Ok(q) => q,
        Err(e) => {
            return html(
                StatusCode::BAD_REQUEST,
                pages::events(&s, &EventsQuery::default(), ordering, &[], None, Some(&e)),
            )
        }
    };
    let filter = match q.to_filter(ordering) {
        Ok(f) => f,
        Err(e) => {
            return html(
                StatusCode::BAD_REQUEST,
                pages::events(&s, &q, ordering, &[], None, Some(&e)),
            )
        }
    };
    match state.admin.store.list(&filter).await {
        Ok(rows) => {
            let next = rows
                .last()
                .filter(|_| rows.len() as u64 == PAGE)
                .map(|last| q.with_before(Some(last.id)));
            html(
                StatusCode::OK,
                pages::events(&s, &q, ordering, &rows, next.as_deref(), None),
            )
        }
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::events(&s, &q, ordering, &[], None, Some(&e.to_string())),
        ),
    }
}

pub(super) async fn event(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    Path(id): Path<i64>,
    RawQuery(raw): RawQuery,
) -> Response {
    // `resent=true`: set by the redirect after a resend from this page.
    let resent = match query_params(raw.as_deref(), &["resent"]).and_then(|p| p.flag("resent")) {
        Ok(r) => r.unwrap_or(false),
        Err(e) => return refused(Some(&s), &e),
    };
    match state.admin.store.get(id).await {
        Ok(Some(row)) => {
            let notice =
                resent.then(|| format!("Event {id} set to pending: the sidecar sends it again."));
            // The attempt timeline, from the attempt log.
            let attempts: Vec<AttemptView> = match state.admin.store.history(id).await {
                Ok(records) => records.into_iter().map(attempt_view).collect(),
                Err(e) => {
                    return html(
                        StatusCode::SERVICE_UNAVAILABLE,
                        pages::message_page("Database error", Some(&s), &e.to_string()),
                    )
                }
            };
            // `[ordering]`: what the event waits behind, if anything.
            let behind = state
                .admin
                .store
                .waits_behind(id)
                .await
                .unwrap_or_else(|e| {
                    tracing::warn!(id, error = %e, "cannot read what the event waits behind");
                    None
                });
            // Why a pending event is not sent yet, as this replica sees it.
            let why = if row.status == Status::Pending {
                state.admin.why(id).await.unwrap_or_else(|e| {
                    tracing::warn!(id, error = %e, "cannot say why the event waits");
                    None
                })
            } else {
                None
            };
            html(
                StatusCode::OK,
                pages::event(&s, &row, &attempts, notice.as_deref(), behind, why.as_ref()),
            )
        }
        Ok(None) => html(
            StatusCode::NOT_FOUND,
            pages::message_page("Not found", Some(&s), &format!("Event {id} not found.")),
        ),
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::message_page("Database error", Some(&s), &e.to_string()),
        ),
    }
}

/// The event page's resend button: the API's `POST /admin/events/{id}/retry`.
pub(super) async fn resend_event(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    Path(id): Path<i64>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Response {
    if let Err(e) = form_params(raw.as_deref(), &body, &["csrf"]) {
        return refused(Some(&s), &e);
    }
    let admin = &state.admin;
    match operator::resend_one(
        &admin.store,
        Some(&admin.metrics),
        id,
        &Caller::new(Via::Console, None),
    )
    .await
    {
        Ok(Ok(_)) => {
            Redirect::to(&format!("/admin/console/events/{id}?resent=true")).into_response()
        }
        Ok(Err(r @ RetryRefused::NotFound(_))) => html(
            StatusCode::NOT_FOUND,
            pages::message_page("Not resent", Some(&s), &r.to_string()),
        ),
        Ok(Err(r @ RetryRefused::NotFailed { .. })) => html(
            StatusCode::CONFLICT,
            pages::message_page("Not resent", Some(&s), &r.to_string()),
        ),
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::message_page("Database error", Some(&s), &e.to_string()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_events_list_shows_failed_events_unless_told() {
        let q = EventsQuery::default();
        assert_eq!(q.to_filter(false).unwrap().status, Some(Status::Failed));
        let all = EventsQuery {
            status: Some("all".into()),
            ..Default::default()
        };
        assert_eq!(all.to_filter(false).unwrap().status, None);
        let sent = EventsQuery {
            status: Some("sent".into()),
            event_name: Some("  ".into()),
            ..Default::default()
        };
        let f = sent.to_filter(false).unwrap();
        assert_eq!(f.status, Some(Status::Sent));
        assert_eq!(f.event_name, None, "an empty field is no filter");
    }

    #[test]
    fn a_wrong_filter_is_named() {
        let bad = |q: EventsQuery| q.to_filter(false).unwrap_err();
        assert!(bad(EventsQuery {
            status: Some("lost".into()),
            ..Default::default()
        })
        .starts_with("status: "));
        assert!(bad(EventsQuery {
            failed_since: Some("noon".into()),
            ..Default::default()
        })
        .starts_with("failed_since: \"noon\" is not a time"));
        assert_eq!(
            bad(EventsQuery {
                before: Some("x".into()),
                ..Default::default()
            }),
            "before: \"x\" is not an event id"
        );
    }

    #[test]
    fn held_lists_the_pending_events_a_failed_one_holds_when_ordering_is_on() {
        let held = || EventsQuery {
            status: Some("held".into()),
            ..Default::default()
        };
        let f = held().to_filter(true).unwrap();
        assert_eq!(f.status, Some(Status::Pending));
        assert!(f.held);
        assert!(!EventsQuery::default().to_filter(true).unwrap().held);
        assert_eq!(
            held().to_filter(false).unwrap_err(),
            "status: held: ordering is off ([ordering] column is not set)"
        );
    }

    #[test]
    fn the_next_page_keeps_the_filters() {
        let q = EventsQuery {
            event_name: Some("a.b".into()),
            error_contains: Some("HTTP 503".into()),
            before: Some("99".into()),
            ..Default::default()
        };
        assert_eq!(
            q.with_before(Some(42)),
            "event_name=a.b&error_contains=HTTP+503&before=42"
        );
    }
}
