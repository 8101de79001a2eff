"""OpenLineage on real parts: the events openlineage-python's file transport writes, from the CLI (a query
pipeline, live batches and a replay) and from Airflow's OpenLineage provider in dag.test()."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from .helpers import REPO, cli, order_value, produce
from .test_aggregate import AGGREGATE, produce_orders
from .test_airflow import airflow_db, build, connections, states  # noqa: F401  (fixtures)

pytestmark = pytest.mark.integration


def _events(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _committed(engine, pipeline: str) -> dict[int, tuple]:
    with engine.connect() as conn:
        return {r.batch_id: (r.kind, r.rows_written) for r in conn.execute(text(
            "SELECT batch_id, kind, rows_written FROM ledger.batches WHERE pipeline = :p AND status = 'committed'"),
            {"p": pipeline})}


def test_the_cli_emits_a_start_and_a_complete_per_batch_with_datasets_facets_and_column_lineage(
        tmp_path, engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=2, batch__max_records=150, **AGGREGATE)
    produce_orders(broker, p, 300, seed=3)
    log_file = tmp_path / "lineage.jsonl"
    config = tmp_path / "openlineage.yml"
    config.write_text(json.dumps({"transport": {"type": "file", "log_file_path": str(log_file), "append": True}}))
    env = {"OPENLINEAGE_CONFIG": str(config), "OPENLINEAGE_NAMESPACE": "analytics"}
    assert cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir, **env).returncode == 0
    replay = cli(["replay", p.name, "--partitions", "0", "--from-offset", "0", "--until-offset", "10"], db_url,
                 broker.bootstrap_servers, p.dir, **env)
    assert replay.returncode == 0, replay.stderr[-2000:]

    events = _events(log_file)
    committed = _committed(engine, p.name)
    assert sorted(b for b, (kind, _) in committed.items() if kind == "live") == sorted(
        e["run"]["facets"]["ledgerbatch_batch"]["batchId"] for e in events
        if e["eventType"] == "COMPLETE" and e["run"]["facets"]["ledgerbatch_batch"]["kind"] == "live")
    assert [e["eventType"] for e in events].count("START") == [e["eventType"] for e in events].count("COMPLETE")
    assert len(committed) == len(events) // 2 == 3  # two live batches and the replay
    url = make_url(db_url)
    for event in (e for e in events if e["eventType"] == "COMPLETE"):
        facet = event["run"]["facets"]["ledgerbatch_batch"]
        assert event["job"] == {"namespace": "analytics", "name": f"ledgerbatch.{p.name}", "facets": {}}
        assert event["inputs"] == [{"namespace": f"kafka://{broker.bootstrap_servers.split(',')[0]}", "name": p.topic,
                                    "facets": {}, "inputFacets": {}}]
        (out,) = event["outputs"]
        assert (out["namespace"], out["name"]) == (f"postgres://{url.host}:{url.port}",
                                                   f"{url.database}.public.{p.table}")
        assert out["outputFacets"]["outputStatistics"]["rowCount"] == committed[facet["batchId"]][1]
        assert [f["name"] for f in out["facets"]["schema"]["fields"]] == ["customer", "minute", "orders", "revenue",
                                                                         "smallest", "largest"]
        lineage = {c: sorted(i["field"] for i in f["inputFields"])
                   for c, f in out["facets"]["columnLineage"]["fields"].items()}
        assert lineage == {"customer": ["customer"], "minute": ["ts"], "revenue": ["amount"], "smallest": ["amount"],
                           "largest": ["amount"]}
        assert facet["pipeline"] == p.name and facet["ranges"] and all(
            set(r) == {"topic", "partition", "from", "until"} for r in facet["ranges"])
    (replayed,) = [e for e in events if e["eventType"] == "COMPLETE"
                   and e["run"]["facets"]["ledgerbatch_batch"]["kind"] == "replay"]
    assert replayed["run"]["facets"]["ledgerbatch_batch"]["ranges"][0]["from"] == 0
    trimmed = {**replayed, "outputs": [{**replayed["outputs"][0], "facets": {
        "schema": "...", "columnLineage": {"fields": {"revenue": replayed["outputs"][0]["facets"]["columnLineage"]
                                                      ["fields"]["revenue"]}}}}]}
    print("OPENLINEAGE " + json.dumps(trimmed, indent=1))


def test_airflow_emits_the_commit_tasks_lineage_through_the_openlineage_provider(
        tmp_path, airflow_db, connections, engine, broker, make_pipeline, monkeypatch):
    p = make_pipeline(partitions=2)
    produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(40)])
    build(p, monkeypatch)
    log_file = tmp_path / "lineage.jsonl"
    # A process of its own, as a worker with the deployment's OpenLineage transport: the provider reads its
    # settings once per process, so this one must not have run Airflow before.
    env = {**os.environ, "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
        {"type": "file", "log_file_path": str(log_file), "append": True})}
    script = (f"from ledgerbatch.airflow.factory import build_dags\n"
              f"print('STATE', build_dags()['ledgerbatch_{p.name}'].test().state)\n")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600,
                          cwd=REPO)
    assert "STATE success" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
    (batch_id,) = _committed(engine, p.name)

    def commit_complete():
        return [e for e in _events(log_file) if e["eventType"] == "COMPLETE" and e["job"]["name"].endswith(".commit")]
    deadline = time.monotonic() + 60
    while not commit_complete() and time.monotonic() < deadline:  # the provider emits from a forked process
        time.sleep(0.5)
    (event,) = commit_complete()
    assert event["job"]["name"] == f"ledgerbatch_{p.name}.commit"
    assert event["run"]["facets"]["ledgerbatch_batch"]["batchId"] == batch_id
    assert [i["name"] for i in event["inputs"]] == [p.topic]
    (out,) = event["outputs"]
    assert out["name"].endswith(f".public.{p.table}") and out["outputFacets"]["outputStatistics"]["rowCount"] == 40
    assert {f["name"] for f in out["facets"]["schema"]["fields"]} >= {"order_id", "customer", "amount", "ts"}
