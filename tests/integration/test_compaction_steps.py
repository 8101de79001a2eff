"""Compaction folds in bounded steps (issue #49): a commit into the target waits for one step, never for the
whole fold, and a compaction killed between steps leaves a ledger that `verify` finds clean, which the next
compaction folds to the end. A long history is made in SQL (as weeks of batches would leave it: committed
live batches of one-offset ranges whose records a transform filtered out, so the target holds no row)."""
from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.ops.history import compact
from ledgerbatch.ops.verify import verify

from .staged import staged_batch

pytestmark = pytest.mark.integration
CUT_OFF = timedelta(minutes=30)  # the history is an hour old


def history(engine, make_pipe, batches: int, ranges: int):
    """A pipeline with `batches` committed live batches of `ranges` ranges (one per partition) an hour old, and
    one more live batch staged to commit."""
    p = make_pipe()
    commit_batch(engine, p.spec, staged_batch(engine, p, {i: (0, 1) for i in range(ranges)},
                                              good=[(i, 0, f"o-{i}", "1.00") for i in range(ranges)]).batch_id)
    with engine.begin() as conn:
        conn.execute(text("""
          WITH b AS (INSERT INTO ledger.batches (pipeline, kind, status, staging_table, records_read, rows_written,
                                                 records_filtered, rows_quarantined, committed_at, created_at)
                     SELECT :p, 'live', 'committed', 'gone', :P, 0, :P, 0, now() - interval '1 hour',
                            now() - interval '1 hour'
                     FROM generate_series(1, :B) RETURNING batch_id),
               n AS (SELECT batch_id, row_number() OVER (ORDER BY batch_id) AS n FROM b)
          INSERT INTO ledger.batch_ranges (batch_id, pipeline, kind, topic, partition, from_offset, until_offset,
                                           records_read, committed)
          SELECT n.batch_id, :p, 'live', :t, part, n.n, n.n + 1, 1, true FROM n, generate_series(0, :P - 1) part"""),
                     {"p": p.name, "t": p.topic, "B": batches, "P": ranges})
        conn.execute(text("UPDATE ledger.batches SET committed_at = now() - interval '1 hour' WHERE pipeline = :p"),
                     {"p": p.name})
        conn.execute(text("UPDATE ledger.cursors SET next_offset = :B + 1, last_batch_id = (SELECT max(batch_id) "
                          "FROM ledger.batches WHERE pipeline = :p) WHERE pipeline = :p"), {"p": p.name, "B": batches})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE ledger.batches, ledger.batch_ranges"))  # as autovacuum would
    nxt = staged_batch(engine, p, {0: (batches + 1, batches + 2)}, good=[(0, batches + 1, "o-x", "1.00")])
    return p, nxt


def scalar(engine, sql: str, **params):
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def folded_through(engine, p) -> int:
    return scalar(engine, "SELECT coalesce(max(through_batch_id), 0) FROM ledger.compactions WHERE pipeline = :p",
                  p=p.name)


def violations(engine, p) -> list:
    with engine.connect() as conn:
        return conn.execute(text("SELECT invariant, problem FROM ledger.invariant_violations WHERE pipeline = :p"),
                            {"p": p.name}).all()


def in_background(fn):
    out: dict = {}

    def target():
        try:
            out["result"] = fn()
        except Exception as exc:  # noqa: BLE001 - the test reads it
            out["error"] = exc
    thread = threading.Thread(target=target)
    thread.start()
    return thread, out


def test_a_commit_waits_for_one_step_not_the_whole_fold(engine, make_pipe):
    p, nxt = history(engine, make_pipe, 6000, ranges=4)
    thread, out = in_background(lambda: compact(engine, p.spec, datetime.now(timezone.utc) - CUT_OFF,
                                                step_batches=150))
    while not folded_through(engine, p) and thread.is_alive():  # the first step has committed
        time.sleep(0.002)
    started = time.monotonic()
    commit_batch(engine, p.spec, nxt.batch_id)
    waited = time.monotonic() - started
    folding_on = thread.is_alive()
    thread.join()
    done = out["result"]
    assert done.batches == 6001 and done.steps == 41
    assert folding_on, "the commit waited for the whole fold"
    assert waited < 0.25 * done.seconds, f"a commit waited {waited:.3f}s of a {done.seconds:.3f}s fold"
    assert violations(engine, p) == [] and verify(engine, p.spec) == []
    assert scalar(engine, "SELECT count(*) FROM ledger.batches WHERE pipeline = :p", p=p.name) == 1  # the new one


def test_a_compaction_killed_between_steps_leaves_a_correct_ledger_and_the_next_one_finishes(engine, make_pipe):
    p, nxt = history(engine, make_pipe, 3000, ranges=2)
    commit_batch(engine, p.spec, nxt.batch_id)
    thread, out = in_background(lambda: compact(engine, p.spec, datetime.now(timezone.utc) - CUT_OFF,
                                                step_batches=50))
    killed = 0
    while not killed and thread.is_alive():  # a step's backend, holding the compaction's lock, after a step or more
        killed = scalar(engine, """
            SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l
            WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
              AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND (l.classid::bigint << 32 | l.objid::bigint) = hashtext('ledgerbatch:compact:' || :p)::bigint
              AND EXISTS (SELECT 1 FROM ledger.compactions WHERE pipeline = :p)""", p=p.name)
    thread.join()
    assert killed and "error" in out, "the compaction ended before a step was killed"
    through = folded_through(engine, p)
    left = scalar(engine, "SELECT count(*) FROM ledger.batches WHERE pipeline = :p", p=p.name)
    assert through > 0 and left > 1, (through, left)  # some steps folded, some did not
    assert violations(engine, p) == [] and verify(engine, p.spec) == []

    done = compact(engine, p.spec, datetime.now(timezone.utc) + timedelta(minutes=1), step_batches=50)
    assert done.batches == left and done.steps == -(-left // 50)
    assert scalar(engine, "SELECT count(*) FROM ledger.batches WHERE pipeline = :p", p=p.name) == 0
    assert scalar(engine, "SELECT batches FROM ledger.compactions WHERE pipeline = :p", p=p.name) == 3002
    assert violations(engine, p) == [] and verify(engine, p.spec) == []
