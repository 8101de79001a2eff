from ledgerbatch.commit.modes.partitions import Partition, Publish, plan_publish


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
