"""The commit of a 1M-row append batch of which the target refuses 100 rows, next to a clean batch's
(issue #22): what finding and quarantining the refused rows costs inside the commit.

Each batch is staged in SQL as the executors leave one (the rows by generate_series, the counts marked
staged), so the figures are the commit's alone. Runs alternate clean and refused batches on one target
with a CHECK (amount > 0) the refused rows break; figures are medians.

python -m bench.rejects --rows 1000000 --refused 100 --runs 3
"""
from __future__ import annotations

import argparse
import statistics

from sqlalchemy import text

from bench.common import DB_PREFIX, fresh_database
from ledgerbatch.commit.modes.catalog import mode_for
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.ledger.batches import begin_attempt, insert_batch, mark_staged
from ledgerbatch.ledger.cursors import init_cursors
from ledgerbatch.ledger.engine import make_engine
from ledgerbatch.ledger.migrations import migrate
from ledgerbatch.model.batch import BatchKind
from ledgerbatch.model.ranges import OffsetRange
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.spec.pipeline import parse_spec
from ledgerbatch.stage.tables import StagingTables, staging_name

SPEC = parse_spec({"name": "rejects", "source": {"topics": ["orders"], "schema":
                   "order_id STRING, customer STRING, amount DECIMAL(12,2), ts TIMESTAMP"},
                   "target": {"table": "public.orders"}, "errors": {"max_ratio": 0.01}})


def stage(engine, start: int, rows: int, refused: int) -> int:
    """A staged live batch of offsets [start, start + rows); every (rows // refused)-th amount is -1."""
    every = rows // refused if refused else 0
    r = OffsetRange("orders", 0, start, start + rows)
    with engine.begin() as conn:
        if start == 0:
            init_cursors(conn, SPEC.name, {r.topic_partition: 0})
        batch_id = insert_batch(conn, SPEC.name, BatchKind.LIVE, [r])
        attempt = begin_attempt(conn, batch_id, None)
        staging = staging_name(batch_id, attempt)
        StagingTables(staging).create(conn, BatchShape.of_spec(SPEC), batch_id)
        conn.execute(text(
            f'INSERT INTO ledger_staging."{staging}" (order_id, customer, amount, ts, _topic, _partition, _offset, '
            "_batch_id) SELECT 'o-' || o, 'c-' || (o % 97), CASE WHEN :every > 0 AND o % :every = 7 THEN -1 "
            "ELSE 1.5 END, timestamp '2026-11-24' + o * interval '1 ms', 'orders', 0, o, :batch_id "
            "FROM generate_series(:lo, :hi - 1) o"), {"every": every, "lo": start, "hi": start + rows,
                                                     "batch_id": batch_id})
        mark_staged(conn, batch_id, attempt, staging, (r,), {r.topic_partition: (rows, 0)})
    return batch_id


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--rows", type=int, default=1_000_000)
    args.add_argument("--refused", type=int, default=100)
    args.add_argument("--runs", type=int, default=3)
    opts = args.parse_args()
    engine = make_engine(fresh_database(f"{DB_PREFIX}rejects"))
    migrate(engine)
    with engine.begin() as conn:
        mode_for(SPEC).ensure_target(conn, SPEC, BatchShape.of_spec(SPEC))
        conn.execute(text("ALTER TABLE public.orders ADD CONSTRAINT positive CHECK (amount > 0)"))
    seconds: dict[int, list[float]] = {0: [], opts.refused: []}
    start = 0
    for run in range(opts.runs):
        for refused in seconds:
            batch_id = stage(engine, start, opts.rows, refused)
            result = commit_batch(engine, SPEC, batch_id)
            assert result.rows_rejected == refused and result.rows_written == opts.rows - refused, result
            seconds[refused].append(result.seconds)
            print(f"run {run + 1}/{opts.runs}: {refused} refused: commit {result.seconds:.2f}s", flush=True)
            start += opts.rows
    clean, refused = (statistics.median(seconds[k]) for k in seconds)
    print(f"median commit of {opts.rows:,} rows: clean {clean:.2f}s, {opts.refused} refused {refused:.2f}s "
          f"({refused / clean:.2f}x)")


if __name__ == "__main__":
    main()
