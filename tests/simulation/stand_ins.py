"""What stands in for the world outside the ledger: Kafka answered from the simulated logs (watermarks for
the planner, `offsets`, `replay`; offsets_for_times from the records' timestamps; the values' sizes that
batch.max_bytes measures), and the executors that `verify --deep` starts (its reads staged by hand, as the
machine stages every batch)."""
from __future__ import annotations

import contextlib

from ledgerbatch.model.ranges import Watermarks, cut_at_bytes
from ledgerbatch.plan import live
from ledgerbatch.source import kafka

from .world import World, timestamp_ms

SERVERS = "simulated:9092"  # never dialled: every look at Kafka goes to the stand-in


def offset_at(world: World, partition: int, ms: int) -> int:
    """Kafka's ListOffsets by time: the first record (of a committed transaction) at or after `ms`, else the end."""
    log = world.logs[partition]
    return next((o for o in range(log.low, log.high) if timestamp_ms(o) >= ms and world.held(partition, o)), log.high)


@contextlib.contextmanager
def kafka_of(world: World):
    """ledgerbatch.source.kafka's look-ups (watermarks, offsets and timestamps) and the planner's
    batch.max_bytes read answered from `world` while the block runs."""
    def watermarks(bootstrap_servers, topics, options=None):
        return {(t, p): Watermarks(log.low, log.high) for t in topics for p, log in enumerate(world.logs)}

    def offsets_at(bootstrap_servers, ends, ms, options=None):
        return {tp: offset_at(world, tp[1], ms) for tp in ends}

    def cap_bytes(ranges, max_bytes, kafka_conf):
        return [cut_at_bytes(r, [([o for o in range(r.from_offset, r.until_offset) if world.held(r.partition, o)],
                                  [world.size(r.partition, o) for o in range(r.from_offset, r.until_offset)
                                   if world.held(r.partition, o)])], max_bytes) for r in ranges]

    def timestamps_at(bootstrap_servers, positions, options=None, timeout_s=10.0):
        return {tp: next((timestamp_ms(o) for o in range(pos, world.logs[tp[1]].high) if world.held(tp[1], o)), None)
                for tp, pos in positions.items()}

    saved = kafka.watermarks, kafka.offsets_at, kafka.timestamps_at, live.cap_bytes
    kafka.watermarks, kafka.offsets_at, kafka.timestamps_at, live.cap_bytes = watermarks, offsets_at, timestamps_at, cap_bytes
    try:
        yield
    finally:
        kafka.watermarks, kafka.offsets_at, kafka.timestamps_at, live.cap_bytes = saved


@contextlib.contextmanager
def executors(stage):
    """verify --deep's process step (stage.process.process_batch, which starts Spark) replaced by `stage`,
    called with the batch id: the machine stages the batch's ranges from the world as it stages any batch."""
    from ledgerbatch.ops import deep_verify

    def process_batch(spark, engine, spec, batch_id, db_url, bootstrap_servers, *args, **kwargs):
        stage(batch_id)

    real, deep_verify.process_batch = deep_verify.process_batch, process_batch
    try:
        yield
    finally:
        deep_verify.process_batch = real


