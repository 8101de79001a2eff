"""`format: debezium` with `converter: avro` end to end on real parts: change events exactly as Confluent's
AvroConverter wrote them for real Debezium (captured by tests/cdc/make_samples.py: snapshot, inserts,
updates, deletes with tombstones, a key change, decimals, timestamps, dates, then a column added to the
source table), their schema ids rewritten to the dev registry's (tests/cdc/avro_samples.py); the dev
broker, local Spark, PostgreSQL."""
from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from sqlalchemy import text

from ledgerbatch.spec.resolve import with_registry
from ledgerbatch.ops.run import run_pipeline
from ledgerbatch.ops.verify import verify
from tests.cdc import scenario
from tests.cdc.avro_samples import edited, load_avro, register, schemas, with_id

from .helpers import cli, produce
from .test_changes import ACCOUNTS, totals

pytestmark = pytest.mark.integration

EVOLVED = len(scenario.TRANSACTIONS)  # the `tx` of the events after the source table gained `note`


def debezium_avro(make_pipeline, registry, max_records):
    """A spec without `schema:`: the columns come from the `after` record of the subject's latest schema."""
    p = make_pipeline(partitions=1, source__format="debezium", source__converter="avro", source__schema=None,
                      source__schema_registry={"url": registry.url}, target__mode="upsert", target__key=["id"],
                      batch__max_records=max_records, errors__max_ratio=1.0)
    register_version(registry, p, 1)
    return p


def register_version(registry, p, version: int) -> None:
    """The captured value schema `version` as the latest of the pipeline topic's subject."""
    text_of = {s["version"]: s["schema"] for s in schemas() if s["subject"] == "shop.public.accounts-value"}
    register(registry.url, f"{p.topic}-value", text_of[version])


def extras(registry, lines):
    """A delete without `before` (REPLICA IDENTITY NOTHING: deleted by the Avro key) of id 5 and its tombstone,
    a value not in the wire format, a value naming a schema id the registry does not know."""
    key_of_5 = next(x["key"] for x in lines if x["op"] == "r" and x["expect_key"] == {"id": 5})
    a_delete = next(x["value"] for x in lines if x["op"] == "d")
    return [(key_of_5, edited(registry.url, a_delete, before=None)), (key_of_5, None),
            (key_of_5, b"not avro"), (key_of_5, with_id(a_delete, 999_999))]


def send(broker, p, events):
    produce(broker.bootstrap_servers, p.topic, [(0, v) for _, v in events], keys=[k for k, _ in events])


def target(engine, p, columns="id, owner, balance, active, updated AT TIME ZONE 'UTC', opened, seen") -> dict:
    with engine.connect() as conn:
        return {r[0]: tuple(r[1:]) for r in conn.execute(text(f'SELECT {columns} FROM public."{p.table}"'))}


def expected(evolved: bool) -> dict:
    """The source table's end state without id 5 (the extra delete); with `note` once evolved."""
    names = [c for c in scenario.COLUMNS if c != "id"] + (["note"] if evolved else [])
    return {k: tuple(row.get(c) for c in names) for k, row in scenario.final_rows(evolved).items() if k != 5}


def wait_until_gone(pgid: int, seconds: float = 30) -> None:
    """Wait until no process of the group `pgid` is alive. SIGKILL reached every member (Spark's JVM, its
    Python workers) at once, but they exit asynchronously. Zombies count as gone: they run nothing and hold
    nothing, and whether they are reaped is up to init (so `os.killpg(pgid, 0)` may never fail)."""
    deadline = time.monotonic() + seconds
    while alive := [p.pid for p in psutil.process_iter() if member(p, pgid)]:
        assert time.monotonic() < deadline, f"processes {alive} of the killed group {pgid} outlived SIGKILL"
        time.sleep(0.05)


def member(proc: psutil.Process, pgid: int) -> bool:
    try:
        return os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE
    except (ProcessLookupError, psutil.NoSuchProcess):
        return False


def quarantined(engine, p) -> list[str]:
    with engine.connect() as conn:
        return conn.execute(text('SELECT error FROM ledger.quarantine WHERE pipeline = :p ORDER BY "offset"'),
                            {"p": p.name}).scalars().all()


def test_avroconverter_events_replicate_the_table_and_its_new_column(engine, db_url, broker, spark, registry,
                                                                     make_pipeline):
    lines = [x for x in load_avro(registry.url) if x["table"] == "accounts"]
    first = [x for x in lines if x["tx"] != EVOLVED]
    p = debezium_avro(make_pipeline, registry, max_records=4)
    bad = extras(registry, lines)
    send(broker, p, [(x["key"], x["value"]) for x in first] + bad)

    spec = with_registry(p.spec, {})
    assert ", ".join(f"{c.name} {c.spark_ddl}" for c in spec.columns) == ACCOUNTS
    run_pipeline(engine, spec, db_url, broker.bootstrap_servers, lambda: spark)
    assert target(engine, p) == expected(evolved=False)
    assert quarantined(engine, p) == [
        "value is not in the Confluent wire format (magic byte 0 and a 4-byte schema id; it starts with 0x6e, 8 bytes)",
        "schema id 999999 is unknown to the registry (40403: Schema 999999 not found)"]

    # The source table gained `note`: Debezium registered a new value schema version, and the target follows.
    register_version(registry, p, 2)
    later = [x for x in lines if x["tx"] == EVOLVED]
    send(broker, p, [(x["key"], x["value"]) for x in later])
    evolved = with_registry(p.spec, {})
    assert evolved.columns[-1].name == "note" and evolved.evolve == "additive"
    run_pipeline(engine, evolved, db_url, broker.bootstrap_servers, lambda: spark)
    got = target(engine, p, "id, owner, balance, active, updated AT TIME ZONE 'UTC', opened, seen, note")
    assert got == expected(evolved=True)
    assert (got[1][-1], got[9][-1], got[4][-1]) == ("vip", "new", None)

    ops = [x["op"] for x in lines]
    t = totals(engine, p)
    assert (t.read, t.written, t.deleted, t.skipped, t.quarantined) == (
        len(lines) + len(bad), sum(op in ("r", "c", "u") for op in ops), ops.count("d") + 1, ops.count(None) + 1, 2)
    assert t.read == t.written + t.deleted + t.skipped + t.quarantined
    assert verify(engine, evolved) == []


def test_sigkill_mid_batch_then_resume_replicates_once(engine, db_url, broker, registry, make_pipeline):
    """`ledgerbatch run` killed while reading a batch, then run again: the target is the source's end state."""
    lines = [x for x in load_avro(registry.url) if x["table"] == "accounts" and x["tx"] != EVOLVED]
    p = debezium_avro(make_pipeline, registry, max_records=6)
    send(broker, p, [(x["key"], x["value"]) for x in lines] + extras(registry, lines))
    crashed = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir, LEDGERBATCH_CRASH_AT="mid_read")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    # Not needed for correctness (a killed member runs no more code, and the resume's attempt fences the
    # crashed one's), but the resume then starts with nothing of the crashed run alive beside it.
    wait_until_gone(crashed.pgid)
    finished = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert target(engine, p) == expected(evolved=False)
    t = totals(engine, p)
    assert (t.read, t.quarantined) == (len(lines) + 4, 2)
    assert t.read == t.written + t.deleted + t.skipped + t.quarantined
    assert verify(engine, with_registry(p.spec, {})) == []
