"""A live pipeline's commit wait while compaction folds a long history (#49).

    python -m bench.compaction_commit_wait [--batches 200000] [--ranges 1] [--step-batches 500]

A pipeline's history of `--batches` committed live batches of `--ranges` one-offset ranges each, an hour old,
made in SQL (as weeks of batches leave the ledger); then `ledgerbatch compact`'s fold of all of it
(ops/history.py: compact, `--step-batches` batches per step) in one thread while the pipeline goes on
committing 1-record live batches in another, as fast as it can: each commit is ledgerbatch's own
(commit/transaction.py: commit_batch; the batches are staged by hand as tests/integration/staged.py does, no
Kafka or Spark). Prints JSON: the commits' durations and lock waits (p50/p99/max) during the fold and before it
(the same commits with no compaction), the fold's seconds, steps and per-step time. Its database is prefixed `lb_compaction_` and
dropped at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

os.environ.setdefault("LEDGERBATCH_BENCH_DB_PREFIX", "lb_compaction_")

from sqlalchemy import text  # noqa: E402

from .commit_wait import Committer, percentiles, scratch_engine  # noqa: E402
from .common import DB_PREFIX  # noqa: E402
from ledgerbatch.commit.transaction import commit_batch  # noqa: E402
from ledgerbatch.ledger.migrations import migrate  # noqa: E402
from ledgerbatch.ops.history import STEP_BATCHES, compact  # noqa: E402
from tests.integration.staged import Pipe, staged_batch  # noqa: E402

CHUNK = 20_000  # history batches made per statement


def make_history(engine, p: Pipe, batches: int, ranges: int) -> None:
    """`batches` committed live batches an hour old, each delivering offset n of partitions 0..ranges-1, whose
    records a transform filtered out (the target holds no row of them, so `verify` stays clean)."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE ledger.batches SET committed_at = now() - interval '1 hour' WHERE pipeline = :p"),
                     {"p": p.name})
    for first in range(1, batches + 1, CHUNK):
        with engine.begin() as conn:
            conn.execute(text("""
              WITH b AS (INSERT INTO ledger.batches (pipeline, kind, status, staging_table, records_read, rows_written,
                                                     records_filtered, rows_quarantined, committed_at, created_at)
                         SELECT :p, 'live', 'committed', 'gone', :R, 0, :R, 0, now() - interval '1 hour',
                                now() - interval '1 hour'
                         FROM generate_series(:lo, :hi) RETURNING batch_id),
                   n AS (SELECT batch_id, :lo - 1 + row_number() OVER (ORDER BY batch_id) AS n FROM b)
              INSERT INTO ledger.batch_ranges (batch_id, pipeline, kind, topic, partition, from_offset, until_offset,
                                               records_read, committed)
              SELECT n.batch_id, :p, 'live', :t, part, n.n, n.n + 1, 1, true
              FROM n, generate_series(0, :R - 1) part"""),
                         {"p": p.name, "t": p.topic, "R": ranges, "lo": first, "hi": min(first + CHUNK - 1, batches)})
    with engine.begin() as conn:
        conn.execute(text("UPDATE ledger.cursors SET next_offset = :B + 1, last_batch_id = (SELECT max(batch_id) "
                          "FROM ledger.batches WHERE pipeline = :p) WHERE pipeline = :p"), {"p": p.name, "B": batches})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE ledger.batches, ledger.batch_ranges"))  # as autovacuum would


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=200_000, help="history batches to fold")
    ap.add_argument("--ranges", type=int, default=1, help="ranges (partitions) per history batch")
    ap.add_argument("--step-batches", type=int, default=STEP_BATCHES, help="batches folded per step")
    ap.add_argument("--baseline-commits", type=int, default=200, help="commits timed before the fold")
    args = ap.parse_args(argv)
    with scratch_engine(f"{DB_PREFIX}{os.getpid()}") as engine:
        migrate(engine)
        p = Pipe(Path(tempfile.mkdtemp(prefix="lb_compaction_")))
        first = staged_batch(engine, p, {i: (0, 1) for i in range(args.ranges)},
                             good=[(i, 0, f"o-{i}", "1.00") for i in range(args.ranges)])
        commit_batch(engine, p.spec, first.batch_id)
        started = time.monotonic()
        make_history(engine, p, args.batches, args.ranges)
        setup_s = time.monotonic() - started
        live = Committer(engine, p, args.batches + 1)
        before = [live.commit_one() for _ in range(args.baseline_commits)]
        c, _, during = live.beside(lambda: compact(engine, p.spec, datetime.now(timezone.utc) - timedelta(minutes=30),
                                                   step_batches=args.step_batches))
        with engine.connect() as conn:
            problems = conn.execute(text("SELECT count(*) FROM ledger.invariant_violations WHERE pipeline = :p"),
                                    {"p": p.name}).scalar_one()
        return {
            "history": {"batches": args.batches, "ranges_per_batch": args.ranges, "made_s": round(setup_s, 1)},
            "fold": {"batches": c.batches, "seconds": round(c.seconds, 1), "steps": c.steps,
                     "step_batches": args.step_batches, "per_step_ms": round(c.seconds / c.steps * 1000, 1),
                     "longest_step_ms": round(c.longest_step_s * 1000, 1), "invariant_violations": problems},
            "commit_wait_during_fold": percentiles(during),
            "commit_wait_before": percentiles(before),
            "load_average_1m": round(os.getloadavg()[0], 1),  # the machine's, when the fold ended
        }


if __name__ == "__main__":
    json.dump(main(sys.argv[1:]), sys.stdout, indent=2)
    print()
