"""Moving cursors on purpose (model/moves.py) and merging delivered ranges for verify --deep: pure logic."""
import pytest

from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.model.moves import plan_moves
from ledgerbatch.model.ranges import OffsetRange, Watermarks
from ledgerbatch.model.deep_reads import merged

ENDS = {("t", 0): Watermarks(10, 100), ("t", 1): Watermarks(0, 50), ("t", 2): Watermarks(0, 40)}


def test_each_partition_moves_forward_back_stays_or_starts():
    moves = plan_moves({("t", 0): 20, ("t", 1): 30}, ENDS, {("t", 0): 60, ("t", 1): 30, ("t", 2): 5})
    assert [(m.partition, m.kind) for m in moves] == [(0, "skip"), (1, "stay"), (2, "start")]
    assert str(moves[0]) == "t[0]: 20 -> 60, skips [20, 60) (40 offsets)"
    assert str(moves[2]) == "t[2]: starts at 5"
    (back,) = plan_moves({("t", 0): 60}, ENDS, {("t", 0): 20})
    assert back.kind == "back" and str(back).startswith("t[0]: 60 -> 20, back over [20, 60)")


def test_a_target_outside_the_log_is_refused():
    with pytest.raises(LedgerbatchError, match=r"t\[0\]: offset 5 is outside the log, which holds \[10, 100\)"):
        plan_moves({("t", 0): 20}, ENDS, {("t", 0): 5})
    with pytest.raises(LedgerbatchError, match="offset 101 is outside the log"):
        plan_moves({}, ENDS, {("t", 0): 101})


def test_adjacent_delivered_ranges_are_read_as_one():
    ranges = [OffsetRange("t", 0, 0, 10), OffsetRange("t", 0, 10, 25), OffsetRange("t", 0, 30, 40),
              OffsetRange("t", 1, 40, 50), OffsetRange("u", 1, 50, 60)]
    assert merged(ranges) == [OffsetRange("t", 0, 0, 25), OffsetRange("t", 0, 30, 40), OffsetRange("t", 1, 40, 50),
                              OffsetRange("u", 1, 50, 60)]
