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
[log]
level = "error"
"#,
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
    let sql = format!(
        r#"INSERT INTO {t} (event_name, payload, status, attempts, created_at, updated_at)
SELECT e,
       jsonb_build_object('event_type', e, 'data', jsonb_build_object(
           'purchase_id', 900000 + g, 'account_id', g % 977, 'amount_cents', 129900,
           'currency', 'BRL', 'installments', 6, 'due_date', '2025-07-10',
           'items', jsonb_build_array(
               jsonb_build_object('sku', 'SKU-0001', 'qty', 1, 'price_cents', 4330),
               jsonb_build_object('sku', 'SKU-0002', 'qty', 2, 'price_cents', 4331),
               jsonb_build_object('sku', 'SKU-0003', 'qty', 3, 'price_cents', 4332)){pad})),
       'pending', 0, now() AT TIME ZONE 'utc', now() AT TIME ZONE 'utc'
FROM (SELECT g, (ARRAY['{a}', '{b}', '{c}'])[1 + g % 3] AS e
      FROM generate_series(1, {n}) AS g) AS s
ORDER BY g"#,
        t = store.table(),
        a = EVENT_NAMES[0],
        b = EVENT_NAMES[1],
        c = EVENT_NAMES[2],
    );
    let res = store
        .connection()
        .execute_unprepared(&sql)
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

/// (sent, failed) row counts.
pub(crate) async fn progress(store: &Store) -> Result<(i64, i64)> {
    let stmt = Statement::from_string(
        DbBackend::Postgres,
        format!(
            "SELECT count(*) FILTER (WHERE status = 'sent') AS sent, \
                    count(*) FILTER (WHERE status = 'failed') AS failed FROM {}",
            store.table()
        ),
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
        let now = progress(store).await?;
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

/// `sent_at` of every sent row.
pub(crate) async fn sent_times(store: &Store) -> Result<Vec<(i64, NaiveDateTime)>> {
    let stmt = Statement::from_string(
        DbBackend::Postgres,
        format!(
            "SELECT id, sent_at FROM {} WHERE status = 'sent'",
            store.table()
        ),
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
