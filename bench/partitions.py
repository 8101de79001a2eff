"""Query cost against an append target's partition count (#42), and the rollup that bounds it.

    python -m bench.partitions [--rows 2000000] [--counts 10,16,24,200,2000] [--repeats 21]

For each count, a target in an append pipeline's shape (`PARTITION BY RANGE (_batch_id)`, unique on the
coordinates and batch) holding `--rows` orders spread evenly over that many batch-id partitions; then the
lookup by source coordinates and `count(*) WHERE customer = ...` are timed (wall and planning, from EXPLAIN
ANALYZE; medians of `--repeats`). Last, the biggest target is brought to the default bound (16) by ledgerbatch's own
rollup (commit/modes/rollup.py, as for a target an earlier version made) and timed again. Prints JSON. Its
database is prefixed `lb_partitions_` and dropped at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

os.environ.setdefault("LEDGERBATCH_BENCH_DB_PREFIX", "lb_partitions_")

from sqlalchemy import create_engine, text  # noqa: E402

from .common import DB_PREFIX, SERVER_URL, fresh_database  # noqa: E402
from ledgerbatch.commit.modes.rollup import bound_partitions  # noqa: E402
from ledgerbatch.spec.pipeline import parse_spec  # noqa: E402


def build(conn, table: str, rows: int, partitions: int) -> None:
    conn.execute(text(f"""
        CREATE TABLE {table} (order_id text, customer text, amount numeric(12,2), ts timestamptz,
            _topic text NOT NULL, _partition integer NOT NULL, _offset bigint NOT NULL, _batch_id bigint NOT NULL,
            UNIQUE (_topic, _partition, _offset, _batch_id)) PARTITION BY RANGE (_batch_id)"""))
    for i in range(partitions):
        upper = "MAXVALUE" if i == partitions - 1 else str(i + 2)
        conn.execute(text(f"CREATE TABLE {table}_b{i + 1} PARTITION OF {table} FOR VALUES FROM ({i + 1}) TO ({upper})"))
    per = rows // partitions
    conn.execute(text(f"""
        INSERT INTO {table}
        SELECT 'o-' || g, 'c-' || (g % 9973), (g % 100000) / 100.0, now(), 'orders', g % 32, g / 32, 1 + (g / :per)
        FROM generate_series(0, :rows - 1) g"""), {"per": per, "rows": per * partitions})
    conn.execute(text(f"ANALYZE {table}"))


def timed(conn, sql: str, repeats: int, params) -> dict:
    walls, plans = [], []
    for _ in range(repeats):
        plan = conn.execute(text(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}"), params()).scalar_one()[0]
        walls.append(plan["Planning Time"] + plan["Execution Time"])
        plans.append(plan["Planning Time"])
    return {"wall_ms": round(statistics.median(walls), 3), "planning_ms": round(statistics.median(plans), 3)}


def measure(conn, table: str, rows: int, repeats: int) -> dict:
    def coordinates():
        g = random.randrange(rows)
        return {"p": g % 32, "o": g // 32}
    return {
        "partitions": conn.execute(text("SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass(:t)"),
                                   {"t": table}).scalar_one(),
        "lookup": timed(conn, f"SELECT * FROM {table} WHERE _topic = 'orders' AND _partition = :p AND _offset = :o",
                        repeats, coordinates),
        "count_by_customer": timed(conn, f"SELECT count(*) FROM {table} WHERE customer = :c", repeats,
                                   lambda: {"c": f"c-{random.randrange(9973)}"}),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.partitions", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--counts", default="10,16,24,200,2000")
    p.add_argument("--repeats", type=int, default=21)
    args = p.parse_args(argv)
    url = fresh_database(f"{DB_PREFIX}targets")
    engine = create_engine(url)
    results = {"rows": args.rows, "repeats": args.repeats, "layouts": []}
    try:
        counts = [int(c) for c in args.counts.split(",")]
        for n in counts:
            with engine.begin() as conn:
                build(conn, f"public.t{n}", args.rows, n)
            with engine.connect() as conn:
                results["layouts"].append(measure(conn, f"public.t{n}", args.rows, args.repeats))
            print(json.dumps(results["layouts"][-1]), file=sys.stderr, flush=True)
        biggest = max(counts)
        spec = parse_spec({"name": "bench_partitions", "source": {"topics": ["orders"], "schema": "order_id STRING"},
                           "target": {"table": f"public.t{biggest}"}})
        started = time.monotonic()
        merges = bound_partitions(engine, spec)
        results["rollup"] = {"from": biggest, "merges": len(merges), "seconds": round(time.monotonic() - started, 2)}
        with engine.connect() as conn:
            conn.execute(text(f"ANALYZE public.t{biggest}"))
            results["rollup"]["after"] = measure(conn, f"public.t{biggest}", args.rows, args.repeats)
            assert conn.execute(text(f"SELECT count(*) FROM public.t{biggest}")).scalar_one() == \
                args.rows // biggest * biggest
    finally:
        engine.dispose()
        with create_engine(SERVER_URL, isolation_level="AUTOCOMMIT").connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{DB_PREFIX}targets" WITH (FORCE)'))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
