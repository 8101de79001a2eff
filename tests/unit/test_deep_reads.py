"""What `verify --deep` reads again, and in how many reads (model/deep_reads.py)."""
from ledgerbatch.model.deep_reads import held, layers, read_of
from ledgerbatch.model.ranges import OffsetRange, Watermarks


def r(p, lo, hi):
    return OffsetRange("t", p, lo, hi)


def test_ranges_that_touch_are_one_read_and_those_that_do_not_are_read_apart():
    """A sample's ranges of one partition leave gaps: a batch holds one range per partition."""
    entries = [(None, r(0, 0, 10)), (None, r(0, 10, 20)), (None, r(0, 30, 40)), (None, r(1, 0, 5)), (None, r(0, 50, 60))]
    reads = [read_of(layer) for layer in layers(entries)]
    assert reads == [([r(0, 0, 20), r(1, 0, 5)], []), ([r(0, 30, 40)], []), ([r(0, 50, 60)], [])]


def test_an_aggregates_batches_are_read_whole():
    """Batch 2 touches batch 1 in partition 0 but not in partition 1: it goes to a read of its own."""
    entries = [(1, r(0, 0, 10)), (1, r(1, 0, 10)), (2, r(0, 10, 20)), (2, r(1, 15, 20)), (3, r(0, 20, 30))]
    assert [read_of(layer) for layer in layers(entries)] == [([r(0, 0, 10), r(1, 0, 10)], [1]),
                                                             ([r(0, 10, 30), r(1, 15, 20)], [2, 3])]


def test_what_kafka_no_longer_holds_is_not_checkable():
    ends = {("t", 0): Watermarks(15, 100), ("t", 1): Watermarks(0, 100)}
    kept, lost = held([(None, r(0, 0, 10)), (None, r(0, 10, 20)), (None, r(1, 0, 10))], ends)
    assert kept == [(None, r(0, 15, 20)), (None, r(1, 0, 10))] and lost == [r(0, 0, 15)]
    kept, lost = held([(1, r(0, 10, 20)), (1, r(1, 0, 10)), (2, r(0, 20, 30))], ends)  # batch 1 is no longer whole
    assert kept == [(2, r(0, 20, 30))] and lost == [r(0, 10, 20), r(1, 0, 10)]
