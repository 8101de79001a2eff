"""Spec versions on real parts: every batch records the version of the spec it was planned with (the text in
ledger.spec_versions); a batch resumed under another version fails loudly, and runs again once the spec is
restored."""
from __future__ import annotations

import pytest
import yaml
from sqlalchemy import text

from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.errors import SpecVersionError
from ledgerbatch.plan.live import plan_next
from ledgerbatch.stage.process import process_batch
from ledgerbatch.plan.replay import ReplayRequest, plan_replay, resolve_ranges
from ledgerbatch.ops.run import run_pipeline
from ledgerbatch.spec.pipeline import parse_spec

from .helpers import order_value, produce

pytestmark = pytest.mark.integration


def test_versions_are_canonical():
    doc = {"name": "x", "source": {"topics": ["t"], "schema": "a STRING"}, "target": {"table": "t"}}
    same = {"target": {"table": "t"}, "source": {"schema": "a STRING", "topics": ["t"]}, "name": "x"}
    assert parse_spec(doc).version == parse_spec(same).version
    assert parse_spec(doc).version != parse_spec({**doc, "batch": {"max_records": 5}}).version


def edit(p, **target):
    path = p.dir / f"{p.name}.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["target"].update(target)
    path.write_text(yaml.safe_dump(doc))


def test_a_resumed_batch_runs_with_its_version_or_fails_loudly(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=1)
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(5)])
    original = (p.dir / f"{p.name}.yaml").read_text()
    v1 = p.spec.version
    batch = plan_next(engine, p.spec, broker.bootstrap_servers)
    edit(p, evolve="additive")  # a new version while the batch is unfinished
    v2 = p.spec.version
    with pytest.raises(SpecVersionError, match=f"planned with spec version {v1}, but the spec is now version {v2}"):
        process_batch(spark, engine, p.spec, batch.batch_id, db_url, broker.bootstrap_servers)

    (p.dir / f"{p.name}.yaml").write_text(original)  # restored: the batch stages...
    process_batch(spark, engine, p.spec, batch.batch_id, db_url, broker.bootstrap_servers)
    edit(p, evolve="additive")  # ...and a commit under another version is refused, the batch stays staged
    with pytest.raises(SpecVersionError, match="Restore the spec"):
        commit_batch(engine, p.spec, batch.batch_id)
    with pytest.raises(SpecVersionError):
        run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark)
    (p.dir / f"{p.name}.yaml").write_text(original)
    assert run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark).records_read == 5

    # The next batch, and a replay, take the current version; every version's text is kept.
    edit(p, evolve="additive")
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(5, 8)])
    run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark)
    replay = plan_replay(engine, p.spec, resolve_ranges(p.spec, broker.bootstrap_servers,
                                                        ReplayRequest(p.topic, None, from_offset=0, until_offset=8)))
    process_batch(spark, engine, p.spec, replay.batch_id, db_url, broker.bootstrap_servers)
    commit_batch(engine, p.spec, replay.batch_id)
    with engine.connect() as conn:
        versions = [r.spec_version for r in conn.execute(text(
            "SELECT spec_version FROM ledger.batches WHERE pipeline = :p ORDER BY batch_id"), {"p": p.name})]
        kept = dict(conn.execute(text("SELECT version, spec_text FROM ledger.spec_versions WHERE pipeline = :p"),
                                 {"p": p.name}).all())
    assert versions == [v1, v2, v2]
    assert set(kept) == {v1, v2} and '"evolve": "additive"' in kept[v2] and '"evolve"' not in kept[v1]
