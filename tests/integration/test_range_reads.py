"""The range reader on a real Kafka: a task's ranges read in turn, each next one's consumer opened while the
one before is read (source/reader.py: read_ranges), or many read through one consumer (source/together.py:
read_together, a turn's), give exactly each range's records, as a range read alone does, across a
transaction's commit marker; a range whose offsets left the log fails as lost, alone."""
from __future__ import annotations

import time

import pytest

from ledgerbatch.errors import OFFSETS_LOST
from ledgerbatch.model.ranges import OffsetRange
from ledgerbatch.source.kafka import consumer_config
from ledgerbatch.source.reader import RangeReadError, read_messages, read_ranges
from ledgerbatch.source.together import read_together

from .helpers import delete_records, end_offsets, order_value, produce

pytestmark = pytest.mark.integration


def _read(chunks) -> list[tuple[int, bytes]]:
    return [(o, v) for records in chunks for o, v in zip(records.offsets, records.values)]


def _marked_topic(broker, topic: str) -> tuple[list, dict]:
    """A topic of 3 partitions whose partition 1 holds a committed transaction's marker: its records as
    (partition, offset, value), and each partition's end once the marker is written."""
    broker.create_topic(topic, 3)
    bs = broker.bootstrap_servers
    acked = produce(bs, topic, [(i % 3, order_value(i)) for i in range(60)])
    # A committed transaction leaves a marker in partition 1: an offset with no record inside a range.
    acked += produce(bs, topic, [(1, order_value(i)) for i in range(100, 120)], transactional_id=f"{topic}-tx")
    acked += produce(bs, topic, [(i % 3, order_value(i)) for i in range(200, 230)])
    last = {p: max(o for q, o, _ in acked if q == p) for p in range(3)}
    # The commit's marker is written after commit_transaction returns (even after later records): until
    # then the transaction holds the read_committed end (the last stable offset) below its records.
    deadline = time.monotonic() + 30
    ends = {p: high for p, (_, high) in end_offsets(bs, topic, 3).items()}
    while any(ends[p] <= o for p, o in last.items()):
        assert time.monotonic() < deadline, f"end offsets {ends}, last offsets {last}"
        time.sleep(0.1)
        ends = {p: high for p, (_, high) in end_offsets(bs, topic, 3).items()}
    return acked, ends


def _expected(acked: list, rng: OffsetRange) -> list:
    return sorted((o, v) for p, o, v in acked if p == rng.partition and rng.from_offset <= o < rng.until_offset)


def test_ranges_read_in_turn_give_exactly_their_records(broker):
    topic = "t_range_reads"
    acked, ends = _marked_topic(broker, topic)
    bs = broker.bootstrap_servers
    ranges = [OffsetRange(topic, 0, 0, ends[0]), OffsetRange(topic, 1, 5, ends[1]), OffsetRange(topic, 2, 3, 17),
              OffsetRange(topic, 2, 17, ends[2])]
    conf = consumer_config(bs)

    read = [(rng, _read(records)) for rng, records in read_ranges(ranges, conf, 30)]

    assert [rng for rng, _ in read] == ranges
    for rng, got in read:
        assert got == _expected(acked, rng) and got
        assert got == _read(read_messages(rng, conf, 30))
    marker_range = read[1]
    assert len(marker_range[1]) < marker_range[0].until_offset - marker_range[0].from_offset


def test_a_lost_range_fails_after_the_ranges_before_it(broker):
    topic = "t_range_reads_lost"
    broker.create_topic(topic, 2)
    bs = broker.bootstrap_servers
    acked = produce(bs, topic, [(i % 2, order_value(i)) for i in range(40)])
    delete_records(bs, topic, 1, 10)
    ranges = [OffsetRange(topic, 0, 0, 20), OffsetRange(topic, 1, 0, 20)]

    reads = read_ranges(ranges, consumer_config(bs), 30)
    rng, records = next(reads)
    assert _read(records) == sorted((o, v) for p, o, v in acked if p == 0)
    rng, records = next(reads)
    with pytest.raises(RangeReadError, match=OFFSETS_LOST):
        _read(records)
    reads.close()


def test_ranges_read_together_give_exactly_their_records(broker):
    """Two topics' ranges through one consumer: each range once, whole, with exactly the records a range read
    alone gives (the marker inside one, an empty one), the end of each judged on its own partition."""
    acked, ends = _marked_topic(broker, "t_together_a")
    other = "t_together_b"
    broker.create_topic(other, 2)
    bs = broker.bootstrap_servers
    acked_b = produce(bs, other, [(i % 2, order_value(i)) for i in range(30)])
    ranges = [OffsetRange("t_together_a", 0, 0, ends[0]), OffsetRange("t_together_a", 1, 5, ends[1]),
              OffsetRange("t_together_a", 2, 3, 17), OffsetRange(other, 0, 2, 15), OffsetRange(other, 1, 7, 7)]
    conf = consumer_config(bs)

    read = {rng: records for rng, records in read_together(ranges, conf, 30)}

    assert sorted(read, key=ranges.index) == ranges
    for rng, records in read.items():
        assert not isinstance(records, Exception), records
        assert _read(records) == _read(read_messages(rng, conf, 30))
        assert _read(records) == _expected(acked if rng.topic == "t_together_a" else acked_b, rng)
    assert read[OffsetRange(other, 1, 7, 7)] == []
    marker = OffsetRange("t_together_a", 1, 5, ends[1])
    assert 0 < len(_read(read[marker])) < marker.span


def test_a_lost_range_read_together_fails_alone(broker):
    topic = "t_together_lost"
    broker.create_topic(topic, 3)
    bs = broker.bootstrap_servers
    acked = produce(bs, topic, [(i % 3, order_value(i)) for i in range(60)])
    delete_records(bs, topic, 1, 10)
    ranges = [OffsetRange(topic, 0, 0, 20), OffsetRange(topic, 1, 0, 20), OffsetRange(topic, 2, 4, 20)]

    read = {rng: records for rng, records in read_together(ranges, consumer_config(bs), 30)}

    assert isinstance(read[ranges[1]], RangeReadError) and OFFSETS_LOST in str(read[ranges[1]])
    assert not read[ranges[1]].retriable
    for rng in (ranges[0], ranges[2]):
        assert _read(read[rng]) == _expected(acked, rng)
