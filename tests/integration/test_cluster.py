"""A real Spark standalone cluster (master + worker from the pip wheel): executors in their own JVMs and
Python workers, the package shipped to them as a zip, one pipeline run end to end."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ledgerbatch.processes import free_port

from .helpers import assert_exactly_once, cli, order_value, produce

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent


def _master_state(ui_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """spark://127.0.0.1:PORT with one worker; both stopped (whole process groups) afterwards."""
    work = tmp_path_factory.mktemp("spark-standalone")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "SPARK_LOCAL_IP": "127.0.0.1"}
    port, ui_port = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    procs = []

    def start(name: str, *args: str) -> None:
        log = open(work / f"{name}.log", "w")
        procs.append(subprocess.Popen([str(BIN / "spark-class"), *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))

    def wait(what: str, ready, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(1)
        raise AssertionError(f"Spark {what} did not start; logs in {work}")

    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(ui_port))
        wait("master", lambda: _master_state(ui_port)["status"] == "ALIVE")
        start("worker", "org.apache.spark.deploy.worker.Worker", url, "--cores", "2", "--memory", "2g",
              "--work-dir", str(work / "work"), "--webui-port", str(free_port()))
        wait("worker", lambda: _master_state(ui_port)["aliveworkers"] >= 1)
        yield url, ui_port
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(30)


def test_run_on_a_standalone_cluster(engine, db_url, broker, make_pipeline, standalone):
    url, ui_port = standalone
    p = make_pipeline(partitions=3, batch__max_records=200)
    records = [(i % 3, order_value(i)) for i in range(300)] + [(1, b"\xff not utf-8"), (2, b"[]")]
    acked = produce(broker.bootstrap_servers, p.topic, records)
    done = cli(["run", p.name, "--master", url], db_url, broker.bootstrap_servers, p.dir, SPARK_LOCAL_IP="127.0.0.1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 batches committed, 302 records read, 300 rows written, 2 quarantined" in done.stdout
    good = {(part, off) for part, off, value in acked if value.startswith(b"{")}
    assert_exactly_once(engine, p, broker.bootstrap_servers, good, {(part, off) for part, off, _ in acked} - good)
    apps = _master_state(ui_port)["completedapps"]
    assert any(a["name"] == f"ledgerbatch-{p.name}" for a in apps), [a["name"] for a in apps]


def test_executors_import_the_package_from_the_shipped_zip(standalone):
    url, _ = standalone
    code = ("from ledgerbatch.spark.session import get_spark\n"
            f"spark = get_spark({url!r}, 'ledgerbatch-zip-check')\n"
            "rdd = spark.sparkContext.parallelize([0], 1)\n"
            "print(rdd.map(lambda _: __import__('ledgerbatch').__file__).collect()[0])\n"
            "spark.stop()\n")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    path = done.stdout.strip().splitlines()[-1]
    assert path.endswith("ledgerbatch.zip/ledgerbatch/__init__.py"), path
