"""Capacity: N pipelines, each its own topic fed `--rate` records a second, in ONE `ledgerbatch run --follow --all`
service (ops/service.py; plain batches staged in turns of one Spark job, stage/turns.py), on real Kafka.

    python -m bench.capacity --pipelines 1,10,30,100 --rate 20 --seconds 60
    python -m bench.capacity --pipelines 100 --backlog 1000000   # one pipeline 1,000,000 records behind

For each N: produced->committed per record (the record's Kafka timestamp, kept as `_timestamp`, to its batch's
`committed_at`, which is the commit transaction's start: its COMMIT comes milliseconds later), p50 and p99 of
each pipeline over the records produced in the measured window (after `--warmup` seconds); batches committed a
second in all; CPU (cores busy, the service's process tree); peak memory (PSS of the tree: Spark's Python
workers share pages); peak PostgreSQL connections to the pipelines' database; peak Kafka connections of the
service's tree (established TCP connections to the broker); and that every produced record is in its target
exactly once. JSON to `--out`.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil
import yaml
from confluent_kafka import Producer
from sqlalchemy import create_engine, text

from .common import BIN, DB_PREFIX, REPO, SERVER_URL, BrokerProcess, TreeSampler, child_env, fresh_database
from .lb import migrate

from ledgerbatch.dev.demodata import order  # noqa: E402

SCHEMA = "order_id STRING, customer STRING, amount DECIMAL(12,2), ts TIMESTAMP"


def names(n: int) -> list[str]:
    return [f"cap{i:03d}" for i in range(n)]


def write_specs(directory: Path, pipelines: list[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in pipelines:
        doc = {"name": name, "source": {"topics": [name], "format": "json", "schema": SCHEMA, "metadata": ["timestamp"]},
               "target": {"table": f"public.{name}", "mode": "append"},
               "errors": {"policy": "quarantine", "max_ratio": 0.5}}
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


class Feed(threading.Thread):
    """`rate` records a second into each topic, spread over its partitions, in ticks of 50 ms."""

    def __init__(self, bootstrap: str, pipelines: list[str], rate: float, partitions: int):
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3})
        self.pipelines, self.rate, self.partitions = pipelines, rate, partitions
        self.stop, self.sent = threading.Event(), {name: 0 for name in pipelines}

    def run(self) -> None:
        started, tick, done = time.monotonic(), 0.05, 0
        while not self.stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            for i in range(done, due):
                for name in self.pipelines:
                    self.producer.produce(name, value=order(i), partition=i % self.partitions)
                    self.sent[name] += 1
            done = due
            self.producer.poll(0)
            self.stop.wait(tick)
        assert self.producer.flush(60) == 0
        self.producer = None  # gone before the broker is: no reconnect noise


class Peaks(threading.Thread):
    """Peak PostgreSQL connections to `db` and peak Kafka connections (to `port`) of the service's tree."""

    def __init__(self, url: str, db: str, pid: int, port: int):
        super().__init__(daemon=True)
        self.engine, self.db, self.root, self.port = create_engine(url), db, psutil.Process(pid), port
        self.stop, self.pg, self.kafka = threading.Event(), 0, 0

    def run(self) -> None:
        while not self.stop.wait(1.0):
            with self.engine.connect() as conn:  # this look's own connection is left out
                self.pg = max(self.pg, conn.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"),
                    {"d": self.db}).scalar_one())
            try:
                pids = {self.root.pid, *(p.pid for p in self.root.children(recursive=True))}
            except psutil.Error:
                continue
            self.kafka = max(self.kafka, sum(1 for c in psutil.net_connections("tcp") if c.pid in pids and c.raddr
                                              and c.raddr.port == self.port and c.status == psutil.CONN_ESTABLISHED))
        self.engine.dispose()


def busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (PostgreSQL and the broker too, which the service's tree leaves out)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def cpu_seconds(pid: int) -> float:
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return total
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return total


def preload(bootstrap: str, topic: str, records: int, partitions: int) -> int:
    """`records` into `topic` before the service starts (a backlog); returns how many."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "log_level": 3,
                         "queue.buffering.max.messages": 1_000_000})
    for i in range(records):
        producer.produce(topic, value=order(i), partition=i % partitions)
        if i % 100_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0
    return records


def delivered(engine, pipelines: list[str]) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT pipeline, sum(next_offset - start_offset) FROM ledger.cursors GROUP BY 1")).all()
    found = {p: int(n) for p, n in rows}
    return {name: found.get(name, 0) for name in pipelines}


def freshness(engine, name: str, window: tuple[datetime, datetime]) -> tuple[float, float, int]:
    """p50 and p99 seconds produced->committed of the records produced in the window, and how many."""
    with engine.connect() as conn:
        row = conn.execute(text(
            f"SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s), percentile_cont(0.99) WITHIN GROUP (ORDER BY s), "
            f"count(*) FROM (SELECT extract(epoch FROM b.committed_at - t._timestamp) AS s FROM public.{name} t "
            f"JOIN ledger.batches b ON b.batch_id = t._batch_id WHERE t._timestamp >= :lo AND t._timestamp < :hi) x"),
            {"lo": window[0], "hi": window[1]}).one()
    return float(row[0] or 0), float(row[1] or 0), int(row[2])


def exactly_once(engine, name: str, sent: int) -> bool:
    with engine.connect() as conn:
        rows, distinct = conn.execute(text(
            f"SELECT count(*), count(DISTINCT (_partition, _offset)) FROM public.{name}")).one()
    return rows == distinct == sent


def one(n: int, args) -> dict:
    pipelines = names(n)
    workdir = Path(tempfile.mkdtemp(prefix="lb_capacity_"))
    broker = BrokerProcess({name: args.partitions for name in pipelines})
    db = f"{DB_PREFIX}capacity"
    url = fresh_database(db)
    env = child_env(LEDGERBATCH_DB_URL=url, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap,
                    LEDGERBATCH_PIPELINES_DIR=str(workdir))
    write_specs(workdir, pipelines)
    migrate(env)
    engine = create_engine(url)
    feed = Feed(broker.bootstrap, pipelines, args.rate, args.partitions)
    if args.backlog:  # the first pipeline starts this far behind, beside the quiet others
        feed.sent[pipelines[0]] += preload(broker.bootstrap, pipelines[0], args.backlog, args.partitions)
    log = workdir / "service.log"
    service = subprocess.Popen([str(BIN / "ledgerbatch"), "run", "--follow", "--all", "--idle-seconds",
                                f"{args.idle_seconds:g}", "--master", args.master], env=env, cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=log.open("w"), start_new_session=True)
    peaks = Peaks(url, db, service.pid, int(broker.bootstrap.rsplit(":", 1)[1]))
    try:
        feed.start()
        deadline = time.monotonic() + args.drain
        while min(committed_by(engine, pipelines).values()) == 0:  # Spark started, every target made
            if service.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the service did not start every pipeline: {log.read_text()[-3000:]}")
            time.sleep(0.5)
        time.sleep(args.warmup)
        with TreeSampler([service.pid]) as memory:
            peaks.start()
            lo, cpu0, batches0 = datetime.now(timezone.utc), cpu_seconds(service.pid), committed(engine)
            backlog_left = feed.sent[pipelines[0]] - delivered(engine, pipelines[:1])[pipelines[0]]
            machine0 = busy_seconds()
            started = time.monotonic()
            time.sleep(args.seconds)
            hi, cpu1, batches1 = datetime.now(timezone.utc), cpu_seconds(service.pid), committed(engine)
            machine1 = busy_seconds()
            seconds = time.monotonic() - started
        feed.stop.set()
        feed.join()
        deadline = time.monotonic() + args.drain
        while delivered(engine, pipelines) != feed.sent and time.monotonic() < deadline:
            if service.poll() is not None:
                raise RuntimeError(f"the service exited ({service.returncode}): {log.read_text()[-3000:]}")
            time.sleep(1)
        peaks.stop.set()
        peaks.join()
    finally:
        feed.stop.set()
        if service.poll() is None:
            os.killpg(service.pid, signal.SIGTERM)
            service.wait(300)
        broker.close()
    fresh = {name: freshness(engine, name, (lo, hi)) for name in pipelines}
    once = all(exactly_once(engine, name, feed.sent[name]) for name in pipelines)
    turns = [line for line in log.read_text().splitlines() if "in one Spark job" in line]
    engine.dispose()
    with create_engine(SERVER_URL, isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
    behind = fresh.pop(pipelines[0]) if args.backlog else None
    p50s, p99s = [f[0] for f in fresh.values()], [f[1] for f in fresh.values()]
    return {"pipelines": n, "rate": args.rate, "seconds": round(seconds, 1), "backlog": args.backlog,
            **({"backlog_pipeline": {"freshness_p50_s": round(behind[0], 2), "freshness_p99_s": round(behind[1], 2),
                                     "backlog_left_at_window": backlog_left}} if args.backlog else {}),
            "records_measured": sum(f[2] for f in fresh.values()),
            "freshness_p50_s": {"median": round(statistics.median(p50s), 2), "max": round(max(p50s), 2)},
            "freshness_p99_s": {"median": round(statistics.median(p99s), 2), "max": round(max(p99s), 2)},
            "batches_per_s": round((batches1 - batches0) / seconds, 2),
            "cpu_cores": round((cpu1 - cpu0) / seconds, 2), "machine_cores_busy": round((machine1 - machine0) / seconds, 2),
            "memory_mib": memory.peaks.mib(),
            "pg_connections_peak": peaks.pg, "kafka_connections_peak": peaks.kafka,
            "turns": len(turns), "exactly_once": once}


def committed_by(engine, pipelines: list[str]) -> dict[str, int]:
    with engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT pipeline, count(*) FROM ledger.batches WHERE status = 'committed' "
                                      "GROUP BY 1")).all())
    return {name: rows.get(name, 0) for name in pipelines}


def committed(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM ledger.batches WHERE status = 'committed'")).scalar_one()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", default="1,10,30,100", help="the Ns to measure, comma-separated")
    parser.add_argument("--rate", type=float, default=20.0, help="records a second into each pipeline's topic")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    parser.add_argument("--warmup", type=float, default=20.0,
                        help="seconds fed before the window, once every pipeline committed its first batch")
    parser.add_argument("--drain", type=float, default=300.0, help="at most this long to deliver the rest after it")
    parser.add_argument("--idle-seconds", type=float, default=0.2, help="the service's --idle-seconds")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--backlog", type=int, default=0,
                        help="records produced into the first pipeline's topic before the service starts; the "
                             "others' freshness is reported without it (its own apart)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "capacity")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for n in (int(x) for x in args.pipelines.split(",")):
        results.append(one(n, args))
        print(json.dumps(results[-1]), flush=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    (args.out / f"capacity-{stamp}.json").write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()},
                                                                 "load_average": os.getloadavg(), "results": results},
                                                                indent=2))
    return 0 if all(r["exactly_once"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
