import pytest

from ledgerbatch.errors import DataLossError, LedgerbatchError
from ledgerbatch.model.ranges import (OffsetRange, Watermarks, cut_at_bytes, newest_ranges, plan_ranges, share_out,
                                      split_budget, start_offsets, too_early)


def test_split_budget_serves_small_lags_whole_and_splits_the_rest_evenly():
    lags = {("t", 0): 5, ("t", 1): 1000, ("t", 2): 1000, ("t", 3): 0}
    assert split_budget(lags, 105) == {("t", 0): 5, ("t", 1): 50, ("t", 2): 50}


def test_split_budget_uses_the_whole_budget_and_never_more_than_the_lag():
    lags = {("t", p): 100 for p in range(3)}
    alloc = split_budget(lags, 10)
    assert sum(alloc.values()) == 10 and all(1 <= n <= 4 for n in alloc.values())
    assert split_budget(lags, 10_000) == lags


def test_split_budget_smaller_than_partition_count_still_progresses():
    alloc = split_budget({("t", p): 10 for p in range(4)}, 2)
    assert sum(alloc.values()) == 2


def test_a_budget_below_the_partition_count_serves_every_partition_in_turn():
    """Four busy partitions and one with a single record, two offsets a batch: the quiet one is served
    within three batches, never starved by the partitions with more lag."""
    ends = {("t", p): Watermarks(0, 1 if p == 0 else 1000) for p in range(5)}
    cursors, served = {tp: 0 for tp in ends}, {}
    for batch_id in range(1, 6):
        for r in plan_ranges(ends, cursors, 2, last_served=served):
            assert r.span == 1
            cursors[r.topic_partition], served[r.topic_partition] = r.until_offset, batch_id
    assert cursors == {("t", 0): 1, ("t", 1): 3, ("t", 2): 2, ("t", 3): 2, ("t", 4): 2}


def test_plan_ranges_from_cursors_to_ends():
    ends = {("t", 0): Watermarks(0, 10), ("t", 1): Watermarks(3, 3)}
    assert plan_ranges(ends, {("t", 0): 4, ("t", 1): 3}, 100) == [OffsetRange("t", 0, 4, 10)]
    assert plan_ranges(ends, {("t", 0): 10, ("t", 1): 3}, 100) == []


def test_cursor_before_log_start_is_data_loss_and_past_end_is_an_error():
    ends = {("t", 0): Watermarks(50, 100)}
    with pytest.raises(DataLossError, match=r"offsets \[10, 50\) were deleted"):
        plan_ranges(ends, {("t", 0): 10}, 100)
    with pytest.raises(LedgerbatchError, match="past the log end"):
        plan_ranges(ends, {("t", 0): 101}, 100)
    with pytest.raises(LedgerbatchError, match="no longer exists"):
        plan_ranges(ends, {("t", 9): 0}, 100)


def test_start_offsets_earliest_latest_and_existing_cursors():
    ends = {("t", 0): Watermarks(5, 10), ("t", 1): Watermarks(0, 7)}
    assert start_offsets(ends, {}, "earliest") == {("t", 0): 5, ("t", 1): 0}
    assert start_offsets(ends, {}, "latest") == {("t", 0): 10, ("t", 1): 7}
    assert start_offsets(ends, {("t", 0): 8}, "latest") == {("t", 0): 8, ("t", 1): 7}


def test_a_cursor_of_a_vanished_partition_is_refused():
    ends = {("t", 0): Watermarks(0, 10)}
    starts = start_offsets(ends, {("t", 0): 3, ("t", 1): 5}, "earliest")
    with pytest.raises(LedgerbatchError, match=r"t\[1\] has a cursor in the ledger but no longer exists"):
        plan_ranges(ends, starts, 100)


def test_offset_range_rejects_backwards_ranges_and_round_trips():
    with pytest.raises(ValueError):
        OffsetRange("t", 0, 5, 4)
    r = OffsetRange("t", 2, 5, 9)
    assert OffsetRange.from_dict(r.to_dict()) == r and r.span == 4


def test_a_partition_cap_bounds_each_range_and_the_rest_is_shared():
    ends = {("t", 0): Watermarks(0, 1000), ("t", 1): Watermarks(0, 30)}
    assert plan_ranges(ends, {("t", 0): 0, ("t", 1): 0}, 500, per_partition=100) == [
        OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 0, 30)]
    assert plan_ranges(ends, {("t", 0): 0, ("t", 1): 0}, 50, per_partition=100) == [
        OffsetRange("t", 0, 0, 25), OffsetRange("t", 1, 0, 25)]


def test_a_byte_budget_cuts_a_range_before_the_record_that_passes_it():
    rng = OffsetRange("t", 0, 10, 20)
    # offsets with a gap (13: a transaction marker), sizes in two chunks
    chunks = [([10, 11, 12], [40, 30, 20]), ([14, 15], [10, 1])]
    assert cut_at_bytes(rng, iter(chunks), 90) == OffsetRange("t", 0, 10, 14)
    assert cut_at_bytes(rng, iter(chunks), 100) == OffsetRange("t", 0, 10, 15)
    assert cut_at_bytes(rng, iter(chunks), 101) == rng  # every record fits: the range stays whole
    assert cut_at_bytes(rng, iter(chunks), 5) == OffsetRange("t", 0, 10, 11)  # one large record still moves
    assert cut_at_bytes(rng, iter([]), 5) == rng


def test_too_early_waits_for_min_records_until_max_delay():
    assert too_early(10, 100, 5.0, 60.0)
    assert not too_early(10, 100, 61.0, 60.0)  # the oldest waited long enough
    assert not too_early(100, 100, 5.0, 60.0) and not too_early(0, 100, 5.0, 60.0)
    assert not too_early(10, 100, None, 60.0)  # its age unknown: do not hold it back


def test_newest_ranges_share_the_sample_among_the_partitions_that_hold_records():
    ends = {("t", 0): Watermarks(0, 1000), ("t", 1): Watermarks(5, 5), ("t", 2): Watermarks(990, 1000),
            ("u", 0): Watermarks(7, 100)}
    assert newest_ranges(ends, 100, 10) == (OffsetRange("t", 0, 966, 1000), OffsetRange("t", 2, 990, 1000),
                                            OffsetRange("u", 0, 66, 100))
    assert newest_ranges(ends, 0, 10) == () and newest_ranges({("t", 1): Watermarks(5, 5)}, 100, 10) == ()


def test_newest_ranges_read_at_most_so_many_partitions():
    ends = {("t", p): Watermarks(0, 1000) for p in range(6)}
    assert newest_ranges(ends, 100, 2) == (OffsetRange("t", 0, 950, 1000), OffsetRange("t", 1, 950, 1000))


def test_share_out_spreads_a_big_pipelines_ranges_over_the_tasks_and_gives_each_range_once():
    spans = [25_000] * 4 + [10] * 40  # one pipeline's backlog beside ten quiet ones of four partitions
    shares = share_out(spans, 4)
    assert sorted(i for share in shares for i in share) == list(range(44))
    assert [sum(1 for i in share if spans[i] > 10) for share in shares] == [1, 1, 1, 1]
    assert max(len(share) for share in shares) - min(len(share) for share in shares) <= 1


def test_share_out_makes_no_empty_share():
    assert share_out([5, 5], 4) == [[0], [1]]
    assert share_out([], 4) == []
    assert share_out([1] * 9, 1) == [list(range(9))]
