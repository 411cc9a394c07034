//! Operator actions that run as operations of the sidecar, not of the
//! request that started them: a resume, a retrigger or a bulk resend
//! started from the admin API or the console answers 202 with the
//! operation's id at once, runs in its own task (never cut by
//! `admin.request_timeout`), and writes its progress and its end to
//! `dispatch.operations_table`, where any replica reads it
//! (`GET /admin/operations/{id}`, the console's operation page). A
//! replica that ends mid-way leaves its row `running` with a heartbeat
//! that stops: after [`CUT_AFTER`] it reads as `cut`, with the command
//! that finishes it (each action is idempotent: run again, it does what
//! is left).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::NaiveDateTime;
use serde::Serialize;

use crate::store::history::Caller;
use crate::store::{now, OperationRow, Store, StoreError};

/// A running operation whose heartbeat is older than this was cut (its
/// replica ended): it writes one at least every [`HEARTBEAT`].
pub const CUT_AFTER: Duration = Duration::from_secs(60);
/// How often a running operation writes its heartbeat when its count has
/// not moved.
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// How often a running operation writes a count that moved.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// The operation kinds.
pub const RESUME: &str = "resume";
pub const RETRIGGER: &str = "retrigger";
pub const RESEND: &str = "resend";

/// Starts and reads operations.
#[derive(Clone)]
pub struct Operations {
    store: Store,
    replica: Arc<str>,
    /// The replays this process carries on, by id.
    running: Arc<std::sync::Mutex<std::collections::HashMap<String, tokio::task::JoinHandle<()>>>>,
}

/// The running count an operation's work reports, and whether it ended
/// because an operator cancelled it.
#[derive(Clone, Default)]
pub struct Progress(Arc<AtomicU64>, Arc<std::sync::atomic::AtomicBool>);

impl Progress {
    pub fn set(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    /// The work ends because it was cancelled: its state is `cancelled`.
    pub fn cancel(&self) {
        self.1.store(true, Ordering::Relaxed);
    }
    fn cancelled(&self) -> bool {
        self.1.load(Ordering::Relaxed)
    }
}

/// An operation as every surface shows it (the API's JSON, the console's
/// page, the CLI's lines).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct OperationView {
    pub id: String,
    /// `resume`, `retrigger`, `resend`.
    pub kind: String,
    /// What it acts on, in words (`dispatcher accounts`, `ids 1, 2`).
    pub target: String,
    /// `running`, `done`, `failed`, `cancelled`, or `cut` (its replica
    /// ended before it did: run `rerun`; a replay is carried on by the
    /// replica holding partition 0, or by its own replica when it starts
    /// again).
    pub state: String,
    /// Rows done so far (announced again, resent).
    pub progress: u64,
    pub message: Option<String>,
    pub error: Option<String>,
    /// The command that finishes it when it failed or was cut.
    pub rerun: String,
    /// The replica (pod) that runs it.
    pub replica: String,
    pub via: String,
    pub label: Option<String>,
    pub started_at: NaiveDateTime,
    pub updated_at: NaiveDateTime,
    pub finished_at: Option<NaiveDateTime>,
    /// Where to follow it.
    pub href: String,
}

impl OperationView {
    /// `row` read at `at`.
    pub fn of(row: OperationRow, at: NaiveDateTime) -> Self {
        let cut = row.state == "running"
            && at.signed_duration_since(row.updated_at).num_seconds() >= CUT_AFTER.as_secs() as i64;
        let (state, error) = if cut {
            (
                "cut".to_owned(),
                Some(format!(
                    "replica {} stopped reporting at {} before the operation ended; \
                     run it again to finish it: {}",
                    row.replica,
                    row.updated_at.format("%Y-%m-%d %H:%M:%S UTC"),
                    row.rerun
                )),
            )
        } else {
            (row.state, row.error)
        };
        Self {
            href: format!("/admin/operations/{}", row.id),
            id: row.id,
            kind: row.kind,
            target: row.target,
            state,
            progress: row.progress.max(0) as u64,
            message: row.message,
            error,
            rerun: row.rerun,
            replica: row.replica,
            via: row.via,
            label: row.label,
            started_at: row.started_at,
            updated_at: row.updated_at,
            finished_at: row.finished_at,
        }
    }

    /// Whether it has ended (done, failed or cut).
    pub fn ended(&self) -> bool {
        self.state != "running"
    }

    /// One line for the CLI and the log.
    pub fn line(&self) -> String {
        let mut line = format!(
            "operation {} ({} {}): {}, {} row(s)",
            self.id, self.kind, self.target, self.state, self.progress
        );
        if let Some(m) = &self.message {
            line.push_str(&format!(": {m}"));
        }
        if let Some(e) = &self.error {
            line.push_str(&format!(": {e}"));
        }
        line
    }
}

/// A new operation's id: its start time and 32 random bits, so ids of
/// replicas started at once differ and sort by start.
fn new_id(at: NaiveDateTime) -> String {
    let mut b = [0u8; 4];
    let random = match getrandom::fill(&mut b) {
        Ok(()) => u32::from_le_bytes(b),
        Err(_) => std::process::id() ^ at.and_utc().timestamp_subsec_nanos(),
    };
    format!("op-{}-{random:08x}", at.format("%Y%m%dT%H%M%S"))
}

impl Operations {
    pub fn new(store: Store, replica: &str) -> Self {
        Self {
            store,
            replica: replica.into(),
            running: Default::default(),
        }
    }

    /// A new running operation's row, started by `caller` at `at`.
    fn new_row(
        &self,
        kind: &str,
        target: String,
        rerun: String,
        caller: &Caller,
        at: NaiveDateTime,
    ) -> OperationRow {
        OperationRow {
            id: new_id(at),
            kind: kind.to_owned(),
            target,
            state: "running".to_owned(),
            progress: 0,
            message: None,
            error: None,
            rerun,
            replica: self.replica.to_string(),
            via: caller.via.as_str().to_owned(),
            label: caller.label.clone(),
            started_at: at,
            updated_at: at,
            finished_at: None,
            params: None,
            cursor: None,
            cancelled_at: None,
        }
    }

    /// The replica (pod) this runs in.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// The database it records operations in.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Asks running operation `id` to stop; `false` when no such operation
    /// is running.
    pub async fn cancel(&self, id: &str) -> Result<bool, StoreError> {
        self.store.cancel_operation(id).await
    }

    /// Starts a replay (its plan kept in the row, its cursor at 0) and runs
    /// it in a task of its own.
    pub async fn start_replay(
        &self,
        plan: crate::replay::ReplayPlan,
        target: String,
        rerun: String,
        caller: &Caller,
    ) -> Result<OperationView, StoreError> {
        let at = now();
        let mut row = self.new_row(crate::replay::REPLAY, target, rerun, caller, at);
        row.params = Some(serde_json::to_string(&plan).unwrap_or_default());
        row.cursor = Some(0);
        self.store.insert_operation(&row).await?;
        tracing::info!(operation = %row.id, target = %row.target, via = %row.via, "replay started");
        self.spawn_replay(&row, plan, caller.clone(), 0, 0);
        Ok(OperationView::of(row, at))
    }

    fn spawn_replay(
        &self,
        row: &OperationRow,
        plan: crate::replay::ReplayPlan,
        caller: Caller,
        done: u64,
        cursor: i64,
    ) -> tokio::task::JoinHandle<()> {
        let progress = Progress::default();
        progress.set(done);
        let fut = crate::replay::run(
            self.store.clone(),
            row.id.clone(),
            self.replica.to_string(),
            plan,
            caller,
            progress.clone(),
            cursor,
        );
        tokio::spawn(drive(self.store.clone(), row.id.clone(), progress, fut))
    }

    /// Carries on the replays whose replica ended: this replica's own (it
    /// started again under the same name: at once) and any other whose
    /// heartbeat stopped [`CUT_AFTER`] ago (when `others`: the replica
    /// holding partition 0). Returns how many it took over.
    pub async fn carry_on_replays(&self, others: bool) -> Result<usize, StoreError> {
        let at = now();
        let stale = at - chrono::Duration::from_std(CUT_AFTER).unwrap_or_default();
        let own_stale = at - chrono::Duration::from_std(HEARTBEAT * 3 / 2).unwrap_or_default();
        let mut taken = 0;
        for row in self
            .store
            .stale_operations(crate::replay::REPLAY, at)
            .await?
        {
            let own = row.replica == *self.replica;
            // Its own: a heartbeat missed once and a half (the process that
            // wrote it ended; the name is the pod's, so this is its restart).
            let before = if own { own_stale } else { stale };
            if (!own && !others) || row.updated_at >= before || self.running_here(&row.id) {
                continue;
            }
            let Some(plan) = row
                .params
                .as_deref()
                .and_then(|p| serde_json::from_str::<crate::replay::ReplayPlan>(p).ok())
            else {
                continue;
            };
            if !self
                .store
                .claim_operation(&row.id, &self.replica, before)
                .await?
            {
                continue;
            }
            tracing::info!(operation = %row.id, from = %row.replica, cursor = ?row.cursor, "carrying on a replay whose replica ended");
            let via = match row.via.as_str() {
                "console" => crate::store::history::Via::Console,
                "admin-api" => crate::store::history::Via::AdminApi,
                _ => crate::store::history::Via::Cli,
            };
            let caller = Caller::new(via, row.label.clone());
            let handle = self.spawn_replay(
                &row,
                plan,
                caller,
                row.progress.max(0) as u64,
                row.cursor.unwrap_or(0),
            );
            self.running.lock().unwrap().insert(row.id.clone(), handle);
            taken += 1;
        }
        Ok(taken)
    }

    /// Whether this process runs operation `id` now.
    fn running_here(&self, id: &str) -> bool {
        let mut running = self.running.lock().unwrap();
        running.retain(|_, h| !h.is_finished());
        running.contains_key(id)
    }

    /// Records the operation, then runs `work` in a task of its own and
    /// answers at once with the operation as it starts. `work` reports its
    /// running count through the [`Progress`] it gets and ends with a
    /// message (done) or an error (failed).
    pub async fn start<F, Fut>(
        &self,
        kind: &str,
        target: String,
        rerun: String,
        caller: &Caller,
        work: F,
    ) -> Result<OperationView, StoreError>
    where
        F: FnOnce(Progress) -> Fut,
        Fut: Future<Output = Result<String, String>> + Send + 'static,
    {
        let at = now();
        let row = self.new_row(kind, target, rerun, caller, at);
        self.store.insert_operation(&row).await?;
        let progress = Progress::default();
        let fut = work(progress.clone());
        let store = self.store.clone();
        let id = row.id.clone();
        tracing::info!(operation = %id, kind, target = %row.target, via = %row.via, "operation started");
        tokio::spawn(drive(store, id, progress, fut));
        Ok(OperationView::of(row, at))
    }

    /// One operation, read from the table (whichever replica runs it).
    pub async fn get(&self, id: &str) -> Result<Option<OperationView>, StoreError> {
        Ok(self
            .store
            .operation(id)
            .await?
            .map(|row| OperationView::of(row, now())))
    }

    /// The most recent operations, newest first.
    pub async fn recent(&self, limit: u64) -> Result<Vec<OperationView>, StoreError> {
        let at = now();
        Ok(self
            .store
            .operations(limit)
            .await?
            .into_iter()
            .map(|row| OperationView::of(row, at))
            .collect())
    }
}

/// Runs `fut` to its end, writing the count as it moves (at most once a
/// [`PROGRESS_EVERY`]) and a heartbeat every [`HEARTBEAT`], then the end.
async fn drive<Fut>(store: Store, id: String, progress: Progress, fut: Fut)
where
    Fut: Future<Output = Result<String, String>> + Send + 'static,
{
    // The work runs in a task of its own: a progress write waiting for a
    // row lock the work holds (a replay's step locks its operation's row)
    // must not stop the work from finishing the transaction that holds it.
    let mut fut = tokio::spawn(fut);
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut written = 0u64;
    let mut last_write = Instant::now();
    let result = loop {
        tokio::select! {
            r = &mut fut => break r.unwrap_or_else(|e| Err(format!("the operation's task ended: {e}"))),
            _ = tick.tick() => {
                let n = progress.get();
                if n != written || last_write.elapsed() >= HEARTBEAT {
                    match store.operation_progress(&id, n).await {
                        Ok(()) => {
                            written = n;
                            last_write = Instant::now();
                        }
                        Err(e) => tracing::warn!(operation = %id, error = %e, "could not record an operation's progress"),
                    }
                }
            }
        }
    };
    let n = progress.get();
    let (state, message, error) = match result {
        Ok(m) if progress.cancelled() => ("cancelled", Some(m), None),
        Ok(m) => ("done", Some(m), None),
        Err(e) => ("failed", None, Some(e)),
    };
    match &error {
        None => tracing::info!(operation = %id, rows = n, message = ?message, "operation done"),
        Some(e) => tracing::warn!(operation = %id, rows = n, error = %e, "operation failed"),
    }
    // The end must land: a database that blinks now would leave the
    // operation `running` until it reads as cut.
    let mut delay = Duration::from_millis(200);
    for _ in 0..8 {
        match store
            .finish_operation(&id, state, n, message.clone(), error.clone())
            .await
        {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(operation = %id, error = %e, "could not record an operation's end; trying again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// The actions that run as operations, one code path for the API and the
/// console.
impl Operations {
    /// Resumes dispatcher `name` (its pause deleted, then its pending
    /// events announced again in committed batches).
    pub async fn resume(
        &self,
        dispatchers: &std::collections::BTreeMap<String, Vec<String>>,
        name: &str,
        caller: &Caller,
    ) -> Result<OperationView, crate::operator::DispatcherError> {
        if !dispatchers.contains_key(name) {
            return Err(crate::operator::DispatcherError::Unknown {
                name: name.to_owned(),
                known: dispatchers.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        }
        let store = self.store.clone();
        let dispatchers = dispatchers.clone();
        let owned = name.to_owned();
        Ok(self
            .start(
                RESUME,
                format!("dispatcher {name}"),
                format!("outbox-sidecar dispatchers resume {name}"),
                caller,
                move |progress| async move {
                    crate::operator::resume_with_progress(&store, &dispatchers, &owned, &mut |n| {
                        progress.set(n)
                    })
                    .await
                    .map(|done| done.message)
                    .map_err(|e| e.to_string())
                },
            )
            .await?)
    }

    /// Announces again the pending rows `filter` selects.
    pub async fn retrigger(
        &self,
        filter: crate::store::RetriggerFilter,
        caller: &Caller,
    ) -> Result<OperationView, StoreError> {
        let (target, rerun) = retrigger_words(&filter);
        let store = self.store.clone();
        self.start(
            RETRIGGER,
            target,
            rerun,
            caller,
            move |progress| async move {
                store
                    .retrigger_with_progress(&filter, &mut |n| progress.set(n))
                    .await
                    .map(|n| format!("{n} pending event(s) announced again"))
                    .map_err(|e| e.to_string())
            },
        )
        .await
    }

    /// Resends every failed event `filter` selects (failed -> pending,
    /// attempts 0), the table gauges read again at its end.
    pub async fn resend(
        &self,
        metrics: Option<crate::metrics::Metrics>,
        filter: crate::store::FailedFilter,
        target: String,
        rerun: String,
        caller: &Caller,
    ) -> Result<OperationView, StoreError> {
        let store = self.store.clone();
        let owned_caller = caller.clone();
        self.start(RESEND, target, rerun, caller, move |progress| async move {
            crate::operator::resend_failed_with_progress(
                &store,
                metrics.as_ref(),
                &filter,
                &owned_caller,
                &mut |n| progress.set(n),
            )
            .await
            .map(|n| format!("{n} event{} set to pending.", if n == 1 { "" } else { "s" }))
            .map_err(|e| e.to_string())
        })
        .await
    }
}

/// A retrigger's target in words, and the CLI command that runs it again.
fn retrigger_words(filter: &crate::store::RetriggerFilter) -> (String, String) {
    let mut target;
    let mut rerun = "outbox-sidecar events retrigger".to_owned();
    if !filter.ids.is_empty() {
        let ids = filter
            .ids
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        target = format!("ids {ids}");
        rerun.push_str(&format!(" {}", ids.replace(',', " ")));
    } else {
        let d = filter.older_than.unwrap_or_default();
        // As the settings write it (`10m`, `1h30m`): one shell word.
        let d = humantime::format_duration(d).to_string().replace(' ', "");
        target = format!("pending for longer than {d}");
        rerun.push_str(&format!(" --pending-older-than {d}"));
    }
    if let Some(name) = &filter.event_name {
        target.push_str(&format!(", event {name}"));
        rerun.push_str(&format!(" --event-name {name}"));
    }
    (target, rerun)
}

/// How `outbox-sidecar operations` ended.
#[derive(Debug)]
pub enum Printed {
    /// Listed, or the operation is running or done.
    Ok,
    /// The operation failed or was cut: its rerun was printed.
    Unfinished,
    NotFound,
    Error(StoreError),
}

impl Operations {
    /// `outbox-sidecar operations [ID] [--wait]`: the same views as the
    /// API, one line each; with `wait`, the progress until the end.
    pub async fn print(&self, id: Option<&str>, wait: bool) -> Printed {
        let Some(id) = id else {
            return match self.recent(20).await {
                Ok(list) => {
                    if list.is_empty() {
                        println!("no operations recorded");
                    }
                    for op in list {
                        println!(
                            "{} {} UTC via {}: {}",
                            op.id,
                            op.started_at.format("%Y-%m-%d %H:%M:%S"),
                            op.via,
                            op.line()
                        );
                    }
                    Printed::Ok
                }
                Err(e) => Printed::Error(e),
            };
        };
        let mut last = None;
        loop {
            let op = match self.get(id).await {
                Ok(Some(op)) => op,
                Ok(None) => return Printed::NotFound,
                Err(e) => return Printed::Error(e),
            };
            let line = op.line();
            if last.as_ref() != Some(&line) {
                println!("{line}");
                last = Some(line);
            }
            if !wait || op.ended() {
                if op.state == "failed" || op.state == "cut" {
                    eprintln!("to finish it, run it again: {}", op.rerun);
                    return Printed::Unfinished;
                }
                return Printed::Ok;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: &str, updated_at: NaiveDateTime) -> OperationRow {
        OperationRow {
            id: "op-1".into(),
            kind: RESUME.into(),
            target: "dispatcher accounts".into(),
            state: state.into(),
            progress: 5,
            message: None,
            error: None,
            rerun: "outbox-sidecar dispatchers resume accounts".into(),
            replica: "pod-a".into(),
            via: "admin-api".into(),
            label: None,
            started_at: updated_at,
            updated_at,
            finished_at: None,
            params: None,
            cursor: None,
            cancelled_at: None,
        }
    }

    #[test]
    fn a_running_operation_whose_heartbeat_stopped_reads_as_cut_with_what_to_run() {
        let t = now();
        let fresh = OperationView::of(row("running", t), t + chrono::Duration::seconds(59));
        assert_eq!(fresh.state, "running");
        assert!(fresh.error.is_none());
        let cut = OperationView::of(row("running", t), t + chrono::Duration::seconds(60));
        assert_eq!(cut.state, "cut");
        let e = cut.error.unwrap();
        assert!(e.contains("pod-a"), "{e}");
        assert!(
            e.contains("outbox-sidecar dispatchers resume accounts"),
            "{e}"
        );
        // An ended one never reads as cut.
        let done = OperationView::of(row("done", t), t + chrono::Duration::hours(1));
        assert_eq!(done.state, "done");
    }

    #[test]
    fn ids_differ_and_name_their_start() {
        let t = now();
        let (a, b) = (new_id(t), new_id(t));
        assert_ne!(a, b);
        assert!(
            a.starts_with(&format!("op-{}", t.format("%Y%m%dT%H%M%S"))),
            "{a}"
        );
    }
}
