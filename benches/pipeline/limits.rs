//! The limits of the pipeline's parts, measured in the same run.

use super::*;
use outbox_sidecar::transition;

/// A client built like `dispatch::Dispatcher`'s.
pub(crate) fn http_client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(DISPATCH_TIMEOUT)
        .build()
        .context("HTTP client")
}

pub(crate) fn sample_payload() -> serde_json::Value {
    json!({"event_type": "accounts.purchase_create", "data": {
        "purchase_id": 900001, "account_id": 1, "amount_cents": 129900, "currency": "BRL",
        "installments": 6, "due_date": "2025-07-10", "items": [
            {"sku": "SKU-0001", "qty": 1, "price_cents": 4330},
            {"sku": "SKU-0002", "qty": 2, "price_cents": 4331},
            {"sku": "SKU-0003", "qty": 3, "price_cents": 4332}]}})
}

/// One POST as the dispatcher makes it; true on 2xx.
pub(crate) async fn post(
    client: &reqwest::Client,
    url: &str,
    id: i64,
    event_name: &str,
    payload: &impl serde::Serialize,
) -> Result<bool> {
    let body = serde_json::to_vec(payload)?;
    let resp = client
        .post(url)
        .header("content-type", "application/json")
        .header("authorization", "Bearer bench-token")
        .header("idempotency-key", id.to_string())
        .header("outbox-event-name", event_name)
        .header("outbox-attempt", "1")
        .body(body)
        .send()
        .await?;
    let ok = resp.status().is_success();
    // Read the body to its end, as the dispatcher does, so the connection
    // goes back to the pool.
    std::hint::black_box(resp.bytes().await?);
    Ok(ok)
}

/// Requests/s against the receiver, `in_flight` concurrent, and the CPU
/// seconds of this process over the timed span.
pub(crate) async fn raw_http(
    url: &str,
    n: usize,
    in_flight: usize,
    ticks_per_s: f64,
) -> Result<(f64, f64)> {
    let client = http_client()?;
    let payload = Arc::new(sample_payload());
    // Warm the connection pool so the figure is the steady state.
    let warm: Vec<_> = (0..in_flight)
        .map(|i| {
            let (client, url, payload) = (client.clone(), url.to_owned(), payload.clone());
            tokio::spawn(
                async move { post(&client, &url, i as i64, EVENT_NAMES[0], &payload).await },
            )
        })
        .collect();
    for w in warm {
        w.await??;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let cpu0 = self_cpu_ticks();
    let workers: Vec<_> = (0..in_flight)
        .map(|_| {
            let (client, url, payload, next) = (
                client.clone(),
                url.to_owned(),
                payload.clone(),
                next.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok::<_, anyhow::Error>(());
                    }
                    if !post(&client, &url, i as i64, EVENT_NAMES[i % 3], &payload).await? {
                        bail!("the receiver refused a request");
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await??;
    }
    let cpu_s = self_cpu_ticks().saturating_sub(cpu0) as f64 / ticks_per_s;
    Ok((n as f64 / started.elapsed().as_secs_f64(), cpu_s))
}

/// Rows/s of `Store::mark_sent`, `in_flight` callers on the store's pool.
pub(crate) async fn single_row_updates(store: &Store, in_flight: usize) -> Result<f64> {
    let ids = all_ids(store).await?;
    let mut rows: Vec<OutboxEventRow> = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(1_000) {
        rows.extend(store.get_many(chunk).await?);
    }
    let n = rows.len();
    let rows = Arc::new(rows);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..in_flight)
        .map(|_| {
            let (store, rows, next) = (store.clone(), rows.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(row) = rows.get(i) else {
                        return Ok::<_, anyhow::Error>(());
                    };
                    let sent = transition::after_success(row, outbox_sidecar::store::now());
                    match store.mark_sent(row, &sent).await? {
                        Outcome::Applied(_) => {}
                        other => bail!("mark_sent did not apply: {other:?}"),
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Rows/s of `UPDATE … WHERE id = ANY($1) AND status = 'pending'`,
/// [`BATCH_IDS`] ids per statement, one statement per pool connection.
/// Also the CPU seconds of this process over the span, and the rows.
pub(crate) async fn batched_updates(store: &Store, ticks_per_s: f64) -> Result<(f64, f64, usize)> {
    let ids = all_ids(store).await?;
    let batches: Arc<Vec<String>> = Arc::new(
        ids.chunks(BATCH_IDS)
            .map(|c| {
                let list: Vec<String> = c.iter().map(i64::to_string).collect();
                format!("{{{}}}", list.join(","))
            })
            .collect(),
    );
    let sql = Arc::new(format!(
        "UPDATE {} SET status = 'sent', sent_at = $2, updated_at = $2 \
         WHERE id = ANY($1::bigint[]) AND status = 'pending'",
        store.table()
    ));
    let next = Arc::new(AtomicUsize::new(0));
    let applied = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let cpu0 = self_cpu_ticks();
    let workers: Vec<_> = (0..POOL)
        .map(|_| {
            let (store, batches, sql, next, applied) = (
                store.clone(),
                batches.clone(),
                sql.clone(),
                next.clone(),
                applied.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(list) = batches.get(i) else {
                        return Ok::<_, anyhow::Error>(());
                    };
                    let stmt = Statement::from_sql_and_values(
                        DbBackend::Postgres,
                        sql.as_str(),
                        [list.clone().into(), outbox_sidecar::store::now().into()],
                    );
                    let res = store.connection().execute_raw(stmt).await?;
                    applied.fetch_add(res.rows_affected(), Ordering::Relaxed);
                }
            })
        })
        .collect();
    for w in workers {
        w.await??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_s = self_cpu_ticks().saturating_sub(cpu0) as f64 / ticks_per_s;
    let applied = applied.load(Ordering::Relaxed);
    if applied != ids.len() as u64 {
        bail!("batched UPDATE applied {applied} of {} rows", ids.len());
    }
    Ok((ids.len() as f64 / elapsed, cpu_s, ids.len()))
}

/// One event at a time, the shape of a job per event: decode, read the
/// row, POST, UPDATE, commit the offset synchronously. Events/s from the
/// first message.
pub(crate) async fn naive_loop(env: &Env, store: &Store, broker: &Broker, n: usize) -> Result<f64> {
    let consumer = broker.consumer(
        "bench-naive",
        &env.opts.kafka_properties,
        &[("enable.auto.commit", "false")],
    )?;
    let client = http_client()?;
    let decoder = Decoder::new(store.table());
    let mut first = None;
    for _ in 0..n {
        let msg = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
            .await
            .context("naive loop: no message")??;
        first.get_or_insert_with(Instant::now);
        let record = Record {
            topic: msg.topic(),
            partition: msg.partition(),
            offset: msg.offset(),
            key: msg.key(),
            value: msg.payload(),
        };
        if let Decision::Trigger(t) = decoder.decode(&record) {
            if let Some(row) = store.get(t.id).await? {
                if row.status == Status::Pending
                    && post(
                        &client,
                        &env.receivers.created.url,
                        row.id,
                        &row.event_name,
                        &row.payload,
                    )
                    .await?
                {
                    let sent = transition::after_success(&row, outbox_sidecar::store::now());
                    store.mark_sent(&row, &sent).await?;
                }
            }
        } else {
            bail!("naive loop: not a trigger");
        }
        consumer.commit_message(&msg, CommitMode::Sync)?;
    }
    let (sent, _) = progress(store, 0).await?;
    if sent as usize != n {
        bail!("naive loop: {sent} rows sent, wanted {n}");
    }
    let elapsed = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
    Ok(n as f64 / elapsed.max(1e-9))
}

pub(crate) const MIB: f64 = 1024.0 * 1024.0;

pub(crate) const RAW_CONSUME: &str = "raw consume (StreamConsumer, no processing)";
pub(crate) const CPU_CONSUME: &str = "client CPU / message (raw consume, child process)";
pub(crate) const CPU_HTTP: &str = "client CPU / request (raw HTTP at max_in_flight, child process)";
pub(crate) const CPU_BATCHED: &str = "client CPU / row (batched UPDATE, child process)";

/// The raw HTTP limit's name: against the receiver S1 posts to.
pub(crate) fn raw_http_name(in_flight: usize) -> String {
    if in_flight == 64 {
        RAW_HTTP_64.to_owned()
    } else {
        format!("raw HTTP, {in_flight} in flight")
    }
}

/// The parts the sidecar is compared with, each in a child process of its
/// own: raw consume, raw HTTP (64 and `max_in_flight` in flight) and the
/// batched UPDATE, with their client CPU per message, request and row.
pub(crate) async fn parts(env: &Env, sheet: &mut Sheet, run: usize) -> Result<()> {
    let o = &env.opts;
    env.with_db(|url| async move {
        let step = |what: &str| eprintln!("[run {run}] {what} (load {})", loadavg_line());

        step("limits: inserting and publishing");
        let consume = open_store(&url, "lim_consume", 2).await?;
        insert_rows(&consume, o.events, 0).await?;
        let broker = Broker::start("outbox.public.lim_consume")?;
        publish_all(&consume, &broker, 0).await?;
        consume.connection().clone().close().await.ok();
        step("limit: raw consume (child process)");
        let l = load1();
        let r = run_part(&Part::Consume {
            brokers: broker.brokers.clone(),
            topic: broker.topic.clone(),
            n: o.events,
            properties: o.kafka_properties.clone(),
        })
        .await?;
        sheet.add(RAW_CONSUME, Unit::Rate, r.rate, l);
        sheet.add(CPU_CONSUME, Unit::Micros, r.cpu_us_each(), l);
        drop(broker);

        let n_http = o.events;
        let http_url = &env.receivers.created.url;
        let mut in_flights = vec![64];
        if o.max_in_flight != 64 {
            in_flights.push(o.max_in_flight);
        }
        for in_flight in in_flights {
            step(&format!(
                "limit: raw HTTP, {in_flight} in flight (child process)"
            ));
            let l = load1();
            let r = run_part(&Part::Http {
                url: http_url.clone(),
                n: n_http,
                in_flight,
            })
            .await?;
            sheet.add(&raw_http_name(in_flight), Unit::Rate, r.rate, l);
            if in_flight == o.max_in_flight {
                sheet.add(CPU_HTTP, Unit::Micros, r.cpu_us_each(), l);
            }
        }

        step("limit: batched UPDATE (child process)");
        let batch = open_store(&url, "lim_batch", POOL).await?;
        insert_rows(&batch, o.events, 0).await?;
        let l = load1();
        let r = run_part(&Part::Batched {
            db_url: url.clone(),
            table: "lim_batch".to_owned(),
        })
        .await?;
        sheet.add(&batched_name(), Unit::Rate, r.rate, l);
        sheet.add(CPU_BATCHED, Unit::Micros, r.cpu_us_each(), l);
        batch.connection().clone().close().await.ok();
        Ok(())
    })
    .await
}

pub(crate) fn batched_name() -> String {
    format!("batched UPDATE ({BATCH_IDS} ids/stmt, {POOL} in parallel)")
}

pub(crate) fn single_row_name(opts: &Options) -> String {
    format!(
        "single-row UPDATE (mark_sent, {} callers, pool {POOL})",
        opts.max_in_flight
    )
}

pub(crate) fn naive_name(opts: &Options) -> String {
    format!(
        "naive loop, one event at a time ({} events)",
        opts.naive_events
    )
}

/// The naive loop's limit (`--naive-events`).
pub(crate) async fn naive(env: &Env, sheet: &mut Sheet, run: usize) -> Result<()> {
    let o = &env.opts;
    env.with_db(|url| async move {
        eprintln!("[run {run}] naive loop (load {})", loadavg_line());
        let naive = open_store(&url, TABLE, POOL).await?;
        insert_rows(&naive, o.naive_events, 0).await?;
        let broker = Broker::start("outbox.public.outbox_events")?;
        publish_all(&naive, &broker, 0).await?;
        let l = load1();
        let r = naive_loop(env, &naive, &broker, o.naive_events).await?;
        sheet.add(&naive_name(o), Unit::Rate, r, l);
        drop(broker);
        naive.connection().clone().close().await.ok();
        Ok(())
    })
    .await
}

/// The single-row UPDATE's limit (`Store::mark_sent`, `--limit-events`).
pub(crate) async fn single_row(env: &Env, sheet: &mut Sheet, run: usize) -> Result<()> {
    let o = &env.opts;
    env.with_db(|url| async move {
        eprintln!(
            "[run {run}] limit: single-row UPDATE (Store::mark_sent) (load {})",
            loadavg_line()
        );
        let single = open_store(&url, "lim_single", POOL).await?;
        insert_rows(&single, o.limit_events, 0).await?;
        let l = load1();
        let r = single_row_updates(&single, o.max_in_flight).await?;
        sheet.add(&single_row_name(o), Unit::Rate, r, l);
        single.connection().clone().close().await.ok();
        Ok(())
    })
    .await
}
