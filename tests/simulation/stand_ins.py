"""What stands in for the world outside the ledger: Kafka's watermarks answered from the simulated logs (the
planner, `offsets`, `replay` ask for them)."""
from __future__ import annotations

import contextlib

from ledgerbatch.model.ranges import Watermarks
from ledgerbatch.source import kafka

from .world import World

SERVERS = "simulated:9092"  # never dialled: every look at Kafka goes to the stand-in


@contextlib.contextmanager
def kafka_of(world: World):
    """ledgerbatch.source.kafka.watermarks answered from `world` while the block runs."""
    def watermarks(bootstrap_servers, topics, options=None):
        return {(t, p): Watermarks(log.low, log.high) for t in topics for p, log in enumerate(world.logs)}
    real, kafka.watermarks = kafka.watermarks, watermarks
    try:
        yield
    finally:
        kafka.watermarks = real
