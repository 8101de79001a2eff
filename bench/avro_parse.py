"""Avro parsing in one process, record by record against a chunk at a time (format-avro.md): the bench's
orders as Avro values through the dev registry, one Parser each way over the same chunk, checked equal.

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
        chunk = make_parser(parse_schema(COLUMNS), ("order_id",), "avro", {"url": registry.url}, ())
        each = make_parser(parse_schema(COLUMNS), ("order_id",), "avro", {"url": registry.url}, ())
        each.chunked = None
        if not chunk.parse("bench", 0, records).equals(each.parse("bench", 0, records)):
            raise SystemExit("the two ways parsed the chunk differently")
        seconds = {"record by record": [], "a chunk at a time": []}
        for _ in range(args.rounds):
            for name, parser in (("record by record", each), ("a chunk at a time", chunk)):
                started = time.perf_counter()
                parser.parse("bench", 0, records)
                seconds[name].append((time.perf_counter() - started) / len(values) * 1e6)
    for name, runs in seconds.items():
        print(f"{name}: {statistics.median(runs):.2f} us a value ({', '.join(f'{r:.2f}' for r in runs)})")


if __name__ == "__main__":
    main()
