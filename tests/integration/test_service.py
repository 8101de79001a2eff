"""Many pipelines in one service (`ledgerbatch run --follow --all`, ops/service.py): one process and one Spark
JVM; each pipeline exactly once; one stopped by its error stops alone; specs added and removed while it runs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from .helpers import REPO, assert_exactly_once, committed_offsets as committed, order_value, produce, \
    wait_committed

pytestmark = pytest.mark.integration


def jvms(group: int) -> int:
    """Java processes in the service's process group."""
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            name = stat.read_text().split("(", 1)[1].rsplit(")", 1)[0]
        except OSError:
            continue
        count += name == "java" and int(fields[2]) == group
    return count


def test_one_service_follows_many_pipelines_each_exactly_once(engine, db_url, broker, make_pipeline):
    a, b = make_pipeline(partitions=2), make_pipeline(partitions=2)
    strict = make_pipeline(partitions=1, errors={"policy": "fail"})  # its bad record stops it, and only it
    acked_a = produce(broker.bootstrap_servers, a.topic, [(i % 2, order_value(i)) for i in range(40)])
    acked_b = produce(broker.bootstrap_servers, b.topic, [(i % 2, order_value(i)) for i in range(40)])
    produce(broker.bootstrap_servers, strict.topic, [(0, order_value(0)), (0, b"{bad")])
    env = {**os.environ, "LEDGERBATCH_DB_URL": db_url, "LEDGERBATCH_PIPELINES_DIR": str(a.dir),
           "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers, "LEDGERBATCH_SPARK_MASTER": "local[2]"}
    service = subprocess.Popen([sys.executable, "-m", "ledgerbatch.cli", "run", "--follow", "--all", "--idle-seconds",
                                "0.2", "--rescan-seconds", "0.5"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_committed(engine, a.name, 40, service, 240)
        wait_committed(engine, b.name, 40, service, 240)
        assert jvms(service.pid) == 1  # one Spark for every pipeline

        c = make_pipeline(partitions=1)  # a spec added while the service runs is followed
        acked_c = produce(broker.bootstrap_servers, c.topic, [(0, order_value(i)) for i in range(10)])
        wait_committed(engine, c.name, 10, service, 240)
        respec_c = c.dir / f"{c.name}.yaml"  # a spec changed: its pipeline goes on under the new version
        respec_c.write_text(respec_c.read_text().replace("max_records: 100000", "max_records: 5"))
        time.sleep(2.0)
        acked_c += produce(broker.bootstrap_servers, c.topic, [(0, order_value(i)) for i in range(10, 20)])
        wait_committed(engine, c.name, 20, service, 240)
        copy = f"{a.name}_copy"  # a copy of a's spec under another name: it would write a's table again
        (a.dir / f"{copy}.yaml").write_text((a.dir / f"{a.name}.yaml").read_text().replace(
            f"name: {a.name}", f"name: {copy}"))
        (b.dir / f"{b.name}.yaml").unlink()  # a spec removed: that pipeline stops after the batch in hand
        time.sleep(2.0)
        produce(broker.bootstrap_servers, b.topic, [(0, order_value(40))])
        a_spec = a.dir / f"{a.name}.yaml"
        good_spec = a_spec.read_text()
        a_spec.write_text("name: [half written")  # a bad edit: a goes on as it was
        time.sleep(1.5)  # read the same on two scans: a bad edit, not one being written
        acked_a += produce(broker.bootstrap_servers, a.topic, [(0, order_value(i)) for i in range(40, 50)])
        wait_committed(engine, a.name, 50, service, 240)  # the others go on
        a_spec.write_text(good_spec)
        time.sleep(1.0)
        assert committed(engine, b.name) == 40
        service.send_signal(signal.SIGTERM)
        out, err = service.communicate(timeout=120)
    finally:
        if service.poll() is None:
            os.killpg(service.pid, signal.SIGKILL)
    (a.dir / f"{copy}.yaml").unlink()  # a's spec loads again (the checks below read it)
    assert service.returncode == 1, err  # one pipeline stopped with an error: said at the end
    assert f"{strict.name}: stopped: " in out and f"{a.name}: " in out and f"{c.name}: 2 batches committed" in out
    assert f"{strict.name} stopped: " in err and "the other pipelines go on" in err
    assert f"{b.name}: its spec was removed: stopping after the batch in hand" in err
    assert f"pipelines {copy} and {a.name} both write public.{a.table}" in err and committed(engine, copy) == 0
    assert f"{c.name}: its spec was changed: stopping after the batch in hand" in err
    assert f"{a.name} goes on under the spec it last loaded with" in err
    assert err.count(f"{a.name}.yaml does not load ({a.dir / a.name}.yaml: not valid YAML") == 1  # said once
    assert "1 of 3 pipelines stopped with an error" in err  # a and c followed to the end; b's spec is gone
    for p, acked in ((a, acked_a), (c, acked_c)):
        assert_exactly_once(engine, p, broker.bootstrap_servers, good={(part, o) for part, o, _ in acked}, bad=set())
    with engine.connect() as conn:
        assert conn.execute(text(f'SELECT count(*) FROM public."{b.table}"')).scalar_one() == len(acked_b)
    assert committed(engine, strict.name) == 0  # its batch failed whole: nothing of it delivered


@pytest.mark.parametrize("args, said", [
    (["run", "a", "b"], "several pipelines (or --all) run only with --follow"),
    (["run", "--follow", "--all", "a"], "name the pipelines to run, or give --all"),
    (["run", "--follow"], "name the pipelines to run, or give --all"),
])
def test_several_pipelines_are_refused_with_what_to_type(args, said, capsys):
    from ledgerbatch.cli import main

    assert main(args) == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("point", ["mid_read", "after_stage", "before_commit"])  # mid_read: in a turn's task
def test_a_service_killed_mid_batch_loses_and_duplicates_nothing_in_any_pipeline(engine, db_url, broker, make_pipeline,
                                                                                 point):
    pipes = [make_pipeline(partitions=2), make_pipeline(partitions=2)]
    acked = {p.name: produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(30)])
             for p in pipes}
    env = {**os.environ, "LEDGERBATCH_DB_URL": db_url, "LEDGERBATCH_PIPELINES_DIR": str(pipes[0].dir),
           "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers, "LEDGERBATCH_SPARK_MASTER": "local[2]"}
    command = [sys.executable, "-m", "ledgerbatch.cli", "run", "--follow", "--all", "--idle-seconds", "0.2"]
    killed = subprocess.run(command, env={**env, "LEDGERBATCH_CRASH_AT": point}, cwd=REPO, capture_output=True,
                            text=True, timeout=300, start_new_session=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]  # the first pipeline to get there kills all
    service = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        for p in pipes:
            wait_committed(engine, p.name, 30, service, 240)
        service.send_signal(signal.SIGTERM)
        service.communicate(timeout=120)
    finally:
        if service.poll() is None:
            os.killpg(service.pid, signal.SIGKILL)
    assert service.returncode == 0
    for p in pipes:
        assert_exactly_once(engine, p, broker.bootstrap_servers, good={(part, o) for part, o, _ in acked[p.name]},
                            bad=set())
