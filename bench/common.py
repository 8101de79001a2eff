"""Shared pieces of the benchmark: databases, the broker child, data, the memory sampler, timing."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from ledgerbatch.source import kafka
from ledgerbatch.ledger.engine import fresh_database as create_database

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "plugins"))
# Every database the bench makes and drops; a unique prefix lets two bench runs share one server.
DB_PREFIX = os.environ.get("LEDGERBATCH_BENCH_DB_PREFIX", "lb_bench_")
SERVER_URL = os.environ.get("LEDGERBATCH_DB_URL") or "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
# Same columns as a ledgerbatch append target of the orders schema.
TARGET_COLUMNS = "order_id text, customer text, amount numeric(12,2), ts timestamp, _topic text, _partition integer, _offset bigint"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of every child: the venv first on PATH (spark-submit finds SPARK_HOME through it)."""
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYSPARK_PYTHON": sys.executable, **extra}


def fresh_database(name: str) -> str:
    """Drop and create database `name` (always prefixed DB_PREFIX) on the server; returns its URL."""
    assert name.startswith(DB_PREFIX), name
    return create_database(SERVER_URL, name)


def libpq(url: str) -> str:
    """psycopg2 wants a libpq URL, not SQLAlchemy's driver-qualified one."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def scalar(url: str, sql: str, **params):
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text(sql), params).scalar_one()
    finally:
        engine.dispose()


def count_rows(url: str, table: str) -> int:
    return scalar(url, f"SELECT count(*) FROM {table}")


BROKERS = {"kafka": "dev-kafka", "mock": "dev-broker"}  # --broker: real Apache Kafka 2.3, or librdkafka's mock


class BrokerProcess:
    """`ledgerbatch dev-kafka` (or `dev-broker`, the mock) as a child process, so that the broker never competes
    with the harness's GIL; it prints its bootstrap address once its topics exist."""

    def __init__(self, topics: dict[str, int], kind: str = "kafka"):
        args = [str(BIN / "ledgerbatch"), BROKERS[kind]] + [a for t, p in topics.items() for a in ("--topic", f"{t}:{p}")]
        self.kind = kind
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=child_env())
        self.bootstrap = self.proc.stdout.readline().strip()
        if not self.bootstrap:
            self.close()
            raise RuntimeError(f"`ledgerbatch {BROKERS[kind]}` did not print its bootstrap address")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)


def watermarks(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """(log start, end) of each partition of `topic`, as the planner sees them."""
    return {p: (wm.low, wm.high) for (_, p), wm in kafka.watermarks(bootstrap, (topic,)).items()}


def check_retained(bootstrap: str, topic: str, expected: int) -> None:
    """Every produced record must still be in the log from offset 0, or the contenders compare nothing."""
    marks = watermarks(bootstrap, topic)
    low = {p: lo for p, (lo, _) in marks.items() if lo != 0}
    retained = sum(hi - lo for lo, hi in marks.values())
    if low or retained != expected:
        raise SystemExit(f"{topic}: {retained} of {expected} records retained (log starts {low or 'all 0'}); "
                         f"(the mock broker keeps ~5 MiB per partition: use more partitions or fewer records)")


@dataclass
class Peaks:
    total: int = 0
    roles: dict[str, int] = field(default_factory=dict)

    def mib(self) -> dict:
        return {"total": round(self.total / 2**20, 1), **{k: round(v / 2**20, 1) for k, v in self.roles.items()}}


def roles(procs: list[psutil.Process]) -> dict[int, str]:
    """jvm (java), executor (any Python the JVM started: Spark's workers) or python (the driver, anything else)."""
    by_pid = {p.pid: p for p in procs}
    out: dict[int, str] = {}

    def role(p: psutil.Process) -> str:
        if p.pid not in out:
            try:
                name, parent = p.name(), by_pid.get(p.ppid())
            except psutil.Error:
                name, parent = "", None
            up = role(parent) if parent else "python"
            out[p.pid] = "jvm" if name == "java" else "executor" if up in ("jvm", "executor") else "python"
        return out[p.pid]

    for p in procs:
        role(p)
    return out


class TreeSampler:
    """Peak of the summed PSS of process trees, sampled every 250 ms, split by role.

    PSS, not RSS: Spark's Python workers are forked from one daemon and share most pages, so a sum
    of their RSS would count those pages once per worker. The sampler runs beside what it measures and
    costs more the bigger the tree: every 100 ms with psutil's full smaps it took 13-21% of a core during
    ledgerbatch's runs (9 ms a sample for Spark's JVM alone), so it reads the kernel's one-line sum
    (smaps_rollup) and samples less often."""

    def __init__(self, pids: list[int], interval: float = 0.25):
        self.roots = [psutil.Process(p) for p in pids]
        self.peaks = Peaks()
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "TreeSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            by_role: dict[str, int] = {}
            procs = []
            for root in self.roots:
                try:
                    procs += [root, *root.children(recursive=True)]
                except psutil.Error:
                    continue
            names = roles(procs)
            for proc in procs:
                name = names[proc.pid]
                try:
                    by_role[name] = by_role.get(name, 0) + _pss(proc)
                except (psutil.Error, OSError):
                    continue
            self.peaks.total = max(self.peaks.total, sum(by_role.values()))
            for name, size in by_role.items():
                self.peaks.roles[name] = max(self.peaks.roles.get(name, 0), size)
            self._stop.wait(self._interval)


def _pss(proc: psutil.Process) -> int:
    """A process's PSS in bytes, from /proc/PID/smaps_rollup (Linux 4.14+) where there is one."""
    try:
        with open(f"/proc/{proc.pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return proc.memory_full_info().pss


def run_measured(args: list[str], env: dict, timeout: float = 3600) -> tuple[float, Peaks, str, str]:
    """Run a child to completion; returns (wall seconds, memory peaks, stdout, stderr). Fails on a non-zero exit."""
    started = time.monotonic()
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    with TreeSampler([proc.pid]) as sampler:
        out, err = proc.communicate(timeout=timeout)
    wall = time.monotonic() - started
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args[:3])} ... exited {proc.returncode}:\n{err[-3000:]}")
    return wall, sampler.peaks, out, err


def median_run(runs: list[dict]) -> dict:
    """The run with the median wall time (its own memory and counts), plus every run's wall."""
    ordered = sorted(runs, key=lambda r: r["wall_s"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["walls_s"] = [round(r["wall_s"], 3) for r in runs]
    chosen["wall_s"] = statistics.median(r["wall_s"] for r in runs)
    return chosen
