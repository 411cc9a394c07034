//! Fetching's flow control: when too much waits in the scheduler, the loop
//! holds back (does not take messages); a hold that lasts [`PAUSE_AFTER`]
//! with no work ending, or [`HOLD_MAX`] in all, pauses the partitions;
//! dead-letter sends under way count against it too.

use tokio::time::Instant;

use super::{Flow, HOLD_MAX, PAUSE_AFTER};

pub(super) struct FlowControl {
    pub(super) paused: bool,
    /// Since when the loop has been holding back.
    pub(super) holding_since: Option<Instant>,
    /// When work last ended (what waits here can move).
    pub(super) progress_at: Instant,
    /// Dead-letter sends under way, and their records' bytes.
    pub(super) dead_letters: usize,
    pub(super) dead_letter_bytes: usize,
}

impl FlowControl {
    pub(super) fn new(now: Instant) -> Self {
        FlowControl {
            paused: false,
            holding_since: None,
            progress_at: now,
            dead_letters: 0,
            dead_letter_bytes: 0,
        }
    }

    /// `over`: too much waits. Pauses once a hold reaches its deadline;
    /// resumes a pause once `may_resume`.
    pub(super) fn decide(&mut self, over: bool, may_resume: bool, now: Instant) -> Option<Flow> {
        if over {
            let since = *self.holding_since.get_or_insert(now);
            if !self.paused && now >= pause_deadline(since, self.progress_at) {
                self.paused = true;
                return Some(Flow::Pause);
            }
        } else {
            self.holding_since = None;
            if self.paused && may_resume {
                self.paused = false;
                return Some(Flow::Resume);
            }
        }
        None
    }

    /// The pause or resume could not be made: try again later.
    pub(super) fn failed(&mut self, flow: Flow, now: Instant) {
        match flow {
            Flow::Pause => {
                self.paused = false;
                self.holding_since = Some(now);
            }
            Flow::Resume => self.paused = true,
        }
    }

    /// When a hold under way reaches its pause deadline.
    pub(super) fn pause_at(&self) -> Option<Instant> {
        self.holding_since
            .filter(|_| !self.paused)
            .map(|since| pause_deadline(since, self.progress_at))
    }
}

fn pause_deadline(since: Instant, progress_at: Instant) -> Instant {
    (since.max(progress_at) + PAUSE_AFTER).min(since + HOLD_MAX)
}
