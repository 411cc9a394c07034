//! A bulk resend's request, from the API's query string or the console's
//! form: its filters, and the confirmation a large one needs.

use super::params::Params;
use crate::operator::CONFIRM_ABOVE;

/// The filters of a bulk resend from request parameters (the API's query
/// string, the console's form).
pub(crate) fn resend_filters(p: &Params) -> Result<crate::operator::ResendFilters, String> {
    Ok(crate::operator::ResendFilters {
        event_name: p.text("event_name")?,
        dispatcher: p.text("dispatcher")?,
        error_contains: p.text("error_contains")?,
        failed_since: p.text("failed_since")?,
        failed_until: p.text("failed_until")?,
    })
}

/// Why a bulk resend whose filters are right was not done.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ConfirmRefused {
    /// More than [`CONFIRM_ABOVE`] rows match and no confirmation was given.
    Needed { count: u64 },
    /// The confirmation is not the number of rows that match now.
    Mismatch { count: u64, confirm: u64 },
}

impl ConfirmRefused {
    /// How many rows match now.
    pub(crate) fn count(&self) -> u64 {
        match self {
            Self::Needed { count } | Self::Mismatch { count, .. } => *count,
        }
    }
}

/// Whether a bulk resend of `count` rows (counted just before it) may go
/// ahead with `confirm`: above [`CONFIRM_ABOVE`] rows only with the count
/// itself, and a confirmation given must be the count at any size, so a
/// resend takes what its dry run showed and not a widened filter. (A row
/// that fails between this count and the resend is resent too.)
pub(crate) fn check_confirm(count: u64, confirm: Option<u64>) -> Result<(), ConfirmRefused> {
    match confirm {
        Some(confirm) if confirm != count => Err(ConfirmRefused::Mismatch { count, confirm }),
        None if count > CONFIRM_ABOVE => Err(ConfirmRefused::Needed { count }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn above_the_threshold_a_resend_needs_the_count() {
        assert_eq!(check_confirm(0, None), Ok(()));
        assert_eq!(check_confirm(CONFIRM_ABOVE, None), Ok(()));
        assert_eq!(check_confirm(CONFIRM_ABOVE, Some(CONFIRM_ABOVE)), Ok(()));
        assert_eq!(
            check_confirm(3, Some(4)),
            Err(ConfirmRefused::Mismatch {
                count: 3,
                confirm: 4
            })
        );
        let above = CONFIRM_ABOVE + 1;
        assert_eq!(
            check_confirm(above, None),
            Err(ConfirmRefused::Needed { count: above })
        );
        assert_eq!(
            check_confirm(above, Some(above - 1)).unwrap_err().count(),
            above
        );
        assert_eq!(check_confirm(above, Some(above)), Ok(()));
    }
}
