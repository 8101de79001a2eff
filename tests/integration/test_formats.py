"""Record formats end to end on real parts: values made by confluent-kafka's real serializers against the
dev registry, Apache Kafka, local Spark, PostgreSQL. Evolution mid-topic, nested and logical types,
Kafka metadata columns, every poison class, a registry outage and a SIGKILL mid-batch."""
from __future__ import annotations

import datetime as dt
import json
import signal
import time
from decimal import Decimal

import pytest
from confluent_kafka import Producer
from sqlalchemy import text

from ledgerbatch.dev.registry import DevRegistry
from ledgerbatch.errors import BatchFailedError
from ledgerbatch.spec.resolve import with_registry
from ledgerbatch.ops.run import run_pipeline

from ..serde import (ORDER, ORDER_AVRO_V1, ORDER_AVRO_V2, ORDER_COLUMNS, avro_encoder, json_schema_encoder,
                     protobuf_encoder)
from .helpers import assert_exactly_once, cli

pytestmark = pytest.mark.integration

COLUMNS_V2 = ORDER_COLUMNS + ", placed TIMESTAMP, channel STRING"
# an hour ago to the second: a fixed date fell out of the broker's default retention (7 days) on 2026-11-28
PLACED = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(hours=1)


def produce(bootstrap: str, topic: str, values: list[bytes | None], partitions: int) -> list[tuple[int, int]]:
    """Each value with key k<i>, header trace=t<i> and a fixed timestamp; returns (partition, offset) in order."""
    producer, acked = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3}), {}
    for i, value in enumerate(values):
        producer.produce(topic, value=value, key=f"k{i}".encode(), partition=i % partitions, headers=[("trace", f"t{i}".encode())],
                         timestamp=int(PLACED.timestamp() * 1000) + i,
                         on_delivery=lambda err, msg, i=i: acked.__setitem__(i, (msg.partition(), msg.offset())))
        producer.poll(0)
    assert producer.flush(30) == 0 and len(acked) == len(values)
    return [acked[i] for i in range(len(values))]


def run(engine, db_url, broker, spark, spec):
    return run_pipeline(engine, spec, db_url, broker.bootstrap_servers, lambda: spark)


def rows(engine, p, order_by="_partition, _offset") -> list:
    with engine.connect() as conn:
        return conn.execute(text(f'SELECT * FROM public."{p.table}" ORDER BY {order_by}')).mappings().all()


def quarantine_reasons(engine, p) -> list[str]:
    with engine.connect() as conn:
        return conn.execute(text('SELECT error FROM ledger.quarantine WHERE pipeline = :p ORDER BY partition, "offset"'),
                            {"p": p.name}).scalars().all()


def poison(encoded: bytes) -> list[bytes]:
    """One value of each bad-record class: not in wire format, an unknown schema id, a body that does not decode."""
    return [b'{"id": 1}', encoded[:1] + (424242).to_bytes(4, "big") + encoded[5:], encoded[:6]]


def test_avro_evolves_mid_topic_with_nested_logical_types_metadata_and_poison(engine, db_url, broker, spark, registry,
                                                                          make_pipeline):
    p = make_pipeline(partitions=2, source__format="avro", source__schema=COLUMNS_V2,
                      source__schema_registry={"url": registry.url}, source__metadata=["key", "timestamp", "headers"])
    v1, v2 = avro_encoder(registry.url, p.topic, ORDER_AVRO_V1), avro_encoder(registry.url, p.topic, ORDER_AVRO_V2)
    old = [v1({**ORDER, "id": i}) for i in range(20)]
    new = [v2({**{k: v for k, v in ORDER.items() if k != "name"}, "id": i, "placed": PLACED,
               "channel": "SHOP" if i % 2 else "WEB"}) for i in range(20, 40)]
    values = old + poison(old[0]) + new
    acked = produce(broker.bootstrap_servers, p.topic, values, 2)

    summary = run(engine, db_url, broker, spark, p.spec)
    assert (summary.records_read, summary.rows_written, summary.rows_quarantined) == (43, 40, 3)
    bad = set(acked[20:23])
    assert_exactly_once(engine, p, broker.bootstrap_servers, set(acked) - bad, bad)
    reasons = " | ".join(quarantine_reasons(engine, p))
    assert "not in the Confluent wire format" in reasons
    assert "schema id 424242 is unknown to the registry" in reasons
    assert "does not decode with writer schema id" in reasons

    by_id = {r["id"]: r for r in rows(engine, p)}
    first, later = by_id[3], by_id[25]
    assert (first["name"], first["amount"], first["tags"], first["placed"], first["channel"]) == \
        ("Ann", Decimal("12.50"), ["a", "b"], None, None)  # v1 lacks placed and channel: NULL
    assert first["customer"] == {"name": "Bo", "tier": 2}
    assert (later["name"], later["placed"], later["channel"]) == (None, PLACED, "SHOP")  # v2 dropped name
    assert bytes(first["_key"]) == b"k3" and first["_timestamp"] == PLACED + dt.timedelta(milliseconds=3)
    assert first["_headers"] == [{"key": "trace", "value": "t3"}]
    with engine.connect() as conn:
        types = dict(conn.execute(text(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = CAST(:t AS regclass) AND attnum > 0"), {"t": f'public."{p.table}"'}).all())
    assert (types["tags"], types["customer"], types["_key"], types["_timestamp"], types["_headers"]) == \
        ("text[]", "jsonb", "bytea", "timestamp with time zone", "jsonb")


@pytest.mark.parametrize("fmt", ["json", "protobuf", "json_schema"])
def test_other_formats_carry_nested_values(fmt, engine, db_url, broker, spark, registry, make_pipeline):
    overrides = {} if fmt == "json" else {"source__schema_registry": {"url": registry.url}}
    p = make_pipeline(partitions=2, source__format=fmt, source__schema=ORDER_COLUMNS, source__metadata=["key"],
                      **overrides)
    encode = {"json": lambda order: json.dumps(order, default=str).encode(),
              "protobuf": protobuf_encoder(registry.url, p.topic),
              "json_schema": json_schema_encoder(registry.url, p.topic)}[fmt]
    values = [encode({**ORDER, "id": i}) for i in range(30)] + [b"\x00\x00\x00\x00"]
    acked = produce(broker.bootstrap_servers, p.topic, values, 2)
    summary = run(engine, db_url, broker, spark, p.spec)
    assert (summary.rows_written, summary.rows_quarantined) == (30, 1)
    assert_exactly_once(engine, p, broker.bootstrap_servers, set(acked[:30]), {acked[30]})
    row = next(r for r in rows(engine, p) if r["id"] == 7)
    assert (row["name"], row["amount"], row["tags"], row["customer"], bytes(row["_key"])) == \
        ("Ann", Decimal("12.50"), ["a", "b"], {"name": "Bo", "tier": 2}, b"k7")


def test_json_transform_path_keeps_nested_and_metadata_columns(engine, db_url, broker, spark, make_pipeline):
    """A per-column transform sends rows through a DataFrame: nested columns travel as their staged text."""
    p = make_pipeline(partitions=2, source__schema=ORDER_COLUMNS, source__metadata=["headers", "timestamp"],
                      transform={"name": "upper(name)"})
    acked = produce(broker.bootstrap_servers, p.topic, [json.dumps({**ORDER, "id": i}, default=str).encode()
                                                       for i in range(10)], 2)
    run(engine, db_url, broker, spark, p.spec)
    assert_exactly_once(engine, p, broker.bootstrap_servers, set(acked), set())
    row = next(r for r in rows(engine, p) if r["id"] == 4)
    assert (row["name"], row["tags"], row["customer"], row["_headers"]) == \
        ("ANN", ["a", "b"], {"name": "Bo", "tier": 2}, [{"key": "trace", "value": "t4"}])
    assert row["_timestamp"] == PLACED + dt.timedelta(milliseconds=4)


def test_registry_down_fails_the_batch_then_the_next_run_delivers_once(engine, db_url, broker, spark, make_pipeline):
    with DevRegistry() as own:
        p = make_pipeline(partitions=2, source__format="avro", source__schema=ORDER_COLUMNS,
                          source__schema_registry={"url": own.url, "max.retries": "1", "retries.wait.ms": "50"})
        encode = avro_encoder(own.url, p.topic)
        acked = produce(broker.bootstrap_servers, p.topic, [encode({**ORDER, "id": i}) for i in range(50)], 2)
        own.stop()
        with pytest.raises(BatchFailedError, match="schema registry unreachable"):
            run(engine, db_url, broker, spark, p.spec)
        with engine.connect() as conn:
            batch = conn.execute(text("SELECT status, records_read FROM ledger.batches WHERE pipeline = :p"),
                                 {"p": p.name}).one()
            assert (batch.status, batch.records_read) == ("failed", None)
            assert conn.execute(text("SELECT count(*) FROM ledger.quarantine WHERE pipeline = :p"),
                                {"p": p.name}).scalar_one() == 0
            assert conn.execute(text("SELECT to_regclass(:t)"), {"t": f'public."{p.table}"'}).scalar_one() is None
        own.start()
        # 5xx answers fail the batch as well. Every request fails until heal(): a count of failing answers would
        # depend on how many tasks asked, and on a cancelled task's retries, which a loaded machine reorders.
        own.fail(503)
        with pytest.raises(BatchFailedError, match="answered 503"):
            run(engine, db_url, broker, spark, p.spec)
        own.heal()
        run(engine, db_url, broker, spark, p.spec)
        assert_exactly_once(engine, p, broker.bootstrap_servers, set(acked), set())


def test_schema_less_spec_takes_the_registry_columns_and_evolves_the_target(engine, db_url, broker, spark, registry,
                                                                           make_pipeline):
    p = make_pipeline(partitions=1, source__format="avro", source__schema=None,
                      source__schema_registry={"url": registry.url})
    v1, v2 = avro_encoder(registry.url, p.topic, ORDER_AVRO_V1), avro_encoder(registry.url, p.topic, ORDER_AVRO_V2)
    first = produce(broker.bootstrap_servers, p.topic, [v1({**ORDER, "id": i}) for i in range(5)], 1)
    spec = with_registry(p.spec, {})
    assert [c.spark_ddl for c in spec.columns] == ["BIGINT", "STRING", "DECIMAL(12,2)", "ARRAY<STRING>",
                                                   "STRUCT<name: STRING, tier: INT>"]
    run(engine, db_url, broker, spark, spec)

    later = {k: v for k, v in ORDER.items() if k != "name"}
    second = produce(broker.bootstrap_servers, p.topic, [v2({**later, "id": i, "placed": PLACED, "channel": "WEB"})
                                                        for i in range(5, 10)], 1)
    evolved = with_registry(p.spec, {})  # the subject's latest version now: name gone, placed and channel new
    assert [c.name for c in evolved.columns] == ["id", "amount", "tags", "customer", "placed", "channel"]
    run(engine, db_url, broker, spark, evolved)
    assert_exactly_once(engine, p, broker.bootstrap_servers, set(first + second), set())
    got = [(r["id"], r["name"], r["placed"], r["channel"]) for r in rows(engine, p)]
    assert got == [(i, "Ann", None, None) for i in range(5)] + [(i, None, PLACED, "WEB") for i in range(5, 10)]


def test_sigkill_mid_batch_then_resume_delivers_avro_once(engine, db_url, broker, registry, make_pipeline):
    p = make_pipeline(partitions=3, source__format="avro", source__schema=ORDER_COLUMNS, batch__max_records=200,
                      source__schema_registry={"url": registry.url})
    encode = avro_encoder(registry.url, p.topic)
    values = [encode({**ORDER, "id": i}) for i in range(600)]
    values[100] = b"not avro"
    acked = produce(broker.bootstrap_servers, p.topic, values, 3)
    crashed = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir, LEDGERBATCH_CRASH_AT="mid_read")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    time.sleep(1)  # the killed group's members die asynchronously
    finished = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert_exactly_once(engine, p, broker.bootstrap_servers, set(acked) - {acked[100]}, {acked[100]})
