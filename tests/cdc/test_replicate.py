"""Replicate a table with Debezium, end to end on real parts: PostgreSQL (wal_level = logical) -> Debezium's
embedded engine -> Apache Kafka -> `ledgerbatch run` (format debezium, upsert) -> PostgreSQL.

The source table gets a snapshot, then random inserts, updates, deletes, primary-key changes and deletes
followed by a re-insert of the same key in one transaction, in many transactions, while `ledgerbatch run` is
SIGKILLed (its whole process group) at random moments and at every crash point. At the end the target equals
the source table in every column, `verify` is clean, nothing is quarantined and the counts by op add up.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
import signal
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from ledgerbatch.faults import POINTS

from .capture import TopicReader

REPO = Path(__file__).resolve().parents[2]
COLUMNS = ("id", "owner", "balance", "active", "updated", "opened", "seen")
DDL = ("id INT PRIMARY KEY, owner TEXT, balance NUMERIC(12,2), active BOOLEAN, updated TIMESTAMP, opened DATE, "
       "seen TIMESTAMPTZ")
SCHEMA = "id INT, owner STRING, balance DECIMAL(12,2), active BOOLEAN, updated TIMESTAMP, opened DATE, seen TIMESTAMP"
UTC = dt.timezone.utc


def random_row(rnd: random.Random, id: int) -> dict:  # noqa: A002 - the column's name
    def maybe(value):
        return None if rnd.random() < 0.15 else value
    return {"id": id,
            "owner": maybe(rnd.choice(["ann", "bob", "chloé", "d'a \"q\"", "ünï", ""]) + str(rnd.randint(0, 999))),
            "balance": maybe(Decimal(rnd.randint(-10**11, 10**11)).scaleb(-2)),
            "active": maybe(rnd.choice([True, False])),
            "updated": maybe(dt.datetime(1960, 1, 1) + dt.timedelta(microseconds=rnd.randint(0, 3 * 10**15))),
            "opened": maybe(dt.date(1950, 1, 1) + dt.timedelta(days=rnd.randint(0, 40000))),
            "seen": maybe(dt.datetime(1990, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=rnd.randint(0, 10**15)))}


class Workload:
    """Random changes to the source table in many transactions; counts what it did by kind."""

    def __init__(self, source, table: str, seed: int):
        self.source, self.table, self.rnd = source, table, random.Random(seed)
        self.ids: set[int] = set()
        self.next_id = 1
        self.done: dict[str, int] = {k: 0 for k in ("insert", "update", "delete", "key change", "delete+reinsert")}
        self.transactions = 0

    def create(self, rows: int) -> None:
        with contextlib.closing(self.source.connect()) as conn, conn, conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {self.table} ({DDL})")
            for _ in range(rows):
                self._insert(cur, self._new_id())

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _insert(self, cur, id: int) -> None:  # noqa: A002
        r = random_row(self.rnd, id)
        cur.execute(f"INSERT INTO {self.table} ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))})",
                    [r[c] for c in COLUMNS])
        self.ids.add(id)

    def run(self, transactions: int, pause: float, stop: threading.Event) -> None:
        rnd = self.rnd
        with contextlib.closing(self.source.connect()) as conn:
            for _ in range(transactions):
                if stop.is_set():
                    return
                with conn, conn.cursor() as cur:
                    for _ in range(rnd.randint(1, 4)):
                        self._change(cur, rnd.choices(list(self.done), weights=[4, 6, 2, 1, 1])[0])
                self.transactions += 1
                time.sleep(rnd.uniform(0, 2 * pause))

    def _change(self, cur, kind: str) -> None:
        rnd, table = self.rnd, self.table
        if kind != "insert" and not self.ids:
            kind = "insert"
        old = rnd.choice(sorted(self.ids)) if self.ids else None
        if kind == "insert":
            self._insert(cur, self._new_id())
        elif kind == "update":
            values = {c: v for c, v in random_row(rnd, old).items() if c != "id" and rnd.random() < 0.5} or \
                {"owner": "touched"}
            cur.execute(f"UPDATE {table} SET {', '.join(f'{c} = %s' for c in values)} WHERE id = %s",
                        [*values.values(), old])
        elif kind == "delete":
            cur.execute(f"DELETE FROM {table} WHERE id = %s", (old,))
            self.ids.discard(old)
        elif kind == "key change":  # Debezium: a delete (and tombstone) of the old key, a create of the new one
            new = self._new_id()
            cur.execute(f"UPDATE {table} SET id = %s WHERE id = %s", (new, old))
            self.ids.discard(old)
            self.ids.add(new)
        else:  # one key deleted and inserted again in one transaction
            cur.execute(f"DELETE FROM {table} WHERE id = %s", (old,))
            self._insert(cur, old)
        assert cur.rowcount == 1, (kind, old)
        self.done[kind] += 1


def write_spec(directory: Path, name: str, topic: str, table: str, max_records: int, **extra) -> Path:
    doc = {"name": name, "source": {"topics": [topic], "format": "debezium", "schema": SCHEMA},
           "target": {"table": f"public.{table}", "mode": "upsert", "key": ["id"]},
           "batch": {"max_records": max_records}}
    for key, value in extra.items():
        section, _, field = key.partition("__")
        doc[section][field] = value
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def start_run(db_url: str, broker, pipelines: Path, name: str, *args: str, **env) -> subprocess.Popen:
    """`ledgerbatch run NAME` in its own process group (driver, Spark's JVM and Python workers)."""
    full_env = {**os.environ, "LEDGERBATCH_DB_URL": db_url, "LEDGERBATCH_PIPELINES_DIR": str(pipelines),
                "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers, "LEDGERBATCH_SPARK_MASTER": "local[2]", **env}
    return subprocess.Popen([sys.executable, "-m", "ledgerbatch.cli", "run", name, *args], env=full_env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def cli(db_url, broker, pipelines, *args, timeout=300) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "LEDGERBATCH_DB_URL": db_url, "LEDGERBATCH_PIPELINES_DIR": str(pipelines),
                "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers, "LEDGERBATCH_SPARK_MASTER": "local[2]"}
    return subprocess.run([sys.executable, "-m", "ledgerbatch.cli", *args], env=full_env, cwd=REPO, text=True,
                          capture_output=True, timeout=timeout, start_new_session=True)


def source_rows(source, table: str, columns=COLUMNS) -> dict:
    with contextlib.closing(source.connect()) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT {', '.join(columns)} FROM {table}")
        return {r[0]: tuple(r) for r in cur.fetchall()}


def target_rows(engine, table: str, columns=COLUMNS) -> dict:
    selected = ", ".join("updated AT TIME ZONE 'UTC'" if c == "updated" else c for c in columns)
    with engine.connect() as conn:
        return {r[0]: tuple(r) for r in conn.execute(text(f'SELECT {selected} FROM public."{table}"'))}


def catch_up(engine, db_url, broker, pipelines, name, source, table, columns=COLUMNS, timeout=120) -> int:
    """Clean runs until the target equals the source (the capture may still be delivering); returns runs."""
    deadline, runs = time.monotonic() + timeout, 0
    while True:
        done = cli(db_url, broker, pipelines, "run", name)
        runs += 1
        assert done.returncode == 0, done.stderr[-3000:]
        if target_rows(engine, table, columns) == source_rows(source, table, columns):
            return runs
        assert time.monotonic() < deadline, "the target did not reach the source table"
        time.sleep(1)


def ledger_totals(engine, name: str):
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) AS batches, sum(records_read) AS read, sum(rows_written) AS written, "
            "sum(rows_deleted) AS deleted, sum(records_skipped) AS skipped, sum(rows_quarantined) AS quarantined, "
            "(SELECT count(*) FROM ledger.quarantine q WHERE q.pipeline = :p) AS in_quarantine "
            "FROM ledger.batches WHERE pipeline = :p AND status = 'committed' AND kind = 'live'"), {"p": name}).one()


def topic_ops(broker, topic: str) -> dict:
    """Every event in the topic by op (tombstones under None)."""
    import json

    reader = TopicReader(broker.bootstrap_servers, topic)
    try:
        total = reader.count()
        while not reader.poll(total):
            pass
        ops: dict = {}
        for e in reader.events:
            op = None if e.value is None else json.loads(e.value)["payload"]["op"]
            ops[op] = ops.get(op, 0) + 1
        return ops
    finally:
        reader.close()


def test_replica_equals_the_source_after_random_changes_and_kills(cdc_source, capture, broker, engine, db_url,
                                                                   tmp_path):
    rnd = random.Random(int(os.environ.get("LEDGERBATCH_CDC_SEED", "7")))
    table = cdc_source.new_table("replica")
    work = Workload(cdc_source, table, seed=rnd.randint(0, 10**6))
    work.create(rows=300)
    cap = capture.start([table])  # Debezium's defaults: schemas on, precise decimals, tombstones on delete
    topic, name, pipelines = cap.topics[table], f"cdc{os.getpid()}", tmp_path / "pipelines"
    write_spec(pipelines, name, topic, table, max_records=150)
    cap.read_until(topic, 300)  # the snapshot is in Kafka: every run below has something to read

    stop = threading.Event()
    writer = threading.Thread(target=work.run, args=(220, 0.4, stop), daemon=True)
    writer.start()
    kills, crashes = 0, []
    # While the source changes: every crash point once (the run SIGKILLs its own group there) and kills at
    # random moments, in random order; then more random kills for as long as the source is changing.
    schedule = list(POINTS) + [None] * 4
    rnd.shuffle(schedule)
    try:
        while schedule or writer.is_alive():
            point = schedule.pop() if schedule else None
            if point is not None:
                crashed = start_run(db_url, broker, pipelines, name, LEDGERBATCH_CRASH_AT=point)
                _, err = crashed.communicate(timeout=300)
                assert crashed.returncode in (-9, 0), err[-3000:]
                if crashed.returncode == -9:
                    crashes.append(point)
                elif crashes.count(None) < 5:  # nothing reached the point (no new records yet): later again
                    crashes.append(None)
                    schedule.insert(0, point)
                continue
            run = start_run(db_url, broker, pipelines, name)
            time.sleep(rnd.uniform(2, 12))
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                kills += 1
            _, err = run.communicate(timeout=60)
            assert run.returncode in (0, -9), err[-3000:]
    finally:
        stop.set()
        writer.join(timeout=60)
    assert not writer.is_alive()

    runs = catch_up(engine, db_url, broker, pipelines, name, cdc_source, table)
    source = source_rows(cdc_source, table)
    assert target_rows(engine, table) == source  # every column of every row
    verified = cli(db_url, broker, pipelines, "verify", name)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    ops = topic_ops(broker, topic)
    t = ledger_totals(engine, name)
    assert t.quarantined == t.in_quarantine == 0
    assert t.read == sum(ops.values())
    assert (t.written, t.deleted, t.skipped) == (ops.get("r", 0) + ops.get("c", 0) + ops.get("u", 0),
                                                 ops.get("d", 0), ops.get(None, 0))
    crashes = [c for c in crashes if c is not None]
    assert set(crashes) == set(POINTS) and kills >= 4
    print(f"\nCDC replica: {len(source)} rows in the source ({len(work.ids)} keys), {work.transactions} transactions: "
          f"{work.done}; events by op {ops}; {t.batches} batches; {kills} random SIGKILLs, crash points {crashes}; "
          f"{runs} clean runs to catch up; equal: yes")


def test_schema_evolution_mid_stream_and_a_resumed_batch_after_a_spec_change(cdc_source, capture, broker, engine,
                                                                             db_url, spark, tmp_path):
    """In-process runs (Spark stays warm): a column added to the source and then to the spec is added to the
    target (a replay fills the rows changed in between); a widened type is widened; a narrowing is refused
    with nothing written; the batch staged under the refused spec fails loudly once the spec changes again,
    until it is abandoned as the error says."""
    from ledgerbatch.errors import SpecError, SpecVersionError
    from ledgerbatch.plan.replay import ReplayRequest
    from ledgerbatch.ops.run import run_replay
    from ledgerbatch.ops.run import run_pipeline
    from ledgerbatch.spec.pipeline import load_spec
    from ledgerbatch.ops.verify import verify

    table, name, pipelines = cdc_source.new_table("evolving"), f"cdcevo{os.getpid()}", tmp_path / "pipelines"
    cdc_source.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, owner TEXT, balance NUMERIC(12,2))")
    cdc_source.execute(f"INSERT INTO {table} SELECT i, 'o' || i, i * 1.25 FROM generate_series(1, 20) i")
    cap = capture.start([table], partitions=1)
    topic = cap.topics[table]
    path = write_spec(pipelines, name, topic, table, 1000, source__schema="id INT, owner STRING, balance DECIMAL(12,2)",
                      target__evolve="additive")

    def run(events: int, columns=("id", "owner", "balance", "note")) -> None:
        """Once `events` are in the topic: run until caught up; the target then equals the source."""
        cap.read_until(topic, events)
        run_pipeline(engine, load_spec(pipelines, name), db_url, broker.bootstrap_servers, lambda: spark)
        assert target_rows(engine, table, columns) == source_rows(cdc_source, table, columns)

    def respec(old: str, new: str) -> str:
        spec = path.read_text()
        path.write_text(spec.replace(old, new))
        return spec

    run(20, ("id", "owner", "balance"))
    # 1. The source gains a column; until the spec lists it, its values are ignored.
    cdc_source.execute(f"ALTER TABLE {table} ADD COLUMN note TEXT")
    cdc_source.execute(f"UPDATE {table} SET note = 'n' || id WHERE id <= 5")
    cdc_source.execute(f"INSERT INTO {table} VALUES (21, 'new', 2.00, 'twenty-one')")
    run(26, ("id", "owner", "balance"))
    # 2. The spec gains it: the next commit adds it to the target, a replay of the topic fills the rows
    #    changed before the spec listed it.
    respec("balance DECIMAL(12,2)", "balance DECIMAL(12,2), note STRING")
    cdc_source.execute(f"UPDATE {table} SET note = 'later' WHERE id = 6")
    run(27, ("id", "owner", "balance"))
    assert target_rows(engine, table, ("id", "note"))[6] == (6, "later")
    assert target_rows(engine, table, ("id", "note"))[1] == (1, None)
    run_replay(engine, load_spec(pipelines, name), ReplayRequest(topic, None, from_offset=0, until_offset=27), db_url,
               broker.bootstrap_servers, lambda: spark, dry_run=False)
    run(27)
    # 3. A wider type in the source and the spec: the target is widened.
    cdc_source.execute(f"ALTER TABLE {table} ALTER COLUMN balance TYPE NUMERIC(14,2)")
    respec("DECIMAL(12,2)", "DECIMAL(14,2)")
    cdc_source.execute(f"UPDATE {table} SET balance = 123456789012.34 WHERE id = 7")
    run(28)

    # 4. A narrower type in the spec is refused at the commit: nothing written, the cursor stays.
    widened = respec("DECIMAL(14,2)", "DECIMAL(10,2)")
    cdc_source.execute(f"UPDATE {table} SET owner = 'after narrowing' WHERE id = 8")
    cap.read_until(topic, 29)
    before = target_rows(engine, table, ("id", "owner", "balance", "note"))
    with pytest.raises(SpecError, match=r"balance is numeric\(14,2\), the spec says numeric\(10,2\)"):
        run_pipeline(engine, load_spec(pipelines, name), db_url, broker.bootstrap_servers, lambda: spark)
    assert target_rows(engine, table, ("id", "owner", "balance", "note")) == before
    with engine.connect() as conn:
        assert conn.execute(text("SELECT next_offset FROM ledger.cursors WHERE pipeline = :p"), {"p": name}).scalar() == 28
        staged = conn.execute(text("SELECT batch_id, status FROM ledger.batches WHERE pipeline = :p "
                                   "ORDER BY batch_id DESC LIMIT 1"), {"p": name}).one()
    assert staged.status == "staged"

    # 5. The spec fixed: the batch planned under the refused version fails loudly, naming both versions ...
    path.write_text(widened)
    with pytest.raises(SpecVersionError, match=f"batch {staged.batch_id} of pipeline {name} was planned with spec "
                                               f"version [0-9a-f]+, but the spec is now version"):
        run_pipeline(engine, load_spec(pipelines, name), db_url, broker.bootstrap_servers, lambda: spark)
    # ... until it is abandoned as the message says; the next run plans its offsets again.
    done = cli(db_url, broker, pipelines, "abandon", name, str(staged.batch_id), "--by", "test", "--reason", "spec changed")
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"batch {staged.batch_id} (staged) abandoned by test" in done.stdout
    again = cli(db_url, broker, pipelines, "abandon", name, str(staged.batch_id), "--by", "test")
    assert again.returncode == 1 and "is abandoned: there is nothing to abandon" in again.stderr
    run(29)
    assert verify(engine, load_spec(pipelines, name)) == []
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ledger.quarantine WHERE pipeline = :p"), {"p": name}).scalar() == 0
        versions = conn.execute(text("SELECT count(*) FROM ledger.spec_versions WHERE pipeline = :p"), {"p": name}).scalar()
    assert versions == 4  # as first written, with note, widened, narrowed
