"""Exactly-once under concurrency (issue #26), on PostgreSQL with batches staged by hand (staged.py): a
replay or backfill committed beside a live commit, replays of records that are now bad, a replay that
commits before a lower-numbered live batch, a batch over its error budget, a second runner beside a live
attempt, verify after a replay with a changed query, and two specs naming one target. Interleavings are
made deterministic by a session that parks the live commit before its COMMIT (staged.parked)."""
from __future__ import annotations

import threading
import time

import pytest
import yaml
from sqlalchemy import text

from ledgerbatch.commit.diff import staged_diff
from ledgerbatch.commit.target import lock_target
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.errors import ReconcileError, SpecError
from ledgerbatch.ledger.batches import begin_attempt, get_batch
from ledgerbatch.ledger.cursors import get_cursors
from ledgerbatch.model.batch import BatchKind, BatchStatus
from ledgerbatch.model.ranges import Watermarks
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.ops.verify import verify
from ledgerbatch.plan.live import plan_from
from ledgerbatch.spec.pipeline import load_spec
from ledgerbatch.stage.lease import LEASE_S, AttemptLease
from ledgerbatch.stage.process import process_batch
from ledgerbatch.stage.tables import StagingTables, staging_name

from .staged import (Staged, batch, begin, cursors, fill, parked, plan, qrow, quarantine, row, staged_batch,
                     start_commit_in_child, target, wait_for_lock_waiters)

pytestmark = pytest.mark.integration


def deletes(engine, p) -> list[tuple]:
    """(order_id, partition, offset, batch_id) of the change pipeline's deleted keys."""
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            f'SELECT order_id, _partition, _offset, _batch_id FROM ledger_deletes."{p.name}" ORDER BY order_id'))]


def commit_beside(engine, db_url, p, live: int, other: int) -> None:
    """Commit `live` and, while it is parked before its COMMIT, `other` (a replay or backfill); both in
    child processes. `other` must wait for the target (an advisory lock), not decide beside it."""
    with parked(engine, live):
        live_commit = start_commit_in_child(db_url, p, live)
        wait_for_lock_waiters(engine, 1)
        other_commit = start_commit_in_child(db_url, p, other)
        assert wait_for_lock_waiters(engine, 2)[-1] == "advisory"
    for child in (live_commit, other_commit):
        _, err = child.communicate(timeout=60)
        assert child.returncode == 0, err[-2000:]


# -- 1. change pipelines: a replay or backfill beside a live commit

@pytest.mark.parametrize("live_change", ["upsert", "delete"])
def test_a_change_replay_beside_a_live_commit_never_restores_an_older_value(live_change, engine, db_url, make_pipe):
    p = make_pipe(mode="upsert", deletes=True)
    first = staged_batch(engine, p, {0: (0, 100)}, good=[(0, 80, "k1", "1.00")])  # k1 = 'old' at 80
    commit_batch(engine, p.spec, first.batch_id)
    newer = "5.00" if live_change == "upsert" else None
    live = staged_batch(engine, p, {0: (100, 200)}, good=[(0, 150, "k1", newer)])  # k1 'new' (or deleted) at 150
    replay = staged_batch(engine, p, {0: (0, 100)}, good=[(0, 80, "k1", "1.00")], kind=BatchKind.REPLAY)
    commit_beside(engine, db_url, p, live.batch_id, replay.batch_id)
    if live_change == "upsert":
        assert target(engine, p) == [row(0, 150, "k1", "5.00", live.batch_id)]
        assert deletes(engine, p) == []
    else:
        assert target(engine, p) == []
        assert deletes(engine, p) == [("k1", 0, 150, live.batch_id)]
    assert verify(engine, p.spec) == []


def test_a_backfill_beside_a_live_commit_keeps_the_live_change(engine, db_url, make_pipe):
    p = make_pipe(mode="upsert", deletes=True)
    first = staged_batch(engine, p, {0: (100, 120)}, good=[(0, 110, "k9", "9.00")])  # the pipeline started at 100
    commit_batch(engine, p.spec, first.batch_id)
    live = staged_batch(engine, p, {0: (120, 200)}, good=[(0, 150, "k1", "5.00")])
    backfill = staged_batch(engine, p, {0: (0, 100)}, good=[(0, 80, "k1", "1.00")], kind=BatchKind.BACKFILL)
    commit_beside(engine, db_url, p, live.batch_id, backfill.batch_id)
    assert target(engine, p) == [row(0, 110, "k9", "9.00", first.batch_id), row(0, 150, "k1", "5.00", live.batch_id)]
    assert verify(engine, p.spec) == []


def test_first_commits_of_a_live_batch_and_a_backfill_create_the_target_once(engine, db_url, make_pipe):
    """Both would CREATE TABLE IF NOT EXISTS the new target at once (a UniqueViolation on pg_type)."""
    p = make_pipe(mode="append")
    live = staged_batch(engine, p, {0: (100, 102)}, good=[(0, 100, "o-100", "1.00"), (0, 101, "o-101", "1.00")])
    backfill = staged_batch(engine, p, {0: (0, 1)}, good=[(0, 0, "o-0", "1.00")], kind=BatchKind.BACKFILL)
    commit_beside(engine, db_url, p, live.batch_id, backfill.batch_id)
    assert target(engine, p) == [row(0, 0, "o-0", "1.00", backfill.batch_id), row(0, 100, "o-100", "1.00", live.batch_id),
                                 row(0, 101, "o-101", "1.00", live.batch_id)]
    assert verify(engine, p.spec) == []


# -- 3. an upsert replay of a record that is now bad (or filtered)

def test_an_upsert_replay_removes_the_row_of_a_record_that_is_now_bad(engine, make_pipe):
    p = make_pipe(mode="upsert", max_ratio=0.9)
    live = staged_batch(engine, p, {0: (0, 100)}, good=[(0, 30, "k1", "1.00"), (0, 80, "k1", "2.00"), (0, 50, "k2", "3.00")])
    commit_batch(engine, p.spec, live.batch_id)
    identical = staged_batch(engine, p, {0: (0, 100)}, kind=BatchKind.REPLAY,
                             good=[(0, 30, "k1", "1.00"), (0, 80, "k1", "2.00"), (0, 50, "k2", "3.00")])
    diff = staged_diff(engine, p.spec, identical.batch_id)
    assert (diff.added, diff.removed, diff.changed, diff.unchanged) == (0, 0, 0, 2)  # by key, not by coordinates
    commit_batch(engine, p.spec, identical.batch_id)
    replay = staged_batch(engine, p, {0: (0, 100)}, good=[(0, 30, "k1", "1.00"), (0, 80, "k1", "2.00")],
                          bad=[(0, 50, "field amount: now refused")], kind=BatchKind.REPLAY)
    diff = staged_diff(engine, p.spec, replay.batch_id)
    assert (diff.added, diff.removed, diff.changed, diff.unchanged, diff.quarantined) == (0, 1, 0, 1, 1)
    commit_batch(engine, p.spec, replay.batch_id)
    assert target(engine, p) == [row(0, 80, "k1", "2.00", replay.batch_id)]
    assert quarantine(engine, p) == [qrow(0, 50, replay.batch_id, "field amount: now refused")]
    assert verify(engine, p.spec) == []


def test_a_change_replay_removes_the_row_and_the_delete_of_records_that_are_now_bad(engine, make_pipe):
    p = make_pipe(mode="upsert", deletes=True, max_ratio=0.9)
    live = staged_batch(engine, p, {0: (0, 10)}, good=[(0, 1, "k1", "1.00"), (0, 2, "k2", "2.00"), (0, 3, "k2", None)])
    commit_batch(engine, p.spec, live.batch_id)
    assert (target(engine, p), deletes(engine, p)) == ([row(0, 1, "k1", "1.00", live.batch_id)], [("k2", 0, 3, live.batch_id)])
    replay = staged_batch(engine, p, {0: (0, 10)}, good=[(0, 2, "k2", "2.00")],
                          bad=[(0, 1, "now bad"), (0, 3, "now bad")], kind=BatchKind.REPLAY)
    commit_batch(engine, p.spec, replay.batch_id)
    assert target(engine, p) == [row(0, 2, "k2", "2.00", replay.batch_id)]
    assert deletes(engine, p) == []
    assert verify(engine, p.spec) == []


# -- 4. a small replay committed before a big, lower-numbered live batch (append partitions)

def test_a_big_live_batch_after_a_small_replay_of_a_higher_id_is_copied_not_attached(engine, make_pipe, monkeypatch):
    monkeypatch.setattr("ledgerbatch.commit.modes.partitions.ATTACH_MIN_ROWS", 3)
    p = make_pipe(mode="append")
    first = staged_batch(engine, p, {0: (0, 3)}, good=[(0, i, f"o-{i}", "1.00") for i in range(3)])
    commit_batch(engine, p.spec, first.batch_id)  # attached: the open partition [first, MAXVALUE)
    live = staged_batch(engine, p, {0: (3, 7)}, good=[(0, i, f"o-{i}", "1.00") for i in range(3, 7)])
    replay = staged_batch(engine, p, {0: (0, 1)}, good=[(0, 0, "o-0", "2.00")], kind=BatchKind.REPLAY)
    commit_batch(engine, p.spec, replay.batch_id)  # small: copied into the open partition, above live's id
    assert commit_batch(engine, p.spec, live.batch_id).rows_written == 4  # closing at live's id would refuse it
    assert len(target(engine, p)) == 7
    assert cursors(engine, p) == {0: 7}
    assert verify(engine, p.spec) == []


# -- 5. no single batch boundary wedges a pipeline

def test_a_lone_bad_record_over_the_error_budget_is_planned_again_with_what_arrived(engine, make_pipe):
    p = make_pipe(mode="append", max_ratio=0.05)
    first = staged_batch(engine, p, {0: (0, 100)}, good=[(0, i, f"o-{i}", "1.00") for i in range(100)])
    commit_batch(engine, p.spec, first.batch_id)
    lone = plan_from(engine, p.spec, {(p.topic, 0): Watermarks(0, 101)})
    fill(engine, p, begin(engine, p, lone.batch_id), good=[], bad=[(0, 100, "invalid JSON")])
    with pytest.raises(ReconcileError, match="1 of 1 records are bad"):
        commit_batch(engine, p.spec, lone.batch_id)
    assert batch(engine, lone.batch_id).status == BatchStatus.FAILED
    # Nothing new: the same offsets, planned again (a new batch), still over the budget.
    again = plan_from(engine, p.spec, {(p.topic, 0): Watermarks(0, 101)})
    assert again.batch_id != lone.batch_id and [(r.from_offset, r.until_offset) for r in again.ranges] == [(100, 101)]
    assert batch(engine, lone.batch_id).status == BatchStatus.ABANDONED
    fill(engine, p, begin(engine, p, again.batch_id), good=[], bad=[(0, 100, "invalid JSON")])
    with pytest.raises(ReconcileError):
        commit_batch(engine, p.spec, again.batch_id)
    # 500 good records later the bad one is 1 of 501: the pipeline moves on.
    wider = plan_from(engine, p.spec, {(p.topic, 0): Watermarks(0, 601)})
    assert [(r.from_offset, r.until_offset) for r in wider.ranges] == [(100, 601)]
    fill(engine, p, begin(engine, p, wider.batch_id), good=[(0, i, f"o-{i}", "1.00") for i in range(101, 601)],
         bad=[(0, 100, "invalid JSON")])
    commit_batch(engine, p.spec, wider.batch_id)
    assert cursors(engine, p) == {0: 601}
    assert verify(engine, p.spec) == []


def test_policy_fail_is_resumed_with_its_ranges_not_planned_again(engine, make_pipe):
    p = make_pipe(mode="append", policy="fail")
    s = staged_batch(engine, p, {0: (0, 2)}, good=[(0, 0, "o-0", "1.00")], bad=[(0, 1, "bad")])
    with pytest.raises(ReconcileError, match="errors.policy is fail"):
        commit_batch(engine, p.spec, s.batch_id)
    assert plan_from(engine, p.spec, {(p.topic, 0): Watermarks(0, 50)}).batch_id == s.batch_id


# -- 7. a second runner waits for a live attempt instead of fencing it

def test_a_second_runner_waits_for_the_attempt_being_staged_and_then_commits_it(engine, db_url, make_pipe):
    p = make_pipe(mode="append")
    batch_id = plan(engine, p, {0: (0, 2)})
    with engine.begin() as conn:
        holder = begin_attempt(conn, batch_id, None, LEASE_S)  # another runner's attempt 1, under a lease
    staging = staging_name(batch_id, holder)
    outcome = {}

    def second_runner():  # process_batch needs no Spark before it has an attempt of its own
        outcome["batch"] = process_batch(None, engine, p.spec, batch_id, db_url, "127.0.0.1:9")

    with AttemptLease(engine, batch_id, holder, every_s=0.5):
        runner = threading.Thread(target=second_runner)
        runner.start()
        runner.join(3)
        assert runner.is_alive(), outcome  # waiting, not fencing the live attempt
        with engine.connect() as conn:
            assert get_batch(conn, batch_id).attempt == holder
        with engine.begin() as conn:  # the holder stages its attempt
            StagingTables(staging).create(conn, BatchShape.of_spec(p.spec), batch_id)
        fill(engine, p, Staged(batch_id, holder, staging), good=[(0, 0, "o-0", "1.00"), (0, 1, "o-1", "1.00")])
    runner.join(30)
    assert not runner.is_alive()
    assert (outcome["batch"].status, outcome["batch"].attempt) == (BatchStatus.STAGED, holder)
    assert commit_batch(engine, p.spec, batch_id, outcome["batch"].attempt).rows_written == 2
    assert verify(engine, p.spec) == []


def test_an_attempt_whose_lease_lapsed_is_taken_over(engine, make_pipe):
    p = make_pipe(mode="append")
    batch_id = plan(engine, p, {0: (0, 2)})
    with engine.begin() as conn:
        assert begin_attempt(conn, batch_id, None, LEASE_S) == 1
        assert begin_attempt(conn, batch_id, None, LEASE_S) is None  # held
        conn.execute(text("UPDATE ledger.batches SET heartbeat_at = now() - interval '1 minute' WHERE batch_id = :b"),
                     {"b": batch_id})
        assert begin_attempt(conn, batch_id, None, LEASE_S) == 2  # a frozen or dead runner's attempt


# -- lesser: verify after a replay with a changed query; two specs on one target

def test_verify_counts_what_a_replay_with_a_changed_query_kept(engine, make_pipe):
    p = make_pipe(mode="append", query="SELECT * FROM batch WHERE amount > 0")
    amounts = {i: i % 10 for i in range(100)}
    kept = [(0, i, f"o-{i}", f"{a}.00") for i, a in amounts.items() if a > 0]
    live = staged_batch(engine, p, {0: (0, 100)}, good=kept, counts={0: (100, 0)}, filtered=100 - len(kept))
    commit_batch(engine, p.spec, live.batch_id)
    assert verify(engine, p.spec) == []
    # the replay runs a stricter query (the spec's transform changed): fewer rows
    kept = [(0, i, f"o-{i}", f"{a}.00") for i, a in amounts.items() if a > 5]
    replay = staged_batch(engine, p, {0: (0, 100)}, good=kept, counts={0: (100, 0)}, filtered=100 - len(kept),
                          kind=BatchKind.REPLAY)
    commit_batch(engine, p.spec, replay.batch_id)
    assert len(target(engine, p)) == 40
    assert verify(engine, p.spec) == []


def test_two_specs_may_not_name_one_target(make_pipe):
    p = make_pipe(mode="append")
    doc = yaml.safe_load((p.dir / f"{p.name}.yaml").read_text())
    doc["name"] = f"{p.name}_twin"
    (p.dir / f"{p.name}_twin.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match=f"pipelines {p.name} and {p.name}_twin both write public.{p.table}"):
        load_spec(p.dir, p.name)


def test_a_topic_removed_from_the_spec_keeps_its_cursors_and_blocks_nothing(engine, make_pipe):
    p = make_pipe(mode="append")
    s = staged_batch(engine, p, {0: (0, 1)}, good=[(0, 0, "o-0", "1.00")])
    commit_batch(engine, p.spec, s.batch_id)
    doc = yaml.safe_load((p.dir / f"{p.name}.yaml").read_text())
    doc["source"]["topics"] = [f"{p.topic}_v2"]
    (p.dir / f"{p.name}.yaml").write_text(yaml.safe_dump(doc))
    retired = load_spec(p.dir, p.name)
    planned = plan_from(engine, retired, {(f"{p.topic}_v2", 0): Watermarks(0, 5)})
    assert [(r.topic, r.from_offset, r.until_offset) for r in planned.ranges] == [(f"{p.topic}_v2", 0, 5)]
    with engine.connect() as conn:  # the retired topic's cursor stays in the ledger
        assert get_cursors(conn, p.name) == {(p.topic, 0): 1, (f"{p.topic}_v2", 0): 0}



def test_a_commit_says_how_long_it_waited_for_the_targets_lock(engine, make_pipe):
    p = make_pipe(mode="append")
    s = staged_batch(engine, p, {0: (0, 1)}, good=[(0, 0, "o-0", "1.00")])
    outcome = {}
    with engine.connect() as holder:
        with holder.begin():  # another commit into the target (or a step of the upkeep) holds its lock
            lock_target(holder, p.spec)
            committer = threading.Thread(target=lambda: outcome.update(r=commit_batch(engine, p.spec, s.batch_id)))
            committer.start()
            deadline = time.monotonic() + 30
            while not waiting_for_a_lock(engine) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.5)  # held 0.5 s more once the commit waits for it
    committer.join(30)
    result = outcome["r"]
    assert 0.5 <= result.waited < result.seconds, result


def waiting_for_a_lock(engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                                 "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                                 )).scalar_one() > 0
