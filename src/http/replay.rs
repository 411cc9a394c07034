//! A replay's parameters as the admin API's query string and the
//! console's form give them (the same names).

use super::params::Params;
use crate::replay::ReplayRequest;

/// Every parameter of `POST /admin/events/replay` (the console's form has
/// the same, and its own token field).
pub(crate) const REPLAY_PARAMS: &[&str] = &[
    "event_name",
    "dispatcher",
    "sent_since",
    "sent_until",
    "aggregate",
    "ids",
    "rate",
    "dry_run",
    "confirm",
    "label",
];

/// The replay asked for (`event_name` may list several, comma-separated),
/// whether it is a dry run, the confirmation and the label.
pub(crate) fn replay_request(
    p: &Params,
) -> Result<(ReplayRequest, bool, Option<u64>, Option<String>), String> {
    let request = ReplayRequest {
        event_names: p
            .text("event_name")?
            .map(|n| {
                n.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default(),
        dispatcher: p.text("dispatcher")?,
        sent_since: p.text("sent_since")?,
        sent_until: p.text("sent_until")?,
        aggregate: p.text("aggregate")?,
        ids: p.text("ids")?,
        rate: p.number::<f64>("rate", "a number of events a second")?,
    };
    Ok((
        request,
        p.flag("dry_run")?.unwrap_or(false),
        p.number::<u64>("confirm", "the number of events a dry run counted")?,
        p.text("label")?,
    ))
}
