"""Avro parsing in one process, record by record against a chunk at a time (format-avro.md): the bench's
orders as Avro values through the dev registry, one Parser each way over the same chunk, checked equal. A
chunk at a time two ways: value by value with fastavro, and whole, field by field (avro_vectors.py).

    python -m bench.avro_parse [--values N] [--rounds R]

Prints each way's median time a value over the rounds, and every round's.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
from decimal import Decimal

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from ledgerbatch.dev.demodata import order
from ledgerbatch.dev.registry import DevRegistry
from ledgerbatch.formats.parse import make_parser
from ledgerbatch.formats.schema import parse_schema
from ledgerbatch.source.reader import Records

from .avro import ORDER

COLUMNS = "order_id STRING, customer STRING, amount DECIMAL(12,2), ts TIMESTAMP"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.avro_parse", description=__doc__.splitlines()[0])
    p.add_argument("--values", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with DevRegistry() as registry:
        serialize = AvroSerializer(SchemaRegistryClient({"url": registry.url}), json.dumps(ORDER))
        ctx = SerializationContext("bench", MessageField.VALUE)
        values = []
        for i in range(args.values):
            o = json.loads(order(i))
            values.append(serialize({**o, "amount": Decimal(o["amount"]), "ts": dt.datetime.fromisoformat(o["ts"])}, ctx))
        records = Records(list(range(len(values))), [None] * len(values), values)
        parsers = {way: make_parser(parse_schema(COLUMNS), ("order_id",), "avro", {"url": registry.url}, ())
                   for way in ("record by record", "a chunk, value by value", "a chunk, whole")}
        parsers["record by record"].chunked = None
        expected = parsers["record by record"].parse("bench", 0, records)
        for way, parser in parsers.items():
            if not parser.parse("bench", 0, records).equals(expected):
                raise SystemExit(f"{way}: parsed the chunk differently")
        for plan in parsers["a chunk, value by value"].chunked.plans.values():
            plan.vectors = None  # fastavro for every value
        seconds = {way: [] for way in parsers}
        for _ in range(args.rounds):
            for way, parser in parsers.items():
                started = time.perf_counter()
                parser.parse("bench", 0, records)
                seconds[way].append((time.perf_counter() - started) / len(values) * 1e6)
    for name, runs in seconds.items():
        print(f"{name}: {statistics.median(runs):.2f} us a value ({', '.join(f'{r:.2f}' for r in runs)})")


if __name__ == "__main__":
    main()
