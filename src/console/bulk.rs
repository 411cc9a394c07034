//! The bulk resend: its form, its dry run and the confirmed resend.

use super::*;

/// Empty form fields are no filter.
pub(super) fn cleaned(f: &ResendFilters) -> ResendFilters {
    ResendFilters {
        event_name: non_empty(&f.event_name),
        dispatcher: non_empty(&f.dispatcher),
        error_contains: non_empty(&f.error_contains),
        failed_since: non_empty(&f.failed_since),
        failed_until: non_empty(&f.failed_until),
    }
}

/// The bulk resend form; with `preview=true`, the dry run (count and
/// sample) and the form that confirms it, carrying the count.
pub(super) async fn bulk_form(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    RawQuery(raw): RawQuery,
) -> Response {
    let admin = &state.admin;
    let names: Vec<&str> = admin.dispatchers.keys().map(String::as_str).collect();
    let mut fields = FILTER_FIELDS.to_vec();
    fields.push("preview");
    let parsed = query_params(raw.as_deref(), &fields)
        .and_then(|p| Ok((resend_filters(&p)?, p.flag("preview")?.unwrap_or(false))));
    let (filters, preview) = match parsed {
        Ok((f, preview)) => (cleaned(&f), preview),
        Err(e) => {
            return html(
                StatusCode::BAD_REQUEST,
                pages::bulk(
                    &s,
                    &ResendFilters::default(),
                    &names,
                    pages::BulkStage::Error(&e),
                ),
            )
        }
    };
    if !preview {
        return html(
            StatusCode::OK,
            pages::bulk(&s, &filters, &names, pages::BulkStage::Form),
        );
    }
    let filter = match filters.to_filter(&admin.dispatchers) {
        Ok(f) => f,
        Err(e) => {
            return html(
                StatusCode::BAD_REQUEST,
                pages::bulk(&s, &filters, &names, pages::BulkStage::Error(&e)),
            )
        }
    };
    match operator::preview_resend(&admin.store, &filter).await {
        Ok((count, sample)) => html(
            StatusCode::OK,
            pages::bulk(
                &s,
                &filters,
                &names,
                pages::BulkStage::Preview {
                    count,
                    sample: &sample,
                    refused: None,
                },
            ),
        ),
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::bulk(
                &s,
                &filters,
                &names,
                pages::BulkStage::Error(&e.to_string()),
            ),
        ),
    }
}

/// The confirmed bulk resend: the API's `POST /admin/events/retry`. The
/// form carries the count its dry run showed (`confirm`); when as many
/// rows no longer match, nothing is resent and the dry run is shown again
/// with the new count.
pub(super) async fn bulk_resend(
    State(state): State<ConsoleState>,
    Extension(s): Extension<Session>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Response {
    let admin = &state.admin;
    let names: Vec<&str> = admin.dispatchers.keys().map(String::as_str).collect();
    let mut fields = FILTER_FIELDS.to_vec();
    fields.extend(["csrf", "confirm"]);
    let parsed = form_params(raw.as_deref(), &body, &fields).and_then(|p| {
        Ok((
            resend_filters(&p)?,
            p.number::<u64>("confirm", "the number of events the dry run counted")?,
        ))
    });
    let (filters, confirm) = match parsed {
        Ok((f, confirm)) => (cleaned(&f), confirm),
        Err(e) => {
            return html(
                StatusCode::BAD_REQUEST,
                pages::bulk(
                    &s,
                    &ResendFilters::default(),
                    &names,
                    pages::BulkStage::Error(&e),
                ),
            )
        }
    };
    let filter = match filters.to_filter(&admin.dispatchers) {
        Ok(f) => f,
        Err(e) => {
            return html(
                StatusCode::BAD_REQUEST,
                pages::bulk(&s, &filters, &names, pages::BulkStage::Error(&e)),
            )
        }
    };
    let (count, sample) = match operator::preview_resend(&admin.store, &filter).await {
        Ok(preview) => preview,
        Err(e) => {
            return html(
                StatusCode::SERVICE_UNAVAILABLE,
                pages::bulk(
                    &s,
                    &filters,
                    &names,
                    pages::BulkStage::Error(&e.to_string()),
                ),
            )
        }
    };
    if let Err(r) = check_confirm(count, confirm) {
        let why = match r {
            ConfirmRefused::Mismatch { count, confirm } => format!(
                "The dry run counted {confirm}; {count} failed event(s) match now. \
                 Nothing was resent: check the sample and confirm again."
            ),
            ConfirmRefused::Needed { count } => format!(
                "{count} failed events match, more than {}: confirm the count below. \
                 Nothing was resent.",
                operator::CONFIRM_ABOVE
            ),
        };
        return html(
            StatusCode::CONFLICT,
            pages::bulk(
                &s,
                &filters,
                &names,
                pages::BulkStage::Preview {
                    count,
                    sample: &sample,
                    refused: Some(&why),
                },
            ),
        );
    }
    // An operation of the sidecar: the page follows it.
    let (target, rerun) = filters.words();
    match admin
        .operations
        .resend(
            Some(admin.metrics.clone()),
            filter,
            target,
            rerun,
            &Caller::new(Via::Console, None),
        )
        .await
    {
        Ok(op) => operation::started(&s, Ok(op), StatusCode::OK),
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::bulk(
                &s,
                &filters,
                &names,
                pages::BulkStage::Error(&e.to_string()),
            ),
        ),
    }
}
