"""Randomized: live batches, replays and backfills of one pipeline committed concurrently by several
processes, some SIGKILLed at random moments (racing.py), in every target mode. Afterwards the pipeline is
finished serially, and the ledger's invariants (`verify`) hold and the target equals what the source says:
every record once (append), each key's latest value (upsert), with deletes (change pipelines), the exact
sums (aggregate). LEDGERBATCH_RACE_SECONDS and LEDGERBATCH_RACE_SEED make longer runs."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import text

from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.ledger.cursors import init_cursors
from ledgerbatch.model.batch import BatchStatus
from ledgerbatch.model.ranges import OffsetRange, Watermarks
from ledgerbatch.ops.verify import verify
from ledgerbatch.plan.live import plan_from
from ledgerbatch.plan.replay import plan_replay
from ledgerbatch.stage.tables import drop_finished_staging

from .racing import END, PARTITIONS, START, expected, staged_records
from .staged import REPO, begin, fill, quarantine, target

pytestmark = pytest.mark.integration

SECONDS = float(os.environ.get("LEDGERBATCH_RACE_SECONDS", "12"))
SEED = int(os.environ.get("LEDGERBATCH_RACE_SEED", "26"))
WORKERS = 3


@pytest.mark.parametrize("mode", ["append", "upsert", "changes", "aggregate"])
def test_live_replay_and_backfill_race_with_sigkills(mode, engine, db_url, make_pipe):
    # A replay or backfill can be a single poison record (offset 5 between [0, 5) and [6, 12)): min_bad lets
    # such a batch quarantine it instead of failing 1 of 1 over max_ratio, which would leave a gap forever.
    p = make_pipe(mode="upsert" if mode == "changes" else mode, deletes=mode == "changes", max_ratio=0.9,
                  max_records=9, min_bad=1)
    with engine.begin() as conn:
        init_cursors(conn, p.name, {(p.topic, part): START for part in range(PARTITIONS)})
    rng = random.Random(f"{SEED}-{mode}")
    deadline = time.monotonic() + SECONDS
    workers, kills, outputs = [], 0, []

    def spawn():
        seconds = max(0.5, deadline - time.monotonic())
        return subprocess.Popen([sys.executable, "-m", "tests.integration.racing", db_url, str(p.dir), p.name,
                                 str(rng.randrange(1 << 30)), f"{seconds:.2f}"], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(REPO / "plugins")})

    workers = [spawn() for _ in range(WORKERS)]
    while time.monotonic() < deadline - 1:
        time.sleep(rng.uniform(0.3, 1.5))
        victim = rng.randrange(WORKERS)
        if workers[victim].poll() is None:
            os.killpg(workers[victim].pid, signal.SIGKILL)
            workers[victim].communicate()
            kills += 1
            workers[victim] = spawn()
    for w in workers:
        out, err = w.communicate(timeout=120)
        assert w.returncode in (0, -9), err[-3000:]
        outputs.append(out.strip())

    with engine.connect() as conn:
        raced = dict(conn.execute(text(
            "SELECT kind || ' ' || status, count(*) FROM ledger.batches WHERE pipeline = :p GROUP BY 1"),
            {"p": p.name}).all())
    _finish(engine, p)
    assert verify(engine, p.spec) == []
    rows, bad = expected(p.spec.mode, p.spec.changes)
    got = target(engine, p)
    assert [r[:-1] for r in got] == [r[:-1] for r in rows]
    assert sorted((q[0], q[1]) for q in quarantine(engine, p)) == sorted(bad)
    print(f"\nrace {mode} seed={SEED} {SECONDS:g}s, {WORKERS} workers, {kills} SIGKILLs: batches {raced}; "
          f"workers said {outputs}")
    assert raced.get("live committed", 0) >= 2 and kills >= 2


def _finish(engine, p) -> None:
    """Deliver what the race left: resume or plan live batches to the end, backfill what lies before the
    start and nobody backfilled, then drop staging left by killed workers."""
    ends = {(p.topic, part): Watermarks(0, END) for part in range(PARTITIONS)}
    while (batch := plan_from(engine, p.spec, ends)) is not None:
        _stage_and_commit(engine, p, batch)
    for part in range(PARTITIONS):
        for lo, hi in _undelivered(engine, p, part, START):
            _stage_and_commit(engine, p, plan_replay(engine, p.spec, [OffsetRange(p.topic, part, lo, hi)]))
    drop_finished_staging(engine, p.name)


def _stage_and_commit(engine, p, batch) -> None:
    if batch.status != BatchStatus.STAGED:
        s = begin(engine, p, batch.batch_id)
        fill(engine, p, s, *staged_records(batch.ranges, p.spec.changes))
    commit_batch(engine, p.spec, batch.batch_id)


def _undelivered(engine, p, part: int, until: int) -> list[tuple[int, int]]:
    with engine.connect() as conn:
        ranges = conn.execute(text(
            "SELECT from_offset, until_offset FROM ledger.batch_ranges WHERE pipeline = :p AND partition = :part "
            "AND committed ORDER BY from_offset"), {"p": p.name, "part": part}).all()
    delivered = {o for lo, hi in ranges for o in range(lo, hi)}
    gaps, start = [], None
    for o in range(until + 1):
        if o < until and o not in delivered:
            start = o if start is None else start
        elif start is not None:
            gaps.append((start, o))
            start = None
    return gaps
