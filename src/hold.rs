//! Holding a dispatcher's events without using their attempts:
//! the operator's pause (group-wide, kept in `dispatch.pause_table`) and the
//! opt-in breaker (`[dispatchers.NAME.breaker]`, this replica's own).
//!
//! **Pause.** Every replica reads the pause table every
//! `dispatch.pause_refresh`. A job whose dispatcher is paused, confirmed by
//! a read that started after the job asked (so a resume is never missed by
//! a stale copy), is *parked*: nothing is sent, no attempt is used, the row
//! stays `pending` and its change event is finished (committed), so it
//! holds back neither other dispatchers' events nor the partition's
//! commits. `resume` deletes the pause and touches the dispatcher's pending
//! rows (`updated_at`, in committed batches), so the change feed announces
//! them again, as `events retrigger` does. It touches them whether or not
//! the pause was still there, so a resume that failed half-way (a statement
//! timeout, a failover, the CLI killed) is repaired by resuming again; a
//! restart while paused loses nothing, the rows are pending in the table. A pause seen late (up to one refresh) lets
//! the events of that moment through.
//!
//! **Breaker.** After `failures` failures in a row, each within `within` of
//! the previous, the breaker opens for `cool_down`. An event that meets an
//! open breaker is parked as a pause parks it (no attempt used, row
//! pending, message finished): held events take no capacity from other
//! dispatchers, so one receiver's outage never stalls the others or the
//! partitions' commits. When the cool-down ends, one parked row is
//! announced again (touched) to serve as the probe: success closes the
//! breaker and every pending row of the dispatcher is announced again, in
//! committed batches; failure opens it for another `cool_down`. A
//! cool-down that ends with nothing parked closes the breaker. Only the
//! receiver's failures count: a payload that is not JSON or an event no
//! dispatcher is registered for never reached it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::config::BreakerSettings;
use crate::metrics::Metrics;
use crate::store::{db_err, now, Pause, Store, StoreError};

/// What a job does before its POST.
#[derive(Debug)]
pub enum Verdict {
    /// Send.
    Go,
    /// Send, as the breaker's probe; report the result.
    Probe,
    /// Paused: leave the row pending and finish its message.
    Park,
    /// The breaker is open until this instant: park the row (no attempt
    /// used); the breaker announces it again.
    WaitUntil(Instant),
}

/// The pauses as this replica last read them, and the breakers.
pub struct Holds {
    store: Store,
    metrics: Metrics,
    refresh: Duration,
    paused: Mutex<HashMap<String, Pause>>,
    /// Serialises fresh reads; holds when the last one started.
    read: tokio::sync::Mutex<Option<Instant>>,
    breakers: HashMap<String, Mutex<Breaker>>,
    /// Signalled when a probe reports.
    probed: Notify,
    /// Partitions left this replica since the breakers' clock last looked:
    /// what its breakers parked is announced again for the next owner.
    partitions_left: std::sync::atomic::AtomicBool,
}

impl Holds {
    pub fn new(
        store: Store,
        metrics: Metrics,
        refresh: Duration,
        breakers: impl IntoIterator<Item = (String, BreakerSettings)>,
    ) -> Self {
        Holds {
            store,
            metrics,
            refresh,
            paused: Mutex::new(HashMap::new()),
            read: tokio::sync::Mutex::new(None),
            breakers: breakers
                .into_iter()
                .map(|(name, s)| (name, Mutex::new(Breaker::new(s))))
                .collect(),
            probed: Notify::new(),
            partitions_left: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Reads the pause table every `refresh` until `stop`, keeping the
    /// gauges; a failed read keeps the last known pauses.
    pub async fn run(&self, stop: tokio_util::sync::CancellationToken) {
        loop {
            if let Err(e) = self.read_pauses(None).await {
                tracing::warn!(error = %e, "cannot read paused dispatchers; keeping the last known");
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.refresh) => {}
            }
        }
    }

    /// Reads the pause table, unless a read that started after `asked`
    /// has already been made (many jobs asking at once share one read).
    async fn read_pauses(&self, asked: Option<Instant>) -> Result<(), StoreError> {
        let mut last = self.read.lock().await;
        if let (Some(asked), Some(last)) = (asked, *last) {
            if last >= asked {
                return Ok(());
            }
        }
        let started = Instant::now();
        let pauses =
            tokio::time::timeout(crate::store::batch::STATEMENT_DEADLINE, self.store.pauses())
                .await
                .map_err(|_| {
                    db_err("reading paused dispatchers")(sea_orm::DbErr::Custom(
                        "no answer in time".into(),
                    ))
                })??;
        *last = Some(started);
        let now = now();
        let mut paused = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        for name in paused.keys() {
            if !pauses.iter().any(|p| &p.dispatcher == name) {
                self.metrics
                    .dispatcher_paused
                    .with_label_values(&[name])
                    .set(0);
                self.metrics
                    .dispatcher_paused_seconds
                    .with_label_values(&[name])
                    .set(0.0);
            }
        }
        paused.clear();
        for p in pauses {
            let age = std::cmp::Ord::max((now - p.paused_at).num_milliseconds(), 0) as f64 / 1000.0;
            self.metrics
                .dispatcher_paused
                .with_label_values(&[&p.dispatcher])
                .set(1);
            self.metrics
                .dispatcher_paused_seconds
                .with_label_values(&[&p.dispatcher])
                .set(age);
            paused.insert(p.dispatcher.clone(), p);
        }
        Ok(())
    }

    fn is_paused(&self, dispatcher: &str) -> bool {
        self.paused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(dispatcher)
    }

    /// Whether `dispatcher` is paused, as last read; a pause is confirmed
    /// by a read that started after this call before the answer is yes
    /// (and counted as a parked event).
    pub async fn paused_now(&self, dispatcher: &str) -> Result<bool, StoreError> {
        if !self.is_paused(dispatcher) {
            return Ok(false);
        }
        self.read_pauses(Some(Instant::now())).await?;
        let paused = self.is_paused(dispatcher);
        if paused {
            self.metrics
                .events_parked_total
                .with_label_values(&[dispatcher])
                .inc();
        }
        Ok(paused)
    }

    /// What a job of `dispatcher`, whose row has `attempts_left` attempts
    /// (this one included), does now. A pause is confirmed with a fresh
    /// read before a row is parked; a failed read is an error (the job
    /// asks again later, it neither parks nor sends).
    pub async fn verdict(
        &self,
        dispatcher: &str,
        attempts_left: i32,
    ) -> Result<Verdict, StoreError> {
        if self.paused_now(dispatcher).await? {
            return Ok(Verdict::Park);
        }
        let Some(breaker) = self.breakers.get(dispatcher) else {
            return Ok(Verdict::Go);
        };
        let mut b = breaker.lock().unwrap_or_else(|e| e.into_inner());
        let verdict = b.verdict(Instant::now(), attempts_left);
        self.metrics
            .dispatcher_breaker_state
            .with_label_values(&[dispatcher])
            .set(b.state_code());
        Ok(verdict)
    }

    /// A probe that was not sent (its payload is not JSON): the next
    /// event probes at once.
    pub fn void_probe(&self, dispatcher: &str) {
        if let Some(breaker) = self.breakers.get(dispatcher) {
            let mut b = breaker.lock().unwrap_or_else(|e| e.into_inner());
            if let State::Probing { .. } = b.state {
                b.state = State::Open {
                    until: Instant::now(),
                };
            }
        }
    }

    /// The breaker's verdict alone (no pause read): `Go` without one.
    pub fn breaker_verdict(&self, dispatcher: &str, attempts_left: i32) -> Verdict {
        let Some(breaker) = self.breakers.get(dispatcher) else {
            return Verdict::Go;
        };
        let mut b = breaker.lock().unwrap_or_else(|e| e.into_inner());
        let verdict = b.verdict(Instant::now(), attempts_left);
        self.metrics
            .dispatcher_breaker_state
            .with_label_values(&[dispatcher])
            .set(b.state_code());
        verdict
    }

    /// The result of an attempt made with [`Verdict::Go`] or
    /// [`Verdict::Probe`].
    pub fn report(&self, dispatcher: &str, success: bool, probe: bool) {
        let Some(breaker) = self.breakers.get(dispatcher) else {
            return;
        };
        let mut b = breaker.lock().unwrap_or_else(|e| e.into_inner());
        let before = b.state_code();
        b.report(Instant::now(), success, probe);
        let after = b.state_code();
        self.metrics
            .dispatcher_breaker_state
            .with_label_values(&[dispatcher])
            .set(after);
        if before != after {
            match after {
                1 => {
                    tracing::warn!(dispatcher, cool_down = ?b.settings.cool_down, "breaker open: holding this dispatcher's events (no attempt used)")
                }
                0 => tracing::info!(dispatcher, "breaker closed: sending again"),
                _ => {}
            }
        }
        drop(b);
        if probe {
            self.probed.notify_waiters();
        }
    }

    /// Waits until `until`, or until a probe reports (its result may let
    /// the held events go sooner).
    pub async fn hold_until(&self, until: Instant) {
        let probed = self.probed.notified();
        tokio::select! {
            _ = tokio::time::sleep_until(until.into()) => {}
            _ = probed => {}
        }
    }

    /// Parks `id` of `dispatcher` held by its open breaker: counted, and
    /// remembered as a probe candidate.
    pub fn park_held(&self, dispatcher: &str, id: i64) {
        if let Some(breaker) = self.breakers.get(dispatcher) {
            breaker.lock().unwrap_or_else(|e| e.into_inner()).park(id);
        }
        self.metrics
            .events_parked_total
            .with_label_values(&[dispatcher])
            .inc();
    }

    /// Partitions were revoked from this replica: the rows its breakers
    /// parked may be the next owner's now, and nothing else would announce
    /// them there (this replica's breaker releases only its own), so the
    /// breakers' clock announces them again at its next tick.
    pub fn partitions_left(&self) {
        if self
            .breakers
            .values()
            .any(|b| b.lock().unwrap_or_else(|e| e.into_inner()).has_parked())
        {
            self.partitions_left
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Runs each breaker's clock until `stop`: announces a parked row as
    /// the probe when a cool-down ends, every pending row of the
    /// dispatcher (`dispatchers` maps each to its event names) once the
    /// breaker closes, and closes a breaker whose cool-down ended with
    /// nothing parked. An announcement that fails is tried again.
    pub async fn supervise_breakers(
        &self,
        dispatchers: BTreeMap<String, Vec<String>>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        if self.breakers.is_empty() {
            return;
        }
        loop {
            if self
                .partitions_left
                .swap(false, std::sync::atomic::Ordering::Relaxed)
            {
                self.announce_parked(&dispatchers, "partitions moved").await;
            }
            for (name, breaker) in &self.breakers {
                let action = {
                    let mut b = breaker.lock().unwrap_or_else(|e| e.into_inner());
                    let action = b.tick(Instant::now());
                    self.metrics
                        .dispatcher_breaker_state
                        .with_label_values(&[name])
                        .set(b.state_code());
                    action
                };
                let events = dispatchers.get(name).map(Vec::as_slice).unwrap_or(&[]);
                match action {
                    Tick::Nothing => {}
                    Tick::AnnounceProbe(ids) => {
                        match self.store.touch_one_pending(&ids, events).await {
                            Ok(Some(id)) => {
                                tracing::info!(dispatcher = %name, id, "breaker cool-down over: a parked event announced again as the probe")
                            }
                            Ok(None) => {
                                breaker
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .nothing_parked();
                            }
                            Err(e) => {
                                tracing::warn!(dispatcher = %name, error = %e, "cannot announce a probe for the breaker; trying again");
                                breaker
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .probe_not_announced();
                            }
                        }
                    }
                    Tick::AnnounceAll => {
                        let mut noop = |_| {};
                        match self.store.retrigger_pending_of(events, &mut noop).await {
                            Ok(n) => {
                                tracing::info!(dispatcher = %name, announced = n, "breaker closed: parked events announced again");
                                breaker
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .announced_all();
                            }
                            Err(e) => {
                                tracing::warn!(dispatcher = %name, error = %e, "breaker closed but its parked events could not all be announced again; trying again");
                            }
                        }
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => {
                    self.announce_parked(&dispatchers, "stopping").await;
                    return;
                }
                _ = tokio::time::sleep(BREAKER_TICK) => {}
            }
        }
    }

    /// At shutdown: a breaker and what it parked end with this replica, so
    /// the pending rows of each dispatcher whose breaker parked some are
    /// announced again, for the next owner of their partitions (this
    /// replica restarted, or another) to decide. Bounded by
    /// [`EXIT_ANNOUNCE_LIMIT`]; what is left is said at ERROR with the
    /// command that finishes it.
    /// Also when partitions leave this replica (`why`): the rows parked
    /// are then forgotten here (announced, they come back to whichever
    /// replica owns them, parked again if its breaker is open).
    async fn announce_parked(&self, dispatchers: &BTreeMap<String, Vec<String>>, why: &str) {
        for (name, breaker) in &self.breakers {
            if !breaker
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .has_parked()
            {
                continue;
            }
            let events = dispatchers.get(name).map(Vec::as_slice).unwrap_or(&[]);
            let mut noop = |_| {};
            let announced = tokio::time::timeout(
                EXIT_ANNOUNCE_LIMIT,
                self.store.retrigger_pending_of(events, &mut noop),
            )
            .await;
            match announced {
                Ok(Ok(n)) => {
                    tracing::info!(dispatcher = %name, announced = n, "{why}: the events this replica's breaker parked announced again for the next owner");
                    let mut b = breaker.lock().unwrap_or_else(|e| e.into_inner());
                    b.parked.count = 0;
                    b.parked.announce_all = false;
                }
                Ok(Err(e)) => {
                    tracing::error!(dispatcher = %name, error = %e, "{why}: the events this replica's breaker parked could not all be announced again; run `outbox-sidecar dispatchers resume {name}` once a replica runs");
                }
                Err(_) => {
                    tracing::error!(dispatcher = %name, limit = ?EXIT_ANNOUNCE_LIMIT, "{why}: announcing the events this replica's breaker parked took too long; run `outbox-sidecar dispatchers resume {name}` once a replica runs");
                }
            }
        }
    }

    /// When each dispatcher's breaker that is not closed probes next (or
    /// gives its probe up).
    pub fn breaker_next_probes(&self) -> HashMap<String, Duration> {
        let now = Instant::now();
        self.breakers
            .iter()
            .filter_map(|(name, b)| {
                let b = b.lock().unwrap_or_else(|e| e.into_inner());
                Some((name.clone(), b.next_probe_in(now)?))
            })
            .collect()
    }

    /// The breaker state of each dispatcher that has one: `closed`,
    /// `open` or `half-open`.
    pub fn breaker_states(&self) -> HashMap<String, &'static str> {
        self.breakers
            .iter()
            .map(|(name, b)| {
                let b = b.lock().unwrap_or_else(|e| e.into_inner());
                (name.clone(), b.state_name())
            })
            .collect()
    }
}

/// How long a probe may be made of a row on its last attempt only if no
/// other row took it first (a probe's failure counts, as every failure).
pub const LAST_ATTEMPT_PROBE_DELAY: Duration = Duration::from_secs(1);

/// How often the breakers' clocks are read.
const BREAKER_TICK: Duration = Duration::from_millis(500);

/// How long shutdown spends announcing the rows breakers parked.
const EXIT_ANNOUNCE_LIMIT: Duration = Duration::from_secs(10);

/// Parked ids a breaker keeps as probe candidates.
const PROBE_CANDIDATES: usize = 16;

/// What a breaker's clock asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Tick {
    Nothing,
    /// Announce one of these parked rows (still pending) as the probe;
    /// any pending row of the dispatcher when none of them is.
    AnnounceProbe(Vec<i64>),
    /// The breaker closed with rows parked: announce every pending row of
    /// the dispatcher.
    AnnounceAll,
}

/// The rows a breaker parked since it last announced them.
#[derive(Debug, Default)]
struct Parked {
    count: u64,
    candidates: std::collections::VecDeque<i64>,
    /// When a probe was last announced (another after a cool-down when
    /// none came back).
    probe_announced: Option<Instant>,
    /// The breaker closed with rows parked; not yet all announced.
    announce_all: bool,
}

/// A breaker's state machine, driven by the instants it is given (a test
/// clock in the unit tests).
#[derive(Debug)]
pub struct Breaker {
    settings: BreakerSettings,
    state: State,
    parked: Parked,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Closed {
        failures: u32,
        last: Option<Instant>,
    },
    /// Holding until `until`; then one probe.
    Open { until: Instant },
    /// A probe is out, since this instant.
    Probing { since: Instant },
}

impl Breaker {
    pub fn new(settings: BreakerSettings) -> Self {
        Breaker {
            settings,
            state: State::Closed {
                failures: 0,
                last: None,
            },
            parked: Parked::default(),
        }
    }

    /// A row held by this breaker was parked.
    pub fn park(&mut self, id: i64) {
        self.parked.count += 1;
        if self.parked.candidates.len() < PROBE_CANDIDATES && !self.parked.candidates.contains(&id)
        {
            self.parked.candidates.push_back(id);
        }
    }

    /// What the clock asks for at `now`.
    pub fn tick(&mut self, now: Instant) -> Tick {
        // A probe granted and never reported (its job cancelled by a
        // revoke, its row changed, its process gone): given up after a
        // cool-down, so the breaker never stays half-open for good.
        if let State::Probing { since } = self.state {
            if now >= since + self.settings.cool_down {
                self.state = State::Open { until: now };
                self.parked.probe_announced = None;
            }
        }
        match self.state {
            State::Closed { .. } if self.parked.announce_all => Tick::AnnounceAll,
            State::Open { until } if now >= until && self.parked.count == 0 => {
                // The cool-down ended with nothing to probe.
                self.close();
                Tick::Nothing
            }
            State::Open { until } if now >= until => match self.parked.probe_announced {
                Some(at) if now < at + self.settings.cool_down => Tick::Nothing,
                _ => {
                    self.parked.probe_announced = Some(now);
                    Tick::AnnounceProbe(self.parked.candidates.iter().copied().collect())
                }
            },
            _ => Tick::Nothing,
        }
    }

    /// No parked row is pending any more: nothing to probe or announce.
    pub fn nothing_parked(&mut self) {
        self.parked = Parked::default();
    }

    /// The probe's announcement failed: try again at the next tick.
    pub fn probe_not_announced(&mut self) {
        self.parked.probe_announced = None;
    }

    /// Every pending row was announced again after the breaker closed.
    /// Rows were parked since they were last announced.
    pub fn has_parked(&self) -> bool {
        self.parked.count > 0 || self.parked.announce_all
    }

    pub fn announced_all(&mut self) {
        self.parked.announce_all = false;
    }

    fn close(&mut self) {
        self.state = State::Closed {
            failures: 0,
            last: None,
        };
        if self.parked.count > 0 {
            self.parked.announce_all = true;
        }
        self.parked.count = 0;
        self.parked.candidates.clear();
        self.parked.probe_announced = None;
    }

    pub fn verdict(&mut self, now: Instant, attempts_left: i32) -> Verdict {
        match self.state {
            State::Closed { .. } => Verdict::Go,
            State::Open { until } if now < until => Verdict::WaitUntil(until),
            State::Open { until } => {
                // A row with attempts to spare probes first; one on its
                // last attempt only when no other came forward.
                if attempts_left > 1 || now >= until + LAST_ATTEMPT_PROBE_DELAY {
                    self.state = State::Probing { since: now };
                    Verdict::Probe
                } else {
                    Verdict::WaitUntil(until + LAST_ATTEMPT_PROBE_DELAY)
                }
            }
            // A probe that never reports (its job cancelled) is given up
            // after a cool-down: the next row probes.
            State::Probing { since } if now >= since + self.settings.cool_down => {
                self.state = State::Open { until: now };
                self.verdict(now, attempts_left)
            }
            State::Probing { since } => Verdict::WaitUntil(since + self.settings.cool_down),
        }
    }

    pub fn report(&mut self, now: Instant, success: bool, probe: bool) {
        if success && probe {
            self.close();
            return;
        }
        self.state = match (self.state, success) {
            (State::Probing { .. }, false) if probe => State::Open {
                until: now + self.settings.cool_down,
            },
            (State::Closed { .. }, true) => State::Closed {
                failures: 0,
                last: None,
            },
            (State::Closed { failures, last }, false) => {
                let in_a_row = match last {
                    Some(last) if now.duration_since(last) <= self.settings.within => failures + 1,
                    _ => 1,
                };
                if in_a_row >= self.settings.failures {
                    State::Open {
                        until: now + self.settings.cool_down,
                    }
                } else {
                    State::Closed {
                        failures: in_a_row,
                        last: Some(now),
                    }
                }
            }
            // Results of requests sent before the breaker opened change
            // nothing while it is open or probing.
            (state, _) => state,
        };
    }

    pub fn state_code(&self) -> i64 {
        match self.state {
            State::Closed { .. } => 0,
            State::Open { .. } => 1,
            State::Probing { .. } => 2,
        }
    }

    pub fn state_name(&self) -> &'static str {
        match self.state {
            State::Closed { .. } => "closed",
            State::Open { .. } => "open",
            State::Probing { .. } => "half-open",
        }
    }

    /// When the next probe may go (open), or when the probe out is given
    /// up (half-open); `None` when closed.
    pub fn next_probe_in(&self, now: Instant) -> Option<Duration> {
        match self.state {
            State::Closed { .. } => None,
            State::Open { until } => {
                let after = match self.parked.probe_announced {
                    Some(at) => until.max(at + self.settings.cool_down),
                    None => until,
                };
                Some(after.saturating_duration_since(now))
            }
            State::Probing { since } => {
                Some((since + self.settings.cool_down).saturating_duration_since(now))
            }
        }
    }
}

#[cfg(test)]
mod tests;
