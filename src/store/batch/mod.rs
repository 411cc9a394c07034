//! Batched status writes: `mark_sent` (every successful event) and
//! `register_failure` (every failed attempt), made for many rows in one
//! statement so the sidecar is not capped by one transaction (one fsync)
//! per event, and failing rows do not slow the rest down.
//!
//! Jobs hand their write to [`StatusWriter`] and wait for the answer; the
//! writer task collects what arrives within a short window (or up to
//! [`MAX_BATCH`] writes) and issues one conditional UPDATE per kind of
//! write. Each write carries the row [`crate::transition`] made (the job
//! computed it; nothing here decides a status or counts an attempt) and
//! keeps its own condition (`id`, `status = 'pending'`, `attempts` as
//! read), so the result per row is that of [`Store::mark_sent`] (as
//! [`Sent`]: an applied write hands back no copy of the row) or of
//! [`Store::register_failure`].

mod many;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use entity::OutboxEventRow;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::history::Attempt;
use super::{db_err, Outcome, Store, StoreError};

pub use super::write::Key;
pub use many::{mark_sent_many, register_failure_many};

/// Writes per batch (of both kinds together).
pub const MAX_BATCH: usize = 256;
/// How long the first write of a batch waits for company.
pub const WINDOW: Duration = Duration::from_millis(2);
/// Batches written at once: one statement's commit (an fsync) overlaps
/// the next batch's gathering and execution.
pub const CONCURRENT_STATEMENTS: usize = 4;

/// How long one batch's statements may take before the batch is dropped.
pub const STATEMENT_DEADLINE: Duration = Duration::from_secs(15);

const SENT_ACTION: &str = "marking events sent";
const FAILURE_ACTION: &str = "registering failures";

/// What a batched `mark_sent` found for one row: as [`Outcome`], without
/// copying rows that the write applied to (the job has them already).
#[derive(Debug, Clone, PartialEq)]
pub enum Sent {
    /// The row is now `sent`, at this time.
    Applied {
        sent_at: chrono::NaiveDateTime,
    },
    /// The row was not `pending` with the expected attempts; as found.
    Conflict(Box<OutboxEventRow>),
    NotFound(i64),
}

/// One row's status write: `next`, the row [`crate::transition`] made of
/// the row its job read, written only while the row is still as read
/// (`seen`).
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub seen: Key,
    pub next: OutboxEventRow,
}

impl Step {
    pub fn new(seen: &OutboxEventRow, next: OutboxEventRow) -> Self {
        Step {
            seen: Key::from(seen),
            next,
        }
    }
}

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

enum Request {
    Sent(Step, Option<Attempt>, Reply<Sent>),
    Failure(Step, Option<Attempt>, Reply<Outcome>),
}

/// The batching writer shared by all jobs; cheap to clone.
#[derive(Clone)]
pub struct StatusWriter {
    tx: mpsc::Sender<Request>,
}

impl StatusWriter {
    /// Starts the writer task; it ends when every handle is dropped.
    pub fn spawn(store: Store) -> StatusWriter {
        Self::spawn_counting(store, None)
    }

    /// [`StatusWriter::spawn`], counting attempt-log rows the database
    /// refused in `log_failures`.
    pub fn spawn_counting(
        store: Store,
        log_failures: Option<prometheus::IntCounter>,
    ) -> StatusWriter {
        let (tx, rx) = mpsc::channel(MAX_BATCH * 4);
        let log = Arc::new(LogHealth {
            failures: log_failures,
            off_until: std::sync::Mutex::new(None),
        });
        tokio::spawn(run(store, log, rx));
        StatusWriter { tx }
    }

    /// As [`Store::mark_sent`], batched with other jobs' writes; with the
    /// attempt log on, `attempt` is recorded in the same write.
    pub async fn mark_sent(
        &self,
        seen: &OutboxEventRow,
        next: &OutboxEventRow,
        attempt: Option<&Attempt>,
    ) -> Result<Sent, StoreError> {
        let (reply, answer) = oneshot::channel();
        let step = Step::new(seen, next.clone());
        let request = Request::Sent(step, attempt.cloned(), reply);
        self.ask(request, answer, SENT_ACTION).await
    }

    /// As [`Store::register_failure`], batched with other jobs' writes;
    /// with the attempt log on, `attempt` is recorded in the same write.
    pub async fn register_failure(
        &self,
        seen: &OutboxEventRow,
        next: &OutboxEventRow,
        attempt: Option<&Attempt>,
    ) -> Result<Outcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        let step = Step::new(seen, next.clone());
        let request = Request::Failure(step, attempt.cloned(), reply);
        self.ask(request, answer, FAILURE_ACTION).await
    }

    async fn ask<T>(
        &self,
        request: Request,
        answer: oneshot::Receiver<Result<T, StoreError>>,
        action: &'static str,
    ) -> Result<T, StoreError> {
        let closed = || {
            db_err(action)(sea_orm::DbErr::Custom(
                "the status writer has stopped".into(),
            ))
        };
        self.tx.send(request).await.map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

/// `first` and what else arrives within [`WINDOW`], up to [`MAX_BATCH`].
async fn gather<T>(rx: &mut mpsc::Receiver<T>, first: T) -> Vec<T> {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    batch.push(first);
    // One timer per batch; what is already queued is taken without one.
    let window = tokio::time::sleep(WINDOW);
    tokio::pin!(window);
    while batch.len() < MAX_BATCH {
        if let Ok(item) = rx.try_recv() {
            batch.push(item);
            continue;
        }
        tokio::select! {
            biased;
            item = rx.recv() => match item {
                Some(item) => batch.push(item),
                None => break,
            },
            _ = &mut window => break,
        }
    }
    batch
}

/// How long the attempt log is left alone after the database refused its
/// rows before a write tries it again.
pub const LOG_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The attempt log's health as the writer sees it. The status is the
/// truth and the log its shadow: when the database refuses the log's rows
/// for good (its table renamed or dropped, a privilege revoked, no
/// partition for the day), statuses are written without them, counted,
/// and the log is tried again after [`LOG_RETRY_AFTER`].
struct LogHealth {
    failures: Option<prometheus::IntCounter>,
    off_until: std::sync::Mutex<Option<std::time::Instant>>,
}

impl LogHealth {
    /// Whether to write the log with this batch.
    fn on(&self) -> bool {
        let mut off = self.off_until.lock().unwrap_or_else(|e| e.into_inner());
        match *off {
            Some(until) if std::time::Instant::now() < until => false,
            Some(_) => {
                *off = None;
                true
            }
            None => true,
        }
    }

    /// `rows` attempt-log rows not written.
    fn dropped(&self, rows: usize) {
        if let Some(c) = &self.failures {
            c.inc_by(rows as u64);
        }
    }

    /// The database refused the log's rows: off for a while.
    fn refused(&self, store: &Store, rows: usize, error: &StoreError) {
        self.dropped(rows);
        let table = store
            .history_table()
            .map(|h| h.table.as_str())
            .unwrap_or("");
        tracing::warn!(
            table,
            rows,
            error = %error,
            retry_in = ?LOG_RETRY_AFTER,
            "the attempt log refused its rows; statuses are written without them"
        );
        *self.off_until.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(std::time::Instant::now() + LOG_RETRY_AFTER);
    }
}

/// Whether `result` is a refusal that the attempt log may have caused.
fn log_suspect<T>(result: &Result<T, StoreError>, log: &[Attempt]) -> bool {
    !log.is_empty() && result.as_ref().is_err_and(|e| !e.is_transient())
}

async fn run(store: Store, log: Arc<LogHealth>, mut rx: mpsc::Receiver<Request>) {
    let statements = Arc::new(Semaphore::new(CONCURRENT_STATEMENTS));
    while let Some(first) = rx.recv().await {
        let batch = gather(&mut rx, first).await;
        // While this batch's statements run, the next batch gathers; at
        // most CONCURRENT_STATEMENTS batches run at once (rows of different
        // batches are distinct: a job waits for its own answer).
        let Ok(permit) = statements.clone().acquire_owned().await else {
            return;
        };
        let store = store.clone();
        let log = log.clone();
        tokio::spawn(async move {
            // A connection that stops answering mid-statement (no reset,
            // no keepalive) would hold these jobs for ever: past the
            // deadline the batch is dropped, each job gets an error and
            // writes again (finding its own write if it did commit).
            if tokio::time::timeout(STATEMENT_DEADLINE, write_batch(&store, &log, batch))
                .await
                .is_err()
            {
                tracing::warn!(deadline = ?STATEMENT_DEADLINE, "a status write did not answer in time; its jobs write again");
            }
            drop(permit);
        });
    }
}

async fn write_batch(store: &Store, log: &LogHealth, batch: Vec<Request>) {
    let (mut sents, mut sent_replies, mut sent_log) = (Vec::new(), Vec::new(), Vec::new());
    let (mut failures, mut failure_replies, mut failure_log) = (Vec::new(), Vec::new(), Vec::new());
    for request in batch {
        match request {
            Request::Sent(step, attempt, reply) => {
                sents.push(step);
                sent_replies.push(reply);
                sent_log.extend(attempt);
            }
            Request::Failure(step, attempt, reply) => {
                failures.push(step);
                failure_replies.push(reply);
                failure_log.extend(attempt);
            }
        }
    }
    let own = |log: &[Attempt], id: i64| -> Vec<Attempt> {
        log.iter().filter(|a| a.event_id == id).cloned().collect()
    };
    if !log.on() {
        log.dropped(sent_log.len() + failure_log.len());
        sent_log.clear();
        failure_log.clear();
    }
    // One after the other: a batch holds one pool connection at a time.
    if !sents.is_empty() {
        let result = sent_then_alone(store, &sents, &mut sent_log, log).await;
        if refused_batch(&result, sents.len()) {
            // One row the database refuses must not fail its neighbours:
            // each row alone, each job its own answer.
            for (step, reply) in sents.into_iter().zip(sent_replies) {
                let id = step.seen.id;
                let one = std::slice::from_ref(&step);
                let result = sent_then_alone(store, one, &mut own(&sent_log, id), log).await;
                answer(std::iter::once(id), vec![reply], result, Sent::NotFound);
            }
        } else {
            let ids = sents.iter().map(|s| s.seen.id);
            answer(ids, sent_replies, result, Sent::NotFound);
        }
    }
    if !failures.is_empty() {
        let result = failures_then_alone(store, &failures, &mut failure_log, log).await;
        if refused_batch(&result, failures.len()) {
            for (step, reply) in failures.into_iter().zip(failure_replies) {
                let id = step.seen.id;
                let one = std::slice::from_ref(&step);
                let result = failures_then_alone(store, one, &mut own(&failure_log, id), log).await;
                answer(std::iter::once(id), vec![reply], result, Outcome::NotFound);
            }
        } else {
            let ids = failures.iter().map(|f| f.seen.id);
            answer(ids, failure_replies, result, Outcome::NotFound);
        }
    }
}

/// [`mark_sent_many`] with the attempt log; when the database refuses
/// that for good, again without it (`attempts` emptied): a delivery never
/// fails for its log row.
async fn sent_then_alone(
    store: &Store,
    steps: &[Step],
    attempts: &mut Vec<Attempt>,
    log: &LogHealth,
) -> Result<HashMap<i64, Sent>, StoreError> {
    let result = mark_sent_many(store, steps, attempts).await;
    if !log_suspect(&result, attempts) {
        return result;
    }
    let alone = mark_sent_many(store, steps, &[]).await;
    if let (Ok(_), Err(e)) = (&alone, &result) {
        log.refused(store, attempts.len(), e);
        attempts.clear();
    }
    alone
}

/// [`register_failure_many`], likewise.
async fn failures_then_alone(
    store: &Store,
    steps: &[Step],
    attempts: &mut Vec<Attempt>,
    log: &LogHealth,
) -> Result<HashMap<i64, Outcome>, StoreError> {
    let result = register_failure_many(store, steps, attempts).await;
    if !log_suspect(&result, attempts) {
        return result;
    }
    let alone = register_failure_many(store, steps, &[]).await;
    if let (Ok(_), Err(e)) = (&alone, &result) {
        log.refused(store, attempts.len(), e);
        attempts.clear();
    }
    alone
}

/// A batch of several rows that the database refused for what it holds:
/// which row it was, only writing them one by one tells.
fn refused_batch<T>(result: &Result<T, StoreError>, rows: usize) -> bool {
    rows > 1 && result.as_ref().is_err_and(|e| !e.is_transient())
}

/// Hands each job (`ids` and `replies` in the same order) its row's
/// outcome, or the batch's error.
fn answer<T: Clone>(
    ids: impl Iterator<Item = i64>,
    replies: Vec<Reply<T>>,
    result: Result<HashMap<i64, T>, StoreError>,
    missing: impl Fn(i64) -> T,
) {
    match result {
        Ok(outcomes) => {
            for (id, reply) in ids.zip(replies) {
                // (ids are distinct in a batch: a job waits for its answer
                // before it writes again; were one there twice, both writes
                // would get the row's outcome)
                let outcome = outcomes.get(&id).cloned().unwrap_or_else(|| missing(id));
                let _ = reply.send(Ok(outcome));
            }
        }
        Err(e) => {
            let message = e.to_string();
            let action = match &e {
                StoreError::Database { action, .. } | StoreError::Refused { action, .. } => action,
                StoreError::Connect { .. } => "connecting to the database",
                StoreError::Interrupted { .. } => "writing statuses",
            };
            let transient = e.is_transient();
            for reply in replies {
                let error = if transient {
                    db_err(action)(sea_orm::DbErr::Custom(message.clone()))
                } else {
                    StoreError::Refused {
                        action,
                        message: message.clone(),
                    }
                };
                let _ = reply.send(Err(error));
            }
        }
    }
}
