"""The Airflow tasks log the same phase event lines as `run`, with the counts the ledger holds."""
from __future__ import annotations

import json
import logging

import pytest

from .helpers import order_value, produce
from .test_airflow import airflow_db, build, connections, states  # noqa: F401  (fixtures)

pytestmark = pytest.mark.integration


def test_dag_tasks_log_one_event_line_per_phase(airflow_db, connections, engine, broker, make_pipeline, monkeypatch,
                                                 caplog):
    caplog.set_level(logging.INFO, logger="ledgerbatch.events")
    p = make_pipeline(partitions=2)
    produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(20)] + [(0, b"[]")])
    dag = build(p, monkeypatch)[f"ledgerbatch_{p.name}"]
    run = dag.test()
    assert str(run.state) == "success", states(run)
    # The records themselves: where Airflow's structlog renders them depends on what ran before.
    events = [json.loads(r.getMessage()[len("phase "):]) for r in caplog.records
              if r.name == "ledgerbatch.events" and r.getMessage().startswith("phase ")]
    assert [e["phase"] for e in events] == ["plan", "process", "commit"]
    assert {e["batch_id"] for e in events} == {events[0]["batch_id"]} and events[0]["ranges"] == 2
    assert events[1]["attempt"] == events[2]["attempt"] == 1
    assert [(e["records_read"], e["rows_written"], e["rows_quarantined"]) for e in events[1:]] == [(21, 20, 1)] * 2
    assert events[1]["seconds"] > events[2]["seconds"] > 0
