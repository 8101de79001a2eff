"""`ledgerbatch run --follow` through outages, while orders keep arriving: immediate restarts of its database
(one while a commit waits inside its transaction, one that loses a COMMIT's reply), a failover to a promoted
asynchronous standby (reached through a read-only phase), and every Kafka broker down for 20 s. Each time the
process is still up at the end, every record is in the target once, `verify` is clean, the log has the
outage's start and end, and the metrics count it. And the schema registry down for 20 s on an Avro
pipeline. The database is a cluster of the test's own (cluster.py)
behind a TCP proxy, as a VIP would be."""
from __future__ import annotations

import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import psycopg2
import pytest
from sqlalchemy import text

from ledgerbatch.ledger.engine import make_engine

from ledgerbatch.dev.registry import DevRegistry
from tests.integration.helpers import assert_exactly_once, cli, order_value, produce
from tests.serde import ORDER, ORDER_COLUMNS, avro_encoder

from .cluster import Cluster, Proxy, free_port

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
WAVES, WAVE = 40, 100  # orders arrive in waves every 0.4 s, 4,000 in all


@pytest.fixture
def database():
    """A cluster of the test's own with a migrated `ledger` database, reached through a proxy."""
    pg = Cluster.create()
    proxy = Proxy(pg.port)
    try:
        pg.execute("CREATE DATABASE ledger")
        yield pg, proxy
    finally:
        proxy.close()
        pg.destroy()


class Run:
    """Orders produced in waves in a thread, and a follower in its own process group, logging to files."""

    def __init__(self, p, broker, db_url: str, log_dir: Path, value=order_value, spark: tuple = ()):
        self.p, self.broker, self.acked, self.value = p, broker, [], value
        self.metrics_port = free_port()
        self.err_path = log_dir / "follower.err"
        env = {**os.environ, "LEDGERBATCH_DB_URL": db_url, "LEDGERBATCH_PIPELINES_DIR": str(p.dir),
               "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers, "LEDGERBATCH_SPARK_MASTER": "local[2]"}
        self.follower = subprocess.Popen(
            [sys.executable, "-m", "ledgerbatch.cli", "run", p.name, "--follow", "--idle-seconds", "0.3",
             "--backoff-initial", "0.2", "--backoff-max", "2", "--metrics-port", str(self.metrics_port), *spark],
            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=open(self.err_path, "w"), text=True,
            start_new_session=True)
        self.waves = 0
        self.produce(WAVES)

    def produce(self, waves: int) -> None:
        """`waves` more waves, in a thread (`producing`)."""
        self.producing = threading.Thread(target=self._produce, args=(self.waves, self.waves + waves), daemon=True)
        self.waves += waves
        self.producing.start()

    def more(self, waves: int) -> None:
        """`waves` more waves once the current ones are produced."""
        self.producing.join(timeout=120)
        self.produce(waves)

    def _produce(self, first: int, last: int) -> None:
        for wave in range(first, last):
            self.acked += produce(self.broker.bootstrap_servers, self.p.topic,
                                  [(i % 2, self.value(i)) for i in range(wave * WAVE, (wave + 1) * WAVE)])
            time.sleep(0.4)

    @property
    def log(self) -> str:
        return self.err_path.read_text()

    def alive(self) -> None:
        assert self.follower.poll() is None, f"the follower exited {self.follower.returncode}: {self.log[-3000:]}"

    def wait_committed(self, engine, offsets: int, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.alive()
            try:
                with engine.connect() as conn:
                    done = conn.execute(text("SELECT coalesce(sum(next_offset - start_offset), 0) FROM ledger.cursors "
                                             "WHERE pipeline = :p"), {"p": self.p.name}).scalar_one()
                if done >= offsets:
                    return
            except Exception:  # noqa: BLE001 - the database is down on purpose
                pass
            assert time.monotonic() < deadline, f"{offsets} offsets not committed in {timeout_s}s: {self.log[-3000:]}"
            time.sleep(0.2)

    def next_commit(self, engine, timeout_s: float = 120) -> float:
        """Seconds from now (a dependency just recovered) to the pipeline's next commit, by the database's
        clock; printed for docs/failure-and-recovery.md's failover matrix."""
        with engine.connect() as conn:
            recovered = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.alive()
            with engine.connect() as conn:
                committed = conn.execute(text("SELECT min(committed_at) FROM ledger.batches WHERE pipeline = :p "
                                              "AND committed_at > :t"), {"p": self.p.name, "t": recovered}).scalar_one()
            if committed is not None:
                return (committed - recovered).total_seconds()
            time.sleep(0.05)
        raise AssertionError(f"no commit within {timeout_s}s of the recovery: {self.log[-3000:]}")

    def metrics(self) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()

    def finish(self, engine, db_url: str) -> str:
        """Every wave delivered, then the follower still up; SIGTERM ends it. Returns its log."""
        self.producing.join(timeout=120)
        self.wait_committed(engine, self.waves * WAVE)
        self.alive()
        scraped = self.metrics()
        self.follower.send_signal(signal.SIGTERM)
        self.follower.communicate(timeout=60)
        assert self.follower.returncode == 0, self.log[-3000:]
        assert_exactly_once(engine, self.p, self.broker.bootstrap_servers, {(part, off) for part, off, _ in self.acked},
                            set())
        verified = cli(["verify", self.p.name], db_url, self.broker.bootstrap_servers, self.p.dir)
        assert verified.returncode == 0, verified.stdout + verified.stderr[-2000:]
        return scraped

    def kill(self) -> None:
        if self.follower.poll() is None:
            os.killpg(self.follower.pid, signal.SIGKILL)


@contextmanager
def following(p, broker, db_url: str, tmp_path: Path, value=order_value, spark: tuple = ()):
    run = Run(p, broker, db_url, tmp_path, value, spark)
    try:
        yield run
    finally:
        run.kill()


def _outages(scraped: str, dependency: str) -> float:
    found = re.findall(r'^ledgerbatch_outages_total\{[^}]*ledgerbatch_dependency="' + re.escape(dependency)
                       + r'"[^}]*\} ([0-9.e+]+)$', scraped, re.M)
    return sum(float(v) for v in found)


def _assert_outage_logged(log: str, dependency: str, times: int = 1) -> None:
    started, ended = log.count(f"outage started: {dependency} unavailable"), log.count(f"outage ended: {dependency} back after")
    assert started == ended >= times, (started, ended, log[-3000:])


def _restart_inside_a_commit(pg: Cluster, direct) -> bool:
    """Hold a staged batch's ranges (its commit then waits inside its transaction, at mark_committed) and
    restart the server while the commit waits: the connection is lost before COMMIT was sent."""
    with direct.connect() as conn:
        staged = conn.execute(text("SELECT max(batch_id) FROM ledger.batches WHERE status = 'staged'")).scalar_one()
    if staged is None:
        return False
    holder = psycopg2.connect(host="127.0.0.1", port=pg.port, user="postgres", dbname="ledger")
    try:
        with holder.cursor() as cur:
            try:
                cur.execute("SELECT 1 FROM ledger.batch_ranges WHERE batch_id = %s FOR UPDATE NOWAIT", (staged,))
            except psycopg2.errors.LockNotAvailable:
                return False
            cur.execute("SELECT status FROM ledger.batches WHERE batch_id = %s", (staged,))
            if cur.fetchone()[0] != "staged":  # committed before the ranges were held: no commit will wait
                return False
            for _ in range(100):
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = 'ledger'")
                if cur.fetchone()[0]:
                    pg.restart()
                    return True
                time.sleep(0.05)
        return False
    finally:
        try:
            holder.close()
        except psycopg2.Error:
            pass


def test_follow_rides_through_immediate_restarts_of_its_database(database, broker, make_pipeline, tmp_path):
    pg, proxy = database
    p = make_pipeline(partitions=2, batch__max_records=300)
    db_url, direct = pg.url("ledger", proxy.port), make_engine(pg.url("ledger"))
    assert cli(["migrate"], db_url, None, p.dir).returncode == 0
    with following(p, broker, db_url, tmp_path) as run:
        run.wait_committed(direct, 1)
        time.sleep(random.uniform(0.5, 2.0))
        pg.restart()  # 1: at a random point
        print(f"failover matrix: immediate restart: next commit {run.next_commit(direct):.2f}s after the server is back")
        run.wait_committed(direct, 1500)
        deadline = time.monotonic() + 60
        while not _restart_inside_a_commit(pg, direct):  # 2: inside a commit, before its COMMIT is sent
            assert time.monotonic() < deadline, "no commit caught waiting inside its transaction"
            # Orders keep coming while it tries: a follower that has committed every order (on a loaded
            # machine it may start after the last wave and catch up at once) stages nothing to catch.
            if not run.producing.is_alive():
                run.produce(5)
            time.sleep(0.05)
        print(f"failover matrix: restart inside a commit: next commit {run.next_commit(direct):.2f}s after the server is back")
        run.wait_committed(direct, 2500)
        # A batch's COMMIT reaches the server and its reply never reaches the runner.
        proxy.cut_after(b"COMMIT\x00", prelude=b"SET status = 'committed'")
        run.more(5)  # orders still to come, so that a commit loses its reply
        time.sleep(random.uniform(0.5, 1.5))
        pg.restart()  # 3: at a random point
        run.more(5)  # and after it: an outage it starts must end before the test does
        scraped = run.finish(direct, db_url)
    assert proxy.cuts == 1
    # The commit's two losses are outages; a restart while the follower is between statements may pass
    # unnoticed (the pool checks a connection before lending it) or fail a staging task's COPY instead.
    _assert_outage_logged(run.log, "database", 2)
    assert _outages(scraped, "database") >= 2, scraped
    assert "live batch" in run.log and "committed" in run.log
    direct.dispose()


def test_follow_rides_through_a_failover_to_a_promoted_asynchronous_standby(database, broker, make_pipeline, tmp_path):
    pg, proxy = database
    standby = pg.standby()
    try:
        p = make_pipeline(partitions=2, batch__max_records=300)
        db_url = pg.url("ledger", proxy.port)
        assert cli(["migrate"], db_url, None, p.dir).returncode == 0
        primary = make_engine(pg.url("ledger"))
        with following(p, broker, db_url, tmp_path) as run:
            run.wait_committed(primary, 1500)
            pg.stop("immediate")  # the primary is gone, with whatever it had not sent the standby yet
            primary.dispose()
            proxy.point_at(standby.port)  # the VIP moves before the standby is promoted: read-only for a while
            time.sleep(3)
            run.alive()
            standby.promote()
            promoted = make_engine(standby.url("ledger"))
            print(f"failover matrix: failover: next commit {run.next_commit(promoted):.2f}s after the promotion")
            scraped = run.finish(promoted, db_url)
            promoted.dispose()
        assert "in a read-only transaction" in run.log, run.log[-3000:]  # the standby before its promotion
        _assert_outage_logged(run.log, "database")
        assert _outages(scraped, "database") >= 1, scraped
    finally:
        standby.destroy()


def test_follow_rides_through_every_kafka_broker_down_for_20_seconds(database, broker, make_pipeline, tmp_path):
    """The broker dies while the follower looks for new records: its look fails after Kafka's 15 s timeout,
    and it waits until the broker is back. (A broker that dies while a range is read stalls the read, which
    resumes when the broker is back: no outage, nothing to log.)"""
    pg, proxy = database
    p = make_pipeline(partitions=2, batch__max_records=300)
    db_url, direct = pg.url("ledger", proxy.port), make_engine(pg.url("ledger"))
    assert cli(["migrate"], db_url, None, p.dir).returncode == 0
    with following(p, broker, db_url, tmp_path) as run:
        run.producing.join(timeout=120)  # every wave acknowledged before the broker goes
        run.wait_committed(direct, run.waves * WAVE)
        broker.kill_broker(0)  # SIGKILL: every broker of the cluster gone
        try:
            time.sleep(20)
            run.alive()
        finally:
            broker.start_broker(0)
            broker.wait_ready()
        run.produce(10)  # and orders keep arriving
        print(f"failover matrix: Kafka down 20 s: next commit {run.next_commit(direct):.2f}s after the broker is back")
        scraped = run.finish(direct, db_url)
    _assert_outage_logged(run.log, "Kafka")
    assert _outages(scraped, "Kafka") >= 1, scraped
    direct.dispose()


def test_follow_rides_through_the_schema_registry_down_for_20_seconds(database, broker, make_pipeline, tmp_path):
    """An Avro pipeline: the batches read while the registry is away fail (nothing quarantined), and the
    follower waits; the producer keeps its schema id and keeps producing."""
    pg, proxy = database
    with DevRegistry() as registry:
        p = make_pipeline(partitions=2, batch__max_records=300, source__format="avro", source__schema=ORDER_COLUMNS,
                          source__schema_registry={"url": registry.url, "max.retries": "1", "retries.wait.ms": "50"})
        db_url, direct = pg.url("ledger", proxy.port), make_engine(pg.url("ledger"))
        assert cli(["migrate"], db_url, None, p.dir).returncode == 0
        encode = avro_encoder(registry.url, p.topic)
        encode({**ORDER, "id": 0})  # the schema registered before the registry goes
        with following(p, broker, db_url, tmp_path, lambda i: encode({**ORDER, "id": i})) as run:
            run.wait_committed(direct, 600)
            registry.stop()
            try:
                time.sleep(20)
                run.alive()
            finally:
                registry.start()
            print(f"failover matrix: registry down 20 s: next commit {run.next_commit(direct):.2f}s after it is back")
            scraped = run.finish(direct, db_url)
        with direct.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM ledger.quarantine")).scalar_one() == 0
    _assert_outage_logged(run.log, "schema registry")
    assert _outages(scraped, "schema registry") >= 1, scraped
    direct.dispose()


def test_follow_rides_through_its_spark_connect_server_killed_and_restarted(database, broker, make_pipeline,
                                                                            tmp_path):
    """The follower runs its batches on a Spark Connect server, which is killed (its whole process group)
    and started again on the same port: the follower opens a new session and carries on."""
    from ledgerbatch.spark.server import LocalConnectServer

    pg, proxy = database
    p = make_pipeline(partitions=2, batch__max_records=300)
    db_url, direct = pg.url("ledger", proxy.port), make_engine(pg.url("ledger"))
    assert cli(["migrate"], db_url, None, p.dir).returncode == 0
    server = LocalConnectServer("local[2]", output=open(tmp_path / "connect.log", "w"))
    try:
        with following(p, broker, db_url, tmp_path, spark=("--remote", server.url)) as run:
            run.wait_committed(direct, 1000)
            server.close()  # SIGTERM, then SIGKILL, to the server's group: JVM and Python workers
            time.sleep(3)
            run.alive()
            server = LocalConnectServer("local[2]", port=server.port, output=open(tmp_path / "connect2.log", "w"))
            print(f"failover matrix: Spark Connect restarted: next commit {run.next_commit(direct):.2f}s after it is back")
            scraped = run.finish(direct, db_url)
    finally:
        server.close()
    _assert_outage_logged(run.log, "Spark")
    assert _outages(scraped, "Spark") >= 1, scraped
    direct.dispose()


def test_an_ha_url_reaches_the_primary_from_the_driver_and_every_executor(database, broker, make_pipeline):
    """A libpq multi-host URL that names the standby first: the driver and the executors' COPY connections
    skip it for the primary (target_session_attrs=read-write), and the batch commits there."""
    pg, _ = database
    standby = pg.standby()
    try:
        url = (f"postgresql+psycopg2://postgres@/ledger?host=127.0.0.1:{standby.port}&host=127.0.0.1:{pg.port}"
               f"&target_session_attrs=read-write&connect_timeout=5&application_name=ledgerbatch-ha")
        engine = make_engine(url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_is_in_recovery()")).scalar_one() is False
        p = make_pipeline(partitions=2)
        assert cli(["migrate"], url, None, p.dir).returncode == 0
        acked = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(200)])
        done = cli(["run", p.name], url, broker.bootstrap_servers, p.dir)
        assert done.returncode == 0, done.stderr[-3000:]
        assert_exactly_once(engine, p, broker.bootstrap_servers, {(part, off) for part, off, _ in acked}, set())
        engine.dispose()
    finally:
        standby.destroy()


def test_the_event_driven_trigger_keeps_watching_through_a_database_restart(database, broker, make_pipeline,
                                                                            monkeypatch, caplog):
    """NewDataTrigger's looks fail while the database is down: one line when that starts, one when it ends,
    and then it fires for the records that arrived."""
    import asyncio
    import json

    from ledgerbatch.airflow.triggers import NewDataTrigger

    pg, proxy = database
    p = make_pipeline(partitions=1)
    assert cli(["migrate"], pg.url("ledger", proxy.port), None, p.dir).returncode == 0
    monkeypatch.setenv("AIRFLOW_CONN_LEDGERBATCH_DB", json.dumps(
        {"conn_type": "postgres", "host": "127.0.0.1", "port": proxy.port, "login": "postgres", "schema": "ledger"}))
    monkeypatch.setenv("AIRFLOW_CONN_LEDGERBATCH_KAFKA", json.dumps(
        {"conn_type": "generic", "extra": {"bootstrap.servers": broker.bootstrap_servers}}))
    trigger = NewDataTrigger(pipeline=p.name, pipelines_dir=str(p.dir), poll_interval=0.1)

    async def watch():
        events = trigger.run()
        first = asyncio.ensure_future(anext(events))
        await asyncio.sleep(1.0)  # the probe is open and looking: a pipeline that never ran fires at once
        assert (await asyncio.wait_for(first, 30)).payload["pipeline"] == p.name
        second = asyncio.ensure_future(anext(events))  # the trigger looks on while the generator is awaited
        await asyncio.to_thread(pg.stop)
        await asyncio.sleep(2.0)  # about 20 looks that fail
        await asyncio.to_thread(pg.start)
        await asyncio.to_thread(produce, broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(5)])
        event = await asyncio.wait_for(second, 60)
        await events.aclose()
        await trigger.cleanup()
        return event.payload

    trigger._log = logger = logging.getLogger("tests.outage.trigger")  # a plain logger in place of Airflow's
    logger.setLevel(logging.INFO)
    logger.addHandler(caplog.handler)
    try:
        payload = asyncio.run(watch())
    finally:
        logger.removeHandler(caplog.handler)
    assert payload["pending_offsets"] == 5
    # once per record: the logger may also reach caplog through the root, where Airflow's set-up leaves it
    lines = list(dict.fromkeys((r.created, r.getMessage()) for r in caplog.records if "outage" in r.getMessage()))
    lines = [message for _, message in lines]
    assert len(lines) == 2, lines
    assert f"{p.name}: outage started: database unavailable (" in lines[0] and "looking again every 0.1s" in lines[0]
    assert f"{p.name}: outage ended: database back after " in lines[1]
