"""Many small ranges through ONE consumer: a turn's task (stage/turn_tasks.py) reads its share of many
pipelines' ranges at once.

A consumer a range (reader.py) waits 29-56 ms for its first records, so 100 small ranges read one after
another took 0.7-1.5 s where one consumer assigned to all of them took 0.05 s (measured on the local broker).
Each range is read exactly as reader.py reads one: [from, until), its end judged on the consumer's position
(gaps: markers, aborted records, compaction), a range gone from the log or stalled fails loudly. A range is
handed out whole (its records buffered, which is why only small ranges come here), as soon as it is complete;
a partition is paused once its range is read, so its later records are not fetched for nothing. A failure of
one range is its own; an error of no topic (the brokers away) fails every range still being read.
"""
from __future__ import annotations

import time
from typing import Iterator

from ledgerbatch.errors import OFFSETS_LOST
from ledgerbatch.faults import crash_point
from ledgerbatch.model.ranges import OffsetRange
from ledgerbatch.source.reader import CHUNK, POLL_S, RangeReadError, Records, transient


class _Pending:
    """One range being read: its records so far, where its consumer stands, when it last moved."""

    def __init__(self, rng: OffsetRange, metadata: bool, now: float):
        self.rng, self.position, self.progress = rng, rng.from_offset, now
        self.offsets, self.keys, self.values, self.timestamps = [], [], [], []
        self.headers = [] if metadata else None

    def add(self, m, timestamp_absent: int) -> None:
        self.offsets.append(m.offset())
        self.keys.append(m.key())
        self.values.append(m.value())
        kind, ms = m.timestamp()
        self.timestamps.append(None if kind == timestamp_absent else ms)
        if self.headers is not None:
            self.headers.append(m.headers())

    def chunks(self) -> list[Records]:
        """The range's records in chunks of CHUNK, as reader.py yields them."""
        return [Records(self.offsets[i:i + CHUNK], self.keys[i:i + CHUNK], self.values[i:i + CHUNK],
                        self.timestamps[i:i + CHUNK], None if self.headers is None else self.headers[i:i + CHUNK])
                for i in range(0, len(self.offsets), CHUNK)]


def read_together(ranges: list[OffsetRange], kafka_conf: dict, stall_timeout_s: float,
                  metadata: bool = False) -> Iterator[tuple[OffsetRange, list[Records] | RangeReadError]]:
    """Each of `ranges` (of distinct partitions) once, as it is complete: with its records in chunks, or with
    the error that ended its read."""
    from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, TopicPartition

    now = time.monotonic()
    pending = {(r.topic, r.partition): _Pending(r, metadata, now) for r in ranges if r.until_offset > r.from_offset}
    for rng in ranges:
        if rng.until_offset <= rng.from_offset:
            yield rng, []
    if not pending:
        return
    consumer = Consumer(kafka_conf)
    try:
        consumer.assign([TopicPartition(r.topic, r.partition, r.from_offset) for r in ranges
                         if (r.topic, r.partition) in pending])
        while pending:
            failed: dict[tuple, RangeReadError] = {}
            for m in consumer.consume(CHUNK, POLL_S):
                error, key = m.error(), (m.topic(), m.partition())
                if error is not None:
                    # auto.offset.reset=error: a range that left the log reports its reset, not records
                    lost = error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)
                    for k in ([key] if key in pending else [] if m.topic() else list(pending)):
                        failed.setdefault(k, RangeReadError(f"{pending[k].rng}: {OFFSETS_LOST + ': ' if lost else ''}"
                                                            f"{error.str()}", retriable=not lost and transient(error)))
                    continue
                reading = pending.get(key)
                if reading is not None and reading.rng.from_offset <= m.offset() < reading.rng.until_offset:
                    reading.add(m, TIMESTAMP_NOT_AVAILABLE)
            # The positions also move past records the consumer skips (markers, aborted records).
            done, now = [], time.monotonic()
            for tp in consumer.position([TopicPartition(*key) for key in pending]):
                reading = pending[(tp.topic, tp.partition)]
                if tp.offset > reading.position:
                    reading.position, reading.progress = tp.offset, now
                if reading.position >= reading.rng.until_offset:
                    done.append(tp)
                elif now - reading.progress > stall_timeout_s and (tp.topic, tp.partition) not in failed:
                    failed[(tp.topic, tp.partition)] = RangeReadError(
                        f"{reading.rng}: no progress for {stall_timeout_s:.0f}s at offset {reading.position}",
                        retriable=True)
            failures = [(pending.pop(key).rng, error) for key, error in failed.items()]
            finished = [pending.pop((tp.topic, tp.partition)) for tp in done if (tp.topic, tp.partition) in pending]
            if failures or finished:
                consumer.pause([TopicPartition(r.topic, r.partition) for r in
                                [rng for rng, _ in failures] + [f.rng for f in finished]])
            handed = time.monotonic()
            yield from failures
            for reading in finished:
                if reading.offsets:
                    crash_point("mid_read")
                yield reading.rng, reading.chunks()
            # While the caller staged what it was handed, no range here could move: that time is no stall.
            away = time.monotonic() - handed
            for reading in pending.values():
                reading.progress += away
    finally:
        consumer.close()
