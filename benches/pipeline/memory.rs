//! `--memory` (`make bench-memory`, issue 16 item 9): a backlog of N
//! (default 5,000) pending rows whose payloads are K KiB (default 200) of
//! JSON, drained by `outbox-sidecar run` with the shipped settings
//! (`max_in_flight` 64, `dispatch.max_buffered_bytes` at its default); the
//! sidecar's peak RSS (`VmHWM`) is compared with the memory limit of the
//! `outbox-sidecar` container in `deploy/kubernetes/deployment.yaml`. Its
//! change events carry no `payload` (as Debezium with `column.exclude.list`
//! sends them; the sidecar reads the payload from the row): a
//! megabyte-sized topic would not fit the mock broker's 5 MiB per partition.

use super::*;

/// The memory limit of the `outbox-sidecar` container the deployment
/// ships, in bytes, and the text it is written as.
fn shipped_memory_limit() -> Result<(u64, String)> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/kubernetes/deployment.yaml"
    );
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).context("deployment.yaml")?;
    let spec = &doc["spec"]["template"]["spec"];
    let containers = [&spec["initContainers"], &spec["containers"]];
    let sidecar = containers
        .iter()
        .filter_map(|c| c.as_sequence())
        .flatten()
        .find(|c| c["name"].as_str() == Some("outbox-sidecar"))
        .ok_or_else(|| anyhow!("no outbox-sidecar container in {path}"))?;
    let limit = sidecar["resources"]["limits"]["memory"]
        .as_str()
        .ok_or_else(|| anyhow!("the outbox-sidecar container has no memory limit"))?;
    let (digits, unit) = limit.split_at(
        limit
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(limit.len()),
    );
    let n: u64 = digits
        .parse()
        .with_context(|| format!("memory limit {limit:?}"))?;
    let factor = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        other => bail!("memory limit {limit:?}: unit {other:?}"),
    };
    Ok((n * factor, limit.to_owned()))
}

/// `n` pending rows whose payloads are `kib` KiB of JSON each (a 32-hex
/// string repeated, plus a few fields).
async fn insert_big_rows(store: &Store, n: usize, kib: usize) -> Result<()> {
    let repeats = kib * 1024 / 32;
    let sql = format!(
        r#"INSERT INTO {t} (event_name, payload, status, attempts, created_at, updated_at)
SELECT '{e}', jsonb_build_object('event_type', 'purchase_create', 'n', g,
           'blob', repeat(md5(g::text), {repeats})),
       'pending', 0, now() AT TIME ZONE 'utc', now() AT TIME ZONE 'utc'
FROM generate_series(1, {n}) AS g ORDER BY g"#,
        t = store.table(),
        e = EVENT_NAMES[0],
    );
    let res = store
        .connection()
        .execute_unprepared(&sql)
        .await
        .context("inserting rows")?;
    if res.rows_affected() != n as u64 {
        bail!("inserted {} rows, wanted {n}", res.rows_affected());
    }
    Ok(())
}

/// Publishes an insert event for every row, without the payload column
/// (Debezium's `column.exclude.list`): the rows are read without theirs.
async fn publish_without_payload(store: &Store, broker: &Broker) -> Result<()> {
    let stmt = Statement::from_string(
        DbBackend::Postgres,
        format!(
            "SELECT id, event_name, '' AS payload, created_at, updated_at FROM {} ORDER BY id",
            store.table()
        ),
    );
    let rows = store.connection().query_all_raw(stmt).await?;
    for (seq, r) in rows.iter().enumerate() {
        let row = SourceRow {
            id: r.try_get("", "id")?,
            event_name: r.try_get("", "event_name")?,
            payload: String::new(),
            created_at: r.try_get("", "created_at")?,
            updated_at: r.try_get("", "updated_at")?,
        };
        let (key, value) = change_event(&row, store.table(), seq);
        let mut value: serde_json::Value = serde_json::from_str(&value)?;
        if let Some(after) = value["after"].as_object_mut() {
            after.remove("payload");
        }
        broker.send(&key, &value.to_string())?;
    }
    broker.flush()
}

/// `--memory`: the sidecar's peak RSS draining a backlog of large
/// payloads, against the shipped memory limit.
pub(crate) async fn memory(env: &Env, kib: usize) -> Result<()> {
    let n = env.opts.events;
    let (limit, limit_text) = shipped_memory_limit()?;
    eprintln!(
        "memory bench: {n} events of {kib} KiB payloads (load {})",
        loadavg_line()
    );
    env.with_db(|url| async move {
        let store = open_store(&url, TABLE, 2).await?;
        insert_big_rows(&store, n, kib).await?;
        let broker = Broker::start("outbox.public.outbox_events")?;
        publish_without_payload(&store, &broker).await?;
        let receiver = &env.receivers.no_content;
        let (requests0, bytes0) = (
            receiver.state.requests.load(Ordering::Relaxed),
            receiver.state.body_bytes.load(Ordering::Relaxed),
        );
        let answered0 = receiver.state.answered();
        let answered = || receiver.state.answered() - answered0;
        let mut sidecar = Sidecar::start(env, &url, &broker, true, receiver, "")?;
        let run = async {
            sidecar.wait_ready().await?;
            let ready = Instant::now();
            let done = wait_all_done(&store, 0, n, answered).await?;
            Ok::<_, anyhow::Error>((done, ready.elapsed()))
        }
        .await;
        let peak = sidecar.peak_rss();
        sidecar.stop().await?;
        let ((sent, failed), drain) = run?;
        let requests = receiver.state.requests.load(Ordering::Relaxed) - requests0;
        let bytes = receiver.state.body_bytes.load(Ordering::Relaxed) - bytes0;
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        let ratio = peak as f64 / limit as f64;
        println!(
            "memory bench: {n} events, payloads of {kib} KiB, change events without the payload, \
             max_in_flight {}, dispatch.max_buffered_bytes at its default",
            env.opts.max_in_flight
        );
        println!(
            "drained in {:.1} s after /readyz: {sent} sent, {failed} failed, {requests} requests, \
             {:.0} MiB of bodies (mean {:.1} KiB)",
            drain.as_secs_f64(),
            mib(bytes),
            bytes as f64 / requests.max(1) as f64 / 1024.0
        );
        println!(
            "peak RSS (VmHWM) of the sidecar: {:.1} MiB; shipped memory limit \
             (deploy/kubernetes/deployment.yaml, outbox-sidecar): {limit_text}; ratio {ratio:.2}",
            mib(peak)
        );
        println!(
            "{} peak RSS within the shipped memory limit",
            if peak < limit { "PASS" } else { "MISS" }
        );
        Ok(())
    })
    .await
}
