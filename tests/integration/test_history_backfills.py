"""Backfills across ledger compaction (issue #49), with batches staged by hand (no broker, no Spark): a
checkpoint keeps exactly the offsets compacted backfills delivered, so offsets no batch delivered stay
backfillable and are counted once; a change pipeline keeps its deletes while a backfill can come, so a backfill
gives the serial result; where the ledger forgot what it would need, the backfill is refused, saying why."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.ledger.compaction import backfill_gaps
from ledgerbatch.model.batch import BatchKind, RangeRefused
from ledgerbatch.model.ranges import OffsetRange, Watermarks
from ledgerbatch.ops.abandon import abandon_batch
from ledgerbatch.ops.history import compact
from ledgerbatch.ops.offsets import Target, set_offsets
from ledgerbatch.ops.verify import verify
from ledgerbatch.plan.replay import plan_replay

from .staged import REPO, batch, staged_batch

pytestmark = pytest.mark.integration

LATER = timedelta(minutes=1)


def later() -> datetime:
    return datetime.now(timezone.utc) + LATER


def rows(lo, hi, part=0):
    return [(part, o, f"o-{o}", "1.00") for o in range(lo, hi)]


def commit(engine, p, ranges, good, kind=BatchKind.LIVE) -> int:
    s = staged_batch(engine, p, ranges, good=good, kind=kind)
    commit_batch(engine, p.spec, s.batch_id)
    return s.batch_id


def kind_of(engine, p, lo, hi, part=0) -> BatchKind:
    """What the planner makes of [lo, hi) now; the planned batch is abandoned again (only a look)."""
    planned = plan_replay(engine, p.spec, [OffsetRange(p.topic, part, lo, hi)])
    abandon_batch(engine, p.spec, planned.batch_id, "test", "only a look")
    return planned.kind


def gaps(engine, p) -> list[OffsetRange]:
    with engine.connect() as conn:
        return backfill_gaps(conn, p.name)


def started_at(engine, p, offset: int) -> None:
    """The pipeline's cursor on partition 0 starts (and stands) at `offset`: nothing delivered live yet."""
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO ledger.cursors (pipeline, topic, partition, start_offset, next_offset) "
                          "VALUES (:p, :t, 0, :o, :o)"), {"p": p.name, "t": p.topic, "o": offset})


def q(engine, sql, **params):
    with engine.connect() as conn:
        return conn.execute(text(sql), params).all()


def keys(engine, p) -> list[str]:
    return [r[0] for r in q(engine, f'SELECT order_id FROM public."{p.table}" ORDER BY 1')]


def test_a_checkpoint_keeps_exactly_what_backfills_delivered(engine, make_pipe):
    p = make_pipe()
    commit(engine, p, {0: (1000, 1010)}, rows(1000, 1010))  # the pipeline starts at 1000
    commit(engine, p, {0: (0, 10)}, rows(0, 10), BatchKind.BACKFILL)
    commit(engine, p, {0: (10, 20)}, rows(10, 20), BatchKind.BACKFILL)  # adjacent: one range once folded
    commit(engine, p, {0: (100, 110)}, rows(100, 110), BatchKind.BACKFILL)
    staged = staged_batch(engine, p, {0: (500, 510)}, good=rows(500, 510), kind=BatchKind.BACKFILL)
    assert compact(engine, p.spec, later()).batches == 4  # the staged backfill stops the fold
    assert q(engine, "SELECT from_offset, until_offset, backfilled::text, backfilled_from FROM ledger.checkpoints "
                     "WHERE pipeline = :p", p=p.name) == [(1000, 1010, "{[0,20),[100,110)}", 0)]

    commit_batch(engine, p.spec, staged.batch_id)  # a backfill staged before the compaction still commits
    assert batch(engine, staged.batch_id).status == "committed"
    assert kind_of(engine, p, 600, 610) == BatchKind.BACKFILL  # the gap stays a gap
    assert kind_of(engine, p, 100, 110) == BatchKind.REPLAY  # what a folded backfill delivered is delivered
    assert kind_of(engine, p, 500, 510) == BatchKind.REPLAY  # counted once, not "20 of its 10 offsets"
    with pytest.raises(RangeRefused, match=r"5 of its 10 offsets were delivered"):
        kind_of(engine, p, 15, 25)
    commit(engine, p, {0: (700, 710)}, rows(700, 710), BatchKind.BACKFILL)  # after the compaction's time
    assert kind_of(engine, p, 700, 710) == BatchKind.REPLAY
    assert compact(engine, p.spec, later()).batches >= 2  # both late backfills fold
    assert q(engine, "SELECT backfilled::text FROM ledger.checkpoints WHERE pipeline = :p", p=p.name) == [
        ("{[0,20),[100,110),[500,510),[700,710)}",)]
    assert verify(engine, p.spec) == []
    assert gaps(engine, p) == [
        OffsetRange(p.topic, 0, 20, 100), OffsetRange(p.topic, 0, 110, 500), OffsetRange(p.topic, 0, 510, 700),
        OffsetRange(p.topic, 0, 710, 1000)]


def test_verify_finds_an_offset_delivered_twice_across_the_checkpoint(engine, make_pipe):
    p = make_pipe()
    commit(engine, p, {0: (1000, 1010)}, rows(1000, 1010))
    commit(engine, p, {0: (0, 10)}, rows(0, 10), BatchKind.BACKFILL)
    compact(engine, p.spec, later())
    late = commit(engine, p, {0: (500, 510)}, rows(500, 510), BatchKind.BACKFILL)
    assert verify(engine, p.spec) == []
    with engine.begin() as conn:  # as if a compacted backfill had delivered some of the late one's offsets
        conn.execute(text("UPDATE ledger.checkpoints SET backfilled = backfilled + '{[505,520)}' WHERE pipeline = :p"),
                     {"p": p.name})
    problems = verify(engine, p.spec)
    assert any(f"backfill batch {late} delivered [500, 510), which compacted batches delivered too ({{[505,510)}})"
               in problem for problem in problems), problems
    with engine.begin() as conn:  # and a target row outside every delivered offset is found again
        conn.execute(text("UPDATE ledger.checkpoints SET backfilled = '{[0,5)}' WHERE pipeline = :p"), {"p": p.name})
    assert any("target rows lie outside every committed range" in problem for problem in verify(engine, p.spec))


def test_a_change_pipeline_keeps_its_deletes_while_a_backfill_can_come(engine, make_pipe):
    p = make_pipe(mode="upsert", deletes=True)
    commit(engine, p, {0: (1000, 1002), 1: (500, 501)},
           [(0, 1000, "k-1", "10.00"), (0, 1001, "k-2", "20.00"), (1, 500, "k-3", "30.00")])
    commit(engine, p, {0: (1002, 1004)}, [(0, 1002, "k-1", None), (0, 1003, "k-3", None)])  # k-1, k-3 deleted
    done = compact(engine, p.spec, later())
    assert (done.batches, done.deletes, done.horizon) == (2, 0, True)  # kept: [0, 1000) and [0, 500) can come
    assert q(engine, f'SELECT order_id FROM ledger_deletes."{p.name}" ORDER BY 1') == [("k-1",), ("k-3",)]

    # older changes of the deleted keys: serially they lose to the deletes, in the same partition or not
    commit(engine, p, {0: (0, 2)}, [(0, 0, "k-1", "1.00"), (0, 1, "k-3", "3.00")], BatchKind.BACKFILL)
    commit(engine, p, {1: (0, 2)}, [(1, 0, "k-1", "1.00"), (1, 1, "k-4", "4.00")], BatchKind.BACKFILL)
    assert keys(engine, p) == ["k-2", "k-4"]
    assert verify(engine, p.spec) == []
    with pytest.raises(RangeRefused, match="the replay horizon is 1004"):  # replays: as before
        kind_of(engine, p, 1000, 1002)


def test_deletes_go_once_no_backfill_can_come_and_then_backfills_are_refused(engine, make_pipe):
    p = make_pipe(mode="upsert", deletes=True)
    commit(engine, p, {0: (1000, 1002)}, [(0, 1000, "k-1", "10.00"), (0, 1001, "k-2", "20.00")])
    commit(engine, p, {0: (1002, 1003)}, [(0, 1002, "k-1", None)])
    with engine.begin() as conn:  # the last plan saw Kafka's retention past the start: [0, 1000) is gone
        conn.execute(text("INSERT INTO ledger.end_offsets (pipeline, topic, partition, log_start, end_offset) "
                          "VALUES (:p, :t, 0, 1000, 1003)"), {"p": p.name, "t": p.topic})
    assert gaps(engine, p) == []
    assert compact(engine, p.spec, later()).deletes == 1
    with pytest.raises(RangeRefused, match=r"a backfill of them is refused: compaction forgot 1 deletes of this "
                                           r"change pipeline .* Load the older offsets into a new pipeline"):
        kind_of(engine, p, 0, 10)


def test_a_backfill_staged_before_deletes_were_forgotten_is_fenced_with_the_reason(engine, make_pipe):
    p = make_pipe(mode="upsert", deletes=True)
    commit(engine, p, {0: (1000, 1002)}, [(0, 1000, "k-1", "10.00"), (0, 1001, "k-1", None)])
    staged = staged_batch(engine, p, {0: (0, 1)}, good=[(0, 0, "k-1", "1.00")], kind=BatchKind.BACKFILL)
    assert compact(engine, p.spec, later()).deletes == 0  # the staged backfill is a gap: deletes kept
    with engine.begin() as conn:  # a ledger whose deletes were forgotten anyway (compacted before migration 015)
        conn.execute(text("UPDATE ledger.compactions SET deletes_folded = 1 WHERE pipeline = :p"), {"p": p.name})
        conn.execute(text(f'DELETE FROM ledger_deletes."{p.name}"'))
    with pytest.raises(LedgerbatchError, match=f"batch {staged.batch_id}: .* a backfill of them is refused"):
        commit_batch(engine, p.spec, staged.batch_id)
    assert keys(engine, p) == []


def test_an_aggregate_backfills_below_its_replay_horizon(engine, make_pipe):
    p = make_pipe(mode="aggregate")
    commit(engine, p, {0: (1000, 1003)}, [(0, 1000, "a", "1.00"), (0, 1001, "b", "2.00"), (0, 1002, "a", "3.00")])
    assert compact(engine, p.spec, later()).horizon
    commit(engine, p, {0: (0, 2)}, [(0, 0, "a", "10.00"), (0, 1, "c", "5.00")], BatchKind.BACKFILL)
    assert q(engine, f'SELECT order_id, n, amount::text FROM public."{p.table}" ORDER BY 1') == [
        ("a", 3, "14.00"), ("b", 1, "2.00"), ("c", 1, "5.00")]
    assert verify(engine, p.spec) == []


def test_a_move_back_over_offsets_a_compacted_backfill_delivered_is_refused(engine, make_pipe, monkeypatch):
    from ledgerbatch.source import kafka
    p = make_pipe()
    started_at(engine, p, 1000)  # started at 1000, nothing delivered live yet
    commit(engine, p, {0: (0, 10)}, rows(0, 10), BatchKind.BACKFILL)
    compact(engine, p.spec, later())
    monkeypatch.setattr(kafka, "watermarks", lambda *a, **k: {(p.topic, 0): Watermarks(0, 2000)})
    with pytest.raises(LedgerbatchError, match=r"back from 1000 to 5 would deliver 5 offsets"):
        set_offsets(engine, p.spec, "unused:9092", Target(offset=5), "test", "a look back")


def test_a_move_back_below_a_checkpoint_of_backfills_only_keeps_compaction_going(engine, make_pipe, monkeypatch):
    """Found by the review: a checkpoint holding only backfills has an empty live span [1000, 1000); moving the
    cursor back to 10 (nothing delivered between) and delivering [10, 1005) live made verify see a false
    overlap, and every later compaction fail on the checkpoint's own check (the ledger grew for good)."""
    from ledgerbatch.source import kafka
    p = make_pipe()
    started_at(engine, p, 1000)  # started at 1000, nothing delivered live yet
    commit(engine, p, {0: (0, 10)}, rows(0, 10), BatchKind.BACKFILL)
    compact(engine, p.spec, later())
    monkeypatch.setattr(kafka, "watermarks", lambda *a, **k: {(p.topic, 0): Watermarks(0, 2000)})
    set_offsets(engine, p.spec, "unused:9092", Target(offset=10), "test", "read [10, 1000) live after all")
    commit(engine, p, {0: (10, 1005)}, rows(10, 1005))
    assert verify(engine, p.spec) == []
    assert compact(engine, p.spec, later()).batches == 1
    assert q(engine, "SELECT from_offset, until_offset, backfilled::text FROM ledger.checkpoints WHERE pipeline = :p",
             p=p.name) == [(10, 1005, "{[0,10)}")]
    assert verify(engine, p.spec) == []


def test_a_staged_backfill_that_retention_passed_still_commits_without_resurrecting(engine, make_pipe):
    """Found by the review: once Kafka's retention passed a backfill already staged, its range was no gap any
    more, compaction forgot the deletes, and the staged backfill (whose records Kafka no longer has) was refused
    for good. Its range stays a gap until it commits: the deletes are kept, k1 stays deleted."""
    p = make_pipe(mode="upsert", deletes=True)
    started_at(engine, p, 10)  # started at 10
    commit(engine, p, {0: (10, 14)}, [(0, 10, "k1", "1.00"), (0, 11, "k1", None), (0, 12, "k2", "2.00"),
                                      (0, 13, "k3", "3.00")])
    backfill = staged_batch(engine, p, {0: (5, 10)}, kind=BatchKind.BACKFILL, good=[
        (0, 5, "k9", "5.00"), (0, 6, "k1", "6.00"), (0, 7, "k7", "7.00"), (0, 8, "k8", "8.00"), (0, 9, "k2", "9.00")])
    with engine.begin() as conn:  # retention passed it: what the next live plan records
        conn.execute(text("INSERT INTO ledger.end_offsets (pipeline, topic, partition, log_start, end_offset) "
                          "VALUES (:p, :t, 0, 12, 14) ON CONFLICT (pipeline, topic, partition) DO UPDATE "
                          "SET log_start = 12"), {"p": p.name, "t": p.topic})
    assert compact(engine, p.spec, later()).deletes == 0
    commit_batch(engine, p.spec, backfill.batch_id)
    assert sorted(r[0] for r in q(engine, f'SELECT order_id FROM public."{p.table}"')) == ["k2", "k3", "k7", "k8", "k9"]
    assert verify(engine, p.spec) == []


def test_migration_015_keeps_what_014_could_not_know_as_unknown(engine, make_pipe):
    p = make_pipe()
    commit(engine, p, {0: (1000, 1010)}, rows(1000, 1010))
    commit(engine, p, {0: (100, 110)}, rows(100, 110), BatchKind.BACKFILL)
    compact(engine, p.spec, later())
    commit(engine, p, {0: (500, 510)}, rows(500, 510), BatchKind.BACKFILL)
    with engine.begin() as conn:  # the checkpoint as migration 014 left it
        conn.execute(text("UPDATE ledger.checkpoints SET backfilled = '{}' WHERE pipeline = :p"), {"p": p.name})
        conn.exec_driver_sql((REPO / "sql/migrations/015_exact_backfills.sql").read_text())
    assert q(engine, "SELECT backfilled_unknown::text FROM ledger.checkpoints WHERE pipeline = :p", p=p.name) == [
        ("{[100,500),[510,1000)}",)]
    assert verify(engine, p.spec) == []
    assert kind_of(engine, p, 500, 510) == BatchKind.REPLAY  # the late backfill, known: counted once
    assert kind_of(engine, p, 600, 610) == BatchKind.REPLAY  # counted as delivered, as under 014
    assert kind_of(engine, p, 0, 100) == BatchKind.BACKFILL  # below backfilled_from: known undelivered
    with pytest.raises(RangeRefused, match=r"5 of its 10 offsets were compacted before the ledger kept exactly what "
                                           r"backfills delivered \(migration 015\)"):
        kind_of(engine, p, 95, 105)
