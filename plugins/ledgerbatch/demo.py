"""`ledgerbatch demo`: the platform on the embedded defaults.

A dev broker in this process, a fresh `ledgerbatch_demo` database on the configured PostgreSQL
server and known orders with bad records in them; then either Airflow (standalone, the demo DAG
triggered until caught up, the UI left running) or, with --no-airflow, `run` to the end. Both
finish with a report from SQL that checks every record arrived exactly once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Engine

from . import ledger
from .config import Settings, safe_url
from .db import fresh_database, make_engine
from .sqlfiles import query
from .demodata import produce_orders
from .devbroker import DevBroker
from .migrate import migrate

DEMO_DB = "ledgerbatch_demo"
TOPIC = "orders"
PIPELINE = "orders"  # pipelines/orders.yaml
REPORT = {"quarantine by reason": "report_quarantine_by_reason", "batches": "report_batches",
          "cursors": "report_cursors"}  # named queries in sql/queries/ledger_status.sql


@dataclass
class DemoSetup:
    db_url: str
    engine: Engine
    broker: DevBroker
    good: int
    bad: int


def prepare(settings: Settings, records: int, partitions: int) -> DemoSetup:
    db_url = fresh_database(settings.db_url, DEMO_DB)
    print(f"demo database: {safe_url(db_url)} (dropped and created fresh)")
    engine = make_engine(db_url)
    migrate(engine)
    broker = DevBroker(3)
    broker.create_topic(TOPIC, partitions)
    print(f"dev broker: {broker.bootstrap_servers}, topic {TOPIC} with {partitions} partitions")
    produced = produce_orders(broker.bootstrap_servers, TOPIC, records, partitions, bad_every=1000)
    print(f"produced {records} records: {produced['good']} valid orders, {produced['bad']} bad records")
    return DemoSetup(db_url, engine, broker, produced["good"], produced["bad"])


def report(setup: DemoSetup) -> bool:
    with setup.engine.connect() as conn:
        target_sql = query("count_rows", schema="public", table=PIPELINE)
        reports = [("target rows", target_sql, conn.execute(text(target_sql)))]
        reports += [(title, *ledger.report(conn, name)) for title, name in REPORT.items()]
        for title, sql, result in reports:
            print(f"-- {title}: {sql}")
            print("   " + " | ".join(result.keys()))
            for row in result:
                print("   " + " | ".join(str(v) for v in row))
            print()
        rows = conn.execute(text(target_sql)).one().rows
        quarantined = ledger.quarantined_count(conn, PIPELINE)
    ok = (rows, quarantined) == (setup.good, setup.bad)
    print("OK: every valid order delivered once, every bad record quarantined once." if ok else
          f"MISMATCH: {rows} rows and {quarantined} quarantined, expected {setup.good} and {setup.bad}.")
    print(f"Inspect the ledger: psql -h 127.0.0.1 -U postgres -d {DEMO_DB} -c 'SELECT * FROM ledger.recent_batches'")
    return ok


def run_without_airflow(settings: Settings, records: int, partitions: int) -> None:
    from .runner import run_pipeline
    from .sparksession import get_spark

    setup = prepare(settings, records, partitions)
    try:
        started = time.monotonic()
        summary = run_pipeline(setup.engine, settings.spec(PIPELINE), setup.db_url, setup.broker.bootstrap_servers,
                               lambda: get_spark(settings.spark_master, "ledgerbatch-demo"))
        print(f"\nledgerbatch run orders: {summary.batches} batches, {summary.records_read} records read, "
              f"{summary.rows_written} rows written, {summary.rows_quarantined} quarantined "
              f"in {time.monotonic() - started:.1f}s\n")
        ok = report(setup)
    finally:
        setup.broker.close()
    if not ok:
        raise SystemExit(1)
