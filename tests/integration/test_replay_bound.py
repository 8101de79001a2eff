"""`ledgerbatch replay` keeps an append target within target.partitions.max, as run and the Airflow commit
task do: a replay big enough to be attached becomes a partition of its own. Spark's staging is the only
stand-in (process_batch stages the same rows by hand, tests/integration/staged.py)."""
from __future__ import annotations

from sqlalchemy import text

from ledgerbatch.commit.modes.rollup import bound_partitions
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.model.ranges import Watermarks
from ledgerbatch.ops import run as run_module
from ledgerbatch.ops.pause import pause_pipeline
from ledgerbatch.ops.verify import verify
from ledgerbatch.plan.replay import ReplayRequest
from ledgerbatch.source import kafka

from . import staged


def test_replays_keep_the_partition_bound(engine, db_url, tmp_path, monkeypatch):
    p = staged.Pipe(tmp_path)
    staged.respec(p, target={"partitions": {"max": 2, "attach_min_rows": 1}})
    monkeypatch.setattr(kafka, "watermarks", lambda servers, topics, options=None: {(p.topic, 0): Watermarks(0, 8)})

    def rows(lo, hi):
        return [(0, o, f"o{o}", "1.00") for o in range(lo, hi)]

    for lo in range(0, 8, 2):
        commit_batch(engine, p.spec, staged.staged_batch(engine, p, {0: (lo, lo + 2)}, rows(lo, lo + 2)).batch_id)
        bound_partitions(engine, p.spec)
    pause_pipeline(engine, p.spec, by="test", reason="only replays now")  # no live commit rolls up for them

    def process_by_hand(spark, engine_, spec, batch_id, url, servers):
        s = staged.begin(engine, p, batch_id)
        staged.fill(engine, p, s, [r for rg in staged.batch(engine, batch_id).ranges
                                   for r in rows(rg.from_offset, rg.until_offset)])
        return staged.batch(engine, batch_id)
    monkeypatch.setattr(run_module, "process_batch", process_by_hand)
    for lo in (0, 2, 4):
        out = run_module.run_replay(engine, p.spec, ReplayRequest(p.topic, (0,), lo, lo + 2), db_url, "stand-in:9092",
                                    spark_factory=lambda: None, dry_run=False)
        assert out.committed
        with engine.connect() as conn:
            partitions = conn.execute(text("SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass(:t)"),
                                      {"t": f'public."{p.table}"'}).scalar_one()
        assert partitions <= 2, f"replay [{lo}, {lo + 2}) left {partitions} partitions, over target.partitions.max 2"
    assert verify(engine, p.spec) == []
    assert [r[1] for r in staged.target(engine, p)] == list(range(8))
