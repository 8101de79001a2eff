"""The CLI as users run it: crash recovery with SIGKILL, and one-line errors for bad input."""
from __future__ import annotations

import pytest

from .helpers import assert_exactly_once, cli, order_value, produce

pytestmark = pytest.mark.integration


def test_cli_errors_are_one_line(tmp_path, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=1)
    missing = cli(["run", "nope"], db_url, broker.bootstrap_servers, p.dir)
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"ledgerbatch: bad pipeline spec: pipeline 'nope' not found: no {p.dir}/nope.yaml (pipelines there: {p.name})"

    (p.dir / "evil.yaml").write_text(
        "name: evil\nsource: {topics: [x], schema: 'a STRING'}\ntarget: {table: 'x; DROP TABLE y'}\n")
    evil = cli(["run", "evil"], db_url, broker.bootstrap_servers, p.dir)
    assert evil.returncode == 2 and "is not a valid identifier" in evil.stderr and len(evil.stderr.strip().splitlines()) == 1

    (p.dir / "typo.yaml").write_text("name: typo\nsource: {topics: [x], schema: 'a STRING', shema: 1}\ntarget: {table: t}\n")
    typo = cli(["run", "typo"], db_url, broker.bootstrap_servers, p.dir)
    assert typo.returncode == 2 and "unknown key(s) shema" in typo.stderr

    no_db = cli(["run", p.name], "postgresql+psycopg2://nobody:s3cret@127.0.0.1:1/x", broker.bootstrap_servers, p.dir)
    assert no_db.returncode == 2 and "is not reachable" in no_db.stderr and "s3cret" not in no_db.stderr
    assert len(no_db.stderr.strip().splitlines()) == 1

    no_broker = cli(["run", p.name], db_url, None, p.dir)
    assert no_broker.returncode == 2 and "KAFKA_BOOTSTRAP_SERVERS is not set" in no_broker.stderr

    bad_arg = cli(["run", p.name, "--max-batches", "0"], db_url, broker.bootstrap_servers, p.dir)
    assert bad_arg.returncode == 2 and "must be at least 1" in bad_arg.stderr
    bad_idle = cli(["run", p.name, "--follow", "--idle-seconds", "nan"], db_url, broker.bootstrap_servers, p.dir)
    assert bad_idle.returncode == 2 and "--idle-seconds: must be more than 0" in bad_idle.stderr


def test_status_shows_cursors_and_lag(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=2)
    produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(10)])
    done = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert done.returncode == 0, done.stderr[-2000:]
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(99))])
    status = cli(["status", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert status.returncode == 0, status.stderr
    assert f"{p.topic}[0]" in status.stdout and "total lag: 1" in status.stdout
    assert "committed attempt=1 read=10 written=10 quarantined=0" in status.stdout


def test_spark_submit_entry_point_stages_a_planned_batch(engine, db_url, broker, make_pipeline):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from ledgerbatch.commit.transaction import commit_batch
    from ledgerbatch.plan.live import plan_next

    p = make_pipeline(partitions=2)
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(200)])
    batch = plan_next(engine, p.spec, broker.bootstrap_servers)
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "LEDGERBATCH_DB_URL": db_url, "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
           "LEDGERBATCH_PIPELINES_DIR": str(p.dir), "PATH": bindir + os.pathsep + os.environ["PATH"]}
    done = subprocess.run([f"{bindir}/spark-submit", "--master", "local[2]", "spark_jobs/process_batch.py",
                           "--pipeline", p.name, "--batch-id", str(batch.batch_id)],
                          env=env, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    commit_batch(engine, p.spec, batch.batch_id)
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())
