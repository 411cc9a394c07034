//! Echoes: what Debezium publishes of the sidecar's own status writes.
//!
//! A change feed captures every write to the outbox table, so each UPDATE
//! the sidecar makes (the `sent` write, every failure write) comes back on
//! the same topic as an update event, and the sidecar consumes and skips
//! it. The bench installs an `AFTER UPDATE` trigger that appends the
//! changed rows' changing columns to a queue table in commit order (one
//! statement-level trigger with a transition table: a row-level PL/pgSQL
//! trigger cost PostgreSQL more per row than the sidecar's whole status
//! write, and Debezium runs nothing in the database's statements); a task
//! drains that queue every few milliseconds and publishes each entry as the update
//! event Debezium's PostgreSQL connector writes with the table's default
//! replica identity (JsonConverter without schemas, `before` null), keyed
//! `{"id": N}` like the insert so it lands on the same partition. The
//! payload, which a status write never changes, is joined from the table
//! rather than copied into the queue; one stored out of line (TOAST, past
//! about 2 KB) is not in the WAL record of an update that left it alone,
//! so Debezium writes its placeholder `__debezium_unavailable_value`
//! there, and so does the bench.
//!
//! What a take costs PostgreSQL is the bench's, not the sidecar's, and it
//! used to be most of PostgreSQL's CPU in S1 (a per-process `perf` of one
//! run: the four echo connections 22% of all samples, the sidecar's seven
//! 20%). Two causes, both fixed:
//! - the join to the outbox table was planned for the take's `LIMIT`
//!   (2,000 rows) rather than the few dozen a take finds: a merge join
//!   that walked the table's primary key from its start, 16,322 rows for
//!   191 echoes in one `EXPLAIN ANALYZE` mid-run. It is now a lateral
//!   lookup by id (`OFFSET 0` keeps the planner from flattening it);
//! - every take walked, from the start of the queue's index, the entries
//!   the earlier takes had deleted (the CI server runs without
//!   autovacuum): 14,887 heap fetches to find the oldest entry mid-run.
//!   A take now starts past what was already taken (see [`Floor`]).

use super::*;

/// PostgreSQL moves a row's value out of line past about 2 KB (its
/// `TOAST_TUPLE_THRESHOLD`); `pg_column_size` is the value's stored size.
const TOAST_THRESHOLD: usize = 2_000;
/// What Debezium writes for an unchanged TOASTed column
/// (`unavailable.value.placeholder`'s default).
const UNAVAILABLE: &str = "__debezium_unavailable_value";

/// The queue table and the trigger, on the scenario's database (once: a
/// database that already has them, a history's, keeps them).
pub(crate) async fn install(store: &Store) -> Result<()> {
    let t = store.table();
    let sql = format!(
        r#"
CREATE TABLE IF NOT EXISTS bench_echo (
    seq bigserial PRIMARY KEY,
    id bigint NOT NULL,
    status text, attempts int, last_error text, sent_at timestamp, updated_at timestamp
);
CREATE OR REPLACE FUNCTION bench_echo_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench_echo (id, status, attempts, last_error, sent_at, updated_at)
    SELECT id, status, attempts, last_error, sent_at, updated_at FROM changed ORDER BY id;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER bench_echo AFTER UPDATE ON {t} REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION bench_echo_rows();
"#
    );
    store
        .connection()
        .execute_unprepared(&sql)
        .await
        .context("installing the echo trigger")?;
    Ok(())
}

/// Turns the trigger off or on: off, the table's updates queue nothing
/// (a figure of the database's own work that must not count the bench's).
pub(crate) async fn set_enabled(store: &Store, on: bool) -> Result<()> {
    let sql = format!(
        "ALTER TABLE {} {} TRIGGER bench_echo",
        store.table(),
        if on { "ENABLE" } else { "DISABLE" }
    );
    store
        .connection()
        .execute_unprepared(&sql)
        .await
        .context("switching the echo trigger")?;
    Ok(())
}

/// One queued change, with the unchanging columns joined from the table.
struct Change {
    seq: i64,
    id: i64,
    event_name: String,
    payload: String,
    created_at: NaiveDateTime,
    status: String,
    attempts: i32,
    last_error: Option<String>,
    sent_at: Option<NaiveDateTime>,
    updated_at: NaiveDateTime,
}

/// Takes up to `limit` queued changes past `floor`, oldest first.
async fn take(store: &Store, limit: usize, floor: i64) -> Result<Vec<Change>> {
    let sql = format!(
        "WITH d AS (DELETE FROM bench_echo WHERE seq IN \
             (SELECT seq FROM bench_echo WHERE seq > $1 ORDER BY seq LIMIT {limit}) RETURNING *) \
         SELECT d.*, o.* FROM d CROSS JOIN LATERAL \
             (SELECT event_name, created_at, \
                  CASE WHEN pg_column_size(payload) > {TOAST_THRESHOLD} \
                  THEN '{UNAVAILABLE}' ELSE payload::text END AS payload \
              FROM {} WHERE id = d.id OFFSET 0) AS o \
         ORDER BY d.seq",
        store.table()
    );
    let rows = store
        .connection()
        .query_all_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            [floor.into()],
        ))
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Change {
                seq: r.try_get("", "seq")?,
                id: r.try_get("", "id")?,
                event_name: r.try_get("", "event_name")?,
                payload: r.try_get("", "payload")?,
                created_at: r.try_get("", "created_at")?,
                status: r.try_get("", "status")?,
                attempts: r.try_get("", "attempts")?,
                last_error: r.try_get("", "last_error")?,
                sent_at: r.try_get("", "sent_at")?,
                updated_at: r.try_get("", "updated_at")?,
            })
        })
        .collect::<Result<Vec<_>, sea_orm::DbErr>>()
        .map_err(Into::into)
}

/// Where the next take starts. Entries become visible when the write that
/// queued them commits, so one may appear below entries already taken (its
/// transaction took its `seq` earlier and committed later): every `seq`
/// skipped over is a gap, and the floor stays below the oldest gap until it
/// is taken, or for [`GAP_WAIT`] (a rolled-back write leaves its `seq`
/// unused for ever).
#[derive(Default)]
struct Floor {
    /// Every entry at or below it has been taken (or given up on).
    at: i64,
    /// The highest `seq` taken.
    top: i64,
    /// Gaps below `top`, with when they were first seen.
    gaps: std::collections::BTreeMap<i64, std::time::Instant>,
}

/// How long a gap in the queue is waited for.
const GAP_WAIT: Duration = Duration::from_secs(10);

impl Floor {
    fn advance(&mut self, taken: &[Change]) {
        let now = std::time::Instant::now();
        let mut seqs: Vec<i64> = taken.iter().map(|c| c.seq).collect();
        seqs.sort_unstable();
        for &seq in &seqs {
            self.gaps.remove(&seq);
            for gap in self.top + 1..seq {
                self.gaps.insert(gap, now);
            }
            self.top = self.top.max(seq);
        }
        self.gaps
            .retain(|_, seen| now.duration_since(*seen) < GAP_WAIT);
        self.at = match self.gaps.keys().next() {
            Some(&oldest) => oldest - 1,
            None => self.top,
        };
    }
}

/// The update event for one change: key and value.
fn update_event(c: &Change, table: &str, seq: u64) -> (String, String) {
    let micros = |t: NaiveDateTime| t.and_utc().timestamp_micros();
    let now = chrono::Utc::now().timestamp_millis();
    let lsn = 80_000_000 + seq * 64;
    let value = json!({
        "before": null,
        "after": {
            "id": c.id,
            "event_name": c.event_name,
            "payload": c.payload,
            "status": c.status,
            "attempts": c.attempts,
            "last_error": c.last_error,
            "sent_at": c.sent_at.map(micros),
            "created_at": micros(c.created_at),
            "updated_at": micros(c.updated_at),
        },
        "source": {"version": "2.7.3.Final", "connector": "postgresql", "name": "bench",
                   "ts_ms": now, "snapshot": "false", "db": "bench",
                   "sequence": format!("[\"{}\",\"{lsn}\"]", lsn - 8),
                   "schema": "public", "table": table, "txId": 2_000_000 + seq, "lsn": lsn,
                   "xmin": null},
        "op": "u",
        "ts_ms": now,
        "transaction": null,
    });
    (crate::kafka::key_of(c.id), value.to_string())
}

/// The task that drains the queue onto the topic while a scenario runs.
pub(crate) struct Echoes {
    stop: Arc<AtomicBool>,
    published: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl Echoes {
    /// Starts draining `store`'s queue onto `topic` of `brokers` with a
    /// producer of its own (the bench's producer settings).
    pub(crate) fn start(store: Store, brokers: &str, topic: &str) -> Result<Echoes> {
        let producer = Broker::producer(brokers)?;
        let stop = Arc::new(AtomicBool::new(false));
        let published = Arc::new(AtomicU64::new(0));
        let topic = topic.to_owned();
        let task = {
            let (stop, published) = (stop.clone(), published.clone());
            tokio::spawn(async move {
                let mut floor = Floor::default();
                loop {
                    // Read the flag before the queue: after a stop, one more
                    // pass takes whatever was queued before it.
                    let stopping = stop.load(Ordering::Relaxed);
                    let changes = take(&store, 2_000, floor.at).await?;
                    floor.advance(&changes);
                    for c in &changes {
                        let seq = published.fetch_add(1, Ordering::Relaxed);
                        let (key, value) = update_event(c, store.table(), seq);
                        send(&producer, &topic, &key, &value)?;
                    }
                    if changes.is_empty() {
                        if stopping {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                producer
                    .flush(Duration::from_secs(60))
                    .context("flushing the echo producer")?;
                Ok(())
            })
        };
        Ok(Echoes {
            stop,
            published,
            task,
        })
    }

    /// Publishes what is queued, then stops; returns the echoes published.
    pub(crate) async fn finish(self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.context("the echo task")??;
        Ok(self.published.load(Ordering::Relaxed))
    }
}
