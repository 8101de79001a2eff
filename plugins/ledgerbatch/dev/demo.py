"""`ledgerbatch demo`: the platform on the embedded defaults.

A real Apache Kafka on loopback (dev/kafka.py, child processes) and a dev schema registry in this process, a fresh `ledgerbatch_demo` database on the
configured PostgreSQL server, known JSON orders and Avro payments (whose schema evolves mid-topic)
with bad records in them; then either Airflow (standalone, the demo DAGs triggered until caught up,
the UI left running) or, with --no-airflow, `run` to the end. Both finish with a report from SQL
that checks every record arrived exactly once.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace

from sqlalchemy import text
from sqlalchemy.engine import Engine

from ledgerbatch.config import Settings, safe_url
from ledgerbatch.dev.demodata import produce_orders, produce_payments
from ledgerbatch.dev.kafka import LocalKafka
from ledgerbatch.dev.registry import DevRegistry
from ledgerbatch.ledger.engine import fresh_database, make_engine
from ledgerbatch.ledger.inspection import run_report
from ledgerbatch.ledger.migrations import migrate
from ledgerbatch.ledger.quarantine import quarantined_count
from ledgerbatch.spec.resolve import load_pipeline
from ledgerbatch.sqlfiles import query

DEMO_DB = "ledgerbatch_demo"
PIPELINES = ("orders", "payments")  # pipelines/<name>.yaml, each reading the topic of its name
REPORT = {"quarantine by reason": "report_quarantine_by_reason", "batches": "report_batches",
          "cursors": "report_cursors"}  # named queries in sql/queries/ledger_status.sql


@dataclass
class DemoSetup:
    db_url: str
    engine: Engine
    broker: LocalKafka
    registry: DevRegistry
    expected: dict[str, tuple[int, int]]  # pipeline -> (valid records, bad records)
    records: int  # orders produced so far (their ids are 0..records-1)
    partitions: int

    def produce_more_orders(self, count: int) -> None:
        """`count` more valid orders, with ids after the last ones."""
        produce_orders(self.broker.bootstrap_servers, "orders", count, self.partitions, start=self.records)
        self.records += count
        self.expected["orders"] = (self.expected["orders"][0] + count, self.expected["orders"][1])

    def close(self) -> None:
        self.broker.close()
        self.registry.stop()


def prepare(settings: Settings, records: int, partitions: int) -> DemoSetup:
    db_url = fresh_database(settings.db_url, DEMO_DB)
    print(f"demo database: {safe_url(db_url)} (dropped and created fresh)")
    engine = make_engine(db_url)
    migrate(engine)
    broker = LocalKafka(1).start()
    registry = DevRegistry()
    for topic in PIPELINES:
        broker.create_topic(topic, partitions)
    print(f"Apache Kafka 2.3: {broker.bootstrap_servers} (logs in {broker.dir}), topics {', '.join(PIPELINES)} "
          f"with {partitions} partitions each")
    print(f"dev schema registry: {registry.url} (in-memory, the REST subset confluent-kafka's client uses)")
    orders = produce_orders(broker.bootstrap_servers, "orders", records, partitions, bad_every=1000)
    print(f"produced {records} JSON orders: {orders['good']} valid, {orders['bad']} bad records")
    count = max(records // 10, 100)
    payments = produce_payments(broker.bootstrap_servers, registry.url, "payments", count, partitions, bad_every=500)
    print(f"produced {count} Avro payments (schema v1, then v2 with a new field): {payments['good']} valid, "
          f"{payments['bad']} bad records")
    return DemoSetup(db_url, engine, broker, registry, {"orders": (orders["good"], orders["bad"]),
                                                       "payments": (payments["good"], payments["bad"])},
                     records, partitions)


def report(setup: DemoSetup) -> bool:
    ok = True
    with setup.engine.connect() as conn:
        reports = [(f"{name} target rows", *_target_rows(conn, name)) for name in PIPELINES]
        reports += [(title, *run_report(conn, name)) for title, name in REPORT.items()]
        for title, sql, result in reports:
            print(f"-- {title}: {sql}")
            print("   " + " | ".join(result.keys()))
            for row in result:
                print("   " + " | ".join(str(v) for v in row))
            print()
        for name in PIPELINES:
            got = (_target_rows(conn, name)[1].one().rows, quarantined_count(conn, name))
            good = got == setup.expected[name]
            ok &= good
            print(f"OK: {name}: every valid record delivered once, every bad record quarantined once." if good else
                  f"MISMATCH: {name}: {got[0]} rows and {got[1]} quarantined, expected {setup.expected[name][0]} "
                  f"and {setup.expected[name][1]}.")
    print(f"Inspect the ledger: psql -h 127.0.0.1 -U postgres -d {DEMO_DB} -c 'SELECT * FROM ledger.recent_batches'")
    return ok


def _target_rows(conn, pipeline: str) -> tuple[str, object]:
    sql = query("count_rows", schema="public", table=pipeline)
    return sql, conn.execute(text(sql))


def run_without_airflow(settings: Settings, records: int, partitions: int) -> None:
    from ledgerbatch.ops.run import run_pipeline
    from ledgerbatch.spark.session import get_spark

    setup = prepare(settings, records, partitions)
    settings = replace(settings, schema_registry={"url": setup.registry.url})
    spark = functools.cache(lambda: get_spark(settings.spark_master, "ledgerbatch-demo"))  # one for both
    try:
        for name in PIPELINES:
            started = time.monotonic()
            summary = run_pipeline(setup.engine, load_pipeline(settings, name), setup.db_url, setup.broker.bootstrap_servers, spark)
            print(f"\nledgerbatch run {name}: {summary.batches} batches, {summary.records_read} records read, "
                  f"{summary.rows_written} rows written, {summary.rows_quarantined} quarantined "
                  f"in {time.monotonic() - started:.1f}s")
        print()
        ok = report(setup)
    finally:
        setup.close()
    if not ok:
        raise SystemExit(1)
