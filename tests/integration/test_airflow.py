"""Airflow: generated DAGs load, and dag.test() moves real data through real spark-submit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
import yaml
from sqlalchemy import text
from sqlalchemy.engine import make_url

from ledgerbatch.ops.pause import pause_pipeline

from .helpers import REPO, assert_exactly_once, order_value, produce

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def airflow_db():
    done = subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], capture_output=True, text=True,
                          timeout=600, env=os.environ)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture
def connections(monkeypatch, db_url, broker):
    u = make_url(db_url)
    monkeypatch.setenv("AIRFLOW_CONN_LEDGERBATCH_DB", json.dumps(
        {"conn_type": "postgres", "host": u.host, "port": u.port, "login": u.username, "schema": u.database}))
    monkeypatch.setenv("AIRFLOW_CONN_LEDGERBATCH_KAFKA", json.dumps(
        {"conn_type": "generic", "extra": {"bootstrap.servers": broker.bootstrap_servers}}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))


def build(p, monkeypatch):
    """The DAGs of `p`; dag.test() re-parses dags/, which must then find the same pipelines dir."""
    from ledgerbatch.airflow.factory import build_dags

    monkeypatch.setenv("LEDGERBATCH_PIPELINES_DIR", str(p.dir))
    return build_dags(p.dir)


def states(run) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def test_generated_dags_import_cleanly():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {"ledgerbatch_orders", "ledgerbatch_payments", "ledgerbatch_backfill",
                               "ledgerbatch_offsets", "ledgerbatch_history"}
    assert bag.dags["ledgerbatch_payments"].schedule == "*/15 * * * *"
    dag = bag.dags["ledgerbatch_orders"]  # schedule: on_new_data
    (asset,) = dag.timetable.asset_condition.objects
    assert asset.uri == "x-ledgerbatch://pipelines/orders/new-data" and asset.watchers
    assert dag.max_active_runs == 1 and not dag.catchup
    assert "ledgerbatch" in dag.tags and "pipeline:orders" in dag.tags
    assert [t.task_id for t in dag.topological_sort()] == ["plan", "process", "commit", "verify"]
    assert dag.get_task("process").retries == 3 and dag.get_task("process").retry_exponential_backoff
    assert dag.get_task("process").task_type == "ProcessBatchOperator"
    assert all(t.doc_md for t in dag.tasks)
    backfill = bag.dags["ledgerbatch_backfill"]
    assert backfill.schedule is None
    assert set(backfill.params) >= {"pipeline", "topic", "partitions", "from_offset", "until_offset", "dry_run"}
    for each in bag.dags.values():  # one line in the DAG list; Airflow's date backfill refused
        assert each.description and "\n" not in each.description and "backfill" not in each.allowed_run_types


def refused_once(run, task_id: str) -> None:
    """The task failed on its first try, with no retry left pending: a person's mistake (user_errors.py)."""
    ti = run.get_task_instance(task_id)
    assert (str(ti.state), ti.try_number) == ("failed", 1), states(run)


def returned(run, task_id: str):
    return run.get_task_instance(task_id).xcom_pull(task_ids=task_id)


def test_dag_test_moves_data_and_ends_green_when_caught_up(airflow_db, connections, engine, broker, make_pipeline, monkeypatch):
    p = make_pipeline(partitions=3)
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 3, order_value(i)) for i in range(300)])
    dag = build(p, monkeypatch)[f"ledgerbatch_{p.name}"]
    run = dag.test()
    assert str(run.state) == "success", states(run)
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())

    idle = dag.test()
    assert str(idle.state) == "success"
    assert states(idle) == {"plan": "success", "process": "skipped", "commit": "skipped", "verify": "skipped"}

    # Paused (in the ledger, as `ledgerbatch pause` does): new records wait, the run ends skipped, not failed.
    pause_pipeline(engine, p.spec, "alice", "target maintenance")
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(300))])
    paused = dag.test()
    assert str(paused.state) == "success"
    assert states(paused) == {"plan": "skipped", "process": "skipped", "commit": "skipped", "verify": "skipped"}


def _kill_spark_job_once(engine, pipeline: str, killed: list) -> None:
    """Once the job's attempt is recorded in the ledger (it is reading), SIGKILL its JVM and every child."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            attempt = conn.execute(text("SELECT max(attempt) FROM ledger.batches WHERE pipeline = :p"), {"p": pipeline}).scalar()
        if attempt:
            break
        time.sleep(0.1)
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "org.apache.spark.deploy.SparkSubmit" in cmd and pipeline in cmd:
            family = [proc] + proc.children(recursive=True)
            for member in family:
                try:
                    member.kill()
                except psutil.NoSuchProcess:
                    pass
            killed.append(len(family))
            return


def test_process_task_retried_after_sigkill(airflow_db, connections, engine, broker, make_pipeline, monkeypatch):
    p = make_pipeline(partitions=2)
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(400)])
    dag = build(p, monkeypatch)[f"ledgerbatch_{p.name}"]
    dag.get_task("process").retry_delay = timedelta(seconds=1)
    killed: list = []
    killer = threading.Thread(target=_kill_spark_job_once, args=(engine, p.name, killed), daemon=True)
    killer.start()
    run = dag.test()
    killer.join(timeout=60)
    assert killed, "the Spark job was never seen"
    if states(run)["process"] == "up_for_retry":
        # dag.test() stops when only a retry delay is left: run the same DAG run again to retry the task.
        retried = dag.test(logical_date=run.logical_date)
        assert retried.run_id == run.run_id
        run = retried
    assert str(run.state) == "success", states(run)
    assert {ti.task_id: ti.try_number for ti in run.get_task_instances()}["process"] >= 2
    with engine.connect() as conn:
        batches = conn.execute(text("SELECT batch_id, status, attempt FROM ledger.batches WHERE pipeline = :p"), {"p": p.name}).all()
    assert len(batches) == 1 and batches[0].status == "committed" and batches[0].attempt == 2
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())


def test_offsets_dag_moves_cursors_with_who_and_why(airflow_db, connections, engine, broker, make_pipeline, monkeypatch,
                                                    caplog, capfd):
    p = make_pipeline(partitions=2)
    produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(20)])
    offsets = build(p, monkeypatch)["ledgerbatch_offsets"]
    conf = {"pipeline": p.name, "to": "latest", "by": "alice", "reason": "start at the end"}

    def cursors():
        with engine.connect() as conn:
            return dict(conn.execute(text("SELECT partition, next_offset FROM ledger.cursors WHERE pipeline = :p"),
                                     {"p": p.name}).all())

    dry = offsets.test(run_conf=conf)  # dry_run is the default
    assert str(dry.state) == "success", states(dry)
    assert cursors() == {}
    default = offsets.test(run_conf={"pipeline": p.name, "by": "alice", "reason": "look"})  # the form as it opens
    assert returned(default, "move") == (f"{p.name} to-latest (dry run, nothing moved): {p.topic}[0]: starts at 10; "
                                         f"{p.topic}[1]: starts at 10")
    no_time = offsets.test(run_conf={**conf, "to": "time"})
    refused_once(no_time, "move")

    def said() -> str:  # the task log: captured, or printed when an earlier dag.test() set up Airflow's logging
        return caplog.text + "".join(capfd.readouterr())
    assert "ledgerbatch_offsets: Time: Move to = time needs a Time" in said()
    real = offsets.test(run_conf={**conf, "dry_run": False})
    assert str(real.state) == "success", states(real)
    assert cursors() == {0: 10, 1: 10}  # a pipeline without cursors starts where they were moved
    with engine.connect() as conn:
        moves = conn.execute(text("SELECT partition, from_offset, to_offset, moved_by, reason, request FROM "
                                  "ledger.offset_moves WHERE pipeline = :p ORDER BY partition"), {"p": p.name}).all()
    assert [tuple(m) for m in moves] == [(part, None, 10, "alice", "start at the end", "to-latest") for part in (0, 1)]
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match="Invalid input for param by: '' should be non-empty"):
        offsets.test(run_conf={**conf, "by": "", "dry_run": False})  # the form requires who
    from ledgerbatch.plan.live import plan_next

    produce(broker.bootstrap_servers, p.topic, [(0, order_value(20))])
    open_batch = plan_next(engine, p.spec, broker.bootstrap_servers)  # a run that planned and has not committed
    while_open = offsets.test(run_conf={**conf, "to": "earliest", "dry_run": False})
    refused_once(while_open, "move")  # the UI's words: the pipeline's DAG, not `ledgerbatch run`
    assert (f"ledgerbatch_offsets: batch {open_batch.batch_id} of {p.name} is open (planned) and its ranges start at "
            f"the cursors: let it finish (trigger the ledgerbatch_{p.name} DAG, or wait for its next run)") in said()


def test_backfill_dag_replays_a_committed_range(airflow_db, connections, engine, broker, make_pipeline, monkeypatch,
                                                capfd):
    p = make_pipeline(partitions=2)
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(40)])
    dags = build(p, monkeypatch)
    assert str(dags[f"ledgerbatch_{p.name}"].test().state) == "success"
    with engine.connect() as conn:
        before = {(r._partition, r._offset): r.customer for r in conn.execute(
            text(f'SELECT _partition, _offset, customer FROM public."{p.table}"'))}
        cursors = conn.execute(text("SELECT partition, next_offset FROM ledger.cursors WHERE pipeline = :p ORDER BY 1"), {"p": p.name}).all()

    path = p.dir / f"{p.name}.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["transform"] = {"customer": "concat('vip-', customer)"}
    path.write_text(yaml.safe_dump(doc))
    dags = build(p, monkeypatch)
    backfill = dags["ledgerbatch_backfill"]
    conf = {"pipeline": p.name, "partitions": "1", "from_offset": 5, "until_offset": 10}

    backwards = backfill.test(run_conf={**conf, "from_offset": 10, "until_offset": 5})
    refused_once(backwards, "plan")  # after a pipeline's dag.test(), the task log is printed, not in caplog
    assert "ledgerbatch_backfill: Until offset 5: must be above From offset (10)" in "".join(capfd.readouterr())
    back = dags["ledgerbatch_offsets"].test(run_conf={"pipeline": p.name, "to": "earliest", "partitions": "1",
                                                      "by": "bob", "reason": "again", "dry_run": False})
    refused_once(back, "move")  # the UI's words: the backfill DAG and its fields, not the CLI's flags
    assert (f"ledgerbatch_offsets: {p.topic}[1] back from 20 to 0 would deliver 20 offsets again that batches "
            f"delivered; re-deliver them with the ledgerbatch_backfill DAG instead: Pipeline {p.name}, Topic "
            f"{p.topic}, Partitions 1, From offset 0, Until offset 20") in "".join(capfd.readouterr())

    dry = backfill.test(run_conf={**conf, "dry_run": True})
    assert str(dry.state) == "success", states(dry)
    assert returned(dry, "commit") == (f"dry run of replay batch {returned(dry, 'plan')}, {p.topic}[1] [5, 10): 0 "
                                       f"unchanged, 0 added, 0 removed, 5 changed, 0 quarantined; target untouched")
    with engine.connect() as conn:
        unchanged = {(r._partition, r._offset): r.customer for r in conn.execute(
            text(f'SELECT _partition, _offset, customer FROM public."{p.table}"'))}
        dry_batch = conn.execute(text("SELECT kind, status, error FROM ledger.batches WHERE pipeline = :p AND kind <> 'live'"),
                                 {"p": p.name}).one()
    assert unchanged == before
    assert dry_batch.kind == "replay" and dry_batch.status == "abandoned" and "changed=5" in dry_batch.error

    real = backfill.test(run_conf={**conf, "dry_run": False})
    assert str(real.state) == "success", states(real)
    with engine.connect() as conn:
        after = {(r._partition, r._offset): r.customer for r in conn.execute(
            text(f'SELECT _partition, _offset, customer FROM public."{p.table}"'))}
        assert conn.execute(text("SELECT partition, next_offset FROM ledger.cursors WHERE pipeline = :p ORDER BY 1"),
                            {"p": p.name}).all() == cursors
    changed = {k for k in before if after[k] != before[k]}
    assert changed == {(1, o) for o in range(5, 10)}
    assert all(after[k] == "vip-" + before[k] for k in changed)
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())


def test_cli_and_airflow_on_one_pipeline_commit_each_batch_once(airflow_db, connections, engine, db_url, broker,
                                                                 make_pipeline, monkeypatch):
    from .test_faults import _popen_run

    p = make_pipeline(partitions=2, batch__max_records=200)
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(600)])
    dag = build(p, monkeypatch)[f"ledgerbatch_{p.name}"]
    runner = _popen_run(p, db_url, broker)
    run = dag.test()  # races the CLI for the same batches; the ledger decides
    _, err = runner.communicate(timeout=600)
    assert runner.returncode in (0, 1), err[-2000:]
    if runner.returncode:
        assert "FencedError" in err or "not staged" in err, err[-2000:]
    assert states(run)["plan"] == "success"  # the racing run may lose attempts to the CLI: that is the point
    finish = dag.test()
    while str(finish.state) == "success" and states(finish)["process"] != "skipped":
        finish = dag.test()  # one batch per DAG run: go on until caught up
    assert str(finish.state) == "success", states(finish)
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())


def test_history_dag_compacts_and_purges_each_pipeline_as_asked(airflow_db, connections, engine, broker, make_pipeline,
                                                               monkeypatch):
    p = make_pipeline(partitions=2)
    produce(broker.bootstrap_servers, p.topic, [(i % 2, b"{oops" if i == 3 else order_value(i)) for i in range(20)])
    dags = build(p, monkeypatch)
    assert str(dags[f"ledgerbatch_{p.name}"].test().state) == "success"
    history = dags["ledgerbatch_history"]
    assert [t.task_id for t in history.tasks] == [f"upkeep_{p.name}"] and history.schedule == "@daily"
    dry = history.test(run_conf={"purge_before": "2099-01-01T00:00:00", "dry_run": True})
    assert returned(dry, f"upkeep_{p.name}") == (f"dry run of {p.name}'s purge: 1 quarantined records before "
                                                 f"2099-01-01T00:00:00+00:00 would be purged; nothing changed")
    run = history.test(run_conf={"compact_before": "2099-01-01T00:00:00", "purge_before": "2099-01-01T00:00:00",
                                 "dry_run": False})  # dag.test() keeps the params of the run before
    assert str(run.state) == "success", states(run)
    with engine.connect() as conn:
        left = conn.execute(text("SELECT (SELECT count(*) FROM ledger.batches WHERE pipeline = :p), "
                                 "(SELECT count(*) FROM ledger.quarantine WHERE pipeline = :p), "
                                 "(SELECT batches FROM ledger.compactions WHERE pipeline = :p), "
                                 "(SELECT quarantine_purged FROM ledger.compactions WHERE pipeline = :p)"),
                            {"p": p.name}).one()
    assert tuple(left) == (0, 0, 1, 1)
    from ledgerbatch.ops.verify import verify

    assert verify(engine, p.spec) == []
