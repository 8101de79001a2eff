"""A live pipeline's commit wait while a partition rollup merges a big run of partitions (#49).

    python -m bench.rollup_commit_wait [--rows 10000000] [--baseline-commits 200]

An append pipeline (`target.partitions.max: 2`) whose target holds two attached batches of `--rows` / 2 rows
each and a third of 50,000 (made in SQL, as the executors' COPY would leave them; the third is the open
partition): over the bound, ledgerbatch's own rollup (commit/modes/rollup.py: roll_up) merges the first two,
copying `--rows` rows, in one thread, while the pipeline goes on committing 1-record live batches in another, as
fast as it can: each commit is ledgerbatch's own (commit/transaction.py: commit_batch; the batches are staged by
hand as tests/integration/staged.py does, no Kafka or Spark). Prints JSON: the commits' durations and lock
waits (p50/p99/max) during the rollup and before it (the same commits with no rollup), the rollup's seconds and
whether it merged (a rollup that gave way says why). Its database is prefixed `lb_rollup_` and dropped at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LEDGERBATCH_BENCH_DB_PREFIX", "lb_rollup_")

from sqlalchemy import text  # noqa: E402

from .commit_wait import Committer, percentiles, scratch_engine  # noqa: E402
from .common import DB_PREFIX  # noqa: E402
from ledgerbatch.commit.modes.append import partitions_of  # noqa: E402
from ledgerbatch.commit.modes.rollup import roll_up  # noqa: E402
from ledgerbatch.commit.transaction import commit_batch  # noqa: E402
from ledgerbatch.ledger.batches import get_batch, mark_staged  # noqa: E402
from ledgerbatch.ledger.migrations import migrate  # noqa: E402
from ledgerbatch.ops import upkeep_failures  # noqa: E402
from tests.integration.staged import Pipe, begin, plan, respec, staged_batch  # noqa: E402

OPEN_ROWS = 50_000  # the third batch: attached at the default attach_min_rows, it is the open partition


def attached_batch(engine, p: Pipe, lo: int, hi: int) -> None:
    """A live batch of offsets [lo, hi) of partition 0, staged in SQL and committed (attached as a partition)."""
    s = begin(engine, p, plan(engine, p, {0: (lo, hi)}))
    with engine.begin() as conn:
        conn.execute(text(f'INSERT INTO ledger_staging."{s.staging}" (order_id, customer, amount, ts, _topic, '
                          "_partition, _offset, _batch_id) SELECT 'o-' || g, 'c-' || (g % 9973), (g % 100000) / 100.0, "
                          "now(), :topic, 0, g, :b FROM generate_series(:lo, :hi - 1) g"),
                     {"topic": p.topic, "b": s.batch_id, "lo": lo, "hi": hi})
        mark_staged(conn, s.batch_id, s.attempt, s.staging, get_batch(conn, s.batch_id).ranges,
                    {(p.topic, 0): (hi - lo, 0)})
    commit_batch(engine, p.spec, s.batch_id)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000, help="rows the rollup merges (two partitions of half)")
    ap.add_argument("--baseline-commits", type=int, default=200, help="commits timed before the rollup")
    args = ap.parse_args(argv)
    with scratch_engine(f"{DB_PREFIX}{os.getpid()}") as engine:
        migrate(engine)
        p = Pipe(Path(tempfile.mkdtemp(prefix="lb_rollup_")))
        respec(p, target={"partitions": {"max": 2}})
        started = time.monotonic()
        half = args.rows // 2
        for lo, hi in ((0, half), (half, 2 * half), (2 * half, 2 * half + OPEN_ROWS)):
            attached_batch(engine, p, lo, hi)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f'VACUUM ANALYZE public."{p.table}"'))  # as autovacuum would after the loads
        setup_s = time.monotonic() - started
        live = Committer(engine, p, 2 * half + OPEN_ROWS)
        before = [live.commit_one() for _ in range(args.baseline_commits)]
        r, seconds, during = live.beside(lambda: roll_up(engine, p.spec))
        with engine.connect() as conn:
            partitions = len(partitions_of(conn, p.spec))
            rows = conn.execute(text(f'SELECT count(*) FROM public."{p.table}"')).scalar_one()
        return {
            "target": {"rows_merged": 2 * half, "made_s": round(setup_s, 1), "rows_after": rows,
                       "partitions_after": partitions},
            "rollup": {"merged": r is not None, "seconds": round(seconds, 1),
                       "gave_way": upkeep_failures.failing(p.name).get("rollup")},
            "commit_wait_during_rollup": percentiles(during),
            "commit_wait_before": percentiles(before),
            "load_average_1m": round(os.getloadavg()[0], 1),  # the machine's, when the rollup ended
        }


if __name__ == "__main__":
    json.dump(main(sys.argv[1:]), sys.stdout, indent=2)
    print()
