"""Every path that commits keeps an append target within target.partitions.max (issue #49): besides `run`,
`ledgerbatch replay` (test_replay_bound.py) and the Airflow commit task (test_upkeep_gives_way.py),
`acknowledge-loss`, which commits the staged live batch before it records what Kafka lost. Batches staged by
hand (staged.py); Kafka's watermarks are a stand-in."""
from __future__ import annotations

from sqlalchemy import text

from ledgerbatch.commit.modes.rollup import bound_partitions
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.model.ranges import Watermarks
from ledgerbatch.ops.loss import acknowledge_loss
from ledgerbatch.ops.verify import verify
from ledgerbatch.source import kafka

from . import staged


def partitions(engine, p) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass(:t)"),
                            {"t": f'public."{p.table}"'}).scalar_one()


def test_acknowledge_loss_commits_the_staged_batch_within_the_bound(engine, make_pipe, monkeypatch):
    p = make_pipe()
    staged.respec(p, target={"partitions": {"max": 2, "attach_min_rows": 1}})

    def rows(lo, hi):
        return [(0, o, f"o{o}", "1.00") for o in range(lo, hi)]

    for lo in range(0, 6, 2):
        commit_batch(engine, p.spec, staged.staged_batch(engine, p, {0: (lo, lo + 2)}, rows(lo, lo + 2)).batch_id)
        bound_partitions(engine, p.spec)
    staged.staged_batch(engine, p, {0: (6, 10)}, rows(6, 10))  # staged, then retention passed the cursor
    monkeypatch.setattr(kafka, "watermarks", lambda servers, topics, options=None: {(p.topic, 0): Watermarks(12, 20)})

    lost = acknowledge_loss(engine, p.spec, "stand-in:9092", by="test", reason="retention")
    assert [(r.from_offset, r.until_offset) for r in lost] == [(10, 12)]  # the staged batch's offsets were kept
    assert partitions(engine, p) <= 2, "acknowledge-loss left the target over target.partitions.max"
    assert verify(engine, p.spec) == []
    assert [r[1] for r in staged.target(engine, p)] == list(range(10))
