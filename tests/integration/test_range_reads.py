"""The range reader on a real Kafka: a task's ranges read in turn, each next one's consumer opened while the
one before is read (source/reader.py: read_ranges), give exactly each range's records, as a range read
alone does, across a transaction's commit marker; a range whose offsets left the log fails as lost."""
from __future__ import annotations

import time

import pytest

from ledgerbatch.errors import OFFSETS_LOST
from ledgerbatch.model.ranges import OffsetRange
from ledgerbatch.source.kafka import consumer_config
from ledgerbatch.source.reader import RangeReadError, read_messages, read_ranges

from .helpers import delete_records, end_offsets, order_value, produce

pytestmark = pytest.mark.integration


def _read(chunks) -> list[tuple[int, bytes]]:
    return [(o, v) for records in chunks for o, v in zip(records.offsets, records.values)]


def test_ranges_read_in_turn_give_exactly_their_records(broker):
    topic = "t_range_reads"
    broker.create_topic(topic, 3)
    bs = broker.bootstrap_servers
    acked = produce(bs, topic, [(i % 3, order_value(i)) for i in range(60)])
    # A committed transaction leaves a marker in partition 1: an offset with no record inside a range.
    acked += produce(bs, topic, [(1, order_value(i)) for i in range(100, 120)], transactional_id="range-reads")
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
    ranges = [OffsetRange(topic, 0, 0, ends[0]), OffsetRange(topic, 1, 5, ends[1]), OffsetRange(topic, 2, 3, 17),
              OffsetRange(topic, 2, 17, ends[2])]
    conf = consumer_config(bs)

    read = [(rng, _read(records)) for rng, records in read_ranges(ranges, conf, 30)]

    assert [rng for rng, _ in read] == ranges
    for rng, got in read:
        expected = sorted((o, v) for p, o, v in acked if p == rng.partition and rng.from_offset <= o < rng.until_offset)
        assert got == expected and got
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
