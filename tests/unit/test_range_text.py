"""Ranges as one short line: model/range_text.py."""
from ledgerbatch.model.range_text import compact_ranges
from ledgerbatch.model.ranges import OffsetRange


def test_partitions_sharing_their_offsets_are_one_run():
    ranges = [OffsetRange("orders", p, 6250, 12500) for p in reversed(range(16))]
    assert compact_ranges(ranges) == "16 ranges: orders[0..15] [6250, 12500)"


def test_gaps_split_runs_and_other_offsets_make_their_own_group():
    ranges = [OffsetRange("orders", p, 0, 100) for p in (0, 1, 2, 5, 7, 8)] + [OffsetRange("orders", 3, 10, 20),
                                                                               OffsetRange("audit", 0, 0, 100)]
    assert compact_ranges(ranges) == ("8 ranges: audit[0] [0, 100); orders[0..2,5,7..8] [0, 100); "
                                      "orders[3] [10, 20)")


def test_one_range_and_none():
    assert compact_ranges([OffsetRange("orders", 0, 0, 100)]) == "1 range: orders[0] [0, 100)"
    assert compact_ranges([]) == "0 ranges"
