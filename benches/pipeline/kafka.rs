//! The mock cluster, its producer, and the change events the bench publishes.

use super::*;

pub(crate) struct Broker {
    // Field order is drop order: producer before its cluster.
    pub(crate) producer: ThreadedProducer<DefaultProducerContext>,
    pub(crate) _cluster: MockCluster<'static, DefaultProducerContext>,
    pub(crate) brokers: String,
    pub(crate) topic: String,
}

impl Broker {
    pub(crate) fn start(topic: &str) -> Result<Broker> {
        Broker::with_partitions(topic, PARTITIONS)
    }

    /// A mock cluster whose `topic` has `partitions` partitions.
    pub(crate) fn with_partitions(topic: &str, partitions: i32) -> Result<Broker> {
        let cluster = MockCluster::new(1).context("starting the mock cluster")?;
        cluster.create_topic(topic, partitions, 1)?;
        let brokers = cluster.bootstrap_servers();
        let producer = Broker::producer(&brokers)?;
        Ok(Broker {
            producer,
            _cluster: cluster,
            brokers,
            topic: topic.to_owned(),
        })
    }

    /// The bench's producer settings (the echo task makes one of its own).
    pub(crate) fn producer(brokers: &str) -> Result<ThreadedProducer<DefaultProducerContext>> {
        ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("linger.ms", "5")
            // The mock broker keeps only 5 MiB per partition (older batches
            // are dropped): compressed batches keep a 50,000-event backlog.
            .set("compression.type", "lz4")
            .set("queue.buffering.max.messages", "1000000")
            .set("queue.buffering.max.kbytes", "1048576")
            .set("batch.num.messages", "10000")
            .create()
            .context("creating a producer")
    }

    /// Hands one record to the producer, waiting while its queue is full.
    pub(crate) fn send(&self, key: &str, value: &str) -> Result<()> {
        send(&self.producer, &self.topic, key, value)
    }

    pub(crate) fn flush(&self) -> Result<()> {
        self.producer
            .flush(Duration::from_secs(60))
            .context("flushing the producer")
    }

    pub(crate) fn consumer(
        &self,
        group: &str,
        common: &[(String, String)],
        extra: &[(&str, &str)],
    ) -> Result<StreamConsumer> {
        consumer(&self.brokers, &self.topic, group, common, extra)
    }
}

/// A consumer of `topic` with the sidecar's librdkafka configuration and
/// `common` and `extra` properties on top.
pub(crate) fn consumer(
    brokers: &str,
    topic: &str,
    group: &str,
    common: &[(String, String)],
    extra: &[(&str, &str)],
) -> Result<StreamConsumer> {
    let settings = KafkaSettings {
        brokers: brokers.to_owned(),
        topic: topic.to_owned(),
        group_id: group.to_owned(),
        dead_letter_topic: None,
        properties: common
            .iter()
            .cloned()
            .chain(
                extra
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
            )
            .collect(),
    };
    let consumer: StreamConsumer = outbox_sidecar::consumer::client_config(&settings)
        .create()
        .context("creating a consumer")?;
    consumer.subscribe(&[topic])?;
    Ok(consumer)
}

/// Hands one record to `producer`, waiting while its queue is full.
pub(crate) fn send(
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    key: &str,
    value: &str,
) -> Result<()> {
    let mut record = BaseRecord::to(topic).key(key).payload(value);
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

/// How many aggregates an ordered scenario spreads its rows over.
pub(crate) const AGGREGATES: i64 = 1_000;

/// How many aggregates the scenario under way spreads its rows over
/// ([`AGGREGATES`], or 1 for the one-hot-aggregate case).
pub(crate) static AGGREGATE_COUNT: std::sync::atomic::AtomicI64 =
    std::sync::atomic::AtomicI64::new(AGGREGATES);

/// Whether change events are keyed by the row's aggregate (an ordered
/// scenario) rather than its id.
pub(crate) static ORDERED_KEYS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// A change event's key: `{"id": N}`, or the aggregate the ordered
/// connector keys by (`message.key.columns`).
pub(crate) fn key_of(id: i64) -> String {
    if ORDERED_KEYS.load(std::sync::atomic::Ordering::Relaxed) {
        let aggregates = AGGREGATE_COUNT.load(std::sync::atomic::Ordering::Relaxed);
        json!({"aggregate_key": format!("agg-{}", id % aggregates)}).to_string()
    } else {
        json!({"id": id}).to_string()
    }
}

/// The change event Debezium's PostgreSQL connector writes for an insert
/// (JsonConverter without schemas): key and value.
pub(crate) fn change_event(row: &SourceRow, table: &str, seq: usize) -> (String, String) {
    let micros = |t: NaiveDateTime| t.and_utc().timestamp_micros();
    let now = chrono::Utc::now().timestamp_millis();
    let value = json!({
        "before": null,
        "after": {
            "id": row.id,
            "event_name": row.event_name,
            "payload": row.payload,
            "status": "pending",
            "attempts": 0,
            "last_error": null,
            "sent_at": null,
            "created_at": micros(row.created_at),
            "updated_at": micros(row.updated_at),
        },
        "source": {"version": "2.7.3.Final", "connector": "postgresql", "name": "bench",
                   "ts_ms": now, "snapshot": "false", "db": "bench", "sequence": null,
                   "schema": "public", "table": table, "txId": 1000 + seq, "lsn": 40_000_000 + seq * 64,
                   "xmin": null},
        "op": "c",
        "ts_ms": now,
        "transaction": null,
    });
    (key_of(row.id), value.to_string())
}

/// Publishes every row of the table past id `after` as fast as the
/// producer takes them; returns the publish time of each id (µs since the
/// epoch, UTC).
pub(crate) async fn publish_all(
    store: &Store,
    broker: &Broker,
    after: i64,
) -> Result<HashMap<i64, i64>> {
    let mut times = HashMap::new();
    let mut after = after;
    loop {
        let rows = load_rows(store, after, 5_000).await?;
        let Some(last) = rows.last() else { break };
        after = last.id;
        for row in &rows {
            let (key, value) = change_event(row, store.table(), times.len());
            times.insert(row.id, chrono::Utc::now().timestamp_micros());
            broker.send(&key, &value)?;
        }
    }
    broker.flush()?;
    Ok(times)
}

/// Publishes every row of the table in id order as the sidecar consumes:
/// waits while more than `window` events are published and not yet
/// `posted()`. Returns the publish time of each id. Fails when nothing is
/// posted for [`STALL_LIMIT`].
pub(crate) async fn publish_streamed(
    store: &Store,
    broker: &Broker,
    after: i64,
    posted: impl Fn() -> u64,
    window: usize,
) -> Result<HashMap<i64, i64>> {
    let mut times = HashMap::new();
    let mut after = after;
    loop {
        let rows = load_rows(store, after, 5_000).await?;
        let Some(last) = rows.last() else { break };
        after = last.id;
        for row in &rows {
            let mut seen = (posted(), Instant::now());
            while times.len() as u64 >= seen.0 + window as u64 {
                tokio::time::sleep(Duration::from_millis(2)).await;
                let now = posted();
                if now != seen.0 {
                    seen = (now, Instant::now());
                } else if seen.1.elapsed() > STALL_LIMIT {
                    bail!(
                        "stalled: {} of {} published events posted after {STALL_LIMIT:?} without progress",
                        now,
                        times.len()
                    );
                }
            }
            let (key, value) = change_event(row, store.table(), times.len());
            times.insert(row.id, chrono::Utc::now().timestamp_micros());
            broker.send(&key, &value)?;
        }
    }
    broker.flush()?;
    Ok(times)
}

/// Publishes `rows`, read from the table beforehand, as fast as the
/// producer takes them: no database read while they go out.
pub(crate) fn publish_rows(rows: &[SourceRow], table: &str, broker: &Broker) -> Result<()> {
    for (i, row) in rows.iter().enumerate() {
        let (key, value) = change_event(row, table, i);
        broker.send(&key, &value)?;
    }
    broker.flush()
}

/// Publishes `rows` at `rate` events/s (the first at once).
pub(crate) fn publish_paced(
    rows: &[SourceRow],
    table: &str,
    broker: &Broker,
    rate: f64,
) -> Result<HashMap<i64, i64>> {
    let mut times = HashMap::new();
    let start = Instant::now();
    for (i, row) in rows.iter().enumerate() {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let (key, value) = change_event(row, table, i);
        times.insert(row.id, chrono::Utc::now().timestamp_micros());
        broker.send(&key, &value)?;
    }
    broker.flush()?;
    Ok(times)
}
