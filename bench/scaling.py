"""Scaling with the ledger's size: plan + commit of one small real batch after N historic batches.

The historic ledger is valid by every constraint: N committed live batches of the pipeline, batch i
covering one contiguous range of partition i % P, together tiling [0, end) of each partition of the
pipeline's real topic, and the cursors standing at the end. The new batch then plans 100 new records
after them and goes through the real plan_next -> process_batch -> commit_batch, timed in-process
(one SparkSession for every N, so Spark's start-up is not in the figures).

The aggregate variant (issue #12) runs the same with bench/transforms.py's per-minute aggregate: each
historic batch also left its contribution (6 groups) in ledger_aggregates, and the target holds their
merge, so the new batch's commit meets a contributions table as large as that history makes it.

Runs as a child process (it hosts Spark): python -m bench.scaling CONFIG_JSON
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from sqlalchemy import text

from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.ledger.engine import make_engine
from ledgerbatch.dev.demodata import produce_orders
from ledgerbatch.ledger.migrations import migrate
from ledgerbatch.plan.live import plan_next
from ledgerbatch.stage.process import process_batch
from ledgerbatch.plan.replay import plan_replay
from ledgerbatch.spark.session import get_spark
from ledgerbatch.spec.pipeline import load_spec

from ledgerbatch.commit.modes.catalog import mode_for
from ledgerbatch.stage.transform import batch_shape

from . import lb, transforms
from .common import DB_PREFIX, fresh_database, watermarks

NAME = "bench_scale"
NEW_RECORDS = 100
AGGREGATE_HISTORIC_MAX = 100_000  # 6 contributions a batch: 600k rows at 100k batches

HISTORIC_SQL = """
CREATE TEMP TABLE historic AS
SELECT g AS batch_id, s.p, s.j * h / n AS from_offset, (s.j + 1) * h / n AS until_offset,
       now() - (:n - g) * interval '1 minute' AS created_at
FROM (SELECT g, ((g - 1) % :parts)::int AS p, ((g - 1) / :parts)::bigint AS j FROM generate_series(1, :n) g) s
CROSS JOIN LATERAL (SELECT (CAST(:highs AS bigint[]))[s.p + 1] AS h,
                           (:n / :parts + CASE WHEN s.p < :n % :parts THEN 1 ELSE 0 END)::bigint AS n) x;

INSERT INTO ledger.batches (batch_id, pipeline, kind, status, attempt, staging_table, created_at, updated_at,
                            staged_at, committed_at, records_read, rows_written, rows_quarantined)
SELECT batch_id, :pipeline, 'live', 'committed', 1, 'b' || batch_id || '_a1', created_at, created_at + interval '10 s',
       created_at + interval '8 s', created_at + interval '10 s', until_offset - from_offset, until_offset - from_offset, 0
FROM historic;

INSERT INTO ledger.batch_ranges (batch_id, pipeline, kind, topic, partition, from_offset, until_offset, records_read, committed)
SELECT batch_id, :pipeline, 'live', :topic, p, from_offset, until_offset, until_offset - from_offset, true FROM historic;

INSERT INTO ledger.cursors (pipeline, topic, partition, start_offset, next_offset, last_batch_id)
SELECT :pipeline, :topic, p, 0, max(until_offset), max(batch_id) FROM historic GROUP BY p;

SELECT setval(pg_get_serial_sequence('ledger.batches', 'batch_id'), :n);
DROP TABLE historic;
"""
HISTORIC_CONTRIBUTIONS_SQL = f"""
INSERT INTO ledger_aggregates.{NAME} (_batch_id, customer, minute, orders, revenue, smallest, largest)
SELECT g, (g * 7 + k) % 30, (g + k) % 20, 10, 100.00, 1.00, 50.00
FROM generate_series(1, :n) g CROSS JOIN generate_series(0, 5) k;

INSERT INTO public.{NAME} (customer, minute, orders, revenue, smallest, largest, _batch_id)
SELECT customer, minute, sum(orders), sum(revenue), min(smallest), max(largest), max(_batch_id)
FROM ledger_aggregates.{NAME} GROUP BY customer, minute;
"""


def one_size(spark, n: int, bootstrap: str, topic: str, partitions: int, workdir: Path, repeats: int,
             aggregate: bool = False) -> dict:
    highs = [hi for _, (_, hi) in sorted(watermarks(bootstrap, topic).items())]
    if not partitions <= n <= min(highs) * partitions:
        raise SystemExit(f"scaling: {n} historic batches need {partitions} to {min(highs) * partitions} offsets' worth")
    url = fresh_database(f"{DB_PREFIX}scale")
    lb.write_spec(workdir, NAME, topic, 100_000, extra=transforms.AGGREGATE if aggregate else None)
    spec = load_spec(workdir, NAME)
    engine = make_engine(url)
    migrate(engine)
    started = time.monotonic()
    with engine.begin() as conn:
        statements = HISTORIC_SQL.split(";\n")
        if aggregate:
            mode_for(spec).ensure_target(conn, spec, batch_shape(spark, spec))
            statements += HISTORIC_CONTRIBUTIONS_SQL.split(";\n")
        for statement in statements:
            if statement.strip():
                conn.execute(text(statement), {"n": n, "parts": partitions, "highs": highs, "pipeline": NAME, "topic": topic})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE"))
    setup_s = time.monotonic() - started
    produced, times = 0, []
    for i in range(repeats + 1):  # the first batch creates the target table and warms Spark: not counted
        produce_orders(bootstrap, topic, NEW_RECORDS, partitions, start=sum(highs) + produced)
        produced += NEW_RECORDS
        t0 = time.monotonic()
        batch = plan_next(engine, spec, bootstrap)
        plan_s = time.monotonic() - t0
        if batch is None or batch.span != NEW_RECORDS:
            raise RuntimeError(f"scaling: planned {batch and batch.span} offsets, expected {NEW_RECORDS}")
        batch = process_batch(spark, engine, spec, batch.batch_id, url, bootstrap)
        t0 = time.monotonic()
        commit_batch(engine, spec, batch.batch_id, batch.attempt)
        commit_s = time.monotonic() - t0
        if i:
            times.append((plan_s, commit_s))
    replay_s = _replay_commits(spark, engine, spec, url, bootstrap, batch.ranges, repeats) if aggregate else None
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT {'sum(orders) - 60 * :n' if aggregate else 'count(*)'} FROM public.{NAME}"),
                            {"n": n}).scalar_one()
    engine.dispose()
    if rows != produced:
        raise RuntimeError(f"scaling: {rows} new {'orders counted' if aggregate else 'rows'} for {produced} new records")
    totals = [p + c for p, c in times]
    return {"historic_batches": n, "mode": "aggregate" if aggregate else "append", "setup_s": round(setup_s, 1),
            "plan_s": statistics.median(p for p, _ in times), "replay_commit_s": replay_s,
            "commit_s": statistics.median(c for _, c in times), "plan_commit_s": statistics.median(totals),
            "plan_commit_all_s": [round(t, 4) for t in totals]}


def _replay_commits(spark, engine, spec, url: str, bootstrap: str, ranges, repeats: int) -> float:
    """Median commit of a replay of the last new batch: its groups are recomputed from every
    contribution to them, so this grows with the history of those groups, unlike a live commit."""
    seconds = []
    for _ in range(repeats):
        batch = plan_replay(engine, spec, list(ranges))
        batch = process_batch(spark, engine, spec, batch.batch_id, url, bootstrap)
        t0 = time.monotonic()
        commit_batch(engine, spec, batch.batch_id, batch.attempt)
        seconds.append(time.monotonic() - t0)
    return statistics.median(seconds)


def main(cfg: dict) -> list[dict]:
    spark = get_spark("local[*]", "ledgerbatch-bench-scaling")
    try:
        args = (cfg["bootstrap"], cfg["topic"], cfg["partitions"], Path(cfg["workdir"]), cfg["repeats"])
        return ([one_size(spark, n, *args) for n in cfg["historic"]]
                + [one_size(spark, n, *args, aggregate=True) for n in cfg["historic"] if n <= AGGREGATE_HISTORIC_MAX])
    finally:
        spark.stop()


if __name__ == "__main__":
    print("BENCH_SCALING_RESULT " + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
