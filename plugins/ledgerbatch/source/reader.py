"""The Kafka range reader: a PySpark Python Data Source with one input partition per offset range.

Modelled on Spark's KafkaSourceRDD: every partition reads exactly [from, until) of one
topic-partition, stops on the consumer position (offsets have gaps: transaction markers,
aborted records, compaction) and fails loudly when the range is gone or stops arriving.
"""
from __future__ import annotations

import json
import time
from typing import Iterator, NamedTuple

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType

from ledgerbatch.errors import OFFSETS_LOST
from ledgerbatch.faults import crash_point
from ledgerbatch.model.ranges import OffsetRange

KAFKA_RANGES = "ledgerbatch_kafka"  # the data source name spark.read.format takes
RAW_SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("offset", LongType(), False),
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("timestamp", LongType(), True),  # ms since the epoch; null where Kafka has none
    StructField("headers", ArrayType(StructType([StructField("key", StringType(), False),
                                                 StructField("value", BinaryType(), True)]), False), True),
])
CHUNK = 10_000  # records per Arrow batch and per consume() call
POLL_S = 0.05  # consume() waits this long for the last records of a range whose tail is a gap


class RangeReadError(RuntimeError):
    pass


class Records(NamedTuple):
    """One chunk of a range's records, as parallel lists. `timestamps` (ms, None where Kafka has none)
    and `headers` (lists of (key, value) pairs) only when the reader was asked for metadata."""
    offsets: list
    keys: list
    values: list
    timestamps: list | None = None
    headers: list | None = None


class KafkaRangePartition(InputPartition):
    def __init__(self, rng: OffsetRange):
        super().__init__(rng.to_dict())
        self.range = rng


class KafkaRangeSource(DataSource):
    """Options: `ranges` (JSON list of ranges), `kafka` (JSON consumer settings), `stall_timeout_s`."""

    @classmethod
    def name(cls) -> str:
        return KAFKA_RANGES

    def schema(self) -> StructType:
        return RAW_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaRangeReader(self.options)


class KafkaRangeReader(DataSourceReader):
    def __init__(self, options: dict):
        self.ranges = [OffsetRange.from_dict(d) for d in json.loads(options["ranges"])]
        self.kafka = json.loads(options["kafka"])
        self.stall_timeout_s = float(options.get("stall_timeout_s", 60))

    def partitions(self) -> list[InputPartition]:
        return [KafkaRangePartition(r) for r in self.ranges]

    def read(self, partition: KafkaRangePartition) -> Iterator:
        yield from read_range(partition.range, self.kafka, self.stall_timeout_s)


def read_range(rng: OffsetRange, kafka_conf: dict, stall_timeout_s: float) -> Iterator:
    """Yield Arrow record batches (RAW_SCHEMA) of exactly the records in `rng`."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(RAW_SCHEMA)
    for records in read_messages(rng, kafka_conf, stall_timeout_s, metadata=True):
        n = len(records.offsets)
        headers = [None if h is None else [{"key": k, "value": v} for k, v in h] for h in records.headers]
        yield pa.RecordBatch.from_arrays(
            [
                pa.repeat(pa.scalar(rng.topic, pa.string()), n),
                pa.repeat(pa.scalar(rng.partition, pa.int32()), n),
                pa.array(records.offsets, pa.int64()),
                pa.array(records.keys, pa.binary()),
                pa.array(records.values, pa.binary()),
                pa.array(records.timestamps, pa.int64()),
                pa.array(headers, schema.field("headers").type),
            ],
            schema=schema,
        )


def read_messages(rng: OffsetRange, kafka_conf: dict, stall_timeout_s: float, metadata: bool = False) -> Iterator[Records]:
    """Yield chunks of exactly the records in `rng`; with `metadata`, their timestamps and headers too."""
    from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, TopicPartition

    consumer = Consumer(kafka_conf)
    tp = TopicPartition(rng.topic, rng.partition, rng.from_offset)
    try:
        consumer.assign([tp])
        position, last_progress = rng.from_offset, time.monotonic()
        while position < rng.until_offset:
            msgs = consumer.consume(min(CHUNK, rng.until_offset - position), POLL_S)
            offsets, keys, values = [], [], []
            timestamps, headers = ([], []) if metadata else (None, None)
            for m in msgs:
                if m.error():
                    # auto.offset.reset=error: a range that left the log reports its reset, not records
                    lost = m.error().code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)
                    raise RangeReadError(f"{rng}: {OFFSETS_LOST + ': ' if lost else ''}{m.error().str()}")
                if m.offset() < rng.until_offset:
                    offsets.append(m.offset())
                    keys.append(m.key())
                    values.append(m.value())
                    if metadata:
                        kind, ms = m.timestamp()
                        timestamps.append(None if kind == TIMESTAMP_NOT_AVAILABLE else ms)
                        headers.append(m.headers())
            # The position also moves past records the consumer skips (markers, aborted records).
            previous = position
            position = max(position, consumer.position([TopicPartition(rng.topic, rng.partition)])[0].offset)
            now = time.monotonic()
            if position > previous:
                last_progress = now
            elif now - last_progress > stall_timeout_s:
                raise RangeReadError(f"{rng}: no progress for {stall_timeout_s:.0f}s at offset {position}")
            if offsets:
                crash_point("mid_read")
                yield Records(offsets, keys, values, timestamps, headers)
    finally:
        consumer.close()
