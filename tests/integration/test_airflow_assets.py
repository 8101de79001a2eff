"""Assets on commit: the commit task's outlet is the target table's Asset, and only a batch committed now makes
an asset event, with the batch as its extra (dag.test() against real Spark, Apache Kafka and PostgreSQL)."""
from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from .helpers import order_value, produce
from .test_airflow import airflow_db, build, connections, states  # noqa: F401  (fixtures)

pytestmark = pytest.mark.integration


def asset_events(uri: str) -> list[dict]:
    """The extras of the AssetEvent rows of `uri`, oldest first, from Airflow's metadata database."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(select(AssetEvent.extra, AssetEvent.source_dag_id, AssetEvent.source_task_id)
                               .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
                               .where(AssetModel.uri == uri).order_by(AssetEvent.id)).all()
    return [{**extra, "_source": f"{dag_id}.{task_id}"} for extra, dag_id, task_id in rows]


def test_commit_publishes_the_target_asset_with_the_batch_only_when_committed_now(
        airflow_db, connections, engine, db_url, broker, make_pipeline, monkeypatch):
    from airflow.sdk import Asset
    from airflow.sdk.execution_time.context import OutletEventAccessors

    p = make_pipeline(partitions=2)
    produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(30)] + [(1, b"not json")])
    u = make_url(db_url)
    uri = f"postgres://{u.host}:{u.port}/{u.database}/public/{p.table}"
    dag = build(p, monkeypatch)[f"ledgerbatch_{p.name}"]
    commit = dag.get_task("commit")
    assert commit.outlets == [Asset(uri, group="ledgerbatch")]
    assert dag.get_task("plan").outlets == [] and dag.get_task("process").outlets == []

    run = dag.test()
    assert str(run.state) == "success", states(run)
    with engine.connect() as conn:
        batch = conn.execute(text("SELECT batch_id, records_read, rows_written, rows_quarantined FROM ledger.batches "
                                  "WHERE pipeline = :p"), {"p": p.name}).one()
    events = asset_events(uri)
    assert len(events) == 1, events
    extra = events[0]
    assert extra["_source"] == f"ledgerbatch_{p.name}.commit"
    assert (extra["batch_id"], extra["kind"], extra["pipeline"], extra["target"]) == (
        batch.batch_id, "live", p.name, f"public.{p.table}")
    assert sorted((r["topic"], r["partition"], r["from_offset"], r["until_offset"]) for r in extra["ranges"]) == [
        (p.topic, 0, 0, 15), (p.topic, 1, 0, 16)]
    assert (extra["records_read"], extra["rows_written"], extra["rows_quarantined"]) == (31, 30, 1) == (
        batch.records_read, batch.rows_written, batch.rows_quarantined)

    idle = dag.test()  # nothing new: plan short-circuits, commit is skipped, no event
    assert states(idle)["commit"] == "skipped", states(idle)
    assert len(asset_events(uri)) == 1

    # A retried commit of a batch that is already committed: no event from that try (its outlets are dropped).
    again = commit.prepare_for_execution()
    again.batch_id = str(batch.batch_id)
    outlet_events = OutletEventAccessors()
    assert f"batch {batch.batch_id} was already committed into" in again.execute({"outlet_events": outlet_events})
    assert again.outlets == [] and commit.outlets == [Asset(uri, group="ledgerbatch")]


def test_backfill_commit_publishes_through_its_alias_and_a_dry_run_publishes_nothing(
        airflow_db, connections, engine, db_url, broker, make_pipeline, monkeypatch):
    p = make_pipeline(partitions=1)
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(10)])
    u = make_url(db_url)
    uri = f"postgres://{u.host}:{u.port}/{u.database}/public/{p.table}"
    dags = build(p, monkeypatch)
    assert str(dags[f"ledgerbatch_{p.name}"].test().state) == "success"
    assert len(asset_events(uri)) == 1

    backfill = dags["ledgerbatch_backfill"]
    conf = {"pipeline": p.name, "from_offset": 2, "until_offset": 5}
    dry = backfill.test(run_conf={**conf, "dry_run": True})
    assert str(dry.state) == "success", states(dry)
    assert len(asset_events(uri)) == 1

    real = backfill.test(run_conf={**conf, "dry_run": False})
    assert str(real.state) == "success", states(real)
    events = asset_events(uri)
    assert len(events) == 2, events
    assert events[1]["_source"] == "ledgerbatch_backfill.commit"
    assert events[1]["kind"] == "replay" and events[1]["rows_written"] == 3
    assert events[1]["ranges"] == [{"topic": p.topic, "partition": 0, "from_offset": 2, "until_offset": 5}]
