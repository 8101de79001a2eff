"""Robust DAG loading: a spec Airflow cannot use is left out alone, with its reason; the other DAGs load."""
from __future__ import annotations

import logging

import pytest
import yaml

from .helpers import REPO

pytestmark = pytest.mark.integration

GOOD = {
    "name": "good",
    "source": {"topics": ["good"], "format": "json", "schema": "order_id STRING, amount DECIMAL(12,2)"},
    "target": {"table": "public.good", "mode": "append"},
    "schedule": "@hourly",
}


@pytest.fixture
def pipelines(tmp_path, monkeypatch):
    """good.yaml, bad_cron.yaml (`schedule: not a cron`) and broken.yaml (not even YAML), as the DAG file's dir."""
    directory = tmp_path / "pipelines"
    directory.mkdir()
    (directory / "good.yaml").write_text(yaml.safe_dump(GOOD))
    bad = {**GOOD, "name": "bad_cron", "source": {**GOOD["source"], "topics": ["bad"]}, "schedule": "not a cron"}
    (directory / "bad_cron.yaml").write_text(yaml.safe_dump(bad))
    (directory / "broken.yaml").write_text("name: broken\nsource: [unclosed\n")
    monkeypatch.setenv("LEDGERBATCH_PIPELINES_DIR", str(directory))
    return directory


@pytest.fixture
def factory_log():
    """The factory logger's records (a handler of its own: Airflow's structlog set-up decides where caplog's go)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = records.append
    logger = logging.getLogger("ledgerbatch.airflow.factory")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def _reasons(records) -> dict[str, str]:
    """spec file name -> reason, from the `ledgerbatch: leaving out pipeline spec PATH: REASON` lines."""
    prefix = "ledgerbatch: leaving out pipeline spec "
    out = {}
    for record in records:
        message = record.getMessage()
        if message.startswith(prefix):
            path, _, reason = message[len(prefix):].partition(": ")
            out[path.rsplit("/", 1)[-1]] = reason
    return out


def test_dagbag_loads_the_good_dags_and_leaves_out_a_bad_schedule_with_its_reason(pipelines, factory_log):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))

    # No import error on the shared DAG file: Airflow would mark every DAG of that file stale.
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {"ledgerbatch_good", "ledgerbatch_backfill", "ledgerbatch_offsets", "ledgerbatch_history"}
    assert bag.dags["ledgerbatch_good"].schedule == "@hourly"
    reasons = _reasons(factory_log)
    assert set(reasons) == {"bad_cron.yaml", "broken.yaml"}, reasons
    assert "AirflowTimetableInvalid" in reasons["bad_cron.yaml"] and "columns" in reasons["bad_cron.yaml"]
    assert "not valid YAML" in reasons["broken.yaml"]

    backfill = bag.dags["ledgerbatch_backfill"]
    assert backfill.params.get_param("pipeline").schema["enum"] == ["good"]
    assert "Pipelines left out" in backfill.doc_md and "bad_cron.yaml" in backfill.doc_md
    assert "broken.yaml" in backfill.doc_md


def test_build_dags_reports_what_it_left_out(pipelines):
    from ledgerbatch.airflow.factory import build_dags

    left_out = []
    dags = build_dags(pipelines, left_out)
    assert set(dags) == {"ledgerbatch_good", "ledgerbatch_backfill", "ledgerbatch_offsets", "ledgerbatch_history"}
    assert sorted(item.spec_path.name for item in left_out) == ["bad_cron.yaml", "broken.yaml"]
    assert all(item.reason for item in left_out)


def test_process_tasks_run_in_the_spark_pool_when_one_is_named(pipelines, monkeypatch):
    """LEDGERBATCH_SPARK_POOL puts every `process` task (the Spark work), and only those, in that Airflow pool."""
    from ledgerbatch.airflow.factory import build_dags

    assert build_dags(pipelines)["ledgerbatch_good"].get_task("process").pool == "default_pool"
    monkeypatch.setenv("LEDGERBATCH_SPARK_POOL", "ledgerbatch_spark")
    dags = build_dags(pipelines)
    pools = {(dag_id, t.task_id): t.pool for dag_id, dag in dags.items() for t in dag.tasks}
    assert {k for k, pool in pools.items() if pool == "ledgerbatch_spark"} == {
        ("ledgerbatch_good", "process"), ("ledgerbatch_backfill", "process")}
    assert all(pool == "default_pool" for k, pool in pools.items() if k[1] != "process")


def test_a_dag_that_fails_to_build_is_not_autoregistered(pipelines, monkeypatch):
    """Any error while building one pipeline's DAG (not only the schedule) leaves that one out."""
    from airflow.sdk.definitions._internal.contextmanager import DagContext

    from ledgerbatch.airflow import factory

    real = factory.pipeline_dag

    def flaky(spec, directory, hook=None):
        dag = real(spec, directory, hook)
        if spec.name == "good":
            raise RuntimeError("boom while building")
        return dag

    monkeypatch.setattr(factory, "pipeline_dag", flaky)
    DagContext.autoregistered_dags.clear()
    monkeypatch.setattr(DagContext, "current_autoregister_module_name", __name__)  # as while the DagBag imports
    left_out = []
    assert set(factory.build_dags(pipelines, left_out)) == {"ledgerbatch_backfill", "ledgerbatch_offsets", "ledgerbatch_history"}
    assert "RuntimeError: boom while building" in {item.reason for item in left_out}
    assert not DagContext.autoregistered_dags


def test_dagbag_dags_carry_assets_watchers_and_a_nullable_backfill_form(pipelines, monkeypatch):
    """What the DAG processor sees, from specs in a dir: the commit's target Asset, the on_new_data watcher, and
    a backfill form whose optional params all accept null (their default)."""
    import json

    import yaml
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import Asset

    from ledgerbatch.airflow.triggers import NewDataTrigger

    monkeypatch.setenv("AIRFLOW_CONN_LEDGERBATCH_DB", json.dumps(
        {"conn_type": "postgres", "host": "db.example.com", "login": "etl", "password": "secret", "schema": "analytics"}))
    events = {**GOOD, "name": "events", "schedule": "on_new_data", "target": {"table": "sales.events", "mode": "append"}}
    (pipelines / "events.yaml").write_text(yaml.safe_dump(events))
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}

    good = bag.dags["ledgerbatch_good"]
    assert good.get_task("commit").outlets == [Asset("postgres://db.example.com:5432/analytics/public/good", group="ledgerbatch")]
    event_driven = bag.dags["ledgerbatch_events"]
    assert event_driven.get_task("commit").outlets == [Asset("postgres://db.example.com:5432/analytics/sales/events", group="ledgerbatch")]
    (watched,) = event_driven.timetable.asset_condition.objects
    assert watched.uri == "x-ledgerbatch://pipelines/events/new-data"
    assert isinstance(watched.watchers[0].trigger, NewDataTrigger) and watched.watchers[0].trigger.pipeline == "events"

    backfill = bag.dags["ledgerbatch_backfill"]
    assert backfill.get_task("commit").outlets[0].name == "ledgerbatch_replays"
    params = backfill.params
    for key in ("topic", "partitions", "from_offset", "until_offset", "from_time", "until_time"):
        param = params.get_param(key)
        assert param.value is None and "null" in param.schema["type"], key
        assert param.resolve(None) is None
    assert params.get_param("from_time").schema["format"] == params.get_param("until_time").schema["format"] == "date-time"
    assert params.get_param("from_time").resolve("2026-11-01T10:00:00+00:00")
    params.validate()  # the defaults are a valid form
