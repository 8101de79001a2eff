"""Small-batch latency: 100 new records until committed, cold (a fresh `ledgerbatch run`, so a fresh
spark-submit and JVM) and warm (one `ledgerbatch run --follow` driver that keeps its SparkSession)."""
from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from ledgerbatch.dev.demodata import produce_orders

from . import lb
from .common import BIN, DB_PREFIX, REPO, count_rows, fresh_database, run_measured

NAME = "bench_latency"
RECORDS = 100


class Latency:
    def __init__(self, bootstrap: str, topic: str, partitions: int, workdir: Path):
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.url = fresh_database(f"{DB_PREFIX}latency")
        self.workdir = workdir / "latency"
        self.table = lb.write_spec(self.workdir, NAME, topic, 100_000)
        self.env = lb.env_for(self.url, bootstrap, self.workdir)
        lb.migrate(self.env)
        self.produced = 0

    def produce(self) -> None:
        produce_orders(self.bootstrap, self.topic, RECORDS, self.partitions, start=self.produced)
        self.produced += RECORDS

    def check(self) -> None:
        rows = count_rows(self.url, self.table)
        if rows != self.produced:
            raise RuntimeError(f"latency pipeline: {rows} rows for {self.produced} records produced")

    def cold(self, repeats: int) -> dict:
        walls = []
        for _ in range(repeats):
            self.produce()
            wall, _, _, _ = run_measured([str(BIN / "ledgerbatch"), "run", NAME], self.env)
            walls.append(wall)
            self.check()
        return {"median_s": statistics.median(walls), "walls_s": [round(w, 3) for w in walls]}

    def warm(self, repeats: int, idle_seconds: float = 0.1, timeout: float = 180) -> dict:
        usage = subprocess.run([str(BIN / "ledgerbatch"), "run", "--help"], env=self.env, capture_output=True, text=True).stdout
        if "--follow" not in usage:
            return {"median_s": None, "note": "`ledgerbatch run --follow` is not available in this build"}
        self.follower_log = self.workdir / "follower.log"
        follower = subprocess.Popen([str(BIN / "ledgerbatch"), "run", NAME, "--follow", "--idle-seconds", str(idle_seconds)],
                                    env=self.env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=self.follower_log.open("w"),
                                    start_new_session=True)
        engine = create_engine(self.url)
        try:
            self.produce()
            self._wait_delivered(engine, follower, timeout)  # the first batch pays for the JVM: not measured
            walls, ledger = [], []
            for _ in range(repeats):
                self.produce()
                started = time.monotonic()  # the records are in Kafka (flushed)
                self._wait_delivered(engine, follower, timeout)
                walls.append(time.monotonic() - started)
                with engine.connect() as conn:
                    ledger.append(conn.execute(text(
                        "SELECT extract(epoch FROM committed_at - created_at) FROM ledger.batches "
                        "WHERE pipeline = :p AND status = 'committed' ORDER BY batch_id DESC LIMIT 1"), {"p": NAME}).scalar_one())
        finally:
            engine.dispose()
            follower.send_signal(signal.SIGTERM)
            try:
                follower.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(follower.pid, signal.SIGKILL)
                follower.wait()
        self.check()
        return {"median_s": statistics.median(walls), "walls_s": [round(w, 3) for w in walls],
                "ledger_median_s": float(statistics.median(ledger))}

    def _wait_delivered(self, engine, follower: subprocess.Popen, timeout: float) -> None:
        """Poll every 50 ms until the cursors cover every produced record (they move only in a commit)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                done = conn.execute(text("SELECT coalesce(sum(next_offset), 0) FROM ledger.cursors WHERE pipeline = :p"),
                                    {"p": NAME}).scalar_one()
            if done >= self.produced:
                return
            if follower.poll() is not None:
                raise RuntimeError(f"the follower exited {follower.returncode}: see {self.follower_log}")
            time.sleep(0.05)
        raise RuntimeError(f"the follower did not commit {self.produced} records within {timeout:.0f}s")
