"""The transform contenders (issue #12): the bench's JSON orders through a query transform, warm, as the
JSON append contender runs them (lb.run_warm): a per-minute aggregate (30 customers x 20 minutes, 600
groups) and a filter that keeps about half the records. The aggregate's totals are checked against
totals computed here from the produced values alone."""
from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

from sqlalchemy import create_engine, text

from ledgerbatch.dev.demodata import order

from . import lb

AGGREGATE = {
    "transform": "SELECT CAST(substr(customer, 3) AS INT) % 30 AS customer, minute(ts) % 20 AS minute, "
                 "count(*) AS orders, sum(amount) AS revenue, min(amount) AS smallest, max(amount) AS largest "
                 "FROM batch GROUP BY 1, 2",
    "target": {"mode": "aggregate", "key": ["customer", "minute"],
               "measures": {"orders": "sum", "revenue": "sum", "smallest": "min", "largest": "max"}},
}
FILTER = {"transform": "SELECT * FROM batch WHERE amount >= 500"}


def expected_groups(records: int) -> dict:
    """(customer, minute) -> (orders, revenue, smallest, largest) of orders 0..records-1, from their values."""
    groups: dict = {}
    for i in range(records):
        o = json.loads(order(i))
        key = (int(o["customer"][2:]) % 30, int(o["ts"][14:16]) % 20)
        amount = Decimal(o["amount"])
        g = groups.get(key)
        groups[key] = (1, amount, amount, amount) if g is None else (
            g[0] + 1, g[1] + amount, min(g[2], amount), max(g[3], amount))
    return groups


def expected_filtered_rows(records: int) -> int:
    return sum(1 for i in range(records) if Decimal(json.loads(order(i))["amount"]) >= 500)


def run_aggregate_warm(bootstrap: str, topic: str, db_name: str, workdir: Path, records: int, want: dict,
                       batches: int = 1) -> dict:
    result = lb.run_warm(bootstrap, topic, db_name, workdir, records, extra=AGGREGATE, batches=batches)
    url = result.pop("url")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            got = {(r.customer, r.minute): (r.orders, r.revenue, r.smallest, r.largest) for r in conn.execute(text(
                f"SELECT customer, minute, orders, revenue, smallest, largest FROM public.{lb.NAME}"))}
    finally:
        engine.dispose()
    return result | {"groups": len(got), "totals_equal": got == want}


def run_filter_warm(bootstrap: str, topic: str, db_name: str, workdir: Path, records: int, batches: int = 1) -> dict:
    result = lb.run_warm(bootstrap, topic, db_name, workdir, records, extra=FILTER, batches=batches)
    result.pop("url")
    return result
