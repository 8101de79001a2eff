"""The commit on its own, without the broker or Spark: staging tables filled by hand with plain INSERTs,
then commit_batch on the real PostgreSQL. Fencing, reconciliation, the no-op second commit, the
target modes, a replay and each crash point of the commit's one transaction."""
from __future__ import annotations

import re

import pytest
from sqlalchemy import text

from ledgerbatch.ledger.batches import mark_staged
from ledgerbatch.ledger.cursors import range_kind
from ledgerbatch.stage.tables import StagingTables
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.errors import FencedError, LedgerbatchError, ReconcileError
from ledgerbatch.model.ranges import OffsetRange
from ledgerbatch.model.batch import BatchKind, BatchStatus
from ledgerbatch.ops.verify import verify

from .staged import batch, begin, cursors, fill, plan, qrow, quarantine, row, staged_batch, staging_tables, target

pytestmark = pytest.mark.integration

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
        mark_staged(conn, first.batch_id, 1, first.staging, (OffsetRange(p.topic, 0, 0, 2),), {(p.topic, 0): (2, 0)})
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
    bad = StagingTables(s.staging).bad
    names = {"both": [s.staging, bad], "good rows": [s.staging], "bad records": [bad]}[dropped]
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
        assert range_kind(conn, p.name, replay_range) == BatchKind.REPLAY
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
