"""Known demo data: JSON orders with a sprinkling of every kind of bad record, for the demo, tests and benchmarks."""
from __future__ import annotations

import json

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
