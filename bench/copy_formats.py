"""CSV against binary COPY of the same staged rows, PostgreSQL alone: the Python side's CPU to make the COPY
data from Arrow arrays (stage/csv_copy.py, stage/binary_copy.py) and the server's CPU to take it into a
table shaped and indexed like a staging table of the benchmark's orders.

    python -m bench.copy_formats [--rows N] [--runs R]

Prints the medians of R runs, each format in turn, and checks that both tables hold the same rows.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from decimal import Decimal

import numpy as np
import psycopg2
import pyarrow as pa

from ledgerbatch.stage import csv_copy

from .common import fresh_database, libpq

PART = 31_250  # rows a part: a range's chunk of the 1M-record benchmark
TABLE = ("CREATE TABLE rows_{fmt} (order_id text, customer text, amount numeric(12,2), ts timestamptz, "
         "_topic text, _partition integer, _offset bigint, _batch_id bigint, "
         "UNIQUE (_topic, _partition, _offset, _batch_id))")
TYPES = ("text", "text", "numeric(12,2)", "timestamptz", "text", "integer", "bigint", "bigint")


def staged_arrays(n: int) -> list:
    """Arrays as a staging task has them for n orders (bench's order shape, amounts of either sign)."""
    rng = np.random.default_rng(1)
    cents = rng.integers(-10**9, 10**9, n)
    return [pa.array([f"o-{i:08d}" for i in range(n)]), pa.array([f"customer-{i % 997}" for i in range(n)]),
            pa.array([Decimal(int(c)).scaleb(-2) for c in cents], pa.decimal128(12, 2)),
            pa.array(1_700_000_000_000_000 + rng.integers(0, 10**12, n), pa.timestamp("us", "UTC")),
            pa.array(["bench"] * n), pa.array(rng.integers(0, 32, n).astype(np.int32)),
            pa.array(np.arange(n, dtype=np.int64)), pa.array(np.full(n, 7, dtype=np.int64))]


def _server_cpu(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Timed:
    """A COPY's data as psycopg2 reads it, timing the Python side's CPU spent making it."""

    def __init__(self, stream):
        self.stream, self.cpu = stream, 0.0

    def read(self, size: int = -1) -> bytes:
        started = time.process_time()
        try:
            return self.stream.read(size)
        finally:
            self.cpu += time.process_time() - started


def one_copy(conn, fmt: str, arrays: list) -> tuple[float, float]:
    """(Python CPU s, server CPU s) of one COPY of `arrays` into a fresh table."""
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS rows_{fmt}; " + TABLE.format(fmt=fmt))
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    conn.commit()
    parts = ([a.slice(i, PART) for a in arrays] for i in range(0, len(arrays[0]), PART))
    timed = _Timed(csv_copy.CopyStream.of(parts, TYPES if fmt == "binary" else ()))
    before = _server_cpu(pid)
    with conn.cursor() as cur:
        cur.copy_expert(f"COPY rows_{fmt} FROM STDIN WITH (FORMAT {fmt})", timed)
    conn.commit()
    return timed.cpu, _server_cpu(pid) - before


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.copy_formats", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    arrays = staged_arrays(args.rows)
    conn = psycopg2.connect(libpq(fresh_database("lb_bench_copy_formats")))
    try:
        runs = {"csv": [], "binary": []}
        for _ in range(args.runs):
            for fmt, times in runs.items():
                times.append(one_copy(conn, fmt, arrays))
        with conn.cursor() as cur:
            cur.execute("SELECT (SELECT md5(string_agg(r::text, ',' ORDER BY _offset)) FROM rows_csv r) = "
                        "(SELECT md5(string_agg(r::text, ',' ORDER BY _offset)) FROM rows_binary r)")
            same = cur.fetchone()[0]
    finally:
        conn.close()
    print(f"{args.rows:,} staged rows, medians of {args.runs} (CPU seconds):")
    for fmt, times in runs.items():
        python, server = (statistics.median(t[i] for t in times) for i in (0, 1))
        print(f"  {fmt}: python {python:.3f}, server {server:.3f} (server runs: "
              f"{', '.join(f'{t[1]:.2f}' for t in times)})")
    print("  both tables hold the same rows" if same else "  THE TABLES DIFFER")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
