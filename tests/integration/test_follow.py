"""`ledgerbatch run --follow`: one warm Spark session across batches, exactly once, SIGTERM stops it cleanly."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from .helpers import REPO, assert_exactly_once, order_value, produce, wait_committed

pytestmark = pytest.mark.integration


def test_follow_keeps_spark_warm_and_delivers_each_wave_once(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=2, batch__max_records=1000)
    first = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(50)])
    env = {**os.environ, "LEDGERBATCH_DB_URL": db_url, "LEDGERBATCH_PIPELINES_DIR": str(p.dir),
           "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers, "LEDGERBATCH_SPARK_MASTER": "local[2]"}
    follower = subprocess.Popen([sys.executable, "-m", "ledgerbatch.cli", "run", p.name, "--follow", "--idle-seconds", "0.2"],
                                env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    try:
        cold = wait_committed(engine, p.name, 50, follower)
        time.sleep(1.5)  # idle: it looks again several times, and says so once
        second = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i) if i != 60 else b"{bad")
                                                             for i in range(50, 100)])
        warm = wait_committed(engine, p.name, 100, follower)
        # The second wave reuses the running session: far quicker than the first, which started Spark.
        assert warm < cold, (warm, cold)
        time.sleep(1.0)
        follower.send_signal(signal.SIGTERM)
        out, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            os.killpg(follower.pid, signal.SIGKILL)
    assert follower.returncode == 0, err
    assert f"{p.name}: 2 batches committed, 100 records read, 99 rows written, 1 quarantined" in out
    assert err.count("caught up, nothing to plan; following") == 2, err  # once per idle spell, not per look
    acked = first + second
    assert_exactly_once(engine, p, broker.bootstrap_servers,
                        good={(part, off) for part, off, v in acked if v != b"{bad"},
                        bad={(part, off) for part, off, v in acked if v == b"{bad"})
