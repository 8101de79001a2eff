"""`ledgerbatch pause` / `resume` (ops/pause.py) against real Kafka: a paused pipeline finishes its open batch
and plans nothing new, says so in `run`, `status` and ledger.pipeline_progress, keeps its watcher quiet, and
delivers the rest once resumed; every pause is a row of ledger.pauses."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from ledgerbatch.airflow.triggers import pending
from ledgerbatch.model.ranges import Watermarks

from .helpers import assert_exactly_once, cli, order_value, produce

pytestmark = pytest.mark.integration


def test_a_paused_pipeline_finishes_its_open_batch_and_plans_nothing_new(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=2, batch__max_records=30)
    first = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(30)])
    planned = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir, LEDGERBATCH_CRASH_AT="after_plan")
    assert planned.returncode == -9, planned.stderr[-2000:]  # batch 1 is open: planned, never processed

    def ledgerbatch(*args: str):
        return cli(list(args), db_url, broker.bootstrap_servers, p.dir)

    paused = ledgerbatch("pause", p.name, "--by", "alice", "--reason", "INC-7: target maintenance")
    assert paused.returncode == 0, paused.stderr
    assert f"{p.name}: paused by alice (INC-7: target maintenance)" in paused.stdout
    again = ledgerbatch("pause", p.name, "--by", "bob", "--reason", "twice")
    assert again.returncode == 1 and f"{p.name} is already paused by alice since " in again.stderr
    later = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(30, 50)])

    run = ledgerbatch("run", p.name)  # the open batch finishes; nothing new is planned
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"{p.name}: 1 batches committed, 30 records read" in run.stdout
    assert "INC-7: target maintenance), nothing new is planned" in run.stderr
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ledger.batches WHERE pipeline = :p"), {"p": p.name}).scalar() == 1
        progress = conn.execute(text("SELECT paused_by, pause_reason, paused_at IS NOT NULL AS since "
                                     "FROM ledger.pipeline_progress WHERE pipeline = :p"), {"p": p.name}).one()
    assert tuple(progress) == ("alice", "INC-7: target maintenance", True)
    table = ledgerbatch("status", p.name)
    assert "  PAUSED by alice since " in table.stdout and ": INC-7: target maintenance (no new batch until " in table.stdout
    (report,) = json.loads(ledgerbatch("status", p.name, "--json").stdout)
    assert report["paused"]["by"] == "alice" and report["total_lag"] == 20

    # The watcher's look: 20 offsets wait, but a paused pipeline has nothing to fire for.
    ends = {(p.topic, 0): Watermarks(0, 25), (p.topic, 1): Watermarks(0, 25)}
    cursors = {(p.topic, 0): 15, (p.topic, 1): 15}
    assert not pending(p.spec, ends, cursors, None, paused=True).waiting
    assert pending(p.spec, ends, cursors, None).waiting

    resumed = ledgerbatch("resume", p.name, "--by", "bob")
    assert resumed.returncode == 0, resumed.stderr
    assert f"{p.name}: resumed by bob (it was paused by alice since " in resumed.stdout
    assert ledgerbatch("resume", p.name, "--by", "bob").stderr.strip().endswith(
        f"{p.name} is not paused: there is nothing to resume")
    assert ledgerbatch("run", p.name).returncode == 0
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in first + later}, set())
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT paused_by, reason, resumed_by, resumed_at > paused_at FROM ledger.pauses "
                                 "WHERE pipeline = :p"), {"p": p.name}).all()
    assert [tuple(r) for r in rows] == [("alice", "INC-7: target maintenance", "bob", True)]
    assert json.loads(ledgerbatch("status", p.name, "--json").stdout)[0]["paused"] is None


def test_pause_needs_who_and_why(db_url, broker, make_pipeline):
    p = make_pipeline(partitions=1)
    blank = cli(["pause", p.name, "--by", " ", "--reason", "x"], db_url, broker.bootstrap_servers, p.dir)
    assert blank.returncode == 1 and "say who pauses the pipeline (--by NAME)" in blank.stderr
    missing = cli(["pause", p.name, "--by", "alice"], db_url, broker.bootstrap_servers, p.dir)
    assert missing.returncode == 2 and "--reason" in missing.stderr
