"""Known demo data: JSON orders and Avro payments with a sprinkling of every kind of bad record, for the demo,
tests and benchmarks."""
from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

from confluent_kafka import Producer

# Bad record kinds, each a value the parser must quarantine.
POISON = (
    b"\xff\xfe not utf-8",
    b"{not json",
    b"[1, 2, 3]",
    b"",
    None,  # tombstone
    b'{"order_id": "x", "amount": "lots"}',
    b'{"order_id": {"nested": true}}',
    b'{"order_id": "x", "ts": "yesterday"}',
)


def order(i: int) -> bytes:
    return json.dumps({
        "order_id": f"o-{i:08d}", "customer": f"c-{i % 9973:04d}",
        "amount": f"{(i * 37) % 100000 / 100:.2f}", "ts": f"2026-11-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:00Z",
    }, separators=(",", ":")).encode()


_CARD = {"type": "record", "name": "Card", "fields": [{"name": "brand", "type": "string"},
                                                     {"name": "last4", "type": "string"}]}
PAYMENT_V1 = {"type": "record", "name": "Payment", "namespace": "demo", "fields": [
    {"name": "payment_id", "type": "string"},
    {"name": "order_id", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "method", "type": {"type": "enum", "name": "Method", "symbols": ["CARD", "BANK", "WALLET"]}},
    {"name": "card", "type": ["null", _CARD], "default": None},
    {"name": "paid_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
]}
# The schema evolves mid-topic: v2 adds tags (with a default, so v1 readers and writers stay compatible).
PAYMENT_V2 = {**PAYMENT_V1, "fields": PAYMENT_V1["fields"] + [
    {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []}]}


def payment(i: int) -> dict:
    method = ("CARD", "BANK", "WALLET")[i % 3]
    return {"payment_id": f"p-{i:08d}", "order_id": f"o-{i:08d}",
            "amount": Decimal((i * 37) % 100000).scaleb(-2), "method": method,
            "card": {"brand": ("visa", "amex")[i % 2], "last4": f"{i % 10000:04d}"} if method == "CARD" else None,
            "paid_at": dt.datetime(2026, 11, 1 + i % 28, i % 24, i % 60, tzinfo=dt.timezone.utc),
            "tags": ["demo", method.lower()]}


def produce_payments(bootstrap: str, registry_url: str, topic: str, count: int, partitions: int,
                     bad_every: int = 0) -> dict:
    """Avro payments through confluent-kafka's real AvroSerializer: the first half with PAYMENT_V1, the
    rest with PAYMENT_V2; every `bad_every`-th value is poison (not in the wire format, or naming a
    schema id the registry does not know). Returns {"good": n, "bad": n}."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url})
    v1, v2 = (AvroSerializer(client, json.dumps(schema)) for schema in (PAYMENT_V1, PAYMENT_V2))
    ctx = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "log_level": 3})
    good = bad = 0
    for i in range(count):
        value = (v1 if i < count // 2 else v2)(payment(i), ctx)
        if bad_every and i % bad_every == bad_every - 1:
            value = b"not avro" if (i // bad_every) % 2 else value[:1] + (999_999).to_bytes(4, "big") + value[5:]
            bad += 1
        else:
            good += 1
        producer.produce(topic, value=value, key=f"p-{i:08d}".encode(), partition=i % partitions,
                         headers=[("source", b"ledgerbatch-demo")])
        producer.poll(0)
    if producer.flush(60):
        raise RuntimeError("demo payments were not all delivered")
    return {"good": good, "bad": bad}


def produce_orders(bootstrap: str, topic: str, count: int, partitions: int, bad_every: int = 0, start: int = 0) -> dict:
    """Produce orders start..start+count-1, round-robin over partitions; every `bad_every`-th is poison.

    Returns {"good": n, "bad": n}.
    """
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True,
                         "queue.buffering.max.messages": 500_000, "log_level": 3})
    good = bad = 0
    for i in range(start, start + count):
        if bad_every and i % bad_every == bad_every - 1:
            value = POISON[(i // bad_every) % len(POISON)]
            bad += 1
        else:
            value = order(i)
            good += 1
        while True:
            try:
                producer.produce(topic, value=value, key=str(i).encode(), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(60)
    if remaining:
        raise RuntimeError(f"{remaining} demo records were not delivered")
    return {"good": good, "bad": bad}
