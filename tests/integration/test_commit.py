"""The commit on its own, without the broker or Spark: staging tables filled by hand with plain INSERTs,
then commit_batch on the real PostgreSQL. Fencing, reconciliation, the no-op second commit, the
target modes, a replay and each crash point of the commit's one transaction."""
from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from ledgerbatch import ledger, tables
from ledgerbatch.commit import commit_batch
from ledgerbatch.errors import FencedError, LedgerbatchError, ReconcileError
from ledgerbatch.ranges import OffsetRange
from ledgerbatch.spec import load_spec
from ledgerbatch.states import BatchKind, BatchStatus
from ledgerbatch.verify import verify

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCHEMA = "order_id STRING, customer STRING, amount DECIMAL(12,2), ts TIMESTAMP"
_names = itertools.count()


# -- a pipeline without a broker, and batches staged by hand

class Pipe:
    """A uniquely named pipeline and target table; its spec is a YAML file (a child process loads it too)."""

    def __init__(self, directory: Path, mode: str = "append", max_ratio: float = 0.5, policy: str = "quarantine"):
        self.name = f"c{os.getpid()}_{next(_names)}"
        self.topic = f"t_{self.name}"
        self.table = f"target_{self.name}"
        self.dir = directory
        target = {"table": f"public.{self.table}", "mode": mode}
        if mode == "upsert":
            target["key"] = ["order_id"]
        doc = {"name": self.name, "source": {"topics": [self.topic], "format": "json", "schema": SCHEMA},
               "target": target, "errors": {"policy": policy, "max_ratio": max_ratio}}
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{self.name}.yaml").write_text(yaml.safe_dump(doc))
        self.spec = load_spec(directory, self.name)


@pytest.fixture
def make_pipe(tmp_path):
    def make(**kw) -> Pipe:
        return Pipe(tmp_path / "pipelines", **kw)
    return make


@dataclass(frozen=True)
class Staged:
    batch_id: int
    attempt: int
    staging: str


def plan(engine, p: Pipe, ranges: dict[int, tuple[int, int]], kind: BatchKind = BatchKind.LIVE) -> int:
    """A batch of explicit ranges {partition: (from, until)}; a live batch's cursors start at `from`
    when the pipeline has none yet."""
    offset_ranges = [OffsetRange(p.topic, part, lo, hi) for part, (lo, hi) in sorted(ranges.items())]
    with engine.begin() as conn:
        if kind == BatchKind.LIVE:
            ledger.init_cursors(conn, p.name, {r.topic_partition: r.from_offset for r in offset_ranges})
        return ledger.insert_batch(conn, p.name, kind, offset_ranges)


def begin(engine, p: Pipe, batch_id: int) -> Staged:
    """A new attempt with its (empty) staging tables, as process_batch starts one."""
    with engine.begin() as conn:
        attempt = ledger.begin_attempt(conn, batch_id)
        staging = tables.staging_name(batch_id, attempt)
        tables.create_staging(conn, p.spec, staging, batch_id)
    return Staged(batch_id, attempt, staging)


def fill(engine, p: Pipe, s: Staged, good: list[tuple], bad: list[tuple] = (),
         counts: dict[int, tuple[int, int]] | None = None) -> None:
    """Good rows (partition, offset, order_id, amount) and bad records (partition, offset, error) by
    plain INSERTs, then mark_staged with `counts` {partition: (rows incl. bad, bad)} (by default the
    true counts of what was inserted)."""
    with engine.begin() as conn:
        if good:
            conn.execute(text(
                f'INSERT INTO ledger_staging."{s.staging}" (order_id, customer, amount, ts, _topic, _partition, _offset, _batch_id) '
                "VALUES (:order_id, 'c', :amount, '2026-11-21T10:00:00Z', :topic, :partition, :offset, :batch_id)"),
                [{"order_id": oid, "amount": amount, "topic": p.topic, "partition": part, "offset": off,
                  "batch_id": s.batch_id} for part, off, oid, amount in good])
        if bad:
            conn.execute(text(
                f'INSERT INTO ledger_staging."{tables.bad_name(s.staging)}" (_topic, _partition, _offset, _error, _key, _value) '
                "VALUES (:topic, :partition, :offset, :error, :key, :value)"),
                [{"topic": p.topic, "partition": part, "offset": off, "error": error, "key": f"k{off}".encode(),
                  "value": b"\xff" + error.encode()} for part, off, error in bad])
        if counts is None:
            counts = {}
            for part, *_ in good:
                rows, nbad = counts.get(part, (0, 0))
                counts[part] = (rows + 1, nbad)
            for part, *_ in bad:
                rows, nbad = counts.get(part, (0, 0))
                counts[part] = (rows + 1, nbad + 1)
        batch = ledger.get_batch(conn, s.batch_id)
        ledger.mark_staged(conn, s.batch_id, s.attempt, s.staging, batch.ranges,
                           {(p.topic, part): c for part, c in counts.items()})


def staged_batch(engine, p: Pipe, ranges: dict[int, tuple[int, int]], good: list[tuple], bad: list[tuple] = (),
                 counts: dict[int, tuple[int, int]] | None = None, kind: BatchKind = BatchKind.LIVE) -> Staged:
    s = begin(engine, p, plan(engine, p, ranges, kind))
    fill(engine, p, s, good, bad, counts)
    return s


# -- what the database holds

def target(engine, p: Pipe) -> list[tuple] | None:
    """(partition, offset, order_id, amount, batch_id) of every target row; None when there is no target."""
    with engine.connect() as conn:
        if not tables.table_exists(conn, "public", p.table):
            return None
        return [(r._partition, r._offset, r.order_id, str(r.amount), r._batch_id) for r in conn.execute(text(
            f'SELECT * FROM public."{p.table}" ORDER BY _partition, _offset'))]


def quarantine(engine, p: Pipe) -> list[tuple]:
    with engine.connect() as conn:
        return [(r.partition, r.offset, r.batch_id, r.error, bytes(r.key), bytes(r.value)) for r in conn.execute(text(
            'SELECT partition, "offset", batch_id, error, key, value FROM ledger.quarantine WHERE pipeline = :p '
            'ORDER BY partition, "offset"'), {"p": p.name})]


def cursors(engine, p: Pipe) -> dict[int, int]:
    with engine.connect() as conn:
        return {part: offset for (_, part), offset in ledger.cursors(conn, p.name).items()}


def batch(engine, batch_id: int) -> ledger.Batch:
    with engine.connect() as conn:
        return ledger.get_batch(conn, batch_id)


def staging_tables(engine, batch_id: int) -> list[str]:
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'ledger_staging' AND tablename ~ :pattern ORDER BY 1"),
            {"pattern": f"^b{batch_id}_a\\d+(_bad)?$"}).scalars().all()


def row(part, off, oid, amount, batch_id):
    return (part, off, oid, amount, batch_id)


def qrow(part, off, batch_id, error):
    return (part, off, batch_id, error, f"k{off}".encode(), b"\xff" + error.encode())


# -- 1. the commit and the no-op second commit

def test_commit_moves_rows_advances_cursors_quarantines_and_second_commit_is_a_noop(engine, make_pipe):
    p = make_pipe()
    # partition 0: offsets 0..3, offset 2 bad; partition 1 starts at 10, offset 11 bad, 13 a gap (e.g. a marker)
    s = staged_batch(engine, p, {0: (0, 4), 1: (10, 14)},
                     good=[(0, 0, "o-0", "1.00"), (0, 1, "o-1", "2.00"), (0, 3, "o-3", "3.00"),
                           (1, 10, "o-10", "4.00"), (1, 12, "o-12", "5.00")],
                     bad=[(0, 2, "not valid JSON"), (1, 11, "field amount")])
    assert batch(engine, s.batch_id).status == BatchStatus.STAGED
    assert cursors(engine, p) == {0: 0, 1: 10}

    result = commit_batch(engine, p.spec, s.batch_id, attempt=s.attempt)
    assert (result.batch_id, result.already_committed, result.rows_written, result.rows_quarantined) == \
        (s.batch_id, False, 5, 2)
    b = s.batch_id
    expected_rows = [row(0, 0, "o-0", "1.00", b), row(0, 1, "o-1", "2.00", b), row(0, 3, "o-3", "3.00", b),
                     row(1, 10, "o-10", "4.00", b), row(1, 12, "o-12", "5.00", b)]
    expected_quarantine = [qrow(0, 2, b, "not valid JSON"), qrow(1, 11, b, "field amount")]
    assert target(engine, p) == expected_rows
    assert quarantine(engine, p) == expected_quarantine
    assert cursors(engine, p) == {0: 4, 1: 14}
    committed = batch(engine, b)
    assert (committed.status, committed.attempt, committed.records_read, committed.rows_written,
            committed.rows_quarantined) == (BatchStatus.COMMITTED, 1, 7, 5, 2)
    assert committed.range_counts == {(p.topic, 0): 4, (p.topic, 1): 3}
    assert staging_tables(engine, b) == []
    with engine.connect() as conn:
        ranges = conn.execute(text("SELECT partition, committed FROM ledger.batch_ranges WHERE batch_id = :b ORDER BY 1"),
                              {"b": b}).all()
        last = conn.execute(text("SELECT DISTINCT last_batch_id FROM ledger.cursors WHERE pipeline = :p"),
                            {"p": p.name}).scalars().all()
        committed_at = conn.execute(text("SELECT committed_at FROM ledger.batches WHERE batch_id = :b"), {"b": b}).scalar_one()
    assert [tuple(r) for r in ranges] == [(0, True), (1, True)]
    assert last == [b]
    assert verify(engine, p.spec) == []

    again = commit_batch(engine, p.spec, b)
    assert (again.already_committed, again.rows_written, again.rows_quarantined) == (True, 5, 2)
    again = commit_batch(engine, p.spec, b, attempt=s.attempt)
    assert again.already_committed
    assert target(engine, p) == expected_rows
    assert quarantine(engine, p) == expected_quarantine
    assert cursors(engine, p) == {0: 4, 1: 14}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT committed_at FROM ledger.batches WHERE batch_id = :b"), {"b": b}).scalar_one() == committed_at

    # The next live batch continues from the cursors and appends.
    s2 = staged_batch(engine, p, {0: (4, 6)}, good=[(0, 4, "o-4", "6.00"), (0, 5, "o-5", "7.00")])
    assert commit_batch(engine, p.spec, s2.batch_id).rows_written == 2
    assert target(engine, p) == expected_rows[:3] + [row(0, 4, "o-4", "6.00", s2.batch_id),
                                                     row(0, 5, "o-5", "7.00", s2.batch_id)] + expected_rows[3:]
    assert cursors(engine, p) == {0: 6, 1: 14}
    assert verify(engine, p.spec) == []


def test_commit_refuses_another_pipelines_batch_and_an_unstaged_one(engine, make_pipe):
    p, other = make_pipe(), make_pipe()
    s = staged_batch(engine, p, {0: (0, 1)}, good=[(0, 0, "o-0", "1.00")])
    with pytest.raises(LedgerbatchError, match=f"batch {s.batch_id} belongs to pipeline {p.name}, not {other.name}"):
        commit_batch(engine, other.spec, s.batch_id)
    planned = plan(engine, other, {0: (0, 1)})
    with pytest.raises(LedgerbatchError, match=f"batch {planned} is planned, not staged: process it first"):
        commit_batch(engine, other.spec, planned)
    assert batch(engine, s.batch_id).status == BatchStatus.STAGED
    assert batch(engine, planned).status == BatchStatus.PLANNED
    assert target(engine, p) is None and target(engine, other) is None


# -- 2. fencing

def test_cursor_moved_under_the_batch_is_fenced(engine, make_pipe):
    p = make_pipe()
    s = staged_batch(engine, p, {0: (0, 2), 1: (10, 12)},
                     good=[(0, 0, "o-0", "1.00"), (0, 1, "o-1", "1.00"), (1, 10, "o-10", "1.00")],
                     bad=[(1, 11, "field amount")])
    # Someone else moved partition 1 (checked after partition 0, whose move must roll back too).
    with engine.begin() as conn:
        conn.execute(text("UPDATE ledger.cursors SET next_offset = 11, last_batch_id = :b "
                          "WHERE pipeline = :p AND partition = 1"), {"b": s.batch_id, "p": p.name})
    with pytest.raises(FencedError, match=re.escape(
            f"batch {s.batch_id}: cursor of {p.topic}[1] is no longer at 10: fenced")):
        commit_batch(engine, p.spec, s.batch_id, attempt=s.attempt)
    assert cursors(engine, p) == {0: 0, 1: 11}
    assert target(engine, p) is None
    assert quarantine(engine, p) == []
    b = batch(engine, s.batch_id)
    assert (b.status, b.attempt, b.error) == (BatchStatus.STAGED, 1, None)  # fenced is not failed
    assert staging_tables(engine, s.batch_id) == [s.staging, f"{s.staging}_bad"]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ledger.batch_ranges WHERE batch_id = :b AND committed"),
                            {"b": s.batch_id}).scalar_one() == 0

    # Put back, the same staged attempt commits.
    with engine.begin() as conn:
        conn.execute(text("UPDATE ledger.cursors SET next_offset = 10, last_batch_id = NULL "
                          "WHERE pipeline = :p AND partition = 1"), {"p": p.name})
    assert commit_batch(engine, p.spec, s.batch_id, attempt=s.attempt).rows_written == 3
    assert cursors(engine, p) == {0: 2, 1: 12}
    assert [r[:2] for r in target(engine, p)] == [(0, 0), (0, 1), (1, 10)]
    assert [q[:3] for q in quarantine(engine, p)] == [(1, 11, s.batch_id)]
    assert verify(engine, p.spec) == []


def test_stale_attempt_is_fenced(engine, make_pipe):
    p = make_pipe()
    first = staged_batch(engine, p, {0: (0, 2)}, good=[(0, 0, "o-0", "1.00"), (0, 1, "o-1", "1.00")])

    # A newer attempt takes over while attempt 1 is staged.
    second = begin(engine, p, first.batch_id)
    assert second.attempt == 2
    with pytest.raises(LedgerbatchError, match=f"batch {first.batch_id} is planned, not staged"):
        commit_batch(engine, p.spec, first.batch_id, attempt=1)
    with engine.begin() as conn, pytest.raises(FencedError, match="no longer owns the batch"):  # attempt 1 cannot re-mark
        ledger.mark_staged(conn, first.batch_id, 1, first.staging, (OffsetRange(p.topic, 0, 0, 2),), {(p.topic, 0): (2, 0)})
    fill(engine, p, second, good=[(0, 0, "o-0", "2.00"), (0, 1, "o-1", "2.00")])

    with pytest.raises(FencedError, match=f"batch {first.batch_id}: attempt 1 is stale, attempt 2 owns the batch"):
        commit_batch(engine, p.spec, first.batch_id, attempt=1)
    assert target(engine, p) is None
    assert cursors(engine, p) == {0: 0}
    b = batch(engine, first.batch_id)
    assert (b.status, b.attempt, b.staging_table) == (BatchStatus.STAGED, 2, second.staging)

    # The owner commits its own rows; the stale attempt's tables go with the commit's clean-up.
    assert commit_batch(engine, p.spec, first.batch_id, attempt=2).rows_written == 2
    assert target(engine, p) == [row(0, 0, "o-0", "2.00", first.batch_id), row(0, 1, "o-1", "2.00", first.batch_id)]
    assert cursors(engine, p) == {0: 2}
    assert staging_tables(engine, first.batch_id) == []
    # Once committed, even the stale attempt sees the no-op.
    assert commit_batch(engine, p.spec, first.batch_id, attempt=1).already_committed
    assert verify(engine, p.spec) == []


# -- 3. reconciliation

def _counts(t):
    return f"Counts(records_read={t[0]}, rows_written={t[1]}, rows_quarantined={t[2]})"


RECONCILE_CASES = {
    # name: (spec overrides, ranges, good rows, bad records, counts recorded, message)
    "a row more than recorded": (
        {}, {0: (1, 4)}, [(0, 1, "x", "1.00"), (0, 2, "y", "1.00"), (0, 3, "z", "1.00")], [], {0: (2, 0)},
        f"staging table holds {_counts((3, 3, 0))} but the ledger recorded {_counts((2, 2, 0))}"),
    "a row less than recorded": (
        {}, {0: (1, 4)}, [(0, 1, "x", "1.00"), (0, 2, "y", "1.00")], [(0, 3, "bad")], {0: (3, 0)},
        f"staging table holds {_counts((3, 2, 1))} but the ledger recorded {_counts((3, 3, 0))}"),
    "a coordinate both good and bad": (
        {}, {0: (1, 5)}, [(0, 1, "x", "1.00"), (0, 2, "y", "1.00"), (0, 3, "z", "1.00")], [(0, 2, "bad")], {0: (4, 1)},
        "holds offsets both as rows and as bad records"),
    "counts per range disagree": (
        {}, {0: (1, 4), 1: (1, 4)}, [(0, 1, "x", "1.00"), (0, 2, "y", "1.00"), (1, 1, "z", "1.00")], [],
        {0: (1, 0), 1: (2, 0)},
        "{topic}[0]: 2 rows staged but 1 records read"),
    "errors.max_ratio exceeded": (
        {"max_ratio": 0.25}, {0: (1, 3)}, [(0, 1, "x", "1.00")], [(0, 2, "bad")], None,
        "1 of 2 records are bad (50.0%), more than errors.max_ratio 25.0%"),
    "errors.policy fail": (
        {"policy": "fail"}, {0: (1, 3)}, [(0, 1, "x", "1.00")], [(0, 2, "bad")], None,
        "1 of 2 records are bad and errors.policy is fail"),
}


@pytest.mark.parametrize("case", list(RECONCILE_CASES))
def test_reconciliation_failure_fails_the_batch_and_leaves_the_target(case, engine, make_pipe):
    overrides, ranges, good, bad, counts, message = RECONCILE_CASES[case]
    p = make_pipe(**overrides)
    first = staged_batch(engine, p, {0: (0, 1), 1: (0, 1)}, good=[(0, 0, "a", "1.00"), (1, 0, "b", "1.00")])
    commit_batch(engine, p.spec, first.batch_id)
    before = target(engine, p)

    s = staged_batch(engine, p, ranges, good, bad, counts)
    with pytest.raises(ReconcileError, match=re.escape(message.format(topic=p.topic))) as raised:
        commit_batch(engine, p.spec, s.batch_id, attempt=s.attempt)
    b = batch(engine, s.batch_id)
    assert (b.status, b.attempt, b.error) == (BatchStatus.FAILED, 1, str(raised.value))
    assert target(engine, p) == before == [row(0, 0, "a", "1.00", first.batch_id), row(1, 0, "b", "1.00", first.batch_id)]
    assert quarantine(engine, p) == []
    assert cursors(engine, p) == {0: 1, 1: 1}
    with pytest.raises(LedgerbatchError, match=f"batch {s.batch_id} is failed, not staged"):
        commit_batch(engine, p.spec, s.batch_id)


# -- 4. a missing staging table

@pytest.mark.parametrize("dropped", ["both", "good rows", "bad records"])
def test_missing_staging_table_fails_the_batch_and_a_new_attempt_commits(dropped, engine, make_pipe):
    p = make_pipe()
    s = staged_batch(engine, p, {0: (0, 2)}, good=[(0, 0, "o-0", "1.00")], bad=[(0, 1, "bad")])
    names = {"both": [s.staging, tables.bad_name(s.staging)], "good rows": [s.staging],
             "bad records": [tables.bad_name(s.staging)]}[dropped]
    with engine.begin() as conn:
        for name in names:
            conn.execute(text(f'DROP TABLE ledger_staging."{name}"'))
    with pytest.raises(ReconcileError, match=f"batch {s.batch_id}: staging table {s.staging} is missing"):
        commit_batch(engine, p.spec, s.batch_id)
    assert batch(engine, s.batch_id).status == BatchStatus.FAILED
    assert target(engine, p) is None
    assert cursors(engine, p) == {0: 0}

    # The next run stages it again under a new attempt; the commit drops what is left of attempt 1.
    again = begin(engine, p, s.batch_id)
    fill(engine, p, again, good=[(0, 0, "o-0", "1.00")], bad=[(0, 1, "bad")])
    assert commit_batch(engine, p.spec, s.batch_id, attempt=2).rows_written == 1
    assert target(engine, p) == [row(0, 0, "o-0", "1.00", s.batch_id)]
    assert quarantine(engine, p) == [qrow(0, 1, s.batch_id, "bad")]
    assert cursors(engine, p) == {0: 2}
    assert staging_tables(engine, s.batch_id) == []
    assert verify(engine, p.spec) == []


# -- 5. each crash point of the commit, in a child process

CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from ledgerbatch.commit import commit_batch
from ledgerbatch.db import make_engine
from ledgerbatch.spec import load_spec
engine = make_engine(sys.argv[2])
print(commit_batch(engine, load_spec(Path(sys.argv[3]), sys.argv[4]), int(sys.argv[5])), flush=True)
"""


def commit_in_child(db_url: str, p: Pipe, batch_id: int, **env) -> subprocess.CompletedProcess:
    """commit_batch in a child process in its own process group (a crash point kills the whole group)."""
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("LEDGERBATCH_CRASH_AT", "LEDGERBATCH_CRASH_PGID", "LEDGERBATCH_TERMINATE_AT")}
    return subprocess.run([sys.executable, "-c", CHILD, str(REPO / "plugins"), db_url, str(p.dir), p.name, str(batch_id)],
                          env={**full_env, **env}, cwd=REPO, capture_output=True, text=True, timeout=60,
                          start_new_session=True)


def _crash_batch(engine, p: Pipe) -> Staged:
    return staged_batch(engine, p, {0: (0, 3), 1: (0, 2)},
                        good=[(0, 0, "o-0", "1.00"), (0, 2, "o-2", "1.00"), (1, 0, "o-10", "1.00"), (1, 1, "o-11", "1.00")],
                        bad=[(0, 1, "bad")])


def _assert_committed_once(engine, p: Pipe, s: Staged) -> None:
    assert target(engine, p) == [row(0, 0, "o-0", "1.00", s.batch_id), row(0, 2, "o-2", "1.00", s.batch_id),
                                 row(1, 0, "o-10", "1.00", s.batch_id), row(1, 1, "o-11", "1.00", s.batch_id)]
    assert quarantine(engine, p) == [qrow(0, 1, s.batch_id, "bad")]
    assert cursors(engine, p) == {0: 3, 1: 2}
    assert batch(engine, s.batch_id).status == BatchStatus.COMMITTED
    assert staging_tables(engine, s.batch_id) == []
    assert verify(engine, p.spec) == []


def test_child_commit_without_faults(engine, db_url, make_pipe):
    p = make_pipe()
    s = _crash_batch(engine, p)
    done = commit_in_child(db_url, p, s.batch_id)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "already_committed=False, rows_written=4, rows_quarantined=1" in done.stdout
    _assert_committed_once(engine, p, s)


def test_sigkill_before_commit_rolls_back_and_the_retry_commits(engine, db_url, make_pipe):
    p = make_pipe()
    s = _crash_batch(engine, p)
    crashed = commit_in_child(db_url, p, s.batch_id, LEDGERBATCH_CRASH_AT="before_commit")
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert "fault injection: SIGKILL at before_commit" in crashed.stderr
    b = batch(engine, s.batch_id)
    assert (b.status, b.attempt) == (BatchStatus.STAGED, 1)
    assert cursors(engine, p) == {0: 0, 1: 0}
    assert target(engine, p) is None  # even the CREATE TABLE of the target rolled back
    assert quarantine(engine, p) == []
    assert staging_tables(engine, s.batch_id) == [s.staging, f"{s.staging}_bad"]

    result = commit_batch(engine, p.spec, s.batch_id)  # waits for the killed backend's locks
    assert (result.already_committed, result.rows_written, result.rows_quarantined) == (False, 4, 1)
    _assert_committed_once(engine, p, s)


def test_sigkill_after_commit_keeps_the_commit_and_the_retry_is_a_noop(engine, db_url, make_pipe):
    p = make_pipe()
    s = _crash_batch(engine, p)
    crashed = commit_in_child(db_url, p, s.batch_id, LEDGERBATCH_CRASH_AT="after_commit")
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert "fault injection: SIGKILL at after_commit" in crashed.stderr
    _assert_committed_once(engine, p, s)

    result = commit_batch(engine, p.spec, s.batch_id)
    assert (result.already_committed, result.rows_written, result.rows_quarantined) == (True, 4, 1)
    _assert_committed_once(engine, p, s)


def test_backend_terminated_inside_the_commit_then_the_retry_commits(engine, db_url, make_pipe):
    p = make_pipe()
    s = _crash_batch(engine, p)
    failed = commit_in_child(db_url, p, s.batch_id, LEDGERBATCH_TERMINATE_AT="before_commit")
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert "fault injection: pg_terminate_backend at before_commit" in failed.stderr
    assert "OperationalError" in failed.stderr
    b = batch(engine, s.batch_id)
    assert (b.status, b.attempt) == (BatchStatus.STAGED, 1)
    assert cursors(engine, p) == {0: 0, 1: 0}
    assert target(engine, p) is None
    assert quarantine(engine, p) == []
    assert staging_tables(engine, s.batch_id) == [s.staging, f"{s.staging}_bad"]

    again = commit_in_child(db_url, p, s.batch_id)
    assert again.returncode == 0, again.stderr[-2000:]
    _assert_committed_once(engine, p, s)
    assert commit_batch(engine, p.spec, s.batch_id).already_committed


# -- 6. upsert

def test_upsert_highest_offset_wins_and_a_later_batch_updates(engine, make_pipe):
    p = make_pipe(mode="upsert")
    # Inserted out of offset order: the offset decides, not the order rows reached staging.
    s1 = staged_batch(engine, p, {0: (0, 5)},
                      good=[(0, 3, "o-1", "3.00"), (0, 0, "o-1", "1.00"), (0, 1, "o-2", "2.00"), (0, 2, "o-1", "9.00")],
                      bad=[(0, 4, "missing order_id, part of the target key")])
    result = commit_batch(engine, p.spec, s1.batch_id)
    assert (result.rows_written, result.rows_quarantined) == (4, 1)
    assert target(engine, p) == [row(0, 1, "o-2", "2.00", s1.batch_id), row(0, 3, "o-1", "3.00", s1.batch_id)]
    assert quarantine(engine, p) == [qrow(0, 4, s1.batch_id, "missing order_id, part of the target key")]

    s2 = staged_batch(engine, p, {0: (5, 7)}, good=[(0, 5, "o-2", "5.00"), (0, 6, "o-3", "6.00")])
    commit_batch(engine, p.spec, s2.batch_id)
    assert target(engine, p) == [row(0, 3, "o-1", "3.00", s1.batch_id), row(0, 5, "o-2", "5.00", s2.batch_id),
                                 row(0, 6, "o-3", "6.00", s2.batch_id)]
    assert cursors(engine, p) == {0: 7}
    assert commit_batch(engine, p.spec, s2.batch_id).already_committed
    assert len(target(engine, p)) == 3
    assert verify(engine, p.spec) == []


# -- 7. replay

def test_replay_replaces_target_rows_and_quarantine_of_its_range(engine, make_pipe):
    p = make_pipe()
    live = staged_batch(engine, p, {0: (0, 5)},
                        good=[(0, 0, "o-0", "1.00"), (0, 1, "o-1", "1.00"), (0, 3, "o-3", "1.00"), (0, 4, "o-4", "1.00")],
                        bad=[(0, 2, "old rule")])
    commit_batch(engine, p.spec, live.batch_id)
    L = live.batch_id
    assert target(engine, p) == [row(0, 0, "o-0", "1.00", L), row(0, 1, "o-1", "1.00", L),
                                 row(0, 3, "o-3", "1.00", L), row(0, 4, "o-4", "1.00", L)]

    # Offsets [1, 3) again: offset 1 is now bad, offset 2 now good.
    replay_range = OffsetRange(p.topic, 0, 1, 3)
    with engine.connect() as conn:
        assert ledger.range_kind(conn, p.name, replay_range) == BatchKind.REPLAY
    s = staged_batch(engine, p, {0: (1, 3)}, good=[(0, 2, "o-2", "20.00")], bad=[(0, 1, "new rule")],
                     kind=BatchKind.REPLAY)
    assert batch(engine, s.batch_id).kind == BatchKind.REPLAY
    result = commit_batch(engine, p.spec, s.batch_id)
    assert (result.already_committed, result.rows_written, result.rows_quarantined) == (False, 1, 1)
    R = s.batch_id
    assert target(engine, p) == [row(0, 0, "o-0", "1.00", L), row(0, 2, "o-2", "20.00", R),
                                 row(0, 3, "o-3", "1.00", L), row(0, 4, "o-4", "1.00", L)]
    assert quarantine(engine, p) == [qrow(0, 1, R, "new rule")]
    assert cursors(engine, p) == {0: 5}  # a replay never moves the cursors
    assert batch(engine, R).status == BatchStatus.COMMITTED
    assert staging_tables(engine, R) == []
    assert commit_batch(engine, p.spec, R).already_committed
    assert len(target(engine, p)) == 4
    assert verify(engine, p.spec) == []
