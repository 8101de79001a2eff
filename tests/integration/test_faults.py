"""Fault injection with real processes: SIGKILL at every crash point, concurrent runners, a zombie
attempt woken after a newer one committed, lost data acknowledged. Recovery is simply running again."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import text

from ledgerbatch.ledger.batches import get_batch
from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.ops.loss import acknowledge_loss
from ledgerbatch.ops.verify import verify

from .helpers import REPO, assert_exactly_once, cli, delete_records, end_offsets, order_value, produce

pytestmark = pytest.mark.integration

EXPECTED_AFTER_CRASH = {  # point -> (status of the first batch, its attempt)
    "after_plan": ("planned", 0),
    "mid_read": ("planned", 1),
    "after_stage": ("staged", 1),
    "before_commit": ("staged", 1),
    "after_commit": ("committed", 1),
}


def known_data(broker, p, n=1000):
    acked = produce(broker.bootstrap_servers, p.topic, [(i % p.partitions, order_value(i) if i % 97 else b"bad") for i in range(n)])
    return {(a[0], a[1]) for a in acked if a[2] != b"bad"}, {(a[0], a[1]) for a in acked if a[2] == b"bad"}


def first_batch(engine, p):
    with engine.connect() as conn:
        return conn.execute(text("SELECT batch_id, status, attempt FROM ledger.batches WHERE pipeline = :p ORDER BY batch_id"),
                            {"p": p.name}).first()


@pytest.mark.parametrize("point", list(EXPECTED_AFTER_CRASH))
def test_sigkill_at_each_crash_point_then_resume(point, engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=3, batch__max_records=400)
    good, bad = known_data(broker, p)

    crashed = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir, LEDGERBATCH_CRASH_AT=point)
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    if point != "mid_read":  # an executor's message dies with the JVM that would forward it
        assert f"SIGKILL at {point}" in crashed.stderr
    batch = first_batch(engine, p)
    assert (batch.status, batch.attempt) == EXPECTED_AFTER_CRASH[point]
    with engine.connect() as conn:
        moved = conn.execute(text("SELECT count(*) FROM ledger.cursors WHERE pipeline = :p AND last_batch_id IS NOT NULL"),
                             {"p": p.name}).scalar_one()
    assert (moved > 0) == (point == "after_commit")
    deadline = time.monotonic() + 15  # SIGKILL is delivered to every member, but they die asynchronously
    while _group_members(crashed) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _group_members(crashed) == [], "processes of the killed group survived"

    resumed = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    if point != "after_commit":
        assert f"resuming batch {batch.batch_id} ({batch.status}" in resumed.stderr
    assert_exactly_once(engine, p, broker.bootstrap_servers, good, bad)


def _group_members(completed) -> list[int]:
    """Processes still alive in the killed run's process group (its Spark JVM, Python workers)."""
    import psutil

    alive = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == completed.pgid and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return alive


def _popen_run(p, db_url, broker, **env) -> subprocess.Popen:
    full_env = {**os.environ, "LEDGERBATCH_DB_URL": db_url, "LEDGERBATCH_PIPELINES_DIR": str(p.dir),
                "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers, "LEDGERBATCH_SPARK_MASTER": "local[2]", **env}
    return subprocess.Popen([sys.executable, "-m", "ledgerbatch.cli", "run", p.name], env=full_env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_two_runners_at_once_commit_each_batch_once(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=2, batch__max_records=300)
    good, bad = known_data(broker, p)
    runners = [_popen_run(p, db_url, broker) for _ in range(2)]
    outputs = [r.communicate(timeout=600) for r in runners]
    codes = [r.returncode for r in runners]
    assert 0 in codes, outputs
    for code, (_, err) in zip(codes, outputs):
        if code:  # the loser of a race stops with a clear message, never with a half-done batch
            assert "FencedError" in err or "already" in err, err[-2000:]
    finished = subprocess.run([sys.executable, "-m", "ledgerbatch.cli", "run", p.name], capture_output=True, text=True,
                              cwd=REPO, env={**os.environ, "LEDGERBATCH_DB_URL": db_url, "LEDGERBATCH_PIPELINES_DIR": str(p.dir),
                                             "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
                                             "LEDGERBATCH_SPARK_MASTER": "local[2]"}, timeout=600)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert_exactly_once(engine, p, broker.bootstrap_servers, good, bad)


def test_stale_attempt_woken_after_newer_commit_is_refused(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=2)
    good, bad = known_data(broker, p, n=600)
    zombie = _popen_run(p, db_url, broker)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        batch = first_batch(engine, p)
        if batch is not None and batch.attempt == 1:
            break
        time.sleep(0.05)
    os.killpg(zombie.pid, signal.SIGSTOP)  # the whole attempt freezes: driver, JVM, Python workers
    try:
        newer = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
        assert newer.returncode == 0, newer.stderr[-2000:]
        assert first_batch(engine, p).status == "committed" and first_batch(engine, p).attempt == 2
    finally:
        os.killpg(zombie.pid, signal.SIGCONT)
    _, err = zombie.communicate(timeout=600)
    assert zombie.returncode == 1, err[-3000:]
    assert "FencedError" in err and "attempt 1" in err, err[-3000:]
    assert_exactly_once(engine, p, broker.bootstrap_servers, good, bad)


def test_lost_offsets_stop_the_pipeline_until_acknowledged(engine, db_url, broker, spark, make_pipeline):
    from ledgerbatch.plan.live import plan_next

    p = make_pipeline(partitions=1)
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(10)])
    batch = plan_next(engine, p.spec, broker.bootstrap_servers)
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(10, 30)])
    delete_records(broker.bootstrap_servers, p.topic, 0, 15)  # as retention would
    low, high = end_offsets(broker.bootstrap_servers, p.topic, 1)[0]

    stuck = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert stuck.returncode == 1 and "DataLossError" in stuck.stderr and "acknowledge-loss" in stuck.stderr
    status = cli(["status", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert "LOST: cursor before the log start" in status.stdout

    no_name = cli(["acknowledge-loss", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert no_name.returncode == 2 and "--by" in no_name.stderr
    ack = cli(["acknowledge-loss", p.name, "--by", "alice", "--reason", "INC-42 retention"], db_url,
              broker.bootstrap_servers, p.dir)
    assert ack.returncode == 0, ack.stderr
    assert f"recorded lost {p.topic}[0] [0, {low}) ({low} offsets), acknowledged by alice" in ack.stdout
    with engine.connect() as conn:
        lost = conn.execute(text("SELECT from_offset, until_offset, acknowledged_by, reason FROM ledger.lost_ranges "
                                 "WHERE pipeline = :p"), {"p": p.name}).one()
        assert tuple(lost) == (0, low, "alice", "INC-42 retention")
        assert get_batch(conn, batch.batch_id).status == "abandoned"

    done = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{high - low} records read" in done.stdout
    assert verify(engine, p.spec) == []
    with pytest.raises(LedgerbatchError, match="nothing is lost"):
        acknowledge_loss(engine, p.spec, broker.bootstrap_servers, "bob", None)


def test_acknowledge_loss_commits_a_staged_batch_and_records_only_what_is_gone(engine, db_url, broker, spark,
                                                                               make_pipeline):
    """A staged batch needs nothing from Kafka: acknowledge-loss commits it, then records as lost only
    the offsets after it that retention deleted."""
    from ledgerbatch.plan.live import plan_next
    from ledgerbatch.stage.process import process_batch

    p = make_pipeline(partitions=1)
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(10)])
    batch = plan_next(engine, p.spec, broker.bootstrap_servers)
    staged = process_batch(spark, engine, p.spec, batch.batch_id, db_url, broker.bootstrap_servers)
    assert (staged.status, staged.records_read) == ("staged", 10)
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(10, 30)])
    delete_records(broker.bootstrap_servers, p.topic, 0, 15)  # as retention would
    low, _ = end_offsets(broker.bootstrap_servers, p.topic, 1)[0]
    assert low == 15

    lost = acknowledge_loss(engine, p.spec, broker.bootstrap_servers, "alice", "retention")
    assert [(r.from_offset, r.until_offset) for r in lost] == [(10, low)]
    with engine.connect() as conn:
        assert get_batch(conn, batch.batch_id).status == "committed"
        assert conn.execute(text(f'SELECT count(*) FROM public."{p.table}"')).scalar() == 10
        assert conn.execute(text("SELECT from_offset, until_offset FROM ledger.lost_ranges WHERE pipeline = :p"),
                            {"p": p.name}).all() == [(10, low)]
    assert verify(engine, p.spec) == []


def test_backend_terminated_inside_commit_is_resolved_by_the_ledger(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=2)
    good, bad = known_data(broker, p, n=300)
    cut = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir, LEDGERBATCH_TERMINATE_AT="before_commit")
    assert cut.returncode == 1, cut.stderr[-2000:]
    assert "database connection lost during commit" in cut.stderr and "run again" in cut.stderr
    assert first_batch(engine, p).status == "staged"
    resumed = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_exactly_once(engine, p, broker.bootstrap_servers, good, bad)
