"""The Kafka range reader: exactly the records of one offset range, in chunks, inside a staging task.

Modelled on Spark's KafkaSourceRDD: it reads exactly [from, until) of one topic-partition, stops on
the consumer position (offsets have gaps: transaction markers, aborted records, compaction) and fails
loudly when the range is gone or stops arriving.
"""
from __future__ import annotations

import time
from typing import Iterator, NamedTuple

from ledgerbatch.errors import OFFSETS_LOST
from ledgerbatch.faults import crash_point
from ledgerbatch.model.ranges import OffsetRange

CHUNK = 10_000  # records per Arrow batch and per consume() call
POLL_S = 0.05  # consume() waits this long for the last records of a range whose tail is a gap


class RangeReadError(RuntimeError):
    """A range that could not be read. `retriable`: the brokers stopped answering (a stall, a transport
    error), which waiting fixes (ops/outages.py); not offsets gone from the log or a read refused."""

    def __init__(self, message: str, retriable: bool = False):
        super().__init__(message)
        self.retriable = retriable


class Records(NamedTuple):
    """One chunk of a range's records, as parallel lists. `timestamps` (ms, None where Kafka has none);
    `headers` (lists of (key, value) pairs) only when the reader was asked for metadata."""
    offsets: list
    keys: list
    values: list
    timestamps: list | None = None
    headers: list | None = None


def read_messages(rng: OffsetRange, kafka_conf: dict, stall_timeout_s: float, metadata: bool = False) -> Iterator[Records]:
    """Yield chunks of exactly the records in `rng`, with their timestamps; with `metadata`, headers too."""
    consumer = _assigned(rng, kafka_conf)
    try:
        yield from _records(rng, consumer, stall_timeout_s, metadata)
    finally:
        consumer.close()


def read_ranges(ranges: list[OffsetRange], kafka_conf: dict, stall_timeout_s: float,
                metadata: bool = False) -> Iterator[tuple[OffsetRange, Iterator[Records]]]:
    """Each of `ranges` in turn with its records (as read_messages gives them), to be read before the next.
    The next range's consumer is opened before a range is handed out: librdkafka connects and fetches in
    its own threads while the task works on this one, so only the first range waits for its first records
    (29-56 ms a range otherwise, measured on the local broker)."""
    consumers: dict[int, object] = {}
    try:
        for i, rng in enumerate(ranges):
            if i == 0:
                consumers[0] = _assigned(rng, kafka_conf)
            if i + 1 < len(ranges):
                consumers[i + 1] = _assigned(ranges[i + 1], kafka_conf)
            yield rng, _records(rng, consumers[i], stall_timeout_s, metadata)
            consumers.pop(i).close()
    finally:
        for consumer in consumers.values():
            consumer.close()


def _assigned(rng: OffsetRange, kafka_conf: dict):
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(kafka_conf)
    consumer.assign([TopicPartition(rng.topic, rng.partition, rng.from_offset)])
    return consumer


def _records(rng: OffsetRange, consumer, stall_timeout_s: float, metadata: bool) -> Iterator[Records]:
    from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError, TopicPartition

    position, last_progress = rng.from_offset, time.monotonic()
    while position < rng.until_offset:
        msgs = consumer.consume(min(CHUNK, rng.until_offset - position), POLL_S)
        offsets, keys, values = [], [], []
        timestamps, headers = [], ([] if metadata else None)  # timestamps always: the freshness metric counts them
        for m in msgs:
            if m.error():
                # auto.offset.reset=error: a range that left the log reports its reset, not records
                lost = m.error().code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)
                raise RangeReadError(f"{rng}: {OFFSETS_LOST + ': ' if lost else ''}{m.error().str()}",
                                     retriable=not lost and transient(m.error()))
            if m.offset() < rng.until_offset:
                offsets.append(m.offset())
                keys.append(m.key())
                values.append(m.value())
                kind, ms = m.timestamp()
                timestamps.append(None if kind == TIMESTAMP_NOT_AVAILABLE else ms)
                if metadata:
                    headers.append(m.headers())
        # The position also moves past records the consumer skips (markers, aborted records).
        previous = position
        position = max(position, consumer.position([TopicPartition(rng.topic, rng.partition)])[0].offset)
        now = time.monotonic()
        if position > previous:
            last_progress = now
        elif now - last_progress > stall_timeout_s:
            raise RangeReadError(f"{rng}: no progress for {stall_timeout_s:.0f}s at offset {position}", retriable=True)
        if offsets:
            crash_point("mid_read")
            yield Records(offsets, keys, values, timestamps, headers)


def transient(error) -> bool:
    """A Kafka error that the brokers' coming back fixes."""
    from confluent_kafka import KafkaError

    return not error.fatal() and (error.retriable() or error.code() in (
        KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT, KafkaError._RESOLVE,
        KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION))
