"""Change pipelines end to end on real parts (Apache Kafka, PostgreSQL, local Spark): `format: debezium`
with real captured events (tests/cdc/samples/) and hand-made envelopes, deletes, tombstones, replays,
and `target.deletes` for plain upsert pipelines."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.stage.process import process_batch
from ledgerbatch.plan.replay import ReplayRequest, plan_replay, resolve_ranges
from ledgerbatch.commit.diff import dry_run_diff
from ledgerbatch.ops.run import run_pipeline
from ledgerbatch.ops.verify import verify

from .helpers import produce

pytestmark = pytest.mark.integration

ACCOUNTS = "id INT, owner STRING, balance DECIMAL(12,2), active BOOLEAN, updated TIMESTAMP, opened DATE, seen TIMESTAMP"


def debezium(make_pipeline, partitions=1, max_records=100, schema="id INT, owner STRING", **overrides):
    return make_pipeline(partitions=partitions, source__format="debezium", source__schema=schema,
                         target__mode="upsert", target__key=["id"], batch__max_records=max_records, **overrides)


def run(engine, db_url, broker, spark, p, **kw):
    return run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark, **kw)


def event(op, id, owner=None, before=None):  # noqa: A002
    """A Debezium envelope as JsonConverter writes it without the schema block."""
    after = None if op == "d" else {"id": id, "owner": owner}
    if op == "d":
        before = before if before is not None else {"id": id, "owner": None}
    return (json.dumps({"id": id}).encode(),
            json.dumps({"before": before, "after": after, "op": op, "source": {"table": "t"}}).encode())


def tombstone(id):  # noqa: A002
    return json.dumps({"id": id}).encode(), None


def send(broker, p, events, partition=0):
    return produce(broker.bootstrap_servers, p.topic, [(partition, v) for _, v in events],
                   keys=[k for k, _ in events])


def table(engine, p, columns="id, owner"):
    with engine.connect() as conn:
        return {r[0]: tuple(r[1:]) for r in conn.execute(text(f'SELECT {columns} FROM public."{p.table}"'))}


def totals(engine, p):
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT sum(records_read) AS read, sum(rows_written) AS written, sum(rows_deleted) AS deleted, "
            "sum(records_skipped) AS skipped, sum(rows_quarantined) AS quarantined FROM ledger.batches "
            "WHERE pipeline = :p AND status = 'committed' AND kind = 'live'"), {"p": p.name}).one()


def range_totals(engine, p):
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT sum(r.rows_deleted) AS deleted, sum(r.records_skipped) AS skipped FROM ledger.batch_ranges r "
            "JOIN ledger.batches b USING (batch_id) WHERE b.pipeline = :p AND b.status = 'committed'"),
            {"p": p.name}).one()


@pytest.mark.parametrize("max_records", [3, 100])
def test_real_debezium_events_replicate_the_table(engine, db_url, broker, spark, make_pipeline, max_records):
    """The captured scenario (snapshot, inserts, updates, deletes with tombstones, an insert and delete in one
    transaction, a key change 3 -> 30, two updates of one key): the target is the source table's end state."""
    from tests.cdc import scenario
    from tests.cdc.test_samples import load

    lines = [x for x in load("schemas-precise.jsonl") if x["table"] == "accounts"]
    p = debezium(make_pipeline, max_records=max_records, schema=ACCOUNTS)
    send(broker, p, [(x["key"], x["value"]) for x in lines])
    summary = run(engine, db_url, broker, spark, p)
    assert summary.records_read == len(lines)
    want = {k: tuple(v for c, v in scenario.final_rows()[k].items() if c != "id") for k in scenario.final_rows()}
    with engine.connect() as conn:
        got = {r[0]: tuple(r[1:]) for r in conn.execute(text(
            f"SELECT id, owner, balance, active, updated AT TIME ZONE 'UTC', opened, seen FROM public.\"{p.table}\""))}
    assert got == want
    ops = [x["op"] for x in lines]
    t = totals(engine, p)
    assert (t.read, t.written, t.deleted, t.skipped, t.quarantined) == (
        len(lines), sum(op in ("r", "c", "u") for op in ops), ops.count("d"), ops.count(None), 0)
    assert tuple(range_totals(engine, p)) == (ops.count("d"), ops.count(None))
    assert verify(engine, p.spec) == []


def test_last_change_of_a_key_wins_within_and_across_batches(engine, db_url, broker, spark, make_pipeline):
    p = debezium(make_pipeline)
    send(broker, p, [event("c", 1, "a"), event("d", 1), tombstone(1), event("c", 1, "a2"),  # deleted, re-inserted
                     event("c", 2, "b"), event("d", 2), tombstone(2),                        # inserted, deleted
                     event("c", 3, "c"), event("u", 3, "c2"),                                # updated
                     event("d", 9), tombstone(9)])                                           # never seen: no-op
    run(engine, db_url, broker, spark, p)
    assert table(engine, p) == {1: ("a2",), 3: ("c2",)}
    # A primary-key change is a delete of the old key and a create of the new one.
    send(broker, p, [event("d", 3, before={"id": 3, "owner": "c2"}), tombstone(3), event("c", 30, "c2"),
                     event("d", 1)])  # no tombstone: tombstones.on.delete=false
    run(engine, db_url, broker, spark, p)
    assert table(engine, p) == {30: ("c2",)}
    t = totals(engine, p)
    assert (t.read, t.written, t.deleted, t.skipped, t.quarantined) == (15, 6, 5, 4, 0)
    assert verify(engine, p.spec) == []


def test_bad_change_events_are_quarantined(engine, db_url, broker, spark, make_pipeline):
    p = debezium(make_pipeline, errors__max_ratio=1.0)
    produce(broker.bootstrap_servers, p.topic, [(0, b'{"op": "t", "before": null, "after": null}'), (0, b"[1]"),
                                                (0, event("c", 1, "a")[1]),
                                                (0, b'{"op": "d", "before": null, "after": null}')],
            keys=[None, None, b'{"id": 1}', None])
    run(engine, db_url, broker, spark, p)
    assert table(engine, p) == {1: ("a",)}
    with engine.connect() as conn:
        errors = [r.error for r in conn.execute(text(
            'SELECT error FROM ledger.quarantine WHERE pipeline = :p ORDER BY "offset"'), {"p": p.name})]
    assert errors[0] == "Debezium op 't' is not a row change (c, r, u or d)"
    assert "not an object" in errors[1] and "without a Kafka key" in errors[2]
    assert verify(engine, p.spec) == []


def replay(engine, db_url, broker, spark, p, from_offset, until_offset, dry_run=False):
    batch = plan_replay(engine, p.spec, resolve_ranges(p.spec, broker.bootstrap_servers,
                                                       ReplayRequest(p.topic, None, from_offset=from_offset,
                                                                     until_offset=until_offset)))
    process_batch(spark, engine, p.spec, batch.batch_id, db_url, broker.bootstrap_servers)
    if dry_run:
        return dry_run_diff(engine, p.spec, batch.batch_id)
    return commit_batch(engine, p.spec, batch.batch_id)


def test_replays_of_changes_stay_exact(engine, db_url, broker, spark, make_pipeline):
    """A replay applies a key's change only where the key's last change delivered (row or delete) came from
    the replayed ranges or before: it never brings back a row a later change deleted, never deletes a row a
    later change wrote, and puts back what its own ranges decided."""
    p = debezium(make_pipeline)
    send(broker, p, [event("c", 1, "a"), event("c", 2, "b"), event("d", 3), event("c", 4, "d"),  # offsets 0-3
                     event("c", 5, "e")])                                                          # 4
    run(engine, db_url, broker, spark, p)
    send(broker, p, [event("d", 1), event("c", 3, "c"), event("u", 4, "d2")])                       # 5-7
    run(engine, db_url, broker, spark, p)
    before = table(engine, p)
    assert before == {2: ("b",), 3: ("c",), 4: ("d2",), 5: ("e",)}

    replay(engine, db_url, broker, spark, p, 0, 4)  # 1 stays deleted, 3 stays, 4 keeps the later value
    assert table(engine, p) == before
    replay(engine, db_url, broker, spark, p, 5, 8)  # the later range itself: the same result
    assert table(engine, p) == before
    with engine.begin() as conn:  # a row lost from the target comes back from the range that wrote it
        conn.execute(text(f'DELETE FROM public."{p.table}" WHERE id = 5'))
    diff = replay(engine, db_url, broker, spark, p, 0, 8, dry_run=True)  # first a dry run: nothing changes
    assert (diff.added, diff.removed, diff.changed, diff.unchanged) == (1, 0, 0, 3)
    assert 5 not in table(engine, p)
    replay(engine, db_url, broker, spark, p, 4, 5)
    assert table(engine, p) == before
    with engine.connect() as conn:
        deleted = {r.id: (r._offset, r._batch_id is not None) for r in conn.execute(
            text(f'SELECT id, _offset, _batch_id FROM ledger_deletes."{p.name}"'))}
    assert deleted == {1: (5, True)}  # 3 was deleted at offset 2, then written again at 6
    assert verify(engine, p.spec) == []


def test_plain_upsert_with_target_deletes(engine, db_url, broker, spark, make_pipeline):
    """`target.deletes: true`: a tombstone with a key deletes the row of the key the key's JSON names; one
    without a key is bad. Without `deletes`, a tombstone stays a bad record."""
    for deletes in (True, False):
        overrides = {"target__deletes": True} if deletes else {}
        p = make_pipeline(partitions=1, source__schema="order_id STRING, customer STRING", target__mode="upsert",
                          target__key=["order_id"], **overrides)
        produce(broker.bootstrap_servers, p.topic,
                [(0, b'{"order_id": "o1", "customer": "a"}'), (0, b'{"order_id": "o2", "customer": "b"}'),
                 (0, None), (0, None), (0, b'{"order_id": "o3", "customer": "c"}')],
                keys=[b"o1", b"o2", b'{"order_id": "o1"}', None, b"o3"])
        run(engine, db_url, broker, spark, p)
        with engine.connect() as conn:
            rows = {r[0] for r in conn.execute(text(f'SELECT order_id FROM public."{p.table}"'))}
            bad = [r.error for r in conn.execute(text(
                'SELECT error FROM ledger.quarantine WHERE pipeline = :p ORDER BY "offset"'), {"p": p.name})]
        t = totals(engine, p)
        if deletes:
            assert rows == {"o2", "o3"} and bad == ["null value (tombstone) without a key: nothing to delete"]
            assert (t.read, t.written, t.deleted, t.skipped, t.quarantined) == (5, 3, 1, 0, 1)
        else:
            assert rows == {"o1", "o2", "o3"} and bad == ["null value (tombstone)"] * 2
            assert (t.read, t.written, t.deleted, t.skipped, t.quarantined) == (5, 3, 0, 0, 2)
        assert verify(engine, p.spec) == []


def test_per_column_transform_applies_to_upserts(engine, db_url, broker, spark, make_pipeline):
    """Rows of a spec with per-column expressions go through a DataFrame: the change of each record goes with it."""
    p = debezium(make_pipeline, transform={"owner": "upper(owner)"})
    send(broker, p, [event("c", 1, "a"), event("c", 2, "b"), event("d", 1), tombstone(1), event("u", 2, "b2")])
    run(engine, db_url, broker, spark, p)
    assert table(engine, p) == {2: ("B2",)}
    t = totals(engine, p)
    assert (t.read, t.written, t.deleted, t.skipped, t.quarantined) == (5, 3, 1, 1, 0)
    assert verify(engine, p.spec) == []
