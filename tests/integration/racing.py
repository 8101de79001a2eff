"""Live batches, replays and backfills of one pipeline racing in several processes (test_racing.py).

A synthetic topic: record (partition, offset) is a pure function of its coordinates, so a worker stages
exactly what the executors would (staged.py's way: plain INSERTs, mark_staged) and the test knows the
source's latest state. Keys live in one partition each (as Kafka's keyed partitioning puts them), so
"the latest value of a key" is well defined. A worker loops over random actions until its deadline:
plan and commit the next live batch, or replay or backfill a random range; each attempt renews its
lease as process_batch does. The test SIGKILLs workers at random moments and starts new ones.

    python -m tests.integration.racing DB_URL PIPELINES_DIR PIPELINE SEED SECONDS
"""
from __future__ import annotations

import random
import sys
import time
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

PARTITIONS = 2
END = 60          # offsets per partition
START = 12        # the live cursors start here: [0, START) is for backfills
LEASE_S = 1.0     # short leases: a killed worker's attempt is taken over quickly


def record(partition: int, offset: int) -> tuple[str, str | None] | None:
    """(key, amount) of a record; amount None: a delete (change pipelines; a plain upsert or append
    pipeline reads it as a value of 0.00); None: a bad record."""
    if offset % 17 == 5:
        return None
    return f"p{partition}-k{offset % 7}", (None if offset % 11 == 3 else f"{offset % 9 + 1}.00")


def expected(mode: str, changes: bool) -> tuple[list[tuple], set[tuple[int, int]]]:
    """The target every delivery order must end in (as staged.target gives it), and the bad coordinates."""
    bad = {(p, o) for p in range(PARTITIONS) for o in range(END) if record(p, o) is None}
    good = [(p, o, *record(p, o)) for p in range(PARTITIONS) for o in range(END) if record(p, o) is not None]
    if mode == "append":
        return [(p, o, k, _amount(a), None) for p, o, k, a in good], bad
    if mode == "aggregate":
        groups: dict[str, list] = defaultdict(lambda: [0, Decimal(0)])
        for _, _, k, a in good:
            groups[k][0] += 1
            groups[k][1] += Decimal(_amount(a))
        return [(k, n, str(total), None) for k, (n, total) in sorted(groups.items())], bad
    latest = {}
    for p, o, k, a in sorted(good, key=lambda g: (g[0], g[1])):
        latest[k] = (p, o, k, a)
    rows = [(p, o, k, _amount(a), None) for p, o, k, a in latest.values() if not (changes and a is None)]
    return sorted(rows), bad


def _amount(a: str | None) -> str:
    return "0.00" if a is None else a


def staged_records(ranges, changes: bool) -> tuple[list[tuple], list[tuple]]:
    """The good rows (partition, offset, key, amount) and bad records (partition, offset, error) of ranges."""
    good, bad = [], []
    for r in ranges:
        for o in range(r.from_offset, r.until_offset):
            rec = record(r.partition, o)
            if rec is None:
                bad.append((r.partition, o, "invalid JSON"))
            else:
                good.append((r.partition, o, rec[0], rec[1] if changes else _amount(rec[1])))
    return good, bad


def worker(db_url: str, pipelines_dir: str, name: str, seed: int, seconds: float) -> None:
    from ledgerbatch.commit.modes import partitions
    from ledgerbatch.commit.transaction import commit_batch
    from ledgerbatch.errors import LedgerbatchError
    from ledgerbatch.ledger.batches import begin_attempt, get_batch
    from ledgerbatch.ledger.cursors import get_cursors
    from ledgerbatch.ledger.engine import make_engine
    from ledgerbatch.model.batch import BatchStatus
    from ledgerbatch.model.ranges import OffsetRange, Watermarks
    from ledgerbatch.plan.live import plan_from
    from ledgerbatch.plan.replay import plan_replay
    from ledgerbatch.spec.pipeline import load_spec
    from ledgerbatch.stage.lease import AttemptLease
    from ledgerbatch.stage.tables import StagingTables, staging_name

    from .staged import Staged, fill, output_schema, target_shape

    partitions.ATTACH_MIN_ROWS = 5  # big enough batches become partitions of an append target
    rng = random.Random(seed)
    engine = make_engine(db_url)
    p = _Pipe(Path(pipelines_dir), name, load_spec(Path(pipelines_dir), name))
    ends = {(p.topic, part): Watermarks(0, END) for part in range(PARTITIONS)}
    deadline = time.monotonic() + seconds
    done = defaultdict(int)
    while time.monotonic() < deadline:
        try:
            if rng.random() < 0.6:
                batch = plan_from(engine, p.spec, ends)
                if batch is None:
                    time.sleep(0.05)
                    continue
            else:
                with engine.connect() as conn:
                    cursors = get_cursors(conn, name)
                part = rng.randrange(PARTITIONS)
                high = cursors.get((p.topic, part), START)
                lo = rng.randrange(0, high)
                hi = rng.randrange(lo + 1, high + 1)
                batch = plan_replay(engine, p.spec, [OffsetRange(p.topic, part, lo, hi)])
            if batch.status != BatchStatus.STAGED:
                with engine.begin() as conn:
                    attempt = begin_attempt(conn, batch.batch_id, output_schema(p), LEASE_S)
                    if attempt is None:  # another worker stages it
                        continue
                    staging = staging_name(batch.batch_id, attempt)
                    StagingTables(staging).create(conn, target_shape(p), batch.batch_id)
                with AttemptLease(engine, batch.batch_id, attempt, every_s=LEASE_S / 4):
                    time.sleep(rng.uniform(0, 0.2))  # reading Kafka takes a while
                    with engine.connect() as conn:
                        planned = get_batch(conn, batch.batch_id)
                    good, bad = staged_records(planned.ranges, p.spec.changes)
                    fill(engine, p, Staged(batch.batch_id, attempt, staging), good, bad)
            result = commit_batch(engine, p.spec, batch.batch_id)
            done[f"{batch.kind} committed" if not result.already_committed else "already committed"] += 1
        except LedgerbatchError as exc:  # fenced, refused ranges, a replay racing the live cursor: all expected
            done[type(exc).__name__] += 1
    print(dict(done), flush=True)


class _Pipe:
    """What staged.py's helpers read of a Pipe, for a pipeline whose spec is already on disk."""

    def __init__(self, directory: Path, name: str, spec):
        self.dir, self.name, self.spec = directory, name, spec
        self.topic = spec.topics[0]
        self.table = spec.target_table


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
