"""Runs the peer DAG (bench/dags/bench_peer.py) with dag.test() in a child process per run.

The harness side (`run`) prepares a throw-away AIRFLOW_HOME, a PostgreSQL metadata database (migrated
once per harness run) and a fresh target database per run; the child (`python -m bench.peer`) times
dag.test() alone, so Airflow's import and start-up are not counted against it.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg2

from .common import BIN, DB_PREFIX, REPO, TARGET_COLUMNS, child_env, count_rows, fresh_database, libpq, run_measured

TABLE = "peer_orders"
MARK = "BENCH_PEER_RESULT "


class Peer:
    def __init__(self, bootstrap: str, topic: str, records: int, batch_size: int = 10_000):
        self.home = Path(tempfile.mkdtemp(prefix="lb_bench_airflow-"))
        self.env = child_env(
            AIRFLOW_HOME=str(self.home),
            AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "bench" / "dags"),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=fresh_database(f"{DB_PREFIX}airflow"),
            BENCH_PEER_TOPIC=topic, BENCH_PEER_RECORDS=str(records), BENCH_PEER_BATCH=str(batch_size),
            BENCH_PEER_TABLE=TABLE,
        )
        self.bootstrap = bootstrap
        done = subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=self.env, capture_output=True, text=True,
                              timeout=900)
        if done.returncode:
            raise RuntimeError(f"airflow db migrate failed: {done.stderr[-2000:]}")

    def close(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)

    def run(self, db_name: str) -> dict:
        url = fresh_database(db_name)
        with psycopg2.connect(libpq(url)) as pg, pg.cursor() as cur:
            cur.execute(f"CREATE TABLE {TABLE} ({TARGET_COLUMNS})")
        pg.close()
        # A new consumer group per run: each run reads the topic from the start.
        kafka = {"bootstrap.servers": self.bootstrap, "group.id": f"bench-peer-{uuid.uuid4().hex[:8]}",
                 "auto.offset.reset": "earliest", "enable.auto.commit": False}
        env = {**self.env, "BENCH_PEER_DSN": libpq(url),
               "AIRFLOW_CONN_BENCH_KAFKA": json.dumps({"conn_type": "kafka", "extra": kafka})}
        process_wall, peaks, out, _ = run_measured([sys.executable, "-m", "bench.peer"], env)
        result = json.loads(next(line[len(MARK):] for line in reversed(out.splitlines()) if line.startswith(MARK)))
        if result["state"] != "success":
            raise RuntimeError(f"peer DAG run ended {result['state']}")
        return {"wall_s": result["dag_test_s"], "process_wall_s": process_wall, "rows": count_rows(url, TABLE),
                "memory_mib": peaks.mib()}


def main() -> None:
    sys.path.insert(0, str(REPO / "bench" / "dags"))
    from bench_peer import dag

    started = time.monotonic()
    run = dag.test()
    print(MARK + json.dumps({"dag_test_s": time.monotonic() - started, "state": str(run.state)}), flush=True)


if __name__ == "__main__":
    main()
