"""What stands in for the world outside the ledger: Kafka's watermarks answered from the simulated logs (the
planner, `offsets`, `replay` ask for them), and a pipeline's spec rewritten as a user edits it."""
from __future__ import annotations

import contextlib

import yaml

from ledgerbatch.model.ranges import Watermarks
from ledgerbatch.source import kafka
from ledgerbatch.spec.pipeline import load_spec

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


def respec(pipe, **sections) -> None:
    """Merge `sections` ({"target": {...}, "history": {...}}) into the pipe's YAML and reload its spec."""
    path = pipe.dir / f"{pipe.name}.yaml"
    doc = yaml.safe_load(path.read_text())
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value}
    path.write_text(yaml.safe_dump(doc))
    pipe.spec = load_spec(pipe.dir, pipe.name)
