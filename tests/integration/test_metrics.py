"""Metrics on real parts: a real Prometheus (Debian's package) scrapes `ledgerbatch run --follow
--metrics-port`, and its HTTP API's answers are checked against the ledger and Kafka; a pipeline run
inside Airflow (dag.test()) sends the same metrics over OTLP/HTTP to a receiver decoding
opentelemetry-proto."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from sqlalchemy import text

from .helpers import REPO, cli, end_offsets, order_value, produce
from .otlp import OtlpReceiver
from .test_airflow import airflow_db, build, connections, states  # noqa: F401  (fixtures)

pytestmark = pytest.mark.integration
PROMETHEUS = shutil.which("prometheus")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def prometheus(tmp_path):
    """Start Prometheus on loopback; yields a function that starts scraping a port and the query API."""
    assert PROMETHEUS, "Debian's prometheus package is missing (scripts/setup.sh installs it as root)"
    port, procs = _free_port(), []

    def start(target_port: int):
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": [
            {"job_name": "ledgerbatch", "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}]}))
        procs.append(subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2)
                return query
            except OSError:
                time.sleep(0.2)
        raise AssertionError("Prometheus did not become ready in 60s")

    def query(promql: str) -> dict[str, float]:
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        body = json.load(urllib.request.urlopen(url, timeout=10))
        assert body["status"] == "success", body
        return {r["metric"].get("messaging_destination_partition_id", ""): float(r["value"][1])
                for r in body["data"]["result"]}

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)


def _until(what: str, check, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} not seen in {timeout_s}s"
        time.sleep(0.5)


def test_prometheus_scrapes_counts_and_lag_in_offsets_and_seconds(engine, db_url, broker, make_pipeline, prometheus):
    p = make_pipeline(partitions=2, batch__max_records=1000)
    produced_at = time.time()
    produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i) if i % 25 else b"{bad") for i in range(100)])
    metrics_port = _free_port()
    env = {**os.environ, "LEDGERBATCH_DB_URL": db_url, "LEDGERBATCH_PIPELINES_DIR": str(p.dir),
           "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers, "LEDGERBATCH_SPARK_MASTER": "local[2]"}
    follower = subprocess.Popen([sys.executable, "-m", "ledgerbatch.cli", "run", p.name, "--follow", "--idle-seconds",
                                 "0.5", "--metrics-port", str(metrics_port)], env=env, cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        query = prometheus(metrics_port)
        pipeline = f'ledgerbatch_pipeline="{p.name}"'
        with engine.connect() as conn:
            def ledger_totals():
                return conn.execute(text("SELECT coalesce(sum(rows_written), 0), coalesce(sum(rows_quarantined), 0) "
                                         "FROM ledger.batches WHERE pipeline = :p AND status = 'committed'"),
                                    {"p": p.name}).one()
            _until("100 records delivered", lambda: sum(ledger_totals()) == 100, 180)
            written, quarantined = ledger_totals()
        assert (written, quarantined) == (96, 4)
        # Prometheus's answers, as a person would ask them, against the ledger's counts
        _until("rows written in Prometheus", lambda: query(f"sum(ledgerbatch_rows_written_total{{{pipeline}}})")
               .get("") == written)
        assert query(f"sum(ledgerbatch_records_quarantined_total{{{pipeline}}})") == {"": quarantined}
        consumed = query(f"messaging_client_consumed_messages_total{{{pipeline}}}")
        assert consumed == {"0": 50.0, "1": 50.0}
        # produced -> committed, one observation a record (bad ones too: they were delivered, to quarantine)
        _until("freshness of 100 records", lambda: query(f"sum(ledgerbatch_freshness_seconds_count{{{pipeline}}})")
               .get("") == 100)
        mean = query(f"sum(ledgerbatch_freshness_seconds_sum{{{pipeline}}}) / "
                     f"sum(ledgerbatch_freshness_seconds_count{{{pipeline}}})")  # quantiles only know the buckets
        assert 0 < mean[""] <= time.time() - produced_at + 1, mean
        assert _until("caught up", lambda: query(f"ledgerbatch_lag_offsets{{{pipeline}}}")) == {"0": 0.0, "1": 0.0}
        delivered_age = query(f"ledgerbatch_lag_newest_delivered_age_seconds{{{pipeline}}}")
        assert set(delivered_age) == {"0", "1"}
        assert all(0 <= age <= time.time() - produced_at + 5 for age in delivered_age.values()), delivered_age
        assert query(f"ledgerbatch_lag_oldest_undelivered_age_seconds{{{pipeline}}}") == {"0": 0.0, "1": 0.0}

        # Paused, with 30 records waiting in partition 0: lag in offsets and in seconds grow.
        assert cli(["pause", p.name, "--by", "test", "--reason", "lag"], db_url, broker.bootstrap_servers,
                   p.dir).returncode == 0
        waiting_since = time.time()
        produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(100, 130)])
        behind = _until("30 offsets behind", lambda: query(f"ledgerbatch_lag_offsets{{{pipeline}}}") == {"0": 30.0, "1": 0.0})
        assert behind
        ends = end_offsets(broker.bootstrap_servers, p.topic, 2)
        with engine.connect() as conn:
            cursors = dict(conn.execute(text("SELECT partition, next_offset FROM ledger.cursors WHERE pipeline = :p"),
                                        {"p": p.name}).all())
        assert {str(k): float(ends[k][1] - v) for k, v in cursors.items()} == {"0": 30.0, "1": 0.0}
        late = f"max by (ledgerbatch_pipeline) (ledgerbatch_lag_oldest_undelivered_age_seconds{{{pipeline}}}) > 3"
        seen = _until("a table behind by more than 3 seconds", lambda: query(late), 60)
        print(f"PROMQL {late} -> {seen}")
        age = seen[""]
        assert 3 < age <= time.time() - waiting_since + 3, age
        follower.send_signal(signal.SIGTERM)
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 0, err[-3000:]
        assert f"metrics for Prometheus on http://127.0.0.1:{metrics_port}/metrics" in err
    finally:
        if follower.poll() is None:
            os.killpg(follower.pid, signal.SIGKILL)


def test_a_pipeline_run_inside_airflow_sends_its_metrics_over_otlp(airflow_db, connections, engine, broker,
                                                                   make_pipeline, monkeypatch):
    import ledgerbatch.ops.metrics

    p = make_pipeline(partitions=2)
    produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i) if i % 20 else b"{bad") for i in range(120)])
    otlp = OtlpReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint)
    monkeypatch.setattr(ledgerbatch.ops.metrics, "_metrics", None)  # as in a fresh task process
    try:
        run = build(p, monkeypatch)[f"ledgerbatch_{p.name}"].test()
        assert str(run.state) == "success", states(run)
    finally:
        otlp.close()
        ledgerbatch.ops.metrics.metrics().provider.shutdown()
    with engine.connect() as conn:
        written, quarantined = conn.execute(text(
            "SELECT sum(rows_written), sum(rows_quarantined) FROM ledger.batches WHERE pipeline = :p "
            "AND status = 'committed'"), {"p": p.name}).one()
    mine = {"ledgerbatch__pipeline": p.name}
    assert (written, quarantined) == (114, 6)
    assert sum(otlp.latest("ledgerbatch.rows.written", **mine).values()) == written
    assert sum(otlp.latest("ledgerbatch.records.quarantined", **mine).values()) == quarantined
    assert sorted(otlp.latest("messaging.client.consumed.messages", **mine).values()) == [60, 60]
    phases = {dict(k)["ledgerbatch.phase"] for k in otlp.latest("ledgerbatch.batch.phase.duration", **mine)}
    assert phases == {"plan", "process", "commit"}
    assert list(otlp.latest("ledgerbatch.lag.offsets", **mine).values()) == [0, 0]  # measured after the commit
    assert all(v >= 0 for v in otlp.latest("ledgerbatch.lag.newest_delivered.age", **mine).values())
