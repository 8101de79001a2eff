"""The Avro contender: the bench's orders once more, as Avro values written through confluent-kafka's
AvroSerializer and a dev schema registry, read by the same warm batch as the JSON ones (lb.run_warm).

The registry runs in the harness's process, so its request counter is read directly around each run.
"""
from __future__ import annotations

import datetime as dt
import json
import os
from decimal import Decimal
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from ledgerbatch.dev.demodata import order
from ledgerbatch.dev.registry import DevRegistry

from . import lb

ORDER = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "order_id", "type": "string"},
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
]}
ROUTE = "schemas/ids"  # GET /schemas/ids/{id}: how a deserializer fetches a writer schema


class AvroOrders:
    def __init__(self, bootstrap: str, registry: DevRegistry, topic: str, records: int, partitions: int,
                 copies: int = 1):
        """Orders 0..records-1 into `topic`, `copies` times over."""
        self.bootstrap, self.registry, self.topic = bootstrap, registry, topic
        self.schema_ids = set().union(*(self._produce(records, partitions) for _ in range(copies)))
        self.runs: list[dict] = []  # registry requests and staging tasks of each run

    def _produce(self, count: int, partitions: int) -> set[int]:
        """Orders 0..count-1, each demodata.order(i) with the same key and partition as produce_orders gives
        it; returns the writer schema ids in the values."""
        serialize = AvroSerializer(SchemaRegistryClient({"url": self.registry.url}), json.dumps(ORDER))
        ctx = SerializationContext(self.topic, MessageField.VALUE)
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 20, "enable.idempotence": True,
                             "queue.buffering.max.messages": 500_000, "log_level": 3})
        ids = set()
        for i in range(count):
            o = json.loads(order(i))
            value = serialize({**o, "amount": Decimal(o["amount"]), "ts": dt.datetime.fromisoformat(o["ts"])}, ctx)
            ids.add(int.from_bytes(value[1:5], "big"))
            while True:
                try:
                    producer.produce(self.topic, value=value, key=str(i).encode(), partition=i % partitions)
                    break
                except BufferError:
                    producer.poll(0.1)
        if producer.flush(60):
            raise RuntimeError(f"{self.topic}: not every Avro order was delivered")
        return ids

    def run_warm(self, db_name: str, workdir: Path, records: int, batches: int = 1) -> dict:
        """lb.run_warm on the Avro topic; the registry's schema requests are counted over the follower's whole life."""
        before = self.registry.requests[ROUTE]
        result = lb.run_warm(self.bootstrap, self.topic, db_name, workdir, records, registry_url=self.registry.url,
                             batches=batches)
        # stage/driver.py starts min(ranges, 2 * defaultParallelism) staging tasks, each with its own decoder and
        # registry client; under local[*] defaultParallelism is the cores this process (and Spark) may use. The
        # follower's warm-up (stage/warm_up.py) decodes the newest records of as many ranges in as many tasks.
        tasks = min(result["ranges"], 2 * len(os.sched_getaffinity(0)))
        self.runs.append({"schema_id_requests": self.registry.requests[ROUTE] - before, "staging_tasks": tasks,
                          "decoding_tasks": 2 * tasks})
        return result

    def registry_figures(self) -> dict:
        """Requests per schema id per decoding task (the warm-up's and the batch's), of the worst run."""
        worst = max(r["schema_id_requests"] / (len(self.schema_ids) * r["decoding_tasks"]) for r in self.runs)
        return {"schema_ids": sorted(self.schema_ids), "runs": self.runs, "per_id_per_task": worst}
