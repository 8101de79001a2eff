"""Spark Connect: a real Connect server started from the pip wheel (`ledgerbatch spark-server`), batches staged
through Connect sessions (the package as a session artifact, the Python Data Sources registered over Connect,
mapInArrow with partials, parallelism without a SparkContext), exactly once; and the pipeline DAG's process
task on that server instead of spark-submit."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import text

from .helpers import REPO, assert_exactly_once, cli, order_value, produce
from .test_airflow import airflow_db, build, connections, states  # noqa: F401  (fixtures)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def connect_server():
    """`ledgerbatch spark-server` on a free port (master local[2]); its sc:// URL. Stopped (its whole process
    group: the launcher, the server's JVM, its Python workers) afterwards."""
    from ledgerbatch.processes import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ledgerbatch.cli", "spark-server", "--port", str(port),
                             "--master", "local[2]"], stdout=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=REPO)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        deadline, url = time.monotonic() + 300, None
        while url is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                assert proc.poll() is None, f"spark-server exited with {proc.returncode}"
                continue
            url = next((word for word in line.split() if word.startswith("sc://")), None)
        assert url == f"sc://127.0.0.1:{port}", "spark-server printed no sc:// URL"
        yield url
    finally:
        from ledgerbatch.processes import stop_group

        stop_group(proc)


@pytest.fixture(autouse=True)
def classic_sessions_unaffected():
    """PySpark marks a process that made a Connect session (SPARK_CONNECT_MODE_ENABLED): other tests' classic
    sessions and spark-submit children must not inherit the mark."""
    marked = "SPARK_CONNECT_MODE_ENABLED" in os.environ
    yield
    if not marked:
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


@pytest.fixture
def connect_spark(connect_server):
    from ledgerbatch.spark.connect import connect_spark

    with connect_spark(connect_server, "ledgerbatch-connect-tests") as spark:
        yield spark


def test_a_connect_session_ships_the_package_and_knows_its_parallelism(connect_spark):
    from pyspark.sql.types import StringType, StructField, StructType

    from ledgerbatch.stage.driver import default_parallelism
    from ledgerbatch.spark.session import is_connect

    def _import_path(batches):  # defined here: pickled by value (the server's workers have no `tests`)
        import ledgerbatch
        import pyarrow as pa

        for _ in batches:
            yield pa.RecordBatch.from_pylist([{"path": ledgerbatch.__file__}], schema=pa.schema([("path", pa.string())]))

    assert is_connect(connect_spark)
    assert default_parallelism(connect_spark) == 2  # the server's local[2], without a SparkContext
    paths = connect_spark.range(0, 2, 1, 2).mapInArrow(_import_path, StructType([StructField("path", StringType())]))
    for row in paths.collect():  # the server's workers import this client's package from the session's artifact
        assert row.path.endswith("ledgerbatch.zip/ledgerbatch/__init__.py"), row.path


def _pids(spark) -> set[int]:
    """The process ids of the Python workers that ran two tasks."""
    from pyspark.sql.types import LongType, StructField, StructType

    def _worker_pids(batches):  # defined here: pickled by value, like _import_path
        import pyarrow as pa

        for _ in batches:
            yield pa.RecordBatch.from_pylist([{"pid": os.getpid()}], schema=pa.schema([("pid", pa.int64())]))

    return {r.pid for r in spark.range(0, 2, 1, 2).mapInArrow(_worker_pids, StructType([StructField("pid", LongType())])).collect()}


def test_a_kept_session_outlives_its_client_and_its_python_workers_serve_the_next(connect_server):
    """What the process task of a live batch does on each DAG run: attach to the pipeline's kept session. The
    second client, within Spark's 60 s idle limit of Python workers, finds the package and the sources there,
    and its tasks run in the same Python workers."""
    from ledgerbatch.spark.connect import connect_spark, kept_session_id

    name = f"live:kept-{time.monotonic_ns()}"
    with connect_spark(connect_server, "first", keep=name) as spark:
        first = (spark.session_id, _pids(spark))
        assert spark.conf.get("ledgerbatch.prepared")
    with connect_spark(connect_server, "second", keep=name) as spark:
        assert spark.session_id == first[0] == kept_session_id(name, 0)
        assert _pids(spark) & first[1], "the second client's tasks ran in new Python workers"
        spark.stop()  # released on the server (what its idle timeout does): the id cannot be attached again
    with connect_spark(connect_server, "third", keep=name) as spark:
        assert spark.session_id == kept_session_id(name, 1)  # the next generation, prepared afresh
        assert _pids(spark)


def test_a_failed_block_interrupts_its_jobs_and_leaves_the_kept_session_usable(connect_server):
    from ledgerbatch.spark.connect import connect_spark

    name = f"live:interrupted-{time.monotonic_ns()}"
    with pytest.raises(RuntimeError, match="the task gave up"):
        with connect_spark(connect_server, "gives-up", keep=name) as spark:
            session = spark.session_id
            raise RuntimeError("the task gave up")
    with connect_spark(connect_server, "next", keep=name) as spark:
        assert spark.session_id == session and spark.range(3).count() == 3


def test_queries_in_one_session_each_read_their_own_batch(connect_spark):
    """Two batches' queries in one session (a kept session, a zombie attempt beside its successor): `batch` is
    bound per statement, so the first query still reads its own rows after the second was built."""
    from ledgerbatch.spec.pipeline import parse_spec
    from ledgerbatch.stage.transform import run_query, view_struct

    spec = parse_spec({"name": "q", "source": {"topics": ["q"], "format": "json", "schema": "n INT"},
                      "target": {"table": "public.q", "mode": "append"},
                      "transform": "SELECT n * 10 AS n, _topic, _partition, _offset FROM batch -- {braces} stay"})
    struct = view_struct(spec)

    def rows(n):
        row = {f.name: None for f in struct.fields} | {"n": n, "_topic": "q", "_partition": 0, "_offset": n}
        return connect_spark.createDataFrame([row], struct)

    first, second = run_query(connect_spark, rows(1), spec), run_query(connect_spark, rows(2), spec)
    assert [r.n for r in first.collect()] == [10] and [r.n for r in second.collect()] == [20]


def test_run_pipeline_through_connect_moves_every_record_once(engine, db_url, broker, make_pipeline, connect_server):
    from ledgerbatch.ops.run import run_pipeline
    from ledgerbatch.spark.session import get_spark

    p = make_pipeline(partitions=3, batch__max_records=200)
    acked = produce(broker.bootstrap_servers, p.topic,
                    [(i % 3, order_value(i)) for i in range(300)] + [(1, b"\xff not utf-8"), (2, b"[]")])
    sessions = []

    def factory():
        sessions.append(get_spark(app_name=f"ledgerbatch-{p.name}", remote=connect_server))
        return sessions[-1]

    try:
        summary = run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, factory)
    finally:
        for s in sessions:
            s.stop()
    assert (summary.batches, summary.records_read, summary.rows_written, summary.rows_quarantined) == (2, 302, 300, 2)
    assert len(sessions) == 1  # one session for the whole run, as with a classic driver
    good = {(part, off) for part, off, value in acked if value.startswith(b"{")}
    assert_exactly_once(engine, p, broker.bootstrap_servers, good, {(part, off) for part, off, _ in acked} - good)


def test_cli_run_of_a_query_pipeline_uses_LEDGERBATCH_SPARK_REMOTE(engine, db_url, broker, make_pipeline,
                                                                   connect_server):
    p = make_pipeline(partitions=2, batch__max_records=150,
                      transform="SELECT order_id, upper(customer) AS customer, amount * 2 AS amount, ts, _topic, _partition, "
                                "_offset FROM batch")
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(200)] + [(0, b"{")])
    # The master would fail the run if it were used: the batch must run on the Connect server.
    done = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir, LEDGERBATCH_SPARK_REMOTE=connect_server,
               LEDGERBATCH_SPARK_MASTER="spark://127.0.0.1:1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 batches committed, 201 records read, 200 rows written, 1 quarantined" in done.stdout, done.stdout
    assert f"a session on the Spark Connect server {connect_server}" in done.stderr
    good = {(part, off) for part, off, value in acked if value != b"{"}
    assert_exactly_once(engine, p, broker.bootstrap_servers, good, {(part, off) for part, off, _ in acked} - good)
    with engine.connect() as conn:
        rows = conn.execute(text(f'SELECT customer, amount FROM public."{p.table}" WHERE order_id = \'o-8\'')).all()
    assert [(r.customer, str(r.amount)) for r in rows] == [("C-1", "2.00")]


@pytest.mark.parametrize("named_by", ["LEDGERBATCH_SPARK_REMOTE", "spark_connect_default"])
def test_dag_test_processes_on_the_connect_server(named_by, airflow_db, connections, engine, broker, make_pipeline,
                                                  connect_server, monkeypatch):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    def no_spark_submit(self, context):
        raise AssertionError("spark-submit was used although a Spark Connect server is named")

    monkeypatch.setattr(SparkSubmitOperator, "execute", no_spark_submit)
    monkeypatch.delenv("LEDGERBATCH_SPARK_REMOTE", raising=False)
    if named_by == "LEDGERBATCH_SPARK_REMOTE":
        monkeypatch.setenv("LEDGERBATCH_SPARK_REMOTE", connect_server)
    else:  # the Spark provider's connection type; its hook builds sc://host:port/
        host, port = connect_server.removeprefix("sc://").split(":")
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT",
                           json.dumps({"conn_type": "spark_connect", "host": host, "port": int(port)}))
    p = make_pipeline(partitions=3)
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 3, order_value(i)) for i in range(150)])
    dag = build(p, monkeypatch)[f"ledgerbatch_{p.name}"]
    run = dag.test()
    assert str(run.state) == "success", states(run)
    assert states(run) == {"plan": "success", "process": "success", "commit": "success", "verify": "success"}
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ  # spark-submit children of this worker stay classic
