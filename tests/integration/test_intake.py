"""Intake limits (plan/live.py) against real Kafka: a per-partition cap with exact, recorded ranges, and
batch.min_records with batch.max_delay holding a trickle back until it fills or its oldest record waited."""
from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from .helpers import assert_exactly_once, cli, order_value, produce

pytestmark = pytest.mark.integration


def _ranges(engine, p) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT batch_id, partition, from_offset, until_offset FROM ledger.batch_ranges WHERE pipeline = :p "
            "ORDER BY batch_id, partition"), {"p": p.name})]


def test_a_partition_cap_bounds_every_range(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=2, batch={"max_records": 1000, "max_records_per_partition": 100})
    acked = produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(250)]
                    + [(1, order_value(i)) for i in range(250, 270)])
    done = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert done.returncode == 0, done.stderr[-2000:]
    ranges = _ranges(engine, p)
    first = ranges[0][0]
    assert [r[1:] for r in ranges] == [(0, 0, 100), (1, 0, 20), (0, 100, 200), (0, 200, 250)]
    assert [r[0] - first for r in ranges] == [0, 0, 1, 2]
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())


def test_a_byte_cap_ends_each_range_at_the_budget_and_a_large_record_still_moves(engine, db_url, broker,
                                                                                make_pipeline):
    p = make_pipeline(partitions=2, batch={"max_records": 1000, "max_bytes": "1KiB"})
    small = [(0, order_value(i)) for i in range(40)]
    large = [(1, b"{" + b" " * 3000 + order_value(i)[1:]) for i in range(40, 43)]  # each over the budget alone
    acked = produce(broker.bootstrap_servers, p.topic, small + large)
    done = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "batch.max_bytes 1024 reached" in done.stderr
    cuts, total = [0], 0  # where partition 0's ranges must end: before the record passing 1024 bytes
    for offset, (_, value) in enumerate(small):
        if total and total + len(value) > 1024:
            cuts.append(offset)
            total = 0
        total += len(value)
    expected = sorted([(0, a, b) for a, b in zip(cuts, cuts[1:] + [40])] + [(1, i, i + 1) for i in range(3)])
    assert len(cuts) > 2 and sorted(r[1:] for r in _ranges(engine, p)) == expected
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())


def test_min_records_holds_a_trickle_until_max_delay(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=1, batch={"max_records": 1000, "min_records": 50, "max_delay": "4s"})

    def run():
        done = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    first = produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(10)])
    held = run()
    assert "10 offsets pending, fewer than batch.min_records 50, and the oldest has waited " in held.stderr
    assert f"{p.name}: 0 batches committed" in held.stdout and _ranges(engine, p) == []
    time.sleep(4.5)
    assert f"{p.name}: 1 batches committed, 10 records read" in run().stdout  # it waited long enough
    more = produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(10, 70)])
    assert f"{p.name}: 1 batches committed, 60 records read" in run().stdout  # 60 >= 50: no waiting
    assert [r[1:] for r in _ranges(engine, p)] == [(0, 0, 10), (0, 10, 70)]
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in first + more}, set())


def test_min_records_holds_records_stamped_by_a_clock_ahead_no_longer_than_max_delay(engine, db_url, broker,
                                                                                     make_pipeline):
    """A producer whose clock runs an hour ahead: by its records' timestamps they have not waited at all, but
    the planner counts max_delay from when it began holding them back too (ledger.waits)."""
    p = make_pipeline(partitions=1, batch={"max_records": 1000, "min_records": 50, "max_delay": "3s"})
    ahead = produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(10)],
                    timestamp_ms=int((time.time() + 3600) * 1000))
    held = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert held.returncode == 0 and f"{p.name}: 0 batches committed" in held.stdout, held.stderr[-2000:]
    time.sleep(3.5)
    done = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert f"{p.name}: 1 batches committed, 10 records read" in done.stdout, done.stderr[-2000:]
    with engine.connect() as conn:  # the wait ended with the batch
        assert conn.execute(text("SELECT count(*) FROM ledger.waits WHERE pipeline = :p"), {"p": p.name}).scalar_one() == 0
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in ahead}, set())
