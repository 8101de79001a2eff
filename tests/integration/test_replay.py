"""Replay and backfill on real parts: exactly the requested coordinates change, the live cursors never move."""
from __future__ import annotations

import pytest
import yaml
from sqlalchemy import text

from ledgerbatch.ledger.batches import get_batch
from ledgerbatch.ledger.cursors import get_cursors
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.stage.process import process_batch
from ledgerbatch.plan.replay import ReplayRequest, plan_replay, resolve_ranges
from ledgerbatch.commit.diff import dry_run_diff
from ledgerbatch.ops.run import run_pipeline
from ledgerbatch.ops.verify import verify

from .helpers import order_value, produce

pytestmark = pytest.mark.integration


def rows(engine, p):
    with engine.connect() as conn:
        return {(r._partition, r._offset): (r.customer, r._batch_id) for r in
                conn.execute(text(f'SELECT _partition, _offset, customer, _batch_id FROM public."{p.table}"'))}


def set_transform(p, transform):
    path = p.dir / f"{p.name}.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["transform"] = transform
    path.write_text(yaml.safe_dump(doc))


def replay(engine, db_url, broker, spark, p, request, dry_run=False):
    batch = plan_replay(engine, p.spec, resolve_ranges(p.spec, broker.bootstrap_servers, request))
    process_batch(spark, engine, p.spec, batch.batch_id, db_url, broker.bootstrap_servers)
    if dry_run:
        return batch, dry_run_diff(engine, p.spec, batch.batch_id)
    return batch, commit_batch(engine, p.spec, batch.batch_id)


def test_replay_after_transform_change_replaces_exactly_the_range(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=2)
    produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i) if i != 4 else b"bad") for i in range(20)])
    run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark)
    before = rows(engine, p)
    with engine.connect() as conn:
        cursors = get_cursors(conn, p.name)

    set_transform(p, {"customer": "upper(customer)"})
    request = ReplayRequest(p.topic, (0,), from_offset=1, until_offset=5)  # partition 0 offsets 1..4 (offset 2 is bad)
    batch, diff = replay(engine, db_url, broker, spark, p, request, dry_run=True)
    assert batch.kind == "replay"
    assert (diff.added, diff.removed, diff.changed, diff.unchanged, diff.quarantined) == (0, 0, 3, 0, 1)
    assert rows(engine, p) == before  # a dry run changes nothing
    with engine.connect() as conn:
        assert get_batch(conn, batch.batch_id).status == "abandoned"

    batch, result = replay(engine, db_url, broker, spark, p, request)
    assert (result.rows_written, result.rows_quarantined) == (3, 1)
    after = rows(engine, p)
    changed = {k for k in before if before[k] != after.get(k)}
    assert changed == {(0, 1), (0, 3), (0, 4)}
    assert all(after[k] == (before[k][0].upper(), batch.batch_id) for k in changed)
    with engine.connect() as conn:
        assert get_cursors(conn, p.name) == cursors
        quarantined = conn.execute(text('SELECT "offset", batch_id FROM ledger.quarantine WHERE pipeline = :p'), {"p": p.name}).all()
    assert [(q.offset, q.batch_id) for q in quarantined] == [(2, batch.batch_id)]
    assert verify(engine, p.spec) == []

    with pytest.raises(LedgerbatchError, match="until 50 is past the log end 10"):
        resolve_ranges(p.spec, broker.bootstrap_servers, ReplayRequest(p.topic, (1,), from_offset=5, until_offset=50))
    more = produce(broker.bootstrap_servers, p.topic, [(1, order_value(100))])
    with pytest.raises(LedgerbatchError, match="neither fully delivered"):  # not delivered yet: replaying would duplicate it
        plan_replay(engine, p.spec, resolve_ranges(p.spec, broker.bootstrap_servers,
                                                   ReplayRequest(p.topic, (1,), from_offset=more[0][1], until_offset=more[0][1] + 1)))


def test_backfill_before_a_latest_start(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=1, source__start="latest")
    history = produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(10)])
    assert run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark).batches == 0
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(10, 15)])
    assert run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark).records_read == 5

    batch, result = replay(engine, db_url, broker, spark, p, ReplayRequest(p.topic, None, from_offset=0, until_offset=10))
    assert batch.kind == "backfill" and result.rows_written == 10
    assert set(rows(engine, p)) == {(0, o) for o in range(15)}
    with engine.connect() as conn:
        assert get_cursors(conn, p.name) == {(p.topic, 0): 15}
    assert verify(engine, p.spec) == []
    # The same offsets again are now a replay, not a second backfill.
    batch, _ = replay(engine, db_url, broker, spark, p, ReplayRequest(p.topic, None, from_offset=0, until_offset=10))
    assert batch.kind == "replay" and len(rows(engine, p)) == 15
    assert history[0][1] == 0


def test_bad_replay_requests(engine, broker, make_pipeline):
    p = make_pipeline(partitions=1)
    with pytest.raises(LedgerbatchError, match="not both or neither"):
        ReplayRequest(p.topic, None)
    with pytest.raises(LedgerbatchError, match="0 <= from < until"):
        ReplayRequest(p.topic, None, from_offset=5, until_offset=5)
    with pytest.raises(LedgerbatchError, match="is not a source"):
        resolve_ranges(p.spec, broker.bootstrap_servers, ReplayRequest("other", None, from_offset=0, until_offset=1))
    with pytest.raises(LedgerbatchError, match=r"no partition\(s\) \[7\]"):
        resolve_ranges(p.spec, broker.bootstrap_servers, ReplayRequest(p.topic, (7,), from_offset=0, until_offset=1))
