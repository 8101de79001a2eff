"""`ledgerbatch status` shows the upkeep (issue #49): an upkeep that gave way in another process (the follower)
is in the ledger (ledger.upkeep_failures, migration 018) until it works again, so `status` run from a shell and
ledger.pipeline_progress show what failed, when, why and how many times in a row; and status says where
compaction stops and which replays and backfills the upkeep abandoned. Batches staged by hand (staged.py)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import create_engine, text

from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.model.batch import BatchKind
from ledgerbatch.ops.history import upkeep
from ledgerbatch.ops.status import pipeline_status, render

from .staged import plan, respec, staged_batch

pytestmark = pytest.mark.integration


def pipe(make_pipe, compact_after: str):
    p = make_pipe()
    respec(p, history={"compact_after": compact_after})
    return p


def deliver(engine, p, lo: int) -> int:
    s = staged_batch(engine, p, {0: (lo, lo + 2)}, good=[(0, o, f"o-{o}", "1.00") for o in range(lo, lo + 2)])
    commit_batch(engine, p.spec, s.batch_id)
    return s.batch_id


def status_from_a_shell(db_url, p) -> dict:
    """`status` in another process: a new engine, nothing of the follower's memory."""
    shell = create_engine(db_url)
    try:
        return pipeline_status(shell, p.name, (p.topic,), None)
    finally:
        shell.dispose()


def progress(engine, p):
    with engine.connect() as conn:
        return conn.execute(text("SELECT upkeep_failing, upkeep_failure, upkeep_failed_at, upkeep_failures_in_a_row "
                                 "FROM ledger.pipeline_progress WHERE pipeline = :p"), {"p": p.name}).one()


def test_an_upkeep_failure_of_the_follower_shows_in_status_until_it_works_again(engine, db_url, make_pipe):
    p = pipe(make_pipe, "1s")
    deliver(engine, p, 0), deliver(engine, p, 2)
    timeout = create_engine(db_url, connect_args={"options": "-c statement_timeout=300"})
    stuck = engine.connect()  # another compaction, stuck: the follower's times out
    stuck.execute(text("SELECT pg_advisory_xact_lock(hashtext(:k))"), {"k": f"ledgerbatch:compact:{p.name}"})
    try:
        for _ in range(2):
            done = upkeep(timeout, p.spec, datetime.now(timezone.utc) + timedelta(minutes=1))
            assert done.gave_way == ("compaction",)
    finally:
        stuck.rollback(), stuck.close()
        timeout.dispose()

    status = status_from_a_shell(db_url, p)
    [failure] = status["upkeep_failures"]
    assert (failure["upkeep"], failure["failures_in_a_row"], failure["sqlstate"]) == ("compaction", 2, "57014")
    assert failure["reason"].startswith("OperationalError (SQLSTATE 57014): canceling statement due to statement")
    assert failure["first_failed_at"] <= failure["failed_at"]
    shown = render(status)
    assert "UPKEEP FAILING: compaction gave way 2 times in a row" in shown and "statement timeout" in shown
    row = progress(engine, p)
    assert (row.upkeep_failing, row.upkeep_failures_in_a_row) == ("compaction", 2)
    assert row.upkeep_failure == failure["reason"] and row.upkeep_failed_at is not None

    assert upkeep(engine, p.spec, datetime.now(timezone.utc) + timedelta(minutes=1)).compacted.batches == 2
    assert status_from_a_shell(db_url, p)["upkeep_failures"] == []
    assert "UPKEEP FAILING" not in render(status_from_a_shell(db_url, p))
    assert progress(engine, p).upkeep_failing is None


def test_status_says_where_compaction_stops_and_what_the_upkeep_abandoned(engine, db_url, make_pipe):
    p = pipe(make_pipe, "60s")
    deliver(engine, p, 0)
    stranded = plan(engine, p, {0: (0, 2)}, BatchKind.REPLAY)  # an interrupted `ledgerbatch replay`
    deliver(engine, p, 2)
    with engine.begin() as conn:
        conn.execute(text("UPDATE ledger.batches SET updated_at = now() - interval '1 hour', committed_at = CASE "
                          "WHEN committed_at IS NOT NULL THEN now() - interval '1 hour' END WHERE pipeline = :p"),
                     {"p": p.name})

    status = status_from_a_shell(db_url, p)
    stops = status["compaction_stops_at"]
    assert (stops["batch_id"], stops["kind"], stops["status"]) == (stranded, "replay", "planned")
    assert f"compaction stops at replay batch #{stranded} (planned at attempt 0, 1h ago)" in render(status)
    assert status["abandoned_by_upkeep"] == []

    done = upkeep(engine, p.spec)
    assert [s.batch_id for s in done.abandoned] == [stranded] and done.compacted.batches == 3
    status = status_from_a_shell(db_url, p)
    assert status["compaction_stops_at"] is None and status["abandoned_by_upkeep"] == []  # folded with the rest

    deliver(engine, p, 4)
    another = plan(engine, p, {0: (4, 6)}, BatchKind.REPLAY)
    deliver(engine, p, 6)
    with engine.begin() as conn:  # the replay is old, the live batches around it are not: nothing folds
        conn.execute(text("UPDATE ledger.batches SET updated_at = now() - interval '1 hour' WHERE batch_id = :b"),
                     {"b": another})
    done = upkeep(engine, p.spec)
    assert [s.batch_id for s in done.abandoned] == [another] and done.compacted.batches == 0
    status = status_from_a_shell(db_url, p)
    assert [b["batch_id"] for b in status["abandoned_by_upkeep"]] == [another]
    assert status["compaction_stops_at"] is None
    assert f"abandoned by the upkeep: replay batch #{another} (last worked on 1h ago): compaction folds past it" \
        in render(status)
