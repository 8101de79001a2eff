"""What the commit-wait benches share (bench.rollup_commit_wait, bench.compaction_commit_wait): a live pipeline
committing 1-record batches as fast as it can, timed, beside a piece of upkeep running in another thread. Two
figures per commit: its whole duration, and of it the wait for the target's commit lock and its batch row
(CommitResult.waited), which is what the upkeep can add; the rest is the commit's own work, which competes
with the upkeep only for the machine's cores and disk."""
from __future__ import annotations

import statistics
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from sqlalchemy import create_engine, text

from .common import SERVER_URL, fresh_database
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.ledger.engine import make_engine
from tests.integration.staged import Pipe, staged_batch


class Committer:
    """The live pipeline: 1-record batches of partition 0, each staged, then committed (only that is timed)."""

    def __init__(self, engine, p: Pipe, offset: int):
        self.engine, self.p, self.offset = engine, p, offset

    def commit_one(self) -> tuple[float, float]:
        """(the commit's seconds, of them waiting for the lock)"""
        s = staged_batch(self.engine, self.p, {0: (self.offset, self.offset + 1)},
                         good=[(0, self.offset, f"o-{self.offset}", "1.00")])
        started = time.monotonic()
        result = commit_batch(self.engine, self.p.spec, s.batch_id)
        self.offset += 1
        return time.monotonic() - started, result.waited

    def beside(self, work: Callable[[], object]) -> tuple[object, float, list[tuple[float, float]]]:
        """Run `work` in a thread, committing until it ends: its result, its seconds, the commits' times."""
        done: dict = {}

        def run():
            started = time.monotonic()
            done.update(result=work(), seconds=time.monotonic() - started)
        worker = threading.Thread(target=run)
        worker.start()
        waits = []
        while worker.is_alive():
            waits.append(self.commit_one())
        worker.join()
        return done["result"], done["seconds"], waits


def percentiles(commits: list[tuple[float, float]]) -> dict:
    """p50/p99/max/mean of the commits' durations (`commit`) and of their waits for the lock (`lock_wait`)."""
    def summary(values: list[float]) -> dict:
        ordered = sorted(values)

        def at(q: float) -> float:
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)
        return {"p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": round(ordered[-1] * 1000, 1),
                "mean_ms": round(statistics.mean(values) * 1000, 1)}
    return {"commits": len(commits), "commit": summary([c for c, _ in commits]),
            "lock_wait": summary([w for _, w in commits])}


@contextmanager
def scratch_engine(name: str) -> Iterator:
    """An engine on a fresh database `name` (prefixed DB_PREFIX), dropped on the way out."""
    engine = make_engine(fresh_database(name))
    try:
        yield engine
    finally:
        engine.dispose()
        admin = create_engine(SERVER_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
