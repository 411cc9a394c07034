//! The bench's databases, the sidecar's configuration, the outbox rows.

use super::*;

pub(crate) struct Env {
    pub(crate) opts: Options,
    pub(crate) admin: DatabaseConnection,
    pub(crate) receivers: Receivers,
    pub(crate) ticks_per_s: f64,
    pub(crate) next_db: AtomicUsize,
}

pub(crate) struct BenchDb {
    pub(crate) name: String,
    pub(crate) url: String,
}

impl Env {
    pub(crate) async fn create_db(&self) -> Result<BenchDb> {
        let n = self.next_db.fetch_add(1, Ordering::Relaxed);
        let name = format!("bench_{}_{n}", std::process::id());
        self.admin
            .execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await
            .with_context(|| format!("creating database {name}"))?;
        let mut url = url::Url::parse(&self.opts.pg_url).context("--pg-url")?;
        url.set_path(&format!("/{name}"));
        Ok(BenchDb {
            name,
            url: url.to_string(),
        })
    }

    pub(crate) async fn drop_db(&self, db: &BenchDb) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", db.name);
        if let Err(e) = self.admin.execute_unprepared(&sql).await {
            eprintln!("warning: cannot drop database {}: {e}", db.name);
        }
    }

    /// Runs `body` on a fresh database and drops it whatever happens.
    pub(crate) async fn with_db<T, F, Fut>(&self, body: F) -> Result<T>
    where
        F: FnOnce(String) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let db = self.create_db().await?;
        let result = body(db.url.clone()).await;
        self.drop_db(&db).await;
        result
    }

    /// The sidecar's configuration file for one scenario (validated here,
    /// so a mistake fails before the child starts).
    pub(crate) fn settings(
        &self,
        db_url: &str,
        brokers: &str,
        topic: &str,
        admin_port: u16,
        receiver: &Receiver,
        extra: &str,
    ) -> Result<String> {
        let toml = format!(
            r#"
[database]
url = "{db_url}"
max_connections = {POOL}
[kafka]
brokers = "{brokers}"
topic = "{topic}"
group_id = "bench-sidecar"
[kafka.properties]
"session.timeout.ms" = "6000"
"heartbeat.interval.ms" = "500"
{extra_kafka}[dispatch]
max_attempts = 3
retry_delay = "{RETRY_DELAY}"
max_in_flight = {mif}
[dispatchers.accounts]
url = "{url}"
events = ["accounts.purchase_create", "accounts.installment_paid", "accounts.installment_overdue"]
timeout = "10s"
{ca_file}[dispatchers.accounts.headers]
Authorization = "Bearer bench-token"
[admin]
listen = "127.0.0.1:{admin_port}"
api_listen = "127.0.0.1:0"
[log]
level = "error"
{extra}"#,
            mif = self.opts.max_in_flight,
            url = receiver.url,
            ca_file = receiver
                .ca_file
                .as_ref()
                .map(|p| format!("ca_file = {:?}\n", p.display().to_string()))
                .unwrap_or_default(),
            extra_kafka = self
                .opts
                .kafka_properties
                .iter()
                .map(|(k, v)| format!("{k:?} = {v:?}\n"))
                .collect::<String>(),
        );
        Settings::from_toml(Some(&toml), BTreeMap::new()).context("bench settings")?;
        Ok(toml)
    }
}

pub(crate) async fn open_store(url: &str, table: &str, pool: u32) -> Result<Store> {
    let store = Store::connect(url, table, pool, Duration::from_secs(10)).await?;
    store.migrate().await?;
    Ok(store)
}

/// `n` pending rows in one statement; payloads of ~350 bytes like the
/// accounts events, or padded to about `payload_bytes` (when larger) with a
/// `notes` array of md5 strings, distinct per row so the broker's lz4 does
/// not squeeze them away.
pub(crate) async fn insert_rows(store: &Store, n: usize, payload_bytes: usize) -> Result<()> {
    let sql = format!(
        r#"INSERT INTO {t} (event_name, payload, status, attempts, created_at, updated_at)
SELECT e, {payload}, 'pending', 0, now() AT TIME ZONE 'utc', now() AT TIME ZONE 'utc'
FROM (SELECT g, {name} AS e FROM generate_series(1, {n}) AS g) AS s
ORDER BY g"#,
        t = store.table(),
        payload = payload_sql(payload_bytes),
        name = event_name_sql(),
    );
    insert(store, &sql, n).await
}

/// A history of `n` rows sent long ago, in one statement: the same
/// payloads, created one after the other over the last two years (oldest
/// first, so ids and times rise together), each sent two seconds after it
/// was created at its first attempt. Then VACUUM (ANALYZE), as autovacuum
/// would have done to a table that old.
pub(crate) async fn seed_history(store: &Store, n: usize) -> Result<()> {
    let step_s = 2.0 * 365.0 * 86_400.0 / n.max(1) as f64;
    let sql = format!(
        r#"INSERT INTO {t} (event_name, payload, status, attempts, created_at, updated_at, sent_at)
SELECT e, {payload}, 'sent', 1, c, c + interval '2 seconds', c + interval '2 seconds'
FROM (SELECT g, {name} AS e,
             (now() AT TIME ZONE 'utc') - make_interval(secs => ({n} - g + 1) * {step_s}) AS c
      FROM generate_series(1, {n}) AS g) AS s
ORDER BY g"#,
        t = store.table(),
        payload = payload_sql(0),
        name = event_name_sql(),
    );
    insert(store, &sql, n).await?;
    store
        .connection()
        .execute_unprepared(&format!("VACUUM (ANALYZE) {}", store.table()))
        .await
        .context("vacuuming the history")?;
    Ok(())
}

/// The event name of row `g`, one of [`EVENT_NAMES`] in turn.
fn event_name_sql() -> String {
    format!(
        "(ARRAY['{}', '{}', '{}'])[1 + g % 3]",
        EVENT_NAMES[0], EVENT_NAMES[1], EVENT_NAMES[2]
    )
}

/// The payload of row `g` and event name `e` (see [`insert_rows`]).
fn payload_sql(payload_bytes: usize) -> String {
    // Each md5 string takes 35 bytes of the payload's JSON text.
    let notes = payload_bytes.saturating_sub(350).div_ceil(35);
    let pad = if notes == 0 {
        String::new()
    } else {
        format!(
            ",\n           'notes', (SELECT jsonb_agg(md5(g::text || ':' || i::text)) \
             FROM generate_series(1, {notes}) AS i)"
        )
    };
    format!(
        r#"jsonb_build_object('event_type', e, 'data', jsonb_build_object(
           'purchase_id', 900000 + g, 'account_id', g % 977, 'amount_cents', 129900,
           'currency', 'BRL', 'installments', 6, 'due_date', '2025-07-10',
           'items', jsonb_build_array(
               jsonb_build_object('sku', 'SKU-0001', 'qty', 1, 'price_cents', 4330),
               jsonb_build_object('sku', 'SKU-0002', 'qty', 2, 'price_cents', 4331),
               jsonb_build_object('sku', 'SKU-0003', 'qty', 3, 'price_cents', 4332)){pad}))"#
    )
}

/// Runs one INSERT … SELECT that must insert `n` rows, then ANALYZE.
pub(crate) async fn insert(store: &Store, sql: &str, n: usize) -> Result<()> {
    let res = store
        .connection()
        .execute_unprepared(sql)
        .await
        .context("inserting rows")?;
    if res.rows_affected() != n as u64 {
        bail!("inserted {} rows, wanted {n}", res.rows_affected());
    }
    store
        .connection()
        .execute_unprepared(&format!("ANALYZE {}", store.table()))
        .await?;
    Ok(())
}

/// A row as the change event needs it.
pub(crate) struct SourceRow {
    pub(crate) id: i64,
    pub(crate) event_name: String,
    pub(crate) payload: String,
    pub(crate) created_at: NaiveDateTime,
    pub(crate) updated_at: NaiveDateTime,
}

pub(crate) async fn load_rows(store: &Store, after: i64, limit: usize) -> Result<Vec<SourceRow>> {
    let stmt = Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!(
            "SELECT id, event_name, payload::text AS payload, created_at, updated_at \
             FROM {} WHERE id > $1 ORDER BY id LIMIT {limit}",
            store.table()
        ),
        [after.into()],
    );
    let rows = store.connection().query_all_raw(stmt).await?;
    rows.iter()
        .map(|r| {
            Ok(SourceRow {
                id: r.try_get("", "id")?,
                event_name: r.try_get("", "event_name")?,
                payload: r.try_get("", "payload")?,
                created_at: r.try_get("", "created_at")?,
                updated_at: r.try_get("", "updated_at")?,
            })
        })
        .collect::<Result<Vec<_>, sea_orm::DbErr>>()
        .map_err(Into::into)
}

pub(crate) async fn all_ids(store: &Store) -> Result<Vec<i64>> {
    let stmt = Statement::from_string(
        DbBackend::Postgres,
        format!("SELECT id FROM {} ORDER BY id", store.table()),
    );
    let rows = store.connection().query_all_raw(stmt).await?;
    rows.iter()
        .map(|r| r.try_get::<i64>("", "id").map_err(Into::into))
        .collect()
}

/// (sent, failed) counts of the rows past id `after` (the scenario's own
/// rows: a history table's earlier rows are never read).
pub(crate) async fn progress(store: &Store, after: i64) -> Result<(i64, i64)> {
    let stmt = Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!(
            "SELECT count(*) FILTER (WHERE status = 'sent') AS sent, \
                    count(*) FILTER (WHERE status = 'failed') AS failed FROM {} WHERE id > $1",
            store.table()
        ),
        [after.into()],
    );
    let row = store
        .connection()
        .query_one_raw(stmt)
        .await?
        .ok_or_else(|| anyhow!("no count row"))?;
    Ok((row.try_get("", "sent")?, row.try_get("", "failed")?))
}

/// Polls until every row is `sent` or `failed`; fails when nothing moves
/// for [`STALL_LIMIT`].
///
/// `answered` counts the receiver's 2xx answers since the scenario began:
/// a row is `sent` only after one, so the table is counted (a full scan
/// of it: with 50,000 rows and their dead versions, 20 scans a second took
/// ~10% of the machine's CPU, charged to PostgreSQL and taken from the
/// sidecar) only once `n` were answered, or when the answers stop moving
/// for a second (rows that end `failed` get none).
pub(crate) async fn wait_all_done(
    store: &Store,
    after: i64,
    n: usize,
    answered: impl Fn() -> u64,
) -> Result<(i64, i64)> {
    let mut last = (-1, -1);
    let mut moved = Instant::now();
    let (mut seen, mut seen_at) = (answered(), Instant::now());
    loop {
        let now_answered = answered();
        if now_answered != seen {
            (seen, seen_at) = (now_answered, Instant::now());
        }
        if (seen as usize) < n && seen_at.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let now = progress(store, after).await?;
        if (now.0 + now.1) as usize >= n {
            return Ok(now);
        }
        if now != last {
            last = now;
            moved = Instant::now();
        } else if moved.elapsed() > STALL_LIMIT {
            bail!(
                "stalled: {} sent, {} failed of {n} after {STALL_LIMIT:?} without progress",
                now.0,
                now.1
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `sent_at` of every sent row past id `after`.
pub(crate) async fn sent_times(store: &Store, after: i64) -> Result<Vec<(i64, NaiveDateTime)>> {
    let stmt = Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!(
            "SELECT id, sent_at FROM {} WHERE status = 'sent' AND id > $1",
            store.table()
        ),
        [after.into()],
    );
    let rows = store.connection().query_all_raw(stmt).await?;
    rows.iter()
        .map(|r| Ok((r.try_get("", "id")?, r.try_get("", "sent_at")?)))
        .collect()
}

/// Bytes of WAL the server has written so far (all databases: a
/// scenario's figure includes the bench's echo queue).
pub(crate) async fn wal_bytes(store: &Store) -> Result<i64> {
    let stmt = Statement::from_string(
        DbBackend::Postgres,
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS b".to_owned(),
    );
    let row = store
        .connection()
        .query_one_raw(stmt)
        .await?
        .ok_or_else(|| anyhow!("no WAL position"))?;
    Ok(row.try_get("", "b")?)
}

/// Transactions this database has committed or rolled back so far (the
/// sidecar's statements, the echo queue's and the bench's own reads: each
/// autocommitted statement is one). PostgreSQL flushes these counters
/// within a second, so a figure over a run of several seconds is close.
pub(crate) async fn transactions(store: &Store) -> Result<i64> {
    let stmt = Statement::from_string(
        DbBackend::Postgres,
        "SELECT (xact_commit + xact_rollback)::bigint AS n FROM pg_stat_database \
         WHERE datname = current_database()"
            .to_owned(),
    );
    let row = store
        .connection()
        .query_one_raw(stmt)
        .await?
        .ok_or_else(|| anyhow!("no pg_stat_database row"))?;
    Ok(row.try_get("", "n")?)
}

/// The highest id in the table (0 when it is empty): a scenario on a table
/// with history inserts and reads only the rows past it.
pub(crate) async fn max_id(store: &Store) -> Result<i64> {
    let stmt = Statement::from_string(
        DbBackend::Postgres,
        format!(
            "SELECT coalesce(max(id), 0)::bigint AS m FROM {}",
            store.table()
        ),
    );
    let row = store
        .connection()
        .query_one_raw(stmt)
        .await?
        .ok_or_else(|| anyhow!("no max(id) row"))?;
    Ok(row.try_get("", "m")?)
}

/// Buffers the database's backends have touched so far: shared blocks found
/// in PostgreSQL's cache plus those read into it (`pg_stat_database`, read
/// from the admin connection, which is on another database). A count of
/// work that does not depend on the machine's load. Backends report it at
/// the end of a transaction at most once a second, and an idle one after
/// 10 s: a window over steady work is right to within a second at each
/// end, and a backend that exits reports everything.
pub(crate) async fn db_buffers(admin: &DatabaseConnection, db: &str) -> Result<i64> {
    let stmt = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT (blks_hit + blks_read)::bigint AS b FROM pg_stat_database WHERE datname = $1",
        [db.into()],
    );
    let row = admin
        .query_one_raw(stmt)
        .await?
        .ok_or_else(|| anyhow!("no pg_stat_database row for {db}"))?;
    Ok(row.try_get("", "b")?)
}

/// Connections open to the database now.
pub(crate) async fn db_backends(admin: &DatabaseConnection, db: &str) -> Result<i64> {
    let stmt = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT count(*)::bigint AS n FROM pg_stat_activity WHERE datname = $1",
        [db.into()],
    );
    let row = admin
        .query_one_raw(stmt)
        .await?
        .ok_or_else(|| anyhow!("no pg_stat_activity count"))?;
    Ok(row.try_get("", "n")?)
}

/// Waits until no connection to the database is left (each backend has
/// exited and so reported its figures); fails after 30 s.
pub(crate) async fn wait_no_backends(admin: &DatabaseConnection, db: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = db_backends(admin, db).await?;
        if n == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{n} connections to {db} still open after 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
