import math

from ledgerbatch.commit.modes.partitions import MAX_MERGE, Partition, Publish, plan_publish, plan_rollup


def test_first_batch_becomes_the_open_partition_whatever_its_size():
    assert plan_publish(1, rows=10, partitions=[], min_rows=100) == Publish(attach=True, upper=None)


def test_small_batch_is_copied_into_the_open_partition():
    open_ = Partition("t_b1", 1, None)
    assert plan_publish(7, rows=99, partitions=[open_], min_rows=100) == Publish(attach=False)


def test_big_batch_closes_the_open_partition_and_opens_its_own():
    closed, open_ = Partition("t_b1", 1, 4), Partition("t_b4", 4, None)
    assert plan_publish(9, rows=100, partitions=[closed, open_], min_rows=100) == Publish(attach=True, close=open_)


def test_batch_inside_a_closed_partition_is_copied_even_if_big():
    closed, open_ = Partition("t_b1", 1, 4), Partition("t_b4", 4, None)
    assert plan_publish(3, rows=10**6, partitions=[closed, open_], min_rows=100) == Publish(attach=False)


def test_batch_below_every_partition_is_attached_up_to_the_next_one():
    # e.g. a live batch committed after a later replay batch created the first partition
    open_ = Partition("t_b8", 8, None)
    assert plan_publish(5, rows=1, partitions=[open_], min_rows=100) == Publish(attach=True, upper=8)


def test_the_open_partitions_own_batch_is_never_closed_on_itself():
    open_ = Partition("t_b8", 8, None)
    assert plan_publish(8, rows=10**6, partitions=[open_], min_rows=100) == Publish(attach=False)


def sized(*sizes, open_size=1):
    """Adjacent closed partitions of these sizes over batch ids 0, 10, 20, ..., then the open one."""
    closed = [Partition(f"p{i}", i * 10, (i + 1) * 10, size) for i, size in enumerate(sizes)]
    return closed + [Partition("open", len(sizes) * 10, None, open_size)]


def test_within_the_bound_nothing_merges():
    assert plan_rollup(sized(5, 5, 5), max_partitions=4) == []


def test_one_over_the_bound_merges_the_cheapest_adjacent_pair_of_like_sizes():
    merged = plan_rollup(sized(100, 40, 2, 3, 50), max_partitions=5)
    assert [p.name for p in merged] == ["p2", "p3"]


def test_far_over_the_bound_merges_one_run_down_to_it():
    merged = plan_rollup(sized(*[1] * 9), max_partitions=4)
    assert [p.name for p in merged] == ["p0", "p1", "p2", "p3", "p4", "p5", "p6"]


def test_far_over_the_bound_merges_at_most_max_merge_at_a_time():
    assert len(plan_rollup(sized(*[1] * 500), max_partitions=24)) == MAX_MERGE


def test_the_open_partition_never_merges():
    assert plan_rollup(sized(7, open_size=1), max_partitions=1) == []
    assert "open" not in [p.name for p in plan_rollup(sized(1, 1, open_size=0), max_partitions=2)]


def test_repeated_rollups_copy_old_data_a_logarithmic_number_of_times():
    """Each batch adds a partition of size 1; the bound is 8. Rows are copied about log2(n) times each."""
    parts, copied, n = [], 0, 512
    for b in range(n):
        parts = [Partition(p.name, p.lower, b, p.size) if p.upper is None else p for p in parts]
        parts.append(Partition(f"b{b}", b, None, 1))
        while run := plan_rollup(parts, 8):
            copied += sum(p.size for p in run)
            keep = [p for p in parts if p not in run]
            parts = sorted(keep + [Partition(run[0].name, run[0].lower, run[-1].upper, sum(p.size for p in run))],
                           key=lambda p: p.lower)
    assert len(parts) <= 8
    assert copied / n < 10  # log2(512) = 9; always merging the smallest pair copies each row 30 times


def test_a_day_of_attached_batches_copies_each_row_at_most_log2_times_and_no_merge_takes_most_of_the_table():
    """A batch every 10 s, each attached (a partition of its own), under the default bound of 16."""
    parts, copied, biggest, n = [Partition("b0", 0, None, 1)], 0, 0.0, 8_640
    for b in range(1, n):
        parts[-1] = Partition(parts[-1].name, parts[-1].lower, b, parts[-1].size)
        parts.append(Partition(f"b{b}", b, None, 1))
        while run := plan_rollup(parts, 16):
            size = sum(p.size for p in run)
            copied, biggest = copied + size, max(biggest, size / (b + 1))
            i = parts.index(run[0])
            parts[i:i + len(run)] = [Partition(run[0].name, run[0].lower, run[-1].upper, size)]
    assert copied / n <= math.log2(n)  # 13.1; weighing sizes by their inequality copied each row 15.6 times
    assert biggest < 0.25
