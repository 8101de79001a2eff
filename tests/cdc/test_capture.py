"""The CDC harness against real parts: PostgreSQL (wal_level = logical) -> Debezium (pgoutput) -> the dev broker.

One capture per converter setting covers two tables, one with REPLICA IDENTITY FULL and one with the default
identity: a snapshot of existing rows, then the scripted transactions of scenario.py. Every event in the topics
is checked against what the scenario says Debezium must emit.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict

import pytest

from . import scenario
from .capture import TopicReader


def check_topic(events, expected, *, schemas_enable: bool, decimal_mode: str, table: str) -> None:
    # Every event has Debezium's key; all events of one key are in one partition.
    partitions_of = defaultdict(set)
    for e in events:
        assert e.key is not None, e
        key = e.key_payload
        assert set(key) == {"id"}, key
        partitions_of[key["id"]].add(e.partition)
    assert all(len(p) == 1 for p in partitions_of.values()), partitions_of

    # Per partition, the events are exactly the expected ones of its keys, in source order.
    by_partition, tx_ids = defaultdict(list), defaultdict(set)
    for e in events:
        by_partition[e.partition].append(e)
    for partition, got in by_partition.items():
        assert [e.offset for e in got] == sorted(e.offset for e in got)
        keys = {e.key_payload["id"] for e in got}
        want = [x for x in expected if x.key in keys]
        assert len(got) == len(want), (partition, [(e.key_payload, e.payload and e.payload["op"]) for e in got])
        for e, x in zip(got, want):
            assert e.key_payload == {"id": x.key}
            if x.op is None:
                assert e.value is None, f"expected a tombstone for key {x.key}, got {e.value!r}"
                prev = got[got.index(e) - 1]
                assert prev.payload["op"] == "d" and prev.key == e.key and prev.offset + 1 == e.offset
                continue
            p = e.payload
            assert p["op"] == x.op, (x, p)
            assert p["source"]["table"] == table and p["source"]["schema"] == "public"
            assert (p["source"]["snapshot"] != "false") == (x.op == "r"), p["source"]
            if x.tx is not None:
                tx_ids[x.tx].add(p["source"]["txId"])
            for image in ("before", "after"):
                got_image = scenario.as_text(scenario.decode_image(p[image], decimal_mode))
                assert got_image == scenario.as_text(getattr(x, image)), (image, x, p)

    # Each scripted transaction is one source transaction (one txId), a different one each.
    assert all(len(ids) == 1 for ids in tx_ids.values()), tx_ids
    assert len({min(ids) for ids in tx_ids.values()}) == len(tx_ids) == len(scenario.TRANSACTIONS), tx_ids

    # The converter's shape: the schema block with schemas.enable=true, the bare envelope without.
    for e in events:
        doc, key_doc = e.value_json, e.key_json
        if schemas_enable:
            assert set(key_doc) == {"schema", "payload"} and key_doc["schema"]["name"].endswith(f".{table}.Key")
            if doc is None:
                continue
            assert set(doc) == {"schema", "payload"} and doc["schema"]["name"].endswith(f".{table}.Envelope")
            after = next(f for f in doc["schema"]["fields"] if f["field"] == "after")
            balance = next(f for f in after["fields"] if f["field"] == "balance")
            if decimal_mode == "precise":
                assert balance["type"] == "bytes" and balance["name"] == "org.apache.kafka.connect.data.Decimal"
                assert balance["parameters"]["scale"] == "2"
            else:
                assert balance["type"] == "string"
        else:
            assert key_doc == {"id": e.key_payload["id"]}
            assert doc is None or ("schema" not in doc and "op" in doc)


@pytest.mark.parametrize("schemas_enable, decimal_mode", [(True, "precise"), (False, "string")],
                         ids=["schemas-precise", "noschemas-string"])
def test_capture_snapshot_then_changes(cdc_source, capture, schemas_enable, decimal_mode):
    full, default = cdc_source.new_table("accounts_full"), cdc_source.new_table("accounts_default")
    with contextlib.closing(cdc_source.connect()) as conn:
        scenario.create_table(conn, full, replica_identity_full=True)
        scenario.create_table(conn, default, replica_identity_full=False)

    cap = capture.start([full, default], schemas_enable=schemas_enable, decimal_mode=decimal_mode)
    # The snapshot arrives first; the changes made after it stream from the slot the engine created.
    for table in (full, default):
        snapshot = cap.read_until(cap.topics[table], len(scenario.SNAPSHOT))
        assert sorted(e.payload["op"] for e in snapshot) == ["r"] * len(scenario.SNAPSHOT)

    with contextlib.closing(cdc_source.connect()) as conn:
        scenario.apply_transactions(conn, full)
        scenario.apply_transactions(conn, default)
        assert scenario.read_table(conn, full) == scenario.final_rows()

    for table, identity_full in ((full, True), (default, False)):
        expected = scenario.expected_events(identity_full)
        events = cap.read_until(cap.topics[table], len(expected), timeout=60)
        assert len(events) == len(expected)
        check_topic(events, expected, schemas_enable=schemas_enable, decimal_mode=decimal_mode, table=table)
        ops = [e.payload["op"] if e.value is not None else None for e in events]
        assert ops.count(None) == ops.count("d") == 3

    assert cap.stop() == 0, cap.log_tail()
    with contextlib.closing(cdc_source.connect()) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (cap.slot,))
        assert cur.fetchone()[0] == 0, "a clean stop drops the slot (slot.drop.on.stop)"
    # Nothing else is in the topics: the end offsets, final once the capture stopped, count exactly the events.
    for table, identity_full in ((full, True), (default, False)):
        reader = TopicReader(capture.broker.bootstrap_servers, cap.topics[table])
        try:
            assert reader.count() == len(scenario.expected_events(identity_full))
        finally:
            reader.close()
