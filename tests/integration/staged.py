"""Batches staged by hand, without the broker or Spark: a pipeline spec in a temp dir, a batch of explicit
ranges, staging tables filled with plain INSERTs and marked staged as the executors would; and what
the database holds afterwards. Shared by the commit tests and the target-mode contract."""
from __future__ import annotations

import contextlib
import itertools
from decimal import Decimal
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from sqlalchemy import text

from ledgerbatch.commit.target import table_exists
from ledgerbatch.ledger.batches import begin_attempt, get_batch, insert_batch, mark_staged
from ledgerbatch.ledger.cursors import get_cursors, init_cursors
from ledgerbatch.model.batch import Batch
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.stage.tables import StagingTables, staging_name
from ledgerbatch.model.ranges import OffsetRange
from ledgerbatch.spec.pipeline import load_spec
from ledgerbatch.model.batch import BatchKind


REPO = Path(__file__).resolve().parents[2]
SCHEMA = "order_id STRING, customer STRING, amount DECIMAL(12,2), ts TIMESTAMP"
# mode aggregate: one group per order id; what its query's analysis gives (transform.output_columns)
GROUPS = "SELECT order_id, count(*) AS n, sum(amount) AS amount FROM batch GROUP BY order_id"
GROUPS_OUTPUT = "order_id STRING, n BIGINT, amount DECIMAL(22,2)"
_names = itertools.count()
TS = "2026-11-21T10:00:00Z"  # every staged row's ts, unless the row gives its own (its version)


class Pipe:
    """A uniquely named pipeline and target table; its spec is a YAML file (a child process loads it too)."""

    def __init__(self, directory: Path, mode: str = "append", max_ratio: float = 0.5, policy: str = "quarantine",
                 deletes: bool = False, query: str | None = None, max_records: int | None = None,
                 on_reject: str | None = None, version: str | None = None, min_bad: int = 0):
        self.name = f"c{os.getpid()}_{next(_names)}"
        self.topic = f"t_{self.name}"
        self.table = f"target_{self.name}"
        self.dir = directory
        target = {"table": f"public.{self.table}", "mode": mode}
        if mode in ("upsert", "aggregate"):
            target["key"] = ["order_id"]
        doc = {"name": self.name, "source": {"topics": [self.topic], "format": "json", "schema": SCHEMA},
               "target": target, "errors": {"policy": policy, "max_ratio": max_ratio}}
        if on_reject:
            doc["errors"]["on_reject"] = on_reject
        if min_bad:
            doc["errors"]["min_bad"] = min_bad
        if mode == "aggregate":
            target["measures"] = {"n": "sum", "amount": "sum"}
            doc["transform"] = GROUPS
        if deletes:  # a change pipeline: a tombstone deletes its key (staged rows carry _change)
            target["deletes"] = True
        if version:  # a versioned upsert: the newest `version` of a key wins (a change pipeline's by _timestamp)
            target["version"] = version
            if version == "_timestamp":
                doc["source"]["metadata"] = ["timestamp"]
        if query:
            doc["transform"] = query
        if max_records:
            doc["batch"] = {"max_records": max_records}
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{self.name}.yaml").write_text(yaml.safe_dump(doc))
        self.spec = load_spec(directory, self.name)


def respec(pipe: Pipe, **sections) -> None:
    """Merge `sections` ({"target": {...}, "history": {...}}) into the pipe's YAML and reload its spec; a key
    given as None is taken out (the spec's default applies again)."""
    path = pipe.dir / f"{pipe.name}.yaml"
    doc = yaml.safe_load(path.read_text())
    for key, value in sections.items():
        merged = {**doc.get(key, {}), **value}
        doc[key] = {k: v for k, v in merged.items() if v is not None}
        if not doc[key]:
            del doc[key]
    path.write_text(yaml.safe_dump(doc))
    pipe.spec = load_spec(pipe.dir, pipe.name)


@dataclass(frozen=True)
class Staged:
    batch_id: int
    attempt: int
    staging: str


def plan(engine, p: Pipe, ranges: dict[int, tuple[int, int]], kind: BatchKind = BatchKind.LIVE) -> int:
    """A batch of explicit ranges {partition: (from, until)}; a live batch's cursors start at `from`
    when the pipeline has none yet."""
    offset_ranges = [OffsetRange(p.topic, part, lo, hi) for part, (lo, hi) in sorted(ranges.items())]
    with engine.begin() as conn:
        if kind == BatchKind.LIVE:
            init_cursors(conn, p.name, {r.topic_partition: r.from_offset for r in offset_ranges})
        return insert_batch(conn, p.name, kind, offset_ranges)


# an append or upsert query's output (transform.output_columns of a `SELECT * FROM batch ...`)
ROWS_OUTPUT = SCHEMA + ", _topic STRING, _partition INT, _offset BIGINT"


def output_schema(p: Pipe) -> str | None:
    if not p.spec.query:
        return None
    return GROUPS_OUTPUT if p.spec.mode == "aggregate" else ROWS_OUTPUT


def target_shape(p: Pipe) -> BatchShape:
    """The batch's shape as the commit reads it (a query pipeline's columns are its query's output)."""
    return BatchShape.recorded(p.spec, output_schema(p))


def begin(engine, p: Pipe, batch_id: int) -> Staged:
    """A new attempt with its (empty) staging tables, as process_batch starts one."""
    with engine.begin() as conn:
        attempt = begin_attempt(conn, batch_id, output_schema(p))
        staging = staging_name(batch_id, attempt)
        StagingTables(staging).create(conn, target_shape(p), batch_id)
    return Staged(batch_id, attempt, staging)


def fill(engine, p: Pipe, s: Staged, good: list[tuple], bad: list[tuple] = (),
         counts: dict[int, tuple[int, int]] | None = None, filtered: int = 0) -> None:
    """Good rows (partition, offset, order_id, amount[, version]) and bad records (partition, offset, error)
    by plain INSERTs, then mark_staged with `counts` {partition: (rows incl. bad, bad)} (by default the
    true counts of what was inserted). A change pipeline's amount None is a delete of the key; a query
    pipeline's `filtered` records were read (give `counts`) but dropped by its query. The version (a
    timestamp, default TS) goes to `ts`, and to `_timestamp` where the spec has it."""
    with engine.begin() as conn:
        if good and p.spec.mode == "aggregate":
            groups: dict[str, list] = {}
            for _, _, oid, amount in good:
                g = groups.setdefault(oid, [0, Decimal(0)])
                g[0], g[1] = g[0] + 1, g[1] + Decimal(amount)
            conn.execute(text(f'INSERT INTO ledger_staging."{s.staging}" (order_id, n, amount, _batch_id) '
                              "VALUES (:order_id, :n, :amount, :batch_id)"),
                         [{"order_id": oid, "n": n, "amount": total, "batch_id": s.batch_id}
                          for oid, (n, total) in groups.items()])
        elif good and p.spec.changes:  # (partition, offset, order_id, amount or None for a delete[, version])
            stamp = ", _timestamp" if "timestamp" in p.spec.metadata else ""
            conn.execute(text(
                f'INSERT INTO ledger_staging."{s.staging}" (order_id, customer, amount, ts{stamp}, _change, _topic, '
                f"_partition, _offset, _batch_id) VALUES (:order_id, :customer, :amount, :ts{stamp and ', :version'}, "
                ":change, :topic, :partition, :offset, :batch_id)"),
                [{"order_id": oid, "customer": None if amount is None else "c", "amount": amount,
                  "ts": None if amount is None and not version else (version or [TS])[0], "version": (version or [TS])[0],
                  "change": "d" if amount is None else "u", "topic": p.topic, "partition": part, "offset": off,
                  "batch_id": s.batch_id}
                 for part, off, oid, amount, *version in good])
        elif good:
            conn.execute(text(
                f'INSERT INTO ledger_staging."{s.staging}" (order_id, customer, amount, ts, _topic, _partition, _offset, _batch_id) '
                "VALUES (:order_id, 'c', :amount, :ts, :topic, :partition, :offset, :batch_id)"),
                [{"order_id": oid, "amount": amount, "ts": (version or [TS])[0], "topic": p.topic, "partition": part,
                  "offset": off, "batch_id": s.batch_id} for part, off, oid, amount, *version in good])
        if bad:
            conn.execute(text(
                f'INSERT INTO ledger_staging."{StagingTables(s.staging).bad}" (_topic, _partition, _offset, _error, _key, _value) '
                "VALUES (:topic, :partition, :offset, :error, :key, :value)"),
                [{"topic": p.topic, "partition": part, "offset": off, "error": error, "key": f"k{off}".encode(),
                  "value": b"\xff" + error.encode()} for part, off, error in bad])
        if counts is None:
            counts = {}
            for part, *_ in good:
                rows, nbad = counts.get(part, (0, 0))
                counts[part] = (rows + 1, nbad)
            for part, *_ in bad:
                rows, nbad = counts.get(part, (0, 0))
                counts[part] = (rows + 1, nbad + 1)
            if p.spec.changes:  # (records, bad, deleted, skipped)
                counts = {part: c + (sum(1 for g in good if g[0] == part and g[3] is None), 0)
                          for part, c in counts.items()}
        batch = get_batch(conn, s.batch_id)
        groups_written = len({oid for _, _, oid, _ in good}) if p.spec.mode == "aggregate" else None
        mark_staged(conn, s.batch_id, s.attempt, s.staging, batch.ranges,
                    {(p.topic, part): c for part, c in counts.items()}, filtered=filtered, groups=groups_written)


def staged_batch(engine, p: Pipe, ranges: dict[int, tuple[int, int]], good: list[tuple], bad: list[tuple] = (),
                 counts: dict[int, tuple[int, int]] | None = None, kind: BatchKind = BatchKind.LIVE,
                 filtered: int = 0) -> Staged:
    s = begin(engine, p, plan(engine, p, ranges, kind))
    fill(engine, p, s, good, bad, counts, filtered)
    return s


# -- what the database holds

def target(engine, p: Pipe) -> list[tuple] | None:
    """(partition, offset, order_id, amount, batch_id) of every target row; None when there is no target.
    An aggregate target's groups are (order_id, n, amount, batch_id), by order id."""
    with engine.connect() as conn:
        if not table_exists(conn, "public", p.table):
            return None
        if p.spec.mode == "aggregate":
            return [(r.order_id, r.n, str(r.amount), r._batch_id) for r in conn.execute(text(
                f'SELECT * FROM public."{p.table}" ORDER BY order_id'))]
        return [(r._partition, r._offset, r.order_id, str(r.amount), r._batch_id) for r in conn.execute(text(
            f'SELECT * FROM public."{p.table}" ORDER BY _partition, _offset'))]


def quarantine(engine, p: Pipe) -> list[tuple]:
    """Bad records as qrow() makes them; a row the target refused has no key: its value is the row as JSON."""
    with engine.connect() as conn:
        return [(r.partition, r.offset, r.batch_id, r.error, r.key and bytes(r.key), bytes(r.value)) for r in conn.execute(text(
            'SELECT partition, "offset", batch_id, error, key, value FROM ledger.quarantine WHERE pipeline = :p '
            'ORDER BY partition, "offset"'), {"p": p.name})]


def refused(engine, p: Pipe) -> list[tuple]:
    """(partition, offset, batch_id, sqlstate, constraint_name, order_id) of every row the target refused."""
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            'SELECT partition, "offset", batch_id, sqlstate, constraint_name, '
            "convert_from(value, 'UTF8')::jsonb ->> 'order_id' FROM ledger.quarantine "
            'WHERE pipeline = :p AND sqlstate IS NOT NULL ORDER BY partition, "offset"'), {"p": p.name})]


def cursors(engine, p: Pipe) -> dict[int, int]:
    with engine.connect() as conn:
        return {part: offset for (_, part), offset in get_cursors(conn, p.name).items()}


def batch(engine, batch_id: int) -> Batch:
    with engine.connect() as conn:
        return get_batch(conn, batch_id)


def staging_tables(engine, batch_id: int) -> list[str]:
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'ledger_staging' AND tablename ~ :pattern ORDER BY 1"),
            {"pattern": f"^b{batch_id}_a\\d+(_bad)?$"}).scalars().all()


def row(part, off, oid, amount, batch_id):
    return (part, off, oid, amount, batch_id)


def qrow(part, off, batch_id, error):
    return (part, off, batch_id, error, f"k{off}".encode(), b"\xff" + error.encode())


# -- a commit in a child process (a crash point kills its whole process group)

CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.ledger.engine import make_engine
from ledgerbatch.spec.pipeline import load_spec
engine = make_engine(sys.argv[2])
print(commit_batch(engine, load_spec(Path(sys.argv[3]), sys.argv[4]), int(sys.argv[5])), flush=True)
"""


def commit_in_child(db_url: str, p: Pipe, batch_id: int, **env) -> subprocess.CompletedProcess:
    """commit_batch in a child process in its own process group (a crash point kills the whole group)."""
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("LEDGERBATCH_CRASH_AT", "LEDGERBATCH_CRASH_PGID", "LEDGERBATCH_TERMINATE_AT")}
    return subprocess.run([sys.executable, "-c", CHILD, str(REPO / "plugins"), db_url, str(p.dir), p.name, str(batch_id)],
                          env={**full_env, **env}, cwd=REPO, capture_output=True, text=True, timeout=60,
                          start_new_session=True)


def start_commit_in_child(db_url: str, p: Pipe, batch_id: int) -> subprocess.Popen:
    """commit_in_child without waiting for it (read its result with .communicate())."""
    return subprocess.Popen([sys.executable, "-c", CHILD, str(REPO / "plugins"), db_url, str(p.dir), p.name,
                             str(batch_id)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


@contextlib.contextmanager
def parked(engine, batch_id: int):
    """Hold the batch's ledger.batch_ranges rows FOR UPDATE: its commit writes the target, then waits before
    its COMMIT (at mark_committed), until the block ends. That window exists anyway: a big live commit
    holds its transaction for seconds."""
    conn = engine.connect()
    tx = conn.begin()
    try:
        conn.execute(text("SELECT 1 FROM ledger.batch_ranges WHERE batch_id = :b FOR UPDATE"), {"b": batch_id})
        yield
    finally:
        tx.rollback()
        conn.close()


def lock_waiters(engine) -> list[str]:
    """What the database's other sessions wait on (wait_event of each backend waiting for a lock)."""
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT wait_event FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND wait_event_type = 'Lock' ORDER BY backend_start")).scalars().all()


def wait_for_lock_waiters(engine, n: int, timeout_s: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        waiting = lock_waiters(engine)
        if len(waiting) >= n:
            return waiting
        time.sleep(0.05)
    raise AssertionError(f"expected {n} sessions waiting for a lock, found {lock_waiters(engine)}")
