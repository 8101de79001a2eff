"""The floor: what a hand-written consumer costs. Two OS processes (one per core), each owning half the
partitions: assign() from offset 0, consume until the position reaches the end watermark, json.loads,
COPY into one plain table. No ledger, no exactly-once: the least work that moves the data.

A worker runs as: python -m bench.floor WORKER_JSON
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import psycopg2
from confluent_kafka import Consumer, TopicPartition

from .common import REPO, TARGET_COLUMNS, TreeSampler, child_env, count_rows, fresh_database, libpq

TABLE = "floor_orders"
CHUNK = 50_000
_ESCAPE = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _field(value) -> str:
    return "\\N" if value is None else str(value).translate(_ESCAPE)


def worker(bootstrap: str, topic: str, partitions: list[int], dsn: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-floor", "enable.auto.commit": False,
                         "log_level": 3})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in partitions}
    left = {p: end for p, end in ends.items() if end > 0}  # offsets still to come per partition
    consumer.assign([TopicPartition(topic, p, 0) for p in left])
    pg = psycopg2.connect(dsn)
    buf, rows = io.StringIO(), 0

    def flush() -> None:
        buf.seek(0)
        with pg.cursor() as cur:
            cur.copy_expert(f"COPY {TABLE} FROM STDIN", buf)
        pg.commit()
        buf.seek(0)
        buf.truncate()

    while left:
        # consume(n) waits for all n messages: never ask for more than is left.
        for msg in consumer.consume(min(10_000, sum(left.values())), timeout=1.0):
            if msg.error():
                raise RuntimeError(msg.error().str())
            o = json.loads(msg.value())
            buf.write("\t".join((_field(o.get("order_id")), _field(o.get("customer")), _field(o.get("amount")),
                                 _field(o.get("ts")), topic, str(msg.partition()), str(msg.offset()))) + "\n")
            rows += 1
            if rows % CHUNK == 0:
                flush()
        # Done by position, not by count: offsets need not be contiguous.
        for tp in consumer.position([TopicPartition(topic, p) for p in left]):
            if tp.offset >= ends[tp.partition]:
                del left[tp.partition]
            elif tp.offset >= 0:
                left[tp.partition] = ends[tp.partition] - tp.offset
    flush()
    consumer.close()
    pg.close()
    return rows


def run(bootstrap: str, topic: str, partitions: int, db_name: str, processes: int = 2) -> dict:
    url = fresh_database(db_name)
    with psycopg2.connect(libpq(url)) as pg, pg.cursor() as cur:
        cur.execute(f"CREATE TABLE {TABLE} ({TARGET_COLUMNS})")
    pg.close()
    configs = [{"bootstrap": bootstrap, "topic": topic, "partitions": list(range(partitions))[i::processes],
                "dsn": libpq(url)} for i in range(processes)]
    # Wall: start every worker -> all done; memory summed over all of them.
    started = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "bench.floor", json.dumps(c)], env=child_env(), cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in configs]
    with TreeSampler([p.pid for p in procs]) as sampler:
        outputs = [p.communicate() for p in procs]
    wall = time.monotonic() - started
    for p, (_, err) in zip(procs, outputs):
        if p.returncode:
            raise RuntimeError(f"floor worker exited {p.returncode}: {err[-2000:]}")
    return {"wall_s": wall, "rows": count_rows(url, TABLE), "memory_mib": sampler.peaks.mib()}


if __name__ == "__main__":
    cfg = json.loads(sys.argv[1])
    print(worker(cfg["bootstrap"], cfg["topic"], cfg["partitions"], cfg["dsn"]))
