"""`ledgerbatch demo`: the whole data path on the embedded defaults, in one command.

A dev broker in this process, a fresh `ledgerbatch_demo` database on the configured PostgreSQL
server, known orders with bad records in them, then `run` to the end and a report from SQL.
"""
from __future__ import annotations

import time

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from .config import Settings, safe_url
from .db import make_engine
from .demodata import produce_orders
from .devbroker import DevBroker
from .migrate import migrate
from .runner import run_pipeline
from .sparksession import get_spark

DEMO_DB = "ledgerbatch_demo"
REPORT = {
    "target rows": "SELECT count(*) AS rows, count(DISTINCT (_topic, _partition, _offset)) AS distinct_coordinates FROM public.orders",
    "quarantine by reason": "SELECT error, count(*) FROM ledger.quarantine GROUP BY error ORDER BY 2 DESC, 1",
    "batches": "SELECT batch_id, status, records_read, rows_written, rows_quarantined, committed_at - created_at AS took FROM ledger.batches ORDER BY batch_id",
    "cursors": "SELECT topic, count(*) AS partitions, sum(next_offset) AS delivered_offsets FROM ledger.cursors GROUP BY topic",
}


def _fresh_database(server_url: str) -> str:
    admin = create_engine(make_url(server_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    make_engine(server_url).dispose()  # a clear error when the server is not reachable
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{DEMO_DB}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{DEMO_DB}"'))
    admin.dispose()
    return make_url(server_url).set(database=DEMO_DB).render_as_string(hide_password=False)


def run_demo(settings: Settings, records: int, partitions: int) -> None:
    spec = settings.spec("orders")
    db_url = _fresh_database(settings.db_url)
    print(f"demo database: {safe_url(db_url)} (dropped and created fresh)")
    engine = make_engine(db_url)
    migrate(engine)
    with DevBroker(3) as broker:
        broker.create_topic("orders", partitions)
        print(f"dev broker: {broker.bootstrap_servers}, topic orders with {partitions} partitions")
        produced = produce_orders(broker.bootstrap_servers, "orders", records, partitions, bad_every=1000)
        print(f"produced {records} records: {produced['good']} valid orders, {produced['bad']} bad records")
        started = time.monotonic()
        summary = run_pipeline(engine, spec, db_url, broker.bootstrap_servers, lambda: get_spark(settings.spark_master, "ledgerbatch-demo"))
        print(f"\nledgerbatch run orders: {summary.batches} batches, {summary.records_read} records read, "
              f"{summary.rows_written} rows written, {summary.rows_quarantined} quarantined "
              f"in {time.monotonic() - started:.1f}s\n")
    with engine.connect() as conn:
        for title, sql in REPORT.items():
            result = conn.execute(text(sql))
            print(f"-- {title}: {sql}")
            print("   " + " | ".join(result.keys()))
            for row in result:
                print("   " + " | ".join(str(v) for v in row))
            print()
    ok = summary.rows_written == produced["good"] and summary.rows_quarantined == produced["bad"]
    print(("OK: every valid order delivered once, every bad record quarantined once." if ok else
           "MISMATCH: delivered counts differ from what was produced."))
    print(f"Inspect the ledger yourself: psql -h 127.0.0.1 -U postgres -d {DEMO_DB} -c 'SELECT * FROM ledger.recent_batches'")
    if not ok:
        raise SystemExit(1)
